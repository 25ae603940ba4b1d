/*
 * client.h — the client object (struct zc_client) and its futures, and what
 * the files of libzeroclient that implement the public calls share of each
 * other (client.c: locking, sending, dispatching and waiting; conn.c,
 * buffers.c, iter.c, state.c, replan.c, ckview.c). Nothing outside the
 * library sees it.
 */
#ifndef ZEROCLIENT_CLIENT_H
#define ZEROCLIENT_CLIENT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "internal.h"
#include "wire.h"
#include "zeroclient.h"

enum future_kind { FUTURE_BUCKET, FUTURE_STEP };

#define STEP_RECS 16 /* StepDone infos kept for step futures asked for later */

/* A future's callback: none; set and waiting for the future to settle; on
 * the client's queue; running (outside the lock); done. */
enum cb_state { CB_NONE, CB_SET, CB_QUEUED, CB_RUNNING, CB_DONE };

struct zc_future {
	zc_client *c;   /* NULL once the client is closed */
	unsigned forks; /* the process's fork count when it was made */
	enum future_kind kind;
	uint64_t iteration;
	uint32_t bucket;
	uint64_t request; /* the BucketReady that made it */
	int state;        /* 0 pending, 1 done, < 0 failed */
	char msg[256];
	struct zc_future *prev, *next;

	zc_future_cb *cb;
	void *cb_arg;
	enum cb_state cb_state;
	zc_client *q;              /* whose queue holds it or runs its callback */
	struct zc_future *cb_next; /* on q's queue */
	bool free_after;           /* freed while its callback ran or a wait held it */
	bool found_inf;            /* FUTURE_STEP: what StepDone said */
	double grad_norm;
	unsigned waiters; /* zc_future_wait() calls on it: it stays until they end */
};

/* A buffer in memory zerod maps too: our own mapping of a memfd (the
 * plan's buffers, a re-plan's, a state round's staging). No name: nothing
 * ever appears in /dev/shm. */
struct host_buf {
	float *base;
	size_t bytes;
};

/* One allocation; its parts by concern, each named for the file that
 * mostly runs it. */
struct zc_client {
	pthread_mutex_t mu;
	unsigned forks; /* the process's fork count at zc_connect() */
	pid_t pid;
	char job_id[ZEROD_JOB_ID_MAX + 1];
	struct zc_config cfg;

	/* the connection to zerod (conn.c, client.c's dispatching) */
	struct client_conn {
		void *zctx, *sock;
		void *mon; /* PAIR receiving sock's monitor events */
		int efd;   /* epoll over the ZMQ_FDs of sock and mon: what zc_fd() returns */
		/* the fast path: offered in HelloOk, attached by zc_register_plan() */
		char fp_mine[108]; /* <the socket we reached>.fd */
		char fp_path[108]; /* where zerod says it is */
		uint64_t fp_token;
		struct fpc *fp;
		bool fp_closed;        /* zerod closed its channel: send by ZeroMQ */
		uint64_t zsent, zrecv; /* ZeroMQ messages sent / received (Hello, HelloOk: 1) */
		bool zmq_look;         /* ZeroMQ may hold messages its fds do not signal */
		bool bell;             /* epoll saw the doorbell ringing: read it before sleeping */
	} conn;

	struct plan *plan;
	struct host_buf grad, param;
	uint64_t bufs_serial; /* zerod's name for them (RegisterPlan's FdBuffers) */
	bool bufs_shared;     /* registered with ZC_BUFFERS_SHARED_PARAMS */
	int share_fd; /* zc_alloc_buffers_shared()'s parameter memfd, open for the other
			 local ranks until zc_close() (-1: none) */
	struct devbufs *dev;  /* CUDA buffers (devbufs.h) instead of grad and param */
	bool bufs_busy;       /* zc_register_buffers() is talking to zerod */
	bool registered;
	int plan_result; /* 0 waiting, 1 ok, < 0 error */
	bool recovered;  /* PlanOk said the job was recovered, at recovered_iter */
	uint64_t recovered_iter;
	int hello_result;
	int stall_ms;         /* HelloOk's stall_timeout_ms (0: an older zerod's) */
	char answer_msg[256]; /* the reason of a failed Hello or RegisterPlan */

	/* the iteration (iter.c) */
	struct client_iter {
		uint64_t iter;
		uint32_t sent_in_iter; /* buckets of `iter` handed over so far */
		uint64_t steps_done;   /* iterations whose StepDone arrived */
		/* what the latest StepDones said (zc_step_info), by iteration % 16 */
		struct step_rec {
			uint64_t iteration; /* UINT64_MAX: none */
			bool found_inf;
			double grad_norm;
		} step_recs[STEP_RECS];
	} it;
	int job_error; /* fatal error: every later future fails with it */
	char job_msg[256];
	int async_error; /* the latest error no future or call carried: zc_last_error() */
	char async_msg[256];
	uint64_t last_request;
	struct zc_future *futures;
	struct zc_future *cbq_head, *cbq_tail; /* settled futures whose callbacks are due */

	/* zc_get_state / zc_set_state: one round at a time (state.c) */
	struct client_round {
		bool pending;
		uint64_t request;
		int result; /* 0 waiting, 1 ok, < 0 error */
		char msg[256];
	} round;

	/* checkpoints (ckview.c, ckpt.c) */
	struct client_ckpt {
		/* zeroctl checkpoint: the operator's request (zc_checkpoint_due) */
		char *due_dir; /* NULL: none */
		uint64_t due_iter;
		struct ckpt_writer *writer; /* zc_checkpoint's write in flight (ckpt.c) */
		/* a checkpoint's export over several nodes: StateOk's ranges
		 * (pairs), this node's index and the count */
		uint64_t *ranges;
		size_t nranges;
		uint32_t node, nnodes;
		uint64_t run;
		/* the last such export's ranges, for the plan of hash
		 * prev_hash: the next one copies only their parameters */
		uint64_t *prev;
		size_t nprev;
		uint64_t prev_hash;
	} ckpt;

	/* re-planning (replan.c): the registered plan and its buffers, until
	 * the new plan is registered */
	struct client_replan {
		struct plan *old_plan;
		struct host_buf old_grad, old_param;
		/* a CUDA re-plan: the registered buffers, c->dev the new plan's */
		struct devbufs *old_dev;
		uint32_t *map; /* each new segment's index in the old plan's order */
		int fd;        /* the new buffers' memfd (grad at 0, param at poff) */
		uint64_t poff;
		int pfd; /* a shared re-plan: the parameters' memfd (at 0); -1: in fd */
	} replan;
};

/* A re-plan's parameters in the job's shared memfd param_fd (at 0), which
 * only the rank that created it fills (copy): zc_alloc_buffers_shared(). */
struct replan_share {
	int param_fd;
	bool copy;
};

/* How much a dispatch looks at. */
enum look {
	/* everything: the caller wants errors too */
	LOOK_ALL,
	/* the caller sleeps on c->conn.efd next, and has asked epoll what is
	 * ready: with a ring, read ZeroMQ only where c->conn.zmq_look says it may
	 * hold something */
	LOOK_SLEEP,
};

/* ---------------------------------------------------- client.c --- */

/* fork(): start counting (0, or -errno), the count, and whether a client
 * or future made under made_under is a child's copy. */
int fork_watch(void);
unsigned fork_count(void);
bool client_forked(unsigned made_under);
/* Every entry point that takes a client, or a future, starts here: 0, or
 * the error recorded for fn. */
int client_check(zc_client *c, const char *fn);
int future_check(zc_future *f, const char *fn);
/* The callbacks' queue (c->mu held), and running what is due (not held). */
void cb_enqueue(zc_client *c, struct zc_future *f);
void cb_dequeue(zc_client *c, struct zc_future *f);
void client_run_callbacks(zc_client *c);
/* How every public call lets go of the client. */
void client_unlock(zc_client *c);
/* Send a request under a fresh request id (c->mu held). */
int client_send_env(zc_client *c, Zerod__V1__Envelope *env, uint64_t *ret_id);
/* A future on c's list, off it, settled (c->mu held). */
void future_link(zc_client *c, struct zc_future *f);
void future_unlink(struct zc_future *f);
void future_settle(struct zc_future *f, int state, const char *msg);
/* The StepDone info of iteration it into f, if kept. */
void client_step_info_of(zc_client *c, uint64_t it, struct zc_future *f);
/* Take the ring's completions, drain both channels (c->mu held). */
int client_take_ring(zc_client *c, uint64_t zrecv);
int client_dispatch_locked(zc_client *c, enum look look);
/* Wait until *flag is non-zero or the deadline passes (c->mu not held). */
int client_wait_for(zc_client *c, const int *flag, const char *msg, int64_t deadline_ms);

/* --------------------------------------------------- buffers.c --- */

/* Unmap b (NULL-safe: a b never mapped). */
void client_buf_release(struct host_buf *b);
/* zerod's fd socket for us, "" if none (c->mu held). */
void client_fd_socket(zc_client *c, char *path, size_t len);
/* Map bytes of memfd fd at offset into *ret: 0, or -errno. */
int client_map_buf(int fd, uint64_t offset, uint64_t bytes, struct host_buf *ret);
struct devbufs;
/* Open the caller's CUDA buffers b for plan p into *ret. */
int client_cuda_bufs_open(zc_client *c, const struct plan *p, const struct zc_buffers *b,
			  struct devbufs **ret, const char *fn);

/* ----------------------------------------------------- state.c --- */

/* The staging's regions (docs/STATE.md): 5, and the masters' with bf16/fp16
 * buckets; each the plan's state_numel floats (plan.h: the state's layout). */
enum { STG_META = 1, STG_MASTER = 5 };
/* Wait for the steps of the iterations handed over. */
int state_wait_steps(zc_client *c, const char *fn);
/* One state round's request and its answer. */
int state_send(zc_client *c, Zerod__V1__Envelope *env, const char *fn);
int state_wait(zc_client *c, const char *fn);
/* Where segment s's state is in plan p's layout. */
int seg_where(const struct plan *p, const struct zc_segment_state *s, uint64_t *ret_at,
	      uint64_t *ret_numel, const char *fn, uint32_t i);
/* The state's tensors: a tensor's bit, a bucket's last region, which are
 * present. */
uint32_t client_tensor_bit(enum zc_optimizer opt, unsigned k);
unsigned client_last_region(const struct plan *p, uint32_t bucket);
uint32_t client_meta_present(const struct plan *p, uint32_t b, uint32_t w, double *ret_step);
/* zc_get_state() and zc_set_state() on plan p. */
int client_get_state(zc_client *c, const struct plan *p, struct zc_segment_state *segs,
		     size_t stride, uint32_t n, const char *fn);
int client_set_state(zc_client *c, const struct plan *p, const struct zc_segment_state *segs,
		     size_t stride, uint32_t n, bool check_values, const char *fn);

/* ---------------------------------------------------- replan.c --- */

/* A registered client's new plan zp: host buffers (shared: sh), CUDA
 * buffers b, and its registration (zc_register_plan). */
int replan_alloc(zc_client *c, const struct zc_plan *zp, const struct replan_share *sh);
int replan_cuda(zc_client *c, const struct zc_plan *zp, const struct zc_buffers *b);
int replan_register(zc_client *c);

#endif
