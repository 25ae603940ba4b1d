/*
 * gradelem.h — the arithmetic of the at_end passes over the averaged
 * gradients (GradScaler's unscale with its non-finite check, the squared
 * norm clip_grad_norm_ needs, its clip), in one place for both backends:
 * gradpass.c runs it on the CPU workers, kern.h's kernels on the GPU (and
 * the test double on the host), so the two agree bit for bit.
 *
 * The summation order of a norm is part of the contract, so it is the same
 * whatever runs it: a piece's gradient is cut into chunks of
 * OPTIM_NORM_CHUNK elements from the piece's start; a chunk's squares are
 * added in element order into a double starting at 0 (optim_grad_measure,
 * one thread per chunk on the GPU); the chunks' sums are then added by the
 * caller on the host, in piece order and chunk order, into the group's sum.
 */
#ifndef ZEROD_OPTIM_GRADELEM_H
#define ZEROD_OPTIM_GRADELEM_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "hd.h"
#include "lowp.h"

#define OPTIM_NORM_CHUNK (8u * 1024u)

/* One chunk, elements x0 .. x0 + n of gradient g (dtype dt): count the
 * elements that are not finite into *ret_bad, then, when scale and
 * inv_scale != 1, multiply each by inv_scale in place (float, rounded back
 * to dt), and return the sum of the squares of the result (double), as
 * torch's _amp_foreach_non_finite_check_and_unscale_ checks, then
 * multiplies. */
static inline ZD_HD double optim_grad_measure(void *g, uint64_t x0, uint64_t n, enum zc_dtype dt,
					      bool scale, float inv_scale, uint32_t *ret_bad)
{
	double s = 0;
	uint32_t bad = 0;

	for (uint64_t k = x0; k < x0 + n; k++) {
		float v = lowp_get(g, k, dt);
		bad += !isfinite(v);
		if (scale && inv_scale != 1.0f)
			v = lowp_put(g, k, dt, v * inv_scale);
		s += (double)v * (double)v;
	}
	*ret_bad = bad;
	return s;
}

/* Clip: element k of g times c (float, rounded back to dt). Callers skip
 * the pass where c >= 1. */
static inline ZD_HD void optim_grad_scale(void *g, uint64_t k, enum zc_dtype dt, float c)
{
	lowp_put(g, k, dt, lowp_get(g, k, dt) * c);
}

#endif
