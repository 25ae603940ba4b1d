/*
 * engine.h — a job's data plane on this node: the executor thread that runs
 * the job's collectives and optimizer steps in plan order, and the optimizer
 * state of the job's shard (fp32 masters, moments, step counts, kept per
 * piece = one shard unit cut at parameter-group segment boundaries).
 *
 * The loop thread submits ops (never blocks); the executor runs them in FIFO
 * order on the worker pool and posts one completion per op to the daemon's
 * completion queue (eventfd). Ops of one job never run concurrently, so the
 * collectives are issued in the same order on every daemon.
 */
#ifndef ZEROD_ENGINE_H
#define ZEROD_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "coll/coll.h"
#include "optim/optim.h"
#include "plan.h"
#include "shard.h"

struct pool;
struct engine;
struct completion_queue;

enum engine_op_kind {
	ENGINE_INIT,   /* masters from rank 0's parameters, then to every rank */
	ENGINE_HYPER,  /* install a new hyperparameter snapshot (takes ownership) */
	ENGINE_REDUCE, /* all-reduce / reduce-scatter bucket lo */
	ENGINE_STEP,   /* optimizer step of the local pieces of buckets lo..hi */
	ENGINE_BCAST,  /* broadcast / all-gather buckets lo..hi */
	ENGINE_STOP,   /* last op: the thread exits */
};

const char *engine_op_name(enum engine_op_kind k);

/* A completion, posted to the loop. */
struct engine_done {
	void *tag; /* the job */
	enum engine_op_kind kind;
	uint64_t iteration;
	uint32_t lo, hi;
	int status;
	struct engine_done *next;
};

struct engine_config {
	void *tag;
	const struct plan *plan;
	const struct shard_map *shard;
	uint32_t world;
	float **grads;  /* [world], NULL for ranks on other nodes */
	float **params; /* [world] */
	const struct coll_ops *coll;
	const struct optim_ops *optim;
	struct pool *pool;
	struct completion_queue *cq;
};

/* Bytes of state engine_new() allocates for plan: the reduction buffer,
 * fp32 master weights and the optimizer's moments, one float each per
 * element. */
uint64_t engine_memory(const struct plan *plan, const struct optim_ops *optim);

/* Allocate the state and start the executor thread (loop thread; large
 * arrays are calloc'd, so pages are only touched by the executor). */
int engine_new(const struct engine_config *cfg, struct engine **ret);

/* Queue an op. groups: ENGINE_HYPER only, a malloc'd array of
 * plan->ngroups that the engine takes over. Non-blocking. */
int engine_submit(struct engine *e, enum engine_op_kind kind, uint64_t iteration, uint32_t lo,
		  uint32_t hi, struct zc_param_group *groups);

/* Drop every queued op and queue ENGINE_STOP; the op running finishes. The
 * ENGINE_STOP completion says the thread is gone: then engine_free(). */
void engine_stop(struct engine *e);

/* Join and free. Only after the ENGINE_STOP completion (or never started). */
void engine_free(struct engine *e);

/* Counters (read on the loop thread after completions). */
struct engine_stats {
	uint64_t reduced_elems;
	uint64_t stepped_elems;
	uint64_t bcast_elems;
};
void engine_stats(struct engine *e, struct engine_stats *ret);

/* ---- the completion queue: executors -> loop ---- */

int completion_queue_new(struct completion_queue **ret);
void completion_queue_free(struct completion_queue *q);
int completion_queue_fd(struct completion_queue *q);
void completion_queue_post(struct completion_queue *q, struct engine_done *d);
/* Take every posted completion, oldest first (caller frees each). */
struct engine_done *completion_queue_take(struct completion_queue *q);

#endif
