/*
 * zero.h — the ZeRO-1 op sequence of one iteration, as data.
 *
 * Given the plan, the shard map, where the job's ranks live (the topology)
 * and what the job's backend can do, zero_program() lists the ops this node
 * runs each iteration, in the order it submits them. Every node of a job
 * derives its list from the same inputs, so the collectives (REDUCE, BCAST)
 * come out in the same order on every node: no negotiation, no hang from
 * two nodes disagreeing on order. A pure function; tests/unit/test_zero.c
 * runs it for both shard modes, both step modes and many topologies against
 * a recording backend.
 *
 * The ops:
 *   FUSED   one pass per chunk: sum the local ranks' gradients (rank order,
 *           then one division), step the owned pieces, store the result into
 *           every local rank's parameters. Only when every rank is on this
 *           node and the backend reduces inside the node itself (host).
 *   REDUCE  average bucket b over the job: all-reduce (bucket mode) or
 *           reduce-scatter (slice mode). The average of each piece this node
 *           owns lands in its owner rank's gradient buffer.
 *   STEP    step the pieces this node owns in buckets lo..hi from their
 *           reduced gradients; store into every local rank's parameters.
 *   BCAST   give every rank the stepped parameters of buckets lo..hi:
 *           broadcast from the owners (bucket mode) or all-gather (slice).
 *
 * Lanes: REDUCE runs on the reduce lane, STEP and FUSED on the compute lane,
 * BCAST on the bcast lane. Lanes run concurrently, each in order; an op also
 * waits for the ops before it that touch its buckets. So a later bucket's
 * reduction never queues behind an earlier bucket's step or broadcast.
 */
#ifndef ZEROD_ZERO_H
#define ZEROD_ZERO_H

#include <stdbool.h>
#include <stdint.h>

#include "plan.h"
#include "plan/shard.h"

enum zop_kind {
	ZOP_FUSED,
	ZOP_REDUCE,
	ZOP_STEP,
	ZOP_BCAST,
};

enum zop_lane {
	LANE_REDUCE,
	LANE_COMPUTE,
	LANE_BCAST,
	LANE_COUNT,
};

struct zop {
	enum zop_kind kind;
	enum zop_lane lane;
	uint32_t lo, hi;    /* buckets lo..hi */
	bool notify_bucket; /* after it: BucketDone(lo), the bucket's gradients are reduced */
};

/* Where the job's ranks are. Ranks are the job's group ranks; nodes are
 * numbered 0..nnodes-1 by the rendezvous. */
struct zero_topo {
	uint32_t world;
	uint32_t nnodes;
	uint32_t node;           /* this node */
	const uint32_t *node_of; /* [world] */
};

/* What the job's backend does, as far as the op sequence cares. */
struct zero_caps {
	/* The daemon sums this node's ranks' buffers itself (host): when the
	 * whole job is on this node no collective is needed and interleaved
	 * buckets run as FUSED. A backend whose collectives span every rank
	 * (NCCL: one member per device) leaves it false. */
	bool local_fuse;
};

struct zero_program {
	uint32_t nops;
	struct zop *ops;
	uint32_t *bucket_ops; /* [nbuckets + 1]: ops submitted when bucket b is ready */
};

const char *zop_name(enum zop_kind k);

/* Build this node's program. 0, -EINVAL for a bad topology, or -ENOMEM. */
int zero_program(const struct plan *p, const struct zero_topo *t, const struct zero_caps *caps,
		 struct zero_program *ret);
void zero_program_clear(struct zero_program *z);

/* true if rank r lives on this node. */
static inline bool zero_local(const struct zero_topo *t, uint32_t r)
{
	return t->node_of[r] == t->node;
}

#endif
