/*
 * kern.h — one kernel launch of the CUDA optimizer backend: its arguments,
 * the per-item body, and the launcher.
 *
 * The bodies are elem.h's, lowp.h's and gradelem.h's arithmetic plus the
 * loads and stores of one item, as ZD_HD functions: the CUDA kernel
 * (kern.cu) runs optim_kern_item once per item on the device, and the test
 * double (tests/gpu/cudadouble.c) runs the very same function on the host,
 * so the double-backed unit tests check this code bit for bit against the
 * CPU kernels, and only the grid-stride loop in kern.cu is left to the GPU
 * test.
 *
 * An item is one element, except for OPTIM_KOP_MEASURE, whose items are the
 * piece's chunks of OPTIM_NORM_CHUNK elements (gradelem.h's summation
 * order: per chunk OPTIM_NORM_LANES lanes, each adding its strided elements
 * in order, then a fixed tree over the lanes). On the host (the double) a
 * chunk is optim_grad_measure, both loops in turn; on the GPU kern.cu runs
 * a block per chunk, a thread per lane, and the tree between barriers, so
 * the GPU adds in the CPU's order and the norms agree bit for bit.
 *
 * bf16/fp16 pieces (zeroclient.h's rules): the averaged gradient is read
 * widened from the owner's gradient buffer, the step runs on the fp32 master
 * (on the owner's device), and the master rounded to nearest even is stored
 * into the owner's parameters, as optim/cpu.c's run_chunk_lowp does.
 */
#ifndef ZEROD_OPTIM_KERN_H
#define ZEROD_OPTIM_KERN_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#include "optim/elem.h"
#include "optim/gradelem.h"
#include "lowp.h"

enum optim_kop {
	OPTIM_KOP_STEP,    /* the optimizer step of each element */
	OPTIM_KOP_CHECK,   /* bf16/fp16: *flag = 1 where p is not the narrowed master */
	OPTIM_KOP_LOAD,    /* bf16/fp16: master = p widened (the job's start) */
	OPTIM_KOP_RELOAD,  /* bf16/fp16: the same where p is not the narrowed master
			    * (zc_params_changed(): hostmem.c's host_reload) */
	OPTIM_KOP_STORE,   /* bf16/fp16: p = master narrowed (an imported master) */
	OPTIM_KOP_MEASURE, /* per chunk: non-finite count, unscale, sum of squares */
	OPTIM_KOP_SCALE,   /* g = g * coef (clipping) */
};

/* Launch arguments: one contiguous range of one parameter group on one
 * device (the owner's), passed to the kernel by value. */
struct optim_kern {
	enum optim_kop op;
	enum zc_optimizer kind;
	enum zc_dtype dtype; /* of p and g */
	union {
		struct optim_sgd_cfg sgd;   /* ZC_OPT_SGD */
		struct optim_adam_cfg adam; /* ZC_OPT_ADAM, ZC_OPT_ADAMW */
	};
	void *p;             /* the owner's parameters (of dtype) */
	void *g;             /* the owner's averaged gradient (of dtype) */
	float *master;       /* bf16/fp16: the fp32 masters, on the owner's device;
			      * fp32 STEP: NULL, or the copy of p the step keeps
			      * (optim.h's keep_params) */
	float *m, *v, *vmax; /* state on the owner's device (NULL where not kept) */
	float coef;          /* MEASURE: inv_scale (used when scale); SCALE: the factor */
	bool scale;
	double *sumsq;   /* MEASURE: [chunks] */
	uint32_t *count; /* MEASURE: [chunks] non-finite; CHECK: the flag */
	uint64_t n;      /* elements */
};

/* How many items a launch has. */
static ZD_INLINE ZD_HD uint64_t optim_kern_items(const struct optim_kern *a)
{
	return a->op == OPTIM_KOP_MEASURE ? (a->n + OPTIM_NORM_CHUNK - 1) / OPTIM_NORM_CHUNK : a->n;
}

/* MEASURE: the elements of chunk i (OPTIM_NORM_CHUNK but for the last). */
static ZD_INLINE ZD_HD uint64_t optim_kern_chunk_n(const struct optim_kern *a, uint64_t i)
{
	uint64_t x0 = i * OPTIM_NORM_CHUNK;

	return a->n - x0 < OPTIM_NORM_CHUNK ? a->n - x0 : OPTIM_NORM_CHUNK;
}

/* The parameter the optimizer steps: the fp32 parameter, or the master. */
static ZD_INLINE ZD_HD float *optim_kern_param(const struct optim_kern *a, uint64_t i)
{
	return a->dtype == ZC_DTYPE_F32 ? (float *)a->p + i : a->master + i;
}

/* After a step of item i: the parameter stored (bf16/fp16: the master
 * narrowed), and an fp32 one's kept copy with it. */
static ZD_INLINE ZD_HD void optim_kern_narrow(const struct optim_kern *a, uint64_t i)
{
	if (a->dtype != ZC_DTYPE_F32)
		((uint16_t *)a->p)[i] = lowp_narrow(a->master[i], a->dtype);
	else if (a->master)
		a->master[i] = ((const float *)a->p)[i];
}

static ZD_INLINE ZD_HD void optim_kern_sgd(const struct optim_kern *a, uint64_t i)
{
	const struct optim_sgd_cfg *c = &a->sgd;
	float *pp = optim_kern_param(a, i);
	float p = *pp, m = c->mode == OPTIM_MOM_LATER ? a->m[i] : 0.0f;

	optim_sgd_elem(&p, &m, lowp_get(a->g, i, a->dtype), c->k, c->maximize, c->wd, c->mode,
		       c->nesterov);
	*pp = p;
	if (c->mode != OPTIM_MOM_NONE)
		a->m[i] = m;
	optim_kern_narrow(a, i);
}

static ZD_INLINE ZD_HD void optim_kern_adam(const struct optim_kern *a, uint64_t i)
{
	const struct optim_adam_cfg *c = &a->adam;
	float *pp = optim_kern_param(a, i);
	float p = *pp, m = a->m[i], v = a->v[i], x = c->amsgrad ? a->vmax[i] : 0.0f;

	optim_adam_elem(&p, &m, &v, &x, lowp_get(a->g, i, a->dtype), c->k, c->maximize, c->wd,
			c->amsgrad);
	*pp = p;
	a->m[i] = m;
	a->v[i] = v;
	if (c->amsgrad)
		a->vmax[i] = x;
	optim_kern_narrow(a, i);
}

/* The master-keeping items of a bf16/fp16 launch. */
static ZD_INLINE ZD_HD void optim_kern_master(const struct optim_kern *a, uint64_t i)
{
	if (a->op == OPTIM_KOP_STORE) {
		optim_kern_narrow(a, i);
		return;
	}
	uint16_t p = ((const uint16_t *)a->p)[i];
	bool same = lowp_same(p, lowp_narrow(a->master[i], a->dtype), a->dtype);

	if (a->op == OPTIM_KOP_CHECK) {
		if (!same)
			*a->count = 1; /* every writer writes the same value */
		return;
	}
	/* a NaN parameter whose master is a NaN is the same (host_reload) */
	if (a->op == OPTIM_KOP_LOAD || !same)
		a->master[i] = lowp_get(a->p, i, a->dtype);
}

/* Item i of the launch. */
static ZD_INLINE ZD_HD void optim_kern_item(const struct optim_kern *a, uint64_t i)
{
	switch (a->op) {
	case OPTIM_KOP_STEP:
		if (a->kind == ZC_OPT_SGD)
			optim_kern_sgd(a, i);
		else
			optim_kern_adam(a, i);
		return;
	case OPTIM_KOP_CHECK:
	case OPTIM_KOP_LOAD:
	case OPTIM_KOP_RELOAD:
	case OPTIM_KOP_STORE:
		optim_kern_master(a, i);
		return;
	case OPTIM_KOP_MEASURE: {
#ifndef __CUDA_ARCH__
		/* the GPU's is kern.cu's block per chunk, never this */
		uint64_t x0 = i * OPTIM_NORM_CHUNK;
		a->sumsq[i] = optim_grad_measure(a->g, x0, optim_kern_chunk_n(a, i), a->dtype,
						 a->scale, a->coef, &a->count[i]);
#endif
		return;
	}
	case OPTIM_KOP_SCALE:
		optim_grad_scale(a->g, i, a->dtype, a->coef);
		return;
	}
}

#ifdef __cplusplus
extern "C" {
#endif

/* Queue the kernel for a's items on stream s; the stream's device must be
 * the current one and own every array. Returns the launch's error
 * (cudaSuccess once queued). Defined by kern.cu in zerod; the test double
 * defines it to run optim_kern_item on the stream's host thread. */
cudaError_t optim_cuda_launch(const struct optim_kern *a, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
