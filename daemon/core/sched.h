/*
 * sched.h — iterations (sched.c): bucket order, op submission, completions,
 * stalls. Every call is on the loop thread.
 */
#ifndef ZEROD_SCHED_H
#define ZEROD_SCHED_H

#include <stddef.h>
#include <stdint.h>

#include "core/core-t.h"

struct exec_done;

void sched_start(struct job *j);
/* Bucket `bucket` of `iteration` from rank s (any transport: ZeroMQ or a
 * fast-path ring), with its segment mask of nwords words (unused: the
 * segments s did not use; NULL, 0: none). A bad bucket is an error to s;
 * nothing else changes. */
void sched_bucket_ready(struct job *j, struct member *s, uint64_t iteration, uint32_t bucket,
			const uint64_t *unused, size_t nwords);
/* Rank s sets group's hyperparameters from iteration on. */
void sched_set_hyper(struct job *j, struct member *s, uint64_t iteration, uint32_t group,
		     const struct zc_param_group *g);
/* Rank s called zc_params_changed() before iteration (the next one it has
 * not started): the masters are reloaded when that iteration starts. */
void sched_params_changed(struct job *j, struct member *s, uint64_t iteration);
/* A completion of j's executor (the loop drains the queue): the hooks see
 * it first. */
void sched_on_done(struct core *c, struct exec_done *done);
void sched_check_stalls(struct core *c, int64_t now);
/* Who j waits for, this node's ranks: "rank 1 (bucket 2 of 4)", or before
 * it starts "rank 3 (not connected)"; returns how many are named (0: the
 * text says the executor). */
int sched_describe_wait(const struct job *j, char *buf, size_t len);

#endif
