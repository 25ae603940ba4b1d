/*
 * exec.c — a job's executor (see exec.h): queueing its ops on the loop
 * thread, and its life (new, stop, free). The lane engine is lanes.c; the
 * ops a lane runs are start.c, step.c and xfer.c; what they share is
 * exec_int.h.
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
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "exec/exec_int.h"

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

static void stop(struct exec *e, bool keep)
{
	struct coll_group *cg;

	pthread_mutex_lock(&e->mu);
	if (keep && !e->stopping)
		e->keep_state = true;
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
	else if (e->cfg.net && e->cfg.net->store && e->cfg.net->store->cancel)
		e->cfg.net->store->cancel(e->cfg.net->store->ctx); /* an open waits on it */
	pthread_mutex_unlock(&e->mu);
}

void exec_stop(struct exec *e)
{
	stop(e, false);
}

void exec_stop_keep(struct exec *e)
{
	stop(e, true);
}

void *exec_take_params(struct exec *e)
{
	void *p = e->kept_params;

	e->kept_params = NULL;
	return p;
}

struct state *exec_take_state(struct exec *e)
{
	struct state *s = e->cfg.state;

	e->cfg.state = NULL;
	if (s && !s->arena && s->nelems + s->nmaster > 0) {
		state_free(s); /* never allocated: nothing kept */
		return NULL;
	}
	return s;
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
	release_recovered(e);
	state_free(e->cfg.state);
	free(e->kept_params);
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
	if (cfg->recover) {
		e->recover = *cfg->recover;
		e->cfg.recover = &e->recover;
	}
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
	e->recover.release = NULL; /* still the caller's */
	e->recover.nrelease = 0;
	exec_free(e);
	return r;
}

void exec_stats(struct exec *e, struct exec_stats *ret)
{
	*ret = (struct exec_stats){
		.reduced_elems = e->reduced, .stepped_elems = e->stepped, .bcast_elems = e->bcast};
}
