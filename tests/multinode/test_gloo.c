/*
 * test_gloo.c — coll/gloo.c between real processes over real gloo TCP on
 * loopback. Each case forks one process per "node" (2 or 3), each with 1-2
 * local "ranks" whose buffers are plain memory in that process, and its own
 * group; the nodes find each other through a file store in a fresh
 * directory (bind port 0 everywhere), so parallel runs never collide.
 *
 *  - REDUCE and BCAST through the coll_ops table, both shard modes, several
 *    placements of ranks on nodes, window cuts inside ranges: every owner's
 *    average equals the documented order (coll/gloo.c) bit for bit, every
 *    rank holds its owners' parameters;
 *  - the real executor (exec.c + zero.c + optim_cpu_ops) over the same
 *    topologies, both shard and step modes: SGD equals a single-process
 *    reference bit for bit, AdamW within 1e-6 relative, every iteration;
 *  - failures: abort ends a collective blocked on a silent peer, and one
 *    blocked in the middle of a transfer to a stopped peer; a killed peer
 *    and a silent one end in errors within the timeout; a node that never
 *    joins fails the open, naming it.
 *
 * `test-gloo --bench [MiB] [iterations]` instead measures the cross-node
 * all-reduce (bucket-mode REDUCE) of two nodes against gloo's own
 * all-reduce between the same two processes.
 */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coll/gloo_shim.h"
#include "common.h"
#include "exec/exec.h"
#include "filestore.h"
#include "base/pool.h"
#include "refoptim.h"
#include "relaystore.h"
#include "testkeys.h"
#include "testlib.h"
#include "zctest.h"

#define MAXW   8
#define MAXN   3
#define NODE_T 20000 /* ms a forked run may take */

/* ------------------------------------------------------- helpers --- */

struct topo {
	uint32_t world, nnodes;
	uint32_t node_of[MAXW];
};

static const char *topo_name(const struct topo *t, char *buf, size_t len)
{
	size_t at = (size_t)snprintf(buf, len, "n%u[", t->nnodes);
	for (uint32_t r = 0; r < t->world && at < len; r++)
		at += (size_t)snprintf(buf + at, len - at, "%s%u", r ? "," : "", t->node_of[r]);
	if (at < len)
		snprintf(buf + at, len - at, "]");
	return buf;
}

static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* A value in [-1, 1) for (a, b, c). */
static float val(uint64_t a, uint64_t b, uint64_t c)
{
	uint64_t h = mix(mix(mix(a) ^ b) ^ c);
	return (float)((double)(h >> 40) / (double)(1ull << 23)) - 1.0f;
}

/* The documented order: each node folds its ranks in rank order, then the
 * node partials are folded in node order, then one division. */
static float ref_avg(const struct topo *t, uint64_t seed, uint64_t x)
{
	float total = 0;
	bool any_node = false;

	for (uint32_t j = 0; j < t->nnodes; j++) {
		float part = 0;
		bool any = false;
		for (uint32_t r = 0; r < t->world; r++) {
			if (t->node_of[r] != j)
				continue;
			part = any ? part + val(seed, r, x) : val(seed, r, x);
			any = true;
		}
		total = any_node ? total + part : part;
		any_node = true;
	}
	return total / (float)t->world;
}

static bool same_bits(float a, float b)
{
	return memcmp(&a, &b, sizeof(a)) == 0;
}

/* What the nodes of one forked run share: a fresh store directory. */
struct mesh {
	char dir[64];
	char prefix[64];
};

static int mesh_new(struct mesh *m)
{
	static unsigned runs;

	snprintf(m->dir, sizeof(m->dir), "/tmp/zerod-gloo-XXXXXX");
	if (!mkdtemp(m->dir))
		return -errno;
	snprintf(m->prefix, sizeof(m->prefix), "run%d.%u/", (int)getpid(), runs++);
	return 0;
}

static void mesh_free(struct mesh *m)
{
	DIR *d = opendir(m->dir);
	struct dirent *e;
	char path[PATH_MAX];

	while (d && (e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "%s/%s", m->dir, e->d_name);
		unlink(path);
	}
	if (d)
		closedir(d);
	rmdir(m->dir);
}

/* The sealed_* cases: a TLS identity every node holds and trusts, so the
 * groups cross the mesh over TLS (coll/sealmesh.c) instead of gloo's. */
static struct tls_ident *test_keys;

static void use_sealed_mesh(void)
{
	char dir[] = "/tmp/zerod-glookeys-XXXXXX", fp[TLS_FP_HEX + 1], cmd[64];

	if (!mkdtemp(dir) || testkeys_make(dir, "a", fp) < 0)
		abort();
	test_keys = testkeys_load(dir, "a", NULL, 0);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	(void)!system(cmd);
	if (!test_keys)
		abort();
}

/* A node's network settings (the store must outlive the open). */
static struct coll_net node_net(uint32_t node, const struct topo *t, const struct mesh *m,
				const struct coll_store *store, uint32_t timeout_ms,
				uint64_t window)
{
	return (struct coll_net){
		.nnodes = t->nnodes,
		.node = node,
		.node_of = t->node_of,
		.host = "127.0.0.1",
		.prefix = m->prefix,
		.store = store,
		.timeout_ms = timeout_ms,
		.window = window,
		.tls = test_keys,
	};
}

/* A child's exit status: 0 if its checks passed. */
static void child_exit(void)
{
	fflush(stdout);
	_exit(test_failed_ ? 1 : 0);
}

typedef void (*node_fn)(uint32_t node, void *arg);

static pid_t spawn(node_fn fn, uint32_t node, void *arg)
{
	pid_t pid;

	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		test_failed_ = 0;
		alarm(NODE_T / 1000 + 5); /* a hung node dies rather than hang the suite */
		fn(node, arg);
		child_exit();
	}
	return pid;
}

/* Wait for pid until deadline (ms, now_ms() clock); SIGKILL it after.
 * Returns its exit code, or -1 if it had to be killed or died by a signal. */
static int reap(pid_t pid, int64_t deadline)
{
	int st;

	for (;;) {
		pid_t r = waitpid(pid, &st, WNOHANG);
		if (r == pid)
			return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
		if (r < 0)
			return -1;
		if (now_ms() > deadline) {
			kill(pid, SIGKILL);
			waitpid(pid, &st, 0);
			return -1;
		}
		poll(NULL, 0, 5);
	}
}

/* Fork one process per node running fn, wait for all; CHECKs each. */
static void run_nodes(uint32_t nnodes, node_fn fn, void *arg, const char *tag)
{
	pid_t pid[MAXN];
	int64_t deadline = now_ms() + NODE_T;

	for (uint32_t j = 0; j < nnodes; j++)
		pid[j] = spawn(fn, j, arg);
	for (uint32_t j = 0; j < nnodes; j++) {
		int rc = pid[j] > 0 ? reap(pid[j], deadline) : -1;
		CHECK(rc == 0, "%s: node %u ended with %d", tag, j, rc);
	}
}

/* One collective, waited for. */
struct waiter {
	struct coll_req req;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool done;
	int status;
};

static void waiter_done(struct coll_req *req, int status)
{
	struct waiter *w = (struct waiter *)req;

	pthread_mutex_lock(&w->mu);
	w->status = status;
	w->done = true;
	pthread_cond_broadcast(&w->cv);
	pthread_mutex_unlock(&w->mu);
}

static void waiter_init(struct waiter *w, enum coll_kind kind, enum zc_shard_mode mode,
			unsigned lane, const struct coll_range *rg, uint32_t n)
{
	memset(w, 0, sizeof(*w));
	w->req = (struct coll_req){.kind = kind,
				   .mode = mode,
				   .lane = lane,
				   .ranges = rg,
				   .nranges = n,
				   .done = waiter_done};
	pthread_mutex_init(&w->mu, NULL);
	pthread_cond_init(&w->cv, NULL);
}

/* Wait up to ms for done; its status, or 1 if it did not come. */
static int waiter_wait(struct waiter *w, int ms)
{
	struct timespec ts;
	int r = 1;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += ms / 1000;
	ts.tv_nsec += (long)(ms % 1000) * 1000000;
	if (ts.tv_nsec >= 1000000000)
		ts.tv_sec++, ts.tv_nsec -= 1000000000;
	pthread_mutex_lock(&w->mu);
	while (!w->done)
		if (pthread_cond_timedwait(&w->cv, &w->mu, &ts) == ETIMEDOUT)
			break;
	if (w->done)
		r = w->status;
	pthread_mutex_unlock(&w->mu);
	return r;
}

static int coll_run(struct coll_group *g, enum coll_kind kind, enum zc_shard_mode mode,
		    unsigned lane, const struct coll_range *rg, uint32_t n)
{
	struct waiter w;
	int r;

	waiter_init(&w, kind, mode, lane, rg, n);
	r = coll_gloo_ops.submit(g, &w.req);
	if (r < 0)
		return r;
	return waiter_wait(&w, NODE_T);
}

/* Buckets of uneven sizes, two groups each, so ranges are cut at unit,
 * segment and window boundaries. */
static const uint64_t bucket_sizes[] = {1000, 37, 30001, 16, 2500};
#define NB ARRAY_SIZE(bucket_sizes)

static struct plan *make_plan(enum zc_optimizer opt, enum zc_shard_mode shard,
			      enum zc_step_mode step)
{
	struct zc_param_group g[2] = {ZC_PARAM_GROUP_INIT, ZC_PARAM_GROUP_INIT};
	struct zc_segment seg[NB][2];
	struct zc_bucket b[NB];
	struct zc_plan zp = PLAN(opt, shard, step, 2, g, NB, b);
	struct plan *p = NULL;
	char err[200];

	if (opt == ZC_OPT_SGD) {
		g[0].lr = 0.05, g[0].momentum = 0.9, g[0].nesterov = true;
		g[1].lr = 0.02, g[1].momentum = 0.5, g[1].dampening = 0.1;
		g[1].weight_decay = 0.01;
	} else {
		g[0].lr = 1e-2;
		g[1].lr = 2e-3, g[1].beta1 = 0.8, g[1].beta2 = 0.99, g[1].eps = 1e-6;
		g[1].weight_decay = 0.01, g[1].amsgrad = true;
	}
	for (size_t i = 0; i < NB; i++) {
		uint64_t half = bucket_sizes[i] / 2;
		seg[i][0] = (struct zc_segment)SEG(0, half, 0);
		seg[i][1] = (struct zc_segment)SEG(half, bucket_sizes[i] - half, 1);
		b[i] = (struct zc_bucket)BUCKET(bucket_sizes[i], 2, seg[i]);
	}
	if (plan_from_zc(&zp, &p, err, sizeof(err)) < 0)
		test_note("plan_from_zc: %s", err);
	return p;
}

/* A node's buffers: local ranks only, NULL for the others. */
struct bufs {
	float *grads[MAXW], *params[MAXW];
};

static int bufs_new(struct bufs *b, const struct topo *t, uint32_t node, uint64_t n)
{
	memset(b, 0, sizeof(*b));
	for (uint32_t r = 0; r < t->world; r++) {
		if (t->node_of[r] != node)
			continue;
		if (posix_memalign((void **)&b->grads[r], 64, n * sizeof(float)) ||
		    posix_memalign((void **)&b->params[r], 64, n * sizeof(float)))
			return -ENOMEM;
	}
	return 0;
}

static void bufs_free(struct bufs *b)
{
	for (uint32_t r = 0; r < MAXW; r++) {
		free(b->grads[r]);
		free(b->params[r]);
	}
}

/* The executor's ranges for the units of buckets lo..hi. */
static uint32_t unit_ranges(const struct plan *p, const struct shard_map *sm, uint32_t lo,
			    uint32_t hi, struct coll_range *out)
{
	uint32_t n = 0;

	for (uint32_t u = sm->bucket_first[lo]; u < sm->bucket_first[hi + 1]; u++)
		out[n++] = (struct coll_range){
			.owner = sm->units[u].owner,
			.off = p->buckets[sm->units[u].bucket].base + sm->units[u].offset,
			.n = sm->units[u].numel,
		};
	return n;
}

/* ----------------------------------------- REDUCE/BCAST directly --- */

struct coll_case {
	struct topo t;
	enum zc_shard_mode mode;
	uint64_t window;
	struct mesh m;
	char tag[96];
};

static void fill_grads(const struct topo *t, uint32_t node, struct bufs *b, uint64_t seed,
		       uint64_t n)
{
	for (uint32_t r = 0; r < t->world; r++)
		if (t->node_of[r] == node)
			for (uint64_t x = 0; x < n; x++)
				b->grads[r][x] = val(seed, r, x);
}

/* After a REDUCE of rg: each locally owned element is the reference. */
static void check_reduced(const struct coll_case *c, const struct bufs *b,
			  const struct coll_range *rg, uint32_t n, uint64_t seed, const char *what)
{
	uint64_t bad = 0, first = 0;
	float got = 0, want = 0;

	for (uint32_t k = 0; k < n; k++) {
		if (!b->grads[rg[k].owner])
			continue;
		for (uint64_t x = rg[k].off; x < rg[k].off + rg[k].n; x++) {
			float w = ref_avg(&c->t, seed, x), v = b->grads[rg[k].owner][x];
			if (!same_bits(v, w) && bad++ == 0)
				first = x, got = v, want = w;
		}
	}
	CHECK(bad == 0, "%s %s: %lu averages differ, first at %lu: %.9g, want %.9g", c->tag, what,
	      (unsigned long)bad, (unsigned long)first, got, want);
}

/* Parameters before a BCAST: the owner holds the truth, the others junk. */
static void fill_params(const struct topo *t, uint32_t node, struct bufs *b,
			const struct coll_range *rg, uint32_t n, uint64_t seed)
{
	for (uint32_t r = 0; r < t->world; r++) {
		if (t->node_of[r] != node)
			continue;
		for (uint32_t k = 0; k < n; k++)
			for (uint64_t x = rg[k].off; x < rg[k].off + rg[k].n; x++)
				b->params[r][x] = rg[k].owner == r ? val(seed, 1000, x)
								   : val(seed, 2000 + r, x);
	}
}

static void check_params(const struct coll_case *c, uint32_t node, const struct bufs *b,
			 const struct coll_range *rg, uint32_t n, uint64_t seed, const char *what)
{
	uint64_t bad = 0;

	for (uint32_t r = 0; r < c->t.world; r++) {
		if (c->t.node_of[r] != node)
			continue;
		for (uint32_t k = 0; k < n; k++)
			for (uint64_t x = rg[k].off; x < rg[k].off + rg[k].n; x++)
				bad += !same_bits(b->params[r][x], val(seed, 1000, x));
	}
	CHECK(bad == 0, "%s %s: node %u: %lu parameters are not their owner's", c->tag, what, node,
	      (unsigned long)bad);
}

static void coll_node(uint32_t node, void *arg)
{
	struct coll_case *c = arg;
	struct plan *p = make_plan(ZC_OPT_SGD, c->mode, ZC_STEP_INTERLEAVED);
	struct shard_map *sm = NULL;
	struct coll_store store = filestore_new(c->m.dir);
	struct coll_net net = node_net(node, &c->t, &c->m, &store, 10000, c->window);
	struct coll_range *rg = NULL, whole[NB];
	struct coll_group *g = NULL;
	struct pool *pool = NULL;
	struct bufs b;
	char err[256] = "";
	uint32_t n;

	REQUIRE(p && shard_assign(p, c->t.world, &sm) == 0, "%s: plan", c->tag);
	REQUIRE(bufs_new(&b, &c->t, node, p->total_numel) == 0 && pool_new(2, &pool) == 0,
		"%s: buffers", c->tag);
	rg = calloc(sm->nunits, sizeof(*rg));
	struct coll_config cc = {.world = c->t.world,
				 .grads = b.grads,
				 .params = b.params,
				 .pool = pool,
				 .net = &net,
				 .err = err,
				 .errlen = sizeof(err)};
	int r = coll_gloo_ops.open(&cc, &g);
	REQUIRE(r == 0, "%s: node %u: open: %d %s", c->tag, node, r, err);

	/* bucket by bucket, as the interleaved program issues them */
	fill_grads(&c->t, node, &b, 1, p->total_numel);
	for (uint32_t bk = 0; bk < NB; bk++) {
		n = unit_ranges(p, sm, bk, bk, rg);
		r = coll_run(g, COLL_REDUCE, c->mode, LANE_REDUCE, rg, n);
		CHECK(r == 0, "%s: reduce %u: %d %s", c->tag, bk, r,
		      coll_gloo_ops.last_error(g, 0));
		check_reduced(c, &b, rg, n, 1, "reduce per bucket");
	}
	/* everything in one request: windows cut across ranges */
	fill_grads(&c->t, node, &b, 2, p->total_numel);
	n = unit_ranges(p, sm, 0, NB - 1, rg);
	r = coll_run(g, COLL_REDUCE, c->mode, LANE_REDUCE, rg, n);
	CHECK(r == 0, "%s: reduce all: %d", c->tag, r);
	check_reduced(c, &b, rg, n, 2, "reduce all");

	for (uint32_t bk = 0; bk < NB; bk++) {
		n = unit_ranges(p, sm, bk, bk, rg);
		fill_params(&c->t, node, &b, rg, n, 3 + bk);
		r = coll_run(g, COLL_BCAST, c->mode, LANE_BCAST, rg, n);
		CHECK(r == 0, "%s: bcast %u: %d %s", c->tag, bk, r, coll_gloo_ops.last_error(g, 2));
		check_params(c, node, &b, rg, n, 3 + bk, "bcast per bucket");
	}
	n = unit_ranges(p, sm, 0, NB - 1, rg);
	fill_params(&c->t, node, &b, rg, n, 9);
	r = coll_run(g, COLL_BCAST, c->mode, LANE_BCAST, rg, n);
	CHECK(r == 0, "%s: bcast all: %d", c->tag, r);
	check_params(c, node, &b, rg, n, 9, "bcast all");

	/* the executor's start: whole buckets from rank 0, on the compute lane */
	for (uint32_t bk = 0; bk < NB; bk++)
		whole[bk] = (struct coll_range){0, p->buckets[bk].base, p->buckets[bk].numel};
	fill_params(&c->t, node, &b, whole, NB, 10);
	r = coll_run(g, COLL_BCAST, ZC_SHARD_BUCKET, LANE_COMPUTE, whole, NB);
	CHECK(r == 0, "%s: start bcast: %d", c->tag, r);
	check_params(c, node, &b, whole, NB, 10, "start bcast");

	coll_gloo_ops.close(g);
	free(rg);
	pool_free(pool);
	bufs_free(&b);
	filestore_free(&store);
	shard_map_free(sm);
	plan_free(p);
}

static const struct topo topos[] = {
	{2, 2, {0, 1}},    {3, 2, {0, 0, 1}},       {4, 2, {0, 1, 0, 1}},
	{3, 3, {0, 1, 2}}, {5, 3, {0, 1, 1, 2, 2}}, {5, 3, {2, 0, 1, 0, 1}},
};

static void t_coll(void)
{
	static const enum zc_shard_mode modes[] = {ZC_SHARD_BUCKET, ZC_SHARD_SLICE};
	static const uint64_t windows[] = {0, 777};
	unsigned runs = 0;
	char tn[64];

	for (size_t ti = 0; ti < ARRAY_SIZE(topos); ti++)
		for (size_t mi = 0; mi < 2; mi++)
			for (size_t wi = 0; wi < 2; wi++) {
				struct coll_case c = {
					.t = topos[ti], .mode = modes[mi], .window = windows[wi]};
				snprintf(c.tag, sizeof(c.tag), "%s %s window %lu",
					 topo_name(&c.t, tn, sizeof(tn)), plan_shard_name(c.mode),
					 (unsigned long)c.window);
				REQUIRE(mesh_new(&c.m) == 0, "mkdtemp");
				run_nodes(c.t.nnodes, coll_node, &c, c.tag);
				mesh_free(&c.m);
				runs++;
				if (test_failed_)
					return;
			}
	test_note("%u forked jobs, every average bit for bit", runs);
}

/* ------------------------------------------- through the executor --- */

struct exec_case {
	struct topo t;
	enum zc_optimizer opt;
	enum zc_shard_mode shard;
	enum zc_step_mode step;
	unsigned iters;
	struct mesh m;
	char tag[128];
	/* the sealed_executor_* case: node 1's lane-0 connection through a
	 * relay that flips a byte of its 5th frame; the job fails, naming it */
	bool tamper;
};

/* exec.c builds the coll_config itself and knows no nodes yet (part 2 of
 * the multi-node issue); this open hands it the test node's network. */
static const struct coll_net *test_net;
static struct coll_ops test_coll;

static int test_open(const struct coll_config *cfg, struct coll_group **ret)
{
	struct coll_config c = *cfg;

	c.net = test_net;
	return coll_gloo_ops.open(&c, ret);
}

static float init_value(uint64_t x)
{
	return val(77, 0, x);
}

static float grad_value(uint32_t rank, unsigned it, uint64_t x)
{
	return val(100 + it, rank, x);
}

struct ref {
	float *p, *g, *m, *v, *vmax;
};

static void ref_step(const struct exec_case *c, const struct plan *pl, struct ref *rf, unsigned it)
{
	uint64_t T = pl->total_numel;

	for (uint64_t x = 0; x < T; x++) {
		float total = 0;
		bool any_node = false;
		for (uint32_t j = 0; j < c->t.nnodes; j++) {
			float part = 0;
			bool any = false;
			for (uint32_t r = 0; r < c->t.world; r++) {
				if (c->t.node_of[r] != j)
					continue;
				part = any ? part + grad_value(r, it, x) : grad_value(r, it, x);
				any = true;
			}
			total = any_node ? total + part : part;
			any_node = true;
		}
		rf->g[x] = total / (float)c->t.world;
	}
	for (uint32_t b = 0; b < pl->nbuckets; b++)
		for (uint32_t k = 0; k < pl->buckets[b].nsegments; k++) {
			const struct zc_segment *sg = &pl->buckets[b].segments[k];
			const struct zc_param_group *h = &pl->groups[sg->group];
			uint64_t o = pl->buckets[b].base + sg->offset;
			if (c->opt == ZC_OPT_SGD)
				ref_sgd(h, rf->p + o, rf->g + o, rf->m + o, it == 0, sg->numel);
			else
				ref_adam(true, h, it + 1, rf->p + o, rf->g + o, rf->m + o,
					 rf->v + o, rf->vmax + o, sg->numel);
		}
}

/* Next completion within ms, or NULL. */
static struct exec_done *next_done(struct completion_queue *cq, struct exec_done **pending, int ms)
{
	if (!*pending) {
		struct pollfd pfd = {.fd = completion_queue_fd(cq), .events = POLLIN};
		if (poll(&pfd, 1, ms) <= 0)
			return NULL;
		*pending = completion_queue_take(cq);
	}
	struct exec_done *d = *pending;
	if (d)
		*pending = d->next;
	return d;
}

static bool in_bucket(const struct plan *pl, uint64_t x)
{
	for (uint32_t b = 0; b < pl->nbuckets; b++)
		if (x >= pl->buckets[b].base && x < pl->buckets[b].base + pl->buckets[b].numel)
			return true;
	return false;
}

/* Every local rank's parameters against the reference. */
static void check_against(const struct exec_case *c, const struct plan *pl, uint32_t node,
			  float *const *params, const float *want, const char *when)
{
	double worst = 0;
	uint64_t bad = 0, first = 0;
	uint32_t first_rank = 0;

	for (uint32_t r = 0; r < c->t.world; r++) {
		if (c->t.node_of[r] != node)
			continue;
		for (uint64_t x = 0; x < pl->total_numel; x++) {
			if (!in_bucket(pl, x))
				continue; /* padding: nobody's */
			float got = params[r][x];
			bool ok;
			if (c->opt == ZC_OPT_SGD) {
				ok = same_bits(got, want[x]);
			} else {
				double d = fabs((double)got - want[x]);
				double rel = d / fmax(fabs((double)want[x]), 1e-30);
				worst = fmax(worst, rel);
				ok = rel <= 1e-6;
			}
			if (!ok && bad++ == 0)
				first = x, first_rank = r;
		}
	}
	CHECK(bad == 0,
	      "%s %s: node %u: %lu parameters differ, first rank %u [%lu]: %.9g, want %.9g", c->tag,
	      when, node, (unsigned long)bad, first_rank, (unsigned long)first,
	      bad ? params[first_rank][first] : 0.0f, bad ? want[first] : 0.0f);
	if (c->opt != ZC_OPT_SGD && worst > 0)
		test_note("%s %s: node %u: largest relative difference %.3g", c->tag, when, node,
			  worst);
}

static void exec_node(uint32_t node, void *arg)
{
	struct exec_case *c = arg;
	struct plan *p = make_plan(c->opt, c->shard, c->step);
	struct shard_map *sm = NULL;
	struct coll_store store = c->tamper ? relaystore_new(c->m.dir, RELAY_FLIP, 5)
					    : filestore_new(c->m.dir);
	struct coll_net net = node_net(node, &c->t, &c->m, &store, 10000, 0);
	struct zero_topo zt = {c->t.world, c->t.nnodes, node, c->t.node_of};
	bool refused = false;
	struct zero_caps caps = {.local_fuse = coll_gloo_ops.local_fuse};
	struct zero_program prog = {0};
	struct completion_queue *cq = NULL;
	struct exec_done *pending = NULL, *d;
	struct pool *pool = NULL;
	struct state *st = NULL;
	struct exec *e = NULL;
	struct ref rf = {0};
	struct bufs b;
	uint64_t T;

	REQUIRE(p && shard_assign(p, c->t.world, &sm) == 0, "%s: plan", c->tag);
	T = p->total_numel;
	REQUIRE(bufs_new(&b, &c->t, node, T) == 0 && pool_new(2, &pool) == 0 &&
			completion_queue_new(&cq) == 0 && zero_program(p, &zt, &caps, &prog) == 0 &&
			state_layout(p, sm, &zt,
				     plan_state_arrays(p->optimizer, p->groups, p->ngroups),
				     &st) == 0,
		"%s: setup", c->tag);
	rf.p = calloc(T, 4), rf.g = calloc(T, 4), rf.m = calloc(T, 4);
	rf.v = calloc(T, 4), rf.vmax = calloc(T, 4);
	for (uint64_t x = 0; x < T; x++)
		rf.p[x] = init_value(x);
	/* rank 0's parameters win at the start; the others start from junk */
	for (uint32_t r = 0; r < c->t.world; r++)
		if (b.params[r])
			for (uint64_t x = 0; x < T; x++)
				b.params[r][x] = r == 0 ? init_value(x) : val(5, r, x);
	test_net = &net;
	test_coll = coll_gloo_ops;
	test_coll.open = test_open;
	struct exec_config ec = {.tag = c,
				 .plan = p,
				 .shard = sm,
				 .prog = &prog,
				 .state = st,
				 .world = c->t.world,
				 .grads = b.grads,
				 .params = b.params,
				 .coll = &test_coll,
				 .optim = &optim_cpu_ops,
				 .pool = pool,
				 .cq = cq};
	REQUIRE(exec_new(&ec, &e) == 0, "%s: exec_new", c->tag);
	d = next_done(cq, &pending, NODE_T);
	CHECK(d && d->ev == EXEC_STARTED, "%s: node %u: no start (%d, status %d)", c->tag, node,
	      d ? (int)d->ev : -1, d ? d->status : 0);
	free(d);
	if (!test_failed_)
		check_against(c, p, node, b.params, rf.p, "after the start");
	for (unsigned it = 0; it < c->iters && !test_failed_; it++) {
		for (uint32_t r = 0; r < c->t.world; r++)
			if (b.grads[r])
				for (uint64_t x = 0; x < T; x++)
					b.grads[r][x] = grad_value(r, it, x);
		for (uint32_t bk = 0; bk < p->nbuckets; bk++)
			CHECK(exec_bucket_ex(e, it, bk, NULL) == 0, "%s: exec_bucket", c->tag);
		ref_step(c, p, &rf, it);
		for (;;) {
			d = next_done(cq, &pending, NODE_T);
			if (c->tamper && d && d->ev == EXEC_FAILED) {
				/* node 0 opened the changed frame; node 1 hears of it */
				const char *why = d->detail ? d->detail : "";
				test_note("node %u: %s failed: %s: %s", node, d->op,
					  zc_strerror_name(d->status), why);
				CHECK(node == 0 ? d->status == -EBADMSG && strstr(why, "node 1") &&
							  strstr(why, "does not open")
						: d->status < 0 && strstr(why, "node 0"),
				      "%s: node %u: %s: %s", c->tag, node,
				      zc_strerror_name(d->status), why);
				refused = true;
				free(d);
				break;
			}
			if (!d || d->ev == EXEC_FAILED) {
				CHECK(false, "%s: node %u iteration %u: %s %s: %d", c->tag, node,
				      it, d ? "failed in" : "timed out", d ? d->op : "",
				      d ? d->status : 0);
				free(d);
				break;
			}
			bool end = d->ev == EXEC_STEP_DONE;
			free(d);
			if (end)
				break;
		}
		if (refused)
			break;
		if (!test_failed_) {
			char when[32];
			snprintf(when, sizeof(when), "iteration %u", it);
			check_against(c, p, node, b.params, rf.p, when);
		}
	}
	CHECK(!c->tamper || refused, "%s: node %u: the changed byte went unnoticed", c->tag, node);
	exec_stop(e);
	while ((d = next_done(cq, &pending, NODE_T))) {
		bool stopped = d->ev == EXEC_STOPPED;
		free(d);
		if (stopped)
			break;
	}
	exec_free(e);
	while (pending) {
		d = pending;
		pending = d->next;
		free(d);
	}
	free(rf.p), free(rf.g), free(rf.m), free(rf.v), free(rf.vmax);
	completion_queue_free(cq);
	zero_program_clear(&prog);
	pool_free(pool);
	bufs_free(&b);
	if (c->tamper)
		relaystore_free(&store);
	else
		filestore_free(&store);
	shard_map_free(sm);
	plan_free(p);
}

static void exec_matrix(enum zc_optimizer opt)
{
	static const enum zc_shard_mode shards[] = {ZC_SHARD_BUCKET, ZC_SHARD_SLICE};
	static const enum zc_step_mode steps[] = {ZC_STEP_INTERLEAVED, ZC_STEP_AT_END};
	unsigned runs = 0;
	char tn[64];

	for (size_t ti = 0; ti < ARRAY_SIZE(topos); ti++)
		for (size_t s = 0; s < 2; s++)
			for (size_t m = 0; m < 2; m++) {
				struct exec_case c = {.t = topos[ti],
						      .opt = opt,
						      .shard = shards[s],
						      .step = steps[m],
						      .iters = 3};
				snprintf(c.tag, sizeof(c.tag), "%s %s/%s/%s",
					 topo_name(&c.t, tn, sizeof(tn)),
					 opt == ZC_OPT_SGD ? "sgd" : "adamw",
					 plan_shard_name(c.shard), plan_step_name(c.step));
				REQUIRE(mesh_new(&c.m) == 0, "mkdtemp");
				run_nodes(c.t.nnodes, exec_node, &c, c.tag);
				mesh_free(&c.m);
				runs++;
				if (test_failed_)
					return;
			}
	test_note("%u forked jobs of 3 iterations checked", runs);
}

static void t_exec_sgd(void)
{
	exec_matrix(ZC_OPT_SGD);
}

static void t_exec_adamw(void)
{
	exec_matrix(ZC_OPT_ADAMW);
}

/* ------------------------------------------------------ failures --- */

/* A two-process scenario, told apart by `kind`. Pipes: up (nodes -> test:
 * one byte when ready), go (test -> node 0: start), hold (test -> node 1:
 * EOF lets it leave). */
enum fail_kind {
	F_ABORT_SILENT,   /* node 1 never joins the collective; node 0 aborts */
	F_ABORT_STOPPED,  /* node 1 is stopped mid-transfer; node 0 aborts */
	F_TIMEOUT_SILENT, /* node 1 never joins the collective; node 0 times out */
	F_KILLED,         /* node 2 of 3 is killed while 0 and 1 wait on it */
};

struct fail_case {
	enum fail_kind kind;
	struct topo t;
	struct mesh m;
	uint32_t timeout_ms;
	uint64_t n; /* elements of the one range */
	int up[2], go[2], hold[2];
	const char *tag;
};

struct submitter {
	pthread_t th;
	struct coll_group *g;
	struct waiter w;
	struct coll_range rg;
};

static void *submit_main(void *arg)
{
	struct submitter *s = arg;

	if (coll_gloo_ops.submit(s->g, &s->w.req) < 0)
		waiter_done(&s->w.req, -EINVAL);
	return NULL;
}

static void submit_async(struct submitter *s, struct coll_group *g, uint64_t n)
{
	s->g = g;
	s->rg = (struct coll_range){.owner = 0, .off = 0, .n = n};
	waiter_init(&s->w, COLL_REDUCE, ZC_SHARD_BUCKET, LANE_REDUCE, &s->rg, 1);
	pthread_create(&s->th, NULL, submit_main, s);
}

static char read_byte(int fd)
{
	char c = 0;

	return read(fd, &c, 1) == 1 ? c : 0;
}

static void fail_node(uint32_t node, void *arg)
{
	struct fail_case *c = arg;
	struct coll_store store = filestore_new(c->m.dir);
	struct coll_net net = node_net(node, &c->t, &c->m, &store, c->timeout_ms, 0);
	struct coll_group *g = NULL;
	struct pool *pool = NULL;
	struct submitter s;
	struct bufs b;
	char err[256] = "";
	int r;

	close(c->up[0]);
	close(c->go[1]);
	close(c->hold[1]); /* so a silent node sees EOF when the test is done */
	REQUIRE(bufs_new(&b, &c->t, node, c->n) == 0 && pool_new(1, &pool) == 0, "%s: setup",
		c->tag);
	for (uint32_t k = 0; k < c->t.world; k++)
		if (b.grads[k])
			for (uint64_t x = 0; x < c->n; x++)
				b.grads[k][x] = 1.0f, b.params[k][x] = 0.0f;
	struct coll_config cc = {.world = c->t.world,
				 .grads = b.grads,
				 .params = b.params,
				 .pool = pool,
				 .net = &net,
				 .err = err,
				 .errlen = sizeof(err)};
	r = coll_gloo_ops.open(&cc, &g);
	REQUIRE(r == 0, "%s: node %u: open: %d %s", c->tag, node, r, err);
	CHECK(write(c->up[1], "r", 1) == 1, "ready");

	bool victim = (c->kind == F_KILLED && node == 2) || (c->kind != F_KILLED && node == 1);
	if (victim && c->kind != F_ABORT_STOPPED) {
		/* silent: joins no collective; leaves when told (or is killed) */
		read_byte(c->hold[0]);
		goto out;
	}
	if (victim) {
		/* post the big exchange, then stop dead inside it */
		submit_async(&s, g, c->n);
		poll(NULL, 0, 300);
		raise(SIGSTOP);
		_exit(0); /* not reached: the test kills us */
	}
	if (c->kind == F_ABORT_STOPPED)
		read_byte(c->go[0]); /* until node 1 is stopped inside its exchange */
	int64_t t0 = now_ms();
	submit_async(&s, g, c->n);
	if (c->kind == F_ABORT_SILENT || c->kind == F_ABORT_STOPPED) {
		r = waiter_wait(&s.w, 300);
		CHECK(r == 1, "%s: the collective ended (%d) with a peer out of it", c->tag, r);
		int64_t ta = now_ms();
		coll_gloo_ops.abort(g);
		r = waiter_wait(&s.w, 5000);
		int64_t dt = now_ms() - ta;
		CHECK(r == -ECANCELED && dt < 2000,
		      "%s: node %u: abort: status %d after %ld ms (want -ECANCELED soon; timeout "
		      "%u)",
		      c->tag, node, r, (long)dt, c->timeout_ms);
		test_note("%s: abort ended the collective in %ld ms", c->tag, (long)dt);
	} else {
		r = waiter_wait(&s.w, (int)c->timeout_ms + 5000);
		int64_t dt = now_ms() - t0;
		bool want_timeout = c->kind == F_TIMEOUT_SILENT;
		CHECK(r < 0 && r != -ECANCELED && (!want_timeout || r == -ETIMEDOUT) &&
			      dt <= c->timeout_ms + 2000, /* slack for a loaded machine */
		      "%s: node %u: status %d (%s) after %ld ms, timeout %u ms", c->tag, node, r,
		      coll_gloo_ops.last_error(g, LANE_REDUCE), (long)dt, c->timeout_ms);
		test_note("%s: node %u: %s after %ld ms", c->tag, node,
			  coll_gloo_ops.last_error(g, LANE_REDUCE), (long)dt);
	}
	pthread_join(s.th, NULL);
out:
	coll_gloo_ops.close(g);
	pool_free(pool);
	bufs_free(&b);
	filestore_free(&store);
}

static void fail_run(struct fail_case *c)
{
	pid_t pid[MAXN];
	int64_t deadline = now_ms() + NODE_T;
	uint32_t victim = c->kind == F_KILLED ? 2 : 1;

	REQUIRE(mesh_new(&c->m) == 0 && pipe(c->up) == 0 && pipe(c->go) == 0 && pipe(c->hold) == 0,
		"setup");
	for (uint32_t j = 0; j < c->t.nnodes; j++)
		pid[j] = spawn(fail_node, j, c);
	close(c->up[1]);
	close(c->hold[0]);
	for (uint32_t j = 0; j < c->t.nnodes; j++)
		CHECK(read_byte(c->up[0]) == 'r', "%s: a node did not open", c->tag);
	if (c->kind == F_ABORT_STOPPED) {
		int st;
		CHECK(waitpid(pid[1], &st, WUNTRACED) == pid[1] && WIFSTOPPED(st),
		      "%s: node 1 stopped", c->tag);
		CHECK(write(c->go[1], "g", 1) == 1, "go");
	}
	if (c->kind == F_KILLED) {
		poll(NULL, 0, 300); /* nodes 0 and 1 are blocked on node 2 by now */
		kill(pid[victim], SIGKILL);
	}
	for (uint32_t j = 0; j < c->t.nnodes; j++) {
		if (j == victim)
			continue;
		int rc = reap(pid[j], deadline);
		CHECK(rc == 0, "%s: node %u ended with %d", c->tag, j, rc);
	}
	close(c->hold[1]); /* a silent victim may leave now */
	if (c->kind == F_ABORT_STOPPED)
		kill(pid[victim], SIGKILL);
	reap(pid[victim], deadline);
	close(c->up[0]);
	close(c->go[0]);
	close(c->go[1]);
	mesh_free(&c->m);
}

static void t_abort_silent_peer(void)
{
	struct fail_case c = {.kind = F_ABORT_SILENT,
			      .t = {2, 2, {0, 1}},
			      .timeout_ms = 20000,
			      .n = 1 << 16,
			      .tag = "abort, silent peer"};
	fail_run(&c);
}

static void t_abort_stopped_peer(void)
{
	/* 8 MiB each way: far more than a socket buffer, so node 0's send is
	 * half written when node 1 stops */
	struct fail_case c = {.kind = F_ABORT_STOPPED,
			      .t = {2, 2, {0, 1}},
			      .timeout_ms = 20000,
			      .n = 4u << 20,
			      .tag = "abort, peer stopped mid-transfer"};
	fail_run(&c);
}

static void t_timeout_silent_peer(void)
{
	struct fail_case c = {.kind = F_TIMEOUT_SILENT,
			      .t = {2, 2, {0, 1}},
			      .timeout_ms = 1000,
			      .n = 1 << 16,
			      .tag = "timeout, silent peer"};
	fail_run(&c);
}

static void t_killed_peer(void)
{
	struct fail_case c = {.kind = F_KILLED,
			      .t = {4, 3, {0, 1, 2, 0}},
			      .timeout_ms = 5000,
			      .n = 1 << 16,
			      .tag = "killed peer"};
	fail_run(&c);
}

/* A node that never comes: the open fails within the timeout, naming it. */
static void never_joins_node(uint32_t node, void *arg)
{
	struct mesh *m = arg;
	struct topo t = {2, 2, {0, 1}};
	struct coll_store store = filestore_new(m->dir);
	struct coll_net net = node_net(node, &t, m, &store, 500, 0);
	struct bufs b;
	struct coll_group *g = NULL;
	char err[256] = "";

	REQUIRE(bufs_new(&b, &t, node, 16) == 0, "buffers");
	struct coll_config cc = {.world = 2,
				 .grads = b.grads,
				 .params = b.params,
				 .net = &net,
				 .err = err,
				 .errlen = sizeof(err)};
	int64_t t0 = now_ms();
	int r = coll_gloo_ops.open(&cc, &g);
	int64_t dt = now_ms() - t0;
	CHECK(r == -ETIMEDOUT && strstr(err, "node 1") && dt < 3000,
	      "open without node 1: %d \"%s\" after %ld ms", r, err, (long)dt);
	test_note("open without node 1: \"%s\" after %ld ms", err, (long)dt);
	if (r == 0)
		coll_gloo_ops.close(g);
	bufs_free(&b);
	filestore_free(&store);
}

static void t_never_joins(void)
{
	struct mesh m;

	REQUIRE(mesh_new(&m) == 0, "mkdtemp");
	run_nodes(1, never_joins_node, &m, "never joins");
	mesh_free(&m);
}

#define SEALED(name, fn)                                                                           \
	static void name(void)                                                                     \
	{                                                                                          \
		use_sealed_mesh();                                                                 \
		fn();                                                                              \
	}
SEALED(t_sealed_never_joins, t_never_joins)
SEALED(t_sealed_coll, t_coll)
SEALED(t_sealed_exec_sgd, t_exec_sgd)
SEALED(t_sealed_abort_silent_peer, t_abort_silent_peer)
SEALED(t_sealed_abort_stopped_peer, t_abort_stopped_peer)
SEALED(t_sealed_timeout_silent_peer, t_timeout_silent_peer)
SEALED(t_sealed_killed_peer, t_killed_peer)

/* The executor over the sealed mesh, one byte changed on the wire: both
 * nodes' executors fail the iteration, node 0 (which opened the frame)
 * naming node 1 and the frame that does not open, node 1 naming node 0. */
static void t_sealed_exec_tampered(void)
{
	struct exec_case c = {.t = {2, 2, {0, 1}},
			      .opt = ZC_OPT_SGD,
			      .shard = ZC_SHARD_BUCKET,
			      .step = ZC_STEP_INTERLEAVED,
			      .iters = 3,
			      .tamper = true};

	use_sealed_mesh();
	snprintf(c.tag, sizeof(c.tag), "sealed, a changed byte");
	REQUIRE(mesh_new(&c.m) == 0, "mkdtemp");
	run_nodes(2, exec_node, &c, c.tag);
	mesh_free(&c.m);
}

/* Topologies open refuses: a node without ranks, a rank on no node. */
static void t_bad_topology(void)
{
	float buf[4];
	float *here[2] = {buf, NULL}, *none[2] = {NULL, NULL};
	uint32_t two[2] = {0, 1}, bad[2] = {0, 5};
	struct coll_store store = {0};
	struct coll_net net = {.nnodes = 3,
			       .node = 0,
			       .node_of = two,
			       .host = "127.0.0.1",
			       .prefix = "x/",
			       .store = &store};
	struct coll_config cc = {.world = 2, .grads = here, .params = here, .net = &net};
	struct coll_group *g = NULL;

	CHECK(coll_gloo_ops.open(&cc, &g) == -EINVAL, "node 2 has no rank");
	net.nnodes = 2;
	net.node_of = bad;
	CHECK(coll_gloo_ops.open(&cc, &g) == -EINVAL, "rank 1 on node 5");
	net.node_of = two;
	cc.grads = cc.params = none;
	CHECK(coll_gloo_ops.open(&cc, &g) == -EINVAL, "this node's rank 0 has no buffers");
	cc.net = NULL;
	CHECK(coll_gloo_ops.open(&cc, &g) == -EINVAL, "no network settings");
}

/* ----------------------------------------------------- benchmark --- */

struct bench {
	struct mesh m, raw;
	uint64_t n;
	unsigned iters;
};

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double median(double *v, unsigned n)
{
	qsort(v, n, sizeof(*v), cmp_double);
	return v[n / 2];
}

static double secs(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void bench_node(uint32_t node, void *arg)
{
	struct bench *bn = arg;
	struct topo t = {2, 2, {0, 1}};
	struct coll_store store = filestore_new(bn->m.dir), raw_store = filestore_new(bn->raw.dir);
	struct coll_net net = node_net(node, &t, &bn->m, &store, 60000, 0);
	struct coll_range one = {.owner = 0, .off = 0, .n = bn->n};
	struct coll_range halves[2] = {{0, 0, bn->n / 2}, {1, bn->n / 2, bn->n - bn->n / 2}};
	struct gloo_shim_config rc = {.rank = (int)node,
				      .size = 2,
				      .host = "127.0.0.1",
				      .prefix = bn->raw.prefix,
				      .store = &raw_store,
				      .timeout_ms = 60000};
	struct gloo_shim *raw = NULL;
	struct coll_group *g = NULL;
	struct pool *pool = NULL;
	double t_raw[64], t_ar[64], t_rs[64];
	float *rawbuf = NULL;
	struct bufs b;
	char err[256] = "";
	unsigned k;

	REQUIRE(bufs_new(&b, &t, node, bn->n) == 0 && pool_new(0, &pool) == 0 &&
			posix_memalign((void **)&rawbuf, 64, bn->n * sizeof(float)) == 0,
		"buffers");
	for (uint64_t x = 0; x < bn->n; x++)
		b.grads[node][x] = rawbuf[x] = 1.0f;
	struct coll_config cc = {.world = 2,
				 .grads = b.grads,
				 .params = b.params,
				 .pool = pool,
				 .net = &net,
				 .err = err,
				 .errlen = sizeof(err)};
	REQUIRE(coll_gloo_ops.open(&cc, &g) == 0, "open: %s", err);
	REQUIRE(gloo_shim_open(&rc, &raw, err, sizeof(err)) == 0, "raw open: %s", err);
	for (k = 0; k < bn->iters + 2; k++) {
		/* alternate, so both see the same noise; the first two warm up */
		double t0 = secs();
		int r = gloo_shim_allreduce_sum(raw, k, rawbuf, bn->n, err, sizeof(err));
		double t1 = secs();
		int r2 = coll_run(g, COLL_REDUCE, ZC_SHARD_BUCKET, LANE_REDUCE, &one, 1);
		double t2 = secs();
		int r3 = coll_run(g, COLL_REDUCE, ZC_SHARD_SLICE, LANE_REDUCE, halves, 2);
		double t3 = secs();
		REQUIRE(r == 0 && r2 == 0 && r3 == 0, "bench: %d %d %d %s", r, r2, r3, err);
		if (k >= 2) {
			t_raw[k - 2] = t1 - t0;
			t_ar[k - 2] = t2 - t1;
			t_rs[k - 2] = t3 - t2;
		}
		for (uint64_t x = 0; x < bn->n; x++)
			rawbuf[x] = 1.0f;
	}
	if (node == 0) {
		double bytes = (double)bn->n * sizeof(float), f = 2.0 * (2 - 1) / 2;
		double mr = median(t_raw, bn->iters), ma = median(t_ar, bn->iters);
		double ms = median(t_rs, bn->iters);
		printf("gloo busbw, 2 nodes on loopback, %.0f MiB, median of %u (nccl-tests "
		       "busbw = algbw x 2(n-1)/n; x (n-1)/n for reduce-scatter)\n",
		       bytes / (1 << 20), bn->iters);
		printf("  raw gloo::allreduce        %8.2f ms  algbw %6.2f GB/s  busbw %6.2f "
		       "GB/s\n",
		       mr * 1e3, bytes / mr / 1e9, bytes / mr / 1e9 * f);
		printf("  coll_gloo REDUCE (bucket)  %8.2f ms  algbw %6.2f GB/s  busbw %6.2f GB/s"
		       "  (%.0f%% of raw)\n",
		       ma * 1e3, bytes / ma / 1e9, bytes / ma / 1e9 * f, 100 * mr / ma);
		printf("  coll_gloo REDUCE (slice)   %8.2f ms  algbw %6.2f GB/s  busbw %6.2f GB/s"
		       "  (reduce-scatter)\n",
		       ms * 1e3, bytes / ms / 1e9, bytes / ms / 1e9 * 0.5);
		fflush(stdout);
	}
	gloo_shim_close(raw);
	coll_gloo_ops.close(g);
	free(rawbuf);
	pool_free(pool);
	bufs_free(&b);
	filestore_free(&store);
	filestore_free(&raw_store);
}

static int bench_main(int argc, char **argv)
{
	struct bench bn = {.n = (64u << 20) / sizeof(float), .iters = 10};

	if (argc > 2)
		bn.n = (uint64_t)strtoull(argv[2], NULL, 10) * (1u << 20) / sizeof(float);
	if (argc > 3)
		bn.iters = (unsigned)MIN(strtoul(argv[3], NULL, 10), 64ul);
	if (bn.n < 2 || bn.iters < 1 || mesh_new(&bn.m) < 0 || mesh_new(&bn.raw) < 0) {
		fprintf(stderr, "usage: test-gloo --bench [MiB] [iterations <= 64]\n");
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);
	run_nodes(2, bench_node, &bn, "bench");
	mesh_free(&bn.m);
	mesh_free(&bn.raw);
	return test_failed_ ? 1 : 0;
}

static const struct test_case cases[] = {
	{"bad_topology_refused", t_bad_topology},
	{"never_joins_fails_open", t_never_joins},
	{"reduce_bcast_bit_for_bit", t_coll},
	{"executor_sgd_bit_for_bit", t_exec_sgd},
	{"executor_adamw_1e-6", t_exec_adamw},
	{"abort_ends_collective_with_silent_peer", t_abort_silent_peer},
	{"abort_ends_transfer_to_stopped_peer", t_abort_stopped_peer},
	{"silent_peer_times_out", t_timeout_silent_peer},
	{"killed_peer_fails_within_timeout", t_killed_peer},
	/* the same over the mesh over TLS (a TLS identity) */
	{"sealed_never_joins_fails_open", t_sealed_never_joins},
	{"sealed_reduce_bcast_bit_for_bit", t_sealed_coll},
	{"sealed_executor_sgd_bit_for_bit", t_sealed_exec_sgd},
	{"sealed_abort_ends_collective_with_silent_peer", t_sealed_abort_silent_peer},
	{"sealed_abort_ends_transfer_to_stopped_peer", t_sealed_abort_stopped_peer},
	{"sealed_silent_peer_times_out", t_sealed_timeout_silent_peer},
	{"sealed_killed_peer_fails_within_timeout", t_sealed_killed_peer},
	{"sealed_executor_changed_byte_fails_naming_the_peer", t_sealed_exec_tampered},
};

int main(int argc, char **argv)
{
	signal(SIGPIPE, SIG_IGN);
	if (argc > 1 && strcmp(argv[1], "--bench") == 0)
		return bench_main(argc, argv);
	return test_main(cases, ARRAY_SIZE(cases), argc, argv);
}
