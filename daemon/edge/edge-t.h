/*
 * edge-t.h — the edge's types (the trainers' side of zerod: sessions over
 * the ROUTER, their connections, the fd socket and fast-path rings), apart
 * from its functions so that daemon.h's struct daemon can hold a struct edge
 * and the edge's files can point at each other without include cycles.
 * All of it is the loop thread's.
 */
#ifndef ZEROD_EDGE_T_H
#define ZEROD_EDGE_T_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "core/core-t.h"

#define ZEROD_ROUTE_MAX 256

struct conn;
struct daemon_config;
struct fastpath;
struct fastpath_listener;
struct fdbufs;

struct session {
	struct session *next;
	uint8_t route[ZEROD_ROUTE_MAX];
	size_t route_len;
	struct edge *e;
	struct member m; /* what the core knows of it: its job, rank, pid, uid */
	uint64_t serial; /* never reused, unlike the address */
	pid_t own_pid;   /* m.pid as the process knows itself (its pid namespace) */
	int pidfd;
	int send_failed;     /* a send to it failed: dropped by session_reap() */
	struct fastpath *fp; /* its shared ring, if offered (fastpath.c) */
	struct fdbufs *bufs; /* memfds it passed for its plan (fdbufs.c) */
	bool detached;       /* its job ended: dropped by session_reap(), connection kept */
	/* Its process exited or its connection closed: dropped at leave_at, so
	 * that a Goodbye still queued behind other peers' messages is read first,
	 * without draining anything on its behalf. */
	int64_t leave_at; /* 0: not leaving */
	enum leave_reason leave_why;
	bool exited;       /* its pidfd fired (or the pid poll saw it gone) */
	struct conn *conn; /* the connection its Hello came on; NULL once closed */
	/* errors sent to it are logged at most SESSION_LOG_BURST a second */
	int64_t log_window;
	unsigned log_count, log_dropped;
};

#define SESSION_LOG_BURST 20

/* The edge: daemon.c fills the pointers and sockets, the edge owns the rest. */
struct edge {
	const struct daemon_config *cfg;
	struct core *core; /* what the edge calls into */
	void *zctx, *router;
	struct fastpath_listener *fpl; /* NULL: no fast path */
	bool stopping;                 /* shutdown began: no new sessions */
	/* connections (conn.c), indexed by fd */
	void *monitor;
	struct conn **conns;
	size_t conns_cap;
	unsigned nconns, conn_limit;
	struct conn *idle_head, *idle_tail; /* without a session, oldest first */
	int64_t shed_log_ms;
	struct session *sessions;
	unsigned nsessions;
	uint64_t session_serial;
	uint64_t cur_request;        /* request id of the message being handled */
	struct session *cur_session; /* its sender, if it has a session */
	struct conn *cur_conn;       /* the connection it came on, if known */
	struct ucred cur_peer;       /* its sender, from the socket (pid 0: unknown) */
};

#endif
