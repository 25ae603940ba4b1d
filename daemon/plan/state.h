/*
 * state.h — the optimizer state of the ranges this node owns, and nothing
 * else: one arena holding, for every owned element, the arrays the job's
 * optimizer needs (plan_state_arrays: Adam m and v, vmax only with amsgrad;
 * SGD's momentum buffer only when some group has momentum). fp32 parameters
 * have no master copy: the owner rank's parameter buffer is the master, as in
 * torch. bf16/fp16 parameters have one: an fp32 array after the others,
 * only for the pieces of such buckets (optim_piece.mat), loaded from the
 * parameters when the job starts and on zc_params_changed(). Step counts
 * (and SGD's `buf is None`) are kept per piece.
 *
 * A piece is a shard unit cut at its bucket's segment boundaries: one owner,
 * one parameter group, contiguous in the flat buffers and in the arena.
 * Written by the compute lane only (exec/step.c, exec/xfer.c).
 */
#ifndef ZEROD_STATE_H
#define ZEROD_STATE_H

#include <stdbool.h>
#include <stdint.h>

#include "optim/optim.h"
#include "plan.h"
#include "plan/shard.h"
#include "plan/zero.h"

struct state {
	unsigned arrays;             /* PLAN_STATE_M | PLAN_STATE_V | PLAN_STATE_VMAX */
	uint32_t npieces;            /* owned by this node */
	struct optim_piece *pieces;  /* by bucket, then offset; .at packs the arena */
	uint32_t *bucket_first;      /* [nbuckets + 1] */
	uint64_t nelems;             /* owned elements */
	float *arena;                /* nelems floats per array, arrays back to back */
	float *m, *v, *vmax;         /* into the arena, or NULL */
	uint64_t nmaster;            /* owned elements of bf16/fp16 buckets */
	float *master;               /* nmaster floats at the arena's end, or NULL */
	/* The undo journal (exec_config.journal), or NULL: before a bucket's
	 * pieces step, their values (the arena's slots, the step counts and
	 * the owners' parameters) are copied here, so that an iteration cut
	 * between its buckets can be taken back to its start exactly
	 * (core/reform.c). */
	float *undo;                /* as the arena */
	struct state_undo *undo_pc; /* [npieces] */
	uint64_t *undo_iter;        /* [nbuckets]: whose step it holds; UINT64_MAX: none */
	uint32_t *undo_params;      /* [nelems]: each owned parameter in a 4-byte slot, by .at */
	uint32_t nbuckets;
};

struct state_undo {
	uint64_t step;
	bool first_momentum;
};

/* Lay out the pieces this node owns (no arena yet). */
int state_layout(const struct plan *p, const struct shard_map *sm, const struct zero_topo *t,
		 unsigned arrays, struct state **ret);

/* Bytes the arena takes: what the job is charged against --max-memory. */
uint64_t state_bytes(const struct state *s);

/* Allocate the arena (zeroed; pages are touched by the first step). */
int state_alloc(struct state *s);

/* Free the arena only; the layout stays. */
void state_release(struct state *s);

/* The state k, laid out by plan `old`, into the fresh layout st of plan p
 * (another layout of the same parameters: plan_replan_match; its arena
 * allocated here), and old's parameters `from` (a flat buffer of old) into
 * `to` (one of p): element by element through the segments they belong
 * to, the step counts as they were. fp32 plans only. 0, -EINVAL (not the
 * same parameters, or bf16/fp16) or -ENOMEM. */
int state_relayout(const struct plan *old, const struct state *k, const void *from,
		   const struct plan *p, struct state *st, void *to);

/* The undo journal for a plan of nbuckets (what is missing of it): 0 or
 * -ENOMEM. */
int state_undo_alloc(struct state *s, uint32_t nbuckets);
/* Its bookkeeping only (undo_pc, undo_iter): a state the backend keeps
 * (cuda) journals its arrays on the devices. 0 or -ENOMEM. */
int state_undo_marks(struct state *s, uint32_t nbuckets);
/* Before piece k steps: elements [x, x + n) of it into the journal.
 * params: every rank's buffer (the owner's is read). Any thread; the
 * caller marks the buckets saved (undo_iter) once all their pieces are. */
void state_undo_save(struct state *s, uint32_t k, uint64_t x, uint64_t n, void *const *params);
/* Back to the start of iteration t: every bucket whose journal holds t
 * gets its values back, its parameters into the one buffer params (a
 * whole flat buffer of the plan). How many buckets. */
uint32_t state_undo_restore(struct state *s, uint64_t t, void *params);

void state_free(struct state *s);

#endif
