/*
 * zeroclient.h — the public C API of libzeroclient, the trainer side of zerod.
 *
 * A trainer process (one rank of a data-parallel job) connects to the zerod of
 * its node, hands over its gradient and parameter buffers (memory it owns, a
 * memfd the daemon maps: zc_register_buffers(), or one the library makes:
 * zc_alloc_buffers()), registers the job's plan, and then,
 * during each backward pass, hands every gradient bucket to the daemon with
 * zc_bucket_ready(). The daemon averages the bucket over all ranks, runs the
 * sharded optimizer step and writes the updated parameters back into every
 * rank's parameter buffer; futures report each of those completions.
 *
 * Conventions (as libuv / systemd):
 *  - every int-returning function returns >= 0 on success and a negative code
 *    on failure: -errno for system errors, a ZC_E... code below otherwise;
 *    zc_strerror() names both;
 *  - every call that fails leaves one reason, for the thread that made the
 *    call, in zc_error_message();
 *  - a NULL handle is an error (-EINVAL), never a crash; the few functions
 *    that cannot return an error say what they return for NULL;
 *  - out-parameters are named ret_* and are written only on success;
 *  - destructors accept NULL;
 *  - the library never logs and never calls exit().
 *
 * Threads: a zc_client and the futures it returned may be used from several
 * threads; calls are serialised by a mutex inside the client. Blocking calls
 * (zc_connect, zc_alloc_buffers, zc_register_buffers, zc_register_plan,
 * zc_future_wait) do not hold that mutex while they sleep, so another thread
 * may call zc_bucket_ready() meanwhile.
 * zc_close() must not race with any other call on the same client.
 *
 * This header is over 1,200 lines: it is the API's reference, every call's
 * contract written beside its declaration.
 *
 * fork(): a client belongs to the process that connected it. In a child
 * forked after zc_connect() (a DataLoader worker, say) every call on that
 * client or its futures fails with ZC_EFORKED and touches nothing of the
 * parent's session: it sends nothing, reads nothing, takes no lock the parent
 * may have held. zc_close() and zc_future_free() in the child release nothing
 * (the child's copy of their memory stays, and its copies of the client's
 * file descriptors, all close-on-exec, until it execs or exits). The child
 * keeps the parent's gradient and parameter buffers mapped (MAP_SHARED: a
 * write there is a write into the parent's buffers, so only read them); the
 * fast-path ring is not mapped in the child at all. A child may zc_connect()
 * a client of its own.
 */
#ifndef ZEROCLIENT_H
#define ZEROCLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The version of this header. The library's major version is its soname
 * (libzeroclient.so.1): within one major, a binary built against an older
 * header runs with a newer library (see "ABI" below). */
#define ZC_VERSION_MAJOR 1
#define ZC_VERSION_MINOR 0
#define ZC_VERSION_PATCH 0
#define ZC_VERSION       (ZC_VERSION_MAJOR * 10000 + ZC_VERSION_MINOR * 100 + ZC_VERSION_PATCH)

/* ZC_VERSION of the library loaded at run time (the header it was built
 * from), which may be newer than the header the caller was built against.
 * Threads: any thread.  Blocking: no. */
unsigned zc_version(void);

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
	X(EINTERNAL, -1023, "internal daemon error")                                               \
	X(EFORKED, -1024, "client used in a child process after fork")                             \
	X(EBUFFER, -1025, "buffer fd refused")                                                     \
	X(ESEGMASK, -1026, "segment mask out of range")                                            \
	X(EREPLAN, -1027, "re-plan changes the parameters")                                        \
	X(ESTATEINVAL, -1028, "invalid optimizer state")                                           \
	X(EPARAMEDIT, -1029, "low-precision parameters edited without zc_params_changed()")        \
	X(ECKPT, -1030, "checkpoint refused: missing, corrupt, partial or incompatible")           \
	X(ESHAREDPARAMS, -1032, "parameter buffer not the one the job's local ranks share")        \
	X(ERANKLOST, -1033, "a trainer of the job died; the job waits for its ranks to rejoin")

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

/*
 * 1 if code says the job lives on without this connection: ZC_ERANKLOST, a
 * trainer of the job died and zerod keeps the job's optimizer state and
 * parameters for --rejoin-timeout. The rank closes its client and it (or
 * its restarted worker group: torchrun --max-restarts) connects again with
 * the same job id; zc_register_plan() then goes on from the job's last
 * iteration boundary (zc_recovered()). 0 for any other code: a fatal one
 * sends the job to its disk checkpoint (zc_restore()).
 * Threads: any thread.  Blocking: no.
 */
int zc_error_recoverable(int code);

/*
 * The reason for the latest error a zc_ call made on this thread returned
 * (which field of the plan differs, which rank is missing, which argument was
 * NULL...); "" if no call on this thread has failed yet. A call that succeeds
 * leaves it as it was (as errno).
 * Ownership: a thread-local string of the library; valid until the next call
 * on this thread fails.
 * Threads: each thread reads its own.  Blocking: no.
 */
const char *zc_error_message(void);

/* ----------------------------------------------------------------- ABI --- */

/*
 * Every struct a caller fills in starts with `size`: the sizeof the caller
 * was built with, written by its init function (zc_plan_init(&p, sizeof(p)))
 * or its ZC_..._INIT initialiser. The library reads a caller's struct through
 * that size:
 *  - a field that does not lie wholly inside `size` was unknown to the caller
 *    (an older zeroclient.h) and takes its default, the value the init
 *    function writes (like a key missing from a torch param group). Fields
 *    added in later versions default to 0, which keeps the older behaviour;
 *  - bytes past the fields this library knows must be zero, else -E2BIG: the
 *    caller asks for something this library cannot do (it was built against
 *    a newer zeroclient.h);
 *  - a size below 4 (not initialised) is -EINVAL, a size above 4096 -E2BIG.
 * Arrays (zc_plan.groups, zc_plan.buckets, zc_bucket.segments) are read with
 * the stride of their first element's size, and every element must carry
 * that size: an array of an older caller's smaller structs is read as such.
 * The layouts below have no implicit padding; `reserved` fields must be 0.
 *
 * The init functions write the defaults into the first `size` bytes of the
 * struct (zeroes past the fields they know) and `size` into its size field;
 * they never write past `size`. They return 0, or -EINVAL / -E2BIG for a size
 * out of range (the struct is then untouched).
 * Threads: any thread.  Blocking: no.
 */
#define ZC_STRUCT_MAX_SIZE 4096

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
 * (zc_param_group_init, ZC_PARAM_GROUP_INIT). Fields an optimizer does not
 * use are ignored. 72 bytes in this version (64 before max_grad_norm). */
struct zc_param_group {
	uint32_t size;       /* sizeof(struct zc_param_group) the caller was built with */
	bool nesterov;       /* SGD */
	bool amsgrad;        /* Adam, AdamW */
	bool maximize;       /* all */
	uint8_t reserved;    /* 0 */
	double lr;           /* 1e-3 */
	double momentum;     /* SGD: 0 */
	double dampening;    /* SGD: 0 */
	double weight_decay; /* 0. SGD, Adam: L2 into the gradient; AdamW: decoupled */
	double beta1, beta2; /* Adam, AdamW: 0.9, 0.999 */
	double eps;          /* Adam, AdamW: 1e-8 */
	/* 0: none. Else clip this group's averaged gradient (every shard, every
	 * node) as torch.nn.utils.clip_grad_norm_(group's params, max_grad_norm)
	 * would before the step: total = 2-norm over the group, the gradient
	 * multiplied by min(max_grad_norm / (total + 1e-6), 1). Needs
	 * ZC_STEP_AT_END and no zc_plan.max_grad_norm (ZC_EPLANINVAL, or
	 * ZC_EHYPER from zc_set_hyper(), otherwise). */
	double max_grad_norm;
};

#define ZC_PARAM_GROUP_INIT                                                                        \
	{                                                                                          \
		.size = sizeof(struct zc_param_group), .lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999,   \
		.eps = 1e-8                                                                        \
	}

int zc_param_group_init(struct zc_param_group *g, size_t size);

/* A contiguous run of one parameter group inside a bucket, in elements.
 * 32 bytes in this version.
 * param_id names the parameter (or flat run of parameters) across re-plans
 * (zc_register_plan() again, below): nonzero ids must be unique within a
 * plan (else ZC_EPLANINVAL); with every id of a plan nonzero, a re-plan
 * matches segments by id, otherwise by position in plan order (bucket 0's
 * segments first). Part of the plan: ranks must agree on it. */
struct zc_segment {
	uint32_t size;   /* sizeof(struct zc_segment) the caller was built with */
	uint32_t group;  /* index into zc_plan.groups */
	uint64_t offset; /* from the start of the bucket */
	uint64_t numel;
	uint64_t param_id; /* 0: identity by position */
};

#define ZC_SEGMENT_INIT                                                                            \
	{                                                                                          \
		.size = sizeof(struct zc_segment)                                                  \
	}

int zc_segment_init(struct zc_segment *s, size_t size);

/*
 * Element type of a bucket's parameters and gradients (zc_bucket.dtype).
 * Low-precision parameters (bf16, fp16) have an fp32 master copy in the
 * daemon; fp32 parameters have none (the owner rank's buffer is the master).
 * The rules, exactly:
 *  - widening (bf16/fp16 -> fp32) is exact;
 *  - the averaged gradient of an element is the fp32 sum of the ranks'
 *    widened gradients, a left fold in rank order, divided once by the world
 *    size (the fp32 rule), then rounded to the bucket's dtype, as a torch
 *    bf16/fp16 model's .grad is after DDP's all-reduce; that rounded value,
 *    widened again, is what the optimizer sees (the same in every mode);
 *  - the optimizer steps the fp32 master with exactly the fp32 arithmetic of
 *    fp32 parameters;
 *  - narrowing (fp32 -> bf16/fp16) rounds to nearest, ties to even, as IEEE
 *    754 roundTiesToEven: a value beyond the largest finite one after
 *    rounding becomes inf of its sign; fp16 results below 2^-14 become
 *    subnormals (or zero) rounded the same way; inf stays inf; a NaN stays a
 *    NaN of its sign with the quiet bit set and its payload's top bits kept
 *    (bf16: the top 7 of fp32's 23 mantissa bits, fp16: the top 10);
 *  - every local rank's parameters, the owner's included, receive the
 *    narrowed master after each step.
 */
enum zc_dtype {
	ZC_DTYPE_F32 = 0,  /* IEEE binary32, 4 bytes */
	ZC_DTYPE_BF16 = 1, /* bfloat16: binary32's top 16 bits, 2 bytes */
	ZC_DTYPE_F16 = 2,  /* IEEE binary16, 2 bytes */
};

/* One gradient bucket: numel elements of dtype, tiled exactly by its
 * segments (in offset order, no gap, no overlap). 32 bytes in this version
 * (24 before dtype: such a caller's buckets are fp32). */
struct zc_bucket {
	uint32_t size; /* sizeof(struct zc_bucket) the caller was built with */
	uint32_t nsegments;
	uint64_t numel;
	const struct zc_segment *segments; /* [nsegments], all of one size */
	uint32_t dtype;                    /* enum zc_dtype; 0: fp32 */
	uint32_t reserved2;                /* 0 */
};

#define ZC_BUCKET_INIT                                                                             \
	{                                                                                          \
		.size = sizeof(struct zc_bucket)                                                   \
	}

int zc_bucket_init(struct zc_bucket *b, size_t size);

/* The whole layout + optimizer of a job. Every rank must declare the same
 * plan; a difference is ZC_EPLANMISMATCH naming the rank and the field.
 * Buckets are numbered in the order backward produces them. 48 bytes in this
 * version (40 before max_grad_norm). Defaults: SGD, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED, no groups and
 * no buckets (which are invalid: fill them in). */
struct zc_plan {
	uint32_t size; /* sizeof(struct zc_plan) the caller was built with */
	enum zc_optimizer optimizer;
	enum zc_shard_mode shard_mode;
	enum zc_step_mode step_mode;
	uint32_t ngroups;
	uint32_t nbuckets;
	const struct zc_param_group *groups; /* [ngroups], all of one size */
	const struct zc_bucket *buckets;     /* [nbuckets], all of one size */
	/* 0: none. Else clip globally, as clip_grad_norm_(every parameter,
	 * max_grad_norm): the 2-norm of the averaged gradient over every group,
	 * shard and node. Needs ZC_STEP_AT_END (every bucket is reduced before
	 * any step) and no group's max_grad_norm: ZC_EPLANINVAL otherwise. */
	double max_grad_norm;
};

#define ZC_PLAN_INIT                                                                               \
	{                                                                                          \
		.size = sizeof(struct zc_plan), .optimizer = ZC_OPT_SGD,                           \
		.shard_mode = ZC_SHARD_BUCKET, .step_mode = ZC_STEP_INTERLEAVED                    \
	}

int zc_plan_init(struct zc_plan *p, size_t size);

/* ------------------------------------------------------------- connect --- */

typedef struct zc_client zc_client;
typedef struct zc_future zc_future;

/* Connection settings: zc_config_init() or ZC_CONFIG_INIT, then fill in.
 * 80 bytes in this version. */
struct zc_config {
	uint32_t size;               /* sizeof(struct zc_config) the caller was built with */
	uint32_t rank;               /* group rank of this trainer, < world_size */
	uint32_t world_size;         /* ranks in the job */
	uint32_t local_rank;         /* rank on this node, < local_size */
	uint32_t local_size;         /* ranks of the job on this node */
	int32_t connect_timeout_ms;  /* zc_connect: the daemon's answer; 0: 30000 */
	int32_t register_timeout_ms; /* zc_register_plan: every rank's plan; 0: connect's
				      * plus twice zerod's --stall-timeout, so zerod's
				      * error naming the missing ranks comes first */
	uint32_t reserved;           /* 0 */
	/* daemon socket path; NULL: $ZEROD_SOCKET, else
	 * $XDG_RUNTIME_DIR/zerod/zerod.sock, else /run/zerod/zerod.sock */
	const char *socket;
	const char *job_id;          /* 1..64 chars of [A-Za-z0-9._-] */
	/* A job over several nodes (one zerod each): every rank of the job
	 * names the same rendezvous, node count and secret, and the ranks of
	 * one node the same node index. The zerod of node 0 serves the
	 * rendezvous on that port; the others join it, proving they know the
	 * secret without sending it. zc_register_plan() completes once every
	 * node has joined with the same plan. Older callers' configs end
	 * before these: they take the environment's values. */
	const char *rdzv;       /* "host:port" (like MASTER_ADDR:MASTER_PORT); NULL: $ZEROD_RDZV;
				   unset or "": every rank is on this node */
	const char *job_secret; /* the job's shared secret (with rdzv: required); NULL:
				   $ZEROD_JOB_SECRET. Sent only to this node's zerod */
	uint32_t nnodes;        /* nodes in the job; 0: $ZEROD_NNODES */
	uint32_t node_rank;     /* this node's index 0..nnodes-1, when has_node_rank */
	uint32_t has_node_rank; /* 0: $ZEROD_NODE_RANK if set, else derived: node 0 holds
				   rank 0, the others follow in the order of their lowest rank */
	uint32_t reserved2;     /* 0 */
};

#define ZC_CONFIG_INIT                                                                             \
	{                                                                                          \
		.size = sizeof(struct zc_config)                                                   \
	}

int zc_config_init(struct zc_config *cfg, size_t size);

/*
 * Connect to the daemon and join job cfg->job_id as cfg->rank (the Hello
 * handshake, which checks the protocol version).
 * Ownership: cfg is only read; *ret_client belongs to the caller, released
 *            with zc_close().
 * Threads:   any thread.
 * Blocking:  up to cfg->connect_timeout_ms waiting for the daemon's answer;
 *            -EACCES at once if this user may not use the socket, and
 *            ZC_ECONNECT at once, naming the path, if it is missing, a
 *            directory, not a socket, nothing listens there (after 200 ms of
 *            refused connects) or what listens does not speak ZeroMQ. Job
 *            ids are per user: ranks of one job run under one uid.
 */
int zc_connect(const struct zc_config *cfg, zc_client **ret_client);

/*
 * Leave the job (Goodbye) and free the client and its buffers. A
 * checkpoint this client is still writing (zc_checkpoint() on rank 0) is
 * finished first; its result is not reported (zc_checkpoint_wait() first
 * for that). A rank that leaves between iterations ends the job cleanly
 * (no error to anyone) if the others leave there too; one that goes on
 * (its next bucket) gets ZC_EJOBFAILED naming the rank that left, and the
 * job ends failed. A rank that leaves during an iteration fails the job.
 * Ownership: frees c; futures still held by the caller stay valid (pending
 *            ones fail with ZC_ESTATE, and their callbacks run here) and are
 *            still freed with zc_future_free(). Accepts NULL. In a child after
 *            fork() it releases nothing (see the top of this file).
 * Threads:   no other call on c may run or follow.
 *            CUDA buffers' events (zc_register_buffers()) are not destroyed:
 *            zerod may still wait on or record them while it tears the job
 *            down after the goodbye, which nothing answers; they stay until
 *            the process exits (2 x ZC_CUDA_EVENT_RING per bucket).
 * Blocking:  until a checkpoint in flight is written, then at most ~200 ms
 *            for the goodbye to leave.
 */
void zc_close(zc_client *c);

/* ------------------------------------------------------------- buffers --- */

/*
 * Buffers are host memory the trainer and the daemon both map: a memfd
 * (memfd_create(2)), passed to the daemon with SCM_RIGHTS over the AF_UNIX
 * socket beside its ZeroMQ one (<socket>.fd). Nothing gets a name, so
 * nothing is ever left in /dev/shm, and the daemon may run as another user
 * than the trainers (see "Running zerod as another user" below).
 *
 * Each of the two buffers (gradients, parameters) holds the plan's buckets
 * in bucket order, each aligned for vector loads: zc_plan_buffer_bytes()
 * says how many bytes in all, and (char *)zc_grad_buffer(c, b) - (char
 * *)zc_grad_buffer(c, 0) where bucket b starts (the same in both buffers,
 * and in the caller's own mappings). The zerod daemon checks each buffer and
 * refuses it with
 * ZC_EBUFFER, the reason in zc_error_message(), unless it is:
 *  - a memfd (not a regular file, pipe, socket, /dev/shm object...);
 *  - sealed against shrinking (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), which
 *    needs MFD_ALLOW_SEALING): a buffer that shrank under the daemon would
 *    crash it; it must not be sealed against writes (F_SEAL_WRITE);
 *  - created by the trainer's own user (a memfd belongs to its creator's
 *    uid: "another user's buffer" is refused);
 *  - at least offset + plan bytes long, the offset a multiple of the page
 *    size; the two buffers do not overlap when they share a memfd.
 */
enum zc_buffers_kind {
	ZC_BUFFERS_HOST = 0, /* memfds (above) */
	ZC_BUFFERS_CUDA = 1, /* CUDA device memory the trainer allocated (below) */
};

/*
 * ZC_BUFFERS_CUDA: grad_dev and param_dev point at zc_plan_buffer_bytes()
 * bytes each of device memory this process allocated (cudaMalloc, PyTorch's
 * caching allocator...), both on one device; the fd fields are ignored.
 * The library sends zerod the CUDA IPC handle of each pointer's allocation
 * (cuMemGetAddressRange's base, cudaIpcGetMemHandle) with the pointer's
 * offset into it, and names the device by its UUID (cudaDeviceProp.uuid),
 * never by ordinal: CUDA_VISIBLE_DEVICES numbers devices per process. zerod
 * opens each handle once per plan, off its loop, when the job starts; a
 * handle it cannot open, or a device it does not see, fails the job with
 * ZC_EMAP naming the rank, the buffer and CUDA's reason.
 * IPC shares an allocation's whole underlying block, and the driver may
 * carve small cudaMalloc allocations out of a larger one: give buffers in
 * allocations of a multiple of 2 MiB (PyTorch's caching allocator makes no
 * smaller ones); memory from cuMemCreate/cuMemMap or cudaMallocAsync pools
 * (PyTorch's expandable segments or its cudaMallocAsync backend) has no
 * cudaIpcGetMemHandle, and zc_register_buffers() fails with CUDA's reason.
 * The library does not link the CUDA runtime: it loads libcudart.so.13 (else
 * libcudart.so; $ZEROD_CUDART names another) at the first CUDA call, and
 * without it the call is ZC_ENOTSUP saying so. A zerod without the cuda
 * backend (built without CUDA, --backend host, no GPU visible) refuses CUDA
 * buffers in zc_register_plan() with ZC_ENOTSUP and its reason; so does a
 * job whose ranks mix host and CUDA buffers. Such a job re-plans with
 * zc_register_buffers() of new CUDA buffers (see "Re-planning" below).
 * The event rings: for each bucket the library creates ZC_CUDA_EVENT_RING
 * ready and as many done events (cudaEventInterprocess |
 * cudaEventDisableTiming) on the buffers' device and sends their IPC handles
 * with the buffers; iteration t uses slot t % ZC_CUDA_EVENT_RING. See
 * zc_bucket_ready_cuda() and zc_step_wait_cuda().
 */
struct zc_buffers {
	uint32_t size;         /* sizeof(struct zc_buffers) the caller was built with */
	int32_t grad_fd;       /* the memfd holding the gradients (-1 by default) */
	uint64_t grad_offset;  /* where they start in it, in bytes */
	int32_t param_fd;      /* the memfd holding the parameters: may be grad_fd */
	uint32_t reserved;     /* 0 */
	uint64_t param_offset; /* where they start in it, in bytes */
	/* 56 bytes from here on (32 before kind: such a caller's buffers are
	 * memfds) */
	uint32_t kind;      /* enum zc_buffers_kind; 0: host */
	uint32_t reserved2; /* 0 */
	void *grad_dev;     /* ZC_BUFFERS_CUDA: the gradients, device memory */
	void *param_dev;    /* ZC_BUFFERS_CUDA: the parameters, on the same device */
	/* 64 bytes from here on (56 before flags: such a caller's flags are 0) */
	uint32_t flags;     /* ZC_BUFFERS_SHARED_PARAMS, or 0 */
	uint32_t reserved3; /* 0 */
};

/*
 * flags: ZC_BUFFERS_SHARED_PARAMS (host buffers, a job on one node): every
 * local rank of the job registers the same parameter buffer, the same memfd
 * (one file: the fds may differ, the file may not) at the same
 * param_offset, each with this flag, and its own gradient buffer. After
 * every step all ranks' parameters are equal anyway, so one buffer can hold
 * them: zerod writes each updated parameter once instead of once per local
 * rank (docs/DATAPLANE.md, "Shared parameters"), and the trainers' models
 * all view it. What follows from sharing: an edit one rank makes between
 * iterations is every rank's (make it on one rank, or the same on every
 * rank: as without sharing, the next step starts from it); and a trainer
 * must not write its parameters while another rank's step is in flight.
 * The ranks must get the memfd to each other (fork, SCM_RIGHTS, pidfd_getfd),
 * or let zc_alloc_buffers_shared() do it: then they pass two numbers.
 * zerod checks it per rank as the plan registers: a rank whose parameter
 * buffer is another file or offset than the other local ranks', or whose
 * flag differs from theirs, fails zc_register_plan() with ZC_ESHAREDPARAMS
 * naming both ranks; a job over several nodes refuses the flag with
 * ZC_ENOTSUP (each node would need its own: not yet), and so does
 * zc_register_buffers() with CUDA buffers. zc_alloc_buffers() gives each
 * rank a memfd of its own, and so does a re-plan with it; a re-plan with
 * zc_alloc_buffers_shared() shares again.
 */
#define ZC_BUFFERS_SHARED_PARAMS 1u

/* Events per bucket and direction (why a ring: DATAPLANE.md, "CUDA
 * buffers"): a record overwrites an event, so a slot is recorded again only
 * once the other side has issued its wait on it. */
#define ZC_CUDA_EVENT_RING 2

#define ZC_BUFFERS_INIT                                                                            \
	{                                                                                          \
		.size = sizeof(struct zc_buffers), .grad_fd = -1, .param_fd = -1                   \
	}

int zc_buffers_init(struct zc_buffers *b, size_t size);

/*
 * Shared parameters without passing fds: what a rank that created the
 * job's shared parameter buffer (zc_alloc_buffers_shared() with from NULL)
 * tells the other local ranks, by any channel (a torch.distributed store,
 * MPI, a file): its pid and the memfd's fd number there.
 */
struct zc_shared_params {
	uint32_t size;     /* sizeof(struct zc_shared_params) */
	int32_t pid;       /* the creating rank's process */
	int32_t fd;        /* the memfd's fd number in it (its client keeps it open) */
	uint32_t reserved; /* 0 */
};

#define ZC_SHARED_PARAMS_INIT                                                                      \
	{                                                                                          \
		.size = sizeof(struct zc_shared_params), .fd = -1                                  \
	}

/*
 * zc_register_buffers() with ZC_BUFFERS_SHARED_PARAMS, the memfds made
 * here: every local rank calls it once, before zc_register_plan(), one rank
 * (say local rank 0) with from NULL and the others with what that one got
 * in *ret. With from NULL it creates the parameter memfd, which its client
 * keeps open until zc_close(), and writes {pid, fd} into *ret; with from it
 * opens that memfd through /proc/PID/fd/N (the same user, the creator
 * dumpable: the kernel's rule for reading another process's fds; yama's
 * ptrace_scope does not restrict it) and copies *from to *ret. Each rank
 * gets a gradient memfd of its own. The creator's call need not wait for
 * the others, but must have returned before they call, and the creator
 * must not zc_close() before every local rank's call returned (its
 * zc_register_plan() returning is enough: that waits for every rank's).
 * zc_param_buffer() then gives the one buffer on every rank: write initial
 * values on one rank only. On a client whose plan is registered (host
 * buffers) it re-plans as zc_alloc_buffers() does (then
 * zc_register_plan(), "Re-planning"), into a new shared buffer: again the
 * creator with from NULL, which copies every segment's parameters into it
 * by the new layout, and then the others with its new handle (they copy
 * nothing: call only after the creator's call returned). The creator's
 * client closes the previous buffer's fd. zc_alloc_buffers() instead
 * re-plans into each rank's own buffers.
 * Errors: zc_register_buffers()'s (ZC_ENOTSUP on a job over several nodes,
 *         and ZC_ESHAREDPARAMS later from zc_register_plan() if the ranks'
 *         files differ), -EINVAL (c, plan or ret NULL; from->size wrong; a
 *         handle naming no memfd, or one too small for plan), -ENOENT (the
 *         creator exited or closed its client), -EACCES / -EPERM (another
 *         user's, or a process not dumpable), -errno of memfd_create(); the
 *         reason in zc_error_message().
 * Ownership: plan as zc_register_buffers(); from is only read; *ret is
 *            written on success.
 * Threads:   any thread.
 * Blocking:  as zc_register_buffers().
 */
int zc_alloc_buffers_shared(zc_client *c, const struct zc_plan *plan,
			    const struct zc_shared_params *from, struct zc_shared_params *ret);

/*
 * The size in bytes of each of plan's two buffers (what a memfd must hold
 * from its offset). ZC_EPLANINVAL (or -EINVAL / -E2BIG for a struct size)
 * with the reason in zc_error_message() for a plan zc_register_buffers()
 * would refuse.
 * Ownership: plan is only read; *ret_bytes is written on success.
 * Threads:   any thread.  Blocking: no.
 */
int zc_plan_buffer_bytes(const struct zc_plan *plan, uint64_t *ret_bytes);

/*
 * Hand this rank's gradient and parameter buffers for plan to the daemon:
 * memory the caller owns (a memfd it created, sized, sealed and mapped, so
 * that, say, PyTorch tensors can be views into it with no copy). The fds go
 * to the daemon, which checks them (above) and answers before this returns;
 * the library maps them too, for zc_grad_buffer() / zc_param_buffer(). May
 * be called once per client, instead of zc_alloc_buffers(), before
 * zc_register_plan(); with ZC_BUFFERS_CUDA also once more per re-plan of
 * a client of CUDA buffers (see "Re-planning").
 * Errors: ZC_EBUFFER (the daemon refused the memory: which buffer and why),
 *         ZC_EPLANINVAL, -EBADF (an fd < 0), -EINVAL / -E2BIG for a struct
 *         size, ZC_ESTATE (buffers already), ZC_ENOTSUP (the daemon offered
 *         no fd socket), ZC_ETIMEDOUT, ZC_EREPLAN (a CUDA re-plan's plan
 *         changes the parameters); the reason in zc_error_message().
 * Ownership: plan is validated and copied; the fds stay the caller's (the
 *            daemon and the library keep mappings, not the fds: the caller
 *            may close them once this returns). The memory is shared: the
 *            caller's own mapping sees every update the daemon makes.
 * Threads:   any thread.
 * Blocking:  up to connect_timeout_ms for the daemon's answer.
 */
int zc_register_buffers(zc_client *c, const struct zc_plan *plan, const struct zc_buffers *bufs);

/*
 * The easy path: the library creates one memfd (gradients, then parameters
 * at the next page boundary), zero-filled and sealed against shrinking and
 * growing, and registers it as zc_register_buffers() does. Errors, threads
 * and blocking as there. Called again after the plan was registered, it
 * re-plans (see "Re-planning" below).
 * Ownership: plan is validated and copied (ZC_EPLANINVAL, or -EINVAL / -E2BIG
 *            for a struct size, with the reason in zc_error_message()); the
 *            buffers belong to c.
 */
int zc_alloc_buffers(zc_client *c, const struct zc_plan *plan);

/*
 * CUDA buffers (ZC_BUFFERS_CUDA): zc_bucket_ready() that first records
 * bucket's ready event of this iteration on `stream` (a cudaStream_t of the
 * buffers' device; NULL: the legacy default stream), so the gradients may
 * still be in flight there: zerod's reduction waits on that event on its
 * own stream (cudaStreamWaitEvent), and the host never synchronises.
 * Errors: as zc_bucket_ready(), ZC_ESTATE (not CUDA buffers), and CUDA's
 * (ZC_EINTERNAL, the reason in zc_error_message()). The event is recorded
 * even when the bucket is then refused; recording a slot again for the same
 * iteration is harmless.
 * Ownership: as zc_bucket_ready().
 * Threads: any thread, but not concurrently with another zc_bucket_ready*
 *          of this client (the slot is that of the iteration it reads).
 * Blocking: no.
 */
int zc_bucket_ready_cuda(zc_client *c, uint32_t bucket, void *stream, zc_future **ret_future);

/*
 * CUDA buffers: make `stream` wait, on the device, until every parameter
 * update of the step future f's iteration has landed in this rank's
 * parameter buffer: zerod records each bucket's done event after the
 * bucket's last collective. f must be a completed step future (else
 * ZC_ESTATE) of an iteration whose ring slots have not been reused: within
 * ZC_CUDA_EVENT_RING - 1 iterations of the client's current one (else
 * ZC_ESTATE: call it before handing over the buckets of iteration t + 2).
 * A failed f returns its code.
 * Ownership: f stays the caller's.
 * Threads: any thread.  Blocking: no.
 */
int zc_step_wait_cuda(zc_future *f, void *stream);

/*
 * Running zerod as another user: the trainers only need to reach its two
 * sockets, <socket> (ZeroMQ) and <socket>.fd (buffers, fast path). zerod
 * creates both with mode 0660 in its runtime directory: put the trainers'
 * users in zerod's group (or the group the directory hands down), and give
 * the directory at least g+x. zerod checks each connection's credentials
 * (SO_PEERCRED: the fd socket's peer must be the process that said Hello)
 * and maps only memfds created by that user; it never needs the trainers'
 * files, and they never need its.
 */

/*
 * Base of bucket b's gradient / parameter buffer (numel fp32 elements); NULL
 * if c is NULL (or used after fork), b is out of range or no buffers are
 * allocated, with the reason in zc_error_message(). The trainer writes
 * gradients before zc_bucket_ready(b) and not again until the iteration's
 * step future completed (the daemon may read them until then, and where the
 * reduction comes before the step, as in ZC_STEP_AT_END, it leaves the
 * average of the ranges a rank owns in that rank's gradient buffer). The
 * daemon writes parameters, which are stable once the iteration's step
 * future completed; the trainer may change them between iterations (the
 * same on every rank), and the next step starts from its values.
 * Ownership: the library's mapping of the buffers, valid from
 *            zc_alloc_buffers() / zc_register_buffers() until zc_close().
 * Threads:   any thread.  Blocking: no.
 */
float *zc_grad_buffer(zc_client *c, uint32_t bucket);
float *zc_param_buffer(zc_client *c, uint32_t bucket);

/*
 * The same for a bucket of any dtype: numel elements of the bucket's dtype
 * (uint16_t bit patterns for bf16 and fp16). zc_grad_buffer() and
 * zc_param_buffer() return NULL for a bucket that is not fp32 (the reason
 * says so). Buffers are laid out by bytes: every bucket starts on a 64-byte
 * boundary. The same rules as above otherwise.
 * Ownership: the memory belongs to c, valid from zc_alloc_buffers() until
 *            zc_close().
 * Threads:   any thread.  Blocking: no.
 */
void *zc_grad_ptr(zc_client *c, uint32_t bucket);
void *zc_param_ptr(zc_client *c, uint32_t bucket);

/*
 * Register the plan of zc_alloc_buffers() / zc_register_buffers() with the daemon and wait until every
 * rank of the job has registered the same plan. The daemon starts from rank
 * 0's parameter buffers (fill them first): on success every rank's parameter
 * buffers hold rank 0's values and the optimizer state is fresh. First, if
 * the daemon offers it and $ZEROD_FASTPATH is not "0", the fast path is set
 * up: a shared ring that carries the buckets and their completions from then
 * on (without it, everything goes over the ZeroMQ socket). Errors:
 * ZC_EPLANMISMATCH, ZC_EBUFFER, ZC_ETIMEDOUT... with the daemon's reason in
 * zc_error_message(). Called again after zc_alloc_buffers() of a new plan,
 * it re-plans (see "Re-planning" below).
 * Ownership: nothing changes hands.
 * Threads:   any thread; other calls on c may run while it waits.
 * Blocking:  up to register_timeout_ms.
 */
int zc_register_plan(zc_client *c);

/*
 * After zc_register_plan() returned 0: 1 if the job was recovered (its ranks
 * rejoined a job that lost a trainer, zc_error_recoverable()), with the
 * iteration it goes on at in *iteration (iteration may be NULL): every
 * rank's parameter buffers hold the job's parameters after the step of
 * iteration - 1, the optimizer state is the state after it, and
 * zc_iteration() says iteration. Move the data loader and LR schedule
 * there. 0 (and *iteration 0) for a job that started fresh; ZC_ESTATE
 * before the plan is registered.
 * Ownership: nothing changes hands.
 * Threads:   any thread.  Blocking: no.
 */
int zc_recovered(zc_client *c, uint64_t *iteration);

/*
 * Re-planning (DDP rebuilding its buckets): between iterations (every step
 * future of the iterations handed over completed), call zc_alloc_buffers()
 * with the new plan and then zc_register_plan() again, on every rank. The new
 * plan must hold the same parameters: the same segments (numel, group and
 * dtype),
 * matched by param_id when every segment of both plans has one, else by
 * position in plan order, in any bucket grouping and order, with the same
 * groups and optimizer; else ZC_EREPLAN naming the first difference, and
 * the old plan stays. zc_alloc_buffers() makes new buffers (a memfd, passed
 * to the daemon by zc_register_plan() as at the first registration) and
 * copies every segment's parameter values from the old ones (the old pointers stay valid
 * until zc_register_plan() returns; take the new ones then); zc_register_plan()
 * exports the optimizer state (zc_get_state()), has the daemon start the job
 * again on the new plan, and imports the state (zc_set_state()) into the new
 * layout: moments, step counts and the fp32 masters of bf16/fp16 segments
 * move with their segment, without loss, in either shard mode. Iterations go on counting; the hyperparameters in force
 * (zc_set_hyper's) stay: the new plan's groups must equal the registered
 * plan's. Between the two calls zc_bucket_ready() and the state calls are
 * ZC_ESTATE, and zc_grad_buffer()/zc_param_buffer() already return the new
 * buffers (do not call them from another thread meanwhile). A job over
 * several nodes re-plans the same way, every rank of every node with the
 * same new plan: nodes whose ranks registered different new plans fail the
 * job with ZC_EPLANMISMATCH on every rank. A refusal that leaves the job
 * running sends the client back to the registered plan and its buffers.
 * Once the daemon took the new plan, only the job's failure can fail the
 * import that follows.
 * CUDA buffers: instead of zc_alloc_buffers() (ZC_ESTATE for such a client:
 * the library allocates no device memory), call zc_register_buffers() with
 * ZC_BUFFERS_CUDA and the new plan's device buffers, after copying every
 * segment's parameters into its place in them (cudaMemcpy, and synchronise
 * first: zerod reads them on its own streams); it checks the plan as above
 * and creates the new buffers' event rings. zc_register_plan() then sends
 * their IPC handles: zerod closes the old handles and communicators and
 * opens the new ones off its loop, and the state (on the owners' devices)
 * moves as above, bf16/fp16 masters narrowed into the new parameters on the
 * devices. Free the old buffers once zc_register_plan() returned 0 (zerod
 * has closed its handles of them); after a refusal the old ones stay.
 */

/* ------------------------------------------------------ optimizer state --- */

/* Which parts of a segment's optimizer state exist: torch's state[p] keys. */
#define ZC_STATE_STEP            1u  /* Adam, AdamW: 'step' */
#define ZC_STATE_MOMENTUM_BUFFER 2u  /* SGD with momentum != 0 */
#define ZC_STATE_EXP_AVG         4u  /* Adam, AdamW */
#define ZC_STATE_EXP_AVG_SQ      8u  /* Adam, AdamW */
#define ZC_STATE_MAX_EXP_AVG_SQ  16u /* Adam, AdamW with amsgrad */
#define ZC_STATE_MASTER          32u /* fp32 master of low-precision parameters */

/*
 * The optimizer state of one segment (bucket, segment: its index in the
 * bucket), as torch keeps it for that parameter: every tensor is numel fp32
 * elements (the segment's), in the segment's element order. 64 bytes in
 * this version; zc_segment_state_init() or ZC_SEGMENT_STATE_INIT first.
 *  - torch.optim.SGD: state is empty before the first step and with
 *    momentum == 0; otherwise only momentum_buffer (SGD keeps no step).
 *  - Adam, AdamW: empty before the first step; then step (a whole number,
 *    as a double like torch's state['step']), exp_avg, exp_avg_sq, and
 *    max_exp_avg_sq where the group has amsgrad.
 *  - master: never for fp32 parameters; always for bf16/fp16 ones (from the
 *    job's start, before any step too): the daemon's fp32 master copy,
 *    whose rounding is the parameter.
 */
struct zc_segment_state {
	uint32_t size;    /* sizeof(struct zc_segment_state) the caller was built with */
	uint32_t bucket;  /* in the current plan */
	uint32_t segment; /* index into the bucket's segments */
	uint32_t present; /* ZC_STATE_* bits: what exists (get), what is given (set) */
	double step;
	float *momentum_buffer, *exp_avg, *exp_avg_sq, *max_exp_avg_sq, *master;
};

#define ZC_SEGMENT_STATE_INIT                                                                      \
	{                                                                                          \
		.size = sizeof(struct zc_segment_state)                                            \
	}

int zc_segment_state_init(struct zc_segment_state *s, size_t size);

/*
 * Export the optimizer state of the segments segs[0..n) name (all of the
 * plan's, or any of them: each rank asks for what it wants). Every local
 * rank of the job calls it between iterations (after the step futures of the
 * iterations it handed over; during one: ZC_ESTATE): it is a collective, the
 * daemon serves once every rank of this node asked, and the state of
 * segments owned on other nodes travels over the job's collectives, so every
 * node's ranks call it too. On success each segs[i].present and .step are
 * written, and each tensor that is present and whose pointer is not NULL is
 * filled (numel floats the caller owns); a tensor that is not present is not
 * touched. A NULL pointer skips that tensor (ask once with NULL pointers to
 * learn what exists).
 * The bulk data goes through a staging memfd made per call (5 x the plan's
 * element count in fp32, 6 x with bf16/fp16 buckets; sparse: only what is
 * written takes pages), passed to the daemon over its fd socket as the
 * buffers are: no name ever appears in /dev/shm.
 * The daemon passes the other ranks' state through this rank's parameter
 * buffers (the job's own broadcasts) and puts the parameters back before
 * the call returns: no thread may read or write them meanwhile.
 * Errors: ZC_EBUCKET (no such bucket or segment: nothing is sent),
 * ZC_ESTATE, ZC_ETIMEDOUT (not every rank called within register_timeout_ms),
 * ZC_ENOTSUP (a daemon that offers no fd socket), ZC_EBUFFER (the daemon
 * refused the staging, with its reason), the job's failure.
 * Ownership: segs and the tensors stay the caller's.
 * Threads:   any thread; other calls on c may run while it waits.
 * Blocking:  until every local rank called and the state is copied.
 */
int zc_get_state(zc_client *c, struct zc_segment_state *segs, uint32_t n);

/*
 * Import the optimizer state of segs[0..n): each named segment's state is
 * replaced by the one given (present says which tensors, as torch's
 * load_state_dict sets state[p]); segments not named keep their state. A
 * segment given with present 0 gets a fresh state (as before its first
 * step). Every local rank of the job calls it between iterations with the
 * same segments, presence bits and steps; the tensors of an element are
 * taken from the rank that owns it (its shard owner), so ranks should pass
 * the same values. Ranks whose lists differ: every rank of the node gets
 * ZC_ESTATEINVAL and nothing is applied.
 * bf16/fp16 segments: a master given (ZC_STATE_MASTER) becomes the daemon's
 * fp32 master and, once the state is in, this rank's parameters of that
 * segment are set to it rounded to the bucket's dtype (as apex's fp16
 * optimizer loads its masters into the model), so every rank passing the
 * same master holds the same parameters; a segment given without one (a
 * state saved by plain torch) takes its master from its owner rank's
 * parameters, widened, as zc_params_changed() would. Either way no thread
 * may touch the parameters during the call.
 * Refused with ZC_ESTATEINVAL naming the segment and the field, nothing
 * applied anywhere and the job going on with its previous state: an unknown
 * bucket or segment, one named twice, a step that is NaN, negative, not a
 * whole number or above 2^31, a tensor the plan's optimizer does not keep
 * (momentum_buffer for Adam or where the group's momentum is 0, Adam's
 * tensors for SGD, max_exp_avg_sq without amsgrad, master for fp32
 * parameters, a step for SGD), an incomplete Adam state (step, exp_avg and
 * exp_avg_sq go together, with max_exp_avg_sq under amsgrad), a NULL
 * pointer for a tensor given, a value that is not finite, and a negative
 * exp_avg_sq or max_exp_avg_sq. Nothing is sent when this rank's input is
 * refused (the other ranks then wait until their timeout), so check on
 * every rank alike.
 * Ownership: segs and the tensors stay the caller's (copied).
 * Threads:   any thread.  Blocking: as zc_get_state().
 */
int zc_set_state(zc_client *c, const struct zc_segment_state *segs, uint32_t n);

/* ---------------------------------------------------------- checkpoints --- */

/*
 * Write the job's parameters and optimizer state to directory dir (made,
 * with its parents, if missing), per parameter segment, in the format of
 * docs/CHECKPOINT.md: a data file and a manifest written last, each to a
 * temporary name, fsynced, renamed and the directory fsynced, with BLAKE2b
 * checksums. Every rank of the job calls it between iterations (after the
 * step of the last iteration it handed over) with the same dir, which must
 * be one directory for every node (a shared filesystem on several nodes):
 * it is a collective (one export round per node). It returns once the
 * state is copied out: on one node into rank 0's staging, from which a
 * thread of rank 0's client writes the files while training goes on; on
 * several (format version 2) each node's local rank 0 gets its own node's
 * state in its staging and writes the node's file, and rank 0 writes the
 * manifest once every node's file is durable. The checkpoint names
 * zc_iteration(), the iteration a restore goes on at.
 * zc_checkpoint_wait() says when it is durable and whether the write
 * failed; the next zc_checkpoint(), zc_restore() and zc_close() wait for a
 * write in flight first. An older checkpoint in dir is replaced; on one
 * node, between its manifest's removal and the new one's rename dir holds
 * none; on several, its manifest stays until the new one replaces it, and
 * a restore meanwhile may find a node file rewritten (refused).
 * Errors: ZC_ESTATE (no plan, mid-iteration), ZC_ENOTSUP (bf16/fp16
 * buckets), ZC_ECKPT (no writer thread), zc_get_state()'s; a failed write
 * comes back from zc_checkpoint_wait().
 * Ownership: dir stays the caller's (copied).
 * Threads:   any thread.  Blocking: until every rank called and rank 0
 *            copied the state (and until an earlier write in flight ends).
 */
int zc_checkpoint(zc_client *c, const char *dir);

/*
 * Wait up to timeout_ms for this rank's last zc_checkpoint() to be durable
 * and return its result: 0, or ZC_ECKPT with the reason. On rank 0 (the
 * writer) it waits for its write (< 0: without limit); ZC_ETIMEDOUT if it
 * is still writing (the write goes on: call again). On several nodes each
 * node's local rank 0 writes too: it waits for its node's file and for the
 * manifest to name it (rank 0 writes that), as rank 0 does. On the other ranks it
 * reads dir's manifest back until it names the checkpoint's iteration (<
 * 0: up to the client's register_timeout_ms); ZC_ECKPT if it does not by
 * then (rank 0 failed to write: its call says why; or dir is not one
 * directory for every node). The result is given once: a second call, or
 * one with no checkpoint since, returns 0.
 * Errors also: -EINVAL (c NULL), ZC_EFORKED.
 * Threads:   any thread.  Blocking: up to timeout_ms.
 */
int zc_checkpoint_wait(zc_client *c, int timeout_ms);

/*
 * Load the checkpoint in dir: every rank, after zc_register_plan() and
 * before its first bucket (or between iterations). A checkpoint of this
 * client's still in flight is waited for first (zc_checkpoint_wait(c,
 * -1), its result dropped: dir is checked as it is). Each rank reads the
 * manifest and the data file and checks them: checksums, sizes, format
 * version, and that the plan holds the same parameters (optimizer, groups
 * with the same kind of state, segment count, each segment's numel and
 * group; matched by param_id when every segment of both has one, else by
 * position in plan order). The bucket layout, world size, shard mode and
 * node count may differ from the checkpoint's. Then it imports the state
 * (zc_set_state()), moves the job to the checkpoint's iteration
 * (zc_iteration() returns it, and the next buckets are that iteration's)
 * and only then writes the parameters into this rank's buffers, so a
 * refused import changes no rank's parameters, a shared buffer's
 * (ZC_BUFFERS_SHARED_PARAMS) included.
 * Refused with ZC_ECKPT naming what is wrong (no manifest, a missing,
 * truncated or corrupt file, another version, other parameters), and
 * nothing is changed: the job keeps its state, parameters and iteration.
 * Errors also: ZC_ESTATE, ZC_ENOTSUP (bf16/fp16 buckets), zc_set_state()'s
 * (e.g. ZC_ESTATEINVAL: the local ranks restored different checkpoints;
 * the parameters are then untouched).
 * Ownership: dir stays the caller's.
 * Threads:   any thread.  Blocking: until every local rank imported.
 */
int zc_restore(zc_client *c, const char *dir);

/*
 * Whether the operator asked for a checkpoint now (`zeroctl checkpoint JOB
 * [DIR]`): 1 with the directory in dir (len bytes, the terminating NUL
 * included) when this rank is between iterations at the iteration the
 * daemon named, else 0. The daemon tells every local rank the same
 * iteration, so ranks that call this between every two iterations all see
 * 1 at the same one and then call zc_checkpoint(c, dir). A request whose
 * iteration a rank passed without calling this lapses.
 * Errors: -EINVAL (dir NULL or len 0), -ERANGE (len too small; the request
 * stays).
 * Threads:   any thread.  Blocking: no (reads what has arrived).
 */
int zc_checkpoint_due(zc_client *c, char *dir, size_t len);

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
 * Threads:   any thread, also from a future's callback.  Blocking: no (one
 *            ring slot or one message; both hold two iterations of the
 *            largest plan). -EAGAIN if the ring is full, which only a daemon
 *            that stopped taking buckets lets happen.
 */
int zc_bucket_ready(zc_client *c, uint32_t bucket, zc_future **ret_future);

/*
 * zc_bucket_ready() that also says which segments of the bucket have no
 * gradient on this rank this iteration (torch: a parameter whose .grad is
 * None, DDP's find_unused_parameters). Bit s of unused[s / 64] (bit s % 64)
 * stands for segment s of the bucket, in the plan's order.
 *  - A segment every rank of the job (every node) marks is skipped as torch
 *    skips such a parameter: no step, no weight decay, no momentum or moment
 *    update, and its step count does not advance (Adam's bias correction
 *    counts its own updates); it takes no part in clipping either.
 *  - A segment some ranks mark and others do not: a marking rank contributes
 *    a zero gradient. The daemon never reads that rank's gradient there; it
 *    writes zeroes over it (whatever the buffer held is gone).
 * nwords must be (nsegments + 63) / 64 of that bucket, and bits at or past
 * nsegments must be 0: ZC_ESEGMASK otherwise, with the reason in
 * zc_error_message(), and nothing is sent. nwords 0 (unused NULL) is
 * zc_bucket_ready(). reserved must be 0 (-EINVAL).
 * With the fast path a bucket with a nonzero mask goes as a ZeroMQ message:
 * the two channels keep their order (common/ring.h's MARK), so it costs one
 * message, not the ordering of anything.
 * Ownership: r and r->unused are only read, during the call. The future as
 *            zc_bucket_ready()'s.
 * Threads, blocking: as zc_bucket_ready().
 */
struct zc_ready {
	uint32_t size;   /* sizeof(struct zc_ready) the caller was built with */
	uint32_t bucket;
	uint32_t nwords; /* words in unused */
	uint32_t reserved;
	const uint64_t *unused;
};

#define ZC_READY_INIT                                                                              \
	{                                                                                          \
		.size = sizeof(struct zc_ready)                                                    \
	}

int zc_bucket_ready_ex(zc_client *c, const struct zc_ready *r, zc_future **ret_future);

/*
 * The unscale factor of the current iteration (zc_iteration(): call it
 * before handing over the iteration's last bucket), as GradScaler.unscale_
 * applies it: each element of the averaged gradient is multiplied by
 * (float)inv_scale before clipping and the step. With it set the daemon looks
 * at every element of every bucket on every node: one that is not finite
 * skips the whole step on every rank (no state changes, step counts stay,
 * parameters are untouched) and the step future says so (zc_step_info:
 * found_inf). Every rank calls it with the same value for the iteration (or
 * none does); ranks that disagree fail the job with ZC_EHYPER naming them.
 * A second call in one iteration replaces the first.
 * Errors: ZC_ESTATE (plan not registered, or ZC_STEP_INTERLEAVED: the
 * reduced gradients must all be in before any step), -EINVAL (inv_scale not
 * finite or <= 0).
 * Ownership: nothing changes hands.
 * Threads:   any thread.  Blocking: no (one message).
 */
int zc_set_grad_scale(zc_client *c, double inv_scale);

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
 * What the step of a completed step future did. found_inf: 1 if a
 * zc_set_grad_scale() iteration found a non-finite averaged gradient and
 * skipped its step everywhere. grad_norm: the total 2-norm of the averaged
 * (unscaled) gradient over every group, shard and node before clipping, as
 * clip_grad_norm_ returns it (its sum of squares accumulated in double), when
 * the daemon computed one (clipping or a grad scale in the plan or the
 * iteration); NaN otherwise, and for an iteration whose info the client no
 * longer keeps (it keeps the last 16).
 * Errors: ZC_ESTATE (f is not a step future, or not completed), a failed
 * future's code.
 * Ownership: *out (its `size` bytes, at least 8) is written on success.
 * Threads:   any thread.  Blocking: no.
 */
struct zc_step_info {
	uint32_t size; /* sizeof(struct zc_step_info) the caller was built with */
	uint32_t found_inf;
	uint64_t iteration;
	double grad_norm;
};

#define ZC_STEP_INFO_INIT                                                                          \
	{                                                                                          \
		.size = sizeof(struct zc_step_info)                                                \
	}

int zc_step_info(zc_future *f, struct zc_step_info *out);

/*
 * Iteration the next zc_bucket_ready() belongs to: 0 first, moving on after
 * the last bucket of an iteration is handed over. ZC_NO_ITERATION if c is
 * NULL or used after fork (the reason in zc_error_message()).
 * Ownership: nothing changes hands.
 * Threads:   any thread.  Blocking: no.
 */
#define ZC_NO_ITERATION UINT64_MAX
uint64_t zc_iteration(zc_client *c);

/*
 * Change group's hyperparameters from the next iteration this rank has not
 * started (an LR schedule, say). A second call for the same group before
 * that iteration starts replaces the first: the last one wins, as an
 * assignment to a torch param group does. Every rank makes the same calls:
 * where the last values of two ranks differ for one group and iteration, the
 * lowest rank's apply and each rank whose values differ hears ZC_EHYPER
 * through zc_last_error() once that iteration's bucket 0 is done. Invalid
 * values are refused here with ZC_EHYPER (the reason in zc_error_message()),
 * and so are values that need optimizer state the plan's groups did not
 * (momentum where every group had none, amsgrad where no group had it: the
 * daemon sized the state from the plan), and a max_grad_norm the plan's mode
 * does not allow (interleaved, or a plan that clips globally).
 * Ownership: hp is copied (any size: see "ABI").
 * Threads:   any thread.  Blocking: no (one message).
 */
int zc_set_hyper(zc_client *c, uint32_t group, const struct zc_param_group *hp);

/*
 * The parameters of bf16/fp16 buckets were changed (load_state_dict, an EMA
 * swap...): reload their fp32 masters from the parameters. Every rank calls
 * it, after its edit and between iterations: after the previous step future
 * completed and before the next iteration's first zc_bucket_ready(). The
 * daemon reloads once every local rank handed over bucket 0 of that next
 * iteration (so every rank's edit is done), before any step of it: each
 * master whose owner rank's parameter is no longer the master rounded to the
 * dtype (an edit) takes the parameter's widened value; the others keep their
 * fp32 values, which the parameters still round to (a reload from rounded
 * values would throw away what the masters are for). fp32 parameters need no
 * call (the owner's buffer is the master).
 * Without it, a step that finds an owner's bf16/fp16 parameter different from
 * its rounded master fails the job with ZC_EPARAMEDIT naming the bucket and
 * segment, and leaves that parameter as the trainer wrote it.
 * Errors here: ZC_ESTATE (no plan registered, or in the middle of an
 * iteration: some buckets handed over, or the last step not completed yet);
 * the daemon's refusal comes through zc_last_error().
 * Ownership: nothing changes hands.
 * Threads:   any thread.  Blocking: no (one message).
 */
int zc_params_changed(zc_client *c);

/*
 * The latest error the daemon reported to this client that no future and no
 * waiting call carried (a refused zc_set_hyper(), a bad bucket handed over
 * without a future), or the job's failure; 0 if none. Each such error is
 * returned once: the next call returns 0 until a newer one comes. The job's
 * failure is returned every time. Its reason goes to this thread's
 * zc_error_message(), whatever other calls failed in between.
 * It reads what the client has processed (zc_future_wait(), zc_future_poll(),
 * zc_dispatch()... process what arrived), and processes nothing itself: an
 * error the daemon sent before a completion shows here once that completion
 * was seen.
 * Ownership: nothing changes hands.
 * Threads:   any thread.  Blocking: no.
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
 * Threads:   any thread; the client's lock is not held while sleeping, so
 *            other threads' calls on the client go on meanwhile.
 * Blocking:  up to timeout_ms.
 */
int zc_future_wait(zc_future *f, int timeout_ms);

/*
 * A completion callback: fn(f, result, arg) runs exactly once, when f
 * completes (result 1) or fails (result < 0, reason in zc_future_message(f)),
 * unless f is freed first (zc_future_free() cancels a callback that has not
 * started). One callback per future: a second call is ZC_ESTATE.
 * Where it runs: on the thread that finds f settled, inside the call that
 * processed the completion (zc_future_wait, zc_future_poll, zc_dispatch,
 * zc_bucket_ready, zc_step_future, zc_register_plan, zc_close ...), after that
 * call released the client's lock and before it returns; in zc_future_then()
 * itself when f is already settled. Callbacks run in the order their futures
 * settled. Nothing runs them unless some thread calls into the client: keep
 * one in zc_future_wait() or zc_fd() + zc_dispatch() while futures are out.
 * fn holds no lock of the client: it may call any function of the client
 * (hand the next bucket over, ask for a future, zc_future_free(f)) except
 * zc_close(); a callback that zc_close() runs must not call that client at
 * all. It should not block for long: it holds up the call that runs it.
 * Ownership: f stays the caller's; arg is passed through untouched.
 * Threads:   any thread.  Blocking: no (but fn may run inside this call).
 */
typedef void zc_future_cb(zc_future *f, int result, void *arg);
int zc_future_then(zc_future *f, zc_future_cb *fn, void *arg);

/*
 * The daemon's reason for a failed future (names the rank, bucket, ...); ""
 * if none, and for NULL.
 * Ownership: the string belongs to f, valid until zc_future_free(f).
 * Threads:   any thread.  Blocking: no.
 */
const char *zc_future_message(zc_future *f);

/*
 * Free a future, pending or not; a callback that has not started is
 * cancelled. Accepts NULL. May be called from f's own callback.
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
 * Process every message that has arrived: completes futures (and runs their
 * callbacks). Returns how many were processed (>= 0) or a negative code.
 * Ownership: nothing changes hands.
 * Threads:   any thread.  Blocking: no.
 */
int zc_dispatch(zc_client *c);

#ifdef __cplusplus
}
#endif

#endif /* ZEROCLIENT_H */
