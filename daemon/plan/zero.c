/*
 * zero.c — the op sequence of one iteration (see zero.h). A pure function of
 * the plan's modes, its bucket count, the topology and the backend's caps.
 */
#include <errno.h>
#include <stdlib.h>

#include "plan/zero.h"

const char *zop_name(enum zop_kind k)
{
	static const char *const names[] = {
		[ZOP_FUSED] = "fused",
		[ZOP_REDUCE] = "reduce",
		[ZOP_STEP] = "step",
		[ZOP_BCAST] = "bcast",
	};
	return k <= ZOP_BCAST ? names[k] : "?";
}

static const enum zop_lane lane_of[] = {
	[ZOP_FUSED] = LANE_COMPUTE,
	[ZOP_REDUCE] = LANE_REDUCE,
	[ZOP_STEP] = LANE_COMPUTE,
	[ZOP_BCAST] = LANE_BCAST,
};

static void emit(struct zero_program *z, enum zop_kind k, uint32_t lo, uint32_t hi, bool notify)
{
	if (z->ops)
		z->ops[z->nops] = (struct zop){
			.kind = k, .lane = lane_of[k], .lo = lo, .hi = hi, .notify_bucket = notify};
	z->nops++;
}

/* One pass counts (ops == NULL), the second fills. */
static void build(const struct plan *p, bool single_node, const struct zero_caps *caps,
		  struct zero_program *z)
{
	uint32_t last = p->nbuckets - 1;
	bool fuse = single_node && caps->local_fuse;

	z->nops = 0;
	for (uint32_t b = 0; b < p->nbuckets; b++) {
		if (z->bucket_ops)
			z->bucket_ops[b] = z->nops;
		if (p->step_mode == ZC_STEP_INTERLEAVED) {
			if (fuse) {
				emit(z, ZOP_FUSED, b, b, true);
				continue;
			}
			emit(z, ZOP_REDUCE, b, b, true);
			emit(z, ZOP_STEP, b, b, false);
			emit(z, ZOP_BCAST, b, b, false);
			continue;
		}
		/* at_end: the reduced gradients wait in the owners' gradient
		 * buffers until the last bucket is in */
		emit(z, ZOP_REDUCE, b, b, true);
		if (b == last) {
			emit(z, ZOP_STEP, 0, last, false);
			/* one node that stores into every rank needs no broadcast */
			if (!fuse)
				emit(z, ZOP_BCAST, 0, last, false);
		}
	}
	if (z->bucket_ops)
		z->bucket_ops[p->nbuckets] = z->nops;
}

int zero_program(const struct plan *p, const struct zero_topo *t, const struct zero_caps *caps,
		 struct zero_program *ret)
{
	struct zero_program z = {0};
	bool single = true;

	if (t->world == 0 || t->nnodes == 0 || t->node >= t->nnodes || p->nbuckets == 0)
		return -EINVAL;
	for (uint32_t r = 0; r < t->world; r++) {
		if (t->node_of[r] >= t->nnodes)
			return -EINVAL;
		single = single && t->node_of[r] == t->node;
	}
	build(p, single, caps, &z);
	z.ops = calloc(z.nops, sizeof(*z.ops));
	z.bucket_ops = calloc(p->nbuckets + 1, sizeof(*z.bucket_ops));
	if (!z.ops || !z.bucket_ops) {
		zero_program_clear(&z);
		return -ENOMEM;
	}
	build(p, single, caps, &z);
	*ret = z;
	return 0;
}

void zero_program_clear(struct zero_program *z)
{
	free(z->ops);
	free(z->bucket_ops);
	*z = (struct zero_program){0};
}
