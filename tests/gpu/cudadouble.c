/*
 * cudadouble.c — a TEST DOUBLE of exactly the CUDA runtime and NCCL entry
 * points zerod's CUDA backend calls (coll/nccl.c, optim/cuda.c, mem/cuda.c,
 * backend_cuda.c, cudacheck.c), plus kern.h's launcher, so that the
 * backend's control path runs in CI on machines without a GPU: stream order,
 * host-function completions, non-blocking NCCL, async errors and abort, IPC
 * opens. Linked only into tests; never installed, never linked into zerod.
 *
 * The model:
 *  - devices: cudadouble_reset() says how many; none answers
 *    cudaGetDeviceCount as a machine without a driver does (error 35).
 *  - memory: device memory is host memory, filled with NaN bytes by
 *    cudaMalloc. Every allocation remembers its device, and every kernel and
 *    collective is checked to touch only memory of its own device: a
 *    wrong-device bug in the backend is a counted violation, not a silent
 *    success.
 *  - streams: one thread each, running its tasks in order (kernels, host
 *    functions, collective parts), after an optional random delay so that
 *    streams interleave differently from run to run. Host functions run on
 *    that thread, as on CUDA's callback thread, and may make no CUDA or NCCL
 *    call (counted).
 *  - kernels: optim_cuda_launch() queues kern.h's optim_kern_item over the
 *    range: the element code the GPU runs, compiled for the host.
 *  - NCCL: communicators made from one unique id (or split from one) form a
 *    clique of threads in this process. A collective part waits on its
 *    stream until every rank of the clique has reached the same operation;
 *    the last one moves the data (sums in rank order, then one division for
 *    ncclAvg: the host backend's rounding). Non-blocking communicators
 *    answer ncclInProgress and take effect after cfg.inprogress_polls polls
 *    of ncclCommGetAsyncError, and a host function queued behind a
 *    collective that is not yet on its stream is a violation.
 *    ncclCommAbort ends the communicator's waiting parts and breaks the
 *    clique: the peers' communicators then report ncclRemoteError.
 *  - NCCL across processes (cfg.shm_cliques, ZEROD_CUDADOUBLE_SHM=1: two
 *    zerod-double daemons playing two nodes): a clique also meets in a
 *    shared file, /dev/shm/zerod-cudadouble-<hash of its id> (a split's key
 *    derives from its parent's, so every process finds the same one), with
 *    a process-shared mutex and condition. Each collective takes one of two
 *    slots (seq % 2: a rank cannot run two ahead of the slowest); every rank
 *    copies its contribution into the slot, and once all have arrived each
 *    computes its own result from the copies with the same code as in one
 *    process (sums in rank order, one division). A peer process that dies
 *    (checked by pid while waiting) or aborts breaks the clique: the waiting
 *    parts end and the communicators report ncclRemoteError. The last rank
 *    to join unlinks the file (the mappings live on).
 *  - across processes (a real zerod built with the double, trainers that
 *    dlopen it as libzeroclient's CUDA runtime: ZEROD_CUDART): device memory
 *    is a memfd mapping, and an IPC handle names the exporter's pid and fd,
 *    which the importer opens through /proc (same user, as CUDA's own IPC
 *    wants). Events are two counters in a memfd (recorded, completed): a
 *    record queues the next count on its stream, a wait queues a task that
 *    waits for the count recorded when the wait was issued (CUDA's
 *    semantics: a later record does not move it), or for the exporter to
 *    exit. A record notes the host time it ran at, which
 *    cudaEventElapsedTime subtracts (zerod-bench's GPU rows). ZEROD_CUDADOUBLE_DEVICES=n configures
 * a process that never calls cudadouble_reset() (n devices, a driver, no jitter).
 *  - what CUDA and NCCL refuse or do differently, as they do (issue 21 §2;
 *    tests/gpu/test_double.c shows each):
 *     - CUDA used in a child forked after its parent initialised CUDA fails
 *       with cudaErrorInitializationError (every call, NCCL's too);
 *     - small allocations are carved from 2 MiB blocks, never at a block's
 *       start: an IPC handle shares the whole block, and in the importer
 *       cuMemGetAddressRange of the opened pointer reports the block (in
 *       the exporter, the allocation, as cudaMalloc gave it);
 *     - a process opening its own IPC handle fails (201,
 *       cudaErrorDeviceUninitialized: "invalid device context");
 *       a handle opened twice gives the same pointer, counted, and each
 *       close matches an open;
 *     - memory imported from a process that has exited died with it: its
 *       bytes turn to garbage (0xff, NaN) before the importer's next task
 *       runs;
 *     - cudaFree waits for all work queued on the allocation's device;
 *     - pageable cudaMemcpy host to device returns before the bytes land:
 *       they land later on the device's legacy default stream, which the
 *       non-blocking streams do not wait for (cudaDeviceSynchronize,
 *       cudaStreamSynchronize(0), a device-to-host cudaMemcpy or an event
 *       recorded on stream 0 order after it); cudaMemset is asynchronous on
 *       that stream too;
 *     - host functions of all streams of one device run one at a time, in
 *       the order they become ready (CUDA's one callback thread);
 *     - a wait on an imported event ends only when the event completes,
 *       never because its exporter exited;
 *     - cudaEventRecord on a stream of another device than the event's
 *       fails with cudaErrorInvalidResourceHandle (stream 0: the current
 *       device's);
 *     - cudaStreamDestroy returns at once (briefly waiting for the queued
 *       work, so tests stay deterministic), its work finishing later;
 *     - NCCL: two threads issuing to communicators on one device at once (a
 *       group call, or a non-blocking one's settle: from its first
 *       collective until its work is on the streams) is a violation, and
 *       the collective kernels of one device run one at a time in launch
 *       order, each until every rank of its communicator has launched it:
 *       launch orders that differ between devices hang, as on a GPU (the
 *       double says so on stderr after 3 s).
 *    and it counts, for the product's tests, allocations and frees made
 *    while any stream has work queued (struct cudadouble_stats).
 *  - not modelled: graphs, peer-access limits, blocking streams' implicit
 *    order behind the legacy stream (every stream is non-blocking here).
 *
 * One mutex guards the double's state; data moves under it (tests are small).
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cuda.h>

#include "cudadouble.h"
#include "optim/kern.h"

#define ALIGN    256
#define BLOCK    ((size_t)2 << 20) /* the driver's sub-allocation block */
#define HEAD     512               /* where a block's first small allocation starts */
#define MAXDEV   64
#define SLOW_S   10 /* after this many seconds a wait says so on stderr */
#define TURN_S   3  /* ... a collective behind another of its device (below the
		     * tests' stall timeouts, so their logs show it) */

/* A block of device memory: a memfd small allocations are carved from (or
 * one large allocation's own). */
struct block {
	char *base;
	size_t size, used;
	int fd; /* -1: revoked (cudadouble_ipc_revoke) */
	uint64_t ino;
	int dev;
	unsigned users; /* allocations living in it */
	bool small;
	struct block *next;
};

struct alloc {
	char *base;    /* what cudaMalloc or cudaIpcOpenMemHandle gave */
	size_t size;   /* what was asked for (imported: the exporter's) */
	char *lo, *hi; /* device memory here: the allocation; imported, the whole block */
	int dev;
	struct block *blk; /* own: the block it is carved from */
	char *map;         /* imported: the block's mapping */
	size_t maplen;
	bool imported; /* opened from another process's handle */
	unsigned ipc_opens;
	int32_t src_pid; /* imported: which handle (exporter, block, offset) */
	uint64_t src_ino, src_off;
	bool dead; /* imported: its exporter exited, the bytes are garbage now */
	struct alloc *next;
};

/* Pinned host memory (cudaMallocHost): copies from it are not staged. */
struct pinned {
	void *p;
	size_t size;
	struct pinned *next;
};

enum dcoll { C_ALLREDUCE, C_REDUCESCATTER, C_REDUCE, C_BCAST, C_ALLGATHER };

struct dop {
	struct ncclComm *comm;
	enum dcoll kind;
	const float *send;
	float *recv;
	size_t count;
	int root;
	bool avg;
	ncclDataType_t type; /* ncclFloat32, ncclBfloat16, ncclFloat16 */
	uint64_t seq; /* the communicator's operation number, set when queued */
	struct turn *turn; /* its place in its device's launch order */
};

/* A collective kernel's place in its device's launch order (turns[dev]). */
struct turn {
	struct turn *prev, *next;
};

/* A collective issued in a group, not yet queued on its stream. */
struct pend {
	struct dop op;
	cudaStream_t stream;
	struct pend *next;
};

enum task_kind { T_HOST, T_KERN, T_COLL, T_EVREC, T_EVWAIT, T_COPY, T_SET };

/* An event's shared state (a memfd page both processes map). */
struct evshared {
	_Atomic uint64_t recorded, completed;
	int32_t owner_pid;
};

struct CUevent_st {
	struct evshared *sh;
	int fd;
	unsigned flags;
	bool imported;
	int dev;            /* the device it was made on (imported: the exporter's) */
	_Atomic int refs;   /* the handle and each task that names it */
	_Atomic int64_t done_ns; /* CLOCK_MONOTONIC when its latest record ran (timing) */
};

struct task {
	enum task_kind kind;
	cudaHostFn_t fn;
	void *arg;
	struct optim_kern kern;
	struct dop op;
	struct CUevent_st *ev; /* T_EVREC, T_EVWAIT: holds a reference */
	uint64_t evseq;
	void *dst; /* T_COPY, T_SET */
	const void *src;
	void *staged; /* T_COPY of a pageable cudaMemcpy: the staging copy, freed after */
	unsigned delay_us;
	int value;
	size_t bytes;
	struct task *next;
};

struct CUstream_st {
	int dev;
	pthread_t thr;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct task *head, *tail;
	uint64_t queued, done;
	bool quit, exited;
	bool legacy; /* the device's legacy default stream (stream 0) */
	unsigned seed;
	struct CUstream_st *next_all; /* streams, under mu; freed by cudadouble_reset */
};

/* One operation of a clique, while its parts arrive. */
struct slot {
	uint64_t seq;
	enum dcoll kind;
	size_t count;
	int root;
	bool avg;
	ncclDataType_t type;
	int arrived, departed;
	bool done;
	const float **send; /* [nranks] */
	float **recv;
	struct slot *next;
};

struct clique {
	char key[NCCL_UNIQUE_ID_BYTES];
	int nranks, joined, color;
	struct ncclComm **member; /* this process's members */
	bool broken;
	struct slot *slots;
	struct shclique *sh; /* cfg.shm_cliques: the clique across processes */
	size_t shlen;
	struct clique *next;
};

struct ncclComm {
	struct clique *cq;
	int rank, dev;
	bool blocking;
	bool init_pending; /* the clique is not complete yet */
	ncclResult_t async;
	unsigned polls_left;
	struct pend *deferred, *deferred_tail; /* collectives answered ncclInProgress */
	uint64_t next_seq, nsplits;
	bool aborted, destroyed;
	struct ncclComm *next_all;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static struct cudadouble_config cfg;
static bool env_configured; /* by ZEROD_CUDADOUBLE_DEVICES, not cudadouble_reset() */
static struct cudadouble_stats st;
static struct alloc *allocs;
static struct ncclComm *comms;
static struct clique *cliques;
static uint64_t ids;
static struct block *blocks;
static struct pinned *pinneds;
static struct CUstream_st *streams;      /* every stream made, live or destroyed */
static struct CUstream_st *legacy[MAXDEV]; /* made on first use */
static struct turn turns[MAXDEV];        /* collective kernels queued per device */
static unsigned hf_next[MAXDEV], hf_serving[MAXDEV]; /* host functions' tickets */
static struct {
	bool held;
	pthread_t who;
} issuer[MAXDEV]; /* the thread issuing NCCL work to a device now */
static atomic_bool cuda_inited; /* a CUDA call made in this process */
static atomic_bool forked;      /* ... and this is a child forked after it */

static _Thread_local int cur_dev;
static _Thread_local bool in_host_fn;
static _Thread_local cudaError_t last_err;
static _Thread_local int group_depth;
static _Thread_local bool group_async;
static _Thread_local struct pend *group_head, *group_tail;

/* ------------------------------------------------------------ helpers --- */

/* Under mu. */
static void violation(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void violation(const char *fmt, ...)
{
	char what[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	if (st.violations++ == 0)
		memcpy(st.first_violation, what, sizeof(what));
	/* a process configured by the environment (a test zerod, a trainer)
	 * has nobody reading the stats: its log says it (the first 20) */
	if (env_configured && st.violations <= 20)
		fprintf(stderr, "cudadouble: violation (process %d): %s\n", (int)getpid(), what);
}

static cudaError_t fail(cudaError_t e)
{
	last_err = e;
	return e;
}

/* A child forked after its parent initialised CUDA: CUDA does not support
 * it, and every call fails (said once on stderr, as the child's stats are
 * nobody's). */
static cudaError_t after_fork(const char *fn)
{
	static atomic_bool said;

	if (!atomic_exchange(&said, true))
		fprintf(stderr,
			"cudadouble: %s in process %d, forked after its parent initialised "
			"CUDA: cudaErrorInitializationError\n",
			fn, (int)getpid());
	return cudaErrorInitializationError;
}

/* Every CUDA entry point: none from a host function. */
#define CUDA_ENTER()                                                                               \
	do {                                                                                       \
		if (atomic_load(&forked))                                                          \
			return fail(after_fork(__func__));                                         \
		atomic_store(&cuda_inited, true);                                                  \
		if (in_host_fn) {                                                                  \
			pthread_mutex_lock(&mu);                                                   \
			violation("%s called from a host function", __func__);                     \
			pthread_mutex_unlock(&mu);                                                 \
			return fail(cudaErrorNotPermitted);                                        \
		}                                                                                  \
	} while (0)

#define NCCL_ENTER()                                                                               \
	do {                                                                                       \
		if (atomic_load(&forked)) {                                                        \
			(void)after_fork(__func__);                                                \
			return ncclUnhandledCudaError;                                             \
		}                                                                                  \
		if (in_host_fn) {                                                                  \
			pthread_mutex_lock(&mu);                                                   \
			violation("%s called from a host function", __func__);                     \
			pthread_mutex_unlock(&mu);                                                 \
			return ncclInvalidUsage;                                                   \
		}                                                                                  \
	} while (0)

/* Under mu: the allocation holding [p, p + bytes), or NULL. */
static struct alloc *find_alloc(const void *p, size_t bytes)
{
	const char *c = p;

	for (struct alloc *a = allocs; a; a = a->next)
		if (c >= a->lo && c < a->hi && bytes <= (size_t)(a->hi - c))
			return a;
	return NULL;
}

/* Under mu: [p, p + n floats) is memory of device dev (n == 0: anything). */
static bool on_dev(const void *p, size_t n, int dev, const char *what)
{
	struct alloc *a;

	if (n == 0)
		return true;
	a = find_alloc(p, n * sizeof(float));
	if (!a) {
		violation("%s: %zu floats at %p are not device memory", what, n, p);
		return false;
	}
	if (a->dev != dev) {
		violation("%s: memory of device %d used on device %d", what, a->dev, dev);
		return false;
	}
	return true;
}

/* A shared mapping of a fresh memfd of n bytes; -1 in *ret_fd on failure. */
static void *memfd_map(size_t n, int *ret_fd)
{
	int fd = memfd_create("cudadouble", MFD_CLOEXEC);
	void *p;

	*ret_fd = -1;
	if (fd < 0)
		return NULL;
	if (ftruncate(fd, (off_t)n) < 0 ||
	    (p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
		close(fd);
		return NULL;
	}
	*ret_fd = fd;
	return p;
}

/* Under mu: a block of device dev with n bytes free (a fresh one if none). */
static struct block *block_for(int dev, size_t n)
{
	bool small = n <= BLOCK - HEAD;
	struct block *b;
	struct stat sb;

	for (b = blocks; small && b; b = b->next)
		if (b->small && b->dev == dev && b->fd >= 0 && b->used + n <= b->size)
			return b;
	b = calloc(1, sizeof(*b));
	if (!b)
		return NULL;
	b->size = small ? BLOCK : (n + BLOCK - 1) / BLOCK * BLOCK;
	b->base = memfd_map(b->size, &b->fd);
	if (!b->base) {
		free(b);
		return NULL;
	}
	if (fstat(b->fd, &sb) == 0)
		b->ino = sb.st_ino;
	b->dev = dev;
	b->small = small;
	b->used = small ? HEAD : 0; /* a small allocation never starts its block */
	b->next = blocks;
	blocks = b;
	return b;
}

/* Under mu: one allocation fewer in b. */
static void block_put(struct block *b)
{
	struct block **pp;

	if (--b->users > 0)
		return;
	for (pp = &blocks; *pp != b; pp = &(*pp)->next)
		;
	*pp = b->next;
	munmap(b->base, b->size);
	if (b->fd >= 0)
		close(b->fd);
	free(b);
}

/* Under mu. */
static void alloc_free(struct alloc *a)
{
	if (a->imported)
		munmap(a->map, a->maplen);
	else
		block_put(a->blk);
	free(a);
}

static void on_fork_child(void)
{
	/* the parent's other threads (its streams) do not exist here */
	pthread_mutex_init(&mu, NULL);
	pthread_cond_init(&cv, NULL);
	if (atomic_load(&cuda_inited))
		atomic_store(&forked, true);
}

/* ZEROD_CUDADOUBLE_DEVICES: a process that never calls cudadouble_reset()
 * (a test zerod, a trainer that dlopens the double) gets that many devices. */
__attribute__((constructor)) static void env_config(void)
{
	const char *n = getenv("ZEROD_CUDADOUBLE_DEVICES");

	pthread_atfork(NULL, NULL, on_fork_child);
	for (int d = 0; d < MAXDEV; d++)
		turns[d].prev = turns[d].next = &turns[d];
	if (n && atoi(n) > 0) {
		cfg.ndevices = atoi(n) < MAXDEV ? atoi(n) : MAXDEV;
		cfg.driver_version = 13000;
		env_configured = true;
	}
	n = getenv("ZEROD_CUDADOUBLE_SHM");
	cfg.shm_cliques = n && atoi(n) > 0;
}

/* --------------------------------------------------------- the config --- */

static void stream_stop(struct CUstream_st *s);

void cudadouble_reset(const struct cudadouble_config *c)
{
	pthread_mutex_lock(&mu);
	if (st.live_streams || st.live_comms) {
		fprintf(stderr, "cudadouble_reset: %u streams and %u communicators still live\n",
			st.live_streams, st.live_comms);
		abort();
	}
	for (int d = 0; d < MAXDEV; d++)
		if (legacy[d]) {
			pthread_mutex_unlock(&mu);
			stream_stop(legacy[d]);
			pthread_mutex_lock(&mu);
			legacy[d] = NULL;
		}
	/* destroyed streams whose work is done (a stream stuck for ever is a
	 * failed test: abort says so) */
	for (int i = 0; streams; i++) {
		struct CUstream_st *x = streams;
		pthread_mutex_lock(&x->mu);
		bool gone = x->exited;
		pthread_mutex_unlock(&x->mu);
		if (!gone) {
			if (i > 5000) {
				fprintf(stderr, "cudadouble_reset: a destroyed stream's work never "
						"ended\n");
				abort();
			}
			pthread_mutex_unlock(&mu);
			usleep(1000);
			pthread_mutex_lock(&mu);
			continue;
		}
		streams = x->next_all;
		pthread_cond_destroy(&x->cv);
		pthread_mutex_destroy(&x->mu);
		free(x);
	}
	while (allocs) {
		struct alloc *a = allocs;
		allocs = a->next;
		alloc_free(a);
	}
	while (pinneds) {
		struct pinned *x = pinneds;
		pinneds = x->next;
		free(x->p);
		free(x);
	}
	while (comms) {
		struct ncclComm *x = comms;
		comms = x->next_all;
		while (x->deferred) {
			struct pend *p = x->deferred;
			x->deferred = p->next;
			free(p);
		}
		free(x);
	}
	while (cliques) {
		struct clique *q = cliques;
		cliques = q->next;
		if (q->sh)
			munmap(q->sh, q->shlen);
		while (q->slots) {
			struct slot *s = q->slots;
			q->slots = s->next;
			free(s->send);
			free(s->recv);
			free(s);
		}
		free(q->member);
		free(q);
	}
	for (int d = 0; d < MAXDEV; d++) {
		hf_next[d] = hf_serving[d] = 0;
		issuer[d].held = false;
		turns[d].prev = turns[d].next = &turns[d]; /* what aborted parts left */
	}
	memset(&st, 0, sizeof(st));
	cfg = *c;
	if (cfg.ndevices > MAXDEV)
		cfg.ndevices = MAXDEV;
	env_configured = false;
	pthread_mutex_unlock(&mu);
}

void cudadouble_stats(struct cudadouble_stats *ret)
{
	pthread_mutex_lock(&mu);
	*ret = st;
	pthread_mutex_unlock(&mu);
}

void cudadouble_uuid(int dev, uint8_t ret[16])
{
	for (int i = 0; i < 16; i++)
		ret[i] = (uint8_t)(0x5a ^ (i * 17) ^ (dev << 4) ^ dev);
}

void cudadouble_ipc_revoke(void *p)
{
	struct alloc *a;

	pthread_mutex_lock(&mu);
	a = find_alloc(p, 1);
	if (a && !a->imported && a->blk->fd >= 0) {
		close(a->blk->fd);
		a->blk->fd = -1;
	}
	pthread_mutex_unlock(&mu);
}

void cudadouble_nccl_fail(int rank, ncclResult_t err)
{
	pthread_mutex_lock(&mu);
	for (struct ncclComm *c = comms; c; c = c->next_all)
		if (c->rank == rank && !c->aborted && !c->destroyed)
			c->async = err;
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
}

/* ---------------------------------------------------------- devices --- */

cudaError_t cudaGetDeviceCount(int *count)
{
	CUDA_ENTER();
	if (cfg.ndevices <= 0) {
		*count = 0;
		return fail(cfg.count_error ? cfg.count_error : cudaErrorInsufficientDriver);
	}
	*count = cfg.ndevices;
	return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *v)
{
	CUDA_ENTER();
	*v = cfg.driver_version;
	return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *v)
{
	CUDA_ENTER();
	*v = CUDART_VERSION;
	return cudaSuccess;
}

cudaError_t cudaSetDevice(int dev)
{
	CUDA_ENTER();
	if (cfg.ndevices <= 0)
		return fail(cudaErrorInsufficientDriver);
	if (dev < 0 || dev >= cfg.ndevices)
		return fail(cudaErrorInvalidDevice);
	cur_dev = dev;
	return cudaSuccess;
}

cudaError_t cudaGetDevice(int *dev)
{
	CUDA_ENTER();
	*dev = cur_dev;
	return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int dev)
{
	CUDA_ENTER();
	if (dev < 0 || dev >= cfg.ndevices)
		return fail(cudaErrorInvalidDevice);
	memset(prop, 0, sizeof(*prop));
	snprintf(prop->name, sizeof(prop->name), "cudadouble device %d", dev);
	cudadouble_uuid(dev, (uint8_t *)prop->uuid.bytes);
	prop->totalGlobalMem = (size_t)1 << 34;
	return cudaSuccess;
}

cudaError_t cudaGetLastError(void)
{
	cudaError_t e = last_err;

	last_err = cudaSuccess;
	return e;
}

cudaError_t cudaPeekAtLastError(void)
{
	return last_err;
}

const char *cudaGetErrorName(cudaError_t e)
{
	switch (e) {
	case cudaSuccess:
		return "cudaSuccess";
	case cudaErrorInvalidValue:
		return "cudaErrorInvalidValue";
	case cudaErrorMemoryAllocation:
		return "cudaErrorMemoryAllocation";
	case cudaErrorInsufficientDriver:
		return "cudaErrorInsufficientDriver";
	case cudaErrorNoDevice:
		return "cudaErrorNoDevice";
	case cudaErrorInvalidDevice:
		return "cudaErrorInvalidDevice";
	case cudaErrorInvalidResourceHandle:
		return "cudaErrorInvalidResourceHandle";
	case cudaErrorInvalidDevicePointer:
		return "cudaErrorInvalidDevicePointer";
	case cudaErrorNotPermitted:
		return "cudaErrorNotPermitted";
	case cudaErrorInitializationError:
		return "cudaErrorInitializationError";
	case cudaErrorDeviceUninitialized:
		return "cudaErrorDeviceUninitialized";
	default:
		return "cudaErrorUnknown (test double)";
	}
}

const char *cudaGetErrorString(cudaError_t e)
{
	switch (e) {
	case cudaSuccess:
		return "no error";
	case cudaErrorInsufficientDriver:
		return "CUDA driver version is insufficient for CUDA runtime version";
	case cudaErrorNoDevice:
		return "no CUDA-capable device is detected";
	case cudaErrorInvalidResourceHandle:
		return "invalid resource handle";
	case cudaErrorInitializationError:
		return "initialization error";
	case cudaErrorDeviceUninitialized:
		return "invalid device context";
	default:
		return "error (test double)";
	}
}

/* ---------------------------------------------------------- memory --- */

static cudaStream_t legacy_stream(int dev);
static void stream_drain(cudaStream_t s);
static void device_drain(int dev, const char *why);
static void stream_push(cudaStream_t s, struct task *t);
static cudaError_t push_copy(cudaStream_t s, void *dst, void *staged, size_t n, unsigned delay);

/* Under mu: whether any stream has work queued (the counters of struct
 * cudadouble_stats: an allocation or free then is one during a step). */
static bool any_stream_busy(void)
{
	bool busy = false;

	for (struct CUstream_st *s = streams; s && !busy; s = s->next_all) {
		pthread_mutex_lock(&s->mu);
		busy = s->done < s->queued;
		pthread_mutex_unlock(&s->mu);
	}
	return busy;
}

/* Under mu: count an allocation or free made while work is queued. */
static void count_busy(const char *fn, size_t bytes, bool alloc)
{
	if (!any_stream_busy())
		return;
	if (alloc)
		st.mallocs_busy++;
	else
		st.frees_busy++;
	if (!st.first_busy[0])
		snprintf(st.first_busy, sizeof(st.first_busy),
			 "%s(%zu bytes) on device %d while streams had work queued", fn, bytes,
			 cur_dev);
}

cudaError_t cudaMalloc(void **p, size_t size)
{
	size_t n = (size ? size + ALIGN - 1 : ALIGN) / ALIGN * ALIGN;
	struct alloc *a;
	struct block *b;

	CUDA_ENTER();
	if (cfg.ndevices <= 0)
		return fail(cudaErrorInsufficientDriver);
	a = calloc(1, sizeof(*a));
	if (!a)
		return fail(cudaErrorMemoryAllocation);
	pthread_mutex_lock(&mu);
	count_busy("cudaMalloc", size, true);
	b = block_for(cur_dev, n);
	if (!b) {
		pthread_mutex_unlock(&mu);
		free(a);
		return fail(cudaErrorMemoryAllocation);
	}
	a->base = b->base + b->used;
	b->used += n;
	b->users++;
	a->blk = b;
	memset(a->base, 0xff, n); /* NaNs: a read of what was never written shows */
	a->size = size;
	a->lo = a->base;
	a->hi = a->base + size;
	a->dev = cur_dev;
	a->next = allocs;
	allocs = a;
	st.live_allocs++;
	pthread_mutex_unlock(&mu);
	*p = a->base;
	return cudaSuccess;
}

cudaError_t cudaFree(void *p)
{
	struct alloc **pp, *a;
	int dev;

	CUDA_ENTER();
	if (!p)
		return cudaSuccess;
	pthread_mutex_lock(&mu);
	for (pp = &allocs; *pp && ((*pp)->base != p || (*pp)->imported); pp = &(*pp)->next)
		;
	if (!*pp) {
		violation("cudaFree(%p): not an allocation", p);
		pthread_mutex_unlock(&mu);
		return fail(cudaErrorInvalidValue);
	}
	dev = (*pp)->dev;
	count_busy("cudaFree", (*pp)->size, false);
	pthread_mutex_unlock(&mu);
	/* CUDA: cudaFree synchronises the device */
	device_drain(dev, "cudaFree");
	pthread_mutex_lock(&mu);
	for (pp = &allocs; *pp && ((*pp)->base != p || (*pp)->imported); pp = &(*pp)->next)
		;
	a = *pp;
	if (a) {
		*pp = a->next;
		st.live_allocs--;
		alloc_free(a);
	}
	pthread_mutex_unlock(&mu);
	return cudaSuccess;
}

/* Pinned host memory: host memory to the double, remembered so that its
 * copies are not staged, counted with the device allocations so that a
 * leak shows. */
cudaError_t cudaMallocHost(void **p, size_t size)
{
	struct pinned *x;

	CUDA_ENTER();
	if (cfg.ndevices <= 0)
		return fail(cudaErrorInsufficientDriver);
	x = calloc(1, sizeof(*x));
	if (!x || !(x->p = malloc(size ? size : 1))) {
		free(x);
		return fail(cudaErrorMemoryAllocation);
	}
	x->size = size;
	pthread_mutex_lock(&mu);
	count_busy("cudaMallocHost", size, true);
	x->next = pinneds;
	pinneds = x;
	st.live_allocs++;
	pthread_mutex_unlock(&mu);
	*p = x->p;
	return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p)
{
	struct pinned **pp, *x;

	CUDA_ENTER();
	if (!p)
		return cudaSuccess;
	pthread_mutex_lock(&mu);
	for (pp = &pinneds; *pp && (*pp)->p != p; pp = &(*pp)->next)
		;
	x = *pp;
	if (!x) {
		violation("cudaFreeHost(%p): not from cudaMallocHost", p);
		pthread_mutex_unlock(&mu);
		return fail(cudaErrorInvalidValue);
	}
	*pp = x->next;
	count_busy("cudaFreeHost", x->size, false);
	st.live_allocs--;
	pthread_mutex_unlock(&mu);
	free(x->p);
	free(x);
	return cudaSuccess;
}

/* Under mu: [p, p + n) is pinned host memory. */
static bool is_pinned(const void *p, size_t n)
{
	const char *c = p;

	for (struct pinned *x = pinneds; x; x = x->next)
		if (c >= (char *)x->p && c + n <= (char *)x->p + x->size)
			return true;
	return false;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind)
{
	bool ok = true, staged;
	struct alloc *a;
	int dev = cur_dev;
	void *copy;

	CUDA_ENTER();
	pthread_mutex_lock(&mu);
	if (kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice)
		ok = (a = find_alloc(dst, n)) != NULL && ((dev = a->dev), true);
	if (kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice)
		ok = ok && (a = find_alloc(src, n)) != NULL && ((dev = a->dev), true);
	if (!ok)
		violation("cudaMemcpy of %zu bytes: a device side is not device memory", n);
	staged = kind == cudaMemcpyHostToDevice && !is_pinned(src, n);
	pthread_mutex_unlock(&mu);
	if (!ok)
		return fail(cudaErrorInvalidValue);
	if (staged) {
		/* CUDA returns once the pageable bytes are staged; the DMA to the
		 * device lands later, on the legacy stream */
		copy = malloc(n ? n : 1);
		if (!copy)
			return fail(cudaErrorMemoryAllocation);
		memcpy(copy, src, n);
		return push_copy(legacy_stream(dev), dst, copy, n,
				 cfg.pageable_land_us ? cfg.pageable_land_us : 3000);
	}
	/* the legacy stream's earlier work first (the pageable copies) */
	stream_drain(legacy_stream(dev));
	memmove(dst, src, n);
	return cudaSuccess;
}

/* cudaMemset is asynchronous: on the legacy stream of dst's device. */
cudaError_t cudaMemset(void *dst, int value, size_t n)
{
	struct alloc *a;
	struct task *t;
	int dev;

	CUDA_ENTER();
	pthread_mutex_lock(&mu);
	a = find_alloc(dst, n);
	dev = a ? a->dev : 0;
	if (!a)
		violation("cudaMemset of %zu bytes: not device memory", n);
	pthread_mutex_unlock(&mu);
	if (!a)
		return fail(cudaErrorInvalidValue);
	t = calloc(1, sizeof(*t));
	if (!t)
		return fail(cudaErrorMemoryAllocation);
	*t = (struct task){.kind = T_SET, .dst = dst, .value = value, .bytes = n};
	stream_push(legacy_stream(dev), t);
	return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
	CUDA_ENTER();
	device_drain(cur_dev, NULL);
	return cudaSuccess;
}

/* Stream 0 (and CUDA's legacy and per-thread handles): the current
 * device's legacy stream. */
static cudaStream_t resolve(cudaStream_t s)
{
	if (s == NULL || s == cudaStreamLegacy || s == cudaStreamPerThread)
		return legacy_stream(cur_dev);
	return s;
}

/* Under mu: a stream task's device sides are device memory of the stream's
 * device (host sides are anything, as pageable memory is to CUDA). */
static bool async_ok(cudaStream_t s, const void *dst, const void *src, size_t n,
		     enum cudaMemcpyKind kind, const char *what)
{
	bool ok = s->dev == cur_dev;

	if (!ok)
		violation("%s on a stream of device %d, device %d current", what, s->dev, cur_dev);
	if (kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice)
		ok = ok && find_alloc(dst, n) != NULL;
	if (kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice)
		ok = ok && find_alloc(src, n) != NULL;
	if (!ok)
		violation("%s of %zu bytes: a device side is not device memory", what, n);
	return ok;
}

static cudaError_t push_task(cudaStream_t s, struct task tmpl)
{
	struct task *t = malloc(sizeof(*t));

	if (!t)
		return fail(cudaErrorMemoryAllocation);
	*t = tmpl;
	stream_push(s, t);
	return cudaSuccess;
}

static cudaError_t push_copy(cudaStream_t s, void *dst, void *staged, size_t n, unsigned delay)
{
	return push_task(s, (struct task){.kind = T_COPY,
					  .dst = dst,
					  .src = staged,
					  .staged = staged,
					  .bytes = n,
					  .delay_us = delay});
}

cudaError_t cudaMemsetAsync(void *dst, int value, size_t n, cudaStream_t s)
{
	bool ok;

	CUDA_ENTER();
	s = resolve(s);
	pthread_mutex_lock(&mu);
	ok = async_ok(s, dst, NULL, n, cudaMemcpyHostToDevice, "cudaMemsetAsync");
	pthread_mutex_unlock(&mu);
	if (!ok)
		return fail(cudaErrorInvalidValue);
	return push_task(s, (struct task){.kind = T_SET, .dst = dst, .value = value, .bytes = n});
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
			    cudaStream_t s)
{
	bool ok;

	CUDA_ENTER();
	s = resolve(s);
	pthread_mutex_lock(&mu);
	ok = async_ok(s, dst, src, n, kind, "cudaMemcpyAsync");
	pthread_mutex_unlock(&mu);
	if (!ok)
		return fail(cudaErrorInvalidValue);
	return push_task(s, (struct task){.kind = T_COPY, .dst = dst, .src = src, .bytes = n});
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attr, const void *p)
{
	struct alloc *a;

	CUDA_ENTER();
	memset(attr, 0, sizeof(*attr));
	pthread_mutex_lock(&mu);
	a = find_alloc(p, 1);
	if (a) {
		attr->type = cudaMemoryTypeDevice;
		attr->device = a->dev;
		attr->devicePointer = (void *)p;
	} else {
		attr->type = cudaMemoryTypeUnregistered;
	}
	pthread_mutex_unlock(&mu);
	return cudaSuccess;
}

/* ------------------------------------------------------------- IPC --- */

struct ipc_payload {
	char magic[8];
	int dev;
	int32_t pid, fd; /* the exporter and its block's memfd */
	uint64_t ino;    /* the memfd's inode: a reused fd number is not it */
	uint64_t off;    /* the allocation's offset in its block */
	uint64_t size, blksize;
};

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *h, void *p)
{
	struct ipc_payload pl = {.magic = "zdipc"};
	struct alloc *a;

	CUDA_ENTER();
	pthread_mutex_lock(&mu);
	a = find_alloc(p, 1);
	if (a && !a->imported) {
		pl.dev = a->dev;
		pl.pid = getpid();
		pl.fd = a->blk->fd;
		pl.ino = a->blk->ino;
		pl.off = (uint64_t)(a->base - a->blk->base);
		pl.size = a->size;
		pl.blksize = a->blk->size;
	}
	pthread_mutex_unlock(&mu);
	if (!a || a->imported)
		return fail(cudaErrorInvalidValue);
	memset(h, 0, sizeof(*h));
	memcpy(h->reserved, &pl, sizeof(pl));
	return cudaSuccess;
}

/* Another process's allocation: its whole block, through /proc. */
static cudaError_t ipc_import(void **p, const struct ipc_payload *pl)
{
	struct stat sb;
	struct alloc *a;
	char path[64];
	int fd;

	if (pl->dev < 0 || pl->dev >= cfg.ndevices || pl->fd < 0 || pl->size == 0 ||
	    pl->blksize == 0 || pl->off + pl->size > pl->blksize)
		return fail(cudaErrorInvalidResourceHandle);
	pthread_mutex_lock(&mu);
	for (a = allocs; a; a = a->next)
		if (a->imported && a->src_pid == pl->pid && a->src_ino == pl->ino &&
		    a->src_off == pl->off) {
			/* opened here already: CUDA counts it and gives the same pointer */
			a->ipc_opens++;
			st.ipc_open++;
			*p = a->base;
			pthread_mutex_unlock(&mu);
			return cudaSuccess;
		}
	pthread_mutex_unlock(&mu);
	snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)pl->pid, (int)pl->fd);
	fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return fail(cudaErrorInvalidResourceHandle);
	if (fstat(fd, &sb) < 0 || sb.st_ino != pl->ino) {
		close(fd);
		return fail(cudaErrorInvalidResourceHandle); /* freed, its fd reused */
	}
	a = calloc(1, sizeof(*a));
	if (!a) {
		close(fd);
		return fail(cudaErrorMemoryAllocation);
	}
	a->map = mmap(NULL, pl->blksize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (a->map == MAP_FAILED) {
		free(a);
		return fail(cudaErrorInvalidResourceHandle);
	}
	a->maplen = pl->blksize;
	a->base = a->map + pl->off;
	a->size = pl->size;
	a->lo = a->map; /* the whole block is mapped, neighbours included */
	a->hi = a->map + pl->blksize;
	a->dev = pl->dev;
	a->imported = true;
	a->ipc_opens = 1;
	a->src_pid = pl->pid;
	a->src_ino = pl->ino;
	a->src_off = pl->off;
	pthread_mutex_lock(&mu);
	a->next = allocs;
	allocs = a;
	st.ipc_open++;
	pthread_mutex_unlock(&mu);
	*p = a->base;
	return cudaSuccess;
}

cudaError_t cudaIpcOpenMemHandle(void **p, cudaIpcMemHandle_t h, unsigned int flags)
{
	struct ipc_payload pl;

	CUDA_ENTER();
	memcpy(&pl, h.reserved, sizeof(pl));
	if (flags != cudaIpcMemLazyEnablePeerAccess)
		return fail(cudaErrorInvalidValue); /* CUDA requires exactly this flag */
	if (memcmp(pl.magic, "zdipc", 6) != 0)
		return fail(cudaErrorInvalidResourceHandle);
	if (pl.pid == getpid()) {
		/* CUDA refuses a process its own handles */
		pthread_mutex_lock(&mu);
		violation("cudaIpcOpenMemHandle of a handle this process exported "
			  "(CUDA: cudaErrorDeviceUninitialized, invalid device context)");
		pthread_mutex_unlock(&mu);
		return fail(cudaErrorDeviceUninitialized);
	}
	return ipc_import(p, &pl);
}

cudaError_t cudaIpcCloseMemHandle(void *p)
{
	struct alloc *a, **pp;

	CUDA_ENTER();
	pthread_mutex_lock(&mu);
	for (pp = &allocs; *pp && !((*pp)->imported && (*pp)->base == p); pp = &(*pp)->next)
		;
	a = *pp;
	if (!a) {
		violation("cudaIpcCloseMemHandle(%p): not an opened handle", p);
		pthread_mutex_unlock(&mu);
		return fail(cudaErrorInvalidValue);
	}
	st.ipc_open--;
	if (--a->ipc_opens == 0) {
		*pp = a->next;
		alloc_free(a);
	}
	pthread_mutex_unlock(&mu);
	return cudaSuccess;
}

/* cuMemGetAddressRange: of an allocation made here, the allocation; of an
 * opened handle, the whole block the importer mapped. */
static CUresult dbl_mem_range(CUdeviceptr *base, size_t *size, CUdeviceptr p)
{
	struct alloc *a;

	pthread_mutex_lock(&mu);
	a = find_alloc((void *)(uintptr_t)p, 1);
	if (a) {
		*base = (CUdeviceptr)(uintptr_t)(a->imported ? a->map : a->base);
		*size = a->imported ? a->maplen : a->size;
	}
	pthread_mutex_unlock(&mu);
	return a ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn, unsigned int version,
					     unsigned long long flags,
					     enum cudaDriverEntryPointQueryResult *status)
{
	CUDA_ENTER();
	(void)version;
	(void)flags;
	*fn = NULL;
	*status = cudaDriverEntryPointSymbolNotFound;
	if (strcmp(symbol, "cuMemGetAddressRange") == 0) {
		*fn = (void *)dbl_mem_range;
		*status = cudaDriverEntryPointSuccess;
	}
	return cudaSuccess;
}

/* ---------------------------------------------------------- streams --- */

static void coll_part(struct dop *op);

static void ev_complete(struct evshared *ev, uint64_t seq)
{
	uint64_t c = atomic_load(&ev->completed);

	while (c < seq && !atomic_compare_exchange_weak(&ev->completed, &c, seq))
		;
}

static void ev_put(struct CUevent_st *e)
{
	if (atomic_fetch_sub(&e->refs, 1) != 1)
		return;
	munmap(e->sh, sizeof(*e->sh));
	if (e->fd >= 0)
		close(e->fd);
	free(e);
}

/* Until the event's count reaches seq. Its exporter's exit does not end it
 * (CUDA's does not either): a stream behind a dead trainer's event waits
 * for ever, and after SLOW_S seconds says so once. */
static void ev_wait(struct evshared *ev, uint64_t seq)
{
	struct timespec t0, t;
	bool said = false;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (unsigned i = 0; atomic_load(&ev->completed) < seq; i++) {
		if (!said && i % 4096 == 4095) {
			clock_gettime(CLOCK_MONOTONIC, &t);
			if (t.tv_sec - t0.tv_sec >= SLOW_S) {
				said = true;
				fprintf(stderr,
					"cudadouble: process %d: a stream has waited %d s for an "
					"event of process %d%s; it waits on\n",
					(int)getpid(), SLOW_S, (int)ev->owner_pid,
					ev->owner_pid > 0 && kill(ev->owner_pid, 0) < 0 &&
							errno == ESRCH
						? ", which exited"
						: "");
			}
		}
		usleep(50);
	}
}

/* A host function: one at a time per device, in the order they become
 * ready (CUDA runs a device's host functions on one thread). */
static void run_host_fn(struct CUstream_st *s, struct task *t)
{
	unsigned ticket;

	pthread_mutex_lock(&mu);
	ticket = hf_next[s->dev]++;
	while (hf_serving[s->dev] != ticket)
		pthread_cond_wait(&cv, &mu);
	pthread_mutex_unlock(&mu);
	in_host_fn = true;
	t->fn(t->arg);
	in_host_fn = false;
	pthread_mutex_lock(&mu);
	hf_serving[s->dev]++;
	st.host_funcs++;
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
}

static void run_task(struct CUstream_st *s, struct task *t)
{
	switch (t->kind) {
	case T_HOST:
		run_host_fn(s, t);
		return;
	case T_KERN:
		for (uint64_t i = 0, n = optim_kern_items(&t->kern); i < n; i++)
			optim_kern_item(&t->kern, i);
		pthread_mutex_lock(&mu);
		st.kernels++;
		pthread_mutex_unlock(&mu);
		return;
	case T_COLL:
		coll_part(&t->op);
		return;
	case T_EVREC: {
		struct timespec ts;

		clock_gettime(CLOCK_MONOTONIC, &ts);
		atomic_store(&t->ev->done_ns, (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec);
		ev_complete(t->ev->sh, t->evseq);
		ev_put(t->ev);
		return;
	}
	case T_EVWAIT:
		ev_wait(t->ev->sh, t->evseq);
		ev_put(t->ev);
		return;
	case T_COPY:
		if (t->delay_us)
			usleep(t->delay_us);
		memmove(t->dst, t->src, t->bytes);
		free(t->staged);
		return;
	case T_SET:
		memset(t->dst, t->value, t->bytes);
		return;
	}
}

static bool pid_gone(pid_t pid);

/* An imported allocation whose exporter has exited: the memory died with
 * it (CUDA: the exporter freeing it before the importer's close is
 * undefined behaviour). The double makes it garbage, every byte 0xff (a
 * NaN for floats, bf16 and fp16), so that a product that still reads it
 * after the death computes NaNs its tests see. Checked before a task runs,
 * at most once a millisecond. */
static void poison_dead_imports(void)
{
	static _Atomic int64_t last_ns;
	struct timespec ts;
	int64_t now;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	now = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
	if (now - atomic_load(&last_ns) < 1000000)
		return;
	atomic_store(&last_ns, now);
	pthread_mutex_lock(&mu);
	for (struct alloc *a = allocs; a; a = a->next)
		if (a->imported && !a->dead && pid_gone(a->src_pid)) {
			memset(a->map, 0xff, a->maplen);
			a->dead = true;
		}
	pthread_mutex_unlock(&mu);
}

static void *stream_main(void *arg)
{
	struct CUstream_st *s = arg;

	pthread_mutex_lock(&s->mu);
	for (;;) {
		struct task *t;

		while (!s->head && !s->quit)
			pthread_cond_wait(&s->cv, &s->mu);
		if (!s->head)
			break;
		t = s->head;
		s->head = t->next;
		if (!s->head)
			s->tail = NULL;
		pthread_mutex_unlock(&s->mu);
		if (cfg.jitter_us)
			usleep((useconds_t)(rand_r(&s->seed) % cfg.jitter_us));
		poison_dead_imports();
		run_task(s, t);
		free(t);
		pthread_mutex_lock(&s->mu);
		s->done++;
		pthread_cond_broadcast(&s->cv);
	}
	s->exited = true;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

static void stream_push(cudaStream_t s, struct task *t)
{
	t->next = NULL;
	pthread_mutex_lock(&s->mu);
	if (s->tail)
		s->tail->next = t;
	else
		s->head = t;
	s->tail = t;
	s->queued++;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
}

/* A stream of device dev, its thread started, on the list (not counted). */
static struct CUstream_st *stream_new(int dev, bool is_legacy)
{
	static atomic_uint nstreams;
	struct CUstream_st *s = calloc(1, sizeof(*s));

	if (!s)
		return NULL;
	s->dev = dev;
	s->legacy = is_legacy;
	s->seed = cfg.seed + atomic_fetch_add(&nstreams, 1);
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cv, NULL);
	if (pthread_create(&s->thr, NULL, stream_main, s) != 0) {
		pthread_cond_destroy(&s->cv);
		pthread_mutex_destroy(&s->mu);
		free(s);
		return NULL;
	}
	pthread_detach(s->thr);
	pthread_mutex_lock(&mu);
	s->next_all = streams;
	streams = s;
	pthread_mutex_unlock(&mu);
	return s;
}

/* The device's legacy default stream (stream 0), made on first use. */
static cudaStream_t legacy_stream(int dev)
{
	struct CUstream_st *s;

	if (dev < 0 || dev >= MAXDEV)
		dev = 0;
	pthread_mutex_lock(&mu);
	s = legacy[dev];
	pthread_mutex_unlock(&mu);
	if (s)
		return s;
	s = stream_new(dev, true);
	if (!s)
		abort(); /* the double cannot go on without it */
	pthread_mutex_lock(&mu);
	if (legacy[dev]) { /* another thread made it first: this one stays idle */
		pthread_mutex_unlock(&mu);
		return legacy[dev];
	}
	legacy[dev] = s;
	pthread_mutex_unlock(&mu);
	return s;
}

/* Until what s has queued now is done. */
static void stream_drain(cudaStream_t s)
{
	pthread_mutex_lock(&s->mu);
	uint64_t target = s->queued;
	while (s->done < target)
		pthread_cond_wait(&s->cv, &s->mu);
	pthread_mutex_unlock(&s->mu);
}

/* Until the work queued now on every stream of dev is done (streams are
 * never freed before cudadouble_reset, so the list is safe to walk). A wait
 * longer than SLOW_S seconds says so once (`why`: the call that waits). */
static void device_drain(int dev, const char *why)
{
	struct CUstream_st *s;

	pthread_mutex_lock(&mu);
	s = streams;
	pthread_mutex_unlock(&mu);
	for (; s; s = s->next_all) {
		struct timespec ts;
		bool said = false;

		if (s->dev != dev)
			continue;
		pthread_mutex_lock(&s->mu);
		uint64_t target = s->queued;
		while (s->done < target) {
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_sec += SLOW_S;
			if (pthread_cond_timedwait(&s->cv, &s->mu, &ts) == ETIMEDOUT && !said &&
			    why) {
				said = true;
				fprintf(stderr,
					"cudadouble: process %d: %s has waited %d s for the work "
					"queued on device %d (CUDA's synchronises the device)\n",
					(int)getpid(), why, SLOW_S, dev);
			}
		}
		pthread_mutex_unlock(&s->mu);
	}
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *ret, unsigned int flags);

/* (zerod-bench's GPU rows) */
cudaError_t cudaStreamCreate(cudaStream_t *ret)
{
	return cudaStreamCreateWithFlags(ret, cudaStreamDefault);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *ret, unsigned int flags)
{
	struct CUstream_st *s;

	CUDA_ENTER();
	(void)flags;
	if (cfg.ndevices <= 0)
		return fail(cudaErrorInsufficientDriver);
	s = stream_new(cur_dev, false);
	if (!s)
		return fail(cudaErrorMemoryAllocation);
	pthread_mutex_lock(&mu);
	st.live_streams++;
	pthread_mutex_unlock(&mu);
	*ret = s;
	return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
	CUDA_ENTER();
	stream_drain(resolve(s));
	return cudaSuccess;
}

/* Asks s's thread to stop once its work is done. */
static void stream_stop(struct CUstream_st *s)
{
	pthread_mutex_lock(&s->mu);
	s->quit = true;
	pthread_cond_broadcast(&s->cv);
	while (!s->exited)
		pthread_cond_wait(&s->cv, &s->mu);
	pthread_mutex_unlock(&s->mu);
}

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
	struct timespec ts;

	CUDA_ENTER();
	if (!s || s->legacy)
		return fail(cudaErrorInvalidResourceHandle);
	/* CUDA returns at once and releases the stream when its work is done;
	 * the double waits for that a moment (tests count streams after a
	 * close), never for ever: a stream stuck behind an event that never
	 * completes stays stuck, as on a GPU */
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_nsec += 200 * 1000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&s->mu);
	s->quit = true;
	pthread_cond_broadcast(&s->cv);
	while (!s->exited && pthread_cond_timedwait(&s->cv, &s->mu, &ts) != ETIMEDOUT)
		;
	pthread_mutex_unlock(&s->mu);
	pthread_mutex_lock(&mu);
	st.live_streams--;
	pthread_mutex_unlock(&mu);
	return cudaSuccess;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *arg)
{
	struct task *t;

	CUDA_ENTER();
	s = resolve(s);
	pthread_mutex_lock(&mu);
	if (s->dev != cur_dev)
		violation("host function on a stream of device %d, device %d current", s->dev,
			  cur_dev);
	for (struct ncclComm *c = comms; c; c = c->next_all)
		for (struct pend *p = c->deferred; p; p = p->next)
			if (p->stream == s)
				violation("host function queued before the ncclInProgress "
					  "collective it follows reached its stream");
	pthread_mutex_unlock(&mu);
	t = calloc(1, sizeof(*t));
	if (!t)
		return fail(cudaErrorMemoryAllocation);
	t->kind = T_HOST;
	t->fn = fn;
	t->arg = arg;
	stream_push(s, t);
	return cudaSuccess;
}

/* kern.h's launcher: the kernel body, on the stream's thread. */
cudaError_t optim_cuda_launch(const struct optim_kern *a, cudaStream_t s)
{
	const bool sgd = a->kind == ZC_OPT_SGD, lowp = a->dtype != ZC_DTYPE_F32;
	/* on_dev counts floats: a bf16/fp16 buffer of n elements is n / 2 */
	const size_t pn = lowp ? (a->n + 1) / 2 : a->n;
	uint64_t items = optim_kern_items(a);
	bool ok;
	struct task *t;

	CUDA_ENTER();
	if (a->n == 0)
		return cudaSuccess;
	pthread_mutex_lock(&mu);
	ok = s->dev == cur_dev;
	if (!ok)
		violation("kernel on a stream of device %d, device %d current", s->dev, cur_dev);
	switch (a->op) {
	case OPTIM_KOP_STEP:
		ok = ok && on_dev(a->p, pn, s->dev, "kernel param") &&
		     on_dev(a->g, pn, s->dev, "kernel grad") &&
		     (!lowp || on_dev(a->master, a->n, s->dev, "kernel master"));
		if (sgd && a->sgd.mode != OPTIM_MOM_NONE)
			ok = ok && on_dev(a->m, a->n, s->dev, "kernel momentum");
		if (!sgd)
			ok = ok && on_dev(a->m, a->n, s->dev, "kernel m") &&
			     on_dev(a->v, a->n, s->dev, "kernel v") &&
			     (!a->adam.amsgrad || on_dev(a->vmax, a->n, s->dev, "kernel vmax"));
		break;
	case OPTIM_KOP_CHECK:
	case OPTIM_KOP_LOAD:
	case OPTIM_KOP_RELOAD:
	case OPTIM_KOP_STORE:
		ok = ok && lowp && on_dev(a->p, pn, s->dev, "master param") &&
		     on_dev(a->master, a->n, s->dev, "master") &&
		     (a->op != OPTIM_KOP_CHECK || on_dev(a->count, 1, s->dev, "check flag"));
		break;
	case OPTIM_KOP_MEASURE:
		ok = ok && on_dev(a->g, pn, s->dev, "measure grad") &&
		     on_dev(a->sumsq, 2 * items, s->dev, "measure sums") &&
		     on_dev(a->count, items, s->dev, "measure counts");
		break;
	case OPTIM_KOP_SCALE:
		ok = ok && on_dev(a->g, pn, s->dev, "clip grad");
		break;
	default:
		ok = false;
		violation("kernel op %d", (int)a->op);
	}
	pthread_mutex_unlock(&mu);
	if (!ok)
		return fail(cudaErrorInvalidDevicePointer);
	t = calloc(1, sizeof(*t));
	if (!t)
		return fail(cudaErrorMemoryAllocation);
	t->kind = T_KERN;
	t->kern = *a;
	stream_push(s, t);
	return cudaSuccess;
}

/* ------------------------------------------------------ collectives --- */

/* coll_move of bf16/fp16: as the host backend (hostmem.c's host_sum_lowp)
 * averages, summed in fp32 in rank order, divided, rounded once. */
static void coll_move_lowp(struct slot *sl, int nranks)
{
	enum zc_dtype dt = sl->type == ncclBfloat16 ? ZC_DTYPE_BF16 : ZC_DTYPE_F16;
	size_t n = sl->count, total = sl->kind == C_REDUCESCATTER || sl->kind == C_ALLGATHER
					      ? n * (size_t)nranks
					      : n;
	uint16_t *tmp = malloc((total ? total : 1) * sizeof(uint16_t));

	if (!tmp) {
		violation("out of memory moving a collective");
		return;
	}
	switch (sl->kind) {
	case C_ALLREDUCE:
	case C_REDUCE:
	case C_REDUCESCATTER:
		for (size_t i = 0; i < total; i++) {
			float x = lowp_get(sl->send[0], i, dt);
			for (int r = 1; r < nranks; r++)
				x += lowp_get(sl->send[r], i, dt);
			if (sl->avg)
				x /= (float)nranks;
			tmp[i] = lowp_narrow(x, dt);
		}
		if (sl->kind == C_REDUCE && sl->recv[sl->root])
			memcpy(sl->recv[sl->root], tmp, n * sizeof(*tmp));
		for (int r = 0; sl->kind != C_REDUCE && r < nranks; r++)
			if (sl->recv[r])
				memcpy(sl->recv[r],
				       tmp + (sl->kind == C_REDUCESCATTER ? (size_t)r * n : 0),
				       n * sizeof(*tmp));
		break;
	case C_BCAST:
		memcpy(tmp, sl->send[sl->root], n * sizeof(*tmp));
		for (int r = 0; r < nranks; r++)
			if (sl->recv[r])
				memcpy(sl->recv[r], tmp, n * sizeof(*tmp));
		break;
	case C_ALLGATHER:
		for (int r = 0; r < nranks; r++)
			memcpy(tmp + (size_t)r * n, sl->send[r], n * sizeof(*tmp));
		for (int r = 0; r < nranks; r++)
			if (sl->recv[r])
				memcpy(sl->recv[r], tmp, total * sizeof(*tmp));
		break;
	}
	free(tmp);
}

/* Under mu, the last part of a slot: move the data. */
static void coll_move(struct slot *sl, int nranks)
{
	size_t n = sl->count, total = sl->kind == C_REDUCESCATTER || sl->kind == C_ALLGATHER
					      ? n * (size_t)nranks
					      : n;
	float *tmp;

	if (sl->type != ncclFloat32) {
		coll_move_lowp(sl, nranks);
		return;
	}
	tmp = malloc((total ? total : 1) * sizeof(float));
	if (!tmp) {
		violation("out of memory moving a collective");
		return;
	}
	switch (sl->kind) {
	case C_ALLREDUCE:
	case C_REDUCE:
	case C_REDUCESCATTER:
		memcpy(tmp, sl->send[0], total * sizeof(float));
		for (int r = 1; r < nranks; r++)
			for (size_t i = 0; i < total; i++)
				tmp[i] += sl->send[r][i];
		if (sl->avg)
			for (size_t i = 0; i < total; i++)
				tmp[i] /= (float)nranks;
		if (sl->kind == C_REDUCE && sl->recv[sl->root])
			memcpy(sl->recv[sl->root], tmp, n * sizeof(float));
		for (int r = 0; sl->kind != C_REDUCE && r < nranks; r++)
			if (sl->recv[r])
				memcpy(sl->recv[r],
				       tmp + (sl->kind == C_REDUCESCATTER ? (size_t)r * n : 0),
				       n * sizeof(float));
		break;
	case C_BCAST:
		memcpy(tmp, sl->send[sl->root], n * sizeof(float));
		for (int r = 0; r < nranks; r++)
			if (sl->recv[r])
				memcpy(sl->recv[r], tmp, n * sizeof(float));
		break;
	case C_ALLGATHER:
		for (int r = 0; r < nranks; r++)
			memcpy(tmp + (size_t)r * n, sl->send[r], n * sizeof(float));
		for (int r = 0; r < nranks; r++)
			if (sl->recv[r])
				memcpy(sl->recv[r], tmp, total * sizeof(float));
		break;
	}
	free(tmp);
}

/* Under mu: the buffers of one part are its device's. */
static void coll_check(const struct dop *op, int nranks)
{
	/* on_dev counts floats: a bf16/fp16 count is half as many, rounded up */
	size_t n = op->type == ncclFloat32 ? op->count : (op->count + 1) / 2;
	size_t wide = op->type == ncclFloat32 ? op->count * (size_t)nranks
					      : (op->count * (size_t)nranks + 1) / 2;
	int dev = op->comm->dev;

	switch (op->kind) {
	case C_ALLREDUCE:
		on_dev(op->send, n, dev, "ncclAllReduce send");
		on_dev(op->recv, n, dev, "ncclAllReduce recv");
		break;
	case C_REDUCESCATTER:
		on_dev(op->send, wide, dev, "ncclReduceScatter send");
		on_dev(op->recv, n, dev, "ncclReduceScatter recv");
		break;
	case C_REDUCE:
		on_dev(op->send, n, dev, "ncclReduce send");
		if (op->comm->rank == op->root)
			on_dev(op->recv, n, dev, "ncclReduce recv");
		break;
	case C_BCAST:
		if (op->comm->rank == op->root)
			on_dev(op->send, n, dev, "ncclBroadcast send");
		on_dev(op->recv, n, dev, "ncclBroadcast recv");
		break;
	case C_ALLGATHER:
		on_dev(op->send, n, dev, "ncclAllGather send");
		on_dev(op->recv, wide, dev, "ncclAllGather recv");
		break;
	}
}

/* ------------------------------------------------- the launch order --- */

/* Under mu: until op's kernel may run: every collective kernel launched
 * before it on its device has ended (NCCL's kernels of one device run one
 * at a time, in launch order, each until every rank of its communicator
 * has launched it). An aborted or broken communicator's kernel leaves at
 * once. After SLOW_S seconds, says so once: a launch order that differs
 * between devices hangs here. */
static bool q_broken(const struct clique *q);

static void turn_wait(struct dop *op)
{
	int d = op->comm->dev;
	struct timespec t0, t, ts;
	bool said = false;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	while (turns[d].next != op->turn && !op->comm->aborted && !q_broken(op->comm->cq)) {
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 50 * 1000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&cv, &mu, &ts);
		clock_gettime(CLOCK_MONOTONIC, &t);
		if (!said && t.tv_sec - t0.tv_sec >= TURN_S) {
			said = true;
			fprintf(stderr,
				"cudadouble: process %d: collective #%llu of rank %d on device %d "
				"has waited %d s behind a collective launched before it on that "
				"device (launch orders differ between devices?)\n",
				(int)getpid(), (unsigned long long)op->seq, op->comm->rank, d,
				TURN_S);
		}
	}
}

/* Under mu: op's kernel has ended. */
static void turn_end(struct dop *op)
{
	if (!op->turn)
		return;
	op->turn->prev->next = op->turn->next;
	op->turn->next->prev = op->turn->prev;
	free(op->turn);
	op->turn = NULL;
	pthread_cond_broadcast(&cv);
}

/* ------------------------------------------- cliques across processes --- */

#define SH_MAGIC   0x7a646e63636c7368ULL
#define SH_MAXR    64
#define SH_CAP     (8u << 20) /* bytes one rank brings to one collective */
#define SH_WAIT_MS 20         /* between checks that the peers live */

struct shslot {
	uint64_t seq;
	int32_t arrived, departed; /* departed == nranks: free */
	int32_t kind, root, avg, type;
	uint64_t count;
};

/* The file's head; then 2 slots x nranks x SH_CAP bytes of contributions. */
struct shclique {
	_Atomic uint64_t magic; /* set once the creator initialised the rest */
	int32_t nranks, color;
	pthread_mutex_t mu; /* process-shared, robust */
	pthread_cond_t cv;  /* process-shared */
	_Atomic int32_t joined, broken;
	int32_t pid[SH_MAXR];
	struct shslot slot[2];
};

static size_t sh_bytes(int nranks)
{
	size_t head = (sizeof(struct shclique) + 4095) / 4096 * 4096;
	return head + 2 * (size_t)nranks * SH_CAP;
}

static char *sh_area(struct shclique *sh, unsigned s, int rank)
{
	size_t head = (sizeof(struct shclique) + 4095) / 4096 * 4096;
	return (char *)sh + head + ((size_t)s * (size_t)sh->nranks + (size_t)rank) * SH_CAP;
}

static uint64_t fnv64(const void *p, size_t n, uint64_t h)
{
	const unsigned char *b = p;

	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 0x100000001b3ULL;
	return h;
}

static void sh_name(const char *key, char *name, size_t len)
{
	snprintf(name, len, "/dev/shm/zerod-cudadouble-%016llx",
		 (unsigned long long)fnv64(key, NCCL_UNIQUE_ID_BYTES, 0xcbf29ce484222325ULL));
}

static int sh_lock(struct shclique *sh)
{
	int r = pthread_mutex_lock(&sh->mu);

	if (r == EOWNERDEAD) { /* a peer died holding it: the clique is broken */
		atomic_store(&sh->broken, 1);
		pthread_mutex_consistent(&sh->mu);
		r = 0;
	}
	return r;
}

/* Process pid has exited (a zombie its parent has not reaped yet too). */
static bool pid_gone(pid_t pid)
{
	char path[64], buf[256], *p;
	ssize_t n;
	int fd;

	if (kill(pid, 0) < 0 && errno == ESRCH)
		return true;
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return false;
	buf[n] = 0;
	p = strrchr(buf, ')');
	return p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X');
}

/* Under sh->mu: a timed wait, then whether every peer process still lives
 * (a dead one breaks the clique). */
static void sh_wait(struct shclique *sh)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_nsec += SH_WAIT_MS * 1000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	if (pthread_cond_timedwait(&sh->cv, &sh->mu, &ts) == EOWNERDEAD) {
		atomic_store(&sh->broken, 1);
		pthread_mutex_consistent(&sh->mu);
	}
	for (int r = 0; r < sh->nranks; r++)
		if (sh->pid[r] > 0 && sh->pid[r] != getpid() && pid_gone(sh->pid[r]))
			atomic_store(&sh->broken, 1);
}

/* Under mu: map (creating it if first) the shared clique of key. NULL on
 * failure (a violation says why). */
static struct shclique *sh_open(const char *key, int nranks, int color)
{
	char name[80];
	struct shclique *sh;
	size_t len = sh_bytes(nranks);
	bool creator = true;
	int fd;

	if (nranks > SH_MAXR) {
		violation("shared clique of %d ranks: the double holds %d", nranks, SH_MAXR);
		return NULL;
	}
	sh_name(key, name, sizeof(name));
	fd = open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0 && errno == EEXIST) {
		creator = false;
		fd = open(name, O_RDWR | O_CLOEXEC);
	}
	if (fd < 0 || (creator && ftruncate(fd, (off_t)len) < 0)) {
		violation("shared clique %s: %s", name, strerror(errno));
		if (fd >= 0)
			close(fd);
		return NULL;
	}
	for (int i = 0; !creator && i < 5000; i++) { /* the creator sizes it */
		struct stat sb;
		if (fstat(fd, &sb) == 0 && (size_t)sb.st_size >= len)
			break;
		usleep(1000);
	}
	sh = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (sh == MAP_FAILED) {
		violation("shared clique %s: mmap: %s", name, strerror(errno));
		return NULL;
	}
	if (creator) {
		pthread_mutexattr_t ma;
		pthread_condattr_t ca;

		pthread_mutexattr_init(&ma);
		pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
		pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
		pthread_mutex_init(&sh->mu, &ma);
		pthread_mutexattr_destroy(&ma);
		pthread_condattr_init(&ca);
		pthread_condattr_setpshared(&ca, PTHREAD_PROCESS_SHARED);
		pthread_cond_init(&sh->cv, &ca);
		pthread_condattr_destroy(&ca);
		sh->nranks = nranks;
		sh->color = color;
		for (unsigned k = 0; k < 2; k++)
			sh->slot[k] = (struct shslot){.seq = UINT64_MAX, .departed = nranks};
		atomic_store(&sh->magic, SH_MAGIC);
	}
	for (int i = 0; atomic_load(&sh->magic) != SH_MAGIC && i < 5000; i++)
		usleep(1000);
	if (atomic_load(&sh->magic) != SH_MAGIC || sh->nranks != nranks || sh->color != color) {
		violation("shared clique %s: %d ranks color %d there, %d color %d wanted", name,
			  sh->nranks, sh->color, nranks, color);
		munmap(sh, len);
		return NULL;
	}
	return sh;
}

/* Under mu: rank joins the shared clique; the last one unlinks its file. */
static bool sh_join(struct clique *q, int rank)
{
	char name[80];
	bool ok;

	if (!q->sh) {
		q->sh = sh_open(q->key, q->nranks, q->color);
		q->shlen = sh_bytes(q->nranks);
		if (!q->sh)
			return false;
	}
	if (sh_lock(q->sh) != 0)
		return false;
	ok = q->sh->pid[rank] == 0;
	if (ok) {
		q->sh->pid[rank] = getpid();
		if (atomic_fetch_add(&q->sh->joined, 1) + 1 == q->nranks) {
			sh_name(q->key, name, sizeof(name));
			unlink(name);
		}
	}
	pthread_mutex_unlock(&q->sh->mu);
	if (!ok)
		violation("rank %d joins shared clique twice", rank);
	return ok;
}

static bool q_broken(const struct clique *q)
{
	return q->broken || (q->sh && atomic_load(&q->sh->broken));
}

/* Bytes rank brings to op (its send side). */
static size_t sh_contribution(const struct dop *op, int nranks)
{
	size_t es = op->type == ncclFloat32 ? 4 : 2;

	if (op->kind == C_BCAST)
		return op->comm->rank == op->root ? op->count * es : 0;
	return op->count * es * (op->kind == C_REDUCESCATTER ? (size_t)nranks : 1);
}

/* One rank's part of a collective of a shared clique, on its stream's
 * thread: never holds mu while it waits. */
static void sh_coll_part(struct dop *op)
{
	struct ncclComm *c = op->comm;
	struct clique *q = c->cq;
	struct shclique *sh = q->sh;
	unsigned si = (unsigned)(op->seq % 2);
	size_t bytes = sh_contribution(op, q->nranks);
	struct shslot *sl = &sh->slot[si];
	bool mismatch = false, aborted;
	struct shslot seen = {0};
	struct slot tmp = {0};
	const float *send[SH_MAXR];
	float *recv[SH_MAXR] = {0};

	pthread_mutex_lock(&mu);
	turn_wait(op);
	aborted = c->aborted;
	coll_check(op, q->nranks);
	st.waiting++;
	pthread_mutex_unlock(&mu);
	if (bytes > SH_CAP) {
		atomic_store(&sh->broken, 1);
		pthread_mutex_lock(&mu);
		violation("a collective of %zu bytes: the shared clique holds %u", bytes, SH_CAP);
		pthread_mutex_unlock(&mu);
	}
	if (aborted || sh_lock(sh) != 0)
		goto out;
	while (!atomic_load(&sh->broken) && sl->seq != op->seq && sl->departed != sh->nranks)
		sh_wait(sh);
	if (!atomic_load(&sh->broken) && sl->seq != op->seq)
		*sl = (struct shslot){.seq = op->seq,
				      .kind = op->kind,
				      .root = op->root,
				      .avg = op->avg,
				      .type = op->type,
				      .count = op->count};
	seen = *sl;
	mismatch =
		!atomic_load(&sh->broken) &&
		(sl->kind != (int32_t)op->kind || sl->count != op->count || sl->root != op->root ||
		 sl->avg != (int32_t)op->avg || sl->type != (int32_t)op->type);
	if (!atomic_load(&sh->broken) && !mismatch) {
		memcpy(sh_area(sh, si, c->rank), op->send, bytes);
		if (++sl->arrived == sh->nranks)
			pthread_cond_broadcast(&sh->cv);
		while (!atomic_load(&sh->broken) && sl->arrived < sh->nranks)
			sh_wait(sh);
	}
	pthread_mutex_unlock(&sh->mu);
	if (!atomic_load(&sh->broken) && !mismatch) {
		/* nobody writes the slot before every rank departs */
		for (int r = 0; r < q->nranks; r++)
			send[r] = (const float *)sh_area(sh, si, r);
		recv[c->rank] = op->recv;
		tmp = (struct slot){.seq = op->seq,
				    .kind = op->kind,
				    .count = op->count,
				    .root = op->root,
				    .avg = op->avg,
				    .type = op->type,
				    .send = send,
				    .recv = recv};
		coll_move(&tmp, q->nranks);
		if (sh_lock(sh) == 0) {
			if (++sl->departed == sh->nranks)
				pthread_cond_broadcast(&sh->cv);
			pthread_mutex_unlock(&sh->mu);
		}
	} else if (mismatch) {
		atomic_store(&sh->broken, 1);
	}
out:
	pthread_mutex_lock(&mu);
	if (mismatch)
		violation("ranks disagree on shared collective #%llu: rank %d issues kind %d "
			  "count %zu root %d, another kind %d count %llu root %d",
			  (unsigned long long)op->seq, c->rank, op->kind, op->count, op->root,
			  (int)seen.kind, (unsigned long long)seen.count, (int)seen.root);
	st.waiting--;
	turn_end(op);
	pthread_mutex_unlock(&mu);
}

/* One rank's part of a collective, on its stream's thread. */
static void coll_part(struct dop *op)
{
	struct ncclComm *c = op->comm;
	struct clique *q = c->cq;
	struct slot *sl, **pp;

	if (q->sh) {
		sh_coll_part(op);
		return;
	}
	pthread_mutex_lock(&mu);
	turn_wait(op);
	if (c->aborted || q->broken) {
		/* NCCL's kernels leave at once after an abort */
		turn_end(op);
		pthread_mutex_unlock(&mu);
		return;
	}
	for (sl = q->slots; sl && sl->seq != op->seq; sl = sl->next)
		;
	if (!sl) {
		sl = calloc(1, sizeof(*sl));
		if (sl) {
			sl->send = calloc((size_t)q->nranks, sizeof(*sl->send));
			sl->recv = calloc((size_t)q->nranks, sizeof(*sl->recv));
		}
		if (!sl || !sl->send || !sl->recv) {
			violation("out of memory for a collective");
			turn_end(op);
			pthread_mutex_unlock(&mu);
			return;
		}
		*sl = (struct slot){.seq = op->seq,
				    .kind = op->kind,
				    .count = op->count,
				    .root = op->root,
				    .avg = op->avg,
				    .type = op->type,
				    .send = sl->send,
				    .recv = sl->recv,
				    .next = q->slots};
		q->slots = sl;
	} else if (sl->kind != op->kind || sl->count != op->count || sl->root != op->root ||
		   sl->avg != op->avg || sl->type != op->type) {
		violation("ranks disagree on collective #%llu: rank %d issues kind %d count %zu "
			  "root %d, an earlier rank kind %d count %zu root %d",
			  (unsigned long long)op->seq, c->rank, op->kind, op->count, op->root,
			  sl->kind, sl->count, sl->root);
	}
	coll_check(op, q->nranks);
	sl->send[c->rank] = op->send;
	sl->recv[c->rank] = op->recv;
	if (++sl->arrived == q->nranks) {
		coll_move(sl, q->nranks);
		sl->done = true;
		pthread_cond_broadcast(&cv);
	}
	st.waiting++;
	while (!sl->done && !c->aborted && !q->broken)
		pthread_cond_wait(&cv, &mu);
	st.waiting--;
	if (++sl->departed == q->nranks) {
		for (pp = &q->slots; *pp != sl; pp = &(*pp)->next)
			;
		*pp = sl->next;
		free(sl->send);
		free(sl->recv);
		free(sl);
	}
	turn_end(op);
	pthread_mutex_unlock(&mu);
}

/* Under mu: put a collective on its stream, and in its device's launch
 * order. */
static void coll_queue(struct pend *p)
{
	struct task *t = calloc(1, sizeof(*t));
	struct turn *tn = calloc(1, sizeof(*tn)), *head;

	if (!t || !tn) {
		violation("out of memory queueing a collective");
		free(t);
		free(tn);
		free(p);
		return;
	}
	head = &turns[p->op.comm->dev];
	tn->prev = head->prev;
	tn->next = head;
	head->prev->next = tn;
	head->prev = tn;
	t->kind = T_COLL;
	t->op = p->op;
	t->op.turn = tn;
	t->op.seq = p->op.comm->next_seq++;
	st.collectives++;
	stream_push(p->stream, t);
	free(p);
}

/* Under mu: the collectives a poll lets through. */
static void comm_flush(struct ncclComm *c)
{
	while (c->deferred) {
		struct pend *p = c->deferred;
		c->deferred = p->next;
		coll_queue(p);
	}
	c->deferred_tail = NULL;
}

/* ------------------------------------------------------------- NCCL --- */

/* Under mu: the calling thread issues NCCL work to a communicator of device
 * d. NCCL forbids two threads doing so on one device at once: from a
 * group's first collective until its end, and for a non-blocking
 * communicator until what it answered ncclInProgress to is on the streams
 * (its settle). */
static void issue_begin(int d)
{
	if (issuer[d].held && !pthread_equal(issuer[d].who, pthread_self()))
		violation("two threads issue NCCL work to communicators of device %d at once "
			  "(NCCL forbids it: serialise each group call and its settle per "
			  "device)",
			  d);
	issuer[d].held = true;
	issuer[d].who = pthread_self();
}

/* Under mu: device d's issue ends once none of its communicators has work
 * still to settle. */
static void issue_end(int d)
{
	for (struct ncclComm *c = comms; c; c = c->next_all)
		if (c->dev == d && c->deferred && !c->aborted && !c->destroyed)
			return;
	issuer[d].held = false;
}


static bool comm_usable(const struct ncclComm *c, const char *what)
{
	if (!c || c->aborted || c->destroyed) {
		violation("%s on a communicator that was %s", what,
			  !c           ? "never made"
			  : c->aborted ? "aborted"
				       : "destroyed");
		return false;
	}
	return true;
}

ncclResult_t ncclGetVersion(int *v)
{
	*v = cfg.nccl_version ? cfg.nccl_version : NCCL_VERSION_CODE;
	return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r)
{
	switch (r) {
	case ncclSuccess:
		return "no error";
	case ncclSystemError:
		return "unhandled system error (test double)";
	case ncclInvalidArgument:
		return "invalid argument (test double)";
	case ncclInvalidUsage:
		return "invalid usage (test double)";
	case ncclRemoteError:
		return "remote process exited or there was a network error";
	case ncclInProgress:
		return "NCCL operation in progress";
	default:
		return "error (test double)";
	}
}

const char *ncclGetLastError(ncclComm_t comm)
{
	(void)comm;
	return "(test double)";
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
	NCCL_ENTER();
	memset(id, 0, sizeof(*id));
	pthread_mutex_lock(&mu);
	/* unique across processes too (shared cliques are keyed by it) */
	snprintf(id->internal, sizeof(id->internal), "cudadouble id %d.%llu.%llx", (int)getpid(),
		 (unsigned long long)++ids, (unsigned long long)time(NULL));
	pthread_mutex_unlock(&mu);
	return ncclSuccess;
}

/* Under mu: whether c's clique is complete (across processes too). */
static bool init_done(struct ncclComm *c)
{
	if (c->init_pending && c->cq->sh && atomic_load(&c->cq->sh->joined) == c->cq->nranks)
		c->init_pending = false;
	return !c->init_pending;
}

/* Under mu: join rank `rank` on device dev to the clique keyed key. */
static ncclResult_t clique_join(const char *key, int nranks, int rank, int dev, int color,
				const ncclConfig_t *conf, struct ncclComm **ret)
{
	struct clique *q;
	struct ncclComm *c;

	if (!conf || conf->size != sizeof(ncclConfig_t) || conf->magic != 0xcafebeef) {
		violation("ncclConfig_t not from NCCL_CONFIG_INITIALIZER");
		return ncclInvalidArgument;
	}
	if (nranks < 1 || rank < 0 || rank >= nranks)
		return ncclInvalidArgument;
	for (q = cliques; q && memcmp(q->key, key, sizeof(q->key)) != 0; q = q->next)
		;
	if (!q) {
		q = calloc(1, sizeof(*q));
		if (!q || !(q->member = calloc((size_t)nranks, sizeof(*q->member)))) {
			free(q);
			return ncclSystemError;
		}
		memcpy(q->key, key, sizeof(q->key));
		q->nranks = nranks;
		q->color = color;
		q->next = cliques;
		cliques = q;
	}
	if (q->nranks != nranks || q->member[rank] || q->color != color) {
		violation("rank %d joins a clique of %d ranks (%d wanted) twice or with color %d",
			  rank, q->nranks, nranks, color);
		return ncclInvalidUsage;
	}
	for (int r = 0; r < nranks; r++)
		if (q->member[r] && q->member[r]->dev == dev) {
			violation("ranks %d and %d on device %d (NCCL: duplicate GPU)", r, rank,
				  dev);
			return ncclInvalidUsage;
		}
	c = calloc(1, sizeof(*c));
	if (!c)
		return ncclSystemError;
	c->cq = q;
	c->rank = rank;
	c->dev = dev;
	c->blocking = conf->blocking != 0; /* NCCL's default (unset) blocks */
	c->init_pending = true;
	c->async = ncclInProgress;
	c->polls_left = cfg.inprogress_polls;
	c->next_all = comms;
	comms = c;
	q->member[rank] = c;
	st.live_comms++;
	if (cfg.shm_cliques && !sh_join(q, rank))
		return ncclSystemError;
	if (++q->joined == nranks) {
		for (int r = 0; r < nranks; r++)
			q->member[r]->init_pending = false;
		pthread_cond_broadcast(&cv);
	}
	*ret = c;
	if (c->blocking) {
		if (group_depth > 0) {
			violation("a blocking communicator made inside a group (the double "
				  "does not model it)");
			return ncclInvalidUsage;
		}
		while (!init_done(c)) {
			if (!q->sh) {
				pthread_cond_wait(&cv, &mu);
				continue;
			}
			pthread_mutex_unlock(&mu);
			usleep(1000);
			pthread_mutex_lock(&mu);
		}
		c->async = ncclSuccess;
		return ncclSuccess;
	}
	if (group_depth > 0) {
		group_async = true;
		return ncclSuccess;
	}
	return ncclInProgress;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
				    ncclConfig_t *conf)
{
	ncclResult_t r;

	NCCL_ENTER();
	pthread_mutex_lock(&mu);
	r = clique_join(id.internal, nranks, rank, cur_dev, 0, conf, comm);
	pthread_mutex_unlock(&mu);
	return r;
}

/* One communicator per device of devlist (NULL: 0..n-1) in this process,
 * from one id, as NCCL's single-process initialisation (zerod-bench's
 * direct busbw row): joined as non-blocking ones (one thread makes them
 * all, as NCCL does inside a group), then blocking, as NCCL's are. */
ncclResult_t ncclCommInitAll(ncclComm_t *out, int n, const int *devlist)
{
	ncclConfig_t conf = NCCL_CONFIG_INITIALIZER;
	ncclResult_t r = ncclSuccess;
	ncclUniqueId id;

	NCCL_ENTER();
	if (!out || n < 1)
		return ncclInvalidArgument;
	if ((r = ncclGetUniqueId(&id)) != ncclSuccess)
		return r;
	conf.blocking = 0;
	pthread_mutex_lock(&mu);
	for (int k = 0; k < n && r == ncclSuccess; k++) {
		int dev = devlist ? devlist[k] : k;

		r = dev >= 0 && dev < cfg.ndevices
			    ? clique_join(id.internal, n, k, dev, 0, &conf, &out[k])
			    : ncclInvalidArgument;
		r = r == ncclInProgress ? ncclSuccess : r; /* (non-blocking: joined) */
	}
	for (int k = 0; k < n && r == ncclSuccess; k++) {
		while (!init_done(out[k]))
			pthread_cond_wait(&cv, &mu);
		out[k]->blocking = true;
		out[k]->async = ncclSuccess;
	}
	pthread_mutex_unlock(&mu);
	return r;
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
			   ncclConfig_t *conf)
{
	char id[NCCL_UNIQUE_ID_BYTES] = "cudadouble split";
	ncclResult_t r = ncclInvalidUsage;
	struct {
		void *parent;
		uint64_t n;
	} k;

	NCCL_ENTER();
	pthread_mutex_lock(&mu);
	if (comm_usable(comm, "ncclCommSplit")) {
		if (key != comm->rank) {
			violation("ncclCommSplit: key %d for rank %d (the double keeps ranks)", key,
				  comm->rank);
		} else {
			k.parent = comm->cq;
			k.n = comm->nsplits++;
			memcpy(id + 32, &k, sizeof(k));
			if (comm->cq->sh) /* the same key in every process */
				memset(id, 0, sizeof(id));
			if (comm->cq->sh)
				snprintf(id, sizeof(id), "cudadouble split %016llx.%llu.%d",
					 (unsigned long long)fnv64(comm->cq->key,
								   sizeof(comm->cq->key),
								   0xcbf29ce484222325ULL),
					 (unsigned long long)k.n, color);
			r = clique_join(id, comm->cq->nranks, comm->rank, comm->dev, color, conf,
					newcomm);
		}
	}
	pthread_mutex_unlock(&mu);
	return r;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async)
{
	NCCL_ENTER();
	pthread_mutex_lock(&mu);
	if (!comm_usable(comm, "ncclCommGetAsyncError")) {
		pthread_mutex_unlock(&mu);
		return ncclInvalidUsage;
	}
	if (comm->async == ncclInProgress && init_done(comm)) {
		if (comm->polls_left > 0) {
			comm->polls_left--;
		} else {
			comm_flush(comm);
			comm->async = ncclSuccess;
			issue_end(comm->dev);
		}
	}
	/* a peer aborted: NCCL reports it as a remote error */
	if (q_broken(comm->cq) && (comm->async == ncclSuccess || comm->async == ncclInProgress))
		comm->async = ncclRemoteError;
	*async = comm->async;
	pthread_mutex_unlock(&mu);
	return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm)
{
	NCCL_ENTER();
	if (!comm)
		return ncclSuccess;
	pthread_mutex_lock(&mu);
	if (comm_usable(comm, "ncclCommAbort")) {
		comm->aborted = true;
		comm->cq->broken = true;
		if (comm->cq->sh)
			atomic_store(&comm->cq->sh->broken, 1); /* the peers' parts see it */
		while (comm->deferred) {
			struct pend *p = comm->deferred;
			comm->deferred = p->next;
			free(p);
		}
		st.live_comms--;
		issue_end(comm->dev);
		pthread_cond_broadcast(&cv);
	}
	pthread_mutex_unlock(&mu);
	return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
	NCCL_ENTER();
	pthread_mutex_lock(&mu);
	if (!comm_usable(comm, "ncclCommFinalize")) {
		pthread_mutex_unlock(&mu);
		return ncclInvalidUsage;
	}
	comm_flush(comm); /* finalize flushes what was issued */
	if (comm->async == ncclSuccess && !comm->blocking && cfg.inprogress_polls) {
		comm->async = ncclInProgress;
		comm->polls_left = cfg.inprogress_polls;
	}
	pthread_mutex_unlock(&mu);
	return comm->blocking || !cfg.inprogress_polls ? ncclSuccess : ncclInProgress;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
	NCCL_ENTER();
	if (!comm)
		return ncclSuccess;
	pthread_mutex_lock(&mu);
	if (comm_usable(comm, "ncclCommDestroy")) {
		if (comm->deferred || comm->async == ncclInProgress)
			violation("ncclCommDestroy on rank %d before its work was issued",
				  comm->rank);
		comm->destroyed = true;
		st.live_comms--;
		issue_end(comm->dev);
	}
	pthread_mutex_unlock(&mu);
	return ncclSuccess;
}

/* nccl.h declares these two as `()`, which C17 does not count as a
 * prototype */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-prototypes"
ncclResult_t ncclGroupStart(void)
{
	NCCL_ENTER();
	group_depth++;
	return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void)
{
	ncclResult_t r = ncclSuccess;
	struct pend *p;

	NCCL_ENTER();
	if (group_depth == 0)
		return ncclInvalidUsage;
	if (--group_depth > 0)
		return ncclSuccess;
	pthread_mutex_lock(&mu);
	while ((p = group_head)) {
		struct ncclComm *c = p->op.comm;

		group_head = p->next;
		p->next = NULL;
		if (!comm_usable(c, "a collective")) {
			free(p);
			r = ncclInvalidUsage;
			continue;
		}
		if (p->stream->dev != c->dev)
			violation(
				"rank %d: collective on a stream of device %d, communicator on %d",
				c->rank, p->stream->dev, c->dev);
		if (!c->blocking && (cfg.inprogress_polls || c->deferred)) {
			/* answered later: queued on the poll that ends the wait */
			if (c->deferred_tail)
				c->deferred_tail->next = p;
			else
				c->deferred = p;
			c->deferred_tail = p;
			if (c->async == ncclSuccess) {
				c->async = ncclInProgress;
				c->polls_left = cfg.inprogress_polls;
			}
			r = r == ncclSuccess ? ncclInProgress : r;
		} else {
			coll_queue(p);
		}
	}
	group_tail = NULL;
	for (int d = 0; d < MAXDEV; d++)
		if (issuer[d].held && pthread_equal(issuer[d].who, pthread_self()))
			issue_end(d);
	if (group_async && r == ncclSuccess)
		r = ncclInProgress;
	group_async = false;
	pthread_mutex_unlock(&mu);
	return r;
}
#pragma GCC diagnostic pop

static ncclResult_t group_add(struct dop op, cudaStream_t stream, ncclDataType_t type,
			      ncclRedOp_t red)
{
	struct pend *p;

	NCCL_ENTER();
	if ((type != ncclFloat32 && type != ncclBfloat16 && type != ncclFloat16) ||
	    (red != ncclSum && red != ncclAvg) || !op.comm || !stream)
		return ncclInvalidArgument;
	p = calloc(1, sizeof(*p));
	if (!p)
		return ncclSystemError;
	pthread_mutex_lock(&mu);
	if (op.comm->dev >= 0 && op.comm->dev < MAXDEV)
		issue_begin(op.comm->dev);
	pthread_mutex_unlock(&mu);
	op.avg = red == ncclAvg;
	op.type = type;
	p->op = op;
	p->stream = stream;
	if (group_tail)
		group_tail->next = p;
	else
		group_head = p;
	group_tail = p;
	if (group_depth > 0)
		return ncclSuccess;
	/* outside a group: a group of one */
	group_depth = 1;
	return ncclGroupEnd();
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type,
			   ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
	return group_add((struct dop){.comm = comm,
				      .kind = C_ALLREDUCE,
				      .send = send,
				      .recv = recv,
				      .count = count},
			 stream, type, op);
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, ncclDataType_t type,
			       ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
	return group_add((struct dop){.comm = comm,
				      .kind = C_REDUCESCATTER,
				      .send = send,
				      .recv = recv,
				      .count = count},
			 stream, type, op);
}

ncclResult_t ncclReduce(const void *send, void *recv, size_t count, ncclDataType_t type,
			ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream)
{
	return group_add((struct dop){.comm = comm,
				      .kind = C_REDUCE,
				      .send = send,
				      .recv = recv,
				      .count = count,
				      .root = root},
			 stream, type, op);
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t type,
			   int root, ncclComm_t comm, cudaStream_t stream)
{
	return group_add((struct dop){.comm = comm,
				      .kind = C_BCAST,
				      .send = send,
				      .recv = recv,
				      .count = count,
				      .root = root},
			 stream, type, ncclSum);
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t type,
			   ncclComm_t comm, cudaStream_t stream)
{
	return group_add((struct dop){.comm = comm,
				      .kind = C_ALLGATHER,
				      .send = send,
				      .recv = recv,
				      .count = count},
			 stream, type, ncclSum);
}

/* ----------------------------------------------------------- events --- */

struct evipc_payload {
	char magic[8];
	int32_t pid, fd;
	int32_t dev;
};

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *ret, unsigned int flags)
{
	struct CUevent_st *e;

	CUDA_ENTER();
	if (cfg.ndevices <= 0)
		return fail(cudaErrorInsufficientDriver);
	if ((flags & cudaEventInterprocess) && !(flags & cudaEventDisableTiming))
		return fail(cudaErrorInvalidValue); /* as CUDA */
	e = calloc(1, sizeof(*e));
	if (!e || !(e->sh = memfd_map(sizeof(*e->sh), &e->fd))) {
		free(e);
		return fail(cudaErrorMemoryAllocation);
	}
	e->sh->owner_pid = getpid();
	e->flags = flags;
	e->dev = cur_dev;
	atomic_store(&e->refs, 1);
	*ret = e;
	return cudaSuccess;
}

/* (zerod-bench's GPU rows; zerod itself only makes events with flags) */
cudaError_t cudaEventCreate(cudaEvent_t *ret)
{
	return cudaEventCreateWithFlags(ret, cudaEventDefault);
}

/* The host time between the two records' runs on their streams. As CUDA:
 * both must have completed (else cudaErrorNotReady) and time (an event made
 * with cudaEventDisableTiming: cudaErrorInvalidResourceHandle). */
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
	CUDA_ENTER();
	if (!ms)
		return fail(cudaErrorInvalidValue);
	if (!a || !b || (a->flags & cudaEventDisableTiming) || (b->flags & cudaEventDisableTiming))
		return fail(cudaErrorInvalidResourceHandle);
	if (atomic_load(&a->sh->recorded) == 0 || atomic_load(&b->sh->recorded) == 0)
		return fail(cudaErrorInvalidResourceHandle); /* never recorded */
	if (atomic_load(&a->sh->completed) < atomic_load(&a->sh->recorded) ||
	    atomic_load(&b->sh->completed) < atomic_load(&b->sh->recorded))
		return fail(cudaErrorNotReady);
	*ms = (float)((double)(atomic_load(&b->done_ns) - atomic_load(&a->done_ns)) / 1e6);
	return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t e)
{
	CUDA_ENTER();
	if (!e)
		return fail(cudaErrorInvalidResourceHandle);
	ev_put(e); /* the tasks that name it keep it until they have run */
	return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
	uint64_t seq;
	struct task *t;

	CUDA_ENTER();
	if (!e)
		return fail(cudaErrorInvalidResourceHandle);
	s = resolve(s);
	if (s->dev != e->dev) {
		/* CUDA: the event and the stream must be of one device */
		pthread_mutex_lock(&mu);
		violation("cudaEventRecord of an event of device %d on a stream of device %d "
			  "(CUDA: cudaErrorInvalidResourceHandle)",
			  e->dev, s->dev);
		pthread_mutex_unlock(&mu);
		return fail(cudaErrorInvalidResourceHandle);
	}
	t = calloc(1, sizeof(*t));
	if (!t)
		return fail(cudaErrorMemoryAllocation);
	seq = atomic_fetch_add(&e->sh->recorded, 1) + 1;
	atomic_fetch_add(&e->refs, 1);
	t->kind = T_EVREC;
	t->ev = e;
	t->evseq = seq;
	stream_push(s, t);
	return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags)
{
	struct task *t;

	CUDA_ENTER();
	(void)flags;
	if (!e)
		return fail(cudaErrorInvalidResourceHandle);
	/* (any device's stream may wait for any device's event) */
	s = resolve(s);
	t = calloc(1, sizeof(*t));
	if (!t)
		return fail(cudaErrorMemoryAllocation);
	atomic_fetch_add(&e->refs, 1);
	t->kind = T_EVWAIT;
	t->ev = e;
	t->evseq = atomic_load(&e->sh->recorded); /* the latest record, as CUDA */
	stream_push(s, t);
	return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e)
{
	CUDA_ENTER();
	if (!e)
		return fail(cudaErrorInvalidResourceHandle);
	return atomic_load(&e->sh->completed) >= atomic_load(&e->sh->recorded) ? cudaSuccess
									      : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
	CUDA_ENTER();
	if (!e)
		return fail(cudaErrorInvalidResourceHandle);
	ev_wait(e->sh, atomic_load(&e->sh->recorded));
	return cudaSuccess;
}

cudaError_t cudaIpcGetEventHandle(cudaIpcEventHandle_t *h, cudaEvent_t e)
{
	struct evipc_payload pl = {.magic = "zdevt"};

	CUDA_ENTER();
	if (!e || e->imported || !(e->flags & cudaEventInterprocess))
		return fail(cudaErrorInvalidResourceHandle);
	pl.pid = getpid();
	pl.fd = e->fd;
	pl.dev = e->dev;
	memset(h, 0, sizeof(*h));
	memcpy(h->reserved, &pl, sizeof(pl));
	return cudaSuccess;
}

cudaError_t cudaIpcOpenEventHandle(cudaEvent_t *ret, cudaIpcEventHandle_t h)
{
	struct evipc_payload pl;
	struct CUevent_st *e;
	char path[64];
	int fd;

	CUDA_ENTER();
	memcpy(&pl, h.reserved, sizeof(pl));
	if (memcmp(pl.magic, "zdevt", 6) != 0)
		return fail(cudaErrorInvalidResourceHandle);
	snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)pl.pid, (int)pl.fd);
	fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return fail(cudaErrorInvalidResourceHandle);
	e = calloc(1, sizeof(*e));
	if (!e) {
		close(fd);
		return fail(cudaErrorMemoryAllocation);
	}
	e->sh = mmap(NULL, sizeof(*e->sh), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (e->sh == MAP_FAILED) {
		free(e);
		return fail(cudaErrorInvalidResourceHandle);
	}
	e->fd = -1;
	e->imported = true;
	e->flags = cudaEventInterprocess | cudaEventDisableTiming;
	e->dev = pl.dev;
	atomic_store(&e->refs, 1);
	*ret = e;
	return cudaSuccess;
}
