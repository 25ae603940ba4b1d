/*
 * step.c — the program's ops on a lane (zero.h): the reductions and
 * broadcasts through the collectives, the step through the optimizer
 * backend with the at_end gradient passes (clipping, a grad scale,
 * segments no rank used, agreed over every node by a gather), zeroing the
 * marked gradients, and reloading the bf16/fp16 masters. Owns nothing of
 * its own: it works on the executor's state (exec_int.h). Lane threads.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "exec/exec_int.h"
#include "exec/gradpass.h"
#include "base/hostmem.h"
#include "base/pool.h"

static uint64_t bucket_elems(const struct exec *e, uint32_t lo, uint32_t hi)
{
	uint64_t n = 0;

	for (uint32_t b = lo; b <= hi; b++)
		n += e->cfg.plan->buckets[b].numel;
	return n;
}

/* A piece of a segment no rank gave a gradient is left alone, as torch
 * leaves a parameter whose .grad is None: no step, its count stays. */
static bool piece_skipped(const struct exec *e, const struct optim_piece *pc)
{
	return e->gused[pc->seg] == 0;
}

/* Name the bucket and segment of a piece whose parameters were edited. */
static void describe_edit(struct exec *e, const struct optim_piece *pc)
{
	const struct plan *p = e->cfg.plan;
	const struct state *s = e->cfg.state;
	uint32_t k = (uint32_t)(pc - s->pieces), b = 0, g = 0;

	while (b + 1 < p->nbuckets && s->bucket_first[b + 1] <= k)
		b++;
	const struct plan_bucket *bk = &p->buckets[b];
	while (g + 1 < bk->nsegments && bk->base + bk->segments[g + 1].offset <= pc->off)
		g++;
	snprintf(e->step_err, sizeof(e->step_err),
		 "bucket %u segment %u (%s, elements %" PRIu64 "..%" PRIu64
		 " of the bucket, owner rank %u): the owner's parameters differ from the "
		 "daemon's fp32 master: call zc_params_changed() on every rank after editing "
		 "them",
		 b, g, plan_dtype_name(bk->dtype), pc->off - bk->base, pc->off - bk->base + pc->n,
		 pc->owner);
}

struct load_task {
	const struct exec *e;
	bool edits_only;
};

static void load_piece(void *arg, size_t k)
{
	const struct load_task *t = arg;
	const struct state *s = t->e->cfg.state;
	const struct optim_piece *pc = &s->pieces[k];
	const uint16_t *p;

	if (pc->dtype == ZC_DTYPE_F32)
		return;
	p = (const uint16_t *)t->e->cfg.params[pc->owner] + pc->off;
	if (t->edits_only)
		host_reload(s->master + pc->mat, p, pc->n, pc->dtype);
	else
		host_widen(s->master + pc->mat, p, pc->n, pc->dtype);
}

/* The masters of the bf16/fp16 pieces from their owners' parameters: all of
 * them when the job starts; after zc_params_changed() those whose parameter
 * was edited (hostmem.h). Host memory is read through the guarded pool as
 * every trainer buffer is (-EFAULT if one shrank); a backend that keeps the
 * state does it itself (cuda: kernels on the owners' devices). */
int load_masters(struct exec *e, bool edits_only)
{
	struct load_task t = {.e = e, .edits_only = edits_only};
	const struct state *s = e->cfg.state;

	if (!s->nmaster)
		return 0;
	if (e->cfg.optim->masters) /* the backend's state (cuda: on the devices) */
		return e->cfg.optim->masters(e->oc, s->pieces, s->npieces,
					     edits_only ? OPTIM_MASTER_RELOAD : OPTIM_MASTER_LOAD);
	return pool_parallel_for(e->cfg.pool, e->cfg.state->npieces, load_piece, &t);
}

/* The undo journal (state.h), before buckets lo..hi step in iteration t:
 * their pieces in chunks over the pool, which reads the trainers'
 * buffers guarded (-EFAULT if one shrank), as every read of them is. */
#define UNDO_CHUNK (64u * 1024)
struct undo_task {
	struct state *s;
	void *const *params;
	uint32_t k0;
	const size_t *first; /* [pieces + 1]: each piece's first chunk */
	uint32_t npieces;
};

static void undo_chunk(void *arg, size_t c)
{
	const struct undo_task *t = arg;
	uint32_t lo = 0, hi = t->npieces;

	while (hi - lo > 1) { /* the piece holding chunk c */
		uint32_t mid = lo + (hi - lo) / 2;
		if (t->first[mid] <= c)
			lo = mid;
		else
			hi = mid;
	}
	const struct optim_piece *pc = &t->s->pieces[t->k0 + lo];
	uint64_t x = (uint64_t)(c - t->first[lo]) * UNDO_CHUNK;
	uint64_t n = pc->n - x < UNDO_CHUNK ? pc->n - x : UNDO_CHUNK;

	state_undo_save(t->s, t->k0 + lo, x, n, t->params);
}

static int undo_save(struct exec *e, uint32_t lo, uint32_t hi, uint64_t t)
{
	struct state *s = e->cfg.state;
	uint32_t k0 = s->bucket_first[lo], k1 = s->bucket_first[hi + 1];
	size_t *first = malloc((k1 - k0 + 1) * sizeof(*first));
	struct undo_task ut = {.s = s,
			       .params = (void *const *)e->cfg.params,
			       .k0 = k0,
			       .first = first,
			       .npieces = k1 - k0};
	int r;

	if (!first)
		return -ENOMEM;
	if (e->cfg.optim->journal) { /* the state on the devices: copied aside there */
		free(first);
		r = e->cfg.optim->journal(e->oc, s->pieces + k0, k1 - k0);
		for (uint32_t k = k0; k < k1 && r >= 0; k++)
			s->undo_pc[k] =
				(struct state_undo){s->pieces[k].step, s->pieces[k].first_momentum};
		for (uint32_t b = lo; b <= hi && r >= 0; b++)
			s->undo_iter[b] = t;
		return r;
	}
	first[0] = 0;
	for (uint32_t k = k0; k < k1; k++) /* a piece of 0 elements still saves its step */
		first[k - k0 + 1] = first[k - k0] + (s->pieces[k].n + UNDO_CHUNK - 1) / UNDO_CHUNK +
				    (s->pieces[k].n == 0);
	r = pool_parallel_for(e->cfg.pool, first[k1 - k0], undo_chunk, &ut);
	free(first);
	if (r < 0)
		return r;
	for (uint32_t b = lo; b <= hi; b++)
		s->undo_iter[b] = t;
	return 0;
}

static int op_step(struct exec *e, uint32_t lo, uint32_t hi, enum optim_grad grad, uint64_t t)
{
	struct state *s = e->cfg.state;
	uint32_t k0 = s->bucket_first[lo], k1 = s->bucket_first[hi + 1], nkeep = 0;
	struct optim_piece *keep = NULL;
	struct optim_call call = {
		.kind = e->cfg.plan->optimizer,
		.groups = e->groups,
		.pieces = s->pieces + k0,
		.npieces = k1 - k0,
		.grad = grad,
		.m = s->m,
		.v = s->v,
		.vmax = s->vmax,
	};
	uint32_t edited = UINT32_MAX;
	int r;

	for (uint32_t k = k0; k < k1; k++)
		nkeep += !piece_skipped(e, &s->pieces[k]);
	if (nkeep == 0)
		return 0;
	call.master = s->master;
	call.edited = &edited;
	if (s->undo_iter && (r = undo_save(e, lo, hi, t)) < 0) {
		free(keep);
		return r;
	}
	if (nkeep < k1 - k0) {
		/* a copy of the pieces that step (backends key their state by
		 * .at, not by position) */
		keep = malloc(nkeep * sizeof(*keep));
		if (!keep)
			return -ENOMEM;
		nkeep = 0;
		for (uint32_t k = k0; k < k1; k++)
			if (!piece_skipped(e, &s->pieces[k]))
				keep[nkeep++] = s->pieces[k];
		call.pieces = keep;
		call.npieces = nkeep;
	}
	r = e->cfg.optim->run(e->oc, &call);
	if (r == ZC_EPARAMEDIT && edited < call.npieces)
		for (uint32_t k = k0; k < k1; k++)
			if (s->pieces[k].at == call.pieces[edited].at)
				describe_edit(e, &s->pieces[k]);
	free(keep);
	if (r < 0)
		return r;
	for (uint32_t k = k0; k < k1; k++) {
		struct optim_piece *pc = &s->pieces[k];
		if (piece_skipped(e, pc))
			continue;
		pc->step++;
		if (e->cfg.plan->optimizer == ZC_OPT_SGD && e->groups[pc->group].momentum != 0)
			pc->first_momentum = false;
		e->stepped += pc->n;
	}
	return 0;
}

struct zero_task {
	struct exec *e;
	uint32_t b;
};

static void zero_one(void *arg, size_t i)
{
	const struct zero_task *t = arg;
	const struct plan *p = t->e->cfg.plan;
	const struct exec_zero *z = &t->e->zero[t->b][i];
	const struct zc_segment *sg = &p->buckets[t->b].segments[z->seg];

	unsigned es = plan_dtype_size(p->buckets[t->b].dtype);

	/* all-zero bits are +0 in fp32, bf16 and fp16 alike */
	memset((char *)t->e->cfg.grads[z->rank] + plan_bucket_offset(p, t->b) + sg->offset * es,
	       0, sg->numel * es);
}

/* Device buffers: the ranges to zero go with the REDUCE (coll_req.zero),
 * which zeroes them on the ranks' streams once their trainers' ready events
 * fired. */
static int zero_list(struct exec *e, struct lane *ln, uint32_t lo, uint32_t hi)
{
	const struct plan *p = e->cfg.plan;

	ln->nzero = 0;
	for (uint32_t b = lo; b <= hi; b++) {
		unsigned es = plan_dtype_size(p->buckets[b].dtype);

		for (uint32_t i = 0; i < e->nzero[b]; i++) {
			const struct exec_zero *z = &e->zero[b][i];
			const struct zc_segment *sg = &p->buckets[b].segments[z->seg];

			if (ln->nzero == ln->zcap) {
				uint32_t cap = ln->zcap ? 2 * ln->zcap : 16;
				struct coll_zero *nz = realloc(ln->zero, cap * sizeof(*nz));
				if (!nz)
					return -ENOMEM;
				ln->zero = nz;
				ln->zcap = cap;
			}
			ln->zero[ln->nzero++] = (struct coll_zero){
				.rank = z->rank,
				.off = plan_bucket_offset(p, b) + sg->offset * es,
				.bytes = sg->numel * es};
		}
	}
	return 0;
}

/* Zero the gradients local ranks marked unused in buckets lo..hi, before
 * anything reads them: a marking rank contributes zero, and a segment every
 * rank marks averages to exactly 0 (finite, no part of any norm). Through
 * the pool, whose guard turns a buffer a trainer shrank into -EFAULT;
 * device buffers through the REDUCE (zero_list). */
static int zero_marked(struct exec *e, uint32_t lo, uint32_t hi)
{
	for (uint32_t b = lo; b <= hi; b++) {
		struct zero_task t = {.e = e, .b = b};
		int r;

		if (!e->nzero[b])
			continue;
		if (!e->cfg.optim->step)
			return -EOPNOTSUPP; /* device buffers: zero_list's */
		r = pool_parallel_for(e->cfg.pool, e->nzero[b], zero_one, &t);
		if (r < 0)
			return r;
	}
	return 0;
}

/* Where the step of buckets lo..hi stands once every node had its say. */
struct step_view {
	bool pass;         /* the gradients were measured (at_end: clip or scale) */
	double nonfinite;  /* elements, over every node */
	double *sumsq;     /* [ngroups], over every node */
};

/* Before a STEP: measure (at_end with clipping or a grad scale), then agree
 * with the other nodes on the segments used, the norms and the scale. The
 * gather carries, per node: has_scale, inv_scale, non-finite count, sumsq
 * per group, used count per segment of the buckets, all as doubles. */
static int step_prepare(struct exec *e, struct lane *ln, uint32_t lo, uint32_t hi,
			struct step_view *v)
{
	const struct plan *p = e->cfg.plan;
	struct state *s = e->cfg.state;
	uint32_t k0 = s->bucket_first[lo], k1 = s->bucket_first[hi + 1];
	uint32_t s0 = e->seg_first[lo], s1 = e->seg_first[hi + 1], ng = p->ngroups;
	size_t n = 3 + ng + (s1 - s0);
	bool clip = p->max_grad_norm != 0;
	double *all;
	int r;

	for (uint32_t g = 0; g < ng; g++)
		clip = clip || e->groups[g].max_grad_norm != 0;
	v->pass = p->step_mode == ZC_STEP_AT_END && (clip || e->has_scale);
	memcpy(e->gused + s0, e->used + s0, (s1 - s0) * sizeof(*e->gused));
	memset(v->sumsq, 0, ng * sizeof(*v->sumsq));
	v->nonfinite = 0;
	if (v->pass) {
		if (e->cfg.optim->measure) /* device buffers: the backend's kernels */
			r = e->cfg.optim->measure(e->oc, s->pieces + k0, k1 - k0, e->has_scale,
						  (float)e->inv_scale, v->sumsq, &v->nonfinite);
		else
			r = gradpass_measure(e->cfg.pool, e->cfg.grads, s->pieces + k0, k1 - k0,
					     e->has_scale, (float)e->inv_scale, v->sumsq,
					     &v->nonfinite);
		if (r < 0)
			return r;
	}
	if (!e->cfg.net)
		return 0;
	if (n > e->gbuf_cap) {
		double *b = realloc(e->gbuf, n * sizeof(double));
		if (!b)
			return -ENOMEM;
		e->gbuf = b;
		e->gbuf_cap = n;
	}
	e->gbuf[0] = e->has_scale;
	e->gbuf[1] = e->has_scale ? e->inv_scale : 0;
	e->gbuf[2] = v->nonfinite;
	memcpy(e->gbuf + 3, v->sumsq, ng * sizeof(double));
	for (uint32_t i = s0; i < s1; i++)
		e->gbuf[3 + ng + (i - s0)] = e->used[i];
	r = lane_gather(e, ln, n, &all);
	if (r < 0)
		return r;
	v->nonfinite = 0;
	memset(v->sumsq, 0, ng * sizeof(*v->sumsq));
	memset(e->gused + s0, 0, (s1 - s0) * sizeof(*e->gused));
	for (uint32_t k = 0; k < e->cfg.net->nnodes; k++) {
		const double *x = all + (size_t)k * n;
		if (x[0] != all[0] || x[1] != all[1]) {
			snprintf(e->sem_err, sizeof(e->sem_err),
				 "the nodes disagree on the grad scale: node 0 %s %g, node %u %s %g",
				 all[0] ? "inv_scale" : "has none", all[1],
				 k, x[0] ? "inv_scale" : "has none", x[1]);
			return ZC_EHYPER;
		}
		v->nonfinite += x[2];
		for (uint32_t g = 0; g < ng; g++)
			v->sumsq[g] += x[3 + g];
		for (uint32_t i = s0; i < s1; i++)
			e->gused[i] += (uint32_t)x[3 + ng + (i - s0)];
	}
	return 0;
}

/* STEP of buckets lo..hi: agree, then skip the iteration (found_inf), clip,
 * and step what was used. */
static int op_step_all(struct exec *e, struct lane *ln, uint32_t lo, uint32_t hi, uint64_t t)
{
	const struct plan *p = e->cfg.plan;
	struct state *s = e->cfg.state;
	uint32_t k0 = s->bucket_first[lo], k1 = s->bucket_first[hi + 1], ng = p->ngroups;
	double sumsq[ng], total = 0;
	float coef[ng];
	struct step_view v = {.sumsq = sumsq};
	bool clip = false;
	int r;

	r = step_prepare(e, ln, lo, hi, &v);
	if (r < 0)
		return r;
	if (v.pass) {
		for (uint32_t g = 0; g < ng; g++)
			total += sumsq[g];
		total = sqrt(total);
		pthread_mutex_lock(&e->mu);
		if (e->step_done) {
			e->step_done->grad_norm = total;
			e->step_done->found_inf = e->has_scale && v.nonfinite > 0;
		}
		pthread_mutex_unlock(&e->mu);
		if (e->has_scale && v.nonfinite > 0)
			return 0; /* GradScaler: the whole step is skipped, on every rank */
		for (uint32_t g = 0; g < ng; g++) {
			double mx = p->max_grad_norm ? p->max_grad_norm : e->groups[g].max_grad_norm;
			double norm = p->max_grad_norm ? total : sqrt(sumsq[g]);
			coef[g] = mx != 0 ? gradpass_clip_coef(mx, norm) : 1.0f;
			clip = clip || !(coef[g] >= 1.0f);
		}
		if (clip) {
			r = e->cfg.optim->clip
				    ? e->cfg.optim->clip(e->oc, s->pieces + k0, k1 - k0, coef)
				    : gradpass_clip(e->cfg.pool, e->cfg.grads, s->pieces + k0,
						    k1 - k0, coef);
			if (r < 0)
				return r;
		}
	}
	return op_step(e, lo, hi, OPTIM_GRAD_OWNER, t);
}

int op_prog(struct exec *e, struct lane *ln, const struct zop *z, uint64_t t)
{
	const struct shard_map *sm = e->cfg.shard;
	enum zc_shard_mode mode = e->cfg.plan->shard_mode;
	uint32_t u0 = sm->bucket_first[z->lo], u1 = sm->bucket_first[z->hi + 1];
	int r;

	switch (z->kind) {
	case ZOP_FUSED:
		r = zero_marked(e, z->lo, z->hi);
		if (r >= 0) {
			memcpy(e->gused + e->seg_first[z->lo], e->used + e->seg_first[z->lo],
			       (e->seg_first[z->hi + 1] - e->seg_first[z->lo]) * sizeof(*e->gused));
			r = op_step(e, z->lo, z->hi, OPTIM_GRAD_SUM_LOCAL, t);
		}
		if (r >= 0)
			e->reduced += bucket_elems(e, z->lo, z->hi);
		return r;
	case ZOP_STEP:
		return op_step_all(e, ln, z->lo, z->hi, t);
	case ZOP_REDUCE:
		if (e->cfg.optim->step)
			r = zero_marked(e, z->lo, z->hi);
		else
			r = zero_list(e, ln, z->lo, z->hi);
		/* the trainers' streams said the gradients are written */
		ln->ev = COLL_EV_WAIT_READY;
		ln->ev_lo = z->lo, ln->ev_hi = z->hi, ln->ev_iter = t;
		ln->pass_on_submit = true; /* its one collective */
		if (r >= 0)
			r = lane_coll(e, ln, COLL_REDUCE, mode, e->ranges + u0, u1 - u0);
		ln->ev = 0;
		ln->nzero = 0;
		if (r >= 0)
			e->reduced += bucket_elems(e, z->lo, z->hi);
		return r;
	case ZOP_BCAST:
		/* the last op of these buckets: the parameters are in */
		ln->ev = COLL_EV_RECORD_DONE;
		ln->ev_lo = z->lo, ln->ev_hi = z->hi, ln->ev_iter = t;
		ln->pass_on_submit = true; /* its one collective */
		r = lane_coll(e, ln, COLL_BCAST, mode, e->ranges + u0, u1 - u0);
		ln->ev = 0;
		if (r >= 0)
			e->bcast += bucket_elems(e, z->lo, z->hi);
		return r;
	}
	return -EINVAL;
}
