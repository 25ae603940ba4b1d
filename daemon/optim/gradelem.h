/*
 * gradelem.h — the arithmetic of the at_end passes over the averaged
 * gradients (GradScaler's unscale with its non-finite check, the squared
 * norm clip_grad_norm_ needs, its clip), in one place for both backends:
 * gradpass.c runs it on the CPU workers, kern.h's kernels on the GPU (and
 * the test double on the host), so the two agree bit for bit.
 *
 * The summation order of a norm is part of the contract, so it is the same
 * whatever runs it: a piece's gradient is cut into chunks of
 * OPTIM_NORM_CHUNK elements from the piece's start; within a chunk, lane l
 * (of OPTIM_NORM_LANES) adds the squares of elements l, l + LANES,
 * l + 2 LANES, ... in that order into a double starting at 0
 * (optim_grad_lane); then the lanes' sums are added by a fixed tree,
 * lane l += lane l + h for h = LANES / 2, LANES / 4, ..., 1 (optim_norm_tree),
 * lane 0 being the chunk's sum. The GPU runs a block per chunk, a thread per
 * lane (neighbouring threads read neighbouring elements) and the same tree
 * in shared memory (kern.cu); the CPU runs both loops here. The chunks' sums
 * are then added by the caller on the host, in piece order and chunk order,
 * into the group's sum.
 */
#ifndef ZEROD_OPTIM_GRADELEM_H
#define ZEROD_OPTIM_GRADELEM_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "hd.h"
#include "lowp.h"

#define OPTIM_NORM_CHUNK (8u * 1024u)

/* a power of two that divides the chunk: kern.cu's threads per block */
#define OPTIM_NORM_LANES 256u

/* Element k of gradient g (dtype dt): counts it into *bad if it is not
 * finite, then, when scale and inv_scale != 1, multiplies it by inv_scale
 * in place (float, rounded back to dt), and returns the square of the
 * result (double), as torch's _amp_foreach_non_finite_check_and_unscale_
 * checks, then multiplies. */
static inline ZD_HD double optim_grad_sq(void *g, uint64_t k, enum zc_dtype dt, bool scale,
					 float inv_scale, uint32_t *bad)
{
	float v = lowp_get(g, k, dt);

	*bad += !isfinite(v);
	if (scale && inv_scale != 1.0f)
		v = lowp_put(g, k, dt, v * inv_scale);
	return (double)v * (double)v;
}

/* Lane l of the chunk of elements x0 .. x0 + n of g: the sum of the squares
 * of its elements x0 + l, x0 + l + LANES, ... below x0 + n, in that order
 * (one GPU thread's part); their non-finite count into *ret_bad. */
static inline ZD_HD double optim_grad_lane(void *g, uint64_t x0, uint64_t n, uint32_t l,
					   enum zc_dtype dt, bool scale, float inv_scale,
					   uint32_t *ret_bad)
{
	double s = 0;
	uint32_t bad = 0;

	for (uint64_t k = x0 + l; k < x0 + n; k += OPTIM_NORM_LANES)
		s += optim_grad_sq(g, k, dt, scale, inv_scale, &bad);
	*ret_bad = bad;
	return s;
}

/* One level of the lanes' tree: lane l += lane l + h, for l < h. The GPU
 * runs the same additions, a thread per l, between barriers. */
static inline ZD_HD void optim_norm_tree_level(double *lane, uint32_t h, uint32_t l)
{
	lane[l] = lane[l] + lane[l + h];
}

/* The chunk of elements x0 .. x0 + n (n <= OPTIM_NORM_CHUNK) of g: the
 * lanes, then the tree; returns lane 0, the chunk's sum of squares, and the
 * chunk's non-finite count in *ret_bad. The host's way to the bits the GPU
 * kernel computes. */
static inline ZD_HD double optim_grad_measure(void *g, uint64_t x0, uint64_t n, enum zc_dtype dt,
					      bool scale, float inv_scale, uint32_t *ret_bad)
{
	double lane[OPTIM_NORM_LANES];
	uint32_t bad = 0;

	/* optim_grad_lane's additions, row by row so the host reads the
	 * chunk in address order: each lane still adds its elements in order */
	for (uint32_t l = 0; l < OPTIM_NORM_LANES; l++)
		lane[l] = 0;
	for (uint64_t row = 0; row < n; row += OPTIM_NORM_LANES)
		for (uint32_t l = 0; l < OPTIM_NORM_LANES && row + l < n; l++)
			lane[l] += optim_grad_sq(g, x0 + row + l, dt, scale, inv_scale, &bad);
	for (uint32_t h = OPTIM_NORM_LANES / 2; h > 0; h /= 2)
		for (uint32_t l = 0; l < h; l++)
			optim_norm_tree_level(lane, h, l);
	*ret_bad = bad;
	return lane[0];
}

/* Clip: element k of g times c (float, rounded back to dt). Callers skip
 * the pass where c >= 1. */
static inline ZD_HD void optim_grad_scale(void *g, uint64_t k, enum zc_dtype dt, float c)
{
	lowp_put(g, k, dt, lowp_get(g, k, dt) * c);
}

#endif
