/*
 * exec.h — a job's executor on this node: runs the ops of zero.h on the job's
 * backends (coll, optim) over its compact state (state.h).
 *
 * One thread per lane (reduce, compute, bcast). The loop thread queues ops
 * and never blocks; each lane runs its ops in order, and an op starts only
 * once the ops queued before it that touch its buckets are done. Only what
 * the loop acts on is posted back (completion.h): the job started, a bucket
 * reduced, an iteration done, a failure, the executor stopped.
 */
#ifndef ZEROD_EXEC_H
#define ZEROD_EXEC_H

#include <stdint.h>

#include "coll/coll.h"
#include "exec/completion.h"
#include "optim/optim.h"
#include "plan.h"
#include "plan/shard.h"
#include "plan/state.h"
#include "plan/zero.h"

struct pool;
struct exec;
struct cudabufs;
struct mem_ops;

/* A recovery (a job re-formed after a trainer died, core/reform.c): what
 * its previous executor left. The start takes back the buckets the
 * journal holds for undo_iter (state.h), then gives every rank the
 * parameters (rank 0's buffer, then the broadcast) instead of rank 0's
 * own, the state as it was: exec_config.state itself when the plan is the
 * same (its arena allocated, kept by exec_stop_keep), else laid out from
 * `kept` (state_relayout) into exec_config.state. A state the backend
 * keeps (cuda) is copied from there onto the devices. Off the loop
 * thread. */
struct exec_recover {
	struct state *kept;      /* another layout's state (the journal writes it), or NULL */
	const struct plan *plan; /* the plan the kept state is laid out by */
	void *params;            /* the parameters, a flat buffer of plan */
	uint64_t undo_iter;      /* take back its stepped buckets; UINT64_MAX: none */
	/* The old buffers (params points into one), unmapped with release_mem
	 * by the start once it has read them, off the loop thread: zerod held
	 * the dead trainers' last mappings, so the unmapping frees their pages.
	 * The array and the mappings are the executor's once exec_new()
	 * returned 0 (NULL: none). */
	struct mem_map **release;
	uint32_t nrelease;
	const struct mem_ops *release_mem;
};

struct exec_config {
	void *tag; /* given back in every completion */
	const struct plan *plan;
	const struct shard_map *shard;
	const struct zero_program *prog;
	struct state *state; /* taken over, even on failure */
	uint32_t world;
	float *const *grads;  /* [world]: NULL for ranks on other nodes */
	float *const *params; /* [world] */
	const struct coll_ops *coll;
	const struct coll_net *net; /* NULL: the whole job is on this node; else it must
				     * outlive the executor */
	const struct optim_ops *optim;
	struct pool *pool;
	struct completion_queue *cq;
	/* Buffers the start op opens, off the loop thread (CUDA IPC: opening
	 * may block), once per plan, and the executor closes when it stops.
	 * With mem, grads and params are NULL and bufs[r] says what local rank
	 * r registered (NULL for ranks on other nodes); bufs and what it points
	 * to must outlive the executor. NULL: grads and params are mapped. */
	const struct mem_ops *mem;
	struct cudabufs *const *bufs; /* [world] */
	int stall_timeout_ms;         /* how long a collective waits for a trainer (nccl) */
	/* A recovery: copied; what it points to stays the caller's, valid
	 * until EXEC_STARTED. NULL: a fresh start. */
	const struct exec_recover *recover;
	/* Keep the undo journal (state.h): each bucket's values from before
	 * its step in the iteration under way, so that a recovery can take an
	 * iteration cut after some of its buckets stepped back to its start.
	 * A state the backend keeps journals on the devices (optim.h). */
	bool journal;
	/* A state the backend keeps (cuda): keep what a recovery needs beyond
	 * the trainers' device memory (optim.h's keep_params: a copy of each
	 * owned fp32 piece's parameters, current after every step), and let
	 * exec_stop_keep() copy it off the devices. */
	bool keep_params;
};

/* Start the lane threads and queue the start: open the backends, allocate
 * the state, give every rank rank 0's parameters; then EXEC_STARTED (or
 * EXEC_FAILED). Loop thread; the arrays in cfg are copied. */
int exec_new(const struct exec_config *cfg, struct exec **ret);

/* Hyperparameters for the steps queued after this (a malloc'd array of
 * plan->ngroups, taken over even on failure). */
int exec_hyper(struct exec *e, struct zc_param_group *groups);

/* zc_params_changed(): reload the fp32 masters of the bf16/fp16 pieces from
 * their owners' parameters, after every op queued so far and before any
 * queued later. Loop thread. */
int exec_reload(struct exec *e);

/* What a bucket brings besides its gradients (semantics.c): segments local
 * ranks marked unused, and with the last bucket of an at_end iteration its
 * grad scale. The arrays are copied. */
struct exec_zero {
	uint32_t rank; /* a local rank */
	uint32_t seg;  /* a segment of the bucket it marked unused */
};
struct exec_bucket_in {
	const uint32_t *marks; /* [bucket's nsegments]: local ranks that marked each; NULL: none */
	const struct exec_zero *zero; /* gradients to zero before the reduction */
	uint32_t nzero;
	bool has_scale; /* the iteration's grad scale (its last bucket only) */
	double inv_scale;
};
/* Bucket b of iteration t is ready on every rank: queue its ops, with in
 * (NULL: nothing marked, no scale). Buckets of one iteration come in order;
 * the next iteration starts after its EXEC_STEP_DONE. A segment no rank
 * of the job (every node) uses is not stepped and its pieces' step counts
 * stay; a marked segment's gradient is zeroed in its rank's buffer before
 * the reduction reads it. */
int exec_bucket_ex(struct exec *e, uint64_t t, uint32_t b, const struct exec_bucket_in *in);

/*
 * Export or import the optimizer state, between iterations (statex.c). Each
 * local rank's staging holds exec_state_regions() regions of the plan's
 * state_numel floats, in the state's layout (plan.h: each element an fp32
 * slot, bucket b from its sbase): the rank's saved parameters (used by an
 * export over several nodes), one word per element (EXEC_META_*), then
 * momentum_buffer / exp_avg, exp_avg_sq, max_exp_avg_sq, and for a plan
 * with bf16/fp16 buckets their fp32 masters. Export: every rank's staging
 * gets every piece's state; on one node straight from the state, over
 * several (fp32 buckets only there) the other nodes' through broadcasts in
 * the parameter buffers, which are saved first and restored after. Import: each
 * owned piece whose segment is given takes its owner rank's values; a
 * bf16/fp16 piece given without a master reloads it from its owner's
 * parameters. The request and what it points to stay the caller's until
 * EXEC_STATE_DONE (or the executor stopped).
 */
enum {
	EXEC_REGION_SAVE,
	EXEC_REGION_META,
	EXEC_REGION_M,
	EXEC_REGION_V,
	EXEC_REGION_VMAX,
	EXEC_REGION_MASTER, /* plans with bf16/fp16 buckets only */
};
/* 5 regions, 6 with bf16/fp16 buckets (an fp32 plan's staging is as it
 * was before low-precision buckets). */
static inline unsigned exec_state_regions(const struct plan *p)
{
	return p->low_precision ? 6 : 5;
}
#define EXEC_META_STEP     0x3fffffffu /* torch's step */
#define EXEC_META_VMAX     (1u << 30)  /* max_exp_avg_sq exists */
#define EXEC_META_MOMENTUM (1u << 31)  /* SGD's momentum_buffer exists */
struct exec_seg_state {
	bool given;
	uint32_t present; /* ZC_STATE_* */
	uint64_t step;    /* torch's */
};
struct exec_state_req {
	bool set;
	/* export: the step word only at each piece's first element (a
	 * checkpoint's export: the client reads no other) */
	bool sparse_meta;
	/* [world]: NULL for ranks on other nodes, and (an export on one node)
	 * for ranks that get nothing */
	float *const *staging;
	const struct exec_seg_state *segs; /* set: [every segment of the plan, in order] */
	const uint32_t *seg_first;         /* set: [nbuckets]: index of each bucket's first */
};
int exec_state(struct exec *e, const struct exec_state_req *req);
/* Loop thread: the state layout's ranges this node owns, as (slot, numel)
 * pairs in *ret (malloc'd, *ret_n words): the pieces' layout is fixed for
 * the executor's life. 0 or -ENOMEM. */
int exec_owned_ranges(const struct exec *e, uint64_t **ret, size_t *ret_n);

/* Drop what is queued, abort the collectives in flight, free the state;
 * EXEC_STOPPED says the threads are gone. Idempotent. */
void exec_stop(struct exec *e);

/* exec_stop() that keeps the state (its arena and every piece's step
 * count) for the next executor of the job, exec_take_state(): only
 * between iterations (after the last EXEC_STEP_DONE, or with no step
 * queued since), so that what is kept is one iteration's boundary. A state
 * on the devices (cuda) is copied into a host arena as the executor ends,
 * with the parameters (exec_take_params): only with keep_params. */
void exec_stop_keep(struct exec *e);
/* After EXEC_STOPPED of exec_stop_keep(): the state, now the caller's
 * (state_free), or NULL if the executor never allocated it (or could not
 * copy it off the devices). */
struct state *exec_take_state(struct exec *e);
/* The same for a state that was on the devices: the parameters, a flat
 * buffer of the plan (free()), from the owners' kept copies and masters;
 * NULL for host state (its parameters are the trainers' mapped buffers). */
void *exec_take_params(struct exec *e);

/* Join and free: after EXEC_STOPPED only. Accepts NULL. */
void exec_free(struct exec *e);

/* The timeline (zeroctl trace): while on, each op's run is recorded, and the
 * loop takes the records after each StepDone. Off, it costs a relaxed load
 * per op. Times are CLOCK_MONOTONIC microseconds. */
struct exec_span {
	enum zop_kind kind;
	uint32_t lo, hi;
	uint64_t iteration;
	int64_t start_us, end_us;
};
void exec_trace(struct exec *e, bool on);
/* Loop thread: move up to max records into out, oldest first; how many. */
size_t exec_take_spans(struct exec *e, struct exec_span *out, size_t max);

struct exec_stats {
	uint64_t reduced_elems;
	uint64_t stepped_elems;
	uint64_t bcast_elems;
};
void exec_stats(struct exec *e, struct exec_stats *ret);

#endif
