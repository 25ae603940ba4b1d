/*
 * recovery.c — zerod-bench --recovery (issue 23 §3): what a trainer's death
 * costs, through zerod's memory and through the disk, in one run.
 *
 * Each round runs one job of cfg's plan (--params, Adam by default) with
 * cfg->ranks forked trainer processes on one zerod, twice, in alternating
 * order:
 *  - memory: zerod with --rejoin-timeout. After WARM iterations the bench
 *    SIGKILLs the last rank in the middle of an iteration (half its buckets
 *    handed over), then ends the others (SIGKILL, as torchrun's agent ends
 *    a worker group) and starts the group again at once. The new ranks
 *    rejoin the job id; zc_register_plan() brings the parameters back
 *    (zc_recovered()), and they train on.
 *  - disk: zerod with --rejoin-timeout 0, a zc_checkpoint() every CKPT_EVERY
 *    iterations (waited for until durable, as a job that restores must).
 *    The same death; the new group forms the job again and zc_restore()s
 *    the last checkpoint.
 * With --daemons 2 the job spans two zerods on loopback (the ranks split
 * as in jobs.c, the victim on node 1): the memory path re-forms over both
 * (reform.c), the disk path restores on both.
 * Timed: from the SIGKILL to the first iteration the new group completes
 * (its StepDone on rank 0), and within it the restart of the processes
 * (the old group reaped, the new one forked and connected: zc_connect()
 * returned on every rank), which neither path can shorten. Also: the
 * iterations lost (the last completed before the death minus the one the
 * job goes on at) and the checkpoint bytes the restart read (the memory
 * path calls no zc_restore(): 0). Printed per round and as median [min-max]
 * with the ratio disk / memory in each round.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"

#define WARM       12 /* iterations before the death */
#define CKPT_EVERY 5  /* the disk path's checkpoints: after iterations 5, 10 */
#define MAX_RANKS  8
#define MAX_NODES  4
#define ROUNDS_MAX 9
#define TIMED_LO   1 /* iterations timed before the death: [TIMED_LO, TIMED_HI), */
#define TIMED_HI   5 /* before the disk path's first checkpoint */

struct rshared {
	atomic_int done[MAX_RANKS];       /* iterations each rank completed (StepDone) */
	atomic_llong first_ns[MAX_RANKS]; /* restarted group: its first StepDone */
	atomic_llong back_ns[MAX_RANKS];  /* ... and the one of the iteration cut short */
	atomic_llong connected_ns[MAX_RANKS];
	atomic_llong resumed[MAX_RANKS]; /* the iteration the restarted rank went on at */
	atomic_int ckpt_durable;         /* the last checkpoint's iteration, durable */
	atomic_llong iter_ns[MAX_RANKS][TIMED_HI]; /* first group: each timed iteration */
	char why[MAX_RANKS][160];
};

struct rrun {
	const struct bench_cfg *cfg;
	const struct bench_daemon *d; /* [nodes] */
	uint32_t nodes;
	char rdzv[32], secret[33]; /* nodes >= 2 */
	const char *job, *dir;
	bool disk, restarted;
	int die_at; /* the victim's iteration (half its buckets), -1: none */
	uint32_t victim;
	struct rshared *sh;
	struct zc_plan plan;
	struct zc_bucket buckets[64];
	struct zc_segment segs[64];
	struct zc_param_group group;
};

static void fill(float *p, uint64_t n, float v)
{
	for (uint64_t i = 0; i < n; i++)
		p[i] = v;
}

static void make_plan(struct rrun *rr)
{
	const struct bench_cfg *c = rr->cfg;
	uint64_t left = c->params;

	zc_plan_init(&rr->plan, sizeof(rr->plan));
	rr->group = c->hp;
	rr->plan.optimizer = c->optim;
	rr->plan.shard_mode = c->shard;
	rr->plan.step_mode = c->step;
	rr->plan.groups = &rr->group;
	rr->plan.ngroups = 1;
	rr->plan.nbuckets = c->nbuckets < 64 ? c->nbuckets : 64;
	for (uint32_t b = 0; b < rr->plan.nbuckets; b++) {
		uint64_t n = b + 1 == rr->plan.nbuckets ? left : c->bucket_numel;
		zc_segment_init(&rr->segs[b], sizeof(rr->segs[b]));
		rr->segs[b].numel = n;
		zc_bucket_init(&rr->buckets[b], sizeof(rr->buckets[b]));
		rr->buckets[b].numel = n;
		rr->buckets[b].segments = &rr->segs[b];
		rr->buckets[b].nsegments = 1;
		left -= n;
	}
	rr->plan.buckets = rr->buckets;
}

static int rank_loop(struct rrun *rr, uint32_t rank, zc_client *c, int until)
{
	const struct zc_plan *p = &rr->plan;
	int r = 0;

	while (r >= 0 && (int)zc_iteration(c) < until) {
		uint64_t t = zc_iteration(c);
		zc_future *step = NULL;
		int64_t t0 = bench_ns();

		for (uint32_t b = 0; b < p->nbuckets && r >= 0; b++) {
			if (rank == rr->victim && (int)t == rr->die_at && b == p->nbuckets / 2)
				pause(); /* the bench kills it here */
			fill(zc_grad_buffer(c, b), p->buckets[b].segments[0].numel,
			     (float)(1 + rank) * 1e-3f * (float)(1 + t % 7));
			r = zc_bucket_ready(c, b, NULL);
		}
		if (r >= 0)
			r = zc_step_future(c, t, &step);
		if (r >= 0)
			r = zc_future_wait(step, 120000);
		if (r == 0)
			r = ZC_ETIMEDOUT;
		zc_future_free(step);
		if (r < 0)
			break;
		if (!rr->restarted && t >= TIMED_LO && t < TIMED_HI)
			atomic_store(&rr->sh->iter_ns[rank][t], (long long)(bench_ns() - t0));
		atomic_store(&rr->sh->done[rank], (int)t + 1);
		if (rr->restarted && atomic_load(&rr->sh->first_ns[rank]) == 0)
			atomic_store(&rr->sh->first_ns[rank], (long long)bench_ns());
		if (rr->restarted && (int)t == WARM)
			atomic_store(&rr->sh->back_ns[rank], (long long)bench_ns());
		if (rr->disk && (t + 1) % CKPT_EVERY == 0) {
			r = zc_checkpoint(c, rr->dir);
			if (r >= 0)
				r = zc_checkpoint_wait(c, 120000);
			if (r >= 0 && rank == 0)
				atomic_store(&rr->sh->ckpt_durable, (int)t + 1);
		}
	}
	return r;
}

static int rank_main(struct rrun *rr, uint32_t rank)
{
	struct zc_config cfg;
	zc_client *c = NULL;
	uint64_t at = 0;
	int r;

	zc_config_init(&cfg, sizeof(cfg));
	cfg.socket = rr->d[0].sock;
	cfg.job_id = rr->job;
	cfg.rank = rank;
	cfg.world_size = rr->cfg->ranks;
	cfg.local_rank = rank;
	cfg.local_size = rr->cfg->ranks;
	if (rr->nodes >= 2) {
		uint32_t node;

		bench_node_of(rr->nodes, rr->cfg->ranks, rank, &node, &cfg.local_rank,
			      &cfg.local_size);
		cfg.socket = rr->d[node].sock;
		cfg.rdzv = rr->rdzv;
		cfg.job_secret = rr->secret;
		cfg.nnodes = rr->nodes;
		cfg.node_rank = node;
		cfg.has_node_rank = 1;
	}
	cfg.register_timeout_ms = 120000;
	/* over several zerods the failed job's record stays a moment while
	 * its nodes stop it (ZC_EJOBFAILED): the disk path's new group asks
	 * again, as a restarted script would, and that wait is its cost */
	for (int tries = 0;; tries++) {
		r = zc_connect(&cfg, &c);
		if (r >= 0 && tries == 0) /* the process is up: what neither path can shorten */
			atomic_store(&rr->sh->connected_ns[rank], (long long)bench_ns());
		if (r >= 0)
			r = zc_alloc_buffers(c, &rr->plan);
		if (r >= 0) {
			for (uint32_t b = 0; b < rr->plan.nbuckets; b++)
				fill(zc_param_buffer(c, b), rr->plan.buckets[b].segments[0].numel,
				     0.5f);
			r = zc_register_plan(c);
		}
		if (r != ZC_EJOBFAILED || !rr->disk || !rr->restarted || tries >= 3000)
			break;
		zc_close(c);
		c = NULL;
		usleep(10000);
	}
	if (r >= 0 && rr->restarted && rr->disk)
		r = zc_restore(c, rr->dir);
	if (r >= 0 && rr->restarted && !rr->disk && zc_recovered(c, &at) != 1)
		r = -EPROTO; /* the memory path must find its job */
	if (r >= 0 && rr->restarted)
		atomic_store(&rr->sh->resumed[rank], (long long)zc_iteration(c));
	if (r >= 0)
		r = rank_loop(rr, rank, c, rr->restarted ? WARM + 3 : WARM + 1);
	if (r < 0)
		snprintf(rr->sh->why[rank], sizeof(rr->sh->why[rank]), "%s: %s",
			 zc_strerror_name(r), zc_error_message());
	zc_close(c);
	return r < 0 ? 1 : 0;
}

static void spawn_group(struct rrun *rr, pid_t *pids)
{
	for (uint32_t k = 0; k < rr->cfg->ranks; k++) {
		fflush(NULL);
		pids[k] = fork();
		if (pids[k] == 0)
			_exit(rank_main(rr, k));
	}
}

static int wait_group(const struct bench_cfg *cfg, pid_t *pids, int *st)
{
	int bad = 0;

	for (uint32_t k = 0; k < cfg->ranks; k++) {
		int s = 0;
		if (pids[k] > 0 && waitpid(pids[k], &s, 0) < 0)
			return -errno;
		st[k] = WIFEXITED(s) ? WEXITSTATUS(s) : 128 + WTERMSIG(s);
		bad += st[k] != 0;
	}
	return bad;
}

struct round_result {
	double recover_ms; /* SIGKILL to the new group's first StepDone */
	double back_ms;    /* SIGKILL to the StepDone of the iteration the death cut short */
	double start_ms;   /* of it: fork to every rank connected and registered */
	int lost;          /* iterations lost */
	double iter_ms;    /* the median timed iteration before the death, the slowest rank's */
	uint64_t read_bytes;
};

static int cmp_d(const void *a, const void *b);

static double timed_iter_ms(const struct bench_cfg *cfg, struct rshared *sh)
{
	double v[TIMED_HI];
	int n = 0;

	for (int t = TIMED_LO; t < TIMED_HI; t++) {
		long long worst = 0;
		for (uint32_t k = 0; k < cfg->ranks; k++)
			if (atomic_load(&sh->iter_ns[k][t]) > worst)
				worst = atomic_load(&sh->iter_ns[k][t]);
		v[n++] = (double)worst / 1e6;
	}
	qsort(v, (size_t)n, sizeof(*v), cmp_d);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static uint64_t dir_bytes(const char *dir)
{
	char cmd[512], out[64];
	FILE *f;
	unsigned long long n = 0;

	snprintf(cmd, sizeof(cmd), "du -sb '%s' 2>/dev/null | cut -f1", dir);
	f = popen(cmd, "r");
	if (f && fgets(out, sizeof(out), f))
		n = strtoull(out, NULL, 10);
	if (f)
		pclose(f);
	return n;
}

static void stop_all(struct bench_daemon *d, uint32_t n)
{
	for (uint32_t k = 0; k < n; k++)
		(void)daemon_stop(&d[k]);
}

/* One path's round: 0, or -1 with the reason on stderr. */
static int one_round(const struct bench_cfg *cfg, bool disk, int round, struct round_result *ret)
{
	char rejoin[16], job[64], dir[256];
	/* the memory path with the undo journal: the death falls between the
	 * buckets of an interleaved iteration (a no-op at_end) */
	const char *extra[] = {"--rejoin-timeout", rejoin, disk ? NULL : "--recovery-journal",
			       NULL};
	struct bench_daemon d[MAX_NODES] = {{{0}}};
	uint32_t nodes = cfg->daemons >= 2 ? cfg->daemons : 1;
	struct rshared *sh =
		mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	struct rrun rr = {.cfg = cfg,
			  .d = d,
			  .nodes = nodes,
			  .disk = disk,
			  .sh = sh,
			  .die_at = WARM,
			  .victim = cfg->ranks - 1};
	pid_t pids[MAX_RANKS];
	int st[MAX_RANKS], r, last = 0;
	int64_t t0, t_conn = 0, t_first = 0;

	if (sh == MAP_FAILED)
		return -1;
	memset(sh, 0, sizeof(*sh));
	snprintf(rejoin, sizeof(rejoin), "%d", disk ? 0 : 60000);
	snprintf(job, sizeof(job), "bench-rec-%s-%d", disk ? "disk" : "mem", round);
	r = nodes >= 2 ? bench_rdzv(rr.rdzv, rr.secret) : 0;
	for (uint32_t k = 0; k < nodes && r >= 0; k++)
		if ((r = daemon_start_args(&d[k], cfg->zerod, extra)) < 0)
			stop_all(d, k);
	if (r < 0) {
		fprintf(stderr, "zerod-bench --recovery: cannot start zerod: %s\n", strerror(-r));
		munmap(sh, sizeof(*sh));
		return -1;
	}
	snprintf(dir, sizeof(dir), "%s/ckpt", d[0].dir);
	rr.job = job;
	rr.dir = dir;
	make_plan(&rr);
	spawn_group(&rr, pids);
	/* until the victim is in iteration WARM: every rank completed WARM (or
	 * a rank ended: it says why) */
	for (int i = 0; i < 1200000 && atomic_load(&sh->done[0]) < WARM; i++) {
		int s;
		pid_t gone = waitpid(-1, &s, WNOHANG);
		if (gone > 0) {
			for (uint32_t k = 0; k < cfg->ranks; k++)
				if (pids[k] == gone)
					pids[k] = -1;
			for (uint32_t k = 0; k < cfg->ranks; k++)
				if (pids[k] > 0)
					kill(pids[k], SIGKILL);
			wait_group(cfg, pids, st);
			for (uint32_t k = 0; k < cfg->ranks; k++)
				if (sh->why[k][0])
					fprintf(stderr, "zerod-bench --recovery: rank %u: %s\n", k,
						sh->why[k]);
			stop_all(d, nodes);
			munmap(sh, sizeof(*sh));
			return -1;
		}
		usleep(100);
	}
	usleep(50000); /* the victim at its pause(), half its buckets in */
	for (uint32_t k = 0; k < cfg->ranks; k++)
		if (atomic_load(&sh->done[k]) > last)
			last = atomic_load(&sh->done[k]);
	t0 = bench_ns();
	kill(pids[rr.victim], SIGKILL);
	for (uint32_t k = 0; k < cfg->ranks; k++) /* the agent ends the group */
		if (k != rr.victim)
			kill(pids[k], SIGKILL);
	wait_group(cfg, pids, st);
	rr.restarted = true;
	rr.die_at = -1;
	spawn_group(&rr, pids);
	r = wait_group(cfg, pids, st);
	for (uint32_t k = 0; k < cfg->ranks; k++) {
		long long c = atomic_load(&sh->connected_ns[k]), f = atomic_load(&sh->first_ns[k]);
		t_conn = c > t_conn ? c : t_conn;
		if (k == 0)
			t_first = f;
		if (st[k] != 0)
			fprintf(stderr, "zerod-bench --recovery: %s round %d: rank %u: %s\n",
				disk ? "disk" : "memory", round, k, sh->why[k]);
	}
	*ret = (struct round_result){
		.recover_ms = (double)(t_first - t0) / 1e6,
		.back_ms = (double)(atomic_load(&sh->back_ns[0]) - t0) / 1e6,
		.start_ms = (double)(t_conn - t0) / 1e6,
		.lost = last - (int)atomic_load(&sh->resumed[0]),
		.iter_ms = timed_iter_ms(cfg, sh),
		.read_bytes = disk ? dir_bytes(dir) : 0,
	};
	stop_all(d, nodes);
	munmap(sh, sizeof(*sh));
	return r == 0 && t_first > 0 ? 0 : -1;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static void stats(const double *v, int n, double *med, double *lo, double *hi)
{
	double s[ROUNDS_MAX];

	memcpy(s, v, (size_t)n * sizeof(*s));
	qsort(s, (size_t)n, sizeof(*s), cmp_d);
	*lo = s[0];
	*hi = s[n - 1];
	*med = n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

/* One JSON key of n per-round values. */
static void json_list(const char *key, const double *v, int n)
{
	printf("  \"%s\": [", key);
	for (int k = 0; k < n; k++)
		printf("%s%.2f", k ? ", " : "", v[k]);
	printf("],\n");
}

int bench_recovery(const struct bench_cfg *cfg, int rounds, bool json)
{
	struct round_result mem[ROUNDS_MAX], disk[ROUNDS_MAX];
	double m[ROUNDS_MAX], dk[ROUNDS_MAX], ratio[ROUNDS_MAX], mx[ROUNDS_MAX], ms[ROUNDS_MAX];
	double mb[ROUNDS_MAX], db[ROUNDS_MAX], s[3][3], beyond[3], sb[2][3];
	double jr[ROUNDS_MAX], sj[3];

	if (rounds < 1 || rounds > ROUNDS_MAX || cfg->ranks < 2 || cfg->ranks > MAX_RANKS ||
	    cfg->daemons > MAX_NODES) {
		fprintf(stderr,
			"zerod-bench --recovery: 1..%d rounds, 2..%d ranks, at most %d "
			"daemons\n",
			ROUNDS_MAX, MAX_RANKS, MAX_NODES);
		return -EINVAL;
	}
	for (int k = 0; k < rounds; k++) {
		/* alternating: memory first in even rounds, disk first in odd */
		for (int i = 0; i < 2; i++) {
			bool d = (i == 0) == (k % 2 == 1);
			fprintf(stderr, "zerod-bench --recovery: round %d/%d, %s\n", k + 1, rounds,
				d ? "disk" : "memory");
			if (one_round(cfg, d, k, d ? &disk[k] : &mem[k]) < 0)
				return -EIO;
		}
		m[k] = mem[k].recover_ms;
		dk[k] = disk[k].recover_ms;
		ratio[k] = dk[k] / m[k];
		ms[k] = mem[k].start_ms;
		mb[k] = mem[k].back_ms;
		db[k] = disk[k].back_ms;
		mx[k] = mem[k].recover_ms - mem[k].start_ms;
		jr[k] = mem[k].iter_ms / disk[k].iter_ms;
	}
	stats(jr, rounds, &sj[0], &sj[1], &sj[2]);
	stats(m, rounds, &s[0][0], &s[0][1], &s[0][2]);
	stats(dk, rounds, &s[1][0], &s[1][1], &s[1][2]);
	stats(ratio, rounds, &s[2][0], &s[2][1], &s[2][2]);
	stats(mx, rounds, &beyond[0], &beyond[1], &beyond[2]);
	stats(mb, rounds, &sb[0][0], &sb[0][1], &sb[0][2]);
	stats(db, rounds, &sb[1][0], &sb[1][1], &sb[1][2]);
	if (json) {
		printf("{\n  \"schema\": \"zerod-bench-recovery/1\",\n  \"params\": %" PRIu64
		       ",\n  \"ranks\": %u,\n  \"daemons\": %u,\n  \"optimizer\": %d,\n  "
		       "\"rounds\": %d,\n",
		       cfg->params, cfg->ranks, cfg->daemons >= 2 ? cfg->daemons : 1,
		       (int)cfg->optim, rounds);
		double ji[ROUNDS_MAX], pi[ROUNDS_MAX];
		for (int k = 0; k < rounds; k++) {
			ji[k] = mem[k].iter_ms;
			pi[k] = disk[k].iter_ms;
		}
		json_list("memory_recover_ms", m, rounds);
		json_list("memory_start_ms", ms, rounds);
		json_list("disk_recover_ms", dk, rounds);
		json_list("memory_back_ms", mb, rounds);
		json_list("disk_back_ms", db, rounds);
		json_list("journal_iter_ms", ji, rounds);
		json_list("plain_iter_ms", pi, rounds);
		printf("  \"journal_over_plain_median\": %.3f,\n", sj[0]);
		json_list("disk_over_memory", ratio, rounds);
		printf("  \"memory_lost_iterations\": %d,\n  \"disk_lost_iterations\": %d,\n",
		       mem[0].lost, disk[0].lost);
		printf("  \"memory_checkpoint_bytes_read\": 0,\n  \"disk_checkpoint_bytes\": "
		       "%" PRIu64 ",\n",
		       disk[0].read_bytes);
		printf("  \"memory_back_ms_median\": %.1f,\n  \"disk_back_ms_median\": %.1f,\n",
		       sb[0][0], sb[1][0]);
		printf("  \"memory_recover_ms_median\": %.1f,\n  "
		       "\"memory_beyond_start_ms_median\": "
		       "%.1f,\n  \"disk_recover_ms_median\": %.1f,\n  \"disk_over_memory_median\": "
		       "%.2f,\n  \"target_beyond_start_ms\": 2000,\n  \"target_disk_over_memory\": "
		       "10,\n"
		       "  \"replicas\": \"not built: issue 23 section 2 is not done\"\n}\n",
		       s[0][0], beyond[0], s[1][0], s[2][0]);
		return 0;
	}
	printf("zerod-bench --recovery: %.1fM params, %u ranks on %u zerod%s, %d alternating "
	       "rounds; a rank SIGKILLed in iteration %d, the group restarted at once\n",
	       (double)cfg->params / 1e6, cfg->ranks, cfg->daemons >= 2 ? cfg->daemons : 1,
	       cfg->daemons >= 2 ? "s" : "", rounds, WARM);
	printf("  from zerod's memory: %.1f ms [%.1f-%.1f] to the next iteration done; of it "
	       "beyond the new processes' start: %.1f ms [%.1f-%.1f] (target < 2000); %d "
	       "iterations lost, no checkpoint read\n",
	       s[0][0], s[0][1], s[0][2], beyond[0], beyond[1], beyond[2], mem[0].lost);
	printf("  from the disk (zc_checkpoint every %d, zc_restore): %.1f ms [%.1f-%.1f]; %d "
	       "iterations lost, %.1f MB of checkpoint\n",
	       CKPT_EVERY, s[1][0], s[1][1], s[1][2], disk[0].lost,
	       (double)disk[0].read_bytes / 1e6);
	printf("  disk / memory, per round: %.1fx [%.1f-%.1f] (target >= 10)\n", s[2][0], s[2][1],
	       s[2][2]);
	printf("  back at the iteration the death cut short: memory %.1f ms [%.1f-%.1f], disk "
	       "%.1f ms [%.1f-%.1f]\n",
	       sb[0][0], sb[0][1], sb[0][2], sb[1][0], sb[1][1], sb[1][2]);
	printf("  an iteration with the undo journal (the memory path, before the death) over "
	       "one without (the disk path's, before its first checkpoint): %.3fx [%.3f-%.3f]\n",
	       sj[0], sj[1], sj[2]);
	printf("  replicas (--replicas 1) and a killed zerod: not measured, not built yet\n");
	return 0;
}
