/*
 * client.c — libzeroclient: one DEALER socket to the node's zerod, the
 * rank's buffers (memfds passed to zerod, bufs.c), and the futures the
 * daemon completes. This file is the client's core: errors, fork(), the
 * callbacks' queue, sending, and taking in what zerod says (dispatching,
 * waiting). The calls are by concern beside it (client.h): conn.c
 * (connect, close), buffers.c (the plan's buffers, registering the plan),
 * iter.c (the iteration and its futures), state.c (zc_get_state,
 * zc_set_state), replan.c (re-planning), ckview.c (what ckpt.c asks of a
 * client).
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
#include "client.h"

#define WAIT_SLICE_MS 10

/* ------------------------------------------------------- errors, fork --- */

static _Thread_local char err_msg[256];

int client_err_set(int code, const char *fmt, ...)
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

/* zc_connect(): count the forks from now on. 0, or -errno. */
int fork_watch(void)
{
	pthread_once(&atfork_once, atfork_register);
	return atfork_result;
}

unsigned fork_count(void)
{
	return atomic_load_explicit(&forks, memory_order_relaxed);
}

bool client_forked(unsigned made_under)
{
	return atomic_load_explicit(&forks, memory_order_relaxed) != made_under;
}

/* Every entry point that takes a client starts here. */
int client_check(zc_client *c, const char *fn)
{
	if (!c)
		return client_err_set(-EINVAL, "%s: the client is NULL", fn);
	if (client_forked(c->forks))
		return client_err_set(
			ZC_EFORKED,
			"%s: this client belongs to process %d; a child after fork() cannot "
			"use it (connect a client of its own)",
			fn, (int)c->pid);
	return 0;
}

int future_check(zc_future *f, const char *fn)
{
	if (!f)
		return client_err_set(-EINVAL, "%s: the future is NULL", fn);
	if (client_forked(f->forks))
		return client_err_set(
			ZC_EFORKED,
			"%s: this future belongs to the parent process; a child after fork() "
			"cannot use it",
			fn);
	return 0;
}

/* ---------------------------------------------------------- callbacks --- */

void cb_enqueue(zc_client *c, struct zc_future *f)
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

void cb_dequeue(zc_client *c, struct zc_future *f)
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
void client_run_callbacks(zc_client *c)
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
void client_unlock(zc_client *c)
{
	bool due = c->cbq_head != NULL;

	pthread_mutex_unlock(&c->mu);
	if (due)
		client_run_callbacks(c);
}

/* ---------------------------------------------------------- helpers --- */

/* Send a request under a fresh request id (returned in *ret_id if wanted):
 * the daemon echoes it on an Error that refuses this request. */
int client_send_env(zc_client *c, Zerod__V1__Envelope *env, uint64_t *ret_id)
{
	int r;

	env->has_request_id = 1;
	env->request_id = ++c->last_request;
	r = wire_send(c->conn.sock, NULL, 0, env);
	c->conn.zmq_look = true; /* the send may have taken the wake-up of a message */
	if (r >= 0)
		c->conn.zsent++; /* a ring slot pushed from now on goes after a MARK */
	if (r >= 0 && ret_id)
		*ret_id = env->request_id;
	return r == -EHOSTUNREACH ? ZC_ECONNECT : r;
}

void future_link(zc_client *c, struct zc_future *f)
{
	f->c = c;
	f->next = c->futures;
	if (c->futures)
		c->futures->prev = f;
	c->futures = f;
}

void future_unlink(struct zc_future *f)
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
void future_settle(struct zc_future *f, int state, const char *msg)
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
	if (c->round.pending && c->round.result == 0) {
		c->round.result = c->job_error;
		snprintf(c->round.msg, sizeof(c->round.msg), "%s", c->job_msg);
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
	if (!matched && c->round.pending && c->round.result == 0 &&
	    (!env->has_request_id || env->request_id == c->round.request)) {
		/* the answer to GetState or SetState: about this rank's request,
		 * or another rank's that spoilt the round */
		c->round.result = code;
		snprintf(c->round.msg, sizeof(c->round.msg), "%s", e->message);
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
void client_step_info_of(zc_client *c, uint64_t it, struct zc_future *f)
{
	const struct step_rec *r = &c->it.step_recs[it % STEP_RECS];

	f->found_inf = r->iteration == it && r->found_inf;
	f->grad_norm = r->iteration == it ? r->grad_norm : NAN;
}

/* A ring's StepDone carries no info: found_inf false, grad_norm NaN (the
 * daemon sends a StepDone that has some over ZeroMQ). */
static void step_done(zc_client *c, uint64_t iteration, bool found_inf, double grad_norm)
{
	c->it.step_recs[iteration % STEP_RECS] = (struct step_rec){
		.iteration = iteration, .found_inf = found_inf, .grad_norm = grad_norm};
	if (iteration + 1 > c->it.steps_done)
		c->it.steps_done = iteration + 1;
	for (struct zc_future *f = c->futures; f; f = f->next)
		if (f->kind == FUTURE_STEP && f->iteration < c->it.steps_done && f->state == 0) {
			client_step_info_of(c, f->iteration, f);
			future_settle(f, 1, NULL);
		}
}

static void hello_ok(zc_client *c, const Zerod__V1__HelloOk *ok)
{
	if (c->hello_result == 0) /* not after a lost connection */
		c->hello_result = 1;
	c->stall_ms = ok->has_stall_timeout_ms ? (int)MIN(ok->stall_timeout_ms, INT32_MAX / 4) : 0;
	if (ok->fastpath_socket && ok->has_fastpath_token &&
	    strlen(ok->fastpath_socket) < sizeof(c->conn.fp_path)) {
		snprintf(c->conn.fp_path, sizeof(c->conn.fp_path), "%s", ok->fastpath_socket);
		c->conn.fp_token = ok->fastpath_token;
	}
}

static void handle(zc_client *c, const Zerod__V1__Envelope *env)
{
	switch (env->body_case) {
	case ZEROD__V1__ENVELOPE__BODY_HELLO_OK:
		hello_ok(c, env->hello_ok);
		break;
	case ZEROD__V1__ENVELOPE__BODY_PLAN_OK:
		if (c->plan_result != 0)
			break;
		c->plan_result = 1;
		if (env->plan_ok->has_recovered_iteration) {
			/* a recovered job: its count goes on where the state is */
			c->recovered = true;
			c->recovered_iter = env->plan_ok->recovered_iteration;
			c->it.iter = c->it.steps_done = c->recovered_iter;
			c->it.sent_in_iter = 0;
		}
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
		if (c->round.pending && c->round.result == 0) {
			const Zerod__V1__StateOk *ok = env->state_ok;
			free(c->ckpt.ranges);
			c->ckpt.ranges = NULL;
			c->ckpt.nranges = 0;
			c->ckpt.nnodes = 0; /* none told */
			if (ok->has_nnodes && !(ok->n_ranges & 1) &&
			    (c->ckpt.ranges = malloc((ok->n_ranges + 1) * sizeof(uint64_t)))) {
				if (ok->n_ranges)
					memcpy(c->ckpt.ranges, ok->ranges,
					       ok->n_ranges * sizeof(uint64_t));
				c->ckpt.nranges = ok->n_ranges / 2;
				c->ckpt.node = ok->node;
				c->ckpt.nnodes = ok->nnodes;
				c->ckpt.run = ok->has_run ? ok->run : 0;
			}
			c->round.result = 1;
		}
		break;
	case ZEROD__V1__ENVELOPE__BODY_CHECKPOINT_DUE:
		free(c->ckpt.due_dir);
		c->ckpt.due_dir = strdup(env->checkpoint_due->dir);
		c->ckpt.due_iter = env->checkpoint_due->iteration;
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
		if (zmq_msg_recv(&ev, c->conn.mon, ZMQ_DONTWAIT) < 0) {
			zmq_msg_close(&ev);
			return lost;
		}
		if (zmq_msg_size(&ev) >= sizeof(event))
			memcpy(&event, zmq_msg_data(&ev), sizeof(event));
		zmq_msg_init(&addr);
		if (zmq_msg_more(&ev))
			zmq_msg_recv(&addr, c->conn.mon, ZMQ_DONTWAIT);
		zmq_msg_close(&addr);
		zmq_msg_close(&ev);
		if (event == ZMQ_EVENT_DISCONNECTED)
			lost = true;
	}
}

/* Act on the ring's completions that may be taken once zrecv ZeroMQ
 * messages were handled. A ring that makes no sense fails the job, and the
 * client goes on with ZeroMQ alone. */
int client_take_ring(zc_client *c, uint64_t zrecv)
{
	struct fpc_event ev;
	char err[160];
	int n = 0, r;

	while (c->conn.fp && (r = fpc_next(c->conn.fp, zrecv, &ev, err, sizeof(err))) != 0) {
		if (r < 0) {
			epoll_ctl(c->conn.efd, EPOLL_CTL_DEL, fpc_fd(c->conn.fp), NULL);
			fpc_free(c->conn.fp);
			c->conn.fp = NULL;
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

/* What epoll said was ready: the doorbell sets c->conn.bell, a ZeroMQ fd (its
 * socket or monitor) c->conn.zmq_look. */
static void note_ready(zc_client *c, const struct epoll_event *ev, int n)
{
	for (int i = 0; i < n; i++) {
		if (c->conn.fp && ev[i].data.fd == fpc_fd(c->conn.fp))
			c->conn.bell = true;
		else
			c->conn.zmq_look = true;
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
 * ringing (c->conn.bell); one left unread makes the next epoll_wait return at
 * once, and then it is read. */
int client_dispatch_locked(zc_client *c, enum look look)
{
	bool zmq = !c->conn.fp || look == LOOK_ALL || c->conn.zmq_look;
	bool lost = zmq && c->conn.mon && drain_monitor(c);
	int n = 0, e = EAGAIN;

	if (c->conn.fp && !fpc_begin(c->conn.fp, c->conn.bell) && !c->conn.fp_closed) {
		/* zerod closed the channel: its end of file would keep c->conn.efd
		 * readable; what comes now comes by ZeroMQ */
		epoll_ctl(c->conn.efd, EPOLL_CTL_DEL, fpc_fd(c->conn.fp), NULL);
		c->conn.fp_closed = true;
	}
	c->conn.bell = false;
	for (;;) {
		Zerod__V1__Envelope *env;
		zmq_msg_t msg;

		n += client_take_ring(c, c->conn.zrecv);
		if (!zmq)
			break;
		zmq_msg_init(&msg);
		if (zmq_msg_recv(&msg, c->conn.sock, ZMQ_DONTWAIT) < 0) {
			e = zmq_errno();
			zmq_msg_close(&msg);
			c->conn.zmq_look = e != EAGAIN;
			break;
		}
		/* what the daemon put in the ring before it sent this, first */
		n += client_take_ring(c, c->conn.zrecv++);
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
	while (c->conn.fp && fpc_sleep(c->conn.fp, c->conn.zrecv))
		n += client_take_ring(c, c->conn.zrecv);
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
	/* the caller woke on c->conn.efd: from what? (one system call, where
	 * reading ZeroMQ and the doorbell for nothing costs five) */
	if (c->conn.fp)
		note_ready(c, ev, epoll_wait(c->conn.efd, ev, ARRAY_SIZE(ev), 0));
	r = client_dispatch_locked(c, LOOK_SLEEP);
	client_unlock(c);
	return r < 0 ? client_err_set(r, "zc_dispatch: receiving from zerod: %s", zc_strerror(r))
		     : r;
}

int zc_fd(zc_client *c)
{
	int r = client_check(c, __func__);

	return r < 0 ? r : c->conn.efd;
}

/* Wait until *flag (read under the lock) is non-zero or the deadline passes.
 * deadline_ms < 0: forever. Returns the flag's value, or 0 on timeout. A
 * negative value's reason, msg (read under the lock: the callbacks run after
 * it may free the future that holds it), goes to this thread's
 * zc_error_message() when msg is not NULL. */
int client_wait_for(zc_client *c, const int *flag, const char *msg, int64_t deadline_ms)
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
		client_take_ring(c, c->conn.zrecv);
		if (*flag == 0)
			client_dispatch_locked(c, LOOK_SLEEP);
		v = *flag;
		if (v < 0 && msg)
			client_err_set(v, "%s", msg[0] ? msg : zc_strerror(v));
		client_unlock(c);
		if (v != 0)
			return v;
		now = now_ms();
		if (deadline_ms >= 0) {
			if (now >= deadline_ms)
				return 0;
			slice = (int)MIN((int64_t)slice, deadline_ms - now);
		}
		n = epoll_wait(c->conn.efd, ev, ARRAY_SIZE(ev), slice);
	}
}
