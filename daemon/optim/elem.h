/*
 * elem.h — the element arithmetic of every optimizer, in one place. The CPU
 * kernels (optim/cpu.c) and the CUDA kernels (optim/kern.cu, through kern.h)
 * both call these functions, so the bit-exact CPU tests check the very code
 * the GPU runs. The formulas, their order and the casts are optim.h's.
 *
 * Functions work on values, not arrays: the caller loads and stores, so the
 * CPU loop keeps its restrict-qualified arrays (and vectorises) and a CUDA
 * kernel chooses its own memory access. Flags are parameters; the CPU
 * kernels pass constants, so each inlined variant is branch-free.
 *
 * Rounding contract: no contraction into FMA (-ffp-contract=off in C,
 * -fmad=false for nvcc), IEEE division and sqrtf (nvcc's defaults
 * -prec-div=true -prec-sqrt=true, no -ftz), never -ffast-math/--use_fast_math.
 */
#ifndef ZEROD_OPTIM_ELEM_H
#define ZEROD_OPTIM_ELEM_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "hd.h"
#include "zeroclient.h"


/* ----------------------------------------------------------------- SGD --- */

/* SGD's scalars, each cast to float once from torch's double value. */
struct optim_sgd_k {
	float lr, wd, mom;
	float damp1; /* 1 - dampening */
};

enum optim_sgd_mom {
	OPTIM_MOM_NONE,  /* momentum == 0: m is never touched (may be NULL) */
	OPTIM_MOM_FIRST, /* no buffer yet: m = d, dampening not applied (torch's clone) */
	OPTIM_MOM_LATER,
};

/* Everything one SGD step of a range needs besides the arrays. */
struct optim_sgd_cfg {
	struct optim_sgd_k k;
	enum optim_sgd_mom mode;
	bool maximize, wd, nesterov;
};

/* One element: *p and *m (read only in OPTIM_MOM_LATER, written unless
 * OPTIM_MOM_NONE) are the caller's copies of the element's values. */
static ZD_INLINE ZD_HD void optim_sgd_elem(float *p, float *m, float g, struct optim_sgd_k k,
					   bool maximize, bool wd, enum optim_sgd_mom mode,
					   bool nesterov)
{
	float d = maximize ? -g : g;

	if (wd)
		d = d + k.wd * *p;
	if (mode != OPTIM_MOM_NONE) {
		float b = mode == OPTIM_MOM_FIRST ? d : k.mom * *m + k.damp1 * d;
		*m = b;
		d = nesterov ? d + k.mom * b : b;
	}
	*p = *p - k.lr * d;
}

/* ---------------------------------------------------------- Adam/AdamW --- */

/* Adam's scalars, each cast to float once from torch's double value. */
struct optim_adam_k {
	float b1, c1;    /* beta1, 1 - beta1 */
	float b2, c2;    /* beta2, 1 - beta2 */
	float r, eps;    /* sqrt(bias_correction2), eps */
	float neg_s;     /* -(lr / bias_correction1) */
	float wd, decay; /* Adam's L2 weight_decay; AdamW's 1 - lr * weight_decay */
};

enum optim_adam_wd {
	OPTIM_WD_NONE,      /* Adam, weight_decay == 0 */
	OPTIM_WD_L2,        /* Adam: g += wd * p */
	OPTIM_WD_DECOUPLED, /* AdamW: p *= 1 - lr * wd, always (torch multiplies by 1 too) */
};

struct optim_adam_cfg {
	struct optim_adam_k k;
	enum optim_adam_wd wd;
	bool maximize, amsgrad;
};

/* One element: *p, *m, *v and (with amsgrad) *vmax are the caller's copies
 * of the element's values, all read and written. */
static ZD_INLINE ZD_HD void optim_adam_elem(float *p, float *m, float *v, float *vmax, float g,
					    struct optim_adam_k k, bool maximize,
					    enum optim_adam_wd wd, bool amsgrad)
{
	float gi = maximize ? -g : g;
	float pi = *p;

	if (wd == OPTIM_WD_L2)
		gi = gi + k.wd * pi;
	if (wd == OPTIM_WD_DECOUPLED)
		pi = pi * k.decay;
	float mi = *m * k.b1 + k.c1 * gi;
	float vi = *v * k.b2 + (k.c2 * gi) * gi;
	*m = mi;
	*v = vi;
	if (amsgrad) {
		/* torch.maximum: a NaN on either side wins. */
		float x = *vmax;
		x = vi > x || vi != vi ? vi : x;
		*vmax = x;
		vi = x;
	}
	float den = sqrtf(vi) / k.r + k.eps;
	*p = pi + (k.neg_s * mi) / den;
}

/* ---------------------------------------------- per-call scalars (host) --- */

/* C only: the CUDA side gets these values from the host (optim/cuda.c). */
#if !defined(__cplusplus)

/* The scalars and flags of one SGD step, from the group's hyperparameters.
 * Host only: torch computes these in Python (double) and so do we. */
static inline struct optim_sgd_cfg optim_sgd_setup(const struct zc_param_group *hp,
						   bool first_momentum)
{
	struct optim_sgd_cfg c = {
		.k = {.lr = (float)hp->lr,
		      .wd = (float)hp->weight_decay,
		      .mom = (float)hp->momentum,
		      .damp1 = (float)(1 - hp->dampening)},
		.mode = hp->momentum == 0 ? OPTIM_MOM_NONE
			: first_momentum  ? OPTIM_MOM_FIRST
					  : OPTIM_MOM_LATER,
		.maximize = hp->maximize,
		.wd = hp->weight_decay != 0,
	};
	/* nesterov only means something with momentum (torch rejects it otherwise) */
	c.nesterov = c.mode != OPTIM_MOM_NONE && hp->nesterov;
	return c;
}

/* The same for Adam (adamw false) or AdamW; step >= 1. */
static inline struct optim_adam_cfg optim_adam_setup(const struct zc_param_group *hp, uint64_t step,
						     bool adamw)
{
	/* torch computes these in Python floats; pow and sqrt as math.pow / math.sqrt. */
	double bc1 = 1 - pow(hp->beta1, (double)step);
	double bc2 = 1 - pow(hp->beta2, (double)step);
	double s = hp->lr / bc1;
	struct optim_adam_cfg c = {
		.k = {.b1 = (float)hp->beta1,
		      .c1 = (float)(1 - hp->beta1),
		      .b2 = (float)hp->beta2,
		      .c2 = (float)(1 - hp->beta2),
		      .r = (float)sqrt(bc2),
		      .eps = (float)hp->eps,
		      .neg_s = (float)(-s),
		      .wd = (float)hp->weight_decay,
		      .decay = (float)(1 - hp->lr * hp->weight_decay)},
		.wd = adamw                   ? OPTIM_WD_DECOUPLED
		      : hp->weight_decay != 0 ? OPTIM_WD_L2
					      : OPTIM_WD_NONE,
		.maximize = hp->maximize,
		.amsgrad = hp->amsgrad,
	};
	return c;
}
#endif /* !__cplusplus */

#endif
