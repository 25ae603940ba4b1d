/*
 * test_train.c — a real zerod and TEST_WORLD real trainer processes, for
 * every shard mode x step mode x optimizer: 20+ iterations with different
 * random gradients on every rank, three param groups, an LR change midway;
 * every rank's final parameters must equal the single-process reference
 * bit for bit (the reference rounds exactly as the daemon must).
 */
#include <stdio.h>
#include <stdlib.h>

#include "harness.h"
#include "testlib.h"
#include "trainer.h"

static struct zd daemon_;
static uint32_t world;

static int rank_main(void *arg, int idx)
{
	return train_rank(arg, (uint32_t)idx);
}

static void run(enum zc_optimizer opt, enum zc_shard_mode shard, enum zc_step_mode step)
{
	static int serial;
	char job[64];
	pid_t pids[16];
	struct train_spec s = {
		.socket = daemon_.sock,
		.job = job,
		.world = world,
		.optimizer = opt,
		.shard_mode = shard,
		.step_mode = step,
		.iters = 24,
		.seed = 42 + (uint64_t)serial,
		.hyper_iter = 10,
		.tolerance = 0,
	};

	REQUIRE(zd_alive(&daemon_), "zerod is not running");
	snprintf(job, sizeof(job), "train-w%u-%d", world, serial++);
	for (uint32_t r = 0; r < world; r++)
		pids[r] = spawn(rank_main, &s, (int)r);
	for (uint32_t r = 0; r < world; r++) {
		int st = wait_child(pids[r], 60000);
		CHECK(st == 0, "%s rank %u exited with %d", job, r, st);
	}
	if (test_failed_)
		zd_dump_log(&daemon_);
}

#define CASE(o, sh, st)                                                                            \
	static void t_##o##_##sh##_##st(void)                                                      \
	{                                                                                          \
		run(ZC_OPT_##o, ZC_SHARD_##sh, ZC_STEP_##st);                                      \
	}
CASE(SGD, BUCKET, INTERLEAVED)
CASE(SGD, BUCKET, AT_END)
CASE(SGD, SLICE, INTERLEAVED)
CASE(SGD, SLICE, AT_END)
CASE(ADAM, BUCKET, INTERLEAVED)
CASE(ADAM, BUCKET, AT_END)
CASE(ADAM, SLICE, INTERLEAVED)
CASE(ADAM, SLICE, AT_END)
CASE(ADAMW, BUCKET, INTERLEAVED)
CASE(ADAMW, BUCKET, AT_END)
CASE(ADAMW, SLICE, INTERLEAVED)
CASE(ADAMW, SLICE, AT_END)

static void t_daemon_stops_cleanly(void)
{
	int st = zd_stop(&daemon_, 10000);
	CHECK(st == 0, "zerod exited with %d after SIGTERM", st);
}

#define ENTRY(o, sh, st)                                                                           \
	{                                                                                          \
#o "_" #sh "_" #st, t_##o##_##sh##_##st                                            \
	}
static const struct test_case cases[] = {
	ENTRY(SGD, BUCKET, INTERLEAVED),
	ENTRY(SGD, BUCKET, AT_END),
	ENTRY(SGD, SLICE, INTERLEAVED),
	ENTRY(SGD, SLICE, AT_END),
	ENTRY(ADAM, BUCKET, INTERLEAVED),
	ENTRY(ADAM, BUCKET, AT_END),
	ENTRY(ADAM, SLICE, INTERLEAVED),
	ENTRY(ADAM, SLICE, AT_END),
	ENTRY(ADAMW, BUCKET, INTERLEAVED),
	ENTRY(ADAMW, BUCKET, AT_END),
	ENTRY(ADAMW, SLICE, INTERLEAVED),
	ENTRY(ADAMW, SLICE, AT_END),
	{"daemon_stops_cleanly", t_daemon_stops_cleanly},
};

int main(int argc, char **argv)
{
	const char *w = getenv("TEST_WORLD");

	world = w ? (uint32_t)atoi(w) : 2;
	if (world < 1 || world > 16) {
		printf("Bail out! TEST_WORLD must be 1..16\n");
		return 1;
	}
	return zd_test_main(&daemon_, NULL, cases, sizeof(cases) / sizeof(cases[0]), argc, argv);
}
