/*
 * coll.h — the collectives backend interface: one group per job on this
 * node. Collectives are asynchronous: submit() issues a request and its
 * done() callback reports the result, exactly once, from whatever thread the
 * backend completes on (it may be called before submit() returns). The
 * executor (exec.c) issues requests from its lane threads, each lane in
 * order, the same order on every node of the job (zero.c); a backend keeps
 * lanes apart (separate streams, tags or communicators) so a reduction of a
 * later bucket never waits behind an earlier broadcast.
 *
 * Lifecycle: open (off the loop thread: a rendezvous or a CUDA IPC open may
 * block) -> submit* -> [abort] -> close once nothing is in flight.
 *
 * coll/host.c: every rank on this node; reductions and copies through the
 * mapped buffers on the worker pool. coll/nccl.c: GPUs, through NCCL (builds
 * with the CUDA toolkit only). Across nodes (gloo) the same table is
 * implemented again.
 */
#ifndef ZEROD_COLL_H
#define ZEROD_COLL_H

#include <stdbool.h>
#include <stdint.h>

#include "zeroclient.h"

struct pool;

/* Bytes of an NCCL unique id (NCCL_UNIQUE_ID_BYTES), so that the
 * rendezvous can carry one without including nccl.h. */
#define COLL_UNIQUE_ID_BYTES 128

/* A job's buffers on this node. */
struct coll_config {
	uint32_t world;       /* ranks in the job */
	float *const *grads;  /* [world]: each local rank's gradient buffer (NULL if remote) */
	float *const *params; /* [world]: each local rank's parameter buffer (NULL if remote) */
	struct pool *pool;
	/* nccl: the job's unique id, COLL_UNIQUE_ID_BYTES, the same on every
	 * node (the rendezvous hands it out); NULL when every rank is on this
	 * node: the backend makes one. Copied. */
	const void *nccl_id;
	int open_timeout_ms; /* nccl: how long open waits for every rank; <= 0: 60 s */
};

/* One owner's share of a bucket: flat elements [off, off + n). */
struct coll_range {
	uint32_t owner;
	uint64_t off;
	uint64_t n;
};

enum coll_kind {
	/* Average the gradients of each range over all ranks; the result lands
	 * in the range owner's gradient buffer (others may be scratch). As an
	 * all-reduce (bucket mode) or a reduce-scatter (slice mode). */
	COLL_REDUCE,
	/* Copy each range from its owner's parameters into every rank's:
	 * broadcasts (bucket mode) or an all-gather (slice mode). */
	COLL_BCAST,
};

struct coll_req {
	enum coll_kind kind;
	enum zc_shard_mode mode;
	unsigned lane;
	const struct coll_range *ranges; /* sorted by offset; they stay valid until done */
	uint32_t nranges;
	/* Called once with 0 or a negative code (-ECANCELED after abort). */
	void (*done)(struct coll_req *req, int status);
};

struct coll_group;

struct coll_ops {
	const char *name;
	/* The daemon sums this node's buffers itself, so a job whose ranks
	 * are all here needs no collective for its reductions (zero.h). */
	bool local_fuse;
	/* Create the job's group once every local buffer is mapped. May block
	 * (never on the loop thread). cfg's arrays are copied. -EOPNOTSUPP if
	 * this backend cannot serve the job's topology. */
	int (*open)(const struct coll_config *cfg, struct coll_group **ret);
	/* Issue a request. < 0: not issued, done() will not be called. */
	int (*submit)(struct coll_group *g, struct coll_req *req);
	/* Any thread: requests in flight and later ones end soon with
	 * -ECANCELED (a peer is gone, the job failed). Never calls a done()
	 * itself: the caller may hold the lock its done() callbacks take. */
	void (*abort)(struct coll_group *g);
	/* Free the group. Accepts NULL. Nothing may be in flight. */
	void (*close)(struct coll_group *g);
};

extern const struct coll_ops coll_host_ops;
extern const struct coll_ops coll_nccl_ops; /* builds with CUDA only */

#endif
