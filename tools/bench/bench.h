/*
 * bench.h — what the pieces of zerod-bench share: the configuration of one
 * run, the floors measured without zerod (floors.c), and the jobs run through
 * a real zerod (jobs.c). zerod-bench.c parses the flags and prints the report.
 */
#ifndef ZEROD_BENCH_H
#define ZEROD_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "zeroclient.h"

/* --tls[=R]: at most this many rounds */
#define TLS_ROUNDS_MAX 9

struct bench_cfg {
	uint64_t params;   /* fp32 elements over all buckets */
	uint32_t nbuckets; /* buckets of bucket_numel (the last one may be shorter) */
	uint64_t bucket_numel;
	uint32_t ranks;
	enum zc_optimizer optim;
	enum zc_shard_mode shard;
	enum zc_step_mode step;
	struct zc_param_group hp;
	int iters, warmup;
	int handoff_iters;   /* tiny-bucket iterations for the handoff latency */
	unsigned threads;    /* threads of the fused reference and triad (CPUs online) */
	size_t memcpy_bytes; /* what the memcpy floor copies */
	const char *zerod;   /* the daemon binary */
	uint32_t daemons;    /* 0: one daemon; N >= 2: N daemons on loopback (--daemons) */
	int checkpoint_every;       /* zc_checkpoint() after every N timed iterations; 0: never */
	const char *checkpoint_dir; /* where (--checkpoint-dir; default a temporary one) */
	bool checkpoint_sync;       /* the stall timed includes zc_checkpoint_wait() */
	int tls;      /* --daemons --tls[=R]: R rounds alternating plain and TLS; 0: none */
	bool overlap; /* also the overlapped kind: fill + hand-over, bucket by bucket (jobs.c) */
	bool cold;    /* evict the caches before every timed region (bench_evict) */
};

/* Monotonic time in nanoseconds. */
int64_t bench_ns(void);
/* The q-quantile (0..1) of n samples; sorts v in place. */
double bench_quantile(double *v, size_t n, double q);
/* Floats of optimizer state per element the daemon must hold for cfg. */
unsigned bench_state_floats(const struct bench_cfg *cfg);

/* ---- floors.c: measured in this process, no zerod ---- */

/* Single-thread memcpy: bytes copied per second, best of a few, in GB/s. */
int floor_memcpy_gbps(size_t bytes, double *ret_gbps);
/* STREAM triad a = b + s*c over arrays of `bytes` on `threads` threads,
 * counted as STREAM does (3 arrays; the write-allocate read of a is not
 * counted), best of a few; nt: with non-temporal stores (no write-allocate
 * then); cold: the caches emptied before each pass. */
int floor_triad_gbps(size_t bytes, unsigned threads, bool nt, bool cold, double *ret_gbps);
/* Median round trip of a 64-byte message over an AF_UNIX socketpair to a
 * forked echo process, in microseconds; this process pinned to cpu_a while it
 * measures, the echo to cpu_b (< 0: not pinned). */
int floor_unix_rtt_us(int iters, int cpu_a, int cpu_b, double *ret_us);
/* Stream over a buffer of 4x the last-level cache (at least 64 MiB), read
 * and written, so that no cache holds what was touched before. */
void bench_evict(void);
/* The last-level cache's size in bytes (sysfs; 32 MiB if it does not say). */
size_t bench_llc_bytes(void);
/* The first two CPUs this process may run on (-1 where there are fewer);
 * returns how many it found. */
int floor_two_cpus(int *ret_a, int *ret_b);
/* Median and fastest time of the plain-C fused pass over cfg's bytes (see
 * floors.c), in milliseconds. */
int floor_fused_ms(const struct bench_cfg *cfg, double *ret_ms, double *ret_min_ms);
/* Bytes one iteration must move through memory at the least (see floors.c). */
double floor_bytes_moved(const struct bench_cfg *cfg);
/* The same counting the write-allocate read of every buffer only written. */
double floor_bytes_moved_wa(const struct bench_cfg *cfg);
/* The same when the ranks share one parameter buffer: it is written once
 * (and read, so both countings agree). */
double floor_bytes_shared(const struct bench_cfg *cfg);

/* ---- jobs.c: a real zerod and real trainer processes ---- */

struct bench_daemon {
	char dir[128];
	char sock[192];
	char log[192];
	pid_t pid;
};

/* Remove the files in directory path (not below), then the directory. */
void bench_rmdir(const char *path);
/* Run shell command cmd (a script printing one JSON object a line) and keep
 * its last line that opens with '{' in last (len bytes). 0, -errno if it
 * could not start, or -EIO if it failed or printed no such line. */
int bench_last_json(const char *cmd, char *last, size_t len);

/* Start cfg->zerod on a socket in a fresh temporary directory. 0 or -errno. */
int daemon_start(struct bench_daemon *d, const char *bin);
/* The same with the flags in extra besides (NULL-terminated, at most 8). */
int daemon_start_args(struct bench_daemon *d, const char *bin, const char *const *extra);
/* SIGTERM, wait, remove the directory. 0, or -errno / the exit status. */
int daemon_stop(struct bench_daemon *d);
/* A job over several daemons: a free loopback port for node 0's
 * rendezvous ("127.0.0.1:PORT", bound, read back and closed: the daemon
 * binds it a moment later) and a random secret (hex). 0 or -errno. */
int bench_rdzv(char rdzv[32], char secret[33]);
/* Where rank of world sits over `nodes` daemons: node k holds the
 * contiguous ranks [k*world/nodes, (k+1)*world/nodes). */
void bench_node_of(uint32_t nodes, uint32_t world, uint32_t rank, uint32_t *node,
		   uint32_t *local_rank, uint32_t *local_size);

struct job_result {
	double iter_ms;          /* median over iterations of the slowest rank's time */
	double iter_min_ms;      /* fastest iteration */
	double fill_ms;          /* median of the gradient fill alone, the slowest rank's */
	/* cfg->overlap: the median of the overlapped kind (each bucket filled
	 * and handed over at once, first fill to step done), and it minus
	 * fill_ms: the figure accounted as torch's (synced - no_sync); NAN
	 * without it */
	double overlap_ms, comparable_ms;
	uint64_t rss_anon_bytes; /* zerod's RssAnon with the job active */
	/* zerod's CPU time (utime + stime) per timed iteration of the hand-over
	 * and of the overlapped kind, in ms (node 0's daemon; clock ticks summed
	 * over the run, so read it over many iterations) */
	double zerod_cpu_ms, zerod_overlap_cpu_ms;
	int checkpoints;         /* zc_checkpoint() calls timed (--checkpoint-every) */
	double ckpt_ms;          /* their median, the slowest rank's: zc_checkpoint() this long */
	double ckpt_max_ms;
	/* The extra time of an iteration that checkpoints (its slowest rank's
	 * iteration + zc_checkpoint()) over the median iteration that does not:
	 * median and slowest over the checkpoints. */
	double ckpt_stall_ms, ckpt_stall_max_ms;
	/* The staging copy's floor, measured in the same run: one memcpy of the
	 * bytes a checkpoint stages (parameters and state) into a warm buffer
	 * by rank 0 between the iterations before each checkpoint's; the
	 * median over the checkpoints. */
	double ckpt_copy_ms;
	uint64_t ckpt_bytes;
};

/* With cfg->daemons = N >= 2, d is an array of N daemons, one per node: node
 * k holds the contiguous ranks [k*R/N, (k+1)*R/N), and the job meets at a
 * rendezvous on a free loopback port served by node 0's daemon, with a
 * random secret. */
/* The main job: cfg's plan, warmup + iters iterations; each rank fills its
 * gradients, waits for the others, then times bucket_ready of every bucket
 * up to its step future. */
/* With ret_shared, a second job beside it of the same plan whose ranks share
 * one parameter buffer (ZC_BUFFERS_SHARED_PARAMS): the two take turns, one
 * iteration each, so both see the same machine; its times go to ret_shared,
 * and zerod's RssAnon then holds both jobs' state. */
int job_iterations(const struct bench_daemon *d, const struct bench_cfg *cfg,
		   struct job_result *ret, struct job_result *ret_shared);
/* The handoff job: one bucket of 16 elements; zc_bucket_ready to the step
 * future done, per rank and iteration, p50 and p99 in microseconds. */
int job_handoff(const struct bench_daemon *d, const struct bench_cfg *cfg, double *ret_p50_us,
		double *ret_p99_us);

/* ---- recovery.c ---- */

/* zerod-bench --recovery: a trainer of cfg's job SIGKILLed and its group
 * restarted, through zerod's memory and through the disk, `rounds`
 * alternating rounds; a table, or with json one object. 0, or -errno. */
int bench_recovery(const struct bench_cfg *cfg, int rounds, bool json);

/* ---- gloo_raw.c (only where gloo is built) ---- */

/* gloo's own all-reduce between `nodes` forked processes on loopback, each
 * iteration every bucket of cfg in turn: the median iteration in ms. */
int gloo_raw_allreduce(uint32_t nodes, const struct bench_cfg *cfg, double *ret_ms);

/* ---- gpu.c ---- */

/* The GPU rows (zerod-bench --gpu): each measured where it can be, else
 * printed as not run with the reason. 0, or -errno. */
int gpu_rows(const struct bench_cfg *cfg, bool json, const char *python, const char *anchor);
/* zerod-bench --gpu-trainer SOCK RANK WORLD NUMEL ITERS: one rank of the
 * busbw job through zerod (gpu.c); its exit status. */
int gpu_trainer_main(const struct bench_cfg *cfg, char **args);

#endif
