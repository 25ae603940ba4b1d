/*
 * ops_int.h — what the files of the operator's side share (ops.c, ctl.c,
 * metrics.c, trace.c, flight.c); the core sees only ops.h. Loop thread.
 */
#ifndef ZEROD_OPS_INT_H
#define ZEROD_OPS_INT_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "base/config.h"
#include "core/core-t.h"
#include "core/hooks.h"
#include "core/job.h"
#include "exec/exec.h"
#include "ops/notify.h"
#include "ops/ops.h"
#include "base/sbuf.h"

/* ---- the flight recorder (flight.c): the last N operations of a job ---- */

enum flight_what {
	FL_SEEN,    /* the ops side first saw the job */
	FL_STARTED, /* the executor started */
	FL_READY,   /* a rank handed over a bucket */
	FL_QUEUED,  /* a bucket complete on every local rank went to the executor */
	FL_REDUCED, /* BucketDone: duration = since queued (0 if unknown) */
	FL_STEP,    /* StepDone: duration = the iteration, since the previous one */
	FL_STALL,   /* the stall inspector's report */
	FL_FAILED,  /* the job failed */
	FL_STOPPED, /* the executor stopped */
};

struct flight_op {
	int64_t at_us; /* since the job was first seen */
	uint64_t iteration;
	uint64_t dur_us;
	int32_t bucket, rank; /* -1: none */
	enum flight_what what;
	char detail[120];
};

struct flight {
	unsigned cap, count, head; /* ring: the oldest is at (head - count) mod cap */
	struct flight_op ops[];
};

int flight_new(unsigned cap, struct flight **ret);
/* Record one operation (the oldest goes once the ring is full). */
struct flight_op *flight_add(struct flight *f, int64_t at_us, enum flight_what what,
			     uint64_t iteration, int32_t bucket, int32_t rank, uint64_t dur_us);
/* The i-th kept operation, oldest first (i < f->count). */
const struct flight_op *flight_get(const struct flight *f, unsigned i);
const char *flight_what_name(enum flight_what w);

/* ---- metrics (metrics.c) ---- */

#define HIST_MAX 20
struct hist {
	const double *le; /* upper bounds, ascending */
	unsigned n;
	uint64_t bucket[HIST_MAX]; /* not cumulative; rendered cumulative */
	uint64_t count;
	double sum;
};
void hist_observe(struct hist *h, double v);

#define ERR_SLOTS 48
struct code_count {
	int code;
	uint64_t n;
};

struct metrics {
	struct hist iteration; /* seconds between a job's StepDones */
	struct hist step;      /* first BucketReady of an iteration to its StepDone */
	struct hist handoff;   /* a bucket queued (ready everywhere) to its BucketDone */
	struct code_count errors[ERR_SLOTS];   /* Error replies by code */
	struct code_count failures[ERR_SLOTS]; /* failed jobs by code */
	uint64_t reloads_ok, reloads_failed;
	uint64_t checkpoints_done, checkpoints_failed; /* CheckpointDone, by result */
};
void metrics_init(struct metrics *m);
void metrics_count(struct code_count *t, int code);
/* The Prometheus text exposition of d into out. */
void metrics_render(struct ops_env *env, struct sbuf *out);

/* ---- per job ---- */

/* A job's last checkpoint as the operator sees it (zeroctl status and
 * inspect): asked by zeroctl, or reported by its writer (CheckpointDone). */
enum ckpt_seen_state { CKPT_SEEN_NONE, CKPT_SEEN_ASKED, CKPT_SEEN_DONE, CKPT_SEEN_FAILED };
struct ckpt_seen {
	enum ckpt_seen_state state;
	uint64_t iteration;
	uint32_t rank;    /* who reported it */
	int64_t at_ms;    /* asked or reported (monotonic) */
	char *dir, *path, *error; /* owned; path and error may be NULL */
};
const char *ckpt_seen_name(enum ckpt_seen_state s);

struct jobops {
	struct jobops *next;
	struct job *job;
	unsigned serial; /* the trace's pid of the job */
	int64_t seen_us; /* first seen (monotonic) */
	struct flight *flight;
	/* the stall inspector */
	int64_t stall_progress; /* the job's progress_ms the reports are about */
	int64_t stall_next_ms;  /* the next report (INT64_MAX: none due) */
	unsigned stall_reports;
	/* timing of the iteration in flight */
	uint64_t iter;           /* the iteration the fields below are about */
	int64_t iter_mark_us;    /* the previous StepDone (or the start) */
	int64_t first_ready_us;  /* its first BucketReady (0: none yet) */
	int64_t *queued_us;      /* [nb]: when bucket b was queued (0: not yet) */
	int64_t *ready_us;       /* [world * nb], tracing only: when rank r sent b */
	uint32_t nb, world;
	uint32_t reduced;        /* BucketDones of `iter` */
	int64_t iter_last_reduced_us; /* its last BucketDone (0: none yet) */
	int64_t step_ms[16];     /* the last StepDones (monotonic ms), a ring */
	unsigned nsteps;
	bool failed_seen, trace_named;
	struct ckpt_seen ckpt;   /* the last checkpoint */
};

/* The job's record (made at first sight), or NULL out of memory. */
/* The operator's side of j's daemon (core.hooks_ctx). */
static inline struct ops_env *ops_env_of(const struct job *j)
{
	return j->core->hooks_ctx;
}

struct jobops *jobops_of(struct job *j);
/* Drop records of jobs that are gone. */
void jobops_sweep(struct ops_env *env);
/* Recent iterations per second. */
double jobops_rate(const struct jobops *jo, int64_t now_ms);
/* Who a job waits for: "rank 1 (bucket 2 of 4), rank 3 (not connected)". */
void ops_describe_wait(const struct job *j, char *buf, size_t len);
/* Whether j owes progress (the same rule as the stall timeout's). */
bool ops_job_waiting(const struct job *j);
const char *ops_job_state_name(const struct job *j);
int64_t ops_now_us(void);

/* ---- the trace timeline (trace.c): Chrome trace JSON ---- */

struct trace;
/* Open path (created or truncated, mode 0640) and start; -errno with why. */
int trace_start(struct ops_env *env, const char *path, struct stat *ret_st, char *why, size_t len);
/* Complete the file and stop: how many events it holds. */
uint64_t trace_stop(struct ops_env *env);
void trace_flush(struct ops_env *env);
const char *trace_file(const struct ops_env *env);
void trace_ready(struct ops_env *env, struct jobops *jo, uint32_t rank, uint64_t t, uint32_t b,
		 int64_t us);
void trace_reduced(struct ops_env *env, struct jobops *jo, uint64_t t, uint32_t b,
		   int64_t queued_us, int64_t us);
void trace_step(struct ops_env *env, struct jobops *jo, uint64_t t, int64_t since_us, int64_t us);
/* The executor's ops of an iteration (exec_take_spans): per bucket, the
 * fused pass, or its reduce, step and broadcast, on every local rank. */
struct exec_span;
void trace_ops(struct ops_env *env, struct jobops *jo, const struct exec_span *sp, size_t n);

/* ---- the control socket (ctl.c) ---- */

int ctl_open(struct ops_env *env, char *why, size_t len);
void ctl_close(struct ops_env *env);
/* Requests left over from a batch cut short: served from the timer. */
void ctl_tick(struct ops_env *env);
int64_t ctl_next_deadline(struct ops_env *env);

/* ---- the whole ---- */

struct ops {
	struct ops_env *env;
	struct daemon_config configured; /* as built from flags and file, before start-up
					  * filled in computed values: what reloads compare */
	int64_t start_ms;
	double start_wall; /* unix seconds */
	struct notify notify;
	void *ctl;        /* the control ROUTER */
	int ctl_fd;       /* its ZMQ_FD, watched by the loop */
	bool ctl_pending; /* a batch was cut short: more requests wait */
	char ctl_path[128];
	bool ctl_bound;
	dev_t ctl_dev;
	ino_t ctl_ino;
	gid_t group; /* whose members may run read verbs */
	struct spool *spool;
	struct metrics m;
	struct trace *trace; /* NULL: off */
	struct jobops *jobs;
	unsigned job_serial;
	int64_t textfile_next_ms;
	/* the metrics textfile's lock (lockfile.h): one zerod writes a path */
	int textfile_lock;      /* -1: none held */
	char textfile_held[4096]; /* the path it is of, or the one refused */
	struct exec_stats ended; /* of executors that stopped */
	bool activated;          /* the trainers' socket came from systemd */
};

/* What `zeroctl reload` reports: filled by ops_reload_report(). */
struct reload_report {
	bool ok;
	char error[512];
	struct sbuf applied, restart; /* lines joined by '\n' */
};
void ops_reload_report(struct ops_env *env, struct reload_report *rep);

#endif
