/*
 * coll.h — the collectives backend interface: one group per job on this
 * node. Collectives are asynchronous: submit() issues a request and its
 * done() callback reports the result, exactly once, from whatever thread the
 * backend completes on (it may be called before submit() returns). The
 * executor (exec/lanes.c) issues requests from its lane threads, each lane in
 * order, the same order on every node of the job (zero.c); a backend keeps
 * lanes apart (separate streams, tags or communicators) so a reduction of a
 * later bucket never waits behind an earlier broadcast.
 *
 * Lifecycle: open (off the loop thread: a rendezvous or a CUDA IPC open may
 * block) -> submit* -> [abort] -> close once nothing is in flight.
 *
 * coll/host.c: every rank on this node; reductions and copies through the
 * mapped buffers on the worker pool. coll/gloo.c: a job over several nodes,
 * summed inside each node the same way and across nodes over a mesh
 * (coll/mesh.h): gloo (TCP), or with TLS keys coll/sealmesh.c (TLS 1.3).
 * coll/nccl.c: GPUs, through NCCL (builds with the CUDA toolkit only).
 */
#ifndef ZEROD_COLL_H
#define ZEROD_COLL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "zeroclient.h"

struct pool;
struct cudabufs;
struct tls_ident;

/*
 * A key-value store every node of a job reaches, through which the nodes
 * swap their network addresses when a group opens. Pluggable: the rendezvous
 * that node 0's daemon serves, or files in a directory the test nodes share.
 * The callbacks may run on any thread, several at once, and must not block
 * past their timeout. Keys are short strings; values are opaque bytes.
 */
struct coll_store {
	void *ctx;
	/* Store a copy of value under key, replacing any. 0 or -errno. */
	int (*set)(void *ctx, const char *key, const void *value, size_t len);
	/* Wait up to timeout_ms for key to be set; then *ret_value is a malloc'd
	 * copy of its value (the caller frees it) and *ret_len its length.
	 * 0, -ETIMEDOUT, or -errno; nothing is returned on failure. */
	int (*get)(void *ctx, const char *key, int timeout_ms, void **ret_value, size_t *ret_len);
	/* Any thread, at any time: the executor stops while its group opens
	 * (exec_stop()), so every get under way and to come fails now with
	 * -ECANCELED instead of waiting for keys the other nodes may never
	 * set. NULL: gets wait their time out. */
	void (*cancel)(void *ctx);
};

/* A job spread over several nodes: where its ranks are and how this node
 * reaches the others (coll/gloo.c). Every node passes the same nnodes,
 * node_of, prefix and window; the strings and arrays are copied by open. */
struct coll_net {
	uint32_t nnodes;
	uint32_t node;           /* this node, 0..nnodes-1 */
	const uint32_t *node_of; /* [world]: the node of each rank */
	const char *host;        /* address or name this node's sockets bind to (port 0) */
	const char *iface;       /* or a network interface ("eth0"), when host is NULL */
	const char *prefix;      /* store keys start with it: fresh for every run of a job */
	const struct coll_store *store;
	uint32_t timeout_ms; /* connecting, and each network operation; 0: 30 s */
	uint64_t window;     /* elements per network round (scratch size); 0: default */
	/* the daemon's TLS identity (net/tls.h): the tensors cross the mesh
	 * over TLS (coll/sealmesh.c), not gloo's plain TCP. NULL: gloo. */
	const struct tls_ident *tls;
	bool ktls; /* the mesh asks for kernel TLS (SSL_OP_ENABLE_KTLS) */
};

/* Bytes of an NCCL unique id (NCCL_UNIQUE_ID_BYTES), so that the
 * rendezvous can carry one without including nccl.h. */
#define COLL_UNIQUE_ID_BYTES 128

/* A job's buffers on this node. */
struct coll_config {
	uint32_t world;       /* ranks in the job */
	float *const *grads;  /* [world]: each local rank's gradient buffer (NULL if remote) */
	float *const *params; /* [world]: each local rank's parameter buffer (NULL if remote) */
	struct pool *pool;
	const struct coll_net *net; /* NULL: every rank is on this node */
	char *err;                  /* optional: why open failed, in words */
	size_t errlen;
	/* nccl: the job's unique id, COLL_UNIQUE_ID_BYTES, the same on every
	 * node. NULL: the backend makes one (every rank on this node), or node
	 * 0 makes it and the others get it through net->store. Copied. */
	const void *nccl_id;
	int open_timeout_ms; /* nccl: how long open waits for every rank; <= 0: 60 s */
	/* nccl: each local rank's CUDA buffers with their interprocess event
	 * rings (cudabufs.h), [world], NULL for ranks on other nodes; open
	 * opens the events (once per plan), close closes them. NULL: none. */
	struct cudabufs *const *bufs;
	/* nccl: how long a request waits for a trainer's ready event before it
	 * fails with -ETIMEDOUT (the job's stall timeout); <= 0: 60 s */
	int ready_timeout_ms;
	/* nccl: the largest gather's gbytes (the step's; larger ones go in
	 * pieces), so its staging is sized at open; 0: 256 */
	size_t gather_bytes;
};

/* One owner's share of a bucket: flat elements [off, off + n) of the
 * bucket's dtype (plan.h: ((T *)buffer)[off]). Only coll/host.c moves
 * bf16/fp16 ranges; the others serve fp32 jobs only (struct backend's
 * low_precision). */
struct coll_range {
	uint32_t owner;
	uint64_t off;
	uint64_t n;
	enum zc_dtype dtype; /* last: {owner, off, n} initialisers stay fp32 */
};

enum coll_kind {
	/* Average the gradients of each range over all ranks; the result lands
	 * in the range owner's gradient buffer (others may be scratch). As an
	 * all-reduce (bucket mode) or a reduce-scatter (slice mode). */
	COLL_REDUCE,
	/* Copy each range from its owner's parameters into every rank's:
	 * broadcasts (bucket mode) or an all-gather (slice mode). */
	COLL_BCAST,
	/* Every node's gbytes of gin, in node order, into gout (nnodes *
	 * gbytes): the few scalars an iteration's nodes must agree on (segment
	 * masks, gradient norms, the grad scale). No ranges. gbytes is a
	 * multiple of 8. gloo; host copies (one node); nccl: an all-gather
	 * through small device staging, one at a time per group (-EBUSY). */
	COLL_GATHER,
};

struct coll_req {
	enum coll_kind kind;
	enum zc_shard_mode mode;
	unsigned lane;
	const struct coll_range *ranges; /* sorted by offset; they stay valid until done */
	uint32_t nranges;
	const void *gin; /* COLL_GATHER */
	void *gout;
	size_t gbytes;
	/* Called once with 0 or a negative code (-ECANCELED after abort). */
	void (*done)(struct coll_req *req, int status);
	/* With event rings (coll_config.bufs): before the request each local
	 * rank's stream waits on its trainer's ready events of buckets
	 * ev_lo..ev_hi for iteration ev_iter (COLL_EV_WAIT_READY), or after it
	 * records their done events (COLL_EV_RECORD_DONE). Others ignore it. */
	unsigned ev;
	uint32_t ev_lo, ev_hi;
	uint64_t ev_iter;
	/* nccl, REDUCE: zero these byte ranges of local ranks' gradient
	 * buffers first (segments those ranks marked unused), on their
	 * streams after the ready events, so a trainer's late write cannot land
	 * after the zeros. The host backends get none (exec/step.c zeroes host
	 * buffers itself). */
	const struct coll_zero *zero;
	uint32_t nzero;
};

struct coll_zero {
	uint32_t rank; /* a local rank */
	uint64_t off;  /* bytes into its gradient buffer */
	uint64_t bytes;
};

#define COLL_EV_WAIT_READY  1u
#define COLL_EV_RECORD_DONE 2u

struct coll_group;

struct coll_ops {
	const char *name;
	/* The daemon sums this node's buffers itself, so a job whose ranks
	 * are all here needs no collective for its reductions (zero.h). */
	bool local_fuse;
	/* The group's collectives must be launched in one order on every node
	 * (NCCL: communicators that share a device run their kernels in launch
	 * order, so two nodes launching two lanes' collectives in different
	 * orders deadlock). The executor then launches a collective only once
	 * every earlier op of the job has launched its own (lanes.c). */
	bool ordered_launch;
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
	/* Optional (may be NULL): why the last request of `lane` failed, in
	 * words ("" if it did not). Call it after that request's done(), from
	 * the lane's thread or once the lane has stopped. */
	const char *(*last_error)(struct coll_group *g, unsigned lane);
};

extern const struct coll_ops coll_host_ops;
/* Only in builds with gloo (ZEROD_HAVE_GLOO). */
extern const struct coll_ops coll_gloo_ops;
extern const struct coll_ops coll_nccl_ops; /* builds with CUDA only */

#endif
