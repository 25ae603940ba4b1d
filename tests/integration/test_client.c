/*
 * test_client.c — libzeroclient's future interface against a real zerod:
 * polling, waiting with a timeout that expires, the file descriptor for a
 * caller's own event loop, futures asked for after the fact, a bucket_ready
 * from a second thread while the first waits, and calls in the wrong state;
 * a socket path that is missing, a directory, a file, left by a zerod that
 * exited, or served by something else fails zc_connect() at once, naming
 * it; a rank that never connects is named in the others' error.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "testlib.h"
#include "zctest.h"

static struct zd daemon_;

static const struct zc_param_group group = {GROUP_SIZE, .lr = 0.1, .momentum = 0.9};
static const struct zc_segment segs[2][1] = {{SEG(0, 64, 0)}, {SEG(0, 100, 0)}};
static const struct zc_bucket buckets[2] = {BUCKET(64, 1, segs[0]), BUCKET(100, 1, segs[1])};
static const struct zc_plan plan =
	PLAN(ZC_OPT_SGD, ZC_SHARD_SLICE, ZC_STEP_AT_END, 1, &group, 2, buckets);

#define FAIL(...)                                                                                  \
	do {                                                                                       \
		printf("# " __VA_ARGS__);                                                          \
		printf("\n");                                                                      \
		return 1;                                                                          \
	} while (0)

static zc_client *join(const char *job, uint32_t rank, uint32_t world)
{
	struct zc_config cfg = test_config(&daemon_, job, rank, world);
	zc_client *c = NULL;
	int r = zc_connect(&cfg, &c);

	if (r < 0) {
		printf("# %s rank %u: connect: %s\n", job, rank, zc_strerror_name(r));
		return NULL;
	}
	r = zc_alloc_buffers(c, &plan);
	if (r >= 0)
		r = zc_register_plan(c);
	if (r < 0) {
		printf("# %s rank %u: register: %s %s\n", job, rank, zc_strerror_name(r),
		       zc_error_message());
		zc_close(c);
		return NULL;
	}
	return c;
}

/* rank 0 of "fd": everything through zc_fd + poll + zc_dispatch. */
static int fd_rank(void *arg, int rank)
{
	zc_client *c = join(arg, (uint32_t)rank, 2);
	zc_future *b0 = NULL, *b1 = NULL, *step = NULL;
	int rounds = 0;

	if (!c)
		return 1;
	if (zc_bucket_ready(c, 0, &b0) < 0 || zc_bucket_ready(c, 1, &b1) < 0 ||
	    zc_step_future(c, 0, &step) < 0)
		FAIL("rank %d: submit failed", rank);
	/* Only the fd moves this loop on: it must become readable whenever
	 * messages wait, or poll() times out and the test fails. */
	while (zc_future_poll(step) == 0) {
		struct pollfd p = {.fd = zc_fd(c), .events = POLLIN};
		if (poll(&p, 1, test_timeout(10000)) != 1)
			FAIL("rank %d: zc_fd not readable within 10 s while the step is pending",
			     rank);
		if (zc_dispatch(c) < 0)
			FAIL("zc_dispatch failed");
		if (++rounds > 100000)
			FAIL("rank %d: zc_fd stays readable with nothing to dispatch", rank);
	}
	if (zc_future_poll(step) != 1)
		FAIL("rank %d: step future %d through the fd loop", rank, zc_future_poll(step));
	if (zc_future_poll(b0) != 1 || zc_future_poll(b1) != 1)
		FAIL("rank %d: bucket futures not done when the step is", rank);
	zc_future_free(step);
	/* a future for an iteration that is already done, is done */
	if (zc_step_future(c, 0, &step) < 0 || zc_future_poll(step) != 1)
		FAIL("rank %d: late step future not done", rank);
	zc_future_free(step);
	zc_future_free(b0);
	zc_future_free(b1);
	if (zc_iteration(c) != 1)
		FAIL("iteration %lu after one step", (unsigned long)zc_iteration(c));
	zc_close(c);
	return 0;
}

static void t_fd_event_loop(void)
{
	pid_t a = spawn(fd_rank, "fd", 0), b = spawn(fd_rank, "fd", 1);
	CHECK(wait_child(a, 20000) == 0, "rank 0 failed");
	CHECK(wait_child(b, 20000) == 0, "rank 1 failed");
}

/* Rank 0 waits with a short timeout while rank 1 is late: 0, then done. A
 * second thread hands over bucket 1 while the main thread waits. */
struct late {
	zc_client *c;
	int r;
};

static void *second_thread(void *arg)
{
	struct late *l = arg;
	usleep(50000);
	l->r = zc_bucket_ready(l->c, 1, NULL);
	return NULL;
}

static int late_pipe[2];

static int timeout_rank(void *arg, int rank)
{
	zc_client *c = join(arg, (uint32_t)rank, 2);
	zc_future *step = NULL;
	int64_t t0;
	int r;

	if (!c)
		return 1;
	if (rank == 1) {
		/* late: until rank 0's short wait is over, however slow the machine */
		if (!wait_pipe(late_pipe[0], 15000))
			FAIL("rank 0 never finished its short wait");
		zc_bucket_ready(c, 0, NULL);
		zc_bucket_ready(c, 1, NULL);
	} else {
		struct late l = {.c = c};
		pthread_t th;

		zc_bucket_ready(c, 0, NULL);
		pthread_create(&th, NULL, second_thread, &l);
		if (zc_step_future(c, 0, &step) < 0)
			FAIL("step future");
		t0 = test_ms();
		r = zc_future_wait(step, 200);
		signal_pipe(late_pipe[1]);
		if (r != 0)
			FAIL("wait(200) with rank 1 late returned %d, expected 0 (pending)", r);
		if (test_ms() - t0 < 150 || test_ms() - t0 > test_timeout(5000))
			FAIL("wait(200) took %ld ms", (long)(test_ms() - t0));
		pthread_join(th, NULL);
		if (l.r < 0)
			FAIL("bucket_ready from a second thread: %s", zc_strerror_name(l.r));
		r = zc_future_wait(step, test_timeout(10000));
		if (r != 1)
			FAIL("step after rank 1 caught up: %d (%s)", r, zc_future_message(step));
		zc_future_free(step);
	}
	/* let the other rank finish its iteration before leaving */
	if (zc_step_future(c, 0, &step) == 0) {
		zc_future_wait(step, test_timeout(10000));
		zc_future_free(step);
	}
	zc_close(c);
	return 0;
}

static void t_wait_timeout_and_threads(void)
{
	pid_t a, b;

	REQUIRE(pipe(late_pipe) == 0, "pipe");
	a = spawn(timeout_rank, "timeout", 0);
	b = spawn(timeout_rank, "timeout", 1);
	CHECK(wait_child(a, 20000) == 0, "rank 0 failed");
	CHECK(wait_child(b, 20000) == 0, "rank 1 failed");
}

static int state_checks(void *arg, int idx)
{
	struct zc_config cfg = test_config(&daemon_, "state", 0, 1);
	zc_client *c = NULL;
	zc_future *f = NULL;
	int r;

	(void)arg, (void)idx;
	if ((r = zc_connect(&cfg, &c)) < 0)
		FAIL("connect: %s", zc_strerror_name(r));
	if ((r = zc_bucket_ready(c, 0, &f)) != ZC_ESTATE)
		FAIL("bucket_ready before the plan: %d, expected ZC_ESTATE", r);
	if ((r = zc_register_plan(c)) != ZC_ESTATE)
		FAIL("register before alloc: %d, expected ZC_ESTATE", r);
	if (zc_grad_buffer(c, 0) != NULL)
		FAIL("a grad buffer before alloc");
	if ((r = zc_alloc_buffers(c, &plan)) < 0)
		FAIL("alloc: %s", zc_strerror_name(r));
	if (zc_grad_buffer(c, 2) != NULL)
		FAIL("a buffer for bucket 2 of 2");
	if ((r = zc_alloc_buffers(c, &plan)) != ZC_ESTATE)
		FAIL("second alloc: %d", r);
	if ((r = zc_register_plan(c)) < 0)
		FAIL("register: %s", zc_strerror_name(r));
	struct zc_param_group bad = group;
	bad.lr = -1;
	if ((r = zc_set_hyper(c, 0, &bad)) != ZC_EHYPER)
		FAIL("negative lr: %d, expected ZC_EHYPER", r);
	if ((r = zc_set_hyper(c, 5, &group)) != ZC_EHYPER)
		FAIL("group 5 of 1: %d, expected ZC_EHYPER", r);
	zc_close(c);

	/* nobody listening */
	cfg.socket = "/nonexistent/zerod.sock";
	cfg.connect_timeout_ms = 300;
	if ((r = zc_connect(&cfg, &c)) != ZC_ECONNECT)
		FAIL("connect to nothing: %d, expected ZC_ECONNECT", r);
	cfg.job_id = "bad/job";
	if ((r = zc_connect(&cfg, &c)) != -EINVAL)
		FAIL("bad job id: %d, expected -EINVAL", r);
	return 0;
}

/* An LR change made in the middle of a backward pass applies from the next
 * iteration, not never. lr 0.1 then 0, momentum 0.9, gradients 1, params 0:
 * after iteration 0 every parameter is -0.1 and iteration 1 leaves it. */
static int midway_rank(void *arg, int idx)
{
	zc_client *c = join(arg, 0, 1);
	struct zc_param_group g = group;
	zc_future *step = NULL;
	float want = 0.0f - (float)0.1 * 1.0f;
	int r;

	(void)idx;
	if (!c)
		return 1;
	for (int it = 0; it < 2; it++) {
		for (uint32_t b = 0; b < 2; b++) {
			for (uint64_t i = 0; i < buckets[b].numel; i++)
				zc_grad_buffer(c, b)[i] = 1.0f;
			zc_future *done = NULL;
			if (zc_bucket_ready(c, b, it == 0 && b == 0 ? &done : NULL) < 0)
				FAIL("bucket_ready");
			if (done) {
				/* bucket 0 is reduced: iteration 0 has begun */
				r = zc_future_wait(done, test_timeout(10000));
				zc_future_free(done);
				if (r != 1)
					FAIL("bucket 0 of iteration 0: %s", zc_strerror_name(r));
				g.lr = 0;
				if ((r = zc_set_hyper(c, 0, &g)) < 0)
					FAIL("set_hyper: %s", zc_strerror_name(r));
			}
		}
		if (zc_step_future(c, (uint64_t)it, &step) < 0 ||
		    zc_future_wait(step, test_timeout(10000)) != 1)
			FAIL("iteration %d did not complete", it);
		zc_future_free(step);
		for (uint32_t b = 0; b < 2; b++)
			for (uint64_t i = 0; i < buckets[b].numel; i++)
				if (zc_param_buffer(c, b)[i] != want)
					FAIL("iteration %d: bucket %u[%lu] = %.9g, want %.9g", it,
					     b, (unsigned long)i, zc_param_buffer(c, b)[i], want);
	}
	if ((r = zc_last_error(c)) != 0)
		FAIL("last error %s: %s", zc_strerror_name(r), zc_error_message());
	zc_close(c);
	return 0;
}

static void t_hyper_midway(void)
{
	CHECK(wait_child(spawn(midway_rank, "midway", 0), 20000) == 0,
	      "a mid-backward LR change was not applied from the next iteration");
}

/*
 * set_hyper: each rank's last call for a group and iteration wins, as an
 * assignment in torch; ranks must agree on their last values. SGD, momentum
 * 0.9, gradient r + 1 on rank r (average 1.5), parameters from 0:
 *  - iteration 0: lr 0.5 then 0.25 on both ranks, rank 0's two calls before
 *    rank 1's first: 0.25 applies and nobody is refused;
 *  - iteration 1: rank 0 sets 0.125, rank 1 sets 0.75 and then 0.125: its
 *    last agrees, so 0.125 applies and nobody is refused;
 *  - iteration 2: rank 0 sets 0.1, rank 1 sets 0.3: they disagree, rank 0's
 *    0.1 applies and rank 1 (only) hears ZC_EHYPER.
 */
static int last_pipe[2], done_pipe[2], checked_pipe[2];

static int hyper_set(zc_client *c, double lr)
{
	struct zc_param_group g = group;

	g.lr = lr;
	return zc_set_hyper(c, 0, &g);
}

static int last_wins_rank(void *arg, int rank)
{
	zc_client *c = join(arg, (uint32_t)rank, 2);
	float d = (1.0f + 2.0f) / 2.0f, mom = (float)0.9, buf = 0, want = 0;
	const double lr[3] = {0.25, 0.125, 0.1};
	zc_future *step = NULL;
	int r;

	if (!c)
		return 1;
	if (rank == 1 && !wait_pipe(last_pipe[0], 10000))
		FAIL("rank 0 did not set its values");
	if (hyper_set(c, 0.5) < 0 || hyper_set(c, 0.25) < 0)
		FAIL("rank %d: iteration 0's set_hyper", rank);
	if (rank == 0)
		signal_pipe(last_pipe[1]);
	for (int it = 0; it < 3; it++) {
		if (it == 1 && ((rank == 1 && hyper_set(c, 0.75) < 0) || hyper_set(c, 0.125) < 0))
			FAIL("rank %d: iteration 1's set_hyper", rank);
		if (it == 2 && hyper_set(c, rank ? 0.3 : 0.1) < 0)
			FAIL("rank %d: iteration 2's set_hyper", rank);
		for (uint32_t b = 0; b < 2; b++) {
			for (uint64_t i = 0; i < buckets[b].numel; i++)
				zc_grad_buffer(c, b)[i] = (float)(rank + 1);
			if (zc_bucket_ready(c, b, NULL) < 0)
				FAIL("rank %d: bucket_ready", rank);
		}
		if (zc_step_future(c, (uint64_t)it, &step) < 0 ||
		    zc_future_wait(step, test_timeout(10000)) != 1)
			FAIL("rank %d: iteration %d did not complete", rank, it);
		zc_future_free(step);
		buf = it ? mom * buf + 1.0f * d : d;
		want = want - (float)lr[it] * buf;
		for (uint32_t b = 0; b < 2; b++)
			for (uint64_t i = 0; i < buckets[b].numel; i++)
				if (zc_param_buffer(c, b)[i] != want)
					FAIL("rank %d iteration %d: bucket %u[%lu] = %.9g, want "
					     "%.9g (lr %g)",
					     rank, it, b, (unsigned long)i,
					     zc_param_buffer(c, b)[i], want, lr[it]);
		r = zc_last_error(c);
		/* the refusal is an Error over ZeroMQ, the step may have come
		 * over the ring first: read on until it is in */
		for (int64_t end = test_ms() + test_timeout(5000);
		     it == 2 && rank == 1 && r == 0 && test_ms() < end; r = zc_last_error(c)) {
			zc_dispatch(c);
			usleep(1000);
		}
		if (it < 2 && r != 0)
			FAIL("rank %d iteration %d: refused though its last values agree: %s %s",
			     rank, it, zc_strerror_name(r), zc_error_message());
		if (it == 2 && r != (rank ? ZC_EHYPER : 0))
			FAIL("rank %d iteration 2: %s (%s), want %s", rank, zc_strerror_name(r),
			     zc_error_message(), rank ? "ZC_EHYPER" : "no error");
	}
	/* neither leaves before the other has read its last error: a
	 * Goodbye ends the job, and the job's end would be the later error
	 * (rank 0 stays until rank 1 has read its refusal, rank 1 until rank
	 * 0 has read that its iteration 2 went through) */
	if (rank == 1) {
		signal_pipe(done_pipe[1]);
		if (!wait_pipe(checked_pipe[0], 10000))
			FAIL("rank 0 did not finish");
	} else {
		signal_pipe(checked_pipe[1]);
		if (!wait_pipe(done_pipe[0], 10000))
			FAIL("rank 1 did not finish");
	}
	zc_close(c);
	return 0;
}

static void t_hyper_last_wins(void)
{
	pid_t a, b;

	REQUIRE(pipe(last_pipe) == 0 && pipe(done_pipe) == 0 && pipe(checked_pipe) == 0, "pipe");
	a = spawn(last_wins_rank, "lastwins", 0);
	b = spawn(last_wins_rank, "lastwins", 1);
	CHECK(wait_child(a, 20000) == 0, "rank 0 failed");
	CHECK(wait_child(b, 20000) == 0, "rank 1 failed");
}

/* The owner's parameter buffer is the master: an edit made identically on
 * every rank between iterations (load_state_dict, an EMA swap) is what the
 * next step starts from. SGD, lr 0.1, momentum 0.9, gradient r + 1 on rank r:
 * iteration 1 must start from the edited 5.0, not from the step's own 0.85. */
static const struct zc_plan edit_plans[] = {
	PLAN(ZC_OPT_SGD, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED, 1, &group, 2, buckets),
	PLAN(ZC_OPT_SGD, ZC_SHARD_SLICE, ZC_STEP_AT_END, 1, &group, 2, buckets),
};

static int edit_rank(void *arg, int rank)
{
	const struct zc_plan *pl = &edit_plans[*(int *)arg];
	struct zc_config cfg = test_config(&daemon_, *(int *)arg ? "edit1" : "edit0",
					   (uint32_t)rank, 2);
	float d = (1.0f + 2.0f) / 2.0f, k = (float)0.1, mom = (float)0.9;
	float buf0 = d, want0 = 1.0f - k * buf0;
	float buf1 = mom * buf0 + 1.0f * d, want1 = 5.0f - k * buf1;
	zc_future *step = NULL;
	zc_client *c = NULL;
	int r;

	if ((r = zc_connect(&cfg, &c)) < 0 || (r = zc_alloc_buffers(c, pl)) < 0)
		FAIL("rank %d: set-up: %s", rank, zc_strerror_name(r));
	for (uint32_t b = 0; b < 2; b++)
		for (uint64_t i = 0; i < buckets[b].numel; i++)
			zc_param_buffer(c, b)[i] = rank == 0 ? 1.0f : -7.0f; /* rank 0's win */
	if ((r = zc_register_plan(c)) < 0)
		FAIL("rank %d: register: %s %s", rank, zc_strerror_name(r), zc_error_message());
	for (int it = 0; it < 2; it++) {
		for (uint32_t b = 0; b < 2; b++) {
			for (uint64_t i = 0; i < buckets[b].numel; i++)
				zc_grad_buffer(c, b)[i] = (float)(rank + 1);
			if (zc_bucket_ready(c, b, NULL) < 0)
				FAIL("bucket_ready");
		}
		if (zc_step_future(c, (uint64_t)it, &step) < 0 || zc_future_wait(step, test_timeout(10000)) != 1)
			FAIL("rank %d: iteration %d did not complete", rank, it);
		zc_future_free(step);
		for (uint32_t b = 0; b < 2; b++)
			for (uint64_t i = 0; i < buckets[b].numel; i++) {
				float got = zc_param_buffer(c, b)[i], want = it ? want1 : want0;
				if (got != want)
					FAIL("rank %d iteration %d: bucket %u[%lu] = %.9g, want "
					     "%.9g",
					     rank, it, b, (unsigned long)i, got, want);
				zc_param_buffer(c, b)[i] = 5.0f; /* the edit, on every rank */
			}
	}
	zc_close(c);
	return 0;
}

static void t_param_edit(void)
{
	static int which[2] = {0, 1};

	for (int p = 0; p < 2; p++) {
		pid_t a = spawn(edit_rank, &which[p], 0), b = spawn(edit_rank, &which[p], 1);
		CHECK(wait_child(a, 20000) == 0, "plan %d: rank 0 failed", p);
		CHECK(wait_child(b, 20000) == 0, "plan %d: rank 1 failed", p);
	}
}

/* The state is sized from the plan: turning on momentum (SGD) or amsgrad
 * (Adam) where no group had it is refused at once by the client (the daemon
 * keeps the same check for clients that speak the protocol themselves). */
static int growth_rank(void *arg, int idx)
{
	static const struct zc_param_group plain = {GROUP_SIZE, .lr = 0.1},
					   adam = ZC_PARAM_GROUP_INIT;
	const struct zc_plan sgd =
		PLAN(ZC_OPT_SGD, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED, 1, &plain, 2, buckets);
	const struct zc_plan ad =
		PLAN(ZC_OPT_ADAM, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED, 1, &adam, 2, buckets);
	struct zc_config cfg = test_config(&daemon_, idx ? "grow1" : "grow0", 0, 1);
	struct zc_param_group g;
	zc_client *c = NULL;
	int r;

	(void)arg;
	if ((r = zc_connect(&cfg, &c)) < 0 || (r = zc_alloc_buffers(c, idx ? &ad : &sgd)) < 0 ||
	    (r = zc_register_plan(c)) < 0)
		FAIL("set-up: %s", zc_strerror_name(r));
	g = idx ? adam : plain;
	if (idx)
		g.amsgrad = true;
	else
		g.momentum = 0.9;
	if ((r = zc_set_hyper(c, 0, &g)) != ZC_EHYPER)
		FAIL("%s turned on mid-run: %d, expected ZC_EHYPER", idx ? "amsgrad" : "momentum", r);
	g = idx ? adam : plain;
	g.lr = 0.05;
	if ((r = zc_set_hyper(c, 0, &g)) < 0)
		FAIL("a plain lr change: %s", zc_strerror_name(r));
	zc_close(c);
	return 0;
}

static void t_state_growth_refused(void)
{
	CHECK(wait_child(spawn(growth_rank, NULL, 0), 20000) == 0, "SGD momentum");
	CHECK(wait_child(spawn(growth_rank, NULL, 1), 20000) == 0, "Adam amsgrad");
}

static void t_wrong_state(void)
{
	CHECK(wait_child(spawn(state_checks, NULL, 0), 20000) == 0, "state checks failed");
}

/* zerod is SIGKILLed while both ranks wait without a time limit: the wait
 * must end with ZC_ECONNECT, not hang. */
static struct zd doomed;
static int doomed_pipe[2];

static int orphan_rank(void *arg, int rank)
{
	struct zc_config cfg = test_config(&doomed, arg, (uint32_t)rank, 2);
	zc_client *c = NULL;
	zc_future *step = NULL;
	int r;

	if (zc_connect(&cfg, &c) < 0 || zc_alloc_buffers(c, &plan) < 0 || zc_register_plan(c) < 0)
		FAIL("rank %d: could not join", rank);
	if (rank == 0 && (zc_bucket_ready(c, 0, NULL) < 0 || zc_bucket_ready(c, 1, NULL) < 0))
		FAIL("rank 0: bucket_ready");
	if (zc_step_future(c, 0, &step) < 0)
		FAIL("step future");
	signal_pipe(doomed_pipe[1]);
	r = zc_future_wait(step, -1);
	if (r != ZC_ECONNECT)
		FAIL("rank %d: wait after zerod died: %d (%s), expected ZC_ECONNECT", rank, r,
		     zc_strerror_name(r));
	if ((r = zc_bucket_ready(c, 0, NULL)) != ZC_ECONNECT)
		FAIL("rank %d: bucket_ready after zerod died: %d", rank, r);
	zc_future_free(step);
	zc_close(c);
	return 0;
}

static void t_daemon_killed(void)
{
	pid_t a, b;

	REQUIRE(zd_start(&doomed, NULL) == 0, "second zerod");
	REQUIRE(pipe(doomed_pipe) == 0, "pipe");
	a = spawn(orphan_rank, "orphan", 0);
	b = spawn(orphan_rank, "orphan", 1);
	CHECK(wait_pipe(doomed_pipe[0], 10000) && wait_pipe(doomed_pipe[0], 10000),
	      "the ranks did not get to wait");
	/* iteration 0 is in flight: rank 0's buckets are in, rank 1's never come */
	CHECK(zd_wait_arrived(&doomed, "orphan", 1, 1, 10000) == 0,
	      "rank 0's buckets did not reach zerod");
	kill(doomed.pid, SIGKILL);
	CHECK(wait_child(a, 10000) == 0, "rank 0 failed or hung");
	CHECK(wait_child(b, 10000) == 0, "rank 1 failed or hung");
	zd_stop(&doomed, 1000);
}

/* --max-sessions counts every trainer connection, of new jobs and old. */
static struct zd small;

static int limit_checks(void *arg, int idx)
{
	zc_client *c[3] = {0};
	int r = 0;

	(void)arg, (void)idx;
	for (uint32_t k = 0; k < 3; k++) {
		struct zc_config cfg = test_config(&small, "crowd", k, 3);
		r = zc_connect(&cfg, &c[k]);
		if (k < 2 && r < 0)
			FAIL("rank %u: %s", k, zc_strerror_name(r));
	}
	if (r != ZC_ELIMIT)
		FAIL("third trainer with --max-sessions 2: %d (%s), expected ZC_ELIMIT", r,
		     zc_strerror_name(r));
	for (int k = 0; k < 3; k++)
		zc_close(c[k]);
	return 0;
}

static void t_session_limit(void)
{
	static const char *const extra[] = {"--max-sessions", "2", NULL};

	REQUIRE(zd_start(&small, extra) == 0, "zerod --max-sessions 2");
	CHECK(wait_child(spawn(limit_checks, NULL, 0), 20000) == 0, "session limit not kept");
	CHECK(zd_stop(&small, 10000) == 0, "zerod did not stop cleanly");
}

/* A plan of 4096 buckets handed over without waiting: the queue between
 * client and daemon holds a whole iteration (and two of the largest plan),
 * so no zc_bucket_ready() fails with EAGAIN, and the steps land. */
#define MANY 4096

static int many_rank(void *arg, int idx)
{
	static struct zc_segment msegs[MANY][1];
	static struct zc_bucket mb[MANY];
	struct zc_param_group g = {GROUP_SIZE, .lr = 0.5};
	struct zc_plan mp = PLAN(ZC_OPT_SGD, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED, 1, &g, MANY, mb);
	struct zc_config cfg = test_config(&daemon_, arg, 0, 1);
	zc_client *c = NULL;
	int r;

	(void)idx;
	for (uint32_t b = 0; b < MANY; b++) {
		msegs[b][0] = (struct zc_segment)SEG(0, 2, 0);
		mb[b] = (struct zc_bucket)BUCKET(2, 1, msegs[b]);
	}
	if ((r = zc_connect(&cfg, &c)) < 0 || (r = zc_alloc_buffers(c, &mp)) < 0 ||
	    (r = zc_register_plan(c)) < 0)
		FAIL("join: %s %s", zc_strerror_name(r), zc_error_message());
	for (int it = 0; it < 2; it++) {
		zc_future *step = NULL;
		for (uint32_t b = 0; b < MANY; b++) {
			zc_grad_buffer(c, b)[0] = zc_grad_buffer(c, b)[1] = 1.0f;
			if ((r = zc_bucket_ready(c, b, NULL)) < 0)
				FAIL("iteration %d bucket %u: %s", it, b, zc_strerror_name(r));
		}
		if (zc_step_future(c, (uint64_t)it, &step) < 0 ||
		    zc_future_wait(step, test_timeout(20000)) != 1)
			FAIL("iteration %d: step %s", it, zc_future_message(step));
		zc_future_free(step);
	}
	for (uint32_t b = 0; b < MANY; b++)
		if (zc_param_buffer(c, b)[1] != -1.0f)
			FAIL("bucket %u: %g after 2 steps of lr 0.5, want -1", b,
			     zc_param_buffer(c, b)[1]);
	if ((r = zc_last_error(c)) != 0)
		FAIL("last error %s: %s", zc_strerror_name(r), zc_error_message());
	zc_close(c);
	return 0;
}

static void t_many_buckets(void)
{
	CHECK(wait_child(spawn(many_rank, "many", 0), 60000) == 0,
	      "4096 buckets handed over at once did not train");
}

/* register_timeout_ms bounds zc_register_plan() when a rank never comes. */
static int register_timeout_rank(void *arg, int idx)
{
	struct zc_config cfg = test_config(&daemon_, arg, 0, 2);
	zc_client *c = NULL;
	int64_t t0, el;
	int r;

	(void)idx;
	cfg.register_timeout_ms = 300;
	if ((r = zc_connect(&cfg, &c)) < 0 || (r = zc_alloc_buffers(c, &plan)) < 0)
		FAIL("connect: %s", zc_strerror_name(r));
	t0 = test_ms();
	r = zc_register_plan(c);
	el = test_ms() - t0;
	printf("# register without rank 1 -> %s after %ld ms: %s\n", zc_strerror_name(r), (long)el,
	       zc_error_message());
	if (r != ZC_ETIMEDOUT)
		FAIL("register without rank 1: %s, want ZC_ETIMEDOUT", zc_strerror_name(r));
	if (el < 250 || el > test_timeout(5000))
		FAIL("register gave up after %ld ms, not after its 300 ms", (long)el);
	zc_close(c);
	/* its leaving ends the job; the end reason says what it waited for */
	if (!zd_wait_log(&daemon_, "left the job; the job waited for rank 1 (not connected)", 5000))
		FAIL("the job's end reason does not name rank 1");
	return 0;
}

static void t_register_timeout(void)
{
	CHECK(wait_child(spawn(register_timeout_rank, "regtimeout", 0), 20000) == 0,
	      "register_timeout_ms not kept");
}

/* A job of 600 elements of SGD with momentum: 7200 bytes of state. */
static struct zc_segment mseg = SEG(0, 600, 0);
static struct zc_bucket mbucket = BUCKET(600, 1, &mseg);
static const struct zc_plan mid =
	PLAN(ZC_OPT_SGD, ZC_SHARD_BUCKET, ZC_STEP_AT_END, 1, &group, 1, &mbucket);
static int held_pipe[2];

static zc_client *mid_join(const char *job, uint32_t rank, uint32_t world)
{
	struct zc_config cfg = test_config(&small, job, rank, world);
	zc_client *c = NULL;
	int r;

	if ((r = zc_connect(&cfg, &c)) < 0 || (r = zc_alloc_buffers(c, &mid)) < 0 ||
	    (r = zc_register_plan(c)) < 0) {
		printf("# %s rank %u: %s %s\n", job, rank, zc_strerror_name(r),
		       zc_error_message());
		zc_close(c);
		return NULL;
	}
	return c;
}

/* rank 1 of job "held": registers, then waits to be killed */
static int held_rank1(void *arg, int idx)
{
	(void)arg, (void)idx;
	if (!mid_join("held", 1, 2))
		return 1;
	signal_pipe(held_pipe[1]);
	for (;;)
		pause();
}

/* A failed job gives its memory back at once, though a rank of it is still
 * connected: another job of the same size fits. */
static int memory_released(void)
{
	zc_client *held, *after;
	zc_future *step = NULL;
	pid_t p1;
	int r;

	if (pipe(held_pipe) < 0 || (p1 = spawn(held_rank1, NULL, 1)) < 0)
		FAIL("pipe/fork");
	held = mid_join("held", 0, 2);
	if (!held || !wait_pipe(held_pipe[0], 10000))
		FAIL("job held did not start");
	if (zc_bucket_ready(held, 0, NULL) < 0 || zc_step_future(held, 0, &step) < 0)
		FAIL("job held: iteration 0");
	kill(p1, SIGKILL);
	wait_child(p1, 10000);
	r = zc_future_wait(step, test_timeout(10000));
	zc_future_free(step);
	/* ZC_ERANKDEAD; or ZC_EJOBFAILED when the daemon saw the death before
	 * bucket 0 arrived and the job ended between iterations */
	if (r != ZC_ERANKDEAD && r != ZC_EJOBFAILED)
		FAIL("job held after its rank 1 was killed: %s", zc_strerror_name(r));
	/* held's rank 0 is still connected; its executor stops a moment after
	 * the error went out, so a few tries may see the memory still held */
	after = NULL;
	for (int i = 0, end = 50 * test_timeout(1); i < end && !after; i++) {
		char job[32];
		snprintf(job, sizeof(job), "after-%d", i);
		if (!(after = mid_join(job, 0, 1)))
			usleep(100000);
	}
	if (!after)
		FAIL("no job of 7200 bytes fits beside a failed one under --max-memory 8K");
	zc_close(after);
	zc_close(held);
	return 0;
}

/* --max-memory bounds the optimizer state of all jobs together: a job that
 * would not fit fails with ZC_ELIMIT, and the job already there trains on. */
static int memory_checks(void *arg, int idx)
{
	static struct zc_segment bseg = SEG(0, 4096, 0);
	static struct zc_bucket bb = BUCKET(4096, 1, &bseg);
	struct zc_param_group ag = ZC_PARAM_GROUP_INIT;
	struct zc_plan big = PLAN(ZC_OPT_ADAM, ZC_SHARD_BUCKET, ZC_STEP_AT_END, 1, &ag, 1, &bb);
	struct zc_config cfg = test_config(&small, "fits", 0, 1);
	zc_client *a = NULL, *b = NULL;
	zc_future *step = NULL;
	int r;

	(void)arg, (void)idx;
	/* plan: 164 elements of SGD with momentum, 3 floats each: 1968 bytes */
	if ((r = zc_connect(&cfg, &a)) < 0 || (r = zc_alloc_buffers(a, &plan)) < 0 ||
	    (r = zc_register_plan(a)) < 0)
		FAIL("a job of 1968 bytes under --max-memory 8K: %s %s", zc_strerror_name(r),
		     zc_error_message());
	/* 4096 elements of Adam (moments and amsgrad's max, 5 floats each): 80 KiB */
	cfg = test_config(&small, "too-big", 0, 1);
	if ((r = zc_connect(&cfg, &b)) < 0 || (r = zc_alloc_buffers(b, &big)) < 0)
		FAIL("too-big: %s", zc_strerror_name(r));
	r = zc_register_plan(b);
	printf("# a job of 80 KiB -> %s: %s\n", zc_strerror_name(r), zc_error_message());
	if (r != ZC_ELIMIT || !strstr(zc_error_message(), "--max-memory"))
		FAIL("a job of 80 KiB under --max-memory 8K: %s, want ZC_ELIMIT",
		     zc_strerror_name(r));
	zc_close(b);
	for (uint32_t k = 0; k < 2; k++)
		if (zc_bucket_ready(a, k, NULL) < 0)
			FAIL("bucket %u of the job that fits", k);
	if (zc_step_future(a, 0, &step) < 0 || zc_future_wait(step, test_timeout(10000)) != 1)
		FAIL("the job that fits did not step: %s", zc_future_message(step));
	zc_future_free(step);
	zc_close(a);
	return memory_released();
}

static void t_memory_limit(void)
{
	/* a killed rank's job frees its state at once (no --rejoin-timeout) */
	static const char *const extra[] = {"--max-memory", "8K", "--rejoin-timeout", "0", NULL};

	REQUIRE(zd_start(&small, extra) == 0, "zerod --max-memory 8K");
	REQUIRE(zd_wait_ctl(&small, 10000) == 0, "zerod does not answer");
	CHECK(zd_wait_log(&small, "8.0 KiB for optimizer state", 2000), "the budget is not logged");
	CHECK(wait_child(spawn(memory_checks, NULL, 0), 20000) == 0, "memory limit not kept");
	CHECK(zd_stop(&small, 10000) == 0, "zerod did not stop cleanly");
}

/* --max-user-memory: one user's jobs together (issue 11 §5: a client cannot
 * take the whole budget from the others). Each job holds 656 bytes (the
 * plan above: 164 elements, SGD's momentum buffer); 1K holds one of them,
 * not two, and the second fits once the first has gone. */
static int user_memory_checks(void *arg, int idx)
{
	struct zc_config cfg = test_config(&small, "first", 0, 1);
	zc_client *a = NULL, *b = NULL;
	int r;

	(void)arg, (void)idx;
	if ((r = zc_connect(&cfg, &a)) < 0 || (r = zc_alloc_buffers(a, &plan)) < 0 ||
	    (r = zc_register_plan(a)) < 0)
		FAIL("the first job: %s %s", zc_strerror_name(r), zc_error_message());
	cfg = test_config(&small, "second", 0, 1);
	if ((r = zc_connect(&cfg, &b)) < 0 || (r = zc_alloc_buffers(b, &plan)) < 0)
		FAIL("second: %s", zc_strerror_name(r));
	r = zc_register_plan(b);
	printf("# a second job of the same user -> %s: %s\n", zc_strerror_name(r),
	       zc_error_message());
	if (r != ZC_ELIMIT || !strstr(zc_error_message(), "--max-user-memory") ||
	    !strstr(zc_error_message(), "656 B"))
		FAIL("a second job over --max-user-memory: %s, want ZC_ELIMIT",
		     zc_strerror_name(r));
	zc_close(b);
	zc_close(a);
	/* the first job's state goes when its executor has stopped */
	for (int i = 0; i < 100; i++) {
		cfg = test_config(&small, "third", 0, 1);
		if ((r = zc_connect(&cfg, &b)) < 0 || (r = zc_alloc_buffers(b, &plan)) < 0)
			FAIL("third: %s", zc_strerror_name(r));
		r = zc_register_plan(b);
		zc_close(b);
		if (r != ZC_ELIMIT)
			break;
		usleep(20000);
	}
	if (r < 0)
		FAIL("a job after the first ended: %s %s", zc_strerror_name(r),
		     zc_error_message());
	return 0;
}

static void t_user_memory_limit(void)
{
	static const char *const extra[] = {"--max-user-memory", "1K", NULL};

	REQUIRE(zd_start(&small, extra) == 0, "zerod --max-user-memory 1K");
	CHECK(wait_child(spawn(user_memory_checks, NULL, 0), 20000) == 0,
	      "user memory limit not kept");
	CHECK(zd_stop(&small, 10000) == 0, "zerod did not stop cleanly");
}

/* --max-memory counts what a recovery needs too: with --recovery-journal an
 * interleaved job holds its undo journal beside its state (a copy of the
 * state, and a 4-byte slot per parameter), an at_end one none. The plan
 * above: 164 elements of SGD's momentum, 656 B of state; interleaved with
 * the journal 656 + 656 + 656 = 1968 B, over 1K; at_end 656 B, under it. */
static int journal_memory_checks(void *arg, int idx)
{
	struct zc_plan inter = plan;
	struct zc_config cfg = test_config(&small, "journaled", 0, 1);
	zc_client *a = NULL, *b = NULL;
	int r;

	(void)arg, (void)idx;
	inter.step_mode = ZC_STEP_INTERLEAVED;
	if ((r = zc_connect(&cfg, &a)) < 0 || (r = zc_alloc_buffers(a, &inter)) < 0)
		FAIL("journaled: %s", zc_strerror_name(r));
	r = zc_register_plan(a);
	printf("# an interleaved job with its journal -> %s: %s\n", zc_strerror_name(r),
	       zc_error_message());
	if (r != ZC_ELIMIT || !strstr(zc_error_message(), "--max-memory") ||
	    !strstr(zc_error_message(), "1.9 KiB") ||
	    !strstr(zc_error_message(), "undo journal (--recovery-journal)"))
		FAIL("an interleaved job of 656 B of state and 1.3 KiB of journal under "
		     "--max-memory 1K: %s, want ZC_ELIMIT naming the journal",
		     zc_strerror_name(r));
	zc_close(a);
	cfg = test_config(&small, "unjournaled", 0, 1);
	if ((r = zc_connect(&cfg, &b)) < 0 || (r = zc_alloc_buffers(b, &plan)) < 0 ||
	    (r = zc_register_plan(b)) < 0)
		FAIL("an at_end job (no journal) of 656 B under --max-memory 1K: %s %s",
		     zc_strerror_name(r), zc_error_message());
	zc_close(b);
	return 0;
}

static void t_memory_limit_counts_journal(void)
{
	static const char *const extra[] = {"--max-memory",       "1K", "--rejoin-timeout", "5000",
					    "--recovery-journal", NULL};

	REQUIRE(zd_start(&small, extra) == 0, "zerod --max-memory 1K --recovery-journal");
	CHECK(wait_child(spawn(journal_memory_checks, NULL, 0), 20000) == 0,
	      "the journal is not counted against --max-memory");
	CHECK(zd_stop(&small, 10000) == 0, "zerod did not stop cleanly");
}

/* A listening socket at path that is not zerod's: it answers like a web
 * server (answer) or says nothing (silent). */
struct fake {
	int fd;
	bool silent;
};

static void *fake_serve(void *arg)
{
	struct fake *f = arg;
	int c = accept(f->fd, NULL, NULL);

	if (c >= 0 && !f->silent) {
		static const char no[] = "HTTP/1.1 400 Bad Request\r\n\r\n";
		if (write(c, no, sizeof(no) - 1) < 0)
			perror("fake: write");
		close(c);
	}
	return NULL; /* silent: the connection stays open, unanswered */
}

static int unix_socket_at(const char *path, bool listening)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    (listening && listen(fd, 4) < 0)) {
		perror(path);
		return -1;
	}
	return fd;
}

/* zc_connect(path) with connect_timeout_ms (0: the default 30 s) fails
 * with ZC_ECONNECT within bound_ms, naming path, what it is and how to
 * start zerod or set ZEROD_SOCKET. */
static bool refused_at_once(const char *path, const char *what, int timeout_ms, int bound_ms)
{
	struct zc_config cfg = test_config(&daemon_, "nowhere", 0, 1);
	zc_client *c = NULL;
	int64_t t0 = test_ms(), el;
	int r;

	cfg.socket = path;
	cfg.connect_timeout_ms = timeout_ms;
	r = zc_connect(&cfg, &c);
	el = test_ms() - t0;
	printf("# %s -> %s after %ld ms: %s\n", path, zc_strerror_name(r), (long)el,
	       zc_error_message());
	if (r == 0)
		zc_close(c);
	return r == ZC_ECONNECT && el < bound_ms && strstr(zc_error_message(), path) &&
	       strstr(zc_error_message(), what) && strstr(zc_error_message(), "ZEROD_SOCKET");
}

static void t_connect_errors(void)
{
	char dir[128], missing[160], file[160], stale[160], web[160], quiet[160];
	struct fake fw = {.fd = -1}, fq = {.fd = -1, .silent = true};
	pthread_t tw, tq;
	int fd;

	snprintf(dir, sizeof(dir), "%.80s/zerod-connect.XXXXXX", test_tmpdir());
	REQUIRE(mkdtemp(dir), "mkdtemp");
	snprintf(missing, sizeof(missing), "%s/zerod.sock", dir);
	snprintf(file, sizeof(file), "%s/file.sock", dir);
	snprintf(stale, sizeof(stale), "%s/stale.sock", dir);
	snprintf(web, sizeof(web), "%s/web.sock", dir);
	snprintf(quiet, sizeof(quiet), "%s/quiet.sock", dir);
	fd = open(file, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
	REQUIRE(fd >= 0, "a plain file");
	close(fd);
	fd = unix_socket_at(stale, false); /* bound, never listening: a zerod gone */
	REQUIRE(fd >= 0, "a stale socket");
	close(fd);
	fw.fd = unix_socket_at(web, true);
	fq.fd = unix_socket_at(quiet, true);
	REQUIRE(fw.fd >= 0 && fq.fd >= 0, "listening sockets");
	REQUIRE(pthread_create(&tw, NULL, fake_serve, &fw) == 0, "a thread");
	REQUIRE(pthread_create(&tq, NULL, fake_serve, &fq) == 0, "a thread");
	/* the default 30 s connect timeout, yet each says so at once */
	CHECK(refused_at_once(missing, "no zerod socket", 0, test_timeout(5000)), "missing socket");
	CHECK(refused_at_once(dir, "is a directory", 0, test_timeout(5000)), "a directory");
	CHECK(refused_at_once(file, "is not a socket", 0, test_timeout(5000)), "a plain file");
	CHECK(refused_at_once(stale, "nothing listens", 0, test_timeout(5000)), "stale socket");
	CHECK(refused_at_once(web, "does not speak ZeroMQ", 0, test_timeout(5000)),
	      "a socket that is not ZeroMQ");
	/* one that says nothing: its connect timeout, then named */
	CHECK(refused_at_once(quiet, "no ZeroMQ greeting within 300 ms", 300, test_timeout(5000)),
	      "a silent socket");
	pthread_join(tw, NULL);
	pthread_join(tq, NULL);
	close(fw.fd);
	close(fq.fd);
	unlink(file), unlink(stale), unlink(web), unlink(quiet);
	rmdir(dir);
}

/* A rank that never connects: the ranks that registered get zerod's error
 * naming it (the client's default wait is longer than zerod's
 * --stall-timeout, however short its connect timeout), and the job's end
 * reason is that, not a rank leaving. */
static int missing_rank(void *arg, int idx)
{
	struct zc_config cfg = test_config(&small, "missing", (uint32_t)idx, 3);
	zc_client *c = NULL;
	int r;

	(void)arg;
	cfg.connect_timeout_ms = 500; /* the default register wait was this */
	if ((r = zc_connect(&cfg, &c)) < 0 || (r = zc_alloc_buffers(c, &plan)) < 0)
		FAIL("rank %d: connect: %s", idx, zc_strerror_name(r));
	r = zc_register_plan(c);
	printf("# rank %d: register without rank 2 -> %s: %s\n", idx, zc_strerror_name(r),
	       zc_error_message());
	if (r >= 0 || !strstr(zc_error_message(), "rank 2 (not connected)"))
		FAIL("rank %d: the error does not name rank 2", idx);
	zc_close(c);
	return 0;
}

static void t_missing_rank_named(void)
{
	static const char *const extra[] = {"--stall-timeout", "1500", NULL};
	pid_t p[2];

	REQUIRE(zd_start(&small, extra) == 0, "zerod --stall-timeout 1500");
	for (int i = 0; i < 2; i++)
		p[i] = spawn(missing_rank, NULL, i);
	for (int i = 0; i < 2; i++)
		CHECK(wait_child(p[i], 20000) == 0, "rank %d was not told rank 2 is missing", i);
	CHECK(zd_wait_log(&small, "job missing: ended (ZC_ETIMEDOUT: plan registration", 5000) &&
		      !zd_log_has(&small, "left the job"),
	      "the job's end reason is not the missing rank");
	CHECK(zd_stop(&small, 10000) == 0, "zerod did not stop cleanly");
}

static void t_daemon_stops_cleanly(void)
{
	CHECK(zd_stop(&daemon_, 10000) == 0, "zerod did not exit 0");
}

static const struct test_case cases[] = {
	{"fd_event_loop", t_fd_event_loop},
	{"wait_timeout_and_second_thread", t_wait_timeout_and_threads},
	{"wrong_state_calls", t_wrong_state},
	{"lr_change_midway_applies_next_iteration", t_hyper_midway},
	{"set_hyper_last_call_wins", t_hyper_last_wins},
	{"param_edit_between_iterations_is_kept", t_param_edit},
	{"state_growth_mid_run_refused", t_state_growth_refused},
	{"daemon_killed_fails_waiters", t_daemon_killed},
	{"session_limit", t_session_limit},
	{"many_buckets_at_once", t_many_buckets, 70000},
	{"memory_limit_ELIMIT", t_memory_limit},
	{"user_memory_limit_ELIMIT", t_user_memory_limit},
	{"memory_limit_counts_the_recovery_journal", t_memory_limit_counts_journal},
	{"register_timeout", t_register_timeout},
	{"connect_errors_at_once", t_connect_errors},
	{"missing_rank_named", t_missing_rank_named},
	{"daemon_stops_cleanly", t_daemon_stops_cleanly},
};

int main(int argc, char **argv)
{
	/* a dead trainer fails its job here: the recovery suite
	 * (tests/reliability/test_recovery.c) has the default */
	static const char *const extra[] = {"--rejoin-timeout", "0", NULL};

	return zd_test_main(&daemon_, extra, cases, sizeof(cases) / sizeof(cases[0]), argc, argv);
}
