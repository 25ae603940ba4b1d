/*
 * lanes.c — the executor's lane engine (exec.c says how ops are ordered):
 * one thread per lane takes its ops in order once their dependencies are
 * done, runs each (start.c, step.c, xfer.c), posts what the loop acts on,
 * records the timeline while it is on, and the last lane out closes the
 * backends. Owns the lanes' collectives in flight and the span ring. Lane
 * threads, except exec_trace() and exec_take_spans() (loop thread).
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "common.h"
#include "exec/exec_int.h"

/* ------------------------------------------------------ collectives --- */

/*
 * The launch order (coll_ops.ordered_launch): every node queues the job's
 * ops in one order (their seq), so a lane may launch a collective only once
 * no op before its own can still launch one: the ops of the other lanes with
 * a lower seq have launched their last collective (a reduce's or a
 * broadcast's one, at submit) or finished. The oldest op that has not always
 * may, so this never deadlocks; every node launches the same collectives in
 * the same order.
 */

/* Under e->mu: the lowest seq of ln's ops that may still launch a collective. */
static uint64_t lane_unpassed(const struct lane *ln)
{
	if (ln->cur_seq)
		return ln->cur_seq;
	return ln->head ? ln->head->seq : UINT64_MAX;
}

/* Under e->mu: wait for ln's turn to launch. -ECANCELED once stopping. */
static int turn_wait(struct exec *e, struct lane *ln)
{
	for (;;) {
		bool mine = true;

		if (e->stopping)
			return -ECANCELED;
		for (unsigned l = 0; l < LANE_COUNT; l++)
			if (l != ln->idx && lane_unpassed(&e->lanes[l]) < ln->cur_seq)
				mine = false;
		if (mine)
			return 0;
		pthread_cond_wait(&ln->cv, &e->mu);
	}
}

/* Under e->mu: ln's op launches no more collectives (or finished): wake
 * the lanes that may wait for it, for a dependency (their next op) or for
 * their turn (their op's launch), and no other. */
static void turn_pass(struct exec *e, struct lane *ln)
{
	ln->cur_seq = 0;
	for (unsigned l = 0; l < LANE_COUNT; l++) {
		const struct lane *o = &e->lanes[l];
		if (l != ln->idx && (o->head || (e->cfg.coll->ordered_launch && o->cur_seq)))
			pthread_cond_signal(&e->lanes[l].cv);
	}
}

/* Submit ln->req in its turn. */
static int lane_submit(struct exec *e, struct lane *ln)
{
	int r = 0;

	if (e->cfg.coll->ordered_launch) {
		pthread_mutex_lock(&e->mu);
		r = turn_wait(e, ln);
		pthread_mutex_unlock(&e->mu);
	}
	if (r >= 0)
		r = e->cfg.coll->submit(e->cg, &ln->req);
	if (r >= 0 && ln->pass_on_submit && e->cfg.coll->ordered_launch) {
		pthread_mutex_lock(&e->mu);
		turn_pass(e, ln);
		pthread_mutex_unlock(&e->mu);
	}
	return r;
}

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
int lane_coll(struct exec *e, struct lane *ln, enum coll_kind kind, enum zc_shard_mode mode,
	      const struct coll_range *rg, uint32_t n)
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
	r = lane_submit(e, ln);
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

/* The gather scratch for n doubles of this node and as many of each node. */
int gbuf_reserve(struct exec *e, size_t n)
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

/* Every node's n doubles of `mine`, in node order, into e->gbuf + n (a
 * gather on this lane: the same calls in the same order on every node). */
int lane_gather(struct exec *e, struct lane *ln, size_t n, double **ret_all)
{
	int r = gbuf_reserve(e, n);

	if (r < 0)
		return r;
	ln->req = (struct coll_req){.kind = COLL_GATHER,
				    .mode = e->cfg.plan->shard_mode,
				    .lane = ln->idx,
				    .gin = e->gbuf,
				    .gout = e->gbuf + n,
				    .gbytes = n * sizeof(double),
				    .done = lane_req_done};
	ln->req_done = false;
	r = lane_submit(e, ln);
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

/* ------------------------------------------------------------ lanes --- */

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
		return o->st.set ? xfer_import(e, ln, &o->st) : xfer_export(e, ln, &o->st);
	}
	return -EINVAL;
}

void xop_release(struct xop *o)
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
			/* why it failed: opening, an edit, the collective (the
			 * start's broadcast too) or the job's semantics */
			.detail = o->type == XOP_START && e->open_err[0] ? e->open_err
				  : e->step_err[0]                       ? e->step_err
				  : e->coll_err[0]                       ? e->coll_err
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

void *lane_main(void *arg)
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
		ln->cur_seq = o->seq;
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
		ln->pass_on_submit = false;
		xop_finish(e, o, r);
		/* another lane's next op, or its launch, may have waited for this one */
		turn_pass(e, ln);
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
		int kept;

		e->cg = NULL;
		e->oc = NULL;
		pthread_mutex_unlock(&e->mu);
		e->cfg.coll->close(cg);
		/* the trainers' device memory may be gone: what the next
		 * executor needs is copied out of the backend's own first */
		kept = 0;
		if (e->keep_state && e->cfg.optim->state_io) /* never opened: nothing to keep */
			kept = oc ? state_off_devices(e, oc) : -EINVAL;
		e->cfg.optim->close(oc);
		close_buffers(e);
		pthread_mutex_lock(&e->mu);
		if (kept < 0)
			e->keep_state = false;
		if (!e->keep_state)
			state_release(e->cfg.state);
		post(e, &e->stop_done);
	}
	pthread_mutex_unlock(&e->mu);
	return NULL;
}
