/*
 * gradpass.c — passes over the averaged gradients of the pieces this node
 * owns, between an at_end iteration's reductions and its step (see
 * gradpass.h): GradScaler's unscale with its non-finite check and the
 * squared 2-norm per group, then clip_grad_norm_'s factor.
 *
 * They run on the worker pool, one task per HOST_CHUNK of a piece, like the
 * step. Each chunk keeps its own partial sum (double) and the chunks are
 * added in order afterwards, so the norms are the same bits on every run
 * whatever thread ran what (the order gradelem.h defines, which the CUDA
 * backend's kernels follow too). The gradients are the owners' gradient buffers,
 * where REDUCE left the average (docs/DATAPLANE.md), so these are host
 * pointers: the host backend's pass only.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "common.h"
#include "exec/gradpass.h"
#include "base/hostmem.h"
#include "optim/gradelem.h"
#include "base/pool.h"

struct pass {
	float *const *grads;
	const struct optim_piece *pcs;
	uint32_t npieces;
	const uint64_t *first; /* [npieces + 1]: first chunk of each piece */
	bool scale;
	float inv_scale;
	const float *coef; /* clip: per group */
	double *sumsq;     /* measure: per chunk */
	uint32_t *nonfinite;
};

_Static_assert(OPTIM_NORM_CHUNK == HOST_CHUNK, "the norm's chunks are the pass's");
_Static_assert(OPTIM_NORM_CHUNK % OPTIM_NORM_LANES == 0 &&
		       (OPTIM_NORM_LANES & (OPTIM_NORM_LANES - 1)) == 0,
	       "whole rows of lanes, a tree of halves");

/* The piece of chunk i and the chunk's place in it. *ret_g points at the
 * chunk's first element, of the piece's dtype (cast: see lowp_get). */
static const struct optim_piece *chunk_of(const struct pass *t, size_t i, float **ret_g,
					  size_t *ret_n)
{
	uint32_t lo = 0, hi = t->npieces;

	while (hi - lo > 1) {
		uint32_t mid = lo + (hi - lo) / 2;
		if (t->first[mid] <= i)
			lo = mid;
		else
			hi = mid;
	}
	const struct optim_piece *pc = &t->pcs[lo];
	uint64_t x = (i - t->first[lo]) * HOST_CHUNK;
	if (pc->dtype == ZC_DTYPE_F32)
		*ret_g = t->grads[pc->owner] + pc->off + x;
	else
		*ret_g = (float *)((uint16_t *)t->grads[pc->owner] + pc->off + x);
	*ret_n = (size_t)MIN((uint64_t)HOST_CHUNK, pc->n - x);
	return pc;
}

/* As torch's _amp_foreach_non_finite_check_and_unscale_: the input is
 * checked, then multiplied (not at all when inv_scale is 1). */
static void measure_chunk(void *arg, size_t i)
{
	const struct pass *t = arg;
	float *g;
	size_t n;
	enum zc_dtype dt = chunk_of(t, i, &g, &n)->dtype;

	t->sumsq[i] = optim_grad_measure(g, 0, n, dt, t->scale, t->inv_scale, &t->nonfinite[i]);
}

static void clip_chunk(void *arg, size_t i)
{
	const struct pass *t = arg;
	float *g;
	size_t n;
	const struct optim_piece *pc = chunk_of(t, i, &g, &n);
	float c = t->coef[pc->group];

	if (c >= 1.0f)
		return;
	for (size_t k = 0; k < n; k++)
		optim_grad_scale(g, k, pc->dtype, c);
}

/* Chunk numbering over the pieces; *ret_first is malloc'd. */
static int chunks(const struct optim_piece *pcs, uint32_t n, uint64_t **ret_first, uint64_t *ret_n)
{
	uint64_t *first = malloc((n + 1) * sizeof(*first)), c = 0;

	if (!first)
		return -ENOMEM;
	for (uint32_t k = 0; k < n; k++) {
		first[k] = c;
		c += (pcs[k].n + HOST_CHUNK - 1) / HOST_CHUNK;
	}
	first[n] = c;
	*ret_first = first;
	*ret_n = c;
	return 0;
}

int gradpass_measure(struct pool *pool, float *const *grads, const struct optim_piece *pcs,
		     uint32_t npieces, bool scale, float inv_scale, double *sumsq,
		     double *ret_nonfinite)
{
	struct pass t = {.grads = grads,
			 .pcs = pcs,
			 .npieces = npieces,
			 .scale = scale,
			 .inv_scale = inv_scale};
	uint64_t *first, nch;
	double bad = 0;
	int r;

	if (npieces == 0) {
		*ret_nonfinite = 0;
		return 0;
	}
	r = chunks(pcs, npieces, &first, &nch);
	if (r < 0)
		return r;
	t.first = first;
	t.sumsq = malloc(nch * sizeof(*t.sumsq));
	t.nonfinite = malloc(nch * sizeof(*t.nonfinite));
	if (!t.sumsq || !t.nonfinite) {
		r = -ENOMEM;
		goto out;
	}
	r = pool_parallel_for(pool, nch, measure_chunk, &t);
	if (r < 0)
		goto out;
	for (uint32_t k = 0; k < npieces; k++)
		for (uint64_t i = first[k]; i < first[k + 1]; i++) {
			sumsq[pcs[k].group] += t.sumsq[i];
			bad += t.nonfinite[i];
		}
	*ret_nonfinite = bad;
out:
	free(t.sumsq);
	free(t.nonfinite);
	free(first);
	return r;
}

int gradpass_clip(struct pool *pool, float *const *grads, const struct optim_piece *pcs,
		  uint32_t npieces, const float *coef)
{
	struct pass t = {.grads = grads, .pcs = pcs, .npieces = npieces, .coef = coef};
	uint64_t *first, nch;
	int r;

	if (npieces == 0)
		return 0;
	r = chunks(pcs, npieces, &first, &nch);
	if (r < 0)
		return r;
	t.first = first;
	r = pool_parallel_for(pool, nch, clip_chunk, &t);
	free(first);
	return r;
}

float gradpass_clip_coef(double max_norm, double total_norm)
{
	/* torch: clip_coef = max_norm / (total_norm + 1e-6), clamped to 1.0;
	 * a NaN norm gives NaN, which torch multiplies in too */
	double c = max_norm / (total_norm + 1e-6);

	return c >= 1.0 ? 1.0f : (float)c;
}
