/*
 * sink.h — how the core answers the ranks it serves without knowing their
 * transport: ZeroMQ and protobuf, the fast-path ring, the connection. The
 * edge implements it (session.c's session_sink); the core's unit tests plug
 * in a recording one. For the core a rank is a `struct member` (core-t.h),
 * which the edge embeds in its session.
 *
 * Every call is on the loop thread and never blocks. A rank that cannot be
 * reached is dropped later (the edge's reap), never inside a call, so the
 * core may call these while it walks a job's ranks; only drop() acts at
 * once, and says so.
 */
#ifndef ZEROD_SINK_H
#define ZEROD_SINK_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/core-t.h"

struct mem_desc;


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
	/* Every rank of the job registered the same plan; recovered: the
	 * iteration a re-formed job goes on at (reform.c), or
	 * SINK_NO_ITERATION for a fresh start or a re-plan. */
	void (*plan_ok)(struct member *s, uint64_t plan_hash, uint64_t recovered);
	/* Bucket b of iteration t is reduced: its hook future completes. */
	void (*bucket_done)(struct member *s, uint64_t t, uint32_t b);
	/* Every update of iteration t has landed: the step future completes. */
	void (*step_done)(struct member *s, uint64_t t);
	/* step_done() with what the step did (zc_step_info): found_inf, and the
	 * gradient norm (NaN: none). Used only when there is something to say;
	 * may be NULL (then step_done()). */
	void (*step_done_info)(struct member *s, uint64_t t, bool found_inf, double grad_norm);
	/* A named error about iteration (or SINK_NO_ITERATION) and bucket (or
	 * -1). fatal: the job cannot go on, every pending future fails. */
	void (*error)(struct member *s, int code, bool fatal, uint64_t iteration, int64_t bucket,
		      const char *msg);
	/* The state export or import the rank asked for is done; rg (else
	 * NULL): a checkpoint's export over several nodes tells the stager
	 * its node's ranges (rg->n words; 0: the node owns none). */
	void (*state_ok)(struct member *s, const struct sink_ranges *rg);
	/* The operator asked for a checkpoint into dir: the rank takes it
	 * between iterations once its iteration is `iteration` (resume.c). */
	void (*checkpoint_due)(struct member *s, const char *dir, uint64_t iteration);
	/* error() that answers no request: another rank's doing, so it fails no
	 * future of the message being handled (sched.c's ZC_EHYPER). */
	void (*error_unasked)(struct member *s, int code, uint64_t iteration, const char *msg);
	/* The rank's job ended: its session goes at the next reap. */
	void (*detach)(struct member *s);
	/* Has the rank's process exited, whether or not its leave was seen? */
	bool (*gone)(struct member *s);
	/* A state staging the rank passed as a memfd over the fd socket, by its
	 * serial (StateStaging.fd_serial): its description, valid until
	 * fd_release(), or ZC_EBUFFER with why in err. */
	int (*fd_staging)(struct member *s, uint64_t serial, struct mem_desc *ret, char *err,
			  size_t errlen);
	/* The memfds the rank passed are mapped or refused: close them. */
	void (*fd_release)(struct member *s);
	/* The rank leaves now, for why (its session ends): job_leave() runs
	 * inside, and may free the job. */
	void (*drop)(struct member *s, enum leave_reason why);
};

/* error() with a printf-style message. */
__attribute__((format(printf, 7, 8))) static inline void
sink_error(const struct sink_ops *k, struct member *s, int code, bool fatal, uint64_t iteration,
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
