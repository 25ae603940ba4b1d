/*
 * test_cuda.c — the CUDA backend's control path (coll/nccl.c, optim/cuda.c,
 * mem/cuda.c, backend_cuda.c) on the test double of the CUDA runtime and
 * NCCL (tests/gpu/cudadouble.c), so it runs in CI without a GPU:
 *  - the start-up probe and --backend choice without a driver, with an old
 *    driver or NCCL, without a device, and with devices;
 *  - the optimizer: every optimizer and flag combination through
 *    optim_cuda_ops.run (kern.h's element body, as the double runs it) bit
 *    for bit against the CPU kernels, over several steps on two devices;
 *    no device memory allocated or freed between state_alloc and close;
 *  - whole jobs of 2-4 ranks through the real executor (exec.c) with
 *    coll_nccl_ops + optim_cuda_ops, both shard and step modes, against the
 *    same job on the host backend, bit for bit, with streams jittered and
 *    every non-blocking NCCL call answering ncclInProgress first;
 *  - two nodes sharing one NCCL unique id: every collective kind, done()
 *    from a stream's thread, never the submitter's; the gather in node
 *    order (staging sized at open: no allocation during gathers, a larger
 *    one in pieces; -EBUSY while one is in flight, abort);
 *  - a trainer whose ready event never completes: the REDUCE fails with
 *    -ETIMEDOUT naming the event (or -ECANCELED on abort) and close returns
 *    at once instead of waiting on the event;
 *  - two processes on one id (the double's cliques in shared memory): an
 *    all-reduce and a gather moving bytes between them, and a peer process
 *    that leaves after the open failing the other's all-reduce with
 *    -ECONNRESET, no hang;
 *  - faults: an async NCCL error, and abort, each ending a collective that
 *    waits for a peer that never comes, with the right code, from the
 *    watchdog, and leaving no communicator or stream behind;
 *  - CUDA IPC buffers of another process (CUDA refuses a process its own):
 *    a small allocation (inside a larger block) and a large one, opened by
 *    device UUID at an offset, and refused when the device, the size or the
 *    kind is wrong.
 * The double also counts misuse (a CUDA call from a host function, memory of
 * another device, a host function queued ahead of its collective, ranks that
 * disagree, two threads issuing NCCL on one device) and device memory
 * allocated or freed while streams have work queued: every case ends with
 * none.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "exec/backend.h"
#include "common.h"
#include "cudadouble.h"
#include "exec/exec.h"
#include "filestore.h"
#include "lowp.h"
#include "mem/cudabufs.h"
#include "mem/mem.h"
#include "base/pool.h"
#include "testlib.h"
#include "zctest.h"

static struct pool *pool_;

/* Each case runs in a process of its own: the pool is made where it is used. */
static struct pool *pool(void)
{
	if (!pool_ && pool_new(2, &pool_) < 0)
		abort();
	return pool_;
}

static uint64_t rng_state;

static uint64_t rng_next(void)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static float rng_float(float lo, float hi)
{
	return lo + (hi - lo) * (float)((double)(rng_next() >> 11) * 0x1p-53);
}

static void reset(int ndevices, unsigned polls, unsigned jitter_us)
{
	struct cudadouble_config c = {
		.ndevices = ndevices,
		.driver_version = ndevices ? 13000 : 0,
		.inprogress_polls = polls,
		.jitter_us = jitter_us,
		.seed = 7,
	};
	cudadouble_reset(&c);
}

/* Nothing misused, nothing left behind. */
static void check_clean(const char *tag)
{
	struct cudadouble_stats s;

	cudadouble_stats(&s);
	CHECK(s.violations == 0, "%s: %u violations, first: %s", tag, s.violations,
	      s.first_violation);
	CHECK(s.live_streams == 0 && s.live_comms == 0 && s.ipc_open == 0 && s.waiting == 0,
	      "%s: left %u streams, %u communicators, %u IPC handles, %u waiting", tag,
	      s.live_streams, s.live_comms, s.ipc_open, s.waiting);
	/* cudaFree waits for the whole device (NCCL kernels waiting on peers,
	 * streams waiting on trainers): none while work is queued (issue 21) */
	CHECK(s.mallocs_busy == 0 && s.frees_busy == 0,
	      "%s: %u allocations and %u frees while streams had work queued, first: %s", tag,
	      s.mallocs_busy, s.frees_busy, s.first_busy);
}

static float *dev_alloc(int dev, size_t n)
{
	void *p = NULL;

	if (cudaSetDevice(dev) != cudaSuccess || cudaMalloc(&p, n * sizeof(float)) != cudaSuccess)
		return NULL;
	return p;
}

/* ---------------------------------------------------------- the probe --- */

static void t_probe(void)
{
	static const struct {
		int ndevices, driver, nccl;
		cudaError_t count_error;
		int want;
		const char *says;
	} cases[] = {
		{0, 0, 0, 0, -ENODEV, "no CUDA driver on this machine"},
		{0, 12020, 0, 0, -ENODEV,
		 "driver (12.2) is older than zerod's CUDA runtime (13.0)"},
		{0, 13000, 0, cudaErrorNoDevice, -ENODEV, "no CUDA device visible"},
		{2, 13000, NCCL_VERSION(2, 17, 1), 0, -EOPNOTSUPP,
		 "NCCL 2.17.1 is older than 2.18"},
		{2, 13000, 0, 0, 2, "2 CUDA devices"},
	};
	const struct backend *be, *untouched = (const struct backend *)&cases;
	char why[256];
	int r;

	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		struct cudadouble_config c = {.ndevices = cases[i].ndevices,
					      .driver_version = cases[i].driver,
					      .nccl_version = cases[i].nccl,
					      .count_error = cases[i].count_error};
		bool gpu = cases[i].want > 0;

		cudadouble_reset(&c);
		r = cuda_probe(why, sizeof(why));
		CHECK(r == cases[i].want && strstr(why, cases[i].says),
		      "case %zu: probe %d \"%s\", want %d \"%s\"", i, r, why, cases[i].want,
		      cases[i].says);
		be = untouched;
		r = backend_choose("cuda", &be, why, sizeof(why));
		CHECK(gpu ? r == 0 && be == &backend_cuda
			  : r == cases[i].want && be == untouched &&
				      strstr(why, "--backend cuda: "),
		      "case %zu: --backend cuda: %d \"%s\"", i, r, why);
		be = untouched;
		r = backend_choose("auto", &be, why, sizeof(why));
		CHECK(r == 0 && be == (gpu ? &backend_cuda : NULL) &&
			      strstr(why, gpu ? "cuda and host" : "host only"),
		      "case %zu: --backend auto: %d \"%s\"", i, r, why);
		be = untouched;
		r = backend_choose("host", &be, why, sizeof(why));
		CHECK(r == 0 && be == NULL, "case %zu: --backend host: %d \"%s\"", i, r, why);
	}
	be = untouched;
	r = backend_choose("gpu", &be, why, sizeof(why));
	CHECK(r == -EINVAL && be == untouched && strstr(why, "unknown backend \"gpu\""),
	      "--backend gpu: %d \"%s\"", r, why);
	check_clean("probe");
}

/* ------------------------------------------------------- the kernels --- */

#define KN 2000 /* elements per rank's buffer */

/* Pieces over two owners and two groups, cut where vector tails show. */
static const struct optim_piece kpieces[] = {
	{.group = 0, .owner = 0, .off = 0, .n = 700, .at = 0},
	{.group = 1, .owner = 0, .off = 700, .n = 303, .at = 700},
	{.group = 1, .owner = 1, .off = 1003, .n = 1, .at = 1003},
	{.group = 0, .owner = 1, .off = 1004, .n = 996, .at = 1004},
};

/* One optimizer and two groups' hyperparameters through optim_cuda_ops,
 * four steps, against optim_cpu_ops.step on host copies. */
static void kernels_case(enum zc_optimizer kind, const struct zc_param_group g[2], const char *tag)
{
	unsigned arrays = plan_state_arrays(kind, g, 2);
	float *dg[2], *dp[2], *hp[2], *hg[2], *arena[3] = {NULL, NULL, NULL}, *ref[3];
	struct optim_piece pc[ARRAY_SIZE(kpieces)];
	uint32_t local[2] = {0, 1};
	struct optim_ctx *ctx = NULL;
	int r;

	for (int k = 0; k < 3; k++) {
		bool kept = arrays & (k == 0   ? PLAN_STATE_M
				      : k == 1 ? PLAN_STATE_V
					       : PLAN_STATE_VMAX);
		/* the executor's host arena: zeros, uploaded on first use */
		arena[k] = kept ? calloc(KN, sizeof(float)) : NULL;
		ref[k] = calloc(KN, sizeof(float));
	}
	for (int d = 0; d < 2; d++) {
		dg[d] = dev_alloc(d, KN);
		dp[d] = dev_alloc(d, KN);
		hp[d] = malloc(KN * sizeof(float));
		hg[d] = malloc(KN * sizeof(float));
		for (size_t i = 0; i < KN; i++)
			hp[d][i] = dp[d][i] = rng_float(-2, 2);
	}
	struct optim_config cfg = {
		.world = 2, .grads = dg, .params = dp, .nlocal = 2, .local = local, .pool = pool()};
	REQUIRE(optim_cuda_ops.open(&cfg, &ctx) == 0, "%s: open", tag);
	memcpy(pc, kpieces, sizeof(pc));
	REQUIRE(optim_cuda_ops.state_alloc(ctx, pc, ARRAY_SIZE(pc), arrays) == 0, "%s: state_alloc",
		tag);
	for (uint64_t t = 1; t <= 4 && !test_failed_; t++) {
		for (int d = 0; d < 2; d++)
			for (size_t i = 0; i < KN; i++)
				hg[d][i] = dg[d][i] = rng_float(-3, 3);
		for (size_t k = 0; k < ARRAY_SIZE(pc); k++) {
			pc[k].step = t;
			pc[k].first_momentum = t == 1;
		}
		struct optim_call call = {.kind = kind,
					  .groups = g,
					  .pieces = pc,
					  .npieces = ARRAY_SIZE(pc),
					  .grad = OPTIM_GRAD_OWNER,
					  .m = arena[0],
					  .v = arena[1],
					  .vmax = arena[2]};
		r = optim_cuda_ops.run(ctx, &call);
		CHECK(r == 0, "%s: step %lu: run %d", tag, (unsigned long)t, r);
		for (size_t k = 0; k < ARRAY_SIZE(pc); k++) {
			const struct optim_piece *q = &pc[k];
			struct optim_args a = {.kind = kind,
					       .hp = &g[q->group],
					       .step = t,
					       .first_momentum = t == 1,
					       .param = hp[q->owner] + q->off,
					       .grad = hg[q->owner] + q->off,
					       .m = ref[0] + q->at,
					       .v = ref[1] + q->at,
					       .vmax = ref[2] + q->at,
					       .n = q->n};
			optim_cpu_ops.step(&a);
		}
		for (int d = 0; d < 2; d++) {
			size_t i = 0;
			while (i < KN && memcmp(&hp[d][i], &dp[d][i], sizeof(float)) == 0)
				i++;
			CHECK(i == KN, "%s: step %lu: rank %d param[%zu] = %a, the CPU's %a", tag,
			      (unsigned long)t, d, i, i < KN ? dp[d][i] : 0, i < KN ? hp[d][i] : 0);
		}
	}
	/* the device state is the state: the host arena stays as it was, and
	 * state_io reads the device's, the CPU's bits */
	for (int k = 0; k < 3; k++) {
		for (size_t i = 0; arena[k] && i < KN; i++)
			if (arena[k][i] != 0) {
				CHECK(arena[k][i] == 0, "%s: host arena %d written", tag, k);
				break;
			}
		for (size_t q = 0; arena[k] && q < ARRAY_SIZE(pc) && !test_failed_; q++) {
			float got[KN];
			REQUIRE(optim_cuda_ops.state_io(ctx, &pc[q], (unsigned)k, got, false) == 0,
				"%s: state_io", tag);
			CHECK(memcmp(got, ref[k] + pc[q].at, pc[q].n * sizeof(float)) == 0,
			      "%s: array %d of piece %zu differs from the CPU's", tag, k, q);
		}
	}
	optim_cuda_ops.close(ctx);
	for (int d = 0; d < 2; d++) {
		cudaFree(dg[d]);
		cudaFree(dp[d]);
		free(hp[d]);
		free(hg[d]);
	}
	for (int k = 0; k < 3; k++) {
		free(arena[k]);
		free(ref[k]);
	}
}

static void t_kernels(void)
{
	struct cudadouble_stats s;
	unsigned cases = 0;
	char tag[64];

	reset(2, 0, 0);
	rng_state = 0xc0da;
	for (int combo = 0; combo < 32 && !test_failed_; combo++) {
		struct zc_param_group g[2] = {ZC_PARAM_GROUP_INIT, ZC_PARAM_GROUP_INIT};
		for (int k = 0; k < 2; k++) {
			g[k].lr = rng_float(1e-4f, 0.3f);
			g[k].momentum = combo & 1 ? rng_float(0.1f, 0.95f) : 0;
			g[k].dampening = combo & 2 ? rng_float(0.05f, 0.5f) : 0;
			g[k].weight_decay = (combo & 4) && k == 0 ? rng_float(1e-4f, 0.1f) : 0;
			g[k].maximize = combo & 8;
			g[k].nesterov = (combo & 16) && (combo & 1) && !(combo & 2);
			g[k].amsgrad = combo & 16;
			g[k].beta1 = rng_float(0.5f, 0.95f);
			g[k].beta2 = rng_float(0.9f, 0.999f);
			g[k].eps = rng_float(1e-9f, 1e-6f);
		}
		snprintf(tag, sizeof(tag), "sgd combo %d", combo);
		kernels_case(ZC_OPT_SGD, g, tag);
		snprintf(tag, sizeof(tag), "adam combo %d", combo);
		kernels_case(ZC_OPT_ADAM, g, tag);
		snprintf(tag, sizeof(tag), "adamw combo %d", combo);
		kernels_case(ZC_OPT_ADAMW, g, tag);
		cases += 3;
	}
	cudadouble_stats(&s);
	CHECK(s.kernels >= cases * 4 * ARRAY_SIZE(kpieces), "%u kernels ran for %u cases",
	      s.kernels, cases);
	CHECK(s.live_allocs == 0, "%u device allocations left: state not freed by close",
	      s.live_allocs);
	test_note("%u optimizer cases, %u kernel launches, bit for bit", cases, s.kernels);
	check_clean("kernels");
}

/* Device memory is allocated by state_alloc and freed by close only: a
 * cudaMalloc or cudaFree while a job runs waits for the whole device. The
 * edit check, the masters, a step, the norm over pieces of several chunks
 * and clipping, twice over, leave the count of live allocations as
 * state_alloc left it. */
static void t_no_alloc_while_running(void)
{
	enum { NE = 34000 }; /* bf16 elements per rank's buffer */
	static const struct optim_piece lp[] = {
		{.owner = 0, .off = 0, .n = 20000, .at = 0, .dtype = ZC_DTYPE_BF16, .step = 1},
		{.owner = 0, .off = 20000, .n = 5000, .at = 20000, .dtype = ZC_DTYPE_BF16, .step = 1},
		{.owner = 1, .off = 25000, .n = 9000, .at = 25000, .dtype = ZC_DTYPE_BF16, .step = 1},
	};
	struct zc_param_group g = ZC_PARAM_GROUP_INIT;
	float *dg[2], *dp[2], coef[1] = {0.5f};
	uint32_t local[2] = {0, 1}, edited = 99;
	struct optim_ctx *ctx = NULL;
	struct cudadouble_stats s;
	unsigned live;
	double sumsq[1], bad;

	reset(2, 0, 0);
	g.lr = 0.25;
	for (int d = 0; d < 2; d++) {
		dg[d] = dev_alloc(d, NE / 2);
		dp[d] = dev_alloc(d, NE / 2);
		REQUIRE(dg[d] && dp[d], "buffers");
		for (size_t i = 0; i < NE; i++) {
			((uint16_t *)dg[d])[i] = 0x3f80; /* 1.0 */
			((uint16_t *)dp[d])[i] = 0x4000; /* 2.0 */
		}
	}
	struct optim_config cfg = {
		.world = 2, .grads = dg, .params = dp, .nlocal = 2, .local = local, .pool = pool()};
	REQUIRE(optim_cuda_ops.open(&cfg, &ctx) == 0, "open");
	REQUIRE(optim_cuda_ops.state_alloc(ctx, lp, ARRAY_SIZE(lp), 0) == 0, "state_alloc");
	REQUIRE(optim_cuda_ops.masters(ctx, lp, ARRAY_SIZE(lp), OPTIM_MASTER_LOAD) == 0, "load");
	cudadouble_stats(&s);
	live = s.live_allocs;
	for (int round = 0; round < 2; round++) {
		struct optim_call call = {.kind = ZC_OPT_SGD,
					  .groups = &g,
					  .pieces = lp,
					  .npieces = ARRAY_SIZE(lp),
					  .grad = OPTIM_GRAD_OWNER,
					  .master = (float *)1, /* not NULL: the state's */
					  .edited = &edited};
		int r;

		for (int d = 0; d < 2; d++) /* the last round unscaled and clipped them */
			for (size_t i = 0; i < NE; i++)
				((uint16_t *)dg[d])[i] = 0x3f80;
		r = optim_cuda_ops.run(ctx, &call);
		CHECK(r == 0, "round %d: run (with the edit check) %d", round, r);
		sumsq[0] = 0;
		r = optim_cuda_ops.measure(ctx, lp, ARRAY_SIZE(lp), true, 0.5f, sumsq, &bad);
		/* 34000 gradients of 1.0 unscaled by 0.5: 34000 / 4 */
		CHECK(r == 0 && sumsq[0] == 8500.0 && bad == 0, "round %d: measure %d: %g, %g bad",
		      round, r, sumsq[0], bad);
		r = optim_cuda_ops.clip(ctx, lp, ARRAY_SIZE(lp), coef);
		CHECK(r == 0, "round %d: clip %d", round, r);
		cudadouble_stats(&s);
		CHECK(s.live_allocs == live, "round %d: %u device allocations live, %u after "
		      "state_alloc: the job allocated while running", round, s.live_allocs, live);
	}
	optim_cuda_ops.close(ctx);
	for (int d = 0; d < 2; d++) {
		cudaFree(dg[d]);
		cudaFree(dp[d]);
	}
	cudadouble_stats(&s);
	CHECK(s.live_allocs == 0, "%u device allocations left after close", s.live_allocs);
	check_clean("no alloc while running");
}

/* What run() refuses: the fused pass, a piece of a rank on another node. */
static void t_kernels_refuse(void)
{
	float *dg[3] = {NULL, NULL, NULL}, *dp[3] = {NULL, NULL, NULL};
	uint32_t local[2] = {0, 1};
	struct zc_param_group g = ZC_PARAM_GROUP_INIT;
	struct optim_piece pc = {.owner = 2, .n = 10, .step = 1};
	struct optim_ctx *ctx = NULL;
	float m[10] = {0}, v[10] = {0};

	reset(2, 0, 0);
	for (int d = 0; d < 2; d++) {
		dg[d] = dev_alloc(d, 10);
		dp[d] = dev_alloc(d, 10);
	}
	struct optim_config cfg = {
		.world = 3, .grads = dg, .params = dp, .nlocal = 2, .local = local};
	REQUIRE(optim_cuda_ops.open(&cfg, &ctx) == 0, "open");
	struct optim_call call = {.kind = ZC_OPT_ADAM,
				  .groups = &g,
				  .pieces = &pc,
				  .npieces = 1,
				  .grad = OPTIM_GRAD_SUM_LOCAL,
				  .m = m,
				  .v = v};
	CHECK(optim_cuda_ops.run(ctx, &call) == -EOPNOTSUPP, "the fused pass is the host's");
	call.grad = OPTIM_GRAD_OWNER;
	CHECK(optim_cuda_ops.run(ctx, &call) == -EINVAL, "a piece of a rank on another node");
	optim_cuda_ops.close(ctx);
	/* host memory is not a CUDA buffer */
	float host[10], *dev1 = dp[1];
	dp[1] = host;
	CHECK(optim_cuda_ops.open(&cfg, &ctx) == -EINVAL, "host memory refused");
	dp[1] = dev1;
	for (int d = 0; d < 2; d++) {
		cudaFree(dg[d]);
		cudaFree(dp[d]);
	}
	check_clean("kernels_refuse");
}

/* ---------------------------------------------------- whole jobs ---- */

/* The plan of the job tests: AdamW (or opt) over two groups, five uneven
 * buckets (one divisible by 2, 3 and 4: the equal-slice path), each
 * bucket's dtype dt[b] (NULL: fp32), global clipping at max_norm (0: none). */
static struct plan *make_plan_ex(enum zc_optimizer opt, enum zc_shard_mode shard,
				 enum zc_step_mode step, const enum zc_dtype *dt, double max_norm)
{
	static const uint64_t sizes[] = {37, 120, 5, 64, 1};
	struct zc_param_group g[2] = {ZC_PARAM_GROUP_INIT, ZC_PARAM_GROUP_INIT};
	struct zc_segment seg[ARRAY_SIZE(sizes)][2];
	struct zc_bucket b[ARRAY_SIZE(sizes)];
	struct zc_plan zp = PLAN(opt, shard, step, 2, g, ARRAY_SIZE(sizes), b);
	struct plan *p = NULL;
	char err[200];

	g[0].lr = 0.01;
	g[0].weight_decay = 0.05;
	g[0].momentum = 0.9;
	g[1].lr = 0.003;
	g[1].amsgrad = true;
	zp.max_grad_norm = max_norm;
	for (size_t i = 0; i < ARRAY_SIZE(sizes); i++) {
		uint64_t half = sizes[i] / 2;
		uint32_t ns = half ? 2 : 1;
		seg[i][0] = (struct zc_segment)SEG(0, half ? half : sizes[i], 0);
		seg[i][1] = (struct zc_segment)SEG(half, sizes[i] - half, 1);
		b[i] = (struct zc_bucket)BUCKET(sizes[i], ns, seg[i]);
		b[i].dtype = dt ? dt[i] : ZC_DTYPE_F32;
	}
	if (plan_from_zc(&zp, &p, err, sizeof(err)) < 0)
		test_note("plan_from_zc: %s", err);
	return p;
}

static struct plan *make_plan(enum zc_shard_mode shard, enum zc_step_mode step)
{
	return make_plan_ex(ZC_OPT_ADAMW, shard, step, NULL, 0);
}

static struct exec_done *next_done(struct completion_queue *cq, struct exec_done **pending)
{
	if (!*pending) {
		struct pollfd pfd = {.fd = completion_queue_fd(cq), .events = POLLIN};
		if (poll(&pfd, 1, 5000) <= 0)
			return NULL;
		*pending = completion_queue_take(cq);
	}
	struct exec_done *d = *pending;
	if (d)
		*pending = d->next;
	return d;
}

/* What a job does besides plain iterations. */
struct job_opts {
	unsigned iters;
	int nan_iter;     /* that iteration, rank 0's first gradient is NaN (-1: never) */
	double inv_scale; /* a grad scale every iteration (0: none) */
	bool masks;       /* rank 1 marks bucket 1's segment 0 unused, every rank
			   * bucket 3's segment 1 */
	int edit_iter;    /* before it every rank edits its parameters alike, then
			   * zc_params_changed() (exec_reload); 0: never */
	/* out: what each iteration's StepDone said */
	double norm[8];
	bool found_inf[8];
	/* between the iterations and the stop: an export of the state, and
	 * optionally an import first (staging per rank, the state's layout) */
	float **export_to;
	float *const *import_from;
	const struct exec_seg_state *import_segs;
	/* cuda: keep_params and the journal on the devices; the job ends with
	 * exec_stop_keep, and the parameters it copies off the devices must be
	 * the buffers' last ones bit for bit */
	bool keep;
};

/* Element i of bucket b of buf, written as v in the bucket's dtype. */
static void put_elem(const struct plan *p, void *buf, uint32_t b, uint64_t i, float v)
{
	lowp_put((char *)buf + plan_bucket_offset(p, b), i, p->buckets[b].dtype, v);
}

/* Run one XOP_STATE round on e and wait for its StateOk. */
static void state_round(struct exec *e, struct completion_queue *cq, struct exec_done **pending,
			const struct plan *p, uint32_t world, float **staging,
			const struct exec_seg_state *segs, const char *tag)
{
	uint32_t seg_first[8], nsegs = 0;
	struct exec_state_req rq = {.set = segs != NULL, .staging = staging};
	struct exec_done *d;

	for (uint32_t b = 0; b < p->nbuckets; b++) {
		seg_first[b] = nsegs;
		nsegs += p->buckets[b].nsegments;
	}
	seg_first[p->nbuckets] = nsegs;
	rq.segs = segs;
	rq.seg_first = seg_first;
	(void)world;
	REQUIRE(exec_state(e, &rq) == 0, "%s: exec_state", tag);
	d = next_done(cq, pending);
	CHECK(d && d->ev == EXEC_STATE_DONE && d->status == 0,
	      "%s: state round: event %d status %d", tag, d ? (int)d->ev : -1, d ? d->status : 0);
	free(d);
}

/* One job on one node: every rank local, on device r (cuda) or in host
 * memory; initial parameters init[r] (the plan's buffer bytes), gradients
 * of iteration t from a seed. Leaves the final parameters of every rank in
 * out[r]. */
static void run_job_ex(const struct plan *p, uint32_t world, bool cuda, void *const *init,
		       struct job_opts *o, void **out, const char *tag)
{
	uint32_t node_of[4] = {0, 0, 0, 0};
	struct zero_topo topo = {.world = world, .nnodes = 1, .node = 0, .node_of = node_of};
	struct zero_caps caps = {.local_fuse = !cuda};
	size_t bytes = plan_buffer_bytes(p), nf = (bytes + 3) / 4;
	void *grads[4] = {NULL}, *params[4] = {NULL};
	struct shard_map *sm = NULL;
	struct completion_queue *cq = NULL;
	struct zero_program prog = {0};
	struct exec_done *pending = NULL, *d;
	struct exec *e = NULL;
	struct state *stt = NULL;
	bool stopped = false;

	for (uint32_t r = 0; r < world; r++) {
		grads[r] = cuda ? (void *)dev_alloc((int)r, nf) : calloc(nf, sizeof(float));
		params[r] = cuda ? (void *)dev_alloc((int)r, nf) : calloc(nf, sizeof(float));
		REQUIRE(grads[r] && params[r], "%s: buffers", tag);
		memcpy(params[r], init[r], bytes);
	}
	REQUIRE(shard_assign(p, world, &sm) == 0, "%s: shard", tag);
	REQUIRE(completion_queue_new(&cq) == 0 && zero_program(p, &topo, &caps, &prog) == 0,
		"%s: program", tag);
	REQUIRE(state_layout(p, sm, &topo, plan_state_arrays(p->optimizer, p->groups, p->ngroups),
			     &stt) == 0,
		"%s: state", tag);
	struct exec_config ec = {.tag = NULL,
				 .plan = p,
				 .shard = sm,
				 .prog = &prog,
				 .state = stt,
				 .world = world,
				 .grads = (float **)grads,
				 .params = (float **)params,
				 .coll = cuda ? &coll_nccl_ops : &coll_host_ops,
				 .optim = cuda ? &optim_cuda_ops : &optim_cpu_ops,
				 .pool = pool(),
				 .cq = cq,
				 .keep_params = o->keep,
				 .journal = o->keep};
	REQUIRE(exec_new(&ec, &e) == 0, "%s: exec_new", tag);
	d = next_done(cq, &pending);
	CHECK(d && d->ev == EXEC_STARTED, "%s: started (%d, status %d)", tag, d ? (int)d->ev : -1,
	      d ? d->status : 0);
	free(d);
	if (o->import_from)
		state_round(e, cq, &pending, p, world, (float **)o->import_from, o->import_segs,
			    tag);
	for (unsigned t = 0; t < o->iters && !test_failed_; t++) {
		uint32_t want = 0;

		if (o->edit_iter && (int)t == o->edit_iter) {
			/* the double's device memory is the host's: written in place */
			for (uint32_t r = 0; r < world; r++)
				for (uint32_t b = 0; b < p->nbuckets; b++)
					for (uint64_t i = 0; i < p->buckets[b].numel; i += 3)
						put_elem(p, params[r], b, i, 0.25f * (float)i);
			CHECK(exec_reload(e) == 0, "%s: exec_reload", tag);
		}

		for (uint32_t r = 0; r < world; r++) {
			rng_state = 1000 * t + r;
			for (uint32_t b = 0; b < p->nbuckets; b++)
				for (uint64_t i = 0; i < p->buckets[b].numel; i++)
					put_elem(p, grads[r], b, i, rng_float(-1, 1));
		}
		if ((int)t == o->nan_iter)
			put_elem(p, grads[0], 0, 0, NAN);
		for (uint32_t b = 0; b < p->nbuckets; b++) {
			uint32_t marks[2] = {0, 0};
			struct exec_zero zero[4];
			struct exec_bucket_in in = {.marks = marks, .zero = zero};

			if (o->masks && b == 1) {
				marks[0] = 1;
				zero[in.nzero++] = (struct exec_zero){.rank = 1, .seg = 0};
			}
			if (o->masks && b == 3)
				for (uint32_t r = 0; r < world; r++) {
					marks[1]++;
					zero[in.nzero++] = (struct exec_zero){.rank = r, .seg = 1};
				}
			if (b == p->nbuckets - 1 && o->inv_scale) {
				in.has_scale = true;
				in.inv_scale = o->inv_scale;
			}
			CHECK(exec_bucket_ex(e, t, b, &in) == 0, "%s: exec_bucket", tag);
		}
		while ((d = next_done(cq, &pending))) {
			bool end = d->ev != EXEC_BUCKET_DONE;
			if (d->ev == EXEC_BUCKET_DONE)
				CHECK(d->bucket == want++, "%s: BucketDone(%u) out of order", tag,
				      d->bucket);
			else
				CHECK(d->ev == EXEC_STEP_DONE && d->iteration == t,
				      "%s: iteration %u: event %d (%s of %u, status %d)", tag, t,
				      (int)d->ev, d->op ? d->op : "", d->lo, d->status);
			if (d->ev == EXEC_STEP_DONE && t < ARRAY_SIZE(o->norm)) {
				o->norm[t] = d->grad_norm;
				o->found_inf[t] = d->found_inf;
			}
			free(d);
			if (end)
				break;
		}
		CHECK(want == p->nbuckets, "%s: iteration %u: %u BucketDones", tag, t, want);
	}
	if (o->export_to && !test_failed_)
		state_round(e, cq, &pending, p, world, o->export_to, NULL, tag);
	if (o->keep)
		exec_stop_keep(e);
	else
		exec_stop(e);
	while ((d = next_done(cq, &pending))) {
		stopped = d->ev == EXEC_STOPPED;
		free(d);
		if (stopped)
			break;
	}
	CHECK(stopped, "%s: EXEC_STOPPED", tag);
	while ((d = pending)) {
		pending = d->next;
		free(d);
	}
	if (stopped && o->keep) {
		char *kept = exec_take_params(e);
		struct state *ks = exec_take_state(e);
		uint32_t b = 0;

		/* every bucket's elements (not the padding between them) */
		while (kept && b < p->nbuckets &&
		       memcmp(kept + plan_bucket_offset(p, b),
			      (char *)params[0] + plan_bucket_offset(p, b),
			      p->buckets[b].numel * plan_dtype_size(p->buckets[b].dtype)) == 0)
			b++;
		CHECK(kept && ks && ks->arena && b == p->nbuckets,
		      "%s: the parameters kept off the devices are not the last ones (bucket %u)",
		      tag, b);
		CHECK(ks && ks->undo_iter && ks->undo_iter[p->nbuckets - 1] == o->iters - 1,
		      "%s: the journal holds iteration %llu, not the last", tag,
		      ks && ks->undo_iter ? (unsigned long long)ks->undo_iter[p->nbuckets - 1]
					  : 0ull);
		free(kept);
		state_free(ks);
	}
	if (stopped)
		exec_free(e);
	for (uint32_t r = 0; r < world; r++) {
		memcpy(out[r], params[r], bytes);
		if (cuda) {
			cudaFree(grads[r]);
			cudaFree(params[r]);
		} else {
			free(grads[r]);
			free(params[r]);
		}
	}
	zero_program_clear(&prog);
	completion_queue_free(cq);
	shard_map_free(sm);
}

static void run_job(const struct plan *p, uint32_t world, bool cuda, float *const *init,
		    unsigned iters, float **out, const char *tag)
{
	struct job_opts o = {.iters = iters, .nan_iter = -1};

	run_job_ex(p, world, cuda, (void *const *)init, &o, (void **)out, tag);
}

static void t_jobs_match_host(void)
{
	static const enum zc_shard_mode shards[] = {ZC_SHARD_BUCKET, ZC_SHARD_SLICE};
	static const enum zc_step_mode steps[] = {ZC_STEP_INTERLEAVED, ZC_STEP_AT_END};
	struct cudadouble_stats s;
	unsigned jobs = 0;

	for (uint32_t w = 2; w <= 4; w++)
		for (size_t sh = 0; sh < 2; sh++)
			for (size_t sp = 0; sp < 2 && !test_failed_; sp++) {
				struct plan *p = make_plan(shards[sh], steps[sp]);
				float *init[4], *host[4], *gpu[4];
				char tag[96];

				REQUIRE(p, "plan");
				snprintf(tag, sizeof(tag), "w%u %s/%s", w,
					 plan_shard_name(shards[sh]), plan_step_name(steps[sp]));
				rng_state = w * 10 + sh * 2 + sp;
				for (uint32_t r = 0; r < w; r++) {
					init[r] = malloc(p->total_numel * sizeof(float));
					host[r] = malloc(p->total_numel * sizeof(float));
					gpu[r] = malloc(p->total_numel * sizeof(float));
					for (size_t i = 0; i < p->total_numel; i++)
						init[r][i] =
							rng_float(-1, 1); /* rank 0's must win */
				}
				run_job(p, w, false, init, 3, host, tag);
				/* every non-blocking call answers ncclInProgress twice;
				 * streams sleep up to 200 us per task */
				reset(4, 2, 200);
				if (w == 3) { /* and what a job that can re-form keeps */
					struct job_opts ko = {
						.iters = 3, .nan_iter = -1, .keep = true};
					run_job_ex(p, w, true, (void *const *)init, &ko,
						   (void **)gpu, tag);
				} else
					run_job(p, w, true, init, 3, gpu, tag);
				for (uint32_t r = 0; r < w && !test_failed_; r++) {
					size_t i = 0;
					while (i < p->total_numel &&
					       memcmp(&host[r][i], &gpu[r][i], sizeof(float)) == 0)
						i++;
					CHECK(i == p->total_numel,
					      "%s: rank %u param[%zu]: cuda %a, host %a", tag, r, i,
					      gpu[r][i], host[r][i]);
					CHECK(memcmp(host[r], init[r], sizeof(float)) != 0,
					      "%s: rank %u: no update", tag, r);
				}
				cudadouble_stats(&s);
				CHECK(s.kernels > 0 && s.host_funcs > 0 && s.collectives > 0,
				      "%s: the double ran %u kernels, %u host functions, %u "
				      "collectives",
				      tag, s.kernels, s.host_funcs, s.collectives);
				CHECK(s.live_allocs == 0, "%s: %u device allocations left", tag,
				      s.live_allocs);
				check_clean(tag);
				for (uint32_t r = 0; r < w; r++) {
					free(init[r]);
					free(host[r]);
					free(gpu[r]);
				}
				plan_free(p);
				jobs++;
			}
	test_note("%u jobs, cuda (double) = host bit for bit", jobs);
}

/* ------------------------------------- bf16/fp16, masks, clipping --- */

static const enum zc_dtype mixed[5] = {ZC_DTYPE_BF16, ZC_DTYPE_F32, ZC_DTYPE_F16, ZC_DTYPE_BF16,
				       ZC_DTYPE_F16};

/* Each rank's parameters: random values in each bucket's dtype (rank 0's
 * must win). */
static void **make_init(const struct plan *p, uint32_t world)
{
	void **init = calloc(world, sizeof(*init));

	for (uint32_t r = 0; r < world; r++) {
		init[r] = calloc(1, plan_buffer_bytes(p) + 4);
		for (uint32_t b = 0; b < p->nbuckets; b++)
			for (uint64_t i = 0; i < p->buckets[b].numel; i++)
				put_elem(p, init[r], b, i, rng_float(-1, 1));
	}
	return init;
}

static void **make_out(const struct plan *p, uint32_t world)
{
	void **out = calloc(world, sizeof(*out));

	for (uint32_t r = 0; r < world; r++)
		out[r] = calloc(1, plan_buffer_bytes(p) + 4);
	return out;
}

static void free_bufs(void **b, uint32_t world)
{
	for (uint32_t r = 0; r < world; r++)
		free(b[r]);
	free(b);
}

/* The job on the host backend, then on the cuda backend (the double, with
 * jittered streams and ncclInProgress answers): the same bytes in every
 * rank's parameters, the same norms and skips. */
static void host_vs_cuda(const struct plan *p, uint32_t world, struct job_opts *o, const char *tag)
{
	void **init = make_init(p, world), **host = make_out(p, world), **gpu = make_out(p, world);
	struct job_opts oh = *o, oc = *o;
	struct cudadouble_stats st;

	run_job_ex(p, world, false, init, &oh, host, tag);
	reset(4, 2, 100);
	run_job_ex(p, world, true, init, &oc, gpu, tag);
	for (uint32_t r = 0; r < world && !test_failed_; r++) {
		size_t i = 0, bytes = plan_buffer_bytes(p);
		while (i < bytes && ((char *)host[r])[i] == ((char *)gpu[r])[i])
			i++;
		CHECK(i == bytes, "%s: rank %u: byte %zu of the parameters differs from the host's",
		      tag, r, i);
		CHECK(memcmp(host[r], init[r], bytes) != 0, "%s: rank %u: no update", tag, r);
	}
	for (unsigned t = 0; t < o->iters && t < ARRAY_SIZE(o->norm); t++) {
		CHECK(memcmp(&oh.norm[t], &oc.norm[t], sizeof(double)) == 0 &&
			      oh.found_inf[t] == oc.found_inf[t],
		      "%s: iteration %u: norm %a found_inf %d on the host, %a %d on cuda", tag, t,
		      oh.norm[t], oh.found_inf[t], oc.norm[t], oc.found_inf[t]);
		o->norm[t] = oc.norm[t];
		o->found_inf[t] = oc.found_inf[t];
	}
	cudadouble_stats(&st);
	CHECK(st.live_allocs == 0, "%s: %u device allocations left", tag, st.live_allocs);
	check_clean(tag);
	free_bufs(init, world);
	free_bufs(host, world);
	free_bufs(gpu, world);
}

static void t_lowp_jobs_match_host(void)
{
	static const enum zc_optimizer opts[] = {ZC_OPT_SGD, ZC_OPT_ADAM, ZC_OPT_ADAMW};
	unsigned jobs = 0;

	for (uint32_t w = 1; w <= 3; w++)
		for (unsigned sh = 0; sh < 2; sh++)
			for (unsigned sp = 0; sp < 2 && !test_failed_; sp++) {
				enum zc_optimizer opt = opts[(w + sh + sp) % 3];
				struct plan *p = make_plan_ex(
					opt, sh ? ZC_SHARD_SLICE : ZC_SHARD_BUCKET,
					sp ? ZC_STEP_AT_END : ZC_STEP_INTERLEAVED, mixed, 0);
				struct job_opts o = {
					.iters = 4, .nan_iter = -1, .masks = w > 1, .edit_iter = 2};
				char tag[96];

				REQUIRE(p, "plan");
				snprintf(tag, sizeof(tag), "lowp %s w%u %s/%s%s, an edit",
					 plan_optimizer_name(opt), w,
					 plan_shard_name(p->shard_mode),
					 plan_step_name(p->step_mode), o.masks ? " masks" : "");
				rng_state = 77 + w * 4 + sh * 2 + sp;
				host_vs_cuda(p, w, &o, tag);
				plan_free(p);
				jobs++;
			}
	test_note("%u bf16/fp16/fp32 jobs, cuda (double) = host bit for bit", jobs);
}

/* at_end with a grad scale, global clipping and a NaN in iteration 1:
 * the norms agree to the bit (gradelem.h's order), iteration 1 is skipped
 * on both, and the parameters match. */
static void t_clip_found_inf_match_host(void)
{
	for (uint32_t w = 2; w <= 3 && !test_failed_; w++)
		for (unsigned lowp = 0; lowp < 2 && !test_failed_; lowp++) {
			struct plan *p =
				make_plan_ex(ZC_OPT_ADAM, w == 2 ? ZC_SHARD_BUCKET : ZC_SHARD_SLICE,
					     ZC_STEP_AT_END, lowp ? mixed : NULL, 0.5);
			struct job_opts o = {
				.iters = 4, .nan_iter = 1, .inv_scale = 0.5, .masks = true};
			char tag[64];

			REQUIRE(p, "plan");
			snprintf(tag, sizeof(tag), "clip w%u%s", w, lowp ? " bf16/fp16" : "");
			rng_state = 500 + w;
			host_vs_cuda(p, w, &o, tag);
			CHECK(!o.found_inf[0] && o.found_inf[1] && !o.found_inf[2],
			      "%s: found_inf %d %d %d", tag, o.found_inf[0], o.found_inf[1],
			      o.found_inf[2]);
			/* the norm is of the unscaled gradient: clipping at 0.5 acts */
			CHECK(o.norm[0] > 0.5 && isfinite(o.norm[0]), "%s: norm %g", tag,
			      o.norm[0]);
			plan_free(p);
		}
}

/* The segments' list of an import from an export's staging (its meta
 * words), every segment given. */
static struct exec_seg_state *segs_of(const struct plan *p, const float *staging)
{
	struct exec_seg_state *sg = calloc(64, sizeof(*sg));
	const uint32_t *meta =
		(const uint32_t *)(staging + (size_t)EXEC_REGION_META * p->state_numel);
	uint32_t k = 0;

	for (uint32_t b = 0; b < p->nbuckets; b++)
		for (uint32_t g = 0; g < p->buckets[b].nsegments; g++, k++) {
			uint32_t w = meta[p->buckets[b].sbase + p->buckets[b].segments[g].offset];
			uint32_t step = w & EXEC_META_STEP;

			sg[k].given = true;
			sg[k].step = step;
			if (p->optimizer == ZC_OPT_SGD)
				sg[k].present =
					w & EXEC_META_MOMENTUM ? ZC_STATE_MOMENTUM_BUFFER : 0;
			else if (step)
				sg[k].present = ZC_STATE_STEP | ZC_STATE_EXP_AVG |
						ZC_STATE_EXP_AVG_SQ |
						(w & EXEC_META_VMAX ? ZC_STATE_MAX_EXP_AVG_SQ : 0);
			if (p->buckets[b].dtype != ZC_DTYPE_F32)
				sg[k].present |= ZC_STATE_MASTER;
		}
	return sg;
}

/* A CUDA job's state out (export) and back in (import into a new job):
 * the export equals the host job's to the bit, and both jobs continued from
 * it end equal; a job not given the state ends elsewhere. */
static void t_state_round_trip(void)
{
	for (unsigned lowp = 0; lowp < 2 && !test_failed_; lowp++) {
		const uint32_t w = 2;
		struct plan *p = make_plan_ex(ZC_OPT_ADAMW, ZC_SHARD_SLICE, ZC_STEP_AT_END,
					      lowp ? mixed : NULL, 0);
		size_t slots = (size_t)exec_state_regions(p) * p->state_numel;
		float *stg[2][2];
		void **init, **mid[2], **end[2], **fresh;
		char tag[64];

		REQUIRE(p, "plan");
		snprintf(tag, sizeof(tag), "state%s", lowp ? " bf16/fp16" : "");
		rng_state = 900 + lowp;
		init = make_init(p, w);
		for (unsigned be = 0; be < 2; be++) {
			struct job_opts o = {.iters = 3, .nan_iter = -1};

			for (uint32_t r = 0; r < w; r++)
				stg[be][r] = calloc(slots, sizeof(float));
			mid[be] = make_out(p, w);
			o.export_to = stg[be];
			if (be)
				reset(4, 1, 50);
			run_job_ex(p, w, be, init, &o, mid[be], tag);
		}
		/* the state's regions (not region 0, the saved parameters, which a
		 * one-node export leaves alone) */
		for (uint32_t r = 0; r < w && !test_failed_; r++) {
			size_t from = (size_t)EXEC_REGION_META * p->state_numel, i = from;
			while (i < slots &&
			       memcmp(&stg[0][r][i], &stg[1][r][i], sizeof(float)) == 0)
				i++;
			CHECK(i == slots, "%s: rank %u: export slot %zu: cuda %a, host %a", tag, r,
			      i, i < slots ? stg[1][r][i] : 0, i < slots ? stg[0][r][i] : 0);
		}
		struct exec_seg_state *segs = segs_of(p, stg[0][0]);
		for (unsigned be = 0; be < 2; be++) {
			struct job_opts o = {.iters = 2,
					     .nan_iter = -1,
					     .import_from = stg[be],
					     .import_segs = segs};
			end[be] = make_out(p, w);
			if (be)
				reset(4, 1, 50);
			run_job_ex(p, w, be, mid[be], &o, end[be], tag);
		}
		struct job_opts o = {.iters = 2, .nan_iter = -1};
		fresh = make_out(p, w);
		reset(4, 0, 0);
		run_job_ex(p, w, true, mid[1], &o, fresh, tag);
		for (uint32_t r = 0; r < w && !test_failed_; r++) {
			CHECK(memcmp(end[0][r], end[1][r], plan_buffer_bytes(p)) == 0,
			      "%s: rank %u: after the import cuda and host differ", tag, r);
			CHECK(memcmp(end[1][r], fresh[r], plan_buffer_bytes(p)) != 0,
			      "%s: rank %u: the import changed nothing", tag, r);
		}
		check_clean(tag);
		free(segs);
		for (unsigned be = 0; be < 2; be++) {
			for (uint32_t r = 0; r < w; r++)
				free(stg[be][r]);
			free_bufs(mid[be], w);
			free_bufs(end[be], w);
		}
		free_bufs(fresh, w);
		free_bufs(init, w);
		plan_free(p);
	}
}

/* --------------------------------------------- two nodes, one id --- */

struct waiter {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	unsigned calls;
	int status;
	pthread_t thread;
	struct coll_req req;
};

static void waiter_done(struct coll_req *req, int status)
{
	struct waiter *w = (struct waiter *)((char *)req - offsetof(struct waiter, req));

	pthread_mutex_lock(&w->mu);
	w->calls++;
	w->status = status;
	w->thread = pthread_self();
	pthread_cond_broadcast(&w->cv);
	pthread_mutex_unlock(&w->mu);
}

static void waiter_init(struct waiter *w)
{
	memset(w, 0, sizeof(*w));
	pthread_mutex_init(&w->mu, NULL);
	pthread_cond_init(&w->cv, NULL);
}

/* Wait (ms at most) for done(); its status, or 1 on timeout. */
static int waiter_wait(struct waiter *w, int ms)
{
	struct timespec ts;
	int r;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += ms / 1000;
	ts.tv_nsec += (long)(ms % 1000) * 1000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&w->mu);
	while (!w->calls && pthread_cond_timedwait(&w->cv, &w->mu, &ts) == 0)
		;
	r = w->calls ? w->status : 1;
	pthread_mutex_unlock(&w->mu);
	return r;
}

#define NN 48 /* elements: 4 equal slices of 12 */

struct node {
	float *grads[4], *params[4];
	struct coll_config cfg;
	struct coll_group *g;
	int r;
};

static void *node_open(void *arg)
{
	struct node *n = arg;

	n->r = coll_nccl_ops.open(&n->cfg, &n->g);
	return NULL;
}

static const uint32_t node_of4[4] = {0, 0, 1, 1};
static size_t gather_bytes_; /* coll_config.gather_bytes of the next nodes_open */

/* World 4: node A holds ranks 0 and 1, node B ranks 2 and 3, rank r on
 * device r; both open concurrently (each waits for the other's ranks). With
 * id NULL they swap the unique id through store (node 0 makes it). */
static int nodes_open_via(struct node nodes[2], const ncclUniqueId *id,
			  const struct coll_store *store, struct coll_net net[2])
{
	pthread_t th;

	memset(nodes, 0, 2 * sizeof(*nodes));
	for (uint32_t r = 0; r < 4; r++) {
		struct node *n = &nodes[r / 2];
		n->grads[r] = dev_alloc((int)r, NN);
		n->params[r] = dev_alloc((int)r, NN);
		if (!n->grads[r] || !n->params[r])
			return -ENOMEM;
	}
	for (int k = 0; k < 2; k++)
		nodes[k].cfg = (struct coll_config){.world = 4,
						    .grads = nodes[k].grads,
						    .params = nodes[k].params,
						    .nccl_id = id ? id->internal : NULL,
						    .open_timeout_ms = 5000,
						    .gather_bytes = gather_bytes_};
	for (int k = 0; k < 2 && !id; k++) {
		net[k] = (struct coll_net){.nnodes = 2,
					   .node = (uint32_t)k,
					   .node_of = node_of4,
					   .prefix = "job.7/",
					   .store = store};
		nodes[k].cfg.net = &net[k];
	}
	pthread_create(&th, NULL, node_open, &nodes[1]);
	node_open(&nodes[0]);
	pthread_join(th, NULL);
	return nodes[0].r < 0 ? nodes[0].r : nodes[1].r;
}

static int nodes_open(struct node nodes[2], const ncclUniqueId *id)
{
	return nodes_open_via(nodes, id, NULL, NULL);
}

static void nodes_close(struct node nodes[2])
{
	for (int k = 0; k < 2; k++) {
		coll_nccl_ops.close(nodes[k].g);
		for (uint32_t r = 0; r < 4; r++) {
			cudaFree(nodes[k].grads[r]);
			cudaFree(nodes[k].params[r]);
		}
	}
}

/* Submit req on both nodes; both done() calls come, from stream threads. */
static void both(struct node nodes[2], struct coll_req tmpl, const char *tag)
{
	struct waiter w[2];

	for (int k = 0; k < 2; k++) {
		waiter_init(&w[k]);
		w[k].req = tmpl;
		w[k].req.done = waiter_done;
		CHECK(coll_nccl_ops.submit(nodes[k].g, &w[k].req) == 0, "%s: submit", tag);
	}
	for (int k = 0; k < 2; k++) {
		CHECK(waiter_wait(&w[k], 5000) == 0, "%s: node %d: status %d", tag, k, w[k].status);
		CHECK(w[k].calls == 1 && !pthread_equal(w[k].thread, pthread_self()),
		      "%s: node %d: done() %u times, from the submitter: %d", tag, k, w[k].calls,
		      w[k].calls && pthread_equal(w[k].thread, pthread_self()));
	}
}

static void t_two_nodes(void)
{
	struct node nodes[2];
	ncclUniqueId id;
	float want[NN];

	reset(4, 3, 100);
	REQUIRE(ncclGetUniqueId(&id) == ncclSuccess, "id");
	REQUIRE(nodes_open(nodes, &id) == 0, "open: %d %d", nodes[0].r, nodes[1].r);

	/* bucket mode: an all-reduce, every rank holds the average */
	for (size_t i = 0; i < NN; i++) {
		want[i] = 0;
		for (uint32_t r = 0; r < 4; r++) {
			float x = (float)(r + 1) * (float)i;
			nodes[r / 2].grads[r][i] = x;
			want[i] += x;
		}
		want[i] /= 4;
	}
	struct coll_range whole = {.owner = 1, .off = 0, .n = NN};
	both(nodes,
	     (struct coll_req){
		     .kind = COLL_REDUCE, .mode = ZC_SHARD_BUCKET, .ranges = &whole, .nranges = 1},
	     "all-reduce");
	for (uint32_t r = 0; r < 4; r++)
		CHECK(memcmp(nodes[r / 2].grads[r], want, sizeof(want)) == 0,
		      "all-reduce: rank %u has not the average", r);

	/* slice mode, equal slices: reduce-scatter, then all-gather */
	struct coll_range eq[4], uneq[4];
	for (uint32_t r = 0; r < 4; r++) {
		eq[r] = (struct coll_range){.owner = r, .off = r * (NN / 4), .n = NN / 4};
		for (size_t i = 0; i < NN; i++)
			nodes[r / 2].grads[r][i] = (float)(r + 1) * (float)i;
	}
	both(nodes,
	     (struct coll_req){
		     .kind = COLL_REDUCE, .mode = ZC_SHARD_SLICE, .ranges = eq, .nranges = 4},
	     "reduce-scatter");
	for (uint32_t r = 0; r < 4; r++)
		CHECK(memcmp(nodes[r / 2].grads[r] + eq[r].off, want + eq[r].off,
			     eq[r].n * sizeof(float)) == 0,
		      "reduce-scatter: rank %u's slice is not the average", r);
	for (uint32_t r = 0; r < 4; r++)
		for (size_t i = 0; i < NN; i++)
			nodes[r / 2].params[r][i] = (float)(100 * r + i);
	both(nodes,
	     (struct coll_req){
		     .kind = COLL_BCAST, .mode = ZC_SHARD_SLICE, .ranges = eq, .nranges = 4},
	     "all-gather");
	for (uint32_t r = 0; r < 4; r++)
		for (size_t i = 0; i < NN; i++)
			if (nodes[r / 2].params[r][i] != (float)(100 * (i / (NN / 4)) + i)) {
				CHECK(0, "all-gather: rank %u param[%zu] = %g", r, i,
				      nodes[r / 2].params[r][i]);
				break;
			}

	/* unequal slices: a reduce and a broadcast per slice to/from its owner */
	static const uint64_t cut[5] = {0, 13, 25, 36, NN};
	for (uint32_t r = 0; r < 4; r++) {
		uneq[r] = (struct coll_range){
			.owner = 3 - r, .off = cut[r], .n = cut[r + 1] - cut[r]};
		for (size_t i = 0; i < NN; i++) {
			nodes[r / 2].grads[r][i] = (float)(r + 1) * (float)i;
			nodes[r / 2].params[r][i] = (float)(100 * r + i);
		}
	}
	both(nodes,
	     (struct coll_req){
		     .kind = COLL_REDUCE, .mode = ZC_SHARD_SLICE, .ranges = uneq, .nranges = 4},
	     "reduce per slice");
	for (uint32_t k = 0; k < 4; k++) {
		uint32_t o = uneq[k].owner;
		CHECK(memcmp(nodes[o / 2].grads[o] + uneq[k].off, want + uneq[k].off,
			     uneq[k].n * sizeof(float)) == 0,
		      "reduce per slice: owner %u of slice %u has not the average", o, k);
	}
	both(nodes,
	     (struct coll_req){
		     .kind = COLL_BCAST, .mode = ZC_SHARD_SLICE, .ranges = uneq, .nranges = 4},
	     "broadcast per slice");
	for (uint32_t r = 0; r < 4; r++)
		for (uint32_t k = 0; k < 4; k++)
			CHECK(nodes[r / 2].params[r][uneq[k].off] ==
				      (float)(100 * uneq[k].owner + uneq[k].off),
			      "broadcast per slice: rank %u slice %u", r, k);
	nodes_close(nodes);
	check_clean("two nodes");
}

/* Remove dir and the files in it. */
static void rm_dir(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	char path[PATH_MAX];

	while (d && (e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		unlink(path);
	}
	if (d)
		closedir(d);
	rmdir(dir);
}

/* A job over two nodes given no id: node 0 makes one and node 1 gets it
 * through the job's store (the rendezvous's, here a file store); their
 * communicators form one clique, so the all-reduce sums all four ranks. A
 * node whose node 0 never comes times out instead of waiting for ever. */
static void t_two_nodes_store(void)
{
	char dir[] = "/tmp/zerod-test-cuda.XXXXXX";
	struct coll_store store;
	struct coll_net net[2];
	struct node nodes[2];
	struct coll_group *cg = NULL;
	float want[NN];

	REQUIRE(mkdtemp(dir), "mkdtemp");
	store = filestore_new(dir);
	reset(4, 3, 100);
	REQUIRE(nodes_open_via(nodes, NULL, &store, net) == 0, "open through the store: %d %d",
		nodes[0].r, nodes[1].r);
	for (size_t i = 0; i < NN; i++) {
		want[i] = 0;
		for (uint32_t r = 0; r < 4; r++) {
			float x = (float)(r + 1) * (float)i;
			nodes[r / 2].grads[r][i] = x;
			want[i] += x;
		}
		want[i] /= 4;
	}
	struct coll_range whole = {.owner = 0, .off = 0, .n = NN};
	both(nodes,
	     (struct coll_req){
		     .kind = COLL_REDUCE, .mode = ZC_SHARD_BUCKET, .ranges = &whole, .nranges = 1},
	     "all-reduce");
	for (uint32_t r = 0; r < 4; r++)
		CHECK(memcmp(nodes[r / 2].grads[r], want, sizeof(want)) == 0,
		      "rank %u has not the average of all four", r);
	nodes_close(nodes);

	/* node 1 alone under a fresh prefix: no id ever comes */
	net[1].prefix = "job.8/";
	nodes[1].cfg.open_timeout_ms = 300;
	for (uint32_t r = 2; r < 4; r++) {
		nodes[1].grads[r] = dev_alloc((int)r, NN);
		nodes[1].params[r] = dev_alloc((int)r, NN);
	}
	int r = coll_nccl_ops.open(&nodes[1].cfg, &cg);
	CHECK(r == -ETIMEDOUT && !cg, "node 1 without node 0: %d (want -ETIMEDOUT)", r);
	for (uint32_t k = 2; k < 4; k++) {
		cudaFree(nodes[1].grads[k]);
		cudaFree(nodes[1].params[k]);
	}
	filestore_free(&store);
	rm_dir(dir);
	check_clean("two nodes through the store");
}

/* A job over two nodes gathers each node's bytes in node order (the
 * executor's masks and norm partials): through set 2's all-gather, growing
 * its staging, every node the same result; a second gather while one is in
 * flight is -EBUSY; a gather the peer never joins ends on abort. */
struct submitter {
	struct coll_group *g;
	struct coll_req *req;
	int r;
};

static void *submit_main(void *arg)
{
	struct submitter *s = arg;

	s->r = coll_nccl_ops.submit(s->g, s->req);
	return NULL;
}

static void t_two_nodes_gather(void)
{
	char dir[] = "/tmp/zerod-test-cuda.XXXXXX";
	/* doubles: 40 B, the staging's 800 B, then 5600 B in 7 pieces */
	static const size_t sizes[3] = {5, 100, 700};
	struct coll_store store;
	struct coll_net net[2];
	struct node nodes[2];
	struct waiter w[2];
	struct cudadouble_stats s0, s1;
	double *in[2], *out[2];

	REQUIRE(mkdtemp(dir), "mkdtemp");
	store = filestore_new(dir);
	reset(4, 3, 100);
	gather_bytes_ = 100 * sizeof(double);
	REQUIRE(nodes_open_via(nodes, NULL, &store, net) == 0, "open through the store: %d %d",
		nodes[0].r, nodes[1].r);
	gather_bytes_ = 0;
	cudadouble_stats(&s0);
	for (int k = 0; k < 2; k++) {
		in[k] = malloc(700 * sizeof(double));
		out[k] = malloc(2 * 700 * sizeof(double));
		REQUIRE(in[k] && out[k], "malloc");
	}
	for (unsigned t = 0; t < 3; t++) {
		size_t n = sizes[t];
		struct submitter sub[2];
		pthread_t th[2];
		for (int k = 0; k < 2; k++) {
			for (size_t i = 0; i < n; i++)
				in[k][i] = 1000.0 * (k + 1) + (double)i + 0.25 * t;
			memset(out[k], 0xff, 2 * n * sizeof(double));
			waiter_init(&w[k]);
			w[k].req = (struct coll_req){.kind = COLL_GATHER,
						     .lane = 1,
						     .gin = in[k],
						     .gout = out[k],
						     .gbytes = n * sizeof(double),
						     .done = waiter_done};
			/* a gather in pieces waits for each in submit: a thread each */
			sub[k] = (struct submitter){.g = nodes[k].g, .req = &w[k].req};
			if (t == 2) {
				pthread_create(&th[k], NULL, submit_main, &sub[k]);
				continue;
			}
			CHECK(coll_nccl_ops.submit(nodes[k].g, &w[k].req) == 0, "gather %u: submit",
			      t);
			if (t == 0 && k == 0) {
				/* node 1 has not joined: node 0's first is still in flight */
				struct coll_req again = w[0].req;
				int r = coll_nccl_ops.submit(nodes[0].g, &again);
				CHECK(r == -EBUSY, "a second gather in flight: %d (want -EBUSY)",
				      r);
			}
		}
		for (int k = 0; k < 2 && t == 2; k++) {
			pthread_join(th[k], NULL);
			CHECK(sub[k].r == 0, "gather %u: node %d: submit %d", t, k, sub[k].r);
		}
		for (int k = 0; k < 2; k++) {
			CHECK(waiter_wait(&w[k], 5000) == 0 && w[k].calls == 1,
			      "gather %u: node %d: status %d, %u calls", t, k, w[k].status,
			      w[k].calls);
			for (size_t i = 0; i < 2 * n; i++) {
				double want =
					1000.0 * (double)(i / n + 1) + (double)(i % n) + 0.25 * t;
				if (out[k][i] != want) {
					CHECK(0,
					      "gather %u: node %d out[%zu] = %g, want %g (node "
					      "%zu's)",
					      t, k, i, out[k][i], want, i / n);
					break;
				}
			}
		}
	}
	/* the staging was sized at open: the gathers allocated nothing (a
	 * cudaMalloc or cudaFree during a step would wait for the device) */
	cudadouble_stats(&s1);
	CHECK(s1.live_allocs == s0.live_allocs, "gathers allocated: %u live allocations, then %u",
	      s0.live_allocs, s1.live_allocs);
	/* node 1 never joins: node 0's gather ends on abort, no hang */
	waiter_init(&w[0]);
	w[0].req = (struct coll_req){.kind = COLL_GATHER,
				     .lane = 1,
				     .gin = in[0],
				     .gout = out[0],
				     .gbytes = 8,
				     .done = waiter_done};
	CHECK(coll_nccl_ops.submit(nodes[0].g, &w[0].req) == 0, "lone gather: submit");
	CHECK(waiter_wait(&w[0], 200) == 1, "a gather without its peer completed: %d", w[0].status);
	coll_nccl_ops.abort(nodes[0].g);
	CHECK(waiter_wait(&w[0], 5000) == -ECANCELED,
	      "lone gather after abort: %d (want "
	      "-ECANCELED)",
	      w[0].status);
	nodes_close(nodes);
	for (int k = 0; k < 2; k++) {
		free(in[k]);
		free(out[k]);
	}
	filestore_free(&store);
	rm_dir(dir);
	check_clean("two nodes gather");
}

/* One node of a job over two processes (cfg.shm_cliques): ranks 2 node and
 * 2 node + 1 here. Reduces, broadcasts and gathers; unless `leave`, when it
 * leaves after the open without a word (a node killed). 0 or why not. */
static int shm_node(uint32_t node, const ncclUniqueId *id, bool leave, char *why, size_t len)
{
	struct cudadouble_config c = {.ndevices = 4,
				      .driver_version = 13000,
				      .inprogress_polls = 2,
				      .jitter_us = 100,
				      .seed = 7 + node,
				      .shm_cliques = true};
	float *grads[4] = {0}, *params[4] = {0}, want[NN];
	struct coll_net net = {.nnodes = 2, .node = node, .node_of = node_of4, .prefix = "shm/"};
	struct coll_config cfg = {.world = 4,
				  .grads = grads,
				  .params = params,
				  .net = &net,
				  .nccl_id = id->internal,
				  .open_timeout_ms = 5000};
	struct coll_range whole = {.owner = 0, .off = 0, .n = NN};
	struct coll_group *g = NULL;
	struct waiter w;
	double in[3], out[6];
	int r;

	cudadouble_reset(&c);
	for (uint32_t k = 2 * node; k < 2 * node + 2; k++) {
		grads[k] = dev_alloc((int)k, NN);
		params[k] = dev_alloc((int)k, NN);
		for (size_t i = 0; i < NN; i++)
			grads[k][i] = (float)(k + 1) * (float)i + 0.1f;
	}
	for (size_t i = 0; i < NN; i++) {
		want[i] = 0;
		for (uint32_t k = 0; k < 4; k++)
			want[i] += (float)(k + 1) * (float)i + 0.1f;
		want[i] /= 4;
	}
	r = coll_nccl_ops.open(&cfg, &g);
	if (r < 0) {
		snprintf(why, len, "node %u: open: %d", node, r);
		return r;
	}
	if (leave)
		_exit(0); /* no close, no abort: as SIGKILL leaves it */
	waiter_init(&w);
	w.req = (struct coll_req){.kind = COLL_REDUCE,
				  .mode = ZC_SHARD_BUCKET,
				  .ranges = &whole,
				  .nranges = 1,
				  .done = waiter_done};
	r = coll_nccl_ops.submit(g, &w.req);
	if (r == 0)
		r = waiter_wait(&w, 10000);
	for (uint32_t k = 2 * node; k < 2 * node + 2 && r == 0; k++)
		if (memcmp(grads[k], want, sizeof(want)) != 0) {
			snprintf(why, len, "node %u: rank %u has not the average of all four", node,
				 k);
			r = 1;
		}
	if (r < 0) {
		snprintf(why, len, "node %u: all-reduce: %d", node, r);
		goto out;
	}
	for (int i = 0; i < 3; i++)
		in[i] = 10.0 * (node + 1) + i;
	waiter_init(&w);
	w.req = (struct coll_req){.kind = COLL_GATHER,
				  .lane = 1,
				  .gin = in,
				  .gout = out,
				  .gbytes = sizeof(in),
				  .done = waiter_done};
	r = coll_nccl_ops.submit(g, &w.req);
	if (r == 0)
		r = waiter_wait(&w, 10000);
	for (int i = 0; i < 6 && r == 0; i++)
		if (out[i] != 10.0 * (i / 3 + 1) + i % 3) {
			snprintf(why, len, "node %u: gathered[%d] = %g", node, i, out[i]);
			r = 1;
		}
	if (r < 0)
		snprintf(why, len, "node %u: gather: %d", node, r);
out:
	coll_nccl_ops.close(g);
	for (uint32_t k = 2 * node; k < 2 * node + 2; k++) {
		cudaFree(grads[k]);
		cudaFree(params[k]);
	}
	if (r == 0) {
		struct cudadouble_stats s;
		cudadouble_stats(&s);
		if (s.violations) {
			snprintf(why, len, "node %u: %u violations, first: %.150s", node,
				 s.violations, s.first_violation);
			r = 1;
		}
	}
	return r;
}

/* Two processes, one job: the double's communicators of one id meet in
 * shared memory, so the bytes really cross between the processes (as two
 * zerod-double daemons do); then a peer process that leaves after the open
 * fails the other's all-reduce with -ECONNRESET (NCCL's remote error), no
 * hang. Both nodes are children of this process, which never initialises
 * CUDA itself (CUDA fails in a child forked after that). */
static void t_two_processes(void)
{
	for (int leave = 0; leave < 2; leave++) {
		ncclUniqueId id;
		char why[256] = "", cwhy[256] = "";
		int st = 0, st0 = 0, r, fds[2];
		pid_t pid, pid0;

		reset(4, 0, 0);
		REQUIRE(ncclGetUniqueId(&id) == ncclSuccess, "id");
		REQUIRE(pipe(fds) == 0, "pipe");
		fflush(stdout);
		pid = fork();
		REQUIRE(pid >= 0, "fork");
		if (pid == 0) {
			r = shm_node(1, &id, leave, cwhy, sizeof(cwhy));
			if (r)
				printf("# %s\n", cwhy);
			fflush(stdout);
			_exit(r ? 1 : 0);
		}
		pid0 = fork();
		REQUIRE(pid0 >= 0, "fork");
		if (pid0 == 0) {
			r = shm_node(0, &id, false, why, sizeof(why));
			if (write(fds[1], &r, sizeof(r)) != sizeof(r) ||
			    write(fds[1], why, sizeof(why)) != sizeof(why))
				_exit(2);
			_exit(0);
		}
		close(fds[1]);
		r = 1;
		if (read(fds[0], &r, sizeof(r)) != sizeof(r) ||
		    read(fds[0], why, sizeof(why)) != sizeof(why))
			snprintf(why, sizeof(why), "node 0 (a child) said nothing");
		why[sizeof(why) - 1] = 0;
		close(fds[0]);
		waitpid(pid0, &st0, 0);
		waitpid(pid, &st, 0);
		if (!leave) {
			CHECK(r == 0, "%s", why);
			CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "node 1 (the child) failed");
		} else {
			CHECK(r == -ECONNRESET,
			      "the survivor's all-reduce: %d (want -ECONNRESET): %s", r, why);
		}
	}
}

/* What open refuses. */
static void t_open_refuses(void)
{
	float *g[2], *p[2];
	struct coll_group *cg = NULL;
	struct coll_config cfg = {.world = 2, .grads = g, .params = p};
	char buf[8];

	reset(2, 1, 0);
	g[0] = dev_alloc(0, 8);
	p[0] = dev_alloc(0, 8);
	g[1] = dev_alloc(0, 8);
	p[1] = dev_alloc(0, 8);
	CHECK(coll_nccl_ops.open(&cfg, &cg) == -EOPNOTSUPP, "two ranks on one GPU");
	cudaFree(g[1]);
	cudaFree(p[1]);
	g[1] = p[1] = NULL;
	CHECK(coll_nccl_ops.open(&cfg, &cg) == -EINVAL, "ranks elsewhere and no unique id");
	g[1] = (float *)buf;
	p[1] = (float *)buf;
	CHECK(coll_nccl_ops.open(&cfg, &cg) == -EINVAL, "host memory");
	cudaFree(g[0]);
	cudaFree(p[0]);
	check_clean("open refuses");
}

/* Node A's collective waits for node B, which never issues it. */
static int stuck(struct node nodes[2], struct waiter *w, struct coll_range *whole)
{
	struct cudadouble_stats s;

	waiter_init(w);
	*whole = (struct coll_range){.owner = 0, .off = 0, .n = NN};
	w->req = (struct coll_req){.kind = COLL_REDUCE,
				   .mode = ZC_SHARD_BUCKET,
				   .ranges = whole,
				   .nranges = 1,
				   .done = waiter_done};
	if (coll_nccl_ops.submit(nodes[0].g, &w->req) != 0)
		return -1;
	for (int i = 0; i < 500; i++) {
		cudadouble_stats(&s);
		if (s.waiting == 2)
			return waiter_wait(w, 0) == 1 ? 0 : -1; /* and not done */
		poll(NULL, 0, 10);
	}
	return -1;
}

static void t_async_error(void)
{
	struct node nodes[2];
	struct coll_range whole;
	struct waiter w, later;
	ncclUniqueId id;
	int r;

	reset(4, 1, 0);
	REQUIRE(ncclGetUniqueId(&id) == ncclSuccess, "id");
	REQUIRE(nodes_open(nodes, &id) == 0, "open");
	CHECK(stuck(nodes, &w, &whole) == 0, "node A's all-reduce waits for node B");
	/* rank 0's network fails: the watchdog must see it and end the wait */
	cudadouble_nccl_fail(0, ncclRemoteError);
	r = waiter_wait(&w, 5000);
	CHECK(r == -ECONNRESET, "done(%d), want -ECONNRESET (a peer failed)", r);
	CHECK(w.calls == 1 && !pthread_equal(w.thread, pthread_self()),
	      "done() once (%u), from the watchdog", w.calls);
	waiter_init(&later);
	later.req = w.req;
	later.req.done = waiter_done;
	r = coll_nccl_ops.submit(nodes[0].g, &later.req);
	CHECK(r == -ECONNRESET && later.calls == 0, "a later submit: %d, %u done()s", r,
	      later.calls);
	nodes_close(nodes); /* B's communicators see A's abort as a remote error */
	check_clean("async error");
}

static void t_abort(void)
{
	struct node nodes[2];
	struct coll_range whole;
	struct waiter w;
	ncclUniqueId id;
	int r;

	reset(4, 1, 50);
	REQUIRE(ncclGetUniqueId(&id) == ncclSuccess, "id");
	REQUIRE(nodes_open(nodes, &id) == 0, "open");
	CHECK(stuck(nodes, &w, &whole) == 0, "node A's all-reduce waits for node B");
	/* done() takes w.mu: an abort that called it here would deadlock, and
	 * one that called it later from this thread is caught below */
	pthread_mutex_lock(&w.mu);
	coll_nccl_ops.abort(nodes[0].g);
	CHECK(w.calls == 0, "abort() returned after calling done()");
	pthread_mutex_unlock(&w.mu);
	r = waiter_wait(&w, 5000);
	CHECK(r == -ECANCELED && w.calls == 1 && !pthread_equal(w.thread, pthread_self()),
	      "done(%d) %u times, from the watchdog", r, w.calls);
	CHECK(coll_nccl_ops.submit(nodes[0].g, &w.req) == -ECANCELED,
	      "requests after abort are refused");
	coll_nccl_ops.abort(nodes[0].g); /* idempotent */
	nodes_close(nodes);
	check_clean("abort");
}

/* ------------------------------------------------- a dead trainer --- */

static atomic_bool trainer_release;

/* On the trainer's stream: a trainer hung (or dead) before its ready event. */
static void trainer_hang(void *arg)
{
	(void)arg;
	while (!atomic_load(&trainer_release))
		usleep(1000);
}

/* A REDUCE behind a trainer's ready event that never completes: it must
 * fail (-ETIMEDOUT after ready_timeout_ms, naming the event; -ECANCELED at
 * once on abort), and close must return at once, not wait on the event. */
static void t_dead_trainer(void)
{
	cudaEvent_t ev[2];
	cudaStream_t ts;
	struct cudabufs cb = {.ring = 1, .nbuckets = 1};
	struct cudabufs *bufs[1] = {&cb};
	uint8_t handles[2 * CUDABUFS_EVENT_BYTES] = {0};
	float *grads[1], *params[1];
	struct coll_range whole = {.owner = 0, .off = 0, .n = NN};
	struct waiter w;
	int64_t t0;
	int r;

	reset(1, 2, 0);
	atomic_store(&trainer_release, false);
	grads[0] = dev_alloc(0, NN);
	params[0] = dev_alloc(0, NN);
	REQUIRE(grads[0] && params[0], "buffers");
	REQUIRE(cudaStreamCreateWithFlags(&ts, cudaStreamNonBlocking) == cudaSuccess, "stream");
	for (int i = 0; i < 2; i++) {
		cudaIpcEventHandle_t h;
		REQUIRE(cudaEventCreateWithFlags(&ev[i], cudaEventInterprocess |
								 cudaEventDisableTiming) ==
				cudaSuccess &&
			cudaIpcGetEventHandle(&h, ev[i]) == cudaSuccess,
			"event %d", i);
		memcpy(handles + i * CUDABUFS_EVENT_BYTES, &h, sizeof(h));
	}
	cb.events = handles;
	/* the trainer's ready event, recorded behind a host function that hangs */
	REQUIRE(cudaLaunchHostFunc(ts, trainer_hang, NULL) == cudaSuccess &&
			cudaEventRecord(ev[0], ts) == cudaSuccess,
		"record");
	for (int pass = 0; pass < 2; pass++) {
		struct coll_config cfg = {.world = 1,
					  .grads = grads,
					  .params = params,
					  .bufs = bufs,
					  .ready_timeout_ms = pass == 0 ? 60000 : 300};
		struct coll_group *g = NULL;

		r = coll_nccl_ops.open(&cfg, &g);
		REQUIRE(r == 0, "open: %d", r);
		waiter_init(&w);
		w.req = (struct coll_req){.kind = COLL_REDUCE,
					  .mode = ZC_SHARD_BUCKET,
					  .ranges = &whole,
					  .nranges = 1,
					  .ev = COLL_EV_WAIT_READY,
					  .done = waiter_done};
		t0 = now_ms();
		/* submit polls the event on the host: from a thread, as a lane */
		struct submitter sub = {.g = g, .req = &w.req};
		pthread_t th;
		pthread_create(&th, NULL, submit_main, &sub);
		if (pass == 0) {
			/* the job's stall timeout passes: the core aborts the group */
			CHECK(waiter_wait(&w, 200) == 1, "done before the trainer's event: %d",
			      w.status);
			coll_nccl_ops.abort(g);
			r = waiter_wait(&w, 2000);
			CHECK(r == -ECANCELED, "abort while waiting for the event: %d", r);
		} else {
			r = waiter_wait(&w, 5000);
			CHECK(r == -ETIMEDOUT && now_ms() - t0 < 3000,
			      "past ready_timeout_ms: %d after %" PRId64 " ms (want -ETIMEDOUT)", r,
			      now_ms() - t0);
			CHECK(strstr(coll_nccl_ops.last_error(g, 0),
				     "rank 0's ready event of bucket 0, iteration 0"),
			      "last_error: \"%s\"", coll_nccl_ops.last_error(g, 0));
		}
		pthread_join(th, NULL);
		CHECK(sub.r == 0, "submit: %d", sub.r);
		t0 = now_ms();
		coll_nccl_ops.close(g);
		CHECK(now_ms() - t0 < 2000, "close took %" PRId64 " ms with the trainer hung",
		      now_ms() - t0);
	}
	atomic_store(&trainer_release, true);
	cudaStreamDestroy(ts);
	cudaEventDestroy(ev[0]);
	cudaEventDestroy(ev[1]);
	cudaFree(grads[0]);
	cudaFree(params[0]);
	check_clean("dead trainer");
}

/* ------------------------------------------------------------- IPC --- */

/* The exporter of t_ipc: a child (CUDA refuses a process its own IPC
 * handles). It allocates `small` (carved from a block, at an offset in it)
 * and `big` (a block of its own) on device 2, fills each with its index
 * (float i at i), sends both handles, frees `small` on the first byte it
 * reads and exits on the second. */
static void ipc_exporter(int tx, int rx, size_t small_n, size_t big_n)
{
	cudaIpcMemHandle_t h[2];
	float *p[2];
	char c;

	reset(3, 0, 0);
	p[0] = dev_alloc(2, small_n);
	p[1] = dev_alloc(2, big_n);
	if (!p[0] || !p[1] || cudaIpcGetMemHandle(&h[0], p[0]) != cudaSuccess ||
	    cudaIpcGetMemHandle(&h[1], p[1]) != cudaSuccess)
		_exit(1);
	for (size_t i = 0; i < small_n; i++)
		p[0][i] = (float)i;
	for (size_t i = 0; i < big_n; i++)
		p[1][i] = (float)i;
	if (write(tx, h, sizeof(h)) != sizeof(h) || read(rx, &c, 1) != 1)
		_exit(1);
	cudaFree(p[0]);
	if (write(tx, &c, 1) != 1 || read(rx, &c, 1) != 1)
		_exit(1);
	_exit(0);
}

/* Maps the exporter's allocation (handle h) at off: 0 and the pointer, or
 * the map's code with err. */
static int ipc_map(const cudaIpcMemHandle_t *h, uint64_t off, uint64_t bytes,
		   struct mem_map **ret, char *err, size_t len)
{
	struct mem_desc d = {.kind = MEM_CUDA_IPC, .bytes = bytes, .owner = 0};

	memcpy(d.cuda.handle, h, sizeof(*h));
	d.cuda.offset = off;
	cudadouble_uuid(2, d.cuda.uuid);
	return mem_cuda_ops.map(&d, bytes, ret, err, len);
}

static void t_ipc(void)
{
	const size_t small_n = 2048, big_n = (3u << 20) / sizeof(float); /* 8 KiB, 3 MiB */
	const uint64_t bytes = 1000 * sizeof(float);
	struct mem_desc d = {.kind = MEM_CUDA_IPC, .bytes = bytes, .owner = 0};
	struct mem_map *m = NULL;
	cudaIpcMemHandle_t h[2];
	struct cudadouble_stats s;
	int up[2], down[2], st = 0, r;
	char err[256], c = 'x';
	float *f;
	pid_t pid;

	REQUIRE(pipe(up) == 0 && pipe(down) == 0, "pipes");
	fflush(stdout);
	pid = fork();
	REQUIRE(pid >= 0, "fork");
	if (pid == 0)
		ipc_exporter(up[1], down[0], small_n, big_n);
	REQUIRE(read(up[0], h, sizeof(h)) == sizeof(h), "the exporter's handles");
	reset(3, 0, 0);

	/* a small allocation: the handle shares its whole block, the buffer
	 * is at an offset into the allocation */
	r = ipc_map(&h[0], 4096, bytes, &m, err, sizeof(err));
	CHECK(r == 0, "map of a small allocation (inside a larger block): %d %s", r, err);
	if (r == 0) {
		f = mem_cuda_ops.ptr(m);
		CHECK(f[0] == 1024.0f && f[999] == 2023.0f,
		      "base + offset reads the exporter's floats 1024.. (%g, %g)", f[0], f[999]);
		mem_cuda_ops.unmap(m);
	}
	/* a large one: its own block */
	r = ipc_map(&h[1], 4096, bytes, &m, err, sizeof(err));
	REQUIRE(r == 0, "map: %d %s", r, err);
	f = mem_cuda_ops.ptr(m);
	CHECK(f[0] == 1024.0f && f[999] == 2023.0f, "base + offset: %g, %g", f[0], f[999]);
	cudadouble_stats(&s);
	CHECK(s.ipc_open == 1, "%u handles open", s.ipc_open);
	mem_cuda_ops.unmap(m);
	cudadouble_stats(&s);
	CHECK(s.ipc_open == 0, "unmap closes the handle (%u open)", s.ipc_open);
	CHECK(mem_cuda_ops.blocking && !mem_shm_ops.blocking, "cuda maps off the loop thread");

	/* refusals: each names what is wrong */
	r = ipc_map(&h[1], (4u << 20) - bytes + sizeof(float), bytes, &m, err, sizeof(err));
	CHECK(r == ZC_ESIZE && strstr(err, "do not fit"), "past the block: %d %s", r, err);
	r = ipc_map(&h[1], 6, bytes, &m, err, sizeof(err));
	CHECK(r == ZC_EMAP && strstr(err, "aligned"), "odd offset: %d %s", r, err);
	memcpy(d.cuda.handle, &h[1], sizeof(h[1]));
	r = mem_cuda_ops.map(&d, bytes + 4, &m, err, sizeof(err));
	CHECK(r == ZC_ESIZE, "the plan's size differs: %d %s", r, err);
	cudadouble_uuid(2, d.cuda.uuid);
	d.cuda.uuid[0] ^= 1;
	r = mem_cuda_ops.map(&d, bytes, &m, err, sizeof(err));
	CHECK(r == ZC_EMAP && strstr(err, "GPU-") && strstr(err, "no such device"),
	      "unknown UUID: %d %s", r, err);
	d.cuda.uuid[0] ^= 1;
	d.kind = MEM_SHM;
	r = mem_cuda_ops.map(&d, bytes, &m, err, sizeof(err));
	CHECK(r == ZC_EMAP && strstr(err, "not a CUDA buffer"), "shm kind: %d %s", r, err);
	d.kind = MEM_CUDA_IPC;
	d.shm_name = "/zerod.x";
	r = mem_shm_ops.map(&d, bytes, &m, err, sizeof(err));
	CHECK(r == ZC_EMAP && strstr(err, "not a shared memory buffer"), "shm: cuda kind: %d %s", r,
	      err);
	/* the exporter frees the small allocation: its block (alone in it) goes */
	REQUIRE(write(down[1], &c, 1) == 1 && read(up[0], &c, 1) == 1, "the exporter's free");
	r = ipc_map(&h[0], 0, bytes, &m, err, sizeof(err));
	CHECK(r == ZC_EMAP && strstr(err, "cannot open the CUDA IPC handle"),
	      "a freed allocation: %d %s", r, err);
	REQUIRE(write(down[1], &c, 1) == 1, "the exporter's exit");
	waitpid(pid, &st, 0);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the exporter failed (%#x)", st);
	check_clean("ipc");
}

static const struct test_case cases[] = {
	{"probe_and_backend_choice", t_probe},
	{"kernels_match_cpu_bit_for_bit", t_kernels},
	{"kernels_refuse", t_kernels_refuse},
	{"no_device_alloc_while_running", t_no_alloc_while_running},
	{"jobs_through_executor_match_host", t_jobs_match_host},
	{"lowp_jobs_match_host", t_lowp_jobs_match_host},
	{"clip_found_inf_masks_match_host", t_clip_found_inf_match_host},
	{"state_round_trip", t_state_round_trip},
	{"two_nodes_one_id_every_collective", t_two_nodes},
	{"two_nodes_id_through_the_store", t_two_nodes_store},
	{"two_nodes_gather", t_two_nodes_gather},
	{"two_processes_shared_cliques", t_two_processes},
	{"open_refuses", t_open_refuses},
	{"async_error_ends_stuck_collective", t_async_error},
	{"abort_ends_stuck_collective", t_abort},
	{"dead_trainer_fails_request_close_returns", t_dead_trainer},
	{"ipc_buffers", t_ipc},
};

TEST_MAIN(cases)
