/*
 * fastpath.h — the per-client fast path for the hot notifications: a shared
 * ring pair (common/ring.h) and doorbells, beside the ZeroMQ session that
 * keeps the control plane and stays the fallback. All on the loop thread.
 */
#ifndef ZEROD_FASTPATH_H
#define ZEROD_FASTPATH_H

#include <stdint.h>

#include "zerod.pb-c.h"

struct edge;
struct session;

/* daemon.c: open <socket>.fd, where clients pass their buffers (fdbufs.c)
 * and attach their rings (refused if ZEROD_FASTPATH=0). Required: trainers
 * cannot register buffers without it; 0, or a code with the reason in why. */
int fastpath_listen(struct edge *e, char *why, size_t whylen);
/* Close it and remove the file; after every session is freed. */
void fastpath_unlisten(struct edge *e);
/* The timer: connections that never attach are closed. */
void fastpath_tick(struct edge *e, int64_t now_ms);
/* When fastpath_tick() has work next (LOOP_NEVER: none). */
int64_t fastpath_next_deadline(struct edge *e);

/* session.c: offer the fast path in s's HelloOk (fills ok's fast-path
 * fields, which point into the daemon's memory). */
void fastpath_offer(struct session *s, Zerod__V1__HelloOk *ok);
/* A ZeroMQ message is about to go to s / has come from s and is about to be
 * handled: kept in step with the ring (marks, see fastpath.c). */
void fastpath_sent(struct session *s);
void fastpath_received(struct session *s);
/* s's trainer exited: take what its ring still holds, as its last ZeroMQ
 * messages are read before it is dropped. */
void fastpath_take_last(struct session *s);
/* Release s's fast path. Accepts a session without one. */
/* s ends with (code, why): a buffer offer or ring attach that comes with
 * its token later is answered with them. */
void fastpath_retire(struct session *s, int code, const char *why);
void fastpath_free(struct session *s);

/* sched.c: a completion to s, through its ring when it has one, else as a
 * ZeroMQ message. */
void fastpath_bucket_done(struct session *s, uint64_t iteration, uint32_t bucket);
void fastpath_step_done(struct session *s, uint64_t iteration);
/* daemon.c, after a batch of completions: ring the doorbells of the clients
 * that may sleep. Until then what the batch pushed waits unseen. */
void fastpath_flush(struct edge *e);

#endif
