/*
 * daemon.h — the daemon's state, owned by the loop thread, and the entry
 * points of its subsystems:
 *   daemon.c  start/stop order, signals, deadlines, limits
 *   conn.c    the ROUTER's connections (its monitor): limits, idle and closed ones
 *   session.c client sessions: receive, decode, dispatch table, replies
 *   job.c     jobs: joining, plan registration, activation, failure, teardown
 *   sched.c   iterations: bucket order, op submission, completions, stalls
 *   rdzv.c    jobs over several nodes: the rendezvous between daemons
 */
#ifndef ZEROD_DAEMON_H
#define ZEROD_DAEMON_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "exec/exec.h"
#include "core/rdzv.h"
#include "core/sink.h"
#include "plan.h"
#include "plan/shard.h"
#include "core/statex.h"
#include "zerod.pb-c.h"

#define ZEROD_MAX_WORLD 4096u
#define ZEROD_ROUTE_MAX 256

struct fastpath;
struct fastpath_listener;
struct fdbufs;
struct loop;
struct loop_timer;
struct pool;
struct mem_map;
struct mem_desc;
struct cudabufs;
struct devmem_use;
struct conn;
struct config_src;
struct jobops;
struct ops;
struct rdzv_daemon;
struct rdzv_job;
struct sharedp;

/* What serves a job's data plane; chosen per job. */
struct backend {
	const char *name;
	const struct coll_ops *coll;
	const struct optim_ops *optim;
	/* the buffers jobs of this backend register: NULL for host jobs,
	 * whose buffers are d->mem's, mapped at registration; else mapped by
	 * the executor's start (they may block) */
	const struct mem_ops *mem;
	/* serves bf16/fp16 buckets (fp32 masters, zeroclient.h's rounding);
	 * a plan with such buckets on another backend is refused (ZC_ENOTSUP) */
	bool low_precision;
};

extern const struct backend backend_host;
/* A host job over several nodes: gloo across them (coll NULL in a build
 * without gloo: such jobs are refused). */
extern const struct backend backend_host_multi;

struct daemon_config {
	const char *socket_path;
	int stall_timeout_ms; /* an iteration that makes no progress this long fails */
	int shutdown_timeout_ms;
	unsigned workers; /* CPU worker threads; 0: one per CPU */
	unsigned max_jobs;
	unsigned max_sessions; /* trainers at once; 0: as many as the fds allow, up to 1024 */
	int join_timeout_ms;   /* a job whose ranks connect but never register */
	int hello_timeout_ms;  /* a connection that has no session this long is closed */
	uint64_t max_memory;   /* bytes of optimizer state over all jobs; 0: half the RAM */
	uint64_t max_user_memory; /* of it, what one user's jobs may hold; 0: all of it */
	uint64_t max_device_memory; /* CUDA jobs' state on any one GPU; 0: no limit */
	int log_level;
	const char *backend; /* --backend auto|host|cuda; NULL: auto */
	/* operations (ops.c): the stall inspector's first report, the flight
	 * recorder's size, the metrics textfile, who may use zeroctl */
	int stall_warn_ms;
	unsigned flight_records;
	const char *metrics_textfile; /* "": none */
	const char *checkpoint_dir;   /* zeroctl checkpoint's default (DIR/JOB); "": none */
	int metrics_interval_ms;
	const char *group; /* "": zerod's own group */
	/* CURVE on the rendezvous between daemons (rdzvcurve.h); "": none */
	const char *curve_secret_key;
	const char *curve_peers;
	bool curve_allow_plain_nccl; /* CUDA jobs over nodes with CURVE keys (NCCL is plain) */
	struct config_src *src; /* the flags and file it came from: read again on reload */
};

struct daemon_stats {
	uint64_t jobs;
	uint64_t jobs_failed; /* ended with an error (not a clean end) */
	uint64_t iterations;
	uint64_t buckets;
	uint64_t reduced_elems;
	uint64_t stepped_elems;
	uint64_t errors_sent;
	uint64_t replies_dropped; /* error replies over a connection's budget */
	uint64_t conns_shed;      /* connections closed over the limit or idle */
};

/* Why a session ends: it tells the job's other ranks. */
enum leave_reason {
	LEAVE_GOODBYE,     /* the trainer said Goodbye */
	LEAVE_EXITED,      /* its process is gone (pidfd, or the timer's look) */
	LEAVE_UNREACHABLE, /* a send to it failed: gone from the socket, or not reading */
	LEAVE_CLOSED,      /* its connection closed, its process lives on */
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
	struct fdbufs *bufs; /* memfds it passed for its plan (fdbufs.c) */
	bool detached;   /* its job ended: dropped by session_reap(), connection kept */
	/* Its process exited or its connection closed: dropped at leave_at, so
	 * that a Goodbye still queued behind other peers' messages is read first,
	 * without draining anything on its behalf. */
	int64_t leave_at; /* 0: not leaving */
	enum leave_reason leave_why;
	bool exited;       /* its pidfd fired (or the pid poll saw it gone) */
	struct conn *conn; /* the connection its Hello came on; NULL once closed */
	/* A grad buffer mapped for a RegisterPlan that was refused for its param
	 * buffer: the name is gone (unlinked when mapped), so a retry that names
	 * it again gets this mapping back. */
	struct mem_map *kept_grad;
	char kept_grad_name[256];
	uint64_t kept_grad_bytes;
	/* errors sent to it are logged at most SESSION_LOG_BURST a second */
	int64_t log_window;
	unsigned log_count, log_dropped;
};

#define SESSION_LOG_BURST 20

/* A job's life; job.c's job_set_state() is the only way between states and
 * checks each step against its table:
 *   FORMING -> REGISTERING -> ACTIVE, and from any of them -> FAILED -> DRAINING */
enum job_state {
	JOB_FORMING,     /* ranks connect and register the plan; nodes join (rdzv.h) */
	JOB_REGISTERING, /* every rank agreed: the executor installs the plan */
	JOB_ACTIVE,      /* iterations */
	JOB_FAILED,      /* ended: err/errmsg say why (quiet_end: not an error) */
	JOB_DRAINING,    /* ended, no rank left: waits for its executor, then is freed */
};

struct hyper_change {
	uint64_t iteration;
	uint32_t group;
	uint32_t rank; /* whose values: one entry per rank (sched_set_hyper) */
	struct zc_param_group values;
	struct hyper_change *next;
};

struct job {
	struct job *next;
	struct daemon *d;
	char id[ZEROD_JOB_ID_MAX + 1];
	uid_t uid; /* whose job: jobs are named per uid, another uid's Hello never finds it */
	uint32_t world;      /* ranks in the job, on every node */
	uint32_t local_size; /* ranks of it on this node */
	enum job_state state;
	int err;
	char errmsg[256];
	bool quiet_end;  /* ended between iterations by a rank leaving: not an error
			    (unless another rank goes on: job_went_on) */
	/* another node's end, relayed by the rendezvous (job_end_remote) */
	bool end_remote;  /* the end being applied came from another node */
	bool end_pending; /* another node ended quietly before iteration end_iter */
	uint64_t end_iter;
	int end_code;
	char end_msg[256];
	uint64_t memory; /* its share of d->memory_used */
	struct devmem_use *devmem; /* a CUDA job: its state per device (devmem.h) */
	uint32_t ndevmem;

	struct session **ranks;     /* [world] */
	struct plan **plans;        /* [world]: what each rank registered */
	struct mem_map **grad_map;  /* [world] */
	struct mem_map **param_map; /* [world] */
	struct sharedp *sharedp;    /* [world]: who shares its parameter buffer (sharedp.h) */
	/* [world], or NULL for a job of host buffers: what each rank
	 * registered as CUDA buffers (cudabufs.h), opened by the executor */
	struct cudabufs **cuda;
	uint32_t nconnected, nregistered; /* of local_size */
	bool *joined;     /* [world]: which ranks ever joined here */
	uint32_t njoined; /* how many */

	struct plan *plan; /* the job's plan, once every rank agreed */
	struct shard_map *shard;
	const struct backend *be;
	uint32_t *node_of;         /* [world]: each rank's node (all 0 on one node) */
	struct rdzv_job *rdzv;     /* a job over several nodes (rdzv.h); NULL: one node */
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
	struct sem_job *sem;           /* segment masks, grad scales (semantics.c); NULL: none yet */
	bool in_flight;                /* some bucket of iteration `iter` arrived */
	bool reload_pending;           /* zc_params_changed() for iteration reload_iter */
	uint64_t reload_iter;

	/* state export/import and re-planning (statex.c) */
	struct statex *sx;      /* the round in progress, or NULL */
	struct replan *rp;      /* a new plan is being registered (statex.c), or NULL */
	struct statex_kept *sxk; /* a checkpoint's staging kept mapped (statex.c), or NULL */

	uint64_t iterations_done, buckets_done;
	struct jobops *ops; /* the operator's record of it (ops.c), or NULL */
};

struct daemon {
	struct daemon_config cfg;
	void *zctx, *router;
	struct loop *loop;
	struct pool *pool;
	struct completion_queue *cq;
	struct fastpath_listener *fpl; /* NULL: no fast path */
	int sigfd;
	struct loop_timer *timer; /* housekeeping, due at the nearest deadline */
	int lockfd;               /* flock()ed lock file beside the socket */
	bool bound;               /* this process bound the socket (only then unlink it) */
	dev_t sock_dev;
	ino_t sock_ino;
	unsigned nofile; /* RLIMIT_NOFILE, raised to the hard limit */
	/* connections (conn.c), indexed by fd */
	void *monitor;
	struct conn **conns;
	size_t conns_cap;
	unsigned nconns, conn_limit;
	struct conn *idle_head, *idle_tail; /* without a session, oldest first */
	int64_t shed_log_ms;
	uint64_t status_serial;
	const struct sink_ops *sink; /* how the core answers ranks: session_sink */
	struct session *sessions;
	unsigned nsessions;
	uint64_t session_serial;
	uint64_t cur_request;        /* request id of the message being handled */
	struct session *cur_session; /* its sender, if it has a session */
	struct conn *cur_conn;       /* the connection it came on, if known */
	struct ucred cur_peer;       /* its sender, from the socket (pid 0: unknown) */
	struct job *jobs;
	unsigned njobs;
	uint64_t memory_used; /* optimizer state the jobs hold (of cfg.max_memory) */
	bool stopping;
	int64_t stop_deadline_ms;
	const struct mem_ops *mem;
	const struct backend *cuda; /* NULL: this daemon serves host buffers only */
	char backend_why[256];      /* what backend_choose() found, for refusals */
	struct rdzv_daemon *rdzv;   /* rendezvous of jobs over several nodes (rdzv.c) */
	struct daemon_stats stats;
	struct ops *ops; /* the operator's side (ops.h): NULL until ops_open() */
	int listen_fd;   /* socket activation: the trainers' socket from systemd, or -1 */
};

/* daemon.c */
int daemon_run(const struct daemon_config *cfg);

/* conn.c */
int conn_open_monitor(struct daemon *d);
void conn_close_all(struct daemon *d);
/* Read every monitor event queued (accepted and closed connections). */
void conn_update(struct daemon *d);
/* The open connection on fd, or NULL (conn_update() first). */
struct conn *conn_of_fd(struct daemon *d, int fd);
struct conn *conn_of_msg(struct daemon *d, int fd, const void *route, size_t rlen);
/* A session began / ended on c: while it has none, c may idle only
 * hello_timeout_ms. */
void conn_bind(struct conn *c, struct session *s);
void conn_unbind(struct conn *c);
/* Is the message that came on fd (c: conn_of_msg()'s) to be dropped
 * unread? It is once its connection was shut, and a connection that never
 * had a session is shut once it sent more than a Hello needs. */
bool conn_drop_msg(struct daemon *d, int fd, struct conn *c);
/* May c be sent one more error reply? A budget per connection (small
 * before Hello): a peer that sends bad messages and never reads cannot park
 * unbounded replies in the daemon. Counts what it refuses. */
bool conn_may_reply(struct daemon *d, struct conn *c);
/* Close connections idle past hello_timeout_ms; the next such deadline. */
void conn_check_idle(struct daemon *d, int64_t now);
int64_t conn_next_deadline(struct daemon *d);

/* session.c */
#define SESSION_NO_ITERATION SINK_NO_ITERATION
/* Handle up to a batch of messages; returns how many. */
int session_on_router(struct loop *l, void *userdata);
int session_send(struct session *s, const Zerod__V1__Envelope *env);
/* iteration: SESSION_NO_ITERATION (or -1, which converts to it) for none */
void session_send_error(struct session *s, int code, bool fatal, uint64_t iteration, int64_t bucket,
			const char *fmt, ...) __attribute__((format(printf, 6, 7)));
void session_drop(struct session *s, enum leave_reason why);
/* Its job ended: the session goes at the next session_reap(), its
 * connection stays (it may say Hello again). */
void session_detach(struct session *s);
/* Its connection closed (conn.c). */
void session_conn_closed(struct session *s);
/* Map the grad buffer gd names, or take back the one kept for it; keep one
 * for a retry after a refused registration. */
int session_map_grad(struct session *s, const struct mem_desc *gd, uint64_t bytes,
		     struct mem_map **ret, char *err, size_t errlen);
void session_keep_grad(struct session *s, struct mem_map *m, const char *name, uint64_t bytes);
/* Drop sessions whose process is gone or whose leave_at passed. */
void session_check_leaving(struct daemon *d, int64_t now);
/* Its trainer's process has exited (its pidfd says so, or /proc), whether or
 * not the loop has seen it yet. */
bool session_gone(struct session *s);
/* The next deadline session_check_leaving() has (LOOP_NEVER: none). */
int64_t session_next_deadline(struct daemon *d);
void session_reap(struct daemon *d);
void session_free_all(struct daemon *d);

/* job.c */
/* What a Hello asks for, in the core's words (session.c decodes it). */
struct join_req {
	const char *job_id;
	uint32_t rank, world;
	uint32_t local_rank, local_size;
	const struct rdzv_spec *rdzv; /* NULL: the job names no rendezvous */
};

int job_join(struct daemon *d, struct session *s, const struct join_req *h, char *err,
	     size_t errlen);
/* Rank s registers plan p (taken over) with buffers gd and pd. */
void job_register_plan(struct job *j, struct session *s, struct plan *p, const struct mem_desc *gd,
		       const struct mem_desc *pd);
/* Rank s registers plan p (taken over) with CUDA buffers cb (taken over):
 * checked here, opened by the executor when the job starts. */
void job_register_cuda(struct job *j, struct session *s, struct plan *p, struct cudabufs *cb);
/* Every node of j joined and agreed (rdzv.c): start its executor. */
void job_formed(struct job *j);
/* A re-plan (statex.c): the old executor is gone and j->plans[], the maps,
 * hold the new plan's; drop what came of the old plan and start again. */
void job_restart(struct job *j);
void job_fail(struct job *j, int code, bool loud, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
void job_leave(struct job *j, struct session *s, enum leave_reason why);
/* Rank s asks a job that ended quietly for more (a bucket of the next
 * iteration...): the end was a failure after all. The caller answers s. */
void job_went_on(struct job *j, struct session *s);
/* Another node's end of j, as the rendezvous relays it (rdzv.c): j ends
 * here with code and msg (j->end_remote set meanwhile). A quiet end before
 * iteration iter waits until this node has finished the iteration before it
 * (job_iteration_done); one that finds this node inside iter is an error for
 * its ranks. */
void job_end_remote(struct job *j, int code, bool quiet, uint64_t iter, const char *msg);
/* j finished an iteration or a state round (sched.c, statex.c): another
 * node's quiet end may be due now. */
void job_iteration_done(struct job *j);
void job_maybe_free(struct job *j);
void job_set_state(struct job *j, enum job_state to);
const char *job_state_name(enum job_state s);
static inline bool job_ended(const struct job *j)
{
	return j->state >= JOB_FAILED;
}
void job_free_all(struct daemon *d);

/* sched.c */
void sched_start(struct job *j);
/* Bucket `bucket` of `iteration` from rank s (any transport: ZeroMQ or a
 * fast-path ring). A bad bucket is an error to s; nothing else changes. */
void sched_bucket_ready(struct job *j, struct session *s, uint64_t iteration, uint32_t bucket);
/* Rank s sets group's hyperparameters from iteration on. */
void sched_set_hyper(struct job *j, struct session *s, uint64_t iteration, uint32_t group,
		     const struct zc_param_group *g);
/* Rank s called zc_params_changed() before iteration (the next one it has
 * not started): the masters are reloaded when that iteration starts. */
void sched_params_changed(struct job *j, struct session *s, uint64_t iteration);
void sched_on_done(struct daemon *d, struct exec_done *done);
void sched_check_stalls(struct daemon *d, int64_t now);
/* Who j waits for, this node's ranks: "rank 1 (bucket 2 of 4)", or before
 * it starts "rank 3 (not connected)"; returns how many are named (0: the
 * text says the executor). */
int sched_describe_wait(const struct job *j, char *buf, size_t len);

#endif
