/*
 * daemon.h — the daemon's state, owned by the loop thread, and the entry
 * points of its subsystems:
 *   daemon.c  start/stop order, signals, timer
 *   session.c client connections: receive, decode, dispatch table, replies
 *   job.c     jobs: joining, plan registration, activation, failure, teardown
 *   sched.c   iterations: bucket order, op submission, completions, stalls
 */
#ifndef ZEROD_DAEMON_H
#define ZEROD_DAEMON_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "exec.h"
#include "plan.h"
#include "shard.h"
#include "zerod.pb-c.h"

#define ZEROD_MAX_WORLD 4096u
#define ZEROD_ROUTE_MAX 256

struct fastpath;
struct fastpath_listener;
struct loop;
struct pool;
struct mem_map;

/* What serves a job's data plane; chosen per job. */
struct backend {
	const char *name;
	const struct coll_ops *coll;
	const struct optim_ops *optim;
};

extern const struct backend backend_host;

struct daemon_config {
	const char *socket_path;
	int stall_timeout_ms; /* an iteration that makes no progress this long fails */
	int shutdown_timeout_ms;
	unsigned workers; /* CPU worker threads; 0: one per CPU */
	unsigned max_jobs;
	unsigned max_sessions; /* trainer connections at once */
	int join_timeout_ms;   /* a job whose ranks connect but never register */
	uint64_t max_memory;   /* bytes of optimizer state over all jobs; 0: half the RAM */
	int log_level;
};

struct daemon_stats {
	uint64_t jobs;
	uint64_t iterations;
	uint64_t buckets;
	uint64_t reduced_elems;
	uint64_t stepped_elems;
	uint64_t errors_sent;
};

struct session {
	struct session *next;
	uint8_t route[ZEROD_ROUTE_MAX];
	size_t route_len;
	struct daemon *d;
	uint64_t serial; /* never reused, unlike the address */
	struct job *job;
	uint32_t rank;
	pid_t pid;     /* from the socket */
	pid_t own_pid; /* the same process as it knows itself (its pid namespace) */
	uid_t uid;     /* from the socket; (uid_t)-1 if unknown */
	int pidfd;
	int send_failed; /* a send to it failed: dropped by session_reap() */
	struct fastpath *fp; /* its shared ring, if offered (fastpath.c) */
	/* errors sent to it are logged at most SESSION_LOG_BURST a second */
	int64_t log_window;
	unsigned log_count, log_dropped;
};

#define SESSION_LOG_BURST 20

enum job_state {
	JOB_JOINING,  /* ranks connect and register the plan */
	JOB_STARTING, /* every rank registered: the executor opens the backends */
	JOB_ACTIVE,   /* iterations */
	JOB_FAILED,   /* err/errmsg say why; waits for its ranks to leave */
};

struct hyper_change {
	uint64_t iteration;
	uint32_t group;
	uint32_t rank; /* who asked first */
	struct zc_param_group values;
	struct hyper_change *next;
};

struct job {
	struct job *next;
	struct daemon *d;
	char id[ZEROD_JOB_ID_MAX + 1];
	uint32_t world;      /* ranks in the job, on every node */
	uint32_t local_size; /* ranks of it on this node: all of them until multi-node */
	enum job_state state;
	int err;
	char errmsg[256];
	bool quiet_end;  /* ended between iterations by a rank leaving: not an error */
	uint64_t memory; /* its share of d->memory_used */

	struct session **ranks;     /* [world] */
	struct plan **plans;        /* [world]: what each rank registered */
	struct mem_map **grad_map;  /* [world] */
	struct mem_map **param_map; /* [world] */
	uint32_t nconnected, nregistered; /* of local_size */

	struct plan *plan; /* the job's plan, once every rank agreed */
	struct shard_map *shard;
	const struct backend *be;
	uint32_t *node_of;         /* [world]: every rank on node 0 until multi-node */
	struct zero_topo topo;
	struct zero_program prog;
	unsigned state_arrays;     /* PLAN_STATE_M | ... the state was allocated with */
	struct exec *exec;
	bool exec_running; /* until its EXEC_STOPPED completion */

	/* iteration state (sched.c) */
	uint64_t iter;
	uint32_t *next_bucket; /* [world] */
	uint32_t *arrived;     /* [nbuckets] */
	uint64_t snap_iter;    /* iteration whose hyperparameters are fixed, or UINT64_MAX */
	struct zc_param_group *groups; /* current hyperparameters */
	struct hyper_change *changes;  /* pending, by iteration */
	int64_t progress_ms;           /* last time the iteration moved */
	bool in_flight;                /* some bucket of iteration `iter` arrived */

	uint64_t iterations_done, buckets_done;
};

struct daemon {
	struct daemon_config cfg;
	void *zctx, *router;
	struct loop *loop;
	struct pool *pool;
	struct completion_queue *cq;
	struct fastpath_listener *fpl; /* NULL: no fast path */
	int sigfd, timerfd;
	struct session *sessions;
	unsigned nsessions;
	uint64_t session_serial;
	uint64_t cur_request;        /* request id of the message being handled */
	struct session *cur_session; /* its sender, if it has a session */
	struct ucred cur_peer;       /* its sender, from the socket (pid 0: unknown) */
	struct job *jobs;
	unsigned njobs;
	uint64_t memory_used; /* optimizer state the jobs hold (of cfg.max_memory) */
	bool stopping;
	int64_t stop_deadline_ms;
	const struct mem_ops *mem;
	struct daemon_stats stats;
};

/* daemon.c */
int daemon_run(const struct daemon_config *cfg);

/* session.c */
/* Handle up to a batch of messages; returns how many. */
int session_on_router(struct loop *l, void *userdata);
int session_send(struct session *s, const Zerod__V1__Envelope *env);
void session_send_error(struct session *s, int code, bool fatal, int64_t iteration, int64_t bucket,
			const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* Why a session ends: it tells the job's other ranks. */
enum leave_reason {
	LEAVE_GOODBYE,     /* the trainer said Goodbye */
	LEAVE_EXITED,      /* its process is gone (pidfd, or the timer's look) */
	LEAVE_UNREACHABLE, /* a send to it failed: gone from the socket, or not reading */
};

void session_drop(struct session *s, enum leave_reason why);
void session_check_pids(struct daemon *d);
void session_reap(struct daemon *d);
void session_free_all(struct daemon *d);

/* job.c */
int job_join(struct daemon *d, struct session *s, const Zerod__V1__Hello *h, char *err,
	     size_t errlen);
void job_register_plan(struct job *j, struct session *s, const Zerod__V1__RegisterPlan *m);
void job_fail(struct job *j, int code, bool loud, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
void job_leave(struct job *j, struct session *s, enum leave_reason why);
void job_maybe_free(struct job *j);
void job_free_all(struct daemon *d);
void job_broadcast(struct job *j, const Zerod__V1__Envelope *env);

/* sched.c */
void sched_start(struct job *j);
/* Bucket `bucket` of `iteration` from rank s (any transport: ZeroMQ or a
 * fast-path ring). A bad bucket is an error to s; nothing else changes. */
void sched_bucket_ready(struct job *j, struct session *s, uint64_t iteration, uint32_t bucket);
void sched_set_hyper(struct job *j, struct session *s, const Zerod__V1__SetHyper *m);
void sched_on_done(struct daemon *d, struct exec_done *done);
void sched_check_stalls(struct daemon *d, int64_t now);

#endif
