/*
 * kern.h — one optimizer kernel launch of the CUDA backend: its arguments,
 * the per-element body, and the launcher.
 *
 * The body (optim_kern_elem) is elem.h's arithmetic plus the loads and
 * stores of one element, as a ZD_HD function: the CUDA kernel (kern.cu) runs
 * it once per element on the device, and the test double
 * (tests/gpu/cudadouble.c) runs the very same function on the host, so the
 * double-backed unit tests check this code bit for bit against the CPU
 * kernels, and only the grid-stride loop in kern.cu is left to the GPU test.
 *
 * fp32 parameters stepped in place. bf16/fp16 parameters with fp32 masters
 * come with the API issue's dtypes.
 */
#ifndef ZEROD_OPTIM_KERN_H
#define ZEROD_OPTIM_KERN_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#include "optim/elem.h"

/* Launch arguments: one contiguous range of one parameter group on one
 * device (the owner's), passed to the kernel by value. */
struct optim_kern {
	enum zc_optimizer kind;
	union {
		struct optim_sgd_cfg sgd;   /* ZC_OPT_SGD */
		struct optim_adam_cfg adam; /* ZC_OPT_ADAM, ZC_OPT_ADAMW */
	};
	float *p;            /* the owner's parameters */
	const float *g;      /* the owner's averaged gradient */
	float *m, *v, *vmax; /* state on the owner's device (NULL where not kept) */
	uint64_t n;
};

static ZD_INLINE ZD_HD void optim_kern_sgd(const struct optim_kern *a, uint64_t i)
{
	const struct optim_sgd_cfg *c = &a->sgd;
	float p = a->p[i], m = c->mode == OPTIM_MOM_LATER ? a->m[i] : 0.0f;

	optim_sgd_elem(&p, &m, a->g[i], c->k, c->maximize, c->wd, c->mode, c->nesterov);
	a->p[i] = p;
	if (c->mode != OPTIM_MOM_NONE)
		a->m[i] = m;
}

static ZD_INLINE ZD_HD void optim_kern_adam(const struct optim_kern *a, uint64_t i)
{
	const struct optim_adam_cfg *c = &a->adam;
	float p = a->p[i], m = a->m[i], v = a->v[i], x = c->amsgrad ? a->vmax[i] : 0.0f;

	optim_adam_elem(&p, &m, &v, &x, a->g[i], c->k, c->maximize, c->wd, c->amsgrad);
	a->p[i] = p;
	a->m[i] = m;
	a->v[i] = v;
	if (c->amsgrad)
		a->vmax[i] = x;
}

/* Element i of the launch. */
static ZD_INLINE ZD_HD void optim_kern_elem(const struct optim_kern *a, uint64_t i)
{
	if (a->kind == ZC_OPT_SGD)
		optim_kern_sgd(a, i);
	else
		optim_kern_adam(a, i);
}

#ifdef __cplusplus
extern "C" {
#endif

/* Queue the kernel for a->n elements on stream s; the stream's device must
 * be the current one and own every array. Returns the launch's error
 * (cudaSuccess once queued). Defined by kern.cu in zerod; the test double
 * defines it to run optim_kern_elem on the stream's host thread. */
cudaError_t optim_cuda_launch(const struct optim_kern *a, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
