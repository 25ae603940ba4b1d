/*
 * shard.h — ownership: which rank steps which range of which bucket. A pure
 * function of the plan (its buckets and shard mode) and the world size, so
 * every daemon of a job computes the same map without talking.
 */
#ifndef ZEROD_SHARD_H
#define ZEROD_SHARD_H

#include <stdint.h>

#include "plan.h"

/* Range [offset, offset + numel) of bucket `bucket` (bucket-relative
 * elements), stepped by rank `owner`. */
struct shard_unit {
	uint32_t bucket;
	uint32_t owner;
	uint64_t offset;
	uint64_t numel;
};

struct shard_map {
	uint32_t world;
	uint32_t nbuckets;
	uint32_t nunits;
	struct shard_unit *units; /* sorted by (bucket, offset); they tile every bucket */
	uint32_t *bucket_first;   /* [nbuckets + 1]: units of bucket b are [first[b], first[b+1]) */
	uint64_t *load;           /* [world]: elements owned per rank */
	uint64_t max_unit;        /* largest unit: the indivisible granule of the balance bound */
};

/*
 * Build the map for plan p and world ranks, by p->shard_mode:
 *  - ZC_SHARD_BUCKET: size-balanced greedy (largest first onto the
 *    least-loaded rank, ties to the lower bucket / lower rank). A bucket
 *    larger than ceil(total / world) is first split into near-equal pieces no
 *    larger than that, so no rank sits idle while another holds a huge bucket.
 *  - ZC_SHARD_SLICE: every bucket cut into world contiguous slices in rank
 *    order; sizes differ by at most one element and the longer slices rotate
 *    over the ranks across buckets, so each rank's total is within one
 *    element of the ideal.
 * Guarantee (unit-tested): max(load) <= ceil(total / world) + max_unit, and no
 * rank owns nothing when there are at least `world` buckets.
 */
int shard_assign(const struct plan *p, uint32_t world, struct shard_map **ret);
void shard_map_free(struct shard_map *m);

#endif
