/*
 * test_api.c — libzeroclient's API v1 contract against a real zerod: the
 * ABI (structs read by their own size, an older caller's smaller structs, a
 * newer caller's larger ones, the init functions, the version), errors (a
 * reason per call and per thread, the latest error the daemon reported, NULL
 * handles, every zmq_setsockopt checked), a client used after fork(), and
 * completion callbacks (run once, with no lock held, so they may call back
 * into the client), and that a waiter sleeps without the client's lock.
 *
 * zmq_setsockopt is interposed here (the executable exports it): a case
 * makes it fail for one option, and zc_connect must say so.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "harness.h"
#include "testlib.h"
#include "zctest.h"

static struct zd daemon_;

#define FAIL(...)                                                                                  \
	do {                                                                                       \
		printf("# " __VA_ARGS__);                                                          \
		printf("\n");                                                                      \
		return 1;                                                                          \
	} while (0)

/* ------------------------------------------------- zmq_setsockopt, interposed --- */

static int fail_option = -1; /* the option zmq_setsockopt refuses; -1: none */

int zmq_setsockopt(void *s, int option, const void *val, size_t len)
{
	static int (*real)(void *, int, const void *, size_t);

	if (option == fail_option) {
		errno = EINVAL;
		return -1;
	}
	if (!real)
		*(void **)&real = dlsym(RTLD_NEXT, "zmq_setsockopt");
	return real(s, option, val, len);
}

/* ------------------------------------------------------------------ helpers --- */

static const struct zc_param_group sgd = {GROUP_SIZE, .lr = 0.5};
static const struct zc_segment segs1[4][1] = {
	{SEG(0, 16, 0)}, {SEG(0, 40, 0)}, {SEG(0, 8, 0)}, {SEG(0, 24, 0)}};
static const struct zc_bucket buckets1[4] = {BUCKET(16, 1, segs1[0]), BUCKET(40, 1, segs1[1]),
					     BUCKET(8, 1, segs1[2]), BUCKET(24, 1, segs1[3])};
/* SGD lr 0.5, 1 or 4 buckets, interleaved: each bucket completes on its own */
static const struct zc_plan plan1 =
	PLAN(ZC_OPT_SGD, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED, 1, &sgd, 1, buckets1);
static const struct zc_plan plan4 =
	PLAN(ZC_OPT_SGD, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED, 1, &sgd, 4, buckets1);

static zc_client *join(const char *job, uint32_t rank, uint32_t world, const struct zc_plan *p)
{
	struct zc_config cfg = test_config(&daemon_, job, rank, world);
	zc_client *c = NULL;
	int r;

	if ((r = zc_connect(&cfg, &c)) < 0 || (r = zc_alloc_buffers(c, p)) < 0 ||
	    (r = zc_register_plan(c)) < 0) {
		printf("# %s rank %u: join: %s %s\n", job, rank, zc_strerror_name(r),
		       zc_error_message());
		zc_close(c);
		return NULL;
	}
	return c;
}

static bool has(const char *s, const char *needle)
{
	return s && strstr(s, needle);
}

/* Hand over every bucket of plan p with gradient g and wait for the step. */
static int iterate(zc_client *c, const struct zc_plan *p, float g)
{
	uint64_t it = zc_iteration(c);
	zc_future *step = NULL;
	int r;

	for (uint32_t b = 0; b < p->nbuckets; b++) {
		for (uint64_t i = 0; i < p->buckets[b].numel; i++)
			zc_grad_buffer(c, b)[i] = g;
		if ((r = zc_bucket_ready(c, b, NULL)) < 0)
			return r;
	}
	if ((r = zc_step_future(c, it, &step)) < 0)
		return r;
	r = zc_future_wait(step, test_timeout(10000));
	zc_future_free(step);
	return r;
}

/* ---------------------------------------------------------------------- ABI --- */

static void t_version(void)
{
	CHECK(zc_version() == ZC_VERSION, "zc_version() %u, header %d", zc_version(), ZC_VERSION);
	CHECK(ZC_VERSION == ZC_VERSION_MAJOR * 10000 + ZC_VERSION_MINOR * 100 + ZC_VERSION_PATCH,
	      "ZC_VERSION %d", ZC_VERSION);
	CHECK(ZC_VERSION_MAJOR == 1, "major %d", ZC_VERSION_MAJOR);
}

/* Each init function writes its type's defaults (what its ZC_..._INIT
 * says), its size, and nothing past the size it was given. */
static void t_init_functions(void)
{
	static const struct zc_param_group gi = ZC_PARAM_GROUP_INIT;
	static const struct zc_plan pi = ZC_PLAN_INIT;
	struct {
		struct zc_param_group g;
		unsigned char canary[8];
	} big;
	struct zc_param_group g;
	struct zc_config cfg;
	struct zc_segment s;
	struct zc_bucket b;
	struct zc_plan p;

	memset(&g, 0xa5, sizeof(g));
	REQUIRE(zc_param_group_init(&g, sizeof(g)) == 0, "param_group_init");
	CHECK(g.size == sizeof(g) && g.lr == 1e-3 && g.beta1 == 0.9 && g.beta2 == 0.999 &&
		      g.eps == 1e-8 && g.momentum == 0 && !g.nesterov && !g.amsgrad && !g.reserved,
	      "param_group_init wrote size %u lr %g beta2 %g", g.size, g.lr, g.beta2);
	CHECK(memcmp(&g, &gi, sizeof(g)) == 0, "param_group_init differs from ZC_PARAM_GROUP_INIT");
	memset(&p, 0xa5, sizeof(p));
	CHECK(zc_plan_init(&p, sizeof(p)) == 0 && memcmp(&p, &pi, sizeof(p)) == 0 &&
		      p.optimizer == ZC_OPT_SGD && p.shard_mode == ZC_SHARD_BUCKET,
	      "plan_init");
	memset(&cfg, 0xa5, sizeof(cfg));
	CHECK(zc_config_init(&cfg, sizeof(cfg)) == 0 && cfg.size == sizeof(cfg) && !cfg.job_id &&
		      !cfg.socket && cfg.rank == 0 && cfg.connect_timeout_ms == 0,
	      "config_init");
	memset(&s, 0xa5, sizeof(s));
	memset(&b, 0xa5, sizeof(b));
	CHECK(zc_segment_init(&s, sizeof(s)) == 0 && s.size == sizeof(s) && s.numel == 0,
	      "segment_init");
	CHECK(zc_bucket_init(&b, sizeof(b)) == 0 && b.size == sizeof(b) && !b.segments,
	      "bucket_init");

	/* an older caller's smaller struct: only its 16 bytes are written */
	memset(&big, 0xa5, sizeof(big));
	CHECK(zc_param_group_init(&big.g, 16) == 0 && big.g.size == 16 && big.g.lr == 1e-3,
	      "param_group_init(16)");
	CHECK(((unsigned char *)&big.g)[16] == 0xa5, "param_group_init(16) wrote byte 16");
	/* a newer caller's larger struct: the bytes this library does not know
	 * are zeroed, so the caller's later fields start out as "not used" */
	CHECK(zc_param_group_init(&big.g, sizeof(big)) == 0 && big.g.size == sizeof(big) &&
		      big.canary[0] == 0 && big.canary[7] == 0 && big.g.lr == 1e-3,
	      "param_group_init(%zu)", sizeof(big));
	/* sizes out of range: refused, nothing written, a reason */
	memset(&g, 0xa5, sizeof(g));
	CHECK(zc_param_group_init(&g, 0) == -EINVAL && ((unsigned char *)&g)[0] == 0xa5,
	      "param_group_init(0)");
	CHECK(has(zc_error_message(), "zc_param_group_init"), "reason \"%s\"", zc_error_message());
	CHECK(zc_plan_init(&p, ZC_STRUCT_MAX_SIZE + 1) == -E2BIG, "plan_init(4097)");
	CHECK(zc_config_init(NULL, sizeof(cfg)) == -EINVAL, "config_init(NULL)");
}

/*
 * zc_param_group as a header older than this one could have declared it:
 * the same fields, fewer of them (a caller built before beta1, beta2 and eps
 * existed). Its arrays have a stride of 24 bytes, not 64.
 */
struct old_group {
	uint32_t size;
	bool nesterov, amsgrad, maximize;
	uint8_t reserved;
	double lr;
	double momentum;
};

/* a newer caller's zc_param_group, with a field this library does not know */
struct new_group {
	struct zc_param_group g;
	double future;
};

/*
 * One bucket of two segments: [0, 40) in group 0 (lr 0.5, no momentum),
 * [40, 100) in group 1 (lr 0.25, momentum 0.9); gradients 1, parameters
 * from 0. After iteration 0 group 1 changes to lr 0.125 by zc_set_hyper()
 * with the caller's own struct. By hand, after iteration 1: group 0 at
 * -0.5 - 0.5 = -1, group 1 at -0.25 - 0.125 * (0.9 * 1 + 1). A library that
 * read the caller's array with its own stride would read group 1 from past
 * the old caller's array.
 */
static const struct zc_segment two_segs[2] = {SEG(0, 40, 0), SEG(40, 60, 1)};
static const struct zc_bucket two_groups_bucket = BUCKET(100, 2, two_segs);

enum abi_kind { ABI_OLD, ABI_NEW };

static int abi_rank(void *arg, int idx)
{
	enum abi_kind kind = (enum abi_kind)idx;
	struct old_group old[2] = {{sizeof(struct old_group), .lr = 0.5},
				   {sizeof(struct old_group), .lr = 0.25, .momentum = 0.9}};
	struct new_group nw[2];
	struct zc_plan p = PLAN(ZC_OPT_SGD, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED, 2, NULL, 1,
				&two_groups_bucket);
	struct zc_config cfg = test_config(&daemon_, arg, 0, 1);
	const char *what = kind == ABI_OLD ? "old" : "new";
	float d = 1.0f, g0 = 0, g1 = 0, buf = 0;
	zc_client *c = NULL;
	const void *hp;
	int r;

	for (int k = 0; k < 2; k++) {
		memset(&nw[k], 0, sizeof(nw[k]));
		zc_param_group_init(&nw[k].g, sizeof(nw[k]));
		nw[k].g.lr = k ? 0.25 : 0.5;
	}
	nw[1].g.momentum = 0.9;
	p.groups = kind == ABI_OLD ? (const struct zc_param_group *)old
				   : (const struct zc_param_group *)nw;
	if ((r = zc_connect(&cfg, &c)) < 0 || (r = zc_alloc_buffers(c, &p)) < 0 ||
	    (r = zc_register_plan(c)) < 0)
		FAIL("%s structs: join: %s %s", what, zc_strerror_name(r), zc_error_message());
	for (int it = 0; it < 2; it++) {
		if (it == 1) {
			old[1].lr = nw[1].g.lr = 0.125;
			hp = kind == ABI_OLD ? (const void *)&old[1] : (const void *)&nw[1];
			if ((r = zc_set_hyper(c, 1, hp)) < 0)
				FAIL("%s structs: set_hyper: %s %s", what, zc_strerror_name(r),
				     zc_error_message());
		}
		if ((r = iterate(c, &p, d)) != 1)
			FAIL("%s structs, iteration %d: %s %s", what, it, zc_strerror_name(r),
			     zc_error_message());
		g0 = g0 - (float)0.5 * d;
		buf = it ? (float)0.9 * buf + 1.0f * d : d;
		g1 = g1 - (float)(it ? 0.125 : 0.25) * buf;
		for (uint64_t i = 0; i < 100; i++) {
			float got = zc_param_buffer(c, 0)[i], want = i < 40 ? g0 : g1;
			if (got != want)
				FAIL("%s structs, iteration %d: [%lu] = %.9g, want %.9g", what, it,
				     (unsigned long)i, got, want);
		}
	}
	if ((r = zc_last_error(c)) != 0)
		FAIL("%s structs: %s %s", what, zc_strerror_name(r), zc_error_message());
	zc_close(c);
	return 0;
}

static void t_older_caller_structs(void)
{
	CHECK(wait_child(spawn(abi_rank, "abi-old", ABI_OLD), 20000) == 0,
	      "an older caller's zc_param_group array (stride 24) was not read as such");
}

static void t_newer_caller_structs(void)
{
	CHECK(wait_child(spawn(abi_rank, "abi-new", ABI_NEW), 20000) == 0,
	      "a newer caller's zc_param_group array (stride 72, zero tail) was not read as such");
}

/* Structs the library must refuse, each with a reason that names it. */
static void t_bad_struct_sizes(void)
{
	struct new_group nw[2];
	struct zc_param_group g[2] = {ZC_PARAM_GROUP_INIT, ZC_PARAM_GROUP_INIT};
	struct zc_plan p =
		PLAN(ZC_OPT_SGD, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED, 2, g, 1, &two_groups_bucket);
	struct {
		struct zc_config cfg;
		uint64_t future;
	} bigcfg;
	struct zc_config cfg = test_config(&daemon_, "abi-bad", 0, 1);
	zc_client *c = NULL;
	int r;

	/* a config from a newer caller: zero past what we know connects... */
	memset(&bigcfg, 0, sizeof(bigcfg));
	bigcfg.cfg = cfg;
	bigcfg.cfg.size = sizeof(bigcfg);
	r = zc_connect(&bigcfg.cfg, &c);
	REQUIRE(r == 0, "a larger config with a zero tail: %s %s", zc_strerror_name(r),
		zc_error_message());
	/* ...something set there is refused */
	bigcfg.future = 1;
	CHECK((r = zc_connect(&bigcfg.cfg, &(zc_client *){NULL})) == -E2BIG &&
		      has(zc_error_message(), "newer zeroclient.h"),
	      "a larger config with a field set: %s %s", zc_strerror_name(r), zc_error_message());
	cfg.size = 0;
	CHECK((r = zc_connect(&cfg, &(zc_client *){NULL})) == -EINVAL &&
		      has(zc_error_message(), "not initialised"),
	      "a config of size 0: %s %s", zc_strerror_name(r), zc_error_message());
	cfg.size = sizeof(cfg);
	cfg.reserved = 1;
	CHECK((r = zc_connect(&cfg, &(zc_client *){NULL})) == -E2BIG,
	      "a config with reserved set: %s", zc_strerror_name(r));

	/* plans: size 0 */
	p.size = 0;
	CHECK((r = zc_alloc_buffers(c, &p)) == -EINVAL && has(zc_error_message(), "plan.size"),
	      "plan.size 0: %s %s", zc_strerror_name(r), zc_error_message());
	p.size = sizeof(p);
	/* one array, two sizes */
	g[1].size = 24;
	CHECK((r = zc_alloc_buffers(c, &p)) == -EINVAL &&
		      has(zc_error_message(), "groups[1].size is 24"),
	      "groups of two sizes: %s %s", zc_strerror_name(r), zc_error_message());
	g[1].size = sizeof(g[1]);
	g[0].reserved = 1;
	CHECK((r = zc_alloc_buffers(c, &p)) == -E2BIG && has(zc_error_message(), "groups[0]"),
	      "reserved set in groups[0]: %s %s", zc_strerror_name(r), zc_error_message());
	g[0].reserved = 0;
	/* a newer caller's group with its new field set */
	for (int k = 0; k < 2; k++) {
		memset(&nw[k], 0, sizeof(nw[k]));
		zc_param_group_init(&nw[k].g, sizeof(nw[k]));
	}
	nw[1].future = 0.5;
	p.groups = &nw[0].g;
	CHECK((r = zc_alloc_buffers(c, &p)) == -E2BIG && has(zc_error_message(), "groups[1]"),
	      "a newer group with its field set: %s %s", zc_strerror_name(r), zc_error_message());
	/* nothing of that stuck: a good plan still goes */
	p.groups = g;
	CHECK((r = zc_alloc_buffers(c, &p)) == 0, "then a good plan: %s %s", zc_strerror_name(r),
	      zc_error_message());
	zc_close(c);
}

/* ------------------------------------------------------------------- errors --- */

/* Another call's reason in this thread, so that a check below sees a new one. */
static void err_reset(void)
{
	(void)zc_plan_init(NULL, 0);
}

/* Every function that takes a handle fails for NULL, with a reason naming
 * it; none crashes (zc_iteration(NULL) used to). */
static void t_null_handles(void)
{
	zc_future *f = NULL;

#define NULL_CASE(call, want, name)                                                                \
	do {                                                                                       \
		err_reset();                                                                       \
		CHECK((call) == (want), #call ": not " #want);                                     \
		CHECK(has(zc_error_message(), name), #call ": reason \"%s\" does not name " name,  \
		      zc_error_message());                                                         \
	} while (0)
	NULL_CASE(zc_alloc_buffers(NULL, &plan1), -EINVAL, "zc_alloc_buffers");
	NULL_CASE(zc_grad_buffer(NULL, 0), NULL, "zc_grad_buffer");
	NULL_CASE(zc_param_buffer(NULL, 0), NULL, "zc_param_buffer");
	NULL_CASE(zc_register_plan(NULL), -EINVAL, "zc_register_plan");
	NULL_CASE(zc_bucket_ready(NULL, 0, &f), -EINVAL, "zc_bucket_ready");
	NULL_CASE(zc_step_future(NULL, 0, &f), -EINVAL, "zc_step_future");
	NULL_CASE(zc_iteration(NULL), ZC_NO_ITERATION, "zc_iteration");
	NULL_CASE(zc_set_hyper(NULL, 0, &sgd), -EINVAL, "zc_set_hyper");
	NULL_CASE(zc_last_error(NULL), -EINVAL, "zc_last_error");
	NULL_CASE(zc_fd(NULL), -EINVAL, "zc_fd");
	NULL_CASE(zc_dispatch(NULL), -EINVAL, "zc_dispatch");
	NULL_CASE(zc_future_poll(NULL), -EINVAL, "zc_future_poll");
	NULL_CASE(zc_future_wait(NULL, 0), -EINVAL, "zc_future_wait");
	NULL_CASE(zc_future_then(NULL, NULL, NULL), -EINVAL, "zc_future_then");
	NULL_CASE(zc_connect(NULL, &(zc_client *){NULL}), -EINVAL, "zc_connect");
#undef NULL_CASE
	CHECK(strcmp(zc_future_message(NULL), "") == 0, "zc_future_message(NULL)");
	zc_future_free(NULL);
	zc_close(NULL);
}

/* Each thread reads the reason of its own latest failed call, and a refused
 * zc_set_hyper() says why. */
static pthread_barrier_t two;

struct thread_err {
	zc_client *c;
	int r;
	char msg[256];
};

static void *step_too_far(void *arg)
{
	struct thread_err *t = arg;
	zc_future *f = NULL;

	t->r = zc_step_future(t->c, 5, &f); /* fails first */
	pthread_barrier_wait(&two);
	pthread_barrier_wait(&two); /* the main thread fails meanwhile */
	snprintf(t->msg, sizeof(t->msg), "%s", zc_error_message());
	return NULL;
}

static void t_errors_per_thread(void)
{
	struct zc_param_group bad = sgd;
	struct thread_err t = {0};
	pthread_t th;
	int r;

	t.c = join("errors", 0, 1, &plan1);
	REQUIRE(t.c, "join");
	REQUIRE(pthread_barrier_init(&two, NULL, 2) == 0, "barrier");
	pthread_create(&th, NULL, step_too_far, &t);
	pthread_barrier_wait(&two);
	bad.lr = -1;
	r = zc_set_hyper(t.c, 0, &bad);
	pthread_barrier_wait(&two);
	pthread_join(th, NULL);
	CHECK(r == ZC_EHYPER && has(zc_error_message(), "lr must be finite and >= 0"),
	      "set_hyper(lr -1): %s, reason \"%s\"", zc_strerror_name(r), zc_error_message());
	CHECK(t.r == ZC_ESTATE && has(t.msg, "iteration 5 has not begun"),
	      "the other thread's reason: %s \"%s\" (another thread's failure overwrote it?)",
	      zc_strerror_name(t.r), t.msg);
	/* a success leaves the reason as it was, as errno */
	CHECK(iterate(t.c, &plan1, 1.0f) == 1, "an iteration");
	CHECK(has(zc_error_message(), "lr must be finite"), "after a success: \"%s\"",
	      zc_error_message());
	zc_close(t.c);
	pthread_barrier_destroy(&two);
}

/*
 * zc_last_error() returns the latest error the daemon reported, each once,
 * with its reason, though calls failed in between. Rank 1 sets other values
 * than rank 0 for iterations 1 and 2; it asks only after iteration 2: the
 * refusal of iteration 2 comes back (not the first), then nothing.
 */
static int latest_pipe[2][2]; /* [rank]: that rank has looked */

static int latest_rank(void *arg, int rank)
{
	zc_client *c = join(arg, (uint32_t)rank, 2, &plan1);
	struct zc_param_group g = sgd;
	int r;

	if (!c)
		return 1;
	for (int it = 0; it < 3; it++) {
		if (it > 0) {
			g.lr = rank ? 0.25 + it : 0.125;
			if (zc_set_hyper(c, 0, &g) < 0)
				FAIL("rank %d: set_hyper: %s", rank, zc_error_message());
		}
		if ((r = iterate(c, &plan1, 1.0f)) != 1)
			FAIL("rank %d iteration %d: %s", rank, it, zc_strerror_name(r));
	}
	/* a call that fails on its own, with its own reason */
	if ((r = zc_bucket_ready(c, 7, NULL)) != ZC_EBUCKET)
		FAIL("rank %d: bucket 7 of 1: %s \"%s\"", rank, zc_strerror_name(r),
		     zc_error_message());
	r = zc_last_error(c);
	if (rank == 0 && r != 0)
		FAIL("rank 0 (whose values apply): %s %s", zc_strerror_name(r), zc_error_message());
	if (rank == 1 && (r != ZC_EHYPER || !has(zc_error_message(), "at iteration 2")))
		FAIL("rank 1: %s \"%s\", want ZC_EHYPER about iteration 2", zc_strerror_name(r),
		     zc_error_message());
	if ((r = zc_last_error(c)) != 0)
		FAIL("rank %d: asked again: %s %s", rank, zc_strerror_name(r), zc_error_message());
	/* either rank leaving ends the job (and the other's bucket 7 would
	 * then get ZC_EJOBFAILED): neither leaves before both looked */
	signal_pipe(latest_pipe[rank][1]);
	if (!wait_pipe(latest_pipe[!rank][0], 10000))
		FAIL("rank %d: rank %d did not finish", rank, !rank);
	zc_close(c);
	return 0;
}

static void t_last_error_is_the_latest(void)
{
	pid_t a, b;

	REQUIRE(pipe(latest_pipe[0]) == 0 && pipe(latest_pipe[1]) == 0, "pipes");
	a = spawn(latest_rank, "latest", 0);
	b = spawn(latest_rank, "latest", 1);

	CHECK(wait_child(a, 20000) == 0, "rank 0 failed");
	CHECK(wait_child(b, 20000) == 0, "rank 1 failed");
}

/* A zmq_setsockopt that fails fails zc_connect, naming the option. */
static void t_setsockopt_checked(void)
{
	static const struct {
		int opt;
		const char *name;
	} opts[] = {{ZMQ_LINGER, "ZMQ_LINGER"},
		    {ZMQ_MAXMSGSIZE, "ZMQ_MAXMSGSIZE"},
		    {ZMQ_SNDHWM, "ZMQ_SNDHWM"},
		    {ZMQ_RCVHWM, "ZMQ_RCVHWM"}};
	struct zc_config cfg = test_config(&daemon_, "sockopt", 0, 1);
	zc_client *c = NULL;
	int r;

	for (size_t k = 0; k < sizeof(opts) / sizeof(opts[0]); k++) {
		fail_option = opts[k].opt;
		r = zc_connect(&cfg, &c);
		CHECK(r == -EINVAL && has(zc_error_message(), opts[k].name),
		      "%s refused: zc_connect %s \"%s\"", opts[k].name, zc_strerror_name(r),
		      zc_error_message());
		if (r == 0)
			zc_close(c);
	}
	fail_option = -1;
	r = zc_connect(&cfg, &c);
	CHECK(r == 0, "then with every option taken: %s", zc_strerror_name(r));
	zc_close(c);
}

/* --------------------------------------------------------------------- fork --- */

/*
 * A trainer forks (a DataLoader worker) after it connected, with a future
 * out. Every call of the child on the parent's client and future fails with
 * ZC_EFORKED and touches nothing: the parent's session goes on as if the
 * child never was. The child may connect a client of its own.
 */
static int forked_child(zc_client *c, zc_future *f, const char *own_job)
{
	struct zc_config cfg = test_config(&daemon_, own_job, 0, 1);
	zc_client *mine = NULL;
	int r;

#define FORKED(call)                                                                               \
	do {                                                                                       \
		if ((r = (call)) != ZC_EFORKED)                                                    \
			FAIL("child: " #call ": %s, want ZC_EFORKED", zc_strerror_name(r));        \
	} while (0)
	/* bucket 1 is the parent's next: a child that handed it over would
	 * break the parent's iteration */
	FORKED(zc_bucket_ready(c, 1, NULL));
	if (!has(zc_error_message(), "fork"))
		FAIL("child: the reason does not say fork: \"%s\"", zc_error_message());
	FORKED(zc_step_future(c, 0, &(zc_future *){NULL}));
	FORKED(zc_set_hyper(c, 0, &sgd));
	FORKED(zc_last_error(c));
	FORKED(zc_dispatch(c));
	FORKED(zc_fd(c));
	FORKED(zc_register_plan(c));
	FORKED(zc_future_poll(f));
	FORKED(zc_future_wait(f, 0));
	FORKED(zc_future_then(f, NULL, NULL));
#undef FORKED
	if (zc_iteration(c) != ZC_NO_ITERATION || zc_grad_buffer(c, 0) != NULL)
		FAIL("child: zc_iteration or zc_grad_buffer answered");
	zc_future_free(f);
	zc_close(c);
#ifdef __SANITIZE_THREAD__
	/* ThreadSanitizer cannot start threads (ZeroMQ's) after a fork of a
	 * threaded process: the child's own client is left to the other runs */
	(void)cfg, (void)mine;
	return 0;
#endif
	if ((r = zc_connect(&cfg, &mine)) < 0 || (r = zc_alloc_buffers(mine, &plan1)) < 0 ||
	    (r = zc_register_plan(mine)) < 0 || (r = iterate(mine, &plan1, 1.0f)) != 1)
		FAIL("child: its own client: %s %s", zc_strerror_name(r), zc_error_message());
	zc_close(mine);
	return 0;
}

static void t_fork_child_refused(void)
{
	zc_client *c = join("forked", 0, 1, &plan4);
	zc_future *f = NULL, *step = NULL;
	int st;
	pid_t pid;

	REQUIRE(c, "join");
	/* bucket 0 handed over: the child must not hand it over again */
	REQUIRE(zc_bucket_ready(c, 0, &f) == 0, "bucket 0");
	fflush(stdout);
	pid = fork();
	if (pid == 0)
		_exit(forked_child(c, f, "forked-child"));
	REQUIRE(pid > 0, "fork");
	st = wait_child(pid, 20000);
	CHECK(st == 0, "the child failed: %d", st);
	/* the parent's session is intact: the rest of the iteration, one more */
	for (uint32_t b = 1; b < 4; b++)
		CHECK(zc_bucket_ready(c, b, NULL) == 0, "parent: bucket %u: %s", b,
		      zc_error_message());
	CHECK(zc_future_wait(f, test_timeout(10000)) == 1, "parent: bucket 0's future");
	CHECK(zc_step_future(c, 0, &step) == 0 && zc_future_wait(step, test_timeout(10000)) == 1,
	      "parent: step 0: %s", zc_error_message());
	zc_future_free(step);
	CHECK(iterate(c, &plan4, 1.0f) == 1, "parent: another iteration: %s", zc_error_message());
	CHECK(zc_iteration(c) == 2, "parent: iteration %lu", (unsigned long)zc_iteration(c));
	CHECK(zc_last_error(c) == 0, "parent: %s", zc_error_message());
	zc_future_free(f);
	zc_close(c);
}

/* ---------------------------------------------------------------- callbacks --- */

/*
 * The callback of bucket b's future hands over bucket b + 1 (and asks the
 * client for its iteration, which takes the client's lock): with a lock
 * held around callbacks, this deadlocks. Each runs once, on the thread that
 * waits for the step, and frees its own future.
 */
struct chain {
	zc_client *c;
	pthread_t waiter;
	struct link {
		struct chain *ch;
		uint32_t b;
		int ran, result;
		bool on_waiter;
	} links[4];
	int errors;
};

static void on_bucket(zc_future *f, int result, void *arg)
{
	struct link *l = arg;
	struct chain *ch = l->ch;
	zc_future *next = NULL;

	l->ran++;
	l->result = result;
	l->on_waiter = pthread_equal(pthread_self(), ch->waiter);
	if (zc_iteration(ch->c) == ZC_NO_ITERATION)
		ch->errors++;
	zc_future_free(f);
	if (l->b + 1 == 4)
		return;
	for (uint64_t i = 0; i < buckets1[l->b + 1].numel; i++)
		zc_grad_buffer(ch->c, l->b + 1)[i] = 1.0f;
	if (zc_bucket_ready(ch->c, l->b + 1, &next) < 0 ||
	    zc_future_then(next, on_bucket, &ch->links[l->b + 1]) < 0)
		ch->errors++;
}

static void t_callback_hands_next_bucket(void)
{
	struct chain ch = {.c = join("chain", 0, 1, &plan4), .waiter = pthread_self()};
	zc_future *f0 = NULL, *step = NULL;
	int r;

	REQUIRE(ch.c, "join");
	for (uint32_t b = 0; b < 4; b++)
		ch.links[b] = (struct link){.ch = &ch, .b = b};
	for (uint64_t i = 0; i < buckets1[0].numel; i++)
		zc_grad_buffer(ch.c, 0)[i] = 1.0f;
	REQUIRE(zc_bucket_ready(ch.c, 0, &f0) == 0, "bucket 0");
	REQUIRE(zc_future_then(f0, on_bucket, &ch.links[0]) == 0, "then");
	REQUIRE(zc_step_future(ch.c, 0, &step) == 0, "step future");
	r = zc_future_wait(step, test_timeout(10000));
	CHECK(r == 1, "the step, with buckets 1..3 handed over by callbacks: %s %s",
	      zc_strerror_name(r), zc_error_message());
	for (uint32_t b = 0; b < 4; b++)
		CHECK(ch.links[b].ran == 1 && ch.links[b].result == 1 && ch.links[b].on_waiter,
		      "bucket %u's callback: ran %d times, result %d, on the waiting thread %d", b,
		      ch.links[b].ran, ch.links[b].result, ch.links[b].on_waiter);
	CHECK(ch.errors == 0, "%d calls failed inside callbacks", ch.errors);
	for (uint32_t b = 0; b < 4; b++)
		CHECK(zc_param_buffer(ch.c, b)[0] == -0.5f, "bucket %u: %g after a step of lr 0.5",
		      b, zc_param_buffer(ch.c, b)[0]);
	zc_future_free(step);
	zc_close(ch.c);
}

/* Exactly once: at once for a settled future, in zc_close() for a pending
 * one, never for a future freed first; one callback per future. */
static int counted[4], counted_result[4];

static void count(zc_future *f, int result, void *arg)
{
	int k = (int)(intptr_t)arg;

	counted[k]++;
	counted_result[k] = result;
	if (k == 2)
		zc_future_free(f); /* from its own callback, inside zc_close() */
}

static void t_callback_exactly_once(void)
{
	zc_client *c = join("once", 0, 1, &plan1);
	zc_future *done = NULL, *pending = NULL, *freed = NULL;
	int r;

	REQUIRE(c, "join");
	REQUIRE(iterate(c, &plan1, 1.0f) == 1, "iteration 0");
	/* settled already: runs inside zc_future_then */
	REQUIRE(zc_step_future(c, 0, &done) == 0, "step 0");
	CHECK(zc_future_then(done, count, (void *)0) == 0 && counted[0] == 1 &&
		      counted_result[0] == 1,
	      "a done future's callback: ran %d times, result %d", counted[0], counted_result[0]);
	r = zc_future_then(done, count, (void *)1);
	CHECK(r == ZC_ESTATE && counted[1] == 0, "a second callback: %s, ran %d",
	      zc_strerror_name(r), counted[1]);
	CHECK(zc_future_then(done, NULL, NULL) == -EINVAL, "a NULL fn");
	/* iteration 1 never gets its bucket: pending until zc_close() */
	REQUIRE(zc_step_future(c, 1, &pending) == 0 && zc_step_future(c, 1, &freed) == 0, "step 1");
	CHECK(zc_future_then(pending, count, (void *)2) == 0, "then(pending)");
	CHECK(zc_future_then(freed, count, (void *)3) == 0, "then(freed)");
	CHECK(zc_future_poll(pending) == 0 && counted[2] == 0, "ran before its future settled");
	zc_future_free(freed); /* cancels its callback */
	zc_close(c);
	CHECK(counted[2] == 1 && counted_result[2] == ZC_ESTATE,
	      "a pending future's callback at zc_close: ran %d times, result %s", counted[2],
	      zc_strerror_name(counted_result[2]));
	CHECK(counted[3] == 0, "a freed future's callback ran %d times", counted[3]);
	CHECK(counted[0] == 1, "the first callback ran again (%d)", counted[0]);
	zc_future_free(done);
}

/*
 * A callback frees its own future while this thread waits on it, and the
 * future fails (rank 1 is killed): the wait returns the failure and its
 * reason without touching the freed future (ASan and valgrind watch).
 */
static int selffree_pipe[2];

static int selffree_rank1(void *arg, int idx)
{
	(void)idx;
	if (!join(arg, 1, 2, &plan1))
		return 1;
	signal_pipe(selffree_pipe[1]);
	for (;;)
		pause();
}

struct selffree {
	int ran, result;
};

static void free_self(zc_future *f, int result, void *arg)
{
	struct selffree *sf = arg;

	sf->ran++;
	sf->result = result;
	zc_future_free(f);
}

static void t_callback_frees_waited_future(void)
{
	struct selffree sf = {0};
	zc_future *f = NULL;
	zc_client *c;
	pid_t p1;
	int r;

	REQUIRE(pipe(selffree_pipe) == 0, "pipe");
	p1 = spawn(selffree_rank1, "selffree", 1);
	c = join("selffree", 0, 2, &plan1);
	REQUIRE(c && wait_pipe(selffree_pipe[0], 10000), "join");
	REQUIRE(zc_step_future(c, 0, &f) == 0, "step future");
	REQUIRE(zc_future_then(f, free_self, &sf) == 0, "then");
	CHECK(zc_bucket_ready(c, 0, NULL) == 0, "bucket 0");
	kill(p1, SIGKILL);
	wait_child(p1, 10000);
	r = zc_future_wait(f, test_timeout(10000)); /* f is freed inside */
	CHECK(r == ZC_ERANKDEAD || r == ZC_EJOBFAILED, "the wait: %s", zc_strerror_name(r));
	CHECK(sf.ran == 1 && sf.result == r, "the callback ran %d times, result %s", sf.ran,
	      zc_strerror_name(sf.result));
	CHECK(zc_error_message()[0] != 0 && strcmp(zc_error_message(), zc_strerror(r)) != 0,
	      "the reason: \"%s\"", zc_error_message());
	test_note("%s: %s", zc_strerror_name(r), zc_error_message());
	zc_close(c);
}

/* ---------------------------------------------------- waiting without a lock --- */

/*
 * zeroclient.h promises that zc_future_wait() does not hold the client's
 * lock while it sleeps. One thread waits for a step that cannot complete yet
 * (buckets 1..3 of 4 are missing); meanwhile this thread calls into the
 * client 21 times, 3 ms apart, and times each call. A waiter that held the
 * lock while it slept (it sleeps in slices of 10 ms) would hold each call up
 * for the rest of its slice, some milliseconds; without, a call takes
 * microseconds. The median is compared, so one preempted call does not
 * count. Then the missing buckets go over and the wait ends with the step.
 */
#define PROBES 21

struct sleeper {
	zc_future *step;
	int r;
	atomic_int done;
};

static void *sleeper(void *arg)
{
	struct sleeper *s = arg;

	s->r = zc_future_wait(s->step, test_timeout(5000));
	atomic_store(&s->done, 1);
	return NULL;
}

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

	return x < y ? -1 : x > y;
}

static int64_t now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void t_wait_does_not_hold_lock(void)
{
	zc_client *c = join("nolock", 0, 1, &plan4);
	struct sleeper s = {0};
	int64_t took[PROBES];
	bool sleeper_done;
	pthread_t th;

	REQUIRE(c, "join");
	REQUIRE(zc_bucket_ready(c, 0, NULL) == 0, "bucket 0");
	REQUIRE(zc_step_future(c, 0, &s.step) == 0, "step future");
	pthread_create(&th, NULL, sleeper, &s);
	usleep((useconds_t)test_timeout(50) * 1000); /* asleep by now */
	for (int k = 0; k < PROBES; k++) {
		int64_t t0;

		usleep(3000);
		t0 = now_us();
		(void)zc_iteration(c);
		took[k] = now_us() - t0;
	}
	sleeper_done = atomic_load(&s.done);
	for (uint32_t b = 1; b < 4; b++)
		CHECK(zc_bucket_ready(c, b, NULL) == 0, "bucket %u", b);
	pthread_join(th, NULL);
	qsort(took, PROBES, sizeof(took[0]), cmp_i64);
	test_note("a call beside a sleeping zc_future_wait: median %ld us, max %ld us",
		  (long)took[PROBES / 2], (long)took[PROBES - 1]);
	CHECK(!sleeper_done, "the waiter returned before the step could complete");
	CHECK(took[PROBES / 2] < 2000,
	      "a call beside a sleeping zc_future_wait took %ld us (median): the waiter holds "
	      "the client's lock while it sleeps",
	      (long)took[PROBES / 2]);
	CHECK(s.r == 1, "the wait ended with %s, not with the step", zc_strerror_name(s.r));
	zc_future_free(s.step);
	zc_close(c);
}

static void t_daemon_stops_cleanly(void)
{
	CHECK(zd_stop(&daemon_, 10000) == 0, "zerod did not exit 0");
}

static const struct test_case cases[] = {
	{"version", t_version},
	{"init_functions", t_init_functions},
	{"older_caller_structs", t_older_caller_structs},
	{"newer_caller_structs", t_newer_caller_structs},
	{"bad_struct_sizes", t_bad_struct_sizes},
	{"null_handles", t_null_handles},
	{"errors_per_thread", t_errors_per_thread},
	{"last_error_is_the_latest", t_last_error_is_the_latest},
	{"setsockopt_checked", t_setsockopt_checked},
	{"fork_child_refused", t_fork_child_refused},
	{"callback_hands_next_bucket", t_callback_hands_next_bucket},
	{"callback_exactly_once", t_callback_exactly_once},
	{"callback_frees_its_waited_future", t_callback_frees_waited_future},
	{"wait_does_not_hold_lock", t_wait_does_not_hold_lock},
	{"daemon_stops_cleanly", t_daemon_stops_cleanly},
};

int main(int argc, char **argv)
{
	/* a dead trainer fails its job here: the recovery suite
	 * (tests/reliability/test_recovery.c) has the default */
	static const char *const extra[] = {"--rejoin-timeout", "0", NULL};

	return zd_test_main(&daemon_, extra, cases, sizeof(cases) / sizeof(cases[0]), argc, argv);
}
