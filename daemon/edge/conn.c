/*
 * conn.c — the ROUTER's connections, as its socket monitor reports them
 * (ZMQ_EVENT_ACCEPTED and ZMQ_EVENT_DISCONNECTED, both carrying the fd).
 * Owns the table of connections by fd, the list of those without a session
 * (oldest first), and each one's budget of error replies.
 *
 * Why a monitor: libzmq accepts on its own I/O thread and aborts the process
 * when accept() fails with EMFILE, and it tells no one when a peer closes
 * between two messages. The monitor tells the loop both:
 *   - past conn_limit, the oldest connection without a session (else the new
 *     one) is shut down, so the fds never run out and a real trainer still
 *     gets in while bare connections pile up;
 *   - a connection without a session is shut down after hello_timeout_ms;
 *   - one that never had a session is shut down once it sent more messages
 *     than a Hello needs (MSGS_WITHOUT_SESSION_MAX), and what it still has
 *     queued is dropped unread: with the ROUTER's small receive queue
 *     (ZEROD_RECV_QUEUE_MSGS) that bounds what a peer that floods before
 *     Hello makes zerod hold, and how long it holds it;
 *   - a session whose connection closed ends (session_conn_closed).
 * Always shutdown(), never close(): the fd stays libzmq's, and libzmq reports
 * DISCONNECTED before it closes it, so no fd number is reused before the loop
 * has read that the old connection is gone.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <zmq.h>

#include "common.h"
#include "base/config.h"
#include "core/hooks.h"
#include "core/job.h"
#include "core/rdzv.h"
#include "core/sched.h"
#include "edge/edge.h"
#include "base/log.h"
#include "base/loop.h"

#define MONITOR_ENDPOINT "inproc://zerod-router-monitor"

/* Error replies: before Hello a peer has little to be told; a session gets
 * enough for a burst of honest mistakes (each one answered). */
#define REPLY_BURST_BEFORE_HELLO 16
#define REPLY_RATE_BEFORE_HELLO  4 /* a second */
#define REPLY_BURST_SESSION      256
#define REPLY_RATE_SESSION       64
/* Messages a connection that never had a session may send: an honest
 * trainer sends one Hello (a few, if it is refused). More than the ROUTER's
 * receive queue holds, several times: messages an older connection left
 * queued when its fd number was reused are charged to the new one, and the
 * ROUTER's fair queueing reads a new peer's Hello within the first of them. */
#define MSGS_WITHOUT_SESSION_MAX (4 * ZEROD_RECV_QUEUE_MSGS)

struct conn {
	int fd;
	int64_t since; /* idle since (accepted, or its session ended) */
	struct session *s;
	struct conn *prev, *next; /* in the idle list while s == NULL && !shut */
	bool shut;                /* shut down: waits for DISCONNECTED */
	bool had_session;         /* once bound: its messages are no longer counted */
	uint32_t unbound_msgs;    /* messages while it never had a session */
	double tokens;            /* error replies it may still get */
	int64_t refill_ms;
};

static void idle_add(struct edge *e, struct conn *c)
{
	c->since = now_ms();
	c->next = NULL;
	c->prev = e->idle_tail;
	if (e->idle_tail)
		e->idle_tail->next = c;
	else
		e->idle_head = c;
	e->idle_tail = c;
}

static void idle_del(struct edge *e, struct conn *c)
{
	if (c->prev)
		c->prev->next = c->next;
	else if (e->idle_head == c)
		e->idle_head = c->next;
	else
		return; /* not in the list */
	if (c->next)
		c->next->prev = c->prev;
	else
		e->idle_tail = c->prev;
	c->prev = c->next = NULL;
}

static void conn_shut(struct edge *e, struct conn *c)
{
	if (c->shut)
		return;
	if (!c->s)
		idle_del(e, c);
	c->shut = true;
	e->nconns--; /* no longer counts against the limit: libzmq closes it */
	e->core->stats.conns_shed++;
	shutdown(c->fd, SHUT_RDWR);
}

static void conn_forget(struct edge *e, struct conn *c)
{
	if (c->s)
		session_conn_closed(c->s);
	else if (!c->shut)
		idle_del(e, c);
	if (!c->shut)
		e->nconns--;
	e->conns[c->fd] = NULL;
	free(c);
}

static void on_accepted(struct edge *e, int fd)
{
	struct conn *c;

	if (fd < 0)
		return;
	if ((size_t)fd >= e->conns_cap) {
		size_t cap = e->conns_cap ? e->conns_cap : 64;
		struct conn **t;
		while (cap <= (size_t)fd)
			cap *= 2;
		t = realloc(e->conns, cap * sizeof(*t));
		if (!t) {
			shutdown(fd, SHUT_RDWR); /* cannot track it: it may not stay */
			return;
		}
		memset(t + e->conns_cap, 0, (cap - e->conns_cap) * sizeof(*t));
		e->conns = t;
		e->conns_cap = cap;
	}
	if (e->conns[fd]) /* its DISCONNECTED never came: the fd was closed */
		conn_forget(e, e->conns[fd]);
	c = calloc(1, sizeof(*c));
	if (!c) {
		shutdown(fd, SHUT_RDWR);
		return;
	}
	c->fd = fd;
	c->tokens = REPLY_BURST_BEFORE_HELLO;
	c->refill_ms = now_ms();
	e->conns[fd] = c;
	e->nconns++;
	idle_add(e, c);
	if (e->nconns <= e->conn_limit)
		return;
	/* Over the limit: a connection that has not said Hello goes, the
	 * oldest first (it is the new one if no other is idle). */
	conn_shut(e, e->idle_head);
	if (now_ms() - e->shed_log_ms >= 1000) {
		e->shed_log_ms = now_ms();
		log_warning("%u connections (the limit the fds allow): closing the oldest that "
			    "has not said Hello (%llu closed so far)",
			    e->conn_limit, (unsigned long long)e->core->stats.conns_shed);
	}
}

void conn_update(struct edge *e)
{
	for (;;) {
		zmq_msg_t ev, addr;
		uint16_t event = 0;
		uint32_t value = 0;

		zmq_msg_init(&ev);
		if (zmq_msg_recv(&ev, e->monitor, ZMQ_DONTWAIT) < 0) {
			zmq_msg_close(&ev);
			return;
		}
		if (zmq_msg_size(&ev) >= sizeof(event) + sizeof(value)) {
			memcpy(&event, zmq_msg_data(&ev), sizeof(event));
			memcpy(&value, (char *)zmq_msg_data(&ev) + sizeof(event), sizeof(value));
		}
		zmq_msg_init(&addr);
		if (zmq_msg_more(&ev))
			zmq_msg_recv(&addr, e->monitor, ZMQ_DONTWAIT);
		zmq_msg_close(&addr);
		zmq_msg_close(&ev);
		if (event == ZMQ_EVENT_ACCEPTED)
			on_accepted(e, (int)value);
		else if (event == ZMQ_EVENT_DISCONNECTED && (size_t)value < e->conns_cap &&
			 e->conns[value])
			conn_forget(e, e->conns[value]);
	}
}

static void on_monitor(struct loop *l, void *userdata)
{
	(void)l;
	conn_update(userdata);
}

int conn_open_monitor(struct edge *e)
{
	int zero = 0;

	if (zmq_socket_monitor(e->router, MONITOR_ENDPOINT,
			       ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED) < 0)
		return -zmq_errno();
	e->monitor = zmq_socket(e->zctx, ZMQ_PAIR);
	if (!e->monitor)
		return -zmq_errno();
	zmq_setsockopt(e->monitor, ZMQ_LINGER, &zero, sizeof(zero));
	if (zmq_connect(e->monitor, MONITOR_ENDPOINT) < 0)
		return -zmq_errno();
	/* also read before every batch of the ROUTER (session_on_router) */
	return loop_add_zsock(e->core->loop, e->monitor, on_monitor, e);
}

void conn_close_all(struct edge *e)
{
	for (size_t fd = 0; fd < e->conns_cap; fd++)
		free(e->conns[fd]);
	free(e->conns);
	e->conns = NULL;
	e->conns_cap = 0;
	e->idle_head = e->idle_tail = NULL;
	if (e->monitor) {
		zmq_socket_monitor(e->router, NULL, 0);
		zmq_close(e->monitor);
		e->monitor = NULL;
	}
}

struct conn *conn_of_fd(struct edge *e, int fd)
{
	if (fd < 0 || !e->monitor)
		return NULL;
	conn_update(e);
	if ((size_t)fd >= e->conns_cap || !e->conns[fd] || e->conns[fd]->shut)
		return NULL;
	return e->conns[fd];
}

/* Messages a peer sent before it closed stay queued in the ROUTER after the
 * fd is gone, and the fd number may serve a new connection by the time they
 * are read: a message whose route is not that of the session bound to its fd
 * came on an older connection, and is charged to none. */
struct conn *conn_of_msg(struct edge *e, int fd, const void *route, size_t rlen)
{
	struct conn *c = conn_of_fd(e, fd);

	if (c && c->s && (c->s->route_len != rlen || memcmp(c->s->route, route, rlen) != 0))
		return NULL;
	return c;
}

void conn_bind(struct conn *c, struct session *s)
{
	struct edge *e = s->e;

	if (c->s || c->shut)
		return;
	idle_del(e, c);
	c->s = s;
	c->had_session = true;
	c->tokens = REPLY_BURST_SESSION;
	s->conn = c;
}

void conn_unbind(struct conn *c)
{
	struct edge *e = c->s->e;

	c->s->conn = NULL;
	c->s = NULL;
	c->tokens = MIN(c->tokens, REPLY_BURST_BEFORE_HELLO);
	if (!c->shut)
		idle_add(e, c);
}

bool conn_drop_msg(struct edge *e, int fd, struct conn *c)
{
	if (!c) /* unknown, or shut: what a shut connection left is dropped */
		return fd >= 0 && (size_t)fd < e->conns_cap && e->conns[fd] && e->conns[fd]->shut;
	if (c->s || c->had_session || ++c->unbound_msgs <= MSGS_WITHOUT_SESSION_MAX)
		return false;
	log_notice("closing a connection that sent %u messages without a Hello (an honest "
		   "client sends one)",
		   MSGS_WITHOUT_SESSION_MAX);
	conn_shut(e, c);
	return true;
}

bool conn_may_reply(struct edge *e, struct conn *c)
{
	int64_t now = now_ms();
	double burst = c && c->s ? REPLY_BURST_SESSION : REPLY_BURST_BEFORE_HELLO;
	double rate = c && c->s ? REPLY_RATE_SESSION : REPLY_RATE_BEFORE_HELLO;

	if (!c)
		return true;
	c->tokens = MIN(burst, c->tokens + (double)(now - c->refill_ms) * rate / 1000.0);
	c->refill_ms = now;
	if (c->tokens >= 1) {
		c->tokens -= 1;
		return true;
	}
	e->core->stats.replies_dropped++;
	return false;
}

void conn_check_idle(struct edge *e, int64_t now)
{
	if (!e->monitor)
		return;
	conn_update(e);
	while (e->idle_head && now - e->idle_head->since >= e->cfg->hello_timeout_ms) {
		log_debug("closing a connection that has no session after %d ms",
			  e->cfg->hello_timeout_ms);
		conn_shut(e, e->idle_head);
	}
}

int64_t conn_next_deadline(struct edge *e)
{
	return e->idle_head ? e->idle_head->since + e->cfg->hello_timeout_ms : LOOP_NEVER;
}
