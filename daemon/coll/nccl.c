/*
 * nccl.c — collectives on GPUs through NCCL. One group per job on this node
 * holds, for each local rank (one GPU each: NCCL refuses two ranks on one
 * device), two communicators and a stream for each: set 0 carries the
 * reductions, set 1 the broadcasts and all-gathers, so a later bucket's
 * reduction never queues behind an earlier broadcast on the same
 * communicator or stream. Set 0 is created with ncclCommInitRankConfig in one
 * group call over the local GPUs, from the job's NCCL unique id (node 0
 * makes it and the others get it from the job's store, the rendezvous's
 * key-value store; a job whose ranks are all here makes its own); set 1 is
 * split from it, so a job needs one id only. Communicators are
 * non-blocking (config.blocking = 0): calls may answer ncclInProgress, and
 * each is polled with ncclCommGetAsyncError until it has really been issued.
 *
 * A request is one group call over the local ranks:
 *   REDUCE, bucket mode: ncclAllReduce(avg) in place on each rank's gradients,
 *     so every rank holds the average (the seed's bucket future);
 *   REDUCE, slice mode: ncclReduceScatter(avg) in place when the bucket's
 *     slices are equal and in rank order, else an ncclReduce(avg) per slice
 *     to its owner;
 *   BCAST: ncclBroadcast from each range's owner, or ncclAllGather in place
 *     for equal slices;
 *   GATHER (a job over several nodes): on set 2, a third communicator per
 *     local rank (split like set 1, made only when the job spans nodes), so
 *     the executor's compute lane, which gathers while the broadcast lane
 *     runs, issues its calls in the same order on every node. Every local
 *     rank copies the node's gbytes from a pinned host buffer into its slot
 *     of a small device buffer (world * gbytes), one ncclAllGather in place
 *     (a copy: no arithmetic), then local rank 0's stream copies the result
 *     back to the pinned buffer and a host function picks each node's part
 *     (that of its lowest rank) in node order into gout. One gather at a
 *     time per group (the executor waits for each; another is -EBUSY). The
 *     staging is sized at open (coll_config.gather_bytes, the step's
 *     largest) and never grows: nothing is allocated or freed while the job
 *     runs (cudaFree waits for the whole device, NCCL kernels waiting on
 *     peers included); a larger gather (a state export) goes through it in
 *     pieces, one after the other. One node: gin copied to gout.
 * ncclAvg is NCCL's own average (2.10+; for floats a pre-multiplied sum), so
 * results match the host backend's sum-then-divide only to rounding. bf16 and
 * fp16 buckets are reduced in their own type (ncclBfloat16, ncclFloat16).
 *
 * Completion: after the group call, one host function per local stream
 * (cudaLaunchHostFunc); the last of them to run calls done(). Host functions
 * make no CUDA call: they take the group's mutex, count, and post.
 *
 * Faults: a watchdog thread per group polls ncclCommGetAsyncError of every
 * communicator every millisecond while a request is in flight. On an async
 * error, or on abort(), it aborts every communicator (ncclCommAbort ends the
 * NCCL kernels, so nothing stays stuck on the GPU) and completes every
 * request in flight itself: with the error (-ECONNRESET when a peer failed,
 * -EIO otherwise) or -ECANCELED. abort() only flags and wakes it, so abort
 * never calls done() and returns at once. Host functions of those requests
 * still run later and find their request already completed.
 *
 * Events (CUDA IPC buffers, coll_config.bufs): open opens each local
 * rank's interprocess event rings once (cudaIpcOpenEventHandle, on the
 * rank's device). A REDUCE first polls its trainers' ready events of the
 * request's buckets from the host (cudaEventQuery) until they are complete,
 * then makes each local stream wait on them (cudaStreamWaitEvent, by then
 * a formality), and a BCAST records their done events on its streams after
 * the collectives, before the host functions; iteration t uses ring slot
 * t % ring (docs/DATAPLANE.md says why a ring). Why poll: ncclCommAbort
 * cannot cancel a stream's wait on an event, so a wait queued behind a dead
 * trainer's event would hold the stream, and close, for ever. The poll ends
 * on abort, and fails the request with -ETIMEDOUT after
 * coll_config.ready_timeout_ms (the job's stall timeout), last_error naming
 * the rank, bucket and iteration. Close drains each stream with a deadline
 * (an event recorded and polled) and abandons, with a log line, one that
 * does not drain, leaking the group rather than hanging.
 *
 * Launch order (NCCL: communicators of one device must not be called from
 * two threads at once, and every device must see collectives of different
 * communicators in one order, or their kernels may wait on each other):
 * one mutex per CUDA device for the whole process (dev_mu, shared by every
 * set and every job on that device) is held from ncclGroupStart to the end
 * of the settle that follows ncclGroupEnd, for the reductions, broadcasts
 * and gathers alike. A group call spans every local device, so it takes
 * their mutexes in ascending order and holds all of them: the collectives
 * of all lanes and jobs reach every local GPU in one order, the order in
 * which they got the locks. Nothing else runs under them: no host wait for
 * a trainer's event (polled before), no open or close (init, split and
 * finalize wait for the other ranks), never the watchdog, whose abort must
 * be able to end a settle held there (the settle sees stop and returns).
 *
 * It is over 1,200 lines: the communicators, the watchdog, the launch order,
 * the events and the gather staging all live in one struct coll_group, and
 * splitting them would put that struct in a header for their sake alone.
 *
 * Locks: a set's mutex is held while its communicators are called (NCCL
 * communicators are not thread-safe), the group's mutex guards the requests.
 * Order: set 0, set 1, set 2, then the device mutexes (ascending), or the
 * group's; the device mutexes and the group's are never held together. The
 * executor's mutex is taken by done(), never under any of ours.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coll/coll.h"
#include "common.h"
#include "mem/cudabufs.h"
#include "base/cudacheck.h"
#include "base/log.h"
#include "plan.h"

#define NSETS            3 /* reductions, broadcasts, gathers (several nodes) */
#define SET_GATHER       2
#define POLL_NS          1000000L /* watchdog period while requests are in flight */
#define ISSUE_NS         20000L   /* between polls of a call answered ncclInProgress */
#define OPEN_TIMEOUT_MS  60000
#define CLOSE_TIMEOUT_MS 10000
#define READY_TIMEOUT_MS 60000
#define GATHER_MIN       256 /* bytes per rank of gather staging at least */
#define DEV_LOCKS        64  /* device mutexes; device d takes dev_mu[d % DEV_LOCKS] */

_Static_assert(COLL_UNIQUE_ID_BYTES == NCCL_UNIQUE_ID_BYTES, "coll.h's id size is NCCL's");

struct nreq {
	struct coll_group *g;
	struct coll_req *req;
	unsigned pending;   /* host functions not yet run (gathers: one more) */
	bool claimed;       /* done() has been, or is being, called */
	struct nreq *next;  /* in inflight or zombies */
	struct nreq *dnext; /* the watchdog's list of those it completes */
};

struct cset {
	pthread_mutex_t mu;
	ncclComm_t *comm;     /* [nlocal] */
	cudaStream_t *stream; /* [nlocal] */
};

struct coll_group {
	uint32_t world, nlocal;
	uint32_t *local;         /* [nlocal]: the ranks on this node, ascending */
	int *dev;                /* [nlocal] */
	float **grads, **params; /* [world] */
	struct cset set[NSETS];
	/* [nlocal][nev]: each local rank's trainer's events (bufs), or NULL */
	cudaEvent_t *ready, *done;
	uint32_t ring, nev;
	bool comms_live; /* communicators exist and were not aborted (watchdog, close) */
	unsigned nsets;  /* 2, or 3 over several nodes (set 2 gathers) */
	int ready_ms;    /* how long a request waits for a trainer's ready event */
	/* dev_mu indices of the local devices, ascending, each once */
	unsigned *lk, nlk;

	/* gathers (set 2, under its mutex): nodes and their first ranks */
	uint32_t nnodes;
	uint32_t *node_first;  /* [nnodes]: the lowest rank of each node */
	void **gdev;  /* [nlocal]: world * gcap bytes on each local device */
	char *ghost;  /* pinned: (1 + world) * gcap bytes, gin then the result */
	char *gpiece; /* nnodes * gcap: a piece of a larger gather, every node's */
	size_t gcap;  /* bytes per rank the staging holds (open sizes it) */
	bool gbusy;   /* a gather is in flight (under mu) */

	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct nreq *inflight; /* not yet completed */
	struct nreq *zombies;  /* claimed by the watchdog, host functions pending */
	atomic_bool stop;      /* abort asked or a fault seen: no new requests */
	int error;             /* the fault, 0 for a plain abort */
	bool quit;             /* close: the watchdog leaves */
	bool watchdog_started;
	pthread_t watchdog;
	char why[256]; /* the fault in words (last_error), under mu */
};

static pthread_mutex_t dev_mu[DEV_LOCKS];
static pthread_once_t dev_mu_once = PTHREAD_ONCE_INIT;

static void dev_mu_init(void)
{
	for (unsigned i = 0; i < DEV_LOCKS; i++)
		pthread_mutex_init(&dev_mu[i], NULL);
}

/* The local devices' mutexes, in ascending order (see the opening comment). */
static void devs_lock(const struct coll_group *g)
{
	for (unsigned i = 0; i < g->nlk; i++)
		pthread_mutex_lock(&dev_mu[g->lk[i]]);
}

static void devs_unlock(const struct coll_group *g)
{
	for (unsigned i = g->nlk; i-- > 0;)
		pthread_mutex_unlock(&dev_mu[g->lk[i]]);
}

static void sleep_ns(long ns)
{
	struct timespec ts = {.tv_sec = 0, .tv_nsec = ns};
	nanosleep(&ts, NULL);
}

/* ---------------------------------------------------------- requests --- */

static void list_remove(struct nreq **head, struct nreq *q)
{
	while (*head != q)
		head = &(*head)->next;
	*head = q->next;
}

/* A host function: the request's work on one stream is done. */
static void host_done(void *arg)
{
	struct nreq *q = arg;
	struct coll_group *g = q->g;
	struct coll_req *req = NULL;
	int status = 0;

	pthread_mutex_lock(&g->mu);
	if (--q->pending == 0) {
		if (!q->claimed) {
			list_remove(&g->inflight, q);
			req = q->req;
			if (req->kind == COLL_GATHER)
				g->gbusy = false;
			/* after an abort NCCL may have cut the collective short */
			status = atomic_load(&g->stop) ? (g->error ? g->error : -ECANCELED) : 0;
		} else {
			list_remove(&g->zombies, q);
		}
		free(q);
	}
	pthread_mutex_unlock(&g->mu);
	if (req)
		req->done(req, status);
}

/* Host functions of q that will never run (their launch failed). */
static void drop_pending(struct coll_group *g, struct nreq *q, unsigned n)
{
	pthread_mutex_lock(&g->mu);
	q->pending -= n;
	if (q->pending == 0 && q->claimed) {
		list_remove(&g->zombies, q);
		free(q);
	}
	/* pending == 0 and unclaimed: the fault that stopped the launches
	 * makes the watchdog complete it */
	pthread_mutex_unlock(&g->mu);
}

/* Record the first fault (why: in words, or NULL) and wake the watchdog to
 * act on it. */
static void fault(struct coll_group *g, int err, const char *why)
{
	pthread_mutex_lock(&g->mu);
	if (!g->error && err != -ECANCELED) {
		g->error = err;
		snprintf(g->why, sizeof(g->why), "%s", why ? why : zc_strerror(err));
	}
	atomic_store(&g->stop, true);
	pthread_cond_broadcast(&g->cv);
	pthread_mutex_unlock(&g->mu);
}

/* ------------------------------------------------------ communicators --- */

/* Wait until no communicator of the list is still in progress. 0, the
 * first error, -ECANCELED if stop is set meanwhile (unless deadline is 0:
 * open and close are not stoppable), -ETIMEDOUT past the deadline. */
static int comms_settle(struct coll_group *g, ncclComm_t *comm, uint32_t n, int64_t deadline)
{
	for (;;) {
		bool busy = false;

		for (uint32_t k = 0; k < n; k++) {
			ncclResult_t st;

			NCCL_TRY(ncclCommGetAsyncError(comm[k], &st));
			if (st == ncclInProgress)
				busy = true;
			else if (st != ncclSuccess)
				return nccl_fail(st, "ncclCommGetAsyncError", __FILE__, __LINE__);
		}
		if (!busy)
			return 0;
		if (!deadline && atomic_load(&g->stop))
			return -ECANCELED;
		if (deadline && now_ms() > deadline)
			return -ETIMEDOUT;
		sleep_ns(ISSUE_NS);
	}
}

/* Abort every communicator (the watchdog, or a failed open/close). */
static void comms_abort(struct coll_group *g)
{
	for (unsigned s = 0; s < NSETS; s++)
		for (uint32_t k = 0; g->set[s].comm && k < g->nlocal; k++)
			if (g->set[s].comm[k]) {
				(void)ncclCommAbort(g->set[s].comm[k]);
				g->set[s].comm[k] = NULL;
			}
	g->comms_live = false;
}

/* Finalize and destroy every communicator; abort them if that fails. */
static void comms_destroy(struct coll_group *g)
{
	int64_t deadline = now_ms() + CLOSE_TIMEOUT_MS;
	int r = 0;

	for (unsigned s = 0; s < g->nsets && r == 0; s++) {
		for (uint32_t k = 0; k < g->nlocal && r == 0; k++)
			NCCL_GOTO(ncclCommFinalize(g->set[s].comm[k]), r, out);
		r = comms_settle(g, g->set[s].comm, g->nlocal, deadline);
	}
out:
	if (r < 0) {
		comms_abort(g);
		return;
	}
	for (unsigned s = 0; s < g->nsets; s++)
		for (uint32_t k = 0; k < g->nlocal; k++) {
			(void)ncclCommDestroy(g->set[s].comm[k]);
			g->set[s].comm[k] = NULL;
		}
	g->comms_live = false;
}

/* ----------------------------------------------------------- watchdog --- */

/* Poll every communicator once: 0, or the async error of the first that
 * has one. */
static int comms_poll(struct coll_group *g)
{
	for (unsigned s = 0; s < g->nsets; s++)
		for (uint32_t k = 0; k < g->nlocal; k++) {
			ncclResult_t st;

			NCCL_TRY(ncclCommGetAsyncError(g->set[s].comm[k], &st));
			if (st != ncclSuccess && st != ncclInProgress)
				return nccl_fail(st, "ncclCommGetAsyncError", __FILE__, __LINE__);
		}
	return 0;
}

/* Abort the communicators and complete every request in flight. */
static void watchdog_abort(struct coll_group *g)
{
	struct nreq *q, *claimed = NULL;
	int status;

	/* submitters notice stop and leave their polls, then we own the
	 * communicators */
	for (unsigned s = 0; s < NSETS; s++)
		pthread_mutex_lock(&g->set[s].mu);
	comms_abort(g);
	for (unsigned s = NSETS; s-- > 0;)
		pthread_mutex_unlock(&g->set[s].mu);

	pthread_mutex_lock(&g->mu);
	status = g->error ? g->error : -ECANCELED;
	while ((q = g->inflight)) {
		g->inflight = q->next;
		q->claimed = true;
		/* our own reference: q lives until we have called its done(),
		 * whatever its host functions do meanwhile */
		q->pending++;
		q->next = g->zombies;
		g->zombies = q;
		q->dnext = claimed;
		claimed = q;
		if (q->req->kind == COLL_GATHER)
			g->gbusy = false; /* stop is set: no gather follows */
	}
	pthread_mutex_unlock(&g->mu);
	while ((q = claimed)) {
		claimed = q->dnext;
		q->req->done(q->req, status);
		drop_pending(g, q, 1);
	}
}

static void *watchdog_main(void *arg)
{
	struct coll_group *g = arg;

	pthread_mutex_lock(&g->mu);
	while (!g->quit) {
		if (atomic_load(&g->stop) && g->comms_live) {
			pthread_mutex_unlock(&g->mu);
			watchdog_abort(g);
			pthread_mutex_lock(&g->mu);
			continue;
		}
		if (!g->inflight || !g->comms_live) {
			pthread_cond_wait(&g->cv, &g->mu);
			continue;
		}
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += POLL_NS;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&g->cv, &g->mu, &ts);
		if (g->quit || atomic_load(&g->stop) || !g->inflight)
			continue;
		pthread_mutex_unlock(&g->mu);
		int r = comms_poll(g);
		pthread_mutex_lock(&g->mu);
		if (r < 0) {
			if (!g->error) {
				g->error = r;
				snprintf(g->why, sizeof(g->why), "%s", zc_strerror(r));
			}
			atomic_store(&g->stop, true);
		}
	}
	pthread_mutex_unlock(&g->mu);
	return NULL;
}

/* --------------------------------------------------------- open/close --- */

/* Free the gather staging (streams are drained). */
static void gather_free(struct coll_group *g)
{
	for (uint32_t k = 0; g->gdev && k < g->nlocal; k++)
		if (g->gdev[k]) {
			(void)cudaSetDevice(g->dev[k]);
			(void)cudaFree(g->gdev[k]);
		}
	if (g->ghost)
		(void)cudaFreeHost(g->ghost);
	free(g->gdev);
	free(g->gpiece);
}

/* Wait until the work on stream st (device dev) is done, or the deadline:
 * true if it drained. An event recorded and polled, not
 * cudaStreamSynchronize: a stream held by a wait on a dead trainer's event
 * never drains, and this must return. */
static bool stream_drain(int dev, cudaStream_t st, int64_t deadline)
{
	cudaEvent_t ev;
	cudaError_t e;

	if (cudaSetDevice(dev) != cudaSuccess ||
	    cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess)
		return false;
	e = cudaEventRecord(ev, st);
	if (e == cudaSuccess)
		while ((e = cudaEventQuery(ev)) == cudaErrorNotReady && now_ms() <= deadline)
			sleep_ns(100 * ISSUE_NS);
	(void)cudaEventDestroy(ev); /* CUDA frees it once the record is done */
	return e == cudaSuccess;
}

static void nccl_close(struct coll_group *g)
{
	unsigned stuck = 0;
	int64_t deadline;

	if (!g)
		return;
	if (g->watchdog_started) {
		pthread_mutex_lock(&g->mu);
		g->quit = true;
		pthread_cond_broadcast(&g->cv);
		pthread_mutex_unlock(&g->mu);
		pthread_join(g->watchdog, NULL);
	}
	if (g->comms_live)
		comms_destroy(g);
	else
		comms_abort(g); /* a half-built open: whatever exists */
	deadline = now_ms() + CLOSE_TIMEOUT_MS;
	for (unsigned s = 0; s < NSETS; s++)
		for (uint32_t k = 0; g->set[s].stream && k < g->nlocal; k++) {
			if (!g->set[s].stream[k])
				continue;
			/* the host functions of aborted requests run first */
			if (!stream_drain(g->dev[k], g->set[s].stream[k], deadline)) {
				stuck++;
				continue;
			}
			(void)cudaStreamDestroy(g->set[s].stream[k]);
			g->set[s].stream[k] = NULL;
		}
	if (stuck) {
		/* their host functions may still run and take g->mu, and a
		 * cudaFree would wait for them: everything stays */
		log_warning("nccl: %u stream%s did not drain in %d ms (a trainer's event "
			    "that never completes?): abandoned, the group's memory leaked",
			    stuck, stuck == 1 ? "" : "s", CLOSE_TIMEOUT_MS);
		(void)cudaGetLastError();
		return;
	}
	for (unsigned s = 0; s < NSETS; s++) {
		free(g->set[s].comm);
		free(g->set[s].stream);
		pthread_mutex_destroy(&g->set[s].mu);
	}
	for (uint64_t i = 0; g->ready && i < (uint64_t)g->nlocal * g->nev; i++) {
		if (g->ready[i])
			(void)cudaEventDestroy(g->ready[i]);
		if (g->done[i])
			(void)cudaEventDestroy(g->done[i]);
	}
	free(g->ready);
	free(g->done);
	gather_free(g);
	(void)cudaGetLastError();
	/* streams are drained: no host function will come for these */
	while (g->zombies) {
		struct nreq *q = g->zombies;
		g->zombies = q->next;
		free(q);
	}
	pthread_cond_destroy(&g->cv);
	pthread_mutex_destroy(&g->mu);
	free(g->node_first);
	free(g->lk);
	free(g->local);
	free(g->dev);
	free(g->grads);
	free(g->params);
	free(g);
}

/* The device of buffer p, or a negative code (host memory: -EINVAL). */
static int ptr_device(const void *p)
{
	struct cudaPointerAttributes a;

	CUDA_TRY(cudaPointerGetAttributes(&a, p));
	if (a.type != cudaMemoryTypeDevice)
		return -EINVAL;
	return a.device;
}

/* Check the buffers, note each local rank's device. */
static int group_layout(struct coll_group *g, const struct coll_config *cfg)
{
	for (uint32_t r = 0; r < cfg->world; r++) {
		int dg, dp;

		if (!cfg->grads[r] != !cfg->params[r])
			return -EINVAL;
		if (!cfg->grads[r])
			continue;
		dg = ptr_device(cfg->grads[r]);
		dp = ptr_device(cfg->params[r]);
		if (dg < 0 || dp < 0)
			return dg < 0 ? dg : dp;
		if (dg != dp)
			return -EINVAL;
		for (uint32_t k = 0; k < g->nlocal; k++)
			if (g->dev[k] == dg)
				return -EOPNOTSUPP; /* NCCL: one rank per GPU */
		g->local[g->nlocal] = r;
		g->dev[g->nlocal] = dg;
		g->nlocal++;
		g->grads[r] = cfg->grads[r];
		g->params[r] = cfg->params[r];
	}
	return g->nlocal ? 0 : -EINVAL;
}

/* The job's NCCL unique id: the one given (cfg->nccl_id); else, for a job
 * over several nodes, the one node 0 makes and sets in the job's store under
 * "<prefix>nccl-id" for the others to get (the rendezvous's key-value store,
 * as gloo swaps its addresses); else, with every rank here, a new one. */
static int unique_id(struct coll_group *g, const struct coll_config *cfg, ncclUniqueId *id,
		     int64_t deadline)
{
	const struct coll_net *net = cfg->net;
	char key[256];
	void *v = NULL;
	size_t len = 0;
	int r;

	if (cfg->nccl_id) {
		memcpy(id->internal, cfg->nccl_id, sizeof(id->internal));
		return 0;
	}
	if (!net || net->nnodes <= 1 || !net->store || !net->prefix) {
		/* only a job that is all here can make its own id */
		if (g->nlocal != g->world)
			return -EINVAL;
		NCCL_TRY(ncclGetUniqueId(id));
		return 0;
	}
	if ((size_t)snprintf(key, sizeof(key), "%snccl-id", net->prefix) >= sizeof(key))
		return -ENAMETOOLONG;
	if (net->node == 0) {
		NCCL_TRY(ncclGetUniqueId(id));
		return net->store->set(net->store->ctx, key, id->internal, sizeof(id->internal));
	}
	r = net->store->get(net->store->ctx, key, (int)MAX(deadline - now_ms(), 1), &v, &len);
	if (r < 0)
		return r;
	if (len != sizeof(id->internal)) {
		free(v);
		return -EPROTO;
	}
	memcpy(id->internal, v, len);
	free(v);
	return 0;
}

static int group_comms(struct coll_group *g, const struct coll_config *cfg)
{
	int64_t deadline =
		now_ms() + (cfg->open_timeout_ms > 0 ? cfg->open_timeout_ms : OPEN_TIMEOUT_MS);
	ncclConfig_t nc = NCCL_CONFIG_INITIALIZER;
	ncclUniqueId id;
	int r = 0;

	nc.blocking = 0;
	r = unique_id(g, cfg, &id, deadline);
	if (r < 0)
		return r;
	g->comms_live = true; /* from here on close() must tear them down */
	NCCL_TRY(ncclGroupStart());
	for (uint32_t k = 0; k < g->nlocal; k++) {
		CUDA_GOTO(cudaSetDevice(g->dev[k]), r, end0);
		NCCL_GOTO(ncclCommInitRankConfig(&g->set[0].comm[k], (int)g->world, id,
						 (int)g->local[k], &nc),
			  r, end0);
	}
end0:
	NCCL_TRY(ncclGroupEnd());
	if (r < 0)
		return r;
	r = comms_settle(g, g->set[0].comm, g->nlocal, deadline);
	if (r < 0)
		return r;
	NCCL_TRY(ncclGroupStart());
	for (uint32_t k = 0; k < g->nlocal; k++) {
		CUDA_GOTO(cudaSetDevice(g->dev[k]), r, end1);
		NCCL_GOTO(ncclCommSplit(g->set[0].comm[k], 0, (int)g->local[k], &g->set[1].comm[k],
					&nc),
			  r, end1);
	}
end1:
	NCCL_TRY(ncclGroupEnd());
	if (r < 0)
		return r;
	r = comms_settle(g, g->set[1].comm, g->nlocal, deadline);
	if (r < 0 || g->nsets < 3)
		return r;
	NCCL_TRY(ncclGroupStart());
	for (uint32_t k = 0; k < g->nlocal; k++) {
		CUDA_GOTO(cudaSetDevice(g->dev[k]), r, end2);
		NCCL_GOTO(ncclCommSplit(g->set[0].comm[k], 0, (int)g->local[k],
					&g->set[SET_GATHER].comm[k], &nc),
			  r, end2);
	}
end2:
	NCCL_TRY(ncclGroupEnd());
	if (r < 0)
		return r;
	return comms_settle(g, g->set[SET_GATHER].comm, g->nlocal, deadline);
}

/* Each local rank's event rings, on its device. */
static int open_events(struct coll_group *g, const struct coll_config *cfg)
{
	const struct cudabufs *cb0 = cfg->bufs[g->local[0]];
	size_t n;

	g->ring = cb0->ring;
	g->nev = cb0->nbuckets * cb0->ring;
	n = (size_t)g->nlocal * g->nev;
	g->ready = calloc(n ? n : 1, sizeof(*g->ready));
	g->done = calloc(n ? n : 1, sizeof(*g->done));
	if (!g->ready || !g->done)
		return -ENOMEM;
	for (uint32_t k = 0; k < g->nlocal; k++) {
		const struct cudabufs *cb = cfg->bufs[g->local[k]];
		cudaError_t e = cudaSetDevice(g->dev[k]);

		if (cb->ring != g->ring || cb->nbuckets * cb->ring != g->nev) {
			if (cfg->err)
				snprintf(cfg->err, cfg->errlen,
					 "rank %u: an event ring of %u, rank %u: %u", g->local[k],
					 cb->ring, g->local[0], g->ring);
			return ZC_EBUFFER;
		}
		for (uint32_t i = 0; i < 2 * g->nev && e == cudaSuccess; i++) {
			cudaIpcEventHandle_t h;
			cudaEvent_t *ev = i < g->nev ? &g->ready[(size_t)k * g->nev + i]
						     : &g->done[(size_t)k * g->nev + i - g->nev];

			memcpy(&h, cb->events + (size_t)i * CUDABUFS_EVENT_BYTES, sizeof(h));
			e = cudaIpcOpenEventHandle(ev, h);
			if (e != cudaSuccess && cfg->err)
				snprintf(cfg->err, cfg->errlen,
					 "rank %u: cannot open its %s event %u (bucket %u): %s (%s)",
					 g->local[k], i < g->nev ? "ready" : "done", i % g->nev,
					 i % g->nev / g->ring, cudaGetErrorString(e),
					 cudaGetErrorName(e));
		}
		if (e != cudaSuccess) {
			(void)cudaGetLastError();
			return ZC_EBUFFER;
		}
	}
	return 0;
}

/* At open: the gather staging for `bytes` per rank (a multiple of 8), on
 * every local device and pinned, and the host buffer for a piece of a
 * larger gather. Never resized: a job allocates nothing while it runs. */
static int gather_alloc(struct coll_group *g, size_t bytes)
{
	size_t cap = MAX(bytes, (size_t)GATHER_MIN);
	void *h = NULL;

	cap = (cap + 7) & ~(size_t)7;
	g->gdev = calloc(g->nlocal, sizeof(*g->gdev));
	g->gpiece = malloc(g->nnodes * cap);
	if (!g->gdev || !g->gpiece)
		return -ENOMEM;
	for (uint32_t i = 0; i < g->nlocal; i++) {
		CUDA_TRY(cudaSetDevice(g->dev[i]));
		CUDA_TRY(cudaMalloc(&g->gdev[i], cap * g->world));
	}
	CUDA_TRY(cudaMallocHost(&h, cap * (1 + (size_t)g->world)));
	g->ghost = h;
	g->gcap = cap;
	return 0;
}

/* The dev_mu indices of the local devices: ascending, each once. */
static int group_locks(struct coll_group *g)
{
	bool seen[DEV_LOCKS] = {false};

	pthread_once(&dev_mu_once, dev_mu_init);
	g->lk = calloc(g->nlocal, sizeof(*g->lk));
	if (!g->lk)
		return -ENOMEM;
	for (uint32_t k = 0; k < g->nlocal; k++)
		seen[(unsigned)g->dev[k] % DEV_LOCKS] = true;
	for (unsigned i = 0; i < DEV_LOCKS; i++)
		if (seen[i])
			g->lk[g->nlk++] = i;
	return 0;
}

/* The job's nodes and the lowest rank of each (whose gathered part is its
 * node's); a job over several nodes gets its gather set. */
static int group_nodes(struct coll_group *g, const struct coll_config *cfg)
{
	const struct coll_net *net = cfg->net;

	g->nsets = 2;
	g->nnodes = 1;
	if (!net || net->nnodes <= 1 || !net->node_of)
		return 0;
	g->nsets = 3;
	g->nnodes = net->nnodes;
	g->node_first = malloc(net->nnodes * sizeof(*g->node_first));
	if (!g->node_first)
		return -ENOMEM;
	for (uint32_t n = 0; n < net->nnodes; n++)
		g->node_first[n] = UINT32_MAX;
	for (uint32_t r = cfg->world; r-- > 0;) {
		if (net->node_of[r] >= net->nnodes)
			return -EINVAL;
		g->node_first[net->node_of[r]] = r;
	}
	for (uint32_t n = 0; n < net->nnodes; n++)
		if (g->node_first[n] == UINT32_MAX)
			return -EINVAL; /* a node without ranks */
	return 0;
}

static int nccl_open(const struct coll_config *cfg, struct coll_group **ret)
{
	struct coll_group *g = calloc(1, sizeof(*g));
	int r = -ENOMEM;

	if (!g)
		return -ENOMEM;
	pthread_mutex_init(&g->mu, NULL);
	pthread_cond_init(&g->cv, NULL);
	for (unsigned s = 0; s < NSETS; s++)
		pthread_mutex_init(&g->set[s].mu, NULL);
	atomic_init(&g->stop, false);
	g->world = cfg->world;
	g->ready_ms = cfg->ready_timeout_ms > 0 ? cfg->ready_timeout_ms : READY_TIMEOUT_MS;
	g->local = calloc(cfg->world, sizeof(*g->local));
	g->dev = calloc(cfg->world, sizeof(*g->dev));
	g->grads = calloc(cfg->world, sizeof(*g->grads));
	g->params = calloc(cfg->world, sizeof(*g->params));
	if (!g->local || !g->dev || !g->grads || !g->params)
		goto fail;
	r = group_layout(g, cfg);
	if (r < 0)
		goto fail;
	r = group_locks(g);
	if (r < 0)
		goto fail;
	r = group_nodes(g, cfg);
	if (r < 0)
		goto fail;
	if (g->nsets == 3 && (r = gather_alloc(g, cfg->gather_bytes)) < 0)
		goto fail;
	if (cfg->bufs && g->nlocal) {
		r = open_events(g, cfg);
		if (r < 0)
			goto fail;
	}
	for (unsigned s = 0; s < g->nsets; s++) {
		g->set[s].comm = calloc(g->nlocal, sizeof(*g->set[s].comm));
		g->set[s].stream = calloc(g->nlocal, sizeof(*g->set[s].stream));
		if (!g->set[s].comm || !g->set[s].stream) {
			r = -ENOMEM;
			goto fail;
		}
		for (uint32_t k = 0; k < g->nlocal; k++) {
			CUDA_GOTO(cudaSetDevice(g->dev[k]), r, fail);
			CUDA_GOTO(cudaStreamCreateWithFlags(&g->set[s].stream[k],
							    cudaStreamNonBlocking),
				  r, fail);
		}
	}
	r = group_comms(g, cfg);
	if (r < 0) {
		comms_abort(g); /* a failed init is not finalized */
		goto fail;
	}
	r = -pthread_create(&g->watchdog, NULL, watchdog_main, g);
	if (r < 0)
		goto fail;
	g->watchdog_started = true;
	*ret = g;
	return 0;
fail:
	nccl_close(g);
	return r;
}

/* ------------------------------------------------------------- issue --- */

/* The slices of a slice-mode request are equal and in rank order: one
 * reduce-scatter / all-gather of count elements each serves them all. */
static bool equal_slices(const struct coll_group *g, const struct coll_req *req, size_t *count)
{
	const struct coll_range *rg = req->ranges;

	if (req->mode != ZC_SHARD_SLICE || req->nranges != g->world)
		return false;
	for (uint32_t i = 0; i < req->nranges; i++)
		if (rg[i].owner != i || rg[i].n != rg[0].n ||
		    rg[i].off != rg[0].off + i * rg[0].n || rg[i].dtype != rg[0].dtype)
			return false;
	*count = rg[0].n;
	return true;
}

/* NCCL's type for a bucket's dtype. */
static ncclDataType_t nccl_type(enum zc_dtype t)
{
	return t == ZC_DTYPE_BF16 ? ncclBfloat16 : t == ZC_DTYPE_F16 ? ncclFloat16 : ncclFloat32;
}

/* One local rank's part of the group call. Offsets count elements of each
 * range's dtype; bf16/fp16 ranges are reduced by NCCL in their own type
 * (ncclAvg), so over several ranks their rounding is NCCL's, not the host
 * backend's rounded-once fp32 sum (docs/DATAPLANE.md). */
static ncclResult_t issue_rank(const struct coll_group *g, const void *arg, uint32_t k,
			       ncclComm_t comm, cudaStream_t st)
{
	const struct coll_req *req = arg;
	uint32_t rank = g->local[k];
	const struct coll_range *rg = req->ranges;
	char *grads = (char *)g->grads[rank], *params = (char *)g->params[rank];
	ncclResult_t e = ncclSuccess;
	size_t c;

	if (equal_slices(g, req, &c)) {
		size_t es = plan_dtype_size(rg[0].dtype);
		uint64_t at = rg[0].off;
		ncclDataType_t ty = nccl_type(rg[0].dtype);

		if (req->kind == COLL_REDUCE)
			return ncclReduceScatter(grads + at * es, grads + (at + rank * c) * es, c,
						 ty, ncclAvg, comm, st);
		return ncclAllGather(params + (at + rank * c) * es, params + at * es, c, ty, comm,
				     st);
	}
	for (uint32_t i = 0; i < req->nranges && (e == ncclSuccess || e == ncclInProgress);) {
		uint64_t off = rg[i].off, end = rg[i].off + rg[i].n;
		size_t es = plan_dtype_size(rg[i].dtype);
		ncclDataType_t ty = nccl_type(rg[i].dtype);
		uint32_t j = i + 1;

		/* bucket mode's all-reduce spans every contiguous range; other
		 * calls merge contiguous ranges of one owner; never two dtypes */
		while (j < req->nranges && rg[j].off == end && rg[j].dtype == rg[i].dtype &&
		       ((req->kind == COLL_REDUCE && req->mode == ZC_SHARD_BUCKET) ||
			rg[j].owner == rg[i].owner))
			end += rg[j++].n;
		if (req->kind == COLL_REDUCE && req->mode == ZC_SHARD_BUCKET)
			e = ncclAllReduce(grads + off * es, grads + off * es, end - off, ty,
					  ncclAvg, comm, st);
		else if (req->kind == COLL_REDUCE)
			e = ncclReduce(grads + off * es, grads + off * es, end - off, ty, ncclAvg,
				       (int)rg[i].owner, comm, st);
		else
			e = ncclBroadcast(params + off * es, params + off * es, end - off, ty,
					  (int)rg[i].owner, comm, st);
		i = j;
	}
	return e;
}

/* Local rank k's event of bucket b, iteration t. */
static cudaEvent_t ring_event(const struct coll_group *g, cudaEvent_t *evs, uint32_t k, uint32_t b,
			      uint64_t t)
{
	return evs[(size_t)k * g->nev + (size_t)b * g->ring + t % g->ring];
}

/* Under the set's mutex: each local stream waits on its trainer's ready
 * events, or records its done events (req->ev). */
static int ring_events(struct coll_group *g, struct cset *set, const struct coll_req *req,
		       unsigned which)
{
	int r = 0;

	if (!g->ready || !(req->ev & which))
		return 0;
	for (uint32_t k = 0; k < g->nlocal; k++) {
		CUDA_TRY(cudaSetDevice(g->dev[k]));
		for (uint32_t b = req->ev_lo; b <= req->ev_hi; b++) {
			if (which == COLL_EV_WAIT_READY)
				CUDA_GOTO(cudaStreamWaitEvent(set->stream[k],
							      ring_event(g, g->ready, k, b,
									 req->ev_iter),
							      0),
					  r, out);
			else
				CUDA_GOTO(cudaEventRecord(ring_event(g, g->done, k, b,
								     req->ev_iter),
							  set->stream[k]),
					  r, out);
		}
	}
out:
	return r;
}

/* Under the set's mutex: the gradients of marked segments to zero, on the
 * streams (coll_req.zero). */
static int zero_marked(struct coll_group *g, struct cset *set, const struct coll_req *req)
{
	for (uint32_t i = 0; i < req->nzero; i++) {
		const struct coll_zero *z = &req->zero[i];
		uint32_t k = 0;

		while (k < g->nlocal && g->local[k] != z->rank)
			k++;
		if (k == g->nlocal)
			return -EINVAL;
		CUDA_TRY(cudaSetDevice(g->dev[k]));
		CUDA_TRY(cudaMemsetAsync((char *)g->grads[z->rank] + z->off, 0, z->bytes,
					 set->stream[k]));
	}
	return 0;
}

/* Under the set's mutex, before anything is queued behind them: poll the
 * trainers' ready events of req from the host until every one is
 * complete. -ECANCELED on abort; -ETIMEDOUT after g->ready_ms, with why
 * naming the first event still pending (a dead or hung trainer). */
static int ready_wait(struct coll_group *g, const struct coll_req *req, char *why, size_t len)
{
	int64_t deadline = now_ms() + g->ready_ms;

	if (!g->ready || !(req->ev & COLL_EV_WAIT_READY))
		return 0;
	for (uint32_t k = 0; k < g->nlocal; k++) {
		CUDA_TRY(cudaSetDevice(g->dev[k]));
		for (uint32_t b = req->ev_lo; b <= req->ev_hi; b++) {
			cudaEvent_t ev = ring_event(g, g->ready, k, b, req->ev_iter);
			cudaError_t e;

			while ((e = cudaEventQuery(ev)) == cudaErrorNotReady) {
				if (atomic_load(&g->stop))
					return -ECANCELED;
				if (now_ms() > deadline) {
					snprintf(why, len,
						 "rank %u's ready event of bucket %u, iteration "
						 "%" PRIu64 ", not complete after %d ms: its "
						 "trainer is dead or hung",
						 g->local[k], b, req->ev_iter, g->ready_ms);
					return -ETIMEDOUT;
				}
				sleep_ns(ISSUE_NS);
			}
			if (e != cudaSuccess)
				return cuda_fail(e, "cudaEventQuery", __FILE__, __LINE__);
		}
	}
	return 0;
}

/* One local rank's part of a group call (index k into local). */
typedef ncclResult_t (*rank_call)(const struct coll_group *g, const void *arg, uint32_t k,
				  ncclComm_t comm, cudaStream_t st);

/* Under the set's mutex: one group call over the local ranks and its
 * settle, under the local devices' mutexes (the launch order). */
static int group_launch(struct coll_group *g, struct cset *set, rank_call call, const void *arg)
{
	int r = 0, re = 0;

	devs_lock(g);
	NCCL_GOTO(ncclGroupStart(), r, unlock);
	for (uint32_t k = 0; k < g->nlocal; k++) {
		CUDA_GOTO(cudaSetDevice(g->dev[k]), r, end);
		NCCL_GOTO(call(g, arg, k, set->comm[k], set->stream[k]), r, end);
	}
end:
	NCCL_GOTO(ncclGroupEnd(), re, unlock);
	/* a non-blocking call may not be on the streams yet: a host function
	 * queued now could run before the collective */
	if (r == 0)
		r = comms_settle(g, set->comm, g->nlocal, 0);
unlock:
	devs_unlock(g);
	return r < 0 ? r : re;
}

/* Under the set's mutex: the group call, then its host functions. */
static int issue(struct coll_group *g, struct cset *set, struct nreq *q, char *why, size_t len)
{
	unsigned launched = 0;
	int r;

	r = ready_wait(g, q->req, why, len);
	if (r < 0)
		goto out;
	r = ring_events(g, set, q->req, COLL_EV_WAIT_READY);
	if (r < 0)
		goto out;
	r = zero_marked(g, set, q->req);
	if (r < 0)
		goto out;
	r = group_launch(g, set, issue_rank, q->req);
	if (r < 0)
		goto out;
	r = ring_events(g, set, q->req, COLL_EV_RECORD_DONE);
	for (uint32_t k = 0; k < g->nlocal && r == 0; k++) {
		CUDA_GOTO(cudaSetDevice(g->dev[k]), r, out);
		CUDA_GOTO(cudaLaunchHostFunc(set->stream[k], host_done, q), r, out);
		launched++;
	}
out:
	if (launched < g->nlocal)
		drop_pending(g, q, g->nlocal - launched);
	return r;
}

/* ------------------------------------------------------------ gather --- */

/* A host function on local rank 0's stream, after the copy back: each
 * node's part into gout, unless the watchdog completed the request. */
static void gather_out(void *arg)
{
	struct nreq *q = arg;
	struct coll_group *g = q->g;
	const struct coll_req *req = q->req;

	pthread_mutex_lock(&g->mu);
	if (!q->claimed)
		for (uint32_t n = 0; n < g->nnodes; n++)
			memcpy((char *)req->gout + n * req->gbytes,
			       g->ghost + (1 + (size_t)g->node_first[n]) * req->gbytes,
			       req->gbytes);
	pthread_mutex_unlock(&g->mu);
	host_done(q);
}

/* A local rank's all-gather in place of its device staging (arg: gbytes). */
static ncclResult_t gather_rank(const struct coll_group *g, const void *arg, uint32_t k,
				ncclComm_t comm, cudaStream_t st)
{
	size_t gb = *(const size_t *)arg;
	char *buf = g->gdev[k];

	/* bytes as floats (gbytes is a multiple of 8): copied, not summed */
	return ncclAllGather(buf + g->local[k] * gb, buf, gb / sizeof(float), ncclFloat32, comm,
			     st);
}

/* Under set 2's mutex, gbytes <= gcap: in, all-gather, out, then the host
 * functions. */
static int issue_gather(struct coll_group *g, struct cset *set, struct nreq *q)
{
	const struct coll_req *req = q->req;
	size_t gb = req->gbytes;
	unsigned launched = 0;
	int r = 0;

	memcpy(g->ghost, req->gin, gb); /* the last gather is done with it */
	for (uint32_t k = 0; k < g->nlocal; k++) {
		CUDA_GOTO(cudaSetDevice(g->dev[k]), r, out);
		CUDA_GOTO(cudaMemcpyAsync((char *)g->gdev[k] + g->local[k] * gb, g->ghost, gb,
					  cudaMemcpyHostToDevice, set->stream[k]),
			  r, out);
	}
	r = group_launch(g, set, gather_rank, &gb);
	if (r < 0)
		goto out;
	CUDA_GOTO(cudaSetDevice(g->dev[0]), r, out);
	CUDA_GOTO(cudaMemcpyAsync(g->ghost + gb, g->gdev[0], gb * g->world, cudaMemcpyDeviceToHost,
				  set->stream[0]),
		  r, out);
	CUDA_GOTO(cudaLaunchHostFunc(set->stream[0], gather_out, q), r, out);
	launched++;
	for (uint32_t k = 0; k < g->nlocal; k++) {
		CUDA_GOTO(cudaSetDevice(g->dev[k]), r, out);
		CUDA_GOTO(cudaLaunchHostFunc(set->stream[k], host_done, q), r, out);
		launched++;
	}
out:
	if (launched < g->nlocal + 1)
		drop_pending(g, q, g->nlocal + 1 - launched);
	return r;
}

/* A gather on one node: the node's part is all there is. */
static int gather_here(struct coll_group *g, struct coll_req *req)
{
	if (g->nlocal != g->world)
		return -EINVAL; /* several nodes, but open was not told which */
	memmove(req->gout, req->gin, req->gbytes);
	req->done(req, 0);
	return 0;
}

/* Issue one request (a gather of at most gcap bytes per rank). */
static int submit_one(struct coll_group *g, struct coll_req *req)
{
	bool gather = req->kind == COLL_GATHER;
	struct cset *set = &g->set[gather ? SET_GATHER : req->kind == COLL_REDUCE ? 0 : 1];
	char why[sizeof(g->why)] = "";
	struct nreq *q;
	int r;

	q = calloc(1, sizeof(*q));
	if (!q)
		return -ENOMEM;
	*q = (struct nreq){.g = g, .req = req, .pending = g->nlocal + gather};
	pthread_mutex_lock(&set->mu);
	pthread_mutex_lock(&g->mu);
	if (atomic_load(&g->stop) || (gather && g->gbusy)) {
		r = atomic_load(&g->stop) ? (g->error ? g->error : -ECANCELED) : -EBUSY;
		pthread_mutex_unlock(&g->mu);
		pthread_mutex_unlock(&set->mu);
		free(q);
		return r;
	}
	g->gbusy = g->gbusy || gather;
	q->next = g->inflight;
	g->inflight = q;
	pthread_cond_broadcast(&g->cv); /* the watchdog polls while it is in flight */
	pthread_mutex_unlock(&g->mu);
	r = gather ? issue_gather(g, set, q) : issue(g, set, q, why, sizeof(why));
	pthread_mutex_unlock(&set->mu);
	/* issued or not, it is in flight: the watchdog completes it */
	if (r < 0)
		fault(g, r, why[0] ? why : NULL);
	return 0;
}

/* A piece of a gather larger than the staging, and its completion. */
struct piece {
	struct coll_req req;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool done;
	int status;
};

static void piece_done(struct coll_req *req, int status)
{
	struct piece *p = (struct piece *)((char *)req - offsetof(struct piece, req));

	pthread_mutex_lock(&p->mu);
	p->done = true;
	p->status = status;
	pthread_cond_signal(&p->cv);
	pthread_mutex_unlock(&p->mu);
}

/* A gather larger than the staging (a state export): in pieces of gcap
 * bytes, one after the other, each node's part of each piece into its
 * place in gout. Waits for each piece here (the caller waits for the whole
 * anyway), then calls done() itself. */
static int gather_pieces(struct coll_group *g, struct coll_req *req)
{
	struct piece p = {.done = false};
	bool issued = false;
	int r = 0;

	pthread_mutex_init(&p.mu, NULL);
	pthread_cond_init(&p.cv, NULL);
	for (size_t off = 0; off < req->gbytes && r == 0; off += g->gcap) {
		size_t len = MIN(g->gcap, req->gbytes - off);

		p.req = (struct coll_req){.kind = COLL_GATHER,
					  .mode = req->mode,
					  .lane = req->lane,
					  .gin = (const char *)req->gin + off,
					  .gout = g->gpiece,
					  .gbytes = len,
					  .done = piece_done};
		p.done = false;
		r = submit_one(g, &p.req);
		if (r < 0)
			break;
		issued = true;
		pthread_mutex_lock(&p.mu);
		while (!p.done)
			pthread_cond_wait(&p.cv, &p.mu);
		r = p.status;
		pthread_mutex_unlock(&p.mu);
		for (uint32_t n = 0; n < g->nnodes && r == 0; n++)
			memcpy((char *)req->gout + n * req->gbytes + off, g->gpiece + n * len, len);
	}
	pthread_cond_destroy(&p.cv);
	pthread_mutex_destroy(&p.mu);
	if (!issued)
		return r; /* not issued: no done() */
	req->done(req, r);
	return 0;
}

static int nccl_submit(struct coll_group *g, struct coll_req *req)
{
	bool gather = req->kind == COLL_GATHER;

	if (gather && (req->gbytes % 8 || !req->gin || !req->gout))
		return -EINVAL;
	if (gather && g->nsets < 3)
		return gather_here(g, req);
	if (gather && req->gbytes > g->gcap)
		return gather_pieces(g, req);
	return submit_one(g, req);
}

static void nccl_abort(struct coll_group *g)
{
	/* the watchdog aborts the communicators and calls the done()s */
	fault(g, -ECANCELED, NULL);
}

/* The group's fault in words: every request after it fails because of it. */
static const char *nccl_last_error(struct coll_group *g, unsigned lane)
{
	(void)lane;
	return g->why;
}

const struct coll_ops coll_nccl_ops = {
	.name = "nccl",
	.local_fuse = false,
	.ordered_launch = true,
	.open = nccl_open,
	.submit = nccl_submit,
	.abort = nccl_abort,
	.close = nccl_close,
	.last_error = nccl_last_error,
};
