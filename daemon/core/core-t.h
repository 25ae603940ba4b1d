/*
 * core-t.h — the core's types, apart from its functions (haproxy's -t.h
 * headers) so that the edge's and the operator's structs can point at them
 * without include cycles: a rank as the core knows it (struct member), a job
 * and its states, and struct core, what the core is given by daemon.c and
 * owns. All of it is the loop thread's.
 *
 * The core answers ranks through the sink (sink.h) and tells the operator's
 * side what happened through the hooks (hooks.h): it never names the edge or
 * ops/ (docs/LAYOUT.md).
 */
#ifndef ZEROD_CORE_T_H
#define ZEROD_CORE_T_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "common.h"
#include "plan.h"
#include "plan/zero.h"
#include "zeroclient.h"

#define ZEROD_MAX_WORLD 4096u

struct backend;
struct completion_queue;
struct core_hooks;
struct cudabufs;
struct daemon_config;
struct devmem_use;
struct exec;
struct jobops;
struct loop;
struct mem_map;
struct mem_ops;
struct pool;
struct rdzv_daemon;
struct rdzv_job;
struct rdzv_spec;
struct reform;
struct replan;
struct sem_job;
struct shard_map;
struct sharedp;
struct sink_ops;
struct statex;
struct statex_kept;

/* Why a rank leaves its job (sink_ops.drop, job_leave): it tells the
 * job's other ranks. */
enum leave_reason {
	LEAVE_GOODBYE,     /* the trainer said Goodbye */
	LEAVE_EXITED,      /* its process is gone (pidfd, or the timer's look) */
	LEAVE_UNREACHABLE, /* a send to it failed: gone from the socket, or not reading */
	LEAVE_CLOSED,      /* its connection closed, its process lives on */
};

/* A rank of a job, as the core knows it: the endpoint the sink answers. The
 * edge embeds one in each session (edge-t.h) and fills pid and uid from the
 * socket before job_join(); job_join() sets job and rank. */
struct member {
	struct job *job; /* NULL: not in a job (yet, or any more) */
	uint32_t rank;
	pid_t pid; /* its process, from the socket */
	uid_t uid; /* from the socket; (uid_t)-1 if unknown */
};

/* See job.kept (job.c's job_register_plan). */
struct kept_grad {
	struct mem_map *map;
	char name[256];
	uint64_t bytes;
};

/* A job's life; job.c's job_set_state() is the only way between states and
 * checks each step against its table:
 *   FORMING -> REGISTERING -> ACTIVE, and from any of them -> FAILED -> DRAINING;
 *   ACTIVE -> REFORMING -> REGISTERING: a trainer died, its ranks rejoin (reform.c).
 * Every state from FAILED on is an end (job_ended). */
enum job_state {
	JOB_FORMING,     /* ranks connect and register the plan; nodes join (rdzv.h) */
	JOB_REGISTERING, /* every rank agreed: the executor installs the plan */
	JOB_ACTIVE,      /* iterations */
	JOB_REFORMING,   /* a trainer died: the state is kept while the ranks rejoin */
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
	struct core *core;
	char id[ZEROD_JOB_ID_MAX + 1];
	uid_t uid;      /* whose job: jobs are named per uid, another uid's Hello never finds it */
	uint32_t world; /* ranks in the job, on every node */
	uint32_t local_size; /* ranks of it on this node */
	enum job_state state;
	int err;
	char errmsg[256];
	bool quiet_end; /* ended between iterations by a rank leaving: not an error
			   (unless another rank goes on: job_went_on) */
	/* another node's end, relayed by the rendezvous (job_end_remote) */
	bool end_remote;  /* the end being applied came from another node */
	bool end_pending; /* another node ended quietly before iteration end_iter */
	uint64_t end_iter;
	int end_code;
	char end_msg[256];
	uint64_t memory;           /* its share of core->memory_used */
	struct devmem_use *devmem; /* a CUDA job: its state per device (devmem.h) */
	uint32_t ndevmem;

	struct member **ranks;      /* [world]: NULL where the rank is not here (now) */
	struct plan **plans;        /* [world]: what each rank registered */
	struct mem_map **grad_map;  /* [world] */
	struct mem_map **param_map; /* [world] */
	struct sharedp *sharedp;    /* [world]: who shares its parameter buffer (sharedp.h) */
	/* [world], or NULL for a job of host buffers: what each rank
	 * registered as CUDA buffers (cudabufs.h), opened by the executor */
	struct cudabufs **cuda;
	uint32_t nconnected, nregistered; /* of local_size */
	bool *joined;                     /* [world]: which ranks ever joined here */
	uint32_t njoined;                 /* how many */

	struct plan *plan; /* the job's plan, once every rank agreed */
	struct shard_map *shard;
	const struct backend *be;
	uint32_t *node_of;     /* [world]: each rank's node (all 0 on one node) */
	struct rdzv_job *rdzv; /* a job over several nodes (rdzv.h); NULL: one node */
	struct zero_topo topo;
	struct zero_program prog;
	unsigned state_arrays; /* PLAN_STATE_M | ... the state was allocated with */
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
	struct sem_job *sem; /* segment masks, grad scales (semantics.c); NULL: none yet */
	bool in_flight;      /* some bucket of iteration `iter` arrived */
	bool reload_pending; /* zc_params_changed() for iteration reload_iter */
	uint64_t reload_iter;

	/* state export/import and re-planning (statex.c) */
	struct statex *sx;       /* the round in progress, or NULL */
	struct replan *rp;       /* a new plan is being registered (statex.c), or NULL */
	struct statex_kept *sxk; /* a checkpoint's staging kept mapped (statex.c), or NULL */
	struct reform *rf;       /* re-forming after a trainer died (reform.c), or NULL */
	bool journal;            /* its executor keeps the undo journal (exec.h) */
	bool keep_params;        /* ... and on the devices the fp32 copies (exec.h) */

	uint64_t iterations_done, buckets_done;
	/* a grad buffer mapped for a RegisterPlan that was refused for its param
	 * buffer: the name is gone (unlinked when mapped), so the rank's retry that
	 * names it again gets this mapping back ([world], or NULL: none kept) */
	struct kept_grad *kept;
	struct jobops *ops; /* the operator's record of it (ops.c), or NULL */
};

struct core_stats {

	uint64_t jobs;
	uint64_t jobs_failed; /* ended with an error (not a clean end) */
	uint64_t iterations;
	uint64_t buckets;
	uint64_t reduced_elems;
	uint64_t stepped_elems;
	uint64_t errors_sent;     /* these three: the edge's */
	uint64_t replies_dropped; /* error replies over a connection's budget */
	uint64_t conns_shed;      /* connections closed over the limit or idle */
	/* trainers' deaths the jobs re-formed after (reform.c), and how they
	 * ended: went on from zerod's memory, or failed (no boundary to go
	 * back to, a rank that never came back, nothing kept) */
	uint64_t recoveries, recoveries_failed;
};

/* What the core is: daemon.c fills it before any job (the shared services
 * below it, the sink the edge implements, the hooks ops/ fills) and frees
 * it after the last one. */
struct core {
	const struct daemon_config *cfg; /* daemon.c's, live keys rewritten by a reload */
	struct loop *loop;
	struct pool *pool;
	struct completion_queue *cq;
	const struct mem_ops *mem;      /* host buffers: memfds */
	const struct backend *cuda;     /* NULL: this daemon serves host buffers only */
	char backend_why[256];          /* what backend_choose() found, for refusals */
	const struct sink_ops *sink;    /* how the core answers ranks (the edge's session_sink) */
	const struct core_hooks *hooks; /* the operator's side (ops/); NULL: nobody looks */
	void *hooks_ctx;                /* what the hooks are given back */
	struct job *jobs;
	unsigned njobs;
	uint64_t memory_used;     /* optimizer state the jobs hold (of cfg->max_memory) */
	struct rdzv_daemon *rdzv; /* rendezvous of jobs over several nodes (rdzv.c) */
	struct core_stats stats;
};

/* What a Hello asks for, in the core's words (the edge decodes it). */
struct join_req {
	const char *job_id;
	uint32_t rank, world;
	uint32_t local_rank, local_size;
	const struct rdzv_spec *rdzv; /* NULL: the job names no rendezvous */
};

#endif
