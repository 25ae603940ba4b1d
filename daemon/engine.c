/*
 * engine.c — the per-job executor thread and the optimizer state of the
 * job's shard (see engine.h).
 *
 * Layout: the daemon keeps flat arrays as long as a rank's buffer (gsum for
 * reduced gradients, master, m, v, vmax) and only touches the ranges this
 * node owns; calloc'd pages nobody touches cost nothing. Steps are cut into
 * chunks of at most CHUNK elements of one piece, so every chunk has one
 * group's hyperparameters and the pool can spread them.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "common.h"
#include "engine.h"
#include "pool.h"

#define CHUNK (32u * 1024u)

struct piece {
	uint32_t bucket;
	uint32_t owner;
	uint32_t group;
	uint64_t off; /* flat */
	uint64_t n;
	uint64_t steps;
	bool has_buf; /* SGD momentum buffer exists (torch: state['momentum_buffer'] set) */
};

struct chunk {
	uint32_t piece;
	uint64_t off; /* flat */
	uint64_t n;
};

struct op {
	enum engine_op_kind kind;
	uint64_t iteration;
	uint32_t lo, hi;
	struct zc_param_group *groups;
	struct engine_done *done; /* allocated at submit, so completing cannot fail */
	struct op *next;
};

struct engine {
	struct engine_config cfg;
	struct coll_group *cg;

	float *gsum, *master, *m, *v, *vmax;
	struct piece *pieces;
	uint32_t npieces;
	uint32_t *bucket_piece;    /* [nbuckets + 1] */
	struct chunk *chunks;      /* local pieces only */
	uint32_t *bucket_chunk;    /* [nbuckets + 1] */
	struct coll_range *ranges; /* one per shard unit */
	struct zc_param_group *groups;

	pthread_t thread;
	bool started;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct op *head, *tail;
	struct op *stop_op; /* preallocated: stopping cannot fail */
	bool stopping;

	_Atomic uint64_t reduced, stepped, bcast;
};

const char *engine_op_name(enum engine_op_kind k)
{
	static const char *const names[] = {
		[ENGINE_INIT] = "init", [ENGINE_HYPER] = "hyper", [ENGINE_REDUCE] = "reduce",
		[ENGINE_STEP] = "step", [ENGINE_BCAST] = "bcast", [ENGINE_STOP] = "stop",
	};
	return k <= ENGINE_STOP ? names[k] : "?";
}

/* ------------------------------------------------------------- state --- */

static bool rank_local(const struct engine *e, uint32_t r)
{
	return e->cfg.grads[r] != NULL;
}

/* Pieces: every shard unit cut at its bucket's segment boundaries. */
static int build_pieces(struct engine *e)
{
	const struct plan *p = e->cfg.plan;
	const struct shard_map *sm = e->cfg.shard;
	uint64_t np = 0, nc = 0;
	uint32_t k = 0, c = 0;

	for (int pass = 0; pass < 2; pass++) {
		k = 0;
		c = 0;
		for (uint32_t b = 0; b < p->nbuckets; b++) {
			const struct plan_bucket *bk = &p->buckets[b];
			if (pass) {
				e->bucket_piece[b] = k;
				e->bucket_chunk[b] = c;
			}
			/* units and segments are both sorted by offset: merge them */
			uint32_t s0 = 0;
			for (uint32_t u = sm->bucket_first[b]; u < sm->bucket_first[b + 1]; u++) {
				const struct shard_unit *un = &sm->units[u];
				uint64_t lo = un->offset, hi = un->offset + un->numel;
				while (s0 < bk->nsegments &&
				       bk->segments[s0].offset + bk->segments[s0].numel <= lo)
					s0++;
				for (uint32_t s = s0;
				     s < bk->nsegments && bk->segments[s].offset < hi; s++) {
					const struct zc_segment *sg = &bk->segments[s];
					uint64_t a = MAX(lo, sg->offset);
					uint64_t z = MIN(hi, sg->offset + sg->numel);
					if (a >= z)
						continue;
					if (pass) {
						e->pieces[k] = (struct piece){
							.bucket = b,
							.owner = un->owner,
							.group = sg->group,
							.off = bk->base + a,
							.n = z - a,
						};
					}
					if (rank_local(e, un->owner)) {
						for (uint64_t x = a; x < z; x += CHUNK) {
							if (pass)
								e->chunks[c] = (struct chunk){
									.piece = k,
									.off = bk->base + x,
									.n = MIN(CHUNK, z - x),
								};
							c++;
						}
					}
					k++;
				}
			}
		}
		if (!pass) {
			np = k;
			nc = c;
			if (np > UINT32_MAX || nc > UINT32_MAX)
				return -E2BIG;
			e->pieces = calloc(np ? np : 1, sizeof(*e->pieces));
			e->chunks = calloc(nc ? nc : 1, sizeof(*e->chunks));
			e->bucket_piece = calloc(p->nbuckets + 1, sizeof(*e->bucket_piece));
			e->bucket_chunk = calloc(p->nbuckets + 1, sizeof(*e->bucket_chunk));
			if (!e->pieces || !e->chunks || !e->bucket_piece || !e->bucket_chunk)
				return -ENOMEM;
		}
	}
	e->npieces = k;
	e->bucket_piece[p->nbuckets] = k;
	e->bucket_chunk[p->nbuckets] = c;
	return 0;
}

static int build_ranges(struct engine *e)
{
	const struct shard_map *sm = e->cfg.shard;

	e->ranges = calloc(sm->nunits ? sm->nunits : 1, sizeof(*e->ranges));
	if (!e->ranges)
		return -ENOMEM;
	for (uint32_t u = 0; u < sm->nunits; u++)
		e->ranges[u] = (struct coll_range){
			.owner = sm->units[u].owner,
			.off = e->cfg.plan->buckets[sm->units[u].bucket].base + sm->units[u].offset,
			.n = sm->units[u].numel,
		};
	return 0;
}

/* ------------------------------------------------------------ the ops --- */

struct step_ctx {
	struct engine *e;
	uint32_t first;
};

static void step_chunk(void *arg, size_t i)
{
	struct step_ctx *sc = arg;
	struct engine *e = sc->e;
	const struct chunk *c = &e->chunks[sc->first + i];
	const struct piece *pc = &e->pieces[c->piece];
	struct optim_args a = {
		.kind = e->cfg.plan->optimizer,
		.hp = &e->groups[pc->group],
		.step = pc->steps + 1,
		.first_momentum = !pc->has_buf,
		.param = e->master + c->off,
		.grad = e->gsum + c->off,
		.m = e->m + c->off,
		.v = e->v ? e->v + c->off : NULL,
		.vmax = e->vmax ? e->vmax + c->off : NULL,
		.n = c->n,
	};

	e->cfg.optim->step(&a);
}

static int op_step(struct engine *e, uint32_t lo, uint32_t hi)
{
	struct step_ctx sc = {.e = e, .first = e->bucket_chunk[lo]};
	uint32_t nchunks = e->bucket_chunk[hi + 1] - e->bucket_chunk[lo];
	int r;

	/* only the daemon's own arrays here, but a fault is a fault */
	r = pool_parallel_for(e->cfg.pool, nchunks, step_chunk, &sc);
	if (r < 0)
		return r;
	for (uint32_t k = e->bucket_piece[lo]; k < e->bucket_piece[hi + 1]; k++) {
		struct piece *pc = &e->pieces[k];
		if (!rank_local(e, pc->owner))
			continue;
		pc->steps++;
		if (e->cfg.plan->optimizer == ZC_OPT_SGD && e->groups[pc->group].momentum != 0)
			pc->has_buf = true;
		e->stepped += pc->n;
	}
	return 0;
}

static int op_reduce(struct engine *e, uint32_t b)
{
	const struct plan_bucket *bk = &e->cfg.plan->buckets[b];
	const struct shard_map *sm = e->cfg.shard;
	int r;

	if (e->cfg.plan->shard_mode == ZC_SHARD_SLICE)
		r = e->cfg.coll->reduce_scatter(e->cg, &e->ranges[sm->bucket_first[b]],
						sm->bucket_first[b + 1] - sm->bucket_first[b],
						e->gsum);
	else
		r = e->cfg.coll->all_reduce(e->cg, bk->base, bk->numel, e->gsum);
	if (r >= 0)
		e->reduced += bk->numel;
	return r;
}

static int op_bcast(struct engine *e, uint32_t lo, uint32_t hi)
{
	const struct shard_map *sm = e->cfg.shard;
	uint32_t u0 = sm->bucket_first[lo], u1 = sm->bucket_first[hi + 1];
	int r = 0;

	if (e->cfg.plan->shard_mode == ZC_SHARD_SLICE) {
		for (uint32_t b = lo; b <= hi && r >= 0; b++)
			r = e->cfg.coll->all_gather(e->cg, &e->ranges[sm->bucket_first[b]],
						    sm->bucket_first[b + 1] - sm->bucket_first[b],
						    e->master);
	} else {
		for (uint32_t u = u0; u < u1 && r >= 0; u++)
			r = e->cfg.coll->broadcast(e->cg, e->ranges[u].owner, e->ranges[u].off,
						   e->ranges[u].n, e->master);
	}
	for (uint32_t u = u0; u < u1 && r >= 0; u++)
		e->bcast += e->ranges[u].n;
	return r;
}

static void init_unit(void *arg, size_t u)
{
	struct engine *e = arg;
	const struct coll_range *r = &e->ranges[u];

	if (rank_local(e, r->owner))
		memcpy(e->master + r->off, e->cfg.params[0] + r->off, r->n * sizeof(float));
}

static int op_init(struct engine *e)
{
	int r;

	if (!e->cfg.params[0])
		return -EOPNOTSUPP; /* rank 0 elsewhere: needs the multi-node path */
	/* through the pool: rank 0's buffer is shared memory (see pool.c) */
	r = pool_parallel_for(e->cfg.pool, e->cfg.shard->nunits, init_unit, e);
	if (r < 0)
		return r;
	return op_bcast(e, 0, e->cfg.plan->nbuckets - 1);
}

/* The optimizer state and the reduction buffer: five arrays of the job's
 * size. */
static void free_state(struct engine *e)
{
	float **arrays[] = {&e->gsum, &e->master, &e->m, &e->v, &e->vmax};

	for (size_t i = 0; i < ARRAY_SIZE(arrays); i++) {
		free(*arrays[i]);
		*arrays[i] = NULL;
	}
}

static int op_run(struct engine *e, struct op *o)
{
	switch (o->kind) {
	case ENGINE_INIT:
		return op_init(e);
	case ENGINE_HYPER:
		free(e->groups);
		e->groups = o->groups;
		o->groups = NULL;
		return 0;
	case ENGINE_REDUCE:
		return op_reduce(e, o->lo);
	case ENGINE_STEP:
		return op_step(e, o->lo, o->hi);
	case ENGINE_BCAST:
		return op_bcast(e, o->lo, o->hi);
	case ENGINE_STOP:
		free_state(e); /* here, not on the loop thread: it can take a while */
		return 0;
	}
	return -EINVAL;
}

static struct op *op_new(enum engine_op_kind kind, uint64_t iteration, uint32_t lo, uint32_t hi,
			 struct zc_param_group *groups)
{
	struct op *o = calloc(1, sizeof(*o));

	if (!o)
		return NULL;
	o->done = calloc(1, sizeof(*o->done));
	if (!o->done) {
		free(o);
		return NULL;
	}
	o->kind = kind;
	o->iteration = iteration;
	o->lo = lo;
	o->hi = hi;
	o->groups = groups;
	return o;
}

static void op_free(struct op *o)
{
	if (!o)
		return;
	free(o->groups);
	free(o->done);
	free(o);
}

static void *engine_thread(void *arg)
{
	struct engine *e = arg;

	for (;;) {
		struct engine_done *d;
		struct op *o;
		int r;

		pthread_mutex_lock(&e->mu);
		while (!e->head)
			pthread_cond_wait(&e->cv, &e->mu);
		o = e->head;
		e->head = o->next;
		if (!e->head)
			e->tail = NULL;
		pthread_mutex_unlock(&e->mu);

		r = op_run(e, o);
		d = o->done;
		*d = (struct engine_done){.tag = e->cfg.tag,
					  .kind = o->kind,
					  .iteration = o->iteration,
					  .lo = o->lo,
					  .hi = o->hi,
					  .status = r};
		completion_queue_post(e->cfg.cq, d);
		o->done = NULL; /* now the loop's */
		if (o->kind == ENGINE_STOP) {
			op_free(o);
			break;
		}
		op_free(o);
	}
	return NULL;
}

/* ------------------------------------------------------------ life --- */

uint64_t engine_memory(const struct plan *plan, const struct optim_ops *optim)
{
	return plan->total_numel * sizeof(float) * (2 + optim->state_floats(plan->optimizer));
}

int engine_new(const struct engine_config *cfg, struct engine **ret)
{
	const struct plan *p = cfg->plan;
	unsigned sf = cfg->optim->state_floats(p->optimizer);
	struct coll_config cc = {
		.world = cfg->world, .grads = cfg->grads, .params = cfg->params, .pool = cfg->pool};
	struct engine *e;
	size_t nf = p->total_numel;
	int r;

	e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	e->cfg = *cfg;
	pthread_mutex_init(&e->mu, NULL);
	/* own copies: the caller's arrays are gone once we return */
	e->cfg.grads = calloc(cfg->world, sizeof(*e->cfg.grads));
	e->cfg.params = calloc(cfg->world, sizeof(*e->cfg.params));
	if (!e->cfg.grads || !e->cfg.params) {
		r = -ENOMEM;
		goto fail;
	}
	memcpy(e->cfg.grads, cfg->grads, cfg->world * sizeof(*e->cfg.grads));
	memcpy(e->cfg.params, cfg->params, cfg->world * sizeof(*e->cfg.params));
	pthread_cond_init(&e->cv, NULL);
	e->gsum = calloc(nf, sizeof(float));
	e->master = calloc(nf, sizeof(float));
	e->m = sf >= 1 ? calloc(nf, sizeof(float)) : NULL;
	e->v = sf >= 2 ? calloc(nf, sizeof(float)) : NULL;
	e->vmax = sf >= 3 ? calloc(nf, sizeof(float)) : NULL;
	e->groups = calloc(p->ngroups, sizeof(*e->groups));
	if (!e->gsum || !e->master || (sf >= 1 && !e->m) || (sf >= 2 && !e->v) ||
	    (sf >= 3 && !e->vmax) || !e->groups) {
		r = -ENOMEM;
		goto fail;
	}
	memcpy(e->groups, p->groups, p->ngroups * sizeof(*e->groups));
	e->stop_op = op_new(ENGINE_STOP, 0, 0, 0, NULL);
	if (!e->stop_op) {
		r = -ENOMEM;
		goto fail;
	}
	r = build_pieces(e);
	if (r < 0)
		goto fail;
	r = build_ranges(e);
	if (r < 0)
		goto fail;
	r = cfg->coll->open(&cc, &e->cg);
	if (r < 0)
		goto fail;
	r = -pthread_create(&e->thread, NULL, engine_thread, e);
	if (r < 0)
		goto fail;
	e->started = true;
	*ret = e;
	return 0;
fail:
	engine_free(e);
	return r;
}

static int queue_op(struct engine *e, struct op *o)
{
	pthread_mutex_lock(&e->mu);
	if (e->stopping && o->kind != ENGINE_STOP) {
		pthread_mutex_unlock(&e->mu);
		op_free(o);
		return -ESHUTDOWN;
	}
	if (e->tail)
		e->tail->next = o;
	else
		e->head = o;
	e->tail = o;
	pthread_cond_signal(&e->cv);
	pthread_mutex_unlock(&e->mu);
	return 0;
}

int engine_submit(struct engine *e, enum engine_op_kind kind, uint64_t iteration, uint32_t lo,
		  uint32_t hi, struct zc_param_group *groups)
{
	struct op *o = op_new(kind, iteration, lo, hi, groups);

	if (!o) {
		free(groups);
		return -ENOMEM;
	}
	return queue_op(e, o);
}

void engine_stop(struct engine *e)
{
	struct op *o, *stop;

	pthread_mutex_lock(&e->mu);
	if (e->stopping) {
		pthread_mutex_unlock(&e->mu);
		return;
	}
	e->stopping = true;
	o = e->head;
	e->head = e->tail = NULL;
	pthread_mutex_unlock(&e->mu);
	while (o) {
		struct op *next = o->next;
		op_free(o);
		o = next;
	}
	stop = e->stop_op;
	e->stop_op = NULL;
	queue_op(e, stop);
}

void engine_free(struct engine *e)
{
	if (!e)
		return;
	if (e->started)
		pthread_join(e->thread, NULL);
	e->cfg.coll->close(e->cg);
	free(e->cfg.grads);
	free(e->cfg.params);
	free_state(e); /* already done if ENGINE_STOP ran */
	free(e->pieces);
	free(e->chunks);
	free(e->bucket_piece);
	free(e->bucket_chunk);
	free(e->ranges);
	free(e->groups);
	for (struct op *o = e->head; o;) {
		struct op *next = o->next;
		op_free(o);
		o = next;
	}
	op_free(e->stop_op);
	pthread_cond_destroy(&e->cv);
	pthread_mutex_destroy(&e->mu);
	free(e);
}

void engine_stats(struct engine *e, struct engine_stats *ret)
{
	*ret = (struct engine_stats){
		.reduced_elems = e->reduced, .stepped_elems = e->stepped, .bcast_elems = e->bcast};
}

/* ------------------------------------------------- completion queue --- */

struct completion_queue {
	pthread_mutex_t mu;
	struct engine_done *head, *tail;
	int efd;
};

int completion_queue_new(struct completion_queue **ret)
{
	struct completion_queue *q = calloc(1, sizeof(*q));

	if (!q)
		return -ENOMEM;
	q->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (q->efd < 0) {
		int r = -errno;
		free(q);
		return r;
	}
	pthread_mutex_init(&q->mu, NULL);
	*ret = q;
	return 0;
}

void completion_queue_free(struct completion_queue *q)
{
	if (!q)
		return;
	for (struct engine_done *d = q->head; d;) {
		struct engine_done *next = d->next;
		free(d);
		d = next;
	}
	close(q->efd);
	pthread_mutex_destroy(&q->mu);
	free(q);
}

int completion_queue_fd(struct completion_queue *q)
{
	return q->efd;
}

void completion_queue_post(struct completion_queue *q, struct engine_done *d)
{
	uint64_t one = 1;

	d->next = NULL;
	pthread_mutex_lock(&q->mu);
	if (q->tail)
		q->tail->next = d;
	else
		q->head = d;
	q->tail = d;
	pthread_mutex_unlock(&q->mu);
	/* EAGAIN only if the counter is saturated: the loop wakes anyway */
	(void)!write(q->efd, &one, sizeof(one));
}

struct engine_done *completion_queue_take(struct completion_queue *q)
{
	struct engine_done *d;
	uint64_t cnt;

	(void)!read(q->efd, &cnt, sizeof(cnt));
	pthread_mutex_lock(&q->mu);
	d = q->head;
	q->head = q->tail = NULL;
	pthread_mutex_unlock(&q->mu);
	return d;
}
