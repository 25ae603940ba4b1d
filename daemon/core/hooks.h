/*
 * hooks.h — what the core and the edge tell the operator's side (ops/:
 * trace, flight recorder, metrics, the job's last checkpoint) as it
 * happens: one table, filled by ops/ (ops_hooks) and set in struct core by
 * daemon.c, called through the NULL-safe helpers below. A daemon without an
 * operator's side (a unit test) leaves core.hooks NULL; a table may leave
 * any member NULL.
 *
 * Every hook runs on the loop thread, never blocks and never calls back into
 * the core; each is safe with a job the operator's side has not seen yet.
 */
#ifndef ZEROD_HOOKS_H
#define ZEROD_HOOKS_H

#include <stdbool.h>
#include <stdint.h>

#include "core/core-t.h"

struct exec_done;

struct core_hooks {
	/* Every completion of an executor, before sched_on_done() acts on it. */
	void (*exec_done)(void *ctx, const struct exec_done *done);
	/* Rank `rank` handed over bucket b of iteration t (sched_bucket_ready,
	 * once the bucket is accepted). */
	void (*bucket_ready)(void *ctx, struct job *j, uint32_t rank, uint64_t t, uint32_t b);
	/* Bucket b of iteration t is complete on every local rank and queued
	 * on the executor. */
	void (*bucket_queued)(void *ctx, struct job *j, uint64_t t, uint32_t b);
	/* j is about to be freed (job_free's first step). */
	void (*job_free)(void *ctx, struct job *j);
	/* An Error with code went to a trainer (the edge). */
	void (*error_sent)(void *ctx, int code);
	/* A trainer of j (rank) said how a checkpoint of iteration ended (the
	 * edge's CheckpointDone; dir one line): path: ok, the generation
	 * written (may be NULL); error: !ok, why (any bytes). */
	void (*checkpoint_done)(void *ctx, struct job *j, uint32_t rank, bool ok,
				uint64_t iteration, const char *dir, const char *path,
				const char *error);
};

#define CORE_HOOK(c, name, ...)                                                                    \
	do {                                                                                       \
		const struct core *c_ = (c);                                                       \
		if (c_->hooks && c_->hooks->name)                                                  \
			c_->hooks->name(c_->hooks_ctx, __VA_ARGS__);                               \
	} while (0)

#endif
