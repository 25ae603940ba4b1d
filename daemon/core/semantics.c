/*
 * semantics.c — torch's semantics that a rank states per iteration (see
 * semantics.h): which segments of a bucket have no gradient on it, and the
 * iteration's grad scale. The loop keeps per bucket the count of local ranks
 * that marked each segment and the gradients to zero, and per rank its
 * scale for this iteration and the next (a rank that handed over its last
 * bucket may set the next one's before the others finish this one); the
 * executor takes them with the bucket (exec_bucket_ex) and agrees with the
 * other nodes before the step (exec/step.c).
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "core/job.h"
#include "core/sink.h"
#include "core/semantics.h"

struct zvec {
	struct exec_zero *v;
	uint32_t n, cap;
};

struct sem_job {
	uint32_t *seg_first; /* [nbuckets + 1] */
	uint32_t *marks;     /* [nsegs]: local ranks that marked the segment, this iteration */
	struct zvec *zero;   /* [nbuckets] */
	double *scale;       /* [2][world]: by iteration parity */
	uint64_t *scale_it;  /* [2][world]: the iteration of each; UINT64_MAX: none */
	uint32_t world, nbuckets;
};

void sem_free(struct sem_job *s)
{
	if (!s)
		return;
	if (s->zero)
		for (uint32_t b = 0; b < s->nbuckets; b++)
			free(s->zero[b].v);
	free(s->zero);
	free(s->seg_first);
	free(s->marks);
	free(s->scale);
	free(s->scale_it);
	free(s);
}

static struct sem_job *sem_of(struct job *j)
{
	const struct plan *p = j->plan;
	struct sem_job *s;

	if (j->sem)
		return j->sem;
	s = calloc(1, sizeof(*s));
	if (!s)
		return NULL;
	s->world = j->world;
	s->nbuckets = p->nbuckets;
	s->seg_first = calloc(p->nbuckets + 1, sizeof(*s->seg_first));
	s->zero = calloc(p->nbuckets, sizeof(*s->zero));
	s->scale = calloc(2 * (size_t)j->world, sizeof(*s->scale));
	s->scale_it = malloc(2 * (size_t)j->world * sizeof(*s->scale_it));
	if (!s->seg_first || !s->zero || !s->scale || !s->scale_it)
		goto fail;
	for (uint32_t b = 0; b < p->nbuckets; b++)
		s->seg_first[b + 1] = s->seg_first[b] + p->buckets[b].nsegments;
	s->marks = calloc(s->seg_first[p->nbuckets] ? s->seg_first[p->nbuckets] : 1,
			  sizeof(*s->marks));
	if (!s->marks)
		goto fail;
	for (size_t i = 0; i < 2 * (size_t)j->world; i++)
		s->scale_it[i] = UINT64_MAX;
	j->sem = s;
	return s;
fail:
	sem_free(s);
	return NULL;
}

/* The mask may go with bucket b: nwords exactly the bucket's, no bit past
 * its segments. 0, or ZC_ESEGMASK to s. */
static int mask_check(struct job *j, struct member *s, uint64_t it, uint32_t b,
		      const uint64_t *unused, size_t nwords)
{
	uint32_t nseg = j->plan->buckets[b].nsegments, want = (nseg + 63) / 64;

	if (nwords != want) {
		sink_error(j->core->sink, s, ZC_ESEGMASK, false, it, b,
			   "bucket %u has %u segments: its mask takes %u words, got %zu", b, nseg,
			   want, nwords);
		return ZC_ESEGMASK;
	}
	if (nseg % 64 && unused[want - 1] >> (nseg % 64)) {
		sink_error(j->core->sink, s, ZC_ESEGMASK, false, it, b,
			   "bucket %u has %u segments, but its mask sets bits at or past %u "
			   "(word %u: 0x%016" PRIx64 ")",
			   b, nseg, nseg, want - 1, unused[want - 1]);
		return ZC_ESEGMASK;
	}
	return 0;
}

int sem_mark(struct job *j, struct member *s, uint64_t iteration, uint32_t bucket,
	     const uint64_t *unused, size_t nwords)
{
	struct sem_job *sm;
	struct zvec *z;
	uint32_t nseg;

	int r;

	if ((r = mask_check(j, s, iteration, bucket, unused, nwords)) < 0)
		return r;
	sm = sem_of(j);
	nseg = j->plan->buckets[bucket].nsegments;
	z = sm ? &sm->zero[bucket] : NULL;
	if (z && z->n + nseg > z->cap) {
		uint32_t cap = MAX(z->cap * 2, z->n + nseg);
		struct exec_zero *v = realloc(z->v, cap * sizeof(*v));
		if (v) {
			z->v = v;
			z->cap = cap;
		} else {
			z = NULL;
		}
	}
	if (!z) {
		sink_error(j->core->sink, s, ZC_ELIMIT, false, iteration, bucket, "out of memory");
		return ZC_ELIMIT;
	}
	for (uint32_t g = 0; g < nseg; g++)
		if (unused[g / 64] >> (g % 64) & 1) {
			sm->marks[sm->seg_first[bucket] + g]++;
			z->v[z->n++] = (struct exec_zero){.rank = s->rank, .seg = g};
		}
	return 0;
}

void sem_set_grad_scale(struct job *j, struct member *s, uint64_t iteration, double inv_scale)
{
	uint32_t nb, next;
	struct sem_job *sm;
	size_t at;

	if (j->state != JOB_ACTIVE) {
		sink_error(j->core->sink, s, ZC_ESTATE, false, iteration, -1,
			   "job %s: the grad scale needs an active job", j->id);
		return;
	}
	if (j->plan->step_mode != ZC_STEP_AT_END) {
		sink_error(j->core->sink, s, ZC_ESTATE, false, iteration, -1,
			   "a grad scale needs step_mode at_end: every bucket must be reduced "
			   "before any step");
		return;
	}
	if (!isfinite(inv_scale) || inv_scale <= 0) {
		sink_error(j->core->sink, s, ZC_EHYPER, false, iteration, -1,
			   "inv_scale must be finite and > 0 (got %g)", inv_scale);
		return;
	}
	/* the rank's current iteration: this one before its last bucket, the
	 * next one after it */
	nb = j->plan->nbuckets;
	next = j->next_bucket[s->rank];
	if (!((iteration == j->iter && next < nb) || (iteration == j->iter + 1 && next == nb))) {
		sink_error(j->core->sink, s, ZC_ESTATE, false, iteration, -1,
			   "rank %u: a grad scale for iteration %" PRIu64
			   " while the job is at iteration %" PRIu64 " (bucket %u of %u)",
			   s->rank, iteration, j->iter, next, nb);
		return;
	}
	sm = sem_of(j);
	if (!sm) {
		sink_error(j->core->sink, s, ZC_ELIMIT, false, iteration, -1, "out of memory");
		return;
	}
	at = (iteration % 2) * sm->world + s->rank;
	sm->scale[at] = inv_scale;
	sm->scale_it[at] = iteration;
}

int sem_take(struct job *j, uint64_t t, uint32_t b, struct exec_bucket_in *in, char *why,
	     size_t len)
{
	struct sem_job *sm = j->sem;
	int first = -1;

	if (!sm)
		return 0;
	*in = (struct exec_bucket_in){.marks = sm->marks + sm->seg_first[b],
				      .zero = sm->zero[b].v,
				      .nzero = sm->zero[b].n};
	if (b != j->plan->nbuckets - 1)
		return 1;
	/* every local rank set the same scale for t, or none did */
	for (uint32_t r = 0; r < j->world; r++) {
		size_t at = (t % 2) * sm->world + r;
		bool has = sm->scale_it[at] == t;

		if (j->node_of && j->node_of[r] != j->topo.node)
			continue;
		if (first < 0) {
			first = (int)r;
			in->has_scale = has;
			in->inv_scale = has ? sm->scale[at] : 0;
			continue;
		}
		if (has != in->has_scale || (has && sm->scale[at] != in->inv_scale)) {
			snprintf(why, len,
				 "ranks disagree on the grad scale of iteration %" PRIu64
				 ": rank %d %s %g, rank %u %s %g",
				 t, first, in->has_scale ? "inv_scale" : "has none", in->inv_scale,
				 r, has ? "inv_scale" : "has none", has ? sm->scale[at] : 0);
			return ZC_EHYPER;
		}
	}
	return 1;
}

void sem_clear(struct job *j, uint32_t b)
{
	struct sem_job *sm = j->sem;

	if (!sm)
		return;
	memset(sm->marks + sm->seg_first[b], 0,
	       (sm->seg_first[b + 1] - sm->seg_first[b]) * sizeof(*sm->marks));
	sm->zero[b].n = 0;
}
