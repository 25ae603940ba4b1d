/*
 * flight.c — a job's flight recorder: a ring of its last N operations with
 * their times, kept from the first sight of the job to its end, for `zeroctl
 * inspect`. Fixed size per job (flight-records), allocated once: recording
 * never allocates.
 */
#include <errno.h>
#include <stdlib.h>

#include "ops/ops_int.h"

static const char *const names[] = {
	[FL_SEEN] = "seen",	  [FL_STARTED] = "started", [FL_READY] = "ready",
	[FL_QUEUED] = "queued",	  [FL_REDUCED] = "reduced", [FL_STEP] = "step",
	[FL_STALL] = "stall",	  [FL_FAILED] = "failed",   [FL_STOPPED] = "stopped",
};

int flight_new(unsigned cap, struct flight **ret)
{
	struct flight *f;

	if (cap == 0)
		cap = 1;
	f = calloc(1, sizeof(*f) + (size_t)cap * sizeof(f->ops[0]));
	if (!f)
		return -ENOMEM;
	f->cap = cap;
	*ret = f;
	return 0;
}

struct flight_op *flight_add(struct flight *f, int64_t at_us, enum flight_what what,
			     uint64_t iteration, int32_t bucket, int32_t rank, uint64_t dur_us)
{
	struct flight_op *op = &f->ops[f->head];

	*op = (struct flight_op){.at_us = at_us,
				 .iteration = iteration,
				 .dur_us = dur_us,
				 .bucket = bucket,
				 .rank = rank,
				 .what = what};
	f->head = (f->head + 1) % f->cap;
	if (f->count < f->cap)
		f->count++;
	return op;
}

const struct flight_op *flight_get(const struct flight *f, unsigned i)
{
	return &f->ops[(f->head + f->cap - f->count + i) % f->cap];
}

const char *flight_what_name(enum flight_what w)
{
	return (unsigned)w < sizeof(names) / sizeof(names[0]) ? names[w] : "?";
}
