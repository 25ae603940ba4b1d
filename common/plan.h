/*
 * plan.h — the validated, owned form of a job's plan (bucket layout,
 * parameter groups, optimizer, modes), its conversion from the public
 * zc_plan and from the wire, its hash and a field-by-field comparison.
 *
 * Flat layout, by bytes: all buckets of a rank live in one buffer; bucket b
 * takes numel * plan_dtype_size(dtype) bytes from byte offset
 * base * plan_dtype_size(dtype), which is a multiple of PLAN_ALIGN_BYTES, so
 * every bucket starts on a cache line. `base` is in elements of the bucket's
 * own dtype: an element offset off (base <= off < base + numel) addresses
 * ((T *)buffer)[off] with T the bucket's element type, so an fp32 bucket's
 * elements are ((float *)buffer)[off] as before. The element numbering of
 * buckets of different dtypes is not one sequence: compare offsets only
 * within a bucket.
 */
#ifndef ZEROD_PLAN_H
#define ZEROD_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "zeroclient.h"
#include "zerod.pb-c.h"

#define PLAN_ALIGN        16u /* fp32 elements (64 bytes) */
#define PLAN_ALIGN_BYTES  64u
#define PLAN_MAX_GROUPS   1024u
#define PLAN_MAX_BUCKETS  65536u
_Static_assert(ZEROD_QUEUE_MSGS >= 2 * PLAN_MAX_BUCKETS, "queues hold two iterations");
#define PLAN_MAX_SEGMENTS (1u << 20)   /* over all buckets */
#define PLAN_MAX_NUMEL    (1ull << 32) /* elements over all buckets */

struct plan_bucket {
	uint64_t numel;
	uint64_t base; /* first element in the flat buffer, in elements of dtype */
	uint64_t sbase; /* first element in the state's fp32 layout (below) */
	uint32_t nsegments;
	enum zc_dtype dtype;
	struct zc_segment *segments;
};

struct plan {
	enum zc_optimizer optimizer;
	enum zc_shard_mode shard_mode;
	enum zc_step_mode step_mode;
	double max_grad_norm; /* 0: no global clipping */
	uint32_t ngroups;
	struct zc_param_group *groups;
	uint32_t nbuckets;
	struct plan_bucket *buckets;
	uint64_t total_numel; /* total_bytes / 4: the flat length in fp32 slots (the
			       * elements with padding, for an all-fp32 plan) */
	uint64_t total_bytes; /* flat buffer length in bytes, with padding */
	bool low_precision;   /* some bucket is not fp32 */
	/* The state's layout (zc_get_state's staging, docs/STATE.md): every
	 * bucket's elements as fp32 slots, bucket b from sbase, each bucket
	 * padded to PLAN_ALIGN; state_numel slots in all. For an all-fp32 plan
	 * it is the buffers' own (sbase == base, state_numel == total_numel). */
	uint64_t state_numel;
	uint64_t hash;
};

/* Validate and copy. On failure returns ZC_EPLANINVAL (-EINVAL or -E2BIG for
 * a struct's size: zeroclient.h's "ABI", or -ENOMEM) and writes the reason
 * into err. The caller's structs are read by their own sizes. */
int plan_from_zc(const struct zc_plan *in, struct plan **ret, char *err, size_t errlen);
int plan_from_pb(const Zerod__V1__Plan *in, struct plan **ret, char *err, size_t errlen);

/* Fill a wire Plan from p. Allocates arrays freed by plan_pb_free(). */
int plan_to_pb(const struct plan *p, Zerod__V1__Plan *out);
void plan_pb_free(Zerod__V1__Plan *pb);

void plan_free(struct plan *p);

/* Bytes of one rank's gradient (or parameter) buffer. */
static inline uint64_t plan_buffer_bytes(const struct plan *p)
{
	return p->total_bytes;
}

/* Bytes of one element of dtype (a valid one: plan_finish checked it). */
static inline unsigned plan_dtype_size(enum zc_dtype t)
{
	return t == ZC_DTYPE_F32 ? 4u : 2u;
}

/* Where bucket b lies in a rank's buffer: its first byte, and its length. */
static inline uint64_t plan_bucket_offset(const struct plan *p, uint32_t b)
{
	return p->buckets[b].base * plan_dtype_size(p->buckets[b].dtype);
}

static inline uint64_t plan_bucket_bytes(const struct plan *p, uint32_t b)
{
	return p->buckets[b].numel * plan_dtype_size(p->buckets[b].dtype);
}

/* "fp32", "bf16", "fp16", or "?" */
const char *plan_dtype_name(enum zc_dtype t);

/* The optimizer state arrays a plan's groups need: torch keeps SGD's momentum
 * buffer only where momentum != 0 and Adam's max_exp_avg_sq only with
 * amsgrad. The state is sized from the plan, so a later hyperparameter change
 * must not need more (plan_state_arrays of the new group & ~the plan's). */
enum plan_state {
	PLAN_STATE_M = 1 << 0,    /* SGD momentum buffer / Adam exp_avg */
	PLAN_STATE_V = 1 << 1,    /* Adam exp_avg_sq */
	PLAN_STATE_VMAX = 1 << 2, /* Adam max_exp_avg_sq */
};
unsigned plan_state_arrays(enum zc_optimizer opt, const struct zc_param_group *groups,
			   uint32_t ngroups);

/* One segment's optimizer state as zc_set_state() gives it (ZC_STATE_* bits
 * in present, torch's step): 0, or ZC_ESTATEINVAL naming the segment and the
 * field in err. Against the plan's groups; the tensors' values are not seen
 * here. */
#define PLAN_STATE_ALL      63u
#define PLAN_STATE_MAX_STEP 0x3fffffffu
int plan_state_check(const struct plan *p, uint32_t bucket, uint32_t segment, uint32_t present,
		     double step, char *err, size_t errlen);

/* A re-plan: p must hold old's parameters (same optimizer and groups, the
 * same segments' numel, group and dtype, matched by param_id when every segment of
 * both has one, else by position in plan order). map (optional, one entry
 * per segment of p in plan order) gets each one's index in old's order.
 * 0, or ZC_EREPLAN with the first difference in err. */
int plan_replan_match(const struct plan *old, const struct plan *p, uint32_t *map, char *err,
		      size_t errlen);

/* Validate one group's hyperparameters for optimizer opt (torch's rules). */
int plan_group_check(enum zc_optimizer opt, const struct zc_param_group *g, char *err,
		     size_t errlen);

/* Whether group values g may be used in plan p: a max_grad_norm needs
 * at_end and no global one. 0, or ZC_EPLANINVAL with the reason. */
int plan_clip_check(const struct plan *p, const struct zc_param_group *g, char *err,
		    size_t errlen);

/* One caller's zc_param_group of any size (its `size` field), normalised:
 * fields it lacks take the defaults, out->size is ours. 0, or -EINVAL /
 * -E2BIG with the reason, about `what` ("groups[1]"), in err. Values are
 * not checked (plan_group_check). */
int plan_group_from_zc(const void *src, const char *what, struct zc_param_group *out, char *err,
		       size_t errlen);

void plan_group_from_pb(const Zerod__V1__ParamGroup *in, struct zc_param_group *out);
void plan_group_to_pb(const struct zc_param_group *in, Zerod__V1__ParamGroup *out);

/* Field by field (a struct compare would read padding). */
bool plan_group_equal(const struct zc_param_group *a, const struct zc_param_group *b);

/* 0 if a and b are equal; otherwise 1 and the first differing field with
 * both values ("buckets[3].segments[1].numel: 4096 vs 2048") in field. */
int plan_diff(const struct plan *a, const struct plan *b, char *field, size_t len);

const char *plan_optimizer_name(enum zc_optimizer o);
const char *plan_shard_name(enum zc_shard_mode m);
const char *plan_step_name(enum zc_step_mode m);

#endif
