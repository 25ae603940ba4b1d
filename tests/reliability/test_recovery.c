/*
 * test_recovery.c — a trainer dies and the job goes on from zerod's memory
 * (issue 23 §1, §4), against a real zerod and real trainer processes.
 *
 *  - killed_*: a job trains; one rank SIGKILLs itself at a phase of an
 *    iteration (before its first bucket, between its buckets, after its
 *    last bucket while the step runs, between iterations). The survivors'
 *    calls fail with ZC_ERANKLOST (zc_error_recoverable) and they exit, as
 *    torchrun's agent ends a worker group; the test then starts every rank
 *    again (the group's restart), which rejoins the same job id, is told by
 *    zc_recovered() the iteration it goes on at (the same on every rank, no
 *    older than the last StepDone any rank saw), and trains to the end.
 *    Every rank's final parameters and state equal bit for bit the
 *    reference of an uninterrupted run (statefix.h: gradients are a function
 *    of rank, iteration and element only). Every shard and step mode,
 *    SGD and Adam, 2 and 3 ranks. In step mode interleaved a death between
 *    buckets, after some were stepped, goes back to the iteration's start
 *    through the undo journal (--recovery-journal, this suite's zerod);
 *    without it that job fails with ZC_ERANKDEAD saying so (reform.c), and
 *    interleaved_cut_without_journal_fails_named asserts it.
 *  - never_back: the restarted group lacks a rank: the ones that rejoined
 *    fail after --rejoin-timeout with ZC_ERANKDEAD naming the missing rank,
 *    and zerod holds no job, memory or fd of it afterwards.
 *  - beside: a job beside the re-forming one trains on to its reference.
 *
 * No disk is read: the job id is all the restarted ranks bring.
 */
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "statefix.h"
#include "testlib.h"

#define ITERS     8
#define KILL_ITER 4
#define NRANKS    3
#define REJOIN_MS 20000

static struct zd daemon_;

static const struct layout layout3 = {3, {{0, 1, -1}, {2, -1}, {3, 4, 5, -1}}};
/* another layout of the same parameters (DDP's buckets before it rebuilds
 * them are another order): a restarted group may bring it */
static const struct layout layout4 = {4, {{5, 3, -1}, {4, 2, -1}, {1, -1}, {0, -1}}};

enum phase {
	BEFORE_FIRST,  /* at the start of KILL_ITER, before its bucket 0 */
	BETWEEN,       /* after half its buckets of KILL_ITER */
	DURING_STEP,   /* after its last bucket of KILL_ITER, the step running */
	BETWEEN_ITERS, /* after the step of KILL_ITER - 1, before KILL_ITER */
	NPHASES,
};
static const char *const phase_name[] = {"before_first_bucket", "between_buckets", "during_step",
					 "between_iterations"};

#define EXIT_LOST  42 /* a survivor told ZC_ERANKLOST */
#define EXIT_FATAL 43 /* a survivor told a fatal error (expected where stated) */

struct script {
	char job[64];
	const char *sock;
	uint32_t world;
	enum zc_optimizer opt;
	enum zc_shard_mode shard;
	enum zc_step_mode step;
	uint64_t seed;
	bool armed;     /* the victim dies at kill_iter, at phase */
	bool restarted; /* the group's restart: every rank must be recovered */
	int kill_iter;
	const struct layout *restart_layout; /* the restarted group's; NULL: layout3 */
	bool ids; /* segments named by param_id (else matched by position) */
	uint32_t victim;
	enum phase phase;
	uint32_t first_world; /* restarted with another world size: the first one's; 0: none */
	atomic_int linger;    /* set: a survivor told ZC_ERANKLOST stays connected until 0 */
	/* over two zerods (TEST_RECOVERY_NODES): rank r on node node_of[r] */
	uint32_t nnodes;
	uint32_t node_of[NRANKS];
	const char *socks[2]; /* the forked ranks see the parent's nodes_ */
	char rdzv[32];
	struct snap *want;    /* the uninterrupted reference at ITERS */
	atomic_int seen[NRANKS];        /* armed: iterations whose StepDone each rank saw */
	atomic_llong recovered[NRANKS]; /* restarted: zc_recovered()'s iteration, -1: none */
	atomic_int fatal_code[NRANKS];
	char fatal_msg[NRANKS][256];
	int register_timeout_ms;
};

static void die(void)
{
	fflush(stdout);
	raise(SIGKILL);
}

static int one_iteration(zc_client *c, const struct script *sc, const struct tplan *tp,
			 uint32_t rank)
{
	uint64_t t = zc_iteration(c);
	bool victim = sc->armed && rank == sc->victim && t == (uint64_t)sc->kill_iter;
	uint32_t nb = tp->plan.nbuckets;
	zc_future *step = NULL;
	int r;

	if (victim && sc->phase == BEFORE_FIRST)
		die();
	if (sf_fill_grads(c, tp, sc->seed, rank, (int)t) < 0)
		return -EINVAL;
	for (uint32_t b = 0; b < nb; b++) {
		if (victim && sc->phase == BETWEEN && b == nb / 2 + 1) {
			/* the others' buckets of the first half are in: stepped in
			 * step mode interleaved */
			usleep(100 * 1000);
			die();
		}
		if ((r = zc_bucket_ready(c, b, NULL)) < 0)
			return r;
	}
	if (victim && sc->phase == DURING_STEP)
		die();
	r = zc_step_future(c, t, &step);
	if (r >= 0)
		r = zc_future_wait(step, test_timeout(30000));
	if (r == 0)
		r = ZC_ETIMEDOUT;
	zc_future_free(step);
	return r < 0 ? r : 0;
}

static int rank_main(void *arg, int idx)
{
	struct script *sc = arg;
	uint32_t rank = (uint32_t)idx;
	struct tplan *tp = calloc(1, sizeof(*tp));
	struct snap *got = calloc(1, sizeof(*got)), *want = sc->want;
	struct zc_config cfg;
	zc_client *c = NULL;
	const char *what = "connect";
	uint64_t at = 0;
	int r;

	make_plan(tp, sc->restarted && sc->restart_layout ? sc->restart_layout : &layout3, sc->opt,
		  sc->shard, sc->step, sc->ids);
	cfg = test_config(&daemon_, sc->job, rank, sc->world);
	if (sc->sock)
		cfg.socket = sc->sock;
	if (sc->nnodes) {
		cfg.socket = sc->socks[sc->node_of[rank]];
		sf_config_nodes(&cfg, rank, sc->world, sc->node_of, sc->nnodes, sc->rdzv,
				"recovery secret");
	}
	cfg.register_timeout_ms = sc->register_timeout_ms;
	r = zc_connect(&cfg, &c);
	if (r >= 0) {
		what = "alloc_buffers";
		r = zc_alloc_buffers(c, &tp->plan);
	}
	if (r >= 0) /* the trainer's own initial values: a recovery overwrites them */
		r = sf_begin(c, tp, sc->opt, NULL, sc->seed + 1000 * (uint64_t)sc->restarted,
			     &what);
	if (r >= 0) {
		what = "zc_recovered";
		r = zc_recovered(c, &at);
		if (r >= 0 && sc->restarted)
			atomic_store(&sc->recovered[rank], r == 1 ? (long long)at : -1);
		EXPECT(r == sc->restarted, "rank %u: zc_recovered() %d, want %d", rank, r,
		       sc->restarted);
		EXPECT(r != 1 || zc_iteration(c) == at,
		       "rank %u: zc_iteration() %llu after a recovery at %llu", rank,
		       (unsigned long long)zc_iteration(c), (unsigned long long)at);
	}
	while (r >= 0 && zc_iteration(c) < ITERS) {
		uint64_t t = zc_iteration(c);

		if (sc->armed && rank == sc->victim && sc->phase == BETWEEN_ITERS &&
		    t == (uint64_t)sc->kill_iter)
			die();
		what = "iteration";
		r = one_iteration(c, sc, tp, rank);
		if (r >= 0 && sc->armed)
			atomic_store(&sc->seen[rank], (int)t + 1);
	}
	if (r < 0 && sc->armed && zc_error_recoverable(r)) {
		printf("# rank %u: %s: %s: %s\n", rank, what, zc_strerror_name(r),
		       zc_error_message());
		while (atomic_load(&sc->linger))
			usleep(10 * 1000);
		zc_close(c);
		return EXIT_LOST;
	}
	if (r < 0) {
		atomic_store(&sc->fatal_code[rank], r);
		snprintf(sc->fatal_msg[rank], sizeof(sc->fatal_msg[rank]), "%s",
			 zc_error_message());
		printf("# rank %u: %s: %s: %s\n", rank, what, zc_strerror_name(r),
		       zc_error_message());
		zc_close(c);
		return EXIT_FATAL;
	}
	what = "get_state";
	r = export_snap(c, tp, sc->opt, got);
	EXPECT(r >= 0, "rank %u: export: %s", rank, zc_strerror_name(r));
	if (r >= 0 && sc->want && sc->first_world) {
		/* another world size from the recovered iteration on: the first
		 * size's run up to it, then the new size's */
		want = calloc(1, sizeof(*want));
		snap_init(want, sc->seed);
		ref_train(want, sc->opt, sc->seed, sc->first_world, 0, (int)at);
		ref_train(want, sc->opt, sc->seed, sc->world, (int)at, ITERS);
	}
	if (r >= 0 && want)
		EXPECT(snap_compare(sc->job, got, want, sc->opt) == 0,
		       "rank %u: differs from the uninterrupted run", rank);
	zc_close(c);
	if (want != sc->want)
		free(want);
	free(tp);
	free(got);
	return child_bad;
}

/* Start the world's ranks of sc's round; wait for all; their exits in st. */
static void run_round(struct script *sc, int *st)
{
	pid_t pids[NRANKS];

	for (uint32_t r = 0; r < sc->world; r++)
		pids[r] = spawn(rank_main, sc, (int)r);
	for (uint32_t r = 0; r < sc->world; r++)
		st[r] = wait_child(pids[r], test_timeout(60000));
}

static struct script *script_new(const char *job, uint32_t world, enum zc_optimizer opt,
				 enum zc_shard_mode shard, enum zc_step_mode step)
{
	struct script *sc = test_shared(sizeof(*sc));

	snprintf(sc->job, sizeof(sc->job), "%s", job);
	sc->world = world;
	sc->opt = opt;
	sc->shard = shard;
	sc->step = step;
	sc->seed = 23;
	sc->kill_iter = KILL_ITER;
	sc->armed = true;
	sc->register_timeout_ms = test_timeout(30000);
	sc->want = test_shared(sizeof(*sc->want));
	snap_init(sc->want, sc->seed);
	ref_train(sc->want, opt, sc->seed, world, 0, ITERS);
	return sc;
}

/* Whether sc's job is in one of the states `want` on each of the n zerods. */
static bool jobs_in(const struct script *sc, struct zd *const *zds, uint32_t n, unsigned want)
{
	bool ok = true;

	for (uint32_t k = 0; k < n; k++)
		ok &= zd_wait_job(zds[k], sc->job, want, 10000) == 0;
	return ok;
}

/* sc's round with its death, then the group's restart (of world size
 * `again`, 0: the job's), on the n zerods the job spans. partial: the
 * death must fail the job instead, every survivor's error holding why1 and
 * why2. */
static void kill_then_restart(struct script *sc, struct zd *const *zds, uint32_t n, bool partial,
			      const char *why1, const char *why2, uint32_t again)
{
	const char *job = sc->job;
	uint32_t world = sc->world;
	int st[NRANKS];
	int maxseen = 0;

	run_round(sc, st);
	for (uint32_t r = 0; r < world; r++) {
		if (r == sc->victim) {
			CHECK(st[r] == 128 + SIGKILL, "%s: the victim rank %u ended %d", job, r,
			      st[r]);
			continue;
		}
		if (partial) {
			CHECK(st[r] == EXIT_FATAL && sc->fatal_code[r] == ZC_ERANKDEAD &&
				      strstr(sc->fatal_msg[r], why1) &&
				      strstr(sc->fatal_msg[r], why2),
			      "%s: rank %u ended %d (%s: %s); want ZC_ERANKDEAD, a partly stepped "
			      "interleaved iteration",
			      job, r, st[r], zc_strerror_name(sc->fatal_code[r]), sc->fatal_msg[r]);
			continue;
		}
		CHECK(st[r] == EXIT_LOST, "%s: survivor rank %u ended %d, want ZC_ERANKLOST", job,
		      r, st[r]);
		if (atomic_load(&sc->seen[r]) > maxseen)
			maxseen = atomic_load(&sc->seen[r]);
	}
	if (partial) {
		CHECK(jobs_in(sc, zds, n, ZD_JOB_GONE), "%s: not gone", job);
		return;
	}
	CHECK(jobs_in(sc, zds, n, ZD_JOB_REFORMING), "%s: not re-forming", job);
	sc->armed = false;
	sc->restarted = true;
	if (again && again != world) {
		sc->first_world = world;
		sc->world = world = again;
	}
	run_round(sc, st);
	for (uint32_t r = 0; r < world; r++) {
		long long at = atomic_load(&sc->recovered[r]);
		CHECK(st[r] == 0, "%s: restarted rank %u ended %d", job, r, st[r]);
		CHECK(at == atomic_load(&sc->recovered[0]),
		      "%s: rank %u recovered at %lld, rank 0 "
		      "at %lld",
		      job, r, at, (long long)atomic_load(&sc->recovered[0]));
		CHECK(at >= maxseen && at >= KILL_ITER && at <= KILL_ITER + 1,
		      "%s: rank %u recovered at iteration %lld; some rank saw %d steps", job, r, at,
		      maxseen);
	}
}

/* One death at phase, victim rank, and the group's restart, of world
 * size `again` (0: the job's). d: a zerod with --recovery-journal
 * (journal), else without: there a death between the buckets of an
 * interleaved iteration fails the job. */
static void kill_and_recover_on(struct zd *d, bool journal, uint32_t world, enum zc_optimizer opt,
				enum zc_shard_mode shard, enum zc_step_mode step, enum phase ph,
				uint32_t victim, uint32_t again)
{
	char job[64];
	struct script *sc;
	bool partial = !journal && step == ZC_STEP_INTERLEAVED && ph == BETWEEN;

	snprintf(job, sizeof(job), "rec-%c%c%c-%u-%d-%u-%u", opt == ZC_OPT_SGD ? 's' : 'a',
		 shard == ZC_SHARD_BUCKET ? 'b' : 's', step == ZC_STEP_AT_END ? 'e' : 'i', world,
		 (int)ph, victim, again);
	sc = script_new(job, world, opt, shard, step);
	sc->victim = victim;
	sc->phase = ph;
	if (d != &daemon_)
		sc->sock = d->sock;
	kill_then_restart(sc, &d, 1, partial, "cannot go back", "--recovery-journal", again);
	if (!partial)
		test_note("%s: %s, recovered at iteration %lld%s", job, phase_name[ph],
			  (long long)atomic_load(&sc->recovered[0]),
			  sc->first_world ? ", on another world size" : "");
}

static void kill_and_recover(uint32_t world, enum zc_optimizer opt, enum zc_shard_mode shard,
			     enum zc_step_mode step, enum phase ph, uint32_t victim)
{
	kill_and_recover_on(&daemon_, true, world, opt, shard, step, ph, victim, 0);
}

static void every_phase(uint32_t world, enum zc_optimizer opt, enum zc_shard_mode shard,
			enum zc_step_mode step)
{
	for (int ph = 0; ph < NPHASES; ph++)
		kill_and_recover(world, opt, shard, step, (enum phase)ph,
				 (uint32_t)ph % world); /* rank 0 too */
}

static void t_adam_bucket_atend_w2(void)
{
	every_phase(2, ZC_OPT_ADAM, ZC_SHARD_BUCKET, ZC_STEP_AT_END);
}
static void t_adam_slice_atend_w3(void)
{
	every_phase(3, ZC_OPT_ADAM, ZC_SHARD_SLICE, ZC_STEP_AT_END);
}
static void t_adam_bucket_interleaved_w3(void)
{
	every_phase(3, ZC_OPT_ADAM, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED);
}
static void t_sgd_slice_interleaved_w2(void)
{
	every_phase(2, ZC_OPT_SGD, ZC_SHARD_SLICE, ZC_STEP_INTERLEAVED);
}
static void t_sgd_bucket_atend_w3(void)
{
	every_phase(3, ZC_OPT_SGD, ZC_SHARD_BUCKET, ZC_STEP_AT_END);
}

/* Without --recovery-journal, a death between the buckets of an
 * interleaved iteration fails its job, saying what would have recovered
 * it; the other phases recover as with it. Once the jobs ended, zerod
 * holds nothing of them: the dead trainers' buffers, which the new
 * executor unmaps once it has read them, are gone. */
static void t_no_journal(void)
{
	struct zd own;
	struct zd_status lv;
	char rejoin[16];
	const char *const args[] = {"--rejoin-timeout", rejoin, NULL};
	int r, fds0;
	long shm0;

	snprintf(rejoin, sizeof(rejoin), "%d", test_timeout(REJOIN_MS));
	r = zd_start(&own, args);
	REQUIRE(r == 0, "cannot start zerod: %s", strerror(-r));
	fds0 = zd_fd_count(&own);
	shm0 = zd_status_kb(&own, "RssShmem");
	for (int ph = 0; ph < NPHASES; ph++)
		kill_and_recover_on(&own, false, 2, ZC_OPT_ADAM, ZC_SHARD_SLICE,
				    ZC_STEP_INTERLEAVED, (enum phase)ph, 1, 0);
	for (int ph = 0; ph < NPHASES; ph++) {
		char job[64];

		snprintf(job, sizeof(job), "rec-asi-2-%d-1-0", ph);
		CHECK(zd_wait_job(&own, job, ZD_JOB_GONE, 10000) == 0, "%s stays", job);
	}
	r = zd_ctl_levels(&own, &lv);
	CHECK(r == 0 && lv.jobs == 0 && lv.memory == 0 && lv.sessions == 0,
	      "after: %d jobs, %llu bytes of state, %u sessions", lv.jobs, lv.memory, lv.sessions);
	CHECK(r == 0 && lv.recovered == 3 && lv.recovery_failed == 1,
	      "zerod_recoveries_total: %llu recovered, %llu failed; want 3 and 1", lv.recovered,
	      lv.recovery_failed);
	CHECK(zd_fd_count(&own) == fds0, "zerod had %d fds before the jobs, %d after", fds0,
	      zd_fd_count(&own));
	/* the trainers' buffers zerod mapped (36 kB each): none stays resident */
	test_note("RssShmem %ld kB before the jobs, %ld kB after", shm0,
		  zd_status_kb(&own, "RssShmem"));
	CHECK(shm0 >= 0 && zd_status_kb(&own, "RssShmem") <= shm0 + 32,
	      "zerod holds %ld kB of shared memory more than before the jobs",
	      zd_status_kb(&own, "RssShmem") - shm0);
	CHECK(zd_stop(&own, 5000) == 0, "zerod did not stop cleanly");
}

/* The restarted group brings another bucket layout (and shard mode) of the
 * same parameters: zerod lays the kept state and the parameters out again
 * for it, and the job ends at the reference bit for bit. */
static void t_other_layout(void)
{
	struct script *sc =
		script_new("rec-layout", 3, ZC_OPT_ADAM, ZC_SHARD_SLICE, ZC_STEP_AT_END);
	int st[NRANKS];

	sc->ids = true; /* another order of the parameters: matched by id */
	sc->victim = 2;
	sc->phase = BETWEEN;
	run_round(sc, st);
	CHECK(st[2] == 128 + SIGKILL && st[0] == EXIT_LOST && st[1] == EXIT_LOST,
	      "first run: %d %d %d", st[0], st[1], st[2]);
	CHECK(zd_wait_job(&daemon_, sc->job, ZD_JOB_REFORMING, 10000) == 0, "not re-forming");
	sc->armed = false;
	sc->restarted = true;
	sc->restart_layout = &layout4;
	sc->shard = ZC_SHARD_BUCKET;
	run_round(sc, st);
	CHECK(st[0] == 0 && st[1] == 0 && st[2] == 0, "restarted with layout 4: %d %d %d", st[0],
	      st[1], st[2]);
	CHECK(atomic_load(&sc->recovered[0]) == KILL_ITER, "recovered at %lld",
	      (long long)atomic_load(&sc->recovered[0]));
}

/* The restarted group brings another world size, larger or smaller, at
 * every phase: zerod shards the kept state again for it (reform_resize),
 * and the job ends bit for bit at the reference of the first size's run to
 * the recovered iteration and the new size's after it. */
static void t_world_grows(void)
{
	for (int ph = 0; ph < NPHASES; ph++)
		kill_and_recover_on(&daemon_, true, 2, ZC_OPT_ADAM, ZC_SHARD_SLICE,
				    ZC_STEP_INTERLEAVED, (enum phase)ph, (uint32_t)ph % 2, 3);
}
static void t_world_shrinks(void)
{
	for (int ph = 0; ph < NPHASES; ph++)
		kill_and_recover_on(&daemon_, true, 3, ZC_OPT_SGD, ZC_SHARD_BUCKET, ZC_STEP_AT_END,
				    (enum phase)ph, (uint32_t)ph % 3, 2);
}

/* The restarted group's world size is its first rank's: an old survivor
 * still connected (told ZC_ERANKLOST, detached) does not hold it back, a
 * rank of the restarted group that says another size is refused with
 * ZC_EWORLD naming both, and the group of the new size recovers. */
static void t_world_mixed(void)
{
	struct script *sc =
		script_new("rec-world-mixed", 2, ZC_OPT_ADAM, ZC_SHARD_BUCKET, ZC_STEP_AT_END);
	struct zc_config c3 = test_config(&daemon_, sc->job, 2, 3);
	struct zc_config c2 = test_config(&daemon_, sc->job, 1, 2);
	zc_client *a = NULL, *b = NULL;
	pid_t pids[2];
	int st[NRANKS], r;

	sc->victim = 1;
	sc->phase = BETWEEN;
	atomic_store(&sc->linger, 1);
	for (uint32_t k = 0; k < 2; k++)
		pids[k] = spawn(rank_main, sc, (int)k);
	st[1] = wait_child(pids[1], test_timeout(30000));
	CHECK(st[1] == 128 + SIGKILL, "the victim ended %d", st[1]);
	CHECK(zd_wait_job(&daemon_, sc->job, ZD_JOB_REFORMING, 10000) == 0, "not re-forming");
	r = zc_connect(&c3, &a);
	CHECK(r == 0, "rank 2 of 3 beside the old group's rank 0: %s: %s", zc_strerror_name(r),
	      zc_error_message());
	r = zc_connect(&c2, &b);
	CHECK(r == ZC_EWORLD && strstr(zc_error_message(), "world size 3, rank 1 says 2"),
	      "rank 1 of 2 after rank 2 of 3: %s: %s", zc_strerror_name(r), zc_error_message());
	if (r >= 0)
		zc_close(b);
	zc_close(a); /* it leaves unregistered: the job waits for a group of 3 */
	atomic_store(&sc->linger, 0);
	st[0] = wait_child(pids[0], test_timeout(30000));
	CHECK(st[0] == EXIT_LOST, "the survivor ended %d", st[0]);
	sc->armed = false;
	sc->restarted = true;
	sc->first_world = 2;
	sc->world = 3;
	run_round(sc, st);
	CHECK(st[0] == 0 && st[1] == 0 && st[2] == 0, "restarted with 3 ranks: %d %d %d", st[0],
	      st[1], st[2]);
	CHECK(atomic_load(&sc->recovered[2]) == KILL_ITER, "recovered at %lld",
	      (long long)atomic_load(&sc->recovered[2]));
}

/* Twice in one run: the recovered job loses a trainer again. */
static void t_killed_twice(void)
{
	struct script *sc = script_new("rec-twice", 2, ZC_OPT_ADAM, ZC_SHARD_SLICE, ZC_STEP_AT_END);
	int st[NRANKS];

	sc->victim = 1;
	sc->phase = BETWEEN;
	run_round(sc, st);
	CHECK(st[0] == EXIT_LOST && st[1] == 128 + SIGKILL, "first run: %d %d", st[0], st[1]);
	CHECK(zd_wait_job(&daemon_, sc->job, ZD_JOB_REFORMING, 10000) == 0, "not re-forming");
	/* the restart is recovered, and dies again: rank 0, two iterations on */
	sc->restarted = true;
	sc->victim = 0;
	sc->phase = BEFORE_FIRST;
	sc->kill_iter = KILL_ITER + 2;
	run_round(sc, st);
	CHECK(st[0] == 128 + SIGKILL && st[1] == EXIT_LOST, "second run: %d %d", st[0], st[1]);
	CHECK(atomic_load(&sc->recovered[1]) == KILL_ITER, "the first recovery at %lld",
	      (long long)atomic_load(&sc->recovered[1]));
	CHECK(zd_wait_job(&daemon_, sc->job, ZD_JOB_REFORMING, 10000) == 0, "not re-forming");
	sc->armed = false;
	run_round(sc, st);
	CHECK(st[0] == 0 && st[1] == 0, "third run: %d %d", st[0], st[1]);
	CHECK(atomic_load(&sc->recovered[0]) == KILL_ITER + 2, "the second recovery at %lld",
	      (long long)atomic_load(&sc->recovered[0]));
}

/* sc's 3 ranks, rank 2 killed between its buckets, then the group's
 * restart without rank 2: the others are told ZC_ERANKLOST, then, once
 * --rejoin-timeout passed, ZC_ERANKDEAD naming rank 2. */
static void never_back_rounds(struct script *sc)
{
	int st[NRANKS];
	pid_t pids[NRANKS];

	sc->victim = 2;
	sc->phase = BETWEEN;
	run_round(sc, st);
	CHECK(st[2] == 128 + SIGKILL && st[0] == EXIT_LOST && st[1] == EXIT_LOST,
	      "round 0: %d %d %d", st[0], st[1], st[2]);
	sc->armed = false;
	sc->restarted = true;
	for (uint32_t k = 0; k < 2; k++) /* rank 2 stays dead */
		pids[k] = spawn(rank_main, sc, (int)k);
	for (uint32_t k = 0; k < 2; k++) {
		st[k] = wait_child(pids[k], test_timeout(30000));
		CHECK(st[k] == EXIT_FATAL && sc->fatal_code[k] == ZC_ERANKDEAD &&
			      strstr(sc->fatal_msg[k], "rank 2 missing") &&
			      strstr(sc->fatal_msg[k], "--rejoin-timeout"),
		      "rank %u ended %d (%s: %s), want ZC_ERANKDEAD naming rank 2", k, st[k],
		      zc_strerror_name(sc->fatal_code[k]), sc->fatal_msg[k]);
	}
}

/* A rank that never comes back: the job fails after --rejoin-timeout,
 * naming it, and nothing of it stays. */
static void t_never_back(void)
{
	struct zd own;
	const char *const args[] = {"--rejoin-timeout", "1500", NULL};
	struct script *sc = script_new("rec-never", 3, ZC_OPT_ADAM, ZC_SHARD_SLICE, ZC_STEP_AT_END);
	struct zd_status lv;
	int fds0, fds1;
	int r = zd_start(&own, args);

	REQUIRE(r == 0, "cannot start zerod: %s", strerror(-r));
	sc->sock = own.sock;
	fds0 = zd_fd_count(&own);
	never_back_rounds(sc);
	CHECK(zd_wait_job(&own, sc->job, ZD_JOB_GONE, 10000) == 0, "the job stays");
	r = zd_ctl_levels(&own, &lv);
	CHECK(r == 0 && lv.jobs == 0 && lv.memory == 0 && lv.sessions == 0,
	      "after: %d jobs, %llu bytes of state, %u sessions", lv.jobs, lv.memory, lv.sessions);
	CHECK(r == 0 && lv.recovered == 0 && lv.recovery_failed == 1,
	      "zerod_recoveries_total: %llu recovered, %llu failed; want 0 and 1", lv.recovered,
	      lv.recovery_failed);
	fds1 = zd_fd_count(&own);
	CHECK(fds1 == fds0, "zerod had %d fds before the job, %d after", fds0, fds1);
	CHECK(zd_stop(&own, 5000) == 0, "zerod did not stop cleanly");
}

/* A job beside the re-forming one trains on to its reference. */
static void t_beside(void)
{
	struct script *a =
		script_new("rec-beside-a", 2, ZC_OPT_ADAM, ZC_SHARD_BUCKET, ZC_STEP_AT_END);
	struct script *b =
		script_new("rec-beside-b", 2, ZC_OPT_SGD, ZC_SHARD_SLICE, ZC_STEP_INTERLEAVED);
	int st[NRANKS], stb[NRANKS];
	pid_t pb[2];

	a->victim = 0;
	a->phase = DURING_STEP;
	b->armed = false; /* nobody dies */
	for (uint32_t k = 0; k < 2; k++)
		pb[k] = spawn(rank_main, b, (int)k);
	run_round(a, st);
	CHECK(st[0] == 128 + SIGKILL && st[1] == EXIT_LOST, "a: %d %d", st[0], st[1]);
	for (uint32_t k = 0; k < 2; k++) {
		stb[k] = wait_child(pb[k], test_timeout(60000));
		CHECK(stb[k] == 0, "the job beside: rank %u ended %d", k, stb[k]);
	}
	a->armed = false;
	a->restarted = true;
	run_round(a, st);
	CHECK(st[0] == 0 && st[1] == 0, "a restarted: %d %d", st[0], st[1]);
}

/* ------------------------------------------- over two nodes (gloo) --- */

/* Two zerods on loopback, the jobs' rendezvous on node 0's. A trainer of a
 * job over both dies: its node tells the other through the rendezvous
 * (RdzvReform, reform.c), every node finishes the iterations before the
 * boundary and stops there, the whole group restarts (as torchrun's agents
 * restart every node's workers), and the job goes on on both nodes from
 * zerod's memory, bit for bit at the uninterrupted reference. */
static struct zd nodes_[2];

static void nodes_stop(void)
{
	for (uint32_t k = 0; k < 2; k++) {
		if (test_failed_) {
			printf("# ---- node %u ----\n", k);
			zd_dump_log(&nodes_[k]);
		}
		CHECK(zd_stop(&nodes_[k], 10000) == 0, "node %u's zerod did not stop cleanly", k);
	}
}

/* How the two zerods run. NODES_TLS: both hold one TLS identity (`zeroctl
 * keygen`; a zerod trusts its own certificate), so the tensors between them
 * cross the TLS mesh (coll/sealmesh.c) and its connections are made again
 * for the restart. NODES_JOURNAL: --recovery-journal, so a death between
 * the buckets of an interleaved iteration recovers too. */
enum { NODES_TLS = 1, NODES_JOURNAL = 2 };
static char keydir[] = "/tmp/zerod-recovery-keys.XXXXXX", key[64], crt[64], peers[64];

static void nodes_start_mode(const char *rejoin_ms, unsigned mode)
{
	const char *dir = keydir;
	const char *args[16] = {"--workers", "2", "--rejoin-timeout", rejoin_ms};
	int a = 4;

	if (mode & NODES_JOURNAL)
		args[a++] = "--recovery-journal";
	if (mode & NODES_TLS) {
		args[a++] = "--tls-key", args[a++] = key;
		args[a++] = "--tls-cert", args[a++] = crt;
		args[a++] = "--tls-peers", args[a++] = peers;
	}
	if (mode & NODES_TLS) {
		const char *bin = getenv("ZEROCTL_BIN");
		char cmd[256];

		REQUIRE(bin && mkdtemp(keydir), "no $ZEROCTL_BIN or no key directory");
		snprintf(key, sizeof(key), "%s/node.key", dir);
		snprintf(crt, sizeof(crt), "%s/node.crt", dir);
		snprintf(peers, sizeof(peers), "%s/node.peers", dir);
		snprintf(cmd, sizeof(cmd), "'%s' keygen %s/node > %s", bin, dir, peers);
		REQUIRE(system(cmd) == 0, "zeroctl keygen failed");
	}
	for (uint32_t k = 0; k < 2; k++)
		REQUIRE(zd_start(&nodes_[k], args) == 0, "cannot start node %u's zerod", k);
}

static struct script *nodes_script(const char *job, uint32_t world, const uint32_t *node_of,
				   enum zc_optimizer opt, enum zc_shard_mode shard,
				   enum zc_step_mode step)
{
	struct script *sc = script_new(job, world, opt, shard, step);

	sc->nnodes = 2;
	memcpy(sc->node_of, node_of, world * sizeof(*node_of));
	for (uint32_t k = 0; k < 2; k++)
		sc->socks[k] = nodes_[k].sock;
	snprintf(sc->rdzv, sizeof(sc->rdzv), "127.0.0.1:%d", zd_free_port());
	return sc;
}

/* Once the cases' jobs are gone: neither zerod holds a job, state, session
 * or fd of them (fds0: each one's before), and each counted `recovered`
 * recoveries and failed[k] failed ones (zerod_recoveries_total: counted
 * where the failure was decided, the victim's node). */
static void nodes_levels(const int *fds0, unsigned long long recovered,
			 const unsigned long long *failed)
{
	struct zd_status lv;

	for (uint32_t k = 0; k < 2; k++) {
		int r = zd_ctl_levels(&nodes_[k], &lv);

		CHECK(r == 0 && lv.jobs == 0 && lv.memory == 0 && lv.sessions == 0,
		      "node %u after: %d jobs, %llu bytes of state, %u sessions", k, lv.jobs,
		      lv.memory, lv.sessions);
		CHECK(r == 0 && lv.recovered == recovered && lv.recovery_failed == failed[k],
		      "node %u: zerod_recoveries_total: %llu recovered, %llu failed; want %llu and "
		      "%llu",
		      k, lv.recovered, lv.recovery_failed, recovered, failed[k]);
		/* the rendezvous's connections close a moment after a job went */
		for (int i = 0; i < 100 && zd_fd_count(&nodes_[k]) != fds0[k]; i++)
			usleep(20000);
		CHECK(zd_fd_count(&nodes_[k]) == fds0[k],
		      "node %u's zerod had %d fds before the jobs, %d after", k, fds0[k],
		      zd_fd_count(&nodes_[k]));
	}
}

/* One death over the two nodes at phase ph, of rank victim, then the
 * group's restart. A death between the buckets of an interleaved
 * iteration (some stepped on every node) goes back through every node's
 * journal; without one (partial) it fails the job on both nodes with
 * ZC_ERANKDEAD saying why. */
static void nodes_kill_and_recover(bool partial, uint32_t world, const uint32_t *node_of,
				   enum zc_optimizer opt, enum zc_shard_mode shard,
				   enum zc_step_mode step, enum phase ph, uint32_t victim)
{
	struct zd *const zds[] = {&nodes_[0], &nodes_[1]};
	char job[64];
	struct script *sc;

	snprintf(job, sizeof(job), "recn-%c%c%c-%u-%d-%u", opt == ZC_OPT_SGD ? 's' : 'a',
		 shard == ZC_SHARD_BUCKET ? 'b' : 's', step == ZC_STEP_AT_END ? 'e' : 'i', world,
		 (int)ph, victim);
	sc = nodes_script(job, world, node_of, opt, shard, step);
	sc->victim = victim;
	sc->phase = ph;
	kill_then_restart(sc, zds, 2, partial, "on every node", "--recovery-journal", 0);
	if (partial)
		return;
	CHECK(jobs_in(sc, zds, 2, ZD_JOB_GONE), "%s: not gone on both nodes after it ended", job);
	test_note("%s: %s, victim rank %u on node %u, recovered at iteration %lld", job,
		  phase_name[ph], victim, node_of[victim],
		  (long long)atomic_load(&sc->recovered[0]));
}

static void nodes_every_phase_on(unsigned mode, uint32_t world, const uint32_t *node_of,
				 enum zc_optimizer opt, enum zc_shard_mode shard,
				 enum zc_step_mode step)
{
	bool tls = mode & NODES_TLS;
	char rejoin[16];
	int fds0[2];
	unsigned long long recovered = 0, failed[2] = {0, 0};

	snprintf(rejoin, sizeof(rejoin), "%d", test_timeout(REJOIN_MS));
	nodes_start_mode(rejoin, mode);
	for (uint32_t k = 0; k < 2; k++)
		fds0[k] = zd_fd_count(&nodes_[k]);
	for (int ph = 0; ph < NPHASES; ph++) { /* the host's ranks die too */
		bool partial =
			!(mode & NODES_JOURNAL) && step == ZC_STEP_INTERLEAVED && ph == BETWEEN;
		nodes_kill_and_recover(partial, world, node_of, opt, shard, step, (enum phase)ph,
				       (uint32_t)(ph + 1) % world);
		recovered += !partial;
		failed[node_of[(ph + 1) % world]] += partial;
	}
	nodes_levels(fds0, recovered, failed);
	for (uint32_t k = 0; tls && k < 2; k++)
		CHECK(zd_log_has(&nodes_[k], "tensors between nodes over TLS 1.3") &&
			      !zd_log_has(&nodes_[k], "over gloo (not encrypted)"),
		      "node %u's jobs did not run over the TLS mesh", k);
	nodes_stop();
	if (tls) {
		unlink(key), unlink(crt), unlink(peers);
		rmdir(keydir);
	}
}

static void nodes_every_phase(uint32_t world, const uint32_t *node_of, enum zc_optimizer opt,
			      enum zc_shard_mode shard, enum zc_step_mode step)
{
	nodes_every_phase_on(NODES_JOURNAL, world, node_of, opt, shard, step);
}

static void t_nodes_tls_adam_slice_interleaved_w3(void)
{
	static const uint32_t node_of[] = {0, 1, 1};

	nodes_every_phase_on(NODES_TLS | NODES_JOURNAL, 3, node_of, ZC_OPT_ADAM, ZC_SHARD_SLICE,
			     ZC_STEP_INTERLEAVED);
}

/* Without --recovery-journal: the death between an interleaved iteration's
 * buckets fails the job on both nodes, named; the other phases recover. */
static void t_nodes_no_journal(void)
{
	static const uint32_t node_of[] = {0, 1};

	nodes_every_phase_on(0, 2, node_of, ZC_OPT_ADAM, ZC_SHARD_SLICE, ZC_STEP_INTERLEAVED);
}

static void t_nodes_adam_slice_atend_w3(void)
{
	static const uint32_t node_of[] = {0, 1, 1};

	nodes_every_phase(3, node_of, ZC_OPT_ADAM, ZC_SHARD_SLICE, ZC_STEP_AT_END);
}

static void t_nodes_sgd_bucket_interleaved_w2(void)
{
	static const uint32_t node_of[] = {0, 1};

	nodes_every_phase(2, node_of, ZC_OPT_SGD, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED);
}

static void t_nodes_adam_bucket_atend_w3(void)
{
	static const uint32_t node_of[] = {0, 0, 1};

	nodes_every_phase(3, node_of, ZC_OPT_ADAM, ZC_SHARD_BUCKET, ZC_STEP_AT_END);
}

/* Over two nodes, a rank of node 1 never comes back: node 1's job fails
 * after --rejoin-timeout naming it, node 0's hears it through the
 * rendezvous, every restarted rank on both nodes gets that ZC_ERANKDEAD,
 * and neither zerod keeps a job, state, session or fd of it. */
static void t_nodes_never_back(void)
{
	static const uint32_t node_of[] = {0, 1, 1};
	struct script *sc;
	int fds0[2];

	nodes_start_mode("1500", 0);
	sc = nodes_script("recn-never", 3, node_of, ZC_OPT_ADAM, ZC_SHARD_SLICE, ZC_STEP_AT_END);
	for (uint32_t k = 0; k < 2; k++)
		fds0[k] = zd_fd_count(&nodes_[k]);
	never_back_rounds(sc);
	CHECK(jobs_in(sc, (struct zd *const[]){&nodes_[0], &nodes_[1]}, 2, ZD_JOB_GONE),
	      "the job stays on a node");
	nodes_levels(fds0, 0, (const unsigned long long[]){0, 1}); /* node 1 decided */
	nodes_stop();
}

static const struct test_case node_cases[] = {
	{"nodes_killed_adam_slice_at_end_w3", t_nodes_adam_slice_atend_w3, 180000},
	{"nodes_killed_sgd_bucket_interleaved_w2", t_nodes_sgd_bucket_interleaved_w2, 180000},
	{"nodes_killed_adam_bucket_at_end_w3", t_nodes_adam_bucket_atend_w3, 180000},
	{"nodes_tls_killed_adam_slice_interleaved_w3", t_nodes_tls_adam_slice_interleaved_w3,
	 180000},
	{"nodes_interleaved_cut_without_journal_fails_named", t_nodes_no_journal, 180000},
	{"nodes_never_back_fails_named_and_frees", t_nodes_never_back, 120000},
};

static const struct test_case cases[] = {
	{"killed_adam_bucket_at_end_w2", t_adam_bucket_atend_w2, 120000},
	{"killed_adam_slice_at_end_w3", t_adam_slice_atend_w3, 120000},
	{"killed_adam_bucket_interleaved_w3", t_adam_bucket_interleaved_w3, 120000},
	{"killed_sgd_slice_interleaved_w2", t_sgd_slice_interleaved_w2, 120000},
	{"killed_sgd_bucket_at_end_w3", t_sgd_bucket_atend_w3, 120000},
	{"interleaved_cut_without_journal_fails_named", t_no_journal, 120000},
	{"killed_twice", t_killed_twice, 120000},
	{"restart_with_another_layout_and_shard_mode", t_other_layout, 120000},
	{"restart_with_more_ranks_w2_to_w3", t_world_grows, 120000},
	{"restart_with_fewer_ranks_w3_to_w2", t_world_shrinks, 120000},
	{"restarted_group_of_mixed_world_sizes_refused", t_world_mixed, 120000},
	{"never_back_fails_named_and_frees", t_never_back, 120000},
	{"job_beside_trains_on", t_beside, 120000},
};

int main(int argc, char **argv)
{
	char rejoin[16];
	const char *const extra[] = {"--rejoin-timeout", rejoin, "--recovery-journal", NULL};

	snprintf(rejoin, sizeof(rejoin), "%d", test_timeout(REJOIN_MS));
	/* TEST_RECOVERY_NODES=1: the cases over two zerods (they need gloo) */
	if (getenv("TEST_RECOVERY_NODES"))
		return zd_test_main(&daemon_, extra, node_cases,
				    sizeof(node_cases) / sizeof(node_cases[0]), argc, argv);
	return zd_test_main(&daemon_, extra, cases, sizeof(cases) / sizeof(cases[0]), argc, argv);
}
