/*
 * exec.c — a job's executor (see exec.h).
 *
 * Ordering: every queued op gets a sequence number and, per lane, the number
 * of the last op before it on that lane that touches one of its buckets. A
 * lane finishes its ops in order, so "lane l has finished op n" is one
 * counter per lane, and an op may start once every lane's counter has reached
 * its dependency on that lane. Dependencies only point backwards, so the
 * oldest unfinished op can always run: no deadlock.
 *
 * Iterations do not overlap (the next one's buckets are refused until its
 * StepDone), so one array of op records, one per op of the program, serves
 * every iteration. Completion records are allocated on the loop thread when
 * the op is queued, so posting one cannot fail.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common.h"
#include "mem/cudabufs.h"
#include "exec/exec.h"
#include "exec/gradpass.h"
#include "base/hostmem.h"
#include "base/pool.h"

#define EXEC_SPANS 1024 /* op records kept between two takes */

enum xop_type {
	XOP_START,
	XOP_HYPER,
	XOP_PROG,
	XOP_RELOAD, /* zc_params_changed(): the masters from the owners' parameters */
	XOP_STATE,
};

struct xop {
	enum xop_type type;
	const struct zop *z; /* XOP_PROG */
	uint64_t iteration;
	uint64_t seq;
	uint64_t dep[LANE_COUNT];
	struct zc_param_group *groups; /* XOP_HYPER */
	struct exec_state_req st;      /* XOP_STATE */
	struct exec_done *done;        /* what to post when it succeeds, if anything */
	struct xop *next;
};

struct lane {
	struct exec *e;
	unsigned idx;
	pthread_t thread;
	pthread_cond_t cv; /* this lane has work, a dependency or its collective is done */
	struct xop *head, *tail;
	uint64_t done_seq; /* ops of this lane up to this number are finished */
	/* the collective in flight on this lane */
	struct coll_req req;
	bool req_done;
	int req_status;
	/* the op's event work (coll_req.ev...), set by op_prog for the nccl
	 * backend's event rings; 0 otherwise */
	unsigned ev;
	uint32_t ev_lo, ev_hi;
	uint64_t ev_iter;
	/* device buffers: the marked gradients the op's REDUCE zeroes */
	struct coll_zero *zero;
	uint32_t nzero, zcap;
};

struct exec {
	struct exec_config cfg; /* own copies of grads and params */
	uint32_t *local;        /* the local ranks, ascending */
	uint32_t nlocal;
	struct coll_range *ranges;      /* [nunits]: the shard units, flat */
	struct coll_range *init_ranges; /* [nbuckets]: each bucket whole, from rank 0 */
	struct coll_group *cg;
	struct optim_ctx *oc;
	struct mem_map **gmaps, **pmaps; /* [world]: what the start op opened (cfg.mem) */
	struct zc_param_group *groups; /* compute lane */
	struct xop *xops;              /* [prog->nops] */
	uint64_t *last;                /* [nbuckets][LANE_COUNT]: last op touching b per lane */

	pthread_mutex_t mu; /* one lock; each lane sleeps on its own cv, so a tiny
			     * bucket wakes one thread, not three */
	struct lane lanes[LANE_COUNT];
	unsigned nthreads, alive;
	uint64_t seq;
	uint32_t remaining;          /* ops of the current iteration not yet finished */
	struct exec_done *step_done; /* the current iteration's */
	struct exec_done *fail_done, *stop_done;
	bool stopping, failed, silent;
	char open_err[256]; /* why the collectives could not open, from the backend */
	char step_err[256]; /* why a step failed (an edit without zc_params_changed()) */
	char coll_err[256]; /* why the first collective failed, the backend's words */

	_Atomic uint64_t reduced, stepped, bcast;

	/* Segment masks and the at_end gradient passes (exec_bucket_ex). The
	 * loop writes a bucket's entries under mu before queueing its ops; the
	 * lanes read them while those run. Iterations do not overlap, so a
	 * bucket's entries are not rewritten while its ops may read them. */
	uint32_t nsegs;
	uint32_t *seg_first;     /* [nbuckets + 1] */
	uint32_t *used;          /* [nsegs]: local ranks that gave the segment a gradient */
	uint32_t *gused;         /* [nsegs]: the same over every node (compute lane) */
	struct exec_zero **zero; /* [nbuckets]: gradients to zero before the reduction */
	uint32_t *nzero;         /* [nbuckets] */
	bool has_scale;          /* the iteration's grad scale */
	double inv_scale;
	double *gbuf;            /* gather scratch: (1 + nnodes) parts (compute lane) */
	size_t gbuf_cap;         /* doubles */
	char sem_err[256];       /* why a step refused (ZC_EHYPER), for the failure */

	/* the timeline, while on: a ring of op records, under mu */
	atomic_bool tracing;
	struct exec_span spans[EXEC_SPANS];
	size_t span_head, span_n;
};

/* ------------------------------------------------------------ the ops --- */

static void lane_req_done(struct coll_req *req, int status)
{
	struct lane *ln = (struct lane *)((char *)req - offsetof(struct lane, req));
	struct exec *e = ln->e;

	pthread_mutex_lock(&e->mu);
	ln->req_status = status;
	ln->req_done = true;
	pthread_cond_signal(&ln->cv);
	pthread_mutex_unlock(&e->mu);
}

/* Issue one collective and wait for it: this lane's ops run in order. */
static int lane_coll(struct exec *e, struct lane *ln, enum coll_kind kind,
		     enum zc_shard_mode mode, const struct coll_range *rg, uint32_t n)
{
	int r;

	if (n == 0)
		return 0;
	ln->req = (struct coll_req){.kind = kind,
				    .mode = mode,
				    .lane = ln->idx,
				    .ranges = rg,
				    .nranges = n,
				    .ev = ln->ev,
				    .ev_lo = ln->ev_lo,
				    .ev_hi = ln->ev_hi,
				    .ev_iter = ln->ev_iter,
				    .zero = ln->zero,
				    .nzero = ln->nzero,
				    .done = lane_req_done};
	ln->req_done = false;
	r = e->cfg.coll->submit(e->cg, &ln->req);
	if (r < 0)
		return r;
	pthread_mutex_lock(&e->mu);
	while (!ln->req_done)
		pthread_cond_wait(&ln->cv, &e->mu);
	r = ln->req_status;
	if (r < 0 && r != -ECANCELED && !e->coll_err[0] && e->cfg.coll->last_error)
		snprintf(e->coll_err, sizeof(e->coll_err), "%s",
			 e->cfg.coll->last_error(e->cg, ln->idx));
	pthread_mutex_unlock(&e->mu);
	return r;
}

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
static int load_masters(struct exec *e, bool edits_only)
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

static int op_step(struct exec *e, uint32_t lo, uint32_t hi, enum optim_grad grad)
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

/* Every node's n doubles of `mine`, in node order, into e->gbuf + n (a
 * gather on this lane: the same calls in the same order on every node). */
static int lane_gather(struct exec *e, struct lane *ln, size_t n, double **ret_all)
{
	uint32_t nn = e->cfg.net->nnodes;
	size_t need = n * (1 + (size_t)nn);
	int r;

	if (need > e->gbuf_cap) {
		double *b = realloc(e->gbuf, need * sizeof(double));
		if (!b)
			return -ENOMEM;
		e->gbuf = b;
		e->gbuf_cap = need;
	}
	ln->req = (struct coll_req){.kind = COLL_GATHER,
				    .mode = e->cfg.plan->shard_mode,
				    .lane = ln->idx,
				    .gin = e->gbuf,
				    .gout = e->gbuf + n,
				    .gbytes = n * sizeof(double),
				    .done = lane_req_done};
	ln->req_done = false;
	r = e->cfg.coll->submit(e->cg, &ln->req);
	if (r < 0)
		return r;
	pthread_mutex_lock(&e->mu);
	while (!ln->req_done)
		pthread_cond_wait(&ln->cv, &e->mu);
	r = ln->req_status;
	pthread_mutex_unlock(&e->mu);
	*ret_all = e->gbuf + n;
	return r;
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
static int op_step_all(struct exec *e, struct lane *ln, uint32_t lo, uint32_t hi)
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
	return op_step(e, lo, hi, OPTIM_GRAD_OWNER);
}

static int op_prog(struct exec *e, struct lane *ln, const struct zop *z, uint64_t t)
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
			r = op_step(e, z->lo, z->hi, OPTIM_GRAD_SUM_LOCAL);
		}
		if (r >= 0)
			e->reduced += bucket_elems(e, z->lo, z->hi);
		return r;
	case ZOP_STEP:
		return op_step_all(e, ln, z->lo, z->hi);
	case ZOP_REDUCE:
		if (e->cfg.optim->step)
			r = zero_marked(e, z->lo, z->hi);
		else
			r = zero_list(e, ln, z->lo, z->hi);
		/* the trainers' streams said the gradients are written */
		ln->ev = COLL_EV_WAIT_READY;
		ln->ev_lo = z->lo, ln->ev_hi = z->hi, ln->ev_iter = t;
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
		r = lane_coll(e, ln, COLL_BCAST, mode, e->ranges + u0, u1 - u0);
		ln->ev = 0;
		if (r >= 0)
			e->bcast += bucket_elems(e, z->lo, z->hi);
		return r;
	}
	return -EINVAL;
}

/*
 * Over several nodes: every node runs this plan, checked through the job's
 * store before the collectives open. The rendezvous compared the plans of
 * the first start; a re-plan (statex.c) is registered on each node alone,
 * and nodes on different layouts would exchange mismatched buffers. Each
 * node stores its plan's hash under the run's prefix and reads the others'.
 */
static int plans_agree(struct exec *e)
{
	const struct coll_net *net = e->cfg.net;
	uint64_t mine = e->cfg.plan->hash;
	char key[256];
	int r;

	snprintf(key, sizeof(key), "%splan/%u", net->prefix, net->node);
	r = net->store->set(net->store->ctx, key, &mine, sizeof(mine));
	for (uint32_t n = 0; n < net->nnodes && r >= 0; n++) {
		void *v = NULL;
		size_t len = 0;
		uint64_t theirs = 0;

		if (n == net->node)
			continue;
		snprintf(key, sizeof(key), "%splan/%u", net->prefix, n);
		r = net->store->get(net->store->ctx, key,
				    net->timeout_ms ? (int)net->timeout_ms : 30000, &v, &len);
		if (r < 0) {
			snprintf(e->open_err, sizeof(e->open_err),
				 "node %u's plan did not come within the timeout: %s", n,
				 zc_strerror(r));
			break;
		}
		if (len == sizeof(theirs))
			memcpy(&theirs, v, sizeof(theirs));
		free(v);
		if (theirs != mine) {
			snprintf(e->open_err, sizeof(e->open_err),
				 "node %u runs plan %016" PRIx64 ", node %u plan %016" PRIx64
				 ": every node's ranks must register the same plan",
				 n, theirs, net->node, mine);
			r = ZC_EPLANMISMATCH;
		}
	}
	return r;
}

/* CUDA IPC buffers (cfg.mem): open every local rank's, once per plan. */
static int open_buffers(struct exec *e)
{
	uint64_t bytes = plan_buffer_bytes(e->cfg.plan);
	float **g = (float **)e->cfg.grads, **pa = (float **)e->cfg.params;
	char err[200];
	int r;

	for (uint32_t i = 0; i < e->nlocal; i++) {
		uint32_t k = e->local[i];

		r = e->cfg.mem->map(&e->cfg.bufs[k]->grad, bytes, &e->gmaps[k], err, sizeof(err));
		if (r >= 0)
			r = e->cfg.mem->map(&e->cfg.bufs[k]->param, bytes, &e->pmaps[k], err,
					    sizeof(err));
		if (r < 0) {
			snprintf(e->open_err, sizeof(e->open_err), "rank %u's %s: %s", k,
				 e->gmaps[k] ? "parameters" : "gradients", err);
			return r;
		}
		g[k] = e->cfg.mem->ptr(e->gmaps[k]);
		pa[k] = e->cfg.mem->ptr(e->pmaps[k]);
	}
	return 0;
}

/* Off the loop thread: blocking unmaps. Accepts an executor that opened
 * none. */
static void close_buffers(struct exec *e)
{
	if (!e->cfg.mem)
		return;
	for (uint32_t k = 0; k < e->cfg.world; k++) {
		e->cfg.mem->unmap(e->gmaps[k]);
		e->cfg.mem->unmap(e->pmaps[k]);
		e->gmaps[k] = e->pmaps[k] = NULL;
	}
}

/* Open the backends (they may block), allocate the state, and give every
 * rank rank 0's parameters: "rank 0's initial values win". */
static int op_start(struct exec *e, struct lane *ln)
{
	struct coll_config cc = {.world = e->cfg.world,
				 .grads = e->cfg.grads,
				 .params = e->cfg.params,
				 .pool = e->cfg.pool,
				 .net = e->cfg.net,
				 .err = e->open_err,
				 .errlen = sizeof(e->open_err),
				 .bufs = e->cfg.mem ? e->cfg.bufs : NULL};
	struct optim_config oc = {.world = e->cfg.world,
				  .grads = e->cfg.grads,
				  .params = e->cfg.params,
				  .nlocal = e->nlocal,
				  .local = e->local,
				  .pool = e->cfg.pool};
	struct coll_group *cg = NULL;
	int r;

	if (e->cfg.mem) {
		r = open_buffers(e);
		if (r < 0)
			return r;
	}
	r = e->cfg.optim->open(&oc, &e->oc);
	if (r < 0)
		return r;
	if (e->cfg.net && e->cfg.net->nnodes > 1 && e->cfg.net->store && (r = plans_agree(e)) < 0)
		return r;
	r = e->cfg.coll->open(&cc, &cg);
	if (r < 0)
		return r;
	pthread_mutex_lock(&e->mu);
	e->cg = cg; /* exec_stop() may abort it from now on */
	r = e->stopping ? -ECANCELED : 0;
	pthread_mutex_unlock(&e->mu);
	if (r < 0)
		return r;
	if (e->cfg.optim->state_alloc) /* on the devices: no host arena */
		r = e->cfg.optim->state_alloc(e->oc, e->cfg.state->pieces, e->cfg.state->npieces,
					      e->cfg.state->arrays);
	else
		r = state_alloc(e->cfg.state);
	if (r < 0)
		return r;
	r = lane_coll(e, ln, COLL_BCAST, ZC_SHARD_BUCKET, e->init_ranges, e->cfg.plan->nbuckets);
	if (r >= 0)
		r = load_masters(e, false);
	return r;
}

/* ------------------------------------------------- state export/import --- */

/*
 * The staging is in the state's layout (plan.h: every element an fp32 slot,
 * bucket b from sbase), not the buffers': a bf16/fp16 bucket's moments and
 * masters are fp32 and must not be rounded on the way.
 */
static float *region(float *stg, uint64_t slots, unsigned k)
{
	return stg + (size_t)k * slots;
}

/* Where piece pc of bucket b is in the state's layout. */
static uint64_t piece_slot(const struct plan *p, uint32_t b, const struct optim_piece *pc)
{
	return p->buckets[b].sbase + (pc->off - p->buckets[b].base);
}

static uint32_t piece_meta(const struct exec *e, const struct optim_piece *pc)
{
	const struct zc_param_group *g = &e->groups[pc->group];
	const struct state *s = e->cfg.state;
	uint32_t w;

	if (e->cfg.plan->optimizer == ZC_OPT_SGD)
		return (s->arrays & PLAN_STATE_M) && !pc->first_momentum ? EXEC_META_MOMENTUM : 0;
	w = (uint32_t)MIN(pc->step - 1, (uint64_t)EXEC_META_STEP);
	if (w && (s->arrays & PLAN_STATE_VMAX) && g->amsgrad)
		w |= EXEC_META_VMAX;
	return w;
}

/* The backend's array (enum optim_array) of staging region k. */
static unsigned state_array(unsigned k)
{
	return k == EXEC_REGION_M   ? OPTIM_ARRAY_M
	       : k == EXEC_REGION_V ? OPTIM_ARRAY_V
	       : k == EXEC_REGION_VMAX ? OPTIM_ARRAY_VMAX
				       : OPTIM_ARRAY_MASTER;
}

/* Piece pc's values of region k, as 32-bit words (n of them) into dst. */
static int piece_values(const struct exec *e, const struct optim_piece *pc, unsigned k, void *dst)
{
	const struct state *s = e->cfg.state;
	const float *src = k == EXEC_REGION_M      ? s->m
			   : k == EXEC_REGION_V    ? s->v
			   : k == EXEC_REGION_VMAX ? s->vmax
						   : NULL;

	if (k == EXEC_REGION_META) {
		uint32_t w = piece_meta(e, pc);
		for (uint64_t x = 0; x < pc->n; x++)
			memcpy((char *)dst + x * sizeof(w), &w, sizeof(w));
	} else if (e->cfg.optim->state_io) { /* the backend's (cuda: device memory) */
		if (k != EXEC_REGION_MASTER || pc->dtype != ZC_DTYPE_F32)
			return e->cfg.optim->state_io(e->oc, pc, state_array(k), dst, false);
	} else if (k == EXEC_REGION_MASTER) {
		if (pc->dtype != ZC_DTYPE_F32)
			memcpy(dst, s->master + pc->mat, pc->n * sizeof(float));
	} else {
		memcpy(dst, src + pc->at, pc->n * sizeof(float));
	}
	return 0;
}

static bool region_kept(const struct exec *e, unsigned k)
{
	const struct state *s = e->cfg.state;

	switch (k) {
	case EXEC_REGION_META:
		return true;
	case EXEC_REGION_M:
		return s->arrays & PLAN_STATE_M;
	case EXEC_REGION_V:
		return s->arrays & PLAN_STATE_V;
	case EXEC_REGION_VMAX:
		return s->arrays & PLAN_STATE_VMAX;
	case EXEC_REGION_MASTER:
		return s->nmaster;
	}
	return false;
}

/* One node, or a checkpoint's export on any node: each piece this node
 * owns goes straight into each local rank's staging (the ranks given
 * one). A sparse export writes the step word at each piece's first element
 * only: a segment starts a piece, and a reader reads it there. The state
 * arrays go with non-temporal stores: the staging is the trainer's, read
 * by its writer later if at all, and a piece of tens of MB is below the
 * size where memcpy streams (a checkpoint's copy is half as fast again). */
static int export_local(struct exec *e, const struct exec_state_req *rq)
{
	const struct plan *p = e->cfg.plan;
	const struct state *s = e->cfg.state;
	int r;

	for (unsigned k = EXEC_REGION_META; k < exec_state_regions(p); k++) {
		if (!region_kept(e, k))
			continue;
		for (uint32_t b = 0; b < p->nbuckets; b++)
			for (uint32_t i = s->bucket_first[b]; i < s->bucket_first[b + 1]; i++) {
				const struct optim_piece *pc = &s->pieces[i];
				uint64_t at = piece_slot(p, b, pc);
				bool one = k == EXEC_REGION_META && rq->sparse_meta;
				const float *array = k == EXEC_REGION_M      ? s->m
						     : k == EXEC_REGION_V    ? s->v
						     : k == EXEC_REGION_VMAX ? s->vmax
									     : NULL;
				uint64_t n = one ? 1 : pc->n;
				float *first = NULL;

				for (uint32_t l = 0; l < e->nlocal; l++) {
					float *stg = rq->staging[e->local[l]], *dst;
					if (!stg)
						continue;
					dst = region(stg, p->state_numel, k) + at;
					if (first) {
						host_store(dst, first, n);
						continue;
					}
					if (one) {
						uint32_t w = piece_meta(e, pc);
						memcpy(dst, &w, sizeof(w));
					} else if (array && !e->cfg.optim->state_io) {
						host_store(dst, array + pc->at, n);
					} else {
						r = piece_values(e, pc, k, dst);
						if (r < 0)
							return r;
					}
					first = dst;
				}
			}
	}
	return 0;
}

/*
 * Several nodes: region k travels in the parameter buffers by the job's own
 * broadcast of every shard unit, then each local rank's buffer goes into
 * its staging. Such a job has fp32 buckets only (backend_host_multi takes
 * no bf16/fp16: job.c), so the buffers' layout is the state's.
 */
static int export_region(struct exec *e, struct lane *ln, const struct exec_state_req *rq,
			 unsigned k)
{
	const struct plan *p = e->cfg.plan;
	const struct state *s = e->cfg.state;
	int r;

	for (uint32_t i = 0; i < s->npieces; i++) {
		const struct optim_piece *pc = &s->pieces[i];
		piece_values(e, pc, k, e->cfg.params[pc->owner] + pc->off);
	}
	r = lane_coll(e, ln, COLL_BCAST, p->shard_mode, e->ranges, e->cfg.shard->nunits);
	if (r < 0)
		return r;
	for (uint32_t l = 0; l < e->nlocal; l++) {
		uint32_t lr = e->local[l];
		memcpy(region(rq->staging[lr], p->state_numel, k), e->cfg.params[lr],
		       p->total_numel * sizeof(float));
	}
	return 0;
}

static int export_bcast(struct exec *e, struct lane *ln, const struct exec_state_req *rq)
{
	const struct plan *p = e->cfg.plan;
	uint64_t bytes = plan_buffer_bytes(p);
	int r = 0;

	if (p->low_precision)
		return -ENOTSUP; /* not taken over several nodes (above) */
	if (e->cfg.optim->state_io)
		return -EOPNOTSUPP; /* device buffers: not through host copies (yet) */
	for (uint32_t l = 0; l < e->nlocal; l++) {
		uint32_t lr = e->local[l];
		memcpy(region(rq->staging[lr], p->state_numel, EXEC_REGION_SAVE), e->cfg.params[lr],
		       bytes);
	}
	for (unsigned k = EXEC_REGION_META; k < exec_state_regions(p) && r >= 0; k++)
		if (region_kept(e, k))
			r = export_region(e, ln, rq, k);
	/* the parameters as they were, whatever came of it */
	for (uint32_t l = 0; l < e->nlocal; l++) {
		uint32_t lr = e->local[l];
		memcpy(e->cfg.params[lr], region(rq->staging[lr], p->state_numel, EXEC_REGION_SAVE),
		       bytes);
	}
	return r;
}

/* Rank r is on this node. */
static bool rank_here(const struct exec *e, uint32_t r)
{
	for (uint32_t l = 0; l < e->nlocal; l++)
		if (e->local[l] == r)
			return true;
	return false;
}

/* Region k of piece pc travels in an export (an fp32 piece has no master). */
static bool piece_region(const struct exec *e, const struct optim_piece *pc, unsigned k)
{
	return region_kept(e, k) && (k != EXEC_REGION_MASTER || pc->dtype != ZC_DTYPE_F32);
}

#define PACK_HEAD 5 /* words per record: slot (2), n (2), region */

/* Piece pc's region k is packed here: its owner is on this node. */
static bool packed_here(const struct exec *e, const struct optim_piece *pc, unsigned k)
{
	return piece_region(e, pc, k) && rank_here(e, pc->owner);
}

/* The 32-bit words this node's export pack takes: the record count (2
 * words), then a record per piece and region. */
static uint64_t pack_words(const struct exec *e)
{
	const struct state *s = e->cfg.state;
	uint64_t w = 2;

	for (uint32_t i = 0; i < s->npieces; i++)
		for (unsigned k = EXEC_REGION_META; k < exec_state_regions(e->cfg.plan); k++)
			if (packed_here(e, &s->pieces[i], k))
				w += PACK_HEAD + s->pieces[i].n;
	return w;
}

/* The gather scratch for n doubles of this node and as many of each node. */
static int gbuf_reserve(struct exec *e, size_t n)
{
	size_t need = n * (1 + (size_t)e->cfg.net->nnodes);

	if (need > e->gbuf_cap) {
		double *b = realloc(e->gbuf, need * sizeof(double));
		if (!b)
			return -ENOMEM;
		e->gbuf = b;
		e->gbuf_cap = need;
	}
	return 0;
}

/* Unpack one node's records into every local rank's staging. */
static int unpack(struct exec *e, const struct exec_state_req *rq, const uint32_t *w, uint64_t len)
{
	const struct plan *p = e->cfg.plan;
	uint64_t nrec, pos = 2;

	memcpy(&nrec, w, sizeof(nrec));
	for (uint64_t i = 0; i < nrec; i++) {
		uint64_t at, n;
		unsigned k;

		if (pos + PACK_HEAD > len)
			return -EPROTO;
		memcpy(&at, w + pos, sizeof(at));
		memcpy(&n, w + pos + 2, sizeof(n));
		k = w[pos + 4];
		pos += PACK_HEAD;
		if (pos + n > len || k >= exec_state_regions(p) || at + n > p->state_numel)
			return -EPROTO;
		for (uint32_t l = 0; l < e->nlocal; l++)
			memcpy(region(rq->staging[e->local[l]], p->state_numel, k) + at, w + pos,
			       n * sizeof(float));
		pos += n;
	}
	return 0;
}

/*
 * Several nodes, state on the devices (optim_ops.state_io, cuda): a node's
 * state holds its own owners' pieces only, so each node packs them as
 * records (slot, length, region, values), one gather agrees on the longest
 * pack, a second brings every node's (padded to it), and each node unpacks
 * them all into every local rank's staging. The state crosses as bytes:
 * the staging holds the owners' bits.
 */
static int export_gather(struct exec *e, struct lane *ln, const struct exec_state_req *rq)
{
	const struct plan *p = e->cfg.plan;
	const struct state *s = e->cfg.state;
	uint64_t mine = pack_words(e), maxw = 0, pos = 2, nrec = 0;
	uint32_t *w;
	double *all;
	size_t n;
	int r;

	r = gbuf_reserve(e, 1);
	if (r < 0)
		return r;
	e->gbuf[0] = (double)mine;
	r = lane_gather(e, ln, 1, &all);
	if (r < 0)
		return r;
	for (uint32_t nd = 0; nd < e->cfg.net->nnodes; nd++)
		maxw = MAX(maxw, (uint64_t)all[nd]);
	n = (size_t)(maxw + 1) / 2; /* doubles: two words each */
	r = gbuf_reserve(e, n);
	if (r < 0)
		return r;
	w = (uint32_t *)e->gbuf;
	memset(w, 0, n * sizeof(double));
	for (uint32_t b = 0; b < p->nbuckets && r >= 0; b++)
		for (uint32_t i = s->bucket_first[b]; i < s->bucket_first[b + 1] && r >= 0; i++)
			for (unsigned k = EXEC_REGION_META; k < exec_state_regions(p) && r >= 0;
			     k++) {
				const struct optim_piece *pc = &s->pieces[i];
				uint64_t at = piece_slot(p, b, pc), len = pc->n;
				if (!packed_here(e, pc, k))
					continue;
				memcpy(w + pos, &at, sizeof(at));
				memcpy(w + pos + 2, &len, sizeof(len));
				w[pos + 4] = k;
				r = piece_values(e, pc, k, w + pos + PACK_HEAD);
				pos += PACK_HEAD + len;
				nrec++;
			}
	memcpy(w, &nrec, sizeof(nrec));
	/* a failed copy still gathers: the other nodes wait for this one */
	int g = lane_gather(e, ln, n, &all);
	if (r < 0 || g < 0)
		return r < 0 ? r : g;
	for (uint32_t nd = 0; nd < e->cfg.net->nnodes && r >= 0; nd++)
		r = unpack(e, rq, (const uint32_t *)(all + (size_t)nd * n), 2 * (uint64_t)n);
	return r;
}

static int state_export(struct exec *e, struct lane *ln, const struct exec_state_req *rq)
{
	/* a checkpoint's export stays on its node: each node's stager gets
	 * this node's pieces only, and its trainer writes them */
	if (e->nlocal == e->cfg.world || rq->sparse_meta)
		return export_local(e, rq);
	return e->cfg.optim->state_io ? export_gather(e, ln, rq) : export_bcast(e, ln, rq);
}

/* The segment of bucket b that holds flat element off. */
static uint32_t piece_segment(const struct plan *p, uint32_t b, uint64_t off)
{
	const struct plan_bucket *bk = &p->buckets[b];
	uint64_t a = off - bk->base;
	uint32_t lo = 0, hi = bk->nsegments - 1;

	while (lo < hi) {
		uint32_t mid = lo + (hi - lo + 1) / 2;
		if (bk->segments[mid].offset <= a)
			lo = mid;
		else
			hi = mid - 1;
	}
	return lo;
}

/* Piece pc's array `which` (host: arr) from src, or zeros where not given;
 * nothing where the state has no such array. */
static int import_array(struct exec *e, const struct optim_piece *pc, unsigned which, float *arr,
			const float *src, bool given)
{
	if (e->cfg.optim->state_io) {
		/* over several nodes each node imports its own owners' pieces */
		if (!(e->cfg.state->arrays & (PLAN_STATE_M << which)) || !rank_here(e, pc->owner))
			return 0;
		return e->cfg.optim->state_io(e->oc, pc, which, given ? (float *)src : NULL, true);
	}
	if (!arr)
		return 0;
	if (given)
		memcpy(arr + pc->at, src, pc->n * sizeof(float));
	else
		memset(arr + pc->at, 0, pc->n * sizeof(float));
	return 0;
}

/* A bf16/fp16 piece's master: given, or its owner's parameters widened. */
static int import_master(struct exec *e, const struct optim_piece *pc, const float *src)
{
	struct state *s = e->cfg.state;

	if (e->cfg.optim->state_io && !rank_here(e, pc->owner))
		return 0; /* its owner's node imports it */
	if (e->cfg.optim->state_io)
		return src ? e->cfg.optim->state_io(e->oc, pc, OPTIM_ARRAY_MASTER, (float *)src,
						    true)
			   : e->cfg.optim->masters(e->oc, pc, 1, OPTIM_MASTER_LOAD);
	if (src)
		memcpy(s->master + pc->mat, src, pc->n * sizeof(float));
	else
		host_widen(s->master + pc->mat,
			   (const uint16_t *)e->cfg.params[pc->owner] + pc->off, pc->n, pc->dtype);
	return 0;
}

/* Some bf16/fp16 segment is given with its master. */
static bool masters_given(const struct plan *p, const struct exec_state_req *rq)
{
	for (uint32_t b = 0; b < p->nbuckets; b++)
		for (uint32_t i = 0;
		     p->buckets[b].dtype != ZC_DTYPE_F32 && i < p->buckets[b].nsegments; i++) {
			const struct exec_seg_state *g = &rq->segs[rq->seg_first[b] + i];
			if (g->given && (g->present & ZC_STATE_MASTER))
				return true;
		}
	return false;
}

/* Validated on the loop thread already (statex.c): nothing here can fail
 * on the host backend, so nothing is applied partially; a backend that
 * keeps the state (cuda) can fail a copy, and the job then fails. A
 * bf16/fp16 piece given without its master takes it from its owner's
 * parameters, widened. */
static int state_import(struct exec *e, struct lane *ln, const struct exec_state_req *rq)
{
	const struct plan *p = e->cfg.plan;
	struct state *s = e->cfg.state;
	uint64_t slots = p->state_numel;
	bool stored = false;
	int r = 0;

	for (uint32_t b = 0; b < p->nbuckets; b++)
		for (uint32_t i = s->bucket_first[b]; i < s->bucket_first[b + 1] && r >= 0; i++) {
			struct optim_piece *pc = &s->pieces[i];
			const struct exec_seg_state *g =
				&rq->segs[rq->seg_first[b] + piece_segment(p, b, pc->off)];
			float *stg = rq->staging[pc->owner];
			uint64_t at = piece_slot(p, b, pc);
			bool has;

			if (!g->given)
				continue;
			if (pc->dtype != ZC_DTYPE_F32) {
				bool given = g->present & ZC_STATE_MASTER;
				r = import_master(e, pc,
						  given ? region(stg, slots, EXEC_REGION_MASTER) +
								  at
							: NULL);
				/* device buffers: the client cannot write them, so the
				 * owner's parameters take the narrowed master here */
				if (r >= 0 && given && e->cfg.optim->masters) {
					if (rank_here(e, pc->owner))
						r = e->cfg.optim->masters(e->oc, pc, 1,
									  OPTIM_MASTER_STORE);
					stored = true; /* on every node: all broadcast */
				}
				if (r < 0)
					break;
			}
			if (p->optimizer == ZC_OPT_SGD) {
				has = g->present & ZC_STATE_MOMENTUM_BUFFER;
				r = import_array(e, pc, OPTIM_ARRAY_M, s->m,
						 region(stg, slots, EXEC_REGION_M) + at, has);
				pc->first_momentum = !has;
				continue;
			}
			has = g->present & ZC_STATE_STEP;
			r = import_array(e, pc, OPTIM_ARRAY_M, s->m,
					 region(stg, slots, EXEC_REGION_M) + at, has);
			if (r >= 0)
				r = import_array(e, pc, OPTIM_ARRAY_V, s->v,
						 region(stg, slots, EXEC_REGION_V) + at, has);
			if (r >= 0)
				r = import_array(e, pc, OPTIM_ARRAY_VMAX, s->vmax,
						 region(stg, slots, EXEC_REGION_VMAX) + at,
						 g->present & ZC_STATE_MAX_EXP_AVG_SQ);
			pc->step = has ? g->step + 1 : 1;
		}
	/* ... and every other local rank's from its owner (the client does this
	 * itself for host buffers: zeroclient.h's zc_set_state); over several
	 * nodes every node broadcasts if any may have stored one, since each
	 * holds only its own owners' pieces */
	if (e->cfg.net && e->cfg.net->nnodes > 1 && e->cfg.optim->masters)
		stored = masters_given(p, rq);
	if (r >= 0 && stored)
		r = lane_coll(e, ln, COLL_BCAST, p->shard_mode, e->ranges, e->cfg.shard->nunits);
	return r;
}

static int xop_run(struct exec *e, struct lane *ln, struct xop *o)
{
	switch (o->type) {
	case XOP_START:
		return op_start(e, ln);
	case XOP_HYPER:
		free(e->groups);
		e->groups = o->groups;
		o->groups = NULL;
		return 0;
	case XOP_PROG:
		return op_prog(e, ln, o->z, o->iteration);
	case XOP_RELOAD:
		return load_masters(e, true);
	case XOP_STATE:
		return o->st.set ? state_import(e, ln, &o->st) : state_export(e, ln, &o->st);
	}
	return -EINVAL;
}

static void xop_release(struct xop *o)
{
	free(o->done);
	o->done = NULL;
	if (o->type != XOP_PROG) {
		free(o->groups);
		free(o);
	}
}

static void post(struct exec *e, struct exec_done **d)
{
	if (!*d)
		return;
	if (e->silent)
		free(*d);
	else
		completion_queue_post(e->cfg.cq, *d);
	*d = NULL;
}

/* Under e->mu: o ran (or was skipped after a failure) with result r. */
static void xop_finish(struct exec *e, struct xop *o, int r)
{
	if (r < 0 && !e->failed) {
		const struct zop *z = o->z;
		e->failed = true;
		*e->fail_done = (struct exec_done){
			.tag = e->cfg.tag,
			.ev = EXEC_FAILED,
			.iteration = o->iteration,
			.op = o->type == XOP_START    ? "start"
			      : o->type == XOP_HYPER  ? "hyper"
			      : o->type == XOP_RELOAD ? "reload"
			      : o->type == XOP_STATE  ? "state"
						      : zop_name(z->kind),
			/* why it failed: opening, an edit, or the job's semantics */
			.detail = o->type == XOP_START ? e->open_err
				  : e->step_err[0]     ? e->step_err
				  : e->coll_err[0]     ? e->coll_err
						       : e->sem_err,
			.lo = z ? z->lo : 0,
			.hi = z ? z->hi : 0,
			.status = r,
		};
		post(e, &e->fail_done);
	}
	if (!e->failed)
		post(e, &o->done);
	if (o->type == XOP_PROG && --e->remaining == 0 && !e->failed)
		post(e, &e->step_done);
	xop_release(o);
}

static int64_t mono_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* Under e->mu. A full ring drops the newest: the loop takes it every step. */
static void span_add(struct exec *e, const struct xop *o, int64_t t0, int64_t t1)
{
	if (e->span_n == EXEC_SPANS)
		return;
	e->spans[(e->span_head + e->span_n++) % EXEC_SPANS] = (struct exec_span){
		.kind = o->z->kind,
		.lo = o->z->lo,
		.hi = o->z->hi,
		.iteration = o->iteration,
		.start_us = t0,
		.end_us = t1,
	};
}

void exec_trace(struct exec *e, bool on)
{
	atomic_store_explicit(&e->tracing, on, memory_order_relaxed);
}

size_t exec_take_spans(struct exec *e, struct exec_span *out, size_t max)
{
	size_t n = 0;

	pthread_mutex_lock(&e->mu);
	while (e->span_n && n < max) {
		out[n++] = e->spans[e->span_head];
		e->span_head = (e->span_head + 1) % EXEC_SPANS;
		e->span_n--;
	}
	pthread_mutex_unlock(&e->mu);
	return n;
}

static bool deps_done(const struct exec *e, const struct xop *o)
{
	for (unsigned l = 0; l < LANE_COUNT; l++)
		if (e->lanes[l].done_seq < o->dep[l])
			return false;
	return true;
}

static void *lane_main(void *arg)
{
	struct lane *ln = arg;
	struct exec *e = ln->e;

	pthread_mutex_lock(&e->mu);
	for (;;) {
		struct xop *o = ln->head;
		bool skip;
		int r = 0;

		if (e->stopping)
			break;
		if (!o || !deps_done(e, o)) {
			pthread_cond_wait(&ln->cv, &e->mu);
			continue;
		}
		ln->head = o->next;
		if (!ln->head)
			ln->tail = NULL;
		skip = e->failed;
		pthread_mutex_unlock(&e->mu);
		int64_t t0 = 0;
		bool traced = !skip && o->type == XOP_PROG &&
			      atomic_load_explicit(&e->tracing, memory_order_relaxed);
		if (traced)
			t0 = mono_us();
		if (!skip)
			r = xop_run(e, ln, o);
		pthread_mutex_lock(&e->mu);
		if (traced)
			span_add(e, o, t0, mono_us());
		ln->done_seq = o->seq;
		xop_finish(e, o, r);
		/* another lane's next op may have waited for this one */
		for (unsigned l = 0; l < LANE_COUNT; l++)
			if (l != ln->idx && e->lanes[l].head)
				pthread_cond_signal(&e->lanes[l].cv);
	}
	while (ln->head) {
		struct xop *o = ln->head;
		ln->head = o->next;
		xop_release(o);
	}
	ln->tail = NULL;
	if (--e->alive == 0) {
		/* the last lane out: nothing runs any more. The closes may wait
		 * for the device (a stream's synchronize, cudaFree, NCCL's
		 * destroy), so they run without e->mu, which the loop thread
		 * takes; exec_stop() and exec_free() find NULLs. */
		struct coll_group *cg = e->cg;
		struct optim_ctx *oc = e->oc;

		e->cg = NULL;
		e->oc = NULL;
		pthread_mutex_unlock(&e->mu);
		e->cfg.coll->close(cg);
		e->cfg.optim->close(oc);
		close_buffers(e);
		pthread_mutex_lock(&e->mu);
		state_release(e->cfg.state);
		post(e, &e->stop_done);
	}
	pthread_mutex_unlock(&e->mu);
	return NULL;
}

/* ----------------------------------------------------------- queueing --- */

/* Under e->mu: number o, find its dependencies, append it to its lane. */
static void enqueue(struct exec *e, struct xop *o, enum zop_lane lane, uint32_t lo, uint32_t hi,
		    bool touches)
{
	struct lane *ln = &e->lanes[lane];

	o->seq = ++e->seq;
	memset(o->dep, 0, sizeof(o->dep));
	if (touches) {
		for (uint32_t b = lo; b <= hi; b++)
			for (unsigned l = 0; l < LANE_COUNT; l++)
				o->dep[l] = MAX(o->dep[l], e->last[(size_t)b * LANE_COUNT + l]);
		for (uint32_t b = lo; b <= hi; b++)
			e->last[(size_t)b * LANE_COUNT + lane] = o->seq;
	}
	o->next = NULL;
	if (ln->tail)
		ln->tail->next = o;
	else
		ln->head = o;
	ln->tail = o;
	pthread_cond_signal(&ln->cv);
}

static struct exec_done *done_new(struct exec *e, enum exec_event ev, uint64_t t, uint32_t b)
{
	struct exec_done *d = calloc(1, sizeof(*d));

	if (d)
		*d = (struct exec_done){
			.tag = e->cfg.tag, .ev = ev, .iteration = t, .bucket = b, .grad_norm = NAN};
	return d;
}

int exec_hyper(struct exec *e, struct zc_param_group *groups)
{
	struct xop *o = calloc(1, sizeof(*o));

	if (!o) {
		free(groups);
		return -ENOMEM;
	}
	o->type = XOP_HYPER;
	o->groups = groups;
	pthread_mutex_lock(&e->mu);
	if (e->stopping) {
		pthread_mutex_unlock(&e->mu);
		xop_release(o);
		return 0;
	}
	enqueue(e, o, LANE_COMPUTE, 0, 0, false);
	pthread_mutex_unlock(&e->mu);
	return 0;
}

int exec_reload(struct exec *e)
{
	struct xop *o = calloc(1, sizeof(*o));

	if (!o)
		return -ENOMEM;
	o->type = XOP_RELOAD;
	pthread_mutex_lock(&e->mu);
	if (e->stopping) {
		pthread_mutex_unlock(&e->mu);
		xop_release(o);
		return 0;
	}
	/* after every op queued so far, on every lane: it reads the parameters
	 * the last broadcast wrote and the trainers edited since */
	enqueue(e, o, LANE_COMPUTE, 0, e->cfg.plan->nbuckets - 1, true);
	pthread_mutex_unlock(&e->mu);
	return 0;
}

int exec_owned_ranges(const struct exec *e, uint64_t **ret, size_t *ret_n)
{
	const struct plan *p = e->cfg.plan;
	const struct state *s = e->cfg.state;
	uint64_t *w = malloc((2 * (size_t)s->npieces + 1) * sizeof(*w));
	size_t n = 0;

	if (!w)
		return -ENOMEM;
	for (uint32_t b = 0; b < p->nbuckets; b++)
		for (uint32_t i = s->bucket_first[b]; i < s->bucket_first[b + 1]; i++) {
			w[n++] = piece_slot(p, b, &s->pieces[i]);
			w[n++] = s->pieces[i].n;
		}
	*ret = w;
	*ret_n = n;
	return 0;
}

int exec_state(struct exec *e, const struct exec_state_req *req)
{
	struct xop *o = calloc(1, sizeof(*o));

	if (!o || !(o->done = done_new(e, EXEC_STATE_DONE, 0, 0))) {
		free(o);
		return -ENOMEM;
	}
	o->type = XOP_STATE;
	o->st = *req;
	pthread_mutex_lock(&e->mu);
	if (e->stopping || e->failed) {
		pthread_mutex_unlock(&e->mu);
		xop_release(o);
		return 0; /* the job is failing already, for its own reason */
	}
	/* after every op queued before it, on every lane, and before the next
	 * iteration's */
	enqueue(e, o, LANE_COMPUTE, 0, e->cfg.plan->nbuckets - 1, true);
	pthread_mutex_unlock(&e->mu);
	return 0;
}

int exec_bucket(struct exec *e, uint64_t t, uint32_t b)
{
	return exec_bucket_ex(e, t, b, NULL);
}

/* Under e->mu: bucket b's masks and, with the last bucket, the scale. */
static void bucket_in(struct exec *e, uint32_t b, const struct exec_bucket_in *in,
		      struct exec_zero *zero)
{
	uint32_t s0 = e->seg_first[b], s1 = e->seg_first[b + 1];

	for (uint32_t s = s0; s < s1; s++)
		e->used[s] = e->nlocal - (in && in->marks ? in->marks[s - s0] : 0);
	free(e->zero[b]);
	e->zero[b] = zero;
	e->nzero[b] = zero ? in->nzero : 0;
	if (b == 0)
		e->has_scale = false;
	if (in && in->has_scale) {
		e->has_scale = true;
		e->inv_scale = in->inv_scale;
	}
}

int exec_bucket_ex(struct exec *e, uint64_t t, uint32_t b, const struct exec_bucket_in *in)
{
	struct exec_zero *zero = NULL;
	const struct zero_program *z = e->cfg.prog;
	uint32_t i0 = z->bucket_ops[b], i1 = z->bucket_ops[b + 1];
	struct exec_done *sd = NULL, *d[i1 - i0];

	memset(d, 0, sizeof(d));
	if (in && in->nzero) {
		zero = malloc(in->nzero * sizeof(*zero));
		if (!zero)
			goto nomem;
		memcpy(zero, in->zero, in->nzero * sizeof(*zero));
	}
	if (b == 0 && !(sd = done_new(e, EXEC_STEP_DONE, t, 0)))
		goto nomem;
	for (uint32_t i = i0; i < i1; i++)
		if (z->ops[i].notify_bucket && !(d[i - i0] = done_new(e, EXEC_BUCKET_DONE, t, b)))
			goto nomem;

	pthread_mutex_lock(&e->mu);
	/* stopping or failed: the job is failing already, for its own reason */
	if (e->stopping || e->failed) {
		pthread_mutex_unlock(&e->mu);
		goto drop;
	}
	if (b == 0) {
		free(e->step_done);
		e->step_done = sd;
		e->remaining = z->nops;
	}
	bucket_in(e, b, in, zero);
	for (uint32_t i = i0; i < i1; i++) {
		struct xop *o = &e->xops[i];
		*o = (struct xop){.type = XOP_PROG, .z = &z->ops[i], .iteration = t, .done = d[i - i0]};
		enqueue(e, o, z->ops[i].lane, z->ops[i].lo, z->ops[i].hi, true);
	}
	pthread_mutex_unlock(&e->mu);
	return 0;
nomem:
	for (uint32_t i = 0; i < i1 - i0; i++)
		free(d[i]);
	free(sd);
	free(zero);
	return -ENOMEM;
drop:
	for (uint32_t i = 0; i < i1 - i0; i++)
		free(d[i]);
	free(sd);
	free(zero);
	return 0;
}

void exec_stop(struct exec *e)
{
	struct coll_group *cg;

	pthread_mutex_lock(&e->mu);
	if (e->stopping) {
		pthread_mutex_unlock(&e->mu);
		return;
	}
	e->stopping = true;
	cg = e->cg;
	for (unsigned l = 0; l < LANE_COUNT; l++)
		pthread_cond_signal(&e->lanes[l].cv);
	/* a collective blocked on a peer ends now; abort may take a while on
	 * some backends, but it is bounded and never waits for the lanes */
	if (cg)
		e->cfg.coll->abort(cg);
	pthread_mutex_unlock(&e->mu);
}

/* --------------------------------------------------------------- life --- */

void exec_free(struct exec *e)
{
	if (!e)
		return;
	for (unsigned l = 0; l < e->nthreads; l++)
		pthread_join(e->lanes[l].thread, NULL);
	/* never started, or stopped: the last lane closed these already */
	e->cfg.coll->close(e->cg);
	e->cfg.optim->close(e->oc);
	close_buffers(e);
	state_free(e->cfg.state);
	for (unsigned l = 0; l < LANE_COUNT; l++)
		while (e->lanes[l].head) {
			struct xop *o = e->lanes[l].head;
			e->lanes[l].head = o->next;
			xop_release(o);
		}
	free(e->step_done);
	free(e->fail_done);
	free(e->stop_done);
	free((void *)e->cfg.grads);
	free((void *)e->cfg.params);
	free(e->gmaps);
	free(e->pmaps);
	free(e->local);
	free(e->ranges);
	free(e->init_ranges);
	free(e->groups);
	free(e->xops);
	free(e->last);
	if (e->zero)
		for (uint32_t b = 0; b < e->cfg.plan->nbuckets; b++)
			free(e->zero[b]);
	free(e->zero);
	free(e->nzero);
	free(e->seg_first);
	free(e->used);
	free(e->gused);
	free(e->gbuf);
	for (unsigned l = 0; l < LANE_COUNT; l++) {
		pthread_cond_destroy(&e->lanes[l].cv);
		free(e->lanes[l].zero);
	}
	pthread_mutex_destroy(&e->mu);
	free(e);
}

static int exec_alloc(const struct exec_config *cfg, struct exec *e)
{
	const struct plan *p = cfg->plan;
	const struct shard_map *sm = cfg->shard;
	float **g, **pa;

	g = calloc(cfg->world, sizeof(*g));
	pa = calloc(cfg->world, sizeof(*pa));
	e->cfg.grads = g;
	e->cfg.params = pa;
	e->local = calloc(cfg->world, sizeof(*e->local));
	e->ranges = calloc(sm->nunits, sizeof(*e->ranges));
	e->init_ranges = calloc(p->nbuckets, sizeof(*e->init_ranges));
	e->groups = calloc(p->ngroups, sizeof(*e->groups));
	e->xops = calloc(cfg->prog->nops, sizeof(*e->xops));
	e->last = calloc((size_t)p->nbuckets * LANE_COUNT, sizeof(*e->last));
	e->fail_done = calloc(1, sizeof(*e->fail_done));
	e->stop_done = done_new(e, EXEC_STOPPED, 0, 0);
	e->seg_first = calloc(p->nbuckets + 1, sizeof(*e->seg_first));
	e->zero = calloc(p->nbuckets, sizeof(*e->zero));
	e->nzero = calloc(p->nbuckets, sizeof(*e->nzero));
	if (!g || !pa || !e->local || !e->ranges || !e->init_ranges || !e->groups || !e->xops ||
	    !e->last || !e->fail_done || !e->stop_done || !e->seg_first || !e->zero || !e->nzero)
		return -ENOMEM;
	for (uint32_t b = 0; b < p->nbuckets; b++)
		e->seg_first[b + 1] = e->seg_first[b] + p->buckets[b].nsegments;
	e->nsegs = e->seg_first[p->nbuckets];
	e->used = calloc(e->nsegs, sizeof(*e->used));
	e->gused = calloc(e->nsegs, sizeof(*e->gused));
	if (!e->used || !e->gused)
		return -ENOMEM;
	memcpy(g, cfg->grads, cfg->world * sizeof(*g));
	memcpy(pa, cfg->params, cfg->world * sizeof(*pa));
	if (cfg->mem) {
		e->gmaps = calloc(cfg->world, sizeof(*e->gmaps));
		e->pmaps = calloc(cfg->world, sizeof(*e->pmaps));
		if (!e->gmaps || !e->pmaps)
			return -ENOMEM;
	}
	for (uint32_t r = 0; r < cfg->world; r++)
		if (g[r] || (cfg->mem && cfg->bufs[r]))
			e->local[e->nlocal++] = r;
	for (uint32_t u = 0; u < sm->nunits; u++)
		e->ranges[u] = (struct coll_range){
			.owner = sm->units[u].owner,
			.off = p->buckets[sm->units[u].bucket].base + sm->units[u].offset,
			.n = sm->units[u].numel,
			.dtype = p->buckets[sm->units[u].bucket].dtype,
		};
	for (uint32_t b = 0; b < p->nbuckets; b++)
		e->init_ranges[b] = (struct coll_range){.owner = 0,
							.off = p->buckets[b].base,
							.n = p->buckets[b].numel,
							.dtype = p->buckets[b].dtype};
	memcpy(e->groups, p->groups, p->ngroups * sizeof(*e->groups));
	return 0;
}

int exec_new(const struct exec_config *cfg, struct exec **ret)
{
	struct exec *e = calloc(1, sizeof(*e));
	struct xop *start = NULL;
	int r;

	if (!e) {
		state_free(cfg->state);
		return -ENOMEM;
	}
	e->cfg = *cfg;
	e->cfg.grads = e->cfg.params = NULL;
	pthread_mutex_init(&e->mu, NULL);
	for (unsigned l = 0; l < LANE_COUNT; l++)
		pthread_cond_init(&e->lanes[l].cv, NULL);
	r = exec_alloc(cfg, e);
	if (r < 0)
		goto fail;
	start = calloc(1, sizeof(*start));
	if (!start || !(start->done = done_new(e, EXEC_STARTED, 0, 0))) {
		r = -ENOMEM;
		goto fail;
	}
	start->type = XOP_START;
	enqueue(e, start, LANE_COMPUTE, 0, 0, false);
	start = NULL;
	for (unsigned l = 0; l < LANE_COUNT; l++) {
		e->lanes[l].e = e;
		e->lanes[l].idx = l;
	}
	pthread_mutex_lock(&e->mu);
	for (unsigned l = 0; l < LANE_COUNT; l++) {
		r = -pthread_create(&e->lanes[l].thread, NULL, lane_main, &e->lanes[l]);
		if (r < 0)
			break;
		e->nthreads++;
		e->alive++;
	}
	if (r < 0) {
		/* the threads that started leave without a word */
		e->stopping = e->silent = true;
		for (unsigned l = 0; l < LANE_COUNT; l++)
			pthread_cond_signal(&e->lanes[l].cv);
	}
	pthread_mutex_unlock(&e->mu);
	if (r < 0)
		goto fail;
	*ret = e;
	return 0;
fail:
	if (start)
		xop_release(start);
	exec_free(e);
	return r;
}

void exec_stats(struct exec *e, struct exec_stats *ret)
{
	*ret = (struct exec_stats){
		.reduced_elems = e->reduced, .stepped_elems = e->stepped, .bcast_elems = e->bcast};
}
