/*
 * semtrain.c — the semantics trainer and its reference (see semtrain.h).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "refoptim.h"
#include "semtrain.h"
#include "testlib.h"

#define NSEG_B2 70
#define NSEGS   (3 + 2 + NSEG_B2)
#define SCALE   1024.0f

static const uint64_t bucket_numel[SEM_NB] = {100, 134, 3 * NSEG_B2};

struct layout {
	struct zc_param_group groups[2];
	struct zc_segment segs[NSEGS];
	struct zc_bucket buckets[SEM_NB];
	struct zc_plan plan;
	uint32_t seg_first[SEM_NB + 1];
	uint64_t base[SEM_NB + 1]; /* the reference's flat layout, buckets back to back */
};

static void make_layout(const struct sem_spec *s, struct layout *l)
{
	static const struct {
		uint32_t group;
		uint64_t numel;
	} fixed[5] = {{0, 37}, {1, 50}, {0, 13}, {1, 64}, {0, 70}};
	uint32_t k = 0;

	memset(l, 0, sizeof(*l));
	l->groups[0] = s->hp[0];
	l->groups[1] = s->hp[1];
	for (uint32_t b = 0; b < SEM_NB; b++) {
		uint32_t n = b == 0 ? 3 : b == 1 ? 2 : NSEG_B2;
		uint64_t off = 0;

		l->seg_first[b] = k;
		for (uint32_t i = 0; i < n; i++, k++) {
			struct zc_segment sg = ZC_SEGMENT_INIT;
			sg.group = b < 2 ? fixed[k].group : i % 2;
			sg.numel = b < 2 ? fixed[k].numel : 3;
			sg.offset = off;
			off += sg.numel;
			l->segs[k] = sg;
		}
		zc_bucket_init(&l->buckets[b], sizeof(l->buckets[b]));
		l->buckets[b].numel = bucket_numel[b];
		l->buckets[b].nsegments = n;
		l->buckets[b].segments = &l->segs[l->seg_first[b]];
		l->base[b + 1] = l->base[b] + bucket_numel[b];
	}
	l->seg_first[SEM_NB] = k;
	zc_plan_init(&l->plan, sizeof(l->plan));
	l->plan.optimizer = s->opt;
	l->plan.shard_mode = s->shard;
	l->plan.step_mode = s->step;
	l->plan.ngroups = 2;
	l->plan.nbuckets = SEM_NB;
	l->plan.groups = l->groups;
	l->plan.buckets = l->buckets;
	l->plan.max_grad_norm = s->max_grad_norm;
}

void sem_spec_init(struct sem_spec *s, const char *job, uint32_t world)
{
	memset(s, 0, sizeof(*s));
	s->job = job;
	s->world = world;
	s->opt = ZC_OPT_SGD;
	s->shard = ZC_SHARD_BUCKET;
	s->step = ZC_STEP_AT_END;
	s->iters = 6;
	s->seed = 11;
	for (int g = 0; g < 2; g++) {
		zc_param_group_init(&s->hp[g], sizeof(s->hp[g]));
		s->hp[g].lr = g ? 0.02 : 0.05;
	}
	s->hyper_iter = -1;
	s->scale_odd_rank = -1;
	s->inf_rank = s->inf_iter = -1;
	s->bad_masks_rank = -1;
}

/* Segment sg (of bucket b, index i in it) has no gradient on rank r. */
static bool all_unused(const struct sem_spec *s, int it, uint32_t b, uint32_t i)
{
	if (!s->masks)
		return false;
	return (it % 3 == 1 && i % 3 == 0) || (b == 2 && it % 2 == 1 && i >= 64);
}

static bool unused(const struct sem_spec *s, uint32_t r, int it, uint32_t b, uint32_t i)
{
	if (!s->masks)
		return false;
	return all_unused(s, it, b, i) || (it % 2 == 0 && (i + r + (uint32_t)it) % 4 == 1);
}

static float grad_of(const struct sem_spec *s, uint32_t r, int it, uint64_t flat)
{
	float g = det_uniform(s->seed, r, (uint64_t)it, flat);

	if (s->scale)
		g *= SCALE;
	if ((int)r == s->inf_rank && it == s->inf_iter && flat == 105)
		g = INFINITY;
	return g;
}

/* ---------------------------------------------------------- reference --- */

struct ref {
	float p[444], m[444], v[444], vmax[444], avg[444];
	uint64_t step[NSEGS];
	bool first[NSEGS];
	struct zc_param_group hp[2];
};

/* One iteration of every rank's gradients through torch's formulas: the
 * average (a rank without a gradient gives 0; rank order, one division);
 * GradScaler: inf/nan anywhere skips the step, else unscale; then
 * clip_grad_norm_ (norms over the parameters that have a gradient); then
 * the optimizer, which skips a parameter with no gradient. Returns the
 * norm (NaN if not computed) and *found. */
static double ref_iter(const struct sem_spec *s, const struct layout *l, struct ref *R, int it,
		       bool *found)
{
	bool skip[NSEGS];
	double sumsq[2] = {0, 0}, total;
	float coef[2] = {1, 1};
	bool clip =
		s->max_grad_norm != 0 || R->hp[0].max_grad_norm != 0 || R->hp[1].max_grad_norm != 0;
	bool pass = s->step == ZC_STEP_AT_END && (clip || s->scale);

	*found = false;
	for (uint32_t b = 0; b < SEM_NB; b++)
		for (uint32_t i = 0; i < l->buckets[b].nsegments; i++) {
			uint32_t k = l->seg_first[b] + i;
			const struct zc_segment *sg = &l->segs[k];
			skip[k] = all_unused(s, it, b, i);
			for (uint64_t e = 0; e < sg->numel; e++) {
				uint64_t x = l->base[b] + sg->offset + e;
				float acc = unused(s, 0, it, b, i) ? 0.0f : grad_of(s, 0, it, x);
				for (uint32_t r = 1; r < s->world; r++)
					acc += unused(s, r, it, b, i) ? 0.0f : grad_of(s, r, it, x);
				R->avg[x] = acc / (float)s->world;
				if (!isfinite(R->avg[x]) && !skip[k])
					*found = true;
			}
		}
	if (s->scale && *found)
		return NAN; /* the norm is the daemon's, checked by the caller */
	for (uint32_t k = 0; k < NSEGS; k++) {
		const struct zc_segment *sg = &l->segs[k];
		uint32_t b = k < 3 ? 0 : k < 5 ? 1 : 2;
		if (skip[k])
			continue;
		for (uint64_t e = 0; e < sg->numel; e++) {
			float *g = &R->avg[l->base[b] + sg->offset + e];
			if (s->scale)
				*g = *g * (1.0f / SCALE);
			sumsq[sg->group] += (double)*g * (double)*g;
		}
	}
	total = sqrt(sumsq[0] + sumsq[1]);
	for (int g = 0; g < 2; g++) {
		double mx = s->max_grad_norm ? s->max_grad_norm : R->hp[g].max_grad_norm;
		double norm = s->max_grad_norm ? total : sqrt(sumsq[g]);
		if (mx != 0)
			coef[g] = ref_clip_coef(mx, norm);
	}
	for (uint32_t k = 0; k < NSEGS; k++) {
		const struct zc_segment *sg = &l->segs[k];
		uint32_t b = k < 3 ? 0 : k < 5 ? 1 : 2;
		uint64_t x = l->base[b] + sg->offset;
		const struct zc_param_group *h = &R->hp[sg->group];
		if (skip[k])
			continue; /* torch: .grad is None, the optimizer passes it by */
		if (coef[sg->group] < 1.0f)
			for (uint64_t e = 0; e < sg->numel; e++)
				R->avg[x + e] = R->avg[x + e] * coef[sg->group];
		R->step[k]++;
		if (s->opt == ZC_OPT_SGD) {
			ref_sgd(h, R->p + x, R->avg + x, R->m + x, R->first[k], sg->numel);
			if (h->momentum != 0)
				R->first[k] = false;
		} else {
			ref_adam(s->opt == ZC_OPT_ADAMW, h, R->step[k], R->p + x, R->avg + x,
				 R->m + x, R->v + x, R->vmax + x, sg->numel);
		}
	}
	return pass ? total : NAN;
}

/* ------------------------------------------------------------- a rank --- */

static void place(const struct sem_spec *s, uint32_t rank, struct zc_config *cfg)
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
	cfg->rdzv = s->rdzv;
	cfg->nnodes = s->nnodes;
	cfg->has_node_rank = 1;
	cfg->node_rank = n;
	cfg->job_secret = "correct horse battery staple";
}

static bool close_enough(float a, float b, double tol)
{
	if (tol == 0)
		return memcmp(&a, &b, sizeof(a)) == 0;
	return fabs((double)a - (double)b) <= tol * fmax(1.0, fabs((double)b));
}

/* Rank `bad` tries masks the library must refuse before the good one. */
static void try_bad_masks(uint32_t rank, zc_client *c, uint32_t b)
{
	uint64_t w[3] = {0, 0, 0};
	struct zc_ready rd = ZC_READY_INIT;
	int r;

	rd.bucket = b;
	rd.unused = w;
	rd.nwords = 1;
	r = zc_bucket_ready_ex(c, &rd, NULL);
	EXPECT(r == ZC_ESEGMASK && strstr(zc_error_message(), "takes 2 words, got 1"),
	       "rank %u: one word for 70 segments: %s: %s", rank, zc_strerror_name(r),
	       zc_error_message());
	rd.nwords = 2;
	w[1] = 1ull << 6; /* segment 70 of 70 */
	r = zc_bucket_ready_ex(c, &rd, NULL);
	EXPECT(r == ZC_ESEGMASK && strstr(zc_error_message(), "bits at or past 70"),
	       "rank %u: bit 70 of 70 segments: %s: %s", rank, zc_strerror_name(r),
	       zc_error_message());
	w[1] = 0;
	rd.reserved = 1;
	r = zc_bucket_ready_ex(c, &rd, NULL);
	EXPECT(r == -EINVAL, "rank %u: reserved 1: %s", rank, zc_strerror_name(r));
}

/* The run failed with r (the reason in msg): as expected, or not. */
static int failed(const struct sem_spec *s, uint32_t rank, const char *what, int r, const char *msg)
{
	if (s->expect_code && r == s->expect_code && (!s->expect_msg || strstr(msg, s->expect_msg)))
		return 0;
	printf("# %s rank %u: %s: %s: %s\n", s->job, rank, what, zc_strerror_name(r), msg);
	return 1;
}

int sem_rank(const struct sem_spec *s, uint32_t rank)
{
	struct layout l;
	struct ref *R = calloc(1, sizeof(*R));
	struct zc_config cfg = ZC_CONFIG_INIT;
	zc_client *c = NULL;
	int r, bad = 0;

	child_bad = 0;
	make_layout(s, &l);
	for (uint32_t k = 0; k < NSEGS; k++)
		R->first[k] = true;
	R->hp[0] = s->hp[0];
	R->hp[1] = s->hp[1];
	cfg.job_id = s->job;
	place(s, rank, &cfg);
	cfg.connect_timeout_ms = test_timeout(15000);
	cfg.register_timeout_ms = test_timeout(s->rdzv ? 20000 : 10000);
	r = zc_connect(&cfg, &c);
	if (r < 0) {
		bad = failed(s, rank, "connect", r, zc_error_message());
		goto out;
	}
	r = s->buffers ? s->buffers(c, &l.plan, rank) : zc_alloc_buffers(c, &l.plan);
	if (r < 0) {
		bad = failed(s, rank, "alloc_buffers", r, zc_error_message());
		goto out;
	}
	for (uint32_t b = 0; b < SEM_NB; b++) {
		float *p = zc_param_buffer(c, b);
		for (uint64_t i = 0; i < bucket_numel[b]; i++) {
			R->p[l.base[b] + i] = det_uniform(s->seed, 99, b, i);
			p[i] = rank == 0 ? R->p[l.base[b] + i] : 777.0f;
		}
	}
	r = zc_register_plan(c);
	if (r < 0) {
		bad = failed(s, rank, "register_plan", r, zc_error_message());
		goto out;
	}
	for (int it = 0; it < s->iters; it++) {
		struct zc_step_info info = ZC_STEP_INFO_INIT;
		zc_future *f = NULL;
		bool found;
		double norm;

		if (it == s->hyper_iter) {
			/* two assignments to the group before the iteration: the
			 * last one holds, as in torch */
			EXPECT(zc_set_hyper(c, 0, &s->hyper_first) == 0, "set_hyper 1: %s",
			       zc_error_message());
			EXPECT(zc_set_hyper(c, 0, &s->hyper_last) == 0, "set_hyper 2: %s",
			       zc_error_message());
			R->hp[0] = s->hyper_last;
		}
		if (s->scale) {
			double inv = (int)rank == s->scale_odd_rank ? 1.0 / 512 : 1.0 / SCALE;
			r = zc_set_grad_scale(c, inv);
			EXPECT(r == 0, "set_grad_scale: %s", zc_error_message());
		}
		for (uint32_t b = 0; b < SEM_NB; b++) {
			float *g = zc_grad_buffer(c, b);
			uint64_t w[2] = {0, 0};
			struct zc_ready rd = ZC_READY_INIT;

			for (uint64_t i = 0; i < bucket_numel[b]; i++)
				g[i] = grad_of(s, rank, it, l.base[b] + i);
			for (uint32_t i = 0; i < l.buckets[b].nsegments; i++)
				if (unused(s, rank, it, b, i)) {
					w[i / 64] |= 1ull << (i % 64);
					/* what a rank without a gradient may hold */
					const struct zc_segment *sg = &l.segs[l.seg_first[b] + i];
					for (uint64_t e = 0; e < sg->numel; e++)
						g[sg->offset + e] = NAN;
				}
			if ((int)rank == s->bad_masks_rank && it == 1 && b == 2)
				try_bad_masks(rank, c, b);
			rd.bucket = b;
			rd.nwords = s->masks ? (l.buckets[b].nsegments + 63) / 64 : 0;
			rd.unused = w;
			r = zc_bucket_ready_ex(c, &rd, NULL);
			if (r < 0) {
				bad = failed(s, rank, "bucket_ready_ex", r, zc_error_message());
				goto out;
			}
		}
		r = zc_step_future(c, (uint64_t)it, &f);
		if (r >= 0)
			r = zc_future_wait(f, test_timeout(20000));
		if (r <= 0) {
			bad = failed(s, rank, "step", r ? r : ZC_ETIMEDOUT,
				     f ? zc_future_message(f) : zc_error_message());
			zc_future_free(f);
			goto out;
		}
		r = zc_step_info(f, &info);
		zc_future_free(f);
		norm = ref_iter(s, &l, R, it, &found);
		EXPECT(r == 0 && info.iteration == (uint64_t)it, "step_info: %s",
		       zc_error_message());
		EXPECT(info.found_inf == (s->scale && found), "iteration %d: found_inf %u", it,
		       info.found_inf);
		if (!(s->scale && found))
			EXPECT((isnan(norm) && isnan(info.grad_norm)) ||
				       fabs(info.grad_norm - norm) <= 1e-9 * fmax(1, norm),
			       "iteration %d: grad_norm %.17g, reference %.17g", it, info.grad_norm,
			       norm);
		for (uint32_t b = 0; b < SEM_NB; b++) {
			const float *p = zc_param_buffer(c, b);
			for (uint64_t i = 0; i < bucket_numel[b]; i++)
				if (!close_enough(p[i], R->p[l.base[b] + i], s->tolerance)) {
					EXPECT(0,
					       "iteration %d bucket %u element %lu: %.9g, "
					       "reference "
					       "%.9g",
					       it, b, (unsigned long)i, p[i], R->p[l.base[b] + i]);
					break;
				}
		}
		if (child_bad)
			break;
	}
	if (s->expect_code) {
		printf("# %s rank %u: trained, but %s was expected\n", s->job, rank,
		       zc_strerror_name(s->expect_code));
		bad = 1;
	}
out:
	zc_close(c);
	free(R);
	return bad || child_bad;
}
