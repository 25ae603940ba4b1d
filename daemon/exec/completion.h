/*
 * completion.h — completions from executor threads (and backend callbacks)
 * to the loop thread: a locked list and one eventfd the loop watches. Posting
 * never fails and never blocks for long: records are allocated by whoever
 * queued the work, before it started.
 */
#ifndef ZEROD_COMPLETION_H
#define ZEROD_COMPLETION_H

#include <stdint.h>

#include "plan/zero.h"

enum exec_event {
	EXEC_STARTED,     /* the job's backends are open and every rank holds rank 0's parameters */
	EXEC_BUCKET_DONE, /* bucket `bucket` of `iteration` is reduced */
	EXEC_STEP_DONE,   /* every op of `iteration` is done */
	EXEC_FAILED,      /* op `op` of buckets lo..hi failed with `status`; nothing more runs */
	EXEC_STOPPED,     /* the executor's threads are gone and its state is freed */
	EXEC_STATE_DONE,  /* the state export or import (exec_state) is done */
};

struct exec_done {
	void *tag; /* the job */
	enum exec_event ev;
	uint64_t iteration;
	uint32_t bucket;
	const char *op;     /* EXEC_FAILED: what failed */
	const char *detail; /* EXEC_FAILED: the backend's words, or "" (valid until exec_free) */
	uint32_t lo, hi;
	int status;
	/* EXEC_STEP_DONE: the step was skipped (a non-finite gradient under a
	 * grad scale); the global gradient norm before clipping, NaN if none */
	bool found_inf;
	double grad_norm;
	struct exec_done *next;
};

struct completion_queue;

int completion_queue_new(struct completion_queue **ret);
void completion_queue_free(struct completion_queue *q);
int completion_queue_fd(struct completion_queue *q);
/* Any thread. Takes d. */
void completion_queue_post(struct completion_queue *q, struct exec_done *d);
/* Loop thread: take every posted completion, oldest first (caller frees each). */
struct exec_done *completion_queue_take(struct completion_queue *q);

#endif
