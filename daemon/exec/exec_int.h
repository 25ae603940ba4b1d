/*
 * exec_int.h — what the files of the executor share (exec.c, lanes.c,
 * start.c, step.c, xfer.c): the executor itself, its op records and its
 * lanes. Everything outside daemon/exec/ sees only exec.h. Each function
 * says which thread runs it: the loop thread queues, the lanes run.
 */
#ifndef ZEROD_EXEC_INT_H
#define ZEROD_EXEC_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "exec/exec.h"

#define EXEC_SPANS 1024 /* op records kept between two takes */

enum xop_type {
	XOP_START,
	XOP_HYPER,
	XOP_PROG,
	XOP_RELOAD, /* zc_params_changed(): the masters from the owners' parameters */
	XOP_STATE,
};

struct xop {
	enum xop_type type;
	const struct zop *z; /* XOP_PROG */
	uint64_t iteration;
	uint64_t seq;
	uint64_t dep[LANE_COUNT];
	struct zc_param_group *groups; /* XOP_HYPER */
	struct exec_state_req st;      /* XOP_STATE */
	struct exec_done *done;        /* what to post when it succeeds, if anything */
	struct xop *next;
};

struct lane {
	struct exec *e;
	unsigned idx;
	pthread_t thread;
	pthread_cond_t cv; /* this lane has work, a dependency or its collective is done */
	struct xop *head, *tail;
	uint64_t done_seq; /* ops of this lane up to this number are finished */
	/* the op it runs, until that op has launched its last collective or
	 * finished (0: none); lanes.c's launch order (coll_ops.ordered_launch) */
	uint64_t cur_seq;
	bool pass_on_submit; /* the op's one collective: its turn passes once launched */
	/* the collective in flight on this lane */
	struct coll_req req;
	bool req_done;
	int req_status;
	/* the op's event work (coll_req.ev...), set by op_prog for the nccl
	 * backend's event rings; 0 otherwise */
	unsigned ev;
	uint32_t ev_lo, ev_hi;
	uint64_t ev_iter;
	/* device buffers: the marked gradients the op's REDUCE zeroes */
	struct coll_zero *zero;
	uint32_t nzero, zcap;
};

struct exec {
	struct exec_config cfg; /* own copies of grads and params */
	struct exec_recover recover; /* cfg.recover's copy (cfg.recover points here) */
	uint32_t *local;        /* the local ranks, ascending */
	uint32_t nlocal;
	struct coll_range *ranges;      /* [nunits]: the shard units, flat */
	struct coll_range *init_ranges; /* [nbuckets]: each bucket whole, from rank 0 */
	struct coll_group *cg;
	struct optim_ctx *oc;
	struct mem_map **gmaps, **pmaps; /* [world]: what the start op opened (cfg.mem) */
	struct zc_param_group *groups; /* compute lane */
	struct xop *xops;              /* [prog->nops] */
	uint64_t *last;                /* [nbuckets][LANE_COUNT]: last op touching b per lane */

	pthread_mutex_t mu; /* one lock; each lane sleeps on its own cv, so a tiny
			     * bucket wakes one thread, not three */
	struct lane lanes[LANE_COUNT];
	unsigned nthreads, alive;
	uint64_t seq;
	uint32_t remaining;          /* ops of the current iteration not yet finished */
	struct exec_done *step_done; /* the current iteration's */
	struct exec_done *fail_done, *stop_done;
	bool stopping, failed, silent;
	bool keep_state;    /* exec_stop_keep(): the state outlives the executor */
	void *kept_params;  /* ... and, off the devices, the parameters (exec_take_params) */
	char open_err[256]; /* why the collectives could not open, from the backend */
	char step_err[256]; /* why a step failed (an edit without zc_params_changed()) */
	char coll_err[256]; /* why the first collective failed, the backend's words */

	_Atomic uint64_t reduced, stepped, bcast;

	/* Segment masks and the at_end gradient passes (exec_bucket_ex). The
	 * loop writes a bucket's entries under mu before queueing its ops; the
	 * lanes read them while those run. Iterations do not overlap, so a
	 * bucket's entries are not rewritten while its ops may read them. */
	uint32_t nsegs;
	uint32_t *seg_first;     /* [nbuckets + 1] */
	uint32_t *used;          /* [nsegs]: local ranks that gave the segment a gradient */
	uint32_t *gused;         /* [nsegs]: the same over every node (compute lane) */
	struct exec_zero **zero; /* [nbuckets]: gradients to zero before the reduction */
	uint32_t *nzero;         /* [nbuckets] */
	bool has_scale;          /* the iteration's grad scale */
	double inv_scale;
	double *gbuf;            /* gather scratch: (1 + nnodes) parts (compute lane) */
	size_t gbuf_cap;         /* doubles */
	char sem_err[256];       /* why a step refused (ZC_EHYPER), for the failure */

	/* the timeline, while on: a ring of op records, under mu */
	atomic_bool tracing;
	struct exec_span spans[EXEC_SPANS];
	size_t span_head, span_n;
};

/* ---- the lane engine (lanes.c) ---- */

/* A lane: issue one collective and wait for it (this lane's ops run in
 * order); every node's n doubles into e->gbuf + n (a gather); the gather
 * scratch for n doubles of this node and as many of each node. */
int lane_coll(struct exec *e, struct lane *ln, enum coll_kind kind, enum zc_shard_mode mode,
	      const struct coll_range *rg, uint32_t n);
int lane_gather(struct exec *e, struct lane *ln, size_t n, double **ret_all);
int gbuf_reserve(struct exec *e, size_t n);
/* A lane's thread (exec_new starts one per lane). */
void *lane_main(void *arg);
/* Free an op's completion record, and the op itself with its groups unless
 * it is a program op (those live in e->xops). */
void xop_release(struct xop *o);

/* ---- the start op (start.c) ---- */

/* A lane: open the backends and the buffers, allocate the state, give
 * every rank rank 0's parameters. */
int op_start(struct exec *e, struct lane *ln);
/* Off the loop thread: unmap what the start opened (none: nothing). */
void close_buffers(struct exec *e);

/* ---- the program's ops and the step (step.c) ---- */

/* A lane: run op z of iteration t. */
int op_prog(struct exec *e, struct lane *ln, const struct zop *z, uint64_t t);
/* A lane: the bf16/fp16 pieces' masters from their owners' parameters
 * (edits_only: only the pieces whose parameters were edited). */
int load_masters(struct exec *e, bool edits_only);
/* The last lane, as an executor of exec_stop_keep() on a state the backend
 * keeps ends (before oc closes): the state into a host arena and the
 * parameters into e->kept_params (start.c). 0 or a negative code (then
 * nothing is kept). */
int state_off_devices(struct exec *e, struct optim_ctx *oc);
/* A recovery's old buffers, once read (exec_recover.release): unmapped
 * (start.c; exec_free() if the start never ran). */
void release_recovered(struct exec *e);

/* ---- state export/import (xfer.c) ---- */

/* A lane, between iterations: exec_state()'s request. */
int xfer_export(struct exec *e, struct lane *ln, const struct exec_state_req *rq);
int xfer_import(struct exec *e, struct lane *ln, const struct exec_state_req *rq);

#endif
