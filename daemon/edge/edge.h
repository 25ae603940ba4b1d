/*
 * edge.h — the edge's entry points: the ROUTER's connections (conn.c) and the
 * trainers' sessions (session.c); its types are edge-t.h's. Every call is on
 * the loop thread.
 */
#ifndef ZEROD_EDGE_H
#define ZEROD_EDGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/sink.h"
#include "edge/edge-t.h"
#include "zerod.pb-c.h"

struct loop;

/* conn.c: the ROUTER's connections (its monitor): limits, idle and closed ones */
int conn_open_monitor(struct edge *e);
void conn_close_all(struct edge *e);
/* Read every monitor event queued (accepted and closed connections). */
void conn_update(struct edge *e);
/* The open connection on fd, or NULL (conn_update() first). */
struct conn *conn_of_fd(struct edge *e, int fd);
struct conn *conn_of_msg(struct edge *e, int fd, const void *route, size_t rlen);
/* A session began / ended on c: while it has none, c may idle only
 * hello_timeout_ms. */
void conn_bind(struct conn *c, struct session *s);
void conn_unbind(struct conn *c);
/* Is the message that came on fd (c: conn_of_msg()'s) to be dropped
 * unread? It is once its connection was shut, and a connection that never
 * had a session is shut once it sent more than a Hello needs. */
bool conn_drop_msg(struct edge *e, int fd, struct conn *c);
/* May c be sent one more error reply? A budget per connection (small
 * before Hello): a peer that sends bad messages and never reads cannot park
 * unbounded replies in the daemon. Counts what it refuses. */
bool conn_may_reply(struct edge *e, struct conn *c);
/* Close connections idle past hello_timeout_ms; the next such deadline. */
void conn_check_idle(struct edge *e, int64_t now);
int64_t conn_next_deadline(struct edge *e);

/* session.c: client sessions: receive, decode, dispatch table, replies */
#define SESSION_NO_ITERATION SINK_NO_ITERATION

/* How the core answers ranks: through their sessions. */
extern const struct sink_ops session_sink;

/* Handle up to a batch of messages (userdata: the edge); returns how many. */
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
/* Drop sessions whose process is gone or whose leave_at passed. */
void session_check_leaving(struct edge *e, int64_t now);
/* Its trainer's process has exited (its pidfd says so, or /proc), whether or
 * not the loop has seen it yet. */
bool session_gone(struct session *s);
/* The next deadline session_check_leaving() has (LOOP_NEVER: none). */
int64_t session_next_deadline(struct edge *e);
void session_reap(struct edge *e);
void session_free_all(struct edge *e);

/* The session a member of the core is. */
static inline struct session *session_of(struct member *m)
{
	return (struct session *)((char *)m - offsetof(struct session, m));
}

#endif
