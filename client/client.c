/*
 * client.c — libzeroclient: one DEALER socket to the node's zerod, the
 * rank's buffers (memfds passed to zerod, bufs.c), and the futures the
 * daemon completes.
 *
 * Every call takes the client's mutex. Waiting never holds it: a waiter
 * drains incoming messages under the lock, then sleeps in epoll_wait() on
 * the socket's ZMQ_FD without it. ZMQ_FD is edge-like (it signals when the
 * socket's state changes, not while messages wait), so a waiter drains until
 * EAGAIN before sleeping, and sleeps in short slices in case another thread
 * consumed the edge.
 *
 * A socket monitor reports the connection dropping (zerod exited or was
 * restarted, which loses the job): every pending and later future then fails
 * with ZC_ECONNECT instead of waiting forever. One epoll fd covers the
 * socket, its monitor and the fast path's doorbell, so callers have a single
 * fd to watch.
 *
 * The fast path (fastpath.c), when zerod offers it and ZEROD_FASTPATH is
 * not 0, carries BucketReady, BucketDone and StepDone through a shared ring;
 * it is attached in zc_register_plan(). Both channels are read in the order
 * the daemon wrote them: before handling its k-th ZeroMQ message, the
 * client takes what the ring holds in front of MARK(k).
 *
 * Completion callbacks (zc_future_then) never run under the mutex: a future
 * that settles with a callback joins the client's queue, and every public
 * call leaves through client_unlock(), which runs the queue after unlocking.
 * So a callback may call back into the client, and each runs once: it is
 * taken off the queue under the lock.
 *
 * Errors: each failing call writes its reason into a thread-local buffer
 * (err_set, zc_error_message), so two threads never read each other's.
 * What the daemon says outside any call (a refused SetHyper) waits in the
 * client for zc_last_error().
 *
 * fork(): a child's copy of a client must not touch the parent's session. A
 * pthread_atfork() handler counts forks in the child; every entry point
 * compares the count with the one its client (or future) was made under
 * before it takes the lock (which a parent's thread may have held at the
 * fork) and fails with ZC_EFORKED. A load, not a getpid() system call, on
 * the hot path.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <zmq.h>

#include "abi.h"
#include "bufs.h"
#include "devbufs.h"
#include "common.h"
#include "fastpath.h"
#include "internal.h"
/* zeroclient.h's rounding of bf16/fp16, the daemon's own (header only):
 * zc_set_state() rounds a given master into the parameters */
#include "lowp.h"
#include "plan.h"
#include "wire.h"
#include "zeroclient.h"

#define WAIT_SLICE_MS              10
#define DEFAULT_CONNECT_TIMEOUT_MS 30000

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

struct zc_client {
	pthread_mutex_t mu;
	unsigned forks; /* the process's fork count at zc_connect() */
	pid_t pid;
	void *zctx, *sock;
	void *mon; /* PAIR receiving sock's monitor events */
	int efd;   /* epoll over the ZMQ_FDs of sock and mon: what zc_fd() returns */
	char job_id[ZEROD_JOB_ID_MAX + 1];
	struct zc_config cfg;

	/* the fast path: offered in HelloOk, attached by zc_register_plan() */
	char fp_mine[108]; /* <the socket we reached>.fd */
	char fp_path[108]; /* where zerod says it is */
	uint64_t fp_token;
	struct fpc *fp;
	bool fp_closed;        /* zerod closed its channel: send by ZeroMQ */
	uint64_t zsent, zrecv; /* ZeroMQ messages sent / received (Hello, HelloOk: 1) */
	bool zmq_look;         /* ZeroMQ may hold messages its fds do not signal */
	bool bell;             /* epoll saw the doorbell readable: read it before sleeping */

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
	int hello_result;
	int stall_ms;         /* HelloOk's stall_timeout_ms (0: an older zerod's) */
	char answer_msg[256]; /* the reason of a failed Hello or RegisterPlan */

	uint64_t iter;
	uint32_t sent_in_iter; /* buckets of `iter` handed over so far */
	uint64_t steps_done;   /* iterations whose StepDone arrived */
	/* what the latest StepDones said (zc_step_info), by iteration % 16 */
	struct step_rec {
		uint64_t iteration; /* UINT64_MAX: none */
		bool found_inf;
		double grad_norm;
	} step_recs[STEP_RECS];
	int job_error; /* fatal error: every later future fails with it */
	char job_msg[256];
	int async_error; /* the latest error no future or call carried: zc_last_error() */
	char async_msg[256];
	uint64_t last_request;
	struct zc_future *futures;
	struct zc_future *cbq_head, *cbq_tail; /* settled futures whose callbacks are due */

	/* zc_get_state / zc_set_state: one at a time (state.c's section below) */
	bool state_pending;
	uint64_t state_request;
	int state_result; /* 0 waiting, 1 ok, < 0 error */
	char state_msg[256];

	/* zeroctl checkpoint: the operator's request (zc_checkpoint_due) */
	char *ckpt_due_dir; /* NULL: none */
	struct ckpt_writer *ckpt_writer; /* zc_checkpoint's write in flight (ckpt.c) */
	/* a checkpoint's export over several nodes: StateOk's ranges (pairs),
	 * this node's index and the count */
	uint64_t *ckpt_ranges;
	size_t nckpt_ranges;
	uint32_t ckpt_node, ckpt_nnodes;
	uint64_t ckpt_run;
	/* the last such export's ranges, for the plan of hash ckpt_prev_hash:
	 * the next one copies only their parameters */
	uint64_t *ckpt_prev;
	size_t nckpt_prev;
	uint64_t ckpt_prev_hash;
	uint64_t ckpt_due_iter;
	/* re-planning: the registered plan and its buffers, until the new
	 * plan is registered */
	struct plan *old_plan;
	struct host_buf old_grad, old_param;
	/* a CUDA re-plan: the registered buffers, c->dev the new plan's */
	struct devbufs *old_dev;
	uint32_t *replan_map; /* each new segment's index in the old plan's order */
	int replan_fd;        /* the new buffers' memfd (grad at 0, param at replan_poff) */
	uint64_t replan_poff;
	int replan_pfd; /* a shared re-plan: the parameters' memfd (at 0); -1: in replan_fd */
};

/* ------------------------------------------------------- errors, fork --- */

static _Thread_local char err_msg[256];

int err_set(int code, const char *fmt, ...)
{
	va_list ap;

	if (!fmt) {
		snprintf(err_msg, sizeof(err_msg), "%s", zc_strerror(code));
		return code;
	}
	va_start(ap, fmt);
	vsnprintf(err_msg, sizeof(err_msg), fmt, ap);
	va_end(ap);
	return code;
}

const char *zc_error_message(void)
{
	return err_msg;
}

/* Forks this process went through as the child (a process forked from a
 * child counts its parent's too). */
static atomic_uint forks;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static int atfork_result;

static void on_fork_child(void)
{
	atomic_fetch_add_explicit(&forks, 1, memory_order_relaxed);
}

static void atfork_register(void)
{
	atfork_result = -pthread_atfork(NULL, NULL, on_fork_child);
}

static bool forked(unsigned made_under)
{
	return atomic_load_explicit(&forks, memory_order_relaxed) != made_under;
}

/* Every entry point that takes a client starts here. */
static int client_check(zc_client *c, const char *fn)
{
	if (!c)
		return err_set(-EINVAL, "%s: the client is NULL", fn);
	if (forked(c->forks))
		return err_set(ZC_EFORKED,
			       "%s: this client belongs to process %d; a child after fork() cannot "
			       "use it (connect a client of its own)",
			       fn, (int)c->pid);
	return 0;
}

static int future_check(zc_future *f, const char *fn)
{
	if (!f)
		return err_set(-EINVAL, "%s: the future is NULL", fn);
	if (forked(f->forks))
		return err_set(
			ZC_EFORKED,
			"%s: this future belongs to the parent process; a child after fork() "
			"cannot use it",
			fn);
	return 0;
}

/* ---------------------------------------------------------- callbacks --- */

static void cb_enqueue(zc_client *c, struct zc_future *f)
{
	f->cb_state = CB_QUEUED;
	f->q = c;
	f->cb_next = NULL;
	if (c->cbq_tail)
		c->cbq_tail->cb_next = f;
	else
		c->cbq_head = f;
	c->cbq_tail = f;
}

static void cb_dequeue(zc_client *c, struct zc_future *f)
{
	struct zc_future **pp = &c->cbq_head, *prev = NULL;

	while (*pp && *pp != f) {
		prev = *pp;
		pp = &(*pp)->cb_next;
	}
	if (!*pp)
		return;
	*pp = f->cb_next;
	if (c->cbq_tail == f)
		c->cbq_tail = prev;
	f->cb_next = NULL;
	f->q = NULL;
}

/* Run the callbacks due, each once, without the lock: a callback may call
 * into the client, and may free its future (then it is freed here, after
 * the callback returned). */
static void run_callbacks(zc_client *c)
{
	for (;;) {
		struct zc_future *f;
		zc_future_cb *fn;
		void *arg;
		int state;
		bool free_it;

		pthread_mutex_lock(&c->mu);
		f = c->cbq_head;
		if (!f) {
			pthread_mutex_unlock(&c->mu);
			return;
		}
		c->cbq_head = f->cb_next;
		if (!c->cbq_head)
			c->cbq_tail = NULL;
		f->cb_next = NULL;
		f->cb_state = CB_RUNNING;
		fn = f->cb;
		arg = f->cb_arg;
		state = f->state;
		pthread_mutex_unlock(&c->mu);

		fn(f, state, arg);

		pthread_mutex_lock(&c->mu);
		f->cb_state = CB_DONE;
		f->q = NULL;
		free_it = f->free_after && !f->waiters;
		pthread_mutex_unlock(&c->mu);
		if (free_it)
			free(f);
	}
}

/* How every public call lets go of the client: unlock, then run what its
 * work made due. */
static void client_unlock(zc_client *c)
{
	bool due = c->cbq_head != NULL;

	pthread_mutex_unlock(&c->mu);
	if (due)
		run_callbacks(c);
}

/* ---------------------------------------------------------- helpers --- */

/* Send a request under a fresh request id (returned in *ret_id if wanted):
 * the daemon echoes it on an Error that refuses this request. */
static int send_env(zc_client *c, Zerod__V1__Envelope *env, uint64_t *ret_id)
{
	int r;

	env->has_request_id = 1;
	env->request_id = ++c->last_request;
	r = wire_send(c->sock, NULL, 0, env);
	c->zmq_look = true; /* the send may have taken the wake-up of a message */
	if (r >= 0)
		c->zsent++; /* a ring slot pushed from now on goes after a MARK */
	if (r >= 0 && ret_id)
		*ret_id = env->request_id;
	return r == -EHOSTUNREACH ? ZC_ECONNECT : r;
}

static void future_link(zc_client *c, struct zc_future *f)
{
	f->c = c;
	f->next = c->futures;
	if (c->futures)
		c->futures->prev = f;
	c->futures = f;
}

static void future_unlink(struct zc_future *f)
{
	zc_client *c = f->c;

	if (!c)
		return;
	if (f->prev)
		f->prev->next = f->next;
	else
		c->futures = f->next;
	if (f->next)
		f->next->prev = f->prev;
	f->prev = f->next = NULL;
}

/* Called with the lock of f's client held (f->c is set). */
static void future_settle(struct zc_future *f, int state, const char *msg)
{
	if (f->state != 0)
		return;
	f->state = state;
	snprintf(f->msg, sizeof(f->msg), "%s", msg ? msg : "");
	if (f->cb_state == CB_SET)
		cb_enqueue(f->c, f);
}

static void fail_all(zc_client *c, int code, const char *msg)
{
	for (struct zc_future *f = c->futures; f; f = f->next)
		future_settle(f, code, msg);
}

/* ------------------------------------------------------- dispatching --- */

/* The job cannot go on for this client: every pending and later future, and
 * a Hello or RegisterPlan still waiting, fail with code. */
static void job_failed(zc_client *c, int code, const char *msg)
{
	/* the first reason stands (ZC_ESHUTDOWN, then the lost connection) */
	if (!c->job_error) {
		c->job_error = code;
		snprintf(c->job_msg, sizeof(c->job_msg), "%s", msg);
	}
	fail_all(c, c->job_error, c->job_msg);
	/* the reason goes with the answer it gives: a RegisterPlan answered
	 * with its own error already keeps that error's reason */
	if (c->hello_result == 0 || (c->hello_result > 0 && c->plan_result == 0))
		snprintf(c->answer_msg, sizeof(c->answer_msg), "%s", c->job_msg);
	if (c->hello_result == 0)
		c->hello_result = c->job_error;
	if (c->plan_result == 0)
		c->plan_result = c->job_error;
	if (c->state_pending && c->state_result == 0) {
		c->state_result = c->job_error;
		snprintf(c->state_msg, sizeof(c->state_msg), "%s", c->job_msg);
	}
}

static void handle_error(zc_client *c, const Zerod__V1__Envelope *env)
{
	const Zerod__V1__Error *e = env->error;
	int code = wire_error_from_pb(e->code);
	bool matched = false;

	/* The client checks the order of buckets before sending them: a bucket
	 * the daemon still refuses means the two disagree on where the
	 * iteration stands, and going on could only hang. */
	if (e->fatal || code == ZC_EORDER || code == ZC_EDUPBUCKET || code == ZC_EBUCKET ||
	    code == ZC_EEARLY) {
		job_failed(c, code, e->message);
		return;
	}
	if (env->has_request_id) {
		/* the refused BucketReady's own future, not another one of the
		 * same iteration and bucket */
		for (struct zc_future *f = c->futures; f; f = f->next)
			if (f->kind == FUTURE_BUCKET && f->request == env->request_id) {
				future_settle(f, code, e->message);
				matched = true;
				break;
			}
	}
	if (!matched && c->state_pending && c->state_result == 0 &&
	    (!env->has_request_id || env->request_id == c->state_request)) {
		/* the answer to GetState or SetState: about this rank's request,
		 * or another rank's that spoilt the round */
		c->state_result = code;
		snprintf(c->state_msg, sizeof(c->state_msg), "%s", e->message);
		return;
	}
	if (!matched && c->plan_result == 0 && c->registered) {
		/* the answer to RegisterPlan */
		c->plan_result = code;
		snprintf(c->answer_msg, sizeof(c->answer_msg), "%s", e->message);
		return;
	}
	if (!matched) {
		/* the latest stands: zc_last_error() */
		c->async_error = code;
		snprintf(c->async_msg, sizeof(c->async_msg), "%s", e->message);
	}
}

/* BucketDone and StepDone, from either channel. */
static void bucket_done(zc_client *c, uint64_t iteration, uint32_t bucket)
{
	for (struct zc_future *f = c->futures; f; f = f->next)
		if (f->kind == FUTURE_BUCKET && f->bucket == bucket && f->iteration == iteration)
			future_settle(f, 1, NULL);
}

/* The StepDone info of iteration it, if kept. */
static void step_info_of(zc_client *c, uint64_t it, struct zc_future *f)
{
	const struct step_rec *r = &c->step_recs[it % STEP_RECS];

	f->found_inf = r->iteration == it && r->found_inf;
	f->grad_norm = r->iteration == it ? r->grad_norm : NAN;
}

/* A ring's StepDone carries no info: found_inf false, grad_norm NaN (the
 * daemon sends a StepDone that has some over ZeroMQ). */
static void step_done(zc_client *c, uint64_t iteration, bool found_inf, double grad_norm)
{
	c->step_recs[iteration % STEP_RECS] = (struct step_rec){
		.iteration = iteration, .found_inf = found_inf, .grad_norm = grad_norm};
	if (iteration + 1 > c->steps_done)
		c->steps_done = iteration + 1;
	for (struct zc_future *f = c->futures; f; f = f->next)
		if (f->kind == FUTURE_STEP && f->iteration < c->steps_done && f->state == 0) {
			step_info_of(c, f->iteration, f);
			future_settle(f, 1, NULL);
		}
}

static void hello_ok(zc_client *c, const Zerod__V1__HelloOk *ok)
{
	if (c->hello_result == 0) /* not after a lost connection */
		c->hello_result = 1;
	c->stall_ms = ok->has_stall_timeout_ms ? (int)MIN(ok->stall_timeout_ms, INT32_MAX / 4) : 0;
	if (ok->fastpath_socket && ok->has_fastpath_token &&
	    strlen(ok->fastpath_socket) < sizeof(c->fp_path)) {
		snprintf(c->fp_path, sizeof(c->fp_path), "%s", ok->fastpath_socket);
		c->fp_token = ok->fastpath_token;
	}
}

static void handle(zc_client *c, const Zerod__V1__Envelope *env)
{
	switch (env->body_case) {
	case ZEROD__V1__ENVELOPE__BODY_HELLO_OK:
		hello_ok(c, env->hello_ok);
		break;
	case ZEROD__V1__ENVELOPE__BODY_PLAN_OK:
		if (c->plan_result == 0)
			c->plan_result = 1;
		break;
	case ZEROD__V1__ENVELOPE__BODY_BUCKET_DONE:
		bucket_done(c, env->bucket_done->iteration, env->bucket_done->bucket);
		break;
	case ZEROD__V1__ENVELOPE__BODY_STEP_DONE:
		step_done(c, env->step_done->iteration, env->step_done->found_inf,
			  env->step_done->has_grad_norm ? env->step_done->grad_norm : NAN);
		break;
	case ZEROD__V1__ENVELOPE__BODY_ERROR:
		handle_error(c, env);
		break;
	case ZEROD__V1__ENVELOPE__BODY_STATE_OK:
		if (c->state_pending && c->state_result == 0) {
			const Zerod__V1__StateOk *ok = env->state_ok;
			free(c->ckpt_ranges);
			c->ckpt_ranges = NULL;
			c->nckpt_ranges = 0;
			c->ckpt_nnodes = 0; /* none told */
			if (ok->has_nnodes && !(ok->n_ranges & 1) &&
			    (c->ckpt_ranges = malloc((ok->n_ranges + 1) * sizeof(uint64_t)))) {
				if (ok->n_ranges)
					memcpy(c->ckpt_ranges, ok->ranges,
					       ok->n_ranges * sizeof(uint64_t));
				c->nckpt_ranges = ok->n_ranges / 2;
				c->ckpt_node = ok->node;
				c->ckpt_nnodes = ok->nnodes;
				c->ckpt_run = ok->has_run ? ok->run : 0;
			}
			c->state_result = 1;
		}
		break;
	case ZEROD__V1__ENVELOPE__BODY_CHECKPOINT_DUE:
		free(c->ckpt_due_dir);
		c->ckpt_due_dir = strdup(env->checkpoint_due->dir);
		c->ckpt_due_iter = env->checkpoint_due->iteration;
		break;
	default:
		c->async_error = ZC_EPROTO;
		snprintf(c->async_msg, sizeof(c->async_msg),
			 "zerod sent a message a client does not expect (body %d)",
			 (int)env->body_case);
		break;
	}
}

static void connection_lost(zc_client *c)
{
	job_failed(
		c, ZC_ECONNECT,
		"lost the connection to zerod (it exited or restarted; the job's state is gone)");
}

/* Monitor events: two frames, (uint16 event, uint32 value) then the address.
 * true if the connection was lost. */
static bool drain_monitor(zc_client *c)
{
	bool lost = false;

	for (;;) {
		zmq_msg_t ev, addr;
		uint16_t event = 0;

		zmq_msg_init(&ev);
		if (zmq_msg_recv(&ev, c->mon, ZMQ_DONTWAIT) < 0) {
			zmq_msg_close(&ev);
			return lost;
		}
		if (zmq_msg_size(&ev) >= sizeof(event))
			memcpy(&event, zmq_msg_data(&ev), sizeof(event));
		zmq_msg_init(&addr);
		if (zmq_msg_more(&ev))
			zmq_msg_recv(&addr, c->mon, ZMQ_DONTWAIT);
		zmq_msg_close(&addr);
		zmq_msg_close(&ev);
		if (event == ZMQ_EVENT_DISCONNECTED)
			lost = true;
	}
}

/* Act on the ring's completions that may be taken once zrecv ZeroMQ
 * messages were handled. A ring that makes no sense fails the job, and the
 * client goes on with ZeroMQ alone. */
static int take_ring(zc_client *c, uint64_t zrecv)
{
	struct fpc_event ev;
	char err[160];
	int n = 0, r;

	while (c->fp && (r = fpc_next(c->fp, zrecv, &ev, err, sizeof(err))) != 0) {
		if (r < 0) {
			epoll_ctl(c->efd, EPOLL_CTL_DEL, fpc_fd(c->fp), NULL);
			fpc_free(c->fp);
			c->fp = NULL;
			job_failed(c, r, err);
			break;
		}
		if (ev.step)
			step_done(c, ev.iteration, false, NAN);
		else
			bucket_done(c, ev.iteration, ev.bucket);
		n++;
	}
	return n;
}

/* How much a dispatch looks at. */
enum look {
	/* everything: the caller wants errors too */
	LOOK_ALL,
	/* the caller sleeps on c->efd next, and has asked epoll what is
	 * ready: with a ring, read ZeroMQ only where c->zmq_look says it may
	 * hold something */
	LOOK_SLEEP,
};

/* What epoll said was ready: the doorbell sets c->bell, a ZeroMQ fd (its
 * socket or monitor) c->zmq_look. */
static void note_ready(zc_client *c, const struct epoll_event *ev, int n)
{
	for (int i = 0; i < n; i++) {
		if (c->fp && ev[i].data.fd == fpc_fd(c->fp))
			c->bell = true;
		else
			c->zmq_look = true;
	}
}

/* Drain every message that has arrived, from both channels. Called with
 * c->mu held. A lost connection is acted on after the messages that came
 * before it: the daemon's last word (ZC_ESHUTDOWN, say) is the better
 * reason.
 *
 * Reading ZeroMQ costs system calls even when nothing came (libzmq polls
 * its mailbox), so with a ring a sleeper skips it unless its fds were
 * ready: once a read ended in EAGAIN, the next message makes them readable,
 * and they stay so until the next read. A send may eat that signal, so a
 * send sets zmq_look too. The doorbell is read only when epoll saw it
 * ringing (c->bell); one left unread makes the next epoll_wait return at
 * once, and then it is read. */
static int dispatch_locked(zc_client *c, enum look look)
{
	bool zmq = !c->fp || look == LOOK_ALL || c->zmq_look;
	bool lost = zmq && c->mon && drain_monitor(c);
	int n = 0, e = EAGAIN;

	if (c->fp && !fpc_begin(c->fp, c->bell) && !c->fp_closed) {
		/* zerod closed the channel: its end of file would keep c->efd
		 * readable; what comes now comes by ZeroMQ */
		epoll_ctl(c->efd, EPOLL_CTL_DEL, fpc_fd(c->fp), NULL);
		c->fp_closed = true;
	}
	c->bell = false;
	for (;;) {
		Zerod__V1__Envelope *env;
		zmq_msg_t msg;

		n += take_ring(c, c->zrecv);
		if (!zmq)
			break;
		zmq_msg_init(&msg);
		if (zmq_msg_recv(&msg, c->sock, ZMQ_DONTWAIT) < 0) {
			e = zmq_errno();
			zmq_msg_close(&msg);
			c->zmq_look = e != EAGAIN;
			break;
		}
		/* what the daemon put in the ring before it sent this, first */
		n += take_ring(c, c->zrecv++);
		if (wire_decode(zmq_msg_data(&msg), zmq_msg_size(&msg), &env) == 0) {
			handle(c, env);
			wire_free(env);
		} else {
			c->async_error = ZC_EPROTO;
			snprintf(c->async_msg, sizeof(c->async_msg),
				 "zerod sent a message that does not decode (%zu bytes)",
				 zmq_msg_size(&msg));
		}
		zmq_msg_close(&msg);
		n++;
	}
	while (c->fp && fpc_sleep(c->fp, c->zrecv))
		n += take_ring(c, c->zrecv);
	if (lost)
		connection_lost(c);
	return e == EAGAIN ? n : -e;
}

int zc_dispatch(zc_client *c)
{
	struct epoll_event ev[4];
	int r;

	if ((r = client_check(c, __func__)) < 0)
		return r;
	pthread_mutex_lock(&c->mu);
	/* the caller woke on c->efd: from what? (one system call, where
	 * reading ZeroMQ and the doorbell for nothing costs five) */
	if (c->fp)
		note_ready(c, ev, epoll_wait(c->efd, ev, ARRAY_SIZE(ev), 0));
	r = dispatch_locked(c, LOOK_SLEEP);
	client_unlock(c);
	return r < 0 ? err_set(r, "zc_dispatch: receiving from zerod: %s", zc_strerror(r)) : r;
}

int zc_fd(zc_client *c)
{
	int r = client_check(c, __func__);

	return r < 0 ? r : c->efd;
}

/* Wait until *flag (read under the lock) is non-zero or the deadline passes.
 * deadline_ms < 0: forever. Returns the flag's value, or 0 on timeout. A
 * negative value's reason, msg (read under the lock: the callbacks run after
 * it may free the future that holds it), goes to this thread's
 * zc_error_message() when msg is not NULL. */
static int wait_for(zc_client *c, const int *flag, const char *msg, int64_t deadline_ms)
{
	struct epoll_event ev[4];
	int n = 0;

	for (;;) {
		int v, slice = WAIT_SLICE_MS;
		int64_t now;

		pthread_mutex_lock(&c->mu);
		note_ready(c, ev, n);
		/* the ring first: when it settles the flag, ZeroMQ can wait for
		 * the next look */
		take_ring(c, c->zrecv);
		if (*flag == 0)
			dispatch_locked(c, LOOK_SLEEP);
		v = *flag;
		if (v < 0 && msg)
			err_set(v, "%s", msg[0] ? msg : zc_strerror(v));
		client_unlock(c);
		if (v != 0)
			return v;
		now = now_ms();
		if (deadline_ms >= 0) {
			if (now >= deadline_ms)
				return 0;
			slice = (int)MIN((int64_t)slice, deadline_ms - now);
		}
		n = epoll_wait(c->efd, ev, ARRAY_SIZE(ev), slice);
	}
}

/* ----------------------------------------------------------- connect --- */

static const char *default_socket(char *buf, size_t len)
{
	const char *s = getenv("ZEROD_SOCKET");

	if (s && *s)
		return s;
	s = getenv("XDG_RUNTIME_DIR");
	if (s && *s) {
		snprintf(buf, len, "%s/zerod/zerod.sock", s);
		if (access(buf, F_OK) == 0)
			return buf;
	}
	return "/run/zerod/zerod.sock";
}

/* what the trainer's error says to do (err_msg holds 256 bytes) */
#define HOW_TO_START     "start zerod (zerod --socket PATH) or set ZEROD_SOCKET to its socket"
#define PROBE_REFUSED_MS 200 /* a zerod between its bind() and listen() */

/* What is at path, told at once: ZeroMQ would retry a missing socket, a
 * refused connect or a peer that is no ZeroMQ socket until the connect
 * timeout and say only that no zerod answered. A plain connection sends
 * ZMTP's signature (0xff, 8 bytes, 0x7f) and reads the peer's: libzmq sends
 * its own at once, so anything else (an answer that is not one, an end of
 * file) is a socket that is not zerod's. zerod's libzmq takes the probe
 * for a peer whose handshake broke off, as it takes any. */
static int probe_socket(const char *path, int timeout_ms)
{
	static const uint8_t sig[10] = {0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f};
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = timeout_ms % 1000 * 1000};
	int64_t deadline = now_ms() + timeout_ms, refused_until = now_ms() + PROBE_REFUSED_MS;
	uint8_t got[10];
	size_t have = 0;
	struct stat st;
	int fd, r = 0;

	if (stat(path, &st) < 0)
		return err_set(ZC_ECONNECT, "no zerod socket at %.180s (%s): " HOW_TO_START, path,
			       strerror(errno));
	if (S_ISDIR(st.st_mode))
		return err_set(ZC_ECONNECT,
			       "%.180s is a directory, not zerod's socket: " HOW_TO_START, path);
	if (!S_ISSOCK(st.st_mode))
		return err_set(ZC_ECONNECT, "%.180s is not a socket, so not zerod's: " HOW_TO_START,
			       path);
	if (strlen(path) >= sizeof(sa.sun_path))
		return 0; /* ZeroMQ says what it makes of it */
	memcpy(sa.sun_path, path, strlen(path) + 1);
	for (;;) {
		fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0)
			return 0; /* no fd for a probe: ZeroMQ's connect will say */
		setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
		if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
			break;
		r = errno;
		close(fd);
		if (r != ECONNREFUSED || now_ms() >= refused_until)
			break;
		poll(NULL, 0, 20);
	}
	if (r == ECONNREFUSED)
		return err_set(ZC_ECONNECT,
			       "nothing listens on %.180s (a socket left by a zerod that "
			       "exited?): " HOW_TO_START,
			       path);
	if (r)
		return 0; /* EACCES, EAGAIN...: ZeroMQ's connect and the Hello say */
	if (send(fd, sig, sizeof(sig), MSG_NOSIGNAL) != (ssize_t)sizeof(sig))
		goto not_zerod;
	while (have < sizeof(got)) {
		struct pollfd pfd = {.fd = fd, .events = POLLIN};
		int64_t left = deadline - now_ms();
		ssize_t n;

		if (left <= 0 || poll(&pfd, 1, (int)left) == 0) {
			close(fd);
			return err_set(ZC_ECONNECT,
				       "%.180s accepted a connection but sent no ZeroMQ greeting "
				       "within %d ms: not zerod's socket? " HOW_TO_START,
				       path, timeout_ms);
		}
		n = recv(fd, got + have, sizeof(got) - have, MSG_DONTWAIT);
		if (n < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (n <= 0)
			break;
		have += (size_t)n;
	}
	if (have == sizeof(got) && got[0] == 0xff && (got[9] & 1)) {
		close(fd);
		return 0;
	}
not_zerod:
	close(fd);
	return err_set(ZC_ECONNECT,
		       "%.180s is a socket that does not speak ZeroMQ, not zerod's: " HOW_TO_START,
		       path);
}

/* A job over several nodes: the settings the Hello carries. */
struct multinode {
	const char *rdzv; /* NULL: one node */
	uint32_t nnodes;
	bool has_node_rank;
	uint32_t node_rank;
	const char *secret;
};

#define RDZV_MAX_LEN   255
#define SECRET_MAX_LEN 256

static int env_u32(const char *name, bool *ret_set, uint32_t *ret)
{
	const char *v = getenv(name);
	char *end;
	unsigned long n;

	*ret_set = v && *v;
	if (!*ret_set)
		return 0;
	errno = 0;
	n = strtoul(v, &end, 10);
	if (errno || *end || n > UINT32_MAX || *v == '-')
		return -EINVAL;
	*ret = (uint32_t)n;
	return 0;
}

/* cfg's fields, else the environment's (ZEROD_RDZV, ZEROD_NNODES,
 * ZEROD_NODE_RANK, ZEROD_JOB_SECRET), checked. -EINVAL with err filled. */
static int multinode_settings(const struct zc_config *cfg, struct multinode *ret, char *err,
			      size_t errlen)
{
	struct multinode m = {.rdzv = cfg->rdzv ? cfg->rdzv : getenv("ZEROD_RDZV")};
	const char *colon;
	bool set;
	char *end;
	unsigned long port;

	if (!m.rdzv || !*m.rdzv) {
		*ret = (struct multinode){0};
		return 0;
	}
	colon = strrchr(m.rdzv, ':');
	port = colon ? strtoul(colon + 1, &end, 10) : 0;
	if (strlen(m.rdzv) > RDZV_MAX_LEN || !colon || colon == m.rdzv || !colon[1] || *end ||
	    port == 0 || port > 65535) {
		snprintf(err, errlen, "rendezvous \"%.64s\": want host:port (port 1..65535)",
			 m.rdzv);
		return -EINVAL;
	}
	m.nnodes = cfg->nnodes;
	if (!m.nnodes && (env_u32("ZEROD_NNODES", &set, &m.nnodes) < 0 || !set)) {
		snprintf(err, errlen,
			 "a rendezvous is named but not the number of nodes "
			 "(zc_config.nnodes or ZEROD_NNODES)");
		return -EINVAL;
	}
	if (m.nnodes == 0 || m.nnodes > cfg->world_size) {
		snprintf(err, errlen, "%u nodes for %u ranks: need 1 <= nnodes <= world size",
			 m.nnodes, cfg->world_size);
		return -EINVAL;
	}
	m.has_node_rank = cfg->has_node_rank != 0;
	m.node_rank = cfg->node_rank;
	if (!m.has_node_rank && env_u32("ZEROD_NODE_RANK", &m.has_node_rank, &m.node_rank) < 0) {
		snprintf(err, errlen, "ZEROD_NODE_RANK is not a number");
		return -EINVAL;
	}
	if (m.has_node_rank && m.node_rank >= m.nnodes) {
		snprintf(err, errlen, "node rank %u of %u nodes", m.node_rank, m.nnodes);
		return -EINVAL;
	}
	m.secret = cfg->job_secret ? cfg->job_secret : getenv("ZEROD_JOB_SECRET");
	if (!m.secret || !*m.secret || strlen(m.secret) > SECRET_MAX_LEN) {
		snprintf(err, errlen,
			 "a job over several nodes needs a secret of 1..%d bytes "
			 "(zc_config.job_secret or ZEROD_JOB_SECRET)",
			 SECRET_MAX_LEN);
		return -EINVAL;
	}
	*ret = m;
	return 0;
}

/* Watch a ZeroMQ socket's ZMQ_FD in the client's epoll fd. */
static int epoll_add_zsock(int efd, void *zsock)
{
	struct epoll_event ev = {.events = EPOLLIN};
	size_t len = sizeof(int);
	int fd;

	if (zmq_getsockopt(zsock, ZMQ_FD, &fd, &len) < 0)
		return -zmq_errno();
	ev.data.fd = fd;
	return epoll_ctl(efd, EPOLL_CTL_ADD, fd, &ev) < 0 ? -errno : 0;
}

static int monitor_open(zc_client *c)
{
	char ep[64];

	c->efd = epoll_create1(EPOLL_CLOEXEC);
	if (c->efd < 0)
		return -errno;
	snprintf(ep, sizeof(ep), "inproc://zeroclient-monitor-%p", (void *)c);
	if (zmq_socket_monitor(c->sock, ep, ZMQ_EVENT_DISCONNECTED) < 0)
		return -zmq_errno();
	c->mon = zmq_socket(c->zctx, ZMQ_PAIR);
	if (!c->mon || zmq_connect(c->mon, ep) < 0)
		return -zmq_errno();
	return epoll_add_zsock(c->efd, c->mon);
}

/* ZeroMQ's errors, converted once: -errno, and the option in the reason. */
static int zopt(void *sock, int opt, const char *name, const void *val, size_t len)
{
	int e;

	if (zmq_setsockopt(sock, opt, val, len) == 0)
		return 0;
	e = zmq_errno();
	return err_set(-e, "zc_connect: zmq_setsockopt(%s): %s", name, zmq_strerror(e));
}
#define ZOPT(sock, opt, val) zopt((sock), (opt), #opt, &(val), sizeof(val))

int zc_connect(const struct zc_config *ucfg, zc_client **ret_client)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__Hello h = ZEROD__V1__HELLO__INIT;
	char pathbuf[512], endpoint[600];
	struct zc_config cfg;
	const char *path;
	int zero = 0, hwm = ZEROD_QUEUE_MSGS, r, timeout;
	int64_t maxmsg = ZEROD_MAX_MSG_BYTES;
	struct multinode mn;
	char mnerr[200];
	zc_client *c;

	if (!ret_client)
		return err_set(-EINVAL, "zc_connect: ret_client is NULL");
	r = config_from_zc(ucfg, &cfg);
	if (r < 0)
		return r;
	if (!job_id_valid(cfg.job_id))
		return err_set(-EINVAL,
			       "zc_connect: job_id must be 1..%d characters of "
			       "[A-Za-z0-9._-]",
			       ZEROD_JOB_ID_MAX);
	if (cfg.world_size == 0 || cfg.rank >= cfg.world_size || cfg.local_size == 0 ||
	    cfg.local_rank >= cfg.local_size)
		return err_set(
			-EINVAL,
			"zc_connect: rank %u of world_size %u, local_rank %u of local_size %u",
			cfg.rank, cfg.world_size, cfg.local_rank, cfg.local_size);
	if (cfg.connect_timeout_ms < 0 || cfg.register_timeout_ms < 0)
		return err_set(-EINVAL, "zc_connect: a negative timeout");
	pthread_once(&atfork_once, atfork_register);
	if (atfork_result < 0)
		return err_set(atfork_result, "zc_connect: pthread_atfork: %s",
			       strerror(-atfork_result));
	r = multinode_settings(&cfg, &mn, mnerr, sizeof(mnerr));
	if (r < 0)
		return err_set(r, "zc_connect: %s", mnerr);
	c = calloc(1, sizeof(*c));
	if (!c)
		return err_set(-ENOMEM, NULL);
	pthread_mutex_init(&c->mu, NULL);
	c->forks = atomic_load_explicit(&forks, memory_order_relaxed);
	c->pid = getpid();
	c->efd = -1;
	c->replan_fd = -1;
	c->replan_pfd = -1;
	c->share_fd = -1;
	for (unsigned i = 0; i < STEP_RECS; i++)
		c->step_recs[i].iteration = UINT64_MAX;
	c->cfg = cfg;
	snprintf(c->job_id, sizeof(c->job_id), "%s", cfg.job_id);
	c->cfg.job_id = c->job_id;
	c->cfg.socket = NULL;
	timeout = cfg.connect_timeout_ms ? cfg.connect_timeout_ms : DEFAULT_CONNECT_TIMEOUT_MS;
	c->cfg.connect_timeout_ms = timeout;

	path = cfg.socket ? cfg.socket : default_socket(pathbuf, sizeof(pathbuf));
	snprintf(endpoint, sizeof(endpoint), "ipc://%s", path);
	/* ZeroMQ retries a refused connect until the timeout; a socket this
	 * user may not use (connecting needs write permission on it) is told
	 * at once, and so is one that is missing, where nothing listens, or
	 * that is not zerod's (probe_socket). */
	if (faccessat(AT_FDCWD, path, W_OK, AT_EACCESS) < 0 &&
	    (errno == EACCES || errno == EPERM)) {
		r = err_set(-EACCES,
			    "no permission to use the socket %.180s (its mode or group, or a "
			    "directory above it)",
			    path);
		goto fail;
	}
	r = probe_socket(path, timeout);
	if (r < 0)
		goto fail;
	if ((size_t)snprintf(c->fp_mine, sizeof(c->fp_mine), "%s.fd", path) >= sizeof(c->fp_mine))
		c->fp_mine[0] = 0;
	c->zctx = zmq_ctx_new();
	if (!c->zctx) {
		r = err_set(-ENOMEM, "zc_connect: zmq_ctx_new failed");
		goto fail;
	}
	c->sock = zmq_socket(c->zctx, ZMQ_DEALER);
	if (!c->sock) {
		r = err_set(-zmq_errno(), "zc_connect: zmq_socket: %s", zmq_strerror(zmq_errno()));
		goto fail;
	}
	if ((r = ZOPT(c->sock, ZMQ_LINGER, zero)) < 0 ||
	    (r = ZOPT(c->sock, ZMQ_MAXMSGSIZE, maxmsg)) < 0 ||
	    (r = ZOPT(c->sock, ZMQ_SNDHWM, hwm)) < 0 || (r = ZOPT(c->sock, ZMQ_RCVHWM, hwm)) < 0)
		goto fail;
	r = monitor_open(c);
	if (r < 0) {
		err_set(r, "zc_connect: the socket's monitor: %s", zc_strerror(r));
		goto fail;
	}
	if (zmq_connect(c->sock, endpoint) < 0) {
		r = err_set(ZC_ECONNECT, "zc_connect: %.180s: %s", endpoint,
			    zmq_strerror(zmq_errno()));
		goto fail;
	}
	r = epoll_add_zsock(c->efd, c->sock);
	if (r < 0) {
		err_set(r, "zc_connect: epoll: %s", zc_strerror(r));
		goto fail;
	}

	h.protocol_version = ZC_PROTOCOL_VERSION;
	h.job_id = c->job_id;
	h.rank = cfg.rank;
	h.world_size = cfg.world_size;
	h.local_rank = cfg.local_rank;
	h.local_size = cfg.local_size;
	h.pid = getpid();
	if (mn.rdzv) {
		h.rdzv = (char *)mn.rdzv;
		h.has_nnodes = 1;
		h.nnodes = mn.nnodes;
		h.has_node_rank = mn.has_node_rank;
		h.node_rank = mn.node_rank;
		h.has_job_secret = 1;
		h.job_secret.data = (uint8_t *)mn.secret;
		h.job_secret.len = strlen(mn.secret);
	}
	env.body_case = ZEROD__V1__ENVELOPE__BODY_HELLO;
	env.hello = &h;
	r = send_env(c, &env, NULL);
	if (r < 0) {
		err_set(r, "zc_connect: sending Hello: %s", zc_strerror(r));
		goto fail;
	}
	r = wait_for(c, &c->hello_result, NULL, now_ms() + timeout);
	if (r == 0) {
		r = err_set(ZC_ECONNECT,
			    "no zerod answered on %.180s within %d ms (something listens there: "
			    "not zerod's socket, or a zerod that hangs?)",
			    path, timeout);
		goto fail;
	}
	if (r < 0) {
		err_set(r, "%s", c->answer_msg);
		goto fail;
	}
	/* Waits for the other ranks (zc_register_plan...) last longer than
	 * the daemon's own clock, which fails them naming the ranks missing:
	 * its stall timeout runs from the last progress, so twice it. */
	if (!c->cfg.register_timeout_ms)
		c->cfg.register_timeout_ms =
			(int)MIN((int64_t)timeout + 2 * (int64_t)c->stall_ms, INT32_MAX);
	*ret_client = c;
	return 0;
fail:
	zc_close(c);
	return r;
}

static void buf_release(struct host_buf *b)
{
	if (b->base)
		munmap(b->base, b->bytes);
	b->base = NULL;
}

void zc_close(zc_client *c)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__Goodbye bye = ZEROD__V1__GOODBYE__INIT;

	int linger = 200;

	/* a child's copy: the session, its sockets and its lock are the
	 * parent's (the lock may even be held by a thread the child lacks) */
	if (!c || forked(c->forks))
		return;
	/* a checkpoint still being written is finished first, and how it
	 * ended said to zerod */
	ckpt_writer_drain(c->ckpt_writer);
	pthread_mutex_lock(&c->mu);
	client_ckpt_report_locked(c);
	pthread_mutex_unlock(&c->mu);
	ckpt_writer_close(&c->ckpt_writer);
	free(c->ckpt_ranges);
	c->ckpt_ranges = NULL;
	free(c->ckpt_prev);
	c->ckpt_prev = NULL;
	/* The goodbye needs a linger to leave before the socket goes; without
	 * one it is not sent, and zerod ends the session when the connection
	 * closes, as for a trainer that died. */
	if (c->sock && c->hello_result == 1 &&
	    zmq_setsockopt(c->sock, ZMQ_LINGER, &linger, sizeof(linger)) == 0) {
		env.body_case = ZEROD__V1__ENVELOPE__BODY_GOODBYE;
		env.goodbye = &bye;
		(void)send_env(c, &env, NULL);
	}
	pthread_mutex_lock(&c->mu);
	while (c->futures) {
		struct zc_future *f = c->futures;
		future_settle(f, ZC_ESTATE, "the client was closed");
		future_unlink(f);
		f->c = NULL;
	}
	pthread_mutex_unlock(&c->mu);
	/* the callbacks of the futures failed here (and any still due) */
	run_callbacks(c);
	if (c->mon) {
		zmq_socket_monitor(c->sock, NULL, 0);
		zmq_close(c->mon);
	}
	if (c->efd >= 0)
		close(c->efd);
	if (c->share_fd >= 0)
		close(c->share_fd);
	fpc_free(c->fp);
	if (c->sock)
		zmq_close(c->sock);
	if (c->zctx)
		zmq_ctx_term(c->zctx);
	buf_release(&c->grad);
	buf_release(&c->param);
	devbufs_free(c->dev);
	devbufs_free(c->old_dev);
	buf_release(&c->old_grad);
	buf_release(&c->old_param);
	plan_free(c->old_plan);
	free(c->replan_map);
	if (c->replan_fd >= 0)
		close(c->replan_fd);
	if (c->replan_pfd >= 0)
		close(c->replan_pfd);
	plan_free(c->plan);
	free(c->ckpt_due_dir);
	pthread_mutex_destroy(&c->mu);
	free(c);
}

/* ----------------------------------------------------------- buffers --- */

/* Where zerod's fd socket is for us: beside the socket we reached, where it
 * is mounted for us (a container may see zerod's directory elsewhere), else
 * where zerod says. The token and the peer check keep a wrong socket
 * harmless. "" if zerod offered none. Called with c->mu held. */
static void fd_socket(zc_client *c, char *path, size_t len)
{
	snprintf(path, len, "%s",
		 !c->fp_path[0]                                   ? ""
		 : c->fp_mine[0] && access(c->fp_mine, F_OK) == 0 ? c->fp_mine
								  : c->fp_path);
}

static int map_buf(int fd, uint64_t offset, uint64_t bytes, struct host_buf *ret)
{
	void *base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)offset);

	if (base == MAP_FAILED)
		return -errno;
	ret->base = base;
	ret->bytes = bytes;
	return 0;
}

/* With c->mu held: the first buffers of this client may come for plan zp
 * (validated and copied into *ret); else the reason, set for the caller. */
static int buffers_claim(zc_client *c, const struct zc_plan *zp, struct plan **ret,
			 const char *fn)
{
	char err[256];
	int r;

	if (c->plan || c->bufs_busy)
		return err_set(ZC_ESTATE, "%s: this client has its buffers already", fn);
	if (c->job_error)
		return err_set(c->job_error, "%s", c->job_msg);
	r = plan_from_zc(zp, ret, err, sizeof(err));
	if (r < 0)
		return err_set(r, "%s", err);
	return 0;
}

/* A re-plan's parameters in the job's shared memfd param_fd (at 0), which
 * only the rank that created it fills (copy): zc_alloc_buffers_shared(). */
struct replan_share {
	int param_fd;
	bool copy;
};
static int replan_alloc(zc_client *c, const struct zc_plan *zp, const struct replan_share *sh);
static int replan_cuda(zc_client *c, const struct zc_plan *zp, const struct zc_buffers *b);

/*
 * Pass b's memfds to zerod for zp's buffers and map them here: what
 * zc_register_buffers() and zc_alloc_buffers() both do. fn names the public
 * call in reasons.
 */
static int register_fds(zc_client *c, const struct zc_plan *zp, const struct zc_buffers *b,
			const char *fn)
{
	struct host_buf grad = {0}, param = {0};
	char path[sizeof(c->fp_path)], err[256];
	int fds[2] = {b->grad_fd, b->param_fd};
	uint64_t bytes, serial = 0, token;
	struct plan *p = NULL;
	int r, timeout;

	pthread_mutex_lock(&c->mu);
	r = buffers_claim(c, zp, &p, fn);
	if (r < 0)
		goto out;
	fd_socket(c, path, sizeof(path));
	if (!path[0]) {
		r = err_set(ZC_ENOTSUP, "%s: zerod offered no fd socket to pass buffers on", fn);
		goto out;
	}
	c->bufs_busy = true;
	token = c->fp_token;
	timeout = c->cfg.connect_timeout_ms;
	pthread_mutex_unlock(&c->mu);

	bytes = plan_buffer_bytes(p);
	r = bufs_send(path, token, fds, fds[0] == fds[1] ? 1 : 2, bytes, b->grad_offset,
		      b->param_offset, timeout, &serial, err, sizeof(err));
	if (r < 0)
		err_set(r, "%s: %s", fn, err);
	else if ((r = map_buf(fds[0], b->grad_offset, bytes, &grad)) < 0 ||
		 (r = map_buf(fds[1], b->param_offset, bytes, &param)) < 0)
		err_set(r, "%s: mapping the buffers: %s", fn, zc_strerror(r));

	pthread_mutex_lock(&c->mu);
	c->bufs_busy = false;
	if (r < 0) {
		buf_release(&grad);
		buf_release(&param);
		goto out;
	}
	c->grad = grad;
	c->param = param;
	c->bufs_serial = serial;
	c->bufs_shared = b->flags & ZC_BUFFERS_SHARED_PARAMS;
	c->plan = p;
	p = NULL;
out:
	plan_free(p);
	client_unlock(c);
	return r;
}

/* p's CUDA buffers b opened (runtime loaded, event rings made) into *ret,
 * with c->mu held on entry and on return but released meanwhile (c is
 * marked busy with buffers). 0, or the code with the reason recorded. */
static int cuda_bufs_open(zc_client *c, const struct plan *p, const struct zc_buffers *b,
			  struct devbufs **ret, const char *fn)
{
	char err[384];
	int r;

	c->bufs_busy = true;
	pthread_mutex_unlock(&c->mu);
	r = devbufs_open(b->grad_dev, b->param_dev, plan_buffer_bytes(p), p->nbuckets, ret, err,
			 sizeof(err));
	if (r < 0)
		err_set(r, "%s: CUDA buffers: %s", fn, err);
	pthread_mutex_lock(&c->mu);
	c->bufs_busy = false;
	return r;
}

/* CUDA buffers: their handles and event rings, sent with the plan. */
static int register_cuda(zc_client *c, const struct zc_plan *zp, const struct zc_buffers *b)
{
	const char *fn = "zc_register_buffers";
	struct devbufs *dev = NULL;
	struct plan *p = NULL;
	int r;

	if (!b->grad_dev || !b->param_dev)
		return err_set(-EINVAL, "%s: CUDA buffers: %s is NULL", fn,
			       b->grad_dev ? "param_dev" : "grad_dev");
	pthread_mutex_lock(&c->mu);
	if (c->plan && c->registered && c->dev) {
		pthread_mutex_unlock(&c->mu);
		return replan_cuda(c, zp, b);
	}
	r = buffers_claim(c, zp, &p, fn);
	if (r < 0)
		goto out;
	r = cuda_bufs_open(c, p, b, &dev, fn);
	if (r < 0)
		goto out;
	c->dev = dev;
	c->plan = p;
	p = NULL;
out:
	plan_free(p);
	client_unlock(c);
	return r;
}

int zc_register_buffers(zc_client *c, const struct zc_plan *zp, const struct zc_buffers *ub)
{
	struct zc_buffers b;
	int r;

	if ((r = client_check(c, __func__)) < 0)
		return r;
	if (!zp)
		return err_set(-EINVAL, "zc_register_buffers: the plan is NULL");
	if ((r = buffers_from_zc(ub, &b)) < 0)
		return r;
	if (b.kind == ZC_BUFFERS_CUDA && b.flags)
		return err_set(ZC_ENOTSUP, "zc_register_buffers: flags 0x%x with CUDA buffers: "
					   "ZC_BUFFERS_SHARED_PARAMS is for host buffers",
			       b.flags);
	if (b.kind == ZC_BUFFERS_CUDA)
		return register_cuda(c, zp, &b);
	if (b.kind != ZC_BUFFERS_HOST)
		return err_set(-EINVAL, "zc_register_buffers: kind %u (ZC_BUFFERS_HOST, _CUDA)",
			       b.kind);
	if (b.grad_fd < 0 || b.param_fd < 0)
		return err_set(-EBADF, "zc_register_buffers: grad_fd %d, param_fd %d: not fds",
			       b.grad_fd, b.param_fd);
	if (b.flags & ~ZC_BUFFERS_SHARED_PARAMS)
		return err_set(-EINVAL, "zc_register_buffers: flags 0x%x (ZC_BUFFERS_SHARED_PARAMS)",
			       b.flags);
	return register_fds(c, zp, &b, __func__);
}

int zc_plan_buffer_bytes(const struct zc_plan *zp, uint64_t *ret_bytes)
{
	struct plan *p;
	char err[256];
	int r;

	if (!zp || !ret_bytes)
		return err_set(-EINVAL, "zc_plan_buffer_bytes: %s is NULL",
			       zp ? "ret_bytes" : "the plan");
	r = plan_from_zc(zp, &p, err, sizeof(err));
	if (r < 0)
		return err_set(r, "%s", err);
	*ret_bytes = plan_buffer_bytes(p);
	plan_free(p);
	return 0;
}

int zc_alloc_buffers(zc_client *c, const struct zc_plan *zp)
{
	struct zc_buffers b = ZC_BUFFERS_INIT;
	struct plan *p;
	char err[256];
	uint64_t bytes;
	int fd, r;

	if ((r = client_check(c, __func__)) < 0)
		return r;
	if (!zp)
		return err_set(-EINVAL, "zc_alloc_buffers: the plan is NULL");
	pthread_mutex_lock(&c->mu);
	bool replan = c->plan && c->registered;
	bool dev = c->dev != NULL;
	pthread_mutex_unlock(&c->mu);
	if (replan && dev)
		return err_set(ZC_ESTATE,
			       "zc_alloc_buffers: a client of CUDA buffers re-plans "
			       "with new CUDA buffers: zc_register_buffers(ZC_BUFFERS_CUDA)");
	if (replan)
		return replan_alloc(c, zp, NULL);
	/* the size first; register_fds() reads the plan again under the lock */
	r = plan_from_zc(zp, &p, err, sizeof(err));
	if (r < 0)
		return err_set(r, "%s", err);
	bytes = plan_buffer_bytes(p);
	plan_free(p);
	r = bufs_memfd(bytes, &b.param_offset, &fd);
	if (r < 0)
		return err_set(r, "zc_alloc_buffers: a memfd of 2 x %" PRIu64 " bytes: %s", bytes,
			       zc_strerror(r));
	b.grad_fd = b.param_fd = fd;
	r = register_fds(c, zp, &b, __func__);
	close(fd); /* the mappings, ours and zerod's, keep the memory */
	return r;
}

/* Without the lock: c->plan and the buffers are set once, by
 * zc_alloc_buffers(), and stay until zc_close(); trainers call this in their
 * inner loops. */
static void *bucket_ptr(zc_client *c, bool grad, uint32_t bucket, const char *fn)
{
	if (client_check(c, fn) < 0)
		return NULL;
	if (!c->plan) {
		err_set(ZC_ESTATE, "%s: no buffers yet (zc_alloc_buffers)", fn);
		return NULL;
	}
	if (bucket >= c->plan->nbuckets) {
		err_set(ZC_EBUCKET, "%s: bucket %u does not exist: the plan has %u buckets", fn,
			bucket, c->plan->nbuckets);
		return NULL;
	}
	if (c->dev)
		return (char *)(grad ? devbufs_grad(c->dev) : devbufs_param(c->dev)) +
		       plan_bucket_offset(c->plan, bucket);
	return (char *)(grad ? c->grad.base : c->param.base) + plan_bucket_offset(c->plan, bucket);
}

/* The float views: fp32 buckets only. */
static float *bucket_f32(zc_client *c, bool grad, uint32_t bucket, const char *fn)
{
	void *p = bucket_ptr(c, grad, bucket, fn);

	if (p && c->plan->buckets[bucket].dtype != ZC_DTYPE_F32) {
		err_set(ZC_ESTATE, "%s: bucket %u holds %s elements: use %s", fn, bucket,
			plan_dtype_name(c->plan->buckets[bucket].dtype),
			grad ? "zc_grad_ptr()" : "zc_param_ptr()");
		return NULL;
	}
	return p;
}

float *zc_grad_buffer(zc_client *c, uint32_t bucket)
{
	return bucket_f32(c, true, bucket, __func__);
}

float *zc_param_buffer(zc_client *c, uint32_t bucket)
{
	return bucket_f32(c, false, bucket, __func__);
}

void *zc_grad_ptr(zc_client *c, uint32_t bucket)
{
	return bucket_ptr(c, true, bucket, __func__);
}

void *zc_param_ptr(zc_client *c, uint32_t bucket)
{
	return bucket_ptr(c, false, bucket, __func__);
}

/*
 * Attach the fast path, if zerod offered one and ZEROD_FASTPATH is not 0;
 * called with c->mu held, before the plan is registered (the daemon takes a
 * ring only then). The lock is released while zerod answers: other calls
 * may run (c->registered keeps a second registration out). Without a ring
 * everything goes over ZeroMQ, as with a daemon that offers none.
 */
static void fastpath_setup(zc_client *c)
{
	const char *env = getenv("ZEROD_FASTPATH");
	uint32_t nbuckets = c->plan->nbuckets;
	uint64_t zsent = c->zsent;
	char path[sizeof(c->fp_path)], err[256];
	struct fpc *fp = NULL;
	int r;

	fd_socket(c, path, sizeof(path));
	if (!path[0] || (env && strcmp(env, "0") == 0))
		return;
	pthread_mutex_unlock(&c->mu);
	r = fpc_attach(path, c->fp_token, zsent, nbuckets, c->cfg.connect_timeout_ms, &fp, err,
		       sizeof(err));
	pthread_mutex_lock(&c->mu);
	if (r < 0)
		return;
	if (c->zsent != zsent || c->job_error) {
		/* a ZeroMQ message went out meanwhile (zc_close's Goodbye),
		 * or the job is over: not worth a ring */
		fpc_free(fp);
		return;
	}
	if (epoll_ctl(c->efd, EPOLL_CTL_ADD, fpc_fd(fp),
		      &(struct epoll_event){.events = EPOLLIN, .data.fd = fpc_fd(fp)}) < 0) {
		fpc_free(fp);
		return;
	}
	c->fp = fp;
}

static int replan_register(zc_client *c);

int zc_register_plan(zc_client *c)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__RegisterPlan rp = ZEROD__V1__REGISTER_PLAN__INIT;
	Zerod__V1__FdBuffers fds = ZEROD__V1__FD_BUFFERS__INIT;
	Zerod__V1__CudaBuffers cuda;
	void *cuda_arrays = NULL;
	Zerod__V1__Plan pb;
	int r;

	if ((r = client_check(c, __func__)) < 0)
		return r;
	pthread_mutex_lock(&c->mu);
	if (c->old_plan) {
		client_unlock(c);
		return replan_register(c);
	}
	if (!c->plan || c->registered) {
		client_unlock(c);
		return err_set(ZC_ESTATE, "zc_register_plan: %s",
			       c->registered
				       ? "the plan is registered already"
				       : "no buffers yet (zc_alloc_buffers, zc_register_buffers)");
	}
	r = plan_to_pb(c->plan, &pb);
	if (r >= 0 && c->dev && (r = devbufs_to_pb(c->dev, &cuda, &cuda_arrays)) < 0)
		plan_pb_free(&pb);
	if (r < 0) {
		client_unlock(c);
		return err_set(r, NULL);
	}
	c->registered = true;
	c->plan_result = 0;
	fastpath_setup(c);
	fds.serial = c->bufs_serial;
	fds.has_shared_params = fds.shared_params = c->bufs_shared;
	rp.plan = &pb;
	if (c->dev)
		rp.cuda = &cuda;
	else
		rp.fds = &fds;
	env.body_case = ZEROD__V1__ENVELOPE__BODY_REGISTER_PLAN;
	env.register_plan = &rp;
	r = send_env(c, &env, NULL);
	plan_pb_free(&pb);
	free(cuda_arrays);
	client_unlock(c);
	if (r < 0)
		return err_set(r, "zc_register_plan: sending the plan: %s", zc_strerror(r));
	r = wait_for(c, &c->plan_result, NULL, now_ms() + c->cfg.register_timeout_ms);
	if (r == 0)
		return err_set(ZC_ETIMEDOUT, "not every rank registered within %d ms",
			       c->cfg.register_timeout_ms);
	if (r < 0) {
		pthread_mutex_lock(&c->mu);
		err_set(r, "%s", c->answer_msg);
		client_unlock(c);
		return r;
	}
	return 0;
}

/* --------------------------------------------------------- iteration --- */

static struct zc_future *future_new(zc_client *c, enum future_kind kind, uint64_t it,
				    uint32_t bucket)
{
	struct zc_future *f = calloc(1, sizeof(*f));

	if (!f)
		return NULL;
	f->forks = c->forks;
	f->kind = kind;
	f->iteration = it;
	f->bucket = bucket;
	future_link(c, f);
	if (c->job_error)
		future_settle(f, c->job_error, c->job_msg);
	return f;
}

/* The daemon's ordering rules, checked before sending: a bucket it would
 * refuse is refused here, so the client's iteration never drifts from the
 * daemon's. A StepDone in transit is read first. Called with c->mu held. */
static int bucket_check(zc_client *c, uint32_t bucket)
{
	if (c->old_plan)
		return err_set(ZC_ESTATE, "a new plan is allocated but not registered yet "
					  "(zc_register_plan)");
	if (bucket >= c->plan->nbuckets)
		return err_set(ZC_EBUCKET, "bucket %u does not exist: the plan has %u buckets",
			       bucket, c->plan->nbuckets);
	if (bucket < c->sent_in_iter)
		return err_set(ZC_EDUPBUCKET, "bucket %u twice in iteration %" PRIu64, bucket,
			       c->iter);
	if (bucket > c->sent_in_iter)
		return err_set(ZC_EORDER,
			       "bucket %u handed over, but bucket %u comes first (buckets go 0, "
			       "1, 2, ... every iteration)",
			       bucket, c->sent_in_iter);
	if (bucket == 0 && c->steps_done < c->iter) {
		take_ring(c, c->zrecv);
		if (c->steps_done < c->iter)
			dispatch_locked(c, LOOK_ALL);
		if (c->job_error)
			return err_set(c->job_error, "%s", c->job_msg);
		if (c->steps_done < c->iter)
			return err_set(ZC_EEARLY,
				       "bucket 0 of iteration %" PRIu64 " while iteration %" PRIu64
				       " is still in flight: wait for its step before the next "
				       "backward",
				       c->iter, c->iter - 1);
	}
	return 0;
}

/* A segment mask that zc_bucket_ready_ex() may send: nwords 0, or exactly the
 * bucket's words with no bit past its segments. Called with c->mu held. */
static int mask_check(zc_client *c, uint32_t bucket, const uint64_t *unused, uint32_t nwords)
{
	uint32_t nseg, want;

	if (nwords == 0)
		return 0;
	nseg = c->plan->buckets[bucket].nsegments;
	want = (nseg + 63) / 64;
	if (!unused)
		return err_set(ZC_ESEGMASK, "zc_bucket_ready_ex: unused is NULL with nwords %u",
			       nwords);
	if (nwords != want)
		return err_set(ZC_ESEGMASK,
			       "zc_bucket_ready_ex: bucket %u has %u segments: the mask takes %u "
			       "words, got %u",
			       bucket, nseg, want, nwords);
	if (nseg % 64 && unused[want - 1] >> (nseg % 64))
		return err_set(ZC_ESEGMASK,
			       "zc_bucket_ready_ex: bucket %u has %u segments, but bits at or past "
			       "%u are set (word %u: 0x%016" PRIx64 ")",
			       bucket, nseg, nseg, want - 1, unused[want - 1]);
	return 0;
}

/* zc_bucket_ready(_ex): a mask with a bit set goes over ZeroMQ (see
 * zeroclient.h); the ring's 16-byte slot has no room for it, and ring.h's
 * MARKs keep the two channels in one order. */
static int bucket_ready(zc_client *c, uint32_t bucket, const uint64_t *unused, uint32_t nwords,
			zc_future **ret_future)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__BucketReady br = ZEROD__V1__BUCKET_READY__INIT;
	struct zc_future *f = NULL;
	bool masked = false;
	int r;

	pthread_mutex_lock(&c->mu);
	if (ckpt_report_ready(c->ckpt_writer))
		client_ckpt_report_locked(c); /* a checkpoint's write ended */
	if (c->job_error) {
		r = err_set(c->job_error, "%s", c->job_msg);
		goto out;
	}
	if (c->plan_result != 1) {
		r = err_set(ZC_ESTATE, "zc_bucket_ready: the plan is not registered");
		goto out;
	}
	r = bucket_check(c, bucket);
	if (r >= 0)
		r = mask_check(c, bucket, unused, nwords);
	if (r < 0)
		goto out;
	for (uint32_t w = 0; w < nwords; w++)
		masked = masked || unused[w];
	if (ret_future) {
		f = future_new(c, FUTURE_BUCKET, c->iter, bucket);
		if (!f) {
			r = err_set(-ENOMEM, NULL);
			goto out;
		}
	}
	if (c->fp && !c->fp_closed && !masked) {
		r = fpc_push_ready(c->fp, c->zsent, c->iter, bucket);
		if (r == -EAGAIN)
			err_set(r, "the fast-path ring is full: zerod has not taken the buckets "
				   "handed over");
		else if (r < 0)
			err_set(r, "the fast-path ring is corrupt");
	} else {
		br.iteration = c->iter;
		br.bucket = bucket;
		if (masked) {
			br.n_unused = nwords;
			br.unused = (uint64_t *)unused;
		}
		env.body_case = ZEROD__V1__ENVELOPE__BODY_BUCKET_READY;
		env.bucket_ready = &br;
		r = send_env(c, &env, f ? &f->request : NULL);
		if (r < 0)
			err_set(r, "zc_bucket_ready: sending: %s", zc_strerror(r));
	}
	if (r < 0) {
		if (f) {
			future_unlink(f);
			free(f);
		}
		goto out;
	}
	c->sent_in_iter++;
	if (bucket == c->plan->nbuckets - 1) {
		c->iter++;
		c->sent_in_iter = 0;
	}
	if (ret_future)
		*ret_future = f;
out:
	client_unlock(c);
	return r;
}

int zc_bucket_ready(zc_client *c, uint32_t bucket, zc_future **ret_future)
{
	int r;

	if ((r = client_check(c, __func__)) < 0)
		return r;
	return bucket_ready(c, bucket, NULL, 0, ret_future);
}

int zc_bucket_ready_cuda(zc_client *c, uint32_t bucket, void *stream, zc_future **ret_future)
{
	char err[384];
	uint64_t t;
	int r;

	if ((r = client_check(c, __func__)) < 0)
		return r;
	pthread_mutex_lock(&c->mu);
	if (!c->dev || !c->registered) {
		r = err_set(ZC_ESTATE, "zc_bucket_ready_cuda: %s",
			    !c->dev ? "not CUDA buffers (zc_register_buffers, ZC_BUFFERS_CUDA)"
				    : "the plan is not registered (zc_register_plan)");
		client_unlock(c);
		return r;
	}
	if (bucket >= c->plan->nbuckets) {
		r = err_set(ZC_EBUCKET, "bucket %u does not exist: the plan has %u buckets", bucket,
			    c->plan->nbuckets);
		client_unlock(c);
		return r;
	}
	t = c->iter;
	client_unlock(c);
	/* recorded before the bucket is sent: zerod's wait must find it */
	r = devbufs_record_ready(c->dev, bucket, t, stream, err, sizeof(err));
	if (r < 0)
		return err_set(r, "zc_bucket_ready_cuda: bucket %u: %s", bucket, err);
	return bucket_ready(c, bucket, NULL, 0, ret_future);
}

int zc_step_wait_cuda(zc_future *f, void *stream)
{
	zc_client *c;
	char err[384];
	int r;

	if ((r = future_check(f, __func__)) < 0)
		return r;
	c = f->c;
	if (!c)
		return err_set(ZC_ESTATE, "zc_step_wait_cuda: the client is closed");
	pthread_mutex_lock(&c->mu);
	if (f->kind != FUTURE_STEP)
		r = err_set(ZC_ESTATE, "zc_step_wait_cuda: not a step future");
	else if (f->state < 0)
		r = err_set(f->state, "%s", f->msg);
	else if (f->state == 0)
		r = err_set(ZC_ESTATE, "zc_step_wait_cuda: iteration %" PRIu64 " has not completed",
			    f->iteration);
	else if (!c->dev)
		r = err_set(ZC_ESTATE, "zc_step_wait_cuda: not CUDA buffers");
	else if (c->iter >= f->iteration + ZC_CUDA_EVENT_RING)
		r = err_set(ZC_ESTATE,
			    "zc_step_wait_cuda: iteration %" PRIu64 "'s events were reused by "
			    "iteration %" PRIu64 " (a ring of %d)",
			    f->iteration, c->iter, ZC_CUDA_EVENT_RING);
	if (r >= 0 && (r = devbufs_wait_done(c->dev, f->iteration, stream, err, sizeof(err))) < 0)
		err_set(r, "zc_step_wait_cuda: %s", err);
	client_unlock(c);
	return r;
}

int zc_bucket_ready_ex(zc_client *c, const struct zc_ready *rd, zc_future **ret_future)
{
	static const struct zc_ready defaults = ZC_READY_INIT;
	struct zc_ready in = defaults;
	uint32_t size;
	char why[256];
	int r;

	if ((r = client_check(c, __func__)) < 0)
		return r;
	if (!rd)
		return err_set(-EINVAL, "zc_bucket_ready_ex: r is NULL");
	size = abi_size(rd);
	r = abi_check(rd, size, sizeof(in));
	if (r < 0) {
		abi_reason(r, size, "ready", "ready", why, sizeof(why));
		return err_set(r, "zc_bucket_ready_ex: %s", why);
	}
	ABI_TAKE(&in, rd, size, bucket);
	ABI_TAKE(&in, rd, size, nwords);
	ABI_TAKE(&in, rd, size, reserved);
	ABI_TAKE(&in, rd, size, unused);
	if (in.reserved)
		return err_set(-EINVAL, "zc_bucket_ready_ex: reserved is %u, must be 0",
			       in.reserved);
	return bucket_ready(c, in.bucket, in.unused, in.nwords, ret_future);
}

int zc_set_grad_scale(zc_client *c, double inv_scale)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__SetGradScale gs = ZEROD__V1__SET_GRAD_SCALE__INIT;
	int r;

	if ((r = client_check(c, __func__)) < 0)
		return r;
	if (!isfinite(inv_scale) || inv_scale <= 0)
		return err_set(-EINVAL,
			       "zc_set_grad_scale: inv_scale must be finite and > 0 (got %g)",
			       inv_scale);
	pthread_mutex_lock(&c->mu);
	if (c->plan_result != 1) {
		r = err_set(ZC_ESTATE, "zc_set_grad_scale: the plan is not registered");
		goto out;
	}
	if (c->plan->step_mode != ZC_STEP_AT_END) {
		r = err_set(ZC_ESTATE, "zc_set_grad_scale: needs step_mode at_end (every bucket "
				       "reduced before any step)");
		goto out;
	}
	gs.iteration = c->iter;
	gs.inv_scale = inv_scale;
	env.body_case = ZEROD__V1__ENVELOPE__BODY_SET_GRAD_SCALE;
	env.set_grad_scale = &gs;
	r = send_env(c, &env, NULL);
	if (r < 0)
		err_set(r, "zc_set_grad_scale: sending: %s", zc_strerror(r));
out:
	client_unlock(c);
	return r;
}

int zc_step_info(zc_future *f, struct zc_step_info *out)
{
	struct zc_step_info info = ZC_STEP_INFO_INIT;
	uint32_t size;
	int r;

	if ((r = future_check(f, __func__)) < 0)
		return r;
	if (!out)
		return err_set(-EINVAL, "zc_step_info: out is NULL");
	size = abi_size(out);
	if (size < offsetof(struct zc_step_info, iteration) || size > ZC_STRUCT_MAX_SIZE)
		return err_set(-EINVAL, "zc_step_info: out->size %u out of range", size);
	if (f->c)
		pthread_mutex_lock(&f->c->mu);
	if (f->kind != FUTURE_STEP)
		r = err_set(ZC_ESTATE, "zc_step_info: not a step future");
	else if (f->state < 0)
		r = err_set(f->state, "%s", f->msg);
	else if (f->state == 0)
		r = err_set(ZC_ESTATE, "zc_step_info: iteration %" PRIu64 " has not completed",
			    f->iteration);
	info.found_inf = f->found_inf;
	info.iteration = f->iteration;
	info.grad_norm = f->grad_norm;
	if (f->c)
		client_unlock(f->c);
	if (r < 0)
		return r;
	/* the caller's bytes past what we know are zeroed, as the init does */
	memset((char *)out + sizeof(uint32_t), 0, size - sizeof(uint32_t));
	memcpy((char *)out + sizeof(uint32_t), (char *)&info + sizeof(uint32_t),
	       MIN((size_t)size, sizeof(info)) - sizeof(uint32_t));
	return 0;
}

int zc_step_future(zc_client *c, uint64_t iteration, zc_future **ret_future)
{
	struct zc_future *f;
	int r;

	if ((r = client_check(c, __func__)) < 0)
		return r;
	if (!ret_future)
		return err_set(-EINVAL, "zc_step_future: ret_future is NULL");
	pthread_mutex_lock(&c->mu);
	if (iteration > c->iter) {
		/* it could only wait for buckets nobody has handed over yet */
		r = err_set(ZC_ESTATE,
			    "iteration %" PRIu64 " has not begun: this rank's next bucket belongs "
			    "to iteration %" PRIu64,
			    iteration, c->iter);
		client_unlock(c);
		return r;
	}
	/* a StepDone that came is read: with a ring, it came there (ZeroMQ is
	 * read by the poll or the wait, where its system calls are due) */
	if (c->fp)
		take_ring(c, c->zrecv);
	else
		dispatch_locked(c, LOOK_ALL);
	f = future_new(c, FUTURE_STEP, iteration, 0);
	if (f && iteration < c->steps_done) {
		/* a step that landed is done, though the job ended after it (the
		 * daemon tells the others at once when a rank leaves) */
		f->state = 1;
		f->msg[0] = 0;
		step_info_of(c, iteration, f);
	}
	client_unlock(c);
	if (!f)
		return err_set(-ENOMEM, NULL);
	*ret_future = f;
	return 0;
}

uint64_t zc_iteration(zc_client *c)
{
	uint64_t it;

	if (client_check(c, __func__) < 0)
		return ZC_NO_ITERATION;
	pthread_mutex_lock(&c->mu);
	it = c->iter;
	client_unlock(c);
	return it;
}

int zc_set_hyper(zc_client *c, uint32_t group, const struct zc_param_group *hp)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__SetHyper sh = ZEROD__V1__SET_HYPER__INIT;
	Zerod__V1__ParamGroup pg;
	struct zc_param_group g;
	char err[192];
	int r;

	if ((r = client_check(c, __func__)) < 0)
		return r;
	if (!hp)
		return err_set(-EINVAL, "zc_set_hyper: hp is NULL");
	r = plan_group_from_zc(hp, "hp", &g, err, sizeof(err));
	if (r < 0)
		return err_set(r, "zc_set_hyper: %s", err);
	pthread_mutex_lock(&c->mu);
	if (c->plan_result != 1) {
		r = err_set(ZC_ESTATE, "zc_set_hyper: the plan is not registered");
		goto out;
	}
	if (group >= c->plan->ngroups) {
		r = err_set(ZC_EHYPER, "zc_set_hyper: group %u does not exist: the plan has %u",
			    group, c->plan->ngroups);
		goto out;
	}
	if (plan_group_check(c->plan->optimizer, &g, err, sizeof(err)) < 0 ||
	    plan_clip_check(c->plan, &g, err, sizeof(err)) < 0) {
		r = err_set(ZC_EHYPER, "zc_set_hyper: group %u: %s", group, err);
		goto out;
	}
	/* the daemon sized the optimizer state from the plan's groups */
	if (plan_state_arrays(c->plan->optimizer, &g, 1) &
	    ~plan_state_arrays(c->plan->optimizer, c->plan->groups, c->plan->ngroups)) {
		r = err_set(ZC_EHYPER,
			    "zc_set_hyper: group %u: %s needs optimizer state this job does not "
			    "keep: declare it in the plan's groups",
			    group, c->plan->optimizer == ZC_OPT_SGD ? "momentum" : "amsgrad");
		goto out;
	}
	plan_group_to_pb(&g, &pg);
	/* the next iteration this rank has not started */
	sh.iteration = c->sent_in_iter ? c->iter + 1 : c->iter;
	sh.group = group;
	sh.values = &pg;
	env.body_case = ZEROD__V1__ENVELOPE__BODY_SET_HYPER;
	env.set_hyper = &sh;
	r = send_env(c, &env, NULL);
	if (r < 0)
		err_set(r, "zc_set_hyper: sending: %s", zc_strerror(r));
out:
	client_unlock(c);
	return r;
}

int zc_params_changed(zc_client *c)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__ParamsChanged pc = ZEROD__V1__PARAMS_CHANGED__INIT;
	int r;

	if ((r = client_check(c, __func__)) < 0)
		return r;
	pthread_mutex_lock(&c->mu);
	if (c->plan_result != 1) {
		r = err_set(ZC_ESTATE, "zc_params_changed: the plan is not registered");
		goto out;
	}
	if (c->sent_in_iter) {
		r = err_set(ZC_ESTATE,
			    "zc_params_changed: iteration %" PRIu64 " is under way (%u buckets "
			    "handed over): call it between iterations",
			    c->iter, c->sent_in_iter);
		goto out;
	}
	if (c->steps_done < c->iter) {
		take_ring(c, c->zrecv);
		if (c->steps_done < c->iter)
			dispatch_locked(c, LOOK_ALL);
		if (c->job_error) {
			r = err_set(c->job_error, "%s", c->job_msg);
			goto out;
		}
		if (c->steps_done < c->iter) {
			r = err_set(ZC_ESTATE,
				    "zc_params_changed: the step of iteration %" PRIu64
				    " has not completed: wait for it first",
				    c->iter - 1);
			goto out;
		}
	}
	pc.iteration = c->iter;
	env.body_case = ZEROD__V1__ENVELOPE__BODY_PARAMS_CHANGED;
	env.params_changed = &pc;
	r = send_env(c, &env, NULL);
	if (r < 0)
		err_set(r, "zc_params_changed: sending: %s", zc_strerror(r));
out:
	client_unlock(c);
	return r;
}

int zc_last_error(zc_client *c)
{
	int r;

	if ((r = client_check(c, __func__)) < 0)
		return r;
	pthread_mutex_lock(&c->mu);
	if (c->job_error) {
		r = err_set(c->job_error, "%s", c->job_msg);
	} else if (c->async_error) {
		r = err_set(c->async_error, "%s", c->async_msg);
		c->async_error = 0; /* told: the next one is newer */
	}
	client_unlock(c);
	return r;
}

/* ----------------------------------------------------------- futures --- */

/* A future's result as a call returns it: a failure's reason for the thread. */
static int future_result(zc_future *f, int st)
{
	return st < 0 ? err_set(st, "%s", f->msg[0] ? f->msg : zc_strerror(st)) : st;
}

int zc_future_poll(zc_future *f)
{
	zc_client *c;
	int st;

	if ((st = future_check(f, __func__)) < 0)
		return st;
	c = f->c;
	if (!c)
		return future_result(f, f->state);
	pthread_mutex_lock(&c->mu);
	take_ring(c, c->zrecv);
	if (f->state == 0)
		dispatch_locked(c, LOOK_ALL);
	/* the reason now: f's callback, run by the unlock, may free f */
	st = future_result(f, f->state);
	client_unlock(c);
	return st;
}

int zc_future_wait(zc_future *f, int timeout_ms)
{
	zc_client *c;
	bool free_it;
	int r;

	if ((r = future_check(f, __func__)) < 0)
		return r;
	c = f->c;
	if (!c)
		return future_result(f, f->state);
	/* f stays while it is waited on, though a callback the wait runs frees it */
	pthread_mutex_lock(&c->mu);
	f->waiters++;
	pthread_mutex_unlock(&c->mu);
	r = wait_for(c, &f->state, f->msg, timeout_ms < 0 ? -1 : now_ms() + timeout_ms);
	pthread_mutex_lock(&c->mu);
	f->waiters--;
	free_it = f->free_after && !f->waiters && f->cb_state != CB_RUNNING;
	pthread_mutex_unlock(&c->mu);
	if (free_it)
		free(f);
	return r;
}

int zc_future_then(zc_future *f, zc_future_cb *fn, void *arg)
{
	zc_client *c;
	int r;

	if ((r = future_check(f, __func__)) < 0)
		return r;
	if (!fn)
		return err_set(-EINVAL, "zc_future_then: fn is NULL");
	c = f->c;
	if (c)
		pthread_mutex_lock(&c->mu);
	if (f->cb_state != CB_NONE) {
		if (c)
			client_unlock(c);
		return err_set(ZC_ESTATE, "zc_future_then: the future has a callback already");
	}
	f->cb = fn;
	f->cb_arg = arg;
	f->cb_state = CB_SET;
	if (c) {
		if (f->state != 0)
			cb_enqueue(c, f);
		client_unlock(c); /* runs it now if it is due */
		return 0;
	}
	/* its client is closed, so it is settled: run it here */
	f->cb_state = CB_RUNNING;
	fn(f, f->state, arg);
	f->cb_state = CB_DONE;
	if (f->free_after)
		free(f);
	return 0;
}

const char *zc_future_message(zc_future *f)
{
	return f ? f->msg : "";
}

void zc_future_free(zc_future *f)
{
	zc_client *c;
	bool running;

	/* a child's copy of a parent's future: nothing of it is the child's */
	if (!f || forked(f->forks))
		return;
	/* the client whose lock guards it: its own, or (once closed) the one
	 * running its callback in zc_close() */
	c = f->c ? f->c : f->q;
	if (c)
		pthread_mutex_lock(&c->mu);
	if (f->cb_state == CB_QUEUED)
		cb_dequeue(f->q, f); /* cancelled */
	future_unlink(f);
	f->c = NULL;
	running = f->cb_state == CB_RUNNING || f->waiters;
	if (running)
		f->free_after = true; /* its callback's runner or its last waiter frees it */
	if (c)
		pthread_mutex_unlock(&c->mu);
	if (!running)
		free(f);
}

/* ------------------------------------------------------ optimizer state --- */

/* The caller's zc_segment_state array: read with its first element's size
 * as the stride (zeroclient.h, "ABI"; this struct came in version 1.0, so
 * no caller's is smaller). */
static int segs_check(const void *segs, uint32_t n, const char *fn, size_t *ret_stride)
{
	uint32_t size;
	int r;

	if (n == 0) {
		*ret_stride = sizeof(struct zc_segment_state);
		return 0;
	}
	if (!segs)
		return err_set(-EINVAL, "%s: segs is NULL", fn);
	size = abi_size(segs);
	for (uint32_t i = 0; i < n; i++) {
		const char *s = (const char *)segs + (size_t)i * size;
		if (size < sizeof(struct zc_segment_state) || abi_size(s) != size)
			return err_set(-EINVAL,
				       "%s: segs[%u].size is %u: not initialised "
				       "(zc_segment_state_init), or not the size of segs[0]",
				       fn, i, abi_size(s));
		if ((r = abi_check(s, size, sizeof(struct zc_segment_state))) < 0)
			return err_set(r,
				       "%s: segs[%u]: a struct of %u bytes this library does not "
				       "know",
				       fn, i, size);
	}
	*ret_stride = size;
	return 0;
}

/* Between iterations: wait for the step future of the last iteration this
 * rank handed over. */
static int state_wait_steps(zc_client *c, const char *fn)
{
	zc_future *f = NULL;
	uint64_t last;
	int r;

	pthread_mutex_lock(&c->mu);
	r = !c->registered || c->plan_result != 1 ? -1 : c->sent_in_iter ? -2 : 0;
	last = c->iter;
	client_unlock(c);
	if (r == -1)
		return err_set(ZC_ESTATE, "%s: the plan is not registered", fn);
	if (r == -2)
		return err_set(ZC_ESTATE,
			       "%s: iteration %" PRIu64 " is half handed over: call it "
			       "between iterations",
			       fn, last);
	if (last == 0)
		return 0;
	r = zc_step_future(c, last - 1, &f);
	if (r >= 0) {
		r = zc_future_wait(f, c->cfg.register_timeout_ms);
		if (r == 0)
			r = err_set(ZC_ETIMEDOUT,
				    "%s: the step of iteration %" PRIu64
				    " did not complete within %d ms",
				    fn, last - 1, c->cfg.register_timeout_ms);
	}
	zc_future_free(f);
	return r < 0 ? r : 0;
}

/* The staging's regions (docs/STATE.md): 5, and the masters' with bf16/fp16
 * buckets; each the plan's state_numel floats (plan.h: the state's layout). */
enum { STG_META = 1, STG_MASTER = 5 };

static uint64_t state_bytes_of(const struct plan *p)
{
	return (uint64_t)(p->low_precision ? 6 : 5) * p->state_numel * sizeof(float);
}

/* A state round's staging: a memfd of the plan's state size, mapped here and
 * passed to zerod over its fd socket (FDSTAGE) just before the request that
 * names it by *ret_serial. No name, so nothing is left behind. */
static int staging_new(zc_client *c, const struct plan *p, struct host_buf *ret,
		       uint64_t *ret_serial, const char *fn)
{
	char path[sizeof(c->fp_path)], err[256];
	uint64_t bytes = state_bytes_of(p), token;
	int fd, r, timeout;

	pthread_mutex_lock(&c->mu);
	fd_socket(c, path, sizeof(path));
	token = c->fp_token;
	timeout = c->cfg.connect_timeout_ms;
	pthread_mutex_unlock(&c->mu);
	if (!path[0])
		return err_set(ZC_ENOTSUP, "%s: zerod offered no fd socket to pass the staging on",
			       fn);
	r = bufs_staging(bytes, &fd);
	if (r < 0)
		return err_set(r, "%s: a staging memfd of %" PRIu64 " bytes: %s", fn, bytes,
			       zc_strerror(r));
	r = map_buf(fd, 0, bytes, ret);
	if (r < 0) {
		close(fd);
		return err_set(r, "%s: mapping the staging: %s", fn, zc_strerror(r));
	}
	r = bufs_send_staging(path, token, fd, bytes, timeout, ret_serial, err, sizeof(err));
	close(fd); /* the mappings, ours and zerod's, keep the memory */
	if (r < 0) {
		buf_release(ret);
		return err_set(r, "%s: %s", fn, err);
	}
	return 0;
}

/* Send a state round's request env: 0, or the error recorded; state_wait()
 * then waits for the round to be served. */
static int state_send(zc_client *c, Zerod__V1__Envelope *env, const char *fn)
{
	uint64_t id = 0;
	int r;

	pthread_mutex_lock(&c->mu);
	if (c->state_pending) {
		client_unlock(c);
		return err_set(ZC_ESTATE, "%s: another state call of this client is waiting", fn);
	}
	if (c->job_error) {
		r = c->job_error;
		err_set(r, "%s", c->job_msg);
		client_unlock(c);
		return r;
	}
	r = send_env(c, env, &id);
	if (r >= 0) {
		c->state_pending = true;
		c->state_request = id;
		c->state_result = 0;
		c->state_msg[0] = 0;
	}
	client_unlock(c);
	if (r < 0)
		return err_set(r, "%s: sending the request: %s", fn, zc_strerror(r));
	return 0;
}

static int state_wait(zc_client *c, const char *fn)
{
	int r = wait_for(c, &c->state_result, c->state_msg, now_ms() + c->cfg.register_timeout_ms);

	pthread_mutex_lock(&c->mu);
	c->state_pending = false;
	client_unlock(c);
	if (r == 0)
		return err_set(ZC_ETIMEDOUT, "%s: not every rank of this node called within %d ms",
			       fn, c->cfg.register_timeout_ms);
	return r < 0 ? r : 0;
}

/* Send the request (GetState when ss is NULL) naming stg (zerod's serial),
 * and wait for the round to be served. */
static int state_round(zc_client *c, Zerod__V1__SetState *ss, const struct host_buf *stg,
		       uint64_t serial, const char *fn)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__GetState gs = ZEROD__V1__GET_STATE__INIT;
	Zerod__V1__StateStaging sg = ZEROD__V1__STATE_STAGING__INIT;
	int r;

	sg.shm_name = (char *)"";
	sg.bytes = stg->bytes;
	sg.has_fd_serial = true;
	sg.fd_serial = serial;
	if (ss) {
		ss->staging = &sg;
		env.body_case = ZEROD__V1__ENVELOPE__BODY_SET_STATE;
		env.set_state = ss;
	} else {
		gs.staging = &sg;
		env.body_case = ZEROD__V1__ENVELOPE__BODY_GET_STATE;
		env.get_state = &gs;
	}
	if ((r = state_send(c, &env, fn)) < 0)
		return r;
	return state_wait(c, fn);
}

static int seg_where(const struct plan *p, const struct zc_segment_state *s, uint64_t *ret_at,
		     uint64_t *ret_numel, const char *fn, uint32_t i)
{
	if (s->bucket >= p->nbuckets)
		return err_set(ZC_EBUCKET, "%s: segs[%u].bucket: %u, the plan has %u buckets", fn,
			       i, s->bucket, p->nbuckets);
	if (s->segment >= p->buckets[s->bucket].nsegments)
		return err_set(ZC_EBUCKET, "%s: segs[%u].segment: %u, bucket %u has %u segments",
			       fn, i, s->segment, s->bucket, p->buckets[s->bucket].nsegments);
	/* the state's layout (plan.h): each element an fp32 slot */
	*ret_at = p->buckets[s->bucket].sbase + p->buckets[s->bucket].segments[s->segment].offset;
	*ret_numel = p->buckets[s->bucket].segments[s->segment].numel;
	return 0;
}

/* The tensors of one segment state, in staging region order (2..5). */
static float *seg_tensor(const struct zc_segment_state *s, enum zc_optimizer opt, unsigned k)
{
	if (k == 2)
		return opt == ZC_OPT_SGD ? s->momentum_buffer : s->exp_avg;
	return k == 3 ? s->exp_avg_sq : k == 4 ? s->max_exp_avg_sq : s->master;
}

static uint32_t tensor_bit(enum zc_optimizer opt, unsigned k)
{
	if (k == 2)
		return opt == ZC_OPT_SGD ? ZC_STATE_MOMENTUM_BUFFER : ZC_STATE_EXP_AVG;
	return k == 3 ? ZC_STATE_EXP_AVG_SQ : k == 4 ? ZC_STATE_MAX_EXP_AVG_SQ : ZC_STATE_MASTER;
}

/* The staging regions a plan's segment state may use: 2..4, and 5 (the
 * master) in a bf16/fp16 bucket. */
static unsigned last_region(const struct plan *p, uint32_t bucket)
{
	return p->buckets[bucket].dtype == ZC_DTYPE_F32 ? 4 : STG_MASTER;
}

static const char *tensor_name(uint32_t bit)
{
	switch (bit) {
	case ZC_STATE_MOMENTUM_BUFFER:
		return "momentum_buffer";
	case ZC_STATE_EXP_AVG:
		return "exp_avg";
	case ZC_STATE_EXP_AVG_SQ:
		return "exp_avg_sq";
	case ZC_STATE_MAX_EXP_AVG_SQ:
		return "max_exp_avg_sq";
	case ZC_STATE_MASTER:
		return "master";
	}
	return "?";
}

/* The keys present in a segment of bucket b whose step word (staging
 * region 1, docs/STATE.md) is w, and its step. */
static uint32_t meta_present(const struct plan *p, uint32_t b, uint32_t w, double *ret_step)
{
	uint32_t present = 0;

	*ret_step = 0;
	if (p->optimizer == ZC_OPT_SGD) {
		if (w & (1u << 31))
			present = ZC_STATE_MOMENTUM_BUFFER;
	} else if (w & PLAN_STATE_MAX_STEP) {
		present = ZC_STATE_STEP | ZC_STATE_EXP_AVG | ZC_STATE_EXP_AVG_SQ;
		if (w & (1u << 30))
			present |= ZC_STATE_MAX_EXP_AVG_SQ;
		*ret_step = (double)(w & PLAN_STATE_MAX_STEP);
	}
	if (p->buckets[b].dtype != ZC_DTYPE_F32)
		present |= ZC_STATE_MASTER; /* it always has one */
	return present;
}

/* Export into the plan p's staging, then read segs out of it. Called for the
 * registered plan, which stays until zc_close() or a re-plan (neither runs
 * beside a state call: zc_close() must not race, a re-plan is this thread's). */
static int get_state(zc_client *c, const struct plan *p, struct zc_segment_state *segs,
		     size_t stride, uint32_t n, const char *fn)
{
	struct host_buf stg = {0};
	uint64_t total = p->state_numel, serial = 0;
	int r;

	for (uint32_t i = 0; i < n; i++) {
		struct zc_segment_state *s = (void *)((char *)segs + (size_t)i * stride);
		uint64_t at, numel;
		if ((r = seg_where(p, s, &at, &numel, fn, i)) < 0)
			return r;
	}
	r = staging_new(c, p, &stg, &serial, fn);
	if (r < 0)
		return r;
	r = state_round(c, NULL, &stg, serial, fn);
	for (uint32_t i = 0; i < n && r >= 0; i++) {
		struct zc_segment_state *s = (void *)((char *)segs + (size_t)i * stride);
		uint64_t at, numel;
		uint32_t w, present;
		double step;

		(void)seg_where(p, s, &at, &numel, fn, i);
		memcpy(&w, stg.base + STG_META * total + at, sizeof(w));
		present = meta_present(p, s->bucket, w, &step);
		for (unsigned k = 2; k <= last_region(p, s->bucket); k++) {
			float *dst = seg_tensor(s, p->optimizer, k);
			if (dst && (present & tensor_bit(p->optimizer, k)))
				memcpy(dst, stg.base + k * total + at, numel * sizeof(float));
		}
		s->present = present;
		s->step = step;
	}
	buf_release(&stg);
	return r;
}

int zc_get_state(zc_client *c, struct zc_segment_state *segs, uint32_t n)
{
	size_t stride;
	int r;

	if ((r = client_check(c, __func__)) < 0)
		return r;
	if ((r = segs_check(segs, n, __func__, &stride)) < 0)
		return r;
	if ((r = state_wait_steps(c, __func__)) < 0)
		return r;
	if (c->old_plan)
		return err_set(ZC_ESTATE, "%s: a new plan is allocated but not registered yet",
			       __func__);
	return get_state(c, c->plan, segs, stride, n, __func__);
}

/* Every value finite, the second moments not negative. */
static int tensor_check(const float *t, uint64_t numel, uint32_t bit, const char *fn, uint32_t i,
			const struct zc_segment_state *s)
{
	for (uint64_t x = 0; x < numel; x++)
		if (!isfinite(t[x]) ||
		    (t[x] < 0 && (bit == ZC_STATE_EXP_AVG_SQ || bit == ZC_STATE_MAX_EXP_AVG_SQ)))
			return err_set(ZC_ESTATEINVAL,
				       "%s: segs[%u]: buckets[%u].segments[%u].%s[%" PRIu64
				       "]: %g (%s)",
				       fn, i, s->bucket, s->segment, tensor_name(bit), x, t[x],
				       isfinite(t[x]) ? "a second moment is never negative"
						      : "not finite");
	return 0;
}

/* A master given to zc_set_state() sets this rank's parameters of its
 * segment to it, rounded to the bucket's dtype (as apex's fp16 optimizer
 * loads its masters into the model): every rank passing the same master
 * then holds the same parameters, and the daemon's step finds them equal to
 * the narrowed master (zc_params_changed()'s check). */
static void narrow_masters(zc_client *c, const struct plan *p, const void *segs, size_t stride,
			   uint32_t n)
{
	if (c->dev)
		return; /* CUDA buffers: the daemon stored them (exec.c's state_import) */
	for (uint32_t i = 0; i < n; i++) {
		const struct zc_segment_state *s = (const void *)((const char *)segs + i * stride);
		const struct plan_bucket *bk = &p->buckets[s->bucket];
		const struct zc_segment *sg = &bk->segments[s->segment];
		uint16_t *dst =
			(uint16_t *)((char *)c->param.base + plan_bucket_offset(p, s->bucket)) +
			sg->offset;

		if (!(s->present & ZC_STATE_MASTER))
			continue;
		for (uint64_t x = 0; x < sg->numel; x++)
			dst[x] = bk->dtype == ZC_DTYPE_BF16 ? lowp_f32_to_bf16(s->master[x])
							    : lowp_f32_to_f16(s->master[x]);
	}
}

/* check_values: the caller's tensors (not the daemon's own, moved by a
 * re-plan: they go back as they came, whatever they hold, and the
 * parameters, copied already, are left as they are). */
static int set_state(zc_client *c, const struct plan *p, const struct zc_segment_state *segs,
		     size_t stride, uint32_t n, bool check_values, const char *fn)
{
	Zerod__V1__SetState ss = ZEROD__V1__SET_STATE__INIT;
	Zerod__V1__SegmentState *items = NULL, **ptrs = NULL;
	struct host_buf stg = {0};
	uint64_t total = p->state_numel, serial = 0;
	uint8_t *seen = NULL;
	uint64_t nsegs = 0, *first = calloc(p->nbuckets, sizeof(*first));
	char err[256];
	int r = 0;

	for (uint32_t b = 0; b < p->nbuckets && first; b++) {
		first[b] = nsegs;
		nsegs += p->buckets[b].nsegments;
	}
	seen = calloc(nsegs ? nsegs : 1, 1);
	items = calloc(n ? n : 1, sizeof(*items));
	ptrs = calloc(n ? n : 1, sizeof(*ptrs));
	if (!first || !seen || !items || !ptrs) {
		r = err_set(-ENOMEM, NULL);
		goto out;
	}
	/* everything is checked before anything is sent */
	for (uint32_t i = 0; i < n; i++) {
		const struct zc_segment_state *s = (const void *)((const char *)segs + i * stride);
		uint64_t at, numel, flat;

		if ((r = seg_where(p, s, &at, &numel, fn, i)) < 0) {
			snprintf(err, sizeof(err), "%s", zc_error_message());
			r = err_set(ZC_ESTATEINVAL, "%s", err);
			goto out;
		}
		if (plan_state_check(p, s->bucket, s->segment, s->present, s->step, err,
				     sizeof(err)) < 0) {
			r = err_set(ZC_ESTATEINVAL, "%s: segs[%u]: %s", fn, i, err);
			goto out;
		}
		flat = first[s->bucket] + s->segment;
		if (seen[flat]++) {
			r = err_set(ZC_ESTATEINVAL,
				    "%s: segs[%u]: buckets[%u].segments[%u] given twice", fn, i,
				    s->bucket, s->segment);
			goto out;
		}
		for (unsigned k = 2; k <= last_region(p, s->bucket); k++) {
			uint32_t bit = tensor_bit(p->optimizer, k);
			const float *t = seg_tensor(s, p->optimizer, k);
			if (!(s->present & bit))
				continue;
			if (!t) {
				r = err_set(
					ZC_ESTATEINVAL,
					"%s: segs[%u]: buckets[%u].segments[%u].%s: present but "
					"NULL",
					fn, i, s->bucket, s->segment, tensor_name(bit));
				goto out;
			}
			if (check_values && (r = tensor_check(t, numel, bit, fn, i, s)) < 0)
				goto out;
		}
		zerod__v1__segment_state__init(&items[i]);
		items[i].bucket = s->bucket;
		items[i].segment = s->segment;
		items[i].present = s->present;
		items[i].step = s->present & ZC_STATE_STEP ? s->step : 0;
		ptrs[i] = &items[i];
	}
	r = staging_new(c, p, &stg, &serial, fn);
	if (r < 0)
		goto out;
	for (uint32_t i = 0; i < n; i++) {
		const struct zc_segment_state *s = (const void *)((const char *)segs + i * stride);
		uint64_t at, numel;

		(void)seg_where(p, s, &at, &numel, fn, i);
		for (unsigned k = 2; k <= last_region(p, s->bucket); k++)
			if (s->present & tensor_bit(p->optimizer, k))
				memcpy(stg.base + k * total + at, seg_tensor(s, p->optimizer, k),
				       numel * sizeof(float));
	}
	ss.segments = ptrs;
	ss.n_segments = n;
	r = state_round(c, &ss, &stg, serial, fn);
	if (r >= 0 && check_values)
		narrow_masters(c, p, segs, stride, n);
out:
	buf_release(&stg);
	free(first);
	free(seen);
	free(items);
	free(ptrs);
	return r;
}

int zc_set_state(zc_client *c, const struct zc_segment_state *segs, uint32_t n)
{
	size_t stride;
	int r;

	if ((r = client_check(c, __func__)) < 0)
		return r;
	if ((r = segs_check(segs, n, __func__, &stride)) < 0)
		return r;
	if ((r = state_wait_steps(c, __func__)) < 0)
		return r;
	if (c->old_plan)
		return err_set(ZC_ESTATE, "%s: a new plan is allocated but not registered yet",
			       __func__);
	return set_state(c, c->plan, segs, stride, n, true, __func__);
}

/* ---------------------------------------------------------- re-planning --- */

static uint32_t plan_nsegs(const struct plan *p)
{
	uint32_t n = 0;

	for (uint32_t b = 0; b < p->nbuckets; b++)
		n += p->buckets[b].nsegments;
	return n;
}

/* Each segment's place in plan order: its bucket and index. */
static int seg_index(const struct plan *p, uint32_t **ret_bucket, uint32_t **ret_seg)
{
	uint32_t n = plan_nsegs(p), k = 0;
	uint32_t *bk = calloc(n ? n : 1, sizeof(*bk)), *sg = calloc(n ? n : 1, sizeof(*sg));

	if (!bk || !sg) {
		free(bk);
		free(sg);
		return -ENOMEM;
	}
	for (uint32_t b = 0; b < p->nbuckets; b++)
		for (uint32_t s = 0; s < p->buckets[b].nsegments; s++, k++)
			bk[k] = b, sg[k] = s;
	*ret_bucket = bk;
	*ret_seg = sg;
	return 0;
}

/* zc_alloc_buffers() after the plan was registered: the new plan's buffers,
 * each segment's parameters copied from where the registered plan had them.
 * The last step must have landed first (the daemon writes the parameters
 * until then). */
static int replan_alloc(zc_client *c, const struct zc_plan *zp, const struct replan_share *sh)
{
	const char *fn = "zc_alloc_buffers";
	struct host_buf grad = {0}, param = {0};
	uint32_t *map = NULL, *nb = NULL, *ns = NULL, *ob = NULL, *os = NULL;
	struct plan *p = NULL;
	uint64_t poff = 0;
	char err[256];
	int fd = -1, pfd = -1, r;

	if ((r = state_wait_steps(c, fn)) < 0)
		return r;
	r = plan_from_zc(zp, &p, err, sizeof(err));
	if (r < 0)
		return err_set(r, "%s: %s", fn, err);
	pthread_mutex_lock(&c->mu);
	if (c->old_plan) {
		r = err_set(ZC_ESTATE, "%s: a new plan is allocated already: register it first",
			    fn);
		goto out;
	}
	map = calloc(plan_nsegs(p) ? plan_nsegs(p) : 1, sizeof(*map));
	if (!map || seg_index(p, &nb, &ns) < 0 || seg_index(c->plan, &ob, &os) < 0) {
		r = err_set(-ENOMEM, NULL);
		goto out;
	}
	r = plan_replan_match(c->plan, p, map, err, sizeof(err));
	if (r < 0) {
		err_set(r, "%s: the new plan %s: %s", fn,
			r == ZC_EREPLAN ? "changes the parameters" : "cannot be checked", err);
		goto out;
	}
	/* shared: the gradients in a memfd of our own (its parameter half is
	 * never touched, so it takes no pages), the parameters in the job's */
	r = bufs_memfd(plan_buffer_bytes(p), &poff, &fd);
	if (r < 0 || (r = map_buf(fd, 0, plan_buffer_bytes(p), &grad)) < 0 ||
	    (r = map_buf(sh ? sh->param_fd : fd, sh ? 0 : poff, plan_buffer_bytes(p), &param)) <
		    0) {
		err_set(r, "%s: a memfd of 2 x %" PRIu64 " bytes: %s", fn, plan_buffer_bytes(p),
			zc_strerror(r));
		goto out;
	}
	if (sh && (pfd = fcntl(sh->param_fd, F_DUPFD_CLOEXEC, 0)) < 0) {
		r = err_set(-errno, "%s: dup of the shared parameter memfd: %s", fn,
			    strerror(errno));
		goto out;
	}
	/* each segment's parameters, by its bucket's layout (a segment keeps its
	 * dtype: plan_replan_match); a shared buffer's by its creator only */
	for (uint32_t k = 0; k < plan_nsegs(p) && (!sh || sh->copy); k++) {
		const struct plan_bucket *nbk = &p->buckets[nb[k]],
					 *obk = &c->plan->buckets[ob[map[k]]];
		const struct zc_segment *n = &nbk->segments[ns[k]], *o = &obk->segments[os[map[k]]];
		unsigned es = plan_dtype_size(nbk->dtype);
		memcpy((char *)param.base + (nbk->base + n->offset) * es,
		       (const char *)c->param.base + (obk->base + o->offset) * es, n->numel * es);
	}
	c->old_plan = c->plan;
	c->old_grad = c->grad;
	c->old_param = c->param;
	c->plan = p;
	c->grad = grad;
	c->param = param;
	c->replan_map = map;
	c->replan_fd = fd; /* passed to zerod by zc_register_plan() */
	c->replan_poff = poff;
	c->replan_pfd = pfd;
	fd = pfd = -1;
	p = NULL;
	map = NULL;
	memset(&grad, 0, sizeof(grad));
	memset(&param, 0, sizeof(param));
out:
	client_unlock(c);
	if (fd >= 0)
		close(fd);
	if (pfd >= 0)
		close(pfd);
	buf_release(&grad);
	buf_release(&param);
	plan_free(p);
	free(map);
	free(nb);
	free(ns);
	free(ob);
	free(os);
	return r < 0 ? r : 0;
}

/* zc_register_buffers(ZC_BUFFERS_CUDA) after the plan was registered: the
 * new plan's CUDA buffers (new handles and event rings), which the caller
 * filled with every segment's parameters (the library does not copy device
 * memory); the registered ones stay until zc_register_plan() took the new. */
static int replan_cuda(zc_client *c, const struct zc_plan *zp, const struct zc_buffers *b)
{
	const char *fn = "zc_register_buffers";
	uint32_t *map = NULL;
	struct devbufs *dev = NULL;
	struct plan *p = NULL;
	char err[384];
	int r;

	if ((r = state_wait_steps(c, fn)) < 0)
		return r;
	r = plan_from_zc(zp, &p, err, sizeof(err));
	if (r < 0)
		return err_set(r, "%s: %s", fn, err);
	pthread_mutex_lock(&c->mu);
	if (c->old_plan || c->bufs_busy) {
		r = err_set(ZC_ESTATE, "%s: a new plan is allocated already: register it first",
			    fn);
		goto out;
	}
	map = calloc(plan_nsegs(p) ? plan_nsegs(p) : 1, sizeof(*map));
	if (!map) {
		r = err_set(-ENOMEM, NULL);
		goto out;
	}
	r = plan_replan_match(c->plan, p, map, err, sizeof(err));
	if (r < 0) {
		err_set(r, "%s: the new plan %s: %s", fn,
			r == ZC_EREPLAN ? "changes the parameters" : "cannot be checked", err);
		goto out;
	}
	r = cuda_bufs_open(c, p, b, &dev, fn);
	if (r < 0)
		goto out;
	c->old_plan = c->plan;
	c->old_dev = c->dev;
	c->plan = p;
	c->dev = dev;
	c->replan_map = map;
	p = NULL;
	map = NULL;
out:
	client_unlock(c);
	plan_free(p);
	free(map);
	return r < 0 ? r : 0;
}

/* A re-plan the job did not take: back to the registered plan and its
 * buffers. Called with c->mu held. */
static void replan_undo(zc_client *c)
{
	buf_release(&c->grad);
	buf_release(&c->param);
	plan_free(c->plan);
	c->plan = c->old_plan;
	c->grad = c->old_grad;
	c->param = c->old_param;
	c->old_plan = NULL;
	if (c->old_dev) {
		devbufs_free(c->dev);
		c->dev = c->old_dev;
		c->old_dev = NULL;
	}
	memset(&c->old_grad, 0, sizeof(c->old_grad));
	memset(&c->old_param, 0, sizeof(c->old_param));
	free(c->replan_map);
	c->replan_map = NULL;
	if (c->replan_fd >= 0)
		close(c->replan_fd);
	c->replan_fd = -1;
	if (c->replan_pfd >= 0)
		close(c->replan_pfd);
	c->replan_pfd = -1;
	c->plan_result = 1;
}

/*
 * zc_register_plan() of a re-plan: export the state under the registered
 * plan, pass the new buffers (their memfd, over <socket>.fd as at the first
 * registration: zerod takes them from a registered session), register the
 * new one (the daemon starts the job again on it), import the state into
 * the new layout, and let the old buffers go. The export costs the state's
 * size in this process for the while.
 */
static int replan_register(zc_client *c)
{
	const char *fn = "zc_register_plan";
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__RegisterPlan rp = ZEROD__V1__REGISTER_PLAN__INIT;
	Zerod__V1__FdBuffers fds = ZEROD__V1__FD_BUFFERS__INIT;
	Zerod__V1__CudaBuffers cuda;
	void *cuda_arrays = NULL;
	Zerod__V1__Plan pb;
	const struct plan *old = c->old_plan, *p = c->plan;
	char path[sizeof(c->fp_path)], err[256];
	uint64_t serial = 0;
	uint32_t nold = plan_nsegs(old), nnew = plan_nsegs(p);
	struct zc_segment_state *os = calloc(nold ? nold : 1, sizeof(*os));
	struct zc_segment_state *ns = calloc(nnew ? nnew : 1, sizeof(*ns));
	uint32_t *ob = NULL, *osg = NULL, *nb = NULL, *nsg = NULL;
	/* in the state's layout (plan.h): moments, then masters */
	float *arena = calloc(4 * old->state_numel + 1, sizeof(float));
	int r;

	if (!os || !ns || !arena || seg_index(old, &ob, &osg) < 0 || seg_index(p, &nb, &nsg) < 0) {
		r = err_set(-ENOMEM, "%s: the state's copy: out of memory", fn);
		goto out;
	}
	for (uint32_t k = 0; k < nold; k++) {
		uint64_t at =
			old->buckets[ob[k]].sbase + old->buckets[ob[k]].segments[osg[k]].offset;
		uint64_t n = old->state_numel;
		os[k] = (struct zc_segment_state)ZC_SEGMENT_STATE_INIT;
		os[k].bucket = ob[k];
		os[k].segment = osg[k];
		os[k].exp_avg = os[k].momentum_buffer = arena + at;
		os[k].exp_avg_sq = arena + n + at;
		os[k].max_exp_avg_sq = arena + 2 * n + at;
		if (old->buckets[ob[k]].dtype != ZC_DTYPE_F32)
			os[k].master = arena + 3 * n + at; /* moves with its segment */
	}
	r = get_state(c, old, os, sizeof(*os), nold, fn);
	if (r < 0)
		goto out;
	pthread_mutex_lock(&c->mu);
	fd_socket(c, path, sizeof(path));
	pthread_mutex_unlock(&c->mu);
	if (c->dev) /* CUDA buffers: their handles go with the plan */
		r = devbufs_to_pb(c->dev, &cuda, &cuda_arrays);
	else if (path[0] && c->replan_pfd >= 0) /* shared: two memfds */
		r = bufs_send(path, c->fp_token, (const int[]){c->replan_fd, c->replan_pfd}, 2,
			      plan_buffer_bytes(p), 0, 0, c->cfg.connect_timeout_ms, &serial, err,
			      sizeof(err));
	else
		r = path[0] ? bufs_send(path, c->fp_token, &c->replan_fd, 1, plan_buffer_bytes(p),
					0, c->replan_poff, c->cfg.connect_timeout_ms, &serial, err,
					sizeof(err))
			    : ZC_ENOTSUP;
	if (r < 0 && c->dev) {
		err_set(r, "%s: the new CUDA buffers: %s", fn, zc_strerror(r));
		pthread_mutex_lock(&c->mu);
		replan_undo(c);
		old = NULL;
		client_unlock(c);
		goto out;
	}
	if (r < 0) {
		err_set(r, "%s: the new buffers: %s", fn,
			path[0] ? err : "zerod offered no fd socket to pass them on");
		pthread_mutex_lock(&c->mu);
		replan_undo(c);
		old = NULL;
		client_unlock(c);
		goto out;
	}
	r = plan_to_pb(p, &pb);
	if (r < 0) {
		r = err_set(r, NULL);
		goto out;
	}
	fds.serial = serial;
	fds.has_shared_params = fds.shared_params = c->replan_pfd >= 0;
	rp.plan = &pb;
	if (c->dev)
		rp.cuda = &cuda;
	else
		rp.fds = &fds;
	env.body_case = ZEROD__V1__ENVELOPE__BODY_REGISTER_PLAN;
	env.register_plan = &rp;
	pthread_mutex_lock(&c->mu);
	c->plan_result = 0;
	r = send_env(c, &env, NULL);
	client_unlock(c);
	plan_pb_free(&pb);
	if (r < 0) {
		r = err_set(r, "%s: sending the new plan: %s", fn, zc_strerror(r));
		goto out;
	}
	r = wait_for(c, &c->plan_result, NULL, now_ms() + c->cfg.register_timeout_ms);
	if (r == 0) {
		r = err_set(ZC_ETIMEDOUT, "%s: not every rank registered the new plan within %d ms",
			    fn, c->cfg.register_timeout_ms);
		goto out;
	}
	if (r < 0) {
		pthread_mutex_lock(&c->mu);
		err_set(r, "%s", c->answer_msg);
		if (!c->job_error) {
			/* refused, the job goes on with the registered plan: so
			 * does this client */
			replan_undo(c);
			old = NULL;
		}
		client_unlock(c);
		goto out;
	}
	/* the job runs on the new plan from here: the old one is gone */
	pthread_mutex_lock(&c->mu);
	buf_release(&c->old_grad);
	buf_release(&c->old_param);
	devbufs_free(c->old_dev); /* zerod closed its handles of them */
	c->old_dev = NULL;
	c->old_plan = NULL;
	if (c->replan_fd >= 0)
		close(c->replan_fd); /* zerod and our mappings keep the memory */
	c->replan_fd = -1;
	c->bufs_shared = c->replan_pfd >= 0;
	if (c->replan_pfd >= 0)
		close(c->replan_pfd);
	c->replan_pfd = -1;
	client_unlock(c);
	for (uint32_t k = 0; k < nnew; k++) {
		ns[k] = os[c->replan_map[k]];
		ns[k].bucket = nb[k];
		ns[k].segment = nsg[k];
	}
	r = set_state(c, p, ns, sizeof(*ns), nnew, false, fn);
	plan_free((struct plan *)old);
	old = NULL;
	free(c->replan_map);
	c->replan_map = NULL;
out:
	if (old && !c->old_plan)
		plan_free((struct plan *)old);
	free(os);
	free(ns);
	free(ob);
	free(osg);
	free(nb);
	free(nsg);
	free(arena);
	free(cuda_arrays);
	return r < 0 ? r : 0;
}

/* --------------------------------------- checkpoints (client/ckpt.c) --- */

int client_ckpt_view(zc_client *c, const char *fn, struct ckpt_view *ret)
{
	int r;

	if ((r = client_check(c, fn)) < 0)
		return r;
	pthread_mutex_lock(&c->mu);
	if (c->plan_result != 1 || !c->plan) {
		r = err_set(ZC_ESTATE, "%s: the plan is not registered", fn);
	} else if (c->old_plan) {
		r = err_set(ZC_ESTATE, "%s: a new plan is allocated but not registered yet", fn);
	} else if (c->sent_in_iter) {
		r = err_set(ZC_ESTATE,
			    "%s: iteration %" PRIu64 " is under way (%u buckets handed over): "
			    "call it between iterations",
			    fn, c->iter, c->sent_in_iter);
	} else {
		*ret = (struct ckpt_view){.plan = c->plan,
					  .job_id = c->job_id,
					  .rank = c->cfg.rank,
					  .world = c->cfg.world_size,
					  .nnodes = c->cfg.nnodes ? c->cfg.nnodes : 1,
					  .one_node = c->cfg.local_size == c->cfg.world_size,
					  .local_rank = c->cfg.local_rank,
					  .iteration = c->iter,
					  .timeout_ms = c->cfg.register_timeout_ms,
					  .writer = &c->ckpt_writer};
	}
	client_unlock(c);
	return r;
}

static int own_ranges(zc_client *c, const struct ckpt_stage *stg, struct ckpt_owned *o,
		      const char *fn);

/* StateOk's ranges lie each within one bucket of p's state layout. */
static bool ranges_ok(const struct plan *p, const uint64_t *rg, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		uint32_t b = 0;
		while (b < p->nbuckets && rg[2 * i] >= p->buckets[b].sbase + p->buckets[b].numel)
			b++;
		if (b == p->nbuckets || rg[2 * i] < p->buckets[b].sbase || rg[2 * i + 1] == 0 ||
		    rg[2 * i + 1] > p->buckets[b].sbase + p->buckets[b].numel - rg[2 * i])
			return false;
	}
	return true;
}

/* The parameter at slot of the registered plan's state layout (fp32
 * buckets: the layout is the buffers'). */
static float *params_at(zc_client *c, uint64_t slot)
{
	const struct plan *p = c->plan;
	uint32_t b = 0;

	while (b + 1 < p->nbuckets && slot >= p->buckets[b + 1].sbase)
		b++;
	return zc_param_buffer(c, b) + (slot - p->buckets[b].sbase);
}

int client_ckpt_export(zc_client *c, const struct ckpt_stage *stg, struct zc_segment_state *ss,
		       uint32_t n, struct ckpt_owned *ret_own, const char *fn)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__CheckpointState cs = ZEROD__V1__CHECKPOINT_STATE__INIT;
	Zerod__V1__StateStaging sg = ZEROD__V1__STATE_STAGING__INIT;
	const struct plan *p = c->plan; /* registered: client_ckpt_view() said so */
	char path[sizeof(c->fp_path)], err[256];
	uint64_t token, serial = 0;
	int r, timeout;

	if ((r = state_wait_steps(c, fn)) < 0)
		return r;
	if (stg) {
		pthread_mutex_lock(&c->mu);
		fd_socket(c, path, sizeof(path));
		token = c->fp_token;
		timeout = c->cfg.connect_timeout_ms;
		pthread_mutex_unlock(&c->mu);
		if (!path[0])
			return err_set(ZC_ENOTSUP,
				       "%s: zerod offered no fd socket to pass the staging on", fn);
		r = bufs_send_staging(path, token, stg->fd, stg->bytes, timeout, &serial, err,
				      sizeof(err));
		if (r < 0)
			return err_set(r, "%s: %s", fn, err);
		sg.shm_name = (char *)"";
		sg.bytes = stg->bytes;
		sg.has_fd_serial = true;
		sg.fd_serial = serial;
		cs.staging = &sg;
	}
	env.body_case = ZEROD__V1__ENVELOPE__BODY_CHECKPOINT_STATE;
	env.checkpoint_state = &cs;
	if ((r = state_send(c, &env, fn)) < 0)
		return r;
	/* the parameters, while zerod copies the state: the step is done, and
	 * nothing writes them until the next iteration's broadcast. Over
	 * several nodes only those of the ranges the last export named (the
	 * same plan: the same ranges), all the first time. */
	bool part = ret_own && c->ckpt_prev && c->ckpt_prev_hash == p->hash;
	if (stg && !c->dev && part)
		for (size_t i = 0; i < c->nckpt_prev; i++)
			memcpy(stg->base + c->ckpt_prev[2 * i],
			       params_at(c, c->ckpt_prev[2 * i]), c->ckpt_prev[2 * i + 1] * 4);
	else if (stg && !c->dev)
		for (uint32_t b = 0; b < p->nbuckets; b++)
			memcpy(stg->base + p->buckets[b].sbase, zc_param_buffer(c, b),
			       p->buckets[b].numel * sizeof(float));
	if ((r = state_wait(c, fn)) < 0 || !stg)
		return r;
	if (ret_own) {
		pthread_mutex_lock(&c->mu);
		if (!ranges_ok(p, c->ckpt_ranges, c->nckpt_ranges)) {
			pthread_mutex_unlock(&c->mu);
			return own_ranges(c, stg, ret_own, fn); /* it says why */
		}
		bool same = part && c->nckpt_prev == c->nckpt_ranges &&
			    memcmp(c->ckpt_prev, c->ckpt_ranges,
				   c->nckpt_ranges * 2 * sizeof(uint64_t)) == 0;
		if (!same && c->ckpt_ranges)
			for (size_t i = 0; i < c->nckpt_ranges && part; i++)
				memcpy(stg->base + c->ckpt_ranges[2 * i],
				       params_at(c, c->ckpt_ranges[2 * i]),
				       c->ckpt_ranges[2 * i + 1] * 4);
		free(c->ckpt_prev);
		c->ckpt_prev = NULL;
		c->nckpt_prev = 0;
		if (c->ckpt_ranges &&
		    (c->ckpt_prev = malloc((c->nckpt_ranges * 2 + 1) * sizeof(uint64_t)))) {
			memcpy(c->ckpt_prev, c->ckpt_ranges,
			       c->nckpt_ranges * 2 * sizeof(uint64_t));
			c->nckpt_prev = c->nckpt_ranges;
			c->ckpt_prev_hash = p->hash;
		}
		pthread_mutex_unlock(&c->mu);
		return own_ranges(c, stg, ret_own, fn);
	}
	for (uint32_t i = 0; i < n; i++) {
		struct zc_segment_state *s = &ss[i];
		uint64_t at, numel;
		uint32_t w;

		if ((r = seg_where(p, s, &at, &numel, fn, i)) < 0)
			return r;
		memcpy(&w, stg->base + STG_META * p->state_numel + at, sizeof(w));
		s->present = meta_present(p, s->bucket, w, &s->step);
		for (unsigned k = 2; k <= last_region(p, s->bucket); k++) {
			float **slot = k == 2   ? (p->optimizer == ZC_OPT_SGD ? &s->momentum_buffer
									      : &s->exp_avg)
				       : k == 3 ? &s->exp_avg_sq
				       : k == 4 ? &s->max_exp_avg_sq
						: &s->master;
			*slot = (s->present & tensor_bit(p->optimizer, k))
					? stg->base + k * p->state_numel + at
					: NULL;
		}
	}
	return 0;
}

void ckpt_owned_free(struct ckpt_owned *o)
{
	free(o->slot);
	free(o->n);
	free(o->bucket);
	free(o->present);
	free(o->step);
	*o = (struct ckpt_owned){0};
}

/* StateOk's ranges of a checkpoint's export over several nodes, with each
 * range's keys and step read from its step word in stg. */
static int own_ranges(zc_client *c, const struct ckpt_stage *stg, struct ckpt_owned *o,
		      const char *fn)
{
	const struct plan *p = c->plan;
	size_t n;
	uint32_t b = 0;

	pthread_mutex_lock(&c->mu);
	n = c->nckpt_ranges;
	*o = (struct ckpt_owned){
		.count = n, .node = c->ckpt_node, .nnodes = c->ckpt_nnodes, .run = c->ckpt_run};
	o->slot = malloc((n + 1) * sizeof(*o->slot));
	o->n = malloc((n + 1) * sizeof(*o->n));
	o->bucket = malloc((n + 1) * sizeof(*o->bucket));
	o->present = malloc((n + 1) * sizeof(*o->present));
	o->step = malloc((n + 1) * sizeof(*o->step));
	if (o->slot && o->n && o->bucket && o->present && o->step)
		for (size_t i = 0; i < n; i++) {
			o->slot[i] = c->ckpt_ranges[2 * i];
			o->n[i] = c->ckpt_ranges[2 * i + 1];
		}
	free(c->ckpt_ranges);
	c->ckpt_ranges = NULL;
	c->nckpt_ranges = 0;
	pthread_mutex_unlock(&c->mu);
	if (!o->slot || !o->n || !o->bucket || !o->present || !o->step) {
		ckpt_owned_free(o);
		return err_set(-ENOMEM, "%s: out of memory", fn);
	}
	if (o->nnodes < 2 || o->node >= o->nnodes || o->nnodes > 4096) {
		ckpt_owned_free(o);
		return err_set(ZC_EPROTO, "%s: zerod named no ranges of this node", fn);
	}
	for (size_t i = 0; i < n; i++) {
		uint32_t w;
		while (b < p->nbuckets && o->slot[i] >= p->buckets[b].sbase + p->buckets[b].numel)
			b++;
		if (b == p->nbuckets || o->slot[i] < p->buckets[b].sbase || o->n[i] == 0 ||
		    o->n[i] > p->buckets[b].sbase + p->buckets[b].numel - o->slot[i]) {
			ckpt_owned_free(o);
			return err_set(ZC_EPROTO, "%s: zerod named a range out of the plan", fn);
		}
		memcpy(&w, stg->base + STG_META * p->state_numel + o->slot[i], sizeof(w));
		o->bucket[i] = b;
		o->present[i] = meta_present(p, b, w, &o->step[i]);
	}
	return 0;
}

int client_ckpt_writer(zc_client *c, const char *fn, struct ckpt_writer ***ret)
{
	int r = client_check(c, fn);

	*ret = r < 0 ? NULL : &c->ckpt_writer;
	return r;
}

int client_resume(zc_client *c, uint64_t iteration, const char *fn)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__Resume rs = ZEROD__V1__RESUME__INIT;
	int r = 0;

	pthread_mutex_lock(&c->mu);
	if (c->sent_in_iter || c->steps_done < c->iter) {
		r = err_set(ZC_ESTATE, "%s: iteration %" PRIu64 " is under way", fn, c->iter);
		goto out;
	}
	if (iteration == c->iter)
		goto out;
	rs.from = c->iter;
	rs.iteration = iteration;
	env.body_case = ZEROD__V1__ENVELOPE__BODY_RESUME;
	env.resume = &rs;
	r = send_env(c, &env, NULL);
	if (r < 0) {
		err_set(r, "%s: sending: %s", fn, zc_strerror(r));
		goto out;
	}
	c->iter = iteration;
	c->steps_done = iteration;
out:
	client_unlock(c);
	return r;
}

/* CheckpointDone from rep (c->mu held). */
static void send_report_locked(zc_client *c, const struct ckpt_report *rep)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__CheckpointDone cd = ZEROD__V1__CHECKPOINT_DONE__INIT;

	if (!c->sock || c->hello_result != 1)
		return;
	cd.iteration = rep->iteration;
	cd.dir = (char *)rep->dir;
	cd.ok = rep->ok;
	cd.path = rep->ok && rep->path[0] ? (char *)rep->path : NULL;
	cd.error = rep->ok ? NULL : (char *)rep->error;
	env.body_case = ZEROD__V1__ENVELOPE__BODY_CHECKPOINT_DONE;
	env.checkpoint_done = &cd;
	(void)send_env(c, &env, NULL);
}

void client_ckpt_report_locked(zc_client *c)
{
	struct ckpt_report *rep;

	if (!ckpt_report_ready(c->ckpt_writer) || !(rep = malloc(sizeof(*rep))))
		return;
	if (ckpt_report_take(c->ckpt_writer, rep))
		send_report_locked(c, rep);
	free(rep);
}

void client_ckpt_report(zc_client *c)
{
	pthread_mutex_lock(&c->mu);
	client_ckpt_report_locked(c);
	pthread_mutex_unlock(&c->mu);
}

void client_ckpt_report_now(zc_client *c, const struct ckpt_report *rep)
{
	pthread_mutex_lock(&c->mu);
	send_report_locked(c, rep);
	pthread_mutex_unlock(&c->mu);
}

int zc_checkpoint_due(zc_client *c, char *dir, size_t len)
{
	int r;

	if ((r = client_check(c, __func__)) < 0)
		return r;
	if (!dir || len == 0)
		return err_set(-EINVAL, "zc_checkpoint_due: no room for the directory");
	pthread_mutex_lock(&c->mu);
	client_ckpt_report_locked(c); /* a checkpoint's write that ended */
	if (!c->sent_in_iter)
		dispatch_locked(c, LOOK_ALL); /* what came before the last step */
	r = 0;
	if (c->ckpt_due_dir && c->ckpt_due_iter < c->iter) {
		free(c->ckpt_due_dir); /* a boundary this rank passed without asking */
		c->ckpt_due_dir = NULL;
	}
	if (c->ckpt_due_dir && !c->sent_in_iter && c->steps_done >= c->iter &&
	    c->ckpt_due_iter == c->iter) {
		if (strlen(c->ckpt_due_dir) >= len) {
			r = err_set(-ERANGE, "zc_checkpoint_due: the directory needs %zu bytes",
				    strlen(c->ckpt_due_dir) + 1);
		} else {
			strcpy(dir, c->ckpt_due_dir);
			free(c->ckpt_due_dir);
			c->ckpt_due_dir = NULL;
			r = 1;
		}
	}
	client_unlock(c);
	return r;
}

void client_keep_share_fd(zc_client *c, int fd)
{
	pthread_mutex_lock(&c->mu);
	if (c->share_fd >= 0)
		close(c->share_fd);
	c->share_fd = fd;
	pthread_mutex_unlock(&c->mu);
}

bool client_registered_host(zc_client *c)
{
	if (!c || forked(c->forks))
		return false; /* the caller's next call says why */
	pthread_mutex_lock(&c->mu);
	bool r = c->plan && c->registered && !c->dev;
	pthread_mutex_unlock(&c->mu);
	return r;
}

int client_replan_shared(zc_client *c, const struct zc_plan *zp, int param_fd, bool copy)
{
	struct replan_share sh = {.param_fd = param_fd, .copy = copy};
	int r;

	if ((r = client_check(c, "zc_alloc_buffers_shared")) < 0)
		return r;
	return replan_alloc(c, zp, &sh);
}
