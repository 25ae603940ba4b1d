/*
 * cuda.c — the CUDA optimizer backend: per job a context with one CUDA
 * stream per local rank, on that rank's device; run() launches kern.cu's
 * kernel for each piece on its owner's stream (fp32 parameters stepped in
 * place in the owner's buffer, bf16/fp16 ones through their fp32 masters,
 * the averaged gradient read from the owner's gradient buffer) and waits
 * for them. Scalars and flags come from elem.h's setup functions, as on the
 * CPU, so both backends apply the same formulas with the same casts.
 *
 * The state lives on the owners' devices and nowhere else (optim.h's
 * state_alloc ... clip): for each local owner rank one allocation on its
 * device, compact over the pieces it owns: m | v | vmax (those the job
 * keeps), nelems floats each, then the masters of its bf16/fp16 pieces
 * (with keep_params a slot for every piece: an fp32 one's holds the copy
 * of its parameters, which the step kernel writes with them). The
 * executor keeps the layout (state.h) but no host arena, charges these
 * bytes to --max-memory and, per device, to --max-device-memory (job.c,
 * devmem.c), and exports and imports the state through state_io (blocking
 * copies, on its lanes). The at_end passes (unscale, norms, clipping) run
 * here as kernels in gradelem.h's order, so their norms are the CPU's bits.
 *
 * Device memory is allocated by state_alloc and freed by close, never in
 * between: a cudaMalloc or cudaFree while the job runs would wait for the
 * whole device, NCCL kernels waiting on peers and streams waiting on
 * trainers' events included. So each owner's scratch (the edit flags, the
 * norm's chunk sums and counts) is sized there for the most any call can
 * need: a flag per piece it owns, a sum and a count per chunk of them.
 *
 * A bf16/fp16 run() first checks every such piece's parameters against its
 * narrowed master; if one was edited (without zc_params_changed()) nothing
 * is stepped and run() returns ZC_EPARAMEDIT naming the first (the CPU
 * leaves only the edited chunks untouched: either way the step fails).
 *
 * What this backend leaves to others: the parameters of the other ranks are
 * written by BCAST (the op sequence always has one for a backend that does
 * not fuse in-node, zero.h), so run() writes only the owner's buffer; and
 * OPTIM_GRAD_SUM_LOCAL (FUSED) never reaches it.
 *
 * Threads: everything on the executor's lanes (run on the compute lane
 * only, one call at a time), never the loop.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "base/cudacheck.h"
#include "optim/kern.h"
#include "optim/optim.h"
#include "plan.h"

/* One local owner rank's state, on its device. */
struct rstate {
	float *base;   /* the one allocation (NULL: the rank owns nothing) */
	float *arr[3]; /* m, v, vmax: nelems each, NULL where not kept */
	float *master; /* nmaster floats */
	float *undo;   /* optim_config.journal: a mirror of base, the journal's copies */
	uint64_t nelems, nmaster;
	void *scratch; /* flags or the norm's chunk sums and counts: npieces
			* words, nchunks CHUNK_BYTES, whichever is more */
	uint32_t npieces; /* the pieces it owns */
	uint64_t nchunks; /* their norm chunks */
};

/* Where a piece's state is in its owner's allocation. */
struct dpiece {
	uint64_t at; /* the layout's offset: the key (run() gets copies of pieces) */
	uint64_t n;
	uint32_t owner;
	uint64_t dat, dmat;
	uint32_t oidx;   /* its index among its owner's pieces: its edit flag */
	uint64_t chunk0; /* its first chunk among its owner's: its norm sums */
};

struct optim_ctx {
	uint32_t world;
	void **grads, **params; /* [world]: device pointers, NULL off this node */
	int *dev;               /* [world]: the rank's device, -1 off this node */
	cudaStream_t *stream;   /* [world] */
	bool *used;             /* [world]: the streams a call queued work on */
	struct rstate *rs;      /* [world] */
	bool allocated;
	struct dpiece *dp; /* sorted by at */
	uint32_t ndp;
	bool keep;    /* optim_config.keep_params: fp32 pieces have a master slot too */
	bool journal; /* optim_config.journal: every rank's state has its undo mirror */
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
	for (uint32_t r = 0; c->rs && r < c->world; r++) {
		if (!c->rs[r].base && !c->rs[r].scratch)
			continue;
		(void)cudaSetDevice(c->dev[r]);
		(void)cudaFree(c->rs[r].base);
		(void)cudaFree(c->rs[r].undo);
		(void)cudaFree(c->rs[r].scratch);
	}
	(void)cudaGetLastError();
	free(c->dp);
	free(c->rs);
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
	c->keep = cfg->keep_params;
	c->journal = cfg->journal;
	c->grads = calloc(cfg->world, sizeof(*c->grads));
	c->params = calloc(cfg->world, sizeof(*c->params));
	c->dev = calloc(cfg->world, sizeof(*c->dev));
	c->stream = calloc(cfg->world, sizeof(*c->stream));
	c->used = calloc(cfg->world, sizeof(*c->used));
	c->rs = calloc(cfg->world, sizeof(*c->rs));
	if (!c->grads || !c->params || !c->dev || !c->stream || !c->used || !c->rs)
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

static bool local_rank(const struct optim_ctx *c, uint32_t r)
{
	return r < c->world && c->dev[r] >= 0;
}

/* Rank r's stream is non-blocking: plain cudaMemcpy/cudaMemset would not be
 * ordered with its kernels, so copies go on the stream and are waited for.
 * src NULL: set bytes of dst to zero. */
static int copy_sync(struct optim_ctx *c, uint32_t r, void *dst, const void *src, size_t bytes,
		     enum cudaMemcpyKind kind)
{
	CUDA_TRY(cudaSetDevice(c->dev[r]));
	if (src)
		CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, kind, c->stream[r]));
	else
		CUDA_TRY(cudaMemsetAsync(dst, 0, bytes, c->stream[r]));
	CUDA_TRY(cudaStreamSynchronize(c->stream[r]));
	return 0;
}

/* ----------------------------------------------------------- the state --- */

static uint64_t nchunks(const struct optim_piece *pc)
{
	return (pc->n + OPTIM_NORM_CHUNK - 1) / OPTIM_NORM_CHUNK;
}

/* A chunk's sum (double) and non-finite count (uint32) in its owner's
 * scratch: the owner's nchunks sums, then as many counts. */
#define CHUNK_BYTES (sizeof(double) + sizeof(uint32_t))

/* The most any call needs of rank rs's scratch. */
static size_t scratch_bytes(const struct rstate *rs)
{
	size_t flags = rs->npieces * sizeof(uint32_t), sums = rs->nchunks * CHUNK_BYTES;

	return flags > sums ? flags : sums; /* > 0: the owner has a piece */
}

static int cuda_state_alloc(struct optim_ctx *c, const struct optim_piece *pcs, uint32_t n,
			    unsigned arrays)
{
	unsigned narr = !!(arrays & PLAN_STATE_M) + !!(arrays & PLAN_STATE_V) +
			!!(arrays & PLAN_STATE_VMAX);

	if (c->allocated || c->dp)
		return -EALREADY;
	c->dp = calloc(n ? n : 1, sizeof(*c->dp));
	if (!c->dp)
		return -ENOMEM;
	for (uint32_t k = 0; k < n; k++) {
		const struct optim_piece *pc = &pcs[k];
		struct rstate *rs;

		if (!local_rank(c, pc->owner) || (k > 0 && pc->at <= pcs[k - 1].at))
			return -EINVAL; /* a rank of another node, or not the layout */
		rs = &c->rs[pc->owner];
		c->dp[k] = (struct dpiece){.at = pc->at,
					   .n = pc->n,
					   .owner = pc->owner,
					   .dat = rs->nelems,
					   .dmat = rs->nmaster,
					   .oidx = rs->npieces,
					   .chunk0 = rs->nchunks};
		rs->npieces++;
		rs->nchunks += nchunks(pc);
		rs->nelems += pc->n;
		if (pc->dtype != ZC_DTYPE_F32 || c->keep)
			rs->nmaster += pc->n;
	}
	c->ndp = n;
	for (uint32_t r = 0; r < c->world; r++) {
		struct rstate *rs = &c->rs[r];
		uint64_t total = rs->nelems * narr + rs->nmaster;
		float *at;
		int e;

		if (rs->npieces == 0)
			continue;
		CUDA_TRY(cudaSetDevice(c->dev[r]));
		CUDA_TRY(cudaMalloc(&rs->scratch, scratch_bytes(rs)));
		if (total == 0)
			continue; /* only empty pieces: flags, no state */
		CUDA_TRY(cudaMalloc((void **)&rs->base, total * sizeof(float)));
		if (c->journal)
			CUDA_TRY(cudaMalloc((void **)&rs->undo, total * sizeof(float)));
		e = copy_sync(c, r, rs->base, NULL, total * sizeof(float), cudaMemcpyHostToDevice);
		if (e < 0)
			return e;
		at = rs->base;
		for (unsigned a = 0; a < 3; a++)
			if (arrays & (PLAN_STATE_M << a)) {
				rs->arr[a] = at;
				at += rs->nelems;
			}
		rs->master = rs->nmaster ? at : NULL;
	}
	c->allocated = true;
	return 0;
}

/* The state of the piece at layout offset at, or NULL. */
static const struct dpiece *find_piece(const struct optim_ctx *c, uint64_t at)
{
	uint32_t lo = 0, hi = c->ndp;

	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;
		if (c->dp[mid].at < at)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < c->ndp && c->dp[lo].at == at ? &c->dp[lo] : NULL;
}

/* Where the state keeps piece pc, or NULL if it is none of the layout's
 * (pieces are fixed for the job: same offset, same piece). */
static const struct dpiece *known_piece(const struct optim_ctx *c, const struct optim_piece *pc)
{
	const struct dpiece *d = find_piece(c, pc->at);

	return d && d->n == pc->n && d->owner == pc->owner ? d : NULL;
}

/* Piece pc's array `which` (enum optim_array) on its owner's device, or
 * NULL where the state has none; OPTIM_ARRAY_UNDO + which: its copy in the
 * journal's mirror. */
static float *piece_array(const struct optim_ctx *c, const struct optim_piece *pc, unsigned which)
{
	const struct dpiece *d = known_piece(c, pc);
	const struct rstate *rs;
	float *at;

	if (which >= OPTIM_ARRAY_UNDO) {
		at = which - OPTIM_ARRAY_UNDO < OPTIM_ARRAY_UNDO
			     ? piece_array(c, pc, which - OPTIM_ARRAY_UNDO)
			     : NULL;
		return at && d && c->rs[d->owner].undo
			       ? c->rs[d->owner].undo + (at - c->rs[d->owner].base)
			       : NULL;
	}
	if (!d)
		return NULL;
	rs = &c->rs[d->owner];
	if (which == OPTIM_ARRAY_MASTER) /* fp32: the kept copy (keep_params) */
		return (pc->dtype != ZC_DTYPE_F32 || c->keep) && rs->master ? rs->master + d->dmat
									    : NULL;
	return which < 3 && rs->arr[which] ? rs->arr[which] + d->dat : NULL;
}

static int cuda_state_io(struct optim_ctx *c, const struct optim_piece *pc, unsigned which,
			 float *buf, bool write)
{
	float *d = piece_array(c, pc, which);
	size_t bytes = pc->n * sizeof(float);

	if (!d)
		return -EINVAL;
	if (bytes == 0)
		return 0;
	if (write)
		return copy_sync(c, pc->owner, d, buf, bytes, cudaMemcpyHostToDevice);
	return copy_sync(c, pc->owner, buf, d, bytes, cudaMemcpyDeviceToHost);
}

static int cuda_params_write(struct optim_ctx *c, uint32_t r, const void *buf, size_t bytes)
{
	if (!local_rank(c, r))
		return -EINVAL;
	return bytes ? copy_sync(c, r, c->params[r], buf, bytes, cudaMemcpyHostToDevice) : 0;
}

/* Queue on fp32 piece pc's owner stream the copy between its parameters
 * and its kept copy (keep_params): to the copy, or back from it. */
static int copy_kept(struct optim_ctx *c, const struct optim_piece *pc, bool to_copy)
{
	float *k = piece_array(c, pc, OPTIM_ARRAY_MASTER);
	float *p = (float *)c->params[pc->owner] + pc->off;
	size_t bytes = pc->n * sizeof(float);

	if (!k || !local_rank(c, pc->owner))
		return -EINVAL;
	if (bytes == 0)
		return 0;
	c->used[pc->owner] = true;
	CUDA_TRY(cudaSetDevice(c->dev[pc->owner]));
	CUDA_TRY(cudaMemcpyAsync(to_copy ? k : p, to_copy ? p : k, bytes, cudaMemcpyDeviceToDevice,
				 c->stream[pc->owner]));
	return 0;
}

/* Wait for every stream c->used marks: r, or else the first error. */
static int wait_used(struct optim_ctx *c, int r)
{
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

static int cuda_journal(struct optim_ctx *c, const struct optim_piece *pcs, uint32_t n)
{
	int r = 0;

	if (!c->journal || !c->allocated)
		return -EINVAL;
	memset(c->used, 0, c->world * sizeof(*c->used));
	for (uint32_t k = 0; k < n && r == 0; k++) {
		const struct optim_piece *pc = &pcs[k];

		if (!known_piece(c, pc)) {
			r = -EINVAL;
			break;
		}
		for (unsigned a = OPTIM_ARRAY_M; a <= OPTIM_ARRAY_MASTER && r == 0 && pc->n; a++) {
			float *from = piece_array(c, pc, a),
			      *to = piece_array(c, pc, OPTIM_ARRAY_UNDO + a);

			if (!from)
				continue;
			c->used[pc->owner] = true;
			CUDA_GOTO(cudaSetDevice(c->dev[pc->owner]), r, out);
			CUDA_GOTO(cudaMemcpyAsync(to, from, pc->n * sizeof(float),
						  cudaMemcpyDeviceToDevice, c->stream[pc->owner]),
				  r, out);
		}
	}
out:
	return wait_used(c, r);
}

/* Queue launch a over piece pc on its owner's stream. */
static int launch(struct optim_ctx *c, const struct optim_piece *pc, struct optim_kern *a)
{
	size_t es = plan_dtype_size(pc->dtype);

	if (!local_rank(c, pc->owner))
		return -EINVAL; /* a piece of a rank on another node */
	a->p = (char *)c->params[pc->owner] + pc->off * es;
	a->g = (char *)c->grads[pc->owner] + pc->off * es;
	a->dtype = pc->dtype;
	a->n = pc->n;
	c->used[pc->owner] = true;
	CUDA_TRY(cudaSetDevice(c->dev[pc->owner]));
	CUDA_TRY(optim_cuda_launch(a, c->stream[pc->owner]));
	return 0;
}

static int cuda_masters(struct optim_ctx *c, const struct optim_piece *pcs, uint32_t n,
			unsigned how)
{
	static const enum optim_kop ops[] = {
		[OPTIM_MASTER_LOAD] = OPTIM_KOP_LOAD,
		[OPTIM_MASTER_RELOAD] = OPTIM_KOP_RELOAD,
		[OPTIM_MASTER_STORE] = OPTIM_KOP_STORE,
	};
	int r = 0;

	if (how > OPTIM_MASTER_KEEP || (how == OPTIM_MASTER_KEEP && !c->keep))
		return -EINVAL;
	memset(c->used, 0, c->world * sizeof(*c->used));
	for (uint32_t k = 0; k < n && r == 0; k++) {
		struct optim_kern a = {.op = how < ARRAY_SIZE(ops) ? ops[how] : OPTIM_KOP_LOAD};

		/* fp32: the owner's parameters are the master; a kept copy is
		 * made again from them (KEEP, RELOAD), or they from it (STORE) */
		if (pcs[k].dtype == ZC_DTYPE_F32) {
			if (c->keep && how != OPTIM_MASTER_LOAD)
				r = copy_kept(c, &pcs[k], how != OPTIM_MASTER_STORE);
			continue;
		}
		if (how == OPTIM_MASTER_KEEP)
			continue;
		a.master = piece_array(c, &pcs[k], OPTIM_ARRAY_MASTER);
		r = a.master ? launch(c, &pcs[k], &a) : -EINVAL;
	}
	return wait_used(c, r);
}

/* ------------------------------------------------------------- the step --- */

/* bf16/fp16: the first piece (index into pcs) whose parameters are no
 * longer its narrowed master into *ret_first, or n if none. Each piece's
 * flag is its owner's scratch word at the piece's index among the owner's. */
static int check_edits(struct optim_ctx *c, const struct optim_piece *pcs, uint32_t n,
		       uint32_t *ret_first)
{
	uint32_t *flags, most = 1;
	int r = 0;

	for (uint32_t o = 0; o < c->world; o++)
		most = c->rs[o].npieces > most ? c->rs[o].npieces : most;
	flags = malloc(most * sizeof(*flags));
	if (!flags)
		return -ENOMEM;
	memset(c->used, 0, c->world * sizeof(*c->used));
	for (uint32_t k = 0; k < n && r == 0; k++) {
		struct optim_kern a = {.op = OPTIM_KOP_CHECK};
		const struct dpiece *d = known_piece(c, &pcs[k]);
		uint32_t o = pcs[k].owner;

		if (pcs[k].dtype == ZC_DTYPE_F32)
			continue;
		if (!d) {
			r = -EINVAL;
			break;
		}
		if (!c->used[o]) {
			c->used[o] = true;
			CUDA_GOTO(cudaSetDevice(c->dev[o]), r, out);
			CUDA_GOTO(cudaMemsetAsync(c->rs[o].scratch, 0,
						  c->rs[o].npieces * sizeof(uint32_t), c->stream[o]),
				  r, out);
		}
		a.master = piece_array(c, &pcs[k], OPTIM_ARRAY_MASTER);
		a.count = (uint32_t *)c->rs[o].scratch + d->oidx;
		r = a.master ? launch(c, &pcs[k], &a) : -EINVAL;
	}
out:
	r = wait_used(c, r);
	*ret_first = n;
	for (uint32_t o = 0; o < c->world && r == 0; o++) {
		if (!c->used[o] ||
		    (r = copy_sync(c, o, flags, c->rs[o].scratch,
				   c->rs[o].npieces * sizeof(*flags), cudaMemcpyDeviceToHost)) < 0)
			continue;
		for (uint32_t k = 0; k < *ret_first; k++)
			if (pcs[k].owner == o && pcs[k].dtype != ZC_DTYPE_F32 &&
			    flags[known_piece(c, &pcs[k])->oidx])
				*ret_first = k;
	}
	free(flags);
	return r;
}

static int cuda_run(struct optim_ctx *c, const struct optim_call *call)
{
	bool lowp = false;
	uint32_t first;
	int r = 0;

	if (call->grad != OPTIM_GRAD_OWNER)
		return -EOPNOTSUPP;
	for (uint32_t k = 0; k < call->npieces; k++) {
		if (!local_rank(c, call->pieces[k].owner))
			return -EINVAL; /* a piece of a rank on another node */
		lowp = lowp || call->pieces[k].dtype != ZC_DTYPE_F32;
	}
	if (!c->allocated)
		return -EINVAL; /* no state_alloc */
	if (lowp) {
		r = check_edits(c, call->pieces, call->npieces, &first);
		if (r < 0)
			return r;
		if (first < call->npieces) {
			if (call->edited)
				*call->edited = first;
			return ZC_EPARAMEDIT;
		}
	}
	memset(c->used, 0, c->world * sizeof(*c->used));
	for (uint32_t k = 0; k < call->npieces && r == 0; k++) {
		const struct optim_piece *pc = &call->pieces[k];
		struct optim_kern a = {.op = OPTIM_KOP_STEP, .kind = call->kind};

		if (!find_piece(c, pc->at)) {
			r = -EINVAL;
			break;
		}
		if (call->kind == ZC_OPT_SGD)
			a.sgd = optim_sgd_setup(&call->groups[pc->group], pc->first_momentum);
		else
			a.adam = optim_adam_setup(&call->groups[pc->group], pc->step,
						  call->kind == ZC_OPT_ADAMW);
		a.m = piece_array(c, pc, OPTIM_ARRAY_M);
		a.v = piece_array(c, pc, OPTIM_ARRAY_V);
		a.vmax = piece_array(c, pc, OPTIM_ARRAY_VMAX);
		/* fp32: the copy the kernel keeps with the parameter (keep_params) */
		a.master = piece_array(c, pc, OPTIM_ARRAY_MASTER);
		if ((pc->dtype != ZC_DTYPE_F32 || c->keep) && !a.master) {
			r = -EINVAL;
			break;
		}
		r = launch(c, pc, &a);
	}
	/* even after a failure: what was launched must end before we return */
	return wait_used(c, r);
}

/* ------------------------------------------------- the at_end passes --- */

/* Where the norm's chunk sums and counts of piece d go in its owner's
 * scratch: the owner's nchunks sums, then as many counts. */
static double *chunk_sum(const struct optim_ctx *c, const struct dpiece *d)
{
	return (double *)c->rs[d->owner].scratch + d->chunk0;
}

static uint32_t *chunk_count(const struct optim_ctx *c, const struct dpiece *d)
{
	const struct rstate *rs = &c->rs[d->owner];

	return (uint32_t *)((double *)rs->scratch + rs->nchunks) + d->chunk0;
}

static int cuda_measure(struct optim_ctx *c, const struct optim_piece *pcs, uint32_t n, bool scale,
			float inv_scale, double *sumsq, double *ret_nonfinite)
{
	double **host = calloc(c->world, sizeof(*host)), bad = 0;
	int r = 0;

	if (!host)
		return -ENOMEM;
	for (uint32_t k = 0; k < n && r == 0; k++)
		if (!known_piece(c, &pcs[k]))
			r = -EINVAL; /* a rank of another node, or not the layout */
	memset(c->used, 0, c->world * sizeof(*c->used));
	for (uint32_t k = 0; k < n && r == 0; k++) {
		const struct dpiece *d = known_piece(c, &pcs[k]);
		struct optim_kern a = {.op = OPTIM_KOP_MEASURE, .coef = inv_scale, .scale = scale};

		a.sumsq = chunk_sum(c, d);
		a.count = chunk_count(c, d);
		r = launch(c, &pcs[k], &a);
	}
	r = wait_used(c, r);
	for (uint32_t o = 0; o < c->world && r == 0; o++) {
		if (!c->used[o])
			continue;
		host[o] = malloc(c->rs[o].nchunks * CHUNK_BYTES);
		r = host[o] ? copy_sync(c, o, host[o], c->rs[o].scratch,
					c->rs[o].nchunks * CHUNK_BYTES, cudaMemcpyDeviceToHost)
			    : -ENOMEM;
	}
	/* gradpass_measure's order: pieces in order, each piece's chunks in
	 * order, whichever device holds them */
	for (uint32_t k = 0; k < n && r == 0; k++) {
		const struct dpiece *d = known_piece(c, &pcs[k]);
		const double *h = host[d->owner];
		const uint32_t *cnt = (const uint32_t *)(h + c->rs[d->owner].nchunks);

		for (uint64_t i = 0; i < nchunks(&pcs[k]); i++) {
			sumsq[pcs[k].group] += h[d->chunk0 + i];
			bad += cnt[d->chunk0 + i];
		}
	}
	if (r == 0)
		*ret_nonfinite = bad;
	for (uint32_t o = 0; o < c->world; o++)
		free(host[o]);
	free(host);
	return r;
}

static int cuda_clip(struct optim_ctx *c, const struct optim_piece *pcs, uint32_t n,
		     const float *coef)
{
	int r = 0;

	memset(c->used, 0, c->world * sizeof(*c->used));
	for (uint32_t k = 0; k < n && r == 0; k++) {
		struct optim_kern a = {.op = OPTIM_KOP_SCALE, .coef = coef[pcs[k].group]};

		if (a.coef >= 1.0f)
			continue; /* as gradpass.c: a NaN factor is applied */
		r = launch(c, &pcs[k], &a);
	}
	return wait_used(c, r);
}

const struct optim_ops optim_cuda_ops = {
	.name = "cuda",
	.step = NULL, /* no per-range host call: every step runs through run() */
	.open = cuda_open,
	.run = cuda_run,
	.close = cuda_close,
	.state_alloc = cuda_state_alloc,
	.state_io = cuda_state_io,
	.params_write = cuda_params_write,
	.journal = cuda_journal,
	.masters = cuda_masters,
	.measure = cuda_measure,
	.clip = cuda_clip,
};
