/*
 * test_dtype.c — bf16 and fp16 buckets against a real zerod: the byte layout
 * and the pointers the library hands out, training bit for bit against a
 * reference computed by zeroclient.h's written rules (refoptim.c's rounding
 * from the definition, not the daemon's bit tricks) for every optimizer and
 * both shard and step modes, the fp32 masters charged to --max-memory
 * exactly, parameter edits honoured after zc_params_changed() and refused
 * with ZC_EPARAMEDIT without it (the edit left as written), an unknown dtype
 * refused by the library and by the daemon, and an fp32 job beside them that
 * keeps training throughout.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "raw.h"
#include "refoptim.h"
#include "testlib.h"
#include "trainer.h"
#include "zctest.h"

static struct zd daemon_;

#define FAIL(...)                                                                                  \
	do {                                                                                       \
		printf("# " __VA_ARGS__);                                                          \
		printf("\n");                                                                      \
		fflush(stdout);                                                                    \
		return 1;                                                                          \
	} while (0)

/* ------------------------------------------------------------- the plan --- */

/* Three buckets: bf16 (two segments, crossing a host chunk of 8 Ki elements),
 * fp32, fp16 (two segments); two groups. */
#define NB 3
static const enum zc_dtype dtypes[NB] = {ZC_DTYPE_BF16, ZC_DTYPE_F32, ZC_DTYPE_F16};
static const uint64_t numels[NB] = {20000, 77, 150};

struct dplan {
	struct zc_param_group groups[2];
	struct zc_segment segs[NB][2];
	struct zc_bucket buckets[NB];
	struct zc_plan p;
};

struct job {
	const char *name;
	enum zc_optimizer opt;
	enum zc_shard_mode shard;
	enum zc_step_mode step;
	uint32_t world;
	int iters;
	uint64_t seed;
};

static void make_plan(struct dplan *d, const struct job *j)
{
	static const uint64_t cut[NB] = {9000, 77, 50};

	memset(d, 0, sizeof(*d));
	for (int k = 0; k < 2; k++) {
		struct zc_param_group *g = &d->groups[k];
		zc_param_group_init(g, sizeof(*g));
		if (j->opt == ZC_OPT_SGD) {
			g->lr = k ? 0.05 : 0.1;
			g->momentum = k ? 0.9 : 0;
			g->nesterov = k;
			g->weight_decay = k ? 0 : 0.01;
		} else {
			g->lr = k ? 0.003 : 0.01;
			g->weight_decay = k ? 0.1 : 0;
			g->amsgrad = k;
		}
	}
	for (uint32_t b = 0; b < NB; b++) {
		uint32_t ns = cut[b] < numels[b] ? 2 : 1;
		d->segs[b][0] = (struct zc_segment)SEG(0, cut[b], b == 1 ? 1 : 0);
		if (ns == 2)
			d->segs[b][1] = (struct zc_segment)SEG(cut[b], numels[b] - cut[b], 1);
		d->buckets[b] = (struct zc_bucket)BUCKET(numels[b], ns, d->segs[b]);
		d->buckets[b].dtype = dtypes[b];
	}
	d->p = (struct zc_plan)PLAN(j->opt, j->shard, j->step, 2, d->groups, NB, d->buckets);
}

/* ------------------------------------------------------- the reference --- */

static float init_value(const struct job *j, uint32_t b, uint64_t i)
{
	return det_uniform(j->seed, b, i, 0);
}

static float grad_value(const struct job *j, uint32_t r, int it, uint32_t b, uint64_t i)
{
	return 2.0f * det_uniform(j->seed, 100 + r, (uint64_t)it * 8 + b, i);
}

/* What a trainer stores: the value in the bucket's dtype. */
static void put(void *buf, enum zc_dtype t, uint64_t i, float x)
{
	if (t == ZC_DTYPE_F32)
		((float *)buf)[i] = x;
	else
		((uint16_t *)buf)[i] = ref_lowp_round(x, t);
}

/* What the optimizer starts from for a stored value. */
static float as_f32(const void *buf, enum zc_dtype t, uint64_t i)
{
	return t == ZC_DTYPE_F32 ? ((const float *)buf)[i]
				 : ref_lowp_widen(((const uint16_t *)buf)[i], t);
}

/* The whole job in one process, by the written rules. */
struct ref {
	float *master[NB], *m[NB], *v[NB], *vmax[NB];
};

static void ref_init(struct ref *rf, const struct job *j)
{
	for (uint32_t b = 0; b < NB; b++) {
		rf->master[b] = calloc(numels[b], sizeof(float));
		rf->m[b] = calloc(numels[b], sizeof(float));
		rf->v[b] = calloc(numels[b], sizeof(float));
		rf->vmax[b] = calloc(numels[b], sizeof(float));
		for (uint64_t i = 0; i < numels[b]; i++) {
			float x = init_value(j, b, i);
			/* the master is the widened stored parameter */
			rf->master[b][i] = dtypes[b] == ZC_DTYPE_F32
						   ? x
						   : ref_lowp_widen(ref_lowp_round(x, dtypes[b]),
								    dtypes[b]);
		}
	}
}

static void ref_free(struct ref *rf)
{
	for (uint32_t b = 0; b < NB; b++) {
		free(rf->master[b]);
		free(rf->m[b]);
		free(rf->v[b]);
		free(rf->vmax[b]);
	}
}

/* Iteration it: the averaged gradient (widened, summed in rank order in
 * fp32, divided once, rounded to the dtype and widened again), then each
 * segment's optimizer on the fp32 master. */
static void ref_iteration(struct ref *rf, const struct job *j, const struct dplan *d, int it)
{
	for (uint32_t b = 0; b < NB; b++) {
		enum zc_dtype t = dtypes[b];
		float *avg = calloc(numels[b], sizeof(float));
		for (uint64_t i = 0; i < numels[b]; i++) {
			float s = 0;
			for (uint32_t r = 0; r < j->world; r++) {
				float g = grad_value(j, r, it, b, i);
				if (t != ZC_DTYPE_F32)
					g = ref_lowp_widen(ref_lowp_round(g, t), t);
				s = r ? s + g : g;
			}
			s = s / (float)j->world;
			avg[i] = t == ZC_DTYPE_F32 ? s : ref_lowp_widen(ref_lowp_round(s, t), t);
		}
		for (uint32_t k = 0; k < d->buckets[b].nsegments; k++) {
			const struct zc_segment *sg = &d->segs[b][k];
			const struct zc_param_group *h = &d->groups[sg->group];
			uint64_t o = sg->offset, n = sg->numel;
			if (j->opt == ZC_OPT_SGD)
				ref_sgd(h, rf->master[b] + o, avg + o, rf->m[b] + o, it == 0, n);
			else
				ref_adam(j->opt == ZC_OPT_ADAMW, h, (uint64_t)it + 1,
					 rf->master[b] + o, avg + o, rf->m[b] + o, rf->v[b] + o,
					 rf->vmax[b] + o, n);
		}
		free(avg);
	}
}

/* Every element of c's parameters equals the reference's narrowed master. */
static int ref_compare(const struct ref *rf, zc_client *c, const char *what)
{
	for (uint32_t b = 0; b < NB; b++) {
		const void *pb = zc_param_ptr(c, b);
		for (uint64_t i = 0; i < numels[b]; i++) {
			float want = rf->master[b][i];
			bool same;
			if (dtypes[b] == ZC_DTYPE_F32) {
				same = memcmp(&want, (const float *)pb + i, sizeof(float)) == 0;
			} else {
				uint16_t w = ref_lowp_round(want, dtypes[b]);
				same = ((const uint16_t *)pb)[i] == w;
			}
			if (!same)
				FAIL("%s: bucket %u [%lu] = %.9g, the rules give %.9g (master %.9g)",
				     what, b, (unsigned long)i, as_f32(pb, dtypes[b], i),
				     dtypes[b] == ZC_DTYPE_F32
					     ? want
					     : ref_lowp_widen(ref_lowp_round(want, dtypes[b]),
							      dtypes[b]),
				     want);
		}
	}
	return 0;
}

/* ------------------------------------------------------------ trainers --- */

static zc_client *join(const struct job *j, uint32_t rank, const struct dplan *d)
{
	struct zc_config cfg = test_config(&daemon_, j->name, rank, j->world);
	zc_client *c = NULL;
	int r;

	if ((r = zc_connect(&cfg, &c)) < 0 || (r = zc_alloc_buffers(c, &d->p)) < 0) {
		printf("# %s rank %u: join: %s %s\n", j->name, rank, zc_strerror_name(r),
		       zc_error_message());
		zc_close(c);
		return NULL;
	}
	/* rank 0's values win: the others start from something else */
	for (uint32_t b = 0; b < NB; b++)
		for (uint64_t i = 0; i < numels[b]; i++)
			put(zc_param_ptr(c, b), dtypes[b], i,
			    rank ? 7.0f + (float)i : init_value(j, b, i));
	if ((r = zc_register_plan(c)) < 0) {
		printf("# %s rank %u: register: %s %s\n", j->name, rank, zc_strerror_name(r),
		       zc_error_message());
		zc_close(c);
		return NULL;
	}
	return c;
}

/* One iteration: this rank's gradients, every bucket, the step. */
static int iterate(const struct job *j, zc_client *c, uint32_t rank, int it, char *msg,
		   size_t len)
{
	uint64_t t = zc_iteration(c);
	zc_future *f = NULL;
	int r;

	for (uint32_t b = 0; b < NB; b++) {
		for (uint64_t i = 0; i < numels[b]; i++)
			put(zc_grad_ptr(c, b), dtypes[b], i, grad_value(j, rank, it, b, i));
		if ((r = zc_bucket_ready(c, b, NULL)) < 0)
			break;
	}
	if (r >= 0 && (r = zc_step_future(c, t, &f)) >= 0)
		r = zc_future_wait(f, test_timeout(20000));
	snprintf(msg, len, "%s", r < 0 ? (f ? zc_future_message(f) : zc_error_message()) : "");
	zc_future_free(f);
	return r;
}

static int train_main(void *arg, int rank)
{
	const struct job *j = arg;
	struct dplan d;
	struct ref rf;
	char msg[512], what[96];
	zc_client *c;
	int r, bad = 0;

	make_plan(&d, j);
	if (!(c = join(j, (uint32_t)rank, &d)))
		return 1;
	ref_init(&rf, j);
	for (int it = 0; it < j->iters && !bad; it++) {
		if ((r = iterate(j, c, (uint32_t)rank, it, msg, sizeof(msg))) != 1) {
			printf("# %s rank %d iteration %d: %s %s\n", j->name, rank, it,
			       zc_strerror_name(r), msg);
			bad = 1;
			break;
		}
		ref_iteration(&rf, j, &d, it);
		snprintf(what, sizeof(what), "%s rank %d iteration %d", j->name, rank, it);
		bad = ref_compare(&rf, c, what);
	}
	ref_free(&rf);
	zc_close(c);
	return bad;
}

static void run_ranks(int (*fn)(void *, int), void *arg, uint32_t world, int timeout_ms)
{
	pid_t pids[4];

	for (uint32_t r = 0; r < world; r++) {
		pids[r] = spawn(fn, arg, (int)r);
		REQUIRE(pids[r] > 0, "fork: %s", strerror(errno));
	}
	for (uint32_t r = 0; r < world; r++) {
		int st = wait_child(pids[r], timeout_ms);
		CHECK(st == 0, "rank %u exited with %d", r, st);
	}
	CHECK(zd_alive(&daemon_), "zerod died");
	if (test_failed_)
		zd_dump_log(&daemon_);
}

/* ------------------------------------------------------- background job --- */

struct bg {
	struct train_spec spec;
	struct train_stop *stop;
	pid_t pids[2];
};
static struct bg *bg;

static int bg_main(void *arg, int idx)
{
	return train_rank(arg, (uint32_t)idx);
}

static void t_bg_start(void)
{
	bg->spec = (struct train_spec){
		.socket = daemon_.sock,
		.job = "bg",
		.world = 2,
		.optimizer = ZC_OPT_ADAM,
		.shard_mode = ZC_SHARD_BUCKET,
		.step_mode = ZC_STEP_INTERLEAVED,
		.iters = 1000000,
		.stop = bg->stop,
		.seed = 4321,
		.hyper_iter = -1,
		.sleep_us = 10000,
		.tolerance = 0,
	};
	for (int r = 0; r < 2; r++) {
		bg->pids[r] = spawn(bg_main, &bg->spec, r);
		REQUIRE(bg->pids[r] > 0, "fork: %s", strerror(errno));
	}
	CHECK(zd_wait_job(&daemon_, "bg", ZD_JOB_ACTIVE, 15000) == 0,
	      "job bg did not become active in 15 s");
}

static void t_bg_job(void)
{
	REQUIRE(bg->pids[0] > 0, "bg_job_starts did not run");
	CHECK(proc_alive(bg->pids[0]) && proc_alive(bg->pids[1]),
	      "job bg ended before the other cases did");
	atomic_store(&bg->spec.stop->requested, 1);
	for (int r = 0; r < 2; r++) {
		int st = wait_child(bg->pids[r], 30000);
		CHECK(st == 0, "bg rank %d exited with %d", r, st);
	}
	CHECK(atomic_load(&bg->spec.stop->stop_at) > 5, "job bg ran %d iterations",
	      atomic_load(&bg->spec.stop->stop_at));
	if (test_failed_)
		zd_dump_log(&daemon_);
}

/* ---------------------------------------------------------------- cases --- */

/* Buckets laid out by bytes, each on a 64-byte boundary; the float views
 * only for fp32 buckets. */
static void t_layout(void)
{
	struct job j = {.name = "layout", .opt = ZC_OPT_SGD, .shard = ZC_SHARD_BUCKET,
			.step = ZC_STEP_INTERLEAVED, .world = 1};
	struct zc_config cfg = test_config(&daemon_, j.name, 0, 1);
	struct dplan d;
	zc_client *c = NULL;
	char *g0, *g1, *g2, *p0;

	make_plan(&d, &j);
	REQUIRE(zc_connect(&cfg, &c) == 0 && zc_alloc_buffers(c, &d.p) == 0, "join: %s",
		zc_error_message());
	g0 = zc_grad_ptr(c, 0), g1 = zc_grad_ptr(c, 1), g2 = zc_grad_ptr(c, 2);
	p0 = zc_param_ptr(c, 0);
	REQUIRE(g0 && g1 && g2 && p0, "a pointer is NULL: %s", zc_error_message());
	/* 20000 bf16 = 40000 bytes -> 40000 (a multiple of 64); 77 fp32 = 308 -> 320 */
	CHECK(g1 - g0 == 40000, "bucket 1 starts %td bytes after bucket 0, want 40000", g1 - g0);
	CHECK(g2 - g1 == 320, "bucket 2 starts %td bytes after bucket 1, want 320", g2 - g1);
	CHECK(((uintptr_t)g1 & 63) == 0 && ((uintptr_t)g2 & 63) == 0, "not cache-line aligned");
	CHECK((char *)zc_grad_buffer(c, 1) == g1 && (char *)zc_param_buffer(c, 1) == zc_param_ptr(c, 1),
	      "the float view of the fp32 bucket differs from its pointer");
	CHECK(zc_grad_buffer(c, 0) == NULL && strstr(zc_error_message(), "bf16") &&
		      strstr(zc_error_message(), "zc_grad_ptr"),
	      "zc_grad_buffer of a bf16 bucket: '%s'", zc_error_message());
	CHECK(zc_param_buffer(c, 2) == NULL && strstr(zc_error_message(), "fp16"),
	      "zc_param_buffer of an fp16 bucket: '%s'", zc_error_message());
	CHECK(zc_grad_ptr(c, 3) == NULL && strstr(zc_error_message(), "does not exist"),
	      "bucket 3: '%s'", zc_error_message());
	CHECK(zc_grad_ptr(NULL, 0) == NULL && zc_param_ptr(NULL, 0) == NULL, "NULL client");
	CHECK(zc_params_changed(NULL) == -EINVAL, "zc_params_changed(NULL)");
	CHECK(zc_params_changed(c) == ZC_ESTATE && strstr(zc_error_message(), "not registered"),
	      "zc_params_changed before the plan: '%s'", zc_error_message());
	zc_close(c);
}

/* The library refuses an unknown dtype, and a nonzero reserved2. */
static void t_unknown_dtype_client(void)
{
	struct job j = {.name = "dtype-bad", .opt = ZC_OPT_SGD, .shard = ZC_SHARD_BUCKET,
			.step = ZC_STEP_INTERLEAVED, .world = 1};
	struct zc_config cfg = test_config(&daemon_, j.name, 0, 1);
	struct dplan d;
	zc_client *c = NULL;
	int r;

	make_plan(&d, &j);
	d.buckets[2].dtype = 7;
	REQUIRE(zc_connect(&cfg, &c) == 0, "connect: %s", zc_error_message());
	r = zc_alloc_buffers(c, &d.p);
	CHECK(r == ZC_EPLANINVAL && strstr(zc_error_message(), "buckets[2].dtype: unknown value 7"),
	      "dtype 7: %s '%s'", zc_strerror_name(r), zc_error_message());
	d.buckets[2].dtype = ZC_DTYPE_F16;
	d.buckets[2].reserved2 = 1;
	r = zc_alloc_buffers(c, &d.p);
	CHECK(r == -E2BIG && strstr(zc_error_message(), "buckets[2]"), "reserved2 1: %s '%s'",
	      zc_strerror_name(r), zc_error_message());
	d.buckets[2].reserved2 = 0;
	CHECK(zc_alloc_buffers(c, &d.p) == 0, "the plan fixed: %s", zc_error_message());
	zc_close(c);
}

/* The daemon refuses it too (a client that is not libzeroclient). */
static int c_unknown_dtype_daemon(void *arg, int idx)
{
	struct raw_reg g;
	struct raw r = {0};

	(void)arg, (void)idx;
	if (raw_reg_init(&g, "dtype-raw") < 0 || raw_open(&r, daemon_.sock, 0) < 0)
		return 1;
	raw_hello(&r, "dtype-raw");
	g.pb.buckets[1]->has_dtype = 1;
	g.pb.buckets[1]->dtype = 3;
	raw_send(&r, &g.env);
	raw_expect_error(&r, ZC_EPLANINVAL, "buckets[1].dtype: unknown value 3", "dtype 3");
	/* the session survived: dtype 0 (fp32, said explicitly) registers */
	g.pb.buckets[1]->dtype = ZC_DTYPE_F32;
	raw_send(&r, &g.env);
	raw_expect_body(&r, ZEROD__V1__ENVELOPE__BODY_PLAN_OK, "the plan with dtype 0");
	raw_goodbye(&r);
	raw_close(&r);
	raw_reg_free(&g);
	return child_bad;
}

static void t_unknown_dtype_daemon(void)
{
	CHECK(wait_child(spawn(c_unknown_dtype_daemon, NULL, 0), 20000) == 0,
	      "the daemon did not refuse dtype 3 by name");
	CHECK(zd_alive(&daemon_), "zerod died");
}

static struct job jobs[] = {
	{"adamw-bucket-il", ZC_OPT_ADAMW, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED, 2, 4, 11},
	{"adam-slice-end", ZC_OPT_ADAM, ZC_SHARD_SLICE, ZC_STEP_AT_END, 3, 4, 12},
	{"sgd-slice-il", ZC_OPT_SGD, ZC_SHARD_SLICE, ZC_STEP_INTERLEAVED, 3, 4, 13},
	{"sgd-bucket-end", ZC_OPT_SGD, ZC_SHARD_BUCKET, ZC_STEP_AT_END, 2, 4, 14},
};

static void t_train0(void)
{
	run_ranks(train_main, &jobs[0], jobs[0].world, 60000);
}
static void t_train1(void)
{
	run_ranks(train_main, &jobs[1], jobs[1].world, 60000);
}
static void t_train2(void)
{
	run_ranks(train_main, &jobs[2], jobs[2].world, 60000);
}
static void t_train3(void)
{
	run_ranks(train_main, &jobs[3], jobs[3].world, 60000);
}

/* The state the job is charged: m and v for every owned element, and a
 * master for the bf16/fp16 ones only. World 1: every element is owned. */
static void t_memory_charged(void)
{
	static struct job j = {"mem", ZC_OPT_ADAM, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED, 1, 1, 15};
	struct dplan d;
	struct zd_status st;
	zc_client *c;
	uint64_t all = numels[0] + numels[1] + numels[2], lowp = numels[0] + numels[2];
	unsigned long long want = (3 * all + lowp) * sizeof(float); /* m, v, vmax; masters */
	unsigned long long before;

	REQUIRE(zd_ctl_levels(&daemon_, &st) == 0, "no status from the control socket");
	before = st.memory;
	make_plan(&d, &j);
	REQUIRE((c = join(&j, 0, &d)) != NULL, "join");
	REQUIRE(zd_ctl_levels(&daemon_, &st) == 0, "no status from the control socket");
	CHECK(st.memory - before == want,
	      "the job is charged %llu bytes, want %llu (m, v, vmax for %lu elements, masters "
	      "for %lu)",
	      st.memory - before, want, (unsigned long)all, (unsigned long)lowp);
	zc_close(c);
}

/* An edit of bf16/fp16 parameters on every rank, then zc_params_changed():
 * the next step starts from the edit. */
static int edit_main(void *arg, int rank)
{
	const struct job *j = arg;
	struct dplan d;
	struct ref rf;
	char msg[512];
	zc_client *c;
	int r, bad = 0;

	make_plan(&d, j);
	if (!(c = join(j, (uint32_t)rank, &d)))
		return 1;
	ref_init(&rf, j);
	for (int it = 0; it < 4 && !bad; it++) {
		if (it == 2) {
			/* segment 1 of bucket 0 (across a chunk boundary) and all of
			 * bucket 2: new values, in the trainer and the reference */
			for (uint64_t i = 9000; i < 11000; i++) {
				float x = 0.25f + 0.001f * (float)i;
				put(zc_param_ptr(c, 0), ZC_DTYPE_BF16, i, x);
				rf.master[0][i] = as_f32(zc_param_ptr(c, 0), ZC_DTYPE_BF16, i);
			}
			for (uint64_t i = 0; i < numels[2]; i++) {
				put(zc_param_ptr(c, 2), ZC_DTYPE_F16, i, -3.0f + 0.01f * (float)i);
				rf.master[2][i] = as_f32(zc_param_ptr(c, 2), ZC_DTYPE_F16, i);
			}
			if ((r = zc_params_changed(c)) < 0)
				FAIL("rank %d: zc_params_changed: %s %s", rank, zc_strerror_name(r),
				     zc_error_message());
		}
		if ((r = iterate(j, c, (uint32_t)rank, it, msg, sizeof(msg))) != 1)
			FAIL("rank %d iteration %d: %s %s", rank, it, zc_strerror_name(r), msg);
		ref_iteration(&rf, j, &d, it);
		char what[64];
		snprintf(what, sizeof(what), "rank %d iteration %d", rank, it);
		bad = ref_compare(&rf, c, what);
	}
	if (zc_last_error(c) != 0)
		FAIL("rank %d: the daemon reported %s", rank, zc_error_message());
	ref_free(&rf);
	zc_close(c);
	return bad;
}

static void t_edit_honoured(void)
{
	static struct job j = {"edit-ok", ZC_OPT_ADAM, ZC_SHARD_SLICE, ZC_STEP_INTERLEAVED, 2, 4, 16};
	run_ranks(edit_main, &j, j.world, 60000);
}

/* The same edit without zc_params_changed(): the step fails with
 * ZC_EPARAMEDIT naming bucket 2 segment 1, and the edit stays. Also a call
 * in the middle of an iteration is refused. */
static int edit_refused_main(void *arg, int rank)
{
	const struct job *j = arg;
	struct dplan d;
	char msg[512];
	zc_client *c;
	uint16_t edited;
	int r;

	make_plan(&d, j);
	if (!(c = join(j, (uint32_t)rank, &d)))
		return 1;
	if ((r = iterate(j, c, (uint32_t)rank, 0, msg, sizeof(msg))) != 1)
		FAIL("rank %d iteration 0: %s %s", rank, zc_strerror_name(r), msg);
	/* mid-iteration: refused here */
	if ((r = zc_bucket_ready(c, 0, NULL)) < 0)
		FAIL("rank %d: bucket 0: %s", rank, zc_error_message());
	r = zc_params_changed(c);
	if (r != ZC_ESTATE || !strstr(zc_error_message(), "under way"))
		FAIL("rank %d: zc_params_changed mid-iteration: %s '%s'", rank, zc_strerror_name(r),
		     zc_error_message());
	for (uint32_t b = 1; b < NB; b++)
		if (zc_bucket_ready(c, b, NULL) < 0)
			FAIL("rank %d: bucket %u: %s", rank, b, zc_error_message());
	zc_future *f = NULL;
	if (zc_step_future(c, 1, &f) < 0 || zc_future_wait(f, test_timeout(20000)) != 1)
		FAIL("rank %d iteration 1: %s", rank, f ? zc_future_message(f) : zc_error_message());
	zc_future_free(f);
	/* the edit, on every rank, without the call */
	uint16_t *p2 = zc_param_ptr(c, 2);
	p2[60] = edited = ref_lowp_round(42.0f, ZC_DTYPE_F16);
	r = iterate(j, c, (uint32_t)rank, 2, msg, sizeof(msg));
	if (r != ZC_EPARAMEDIT || !strstr(msg, "bucket 2 segment 1") ||
	    !strstr(msg, "zc_params_changed"))
		FAIL("rank %d: the edited step: %s '%s'", rank, zc_strerror_name(r), msg);
	if (p2[60] != edited)
		FAIL("rank %d: the edit was overwritten: %04x, wrote %04x", rank, p2[60], edited);
	zc_close(c);
	return 0;
}

static void t_edit_refused(void)
{
	static struct job j = {"edit-refused", ZC_OPT_SGD, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED, 2,
			       0, 17};
	run_ranks(edit_refused_main, &j, j.world, 60000);
}

static void t_daemon_stops_cleanly(void)
{
	int st = zd_stop(&daemon_, 10000);
	CHECK(st == 0, "zerod exited with %d after SIGTERM", st);
}

static const struct test_case cases[] = {
	{"bg_job_starts", t_bg_start},
	/* while bg is the only other job: its charge stays as it is */
	{"masters_charged_exactly", t_memory_charged},
	{"layout_by_bytes_and_pointers", t_layout},
	{"unknown_dtype_refused_by_library", t_unknown_dtype_client},
	{"unknown_dtype_refused_by_daemon", t_unknown_dtype_daemon},
	{"train_adamw_bucket_interleaved", t_train0, 60000},
	{"train_adam_slice_at_end", t_train1, 60000},
	{"train_sgd_slice_interleaved", t_train2, 60000},
	{"train_sgd_bucket_at_end", t_train3, 60000},
	{"edit_with_params_changed_honoured", t_edit_honoured, 60000},
	{"edit_without_params_changed_EPARAMEDIT", t_edit_refused, 60000},
	{"bg_job_survived", t_bg_job, 70000},
	{"daemon_stops_cleanly", t_daemon_stops_cleanly},
};

int main(int argc, char **argv)
{
	bg = test_shared(sizeof(*bg));
	bg->stop = train_stop_new();
	return zd_test_main(&daemon_, NULL, cases, sizeof(cases) / sizeof(cases[0]), argc, argv);
}
