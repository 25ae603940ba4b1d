/* trainer.c — see trainer.h. */
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "harness.h"
#include "refoptim.h"
#include "testlib.h"
#include "trainer.h"
#include "zctest.h"

static const uint64_t bucket_sizes[] = {1000, 37, 70001, 16, 2500}; /* 70001: several chunks */
#define NB (sizeof(bucket_sizes) / sizeof(bucket_sizes[0]))

void train_make_plan(const struct train_spec *s, struct train_plan *tp)
{
	memset(tp, 0, sizeof(*tp));
	for (int g = 0; g < TRAIN_MAX_GROUPS; g++)
		tp->groups[g] = (struct zc_param_group)ZC_PARAM_GROUP_INIT;
	if (s->optimizer == ZC_OPT_SGD) {
		tp->groups[0].lr = 0.05;
		tp->groups[0].momentum = 0.9;
		tp->groups[0].nesterov = true;
		tp->groups[1].lr = 0.02;
		tp->groups[1].momentum = 0.5;
		tp->groups[1].dampening = 0.1;
		tp->groups[1].weight_decay = 0.01;
		tp->groups[2].lr = 0.01;
		tp->groups[2].weight_decay = 0.001;
		tp->groups[2].maximize = true;
	} else {
		tp->groups[0].lr = 1e-2;
		tp->groups[1].lr = 2e-3;
		tp->groups[1].beta1 = 0.8;
		tp->groups[1].beta2 = 0.99;
		tp->groups[1].eps = 1e-6;
		tp->groups[1].weight_decay = 0.01;
		tp->groups[1].amsgrad = true;
		tp->groups[2].lr = 5e-3;
		tp->groups[2].weight_decay = 0.05;
		tp->groups[2].maximize = true;
	}
	for (uint32_t b = 0; b < NB; b++) {
		/* 1 to 3 segments per bucket, cycling through the groups */
		uint64_t n = bucket_sizes[b], off = 0;
		uint32_t nseg = n < 20 ? 1 : 1 + b % 3;
		for (uint32_t k = 0; k < nseg; k++) {
			uint64_t len = k + 1 == nseg ? n - off : n / (nseg + 1);
			tp->segs[b][k] =
				(struct zc_segment)SEG(off, len, (b + k) % TRAIN_MAX_GROUPS);
			off += len;
		}
		tp->buckets[b] = (struct zc_bucket)BUCKET(n, nseg, tp->segs[b]);
	}
	tp->plan = (struct zc_plan){
		.size = sizeof(struct zc_plan),
		.optimizer = s->optimizer,
		.shard_mode = s->shard_mode,
		.step_mode = s->step_mode,
		.ngroups = TRAIN_MAX_GROUPS,
		.groups = tp->groups,
		.nbuckets = NB,
		.buckets = tp->buckets,
	};
}

static float grad_value(const struct train_spec *s, uint32_t rank, int it, uint32_t b, uint64_t i)
{
	return det_uniform(s->seed, rank, (uint64_t)it, ((uint64_t)b << 32) | i);
}

static float init_value(const struct train_spec *s, uint32_t b, uint64_t i)
{
	return det_uniform(s->seed ^ 0x5eed, 0, b, i);
}

/* ---- the reference: one process, no sharding, plain loops ---- */

struct ref_state {
	float *p, *m, *v, *vmax;
	uint64_t n;
};

/* The sum of the ranks' gradients, in the order the daemons add them: in
 * rank order within each node, then the nodes' sums in node order. */
static float grad_sum(const struct train_spec *s, int it, uint32_t b, uint64_t i)
{
	float sum = 0;
	bool any_node = false;

	if (!s->node_of) {
		sum = grad_value(s, 0, it, b, i);
		for (uint32_t r = 1; r < s->world; r++)
			sum += grad_value(s, r, it, b, i);
		return sum;
	}
	for (uint32_t n = 0; n < s->nnodes; n++) {
		float part = 0;
		bool any = false;
		for (uint32_t r = 0; r < s->world; r++) {
			if (s->node_of[r] != n)
				continue;
			part = any ? part + grad_value(s, r, it, b, i) : grad_value(s, r, it, b, i);
			any = true;
		}
		sum = any_node ? sum + part : part;
		any_node = true;
	}
	return sum;
}

static float *reference(const struct train_spec *s, const struct train_plan *tp, int iters)
{
	uint64_t total = 0, *base = calloc(NB, sizeof(*base));
	struct zc_param_group groups[TRAIN_MAX_GROUPS];
	float *p, *m, *v, *vmax, *g;

	for (uint32_t b = 0; b < NB; b++) {
		base[b] = total;
		total += bucket_sizes[b];
	}
	p = calloc(total, 4), m = calloc(total, 4), v = calloc(total, 4);
	vmax = calloc(total, 4), g = calloc(total, 4);
	memcpy(groups, tp->groups, sizeof(groups));
	for (uint32_t b = 0; b < NB; b++)
		for (uint64_t i = 0; i < bucket_sizes[b]; i++)
			p[base[b] + i] = init_value(s, b, i);
	for (int it = 0; it < iters; it++) {
		if (it == s->hyper_iter)
			groups[0].lr *= 0.5;
		for (uint32_t b = 0; b < NB; b++)
			for (uint64_t i = 0; i < bucket_sizes[b]; i++)
				g[base[b] + i] = grad_sum(s, it, b, i) / (float)s->world;
		for (uint32_t b = 0; b < NB; b++)
			for (uint32_t k = 0; k < tp->buckets[b].nsegments; k++) {
				const struct zc_segment *sg = &tp->buckets[b].segments[k];
				const struct zc_param_group *h = &groups[sg->group];
				uint64_t o = base[b] + sg->offset;
				if (s->optimizer == ZC_OPT_SGD)
					ref_sgd(h, p + o, g + o, m + o, it == 0, sg->numel);
				else
					ref_adam(s->optimizer == ZC_OPT_ADAMW, h, (uint64_t)it + 1,
						 p + o, g + o, m + o, v + o, vmax + o, sg->numel);
			}
	}
	free(base);
	free(m);
	free(v);
	free(vmax);
	free(g);
	return p;
}

/* ---- one rank ---- */

struct train_stop *train_stop_new(void)
{
	struct train_stop *st =
		mmap(NULL, sizeof(*st), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	if (st == MAP_FAILED)
		abort();
	atomic_init(&st->requested, 0);
	atomic_init(&st->stop_at, INT_MAX);
	atomic_init(&st->done, 0);
	atomic_init(&st->worst_iter_us, 0);
	atomic_init(&st->iter_start_ms, 0);
	return st;
}

/* Does rank stop before iteration it? (see struct train_stop) */
static bool stop_before(const struct train_spec *s, uint32_t rank, int it)
{
	if (!s->stop)
		return false;
	if (rank == 0 && atomic_load(&s->stop->requested) &&
	    atomic_load(&s->stop->stop_at) == INT_MAX)
		atomic_store(&s->stop->stop_at, it + 1);
	return it >= atomic_load(&s->stop->stop_at);
}

/* Record how rank ended (the first error only). */
static void note_result(const struct train_spec *s, uint32_t rank, int code, int iters,
			const char *msg)
{
	struct train_result *res = s->results ? &s->results[rank] : NULL;

	if (!res)
		return;
	res->iterations = iters;
	if (res->code || !code)
		return;
	res->code = code;
	snprintf(res->msg, sizeof(res->msg), "%s", msg ? msg : "");
}

/* Where rank runs: its node's socket and its place among that node's ranks. */
static void place(const struct train_spec *s, uint32_t rank, struct zc_config *cfg)
{
	cfg->rank = cfg->local_rank = rank;
	cfg->world_size = cfg->local_size = s->world;
	cfg->socket = s->socket;
	if (!s->rdzv)
		return;
	uint32_t n = s->node_of[rank];
	cfg->local_rank = cfg->local_size = 0;
	for (uint32_t r = 0; r < s->world; r++)
		if (s->node_of[r] == n) {
			cfg->local_rank += r < rank;
			cfg->local_size++;
		}
	cfg->socket = s->sockets[n];
	cfg->rdzv = s->rdzvs ? s->rdzvs[n] : s->rdzv;
	cfg->nnodes = s->nnodes;
	cfg->has_node_rank = s->explicit_nodes;
	cfg->node_rank = n;
	cfg->job_secret = s->secret;
}

int train_rank(const struct train_spec *s, uint32_t rank)
{
	struct train_plan tp;
	struct zc_config cfg = ZC_CONFIG_INIT;
	const char *errtext = "";
	zc_client *c = NULL;
	zc_future *bf[NB];
	float *ref = NULL;
	int r, bad = 0, done = 0;
	uint64_t at = 0;

	train_make_plan(s, &tp);
	if (s->rdzv && s->plan_variant_node >= 0 &&
	    s->node_of[rank] == (uint32_t)s->plan_variant_node)
		tp.groups[0].lr *= 2;
	cfg.job_id = s->job;
	place(s, rank, &cfg);
	cfg.connect_timeout_ms = test_timeout(15000);
	cfg.register_timeout_ms = test_timeout(s->rdzv ? 20000 : 0);
	r = zc_connect(&cfg, &c);
	errtext = zc_error_message();
	if (r < 0) {
		printf("# %s rank %u: connect: %s: %s\n", s->job, rank, zc_strerror_name(r),
		       errtext);
		note_result(s, rank, r, 0, errtext);
		return 1;
	}
	if (s->hooks && s->hooks->buffers)
		r = s->hooks->buffers(c, &tp.plan, rank);
	else
		r = zc_alloc_buffers(c, &tp.plan);
	if (r < 0)
		goto fail;
	for (uint32_t b = 0; b < NB; b++) {
		float *pb = zc_param_buffer(c, b);
		for (uint64_t i = 0; i < bucket_sizes[b]; i++)
			/* only rank 0's initial values may survive */
			pb[i] = rank == 0 ? init_value(s, b, i) : 1234.5f;
	}
	r = zc_register_plan(c);
	if (r < 0)
		goto fail;
	for (uint32_t b = 0; b < NB; b++)
		for (uint64_t i = 0; i < bucket_sizes[b]; i++)
			if (zc_param_buffer(c, b)[i] != init_value(s, b, i)) {
				printf("# %s rank %u: after registration bucket %u[%lu] is %g, not "
				       "rank "
				       "0's %g\n",
				       s->job, rank, b, (unsigned long)i, zc_param_buffer(c, b)[i],
				       init_value(s, b, i));
				bad = 1;
				goto out;
			}
	for (int it = 0; it < s->iters && !stop_before(s, rank, it); it++, done++) {
		zc_future *step = NULL;
		int64_t t0 = test_ms();

		if (s->stop && rank == 0)
			atomic_store(&s->stop->iter_start_ms, t0);

		if (it == s->hyper_iter) {
			struct zc_param_group h = tp.groups[0];
			h.lr *= 0.5;
			r = zc_set_hyper(c, 0, &h);
			if (r < 0)
				goto fail;
		}
		for (uint32_t b = 0; b < NB; b++) {
			float *gb = zc_grad_buffer(c, b);
			if (s->rdzv && s->die_iter == it && s->die_rank == (int)rank && b == NB / 2)
				_exit(3); /* in the middle of its iteration */
			if (s->kill_rank1 == (int)rank + 1 && s->kill_iter == it && b == NB / 2)
				raise(SIGKILL);
			for (uint64_t i = 0; i < bucket_sizes[b]; i++)
				gb[i] = grad_value(s, rank, it, b, i);
			if (s->hooks && s->hooks->ready)
				r = s->hooks->ready(c, b, bucket_sizes[b], &bf[b]);
			else
				r = zc_bucket_ready(c, b, &bf[b]);
			if (r < 0)
				goto fail;
		}
		r = zc_step_future(c, (uint64_t)it, &step);
		if (r >= 0)
			r = zc_future_wait(step, test_timeout(20000));
		if (r <= 0) {
			printf("# %s rank %u: iteration %d step: %s: %s\n", s->job, rank, it,
			       r ? zc_strerror_name(r) : "timed out", zc_future_message(step));
			note_result(s, rank, r ? r : ZC_ETIMEDOUT, done, zc_future_message(step));
			zc_future_free(step);
			for (uint32_t b = 0; b < NB; b++)
				zc_future_free(bf[b]);
			bad = 1;
			goto out;
		}
		if (s->hooks && s->hooks->stepped && (r = s->hooks->stepped(c, step, it)) < 0) {
			zc_future_free(step);
			for (uint32_t b = 0; b < NB; b++)
				zc_future_free(bf[b]);
			goto fail;
		}
		zc_future_free(step);
		for (uint32_t b = 0; b < NB; b++) {
			/* the step completes after every bucket's reduction */
			int st = zc_future_poll(bf[b]);
			if (st != 1) {
				printf("# %s rank %u: iteration %d bucket %u future: %d\n", s->job,
				       rank, it, b, st);
				bad = 1;
			}
			zc_future_free(bf[b]);
		}
		if (bad)
			goto out;
		if (s->stop && rank == 0) {
			long long us = (test_ms() - t0) * 1000;
			if (us > atomic_load(&s->stop->worst_iter_us))
				atomic_store(&s->stop->worst_iter_us, us);
			atomic_fetch_add(&s->stop->done, 1);
			atomic_store(&s->stop->iter_start_ms, 0);
		}
		if (s->sleep_us)
			usleep((useconds_t)s->sleep_us);
	}
	if (s->stop)
		printf("# %s rank %u: stopped after %d iterations\n", s->job, rank, done);
	note_result(s, rank, 0, done, NULL);
	ref = reference(s, &tp, done);
	for (uint32_t b = 0; b < NB && bad < 5; b++) {
		const float *pb = zc_param_buffer(c, b);
		for (uint64_t i = 0; i < bucket_sizes[b] && bad < 5; i++, at++) {
			float want = ref[at], got = pb[i];
			bool ok = s->tolerance == 0
					  ? memcmp(&want, &got, sizeof(float)) == 0
					  : fabs((double)got - want) <=
						    s->tolerance * fmax(fabs((double)want), 1e-3);
			if (!ok) {
				printf("# %s rank %u: bucket %u[%lu] = %.9g, reference %.9g\n",
				       s->job, rank, b, (unsigned long)i, got, want);
				bad++;
			}
		}
	}
out:
	free(ref);
	zc_close(c);
	return bad ? 1 : 0;
fail:
	printf("# %s rank %u: %s: %s\n", s->job, rank, zc_strerror_name(r), zc_error_message());
	note_result(s, rank, r, done, zc_error_message());
	zc_close(c);
	return 1;
}

/* ------------------------------------------------ the background job --- */

static int bg_rank(void *arg, int idx)
{
	return train_rank(arg, (uint32_t)idx);
}

struct bg_job *bg_job_new(void)
{
	struct bg_job *bg = test_shared(sizeof(*bg));

	bg->stop = train_stop_new();
	return bg;
}

void bg_job_start(struct bg_job *bg, const struct train_spec *spec)
{
	bg->spec = *spec;
	bg->spec.stop = bg->stop;
	for (int r = 0; r < 2; r++)
		bg->pids[r] = spawn(bg_rank, &bg->spec, r);
	CHECK(bg->pids[0] > 0 && bg->pids[1] > 0, "fork");
}

void bg_job_finish(struct bg_job *bg)
{
	REQUIRE(bg->pids[0] > 0, "no background job");
	atomic_store(&bg->stop->requested, 1);
	for (int r = 0; r < 2; r++)
		CHECK(wait_child(bg->pids[r], 60000) == 0,
		      "bg rank %d did not end with the reference parameters", r);
}
