/*
 * test_cudajob.c — CUDA jobs end to end without a GPU: a real zerod linked
 * with the CUDA test double instead of the runtime and NCCL (zerod-double,
 * test-only) and real trainer processes whose libzeroclient loads the same
 * double as its CUDA runtime (ZEROD_CUDART = libzerocudadouble.so, which this
 * program links too, to allocate "device" memory and streams). The double's
 * device memory is host memory shared across processes, so every byte of the
 * path is real: RegisterPlan.cuda, the IPC handles opened by zerod's
 * executor, NCCL's (double's) collectives, the optimizer kernels' element
 * code, and the event rings:
 *  - jobs of 2-4 ranks, SGD, Adam and AdamW, both shard and step modes, equal
 *    to the single-process reference (tests/refoptim.c) bit for bit. Each
 *    rank hands a bucket over with zc_bucket_ready_cuda() while its gradients
 *    are still "in flight": they are NaN in the buffer and a host function
 *    queued on the rank's stream writes them 2 ms later, before the ready
 *    event's record. A daemon that did not wait on the event (on its stream)
 *    would average NaNs. After each step zc_step_wait_cuda() orders the
 *    stream behind the done events;
 *  - the state of a CUDA job out of the devices and back (zc_get_state,
 *    zc_set_state) between iterations, the job then trains on to the
 *    reference;
 *  - re-planning (cudareplan.c): ranks register new CUDA buffers and a new
 *    layout after 5 iterations, in the same or the other shard mode, over 2-4
 *    ranks and over the two nodes below, and end bit for bit on the
 *    reference; fp32, bf16 and fp16 buckets end where a run on the second
 *    layout from the same state (masters included) ends; a new plan that
 *    moves a parameter to another group is ZC_EREPLAN and the job trains on;
 *  - the CUDA kind on a zerod --backend host: ZC_ENOTSUP saying why;
 *  - no CUDA runtime in the trainer: ZC_ENOTSUP from zc_register_buffers();
 *  - a handle zerod cannot open (revoked in the double after
 *    zc_register_buffers(), as a handle of memory freed since) and a device
 *    zerod does not see (an unknown UUID): the job fails with ZC_EMAP naming
 *    the rank and the reason, while a second job beside it trains to the
 *    reference;
 *  - --max-device-memory: a job whose state passes it on one GPU is refused
 *    with ZC_ELIMIT naming the GPU, one beside it that fits trains;
 *  - two nodes: two zerod-double daemons on loopback (the rendezvous on a
 *    free port) whose NCCL cliques meet across the processes in shared
 *    memory (ZEROD_CUDADOUBLE_SHM=1), so the collectives move the bytes
 *    between the daemons: semtrain.c's jobs with masks, clipping (global
 *    and per group), a grad scale and a non-finite iteration in at_end, bit
 *    for bit against its reference (the double's average is a sum in rank
 *    order then one division; with node_of {0, 1} that is the order the
 *    references sum in); a job of 3 ranks over the two whose state goes out
 *    of the devices across the nodes and back, then trains on to the
 *    reference bit for bit; a bf16 and an fp16 bucket whose masters live on
 *    each owner's device, exported across the nodes and imported again
 *    (and zc_close() keeps the events zerod may still use);
 *    and a daemon killed mid-run: the other node's rank fails with
 *    ZC_ERANKDEAD naming node 1, no hang;
 *  - a trainer SIGKILLed mid-iteration whose ready events never complete
 *    (the double's waits outlive their exporter, as CUDA's): the job is torn
 *    down within the stall timeout, a job after it trains, zerod stops;
 *  - zerod-double's log holds nothing the double caught (a violation: two
 *    threads issuing NCCL on one device, an event recorded across devices).
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "cudadouble.h"
#include "cudarecover.h"
#include "cudareplan.h"
#include "harness.h"
#include "refoptim.h"
#include "semtrain.h"
#include "testlib.h"
#include "trainer.h"
#include "zctest.h"

#define NDEV 4 /* ZEROD_CUDADOUBLE_DEVICES (tests/meson.build) */

static struct zd daemon_;

/* ------------------------------------------------ the CUDA trainer hooks --- */

static cudaStream_t stream_;
static bool free_after_register_; /* the bad-handle case: revoke the handle */
static int late_iter_ = -1;       /* from this iteration on the gradients land 30 s late */
static int iters_done_;           /* this rank's iterations stepped */
static int device_;               /* -1: the rank's own (rank % NDEV) */

static int cuda_buffers(zc_client *c, const struct zc_plan *plan, uint32_t rank)
{
	struct zc_buffers b = ZC_BUFFERS_INIT;
	uint64_t bytes;
	char *base;
	int r;

	r = zc_plan_buffer_bytes(plan, &bytes);
	if (r < 0)
		return r;
	if (cudaSetDevice(device_ >= 0 ? device_ : (int)(rank % NDEV)) != cudaSuccess ||
	    cudaMalloc((void **)&base, 2 * bytes + 512) != cudaSuccess ||
	    cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking) != cudaSuccess) {
		printf("# rank %u: the double refused a device, an allocation or a stream\n", rank);
		return -ENOMEM;
	}
	/* both buffers in one allocation, neither at its base: the handle is
	 * the allocation's, each buffer an offset into it */
	b.kind = ZC_BUFFERS_CUDA;
	b.grad_dev = base + 256;
	b.param_dev = base + 256 + bytes;
	r = zc_register_buffers(c, plan, &b);
	if (r >= 0 && free_after_register_)
		cudadouble_ipc_revoke(base); /* zerod opens it only when the job starts */
	return r;
}

struct late_grads {
	float *dst, *src;
	uint64_t n;
	unsigned us; /* how late they land behind the ready call */
};

/* On the rank's stream: the gradients land only now. */
static void write_late(void *arg)
{
	struct late_grads *l = arg;

	usleep(l->us);
	memcpy(l->dst, l->src, l->n * sizeof(float));
	free(l->src);
	free(l);
}

static int cuda_ready(zc_client *c, uint32_t b, uint64_t numel, zc_future **ret)
{
	float *g = zc_grad_buffer(c, b);
	struct late_grads *l = calloc(1, sizeof(*l));

	if (!l || !(l->src = malloc(numel * sizeof(float))))
		return -ENOMEM;
	memcpy(l->src, g, numel * sizeof(float));
	for (uint64_t i = 0; i < numel; i++)
		g[i] = NAN;
	l->dst = g;
	l->n = numel;
	l->us = late_iter_ >= 0 && iters_done_ >= late_iter_ ? 30u * 1000 * 1000 : 2000;
	if (cudaLaunchHostFunc(stream_, write_late, l) != cudaSuccess)
		return -EIO;
	return zc_bucket_ready_cuda(c, b, stream_, ret);
}

static int cuda_stepped(zc_client *c, zc_future *step, int it)
{
	int r;

	(void)c;
	(void)it;
	iters_done_++;
	r = zc_step_wait_cuda(step, stream_);
	if (r < 0)
		return r;
	return cudaStreamSynchronize(stream_) == cudaSuccess ? 0 : -EIO;
}

static const struct train_hooks cuda_hooks = {
	.buffers = cuda_buffers,
	.ready = cuda_ready,
	.stepped = cuda_stepped,
};

/* The state round trip: after iteration 2 every rank exports the whole
 * state (zc_get_state: from the devices), checks it holds what three Adam
 * steps leave, and imports it again (zc_set_state: onto the devices); the
 * job then trains on to the reference, bit for bit, so the state went out
 * and came back whole. */
static struct train_plan round_tp_;

static int state_round_trip(zc_client *c)
{
	const struct zc_plan *p = &round_tp_.plan;
	struct zc_segment_state segs[5 * 4];
	float *mem[5 * 4][3] = {{NULL}};
	uint32_t n = 0;
	bool moved = false;
	int r = 0;

	for (uint32_t b = 0; b < p->nbuckets; b++)
		for (uint32_t g = 0; g < p->buckets[b].nsegments; g++, n++) {
			uint64_t numel = p->buckets[b].segments[g].numel;
			segs[n] = (struct zc_segment_state)ZC_SEGMENT_STATE_INIT;
			segs[n].bucket = b;
			segs[n].segment = g;
			for (int k = 0; k < 3; k++)
				mem[n][k] = calloc(numel, sizeof(float));
			segs[n].exp_avg = mem[n][0];
			segs[n].exp_avg_sq = mem[n][1];
			segs[n].max_exp_avg_sq = mem[n][2];
		}
	r = zc_get_state(c, segs, n);
	EXPECT(r == 0, "zc_get_state of a CUDA job: %s: %s", zc_strerror_name(r),
	       zc_error_message());
	for (uint32_t i = 0; i < n && r == 0; i++) {
		EXPECT(segs[i].step == 3 && (segs[i].present & ZC_STATE_EXP_AVG),
		       "segment %u of bucket %u: step %g, present %#x after 3 steps",
		       segs[i].segment, segs[i].bucket, segs[i].step, segs[i].present);
		moved = moved || segs[i].exp_avg[0] != 0;
	}
	EXPECT(r != 0 || moved, "the exported exp_avg is all zeros");
	if (r == 0) {
		r = zc_set_state(c, segs, n);
		EXPECT(r == 0, "zc_set_state of a CUDA job: %s: %s", zc_strerror_name(r),
		       zc_error_message());
	}
	for (uint32_t i = 0; i < n; i++)
		for (int k = 0; k < 3; k++)
			free(mem[i][k]);
	return r;
}

static int cuda_stepped_state(zc_client *c, zc_future *step, int it)
{
	int r = cuda_stepped(c, step, it);

	return r < 0 || it != 2 ? r : state_round_trip(c);
}

static const struct train_hooks cuda_state_hooks = {
	.buffers = cuda_buffers,
	.ready = cuda_ready,
	.stepped = cuda_stepped_state,
};

/* ------------------------------------------------------------- training --- */

static int rank_main(void *arg, int idx)
{
	return train_rank(arg, (uint32_t)idx);
}

static struct train_spec spec(const char *job, uint32_t world, enum zc_optimizer opt,
			      enum zc_shard_mode shard, enum zc_step_mode step, uint64_t seed)
{
	return (struct train_spec){
		.socket = daemon_.sock,
		.job = job,
		.world = world,
		.optimizer = opt,
		.shard_mode = shard,
		.step_mode = step,
		.iters = 5,
		.seed = seed,
		.hyper_iter = 3,
		.die_iter = -1,
		.hooks = &cuda_hooks,
	};
}

static void start_ranks(struct train_spec *s, pid_t *pids)
{
	for (uint32_t r = 0; r < s->world; r++)
		pids[r] = spawn(rank_main, s, (int)r);
}

static void check_ranks(const struct train_spec *s, const pid_t *pids)
{
	for (uint32_t r = 0; r < s->world; r++) {
		int st = wait_child(pids[r], test_timeout(60000));
		CHECK(st == 0, "%s rank %u exited with %d", s->job, r, st);
	}
}

/* zerod's log says job started on the cuda backend ("job J: plan ...,
 * backend cuda, ..."). */
static bool ran_on_cuda(const char *job)
{
	char want[96], line[1024];
	bool found = false;
	FILE *f = fopen(daemon_.log, "r");

	if (!f)
		return false;
	snprintf(want, sizeof(want), "job %s: plan ", job);
	while (!found && fgets(line, sizeof(line), f))
		found = strstr(line, want) && strstr(line, "backend cuda,");
	fclose(f);
	return found;
}

static void run(const char *job, uint32_t world, enum zc_optimizer opt, enum zc_shard_mode shard,
		enum zc_step_mode step, uint64_t seed)
{
	struct train_spec s = spec(job, world, opt, shard, step, seed);
	pid_t pids[NDEV];

	REQUIRE(zd_alive(&daemon_), "zerod is not running");
	device_ = -1;
	start_ranks(&s, pids);
	check_ranks(&s, pids);
	CHECK(ran_on_cuda(job), "zerod's log does not say %s ran on the cuda backend", job);
	if (test_failed_)
		zd_dump_log(&daemon_);
}

static void t_sgd_w2_bucket_interleaved(void)
{
	run("cuda-sgd-w2", 2, ZC_OPT_SGD, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED, 11);
}

static void t_adam_w4_slice_at_end(void)
{
	run("cuda-adam-w4", 4, ZC_OPT_ADAM, ZC_SHARD_SLICE, ZC_STEP_AT_END, 12);
}

static void t_adamw_w3_bucket_at_end(void)
{
	run("cuda-adamw-w3", 3, ZC_OPT_ADAMW, ZC_SHARD_BUCKET, ZC_STEP_AT_END, 13);
}

static void t_sgd_w2_slice_interleaved(void)
{
	run("cuda-sgd-w2s", 2, ZC_OPT_SGD, ZC_SHARD_SLICE, ZC_STEP_INTERLEAVED, 14);
}

static void t_state_round_trip(void)
{
	struct train_spec s =
		spec("cuda-state", 3, ZC_OPT_ADAM, ZC_SHARD_SLICE, ZC_STEP_AT_END, 41);
	pid_t pids[NDEV];

	REQUIRE(zd_alive(&daemon_), "zerod is not running");
	s.hooks = &cuda_state_hooks;
	train_make_plan(&s, &round_tp_); /* inherited by the ranks */
	device_ = -1;
	start_ranks(&s, pids);
	check_ranks(&s, pids);
	CHECK(ran_on_cuda(s.job), "zerod's log does not say %s ran on the cuda backend", s.job);
	if (test_failed_)
		zd_dump_log(&daemon_);
}

/* ---------------------------------------------------------- re-planning --- */

static struct crp_script *crp_new(const char *job, uint32_t world, enum zc_optimizer opt,
				  enum zc_shard_mode shard, enum zc_step_mode step)
{
	struct crp_script *sc = test_shared(sizeof(*sc));

	sc->zd = &daemon_;
	snprintf(sc->job, sizeof(sc->job), "%s", job);
	sc->world = world;
	sc->opt = opt;
	sc->shard = sc->shard2 = shard;
	sc->step = step;
	sc->seed = 7;
	sc->replan_at = -1;
	return sc;
}

static void crp_run(struct crp_script *sc)
{
	pid_t pids[NDEV];

	REQUIRE(zd_alive(&daemon_), "zerod is not running");
	for (uint32_t r = 0; r < sc->world; r++)
		pids[r] = spawn(crp_rank, sc, (int)r);
	for (uint32_t r = 0; r < sc->world; r++) {
		int st = wait_child(pids[r], test_timeout(60000));
		CHECK(st == 0, "%s rank %u exited with %d", sc->job, r, st);
	}
	/* no look at zerod's log: it drops lines of clients that cause more
	 * than 20 a second, as these quick jobs do. The ranks ran on CUDA
	 * buffers (zc_bucket_ready_cuda and zc_step_wait_cuda refuse others),
	 * and a rank that re-planned had zc_register_plan() succeed. */
	if (test_failed_)
		zd_dump_log(&daemon_);
}

/* Train 5 iterations on CUDA buffers, re-plan to another layout and shard
 * mode (new device buffers, IPC handles and event rings), train 5 more:
 * equal to the reference bit for bit (parameters, moments, steps; the lr
 * set at iteration 3 stays in force), so the state moved by param_id (or
 * position) without loss. */
static void cuda_replan(const char *job, enum zc_optimizer opt, enum zc_shard_mode from_shard,
			enum zc_shard_mode to_shard, enum zc_step_mode step, int from, int to,
			bool ids, uint32_t world)
{
	struct crp_script *sc = crp_new(job, world, opt, from_shard, step);
	struct snap *want = test_shared(sizeof(*want));

	sf_hyper_iter = 3;
	snap_init(want, sc->seed);
	ref_train(want, opt, sc->seed, world, 0, 10);
	sc->shard2 = to_shard;
	sc->layout = from;
	sc->ids = ids;
	sc->iters = 10;
	sc->replan_at = 5;
	sc->replan_layout = to;
	sc->want = want;
	crp_run(sc);
}

static void t_replan_adam_bucket_to_slice(void)
{
	cuda_replan("cuda-replan-adam", ZC_OPT_ADAM, ZC_SHARD_BUCKET, ZC_SHARD_SLICE,
		    ZC_STEP_AT_END, 0, 1, true, 2);
}

static void t_replan_sgd_slice_to_bucket(void)
{
	cuda_replan("cuda-replan-sgd", ZC_OPT_SGD, ZC_SHARD_SLICE, ZC_SHARD_BUCKET,
		    ZC_STEP_INTERLEAVED, 3, 0, false, 3);
}

static void t_replan_adamw_slice_w4(void)
{
	cuda_replan("cuda-replan-adamw", ZC_OPT_ADAMW, ZC_SHARD_SLICE, ZC_SHARD_SLICE,
		    ZC_STEP_INTERLEAVED, 2, 1, true, 4);
}

/* fp32, bf16 and fp16 buckets on CUDA: the run that re-plans after 5
 * iterations (bucket mode to slice mode) ends bit for bit where a run on
 * the second layout from the first run's export at 5 (masters imported)
 * ends. The masters at 5 are finer than the parameters, so a re-plan that
 * re-derived them from the rounded parameters on the devices would not. */
static void t_replan_lowp_masters(void)
{
	struct crp_script *a =
		crp_new("cuda-lowp-5", 2, ZC_OPT_ADAM, ZC_SHARD_BUCKET, ZC_STEP_AT_END);
	struct crp_script *b =
		crp_new("cuda-lowp-2nd", 2, ZC_OPT_ADAM, ZC_SHARD_SLICE, ZC_STEP_AT_END);
	struct crp_script *c =
		crp_new("cuda-lowp-replans", 2, ZC_OPT_ADAM, ZC_SHARD_BUCKET, ZC_STEP_AT_END);
	struct snap *at5 = test_shared(sizeof(*at5)), *end = test_shared(sizeof(*end));
	uint64_t finer = 0;

	sf_lowp = true;
	a->layout = 4;
	a->ids = true;
	a->iters = 5;
	a->out = at5;
	crp_run(a);
	REQUIRE(at5->valid && !test_failed_, "the first 5 iterations failed");
	for (int k = 0; k < NP; k++) {
		bool lp = sf_lowp_dt[k] != ZC_DTYPE_F32;
		CHECK(!!(at5->present[k] & ZC_STATE_MASTER) == lp, "param %d: present 0x%x", k,
		      at5->present[k]);
		for (uint64_t i = 0; lp && i < params[k].numel; i++)
			finer += at5->master[param_base(k) + i] != at5->p[param_base(k) + i];
	}
	CHECK(finer > 0, "every master equals its rounded parameter: not a master");
	printf("# %llu masters finer than their parameters\n", (unsigned long long)finer);
	b->layout = 5;
	b->ids = true;
	b->load = true;
	b->in = at5;
	b->start = 5;
	b->iters = 5;
	b->out = end;
	crp_run(b);
	REQUIRE(end->valid && !test_failed_, "the run on the second layout failed");
	c->shard2 = ZC_SHARD_SLICE;
	c->layout = 4;
	c->ids = true;
	c->iters = 10;
	c->replan_at = 5;
	c->replan_layout = 5;
	c->want = end;
	crp_run(c);
}

/* A new plan that moves a parameter to another group: ZC_EREPLAN from
 * zc_register_buffers(), the client keeps its buffers and the job trains on
 * with the plan it had, to the reference. zc_alloc_buffers() on such a
 * client is ZC_ESTATE naming zc_register_buffers(). */
static void t_replan_changes_params(void)
{
	struct crp_script *sc =
		crp_new("cuda-replan-bad", 2, ZC_OPT_SGD, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED);
	struct snap *want = test_shared(sizeof(*want));

	sf_hyper_iter = 3;
	snap_init(want, sc->seed);
	ref_train(want, ZC_OPT_SGD, sc->seed, 2, 0, 8);
	sc->ids = true;
	sc->iters = 8;
	sc->replan_at = 4;
	sc->replan_layout = 1;
	sc->replan_regroup = true;
	sc->replan_code = ZC_EREPLAN;
	sc->want = want;
	crp_run(sc);
}

/* ------------------------------------------------------------ two nodes --- */

static struct train_result *shared_results(uint32_t n)
{
	void *p = mmap(NULL, n * sizeof(struct train_result), PROT_READ | PROT_WRITE,
		       MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	return p == MAP_FAILED ? NULL : p;
}

struct cuda_cluster {
	struct zd zd[2];
	const char *socks[2];
	char rdzv[32];
};

#define STALL_MS 6000

/* Two zerod-double --backend cuda whose cliques meet in /dev/shm, with
 * the flags in extra (NULL-terminated, at most 8) besides. */
static void cluster_start_with(struct cuda_cluster *cl, const char *const *extra)
{
	char stall[16];
	const char *args[16] = {"--backend", "cuda", "--stall-timeout", stall, "--workers", "2"};
	int port, a = 6;

	for (int i = 0; extra && extra[i] && a < 15; i++)
		args[a++] = extra[i];
	args[a] = NULL;
	memset(cl, 0, sizeof(*cl));
	snprintf(stall, sizeof(stall), "%d", test_timeout(STALL_MS));
	setenv("ZEROD_CUDADOUBLE_SHM", "1", 1); /* this case's process and its children */
	for (int k = 0; k < 2; k++) {
		REQUIRE(zd_start(&cl->zd[k], args) == 0, "zerod-double %d did not start", k);
		cl->socks[k] = cl->zd[k].sock;
	}
	port = zd_free_port();
	REQUIRE(port > 0, "no free port");
	snprintf(cl->rdzv, sizeof(cl->rdzv), "127.0.0.1:%d", port);
}

static void cluster_start(struct cuda_cluster *cl)
{
	cluster_start_with(cl, NULL);
}

/* Stop both (`killed`: SIGKILLed by the case, or -1). */
static void cluster_stop(struct cuda_cluster *cl, int killed)
{
	for (int k = 0; k < 2; k++) {
		if (test_failed_) {
			printf("# ---- daemon %d ----\n", k);
			zd_dump_log(&cl->zd[k]);
		}
		if (k != killed)
			CHECK(!zd_log_has(&cl->zd[k], "cudadouble:"),
			      "daemon %d: the double caught misuse", k);
		int st = zd_stop(&cl->zd[k], 10000);
		if (k == killed)
			CHECK(st == 128 + SIGKILL, "daemon %d: exit %d, not SIGKILL", k, st);
		else
			CHECK(st == 0, "daemon %d exited with %d after SIGTERM", k, st);
	}
}

/* The daemon's log says job ran on cuda as node `node` of 2. */
static bool ran_on_cuda_node(const struct zd *d, const char *job, int node)
{
	char want[96], where[32], line[1024];
	bool found = false;
	FILE *f = fopen(d->log, "r");

	if (!f)
		return false;
	snprintf(want, sizeof(want), "job %s: plan ", job);
	snprintf(where, sizeof(where), "node %d of 2", node);
	while (!found && fgets(line, sizeof(line), f))
		found = strstr(line, want) && strstr(line, "backend cuda,") && strstr(line, where);
	fclose(f);
	return found;
}

static int sem_cuda_buffers(zc_client *c, const struct zc_plan *plan, uint32_t rank)
{
	device_ = -1;
	return cuda_buffers(c, plan, rank);
}

static int sem_main(void *arg, int idx)
{
	return sem_rank(arg, (uint32_t)idx);
}

/* The two-node cases need zerod's gloo backend (-Dgloo): without it a job
 * over several nodes is refused (ZC_ENOTSUP), so they are skipped. */
#ifdef ZEROD_HAVE_GLOO
#define NEEDS_GLOO() ((void)0)
#else
#define NEEDS_GLOO() SKIP("zerod was built without gloo (-Dgloo, libgloo-dev): no job spans nodes")
#endif

static const uint32_t node_of2[2] = {0, 1};

/* semtrain's job on CUDA buffers over the two daemons, rank r on node r:
 * bit for bit against its reference. */
static void sem_two_nodes(struct sem_spec *s)
{
	struct cuda_cluster cl;
	pid_t pids[2];

	cluster_start(&cl);
	s->rdzv = cl.rdzv;
	s->nnodes = 2;
	s->sockets = cl.socks;
	s->node_of = node_of2;
	s->buffers = sem_cuda_buffers;
	s->tolerance = 0;
	for (int r = 0; r < 2; r++)
		pids[r] = spawn(sem_main, s, r);
	for (int r = 0; r < 2; r++) {
		int st = wait_child(pids[r], test_timeout(90000));
		CHECK(st == 0, "%s rank %d exited with %d", s->job, r, st);
	}
	for (int k = 0; k < 2; k++)
		CHECK(ran_on_cuda_node(&cl.zd[k], s->job, k),
		      "daemon %d's log does not say %s ran on cuda as node %d of 2", k, s->job, k);
	cluster_stop(&cl, -1);
}

/* Masks (segments unused on one node only, and on both), a global clip and
 * a grad scale, bucket mode, at_end: the masks, norms and scale meet
 * through the NCCL gather. */
static void t_two_nodes_masks_clip_scale(void)
{
	NEEDS_GLOO();
	struct sem_spec s;

	sem_spec_init(&s, "cuda-nodes-mcs", 2);
	s.opt = ZC_OPT_ADAM;
	s.masks = true;
	s.scale = true;
	s.max_grad_norm = 5.0;
	sem_two_nodes(&s);
}

/* Per-group clipping over both nodes' shards and +inf on node 1 at
 * iteration 2 (neither node steps it), slice mode, with masks. */
static void t_two_nodes_group_clip_found_inf(void)
{
	NEEDS_GLOO();
	struct sem_spec s;

	sem_spec_init(&s, "cuda-nodes-gci", 2);
	s.opt = ZC_OPT_ADAMW;
	s.shard = ZC_SHARD_SLICE;
	s.masks = true;
	s.scale = true;
	s.inf_rank = 1;
	s.inf_iter = 2;
	s.hp[0].max_grad_norm = 3.0;
	s.hp[1].max_grad_norm = 100.0;
	sem_two_nodes(&s);
}

/* A train_spec over cl: rank r on node node_of[r]. */
static void on_nodes(struct train_spec *s, struct cuda_cluster *cl, const uint32_t *node_of)
{
	s->socket = NULL;
	s->rdzv = cl->rdzv;
	s->nnodes = 2;
	s->secret = "cuda nodes";
	s->node_of = node_of;
	s->explicit_nodes = true;
	s->sockets = cl->socks;
	s->plan_variant_node = -1;
	s->die_rank = -1;
}

/* Three ranks over the two daemons (0 and 1 on node 0, 2 on node 1: the
 * references' node order is then the double's rank order): after
 * iteration 2 every rank exports the state (each node's owners' pieces
 * gathered across the nodes) and imports it again (each node its own
 * owners'), and the job trains on to the reference bit for bit. */
static void t_two_nodes_state_round_trip(void)
{
	NEEDS_GLOO();
	static const uint32_t node_of3[3] = {0, 0, 1};
	struct train_spec s =
		spec("cuda-nodes-state", 3, ZC_OPT_ADAM, ZC_SHARD_SLICE, ZC_STEP_AT_END, 43);
	struct cuda_cluster cl;
	pid_t pids[3];

	cluster_start(&cl);
	on_nodes(&s, &cl, node_of3);
	s.hooks = &cuda_state_hooks;
	train_make_plan(&s, &round_tp_); /* inherited by the ranks */
	device_ = -1;
	start_ranks(&s, pids);
	check_ranks(&s, pids);
	for (int k = 0; k < 2; k++)
		CHECK(ran_on_cuda_node(&cl.zd[k], s.job, k),
		      "daemon %d's log does not say %s ran on cuda as node %d of 2", k, s.job, k);
	cluster_stop(&cl, -1);
}

/* Three ranks over the two daemons (0 and 1 on node 0, 2 on node 1) on
 * CUDA buffers re-plan after 5 iterations to another layout and shard mode:
 * each node stops its executor, takes its ranks' new handles and rings,
 * and the new NCCL communicators meet under fresh store keys; the state
 * goes out across the nodes and back into the new layout, and the job ends
 * bit for bit on the reference summed in node order. */
static void t_two_nodes_replan(void)
{
	NEEDS_GLOO();
	struct crp_script *sc =
		crp_new("cuda-nodes-replan", 3, ZC_OPT_ADAM, ZC_SHARD_SLICE, ZC_STEP_AT_END);
	struct snap *want = test_shared(sizeof(*want));
	static const uint32_t node_of3[3] = {0, 0, 1};
	struct cuda_cluster cl;
	pid_t pids[3];

	cluster_start(&cl);
	sf_hyper_iter = 3;
	snap_init(want, sc->seed);
	ref_train_nodes(want, ZC_OPT_ADAM, sc->seed, 3, node_of3, 0, 10);
	sc->zd = &cl.zd[0];
	sc->nnodes = 2;
	memcpy(sc->node_of, node_of3, sizeof(node_of3));
	for (int k = 0; k < 2; k++)
		snprintf(sc->socks[k], sizeof(sc->socks[k]), "%s", cl.socks[k]);
	snprintf(sc->rdzv, sizeof(sc->rdzv), "%s", cl.rdzv);
	sc->shard2 = ZC_SHARD_BUCKET;
	sc->layout = 0;
	sc->ids = true;
	sc->iters = 10;
	sc->replan_at = 5;
	sc->replan_layout = 1;
	sc->want = want;
	for (uint32_t r = 0; r < 3; r++)
		pids[r] = spawn(crp_rank, sc, (int)r);
	for (uint32_t r = 0; r < 3; r++) {
		int st = wait_child(pids[r], test_timeout(90000));
		CHECK(st == 0, "%s rank %u exited with %d", sc->job, r, st);
	}
	for (int k = 0; k < 2; k++)
		CHECK(ran_on_cuda_node(&cl.zd[k], sc->job, k),
		      "daemon %d's log does not say %s ran on cuda as node %d of 2", k, sc->job, k);
	cluster_stop(&cl, -1);
}

/* A bf16 and an fp16 bucket over the two nodes (rank r alone on node r),
 * SGD in slice mode: each node owns half of each bucket and keeps its
 * masters on its device. The values are multiples of 1/16 (exact in both
 * dtypes and in every sum), so the reference is the movement itself: the
 * reduction across the daemons, each owner's master step and rounding, the
 * broadcast back. After iteration 2 each rank exports the state (masters
 * included, gathered across the nodes) and checks the masters, then
 * imports it again (each node its own owners' masters, narrowed into the
 * parameters and broadcast); the job trains on to the reference. */
#define LP_ITERS 5
static const uint64_t lp_numel[2] = {40, 24};
static const enum zc_dtype lp_dtype[2] = {ZC_DTYPE_BF16, ZC_DTYPE_F16};

struct lowp_two {
	struct cuda_cluster *cl;
	struct train_result *res;
};

static float lp_init(uint32_t b, uint64_t i)
{
	return (float)((int)(i % 7) - 3) / 4 + (float)b;
}

static float lp_grad(uint32_t r, int it, uint32_t b, uint64_t i)
{
	return (float)((int)((i + b) % 5) - 2 + (int)r + it) / 8;
}

/* The double's memfds open in this process (its allocations and events). */
static int double_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;

	while (d && (e = readdir(d))) {
		char path[300], to[128];
		ssize_t k;

		snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
		k = readlink(path, to, sizeof(to) - 1);
		if (k > 0) {
			to[k] = 0;
			n += strstr(to, "memfd:cudadouble") != NULL;
		}
	}
	if (d)
		closedir(d);
	return n;
}

static int lowp_two_rank(void *arg, int idx)
{
	const struct lowp_two *x = arg;
	uint32_t rank = (uint32_t)idx;
	struct zc_param_group grp = {GROUP_SIZE, .lr = 0.5};
	struct zc_segment segs[2][1] = {{SEG(0, 40, 0)}, {SEG(0, 24, 0)}};
	struct zc_bucket bk[2] = {BUCKET(40, 1, segs[0]), BUCKET(24, 1, segs[1])};
	struct zc_plan plan = PLAN(ZC_OPT_SGD, ZC_SHARD_SLICE, ZC_STEP_AT_END, 1, &grp, 2, bk);
	struct zc_config cfg = test_config(&x->cl->zd[rank], "cuda-nodes-lowp", rank, 2);
	float master[2][40];
	zc_client *c = NULL;
	int r, bad = 0;

	bk[0].dtype = lp_dtype[0];
	bk[1].dtype = lp_dtype[1];
	cfg.local_rank = 0;
	cfg.local_size = 1;
	cfg.rdzv = x->cl->rdzv;
	cfg.nnodes = 2;
	cfg.has_node_rank = true;
	cfg.node_rank = rank;
	cfg.job_secret = "cuda nodes";
	cfg.register_timeout_ms = test_timeout(20000);
	device_ = -1;
	r = zc_connect(&cfg, &c);
	if (r == 0)
		r = cuda_buffers(c, &plan, rank);
	for (uint32_t b = 0; b < 2 && r == 0; b++) {
		uint16_t *p = zc_param_ptr(c, b);
		for (uint64_t i = 0; i < lp_numel[b]; i++) {
			master[b][i] = lp_init(b, i);
			/* rank 1's differ: the job starts from rank 0's */
			p[i] = ref_lowp_round(rank ? -7.0f : master[b][i], lp_dtype[b]);
		}
	}
	if (r == 0)
		r = zc_register_plan(c);
	for (int it = 0; it < LP_ITERS && r == 0; it++) {
		zc_future *f = NULL;
		for (uint32_t b = 0; b < 2 && r == 0; b++) {
			uint16_t *g = zc_grad_ptr(c, b);
			for (uint64_t i = 0; i < lp_numel[b]; i++)
				g[i] = ref_lowp_round(lp_grad(rank, it, b, i), lp_dtype[b]);
			r = zc_bucket_ready_cuda(c, b, stream_, NULL);
		}
		if (r == 0)
			r = zc_step_future(c, (uint64_t)it, &f);
		if (r == 0)
			r = zc_future_wait(f, test_timeout(20000)) == 1 ? 0 : ZC_ETIMEDOUT;
		if (r == 0)
			r = cuda_stepped(c, f, it);
		zc_future_free(f);
		for (uint32_t b = 0; b < 2 && r == 0; b++) {
			const uint16_t *p = zc_param_ptr(c, b);
			for (uint64_t i = 0; i < lp_numel[b]; i++) {
				float avg = (lp_grad(0, it, b, i) + lp_grad(1, it, b, i)) / 2;
				master[b][i] -= 0.5f * avg;
				if (p[i] != ref_lowp_round(master[b][i], lp_dtype[b]) && !bad++)
					printf("# rank %u iteration %d bucket %u element %lu: %#x, "
					       "want %#x\n",
					       rank, it, b, (unsigned long)i, p[i],
					       ref_lowp_round(master[b][i], lp_dtype[b]));
			}
		}
		if (r == 0 && it == 2) {
			struct zc_segment_state st[2];
			float got[2][40];
			for (uint32_t b = 0; b < 2; b++) {
				st[b] = (struct zc_segment_state)ZC_SEGMENT_STATE_INIT;
				st[b].bucket = b;
				st[b].segment = 0;
				st[b].master = got[b];
			}
			r = zc_get_state(c, st, 2);
			for (uint32_t b = 0; b < 2 && r == 0; b++) {
				if (!(st[b].present & ZC_STATE_MASTER) && !bad++)
					printf("# rank %u bucket %u: no master exported\n", rank,
					       b);
				for (uint64_t i = 0; i < lp_numel[b]; i++)
					if (got[b][i] != master[b][i] && !bad++)
						printf("# rank %u bucket %u master %lu: %g, want "
						       "%g\n",
						       rank, b, (unsigned long)i, got[b][i],
						       master[b][i]);
			}
			for (uint32_t b = 0; b < 2; b++)
				st[b].present &= ZC_STATE_MASTER; /* SGD without momentum */
			if (r == 0)
				r = zc_set_state(c, st, 2);
		}
	}
	if (r < 0)
		printf("# rank %u: %s: %s\n", rank, zc_strerror_name(r), zc_error_message());
	/* zerod may still use the exported events while it tears the job down
	 * after the Goodbye: zc_close() keeps them (in the double each event
	 * is a memfd of this process, which a destroy would close) */
	int fds = double_fds();
	zc_close(c);
	if (r == 0 && double_fds() != fds && !bad++)
		printf("# rank %u: zc_close() destroyed exported events: %d of the double's memfds "
		       "open, %d before\n",
		       rank, double_fds(), fds);
	return r < 0 || bad ? 1 : 0;
}

static void t_two_nodes_lowp_masters(void)
{
	NEEDS_GLOO();
	struct cuda_cluster cl;
	struct lowp_two x = {.cl = &cl};
	pid_t pids[2];

	cluster_start(&cl);
	for (int r = 0; r < 2; r++)
		pids[r] = spawn(lowp_two_rank, &x, r);
	for (int r = 0; r < 2; r++) {
		int st = wait_child(pids[r], test_timeout(60000));
		CHECK(st == 0, "cuda-nodes-lowp rank %d exited with %d", r, st);
	}
	for (int k = 0; k < 2; k++)
		CHECK(ran_on_cuda_node(&cl.zd[k], "cuda-nodes-lowp", k),
		      "daemon %d's log does not say the job ran on cuda as node %d of 2", k, k);
	cluster_stop(&cl, -1);
}

/* The daemon of node 1 is SIGKILLed mid-run: the rank on node 0 fails with
 * a named error within the stall timeout (its collectives end: the dead
 * peer breaks the clique), and its daemon lives on. */
static void t_two_nodes_daemon_killed(void)
{
	NEEDS_GLOO();
	struct train_spec s =
		spec("cuda-nodes-kill", 2, ZC_OPT_SGD, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED, 44);
	struct cuda_cluster cl;
	pid_t pids[2];
	int64_t t0;
	int st;

	cluster_start(&cl);
	on_nodes(&s, &cl, node_of2);
	s.iters = 100000;
	s.sleep_us = 5000;
	s.stop = train_stop_new(); /* never asked: counts rank 0's iterations */
	s.results = shared_results(2);
	REQUIRE(s.results, "no shared memory for the results");
	device_ = -1;
	start_ranks(&s, pids);
	t0 = test_ms();
	while (atomic_load(&s.stop->done) < 3 && test_ms() - t0 < test_timeout(20000))
		usleep(2000);
	REQUIRE(atomic_load(&s.stop->done) >= 3, "the job never ran 3 iterations");
	kill(cl.zd[1].pid, SIGKILL);
	st = wait_child(pids[0], test_timeout(STALL_MS + 10000));
	CHECK(st == 1, "rank 0 exited with %d, not 1 (failed)", st);
	printf("# rank 0: %s: %s\n", zc_strerror_name(s.results[0].code), s.results[0].msg);
	CHECK(s.results[0].code == ZC_ERANKDEAD && strstr(s.results[0].msg, "node 1"),
	      "rank 0 ended with %s: %s (want ZC_ERANKDEAD naming node 1)",
	      zc_strerror_name(s.results[0].code), s.results[0].msg);
	wait_child(pids[1], test_timeout(20000));
	CHECK(zd_alive(&cl.zd[0]), "node 0's zerod died");
	cluster_stop(&cl, 1);
}

/* --------------------------------------------------- TLS and NCCL --- */

/* One TLS identity both daemons hold (a zerod trusts its own certificate):
 * an Ed25519 key and its self-signed certificate (CN "zerod cudajob test",
 * valid 2000..9999), as `zeroctl keygen` makes them, written here so that
 * this test needs neither zeroctl nor OpenSSL: DIR/node.key (0600),
 * DIR/node.crt and a DIR/peers without another fingerprint. A test key,
 * never a secret. */
static const char test_key_pem[] =
	"-----BEGIN PRIVATE KEY-----\n"
	"MC4CAQAwBQYDK2VwBCIEINeE+QqAmAdnWXp3+e+1UNekBE9niCywrkTvUFMtTXmt\n"
	"-----END PRIVATE KEY-----\n";
static const char test_cert_pem[] =
	"-----BEGIN CERTIFICATE-----\n"
	"MIHqMIGdoAMCAQICAQEwBQYDK2VwMB0xGzAZBgNVBAMMEnplcm9kIGN1ZGFqb2Ig\n"
	"dGVzdDAiGA8yMDAwMDEwMTAwMDAwMFoYDzk5OTkxMjMxMjM1OTU5WjAdMRswGQYD\n"
	"VQQDDBJ6ZXJvZCBjdWRham9iIHRlc3QwKjAFBgMrZXADIQAB9FzRZL34IOHzMI/r\n"
	"zjsZXp2qODKuhZqb2RlITNEH6TAFBgMrZXADQQDd1BI4cRLTpaGgGMbUIpdtyvkX\n"
	"SY0JNnTZI2HGpGO81W665pVFPPww4RK4wcaXZisqKsnvZsGWFfYeol7Ra98O\n"
	"-----END CERTIFICATE-----\n";

static bool write_text(const char *path, mode_t mode, const char *text)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
	bool ok = fd >= 0 && write(fd, text, strlen(text)) == (ssize_t)strlen(text);

	if (fd >= 0)
		close(fd);
	return ok;
}

#define TLS_ARGS(key, cert, peers) "--tls-key", key, "--tls-cert", cert, "--tls-peers", peers

static bool tls_files(char dir[64], char key[96], char cert[96], char peers[96])
{
	snprintf(dir, 64, "/tmp/zerod-cudatls-XXXXXX");
	if (!mkdtemp(dir))
		return false;
	snprintf(key, 96, "%s/node.key", dir);
	snprintf(cert, 96, "%s/node.crt", dir);
	snprintf(peers, 96, "%s/peers", dir);
	return write_text(key, 0600, test_key_pem) && write_text(cert, 0644, test_cert_pem) &&
	       write_text(peers, 0644, "# only this zerod's own certificate\n");
}

/* With TLS keys a CUDA job over the two daemons is refused before it
 * moves a byte: NCCL's transport between nodes is plain. Every rank gets
 * ZC_ENOTSUP saying so ("this zerod has TLS keys") and naming the option
 * that allows it; a one-node CUDA job on the same daemon trains to the
 * reference after it (NCCL stays inside the node). Daemons started with
 * --tls-allow-plain-nccl run the same two-node job to the reference. */
static void t_two_nodes_tls_refuses_nccl(void)
{
	NEEDS_GLOO();
	char dir[64], key[96], cert[96], peers[96], cmd[96];
	struct cuda_cluster cl;
	pid_t pids[2];

	REQUIRE(tls_files(dir, key, cert, peers), "no TLS key files");
	const char *const tls[] = {TLS_ARGS(key, cert, peers), NULL};
	const char *const allow[] = {TLS_ARGS(key, cert, peers), "--tls-allow-plain-nccl", NULL};

	cluster_start_with(&cl, tls);
	struct train_spec bad =
		spec("cuda-nodes-tls", 2, ZC_OPT_SGD, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED, 45);
	on_nodes(&bad, &cl, node_of2);
	bad.results = shared_results(2);
	REQUIRE(bad.results, "no shared memory for the results");
	device_ = -1;
	start_ranks(&bad, pids);
	for (int r = 0; r < 2; r++) {
		int st = wait_child(pids[r], test_timeout(60000));
		const struct train_result *res = &bad.results[r];
		CHECK(st == 1 && res->code == ZC_ENOTSUP && strstr(res->msg, "NCCL") &&
			      strstr(res->msg, "not encrypted") &&
			      strstr(res->msg, "this zerod has TLS keys") &&
			      strstr(res->msg, "--tls-allow-plain-nccl"),
		      "rank %d: exit %d, %s: %s (want ZC_ENOTSUP: NCCL is not encrypted)", r, st,
		      zc_strerror_name(res->code), res->msg);
		if (r == 0)
			printf("# rank 0: %s: %s\n", zc_strerror_name(res->code), res->msg);
	}
	struct train_spec local =
		spec("cuda-tls-local", 2, ZC_OPT_ADAM, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED, 46);
	local.socket = cl.zd[0].sock;
	start_ranks(&local, pids);
	check_ranks(&local, pids);
	CHECK(zd_alive(&cl.zd[0]) && zd_alive(&cl.zd[1]), "a daemon died");
	cluster_stop(&cl, -1);

	cluster_start_with(&cl, allow);
	struct train_spec ok =
		spec("cuda-nodes-tls-ok", 2, ZC_OPT_SGD, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED, 47);
	on_nodes(&ok, &cl, node_of2);
	start_ranks(&ok, pids);
	check_ranks(&ok, pids);
	for (int k = 0; k < 2; k++) {
		CHECK(ran_on_cuda_node(&cl.zd[k], ok.job, k),
		      "daemon %d's log does not say %s ran on cuda as node %d of 2", k, ok.job, k);
		CHECK(zd_log_has(&cl.zd[k], "tensors between nodes over NCCL (not encrypted)"),
		      "daemon %d's log does not say NCCL carries the tensors in the clear", k);
	}
	cluster_stop(&cl, -1);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	(void)!system(cmd);
}

/* -------------------------------------------------------------- refusals --- */

/* A rank that registers CUDA buffers with the train hooks and reports how
 * its job ended (results in shared memory). */
struct refusal {
	struct train_spec s;
	struct train_result *res;
};

static int bad_handle_rank(void *arg, int idx)
{
	struct train_spec *s = arg;

	free_after_register_ = idx == 1; /* rank 1's allocation is gone when zerod opens it */
	device_ = -1;
	return train_rank(s, (uint32_t)idx);
}

static int unknown_uuid_rank(void *arg, int idx)
{
	struct cudadouble_config cfg = {.ndevices = 8, .driver_version = 13000};
	struct train_spec *s = arg;

	/* this trainer sees 8 devices; zerod sees 4: device 6's UUID is
	 * unknown to it */
	cudadouble_reset(&cfg);
	device_ = idx == 0 ? 6 : idx;
	return train_rank(s, (uint32_t)idx);
}

/* A job that must fail with ZC_EMAP naming `needle` while a good job
 * trains beside it. */
static void refused_beside(const char *job, int (*fn)(void *, int), const char *needle)
{
	char good_job[64];
	struct train_spec good, bad;
	pid_t gp[2], bp[2];

	REQUIRE(zd_alive(&daemon_), "zerod is not running");
	snprintf(good_job, sizeof(good_job), "%s-beside", job);
	good = spec(good_job, 2, ZC_OPT_ADAM, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED, 21);
	good.iters = 8;
	bad = spec(job, 2, ZC_OPT_SGD, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED, 22);
	bad.results = shared_results(2);
	REQUIRE(bad.results, "no shared memory for the results");
	device_ = -1;
	start_ranks(&good, gp);
	for (int r = 0; r < 2; r++)
		bp[r] = spawn(fn, &bad, r);
	for (int r = 0; r < 2; r++) {
		int st = wait_child(bp[r], test_timeout(60000));
		CHECK(st == 1, "%s rank %d exited with %d, not 1 (refused)", job, r, st);
		CHECK(bad.results[r].code == ZC_EMAP, "%s rank %d ended with %s: %s, not ZC_EMAP",
		      job, r, zc_strerror_name(bad.results[r].code), bad.results[r].msg);
		CHECK(strstr(bad.results[r].msg, needle) != NULL,
		      "%s rank %d's reason \"%s\" does not say \"%s\"", job, r, bad.results[r].msg,
		      needle);
	}
	check_ranks(&good, gp);
	CHECK(zd_alive(&daemon_), "zerod died");
	if (test_failed_)
		zd_dump_log(&daemon_);
}

static void t_bad_handle_refused(void)
{
	refused_beside("cuda-badhandle", bad_handle_rank, "rank 1's gradients");
}

static void t_unknown_uuid_refused(void)
{
	refused_beside("cuda-uuid", unknown_uuid_rank, "no such device visible to zerod");
}

/* Rank 1 is SIGKILLed mid-iteration while the ready events of the buckets
 * it handed over are still held back on its stream (its gradients land
 * only 30 s later): they never complete, and a wait on them never ends
 * (CUDA's does not end because the exporter died). zerod must fail the
 * job within the stall timeout, abandon what waits on those events, and
 * stop cleanly; a job after it trains. */
static int killed_rank(void *arg, int idx)
{
	if (idx == 1)
		late_iter_ = 2; /* the iteration it is killed in */
	device_ = -1;
	return train_rank(arg, (uint32_t)idx);
}

static void t_trainer_killed_mid_iteration(void)
{
	/* the job fails rather than re-forming (the recover_* cases re-form) */
	const char *const extra[] = {
		"--backend", "cuda", "--stall-timeout", "4000", "--rejoin-timeout", "0", NULL};
	struct train_spec s =
		spec("cuda-killed", 2, ZC_OPT_SGD, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED, 46);
	struct train_spec after =
		spec("cuda-after-kill", 2, ZC_OPT_SGD, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED, 47);
	struct zd kd;
	pid_t pids[2];
	int64_t t0;
	int st;

	REQUIRE(zd_start(&kd, extra) == 0, "cannot start a zerod --stall-timeout 4000");
	s.socket = after.socket = kd.sock;
	s.kill_rank1 = 2; /* rank 1 */
	s.kill_iter = 2;
	s.results = shared_results(2);
	REQUIRE(s.results, "no shared memory for the results");
	for (int r = 0; r < 2; r++)
		pids[r] = spawn(killed_rank, &s, r);
	st = wait_child(pids[1], test_timeout(30000));
	CHECK(st == 128 + SIGKILL, "rank 1 exited with %d, not SIGKILL", st);
	t0 = test_ms();
	st = wait_child(pids[0], test_timeout(4000 + 10000));
	CHECK(st == 1, "rank 0 exited with %d, not 1 (its job failed)", st);
	printf("# rank 0: %s: %s (%lld ms after the kill)\n", zc_strerror_name(s.results[0].code),
	       s.results[0].msg, (long long)(test_ms() - t0));
	CHECK(zd_wait_job(&kd, s.job, ZD_JOB_GONE, test_timeout(4000 + 10000)) == 0,
	      "the job was not torn down within the stall timeout (+10 s)");
	device_ = -1;
	start_ranks(&after, pids);
	check_ranks(&after, pids);
	CHECK(zd_alive(&kd), "zerod died");
	st = zd_stop(&kd, test_timeout(10000));
	CHECK(st == 0, "zerod did not stop cleanly after the killed trainer's job (%d)", st);
	CHECK(!zd_log_has(&kd, "cudadouble: violation"), "the double counted a violation in zerod");
	if (test_failed_)
		zd_dump_log(&kd);
}

/* ------------------------------------------------ recovery (issue 23) --- */

#define REC_ITERS 7
#define REC_KILL  3

static struct zd rec_zd_; /* --rejoin-timeout --recovery-journal: jobs re-form */

static struct crc_script *crc_new(const char *job, uint32_t world, enum zc_optimizer opt,
				  enum zc_shard_mode shard, enum zc_step_mode step, int layout)
{
	struct crc_script *sc = test_shared(sizeof(*sc));

	sc->zd = &rec_zd_;
	snprintf(sc->job, sizeof(sc->job), "%s", job);
	sc->world = world;
	sc->opt = opt;
	sc->shard = shard;
	sc->step = step;
	sc->layout = layout;
	sc->seed = 61;
	sc->iters = REC_ITERS;
	sc->kill_iter = REC_KILL;
	return sc;
}

static void crc_round(struct crc_script *sc, int *st)
{
	pid_t pids[CRC_MAXR];

	for (uint32_t r = 0; r < sc->world; r++)
		pids[r] = spawn(crc_rank, sc, (int)r);
	for (uint32_t r = 0; r < sc->world; r++)
		st[r] = wait_child(pids[r], test_timeout(60000));
}

/* A zerod --backend cuda whose jobs re-form, with or without the journal. */
static int rec_zd_start(struct zd *d, bool journal)
{
	char rejoin[16];
	const char *const extra[] = {"--backend",
				     "cuda",
				     "--stall-timeout",
				     "4000",
				     "--rejoin-timeout",
				     rejoin,
				     journal ? "--recovery-journal" : NULL,
				     NULL};

	snprintf(rejoin, sizeof(rejoin), "%d", test_timeout(20000));
	return zd_start(d, extra);
}

static bool rec_zd_up(void)
{
	return zd_alive(&rec_zd_) || rec_zd_start(&rec_zd_, true) == 0;
}

/* One death of sc's victim at its phase and the group's restart (of world
 * size `again`, 0: the same). `fatal`: the job cannot go back to a boundary
 * and fails naming why (needle). The restarted ranks end bit for bit at
 * sc->want, which the caller sets. */
static void crc_kill(struct crc_script *sc, enum crc_phase ph, uint32_t victim, const char *fatal,
		     uint32_t again)
{
	int st[CRC_MAXR], maxseen = 0;
	uint32_t world = sc->world;

	sc->armed = true;
	sc->restarted = false;
	sc->phase = ph;
	sc->victim = victim;
	crc_round(sc, st);
	for (uint32_t r = 0; r < world; r++) {
		if (r == victim) {
			CHECK(st[r] == 128 + SIGKILL, "%s: the victim rank %u ended %d", sc->job, r,
			      st[r]);
			continue;
		}
		if (fatal) {
			CHECK(st[r] == CRC_EXIT_FATAL && sc->fatal_code[r] == ZC_ERANKDEAD &&
				      strstr(sc->fatal_msg[r], fatal),
			      "%s: rank %u ended %d (%s: %s); want ZC_ERANKDEAD saying \"%s\"",
			      sc->job, r, st[r], zc_strerror_name(sc->fatal_code[r]),
			      sc->fatal_msg[r], fatal);
			continue;
		}
		CHECK(st[r] == CRC_EXIT_LOST, "%s: survivor rank %u ended %d, want ZC_ERANKLOST",
		      sc->job, r, st[r]);
		if (atomic_load(&sc->seen[r]) > maxseen)
			maxseen = atomic_load(&sc->seen[r]);
	}
	if (fatal) {
		CHECK(zd_wait_job(sc->zd, sc->job, ZD_JOB_GONE, 15000) == 0, "%s: not gone",
		      sc->job);
		return;
	}
	CHECK(zd_wait_job(sc->zd, sc->job, ZD_JOB_REFORMING, 10000) == 0, "%s: not re-forming",
	      sc->job);
	sc->armed = false;
	sc->restarted = true;
	if (again)
		sc->world = again;
	crc_round(sc, st);
	for (uint32_t r = 0; r < sc->world; r++) {
		long long at = atomic_load(&sc->recovered[r]);

		CHECK(st[r] == 0, "%s: restarted rank %u ended %d", sc->job, r, st[r]);
		CHECK(at == atomic_load(&sc->recovered[0]) && at >= maxseen && at == REC_KILL,
		      "%s: rank %u recovered at %lld; some rank saw %d steps", sc->job, r, at,
		      maxseen);
	}
	test_note("%s: victim %u, phase %d: recovered at %lld", sc->job, victim, (int)ph,
		  (long long)atomic_load(&sc->recovered[0]));
}

/* Every phase of a death, the victim another rank each time: each
 * recovers at the iteration it cut and ends at want bit for bit. */
static void crc_every_phase(const char *name, uint32_t world, enum zc_optimizer opt,
			    enum zc_shard_mode shard, enum zc_step_mode step, int layout,
			    const struct snap *want)
{
	char job[64];

	for (int ph = 0; ph < CRC_NPHASES; ph++) {
		struct crc_script *sc;

		snprintf(job, sizeof(job), "%s-%d", name, ph);
		sc = crc_new(job, world, opt, shard, step, layout);
		sc->want = want;
		crc_kill(sc, (enum crc_phase)ph, (uint32_t)ph % world, NULL, 0);
	}
}

/* fp32, Adam, slice, at_end over 2 ranks on 2 devices, a death before the
 * first bucket, between buckets, during the step (every bucket handed
 * over, the victim's last event never completes: the step is taken back
 * by the journal on the devices) and between iterations: each recovers at
 * the iteration it cut, bit for bit. */
static void t_recover_adam_at_end(void)
{
	struct snap *want = test_shared(sizeof(*want));

	REQUIRE(rec_zd_up(), "cannot start zerod --rejoin-timeout");
	snap_init(want, 61);
	ref_train(want, ZC_OPT_ADAM, 61, 2, 0, REC_ITERS);
	crc_every_phase("cuda-rec-ae", 2, ZC_OPT_ADAM, ZC_SHARD_SLICE, ZC_STEP_AT_END, 0, want);
	CHECK(!zd_log_has(&rec_zd_, "cudadouble: violation"), "the double caught misuse in zerod");
}

/* fp32, SGD, bucket, interleaved over 3 ranks: between buckets some were
 * stepped in place; the journal on the devices takes them back. */
static void t_recover_sgd_interleaved(void)
{
	struct snap *want = test_shared(sizeof(*want));

	REQUIRE(rec_zd_up(), "cannot start zerod --rejoin-timeout");
	snap_init(want, 61);
	ref_train(want, ZC_OPT_SGD, 61, 3, 0, REC_ITERS);
	crc_every_phase("cuda-rec-si", 3, ZC_OPT_SGD, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED, 0,
			want);
}

/* Without --recovery-journal a death that leaves stepped buckets (between
 * the buckets of an interleaved iteration) or a step needing the dead
 * trainer's memory (every bucket in) fails the job naming why; before the
 * first bucket it recovers. */
static void t_recover_without_journal(void)
{
	struct zd nj;
	struct snap *want = test_shared(sizeof(*want));
	struct crc_script *sc;

	REQUIRE(rec_zd_start(&nj, false) == 0, "cannot start zerod --rejoin-timeout");
	sc = crc_new("cuda-nj-si-1", 2, ZC_OPT_SGD, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED, 0);
	sc->zd = &nj;
	crc_kill(sc, CRC_BETWEEN, 1, "without --recovery-journal", 0);
	sc = crc_new("cuda-nj-ae-2", 2, ZC_OPT_ADAM, ZC_SHARD_SLICE, ZC_STEP_AT_END, 0);
	sc->zd = &nj;
	crc_kill(sc, CRC_DURING_STEP, 1, "died with it (CUDA buffers)", 0);
	snap_init(want, 61);
	ref_train(want, ZC_OPT_ADAM, 61, 2, 0, REC_ITERS);
	sc = crc_new("cuda-nj-ae-0", 2, ZC_OPT_ADAM, ZC_SHARD_SLICE, ZC_STEP_AT_END, 0);
	sc->zd = &nj;
	sc->want = want;
	crc_kill(sc, CRC_BEFORE_FIRST, 0, NULL, 0);
	CHECK(zd_stop(&nj, test_timeout(10000)) == 0, "zerod did not stop cleanly");
}

/* fp32, bf16 and fp16 buckets, interleaved: the masters come through the
 * recovery, and the journal's, not the rounded parameters (a run that
 * re-derived them would end elsewhere): the restarted job ends bit for bit
 * where an uninterrupted run ends. */
static void t_recover_lowp_masters(void)
{
	struct crc_script *sc;
	struct snap *want = test_shared(sizeof(*want));
	int st[CRC_MAXR];

	REQUIRE(rec_zd_up(), "cannot start zerod --rejoin-timeout");
	sf_lowp = true;
	sc = crc_new("cuda-rec-lp-ref", 2, ZC_OPT_ADAM, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED, 4);
	sc->out = want;
	crc_round(sc, st);
	REQUIRE(want->valid && st[0] == 0 && st[1] == 0, "the uninterrupted bf16/fp16 run failed");
	for (int ph = CRC_BETWEEN; ph <= CRC_DURING_STEP; ph++) {
		char job[64];

		snprintf(job, sizeof(job), "cuda-rec-lp-%d", ph);
		sc = crc_new(job, 2, ZC_OPT_ADAM, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED, 4);
		sc->want = want;
		crc_kill(sc, (enum crc_phase)ph, (uint32_t)ph % 2, NULL, 0);
	}
	sf_lowp = false;
}

/* The restarted group of a CUDA job has 3 ranks for 2 (on 3 devices): the
 * kept state is sharded again for them, and the job ends bit for bit at the
 * 2 ranks' run to the recovered iteration, the 3 ranks' after it. */
static void t_recover_more_ranks(void)
{
	struct crc_script *sc;
	struct snap *want = test_shared(sizeof(*want));

	REQUIRE(rec_zd_up(), "cannot start zerod --rejoin-timeout");
	snap_init(want, 61);
	ref_train(want, ZC_OPT_ADAM, 61, 2, 0, REC_KILL);
	ref_train(want, ZC_OPT_ADAM, 61, 3, REC_KILL, REC_ITERS);
	sc = crc_new("cuda-rec-w3", 2, ZC_OPT_ADAM, ZC_SHARD_BUCKET, ZC_STEP_AT_END, 0);
	sc->want = want;
	crc_kill(sc, CRC_BETWEEN, 1, NULL, 3);
}

/* zerod-double prints what the double caught on its stderr (its log):
 * every case on the shared daemon must leave none. */
static void t_no_violations_in_zerod(void)
{
	REQUIRE(zd_alive(&daemon_), "zerod is not running");
	CHECK(!zd_log_has(&daemon_, "cudadouble:"), "the double caught misuse in zerod");
	if (test_failed_)
		zd_dump_log(&daemon_);
}

/* --max-device-memory: a job whose state would pass it on one GPU is
 * refused with ZC_ELIMIT naming that GPU, and a smaller job beside it
 * trains. With 2 ranks in bucket mode the GPU holding the most state needs
 * ~141 KiB for SGD (a momentum buffer), ~423 KiB for Adam with an amsgrad
 * group (three arrays): a limit of 300K takes the one job and not the
 * other, whichever comes first (a refused job holds nothing). */
static void t_device_memory_limit(void)
{
	const char *const extra[] = {"--backend", "cuda", "--max-device-memory", "300K", NULL};
	struct train_spec good, bad;
	pid_t gp[2], bp[2];
	struct zd hd;

	REQUIRE(zd_start(&hd, extra) == 0, "cannot start a zerod --max-device-memory 300K");
	good = spec("cuda-devmem-sgd", 2, ZC_OPT_SGD, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED, 31);
	bad = spec("cuda-devmem-adam", 2, ZC_OPT_ADAM, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED, 32);
	good.socket = bad.socket = hd.sock;
	bad.results = shared_results(2);
	REQUIRE(bad.results, "no shared memory for the results");
	device_ = -1;
	start_ranks(&good, gp);
	start_ranks(&bad, bp);
	for (int r = 0; r < 2; r++) {
		int st = wait_child(bp[r], test_timeout(60000));
		CHECK(st == 1, "rank %d of the large job exited with %d, not 1 (refused)", r, st);
		CHECK(bad.results[r].code == ZC_ELIMIT, "rank %d ended with %s: %s, not ZC_ELIMIT",
		      r, zc_strerror_name(bad.results[r].code), bad.results[r].msg);
		CHECK(strstr(bad.results[r].msg, "--max-device-memory") &&
			      strstr(bad.results[r].msg, "on GPU-"),
		      "rank %d's reason \"%s\" does not name the limit and the GPU", r,
		      bad.results[r].msg);
	}
	check_ranks(&good, gp);
	CHECK(zd_alive(&hd), "zerod died");
	if (test_failed_)
		zd_dump_log(&hd);
	CHECK(zd_stop(&hd, 10000) == 0, "the zerod did not stop cleanly");
}

static int host_only_rank(void *arg, int idx)
{
	const struct zd *hd = arg;
	struct zc_config cfg = test_config(hd, "cuda-on-host", 0, 1);
	struct train_spec s =
		spec("cuda-on-host", 1, ZC_OPT_SGD, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED, 1);
	struct train_plan tp;
	zc_client *c = NULL;
	int r;

	(void)idx;
	device_ = 0;
	train_make_plan(&s, &tp);
	r = zc_connect(&cfg, &c);
	EXPECT(r == 0, "connect: %s", zc_error_message());
	if (r < 0)
		return 1;
	r = cuda_buffers(c, &tp.plan, 0);
	EXPECT(r == 0, "zc_register_buffers: %s: %s", zc_strerror_name(r), zc_error_message());
	r = zc_register_plan(c);
	EXPECT(r == ZC_ENOTSUP, "zc_register_plan on a host-only zerod: %s (%s), not ZC_ENOTSUP",
	       zc_strerror_name(r), zc_error_message());
	EXPECT(strstr(zc_error_message(), "host buffers only") &&
		       strstr(zc_error_message(), "--backend host"),
	       "the reason \"%s\" does not say why", zc_error_message());
	zc_close(c);
	return child_bad;
}

static void t_cuda_kind_on_host_only_daemon(void)
{
	const char *const extra[] = {"--backend", "host", NULL};
	struct zd hd;
	int st;

	REQUIRE(zd_start(&hd, extra) == 0, "cannot start a second zerod --backend host");
	st = wait_child(spawn(host_only_rank, &hd, 0), test_timeout(30000));
	CHECK(st == 0, "the trainer exited with %d", st);
	if (test_failed_)
		zd_dump_log(&hd);
	CHECK(zd_stop(&hd, 10000) == 0, "the host-only zerod did not stop cleanly");
}

static int no_runtime_rank(void *arg, int idx)
{
	const struct zd *d = arg;
	struct zc_config cfg = test_config(d, "cuda-no-runtime", 0, 1);
	struct train_spec s =
		spec("cuda-no-runtime", 1, ZC_OPT_SGD, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED, 1);
	struct zc_buffers b = ZC_BUFFERS_INIT;
	struct train_plan tp;
	zc_client *c = NULL;
	float fake[64];
	int r;

	(void)idx;
	setenv("ZEROD_CUDART", "/nonexistent/libcudart.so.13", 1);
	train_make_plan(&s, &tp);
	r = zc_connect(&cfg, &c);
	EXPECT(r == 0, "connect: %s", zc_error_message());
	if (r < 0)
		return 1;
	b.kind = ZC_BUFFERS_CUDA;
	b.grad_dev = fake;
	b.param_dev = fake + 32;
	r = zc_register_buffers(c, &tp.plan, &b);
	EXPECT(r == ZC_ENOTSUP, "zc_register_buffers without a runtime: %s (%s)",
	       zc_strerror_name(r), zc_error_message());
	EXPECT(strstr(zc_error_message(), "no CUDA runtime") != NULL,
	       "the reason \"%s\" does not say so", zc_error_message());
	/* the client is still usable: host buffers instead */
	r = zc_alloc_buffers(c, &tp.plan);
	EXPECT(r == 0, "zc_alloc_buffers after the refusal: %s", zc_error_message());
	zc_close(c);
	return child_bad;
}

static void t_no_cuda_runtime(void)
{
	int st = wait_child(spawn(no_runtime_rank, &daemon_, 0), test_timeout(30000));
	CHECK(st == 0, "the trainer exited with %d", st);
}

static void t_daemon_stops_cleanly(void)
{
	int st = zd_stop(&daemon_, 10000);
	CHECK(st == 0, "zerod exited with %d after SIGTERM", st);
	if (zd_alive(&rec_zd_)) {
		st = zd_stop(&rec_zd_, 10000);
		CHECK(st == 0, "the recovery cases' zerod exited with %d after SIGTERM", st);
	}
}

static const struct test_case cases[] = {
	{"sgd_w2_bucket_interleaved", t_sgd_w2_bucket_interleaved, 90000},
	{"adam_w4_slice_at_end", t_adam_w4_slice_at_end, 90000},
	{"adamw_w3_bucket_at_end", t_adamw_w3_bucket_at_end, 90000},
	{"sgd_w2_slice_interleaved", t_sgd_w2_slice_interleaved, 90000},
	{"state_round_trip", t_state_round_trip, 90000},
	{"replan_adam_bucket_to_slice", t_replan_adam_bucket_to_slice, 90000},
	{"replan_sgd_slice_to_bucket", t_replan_sgd_slice_to_bucket, 90000},
	{"replan_adamw_slice_w4", t_replan_adamw_slice_w4, 90000},
	{"replan_lowp_masters", t_replan_lowp_masters, 120000},
	{"replan_changes_params", t_replan_changes_params, 90000},
	{"cuda_kind_on_host_only_daemon", t_cuda_kind_on_host_only_daemon, 40000},
	{"no_cuda_runtime", t_no_cuda_runtime, 40000},
	{"bad_handle_refused", t_bad_handle_refused, 90000},
	{"unknown_uuid_refused", t_unknown_uuid_refused, 90000},
	{"device_memory_limit", t_device_memory_limit, 90000},
	{"trainer_killed_mid_iteration", t_trainer_killed_mid_iteration, 90000},
	{"recover_adam_at_end_every_phase", t_recover_adam_at_end, 120000},
	{"recover_sgd_interleaved_w3_every_phase", t_recover_sgd_interleaved, 120000},
	{"recover_without_journal_fails_named", t_recover_without_journal, 120000},
	{"recover_lowp_masters", t_recover_lowp_masters, 120000},
	{"recover_with_more_ranks_w2_to_w3", t_recover_more_ranks, 120000},
	{"two_nodes_masks_clip_scale", t_two_nodes_masks_clip_scale, 120000},
	{"two_nodes_group_clip_found_inf", t_two_nodes_group_clip_found_inf, 120000},
	{"two_nodes_state_round_trip", t_two_nodes_state_round_trip, 120000},
	{"two_nodes_lowp_masters", t_two_nodes_lowp_masters, 120000},
	{"two_nodes_replan", t_two_nodes_replan, 120000},
	{"two_nodes_daemon_killed", t_two_nodes_daemon_killed, 120000},
	{"two_nodes_tls_refuses_nccl", t_two_nodes_tls_refuses_nccl, 120000},
	{"no_double_violations_in_zerod", t_no_violations_in_zerod},
	{"daemon_stops_cleanly", t_daemon_stops_cleanly},
};

int main(int argc, char **argv)
{
	const char *const extra[] = {"--backend", "cuda", NULL};

	return zd_test_main(&daemon_, extra, cases, sizeof(cases) / sizeof(cases[0]), argc, argv);
}
