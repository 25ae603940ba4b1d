/*
 * cuda.c — the CUDA optimizer backend: per job a context with one CUDA
 * stream per local rank, on that rank's device; run() launches kern.cu's
 * kernel for each piece on its owner's stream (fp32 parameters stepped in
 * place in the owner's buffer, the averaged gradient read from the owner's
 * gradient buffer) and waits for them. Scalars and flags come from elem.h's
 * setup functions, as on the CPU, so both backends apply the same formulas
 * with the same casts.
 *
 * The state (Adam m, v, vmax; SGD's momentum) lives on the owner's device:
 * each piece's arrays are allocated there the first time the piece is
 * stepped and seeded from the host arena the executor keeps (zeros today, a
 * restored checkpoint later); from then on the device copy is the state. The
 * executor still allocates that host arena (state_alloc) and charges it to
 * --max-memory: placing the arena on the devices is the executor's next
 * change, not this file's.
 *
 * What this backend leaves to others: the parameters of the other ranks are
 * written by BCAST (the op sequence always has one for a backend that does
 * not fuse in-node, zero.h), so run() writes only the owner's buffer; and
 * OPTIM_GRAD_SUM_LOCAL (FUSED) never reaches it.
 *
 * Threads: open, run and close on the executor's lanes (run on the compute
 * lane only, one call at a time), never the loop. bf16/fp16 masters wait for
 * the API issue's dtypes.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "cudacheck.h"
#include "optim/kern.h"
#include "optim/optim.h"

/* One piece's state arrays on its owner's device: m | v | vmax, n each,
 * only those the job keeps. */
struct dstate {
	uint64_t at; /* the piece's offset in the host arena: the key */
	uint64_t n;
	int dev;
	float *buf;
};

struct optim_ctx {
	uint32_t world;
	float **grads, **params; /* [world]: device pointers, NULL off this node */
	int *dev;                /* [world]: the rank's device, -1 off this node */
	cudaStream_t *stream;    /* [world] */
	bool *used;              /* [world]: scratch for run() */
	struct dstate *st;       /* sorted by at */
	uint32_t nst, cap;
};

/* The device that holds p, or a negative code. */
static int ptr_device(const void *p)
{
	struct cudaPointerAttributes a;

	CUDA_TRY(cudaPointerGetAttributes(&a, p));
	/* host memory here means the trainer registered the wrong kind */
	if (a.type != cudaMemoryTypeDevice)
		return -EINVAL;
	return a.device;
}

static void cuda_close(struct optim_ctx *c)
{
	if (!c)
		return;
	for (uint32_t r = 0; c->stream && r < c->world; r++) {
		if (!c->stream[r])
			continue;
		/* nothing may be running, but a failed run() can leave kernels
		 * queued: let them end before their state goes */
		(void)cudaSetDevice(c->dev[r]);
		(void)cudaStreamSynchronize(c->stream[r]);
		(void)cudaStreamDestroy(c->stream[r]);
	}
	for (uint32_t i = 0; i < c->nst; i++) {
		(void)cudaSetDevice(c->st[i].dev);
		(void)cudaFree(c->st[i].buf);
	}
	(void)cudaGetLastError();
	free(c->st);
	free(c->grads);
	free(c->params);
	free(c->dev);
	free(c->stream);
	free(c->used);
	free(c);
}

static int cuda_open(const struct optim_config *cfg, struct optim_ctx **ret)
{
	struct optim_ctx *c = calloc(1, sizeof(*c));
	int r = -ENOMEM;

	if (!c)
		return -ENOMEM;
	c->world = cfg->world;
	c->grads = calloc(cfg->world, sizeof(*c->grads));
	c->params = calloc(cfg->world, sizeof(*c->params));
	c->dev = calloc(cfg->world, sizeof(*c->dev));
	c->stream = calloc(cfg->world, sizeof(*c->stream));
	c->used = calloc(cfg->world, sizeof(*c->used));
	if (!c->grads || !c->params || !c->dev || !c->stream || !c->used)
		goto fail;
	for (uint32_t r0 = 0; r0 < cfg->world; r0++)
		c->dev[r0] = -1;
	for (uint32_t k = 0; k < cfg->nlocal; k++) {
		uint32_t rk = cfg->local[k];
		int d = ptr_device(cfg->params[rk]), dg = ptr_device(cfg->grads[rk]);

		r = d < 0 ? d : dg < 0 ? dg : d != dg ? -EINVAL : 0;
		if (r < 0)
			goto fail;
		c->grads[rk] = cfg->grads[rk];
		c->params[rk] = cfg->params[rk];
		c->dev[rk] = d;
		CUDA_GOTO(cudaSetDevice(d), r, fail);
		CUDA_GOTO(cudaStreamCreateWithFlags(&c->stream[rk], cudaStreamNonBlocking), r,
			  fail);
	}
	*ret = c;
	return 0;
fail:
	cuda_close(c);
	return r;
}

/* The device state of piece pc (owned by a rank on device dev), allocated
 * and seeded from the host arena the first time. */
static int piece_state(struct optim_ctx *c, const struct optim_call *call,
		       const struct optim_piece *pc, int dev, struct dstate **ret)
{
	float *const host[3] = {call->m, call->v, call->vmax};
	uint32_t lo = 0, hi = c->nst, narr = 0;
	struct dstate ns = {.at = pc->at, .n = pc->n, .dev = dev};
	int r;

	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;
		if (c->st[mid].at < pc->at)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo < c->nst && c->st[lo].at == pc->at) {
		/* pieces are fixed for the job: same offset, same piece */
		if (c->st[lo].n != pc->n || c->st[lo].dev != dev)
			return -EINVAL;
		*ret = &c->st[lo];
		return 0;
	}
	if (c->nst == c->cap) {
		uint32_t cap = c->cap ? 2 * c->cap : 16;
		struct dstate *st = realloc(c->st, cap * sizeof(*st));
		if (!st)
			return -ENOMEM;
		c->st = st;
		c->cap = cap;
	}
	for (unsigned a = 0; a < 3; a++)
		narr += host[a] != NULL;
	if (narr) {
		unsigned k = 0;

		CUDA_TRY(cudaMalloc((void **)&ns.buf, pc->n * narr * sizeof(float)));
		for (unsigned a = 0; a < 3; a++) {
			if (!host[a])
				continue;
			CUDA_GOTO(cudaMemcpy(ns.buf + k * pc->n, host[a] + pc->at,
					     pc->n * sizeof(float), cudaMemcpyHostToDevice),
				  r, free_buf);
			k++;
		}
	}
	memmove(&c->st[lo + 1], &c->st[lo], (c->nst - lo) * sizeof(*c->st));
	c->st[lo] = ns;
	c->nst++;
	*ret = &c->st[lo];
	return 0;
free_buf:
	(void)cudaFree(ns.buf);
	return r;
}

/* The state arrays of piece pc inside its device buffer, in the order the
 * host arena's arrays are kept (m, v, vmax; only those that exist). */
static void piece_arrays(const struct optim_call *call, const struct dstate *s, float **m,
			 float **v, float **vmax)
{
	float **out[3] = {m, v, vmax};
	const float *host[3] = {call->m, call->v, call->vmax};
	unsigned k = 0;

	for (unsigned a = 0; a < 3; a++)
		*out[a] = host[a] ? s->buf + (k++) * s->n : NULL;
}

static int cuda_run(struct optim_ctx *c, const struct optim_call *call)
{
	int r = 0;

	if (call->grad != OPTIM_GRAD_OWNER)
		return -EOPNOTSUPP;
	/* fp32 only (backend_cuda.low_precision): never step bf16/fp16 as floats */
	for (uint32_t k = 0; k < call->npieces; k++)
		if (call->pieces[k].dtype != ZC_DTYPE_F32)
			return ZC_ENOTSUP;
	memset(c->used, 0, c->world * sizeof(*c->used));
	for (uint32_t k = 0; k < call->npieces; k++) {
		const struct optim_piece *pc = &call->pieces[k];
		struct optim_kern a = {.kind = call->kind};
		struct dstate *s = NULL;

		if (pc->owner >= c->world || c->dev[pc->owner] < 0) {
			r = -EINVAL; /* a piece of a rank on another node */
			break;
		}
		CUDA_GOTO(cudaSetDevice(c->dev[pc->owner]), r, wait);
		r = piece_state(c, call, pc, c->dev[pc->owner], &s);
		if (r < 0)
			break;
		if (call->kind == ZC_OPT_SGD)
			a.sgd = optim_sgd_setup(&call->groups[pc->group], pc->first_momentum);
		else
			a.adam = optim_adam_setup(&call->groups[pc->group], pc->step,
						  call->kind == ZC_OPT_ADAMW);
		a.p = c->params[pc->owner] + pc->off;
		a.g = c->grads[pc->owner] + pc->off;
		piece_arrays(call, s, &a.m, &a.v, &a.vmax);
		a.n = pc->n;
		c->used[pc->owner] = true;
		CUDA_GOTO(optim_cuda_launch(&a, c->stream[pc->owner]), r, wait);
	}
wait:
	/* even after a failure: what was launched must end before we return */
	for (uint32_t o = 0; o < c->world; o++) {
		int w = 0;

		if (!c->used[o])
			continue;
		CUDA_GOTO(cudaSetDevice(c->dev[o]), w, next);
		CUDA_GOTO(cudaStreamSynchronize(c->stream[o]), w, next);
	next:
		if (r == 0)
			r = w;
	}
	return r;
}

const struct optim_ops optim_cuda_ops = {
	.name = "cuda",
	.step = NULL, /* no per-range host call: every step runs through run() */
	.open = cuda_open,
	.run = cuda_run,
	.close = cuda_close,
};
