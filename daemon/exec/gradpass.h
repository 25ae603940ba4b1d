/*
 * gradpass.h — what an at_end step does to the averaged gradients of the
 * pieces this node owns before stepping them (step.c): GradScaler's unscale
 * and non-finite check, the squared norms clip_grad_norm_ needs, and its
 * clip factor. Host buffers, on the worker pool; compute lane only.
 */
#ifndef ZEROD_GRADPASS_H
#define ZEROD_GRADPASS_H

#include <stdbool.h>
#include <stdint.h>

#include "optim/optim.h"

struct pool;

/* For each piece's gradient (grads[owner] + off, n): count the elements that
 * are not finite, then, when scale, multiply each by inv_scale in place
 * (float), and add the squares of the result (double) into sumsq[group].
 * *ret_nonfinite: how many were not finite. 0, -EFAULT (a buffer vanished)
 * or -ENOMEM. */
int gradpass_measure(struct pool *pool, float *const *grads, const struct optim_piece *pcs,
		     uint32_t npieces, bool scale, float inv_scale, double *sumsq,
		     double *ret_nonfinite);

/* Multiply each piece's gradient by coef[group] (float) where it is below 1. */
int gradpass_clip(struct pool *pool, float *const *grads, const struct optim_piece *pcs,
		  uint32_t npieces, const float *coef);

/* clip_grad_norm_'s factor: min(max_norm / (total_norm + 1e-6), 1), as float
 * (computed in double and rounded once; torch computes it in float32, so the
 * two may differ in the last bit). */
float gradpass_clip_coef(double max_norm, double total_norm);

#endif
