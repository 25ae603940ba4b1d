/*
 * refoptim.h — the tests' single-process reference optimizers: plain loops
 * in optim.h's order and rounding, which the daemon's results must equal bit
 * for bit. One copy for every test that checks a trained result.
 */
#ifndef ZEROD_TEST_REFOPTIM_H
#define ZEROD_TEST_REFOPTIM_H

#include <stdbool.h>
#include <stdint.h>

#include "zeroclient.h"

/* torch's SGD over n elements; first: no momentum buffer yet. */
void ref_sgd(const struct zc_param_group *h, float *p, const float *g, float *m, bool first,
	     uint64_t n);
/* torch's Adam (decoupled: AdamW) update number `step` (1 for the first). */
void ref_adam(bool decoupled, const struct zc_param_group *h, uint64_t step, float *p,
	      const float *g, float *m, float *v, float *vmax, uint64_t n);

/* torch.nn.utils.clip_grad_norm_'s factor for a total norm: min(max_norm /
 * (total_norm + 1e-6), 1), rounded once to float (torch computes it in
 * float32 tensors: at most the last bit apart). */
float ref_clip_coef(double max_norm, double total_norm);
/* zeroclient.h's bf16/fp16 rules (enum zc_dtype), computed from their
 * definition rather than by bit tricks: the value a pattern stands for, and
 * the pattern nearest to x (ties to the even pattern; past the largest finite
 * value by half an ulp or more: inf). x must not be a NaN. */
double ref_lowp_value(uint16_t h, enum zc_dtype t);
uint16_t ref_lowp_round(float x, enum zc_dtype t);
/* widen: the pattern's value as a float (exact); NaN patterns give NaN */
float ref_lowp_widen(uint16_t h, enum zc_dtype t);

#endif
