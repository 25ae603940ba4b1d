/*
 * test_zero.c — the op sequence (zero.c) run by the real executor (exec.c)
 * against a recording backend that logs every collective and every step
 * instead of moving bytes. Several simulated nodes of one job run one after
 * another in this process, so what must hold between nodes can be checked on
 * one machine:
 *  - every node issues the same collectives in the same order on each lane;
 *  - each piece is stepped exactly once per iteration, by its owner's node,
 *    with the right step number, after its bucket's reduction and before its
 *    broadcast;
 *  - BucketDone comes in bucket order, then StepDone;
 * for both shard modes, both step modes, world sizes 1-5 over 1-3 nodes,
 * and both kinds of backend (one that fuses in-node work, one whose
 * collectives span every rank). Then the lanes themselves: a later bucket's
 * reduction overtakes a blocked broadcast, a backend that needs one launch
 * order gets the ops' order, abort ends a blocked collective,
 * and a failed op is reported once and stops the iteration.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "exec/exec.h"
#include "base/pool.h"
#include "testlib.h"
#include "zctest.h"

/* ------------------------------------------------- recording backend --- */

#define MAX_RECS 4096

struct rec {
	unsigned node;
	uint64_t seq;
	bool coll;
	enum coll_kind kind;
	unsigned lane;
	char what[256]; /* the collective, as text */
	uint64_t lo_off, hi_off; /* the flat elements its ranges span */
	/* a step: one record per piece */
	struct optim_piece piece;
	enum optim_grad grad;
};

static struct {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct rec recs[MAX_RECS];
	unsigned n;
	uint64_t seq;
	unsigned node;       /* the simulated node now running */
	bool block_bcast;    /* BCAST waits for release or abort */
	bool released;
	bool blocked;        /* a BCAST is waiting */
	int fail_step_bucket; /* >= 0: steps touching this bucket's offset fail with -EIO */
	uint64_t fail_off;
	int step_delay_ms; /* the next step waits this long first (once) */
} R = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER, .fail_step_bucket = -1};

struct coll_group {
	atomic_bool aborted;
};

static int rec_open(const struct coll_config *cfg, struct coll_group **ret)
{
	(void)cfg;
	*ret = calloc(1, sizeof(**ret));
	return *ret ? 0 : -ENOMEM;
}

static int rec_submit(struct coll_group *g, struct coll_req *req)
{
	struct rec *r;
	size_t at = 0;
	int status = 0;

	pthread_mutex_lock(&R.mu);
	if (R.n < MAX_RECS) {
		r = &R.recs[R.n++];
		*r = (struct rec){.node = R.node,
				  .seq = ++R.seq,
				  .coll = true,
				  .kind = req->kind,
				  .lane = req->lane};
		at += (size_t)snprintf(r->what, sizeof(r->what), "lane %u %s/%s:", req->lane,
				       req->kind == COLL_REDUCE ? "reduce" : "bcast",
				       req->mode == ZC_SHARD_SLICE ? "slice" : "bucket");
		r->lo_off = UINT64_MAX;
		for (uint32_t k = 0; k < req->nranges; k++) {
			r->lo_off = MIN(r->lo_off, req->ranges[k].off);
			r->hi_off = MAX(r->hi_off, req->ranges[k].off + req->ranges[k].n);
		}
		for (uint32_t k = 0; k < req->nranges && at + 40 < sizeof(r->what); k++)
			at += (size_t)snprintf(r->what + at, sizeof(r->what) - at,
					       " %u:%lu+%lu", req->ranges[k].owner,
					       (unsigned long)req->ranges[k].off,
					       (unsigned long)req->ranges[k].n);
	}
	if (req->kind == COLL_BCAST && R.block_bcast) {
		R.blocked = true;
		pthread_cond_broadcast(&R.cv);
		while (!R.released && !atomic_load(&g->aborted))
			pthread_cond_wait(&R.cv, &R.mu);
		R.blocked = false;
		if (!R.released)
			status = -ECANCELED;
	}
	pthread_mutex_unlock(&R.mu);
	req->done(req, status); /* never under R.mu: done takes the executor's lock */
	return 0;
}

static void rec_abort(struct coll_group *g)
{
	/* wakes the blocked submit; it calls done() itself, abort never does */
	atomic_store(&g->aborted, true);
	pthread_mutex_lock(&R.mu);
	pthread_cond_broadcast(&R.cv);
	pthread_mutex_unlock(&R.mu);
}

static void rec_close(struct coll_group *g)
{
	free(g);
}

static struct coll_ops rec_coll = {
	.name = "recording",
	.open = rec_open,
	.submit = rec_submit,
	.abort = rec_abort,
	.close = rec_close,
};

struct optim_ctx {
	int unused;
};

static int rec_optim_open(const struct optim_config *cfg, struct optim_ctx **ret)
{
	(void)cfg;
	*ret = calloc(1, sizeof(**ret));
	return *ret ? 0 : -ENOMEM;
}

static int rec_run(struct optim_ctx *c, const struct optim_call *call)
{
	int r = 0;

	(void)c;
	pthread_mutex_lock(&R.mu);
	if (R.step_delay_ms) {
		int ms = R.step_delay_ms;
		R.step_delay_ms = 0;
		pthread_mutex_unlock(&R.mu);
		poll(NULL, 0, ms);
		pthread_mutex_lock(&R.mu);
	}
	for (uint32_t k = 0; k < call->npieces && R.n < MAX_RECS; k++) {
		if (R.fail_step_bucket >= 0 && call->pieces[k].off >= R.fail_off)
			r = -EIO;
		R.recs[R.n++] = (struct rec){.node = R.node,
					     .seq = ++R.seq,
					     .piece = call->pieces[k],
					     .grad = call->grad};
	}
	pthread_mutex_unlock(&R.mu);
	return r;
}

static void rec_optim_close(struct optim_ctx *c)
{
	free(c);
}

static struct optim_ops rec_optim;

/* --------------------------------------------------------- the job --- */

/* Buckets of uneven sizes, each cut into two groups, so pieces are cut at
 * both unit and segment boundaries. */
static struct plan *make_plan(enum zc_shard_mode shard, enum zc_step_mode step)
{
	static const uint64_t sizes[] = {37, 100, 5, 64, 1};
	struct zc_param_group g[2] = {ZC_PARAM_GROUP_INIT, ZC_PARAM_GROUP_INIT};
	struct zc_segment seg[ARRAY_SIZE(sizes)][2];
	struct zc_bucket b[ARRAY_SIZE(sizes)];
	struct zc_plan zp = PLAN(ZC_OPT_ADAM, shard, step, 2, g, ARRAY_SIZE(sizes), b);
	struct plan *p = NULL;
	char err[200];

	for (size_t i = 0; i < ARRAY_SIZE(sizes); i++) {
		uint64_t half = sizes[i] / 2;
		uint32_t ns = half ? 2 : 1;
		seg[i][0] = (struct zc_segment)SEG(0, half ? half : sizes[i], 0);
		seg[i][1] = (struct zc_segment)SEG(half, sizes[i] - half, 1);
		b[i] = (struct zc_bucket)BUCKET(sizes[i], ns, seg[i]);
	}
	if (plan_from_zc(&zp, &p, err, sizeof(err)) < 0)
		test_note("plan_from_zc: %s", err);
	return p;
}

struct node_run {
	struct exec *e;
	struct completion_queue *cq;
	struct zero_program prog;
	float **bufs;
};

/* Wait for the next completion (2 s at most); NULL on timeout. */
static struct exec_done *next_done(struct completion_queue *cq, struct exec_done **pending)
{
	if (!*pending) {
		struct pollfd pfd = {.fd = completion_queue_fd(cq), .events = POLLIN};
		if (poll(&pfd, 1, 2000) <= 0)
			return NULL;
		*pending = completion_queue_take(cq);
	}
	struct exec_done *d = *pending;
	if (d)
		*pending = d->next;
	return d;
}

static int node_start(struct node_run *nr, const struct plan *p, const struct shard_map *sm,
		      const struct zero_topo *t, bool fuse, struct pool *pool)
{
	struct zero_caps caps = {.local_fuse = fuse};
	struct state *st;
	struct exec_config ec;
	int r;

	memset(nr, 0, sizeof(*nr));
	nr->bufs = calloc(t->world, sizeof(*nr->bufs));
	for (uint32_t k = 0; k < t->world; k++)
		if (zero_local(t, k))
			nr->bufs[k] = calloc(p->total_numel, sizeof(float));
	if ((r = completion_queue_new(&nr->cq)) < 0 || (r = zero_program(p, t, &caps, &nr->prog)) < 0)
		return r;
	r = state_layout(p, sm, t, PLAN_STATE_M | PLAN_STATE_V, &st);
	if (r < 0)
		return r;
	ec = (struct exec_config){.tag = nr,
				  .plan = p,
				  .shard = sm,
				  .prog = &nr->prog,
				  .state = st,
				  .world = t->world,
				  .grads = nr->bufs,
				  .params = nr->bufs,
				  .coll = &rec_coll,
				  .optim = &rec_optim,
				  .pool = pool,
				  .cq = nr->cq};
	return exec_new(&ec, &nr->e);
}

/* Stop the executor and wait for EXEC_STOPPED; 0 if it came. */
static int node_stop(struct node_run *nr, uint32_t world)
{
	struct exec_done *pending = NULL, *d;
	int r = -ETIMEDOUT;

	if (nr->e) {
		exec_stop(nr->e);
		while ((d = next_done(nr->cq, &pending))) {
			bool stopped = d->ev == EXEC_STOPPED;
			free(d);
			if (stopped) {
				r = 0;
				break;
			}
		}
		while (pending) {
			d = pending;
			pending = d->next;
			free(d);
		}
		if (r == 0)
			exec_free(nr->e);
	}
	zero_program_clear(&nr->prog);
	completion_queue_free(nr->cq);
	for (uint32_t k = 0; nr->bufs && k < world; k++)
		free(nr->bufs[k]);
	free(nr->bufs);
	return r;
}

/* Run iterations on one node; check its completions. */
static void node_iterate(struct node_run *nr, const struct plan *p, unsigned iters,
			 const char *tag)
{
	struct exec_done *pending = NULL, *d = next_done(nr->cq, &pending);

	REQUIRE(d && d->ev == EXEC_STARTED, "%s: no EXEC_STARTED (%d)", tag, d ? (int)d->ev : -1);
	free(d);
	for (unsigned t = 0; t < iters; t++) {
		uint32_t want = 0;
		for (uint32_t b = 0; b < p->nbuckets; b++)
			REQUIRE(exec_bucket_ex(nr->e, t, b, NULL) == 0, "%s: exec_bucket", tag);
		for (;;) {
			d = next_done(nr->cq, &pending);
			REQUIRE(d, "%s: iteration %u: timed out after BucketDone %u", tag, t, want);
			if (d->ev == EXEC_BUCKET_DONE) {
				CHECK(d->bucket == want && d->iteration == t,
				      "%s: BucketDone(%lu, %u), expected (%u, %u)", tag,
				      (unsigned long)d->iteration, d->bucket, t, want);
				want++;
				free(d);
				continue;
			}
			CHECK(d->ev == EXEC_STEP_DONE && d->iteration == t,
			      "%s: event %d for iteration %lu", tag, (int)d->ev,
			      (unsigned long)d->iteration);
			CHECK(want == p->nbuckets, "%s: StepDone after %u BucketDones", tag, want);
			free(d);
			break;
		}
	}
}

/* Every check on the records of all nodes of one job. */
static void check_records(const struct plan *p, const struct shard_map *sm,
			  const struct zero_topo *t, unsigned iters, bool fused_expected,
			  const char *tag)
{
	/* 1. the same collectives in the same order on every lane of every node */
	for (unsigned lane = 0; lane < LANE_COUNT; lane++) {
		unsigned idx[8] = {0};
		for (;;) {
			const struct rec *first = NULL;
			bool any_left = false;
			for (unsigned n = 0; n < t->nnodes; n++) {
				while (idx[n] < R.n &&
				       (R.recs[idx[n]].node != n || !R.recs[idx[n]].coll ||
					R.recs[idx[n]].lane != lane))
					idx[n]++;
				if (idx[n] >= R.n) {
					CHECK(!first, "%s: lane %u: node %u ends before %s", tag,
					      lane, n, first ? first->what : "");
					continue;
				}
				any_left = true;
				if (!first)
					first = &R.recs[idx[n]];
				else
					CHECK(strcmp(first->what, R.recs[idx[n]].what) == 0,
					      "%s: node %u issues \"%s\", node %u \"%s\"", tag, n,
					      R.recs[idx[n]].what, first->node, first->what);
				idx[n]++;
			}
			if (!any_left || test_failed_)
				break;
		}
	}
	/* 2. each piece once per iteration, by its owner's node, in order */
	for (uint32_t b = 0; b < p->nbuckets; b++) {
		const struct plan_bucket *bk = &p->buckets[b];
		for (unsigned it = 0; it < iters; it++) {
			uint64_t covered = 0;
			for (unsigned i = 0; i < R.n; i++) {
				const struct rec *r = &R.recs[i];
				const struct optim_piece *pc = &r->piece;
				if (r->coll || pc->off < bk->base || pc->off >= bk->base + bk->numel ||
				    pc->step != it + 1)
					continue;
				covered += pc->n;
				CHECK(t->node_of[pc->owner] == r->node,
				      "%s: node %u stepped a piece of rank %u (node %u)", tag,
				      r->node, pc->owner, t->node_of[pc->owner]);
				CHECK(r->grad == (fused_expected ? OPTIM_GRAD_SUM_LOCAL
								 : OPTIM_GRAD_OWNER),
				      "%s: bucket %u stepped from grad source %d", tag, b,
				      (int)r->grad);
			}
			CHECK(covered == bk->numel, "%s: iteration %u bucket %u: %lu of %lu stepped",
			      tag, it, b, (unsigned long)covered, (unsigned long)bk->numel);
		}
	}
	/* 3. per node and iteration: reduction(b) < step(b) < broadcast(b) */
	for (unsigned n = 0; n < t->nnodes; n++) {
		for (uint32_t b = 0; b < p->nbuckets; b++) {
			const struct plan_bucket *bk = &p->buckets[b];
			uint64_t red[8] = {0}, bc[9] = {0}, st[8] = {0};
			unsigned nr = 0, nb = 0;
			for (unsigned i = 0; i < R.n; i++) {
				const struct rec *r = &R.recs[i];
				if (r->node != n)
					continue;
				if (!r->coll) {
					if (r->piece.off >= bk->base &&
					    r->piece.off < bk->base + bk->numel &&
					    r->piece.step >= 1 && r->piece.step <= 8)
						st[r->piece.step - 1] =
							MAX(st[r->piece.step - 1], r->seq);
					continue;
				}
				if (r->hi_off <= bk->base || r->lo_off >= bk->base + bk->numel)
					continue;
				if (r->kind == COLL_REDUCE && nr < 8)
					red[nr++] = r->seq;
				else if (r->kind == COLL_BCAST && nb < 9)
					bc[nb++] = r->seq; /* [0]: the start's, from rank 0 */
			}
			CHECK(nb >= 1, "%s: node %u bucket %u: no start broadcast", tag, n, b);
			CHECK(nr == (fused_expected ? 0 : iters), "%s: node %u bucket %u: %u reductions",
			      tag, n, b, nr);
			for (unsigned it = 0; it < iters; it++) {
				if (st[it] && it < nr)
					CHECK(red[it] < st[it],
					      "%s: node %u bucket %u it %u: step before reduce", tag, n,
					      b, it);
				if (st[it] && it + 1 < nb)
					CHECK(st[it] < bc[it + 1],
					      "%s: node %u bucket %u it %u: broadcast before step", tag, n,
					      b, it);
			}
		}
	}
	(void)sm;
}

static void run_job(enum zc_shard_mode shard, enum zc_step_mode step, uint32_t world,
		    uint32_t nnodes, bool round_robin, bool fuse, struct pool *pool)
{
	struct plan *p = make_plan(shard, step);
	struct shard_map *sm = NULL;
	uint32_t node_of[8];
	char tag[128];
	const unsigned iters = 3;
	bool fused = fuse && nnodes == 1 && step == ZC_STEP_INTERLEAVED;

	snprintf(tag, sizeof(tag), "%s/%s w%u n%u %s %s", plan_shard_name(shard),
		 plan_step_name(step), world, nnodes, round_robin ? "rr" : "blocks",
		 fuse ? "fuse" : "span");
	REQUIRE(p && shard_assign(p, world, &sm) == 0, "%s: plan", tag);
	for (uint32_t r = 0; r < world; r++)
		node_of[r] = round_robin ? r % nnodes : r * nnodes / world;
	pthread_mutex_lock(&R.mu);
	R.n = 0;
	pthread_mutex_unlock(&R.mu);
	for (uint32_t n = 0; n < nnodes && !test_failed_; n++) {
		struct zero_topo t = {.world = world, .nnodes = nnodes, .node = n, .node_of = node_of};
		struct node_run nr;
		R.node = n;
		CHECK(node_start(&nr, p, sm, &t, fuse, pool) == 0, "%s: node %u start", tag, n);
		if (!test_failed_)
			node_iterate(&nr, p, iters, tag);
		CHECK(node_stop(&nr, world) == 0, "%s: node %u: no EXEC_STOPPED", tag, n);
	}
	if (!test_failed_) {
		struct zero_topo t = {.world = world, .nnodes = nnodes, .node = 0, .node_of = node_of};
		check_records(p, sm, &t, iters, fused, tag);
	}
	shard_map_free(sm);
	plan_free(p);
}

static struct pool *pool_;

/* Each case runs in a process of its own: each sets up what it uses. */
static int setup(void)
{
	rec_optim = optim_cpu_ops;
	rec_optim.name = "recording";
	rec_optim.open = rec_optim_open;
	rec_optim.run = rec_run;
	rec_optim.close = rec_optim_close;
	return pool_ ? 0 : pool_new(2, &pool_);
}

static void t_matrix(void)
{
	static const enum zc_shard_mode shards[] = {ZC_SHARD_BUCKET, ZC_SHARD_SLICE};
	static const enum zc_step_mode steps[] = {ZC_STEP_INTERLEAVED, ZC_STEP_AT_END};
	unsigned jobs = 0;
	REQUIRE(setup() == 0, "worker pool");

	for (size_t s = 0; s < 2; s++)
		for (size_t m = 0; m < 2; m++)
			for (uint32_t w = 1; w <= 5; w++)
				for (uint32_t n = 1; n <= 3 && n <= w; n++)
					for (int rr = 0; rr < (n > 1 ? 2 : 1); rr++)
						for (int fuse = 0; fuse < 2; fuse++) {
							run_job(shards[s], steps[m], w, n, rr,
								fuse, pool_);
							jobs++;
							if (test_failed_)
								return;
						}
	test_note("%u jobs checked", jobs);
}

/* The program's shape, stated: what each case must emit for bucket b. */
static void t_program_shape(void)
{
	struct plan *p = make_plan(ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED);
	uint32_t one[2] = {0, 0}, two[2] = {0, 1};
	struct zero_topo t1 = {.world = 2, .nnodes = 1, .node = 0, .node_of = one};
	struct zero_topo t2 = {.world = 2, .nnodes = 2, .node = 0, .node_of = two};
	struct zero_caps fuse = {.local_fuse = true}, span = {.local_fuse = false};
	struct zero_program z;

	REQUIRE(p, "plan");
	REQUIRE(zero_program(p, &t1, &fuse, &z) == 0, "program");
	CHECK(z.nops == p->nbuckets && z.ops[0].kind == ZOP_FUSED && z.ops[0].notify_bucket,
	      "one node, host: one FUSED per bucket (%u ops)", z.nops);
	zero_program_clear(&z);
	REQUIRE(zero_program(p, &t1, &span, &z) == 0, "program");
	CHECK(z.nops == 3 * p->nbuckets && z.ops[0].kind == ZOP_REDUCE &&
		      z.ops[1].kind == ZOP_STEP && z.ops[2].kind == ZOP_BCAST &&
		      z.ops[0].lane == LANE_REDUCE && z.ops[2].lane == LANE_BCAST,
	      "spanning backend: REDUCE STEP BCAST per bucket (%u ops)", z.nops);
	zero_program_clear(&z);
	REQUIRE(zero_program(p, &t2, &fuse, &z) == 0, "program");
	CHECK(z.nops == 3 * p->nbuckets, "two nodes: no fusion (%u ops)", z.nops);
	zero_program_clear(&z);
	p->step_mode = ZC_STEP_AT_END;
	REQUIRE(zero_program(p, &t1, &fuse, &z) == 0, "program");
	CHECK(z.nops == p->nbuckets + 1 && z.ops[z.nops - 1].kind == ZOP_STEP &&
		      z.ops[z.nops - 1].lo == 0 && z.ops[z.nops - 1].hi == p->nbuckets - 1 &&
		      z.bucket_ops[p->nbuckets - 1] == p->nbuckets - 1,
	      "at_end on one node: a REDUCE per bucket, one STEP of all, no broadcast");
	zero_program_clear(&z);
	t2.node = 2;
	CHECK(zero_program(p, &t2, &fuse, &z) == -EINVAL, "a node outside the topology");
	plan_free(p);
}

/* Two nodes, interleaved: bucket 1's reduction (and its BucketDone) must not
 * wait for bucket 0's broadcast, which the recorder holds back. */
static void t_reduce_overtakes_bcast(void)
{
	struct plan *p = make_plan(ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED);
	struct shard_map *sm = NULL;
	uint32_t node_of[2] = {0, 1};
	struct zero_topo t = {.world = 2, .nnodes = 2, .node = 0, .node_of = node_of};
	struct exec_done *pending = NULL, *d;
	struct node_run nr;
	unsigned dones = 0;
	REQUIRE(setup() == 0, "worker pool");

	REQUIRE(p && shard_assign(p, 2, &sm) == 0, "plan");
	R.node = 0;
	REQUIRE(node_start(&nr, p, sm, &t, true, pool_) == 0, "start");
	d = next_done(nr.cq, &pending);
	CHECK(d && d->ev == EXEC_STARTED, "started");
	free(d);
	pthread_mutex_lock(&R.mu);
	R.block_bcast = true;
	R.released = false;
	pthread_mutex_unlock(&R.mu);
	CHECK(exec_bucket_ex(nr.e, 0, 0, NULL) == 0, "queue 0");
	pthread_mutex_lock(&R.mu);
	for (int i = 0; i < 200 && !R.blocked; i++) {
		pthread_mutex_unlock(&R.mu);
		poll(NULL, 0, 10);
		pthread_mutex_lock(&R.mu);
	}
	CHECK(R.blocked, "bucket 0's broadcast is held");
	pthread_mutex_unlock(&R.mu);
	CHECK(exec_bucket_ex(nr.e, 0, 1, NULL) == 0, "queue 1");
	while (dones < 2 && (d = next_done(nr.cq, &pending))) {
		CHECK(d->ev == EXEC_BUCKET_DONE && d->bucket == dones, "event %d bucket %u",
		      (int)d->ev, d->bucket);
		dones++;
		free(d);
	}
	pthread_mutex_lock(&R.mu);
	CHECK(dones == 2 && R.blocked, "BucketDone(1) came while bucket 0's broadcast is held "
				       "(%u dones, blocked %d)",
	      dones, R.blocked);
	R.released = true;
	R.block_bcast = false;
	pthread_cond_broadcast(&R.cv);
	pthread_mutex_unlock(&R.mu);
	for (uint32_t b = 2; b < p->nbuckets; b++)
		exec_bucket_ex(nr.e, 0, b, NULL);
	while ((d = next_done(nr.cq, &pending))) {
		bool end = d->ev == EXEC_STEP_DONE;
		free(d);
		if (end)
			break;
	}
	CHECK(node_stop(&nr, 2) == 0, "stop");
	shard_map_free(sm);
	plan_free(p);
}

/* One iteration of a two-node slice job whose buckets 0 and 1 are in at
 * once while bucket 0's step is slow; the collectives in the order the
 * backend saw them, as (kind, first offset), into kinds/offs (n of them). */
static unsigned launch_order_run(bool ordered, enum coll_kind *kinds, uint64_t *offs,
				 unsigned max)
{
	struct plan *p = make_plan(ZC_SHARD_SLICE, ZC_STEP_INTERLEAVED);
	struct shard_map *sm = NULL;
	uint32_t node_of[2] = {0, 1};
	struct zero_topo t = {.world = 2, .nnodes = 2, .node = 0, .node_of = node_of};
	struct exec_done *pending = NULL, *d;
	struct node_run nr;
	unsigned n = 0;

	if (!p || shard_assign(p, 2, &sm) != 0) {
		CHECK(false, "plan");
		return 0;
	}
	rec_coll.ordered_launch = ordered;
	R.node = 0;
	if (node_start(&nr, p, sm, &t, true, pool_) != 0) {
		CHECK(false, "start");
		return 0;
	}
	d = next_done(nr.cq, &pending);
	CHECK(d && d->ev == EXEC_STARTED, "started");
	free(d);
	pthread_mutex_lock(&R.mu);
	R.n = 0;
	R.step_delay_ms = 150;
	pthread_mutex_unlock(&R.mu);
	for (uint32_t b = 0; b < p->nbuckets; b++)
		CHECK(exec_bucket_ex(nr.e, 0, b, NULL) == 0, "queue %u", b);
	while ((d = next_done(nr.cq, &pending))) {
		bool end = d->ev == EXEC_STEP_DONE;
		free(d);
		if (end)
			break;
	}
	CHECK(node_stop(&nr, 2) == 0, "stop");
	pthread_mutex_lock(&R.mu);
	for (unsigned i = 0; i < R.n && n < max; i++)
		if (R.recs[i].coll) {
			kinds[n] = R.recs[i].kind;
			offs[n++] = R.recs[i].lo_off;
		}
	pthread_mutex_unlock(&R.mu);
	rec_coll.ordered_launch = false;
	shard_map_free(sm);
	plan_free(p);
	return n;
}

/* A backend whose collectives must launch in one order on every node
 * (coll_ops.ordered_launch, NCCL's): they go in the ops' order, reduce 0,
 * broadcast 0, reduce 1, ..., even where bucket 1's reduction could go
 * first (its gradients are in while bucket 0 is stepped), which without
 * the rule it does: a node where bucket 1 came later would launch the other
 * order, and on a device that runs one kernel at a time both hang. */
static void t_ordered_launch(void)
{
	enum coll_kind kinds[64];
	uint64_t offs[64];
	unsigned n;
	REQUIRE(setup() == 0, "worker pool");

	n = launch_order_run(false, kinds, offs, 64);
	CHECK(n >= 4 && kinds[0] == COLL_REDUCE && kinds[1] == COLL_REDUCE,
	      "unordered: bucket 1's reduction overtakes bucket 0's broadcast (%u collectives, "
	      "second %s)",
	      n, n > 1 && kinds[1] == COLL_BCAST ? "bcast" : "reduce");
	n = launch_order_run(true, kinds, offs, 64);
	CHECK(n == 10, "ordered: 10 collectives, got %u", n);
	for (unsigned i = 0; i + 1 < n; i += 2) {
		CHECK(kinds[i] == COLL_REDUCE && kinds[i + 1] == COLL_BCAST && offs[i] == offs[i + 1],
		      "ordered: collective %u and %u are bucket %u's reduce and broadcast", i,
		      i + 1, i / 2);
		CHECK(i == 0 || offs[i] > offs[i - 1], "ordered: bucket %u after bucket %u", i / 2,
		      i / 2 - 1);
	}
}

/* A collective that never finishes ends with abort: exec_stop() must not hang. */
static void t_abort_blocked(void)
{
	struct plan *p = make_plan(ZC_SHARD_SLICE, ZC_STEP_INTERLEAVED);
	struct shard_map *sm = NULL;
	uint32_t node_of[3] = {0, 1, 1};
	struct zero_topo t = {.world = 3, .nnodes = 2, .node = 1, .node_of = node_of};
	struct exec_done *pending = NULL, *d;
	struct node_run nr;
	bool blocked;
	REQUIRE(setup() == 0, "worker pool");

	REQUIRE(p && shard_assign(p, 3, &sm) == 0, "plan");
	R.node = 1;
	REQUIRE(node_start(&nr, p, sm, &t, true, pool_) == 0, "start");
	d = next_done(nr.cq, &pending);
	free(d);
	pthread_mutex_lock(&R.mu);
	R.block_bcast = true;
	R.released = false;
	pthread_mutex_unlock(&R.mu);
	exec_bucket_ex(nr.e, 0, 0, NULL);
	d = next_done(nr.cq, &pending); /* BucketDone(0) */
	free(d);
	pthread_mutex_lock(&R.mu);
	for (int i = 0; i < 200 && !R.blocked; i++) {
		pthread_mutex_unlock(&R.mu);
		poll(NULL, 0, 10);
		pthread_mutex_lock(&R.mu);
	}
	blocked = R.blocked;
	pthread_mutex_unlock(&R.mu);
	CHECK(blocked, "the broadcast is held");
	CHECK(node_stop(&nr, 3) == 0, "exec_stop ends a held collective (EXEC_STOPPED came)");
	pthread_mutex_lock(&R.mu);
	R.block_bcast = false;
	pthread_mutex_unlock(&R.mu);
	shard_map_free(sm);
	plan_free(p);
}

/* A step fails: one EXEC_FAILED naming it, no StepDone, nothing after. */
static void t_failure(void)
{
	struct plan *p = make_plan(ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED);
	struct shard_map *sm = NULL;
	uint32_t node_of[2] = {0, 0};
	struct zero_topo t = {.world = 2, .nnodes = 1, .node = 0, .node_of = node_of};
	struct exec_done *pending = NULL, *d;
	struct node_run nr;
	unsigned failed = 0, step_done = 0, bucket_done = 0;
	REQUIRE(setup() == 0, "worker pool");

	REQUIRE(p && shard_assign(p, 2, &sm) == 0, "plan");
	R.node = 0;
	R.fail_step_bucket = 2;
	R.fail_off = p->buckets[2].base;
	REQUIRE(node_start(&nr, p, sm, &t, true, pool_) == 0, "start");
	d = next_done(nr.cq, &pending);
	free(d);
	for (uint32_t b = 0; b < p->nbuckets; b++)
		CHECK(exec_bucket_ex(nr.e, 0, b, NULL) == 0, "queue %u", b);
	while ((d = next_done(nr.cq, &pending))) {
		if (d->ev == EXEC_FAILED) {
			failed++;
			CHECK(d->status == -EIO && d->lo == 2 && strcmp(d->op, "fused") == 0,
			      "failure: %s of %u..%u: %d", d->op, d->lo, d->hi, d->status);
		}
		step_done += d->ev == EXEC_STEP_DONE;
		bucket_done += d->ev == EXEC_BUCKET_DONE;
		free(d);
	}
	CHECK(failed == 1 && step_done == 0 && bucket_done == 2,
	      "one failure, no StepDone, BucketDone only before it (%u, %u, %u)", failed,
	      step_done, bucket_done);
	CHECK(exec_bucket_ex(nr.e, 1, 0, NULL) == 0, "queueing after a failure is a quiet no-op");
	CHECK(node_stop(&nr, 2) == 0, "stop");
	R.fail_step_bucket = -1;
	shard_map_free(sm);
	plan_free(p);
}

static const struct test_case cases[] = {
	{"program_shape", t_program_shape},
	{"matrix_modes_worlds_nodes", t_matrix},
	{"reduce_overtakes_blocked_bcast", t_reduce_overtakes_bcast},
	{"ordered_launch", t_ordered_launch},
	{"abort_ends_blocked_collective", t_abort_blocked},
	{"failed_op_reported_once", t_failure},
};

TEST_MAIN(cases)
