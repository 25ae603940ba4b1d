/*
 * test_ckpt.c — checkpoints on disk (zc_checkpoint, zc_restore) and daemon
 * crashes (issue 11 §1, §2), against real zerods and real trainer processes.
 *
 *  - crash_*: a job trains, checkpointing every CKPT_EVERY iterations; the
 *    test SIGKILLs a zerod mid-training and starts it again on the same
 *    socket; the trainers see their calls fail, reconnect, restore the last
 *    checkpoint and train on. Their final parameters and state equal an
 *    uninterrupted run's (the reference, which the daemons equal bit for
 *    bit, tests/integration/test_state.c) bit for bit, SGD and Adam. On one
 *    zerod, and on two (the job over two nodes; node 1's zerod is killed).
 *  - restore_*: a checkpoint restored onto another world size, shard mode,
 *    step mode, bucket layout and node count trains on like the reference.
 *  - bad_*: a corrupt, partial, truncated or mismatched checkpoint, or a
 *    FIFO or a link to one for its manifest or data file, is refused at once
 *    with ZC_ECKPT naming what is wrong; the job keeps its state and trains
 *    on to the reference, and a job beside it trains on.
 *  - killed_while_writing_*: the writer or its zerod killed at random
 *    points of a checkpoint; every restore loads the previous checkpoint or
 *    the new one, whole (issue 20 §5).
 *
 * The job's parameters and the reference are test_state.c's (one copy of
 * its model here: NP tensors, gradients a function of rank, iteration,
 * parameter and element, never of the layout).
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "refoptim.h"
#include "statefix.h"
#include "testlib.h"
#include "trainer.h"

#define CKPT_EVERY 3
#define ITERS      12
#define KILL_AFTER 8 /* iterations rank 0 completed when the zerod is killed */

static struct zd daemon_;

/* statefix.h's job; layout 3 lacks parameter 5 (another model) */
static const struct layout layouts[] = {
	{3, {{0, 1, -1}, {2, -1}, {3, 4, 5, -1}}},
	{4, {{5, 3, -1}, {4, 2, -1}, {1, -1}, {0, -1}}},
	{1, {{2, 0, 4, 1, 5, 3, -1}}},
	{2, {{0, 1, 2, -1}, {3, 4, -1}}}, /* param 5 missing: another model */
};

/* ------------------------------------------------------ generations --- */

/* The directory dir's current checkpoint is in (docs/CHECKPOINT.md,
 * "Generations"): its newest dir/ckpt-SEQ, or dir itself (the older
 * single-generation layout), into out. */
static const char *ckpt_gen(const char *dir, char *out, size_t len)
{
	unsigned long long best = 0, v;
	DIR *d = opendir(dir);
	struct dirent *e;

	snprintf(out, len, "%s", dir);
	while (d && (e = readdir(d)))
		if (sscanf(e->d_name, "ckpt-%llu", &v) == 1 && v > best) {
			best = v;
			snprintf(out, len, "%s/%s", dir, e->d_name);
		}
	if (d)
		closedir(d);
	return out;
}

/* -------------------------------------------------------------- a rank --- */

struct script {
	char job[64];
	uint32_t world;
	enum zc_optimizer opt;
	enum zc_shard_mode shard;
	enum zc_step_mode step;
	int layout;
	bool ids;
	uint64_t seed;
	int iters;             /* train until the job's iteration reaches this */
	int ckpt_every;        /* 0: never */
	char dir[256];         /* checkpoints */
	bool restore;          /* restore from dir before training */
	uint64_t restore_at;   /* the iteration zc_iteration() must say after it */
	struct snap *want;     /* the export at the end must equal it */
	atomic_int done;       /* iterations rank 0 completed */
	atomic_int reconnects; /* restores after a crash, all ranks */
	bool crash;            /* rank 0 waits after KILL_AFTER iterations until killed */
	bool poll_due;         /* zc_checkpoint_due() between iterations (zeroctl) */
	int sleep_ms;          /* per iteration: a job that lasts while zeroctl asks */
	atomic_int due_at[8];  /* the iteration each rank checkpointed at when asked */
	atomic_int killed;
	int ckpt_late_rank1;   /* rank ckpt_late_rank1 - 1 comes to its checkpoints late */
	int replan_at; /* > 0: before this iteration, re-plan to replan_layout */
	int replan_layout;
	uint32_t nnodes;
	uint32_t node_of[8];
	char socks[3][192];
	char rdzv[32];
};

static struct zc_config script_config(const struct script *sc, uint32_t rank)
{
	struct zc_config cfg = test_config(&daemon_, sc->job, rank, sc->world);

	cfg.register_timeout_ms = test_timeout(20000);
	cfg.connect_timeout_ms = 1000;
	if (sc->nnodes < 2) {
		if (sc->socks[0][0]) /* the case's own zerod */
			cfg.socket = sc->socks[0];
		return cfg;
	}
	cfg.socket = sc->socks[sc->node_of[rank]];
	sf_config_nodes(&cfg, rank, sc->world, sc->node_of, sc->nnodes, sc->rdzv, "ckpt secret");
	return cfg;
}

static void fill_params(zc_client *c, const struct tplan *tp, const struct snap *from)
{
	for (int k = 0; k < NP; k++)
		memcpy(zc_param_buffer(c, tp->bucket_of[k]) +
			       tp->segs[tp->bucket_of[k]][tp->seg_of[k]].offset,
		       from->p + param_base(k), params[k].numel * sizeof(float));
}

static int one_iteration(zc_client *c, const struct script *sc, const struct tplan *tp,
			 uint32_t rank)
{
	zc_future *step = NULL;
	uint64_t t = zc_iteration(c);
	int r;

	for (int k = 0; k < NP; k++) {
		float *gb = zc_grad_buffer(c, tp->bucket_of[k]) +
			    tp->segs[tp->bucket_of[k]][tp->seg_of[k]].offset;
		for (uint64_t i = 0; i < params[k].numel; i++)
			gb[i] = grad_value(sc->seed, rank, (int)t, k, i);
	}
	for (uint32_t b = 0; b < tp->plan.nbuckets; b++)
		if ((r = zc_bucket_ready(c, b, NULL)) < 0)
			return r;
	r = zc_step_future(c, t, &step);
	if (r >= 0)
		r = zc_future_wait(step, test_timeout(20000));
	if (r == 0)
		r = ZC_ETIMEDOUT;
	zc_future_free(step);
	return r < 0 ? r : 0;
}

/* Connect, make buffers (the initial parameters in them), register. */
static int setup(const struct script *sc, uint32_t rank, const struct tplan *tp, zc_client **ret,
		 const char **what)
{
	struct zc_config cfg = script_config(sc, rank);
	struct snap *init = calloc(1, sizeof(*init));
	zc_client *c = NULL;
	int r;

	*what = "connect";
	r = zc_connect(&cfg, &c);
	if (r >= 0) {
		*what = "alloc_buffers";
		r = zc_alloc_buffers(c, &tp->plan);
	}
	if (r >= 0) {
		snap_init(init, sc->seed);
		fill_params(c, tp, init);
		*what = "register_plan";
		r = zc_register_plan(c);
	}
	free(init);
	if (r < 0) {
		zc_close(c);
		return r;
	}
	*ret = c;
	return 0;
}

static int restore(zc_client *c, const struct script *sc, uint32_t rank, uint64_t want_iter)
{
	int r = zc_restore(c, sc->dir);

	if (r < 0)
		return r;
	(void)sc;
	EXPECT(zc_iteration(c) == want_iter,
	       "rank %u: after the restore at iteration %llu, want %llu", rank,
	       (unsigned long long)zc_iteration(c), (unsigned long long)want_iter);
	return 0;
}

/* DDP's re-plan between iterations: new buffers of sc->replan_layout,
 * *tp replaced by its plan. */
static int replan(zc_client *c, const struct script *sc, struct tplan **tp)
{
	struct tplan *to = calloc(1, sizeof(*to));
	int r;

	if (!to)
		return -ENOMEM;
	make_plan(to, &layouts[sc->replan_layout], sc->opt, sc->shard, sc->step, sc->ids);
	r = zc_alloc_buffers(c, &to->plan);
	if (r >= 0)
		r = zc_register_plan(c);
	if (r < 0) {
		free(to);
		return r;
	}
	free(*tp);
	*tp = to;
	return 0;
}

static int rank_main(void *arg, int idx)
{
	struct script *sc = arg;
	uint32_t rank = (uint32_t)idx;
	struct tplan *tp = calloc(1, sizeof(*tp));
	struct snap *got = calloc(1, sizeof(*got));
	zc_client *c = NULL;
	const char *what = "setup";
	int64_t deadline = test_ms() + test_timeout(60000);
	int r, last_ckpt = -1;

	make_plan(tp, &layouts[sc->layout], sc->opt, sc->shard, sc->step, sc->ids);
	r = setup(sc, rank, tp, &c, &what);
	if (r >= 0 && sc->restore) {
		what = "restore";
		r = restore(c, sc, rank, sc->restore_at);
	}
	while (r >= 0 && (int)zc_iteration(c) < sc->iters) {
		uint64_t t = zc_iteration(c);
		char due[512];
		if (sc->poll_due && (r = zc_checkpoint_due(c, due, sizeof(due))) == 1) {
			what = "checkpoint asked by zeroctl";
			r = zc_checkpoint(c, due);
			if (r >= 0)
				atomic_store(&sc->due_at[rank], (int)t);
		}
		if (r < 0)
			break;
		if (sc->sleep_ms)
			usleep((useconds_t)sc->sleep_ms * 1000);
		if (sc->replan_at > 0 && t == (uint64_t)sc->replan_at) {
			what = "re-plan";
			r = replan(c, sc, &tp);
			if (r < 0)
				break;
		}
		what = "iteration";
		r = one_iteration(c, sc, tp, rank);
		if (r >= 0 && sc->ckpt_every && (t + 1) % (uint64_t)sc->ckpt_every == 0) {
			what = "checkpoint";
			if (sc->ckpt_late_rank1 == (int)rank + 1)
				usleep((useconds_t)test_timeout(700) * 1000);
			r = zc_checkpoint(c, sc->dir);
			if (r >= 0)
				last_ckpt = (int)t + 1;
		}
		if (r >= 0 && rank == 0)
			atomic_store(&sc->done, (int)t + 1);
		if (r >= 0 && rank == 0 && sc->crash && t + 1 == KILL_AFTER) {
			/* the checkpoint restored after the crash is durable
			 * before the zerod dies (rank 0 writes it, off the
			 * training path) */
			what = "waiting for the checkpoint";
			r = zc_checkpoint_wait(c, -1);
			if (r < 0)
				break;
			/* the others are in iteration KILL_AFTER, waiting for
			 * this rank's buckets, when the zerod dies */
			while (!atomic_load(&sc->killed) && test_ms() < deadline)
				usleep(1000);
		}
		if (r == ZC_ECONNECT || r == ZC_EJOBFAILED || r == ZC_ERANKDEAD ||
		    r == ZC_ETIMEDOUT) {
			/* the daemon (ours or another node's) is gone: connect
			 * again, as often as it takes, and go on from the last
			 * checkpoint */
			printf("# rank %u: %s at iteration %llu: %s: %s; reconnecting\n", rank,
			       what, (unsigned long long)t, zc_strerror_name(r),
			       zc_error_message());
			zc_close(c);
			c = NULL;
			do {
				if (test_ms() > deadline)
					break;
				usleep(20000);
				r = setup(sc, rank, tp, &c, &what);
			} while (r == ZC_ECONNECT || r == -ECONNREFUSED || r == -ENOENT ||
				 r == ZC_EDUPRANK || r == ZC_ETIMEDOUT || r == ZC_EJOBFAILED ||
				 r == ZC_ERANKDEAD);
			if (r >= 0) {
				what = "restore after the crash";
				r = restore(c, sc, rank, (uint64_t)last_ckpt);
				atomic_fetch_add(&sc->reconnects, 1);
			}
		}
	}
	if (r >= 0) {
		what = "get_state";
		r = export_snap(c, tp, sc->opt, got);
	}
	if (r < 0)
		EXPECT(0, "%s rank %u: %s: %s: %s", sc->job, rank, what, zc_strerror_name(r),
		       zc_error_message());
	else if (sc->want)
		EXPECT(snap_compare(sc->job, got, sc->want, sc->opt) == 0,
		       "rank %u: differs from the "
		       "reference",
		       rank);
	zc_close(c);
	free(tp);
	free(got);
	return child_bad;
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
	sc->seed = 7;
	snprintf(sc->dir, sizeof(sc->dir), "%s/ckpt-%s", daemon_.dir, job);
	return sc;
}

static void spawn_all(struct script *sc, pid_t *pids)
{
	for (uint32_t r = 0; r < sc->world; r++)
		pids[r] = spawn(rank_main, sc, (int)r);
}

static void wait_all(struct script *sc, const pid_t *pids)
{
	for (uint32_t r = 0; r < sc->world; r++) {
		int st = wait_child(pids[r], test_timeout(90000));
		CHECK(st == 0, "%s rank %u exited with %d", sc->job, r, st);
	}
}

static void run_script(struct script *sc)
{
	pid_t pids[8];

	spawn_all(sc, pids);
	wait_all(sc, pids);
	if (test_failed_)
		zd_dump_log(&daemon_);
}

/* ------------------------------------------------- crash and restart --- */

/* Is someone listening on the unix socket at path? */
static bool listening(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	bool ok;

	if (strlen(path) >= sizeof(sa.sun_path)) {
		if (fd >= 0)
			close(fd);
		return access(path, F_OK) == 0;
	}
	memcpy(sa.sun_path, path, strlen(path) + 1);
	ok = fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
	if (fd >= 0)
		close(fd);
	return ok;
}

/* SIGKILL d's zerod and start a new one on the same socket (and directory,
 * its log appended), with args: 0 or -errno. */
static int crash_and_restart(struct zd *d, const char *const *args, atomic_int *killed)
{
	const char *bin = getenv("ZEROD_BIN");
	const char *argv[16];
	int n = 0;
	pid_t parent = getpid();
	int64_t deadline;

	if (kill(d->pid, SIGKILL) < 0)
		return -errno;
	if (waitpid(d->pid, NULL, 0) < 0)
		return -errno;
	*killed = 1;
	argv[n++] = "--socket";
	argv[n++] = d->sock;
	for (; args && *args && n < 15; args++)
		argv[n++] = *args;
	argv[n] = NULL;
	fflush(stdout);
	d->pid = fork();
	if (d->pid < 0)
		return -errno;
	if (d->pid == 0) {
		int fd = open(d->log, O_WRONLY | O_APPEND | O_CLOEXEC);
		if (fd >= 0) {
			dup2(fd, 2);
			close(fd);
		}
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(127);
		zd_exec(bin, argv);
	}
	for (deadline = test_ms() + test_timeout(10000); test_ms() < deadline; usleep(5000))
		if (listening(d->sock))
			return 0;
	return -ETIMEDOUT;
}

/* Wait until rank 0 completed KILL_AFTER iterations (a checkpoint of
 * iteration 6 is on disk, the next one is 3 iterations away). */
static bool wait_done(struct script *sc, const pid_t *pids)
{
	int64_t deadline = test_ms() + test_timeout(60000);

	while (atomic_load(&sc->done) < KILL_AFTER && test_ms() < deadline) {
		if (!proc_alive(pids[0]))
			return false;
		usleep(1000);
	}
	return atomic_load(&sc->done) >= KILL_AFTER;
}

static void crash_one_node(enum zc_optimizer opt, enum zc_shard_mode shard, enum zc_step_mode step)
{
	struct script *sc = script_new("crash", 2, opt, shard, step);
	struct snap *want = test_shared(sizeof(*want));
	struct zd own;
	pid_t pids[2];
	int r = zd_start(&own, NULL);

	REQUIRE(r == 0, "cannot start zerod: %s", strerror(-r));
	snprintf(sc->socks[0], sizeof(sc->socks[0]), "%s", own.sock);
	sc->crash = true;
	snap_init(want, sc->seed);
	ref_train_nodes(want, opt, sc->seed, 2, NULL, 0, ITERS);
	sc->iters = ITERS;
	sc->ckpt_every = CKPT_EVERY;
	sc->want = want;
	spawn_all(sc, pids);
	bool reached = wait_done(sc, pids);
	CHECK(reached, "rank 0 did not get to iteration %d", KILL_AFTER);
	if (reached) {
		r = crash_and_restart(&own, NULL, &sc->killed);
		CHECK(r == 0, "restarting zerod: %s", strerror(-r));
	}
	wait_all(sc, pids);
	CHECK(atomic_load(&sc->reconnects) == 2, "%d ranks restored after the crash, want 2",
	      atomic_load(&sc->reconnects));
	if (test_failed_)
		zd_dump_log(&own);
	CHECK(zd_stop(&own, 10000) == 0, "the restarted zerod did not stop cleanly");
}

static void t_crash_sgd(void)
{
	crash_one_node(ZC_OPT_SGD, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED);
}

static void t_crash_adam(void)
{
	crash_one_node(ZC_OPT_ADAM, ZC_SHARD_SLICE, ZC_STEP_AT_END);
}

/* ------------------------------------------------ restore elsewhere --- */

/* A job of 2 ranks (bucket mode, layout 0) trains 3 iterations and
 * checkpoints; one of 3 ranks (slice mode, at_end, another layout, matched
 * by param_id) restores it at iteration 3 and trains 2 more: the reference
 * of 3 iterations with 2 ranks then 2 with 3. */
static void other_layout(enum zc_optimizer opt, bool ids, int layout)
{
	struct script *a = script_new("ck-w2", 2, opt, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED);
	struct script *b = script_new("rs-w3", 3, opt, ZC_SHARD_SLICE, ZC_STEP_AT_END);
	struct snap *want = test_shared(sizeof(*want));

	snap_init(want, a->seed);
	ref_train_nodes(want, opt, a->seed, 2, NULL, 0, 3);
	a->ids = ids;
	a->iters = 3;
	a->ckpt_every = 3;
	a->want = want;
	run_script(a);
	REQUIRE(!test_failed_, "the checkpointing job failed");
	ref_train_nodes(want, opt, a->seed, 3, NULL, 3, 5);
	snprintf(b->dir, sizeof(b->dir), "%s", a->dir);
	b->ids = ids;
	b->layout = layout;
	b->restore = true;
	b->restore_at = 3;
	b->iters = 5;
	b->want = want;
	run_script(b);
}

/* Checkpoints every iteration, a re-plan between them (the staging zerod
 * keeps mapped from one checkpoint to the next is replaced when its size
 * changes, reused when not), and the last one restored by another job
 * (3 ranks, slice mode, another layout): the reference of 6 iterations
 * with 2 ranks then 2 with 3. */
static void t_replan_between_checkpoints(void)
{
	struct script *a =
		script_new("ck-replan", 2, ZC_OPT_ADAM, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED);
	struct script *b = script_new("rs-replan", 3, ZC_OPT_ADAM, ZC_SHARD_SLICE, ZC_STEP_AT_END);
	struct snap *want = test_shared(sizeof(*want));

	snap_init(want, a->seed);
	ref_train_nodes(want, ZC_OPT_ADAM, a->seed, 2, NULL, 0, 6);
	a->ids = true;
	a->iters = 6;
	a->ckpt_every = 1;
	a->replan_at = 3;
	a->replan_layout = 1;
	a->want = want;
	run_script(a);
	REQUIRE(!test_failed_, "the checkpointing job failed");
	ref_train_nodes(want, ZC_OPT_ADAM, a->seed, 3, NULL, 6, 8);
	snprintf(b->dir, sizeof(b->dir), "%s", a->dir);
	b->ids = true;
	b->layout = 2;
	b->restore = true;
	b->restore_at = 6;
	b->iters = 8;
	b->want = want;
	run_script(b);
}

static void t_restore_other_layout_sgd(void)
{
	other_layout(ZC_OPT_SGD, true, 1);
}

static void t_restore_other_layout_adamw(void)
{
	other_layout(ZC_OPT_ADAMW, true, 1);
}

/* matched by position: one bucket holding every parameter in plan order
 * would reorder them, so the same order in other buckets (layout 0 → 0 in
 * another shard mode and world is what position matching promises) */
static void t_restore_by_position_adam(void)
{
	other_layout(ZC_OPT_ADAM, false, 0);
}

/* ----------------------------------------------------- bad checkpoints --- */

static int bystander_rank(void *arg, int idx)
{
	return train_rank(arg, (uint32_t)idx);
}

static void corrupt(const char *path, long at, int how)
{
	int fd = open(path, O_RDWR | O_CLOEXEC);
	unsigned char c;

	if (fd < 0)
		return;
	if (how == 0 && pread(fd, &c, 1, at) == 1) { /* flip a byte */
		c ^= 0x40;
		if (pwrite(fd, &c, 1, at) != 1)
			printf("# pwrite: %s\n", strerror(errno));
	} else if (how == 1) {
		if (ftruncate(fd, at) < 0)
			printf("# ftruncate: %s\n", strerror(errno));
	}
	close(fd);
}

static void copy_file(const char *from, const char *to)
{
	char buf[65536];
	int a = open(from, O_RDONLY | O_CLOEXEC),
	    b = open(to, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	ssize_t n;

	while (a >= 0 && b >= 0 && (n = read(a, buf, sizeof(buf))) > 0)
		if (write(b, buf, (size_t)n) != n)
			break;
	if (a >= 0)
		close(a);
	if (b >= 0)
		close(b);
}

/* A good checkpoint in good/, spoiled copies made from it. */
struct spoil {
	const char *what;
	const char *needle; /* in zc_error_message() */
	int layout;         /* the restoring job's plan (3: other parameters) */
	enum zc_optimizer opt;
};

static const struct spoil spoils[] = {
	{"a byte of the data flipped", "checksum mismatch (corrupt)", 0, ZC_OPT_ADAM},
	{"a byte of the manifest flipped", "manifest's checksum", 0, ZC_OPT_ADAM},
	{"the data file deleted", "state.zck: No such file", 0, ZC_OPT_ADAM},
	{"the manifest deleted", "no checkpoint, or one not finished", 0, ZC_OPT_ADAM},
	{"the data file truncated", "(truncated)", 0, ZC_OPT_ADAM},
	{"the manifest truncated", "checksum line", 0, ZC_OPT_ADAM},
	{"another model (5 parameters)", "segments", 3, ZC_OPT_ADAM},
	{"another optimizer", "optimizer", 0, ZC_OPT_SGD},
	/* issue 20 §4: each of these hung zc_restore() for good */
	{"a FIFO for the manifest", "MANIFEST: a FIFO, not a regular file", 0, ZC_OPT_ADAM},
	{"a link to a FIFO for the manifest", "MANIFEST: a symbolic link", 0, ZC_OPT_ADAM},
	{"a FIFO for the data file", "state.zck: a FIFO, not a regular file", 0, ZC_OPT_ADAM},
	{"a link to a FIFO for the data file", "state.zck: a symbolic link", 0, ZC_OPT_ADAM},
	{"no directory", "No such file", 0, ZC_OPT_ADAM},
};
#define NSPOILS (sizeof(spoils) / sizeof(spoils[0]))

static void spoil_make(const char *good, const char *dir, size_t i)
{
	char a[512], b[512];
	struct stat st;

	char gen[400], src[400];

	if (i == NSPOILS - 1)
		return; /* no directory */
	mkdir(dir, 0755);
	snprintf(gen, sizeof(gen), "%s/ckpt-00000001", dir);
	mkdir(gen, 0755);
	ckpt_gen(good, src, sizeof(src));
	for (int f = 0; f < 2; f++) {
		const char *name = f ? "MANIFEST" : "state.zck";
		snprintf(a, sizeof(a), "%s/%s", src, name);
		snprintf(b, sizeof(b), "%s/%s", gen, name);
		copy_file(a, b);
	}
	snprintf(b, sizeof(b), "%s/state.zck", gen);
	stat(b, &st);
	switch (i) {
	case 0:
		corrupt(b, st.st_size / 2, 0);
		break;
	case 2:
		unlink(b);
		break;
	case 4:
		corrupt(b, st.st_size - 100, 1);
		break;
	default:
		break;
	}
	snprintf(b, sizeof(b), "%s/MANIFEST", gen);
	stat(b, &st);
	switch (i) {
	case 1:
		corrupt(b, 40, 0);
		break;
	case 3:
		unlink(b);
		break;
	case 5:
		corrupt(b, st.st_size / 2, 1);
		break;
	default:
		break;
	}
	if (i >= 8 && i <= 11) { /* a FIFO, or a link to one, with nobody writing it */
		snprintf(b, sizeof(b), "%s/%s", gen, i <= 9 ? "MANIFEST" : "state.zck");
		snprintf(a, sizeof(a), "%s/fifo", dir);
		unlink(b);
		mkfifo(a, 0644);
		if (i == 8 || i == 10)
			CHECK(rename(a, b) == 0, "%s: %s", b, strerror(errno));
		else
			CHECK(symlink(a, b) == 0, "%s: %s", b, strerror(errno));
	}
}

/* A job trains 2 iterations and tries every spoiled checkpoint: each
 * refused with ZC_ECKPT and its reason; then it trains 2 more and equals
 * the reference of 4 iterations (nothing was loaded), while a job beside it
 * trains on. */
struct bad {
	struct script sc;
	char good[256];
};

static int bad_rank(void *arg, int idx)
{
	struct bad *bd = arg;
	struct script *sc = &bd->sc;
	uint32_t rank = (uint32_t)idx;
	struct tplan *tp = calloc(1, sizeof(*tp));
	struct snap *got = calloc(1, sizeof(*got)), *want = calloc(1, sizeof(*want));
	zc_client *c = NULL;
	const char *what;
	int r;

	make_plan(tp, &layouts[0], ZC_OPT_ADAM, sc->shard, sc->step, false);
	r = setup(sc, rank, tp, &c, &what);
	for (int it = 0; it < 2 && r >= 0; it++)
		r = one_iteration(c, sc, tp, rank);
	if (r >= 0)
		r = zc_checkpoint(c, bd->good);
	EXPECT(r == 0, "rank %u: training and checkpointing: %s: %s", rank, zc_strerror_name(r),
	       zc_error_message());
	/* the good one restores (at the iteration it is at: nothing moves) */
	if (r >= 0) {
		r = zc_restore(c, bd->good);
		EXPECT(r == 0 && zc_iteration(c) == 2, "rank %u: the good checkpoint: %s: %s", rank,
		       zc_strerror_name(r), zc_error_message());
	}
	for (size_t i = 0; i < NSPOILS && r >= 0; i++) {
		char dir[300];
		snprintf(dir, sizeof(dir), "%s.%zu", bd->good, i);
		if (spoils[i].layout != 0 || spoils[i].opt != ZC_OPT_ADAM)
			continue; /* another job's plan: below */
		int e = zc_restore(c, dir);
		EXPECT(e == ZC_ECKPT && strstr(zc_error_message(), spoils[i].needle),
		       "rank %u: %s: %s: %s", rank, spoils[i].what, zc_strerror_name(e),
		       zc_error_message());
		if (rank == 0)
			printf("# %s: %s\n", spoils[i].what, zc_error_message());
		EXPECT(zc_iteration(c) == 2, "rank %u: %s moved the iteration to %llu", rank,
		       spoils[i].what, (unsigned long long)zc_iteration(c));
	}
	for (int it = 0; it < 2 && r >= 0; it++)
		r = one_iteration(c, sc, tp, rank);
	if (r >= 0)
		r = export_snap(c, tp, ZC_OPT_ADAM, got);
	EXPECT(r == 0, "rank %u: training on: %s: %s", rank, zc_strerror_name(r),
	       zc_error_message());
	snap_init(want, sc->seed);
	ref_train_nodes(want, ZC_OPT_ADAM, sc->seed, sc->world, NULL, 0, 4);
	if (r == 0)
		EXPECT(snap_compare("after the refusals", got, want, ZC_OPT_ADAM) == 0,
		       "rank %u: a refused checkpoint changed the job", rank);
	zc_close(c);
	/* other plans: a fresh job each, refused before anything moves */
	for (size_t i = 0; i < NSPOILS; i++) {
		char dir[300], job[64];
		struct script other = *sc;
		if (spoils[i].layout == 0 && spoils[i].opt == ZC_OPT_ADAM)
			continue;
		snprintf(dir, sizeof(dir), "%s.%zu", bd->good, i);
		snprintf(job, sizeof(job), "other-%zu", i);
		snprintf(other.job, sizeof(other.job), "%s", job);
		make_plan(tp, &layouts[spoils[i].layout], spoils[i].opt, sc->shard, sc->step, false);
		r = setup(&other, rank, tp, &c, &what);
		if (r >= 0)
			r = zc_restore(c, dir);
		EXPECT(r == ZC_ECKPT && strstr(zc_error_message(), spoils[i].needle),
		       "rank %u: %s: %s: %s", rank, spoils[i].what, zc_strerror_name(r),
		       zc_error_message());
		if (rank == 0)
			printf("# %s: %s\n", spoils[i].what, zc_error_message());
		zc_close(c);
		c = NULL;
	}
	free(tp);
	free(got);
	free(want);
	return child_bad;
}

static void t_bad_checkpoints(void)
{
	struct bad *bd = test_shared(sizeof(*bd));
	struct train_spec *by = test_shared(sizeof(*by));
	pid_t bpids[2], pids[2];
	char good[256];

	*by = (struct train_spec){.socket = daemon_.sock,
				  .job = "bystander",
				  .world = 2,
				  .optimizer = ZC_OPT_ADAM,
				  .shard_mode = ZC_SHARD_SLICE,
				  .step_mode = ZC_STEP_INTERLEAVED,
				  .iters = 40,
				  .seed = 99,
				  .hyper_iter = -1};
	for (uint32_t r = 0; r < 2; r++)
		bpids[r] = spawn(bystander_rank, by, (int)r);
	bd->sc = *script_new("bad", 2, ZC_OPT_ADAM, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED);
	snprintf(bd->good, sizeof(bd->good), "%s/good", daemon_.dir);
	/* a good checkpoint of the same model to spoil: a job of its own,
	 * whose rank closes right after its zc_checkpoint(): zc_close()
	 * finishes the write in flight, or there is nothing to spoil */
	{
		struct script *mk =
			script_new("mk", 1, ZC_OPT_ADAM, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED);
		mk->iters = 2;
		mk->ckpt_every = 2;
		run_script(mk);
		REQUIRE(!test_failed_, "making the checkpoint to spoil failed");
		snprintf(good, sizeof(good), "%s", mk->dir);
	}
	for (size_t i = 0; i < NSPOILS; i++) {
		char dir[300];
		snprintf(dir, sizeof(dir), "%s.%zu", bd->good, i);
		spoil_make(good, dir, i);
	}
	{ /* the layout before generations, the files directly in the dir:
		   still read (a job of mk's plan restores it and equals mk's
		   reference of 2 iterations) */
		struct script *old =
			script_new("old-layout", 1, ZC_OPT_ADAM, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED);
		struct snap *want = test_shared(sizeof(*want));
		char a[700], b[700], gen[400];
		mkdir(old->dir, 0755);
		for (int f = 0; f < 2; f++) {
			const char *name = f ? "MANIFEST" : "state.zck";
			snprintf(a, sizeof(a), "%s/%s", ckpt_gen(good, gen, sizeof(gen)), name);
			snprintf(b, sizeof(b), "%s/%s", old->dir, name);
			copy_file(a, b);
		}
		snap_init(want, old->seed);
		ref_train_nodes(want, ZC_OPT_ADAM, old->seed, 1, NULL, 0, 2);
		old->restore = true;
		old->restore_at = 2;
		old->iters = 2;
		old->want = want;
		run_script(old);
		REQUIRE(!test_failed_, "the old single-generation layout did not restore");
	}
	for (uint32_t r = 0; r < 2; r++)
		pids[r] = spawn(bad_rank, bd, (int)r);
	for (uint32_t r = 0; r < 2; r++)
		CHECK(wait_child(pids[r], test_timeout(90000)) == 0, "rank %u: see above", r);
	for (uint32_t r = 0; r < 2; r++)
		CHECK(wait_child(bpids[r], test_timeout(90000)) == 0,
		      "the job beside it, rank %u, did not train to the reference", r);
	if (test_failed_)
		zd_dump_log(&daemon_);
}

/* A checkpoint into a directory that cannot be written: zc_checkpoint()
 * returns once the state is copied out, and the write's failure comes back
 * from zc_checkpoint_wait() as ZC_ECKPT with the reason: on rank 0 (the
 * writer) what failed, on rank 1 that the manifest never named the
 * iteration. The job trains on, and its next checkpoint, into a good
 * directory, is durable (wait: 0, and it restores). */
static int unwritable_rank(void *arg, int idx)
{
	struct script *sc = arg;
	static const struct {
		const char *sub, *needle;
	} bad[] = {
		{NULL, "No such file"},      /* under /proc: mkdir fails */
		{"afile/ck", "Not a directory"}, /* a parent is a file */
	};
	struct tplan tp;
	zc_client *c = NULL;
	const char *what;
	char dir[300];
	int r;

	make_plan(&tp, &layouts[0], sc->opt, sc->shard, sc->step, false);
	r = setup(sc, (uint32_t)idx, &tp, &c, &what);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]) && r >= 0; i++) {
		if (bad[i].sub)
			snprintf(dir, sizeof(dir), "%s/%s", daemon_.dir, bad[i].sub);
		else
			snprintf(dir, sizeof(dir), "/proc/zerod-no/such/dir");
		r = one_iteration(c, sc, &tp, (uint32_t)idx);
		if (r < 0)
			break;
		r = zc_checkpoint(c, dir);
		EXPECT(r == 0, "rank %d: zc_checkpoint(%s): %s: %s", idx, dir, zc_strerror_name(r),
		       zc_error_message());
		if (r < 0)
			break;
		int e = zc_checkpoint_wait(c, idx == 0 ? -1 : 2000);
		EXPECT(e == ZC_ECKPT && strstr(zc_error_message(), dir) &&
			       (idx != 0 || strstr(zc_error_message(), bad[i].needle)),
		       "rank %d: zc_checkpoint_wait after a checkpoint into %s: %s: %s", idx, dir,
		       zc_strerror_name(e), zc_error_message());
		if (idx == 0)
			printf("# %s: %s\n", dir, zc_error_message());
		e = zc_checkpoint_wait(c, 0);
		EXPECT(e == 0, "rank %d: the failure was given twice: %s", idx, zc_strerror_name(e));
	}
	if (r >= 0)
		r = one_iteration(c, sc, &tp, (uint32_t)idx);
	snprintf(dir, sizeof(dir), "%s/after-unwritable", daemon_.dir);
	if (r >= 0)
		r = zc_checkpoint(c, dir);
	if (r >= 0)
		r = zc_checkpoint_wait(c, -1);
	if (r >= 0)
		r = zc_restore(c, dir);
	EXPECT(r == 0 && zc_iteration(c) == 3, "rank %d: training on, a good checkpoint: %s: %s",
	       idx, zc_strerror_name(r), zc_error_message());
	zc_close(c);
	return child_bad;
}

static void t_unwritable_dir(void)
{
	struct script *sc =
		script_new("unwritable", 2, ZC_OPT_SGD, ZC_SHARD_SLICE, ZC_STEP_INTERLEAVED);
	pid_t pids[2];
	char path[300];
	FILE *f;

	snprintf(path, sizeof(path), "%s/afile", daemon_.dir);
	f = fopen(path, "w");
	REQUIRE(f, "cannot make %s", path);
	fclose(f);
	for (uint32_t r = 0; r < 2; r++)
		pids[r] = spawn(unwritable_rank, sc, (int)r);
	wait_all(sc, pids);
}

/* ------------------------------------------- killed while writing --- */

/*
 * Issue 20 §5: a checkpoint's writer (the trainer) or its zerod killed at a
 * random point of a checkpoint, every restore after it loads the previous
 * checkpoint or the new one, whole: never none, never a half one. A 1-rank
 * job checkpoints iteration 2 (waited durable), trains to 4 and checkpoints
 * again; the test watches the directory (inotify: every file or directory
 * made, written, closed, renamed or removed in it and in the directories
 * made in it) and kills at the K-th such event, K drawn from 1 to what a
 * whole checkpoint made in the first round: the trainer (SIGKILL) or, every
 * third round, the zerod (SIGKILL, then started again; the trainer's write
 * needs no zerod and goes on). A fresh job then
 * restores the directory and must be at iteration 2 or 4 with exactly the
 * reference's parameters and state of that iteration. A job beside the
 * trainer-killed ones, on the same zerod, trains on to its reference.
 */
#define KILL_ROUNDS 30

struct killck {
	struct script sc;
	atomic_int phase;    /* 1: the second zc_checkpoint() is next; 2: durable */
	atomic_int armed;    /* the test watches: the writer may go on */
	atomic_long took_us; /* that checkpoint, zc_checkpoint() to durable */
	bool kill_zerod;
	int restored_at; /* the restore's iteration (-1: failed) */
};

static int64_t now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static int kill_writer_rank(void *arg, int idx)
{
	struct killck *k = arg;
	struct script *sc = &k->sc;
	struct tplan tp;
	zc_client *c = NULL;
	const char *what = "setup";
	int r;

	make_plan(&tp, &layouts[0], sc->opt, sc->shard, sc->step, false);
	r = setup(sc, (uint32_t)idx, &tp, &c, &what);
	for (int it = 0; it < 2 && r >= 0; it++)
		r = one_iteration(c, sc, &tp, 0);
	if (r >= 0)
		r = zc_checkpoint(c, sc->dir);
	if (r >= 0)
		r = zc_checkpoint_wait(c, -1);
	for (int it = 0; it < 2 && r >= 0; it++)
		r = one_iteration(c, sc, &tp, 0);
	EXPECT(r == 0, "%s: the first checkpoint and training: %s: %s", sc->job,
	       zc_strerror_name(r), zc_error_message());
	if (r < 0)
		return child_bad;
	int64_t t0 = now_us();
	atomic_store(&k->phase, 1);
	while (!atomic_load(&k->armed))
		usleep(100);
	r = zc_checkpoint(c, sc->dir);
	if (r >= 0)
		r = zc_checkpoint_wait(c, -1);
	atomic_store(&k->took_us, (long)(now_us() - t0));
	atomic_store(&k->phase, 2);
	if (k->kill_zerod) {
		/* its zerod died at some point: the write is on disk or
		 * zc_checkpoint() failed before it began, either is fine */
		zc_close(c);
		return 0;
	}
	for (;;) /* until the test kills this trainer */
		usleep(1000);
}

static int kill_restore_rank(void *arg, int idx)
{
	struct killck *k = arg;
	struct script sc = k->sc;
	struct snap *got = calloc(1, sizeof(*got)), *want = calloc(1, sizeof(*want));
	struct tplan tp;
	zc_client *c = NULL;
	const char *what = "setup";
	int r, at = -1;

	snprintf(sc.job, sizeof(sc.job), "%.40s-restore", k->sc.job);
	make_plan(&tp, &layouts[0], sc.opt, sc.shard, sc.step, false);
	r = setup(&sc, (uint32_t)idx, &tp, &c, &what);
	if (r >= 0) {
		what = "restore";
		r = zc_restore(c, sc.dir);
	}
	if (r >= 0) {
		at = (int)zc_iteration(c);
		what = "get_state";
		r = export_snap(c, &tp, sc.opt, got);
	}
	EXPECT(r == 0, "%s: %s: %s: %s", sc.job, what, zc_strerror_name(r), zc_error_message());
	if (r == 0) {
		EXPECT(at == 2 || at == 4, "%s: restored at iteration %d: neither 2 nor 4", sc.job,
		       at);
		snap_init(want, sc.seed);
		ref_train_nodes(want, sc.opt, sc.seed, 1, NULL, 0, at);
		EXPECT(snap_compare("the restored checkpoint", got, want, sc.opt) == 0,
		       "%s: the checkpoint of iteration %d restored is not that iteration's whole",
		       sc.job, at);
	}
	k->restored_at = r == 0 ? at : -1;
	zc_close(c);
	free(got);
	free(want);
	return child_bad;
}

/* Whether a checkpoint not finished (.tmp-*) is left in dir. */
static bool unfinished_left(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	bool found = false;

	while (d && (e = readdir(d)))
		found = found || strncmp(e->d_name, ".tmp-", 5) == 0;
	if (d)
		closedir(d);
	return found;
}

/* Watch k's directory (and the directories made in it) until `want`
 * events happened or the checkpoint is durable (phase 2): how many were
 * seen. Busy: the kill follows the event as closely as it can. */
static long watch_until(struct killck *k, long want, int64_t deadline)
{
	const uint32_t mask = IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO |
			      IN_CLOSE_WRITE | IN_MODIFY;
	char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
	int fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
	long seen = 0;

	if (fd < 0 || inotify_add_watch(fd, k->sc.dir, mask) < 0) {
		CHECK(0, "inotify on %s: %s", k->sc.dir, strerror(errno));
		if (fd >= 0)
			close(fd);
		atomic_store(&k->armed, 1);
		return 0;
	}
	atomic_store(&k->armed, 1);
	while (seen < want && test_ms() < deadline) {
		ssize_t n = read(fd, buf, sizeof(buf));
		if (n <= 0) {
			if (atomic_load(&k->phase) >= 2)
				break;
			continue;
		}
		for (char *p = buf; p < buf + n && seen < want;) {
			struct inotify_event *e = (struct inotify_event *)p;
			if ((e->mask & IN_CREATE) && (e->mask & IN_ISDIR) && e->len) {
				char sub[512];
				snprintf(sub, sizeof(sub), "%s/%s", k->sc.dir, e->name);
				inotify_add_watch(fd, sub, mask);
			}
			if (e->mask & mask)
				seen++;
			p += sizeof(*e) + e->len;
		}
	}
	close(fd);
	return seen;
}

static void t_killed_while_writing(void)
{
	struct train_spec *by = test_shared(sizeof(*by));
	struct killck *k = test_shared(sizeof(*k));
	/* a killed writer fails its job (the next round restores from disk) */
	const char *const own_args[] = {"--workers", "2", "--rejoin-timeout", "0", NULL};
	unsigned seed = (unsigned)now_us(), cut = 0, at[5] = {0};
	pid_t bpids[2];
	long span = 0;
	struct zd own;
	int r = zd_start(&own, own_args);

	REQUIRE(r == 0, "cannot start zerod: %s", strerror(-r));
	printf("# random seed %u\n", seed);
	srand(seed);
	*by = (struct train_spec){.socket = daemon_.sock,
				  .job = "kill-bystander",
				  .world = 2,
				  .optimizer = ZC_OPT_ADAM,
				  .shard_mode = ZC_SHARD_SLICE,
				  .step_mode = ZC_STEP_INTERLEAVED,
				  .iters = 60,
				  .seed = 99,
				  .hyper_iter = -1};
	for (uint32_t i = 0; i < 2; i++)
		bpids[i] = spawn(bystander_rank, by, (int)i);
	for (int round = 0; round < KILL_ROUNDS && !test_failed_; round++) {
		char job[32];
		snprintf(job, sizeof(job), "killck-%d", round);
		k->sc = *script_new(job, 1, ZC_OPT_ADAM, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED);
		k->kill_zerod = round % 3 == 2;
		if (k->kill_zerod)
			snprintf(k->sc.socks[0], sizeof(k->sc.socks[0]), "%s", own.sock);
		atomic_store(&k->phase, 0);
		atomic_store(&k->armed, 0);
		atomic_store(&k->took_us, 0);
		k->restored_at = -1;
		pid_t w = spawn(kill_writer_rank, k, 0);
		int64_t deadline = test_ms() + test_timeout(30000);
		while (atomic_load(&k->phase) < 1 && proc_alive(w) && test_ms() < deadline)
			usleep(200);
		REQUIRE(atomic_load(&k->phase) >= 1, "round %d: the writer never got to its second "
			"checkpoint", round);
		/* round 0 counts a whole checkpoint's events: the kills fall
		 * within them */
		long want = round == 0 ? LONG_MAX : 1 + rand() % (span + 1);
		long seen = watch_until(k, want, deadline);
		if (round == 0) {
			span = seen;
			printf("# a whole checkpoint made %ld events in %s\n", span, k->sc.dir);
			REQUIRE(span > 0, "no event seen in %s", k->sc.dir);
		}
		long delay = seen;
		if (k->kill_zerod) {
			r = crash_and_restart(&own, own_args, &k->sc.killed);
			CHECK(r == 0, "round %d: restarting zerod: %s", round, strerror(-r));
		} else {
			kill(w, SIGKILL);
		}
		int st = wait_child(w, test_timeout(30000));
		CHECK(k->kill_zerod ? st == 0 : st != 0, "round %d: the writer ended with %d", round,
		      st);
		bool mid = unfinished_left(k->sc.dir) || atomic_load(&k->phase) < 2;
		cut += mid;
		pid_t rp = spawn(kill_restore_rank, k, 0);
		CHECK(wait_child(rp, test_timeout(30000)) == 0, "round %d: the restore, see above",
		      round);
		if (k->restored_at == 2 || k->restored_at == 4)
			at[k->restored_at]++;
		printf("# round %d: %s killed %s (at event %ld), restored at %d\n", round,
		       k->kill_zerod ? "zerod" : "the trainer", mid ? "mid-checkpoint" : "after it",
		       delay, k->restored_at);
	}
	printf("# %u of %d kills fell before the checkpoint was durable; restored at 2: %u, at 4: "
	       "%u\n",
	       cut, KILL_ROUNDS, at[2], at[4]);
	for (uint32_t i = 0; i < 2; i++)
		CHECK(wait_child(bpids[i], test_timeout(90000)) == 0,
		      "the job beside it, rank %u, did not train to the reference", i);
	if (test_failed_) {
		zd_dump_log(&daemon_);
		zd_dump_log(&own);
	}
	CHECK(zd_stop(&own, 10000) == 0, "the restarted zerod did not stop cleanly");
}

/* ------------------------------------------- over two nodes (gloo) --- */

static struct zd nodes_[2];
static const char *const node_args[] = {"--workers", "2", NULL};

static int nodes_start(struct script *sc, const uint32_t *node_of)
{
	int port;

	sc->nnodes = 2;
	memcpy(sc->node_of, node_of, sc->world * sizeof(*node_of));
	for (uint32_t k = 0; k < 2; k++) {
		int r = zd_start(&nodes_[k], node_args);
		if (r < 0)
			return r;
		snprintf(sc->socks[k], sizeof(sc->socks[k]), "%s", nodes_[k].sock);
	}
	port = zd_free_port();
	snprintf(sc->rdzv, sizeof(sc->rdzv), "127.0.0.1:%d", port);
	return port > 0 ? 0 : -EADDRINUSE;
}

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

/* A job of 3 ranks over 2 zerods, Adam: node 1's zerod is SIGKILLed after
 * iteration 7 and started again; every rank reconnects and restores. */
static void t_nodes_crash(void)
{
	static const uint32_t node_of[] = {0, 1, 1};
	struct script *sc =
		script_new("nodes-crash", 3, ZC_OPT_ADAM, ZC_SHARD_SLICE, ZC_STEP_INTERLEAVED);
	struct snap *want = test_shared(sizeof(*want));
	pid_t pids[3];
	int r = nodes_start(sc, node_of);

	REQUIRE(r == 0, "cannot start the nodes: %s", strerror(-r));
	snap_init(want, sc->seed);
	ref_train_nodes(want, sc->opt, sc->seed, 3, node_of, 0, ITERS);
	sc->iters = ITERS;
	sc->ckpt_every = CKPT_EVERY;
	sc->crash = true;
	sc->want = want;
	spawn_all(sc, pids);
	bool reached = wait_done(sc, pids);
	CHECK(reached, "rank 0 did not get to iteration %d", KILL_AFTER);
	if (reached) {
		r = crash_and_restart(&nodes_[1], node_args, &sc->killed);
		CHECK(r == 0, "restarting node 1's zerod: %s", strerror(-r));
	}
	wait_all(sc, pids);
	CHECK(atomic_load(&sc->reconnects) == 3, "%d ranks restored after the crash, want 3",
	      atomic_load(&sc->reconnects));
	nodes_stop();
}

/* A checkpoint of a one-node job of 2 ranks restored by a job of 3 ranks
 * over 2 nodes. */
static void t_nodes_restore_other_world(void)
{
	static const uint32_t node_of[] = {1, 0, 1};
	struct script *a =
		script_new("one-node", 2, ZC_OPT_ADAMW, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED);
	struct script *b = script_new("two-nodes", 3, ZC_OPT_ADAMW, ZC_SHARD_SLICE, ZC_STEP_AT_END);
	struct snap *want = test_shared(sizeof(*want));
	int r;

	snap_init(want, a->seed);
	ref_train_nodes(want, a->opt, a->seed, 2, NULL, 0, 3);
	a->ids = b->ids = true;
	a->iters = 3;
	a->ckpt_every = 3;
	a->want = want;
	run_script(a);
	REQUIRE(!test_failed_, "the checkpointing job failed");
	ref_train_nodes(want, a->opt, a->seed, 3, node_of, 3, 5);
	r = nodes_start(b, node_of);
	REQUIRE(r == 0, "cannot start the nodes: %s", strerror(-r));
	snprintf(b->dir, sizeof(b->dir), "%s", a->dir);
	b->layout = 2;
	b->restore = true;
	b->restore_at = 3;
	b->iters = 5;
	b->want = want;
	run_script(b);
	nodes_stop();
}

/* ------------------------------------------- per-node files (v2) --- */

/* A line of dir's MANIFEST starting with key: its rest, into out. */
static bool manifest_line(const char *dir, const char *key, char *out, size_t len)
{
	char path[512], line[512], gen[400];
	bool found = false;
	FILE *f;

	snprintf(path, sizeof(path), "%s/MANIFEST", ckpt_gen(dir, gen, sizeof(gen)));
	if (!(f = fopen(path, "r")))
		return false;
	while (!found && fgets(line, sizeof(line), f))
		if (strncmp(line, key, strlen(key)) == 0) {
			snprintf(out, len, "%s", line + strlen(key));
			found = true;
		}
	fclose(f);
	return found;
}

/* What node-K.zck holds: its size as its records add it up, and which
 * elements of which segment (marks[seg offset + element] += 1). */
static long node_file_walk(const char *dir, uint32_t node, const uint64_t *seg_base,
			   uint32_t nsegs, uint8_t *marks, uint64_t *ret_elems)
{
	char path[512], gen[400];
	unsigned char head[32], rh[32];
	uint64_t nrecs, elems = 0;
	uint32_t version, nd;
	long size = 32;
	FILE *f;

	snprintf(path, sizeof(path), "%s/node-%u.zck", ckpt_gen(dir, gen, sizeof(gen)), node);
	if (!(f = fopen(path, "rb")))
		return -1;
	if (fread(head, 1, 32, f) != 32 || memcmp(head, "ZCKPTNOD", 8) != 0) {
		fclose(f);
		return -1;
	}
	memcpy(&version, head + 8, 4);
	memcpy(&nd, head + 12, 4);
	memcpy(&nrecs, head + 24, 8);
	CHECK(version == 2 && nd == node, "%s: version %u node %u", path, version, nd);
	for (uint64_t i = 0; i < nrecs; i++) {
		uint32_t seg, present, nt = 1;
		uint64_t off, n;
		if (fread(rh, 1, 32, f) != 32)
			break;
		memcpy(&seg, rh, 4);
		memcpy(&present, rh + 4, 4);
		memcpy(&off, rh + 8, 8);
		memcpy(&n, rh + 16, 8);
		for (uint32_t b = ZC_STATE_MOMENTUM_BUFFER; b <= ZC_STATE_MAX_EXP_AVG_SQ; b <<= 1)
			nt += !!(present & b);
		if (seg >= nsegs || seg_base[seg] + off + n > seg_base[seg + 1]) {
			CHECK(0, "%s: record %llu out of its segment", path, (unsigned long long)i);
			break;
		}
		for (uint64_t x = 0; x < n; x++)
			marks[seg_base[seg] + off + x]++;
		elems += n;
		size += 32 + (long)(n * nt * sizeof(float));
		if (fseek(f, (long)(n * nt * sizeof(float)), SEEK_CUR) < 0)
			break;
	}
	fclose(f);
	*ret_elems = elems;
	return size;
}

/* The spoiled copies of a version 2 checkpoint, and what a restore says. */
static const struct {
	const char *what, *file, *needle;
	int how; /* 0: a byte flipped, 1: truncated, 2: deleted */
} node_spoils[] = {
	{"node 1's file deleted", "node-1.zck", "node-1.zck: No such file", 2},
	{"a byte of node 0's file flipped", "node-0.zck", "node-0.zck: checksum mismatch", 0},
	{"node 1's file truncated", "node-1.zck", "node-1.zck: ", 1},
};
#define NNODE_SPOILS (sizeof(node_spoils) / sizeof(node_spoils[0]))

/* A job of 2 ranks on one zerod tries every spoiled copy (each refused,
 * naming the file, nothing moved), then restores the good one (a
 * checkpoint of 3 ranks over 2 nodes) and trains on to the reference. */
static int node_spoil_rank(void *arg, int idx)
{
	struct script *sc = arg;
	uint32_t rank = (uint32_t)idx;
	struct tplan *tp = calloc(1, sizeof(*tp));
	struct snap *got = calloc(1, sizeof(*got));
	zc_client *c = NULL;
	const char *what;
	int r;

	make_plan(tp, &layouts[sc->layout], sc->opt, sc->shard, sc->step, sc->ids);
	r = setup(sc, rank, tp, &c, &what);
	for (size_t i = 0; i < NNODE_SPOILS && r >= 0; i++) {
		char dir[300];
		snprintf(dir, sizeof(dir), "%s.%zu", sc->dir, i);
		int e = zc_restore(c, dir);
		EXPECT(e == ZC_ECKPT && strstr(zc_error_message(), node_spoils[i].needle),
		       "rank %u: %s: %s: %s", rank, node_spoils[i].what, zc_strerror_name(e),
		       zc_error_message());
		if (rank == 0)
			printf("# %s: %s\n", node_spoils[i].what, zc_error_message());
		EXPECT(zc_iteration(c) == 0, "rank %u: %s moved the iteration", rank,
		       node_spoils[i].what);
	}
	if (r >= 0)
		r = restore(c, sc, rank, sc->restore_at);
	while (r >= 0 && (int)zc_iteration(c) < sc->iters)
		r = one_iteration(c, sc, tp, rank);
	if (r >= 0)
		r = export_snap(c, tp, sc->opt, got);
	EXPECT(r == 0, "rank %u: %s", rank, zc_error_message());
	if (r == 0)
		EXPECT(snap_compare(sc->job, got, sc->want, sc->opt) == 0,
		       "rank %u: differs from the reference", rank);
	zc_close(c);
	free(tp);
	free(got);
	return child_bad;
}

/* A job of 3 ranks over 2 zerods (rank 0 on node 1) checkpoints: version
 * 2, one file per node, each holding only its node's ranges, together
 * every element once, sizes as the manifest says; spoiled copies are
 * refused naming the file; a one-node job of 2 ranks restores it. */
static void t_nodes_files_per_node(void)
{
	static const uint32_t node_of[] = {1, 0, 1};
	struct script *a = script_new("v2-nodes", 3, ZC_OPT_ADAM, ZC_SHARD_SLICE, ZC_STEP_AT_END);
	struct script *b = script_new("v2-one", 2, ZC_OPT_ADAM, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED);
	struct snap *want = test_shared(sizeof(*want));
	uint64_t seg_base[16] = {0}, total = 0, elems[2] = {0};
	uint32_t nsegs = 0;
	char line[256], key[32], gen[400];
	uint8_t *marks = NULL;
	int r;

	snap_init(want, a->seed);
	ref_train_nodes(want, a->opt, a->seed, 3, node_of, 0, 3);
	a->ids = b->ids = true;
	a->iters = 3;
	a->ckpt_every = 3;
	a->want = want;
	r = nodes_start(a, node_of);
	REQUIRE(r == 0, "cannot start the nodes: %s", strerror(-r));
	run_script(a);
	nodes_stop();
	REQUIRE(!test_failed_, "the checkpointing job failed");

	CHECK(manifest_line(a->dir, "zerod-checkpoint ", line, sizeof(line)) && atoi(line) == 2,
	      "the manifest is not of version 2");
	CHECK(manifest_line(a->dir, "nodes ", line, sizeof(line)) && atoi(line) == 2,
	      "the manifest does not say 2 nodes");
	REQUIRE(manifest_line(a->dir, "segments ", line, sizeof(line)), "no segments line");
	nsegs = (uint32_t)atoi(line);
	REQUIRE(nsegs > 0 && nsegs < 16, "%u segments", nsegs);
	for (uint32_t k = 0; k < nsegs; k++) {
		unsigned long long numel = 0;
		snprintf(key, sizeof(key), "segment %u ", k);
		REQUIRE(manifest_line(a->dir, key, line, sizeof(line)) &&
				sscanf(line, "param_id %*u numel %llu", &numel) == 1,
			"no line for segment %u", k);
		seg_base[k + 1] = seg_base[k] + numel;
	}
	total = seg_base[nsegs];
	marks = calloc(total, 1);
	REQUIRE(marks, "out of memory");
	for (uint32_t nd = 0; nd < 2; nd++) {
		char path[512];
		unsigned long long listed = 0;
		struct stat st;
		long size = node_file_walk(a->dir, nd, seg_base, nsegs, marks, &elems[nd]);
		snprintf(key, sizeof(key), "file node-%u.zck ", nd);
		snprintf(path, sizeof(path), "%s/node-%u.zck", ckpt_gen(a->dir, gen, sizeof(gen)),
			 nd);
		CHECK(manifest_line(a->dir, key, line, sizeof(line)) &&
			      sscanf(line, "%llu", &listed) == 1,
		      "the manifest lists no node-%u.zck", nd);
		CHECK(size > 0 && stat(path, &st) == 0 && st.st_size == size &&
			      (unsigned long long)size == listed,
		      "node-%u.zck: %ld bytes by its records, %lld on disk, %llu in the manifest",
		      nd, size, (long long)st.st_size, listed);
		/* a node holds its own ranges only: never every element */
		CHECK(elems[nd] > 0 && elems[nd] < total,
		      "node-%u.zck holds %llu of %llu elements", nd,
		      (unsigned long long)elems[nd], (unsigned long long)total);
		printf("# node-%u.zck: %ld bytes, %llu of %llu elements\n", nd, size,
		       (unsigned long long)elems[nd], (unsigned long long)total);
	}
	for (uint64_t x = 0; x < total; x++)
		if (marks[x] != 1) {
			CHECK(0, "element %llu is in %u node files, want 1", (unsigned long long)x,
			      marks[x]);
			break;
		}
	CHECK(elems[0] + elems[1] == total, "the node files hold %llu elements, the model %llu",
	      (unsigned long long)(elems[0] + elems[1]), (unsigned long long)total);
	free(marks);

	/* spoiled copies */
	for (size_t i = 0; i < NNODE_SPOILS; i++) {
		char from[512], to[512], dir[360];
		snprintf(dir, sizeof(dir), "%s.%zu", a->dir, i);
		mkdir(dir, 0755); /* the old single-generation layout: read as before */
		for (const char *const *f = (const char *const[]){"MANIFEST", "node-0.zck",
								  "node-1.zck", NULL};
		     *f; f++) {
			snprintf(from, sizeof(from), "%s/%s", ckpt_gen(a->dir, gen, sizeof(gen)), *f);
			snprintf(to, sizeof(to), "%s/%s", dir, *f);
			copy_file(from, to);
		}
		snprintf(to, sizeof(to), "%s/%s", dir, node_spoils[i].file);
		struct stat st;
		stat(to, &st);
		if (node_spoils[i].how == 2)
			unlink(to);
		else
			corrupt(to, node_spoils[i].how ? st.st_size - 50 : st.st_size / 2,
				node_spoils[i].how);
	}
	ref_train_nodes(want, a->opt, a->seed, 2, NULL, 3, 5);
	snprintf(b->dir, sizeof(b->dir), "%s", a->dir);
	b->layout = 1;
	b->restore_at = 3;
	b->iters = 5;
	b->want = want;
	{
		pid_t pids[2];
		for (uint32_t k = 0; k < 2; k++)
			pids[k] = spawn(node_spoil_rank, b, (int)k);
		wait_all(b, pids);
	}
	if (test_failed_)
		zd_dump_log(&daemon_);
}

/* A directory used again by another run: run A checkpoints iteration 3
 * into dir, then run B (another job, other values) checkpoints iteration 3
 * into the same dir while node 0's only rank (its stager) comes to it
 * late, so rank 0's writer on node 1 finds run A's node-0.sum of that
 * iteration there first. Node sums carry the run, so it waits for run B's,
 * and the checkpoint restores to B's reference bit for bit (listing A's
 * file would give a manifest whose checksum node 0's rewrite then breaks,
 * or A's values). */
static void t_nodes_stale_run(void)
{
	static const uint32_t node_of[] = {1, 0, 1};
	struct script *a = script_new("stale-a", 3, ZC_OPT_ADAM, ZC_SHARD_SLICE, ZC_STEP_AT_END);
	struct script *b = script_new("stale-b", 3, ZC_OPT_ADAM, ZC_SHARD_SLICE, ZC_STEP_AT_END);
	struct script *c = script_new("stale-c", 2, ZC_OPT_ADAM, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED);
	struct snap *wa = test_shared(sizeof(*wa)), *wb = test_shared(sizeof(*wb));
	int r;

	b->seed = c->seed = 11;
	snap_init(wa, a->seed);
	ref_train_nodes(wa, a->opt, a->seed, 3, node_of, 0, 3);
	snap_init(wb, b->seed);
	ref_train_nodes(wb, b->opt, b->seed, 3, node_of, 0, 3);
	a->ids = b->ids = c->ids = true;
	a->iters = b->iters = 3;
	a->ckpt_every = b->ckpt_every = 3;
	a->want = wa;
	b->want = wb;
	r = nodes_start(a, node_of);
	REQUIRE(r == 0, "cannot start the nodes: %s", strerror(-r));
	b->nnodes = a->nnodes;
	memcpy(b->node_of, a->node_of, sizeof(b->node_of));
	memcpy(b->socks, a->socks, sizeof(b->socks));
	memcpy(b->rdzv, a->rdzv, sizeof(b->rdzv));
	snprintf(b->dir, sizeof(b->dir), "%s", a->dir);
	b->ckpt_late_rank1 = 2; /* rank 1: node 0's stager */
	run_script(a);
	REQUIRE(!test_failed_, "run A failed");
	run_script(b);
	nodes_stop();
	REQUIRE(!test_failed_, "run B failed");
	/* one node of 2 ranks restores run B's checkpoint and trains on */
	ref_train_nodes(wb, b->opt, b->seed, 2, NULL, 3, 5);
	snprintf(c->dir, sizeof(c->dir), "%s", a->dir);
	c->layout = 1;
	c->restore = true;
	c->restore_at = 3;
	c->iters = 5;
	c->want = wb;
	run_script(c);
}

/* The version 1 writer over several nodes (ZEROD_CKPT_V1: the export
 * round into rank 0, which writes state.zck) still works, and its
 * checkpoint restores into a job over the same two zerods. */
static void t_nodes_v1_still_restores(void)
{
	static const uint32_t node_of[] = {0, 1, 1};
	struct script *a = script_new("v1-nodes", 3, ZC_OPT_ADAM, ZC_SHARD_BUCKET, ZC_STEP_AT_END);
	struct script *b = script_new("v1-back", 3, ZC_OPT_ADAM, ZC_SHARD_SLICE, ZC_STEP_INTERLEAVED);
	struct snap *want = test_shared(sizeof(*want));
	char line[64], path[512], gen[400];
	struct stat st;
	int r;

	snap_init(want, a->seed);
	ref_train_nodes(want, a->opt, a->seed, 3, node_of, 0, 3);
	a->ids = b->ids = true;
	a->iters = 3;
	a->ckpt_every = 3;
	a->want = want;
	r = nodes_start(a, node_of);
	REQUIRE(r == 0, "cannot start the nodes: %s", strerror(-r));
	setenv("ZEROD_CKPT_V1", "1", 1); /* the ranks inherit it */
	run_script(a);
	unsetenv("ZEROD_CKPT_V1");
	REQUIRE(!test_failed_, "the checkpointing job failed");
	CHECK(manifest_line(a->dir, "zerod-checkpoint ", line, sizeof(line)) && atoi(line) == 1,
	      "the manifest is not of version 1");
	snprintf(path, sizeof(path), "%s/state.zck", ckpt_gen(a->dir, gen, sizeof(gen)));
	CHECK(stat(path, &st) == 0, "no %s", path);
	ref_train_nodes(want, a->opt, a->seed, 3, node_of, 3, 5);
	b->nnodes = 2;
	memcpy(b->node_of, node_of, sizeof(node_of));
	memcpy(b->socks, a->socks, sizeof(a->socks));
	snprintf(b->rdzv, sizeof(b->rdzv), "%s", a->rdzv);
	snprintf(b->dir, sizeof(b->dir), "%s", a->dir);
	b->restore = true;
	b->restore_at = 3;
	b->iters = 5;
	b->want = want;
	run_script(b);
	nodes_stop();
}

/* ---------------------------------------------- zeroctl checkpoint --- */

/* zeroctl -s SOCK -o json ARGS... with stdout into out: its exit status. */
static int zeroctl(const char *sock, const char *out, const char *a1, const char *a2,
		   const char *a3)
{
	const char *bin = getenv("ZEROCTL_BIN");
	const char *argv[] = {bin ? bin : "zeroctl", "-s", sock, "-o", "json", a1, a2, a3, NULL};
	pid_t pid;

	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		if (fd < 0)
			_exit(126);
		dup2(fd, 1);
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	return pid < 0 ? -1 : wait_child(pid, test_timeout(30000));
}

static long long json_int(const char *path, const char *key)
{
	char buf[4096], *p;
	FILE *f = fopen(path, "re");
	size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;

	if (f)
		fclose(f);
	buf[n] = '\0';
	p = strstr(buf, key);
	return p ? strtoll(p + strlen(key), NULL, 10) : -1;
}

/* The operator asks a running job (2 ranks, one zerod started with
 * --checkpoint-dir) for a checkpoint with no directory: zeroctl names the
 * iteration and CHECKPOINT_DIR/JOB; both ranks see zc_checkpoint_due() at
 * that iteration and write it; the manifest names it; a job restoring it
 * trains on to the reference. An unknown job: exit 1. */
static void t_zeroctl_checkpoint(void)
{
	struct script *sc = script_new("opctl", 2, ZC_OPT_SGD, ZC_SHARD_SLICE, ZC_STEP_AT_END);
	struct script *b =
		script_new("opctl-restored", 2, ZC_OPT_SGD, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED);
	struct snap *want = test_shared(sizeof(*want));
	char cdir[200], args0[220], out[256], manifest[420], line[64];
	const char *args[] = {"--checkpoint-dir", args0, NULL};
	struct zd own;
	pid_t pids[2];
	long long at;
	int r;

	snprintf(cdir, sizeof(cdir), "%s/operator", daemon_.dir);
	snprintf(args0, sizeof(args0), "%s", cdir);
	r = zd_start(&own, args);
	REQUIRE(r == 0, "cannot start zerod: %s", strerror(-r));
	snprintf(sc->socks[0], sizeof(sc->socks[0]), "%s", own.sock);
	snprintf(b->socks[0], sizeof(b->socks[0]), "%s", own.sock);
	snprintf(out, sizeof(out), "%s/zeroctl.json", daemon_.dir);
	sc->iters = 30;
	sc->poll_due = true;
	sc->sleep_ms = 20;
	for (int k = 0; k < 2; k++)
		atomic_store(&sc->due_at[k], -1);
	spawn_all(sc, pids);
	while (atomic_load(&sc->done) < 3 && proc_alive(pids[0]))
		usleep(1000);
	r = zeroctl(own.sock, out, "checkpoint", "opctl", NULL);
	CHECK(r == 0, "zeroctl checkpoint opctl: exit %d", r);
	at = json_int(out, "\"iteration\":");
	CHECK(at >= 3 && at < 30, "zeroctl named iteration %lld", at);
	CHECK(json_int(out, "\"ranks\":") == 2, "zeroctl told %lld ranks",
	      json_int(out, "\"ranks\":"));
	wait_all(sc, pids);
	for (int k = 0; k < 2; k++)
		CHECK(atomic_load(&sc->due_at[k]) == at,
		      "rank %d checkpointed at %d, zeroctl said %lld", k,
		      atomic_load(&sc->due_at[k]), at);
	{
		char top[400], gen[400];
		snprintf(top, sizeof(top), "%s/opctl", cdir);
		snprintf(manifest, sizeof(manifest), "%s/MANIFEST",
			 ckpt_gen(top, gen, sizeof(gen)));
	}
	{
		FILE *f = fopen(manifest, "re");
		bool found = false;
		char want_line[64];
		snprintf(want_line, sizeof(want_line), "iteration %lld\n", at);
		while (f && fgets(line, sizeof(line), f))
			found = found || strcmp(line, want_line) == 0;
		if (f)
			fclose(f);
		CHECK(found, "%s does not name iteration %lld", manifest, at);
	}
	r = zeroctl(own.sock, out, "checkpoint", "no-such-job", NULL);
	CHECK(r == 1, "zeroctl checkpoint of no job: exit %d, want 1", r);
	if (at > 0 && at < 30) {
		snap_init(want, sc->seed);
		ref_train_nodes(want, ZC_OPT_SGD, sc->seed, 2, NULL, 0, (int)at + 2);
		snprintf(b->dir, sizeof(b->dir), "%s/opctl", cdir);
		b->restore = true;
		b->restore_at = (uint64_t)at;
		b->iters = (int)at + 2;
		b->want = want;
		run_script(b);
	}
	if (test_failed_)
		zd_dump_log(&own);
	CHECK(zd_stop(&own, 10000) == 0, "zerod did not stop cleanly");
}

static const struct test_case cases[] = {
	{"crash_sgd_restart_equals_uninterrupted", t_crash_sgd, 120000},
	{"crash_adam_restart_equals_uninterrupted", t_crash_adam, 120000},
	{"restore_other_world_shard_layout_sgd", t_restore_other_layout_sgd, 90000},
	{"restore_other_world_shard_layout_adamw", t_restore_other_layout_adamw, 90000},
	{"restore_by_position_adam", t_restore_by_position_adam, 90000},
	{"replan_between_checkpoints_restores", t_replan_between_checkpoints, 90000},
	{"bad_checkpoints_ECKPT_job_beside_trains", t_bad_checkpoints, 180000},
	{"unwritable_dir_ECKPT_from_checkpoint_wait", t_unwritable_dir, 60000},
	{"zeroctl_checkpoint_at_next_boundary", t_zeroctl_checkpoint, 120000},
	{"killed_while_writing_restores_previous_or_new", t_killed_while_writing, 180000},
};

static const struct test_case node_cases[] = {
	{"nodes_crash_restart_equals_uninterrupted", t_nodes_crash, 180000},
	{"nodes_restore_other_world", t_nodes_restore_other_world, 120000},
	{"nodes_files_per_node_spoils_refused_restore_one_node", t_nodes_files_per_node, 120000},
	{"nodes_v1_writer_still_restores", t_nodes_v1_still_restores, 120000},
	{"nodes_dir_used_again_by_another_run", t_nodes_stale_run, 120000},
};

int main(int argc, char **argv)
{
	static const char *const extra[] = {"--rejoin-timeout", "0", NULL};

	/* TEST_CKPT_NODES=1: the cases over two zerods (they need gloo) */
	if (getenv("TEST_CKPT_NODES"))
		return zd_test_main(&daemon_, extra, node_cases,
				    sizeof(node_cases) / sizeof(node_cases[0]), argc, argv);
	/* recovery from disk: a dead trainer fails its job (--rejoin-timeout
	 * 0), the in-memory recovery is tests/reliability/test_recovery.c's */
	return zd_test_main(&daemon_, extra, cases, sizeof(cases) / sizeof(cases[0]), argc, argv);
}
