/*
 * coll.h — the collectives backend interface: one instance per job on this
 * node. Every call takes flat element offsets into the job's buffers (see
 * plan.h) and blocks until done, so it runs on the job's executor thread,
 * never on the loop thread. All daemons of a job issue the same calls in the
 * same order (sched.c derives the order from the plan).
 *
 * coll/host.c: ranks on this node, through their mapped shm buffers, reduced
 * and copied by the worker pool. Across nodes (gloo) and on GPUs (nccl) the
 * same table is implemented again.
 */
#ifndef ZEROD_COLL_H
#define ZEROD_COLL_H

#include <stdint.h>

struct pool;

struct coll_config {
	uint32_t world; /* ranks in the job */
	float **grads;  /* [world]: each local rank's gradient buffer base (NULL if remote) */
	float **params; /* [world]: each local rank's parameter buffer base (NULL if remote) */
	struct pool *pool;
};

/* One rank's share of a reduce-scatter / all-gather. */
struct coll_range {
	uint32_t owner;
	uint64_t off; /* flat element offset */
	uint64_t n;
};

struct coll_group;

struct coll_ops {
	const char *name;
	/* Create the job's group once every local buffer is mapped (loop thread,
	 * must not block). cfg's arrays are copied. */
	int (*open)(const struct coll_config *cfg, struct coll_group **ret);
	/* Average the gradients [off, off+n) over all ranks into out[off..]
	 * on this node. */
	int (*all_reduce)(struct coll_group *g, uint64_t off, uint64_t n, float *out);
	/* Average each range over all ranks into out[range] on the node that
	 * hosts range.owner (other nodes may skip it). */
	int (*reduce_scatter)(struct coll_group *g, const struct coll_range *r, uint32_t nr,
			      float *out);
	/* Copy src[off..off+n) held by rank root into every rank's parameters. */
	int (*broadcast)(struct coll_group *g, uint32_t root, uint64_t off, uint64_t n,
			 const float *src);
	/* Copy each range, held by its owner in src[range], into every rank's
	 * parameters. */
	int (*all_gather)(struct coll_group *g, const struct coll_range *r, uint32_t nr,
			  const float *src);
	/* Free the group. Accepts NULL. No call may be running. */
	void (*close)(struct coll_group *g);
};

extern const struct coll_ops coll_host_ops;

#endif
