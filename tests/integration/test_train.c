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

/* serial: the case's place in the table, for its job name and seed (each
 * case runs in a process of its own, so no counter could carry it) */
static void run(int serial, enum zc_optimizer opt, enum zc_shard_mode shard, enum zc_step_mode step)
{
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
	snprintf(job, sizeof(job), "train-w%u-%d", world, serial);
	for (uint32_t r = 0; r < world; r++)
		pids[r] = spawn(rank_main, &s, (int)r);
	for (uint32_t r = 0; r < world; r++) {
		int st = wait_child(pids[r], 60000);
		CHECK(st == 0, "%s rank %u exited with %d", job, r, st);
	}
	if (test_failed_)
		zd_dump_log(&daemon_);
}

#define CASE(n, o, sh, st)                                                                         \
	static void t_##o##_##sh##_##st(void)                                                      \
	{                                                                                          \
		run(n, ZC_OPT_##o, ZC_SHARD_##sh, ZC_STEP_##st);                                   \
	}
CASE(0, SGD, BUCKET, INTERLEAVED)
CASE(1, SGD, BUCKET, AT_END)
CASE(2, SGD, SLICE, INTERLEAVED)
CASE(3, SGD, SLICE, AT_END)
CASE(4, ADAM, BUCKET, INTERLEAVED)
CASE(5, ADAM, BUCKET, AT_END)
CASE(6, ADAM, SLICE, INTERLEAVED)
CASE(7, ADAM, SLICE, AT_END)
CASE(8, ADAMW, BUCKET, INTERLEAVED)
CASE(9, ADAMW, BUCKET, AT_END)
CASE(10, ADAMW, SLICE, INTERLEAVED)
CASE(11, ADAMW, SLICE, AT_END)

static void t_daemon_stops_cleanly(void)
{
	int st = zd_stop(&daemon_, 10000);
	CHECK(st == 0, "zerod exited with %d after SIGTERM", st);
}

#define ENTRY(o, sh, st)                                                                           \
	{                                                                                          \
#o "_" #sh "_" #st, t_##o##_##sh##_##st, 70000                                     \
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
