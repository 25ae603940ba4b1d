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
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common.h"
#include "exec.h"

#define EXEC_SPANS 1024 /* op records kept between two takes */

enum xop_type {
	XOP_START,
	XOP_HYPER,
	XOP_PROG,
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
};

struct exec {
	struct exec_config cfg; /* own copies of grads and params */
	uint32_t *local;        /* the local ranks, ascending */
	uint32_t nlocal;
	struct coll_range *ranges;      /* [nunits]: the shard units, flat */
	struct coll_range *init_ranges; /* [nbuckets]: each bucket whole, from rank 0 */
	struct coll_group *cg;
	struct optim_ctx *oc;
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

	_Atomic uint64_t reduced, stepped, bcast;

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
	return r;
}

static uint64_t bucket_elems(const struct exec *e, uint32_t lo, uint32_t hi)
{
	uint64_t n = 0;

	for (uint32_t b = lo; b <= hi; b++)
		n += e->cfg.plan->buckets[b].numel;
	return n;
}

static int op_step(struct exec *e, uint32_t lo, uint32_t hi, enum optim_grad grad)
{
	struct state *s = e->cfg.state;
	uint32_t k0 = s->bucket_first[lo], k1 = s->bucket_first[hi + 1];
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
	int r;

	if (k0 == k1)
		return 0;
	r = e->cfg.optim->run(e->oc, &call);
	if (r < 0)
		return r;
	for (uint32_t k = k0; k < k1; k++) {
		struct optim_piece *pc = &s->pieces[k];
		pc->step++;
		if (e->cfg.plan->optimizer == ZC_OPT_SGD && e->groups[pc->group].momentum != 0)
			pc->first_momentum = false;
		e->stepped += pc->n;
	}
	return 0;
}

static int op_prog(struct exec *e, struct lane *ln, const struct zop *z)
{
	const struct shard_map *sm = e->cfg.shard;
	enum zc_shard_mode mode = e->cfg.plan->shard_mode;
	uint32_t u0 = sm->bucket_first[z->lo], u1 = sm->bucket_first[z->hi + 1];
	int r;

	switch (z->kind) {
	case ZOP_FUSED:
		r = op_step(e, z->lo, z->hi, OPTIM_GRAD_SUM_LOCAL);
		if (r >= 0)
			e->reduced += bucket_elems(e, z->lo, z->hi);
		return r;
	case ZOP_STEP:
		return op_step(e, z->lo, z->hi, OPTIM_GRAD_OWNER);
	case ZOP_REDUCE:
		r = lane_coll(e, ln, COLL_REDUCE, mode, e->ranges + u0, u1 - u0);
		if (r >= 0)
			e->reduced += bucket_elems(e, z->lo, z->hi);
		return r;
	case ZOP_BCAST:
		r = lane_coll(e, ln, COLL_BCAST, mode, e->ranges + u0, u1 - u0);
		if (r >= 0)
			e->bcast += bucket_elems(e, z->lo, z->hi);
		return r;
	}
	return -EINVAL;
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
				 .errlen = sizeof(e->open_err)};
	struct optim_config oc = {.world = e->cfg.world,
				  .grads = e->cfg.grads,
				  .params = e->cfg.params,
				  .nlocal = e->nlocal,
				  .local = e->local,
				  .pool = e->cfg.pool};
	struct coll_group *cg = NULL;
	int r;

	r = e->cfg.optim->open(&oc, &e->oc);
	if (r < 0)
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
	r = state_alloc(e->cfg.state);
	if (r < 0)
		return r;
	return lane_coll(e, ln, COLL_BCAST, ZC_SHARD_BUCKET, e->init_ranges,
			 e->cfg.plan->nbuckets);
}

/* ------------------------------------------------- state export/import --- */

static float *region(float *stg, uint64_t total, unsigned k)
{
	return stg + (size_t)k * total;
}

static uint32_t piece_meta(const struct exec *e, const struct optim_piece *pc)
{
	const struct zc_param_group *g = &e->groups[pc->group];
	const struct state *s = e->cfg.state;
	uint32_t w;

	if (e->cfg.plan->optimizer == ZC_OPT_SGD)
		return s->m && !pc->first_momentum ? EXEC_META_MOMENTUM : 0;
	w = (uint32_t)MIN(pc->step - 1, (uint64_t)EXEC_META_STEP);
	if (w && s->vmax && g->amsgrad)
		w |= EXEC_META_VMAX;
	return w;
}

/* Fill each owned piece's range of its owner's parameters with region k's
 * values, broadcast them to every rank, and copy them into each local
 * rank's staging. */
static int export_region(struct exec *e, struct lane *ln, const struct exec_state_req *rq,
			 unsigned k)
{
	const struct state *s = e->cfg.state;
	uint64_t total = e->cfg.plan->total_numel;
	int r;

	for (uint32_t i = 0; i < s->npieces; i++) {
		const struct optim_piece *pc = &s->pieces[i];
		float *dst = e->cfg.params[pc->owner] + pc->off;
		const float *src = k == EXEC_REGION_M ? s->m : k == EXEC_REGION_V ? s->v : s->vmax;

		if (k == EXEC_REGION_META) {
			uint32_t w = piece_meta(e, pc);
			for (uint64_t x = 0; x < pc->n; x++)
				memcpy(dst + x, &w, sizeof(w));
		} else {
			memcpy(dst, src + pc->at, pc->n * sizeof(float));
		}
	}
	r = lane_coll(e, ln, COLL_BCAST, e->cfg.plan->shard_mode, e->ranges, e->cfg.shard->nunits);
	if (r < 0)
		return r;
	for (uint32_t i = 0; i < e->nlocal; i++) {
		uint32_t lr = e->local[i];
		memcpy(region(rq->staging[lr], total, k), e->cfg.params[lr], total * sizeof(float));
	}
	return 0;
}

static int state_export(struct exec *e, struct lane *ln, const struct exec_state_req *rq)
{
	const struct state *s = e->cfg.state;
	uint64_t total = e->cfg.plan->total_numel;
	int r;

	for (uint32_t i = 0; i < e->nlocal; i++) {
		uint32_t lr = e->local[i];
		memcpy(region(rq->staging[lr], total, EXEC_REGION_SAVE), e->cfg.params[lr],
		       total * sizeof(float));
	}
	r = export_region(e, ln, rq, EXEC_REGION_META);
	if (r >= 0 && s->m)
		r = export_region(e, ln, rq, EXEC_REGION_M);
	if (r >= 0 && s->v)
		r = export_region(e, ln, rq, EXEC_REGION_V);
	if (r >= 0 && s->vmax)
		r = export_region(e, ln, rq, EXEC_REGION_VMAX);
	/* the parameters as they were, whatever came of it */
	for (uint32_t i = 0; i < e->nlocal; i++) {
		uint32_t lr = e->local[i];
		memcpy(e->cfg.params[lr], region(rq->staging[lr], total, EXEC_REGION_SAVE),
		       total * sizeof(float));
	}
	return r;
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

static void import_array(float *arr, const struct optim_piece *pc, const float *src, bool given)
{
	if (!arr)
		return;
	if (given)
		memcpy(arr + pc->at, src + pc->off, pc->n * sizeof(float));
	else
		memset(arr + pc->at, 0, pc->n * sizeof(float));
}

/* Validated on the loop thread already (statex.c): nothing here can fail,
 * so nothing is applied partially. */
static int state_import(struct exec *e, const struct exec_state_req *rq)
{
	const struct plan *p = e->cfg.plan;
	struct state *s = e->cfg.state;
	uint64_t total = p->total_numel;

	for (uint32_t b = 0; b < p->nbuckets; b++)
		for (uint32_t i = s->bucket_first[b]; i < s->bucket_first[b + 1]; i++) {
			struct optim_piece *pc = &s->pieces[i];
			const struct exec_seg_state *g =
				&rq->segs[rq->seg_first[b] + piece_segment(p, b, pc->off)];
			float *stg = rq->staging[pc->owner];

			if (!g->given)
				continue;
			if (p->optimizer == ZC_OPT_SGD) {
				bool has = g->present & ZC_STATE_MOMENTUM_BUFFER;
				import_array(s->m, pc, region(stg, total, EXEC_REGION_M), has);
				pc->first_momentum = !has;
				continue;
			}
			bool has = g->present & ZC_STATE_STEP;
			import_array(s->m, pc, region(stg, total, EXEC_REGION_M), has);
			import_array(s->v, pc, region(stg, total, EXEC_REGION_V), has);
			import_array(s->vmax, pc, region(stg, total, EXEC_REGION_VMAX),
				     g->present & ZC_STATE_MAX_EXP_AVG_SQ);
			pc->step = has ? g->step + 1 : 1;
		}
	return 0;
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
		return op_prog(e, ln, o->z);
	case XOP_STATE:
		return o->st.set ? state_import(e, &o->st) : state_export(e, ln, &o->st);
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
			.op = o->type == XOP_START   ? "start"
			      : o->type == XOP_HYPER ? "hyper"
			      : o->type == XOP_STATE ? "state"
						     : zop_name(z->kind),
			.detail = o->type == XOP_START ? e->open_err : "",
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
		/* the last lane out: nothing runs any more */
		e->cfg.coll->close(e->cg);
		e->cg = NULL;
		e->cfg.optim->close(e->oc);
		e->oc = NULL;
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
		*d = (struct exec_done){.tag = e->cfg.tag, .ev = ev, .iteration = t, .bucket = b};
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
	const struct zero_program *z = e->cfg.prog;
	uint32_t i0 = z->bucket_ops[b], i1 = z->bucket_ops[b + 1];
	struct exec_done *sd = NULL, *d[i1 - i0];

	memset(d, 0, sizeof(d));
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
	return -ENOMEM;
drop:
	for (uint32_t i = 0; i < i1 - i0; i++)
		free(d[i]);
	free(sd);
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
	free(e->local);
	free(e->ranges);
	free(e->init_ranges);
	free(e->groups);
	free(e->xops);
	free(e->last);
	for (unsigned l = 0; l < LANE_COUNT; l++)
		pthread_cond_destroy(&e->lanes[l].cv);
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
	if (!g || !pa || !e->local || !e->ranges || !e->init_ranges || !e->groups || !e->xops ||
	    !e->last || !e->fail_done || !e->stop_done)
		return -ENOMEM;
	memcpy(g, cfg->grads, cfg->world * sizeof(*g));
	memcpy(pa, cfg->params, cfg->world * sizeof(*pa));
	for (uint32_t r = 0; r < cfg->world; r++)
		if (g[r])
			e->local[e->nlocal++] = r;
	for (uint32_t u = 0; u < sm->nunits; u++)
		e->ranges[u] = (struct coll_range){
			.owner = sm->units[u].owner,
			.off = p->buckets[sm->units[u].bucket].base + sm->units[u].offset,
			.n = sm->units[u].numel,
		};
	for (uint32_t b = 0; b < p->nbuckets; b++)
		e->init_ranges[b] = (struct coll_range){
			.owner = 0, .off = p->buckets[b].base, .n = p->buckets[b].numel};
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
