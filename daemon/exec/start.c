/*
 * start.c — the start op, a job's first on the compute lane: over several
 * nodes check that every node runs this plan, open the CUDA IPC buffers
 * (cfg.mem), the collectives and the optimizer, allocate the state and give
 * every rank rank 0's parameters; and the buffers' close when the executor
 * stops. Opening may block: it runs on a lane, never the loop thread.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "base/hostmem.h"
#include "mem/cudabufs.h"
#include "exec/exec_int.h"

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
void close_buffers(struct exec *e)
{
	if (!e->cfg.mem)
		return;
	for (uint32_t k = 0; k < e->cfg.world; k++) {
		e->cfg.mem->unmap(e->gmaps[k]);
		e->cfg.mem->unmap(e->pmaps[k]);
		e->gmaps[k] = e->pmaps[k] = NULL;
	}
}

/* state_off_devices(): the undo journal's copies into the host journal
 * (state.h): arrays and masters as the arena, and each owned parameter as
 * it was before its step, from the kept copy (fp32) or the master narrowed
 * (bf16/fp16), as the step had stored it. The marks are the executor's. */
static int journal_off_devices(struct exec *e, struct optim_ctx *oc)
{
	const struct optim_ops *op = e->cfg.optim;
	struct state *s = e->cfg.state;
	float *arr[3] = {s->m, s->v, s->vmax}, *tmp = NULL;
	uint64_t most = 0;
	int r = state_undo_alloc(s, e->cfg.plan->nbuckets);

	for (uint32_t i = 0; i < s->npieces; i++)
		most = s->pieces[i].n > most ? s->pieces[i].n : most;
	if (r >= 0 && !(tmp = malloc((most + 1) * sizeof(float))))
		r = -ENOMEM;
	for (uint32_t i = 0; i < s->npieces && r >= 0; i++) {
		struct optim_piece *pc = &s->pieces[i];

		if (pc->n == 0)
			continue;
		for (unsigned a = 0; a < 3 && r >= 0; a++)
			if (arr[a])
				r = op->state_io(oc, pc, OPTIM_ARRAY_UNDO + a,
						 s->undo + (arr[a] - s->arena) + pc->at, false);
		if (r >= 0)
			r = op->state_io(oc, pc, OPTIM_ARRAY_UNDO + OPTIM_ARRAY_MASTER, tmp, false);
		if (r < 0)
			break;
		if (pc->dtype == ZC_DTYPE_F32) {
			memcpy(s->undo_params + pc->at, tmp, pc->n * sizeof(float));
			continue;
		}
		memcpy(s->undo + (s->master - s->arena) + pc->mat, tmp, pc->n * sizeof(float));
		for (uint64_t x = 0; x < pc->n; x++) {
			uint16_t h;

			host_narrow(&h, tmp + x, 1, pc->dtype);
			s->undo_params[pc->at + x] = h;
		}
	}
	free(tmp);
	return r;
}

int state_off_devices(struct exec *e, struct optim_ctx *oc)
{
	const struct optim_ops *op = e->cfg.optim;
	const struct plan *p = e->cfg.plan;
	struct state *s = e->cfg.state;
	char *img = e->cfg.keep_params ? calloc(1, plan_buffer_bytes(p) + 1) : NULL;
	int r = img ? state_alloc(s) : -EINVAL;

	for (uint32_t i = 0; i < s->npieces && r >= 0; i++) {
		struct optim_piece *pc = &s->pieces[i];
		float *arr[3] = {s->m, s->v, s->vmax};
		char *at = img + pc->off * plan_dtype_size(pc->dtype);

		if (pc->n == 0)
			continue;
		for (unsigned a = 0; a < 3 && r >= 0; a++)
			if (arr[a])
				r = op->state_io(oc, pc, a, arr[a] + pc->at, false);
		if (r >= 0 && pc->dtype == ZC_DTYPE_F32) /* the kept copy */
			r = op->state_io(oc, pc, OPTIM_ARRAY_MASTER, (float *)at, false);
		else if (r >= 0) { /* the master, and the parameters as the step stores them */
			r = op->state_io(oc, pc, OPTIM_ARRAY_MASTER, s->master + pc->mat, false);
			if (r >= 0)
				host_narrow((uint16_t *)at, s->master + pc->mat, pc->n, pc->dtype);
		}
	}
	if (r >= 0 && s->undo_iter) /* the journal too, in its host form (state.h) */
		r = journal_off_devices(e, oc);
	if (r < 0) {
		free(img);
		state_release(s);
		return r;
	}
	e->kept_params = img;
	return 0;
}

/* start_recovered() of a state the backend keeps (cuda): the kept host
 * state (laid out for this plan first, where it is another) copied onto
 * the devices, then the host arena released as for any device state, and
 * the parameters into rank 0's buffer. */
static int start_recovered_dev(struct exec *e, struct state *k)
{
	const struct exec_recover *rc = &e->recover;
	const struct optim_ops *op = e->cfg.optim;
	struct state *s = e->cfg.state;
	const void *img = rc->params;
	void *own = NULL;
	int r = op->state_alloc(e->oc, s->pieces, s->npieces, s->arrays);

	if (r >= 0 && rc->kept) {
		own = malloc(plan_buffer_bytes(e->cfg.plan) + 1);
		r = own ? state_relayout(rc->plan, rc->kept, rc->params, e->cfg.plan, s, own)
			: -ENOMEM;
		img = own;
		k = s;
	}
	for (uint32_t i = 0; i < s->npieces && r >= 0; i++) {
		struct optim_piece *pc = &s->pieces[i];
		float *arr[3] = {k->m, k->v, k->vmax};

		if (pc->n == 0)
			continue;
		for (unsigned a = 0; a < 3 && r >= 0; a++)
			if (arr[a])
				r = op->state_io(e->oc, pc, a, arr[a] + pc->at, true);
		if (r >= 0 && pc->dtype != ZC_DTYPE_F32)
			r = op->state_io(e->oc, pc, OPTIM_ARRAY_MASTER, k->master + pc->mat, true);
	}
	if (r >= 0)
		r = op->params_write(e->oc, 0, img, plan_buffer_bytes(e->cfg.plan));
	state_release(s); /* on the devices now */
	free(own);
	if (r < 0)
		snprintf(e->open_err, sizeof(e->open_err),
			 "the kept state cannot be copied onto the devices: %s", strerror(-r));
	return r;
}

void release_recovered(struct exec *e)
{
	struct exec_recover *rc = &e->recover;

	for (uint32_t i = 0; i < rc->nrelease; i++)
		rc->release_mem->unmap(rc->release[i]);
	free(rc->release);
	rc->release = NULL;
	rc->nrelease = 0;
	rc->params = NULL; /* it pointed into them */
}

/* Whether a recovery's parameters come from their owners: over several
 * nodes each node kept (and its journal took back) only its own pieces
 * exactly; the others' in its old buffers may be a step ahead. */
static bool by_owners(const struct exec *e)
{
	return e->cfg.recover && e->cfg.net && e->cfg.net->nnodes > 1;
}

/* A recovery's state and parameters (exec.h's exec_recover): the buckets
 * the journal holds taken back, then the kept state as it is or laid out
 * for this plan, and the parameters into rank 0's buffer, which the
 * broadcast gives the others (the masters are the kept ones); over several
 * nodes into every local rank's, and each owner broadcasts its pieces. */
static int start_recovered(struct exec *e)
{
	const struct exec_recover *rc = &e->recover;
	struct state *k = rc->kept ? rc->kept : e->cfg.state;
	int r;

	if (rc->undo_iter != UINT64_MAX)
		(void)state_undo_restore(k, rc->undo_iter, rc->params);
	if (e->cfg.optim->state_io)
		return start_recovered_dev(e, k);
	if (!rc->kept && by_owners(e)) { /* each owner's pieces are its node's */
		for (uint32_t l = 0; l < e->nlocal; l++)
			memcpy(e->cfg.params[e->local[l]], rc->params,
			       plan_buffer_bytes(e->cfg.plan));
		return 0;
	}
	if (!rc->kept) {
		memcpy(e->cfg.params[0], rc->params, plan_buffer_bytes(e->cfg.plan));
		return 0;
	}
	r = state_relayout(rc->plan, rc->kept, rc->params, e->cfg.plan, e->cfg.state,
			   e->cfg.params[0]);
	if (r < 0)
		snprintf(e->open_err, sizeof(e->open_err),
			 "the kept state cannot be laid out for the rejoined ranks' plan: %s",
			 strerror(-r));
	return r;
}

/* Open the backends (they may block), allocate the state, and give every
 * rank rank 0's parameters: "rank 0's initial values win". */
int op_start(struct exec *e, struct lane *ln)
{
	struct coll_config cc = {.world = e->cfg.world,
				 .grads = e->cfg.grads,
				 .params = e->cfg.params,
				 .pool = e->cfg.pool,
				 .net = e->cfg.net,
				 .err = e->open_err,
				 .errlen = sizeof(e->open_err),
				 .bufs = e->cfg.mem ? e->cfg.bufs : NULL,
				 .ready_timeout_ms = e->cfg.stall_timeout_ms,
				 /* the step's gather (step.c): its largest */
				 .gather_bytes = (3 + (size_t)e->cfg.plan->ngroups +
						  e->seg_first[e->cfg.plan->nbuckets]) *
						 sizeof(double)};
	struct optim_config oc = {.world = e->cfg.world,
				  .keep_params = e->cfg.keep_params,
				  .journal = e->cfg.journal && e->cfg.optim->journal,
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
	if (e->cfg.recover) { /* the state and parameters from before */
		r = start_recovered(e);
		release_recovered(e);
	} else if (e->cfg.optim->state_alloc) /* on the devices: no host arena */
		r = e->cfg.optim->state_alloc(e->oc, e->cfg.state->pieces, e->cfg.state->npieces,
					      e->cfg.state->arrays);
	else
		r = state_alloc(e->cfg.state);
	if (r >= 0 && e->cfg.journal) /* a state on the devices journals there */
		r = e->cfg.optim->journal ? state_undo_marks(e->cfg.state, e->cfg.plan->nbuckets)
					  : state_undo_alloc(e->cfg.state, e->cfg.plan->nbuckets);
	if (r < 0)
		return r;
	if (by_owners(e))
		r = lane_coll(e, ln, COLL_BCAST, e->cfg.plan->shard_mode, e->ranges,
			      e->cfg.shard->nunits);
	else
		r = lane_coll(e, ln, COLL_BCAST, ZC_SHARD_BUCKET, e->init_ranges,
			      e->cfg.plan->nbuckets);
	if (r >= 0 && !e->cfg.recover) /* a recovery keeps its masters */
		r = load_masters(e, false);
	if (r >= 0 && e->cfg.keep_params) /* the fp32 copies from what every rank has now */
		r = e->cfg.optim->masters(e->oc, e->cfg.state->pieces, e->cfg.state->npieces,
					  OPTIM_MASTER_KEEP);
	return r;
}
