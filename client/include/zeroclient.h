/*
 * zeroclient.h — the public C API of libzeroclient, the trainer side of zerod.
 *
 * A trainer process (one rank of a data-parallel job) connects to the zerod of
 * its node, allocates its gradient and parameter buffers through the library
 * (POSIX shared memory the daemon maps), registers the job's plan, and then,
 * during each backward pass, hands every gradient bucket to the daemon with
 * zc_bucket_ready(). The daemon averages the bucket over all ranks, runs the
 * sharded optimizer step and writes the updated parameters back into every
 * rank's parameter buffer; futures report each of those completions.
 *
 * Conventions (as libuv / systemd):
 *  - every int-returning function returns >= 0 on success and a negative code
 *    on failure: -errno for system errors, a ZC_E... code below otherwise;
 *    zc_strerror() names both;
 *  - out-parameters are named ret_* and are written only on success;
 *  - destructors accept NULL;
 *  - the library never logs and never calls exit().
 *
 * Threads: a zc_client and the futures it returned may be used from several
 * threads; calls are serialised by a mutex inside the client. Blocking calls
 * (zc_register_plan, zc_future_wait) release that mutex while they wait, so
 * another thread may call zc_bucket_ready() meanwhile. zc_close() must not
 * race with any other call on the same client.
 */
#ifndef ZEROCLIENT_H
#define ZEROCLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Protocol version spoken by this library; a daemon speaking another one
 * answers ZC_EVERSION. */
#define ZC_PROTOCOL_VERSION 1

/*
 * The error list. X(name, value, text): value is the negative code returned
 * by the API; the protocol's ErrorCode enum (proto/zerod.proto) mirrors it
 * with the positive value (a unit test keeps the two in step).
 */
#define ZC_ERRORS(X)                                                                               \
	X(EPROTO, -1001, "malformed or unexpected message")                                        \
	X(EVERSION, -1002, "protocol version mismatch")                                            \
	X(EPLANINVAL, -1003, "invalid plan")                                                       \
	X(EPLANMISMATCH, -1004, "plan differs between ranks")                                      \
	X(ESIZE, -1005, "buffer size does not match the plan")                                     \
	X(EBUCKET, -1006, "unknown bucket index")                                                  \
	X(EORDER, -1007, "bucket out of order")                                                    \
	X(EDUPBUCKET, -1008, "duplicate bucket in this iteration")                                 \
	X(EEARLY, -1009, "bucket of the next iteration before the step completed")                 \
	X(ERANK, -1010, "invalid rank or world size")                                              \
	X(EDUPRANK, -1011, "rank already connected to this job")                                   \
	X(EWORLD, -1012, "world size differs between ranks")                                       \
	X(ERANKDEAD, -1013, "a trainer of the job died")                                           \
	X(ETIMEDOUT, -1014, "timed out")                                                           \
	X(ESHUTDOWN, -1015, "daemon shutting down")                                                \
	X(EJOBFAILED, -1016, "the job failed earlier")                                             \
	X(ESTATE, -1017, "call not valid in this state")                                           \
	X(EHYPER, -1018, "hyperparameter change rejected")                                         \
	X(ENOTSUP, -1019, "not supported by this daemon")                                          \
	X(ELIMIT, -1020, "daemon limit exceeded")                                                  \
	X(EMAP, -1021, "daemon cannot map the shared buffer")                                      \
	X(ECONNECT, -1022, "cannot reach the daemon")                                              \
	X(EINTERNAL, -1023, "internal daemon error")

enum zc_error {
#define ZC__ERROR_ENUM(name, value, text) ZC_##name = (value),
	ZC_ERRORS(ZC__ERROR_ENUM)
#undef ZC__ERROR_ENUM
};

/* Text for any code returned by this API (ZC_E... or -errno). Never NULL.
 * Ownership: a static string; do not free it.
 * Threads: any thread.  Blocking: no. */
const char *zc_strerror(int code);

/* Symbolic name ("ZC_EORDER", "ENOENT", ...) for a code; "ZC_EUNKNOWN" for
 * an unknown code.
 * Ownership: a static string; do not free it.
 * Threads: any thread.  Blocking: no. */
const char *zc_strerror_name(int code);

/* ---------------------------------------------------------------- plan --- */

enum zc_optimizer {
	ZC_OPT_SGD = 1,   /* torch.optim.SGD */
	ZC_OPT_ADAM = 2,  /* torch.optim.Adam */
	ZC_OPT_ADAMW = 3, /* torch.optim.AdamW */
};

enum zc_shard_mode {
	/* all-reduce each bucket; the bucket's owner steps it and broadcasts it.
	 * Owners: size-balanced and deterministic; large buckets may be split. */
	ZC_SHARD_BUCKET = 1,
	/* reduce-scatter each bucket; every rank steps its own 1/W; all-gather. */
	ZC_SHARD_SLICE = 2,
};

enum zc_step_mode {
	ZC_STEP_INTERLEAVED = 1, /* step each bucket as soon as it is reduced */
	ZC_STEP_AT_END = 2,      /* step every bucket after the last one is reduced */
};

/* Hyperparameters of one parameter group, with torch's meaning and defaults
 * (ZC_PARAM_GROUP_INIT). Fields an optimizer does not use are ignored. */
struct zc_param_group {
	double lr;
	double momentum, dampening; /* SGD */
	double weight_decay;        /* SGD, Adam: L2 into the gradient; AdamW: decoupled */
	double beta1, beta2, eps;   /* Adam, AdamW */
	bool nesterov;              /* SGD */
	bool amsgrad;               /* Adam, AdamW */
	bool maximize;              /* all */
};

#define ZC_PARAM_GROUP_INIT                                                                        \
	{                                                                                          \
		.lr = 1e-3, .momentum = 0, .dampening = 0, .weight_decay = 0, .beta1 = 0.9,        \
		.beta2 = 0.999, .eps = 1e-8, .nesterov = false, .amsgrad = false,                  \
		.maximize = false                                                                  \
	}

/* A contiguous run of one parameter group inside a bucket, in elements. */
struct zc_segment {
	uint64_t offset; /* from the start of the bucket */
	uint64_t numel;
	uint32_t group; /* index into zc_plan.groups */
};

/* One gradient bucket: numel fp32 elements, tiled exactly by its segments
 * (in offset order, no gap, no overlap). */
struct zc_bucket {
	uint64_t numel;
	uint32_t nsegments;
	const struct zc_segment *segments;
};

/* The whole layout + optimizer of a job. Every rank must declare the same
 * plan; a difference is ZC_EPLANMISMATCH naming the rank and the field.
 * Buckets are numbered in the order backward produces them. */
struct zc_plan {
	enum zc_optimizer optimizer;
	enum zc_shard_mode shard_mode;
	enum zc_step_mode step_mode;
	uint32_t ngroups;
	const struct zc_param_group *groups;
	uint32_t nbuckets;
	const struct zc_bucket *buckets;
};

/* ------------------------------------------------------------- connect --- */

typedef struct zc_client zc_client;
typedef struct zc_future zc_future;

/* Connection settings. Zero-initialise (ZC_CONFIG_INIT) and fill in. */
struct zc_config {
	const char *socket;     /* daemon socket path; NULL: $ZEROD_SOCKET, else
				   $XDG_RUNTIME_DIR/zerod/zerod.sock, else /run/zerod/zerod.sock */
	const char *job_id;     /* 1..64 chars of [A-Za-z0-9._-] */
	uint32_t rank;          /* group rank of this trainer, < world_size */
	uint32_t world_size;    /* ranks in the job */
	uint32_t local_rank;    /* rank on this node, < local_size */
	uint32_t local_size;    /* ranks of the job on this node */
	int connect_timeout_ms; /* zc_connect: the daemon's answer; 0: 30000 */
	char *error_text;       /* optional: zc_connect copies the reason of a failure here */
	size_t error_text_len;
	int register_timeout_ms; /* zc_register_plan: every rank's plan; 0: connect's */
	/* A job over several nodes (one zerod each): every rank of the job
	 * names the same rendezvous, node count and secret, and the ranks of
	 * one node the same node index. The zerod of node 0 serves the
	 * rendezvous on that port; the others join it, proving they know the
	 * secret without sending it. zc_register_plan() completes once every
	 * node has joined with the same plan. */
	const char *rdzv;       /* "host:port" (like MASTER_ADDR:MASTER_PORT); NULL: $ZEROD_RDZV;
				   unset or "": every rank is on this node */
	uint32_t nnodes;        /* nodes in the job; 0: $ZEROD_NNODES */
	uint32_t node_rank;     /* this node's index 0..nnodes-1, when has_node_rank */
	bool has_node_rank;     /* false: $ZEROD_NODE_RANK if set, else derived: node 0 holds
				   rank 0, the others follow in the order of their lowest rank */
	const char *job_secret; /* the job's shared secret (with rdzv: required); NULL:
				   $ZEROD_JOB_SECRET. Sent only to this node's zerod */
};

#define ZC_CONFIG_INIT                                                                             \
	{                                                                                          \
		0                                                                                  \
	}

/*
 * Connect to the daemon and join job cfg->job_id as cfg->rank (the Hello
 * handshake, which checks the protocol version).
 * Ownership: cfg is only read; *ret_client belongs to the caller, released
 *            with zc_close().
 * Threads:   any thread.
 * Blocking:  up to cfg->connect_timeout_ms waiting for the daemon's answer;
 *            -EACCES at once if this user may not use the socket. Job ids are
 *            per user: ranks of one job run under one uid.
 */
int zc_connect(const struct zc_config *cfg, zc_client **ret_client);

/*
 * Leave the job (Goodbye) and free the client and its buffers.
 * Ownership: frees c; futures still held by the caller stay valid (pending
 *            ones fail with ZC_ESTATE) and are still freed with
 *            zc_future_free(). Accepts NULL.
 * Threads:   no other call on c may run or follow.
 * Blocking:  at most ~200 ms for the goodbye to leave.
 */
void zc_close(zc_client *c);

/* ------------------------------------------------------------- buffers --- */

/*
 * Allocate this rank's gradient and parameter buffers for plan: POSIX shared
 * memory (mode 0600, zero-filled) that the daemon maps when the plan is
 * registered. May be called once per client.
 * Ownership: plan is validated and copied (ZC_EPLANINVAL, reason in
 *            zc_error_message()); the buffers belong to c.
 * Threads:   any thread.  Blocking: no.
 */
int zc_alloc_buffers(zc_client *c, const struct zc_plan *plan);

/*
 * Base of bucket b's gradient / parameter buffer (numel fp32 elements); NULL
 * if b is out of range or no buffers are allocated. The trainer writes
 * gradients before zc_bucket_ready(b) and not again until the iteration's
 * step future completed (the daemon may read them until then, and where the
 * reduction comes before the step, as in ZC_STEP_AT_END, it leaves the
 * average of the ranges a rank owns in that rank's gradient buffer). The
 * daemon writes parameters, which are stable once the iteration's step
 * future completed; the trainer may change them between iterations (the
 * same on every rank), and the next step starts from its values.
 * Ownership: the memory belongs to c, valid from zc_alloc_buffers() until
 *            zc_close().
 * Threads:   any thread.  Blocking: no.
 */
float *zc_grad_buffer(zc_client *c, uint32_t bucket);
float *zc_param_buffer(zc_client *c, uint32_t bucket);

/*
 * Register the plan of zc_alloc_buffers() with the daemon and wait until every
 * rank of the job has registered the same plan. The daemon starts from rank
 * 0's parameter buffers (fill them first): on success every rank's parameter
 * buffers hold rank 0's values and the optimizer state is fresh. First, if
 * the daemon offers it and $ZEROD_FASTPATH is not "0", the fast path is set
 * up: a shared ring that carries the buckets and their completions from then
 * on (without it, everything goes over the ZeroMQ socket). Errors:
 * ZC_EPLANMISMATCH, ZC_ESIZE, ZC_EMAP, ZC_ETIMEDOUT... with the daemon's
 * reason in zc_error_message().
 * Ownership: nothing changes hands.
 * Threads:   any thread; other calls on c may run while it waits.
 * Blocking:  up to register_timeout_ms.
 */
int zc_register_plan(zc_client *c);

/* ----------------------------------------------------------- iteration --- */

/*
 * Hand bucket b of the current iteration to the daemon. Buckets go in order
 * 0, 1, 2, ... each iteration; after the last one the client moves on to the
 * next iteration, whose bucket 0 waits until this iteration's step future
 * completed. A bucket out of order is refused here, with nothing sent and
 * nothing changed: ZC_EORDER (one is skipped), ZC_EDUPBUCKET (already handed
 * over), ZC_EBUCKET (no such bucket), ZC_EEARLY (the step of the previous
 * iteration is still running); zc_error_message() says which. Should the
 * daemon refuse a bucket the client let through, client and daemon disagree
 * on the iteration, and every future fails with the daemon's code.
 * Ownership: *ret_future (NULL if not wanted) belongs to the caller, freed
 *            with zc_future_free(); it completes when bucket b is averaged
 *            over all ranks (BucketDone).
 * Threads:   any thread.  Blocking: no (one ring slot or one message; both
 *            hold two iterations of the largest plan). -EAGAIN if the ring
 *            is full, which only a daemon that stopped taking buckets lets
 *            happen.
 */
int zc_bucket_ready(zc_client *c, uint32_t bucket, zc_future **ret_future);

/*
 * Future of iteration's step: completes when every parameter update of that
 * iteration has landed in every local rank's parameter buffer (StepDone). It
 * may be asked for before, during or after the iteration; one for an
 * iteration already complete is already done. An iteration after
 * zc_iteration() has not begun: ZC_ESTATE.
 * Ownership: *ret_future belongs to the caller (zc_future_free()).
 * Threads:   any thread.  Blocking: no.
 */
int zc_step_future(zc_client *c, uint64_t iteration, zc_future **ret_future);

/*
 * Iteration the next zc_bucket_ready() belongs to: 0 first, moving on after
 * the last bucket of an iteration is handed over.
 * Ownership: nothing changes hands.
 * Threads:   any thread.  Blocking: no.
 */
uint64_t zc_iteration(zc_client *c);

/*
 * Change group's hyperparameters from the next iteration this rank has not
 * started (an LR schedule, say). Every rank makes the same call; other values
 * for the same iteration from another rank are ZC_EHYPER. Invalid values are
 * refused here with ZC_EHYPER, and so are values that need optimizer state
 * the plan's groups did not (momentum where every group had none, amsgrad
 * where no group had it: the daemon sized the state from the plan). A
 * refusal by the daemon shows in zc_last_error().
 * Ownership: hp is copied.
 * Threads:   any thread.  Blocking: no (one message).
 */
int zc_set_hyper(zc_client *c, uint32_t group, const struct zc_param_group *hp);

/*
 * The daemon's explanation of the last error a call on c returned (which
 * field of the plan differs, which rank is missing...); "" if none.
 * Ownership: the string belongs to c, valid until the next call on c.
 * Threads:   read it on the thread that got the error.  Blocking: no.
 */
const char *zc_error_message(zc_client *c);

/*
 * First error the daemon reported to this client that no future carried (0
 * if none): a refused zc_set_hyper(), a bad bucket handed over without a
 * future, or the job's failure.
 * Ownership: nothing changes hands (the text is zc_error_message()'s).
 * Threads:   any thread.  Blocking: no (processes messages that arrived).
 */
int zc_last_error(zc_client *c);

/* -------------------------------------------------------------- futures --- */

/*
 * Poll: 1 done, 0 pending, < 0 failed with that code (the daemon's reason in
 * zc_future_message()).
 * Ownership: f stays the caller's.
 * Threads:   any thread.  Blocking: no (processes messages that arrived).
 */
int zc_future_poll(zc_future *f);

/*
 * Wait up to timeout_ms (< 0: without limit) for f: 1 done, 0 still pending
 * when the time ran out, < 0 failed with that code.
 * Ownership: f stays the caller's.
 * Threads:   any thread; c's lock is not held while sleeping.
 * Blocking:  up to timeout_ms.
 */
int zc_future_wait(zc_future *f, int timeout_ms);

/*
 * The daemon's reason for a failed future (names the rank, bucket, ...); ""
 * if none.
 * Ownership: the string belongs to f, valid until zc_future_free(f).
 * Threads:   any thread.  Blocking: no.
 */
const char *zc_future_message(zc_future *f);

/*
 * Free a future, pending or not. Accepts NULL.
 * Ownership: frees f.  Threads: not while another thread waits on f.
 * Blocking:  no.
 */
void zc_future_free(zc_future *f);

/*
 * A file descriptor for the caller's own event loop: it turns readable when
 * messages from the daemon may have arrived; then call zc_dispatch() and check
 * the futures with zc_future_poll(). Like ZMQ_FD, it signals changes, not
 * levels: call zc_dispatch() after every wake-up before sleeping again.
 * Ownership: the fd belongs to c; do not read, write or close it.
 * Threads:   any thread.  Blocking: no.
 */
int zc_fd(zc_client *c);

/*
 * Process every message that has arrived: completes futures. Returns how many
 * were processed (>= 0) or a negative code.
 * Ownership: nothing changes hands.
 * Threads:   any thread.  Blocking: no.
 */
int zc_dispatch(zc_client *c);

#ifdef __cplusplus
}
#endif

#endif /* ZEROCLIENT_H */
