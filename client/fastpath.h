/*
 * fastpath.h — libzeroclient's side of the fast path (internal): the shared
 * ring pair of common/ring.h and its doorbell. The caller (client.c) holds
 * the client's mutex around every call.
 */
#ifndef ZEROCLIENT_FASTPATH_H
#define ZEROCLIENT_FASTPATH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct fpc;

/* What the daemon put in the down ring for the client to act on. */
struct fpc_event {
	bool step; /* StepDone(iteration), else BucketDone(iteration, bucket) */
	uint64_t iteration;
	uint32_t bucket;
};

/*
 * Attach a ring sized for nbuckets: create and seal the memfd, connect to
 * the daemon's fd socket `path`, send ATTACH with `token` and zsent (the
 * ZeroMQ messages sent so far), wait up to timeout_ms for the answer.
 * 0, or a negative code with the reason in err (the caller falls back to
 * ZeroMQ).
 */
int fpc_attach(const char *path, uint64_t token, uint64_t zsent, uint32_t nbuckets,
	       int timeout_ms, struct fpc **ret, char *err, size_t errlen);
/* Accepts NULL. */
void fpc_free(struct fpc *f);
/* The doorbell: readable when the daemon rang. */
int fpc_fd(const struct fpc *f);

/* Hand bucket over: READY(iteration, bucket), after MARK(zsent) if a
 * ZeroMQ message went out since the last slot. -EAGAIN when the ring is
 * full (the daemon has not taken a whole ring of slots), ZC_EPROTO when its
 * indices make no sense. */
int fpc_push_ready(struct fpc *f, uint64_t zsent, uint64_t iteration, uint32_t bucket);

/* Dispatching: fpc_begin(), then fpc_next() until it returns 0, ..., then
 * fpc_sleep(); while that returns true there is more to take. fpc_begin()
 * returns false once the daemon closed the channel (it stopped, or dropped
 * the ring): what the ring holds may still be taken, nothing more comes,
 * and the doorbell stays readable (end of file). */
bool fpc_begin(struct fpc *f, bool drain_doorbell);
/* The next completion, passing MARK(k) for k <= zrecv (the ZeroMQ
 * messages received): 1 with *ret set, 0 if none can be taken now,
 * ZC_EPROTO (reason in err) if the ring is corrupt. */
int fpc_next(struct fpc *f, uint64_t zrecv, struct fpc_event *ret, char *err, size_t errlen);
bool fpc_sleep(struct fpc *f, uint64_t zrecv);

#endif
