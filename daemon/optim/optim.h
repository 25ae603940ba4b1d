/*
 * optim.h — the optimizer backend interface (one ops table per
 * implementation: optim/cpu.c now, optim/cuda later).
 *
 * One call updates n contiguous elements of one parameter group. The update
 * formulas are torch 1.13's (_single_tensor_sgd / _single_tensor_adam /
 * _single_tensor_adamw). Scalars that torch computes in Python (double) are
 * computed in double here and cast to float once; element arithmetic is float,
 * in exactly this order (no contraction into FMA):
 *
 * SGD:   d = maximize ? -g : g
 *        if wd != 0:  d = d + (float)wd * p
 *        if mom != 0: m = first_momentum ? d : (float)mom * m + (float)(1 - dampening) * d
 *                     d = nesterov ? d + (float)mom * m : m
 *        p = p - (float)lr * d
 * Adam:  g = maximize ? -g : g
 *        if wd != 0:  g = g + (float)wd * p
 *        m = m * (float)b1 + (float)(1 - b1) * g
 *        v = v * (float)b2 + ((float)(1 - b2) * g) * g
 *        bc1 = 1 - b1^step, bc2 = 1 - b2^step            (double)
 *        s = lr / bc1, r = sqrt(bc2)                       (double)
 *        amsgrad: vmax = max(vmax, v), use vmax instead of v below
 *        den = sqrtf(v) / (float)r + (float)eps
 *        p = p + ((float)(-s) * m) / den
 * AdamW: g = maximize ? -g : g
 *        p = p * (float)(1 - lr * wd)
 *        then Adam without the wd term.
 */
#ifndef ZEROD_OPTIM_H
#define ZEROD_OPTIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "zeroclient.h"

struct optim_args {
	enum zc_optimizer kind;
	const struct zc_param_group *hp;
	uint64_t step;       /* number of this update, 1 for the first (Adam bias correction) */
	bool first_momentum; /* SGD: no momentum buffer yet (torch's `buf is None`) */
	float *param;        /* fp32 master weights, updated in place */
	const float *grad;   /* averaged gradient */
	float *m;            /* SGD momentum buffer / Adam exp_avg */
	float *v;            /* Adam exp_avg_sq (NULL for SGD) */
	float *vmax;         /* Adam max_exp_avg_sq (used when amsgrad) */
	size_t n;
};

struct optim_ops {
	const char *name;
	/* Apply one update to a->n elements. Called on worker threads, never
	 * the loop; thread-safe for disjoint ranges; pure compute, no errors. */
	void (*step)(const struct optim_args *a);
	/* Floats of state kept per element for kind (m, v, vmax). */
	unsigned (*state_floats)(enum zc_optimizer kind);
};

extern const struct optim_ops optim_cpu_ops;

#endif
