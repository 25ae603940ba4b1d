/*
 * test_gpu.c — the CUDA backend on real GPUs (suite gpu; tests/gpu/run builds
 * and runs it where a GPU is). Without a usable device it says why and
 * exits 77, so meson counts it skipped.
 *  - kernels: every optimizer and flag combination through optim_cuda_ops,
 *    bit for bit against the CPU kernels (nvcc -fmad=false, IEEE division
 *    and sqrtf: optim.h's rounding contract);
 *  - bf16/fp16 masters (load, step, narrow), the at_end passes (unscale
 *    with a non-finite check, the norms in gradelem.h's order, clipping)
 *    through optim_cuda_ops, bit for bit against the CPU's code;
 *  - bandwidth: the Adam kernel against a device-to-device copy of the same
 *    run, in bytes moved per second (issue 9's target: 80 %);
 *  - a job of W = min(GPUs, 4) ranks, one per GPU, through the executor with
 *    NCCL and the kernels, against the host backend on the same data: bit
 *    for bit at W = 1, to rounding above (ncclAvg sums in its own order),
 *    and the hand-off latency from a bucket's exec_bucket_ex to its BucketDone;
 *  - IPC: a child process plays the trainer, allocates device memory and
 *    exports its handle; mem_cuda_ops opens it by UUID at an offset and
 *    writes through it, and the child reads the writes back.
 * This process never initialises CUDA: the probe runs in a child that
 * exits, as every case does (CUDA fails in a child forked after its parent
 * initialised it), and each pageable copy to the device and each cudaMemset
 * is followed by a device synchronisation before anything depends on it.
 * The trainers' CUDA buffers and event rings through a real zerod:
 * test_gpujob.c. Not yet: the parity run against PyTorch's
 * ZeroRedundancyOptimizer (the Python package registers host buffers).
 */
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "exec/backend.h"
#include "common.h"
#include "exec/exec.h"
#include "exec/gradpass.h"
#include "mem/mem.h"
#include "optim/kern.h"
#include "base/pool.h"
#include "testlib.h"
#include "zctest.h"

extern char **environ;

static struct pool *pool_;
static int ndev_;
static uint64_t rng_state;

static float rng_float(float lo, float hi)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	z ^= z >> 31;
	return lo + (hi - lo) * (float)((double)(z >> 11) * 0x1p-53);
}

#define CU(call)                                                                                   \
	do {                                                                                       \
		cudaError_t e_ = (call);                                                           \
		REQUIRE(e_ == cudaSuccess, "%s: %s", #call, cudaGetErrorString(e_));               \
	} while (0)

static int64_t now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static float *dev_alloc(int dev, size_t n)
{
	void *p = NULL;

	if (cudaSetDevice(dev) != cudaSuccess || cudaMalloc(&p, n * sizeof(float)) != cudaSuccess)
		return NULL;
	return p;
}

static size_t first_diff(const float *a, const float *b, size_t n)
{
	size_t i = 0;

	while (i < n && memcmp(&a[i], &b[i], sizeof(float)) == 0)
		i++;
	return i;
}

/* A pageable cudaMemcpy to the device returns once the bytes are staged;
 * the DMA may land after it, unordered with the backend's non-blocking
 * streams: wait for the device before they read it. */
static cudaError_t h2d(void *dst, const void *src, size_t bytes)
{
	cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice);

	return e == cudaSuccess ? cudaDeviceSynchronize() : e;
}

/* ------------------------------------------------------------ kernels --- */

#define KN 100003

static void kernels_case(enum zc_optimizer kind, const struct zc_param_group g[2], const char *tag)
{
	unsigned arrays = plan_state_arrays(kind, g, 2);
	const struct optim_piece pieces[3] = {
		{.group = 0, .owner = 0, .off = 0, .n = 40000, .at = 0},
		{.group = 1, .owner = 0, .off = 40000, .n = 3, .at = 40000},
		{.group = 0, .owner = 0, .off = 40003, .n = KN - 40003, .at = 40003},
	};
	struct optim_piece pc[3];
	float *hp = malloc(KN * sizeof(float)), *hg = malloc(KN * sizeof(float));
	float *got = malloc(KN * sizeof(float)), *arena[3], *ref[3];
	float *dp = dev_alloc(0, KN), *dg = dev_alloc(0, KN);
	uint32_t local = 0;
	struct optim_ctx *ctx = NULL;

	for (int k = 0; k < 3; k++) {
		unsigned bit = k == 0 ? PLAN_STATE_M : k == 1 ? PLAN_STATE_V : PLAN_STATE_VMAX;
		arena[k] = arrays & bit ? calloc(KN, sizeof(float)) : NULL;
		ref[k] = calloc(KN, sizeof(float));
	}
	REQUIRE(hp && hg && got && dp && dg, "%s: memory", tag);
	for (size_t i = 0; i < KN; i++)
		hp[i] = rng_float(-2, 2);
	CU(h2d(dp, hp, KN * sizeof(float)));
	struct optim_config cfg = {
		.world = 1, .grads = &dg, .params = &dp, .nlocal = 1, .local = &local};
	REQUIRE(optim_cuda_ops.open(&cfg, &ctx) == 0, "%s: open", tag);
	memcpy(pc, pieces, sizeof(pc));
	REQUIRE(optim_cuda_ops.state_alloc(ctx, pc, 3, arrays) == 0, "%s: state_alloc", tag);
	for (uint64_t t = 1; t <= 3 && !test_failed_; t++) {
		for (size_t i = 0; i < KN; i++)
			hg[i] = rng_float(-3, 3);
		CU(h2d(dg, hg, KN * sizeof(float)));
		for (int k = 0; k < 3; k++) {
			pc[k].step = t;
			pc[k].first_momentum = t == 1;
		}
		struct optim_call call = {.kind = kind,
					  .groups = g,
					  .pieces = pc,
					  .npieces = 3,
					  .grad = OPTIM_GRAD_OWNER,
					  .m = arena[0],
					  .v = arena[1],
					  .vmax = arena[2]};
		CHECK(optim_cuda_ops.run(ctx, &call) == 0, "%s: run", tag);
		for (int k = 0; k < 3; k++) {
			struct optim_args a = {.kind = kind,
					       .hp = &g[pc[k].group],
					       .step = t,
					       .first_momentum = t == 1,
					       .param = hp + pc[k].off,
					       .grad = hg + pc[k].off,
					       .m = ref[0] + pc[k].at,
					       .v = ref[1] + pc[k].at,
					       .vmax = ref[2] + pc[k].at,
					       .n = pc[k].n};
			optim_cpu_ops.step(&a);
		}
		CU(cudaMemcpy(got, dp, KN * sizeof(float), cudaMemcpyDeviceToHost));
		size_t i = first_diff(got, hp, KN);
		CHECK(i == KN, "%s: step %lu: param[%zu] = %a on the GPU, %a on the CPU", tag,
		      (unsigned long)t, i, i < KN ? got[i] : 0, i < KN ? hp[i] : 0);
	}
	/* the state on the device is the CPU's too */
	for (int k = 0; k < 3 && !test_failed_; k++)
		for (int q = 0; arena[k] && q < 3; q++) {
			REQUIRE(optim_cuda_ops.state_io(ctx, &pc[q], (unsigned)k, got, false) == 0,
				"%s: state_io", tag);
			size_t i = first_diff(got, ref[k] + pc[q].at, pc[q].n);
			CHECK(i == pc[q].n, "%s: state array %d of piece %d differs at %zu", tag, k,
			      q, i);
		}
	optim_cuda_ops.close(ctx);
	cudaFree(dp);
	cudaFree(dg);
	for (int k = 0; k < 3; k++) {
		free(arena[k]);
		free(ref[k]);
	}
	free(hp);
	free(hg);
	free(got);
}

static void t_kernels(void)
{
	char tag[64];
	unsigned n = 0;

	rng_state = 0x6a11;
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
		snprintf(tag, sizeof(tag), "sgd %d", combo);
		kernels_case(ZC_OPT_SGD, g, tag);
		snprintf(tag, sizeof(tag), "adam %d", combo);
		kernels_case(ZC_OPT_ADAM, g, tag);
		snprintf(tag, sizeof(tag), "adamw %d", combo);
		kernels_case(ZC_OPT_ADAMW, g, tag);
		n += 3;
	}
	test_note("%u optimizer cases on the GPU, bit for bit with the CPU", n);
}

/* ------------------------------------------ bf16/fp16, norms, clipping --- */

/* bf16 or fp16 parameters with fp32 masters on the GPU (kern.h's element
 * bodies under nvcc) against the CPU's order of operations (optim/cpu.c's
 * run_chunk_lowp: widen the gradient, step the master, narrow it), then the
 * at_end passes (optim_cuda_ops.measure and .clip against gradpass.c): the
 * same bits for parameters, masters, moments, gradients and norms. */
static void lowp_case(enum zc_dtype dt, enum zc_optimizer kind, const char *tag)
{
	struct zc_param_group g[2] = {ZC_PARAM_GROUP_INIT, ZC_PARAM_GROUP_INIT};
	const struct optim_piece pieces[3] = {
		{.group = 0, .owner = 0, .off = 0, .n = 40000, .at = 0, .dtype = dt, .mat = 0},
		{.group = 1,
		 .owner = 0,
		 .off = 40000,
		 .n = 3,
		 .at = 40000,
		 .dtype = dt,
		 .mat = 40000},
		{.group = 0,
		 .owner = 0,
		 .off = 40003,
		 .n = KN - 40003,
		 .at = 40003,
		 .dtype = dt,
		 .mat = 40003},
	};
	struct optim_piece pc[3];
	size_t hb = (KN + 1) / 2 + 1; /* floats holding KN 16-bit values */
	uint16_t *hp = calloc(hb, sizeof(float)), *hg = calloc(hb, sizeof(float));
	uint16_t *got16 = calloc(hb, sizeof(float));
	float *master = malloc(KN * sizeof(float)), *wg = malloc(KN * sizeof(float));
	float *got = malloc(KN * sizeof(float)), *ref[3];
	float *dp = dev_alloc(0, hb), *dg = dev_alloc(0, hb);
	uint32_t local = 0;
	struct optim_ctx *ctx = NULL;
	unsigned arrays;

	g[0].lr = 0.01;
	g[0].momentum = 0.9;
	g[0].weight_decay = 0.01;
	g[1].lr = 0.003;
	g[1].amsgrad = true;
	arrays = plan_state_arrays(kind, g, 2);
	for (int k = 0; k < 3; k++)
		ref[k] = calloc(KN, sizeof(float));
	REQUIRE(hp && hg && got16 && master && wg && got && dp && dg, "%s: memory", tag);
	for (size_t i = 0; i < KN; i++) {
		hp[i] = lowp_narrow(rng_float(-2, 2), dt);
		master[i] = lowp_get(hp, i, dt);
	}
	CU(h2d(dp, hp, hb * sizeof(float)));
	struct optim_config cfg = {
		.world = 1, .grads = &dg, .params = &dp, .nlocal = 1, .local = &local};
	REQUIRE(optim_cuda_ops.open(&cfg, &ctx) == 0, "%s: open", tag);
	memcpy(pc, pieces, sizeof(pc));
	REQUIRE(optim_cuda_ops.state_alloc(ctx, pc, 3, arrays) == 0 &&
			optim_cuda_ops.masters(ctx, pc, 3, OPTIM_MASTER_LOAD) == 0,
		"%s: state_alloc, masters", tag);
	for (uint64_t t = 1; t <= 3 && !test_failed_; t++) {
		for (size_t i = 0; i < KN; i++)
			hg[i] = lowp_narrow(rng_float(-3, 3), dt);
		CU(h2d(dg, hg, hb * sizeof(float)));
		for (int k = 0; k < 3; k++) {
			pc[k].step = t;
			pc[k].first_momentum = t == 1;
		}
		struct optim_call call = {.kind = kind,
					  .groups = g,
					  .pieces = pc,
					  .npieces = 3,
					  .grad = OPTIM_GRAD_OWNER};
		CHECK(optim_cuda_ops.run(ctx, &call) == 0, "%s: run", tag);
		for (size_t i = 0; i < KN; i++)
			wg[i] = lowp_get(hg, i, dt);
		for (int k = 0; k < 3; k++) {
			struct optim_args a = {.kind = kind,
					       .hp = &g[pc[k].group],
					       .step = t,
					       .first_momentum = t == 1,
					       .param = master + pc[k].mat,
					       .grad = wg + pc[k].off,
					       .m = ref[0] + pc[k].at,
					       .v = ref[1] + pc[k].at,
					       .vmax = ref[2] + pc[k].at,
					       .n = pc[k].n};
			optim_cpu_ops.step(&a);
		}
		for (size_t i = 0; i < KN; i++)
			hp[i] = lowp_narrow(master[i], dt);
		CU(cudaMemcpy(got16, dp, hb * sizeof(float), cudaMemcpyDeviceToHost));
		CHECK(memcmp(got16, hp, KN * sizeof(uint16_t)) == 0, "%s: step %lu: parameters",
		      tag, (unsigned long)t);
	}
	for (int q = 0; q < 3 && !test_failed_; q++) {
		REQUIRE(optim_cuda_ops.state_io(ctx, &pc[q], OPTIM_ARRAY_MASTER, got, false) == 0,
			"%s: state_io", tag);
		size_t i = first_diff(got, master + pc[q].mat, pc[q].n);
		CHECK(i == pc[q].n, "%s: master of piece %d differs at %zu", tag, q, i);
	}
	/* unscale by 0.5 with a non-finite element, the norms, then clip */
	{
		double hs[2] = {0, 0}, ds[2] = {0, 0}, hbad = 0, dbad = 0;
		const float coef[2] = {0.25f, 1.0f};
		void *hgp = hg;

		hg[12345] = lowp_narrow(INFINITY, dt);
		CU(h2d(dg, hg, hb * sizeof(float)));
		CHECK(gradpass_measure(pool_, (float *const *)&hgp, pc, 3, true, 0.5f, hs, &hbad) ==
				      0 &&
			      optim_cuda_ops.measure(ctx, pc, 3, true, 0.5f, ds, &dbad) == 0,
		      "%s: measure", tag);
		CHECK(memcmp(hs, ds, sizeof(hs)) == 0 && hbad == dbad && hbad == 1,
		      "%s: norms %a %a, %g non-finite on the CPU; %a %a, %g on the GPU", tag, hs[0],
		      hs[1], hbad, ds[0], ds[1], dbad);
		hg[12345] = 0;
		CU(h2d(dg, hg, hb * sizeof(float)));
		CHECK(gradpass_clip(pool_, (float *const *)&hgp, pc, 3, coef) == 0 &&
			      optim_cuda_ops.clip(ctx, pc, 3, coef) == 0,
		      "%s: clip", tag);
		CU(cudaMemcpy(got16, dg, hb * sizeof(float), cudaMemcpyDeviceToHost));
		CHECK(memcmp(got16, hg, KN * sizeof(uint16_t)) == 0, "%s: clipped gradients", tag);
	}
	optim_cuda_ops.close(ctx);
	cudaFree(dp);
	cudaFree(dg);
	for (int k = 0; k < 3; k++)
		free(ref[k]);
	free(hp);
	free(hg);
	free(got16);
	free(master);
	free(wg);
	free(got);
}

static void t_lowp_and_norms(void)
{
	static const enum zc_optimizer opts[] = {ZC_OPT_SGD, ZC_OPT_ADAM, ZC_OPT_ADAMW};
	char tag[64];

	rng_state = 0x10f9;
	for (int d = 0; d < 2 && !test_failed_; d++)
		for (int o = 0; o < 3 && !test_failed_; o++) {
			enum zc_dtype dt = d ? ZC_DTYPE_F16 : ZC_DTYPE_BF16;
			snprintf(tag, sizeof(tag), "%s %s", plan_dtype_name(dt),
				 plan_optimizer_name(opts[o]));
			lowp_case(dt, opts[o], tag);
		}
	test_note("bf16 and fp16 masters, unscale, norms and clipping on the GPU, bit for bit "
		  "with the CPU");
}

/* ---------------------------------------------------------- bandwidth --- */

static void t_bandwidth(void)
{
	const size_t n = (size_t)1 << 26; /* 256 MiB per array */
	const int reps = 20;
	struct zc_param_group hp = ZC_PARAM_GROUP_INIT;
	float *a[5], copy_ms, adam_ms;
	cudaEvent_t e0, e1;
	cudaStream_t s;

	CU(cudaSetDevice(0));
	for (int k = 0; k < 5; k++) {
		REQUIRE((a[k] = dev_alloc(0, n)), "memory");
		CU(cudaMemset(a[k], 0, n * sizeof(float)));
	}
	CU(cudaDeviceSynchronize()); /* cudaMemset is asynchronous */
	CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	CU(cudaEventCreate(&e0));
	CU(cudaEventCreate(&e1));
	struct optim_kern k = {.kind = ZC_OPT_ADAM,
			       .adam = optim_adam_setup(&hp, 1, false),
			       .p = a[0],
			       .g = a[1],
			       .m = a[2],
			       .v = a[3],
			       .n = n};
	/* warm both up, then the best of 3 rounds of each, interleaved, so a
	 * moment of noise on the device costs neither */
	for (int r = 0; r < 3; r++) {
		CU(cudaMemcpyAsync(a[4], a[0], n * sizeof(float), cudaMemcpyDeviceToDevice, s));
		CU(optim_cuda_launch(&k, s));
	}
	CU(cudaStreamSynchronize(s));
	copy_ms = adam_ms = 1e30f;
	for (int round = 0; round < 3; round++) {
		float ms;

		CU(cudaEventRecord(e0, s));
		for (int r = 0; r < reps; r++)
			CU(cudaMemcpyAsync(a[4], a[0], n * sizeof(float), cudaMemcpyDeviceToDevice,
					   s));
		CU(cudaEventRecord(e1, s));
		CU(cudaEventSynchronize(e1));
		CU(cudaEventElapsedTime(&ms, e0, e1));
		copy_ms = ms < copy_ms ? ms : copy_ms;
		CU(cudaEventRecord(e0, s));
		for (int r = 0; r < reps; r++)
			CU(optim_cuda_launch(&k, s));
		CU(cudaEventRecord(e1, s));
		CU(cudaEventSynchronize(e1));
		CU(cudaEventElapsedTime(&ms, e0, e1));
		adam_ms = ms < adam_ms ? ms : adam_ms;
	}
	/* bytes moved: a copy reads and writes each byte; Adam reads p, g, m,
	 * v and writes p, m, v */
	double copy_gbs = 2.0 * n * sizeof(float) * reps / (copy_ms * 1e6);
	double adam_gbs = 7.0 * n * sizeof(float) * reps / (adam_ms * 1e6);
	test_note("device copy %.0f GB/s, Adam %.0f GB/s (%.0f %% of copy), %zu elements, "
		  "%.2f ms per step",
		  copy_gbs, adam_gbs, 100 * adam_gbs / copy_gbs, n, adam_ms / reps);
	CHECK(adam_gbs >= 0.8 * copy_gbs, "Adam at %.0f %% of the copy bandwidth, below 80 %%",
	      100 * adam_gbs / copy_gbs);
	cudaEventDestroy(e0);
	cudaEventDestroy(e1);
	cudaStreamDestroy(s);
	for (int i = 0; i < 5; i++)
		cudaFree(a[i]);
}

/* --------------------------------------------------------------- jobs --- */

static struct plan *make_plan(enum zc_shard_mode shard)
{
	static const uint64_t sizes[] = {1 << 20, 37, 120000, 5, 1 << 18};
	struct zc_param_group g[2] = {ZC_PARAM_GROUP_INIT, ZC_PARAM_GROUP_INIT};
	struct zc_segment seg[ARRAY_SIZE(sizes)][2];
	struct zc_bucket b[ARRAY_SIZE(sizes)];
	struct zc_plan zp =
		PLAN(ZC_OPT_ADAMW, shard, ZC_STEP_INTERLEAVED, 2, g, ARRAY_SIZE(sizes), b);
	struct plan *p = NULL;
	char err[200];

	g[0].lr = 0.01;
	g[0].weight_decay = 0.05;
	g[1].lr = 0.003;
	g[1].amsgrad = true;
	for (size_t i = 0; i < ARRAY_SIZE(sizes); i++) {
		uint64_t half = sizes[i] / 2;
		seg[i][0] = (struct zc_segment)SEG(0, half ? half : sizes[i], 0);
		seg[i][1] = (struct zc_segment)SEG(half, sizes[i] - half, 1);
		b[i] = (struct zc_bucket)BUCKET(sizes[i], half ? 2 : 1, seg[i]);
	}
	if (plan_from_zc(&zp, &p, err, sizeof(err)) < 0)
		test_note("plan_from_zc: %s", err);
	return p;
}

static struct exec_done *next_done(struct completion_queue *cq, struct exec_done **pending)
{
	if (!*pending) {
		struct pollfd pfd = {.fd = completion_queue_fd(cq), .events = POLLIN};
		if (poll(&pfd, 1, 20000) <= 0)
			return NULL;
		*pending = completion_queue_take(cq);
	}
	struct exec_done *d = *pending;
	if (d)
		*pending = d->next;
	return d;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* One job of w ranks (on GPUs 0..w-1, or host memory); buckets are handed
 * over one at a time, each after the previous one's BucketDone, so the
 * latency of each hand-off is measured (median in *lat_us). */
static void run_job(const struct plan *p, uint32_t w, bool cuda, float *const *init, unsigned iters,
		    float **out, double *lat_us)
{
	uint32_t node_of[4] = {0};
	struct zero_topo topo = {.world = w, .nnodes = 1, .node = 0, .node_of = node_of};
	struct zero_caps caps = {.local_fuse = !cuda};
	size_t n = p->total_numel, bytes = n * sizeof(float);
	float *grads[4] = {NULL}, *params[4] = {NULL}, *hg = malloc(bytes);
	uint64_t *lat = calloc((size_t)iters * p->nbuckets, sizeof(*lat));
	struct shard_map *sm = NULL;
	struct completion_queue *cq = NULL;
	struct zero_program prog = {0};
	struct exec_done *pending = NULL, *d;
	struct exec *e = NULL;
	struct state *stt = NULL;
	unsigned nlat = 0;

	REQUIRE(hg && lat, "memory");
	for (uint32_t r = 0; r < w; r++) {
		grads[r] = cuda ? dev_alloc((int)r, n) : malloc(bytes);
		params[r] = cuda ? dev_alloc((int)r, n) : malloc(bytes);
		REQUIRE(grads[r] && params[r], "buffers");
		if (cuda)
			CU(h2d(params[r], init[r], bytes));
		else
			memcpy(params[r], init[r], bytes);
	}
	REQUIRE(shard_assign(p, w, &sm) == 0 && completion_queue_new(&cq) == 0 &&
			zero_program(p, &topo, &caps, &prog) == 0 &&
			state_layout(p, sm, &topo,
				     plan_state_arrays(p->optimizer, p->groups, p->ngroups),
				     &stt) == 0,
		"setup");
	struct exec_config ec = {.plan = p,
				 .shard = sm,
				 .prog = &prog,
				 .state = stt,
				 .world = w,
				 .grads = grads,
				 .params = params,
				 .coll = cuda ? &coll_nccl_ops : &coll_host_ops,
				 .optim = cuda ? &optim_cuda_ops : &optim_cpu_ops,
				 .pool = pool_,
				 .cq = cq};
	REQUIRE(exec_new(&ec, &e) == 0, "exec_new");
	d = next_done(cq, &pending);
	CHECK(d && d->ev == EXEC_STARTED, "started: %d %s", d ? d->status : 0,
	      d ? zc_strerror(d->status) : "timeout");
	free(d);
	for (unsigned t = 0; t < iters && !test_failed_; t++) {
		for (uint32_t r = 0; r < w; r++) {
			rng_state = 1000 * t + r;
			for (size_t i = 0; i < n; i++)
				hg[i] = rng_float(-1, 1);
			if (cuda)
				CU(h2d(grads[r], hg, bytes));
			else
				memcpy(grads[r], hg, bytes);
		}
		for (uint32_t b = 0; b < p->nbuckets && !test_failed_; b++) {
			int64_t t0 = now_us();
			CHECK(exec_bucket_ex(e, t, b, NULL) == 0, "exec_bucket");
			d = next_done(cq, &pending);
			CHECK(d && d->ev == EXEC_BUCKET_DONE && d->bucket == b,
			      "iteration %u bucket %u: event %d status %d", t, b,
			      d ? (int)d->ev : -1, d ? d->status : 0);
			lat[nlat++] = (uint64_t)(now_us() - t0);
			free(d);
		}
		d = next_done(cq, &pending);
		CHECK(d && d->ev == EXEC_STEP_DONE, "iteration %u: no StepDone", t);
		free(d);
	}
	exec_stop(e);
	while ((d = next_done(cq, &pending))) {
		bool stopped = d->ev == EXEC_STOPPED;
		free(d);
		if (stopped)
			break;
	}
	exec_free(e);
	for (uint32_t r = 0; r < w; r++) {
		if (cuda) {
			CU(cudaMemcpy(out[r], params[r], bytes, cudaMemcpyDeviceToHost));
			cudaFree(grads[r]);
			cudaFree(params[r]);
		} else {
			memcpy(out[r], params[r], bytes);
			free(grads[r]);
			free(params[r]);
		}
	}
	qsort(lat, nlat, sizeof(*lat), cmp_u64);
	*lat_us = nlat ? (double)lat[nlat / 2] : 0;
	free(lat);
	free(hg);
	zero_program_clear(&prog);
	completion_queue_free(cq);
	shard_map_free(sm);
}

static void t_job(void)
{
	uint32_t w = ndev_ < 4 ? (uint32_t)ndev_ : 4;

	for (int sh = 0; sh < 2 && !test_failed_; sh++) {
		struct plan *p = make_plan(sh ? ZC_SHARD_SLICE : ZC_SHARD_BUCKET);
		float *init[4], *host[4], *gpu[4];
		double host_us, gpu_us, worst = 0;

		REQUIRE(p, "plan");
		rng_state = 99;
		for (uint32_t r = 0; r < w; r++) {
			init[r] = malloc(p->total_numel * sizeof(float));
			host[r] = malloc(p->total_numel * sizeof(float));
			gpu[r] = malloc(p->total_numel * sizeof(float));
			for (size_t i = 0; i < p->total_numel; i++)
				init[r][i] = rng_float(-1, 1);
		}
		run_job(p, w, false, init, 5, host, &host_us);
		run_job(p, w, true, init, 5, gpu, &gpu_us);
		for (uint32_t r = 0; r < w && !test_failed_; r++) {
			if (w == 1) {
				size_t i = first_diff(gpu[r], host[r], p->total_numel);
				CHECK(i == p->total_numel, "w1: param[%zu]: gpu %a, host %a", i,
				      gpu[r][i], host[r][i]);
			}
			for (size_t i = 0; i < p->total_numel; i++)
				worst = fmax(worst, fabs((double)gpu[r][i] - host[r][i]) /
							    (1e-5 + fabs((double)host[r][i])));
		}
		CHECK(worst < 1e-4, "relative difference %g from the host backend", worst);
		test_note("%s mode, %u rank%s, %llu elements: BucketDone %.0f us after the bucket "
			  "(median; host backend %.0f us), largest relative difference %.2g",
			  sh ? "slice" : "bucket", w, w == 1 ? "" : "s",
			  (unsigned long long)p->total_numel, gpu_us, host_us, worst);
		for (uint32_t r = 0; r < w; r++) {
			free(init[r]);
			free(host[r]);
			free(gpu[r]);
		}
		plan_free(p);
	}
}

/* ---------------------------------------------------------------- IPC --- */

struct ipc_msg {
	uint8_t handle[MEM_CUDA_HANDLE_BYTES];
	uint8_t uuid[MEM_CUDA_UUID_BYTES];
	uint64_t offset;
};

#define IPC_N 4096

/* The trainer: export a buffer, wait, check what the daemon wrote. */
static int ipc_child(void)
{
	struct cudaDeviceProp prop;
	cudaIpcMemHandle_t h;
	struct ipc_msg msg = {.offset = 1024};
	float *base, got[IPC_N];
	char c;

	/* 2 MiB: IPC shares a cudaMalloc's whole underlying block, and a small
	 * allocation may be carved out of a larger one (zeroclient.h) */
	/* cudaMemset is asynchronous: done before the daemon writes */
	if (cudaSetDevice(0) != cudaSuccess || cudaMalloc((void **)&base, 2 << 20) ||
	    cudaMemset(base, 0, 2 * IPC_N * 4) || cudaDeviceSynchronize() ||
	    cudaIpcGetMemHandle(&h, base) || cudaGetDeviceProperties(&prop, 0))
		return 2;
	memcpy(msg.handle, &h, sizeof(h));
	memcpy(msg.uuid, prop.uuid.bytes, sizeof(msg.uuid));
	if (write(1, &msg, sizeof(msg)) != sizeof(msg) || read(0, &c, 1) != 1)
		return 3;
	if (cudaMemcpy(got, (char *)base + msg.offset, sizeof(got), cudaMemcpyDeviceToHost))
		return 4;
	for (int i = 0; i < IPC_N; i++)
		if (got[i] != (float)i)
			return 5;
	return 0;
}

static void t_ipc(void)
{
	int to[2], from[2], status = -1;
	char *argv[] = {"test-gpu", "--ipc-child", NULL}, err[256];
	posix_spawn_file_actions_t fa;
	struct mem_desc d = {.kind = MEM_CUDA_IPC, .bytes = IPC_N * 4};
	struct mem_map *m = NULL;
	struct ipc_msg msg;
	float src[IPC_N];
	pid_t pid;
	int r;

	REQUIRE(pipe(to) == 0 && pipe(from) == 0, "pipes");
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, to[0], 0);
	posix_spawn_file_actions_adddup2(&fa, from[1], 1);
	REQUIRE(posix_spawn(&pid, "/proc/self/exe", &fa, NULL, argv, environ) == 0, "spawn");
	close(to[0]);
	close(from[1]);
	REQUIRE(read(from[0], &msg, sizeof(msg)) == sizeof(msg), "the child's handle");
	memcpy(d.cuda.handle, msg.handle, sizeof(msg.handle));
	memcpy(d.cuda.uuid, msg.uuid, sizeof(msg.uuid));
	d.cuda.offset = msg.offset;
	r = mem_cuda_ops.map(&d, IPC_N * 4, &m, err, sizeof(err));
	CHECK(r == 0, "map: %d %s", r, err);
	if (r == 0) {
		for (int i = 0; i < IPC_N; i++)
			src[i] = (float)i;
		CHECK(h2d(mem_cuda_ops.ptr(m), src, sizeof(src)) == cudaSuccess,
		      "write through the handle (landed before the child reads)");
		mem_cuda_ops.unmap(m);
	}
	CHECK(write(to[1], "x", 1) == 1, "release the child");
	waitpid(pid, &status, 0);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child read back %d", status);
	close(to[1]);
	close(from[0]);
	posix_spawn_file_actions_destroy(&fa);
}

static const struct test_case cases[] = {
	{"kernels_match_cpu_bit_for_bit", t_kernels},
	{"lowp_masters_norms_clip_match_cpu", t_lowp_and_norms},
	{"adam_bandwidth_vs_copy", t_bandwidth},
	{"job_through_nccl_and_kernels", t_job},
	{"ipc_buffer_from_another_process", t_ipc},
};

/* cuda_probe() in a child that exits: it initialises CUDA, and CUDA does
 * not work in a child forked after that, as every case is (test_main). The
 * device count, why in why. */
static int probe_in_child(char *why, size_t len)
{
	int fds[2], n = -1, st = 0;
	pid_t pid;

	snprintf(why, len, "the probe's child failed");
	if (pipe(fds) != 0)
		return -1;
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		char w[256] = "";
		n = cuda_probe(w, sizeof(w));
		if (write(fds[1], &n, sizeof(n)) != sizeof(n) || write(fds[1], w, sizeof(w)) != sizeof(w))
			_exit(1);
		_exit(0);
	}
	close(fds[1]);
	if (pid > 0) {
		char w[256];
		if (read(fds[0], &n, sizeof(n)) == sizeof(n) && read(fds[0], w, sizeof(w)) == sizeof(w)) {
			w[sizeof(w) - 1] = 0;
			snprintf(why, len, "%s", w);
		} else {
			n = -1;
		}
		waitpid(pid, &st, 0);
	}
	close(fds[0]);
	return n;
}

int main(int argc, char **argv)
{
	char why[256];

	if (argc > 1 && strcmp(argv[1], "--ipc-child") == 0)
		return ipc_child();
	ndev_ = probe_in_child(why, sizeof(why));
	if (ndev_ <= 0) {
		/* TAP for people and tools/test.sh's count; meson reads the 77 */
		printf("1..1\nok 1 - gpu # SKIP no usable GPU: %s\n", why);
		return 77;
	}
	printf("# %s\n", why);
	if (pool_new(2, &pool_) < 0)
		return 1;
	return test_main(cases, ARRAY_SIZE(cases), argc, argv);
}
