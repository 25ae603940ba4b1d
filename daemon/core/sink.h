/*
 * sink.h — how the core (job.c, sched.c) answers the ranks it serves without
 * knowing their transport: ZeroMQ and protobuf, the fast-path ring, the
 * connection. session.c implements it (session_sink); a test may plug in
 * its own. For the core a `struct session` is an opaque rank endpoint.
 *
 * Every call is on the loop thread and never blocks; a rank that cannot be
 * reached is dropped later (session_reap), never inside a call, so the core
 * may call these while it walks a job's ranks.
 */
#ifndef ZEROD_SINK_H
#define ZEROD_SINK_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

struct session;

/* An error about no particular iteration. */
#define SINK_NO_ITERATION UINT64_MAX

/* A checkpoint's export over several nodes: the state layout's ranges this
 * node owns, (slot, numel) pairs, n words; and the node's index. */
struct sink_ranges {
	const uint64_t *ranges;
	size_t n;
	uint32_t node, nnodes;
	uint64_t run; /* StateOk.run */
};

struct sink_ops {
	/* Every rank of the job registered the same plan. */
	void (*plan_ok)(struct session *s, uint64_t plan_hash);
	/* Bucket b of iteration t is reduced: its hook future completes. */
	void (*bucket_done)(struct session *s, uint64_t t, uint32_t b);
	/* Every update of iteration t has landed: the step future completes. */
	void (*step_done)(struct session *s, uint64_t t);
	/* step_done() with what the step did (zc_step_info): found_inf, and the
	 * gradient norm (NaN: none). Used only when there is something to say;
	 * may be NULL (then step_done()). */
	void (*step_done_info)(struct session *s, uint64_t t, bool found_inf, double grad_norm);
	/* A named error about iteration (or SINK_NO_ITERATION) and bucket (or
	 * -1). fatal: the job cannot go on, every pending future fails. */
	void (*error)(struct session *s, int code, bool fatal, uint64_t iteration, int64_t bucket,
		      const char *msg);
	/* The state export or import the rank asked for is done; rg (else
	 * NULL): a checkpoint's export over several nodes tells the stager
	 * its node's ranges (rg->n words; 0: the node owns none). */
	void (*state_ok)(struct session *s, const struct sink_ranges *rg);
	/* The operator asked for a checkpoint into dir: the rank takes it
	 * between iterations once its iteration is `iteration` (resume.c). */
	void (*checkpoint_due)(struct session *s, const char *dir, uint64_t iteration);
	/* The rank's job ended: its session goes at the next reap. */
	void (*detach)(struct session *s);
};

extern const struct sink_ops session_sink;

/* error() with a printf-style message. */
__attribute__((format(printf, 7, 8))) static inline void
sink_error(const struct sink_ops *k, struct session *s, int code, bool fatal, uint64_t iteration,
	   int64_t bucket, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	k->error(s, code, fatal, iteration, bucket, msg);
}

#endif
