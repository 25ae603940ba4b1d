/*
 * optim.h — the optimizer backend interface (one ops table per
 * implementation: optim/cpu.c, optim/cuda.c).
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
 *
 * bf16/fp16 parameters step an fp32 master with the widened gradient and
 * store the master rounded (lowp.h). The at_end passes (unscale, the
 * squared norms, clipping) are gradelem.h's, whose header states the norm's
 * summation order; both backends keep it, so their norms are the same bits.
 */
#ifndef ZEROD_OPTIM_H
#define ZEROD_OPTIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "zeroclient.h"

struct pool;

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

/* One contiguous range of one parameter group that this node steps. */
struct optim_piece {
	uint32_t group;
	uint32_t owner;      /* rank whose parameters are the master copy */
	uint64_t off;        /* flat element offset into the ranks' buffers */
	uint64_t n;
	uint64_t at;         /* element offset into the state arrays */
	uint64_t step;       /* number of this update, 1 for the first */
	bool first_momentum; /* SGD: no momentum buffer yet */
	uint32_t seg;        /* the plan's segment it lies in, counted over all buckets
				(a segment every rank marks unused skips its pieces) */
	/* bf16/fp16 (zeroclient.h's rules): off counts elements of that type,
	 * and the fp32 master is master[mat .. mat + n) of the call */
	enum zc_dtype dtype;
	uint64_t mat;
};

/* Where a step's gradient comes from. */
enum optim_grad {
	/* sum the local ranks' gradients in rank order, then divide by the
	 * job's world size: the whole job is on this node (fused pass) */
	OPTIM_GRAD_SUM_LOCAL,
	/* the owner's gradient buffer already holds the average (REDUCE) */
	OPTIM_GRAD_OWNER,
};

/* One step call: pieces of some buckets, on a job's context. The result of
 * each piece is stored into the owner's parameters and every other local
 * rank's parameters. */
struct optim_call {
	enum zc_optimizer kind;
	const struct zc_param_group *groups;
	const struct optim_piece *pieces;
	uint32_t npieces;
	enum optim_grad grad;
	float *m, *v, *vmax; /* state arrays (NULL where not kept) */
	/* The masters of the bf16/fp16 pieces (NULL if none). Before stepping a
	 * chunk of such a piece, run checks that the owner's parameters equal
	 * the narrowed masters: where one does not (an edit without
	 * zc_params_changed()), that chunk is left untouched, run returns
	 * ZC_EPARAMEDIT and *edited names the first such piece (index into
	 * pieces). */
	float *master;
	uint32_t *edited;
};

/* A job's buffers on this node, as the optimizer context sees them. */
struct optim_config {
	uint32_t world;
	float *const *grads;    /* [world]: NULL for ranks on other nodes */
	float *const *params;   /* [world] */
	uint32_t nlocal;
	const uint32_t *local; /* the local ranks, ascending */
	struct pool *pool;      /* host: the CPU workers */
	/* A backend that keeps the state (cuda): also keep a copy of each
	 * owned fp32 piece's parameters, made current by every step, so that
	 * the job outlives its trainers' device memory (core/reform.c);
	 * state_io's OPTIM_ARRAY_MASTER reads and writes it. */
	bool keep_params;
	/* ... and the undo journal's copies of the state on the devices
	 * (journal(), state_io's OPTIM_ARRAY_UNDO + array). */
	bool journal;
};

struct optim_ctx;

struct optim_ops {
	const char *name;
	/* Apply one update to a->n elements of host memory. Called on worker
	 * threads, never the loop; thread-safe for disjoint ranges; pure
	 * compute, no errors. NULL where the kernels run elsewhere (cuda). */
	void (*step)(const struct optim_args *a);
	/* Per job: the context its calls run on (host: the pool; cuda: a
	 * stream). Off the loop thread. cfg's arrays are copied. */
	int (*open)(const struct optim_config *cfg, struct optim_ctx **ret);
	/* Run one call to completion (compute lane). 0, -EFAULT if a trainer's
	 * buffer vanished under it, or another negative code. */
	int (*run)(struct optim_ctx *c, const struct optim_call *call);
	/* Free the context. Accepts NULL. No call may be running. */
	void (*close)(struct optim_ctx *c);

	/*
	 * A backend that keeps the job's state itself (cuda: on the owners'
	 * devices) has the members below; NULL in all of them (cpu) means the
	 * executor's host arena (state.h) is the state and calls pass it in
	 * optim_call. All on the executor's lanes, one at a time, never with a
	 * run() in flight; each blocks until its copies and kernels are done.
	 */
	/* Allocate the state of the pieces this node owns (state.h's layout,
	 * pcs sorted by .at), zeroed: the arrays in `arrays` (PLAN_STATE_M,
	 * _V, _VMAX) for every piece, a master for each bf16/fp16 piece. Once
	 * per context, before the first run(); run() then ignores optim_call's
	 * m, v, vmax and master but for whether they are NULL. */
	int (*state_alloc)(struct optim_ctx *c, const struct optim_piece *pcs, uint32_t n,
			   unsigned arrays);
	/* Copy piece pc's array `which` (enum optim_array) to buf (write
	 * false) or from it (write true; buf NULL: zeros). pc is found by .at.
	 * n floats; -EINVAL for a piece or array the state does not have. */
	int (*state_io)(struct optim_ctx *c, const struct optim_piece *pc, unsigned which,
			float *buf, bool write);
	/* Copy `bytes` of host memory buf into local rank r's parameter
	 * buffer, from its start (a recovery's parameters, core/reform.c). */
	int (*params_write)(struct optim_ctx *c, uint32_t r, const void *buf, size_t bytes);
	/* optim_config.journal: before pcs step, each one's arrays and master
	 * (fp32: its kept copy) copied aside on its device, where state_io
	 * reads them as OPTIM_ARRAY_UNDO + the array. */
	int (*journal)(struct optim_ctx *c, const struct optim_piece *pcs, uint32_t n);
	/* The masters of the bf16/fp16 pieces among pcs and their owners'
	 * parameters (enum optim_master: which way). */
	int (*masters)(struct optim_ctx *c, const struct optim_piece *pcs, uint32_t n,
		       unsigned how);
	/* gradpass.h's measure and clip over the owners' gradients (their
	 * device buffers), in gradelem.h's order: the same bits. */
	int (*measure)(struct optim_ctx *c, const struct optim_piece *pcs, uint32_t n, bool scale,
		       float inv_scale, double *sumsq, double *ret_nonfinite);
	int (*clip)(struct optim_ctx *c, const struct optim_piece *pcs, uint32_t n,
		    const float *coef);
};

/* What masters() does. */
enum optim_master {
	OPTIM_MASTER_LOAD,   /* master = the owner's parameter, widened (the start) */
	OPTIM_MASTER_RELOAD, /* the same where the parameter is not the narrowed
			      * master (zc_params_changed(): hostmem.c's host_reload) */
	OPTIM_MASTER_STORE,  /* the owner's parameter = the master, narrowed */
	OPTIM_MASTER_KEEP,   /* keep_params: the fp32 pieces' copies = the owners'
			      * parameters (bf16/fp16 masters untouched) */
};

/* The arrays of state_io. */
enum optim_array {
	OPTIM_ARRAY_M,
	OPTIM_ARRAY_V,
	OPTIM_ARRAY_VMAX,
	OPTIM_ARRAY_MASTER,
	OPTIM_ARRAY_UNDO, /* + one of the above: its copy in the undo journal */
};

extern const struct optim_ops optim_cpu_ops;
extern const struct optim_ops optim_cuda_ops; /* builds with CUDA only */

#endif
