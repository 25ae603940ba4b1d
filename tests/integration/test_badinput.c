/*
 * test_badinput.c — one real zerod (--stall-timeout 1500) fed everything a
 * trainer can get wrong: bytes that are not an Envelope, truncated and
 * multi-frame messages, a wrong protocol version, messages out of state,
 * buffers of the wrong size, buckets out of order / twice / unknown / early,
 * a duplicate rank, a plan that differs between ranks, a trainer killed
 * mid-iteration and one that stalls. Each must get its exact ZC_E... code
 * (naming what was wrong), and none may disturb the background job "bg"
 * that trains through all of it and must end with the reference parameters.
 *
 * The parent never creates a ZeroMQ context: every client (libzeroclient or
 * a raw DEALER socket) lives in a forked child that exits 0 when everything
 * it saw was as expected and prints its reasons as TAP comments otherwise.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "common.h"
#include "harness.h"
#include "raw.h"
#include "plan.h"
#include "testlib.h"
#include "trainer.h"
#include "wire.h"
#include "zctest.h"

/* the daemon's --stall-timeout and --join-timeout: 1500 and 1000 ms, scaled
 * as every wait (set in main()) */
static int stall_ms, join_ms;

static struct zd daemon_;

/* ------------------------------------------------------ child side --- */

static bool contains(const char *hay, const char *needle)
{
	return hay && strstr(hay, needle) != NULL;
}

/* ---- raw DEALER (raw.c): what a broken or hostile client could send ---- */


/* ---- libzeroclient: a small plan of 1..4 buckets, one SGD group ---- */

struct small_plan {
	struct zc_param_group group;
	struct zc_segment segs[4];
	struct zc_bucket buckets[4];
	struct zc_plan plan;
};

static void small_plan(struct small_plan *sp, uint32_t nbuckets, uint64_t bucket1_numel)
{
	uint64_t sizes[4] = {64, 100, 33, 16};

	if (bucket1_numel)
		sizes[1] = bucket1_numel;
	memset(sp, 0, sizeof(*sp));
	sp->group = (struct zc_param_group)ZC_PARAM_GROUP_INIT;
	sp->group.lr = 0.1;
	for (uint32_t b = 0; b < 4; b++) {
		sp->segs[b] = (struct zc_segment)SEG(0, sizes[b], 0);
		sp->buckets[b] = (struct zc_bucket)BUCKET(sizes[b], 1, &sp->segs[b]);
	}
	sp->plan = (struct zc_plan){
		.size = sizeof(struct zc_plan),
		.optimizer = ZC_OPT_SGD,
		.shard_mode = ZC_SHARD_BUCKET,
		.step_mode = ZC_STEP_INTERLEAVED,
		.ngroups = 1,
		.groups = &sp->group,
		.nbuckets = nbuckets,
		.buckets = sp->buckets,
	};
}

static zc_client *connect_rank(const char *job, uint32_t rank, uint32_t world)
{
	struct zc_config cfg = test_config(&daemon_, job, rank, world);
	const char *err = "";
	zc_client *c = NULL;
	int r;

	r = zc_connect(&cfg, &c);
	err = zc_error_message();
	EXPECT(r == 0, "%s rank %u: zc_connect: %s: %s", job, rank, zc_strerror_name(r), err);
	return r == 0 ? c : NULL;
}

/* Connect, allocate, fill gradients and register: a rank ready to send. */
static zc_client *join(const char *job, uint32_t rank, uint32_t world, uint32_t nbuckets)
{
	struct small_plan sp;
	zc_client *c = connect_rank(job, rank, world);
	int r;

	if (!c)
		return NULL;
	small_plan(&sp, nbuckets, 0);
	r = zc_alloc_buffers(c, &sp.plan);
	EXPECT(r == 0, "%s rank %u: zc_alloc_buffers: %s", job, rank, zc_strerror_name(r));
	if (r == 0) {
		for (uint32_t b = 0; b < nbuckets; b++)
			for (uint64_t i = 0; i < sp.buckets[b].numel; i++)
				zc_grad_buffer(c, b)[i] = det_uniform(9, rank, b, i);
		r = zc_register_plan(c);
		EXPECT(r == 0, "%s rank %u: zc_register_plan: %s: %s", job, rank,
		       zc_strerror_name(r), zc_error_message());
	}
	if (r != 0) {
		zc_close(c);
		return NULL;
	}
	return c;
}

/* Wait for f (5 s) and expect `want` (1: done; else a ZC_E... code) with
 * needle in its message. */
static void expect_future(zc_future *f, int want, const char *needle, const char *what)
{
	int st = zc_future_wait(f, test_timeout(5000));

	if (st < 0)
		printf("# %s -> %s: %s\n", what, zc_strerror_name(st), zc_future_message(f));
	EXPECT(st == want, "%s: future gave %s (%d), want %s: \"%s\"", what,
	       st == 1   ? "done"
	       : st == 0 ? "still pending after 5 s"
			 : zc_strerror_name(st),
	       st, want == 1 ? "done" : zc_strerror_name(want), zc_future_message(f));
	if (needle && st == want)
		EXPECT(contains(zc_future_message(f), needle), "%s: message \"%s\" lacks \"%s\"",
		       what, zc_future_message(f), needle);
}

/* Send every bucket of the current iteration; the step of `it` must complete. */
static void finish_iteration(zc_client *c, uint32_t from, uint32_t nbuckets, uint64_t it,
			     const char *what)
{
	zc_future *bf[4] = {0}, *step = NULL;
	int r;

	for (uint32_t b = from; b < nbuckets; b++) {
		r = zc_bucket_ready(c, b, &bf[b]);
		EXPECT(r == 0, "%s: zc_bucket_ready(%u): %s", what, b, zc_strerror_name(r));
	}
	r = zc_step_future(c, it, &step);
	EXPECT(r == 0, "%s: zc_step_future: %s", what, zc_strerror_name(r));
	if (r == 0)
		expect_future(step, 1, NULL, what);
	for (uint32_t b = from; b < nbuckets; b++)
		if (bf[b])
			EXPECT(zc_future_poll(bf[b]) == 1, "%s: bucket %u future: %d", what, b,
			       zc_future_poll(bf[b]));
	zc_future_free(step);
	for (uint32_t b = 0; b < 4; b++)
		zc_future_free(bf[b]);
}

/* ----------------------------------------------------- parent side --- */

/* Fork n children running fn(arg, i) and expect exit status want[i]. */
static void run_children(int (*fn)(void *, int), void *arg, int n, const int *want, int timeout_ms)
{
	pid_t pids[8];

	REQUIRE(zd_alive(&daemon_), "zerod is not running");
	for (int i = 0; i < n; i++) {
		pids[i] = spawn(fn, arg, i);
		REQUIRE(pids[i] > 0, "fork: %s", strerror(errno));
	}
	for (int i = 0; i < n; i++) {
		int st = wait_child(pids[i], timeout_ms);
		int w = want ? want[i] : 0;
		CHECK(st == w, "child %d exited with %d, want %d", i, st, w);
	}
	CHECK(zd_alive(&daemon_), "zerod died");
	if (test_failed_)
		zd_dump_log(&daemon_);
}

/* ------------------------------------------------- background job --- */

/* Started by the first case and checked by the last: shared memory (each
 * case runs in its own process). Its ranks outlive the first case's process
 * and the runner reaps them. */
struct bg {
	struct train_spec spec;
	struct train_stop *stop; /* shared memory too: made in main() */
	pid_t pids[2];
};
static struct bg *bg;

/* Both bg ranks still run (without reaping them). */
static bool bg_running(void)
{
	return proc_alive(bg->pids[0]) && proc_alive(bg->pids[1]);
}

static int bg_main(void *arg, int idx)
{
	return train_rank(arg, (uint32_t)idx);
}

static void t_bg_start(void)
{
	bg->spec = (struct train_spec){
		.socket = daemon_.sock,
		.job = "bg",
		.world = 2,
		.optimizer = ZC_OPT_ADAM,
		.shard_mode = ZC_SHARD_BUCKET,
		.step_mode = ZC_STEP_INTERLEAVED,
		.iters = 1000000,
		.stop = bg->stop,
		.seed = 1234,
		.hyper_iter = -1,
		.sleep_us = 10000,
		.tolerance = 1e-6,
	};
	REQUIRE(zd_alive(&daemon_), "zerod is not running");
	for (int r = 0; r < 2; r++) {
		bg->pids[r] = spawn(bg_main, &bg->spec, r);
		REQUIRE(bg->pids[r] > 0, "fork: %s", strerror(errno));
	}
	/* let it connect and get going before the bad cases start */
	CHECK(zd_wait_job(&daemon_, "bg", ZD_JOB_ACTIVE, 15000) == 0,
	      "job bg did not become active in 15 s");
}

/* ------------------------------------------------------------ cases --- */

/* 1. bytes that are not an Envelope */
static int c_garbage(void *arg, int idx)
{
	static const unsigned char overlong[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
						 0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
	static const unsigned char badlen[] = {0x0a, 0xf0, 0xff, 0xff, 0x7f, 0x08, 0x01};
	struct raw r = {0};

	(void)arg, (void)idx;
	if (raw_open(&r, daemon_.sock, 0) < 0)
		return 1;
	raw_send_bytes(&r, overlong, sizeof(overlong), 0);
	raw_expect_error(&r, ZC_EPROTO, "cannot decode a 12-byte message", "overlong varint");
	raw_send_bytes(&r, badlen, sizeof(badlen), 0);
	raw_expect_error(&r, ZC_EPROTO, "cannot decode", "field longer than the message");
	raw_send_bytes(&r, "", 0, 0);
	raw_expect_error(&r, ZC_EPROTO, "cannot decode a 0-byte message", "empty message");
	raw_close(&r);
	return child_bad;
}

static void t_garbage(void)
{
	run_children(c_garbage, NULL, 1, NULL, 10000);
}

/* 2. the first half of a packed Hello */
static int c_truncated(void *arg, int idx)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__Hello h;
	struct raw r = {0};
	char want[64];
	void *buf;
	size_t len;

	(void)arg, (void)idx;
	if (raw_open(&r, daemon_.sock, 0) < 0)
		return 1;
	raw_fill_hello(&h, "truncated", 0, 1);
	env.body_case = ZEROD__V1__ENVELOPE__BODY_HELLO;
	env.hello = &h;
	if (wire_encode(&env, &buf, &len) < 0)
		return 1;
	raw_send_bytes(&r, buf, len / 2, 0);
	snprintf(want, sizeof(want), "cannot decode a %zu-byte message", len / 2);
	raw_expect_error(&r, ZC_EPROTO, want, "truncated Hello");
	/* the whole message on the same connection is still welcome */
	raw_send_bytes(&r, buf, len, 0);
	raw_expect_body(&r, ZEROD__V1__ENVELOPE__BODY_HELLO_OK,
			"whole Hello after a truncated one");
	raw_goodbye(&r);
	free(buf);
	raw_close(&r);
	return child_bad;
}

static void t_truncated(void)
{
	run_children(c_truncated, NULL, 1, NULL, 10000);
}

/* 3. protocol version 99 */
static int c_version(void *arg, int idx)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__Hello h;
	struct raw r = {0};

	(void)arg, (void)idx;
	if (raw_open(&r, daemon_.sock, 0) < 0)
		return 1;
	raw_fill_hello(&h, "version", 0, 1);
	h.protocol_version = 99;
	env.body_case = ZEROD__V1__ENVELOPE__BODY_HELLO;
	env.hello = &h;
	raw_send(&r, &env);
	raw_expect_error(&r, ZC_EVERSION, "protocol 99", "Hello with protocol_version 99");
	raw_close(&r);
	return child_bad;
}

static void t_version(void)
{
	run_children(c_version, NULL, 1, NULL, 10000);
}

/* A Hello that claims another process's pid (pid 1) is refused, naming the
 * pid the connection really belongs to (SO_PEERCRED): the daemon never
 * watches, nor maps memory for, a process it cannot confirm. */
static int c_liar(void *arg, int idx)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__Hello h;
	struct raw r = {0};
	char want[96];

	(void)arg, (void)idx;
	if (raw_open(&r, daemon_.sock, 0) < 0)
		return 1;
	raw_fill_hello(&h, "liar", 1, 2);
	h.pid = 1;
	env.body_case = ZEROD__V1__ENVELOPE__BODY_HELLO;
	env.hello = &h;
	raw_send(&r, &env);
	snprintf(want, sizeof(want), "Hello says pid 1, the connection belongs to pid %d",
		 (int)getpid());
	raw_expect_error(&r, ZC_EPROTO, want, "Hello claiming pid 1");
	/* the truth is welcome */
	raw_fill_hello(&h, "liar", 0, 1);
	raw_send(&r, &env);
	raw_expect_body(&r, ZEROD__V1__ENVELOPE__BODY_HELLO_OK, "Hello with its own pid");
	raw_goodbye(&r);
	raw_close(&r);
	return child_bad;
}

static void t_liar(void)
{
	run_children(c_liar, NULL, 1, NULL, 10000);
}

/* 4. a message before Hello, a server-only message, a multi-frame message */
static int c_state(void *arg, int idx)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__HelloOk ok = ZEROD__V1__HELLO_OK__INIT;
	Zerod__V1__Hello h;
	struct raw r = {0};
	void *buf;
	size_t len;

	(void)arg, (void)idx;
	if (raw_open(&r, daemon_.sock, 0) < 0)
		return 1;
	raw_bucket(&r, 0, 0);
	raw_expect_error(&r, ZC_EPROTO, "before Hello", "BucketReady before Hello");

	ok.protocol_version = 1;
	ok.daemon_version = "0";
	env.body_case = ZEROD__V1__ENVELOPE__BODY_HELLO_OK;
	env.hello_ok = &ok;
	raw_send(&r, &env);
	raw_expect_error(&r, ZC_EPROTO, "not a message a client sends", "HelloOk from a client");

	/* a valid Hello, but in the first of two frames: refused as a whole */
	raw_fill_hello(&h, "multiframe", 0, 1);
	env.body_case = ZEROD__V1__ENVELOPE__BODY_HELLO;
	env.hello = &h;
	if (wire_encode(&env, &buf, &len) < 0)
		return 1;
	raw_send_bytes(&r, buf, len, ZMQ_SNDMORE);
	raw_send_bytes(&r, "tail", 4, 0);
	raw_expect_error(&r, ZC_EPROTO, "multi-frame", "two-frame Hello");
	/* nothing of it was taken: a single-frame Hello now joins */
	raw_send_bytes(&r, buf, len, 0);
	raw_expect_body(&r, ZEROD__V1__ENVELOPE__BODY_HELLO_OK, "Hello after the multi-frame one");
	raw_goodbye(&r);
	free(buf);
	raw_close(&r);
	return child_bad;
}

static void t_state(void)
{
	run_children(c_state, NULL, 1, NULL, 10000);
}

static int make_shm(const char *name, size_t bytes)
{
	int fd = shm_open(name, O_RDWR | O_CREAT | O_TRUNC, 0600);

	if (fd < 0 || ftruncate(fd, (off_t)bytes) < 0) {
		printf("# shm %s: %s\n", name, strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	close(fd);
	return 0;
}

/* 5. shm buffers of the wrong size, and a grad_bytes that does not match */
static int c_size(void *arg, int idx)
{
	struct raw_reg g;
	struct raw r = {0};
	char small[96], want[160];

	(void)arg, (void)idx;
	if (raw_reg_init(&g, "size") < 0)
		return 1;
	snprintf(small, sizeof(small), "/zerodtest-size-%d-small", (int)getpid());
	if (make_shm(small, g.bytes / 2) < 0 || raw_open(&r, daemon_.sock, 0) < 0)
		return 1;
	raw_hello(&r, "size");

	/* the object is half the size the plan needs (and the claim says) */
	g.shm.grad_name = small;
	raw_send(&r, &g.env);
	snprintf(want, sizeof(want), "holds %lu bytes, the plan needs %lu",
		 (unsigned long)(g.bytes / 2), (unsigned long)g.bytes);
	raw_expect_error(&r, ZC_ESIZE, want, "grad object too small");

	/* the claim differs from the plan */
	g.shm.grad_name = g.grad;
	g.shm.grad_bytes = g.bytes + 4;
	raw_send(&r, &g.env);
	snprintf(want, sizeof(want), "client says %lu bytes, the plan needs %lu",
		 (unsigned long)(g.bytes + 4), (unsigned long)g.bytes);
	raw_expect_error(&r, ZC_ESIZE, want, "grad_bytes mismatch");

	/* the session and the job survived: the right sizes register */
	g.shm.grad_bytes = g.bytes;
	raw_send(&r, &g.env);
	raw_expect_body(&r, ZEROD__V1__ENVELOPE__BODY_PLAN_OK, "RegisterPlan with the right sizes");
	raw_goodbye(&r);

	shm_unlink(small);
	raw_reg_free(&g);
	raw_close(&r);
	return child_bad;
}

/* A trainer that hands over a bucket and drops its connection while its
 * process lives on (so its pidfd never fires). The daemon's socket monitor
 * sees the connection close: the job ends at once, naming the rank, instead
 * of lingering until the stall timeout. */
static int c_vanish(void *arg, int idx)
{
	struct raw_reg g;
	struct raw r = {0};
	char want[96];

	(void)arg, (void)idx;
	if (raw_reg_init(&g, "vanish") < 0 || raw_open(&r, daemon_.sock, 0) < 0)
		return 1;
	raw_hello(&r, "vanish");
	raw_send(&r, &g.env);
	raw_expect_body(&r, ZEROD__V1__ENVELOPE__BODY_PLAN_OK, "RegisterPlan");
	raw_bucket(&r, 0, 0);
	/* Wait for bucket 0's BucketDone, so the daemon has nothing left to send:
	 * dropping the connection earlier would race that send (which would then
	 * fail and name the rank "cannot be sent to" instead). */
	raw_expect_body(&r, ZEROD__V1__ENVELOPE__BODY_BUCKET_DONE, "bucket 0");
	raw_close(&r); /* no Goodbye, and this process stays */
	snprintf(want, sizeof(want), "job vanish: ended (ZC_ERANKDEAD: rank 0 (pid %d) closed",
		 (int)getpid());
	/* ended well before the stall timeout (STALL_MS), and said why */
	EXPECT(zd_wait_job(&daemon_, "vanish", ZD_JOB_GONE, 1000) == 0,
	       "job vanish did not end within 1 s");
	EXPECT(zd_wait_log(&daemon_, want, 1000), "no '%s' in the daemon's log", want);
	raw_reg_free(&g);
	return child_bad;
}

static void t_vanish(void)
{
	run_children(c_vanish, NULL, 1, NULL, 10000);
}

/* A trainer shrinks its gradient buffer after the daemon mapped it: the next
 * reduction faults (SIGBUS). Only that job fails, with ZC_EMAP; the daemon
 * and the job beside it go on. */
static int c_shrink(void *arg, int idx)
{
	struct raw_reg g;
	struct raw r = {0};
	int fd;

	(void)arg, (void)idx;
	if (raw_reg_init(&g, "shrink") < 0 || raw_open(&r, daemon_.sock, 0) < 0)
		return 1;
	fd = shm_open(g.grad, O_RDWR, 0);
	raw_hello(&r, "shrink");
	raw_send(&r, &g.env);
	raw_expect_body(&r, ZEROD__V1__ENVELOPE__BODY_PLAN_OK, "RegisterPlan");
	EXPECT(fd >= 0 && ftruncate(fd, 0) == 0, "ftruncate: %s", strerror(errno));
	raw_bucket(&r, 0, 0);
	raw_expect_error(&r, ZC_EMAP, "shrank", "bucket 0 over a truncated buffer");
	if (fd >= 0)
		close(fd);
	raw_reg_free(&g);
	raw_close(&r);
	return child_bad;
}

static void t_shrink(void)
{
	run_children(c_shrink, NULL, 1, NULL, 10000);
	CHECK(zd_alive(&daemon_), "zerod died of a truncated buffer");
}

/* A RegisterPlan naming shared memory of another user (here: nobody) is
 * refused: the daemon never maps memory that is not the trainer's own. */
static int c_foreign(void *arg, int idx)
{
	struct raw_reg g;
	struct raw r = {0};
	int fd;

	(void)arg, (void)idx;
	if (raw_reg_init(&g, "foreign") < 0 || raw_open(&r, daemon_.sock, 0) < 0)
		return 1;
	fd = shm_open(g.grad, O_RDWR, 0);
	EXPECT(fd >= 0 && fchown(fd, 65534, 65534) == 0, "chown to nobody: %s", strerror(errno));
	if (fd >= 0)
		close(fd);
	raw_hello(&r, "foreign");
	raw_send(&r, &g.env);
	raw_expect_error(&r, ZC_EMAP, "belongs to uid 65534", "another user's shared memory");
	raw_goodbye(&r);
	raw_reg_free(&g);
	raw_close(&r);
	return child_bad;
}

static void t_foreign(void)
{
	if (geteuid() != 0)
		SKIP("needs root to hand a shared memory object to another user");
	run_children(c_foreign, NULL, 1, NULL, 10000);
}

/* A rank that connects and never registers holds a job slot only until the
 * join timeout (1000 ms here): then the job fails with ZC_ETIMEDOUT, naming
 * the rank that never came. */
static int c_idle(void *arg, int idx)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__Hello h;
	struct raw r = {0};
	int64_t t0;

	(void)arg, (void)idx;
	if (raw_open(&r, daemon_.sock, 0) < 0)
		return 1;
	raw_fill_hello(&h, "idle", 0, 2);
	env.body_case = ZEROD__V1__ENVELOPE__BODY_HELLO;
	env.hello = &h;
	raw_send(&r, &env);
	raw_expect_body(&r, ZEROD__V1__ENVELOPE__BODY_HELLO_OK, "Hello");
	t0 = test_ms();
	raw_expect_error(&r, ZC_ETIMEDOUT, "rank 1 (not connected)", "an idle job");
	EXPECT(test_ms() - t0 >= join_ms * 8 / 10,
	       "the idle job failed after %ld ms, before the timeout (%d ms)",
	       (long)(test_ms() - t0), join_ms);
	raw_close(&r);
	return child_bad;
}

static void t_idle(void)
{
	run_children(c_idle, NULL, 1, NULL, 10000);
}

static void t_size(void)
{
	run_children(c_size, NULL, 1, NULL, 10000);
}

/* zc_bucket_ready() refused with `want` and a message holding needle; no
 * future was handed out and the client's iteration did not move. */
static void expect_refused(zc_client *c, uint32_t bucket, int want, const char *needle)
{
	zc_future *f = NULL;
	uint64_t it = zc_iteration(c);
	int r = zc_bucket_ready(c, bucket, &f);

	printf("# zc_bucket_ready(%u) -> %s: %s\n", bucket, zc_strerror_name(r),
	       zc_error_message());
	EXPECT(r == want, "zc_bucket_ready(%u): %s, want %s", bucket, zc_strerror_name(r),
	       zc_strerror_name(want));
	EXPECT(contains(zc_error_message(), needle), "message \"%s\" lacks \"%s\"",
	       zc_error_message(), needle);
	EXPECT(f == NULL, "a refused bucket handed out a future");
	EXPECT(zc_iteration(c) == it, "a refused bucket moved the client from iteration %lu to %lu",
	       (unsigned long)it, (unsigned long)zc_iteration(c));
	zc_future_free(f);
}

/* 6. bucket 1 before bucket 0, and the last bucket first: refused by the
 * client (which keeps the daemon's rules), and the iteration goes through. */
static int c_order(void *arg, int idx)
{
	zc_client *c = join("order", 0, 1, 3);
	zc_future *f = NULL;
	int r;

	(void)arg, (void)idx;
	if (!c)
		return 1;
	expect_refused(c, 1, ZC_EORDER, "bucket 0 comes first");
	expect_refused(c, 2, ZC_EORDER, "bucket 0 comes first");
	r = zc_step_future(c, 5, &f);
	EXPECT(r == ZC_ESTATE && f == NULL, "a step future of iteration 5 at 0: %s",
	       zc_strerror_name(r));
	finish_iteration(c, 0, 3, 0, "iteration 0 after EORDER");
	finish_iteration(c, 0, 3, 1, "iteration 1");
	zc_close(c);
	return child_bad;
}

static void t_order(void)
{
	run_children(c_order, NULL, 1, NULL, 15000);
}

/* 6b. the daemon keeps the same rules for whoever speaks the protocol
 * without libzeroclient: every bad BucketReady gets its named error, and
 * the iteration then completes. */
static int c_order_raw(void *arg, int idx)
{
	struct raw_reg g;
	struct raw r = {0};
	int answered = 0;

	(void)arg, (void)idx;
	if (raw_reg_init(&g, "order-raw") < 0 || raw_open(&r, daemon_.sock, 0) < 0)
		return 1;
	raw_hello(&r, "order-raw");
	raw_send(&r, &g.env);
	raw_expect_body(&r, ZEROD__V1__ENVELOPE__BODY_PLAN_OK, "RegisterPlan");
	raw_bucket(&r, 0, 1);
	raw_expect_error(&r, ZC_EORDER, "bucket 0 comes first", "raw bucket 1 first");
	raw_bucket(&r, 0, 0);
	raw_expect_body(&r, ZEROD__V1__ENVELOPE__BODY_BUCKET_DONE, "raw bucket 0");
	raw_bucket(&r, 0, 0);
	raw_expect_error(&r, ZC_EDUPBUCKET, "twice", "raw bucket 0 again");
	raw_bucket(&r, 0, 7);
	raw_expect_error(&r, ZC_EBUCKET, "bucket 7 does not exist", "raw bucket 7");
	raw_bucket(&r, 3, 0);
	raw_expect_error(&r, ZC_EEARLY, "still in flight", "raw bucket 0 of iteration 3");
	raw_bucket(&r, 0, 1);
	raw_expect_body(&r, ZEROD__V1__ENVELOPE__BODY_BUCKET_DONE, "raw bucket 1");
	raw_expect_body(&r, ZEROD__V1__ENVELOPE__BODY_STEP_DONE, "raw step 0");
	raw_bucket(&r, 0, 0);
	raw_expect_error(&r, ZC_EDUPBUCKET, "already complete", "raw bucket of iteration 0 again");
	/* a flood of bad buckets: every one is answered, the log keeps a few */
	for (int i = 0; i < 100; i++)
		raw_bucket(&r, 1, 9);
	for (int i = 0; i < 100; i++) {
		Zerod__V1__Envelope *env = raw_recv(&r, "a flood of bad buckets");
		if (!env)
			break;
		answered += env->body_case == ZEROD__V1__ENVELOPE__BODY_ERROR &&
			    -(int)env->error->code == ZC_EBUCKET;
		wire_free(env);
	}
	EXPECT(answered == 100, "%d of 100 bad buckets answered with ZC_EBUCKET", answered);
	raw_goodbye(&r);
	EXPECT(zd_wait_log(&daemon_, "were not logged", 3000),
	       "the log does not say errors were left out");
	raw_reg_free(&g);
	raw_close(&r);
	return child_bad;
}

static void t_order_raw(void)
{
	run_children(c_order_raw, NULL, 1, NULL, 15000);
}

/* 7. the same bucket twice, and bucket 7 of a 3-bucket plan */
static int c_dupbucket(void *arg, int idx)
{
	zc_client *c = join("dupbucket", 0, 1, 3);
	zc_future *f0 = NULL;

	(void)arg, (void)idx;
	if (!c)
		return 1;
	EXPECT(zc_bucket_ready(c, 0, &f0) == 0, "zc_bucket_ready(0)");
	expect_future(f0, 1, NULL, "bucket 0 (world 1: reduced at once)");
	expect_refused(c, 0, ZC_EDUPBUCKET, "bucket 0 twice");
	expect_refused(c, 7, ZC_EBUCKET, "bucket 7 does not exist");
	zc_future_free(f0);
	finish_iteration(c, 1, 3, 0, "iteration 0 after EDUPBUCKET/EBUCKET");
	zc_close(c);
	return child_bad;
}

static void t_dupbucket(void)
{
	run_children(c_dupbucket, NULL, 1, NULL, 15000);
}

/* 8. bucket 0 of iteration 1 before iteration 0 completed */
static int early_pipe[2];

static int c_early(void *arg, int idx)
{
	zc_client *c = join("early", (uint32_t)idx, 2, 3);
	zc_future *bf[3] = {0}, *step = NULL;

	(void)arg;
	if (!c) {
		if (idx == 0)
			signal_pipe(early_pipe[1]);
		return 1;
	}
	if (idx == 1) {
		EXPECT(wait_pipe(early_pipe[0], 10000), "rank 0 never got to its early bucket");
		finish_iteration(c, 0, 3, 0, "rank 1 iteration 0");
		zc_close(c);
		return child_bad;
	}
	for (uint32_t b = 0; b < 3; b++)
		EXPECT(zc_bucket_ready(c, b, &bf[b]) == 0, "zc_bucket_ready(%u)", b);
	EXPECT(zc_step_future(c, 0, &step) == 0, "zc_step_future");
	EXPECT(zc_iteration(c) == 1, "client at iteration %lu", (unsigned long)zc_iteration(c));
	expect_refused(c, 0, ZC_EEARLY, "still in flight");
	EXPECT(zc_future_poll(step) == 0, "step 0 settled (%d) before rank 1 sent anything",
	       zc_future_poll(step));
	signal_pipe(early_pipe[1]);
	expect_future(step, 1, NULL, "rank 0 step 0");
	for (uint32_t b = 0; b < 3; b++) {
		EXPECT(zc_future_poll(bf[b]) == 1, "bucket %u future %d", b, zc_future_poll(bf[b]));
		zc_future_free(bf[b]);
	}
	zc_future_free(step);
	zc_close(c);
	return child_bad;
}

static void t_early(void)
{
	REQUIRE(pipe(early_pipe) == 0, "pipe");
	run_children(c_early, NULL, 2, NULL, 20000);
	close(early_pipe[0]);
	close(early_pipe[1]);
}

/* 9. two clients as rank 0 of one job */
static int c_duprank(void *arg, int idx)
{
	struct zc_config cfg = test_config(&daemon_, "duprank", 0, 2);
	const char *err = "";
	zc_client *c1 = connect_rank("duprank", 0, 2), *c2 = NULL;
	int r;

	(void)arg, (void)idx;
	if (!c1)
		return 1;
	r = zc_connect(&cfg, &c2);
	err = zc_error_message();
	printf("# second rank 0 -> %s: %s\n", zc_strerror_name(r), err);
	EXPECT(r == ZC_EDUPRANK, "second rank 0: %s (%d): %s", zc_strerror_name(r), r, err);
	EXPECT(contains(err, "rank 0 is already connected"), "message \"%s\"", err);
	if (r == 0)
		zc_close(c2);
	zc_close(c1);
	return child_bad;
}

static void t_duprank(void)
{
	run_children(c_duprank, NULL, 1, NULL, 15000);
}

/* 10. rank 1's bucket 1 has another numel than rank 0's */
static int c_planmm(void *arg, int idx)
{
	struct small_plan sp;
	zc_client *c = connect_rank("planmm", (uint32_t)idx, 2);
	int r;

	(void)arg;
	if (!c)
		return 1;
	small_plan(&sp, 3, idx == 1 ? 101 : 0);
	r = zc_alloc_buffers(c, &sp.plan);
	EXPECT(r == 0, "zc_alloc_buffers: %s", zc_strerror_name(r));
	if (idx == 1) {
		/* register after rank 0, so that it is rank 1's plan that differs */
		EXPECT(zd_wait_registered(&daemon_, "planmm", 0, 5000) == 0,
		       "rank 0 did not register within 5 s");
		r = zc_register_plan(c);
		printf("# rank 1 register -> %s: %s\n", zc_strerror_name(r), zc_error_message());
		EXPECT(r == ZC_EPLANMISMATCH, "zc_register_plan: %s (%d): %s", zc_strerror_name(r),
		       r, zc_error_message());
		EXPECT(contains(zc_error_message(), "buckets[1].numel"), "message \"%s\"",
		       zc_error_message());
		EXPECT(contains(zc_error_message(), "rank 1"), "message \"%s\"",
		       zc_error_message());
	} else {
		/* waits for rank 1: the mismatch fails the job for it too */
		r = zc_register_plan(c);
		printf("# rank 0 register -> %s: %s\n", zc_strerror_name(r), zc_error_message());
		EXPECT(r == ZC_EPLANMISMATCH, "rank 0 zc_register_plan: %s (%d): %s",
		       zc_strerror_name(r), r, zc_error_message());
		EXPECT(contains(zc_error_message(), "rank 1") &&
			       contains(zc_error_message(), "buckets[1].numel"),
		       "message \"%s\"", zc_error_message());
	}
	zc_close(c);
	return child_bad;
}

static void t_planmm(void)
{
	run_children(c_planmm, NULL, 2, NULL, 20000);
}

/* 11. rank 2 of 3 sends bucket 0 and is SIGKILLed */
static int killed_pipe[2];

static int c_killed(void *arg, int idx)
{
	zc_client *c = join("killed", (uint32_t)idx, 3, 3);
	zc_future *step = NULL, *f = NULL;

	(void)arg;
	if (!c)
		return 1;
	if (idx == 2) {
		int st;
		EXPECT(wait_pipe(killed_pipe[0], 10000) && wait_pipe(killed_pipe[0], 10000),
		       "ranks 0 and 1 never sent their buckets");
		EXPECT(zc_bucket_ready(c, 0, &f) == 0, "zc_bucket_ready(0)");
		/* bucket 0 is complete with it: its arrival is confirmed */
		st = zc_future_wait(f, test_timeout(5000));
		EXPECT(st == 1, "rank 2 bucket 0: %d %s", st, zc_future_message(f));
		if (child_bad)
			return 1;
		raise(SIGKILL);
		return 2;
	}
	for (uint32_t b = 0; b < 3; b++)
		EXPECT(zc_bucket_ready(c, b, NULL) == 0, "zc_bucket_ready(%u)", b);
	EXPECT(zc_step_future(c, 0, &step) == 0, "zc_step_future");
	{
		int64_t t0 = test_ms(), el;
		signal_pipe(killed_pipe[1]);
		expect_future(step, ZC_ERANKDEAD, "rank 2", "step 0 with rank 2 killed");
		el = test_ms() - t0;
		printf("# rank %d: step failed %ld ms after its buckets\n", idx, (long)el);
		EXPECT(el < stall_ms, "the death was noticed after %ld ms (stall timeout %d)",
		       (long)el, stall_ms);
	}
	zc_future_free(step);
	zc_close(c);
	return child_bad;
}

static void t_killed(void)
{
	static const int want[3] = {0, 0, 128 + SIGKILL};

	REQUIRE(pipe(killed_pipe) == 0, "pipe");
	run_children(c_killed, NULL, 3, want, 20000);
	close(killed_pipe[0]);
	close(killed_pipe[1]);
}

/* A trainer killed after allocating its buffers and before registering
 * them. libzeroclient's buffers are memfds: nothing of them is in /dev/shm.
 * An older client named its buffers there (the protocol's ShmBuffers, which
 * zerod still maps); each rank here also makes two such names, as that
 * client did. The daemon never mapped them, and removes them once the
 * process is gone. The job ends with it, so the names of rank 1 (alive,
 * never registered) go too: its job can no longer use them, and a launcher
 * that kills it next would leak them. Its own mappings stay valid and
 * zc_close() still works. Only such names go: a look-alike object beside
 * them stays. */
static int orphan_pipe[2], orphan_go[2];

static int c_orphan(void *arg, int idx)
{
	struct small_plan sp;
	zc_client *c = connect_rank("orphanshm", (uint32_t)idx, 2);
	char name[128];
	int r, n;

	(void)arg;
	if (!c)
		return 1;
	small_plan(&sp, 2, 0);
	r = zc_alloc_buffers(c, &sp.plan);
	EXPECT(r == 0, "zc_alloc_buffers: %s", zc_strerror_name(r));
	n = shm_name_prefix(name, sizeof(name), "orphanshm", (uint32_t)idx, (int)getpid());
	snprintf(name + n, sizeof(name) - (size_t)n, "%08x.grad", 0x1234abcdu);
	EXPECT(raw_make_shm(name, 64) == 0, "%s", name);
	snprintf(name + n, sizeof(name) - (size_t)n, "%08x.param", 0x1234abcdu);
	EXPECT(raw_make_shm(name, 64) == 0, "%s", name);
	signal_pipe(orphan_pipe[1]);
	if (idx == 0)
		for (;;)
			pause(); /* until SIGKILL */
	wait_pipe(orphan_go[0], 10000);
	if (r == 0) {
		zc_param_buffer(c, 0)[0] = 1.5f; /* the mapping outlives the name */
		EXPECT(zc_param_buffer(c, 0)[0] == 1.5f, "rank 1's buffer");
	}
	zc_close(c);
	return child_bad;
}

static void t_orphan_shm(void)
{
	char prefix[2][64], decoy[96];
	pid_t pids[2];
	int left = -1;

	REQUIRE(pipe(orphan_pipe) == 0 && pipe(orphan_go) == 0, "pipe");
	/* zerod logs at most LOG_CAUSE_PER_SECOND lines a second that one
	 * uid's clients cause, after a burst the cases before may have used
	 * up; this case looks for such a line, so the budget refills first */
	usleep(1500 * 1000);
	for (int i = 0; i < 2; i++) {
		pids[i] = spawn(c_orphan, NULL, i);
		snprintf(prefix[i], sizeof(prefix[i]), "zerod.orphanshm.r%d.%d.", i, (int)pids[i]);
	}
	CHECK(wait_pipe(orphan_pipe[0], 10000) && wait_pipe(orphan_pipe[0], 10000),
	      "the ranks did not allocate their buffers");
	CHECK(shm_count(prefix[0], true) == 2 && shm_count(prefix[1], true) == 2,
	      "each rank should have its 2 old-style names (and no more) in /dev/shm before "
	      "rank 0 dies");
	/* the prefix of rank 0, but not a name libzeroclient makes */
	snprintf(decoy, sizeof(decoy), "/%sdecoy.grad", prefix[0]);
	CHECK(make_shm(decoy, 64) == 0, "decoy %s", decoy);
	kill(pids[0], SIGKILL);
	CHECK(wait_child(pids[0], 10000) == 128 + SIGKILL, "rank 0 did not die of SIGKILL");
	/* the decoy stays: it is not a name libzeroclient makes */
	for (int64_t end = test_ms() + test_timeout(3000);
	     (left = shm_count(prefix[0], false) - 1) != 0 && test_ms() < end;)
		usleep(10000);
	CHECK(left == 0, "%d buffers of the killed rank 0 left in /dev/shm after 3 s", left);
	CHECK(zd_wait_log(&daemon_, "left by its exited trainer", 2000), "the daemon did not log it");
	for (int i = 0; i < 300 && (left = shm_count(prefix[1], false)) != 0; i++)
		usleep(10000);
	CHECK(left == 0, "%d buffers of rank 1, whose job ended, left in /dev/shm", left);
	CHECK(shm_count(prefix[0], true) == 1, "the look-alike object was removed");
	shm_unlink(decoy);
	signal_pipe(orphan_go[1]);
	CHECK(wait_child(pids[1], 10000) == 0, "rank 1 failed");
	for (int i = 0; i < 2; i++)
		close(orphan_pipe[i]), close(orphan_go[i]);
}

/* 12. rank 1 of 2 is alive but never sends */
static int c_stalled(void *arg, int idx)
{
	zc_client *c = join("stalled", (uint32_t)idx, 2, 3);
	zc_future *step = NULL;
	int64_t t0, el;

	(void)arg;
	if (!c)
		return 1;
	if (idx == 0)
		for (uint32_t b = 0; b < 3; b++)
			EXPECT(zc_bucket_ready(c, b, NULL) == 0, "zc_bucket_ready(%u)", b);
	EXPECT(zc_step_future(c, 0, &step) == 0, "zc_step_future");
	t0 = test_ms();
	expect_future(step, ZC_ETIMEDOUT, "rank 1", idx ? "rank 1 step 0" : "rank 0 step 0");
	el = test_ms() - t0;
	printf("# rank %d: step failed after %ld ms\n", idx, (long)el);
	zc_future_free(step);
	zc_close(c);
	return child_bad;
}

static void t_stalled(void)
{
	run_children(c_stalled, NULL, 2, NULL, 20000);
}

/* 13. a fresh job after all that, the background job, and a clean stop */
static void t_fresh_job(void)
{
	static struct train_spec s;
	static const int want[2] = {0, 0};

	s = (struct train_spec){
		.socket = daemon_.sock,
		.job = "fresh",
		.world = 2,
		.optimizer = ZC_OPT_SGD,
		.shard_mode = ZC_SHARD_SLICE,
		.step_mode = ZC_STEP_AT_END,
		.iters = 20,
		.seed = 99,
		.hyper_iter = 5,
		.tolerance = 0,
	};
	run_children(bg_main, &s, 2, want, 30000);
}

static void t_bg_job(void)
{
	REQUIRE(bg->pids[0] > 0, "bg_job_starts did not run");
	CHECK(bg_running(), "job bg ended before the bad cases did");
	atomic_store(&bg->spec.stop->requested, 1);
	for (int r = 0; r < 2; r++) {
		int st = wait_child(bg->pids[r], 30000);
		CHECK(st == 0, "bg rank %d exited with %d", r, st);
	}
	CHECK(atomic_load(&bg->spec.stop->stop_at) > 5, "job bg ran %d iterations",
	      atomic_load(&bg->spec.stop->stop_at));
	if (test_failed_)
		zd_dump_log(&daemon_);
}

static void t_daemon_stops_cleanly(void)
{
	int st = zd_stop(&daemon_, 10000);
	CHECK(st == 0, "zerod exited with %d after SIGTERM", st);
}

static const struct test_case cases[] = {
	{"bg_job_starts", t_bg_start},
	{"garbage_bytes_EPROTO", t_garbage},
	{"truncated_hello_EPROTO", t_truncated},
	{"version_mismatch_EVERSION", t_version},
	{"hello_lies_about_pid", t_liar},
	{"before_hello_and_multiframe_EPROTO", t_state},
	{"wrong_buffer_sizes_ESIZE", t_size},
	{"buffer_shrunk_after_mapping_EMAP", t_shrink},
	{"connection_dropped_ends_job_ERANKDEAD", t_vanish},
	{"another_users_buffer_EMAP", t_foreign},
	{"idle_job_join_timeout_ETIMEDOUT", t_idle},
	{"bucket_out_of_order_EORDER", t_order},
	{"bucket_rules_kept_by_the_daemon_too", t_order_raw},
	{"duplicate_and_unknown_bucket", t_dupbucket},
	{"early_bucket_EEARLY", t_early},
	{"duplicate_rank_EDUPRANK", t_duprank},
	{"plan_mismatch_EPLANMISMATCH", t_planmm},
	{"trainer_killed_ERANKDEAD", t_killed},
	{"trainer_killed_before_registering_leaks_no_shm", t_orphan_shm},
	{"trainer_stalled_ETIMEDOUT", t_stalled},
	{"fresh_job_trains", t_fresh_job, 70000},
	{"bg_job_survived", t_bg_job, 70000},
	{"daemon_stops_cleanly", t_daemon_stops_cleanly},
};

int main(int argc, char **argv)
{
	char stall[16], join[16];
	/* a dead trainer fails its job here (--rejoin-timeout 0): the recovery
	 * suite (tests/reliability/test_recovery.c) has the default */
	const char *const extra[] = {
		"--stall-timeout", stall, "--join-timeout", join, "--rejoin-timeout", "0", NULL};

	stall_ms = test_timeout(1500);
	join_ms = test_timeout(1000);
	snprintf(stall, sizeof(stall), "%d", stall_ms);
	snprintf(join, sizeof(join), "%d", join_ms);
	bg = test_shared(sizeof(*bg));
	bg->stop = train_stop_new();
	return zd_test_main(&daemon_, extra, cases, sizeof(cases) / sizeof(cases[0]), argc, argv);
}
