/*
 * test_protocol_fuzz.c — a real zerod fed mutated protocol messages (bit
 * flips, truncations, splices, random varints, wrong directions, valid
 * messages with random field values) from several raw connections, while a
 * real 2-rank job trains beside it. Afterwards the daemon must still be alive,
 * the job's parameters must equal the reference (nothing lost), a fresh job
 * must train, and SIGTERM must stop the daemon cleanly.
 *
 * ZEROD_FUZZ_ITERS (default 3000) and ZEROD_FUZZ_SEED (default 1) size and
 * seed a run; CI runs the default, a long run is by hand:
 *   ZEROD_FUZZ_ITERS=200000 meson test -C build fuzz-protocol
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <zmq.h>

#include "harness.h"
#include "plan.h"
#include "testlib.h"
#include "trainer.h"
#include "wire.h"
#include "zctest.h"

#define NSOCK 4

static struct zd daemon_;
static uint64_t rng;

static uint64_t rnd(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

static uint32_t below(uint32_t n)
{
	return n ? (uint32_t)(rnd() % n) : 0;
}

static void *open_sock(void *ctx)
{
	char ep[256];
	int zero = 0;
	void *s = zmq_socket(ctx, ZMQ_DEALER);

	zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof(zero));
	snprintf(ep, sizeof(ep), "ipc://%s", daemon_.sock);
	zmq_connect(s, ep);
	return s;
}

/* Where the fuzzer's own job stands, as the daemon's answers say: the next
 * bucket to hand over (2: all are, the step is pending). Fuzzed messages on
 * its socket may end it (dead): then a new job takes its place. */
struct active {
	uint64_t it;
	uint32_t b;
	int steps, jobs, failed_setups;
	bool dead;
};

/* Read every answer waiting on s; with a, follow the job's progress. */
static void drain(void *s, struct active *a)
{
	uint8_t buf[4096];
	int len;

	while ((len = zmq_recv(s, buf, sizeof(buf), ZMQ_DONTWAIT)) >= 0) {
		Zerod__V1__Envelope *env;
		if (!a || len > (int)sizeof(buf) ||
		    !(env = zerod__v1__envelope__unpack(NULL, (size_t)len, buf)))
			continue;
		if (env->body_case == ZEROD__V1__ENVELOPE__BODY_BUCKET_DONE &&
		    env->bucket_done->iteration == a->it && env->bucket_done->bucket == a->b)
			a->b++;
		if (env->body_case == ZEROD__V1__ENVELOPE__BODY_ERROR && env->error->fatal)
			a->dead = true;
		if (env->body_case == ZEROD__V1__ENVELOPE__BODY_STEP_DONE &&
		    env->step_done->iteration == a->it) {
			a->it++;
			a->b = 0;
			a->steps++;
		}
		zerod__v1__envelope__free_unpacked(env, NULL);
	}
}

/* The next answer on s (5 s at most) is of kind body. */
static bool answered(void *s, Zerod__V1__Envelope__BodyCase body)
{
	uint8_t buf[4096];
	Zerod__V1__Envelope *env;
	int len = zmq_recv(s, buf, sizeof(buf), 0);
	bool ok;

	if (len < 0 || len > (int)sizeof(buf) ||
	    !(env = zerod__v1__envelope__unpack(NULL, (size_t)len, buf)))
		return false;
	ok = env->body_case == body;
	zerod__v1__envelope__free_unpacked(env, NULL);
	return ok;
}

/* A small valid plan, and real shm buffers for it. */
static struct zc_param_group groups[2];
static struct zc_segment segs[3] = {SEG(0, 40, 0), SEG(40, 60, 1), SEG(0, 33, 1)};
static struct zc_bucket buckets[2] = {BUCKET(100, 2, segs), BUCKET(33, 1, segs + 2)};
static struct zc_plan zplan =
	PLAN(ZC_OPT_ADAM, ZC_SHARD_SLICE, ZC_STEP_INTERLEAVED, 2, groups, 2, buckets);

static void make_shm(const char *name, size_t bytes)
{
	int fd = shm_open(name, O_RDWR | O_CREAT | O_TRUNC, 0600);
	if (fd >= 0) {
		(void)!ftruncate(fd, (off_t)bytes);
		close(fd);
	}
}

/* One message, valid in form, with fields drawn at random. */
static size_t make_seed(uint8_t *out, size_t cap, int world1_job_ready)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__Hello h = ZEROD__V1__HELLO__INIT;
	Zerod__V1__RegisterPlan rp = ZEROD__V1__REGISTER_PLAN__INIT;
	Zerod__V1__ShmBuffers shm = ZEROD__V1__SHM_BUFFERS__INIT;
	Zerod__V1__BucketReady br = ZEROD__V1__BUCKET_READY__INIT;
	Zerod__V1__SetHyper sh = ZEROD__V1__SET_HYPER__INIT;
	Zerod__V1__ParamGroup pg;
	Zerod__V1__StepDone sd = ZEROD__V1__STEP_DONE__INIT;
	Zerod__V1__Goodbye bye = ZEROD__V1__GOODBYE__INIT;
	Zerod__V1__Plan pb;
	struct plan *p = NULL;
	char job[32], gname[64], pname[64];
	size_t n = 0;
	bool have_pb = false;

	snprintf(job, sizeof(job), "fuzz-%u", below(6));
	env.has_request_id = below(2);
	env.request_id = rnd();
	switch (world1_job_ready ? below(8) : below(5)) {
	case 0:
		h.protocol_version = below(4) ? 1 : (uint32_t)rnd();
		h.job_id = below(8) ? job : "bad job/id";
		h.world_size = below(4) ? 1 + below(4) : (uint32_t)rnd();
		h.rank = below(h.world_size + 2);
		h.local_size = below(4) ? h.world_size : (uint32_t)rnd();
		h.local_rank = below(h.local_size + 1);
		h.pid = below(4) ? getpid() : (int32_t)rnd();
		env.body_case = ZEROD__V1__ENVELOPE__BODY_HELLO;
		env.hello = &h;
		break;
	case 1:
		if (plan_from_zc(&zplan, &p, NULL, 0) < 0 || plan_to_pb(p, &pb) < 0)
			break;
		have_pb = true;
		if (below(3) == 0 && pb.n_buckets)
			pb.buckets[below((uint32_t)pb.n_buckets)]->numel = rnd() >> below(64);
		if (below(3) == 0)
			pb.optimizer = (Zerod__V1__Optimizer)below(6);
		snprintf(gname, sizeof(gname), "/zerod-fuzz-%d-g%u", getpid(), below(3));
		snprintf(pname, sizeof(pname), "/zerod-fuzz-%d-p%u", getpid(), below(3));
		shm.grad_name = below(8) ? gname : "not/a/name";
		shm.param_name = pname;
		shm.grad_bytes = below(3) ? plan_buffer_bytes(p) : rnd() >> below(64);
		shm.param_bytes = below(3) ? plan_buffer_bytes(p) : rnd() >> below(64);
		if (below(2)) {
			make_shm(gname, plan_buffer_bytes(p));
			make_shm(pname, below(4) ? plan_buffer_bytes(p) : 8);
		}
		rp.plan = &pb;
		rp.shm = &shm;
		env.body_case = ZEROD__V1__ENVELOPE__BODY_REGISTER_PLAN;
		env.register_plan = &rp;
		break;
	case 2:
		sd.iteration = rnd();
		env.body_case = ZEROD__V1__ENVELOPE__BODY_STEP_DONE; /* wrong direction */
		env.step_done = &sd;
		break;
	case 3:
		env.body_case = ZEROD__V1__ENVELOPE__BODY_GOODBYE;
		env.goodbye = &bye;
		break;
	case 4:
		break; /* an envelope with no body */
	default:
		if (below(2)) {
			br.iteration = below(4) ? below(40) : rnd();
			br.bucket = below(4) ? below(3) : (uint32_t)rnd();
			env.body_case = ZEROD__V1__ENVELOPE__BODY_BUCKET_READY;
			env.bucket_ready = &br;
		} else {
			struct zc_param_group g = ZC_PARAM_GROUP_INIT;
			g.lr = below(4) ? 1e-3 : (double)(int64_t)rnd();
			g.beta1 = below(4) ? 0.9 : 1.5;
			plan_group_to_pb(&g, &pg);
			sh.iteration = below(4) ? below(40) : rnd();
			sh.group = below(3);
			sh.values = &pg;
			env.body_case = ZEROD__V1__ENVELOPE__BODY_SET_HYPER;
			env.set_hyper = &sh;
		}
		break;
	}
	n = zerod__v1__envelope__get_packed_size(&env);
	if (n <= cap)
		zerod__v1__envelope__pack(&env, out);
	else
		n = 0;
	if (have_pb)
		plan_pb_free(&pb);
	plan_free(p);
	return n;
}

static size_t mutate(uint8_t *buf, size_t n, size_t cap)
{
	switch (below(6)) {
	case 0: /* flip bits */
		for (uint32_t k = 1 + below(8); k && n; k--)
			buf[below((uint32_t)n)] ^= (uint8_t)(1u << below(8));
		return n;
	case 1: /* truncate */
		return n ? below((uint32_t)n) : 0;
	case 2: /* append noise */
		for (uint32_t k = below(32); k && n < cap; k--)
			buf[n++] = (uint8_t)rnd();
		return n;
	case 3: /* a huge varint somewhere */
		if (n > 2) {
			size_t at = below((uint32_t)n - 1);
			for (size_t i = at; i < n && i < at + 9; i++)
				buf[i] = 0xff;
		}
		return n;
	case 4: /* duplicate a range */
		if (n > 4 && n * 2 < cap) {
			size_t a = below((uint32_t)n / 2), len = below((uint32_t)(n - a));
			memmove(buf + a + len, buf + a, n - a);
			return n + len;
		}
		return n;
	default: /* unchanged */
		return n;
	}
}

/* Socket 0 runs a real world-1 job, so bucket and hyperparameter messages
 * reach an active job's scheduler and engine, not only the edge. */
static void say_goodbye(void *s)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__Goodbye bye = ZEROD__V1__GOODBYE__INIT;
	uint8_t buf[64];
	int linger = 200;

	env.body_case = ZEROD__V1__ENVELOPE__BODY_GOODBYE;
	env.goodbye = &bye;
	zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof(linger));
	zmq_send(s, buf, zerod__v1__envelope__pack(&env, buf), ZMQ_DONTWAIT);
}

static bool setup_active(void *s, const char *job)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__Hello h = ZEROD__V1__HELLO__INIT;
	Zerod__V1__RegisterPlan rp = ZEROD__V1__REGISTER_PLAN__INIT;
	Zerod__V1__ShmBuffers shm = ZEROD__V1__SHM_BUFFERS__INIT;
	Zerod__V1__Plan pb;
	struct plan *p = NULL;
	char gname[64], pname[64];
	uint8_t buf[4096];
	int tmo = test_timeout(5000);
	bool ok;

	zmq_setsockopt(s, ZMQ_RCVTIMEO, &tmo, sizeof(tmo));
	h.protocol_version = ZC_PROTOCOL_VERSION;
	h.job_id = (char *)job;
	h.world_size = h.local_size = 1;
	h.pid = getpid();
	env.body_case = ZEROD__V1__ENVELOPE__BODY_HELLO;
	env.hello = &h;
	zmq_send(s, buf, zerod__v1__envelope__pack(&env, buf), 0);
	if (!answered(s, ZEROD__V1__ENVELOPE__BODY_HELLO_OK) ||
	    plan_from_zc(&zplan, &p, NULL, 0) < 0 || plan_to_pb(p, &pb) < 0)
		return false;
	snprintf(gname, sizeof(gname), "/zerod-fuzz-%d-active-g", getpid());
	snprintf(pname, sizeof(pname), "/zerod-fuzz-%d-active-p", getpid());
	make_shm(gname, plan_buffer_bytes(p));
	make_shm(pname, plan_buffer_bytes(p));
	shm = (Zerod__V1__ShmBuffers)ZEROD__V1__SHM_BUFFERS__INIT;
	shm.grad_name = gname;
	shm.param_name = pname;
	shm.grad_bytes = shm.param_bytes = plan_buffer_bytes(p);
	rp.plan = &pb;
	rp.shm = &shm;
	env.body_case = ZEROD__V1__ENVELOPE__BODY_REGISTER_PLAN;
	env.register_plan = &rp;
	zmq_send(s, buf, zerod__v1__envelope__pack(&env, buf), 0);
	ok = answered(s, ZEROD__V1__ENVELOPE__BODY_PLAN_OK);
	plan_pb_free(&pb);
	plan_free(p);
	return ok;
}

/* Mostly in-order buckets for the active job, so its iterations move. */
static size_t active_bucket(uint8_t *out, const struct active *a)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__BucketReady br = ZEROD__V1__BUCKET_READY__INIT;

	/* the next bucket, or one out of order, twice, unknown or early */
	br.iteration = a->it + (below(10) ? 0 : below(2));
	br.bucket = below(10) && a->b < 2 ? a->b : below(4);
	env.body_case = ZEROD__V1__ENVELOPE__BODY_BUCKET_READY;
	env.bucket_ready = &br;
	return zerod__v1__envelope__pack(&env, out);
}

static int fuzz_main(void *arg, int idx)
{
	long iters = (long)(intptr_t)arg;
	void *ctx = zmq_ctx_new(), *socks[NSOCK];
	uint8_t buf[8192];

	(void)idx;
	groups[0] = (struct zc_param_group)ZC_PARAM_GROUP_INIT;
	groups[1] = (struct zc_param_group)ZC_PARAM_GROUP_INIT;
	struct active a = {.dead = true};

	for (int k = 0; k < NSOCK; k++)
		socks[k] = open_sock(ctx);
	for (long i = 0; i < iters; i++) {
		int k = (int)below(NSOCK);
		size_t n;

		if (a.dead) {
			char job[32];
			snprintf(job, sizeof(job), "fuzz-active-%d", a.jobs++);
			say_goodbye(socks[0]); /* so its session and job end */
			zmq_close(socks[0]);
			socks[0] = open_sock(ctx);
			a.it = a.b = 0;
			a.dead = false;
			a.failed_setups += !setup_active(socks[0], job);
		}
		if (k == 0 && below(4)) {
			/* the active job: clean buckets, now and then a bad one */
			n = active_bucket(buf, &a);
			zmq_send(socks[0], buf, n, ZMQ_DONTWAIT);
			usleep(below(3) ? 0 : 200);
			drain(socks[0], &a);
			continue;
		}
		n = make_seed(buf, sizeof(buf) / 2, 1);
		n = mutate(buf, n, sizeof(buf));
		if (below(50) == 0) {
			/* two frames: the daemon wants one */
			zmq_send(socks[k], buf, n / 2, ZMQ_SNDMORE | ZMQ_DONTWAIT);
			zmq_send(socks[k], buf + n / 2, n - n / 2, ZMQ_DONTWAIT);
		} else {
			zmq_send(socks[k], buf, n, ZMQ_DONTWAIT);
		}
		drain(socks[k], k == 0 ? &a : NULL);
		if (k != 0 && below(300) == 0) {
			/* a new connection: a new routing id */
			zmq_close(socks[k]);
			socks[k] = open_sock(ctx);
		}
	}
	usleep(200000);
	for (int k = 0; k < NSOCK; k++) {
		drain(socks[k], k == 0 ? &a : NULL);
		zmq_close(socks[k]);
	}
	zmq_ctx_term(ctx);
	for (int g = 0; g < 3; g++) {
		char name[80];
		snprintf(name, sizeof(name), "/zerod-fuzz-%d-g%d", getpid(), g);
		shm_unlink(name);
		snprintf(name, sizeof(name), "/zerod-fuzz-%d-p%d", getpid(), g);
		shm_unlink(name);
	}
	{
		char name[80];
		snprintf(name, sizeof(name), "/zerod-fuzz-%d-active-g", getpid());
		shm_unlink(name);
		snprintf(name, sizeof(name), "/zerod-fuzz-%d-active-p", getpid());
		shm_unlink(name);
	}
	printf("# the fuzzer's own jobs: %d, %d of them not registered, %d steps done\n", a.jobs,
	       a.failed_setups, a.steps);
	return a.failed_setups == 0 && a.steps > 0 ? 0 : 1;
}

static struct train_spec bg;
static pid_t bg_pids[2];

static int rank_main(void *arg, int idx)
{
	return train_rank(arg, (uint32_t)idx);
}

static void t_fuzz(void)
{
	const char *it = getenv("ZEROD_FUZZ_ITERS"), *seed = getenv("ZEROD_FUZZ_SEED");
	long iters = it ? atol(it) : 3000;
	pid_t f;
	int st;

	rng = seed ? strtoull(seed, NULL, 0) : 1;
	rng = rng ? rng : 1;
	test_note("%ld messages, seed %llu (ZEROD_FUZZ_ITERS, ZEROD_FUZZ_SEED)", iters,
		  (unsigned long long)rng);
	bg = (struct train_spec){.socket = daemon_.sock,
				 .job = "beside-the-fuzz",
				 .world = 2,
				 .optimizer = ZC_OPT_ADAMW,
				 .shard_mode = ZC_SHARD_BUCKET,
				 .step_mode = ZC_STEP_AT_END,
				 .iters = 1000000,
				 .stop = train_stop_new(), /* trains as long as the fuzzer runs */
				 .seed = 7,
				 .hyper_iter = 5,
				 .sleep_us = 20000,
				 .tolerance = 1e-6};
	for (int r = 0; r < 2; r++)
		bg_pids[r] = spawn(rank_main, &bg, r);
	f = spawn(fuzz_main, (void *)(intptr_t)iters, 0);
	st = wait_child(f, 600000);
	CHECK(st == 0, "fuzzer exited with %d", st);
	CHECK(zd_alive(&daemon_), "zerod died under fuzzing");
	atomic_store(&bg.stop->requested, 1);
	for (int r = 0; r < 2; r++) {
		st = wait_child(bg_pids[r], 60000);
		CHECK(st == 0, "the job beside the fuzzer: rank %d exited with %d", r, st);
	}
	CHECK(atomic_load(&bg.stop->stop_at) > 5, "the job beside the fuzzer ran %d iterations",
	      atomic_load(&bg.stop->stop_at));
}

static void t_fresh_job(void)
{
	struct train_spec s = {.socket = daemon_.sock,
			       .job = "after-the-fuzz",
			       .world = 3,
			       .optimizer = ZC_OPT_SGD,
			       .shard_mode = ZC_SHARD_SLICE,
			       .step_mode = ZC_STEP_INTERLEAVED,
			       .iters = 20,
			       .seed = 9,
			       .hyper_iter = -1};
	pid_t p[3];

	REQUIRE(zd_alive(&daemon_), "zerod is gone");
	for (int r = 0; r < 3; r++)
		p[r] = spawn(rank_main, &s, r);
	for (int r = 0; r < 3; r++)
		CHECK(wait_child(p[r], 60000) == 0, "rank %d of a fresh job failed", r);
}

static void t_stop(void)
{
	int st = zd_stop(&daemon_, 10000);
	CHECK(st == 0, "zerod exited with %d after SIGTERM", st);
	if (st)
		zd_dump_log(&daemon_);
}

static const struct test_case cases[] = {
	{"fuzz_beside_a_training_job", t_fuzz, 600000},
	{"fresh_job_after_fuzz", t_fresh_job, 70000},
	{"daemon_stops_cleanly", t_stop},
};

int main(int argc, char **argv)
{
	char stall[16];
	const char *const extra[] = {"--stall-timeout", stall, "-q", NULL};

	snprintf(stall, sizeof(stall), "%d", test_timeout(3000));
	return zd_test_main(&daemon_, extra, cases, sizeof(cases) / sizeof(cases[0]), argc, argv);
}
