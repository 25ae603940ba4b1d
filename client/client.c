/*
 * client.c — libzeroclient: one DEALER socket to the node's zerod, the
 * rank's shm buffers, and the futures the daemon completes.
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
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>
#include <zmq.h>

#include "common.h"
#include "fastpath.h"
#include "plan.h"
#include "wire.h"
#include "zeroclient.h"

#define WAIT_SLICE_MS              10
#define DEFAULT_CONNECT_TIMEOUT_MS 30000

enum future_kind { FUTURE_BUCKET, FUTURE_STEP };

struct zc_future {
	zc_client *c; /* NULL once the client is closed */
	enum future_kind kind;
	uint64_t iteration;
	uint32_t bucket;
	uint64_t request; /* the BucketReady that made it */
	int state;        /* 0 pending, 1 done, < 0 failed */
	char msg[256];
	struct zc_future *prev, *next;
};

struct shm_buf {
	char name[128];
	float *base;
	size_t bytes;
};

struct zc_client {
	pthread_mutex_t mu;
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
	struct shm_buf grad, param;
	bool registered;
	int plan_result; /* 0 waiting, 1 ok, < 0 error */
	int hello_result;
	char reply_msg[256];

	uint64_t iter;
	uint32_t sent_in_iter; /* buckets of `iter` handed over so far */
	uint64_t steps_done;   /* iterations whose StepDone arrived */
	int job_error;         /* fatal error: every later future fails with it */
	char job_msg[256];
	int last_error;
	uint64_t last_request;
	struct zc_future *futures;
};

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

static void future_settle(struct zc_future *f, int state, const char *msg)
{
	if (f->state != 0)
		return;
	f->state = state;
	snprintf(f->msg, sizeof(f->msg), "%s", msg ? msg : "");
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
	if (c->hello_result == 0)
		c->hello_result = c->job_error;
	if (c->plan_result == 0)
		c->plan_result = c->job_error;
	snprintf(c->reply_msg, sizeof(c->reply_msg), "%s", c->job_msg);
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
	if (!matched && c->plan_result == 0 && c->registered) {
		/* the answer to RegisterPlan */
		c->plan_result = code;
		snprintf(c->reply_msg, sizeof(c->reply_msg), "%s", e->message);
		return;
	}
	if (!matched && !c->last_error) {
		c->last_error = code;
		snprintf(c->reply_msg, sizeof(c->reply_msg), "%s", e->message);
	}
}

/* BucketDone and StepDone, from either channel. */
static void bucket_done(zc_client *c, uint64_t iteration, uint32_t bucket)
{
	for (struct zc_future *f = c->futures; f; f = f->next)
		if (f->kind == FUTURE_BUCKET && f->bucket == bucket && f->iteration == iteration)
			future_settle(f, 1, NULL);
}

static void step_done(zc_client *c, uint64_t iteration)
{
	if (iteration + 1 > c->steps_done)
		c->steps_done = iteration + 1;
	for (struct zc_future *f = c->futures; f; f = f->next)
		if (f->kind == FUTURE_STEP && f->iteration < c->steps_done)
			future_settle(f, 1, NULL);
}

static void hello_ok(zc_client *c, const Zerod__V1__HelloOk *ok)
{
	if (c->hello_result == 0) /* not after a lost connection */
		c->hello_result = 1;
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
		step_done(c, env->step_done->iteration);
		break;
	case ZEROD__V1__ENVELOPE__BODY_ERROR:
		handle_error(c, env);
		break;
	default:
		if (!c->last_error)
			c->last_error = ZC_EPROTO;
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
			step_done(c, ev.iteration);
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
		} else if (!c->last_error) {
			c->last_error = ZC_EPROTO;
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

	if (!c)
		return -EINVAL;
	pthread_mutex_lock(&c->mu);
	/* the caller woke on c->efd: from what? (one system call, where
	 * reading ZeroMQ and the doorbell for nothing costs five) */
	if (c->fp)
		note_ready(c, ev, epoll_wait(c->efd, ev, ARRAY_SIZE(ev), 0));
	r = dispatch_locked(c, LOOK_SLEEP);
	pthread_mutex_unlock(&c->mu);
	return r;
}

int zc_fd(zc_client *c)
{
	return c ? c->efd : -EINVAL;
}

/* Wait until *flag (read under the lock) is non-zero or the deadline passes.
 * deadline_ms < 0: forever. Returns the flag's value, or 0 on timeout. */
static int wait_for(zc_client *c, const int *flag, int64_t deadline_ms)
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
		pthread_mutex_unlock(&c->mu);
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
	m.has_node_rank = cfg->has_node_rank;
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

int zc_connect(const struct zc_config *cfg, zc_client **ret_client)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__Hello h = ZEROD__V1__HELLO__INIT;
	char pathbuf[512], endpoint[600];
	const char *path;
	int zero = 0, hwm = ZEROD_QUEUE_MSGS, r, timeout;
	int64_t maxmsg = ZEROD_MAX_MSG_BYTES;
	struct multinode mn;
	char mnerr[200];
	zc_client *c;

	if (!cfg || !ret_client || !job_id_valid(cfg->job_id) || cfg->world_size == 0 ||
	    cfg->rank >= cfg->world_size || cfg->local_size == 0 ||
	    cfg->local_rank >= cfg->local_size || cfg->connect_timeout_ms < 0 ||
	    cfg->register_timeout_ms < 0)
		return -EINVAL;
	r = multinode_settings(cfg, &mn, mnerr, sizeof(mnerr));
	if (r < 0) {
		if (cfg->error_text && cfg->error_text_len)
			snprintf(cfg->error_text, cfg->error_text_len, "%s", mnerr);
		return r;
	}
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	pthread_mutex_init(&c->mu, NULL);
	c->efd = -1;
	c->cfg = *cfg;
	snprintf(c->job_id, sizeof(c->job_id), "%s", cfg->job_id);
	c->cfg.job_id = c->job_id;
	c->cfg.socket = NULL;
	timeout = cfg->connect_timeout_ms ? cfg->connect_timeout_ms : DEFAULT_CONNECT_TIMEOUT_MS;
	c->cfg.connect_timeout_ms = timeout;
	if (!c->cfg.register_timeout_ms)
		c->cfg.register_timeout_ms = timeout;

	path = cfg->socket ? cfg->socket : default_socket(pathbuf, sizeof(pathbuf));
	snprintf(endpoint, sizeof(endpoint), "ipc://%s", path);
	/* ZeroMQ retries a refused connect until the timeout; a socket this
	 * user may not use (connecting needs write permission on it) is told
	 * at once. A missing one may still appear: that waits. */
	if (faccessat(AT_FDCWD, path, W_OK, AT_EACCESS) < 0 &&
	    (errno == EACCES || errno == EPERM)) {
		r = -EACCES;
		if (cfg->error_text && cfg->error_text_len)
			snprintf(cfg->error_text, cfg->error_text_len,
				 "no permission to use the socket %.180s (its mode or group, or a "
				 "directory above it)",
				 path);
		goto fail;
	}
	if ((size_t)snprintf(c->fp_mine, sizeof(c->fp_mine), "%s.fd", path) >= sizeof(c->fp_mine))
		c->fp_mine[0] = 0;
	c->zctx = zmq_ctx_new();
	if (!c->zctx) {
		r = -ENOMEM;
		goto fail;
	}
	c->sock = zmq_socket(c->zctx, ZMQ_DEALER);
	if (!c->sock) {
		r = -zmq_errno();
		goto fail;
	}
	zmq_setsockopt(c->sock, ZMQ_LINGER, &zero, sizeof(zero));
	zmq_setsockopt(c->sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg));
	zmq_setsockopt(c->sock, ZMQ_SNDHWM, &hwm, sizeof(hwm));
	zmq_setsockopt(c->sock, ZMQ_RCVHWM, &hwm, sizeof(hwm));
	r = monitor_open(c);
	if (r < 0)
		goto fail;
	if (zmq_connect(c->sock, endpoint) < 0) {
		r = ZC_ECONNECT;
		goto fail;
	}
	r = epoll_add_zsock(c->efd, c->sock);
	if (r < 0)
		goto fail;

	h.protocol_version = ZC_PROTOCOL_VERSION;
	h.job_id = c->job_id;
	h.rank = cfg->rank;
	h.world_size = cfg->world_size;
	h.local_rank = cfg->local_rank;
	h.local_size = cfg->local_size;
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
	if (r < 0)
		goto fail;
	r = wait_for(c, &c->hello_result, now_ms() + timeout);
	if (r == 0) {
		r = ZC_ECONNECT;
		snprintf(c->reply_msg, sizeof(c->reply_msg),
			 "no zerod answered on %.180s within %d ms", path, timeout);
	}
	if (r < 0) {
		if (cfg->error_text && cfg->error_text_len)
			snprintf(cfg->error_text, cfg->error_text_len, "%s", c->reply_msg);
		goto fail;
	}
	*ret_client = c;
	return 0;
fail:
	zc_close(c);
	return r;
}

static void shm_release(struct shm_buf *b)
{
	if (b->base)
		munmap(b->base, b->bytes);
	if (b->name[0])
		shm_unlink(b->name); /* the daemon unlinks it when mapped: ENOENT is fine */
	b->base = NULL;
	b->name[0] = 0;
}

void zc_close(zc_client *c)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__Goodbye bye = ZEROD__V1__GOODBYE__INIT;

	if (!c)
		return;
	if (c->sock && c->hello_result == 1) {
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
	if (c->mon) {
		zmq_socket_monitor(c->sock, NULL, 0);
		zmq_close(c->mon);
	}
	if (c->efd >= 0)
		close(c->efd);
	fpc_free(c->fp);
	if (c->sock) {
		/* let the goodbye leave before the socket goes */
		int linger = 200;
		zmq_setsockopt(c->sock, ZMQ_LINGER, &linger, sizeof(linger));
		zmq_close(c->sock);
	}
	if (c->zctx)
		zmq_ctx_term(c->zctx);
	shm_release(&c->grad);
	shm_release(&c->param);
	plan_free(c->plan);
	pthread_mutex_destroy(&c->mu);
	free(c);
}

/* ----------------------------------------------------------- buffers --- */

static int shm_create(zc_client *c, const char *kind, size_t bytes, struct shm_buf *b)
{
	uint32_t rnd = 0;
	void *base;
	size_t n;
	int fd, r;

	(void)!getrandom(&rnd, sizeof(rnd), 0);
	n = (size_t)shm_name_prefix(b->name, sizeof(b->name), c->job_id, c->cfg.rank,
				    (int)getpid());
	snprintf(b->name + n, sizeof(b->name) - n, "%08x.%s", rnd, kind);
	fd = shm_open(b->name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0) {
		b->name[0] = 0;
		return -errno;
	}
	if (ftruncate(fd, (off_t)bytes) < 0) {
		r = -errno;
		close(fd);
		shm_release(b);
		return r;
	}
	base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	r = -errno;
	close(fd);
	if (base == MAP_FAILED) {
		shm_release(b);
		return r;
	}
	b->base = base;
	b->bytes = bytes;
	return 0;
}

int zc_alloc_buffers(zc_client *c, const struct zc_plan *zp)
{
	struct plan *p;
	char err[256];
	int r;

	if (!c || !zp)
		return -EINVAL;
	pthread_mutex_lock(&c->mu);
	if (c->plan) {
		r = ZC_ESTATE;
		goto out;
	}
	r = plan_from_zc(zp, &p, err, sizeof(err));
	if (r < 0) {
		snprintf(c->reply_msg, sizeof(c->reply_msg), "%s", err);
		goto out;
	}
	r = shm_create(c, "grad", plan_buffer_bytes(p), &c->grad);
	if (r >= 0)
		r = shm_create(c, "param", plan_buffer_bytes(p), &c->param);
	if (r < 0) {
		shm_release(&c->grad);
		plan_free(p);
		goto out;
	}
	c->plan = p;
out:
	pthread_mutex_unlock(&c->mu);
	return r;
}

static float *bucket_ptr(zc_client *c, const struct shm_buf *b, uint32_t bucket)
{
	if (!c || !c->plan || bucket >= c->plan->nbuckets)
		return NULL;
	return b->base + c->plan->buckets[bucket].base;
}

float *zc_grad_buffer(zc_client *c, uint32_t bucket)
{
	return c ? bucket_ptr(c, &c->grad, bucket) : NULL;
}

float *zc_param_buffer(zc_client *c, uint32_t bucket)
{
	return c ? bucket_ptr(c, &c->param, bucket) : NULL;
}

const char *zc_error_message(zc_client *c)
{
	return c ? c->reply_msg : "";
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

	if (!c->fp_path[0] || (env && strcmp(env, "0") == 0))
		return;
	/* Beside the socket we reached, where it is mounted for us (a
	 * container may see zerod's directory elsewhere), else where zerod
	 * says. The token and the peer check keep a wrong socket harmless. */
	memcpy(path, c->fp_mine[0] && access(c->fp_mine, F_OK) == 0 ? c->fp_mine : c->fp_path,
	       sizeof(path));
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

int zc_register_plan(zc_client *c)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__RegisterPlan rp = ZEROD__V1__REGISTER_PLAN__INIT;
	Zerod__V1__ShmBuffers shm = ZEROD__V1__SHM_BUFFERS__INIT;
	Zerod__V1__Plan pb;
	int r;

	if (!c)
		return -EINVAL;
	pthread_mutex_lock(&c->mu);
	if (!c->plan || c->registered) {
		pthread_mutex_unlock(&c->mu);
		return ZC_ESTATE;
	}
	r = plan_to_pb(c->plan, &pb);
	if (r < 0) {
		pthread_mutex_unlock(&c->mu);
		return r;
	}
	c->registered = true;
	c->plan_result = 0;
	fastpath_setup(c);
	shm.grad_name = c->grad.name;
	shm.grad_bytes = c->grad.bytes;
	shm.param_name = c->param.name;
	shm.param_bytes = c->param.bytes;
	rp.plan = &pb;
	rp.shm = &shm;
	env.body_case = ZEROD__V1__ENVELOPE__BODY_REGISTER_PLAN;
	env.register_plan = &rp;
	r = send_env(c, &env, NULL);
	plan_pb_free(&pb);
	pthread_mutex_unlock(&c->mu);
	if (r < 0)
		return r;
	r = wait_for(c, &c->plan_result, now_ms() + c->cfg.register_timeout_ms);
	if (r == 0) {
		snprintf(c->reply_msg, sizeof(c->reply_msg),
			 "not every rank registered within %d ms", c->cfg.register_timeout_ms);
		return ZC_ETIMEDOUT;
	}
	return r < 0 ? r : 0;
}

/* --------------------------------------------------------- iteration --- */

static struct zc_future *future_new(zc_client *c, enum future_kind kind, uint64_t it,
				    uint32_t bucket)
{
	struct zc_future *f = calloc(1, sizeof(*f));

	if (!f)
		return NULL;
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
	int r = 0;

	if (bucket >= c->plan->nbuckets) {
		r = ZC_EBUCKET;
		snprintf(c->reply_msg, sizeof(c->reply_msg),
			 "bucket %u does not exist: the plan has %u buckets", bucket,
			 c->plan->nbuckets);
	} else if (bucket < c->sent_in_iter) {
		r = ZC_EDUPBUCKET;
		snprintf(c->reply_msg, sizeof(c->reply_msg),
			 "bucket %u twice in iteration %" PRIu64, bucket, c->iter);
	} else if (bucket > c->sent_in_iter) {
		r = ZC_EORDER;
		snprintf(c->reply_msg, sizeof(c->reply_msg),
			 "bucket %u handed over, but bucket %u comes first (buckets go 0, 1, 2, "
			 "... every iteration)",
			 bucket, c->sent_in_iter);
	} else if (bucket == 0 && c->steps_done < c->iter) {
		take_ring(c, c->zrecv);
		if (c->steps_done < c->iter)
			dispatch_locked(c, LOOK_ALL);
		if (c->job_error)
			r = c->job_error; /* job_failed() wrote reply_msg */
		else if (c->steps_done < c->iter) {
			r = ZC_EEARLY;
			snprintf(c->reply_msg, sizeof(c->reply_msg),
				 "bucket 0 of iteration %" PRIu64 " while iteration %" PRIu64
				 " is still in flight: wait for its step before the next backward",
				 c->iter, c->iter - 1);
		}
	}
	return r;
}

int zc_bucket_ready(zc_client *c, uint32_t bucket, zc_future **ret_future)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__BucketReady br = ZEROD__V1__BUCKET_READY__INIT;
	struct zc_future *f = NULL;
	int r;

	if (!c)
		return -EINVAL;
	pthread_mutex_lock(&c->mu);
	if (c->plan_result != 1) {
		r = c->job_error ? c->job_error : ZC_ESTATE;
		goto out;
	}
	if (c->job_error) {
		r = c->job_error;
		goto out;
	}
	r = bucket_check(c, bucket);
	if (r < 0)
		goto out;
	if (ret_future) {
		f = future_new(c, FUTURE_BUCKET, c->iter, bucket);
		if (!f) {
			r = -ENOMEM;
			goto out;
		}
	}
	if (c->fp && !c->fp_closed) {
		r = fpc_push_ready(c->fp, c->zsent, c->iter, bucket);
		if (r == -EAGAIN)
			snprintf(c->reply_msg, sizeof(c->reply_msg),
				 "the fast-path ring is full: zerod has not taken the buckets "
				 "handed over");
	} else {
		br.iteration = c->iter;
		br.bucket = bucket;
		env.body_case = ZEROD__V1__ENVELOPE__BODY_BUCKET_READY;
		env.bucket_ready = &br;
		r = send_env(c, &env, f ? &f->request : NULL);
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
	pthread_mutex_unlock(&c->mu);
	return r;
}

int zc_step_future(zc_client *c, uint64_t iteration, zc_future **ret_future)
{
	struct zc_future *f;

	if (!c || !ret_future)
		return -EINVAL;
	pthread_mutex_lock(&c->mu);
	if (iteration > c->iter) {
		/* it could only wait for buckets nobody has handed over yet */
		snprintf(c->reply_msg, sizeof(c->reply_msg),
			 "iteration %" PRIu64 " has not begun: this rank's next bucket belongs to "
			 "iteration %" PRIu64,
			 iteration, c->iter);
		pthread_mutex_unlock(&c->mu);
		return ZC_ESTATE;
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
	}
	pthread_mutex_unlock(&c->mu);
	if (!f)
		return -ENOMEM;
	*ret_future = f;
	return 0;
}

uint64_t zc_iteration(zc_client *c)
{
	uint64_t it;

	pthread_mutex_lock(&c->mu);
	it = c->iter;
	pthread_mutex_unlock(&c->mu);
	return it;
}

int zc_set_hyper(zc_client *c, uint32_t group, const struct zc_param_group *hp)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__SetHyper sh = ZEROD__V1__SET_HYPER__INIT;
	Zerod__V1__ParamGroup pg;
	char err[160];
	int r;

	if (!c || !hp)
		return -EINVAL;
	pthread_mutex_lock(&c->mu);
	if (c->plan_result != 1) {
		r = ZC_ESTATE;
		goto out;
	}
	if (group >= c->plan->ngroups ||
	    plan_group_check(c->plan->optimizer, hp, err, sizeof(err)) < 0) {
		r = ZC_EHYPER;
		goto out;
	}
	/* the daemon sized the optimizer state from the plan's groups */
	if (plan_state_arrays(c->plan->optimizer, hp, 1) &
	    ~plan_state_arrays(c->plan->optimizer, c->plan->groups, c->plan->ngroups)) {
		r = ZC_EHYPER;
		goto out;
	}
	plan_group_to_pb(hp, &pg);
	/* the next iteration this rank has not started */
	sh.iteration = c->sent_in_iter ? c->iter + 1 : c->iter;
	sh.group = group;
	sh.values = &pg;
	env.body_case = ZEROD__V1__ENVELOPE__BODY_SET_HYPER;
	env.set_hyper = &sh;
	r = send_env(c, &env, NULL);
out:
	pthread_mutex_unlock(&c->mu);
	return r;
}

int zc_last_error(zc_client *c)
{
	int r;

	if (!c)
		return -EINVAL;
	pthread_mutex_lock(&c->mu);
	dispatch_locked(c, LOOK_ALL);
	r = c->last_error ? c->last_error : c->job_error;
	pthread_mutex_unlock(&c->mu);
	return r;
}

/* ----------------------------------------------------------- futures --- */

int zc_future_poll(zc_future *f)
{
	int st;

	if (!f)
		return -EINVAL;
	if (!f->c)
		return f->state;
	pthread_mutex_lock(&f->c->mu);
	take_ring(f->c, f->c->zrecv);
	if (f->state == 0)
		dispatch_locked(f->c, LOOK_ALL);
	st = f->state;
	pthread_mutex_unlock(&f->c->mu);
	return st;
}

int zc_future_wait(zc_future *f, int timeout_ms)
{
	int r;

	if (!f)
		return -EINVAL;
	if (!f->c)
		return f->state;
	r = wait_for(f->c, &f->state, timeout_ms < 0 ? -1 : now_ms() + timeout_ms);
	return r;
}

const char *zc_future_message(zc_future *f)
{
	return f ? f->msg : "";
}

void zc_future_free(zc_future *f)
{
	zc_client *c;

	if (!f)
		return;
	c = f->c;
	if (c) {
		pthread_mutex_lock(&c->mu);
		future_unlink(f);
		pthread_mutex_unlock(&c->mu);
	}
	free(f);
}
