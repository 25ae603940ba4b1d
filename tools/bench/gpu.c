/*
 * gpu.c — the GPU rows of zerod-bench (--gpu; issue 25 §4), so that the
 * first run on a GPU machine produces them. Each row is measured only where
 * it can be, and otherwise says that it did not run and why, never a number:
 *
 *   nccl_busbw     NCCL all-reduce of --params floats across every visible
 *                  device from one process (ncclCommInitAll), timed with
 *                  CUDA events, busbw = algbw x 2(n-1)/n as nccl-tests
 *                  computes it; beside it the same bytes through zerod:
 *                  a `zerod --backend cuda` job of one trainer process per
 *                  device (this binary again, --gpu-trainer, exec'd so that
 *                  no child inherits this process's CUDA), one bucket of
 *                  --params floats, shard slice (reduce-scatter, step,
 *                  all-gather: an all-reduce's bytes), SGD without momentum
 *                  (the least step), the slowest rank's median iteration
 *                  (ready event to the stream synced after the done event),
 *                  busbw counted the same way (zerod_busbw, zerod_vs_nccl:
 *                  target >= 0.95);
 *   adam_gbps      a world-1 job on `zerod --backend cuda` with CUDA buffers
 *                  (IPC handles, zc_bucket_ready_cuda, zc_step_wait_cuda):
 *                  the bytes Adam must move, 4 N x 7 (gradient read,
 *                  parameters, m and v read and written), over the median
 *                  iteration; against d2d_gbps, cudaMemcpy device to device
 *                  counted as read + write (2 x bytes), best of 10;
 *   handoff_cuda   the same path with one bucket of 16 elements: ready
 *                  event recorded, zc_bucket_ready_cuda, step done, the
 *                  done event waited on the stream and the stream synced;
 *                  p50 and p99 in µs;
 *   ddp_cuda       DDP + ZerodOptimizer against DDP +
 *                  ZeroRedundancyOptimizer(overlap_with_ddp=True) on CUDA at
 *                  world 1: torch_anchor.py --cuda through --python (a torch
 *                  with CUDA; Debian's is not), each minus no_sync.
 *
 * Built with the CUDA runtime only where meson found the toolkit
 * (ZEROD_BENCH_CUDA); else every row says zerod-bench was built without it.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"

#ifdef ZEROD_BENCH_CUDA
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif

struct gpu_row {
	const char *name;
	bool ran;
	char why[200];     /* when !ran */
	double v[6];       /* the row's numbers when ran */
	const char *k[6];  /* their keys */
	unsigned n;
};

static void not_run(struct gpu_row *r, const char *fmt, const char *arg)
{
	r->ran = false;
	snprintf(r->why, sizeof(r->why), fmt, arg);
}

static void put(struct gpu_row *r, const char *key, double v)
{
	if (r->n < 6) {
		r->k[r->n] = key;
		r->v[r->n++] = v;
	}
	r->ran = true;
}

#ifdef ZEROD_BENCH_CUDA

#define IPC_ROUND ((uint64_t)2 << 20) /* whole 2 MiB allocations for IPC (zeroclient.h) */

static double d2d_gbps(size_t bytes, const char **why)
{
	void *a = NULL, *b = NULL;
	cudaEvent_t e0 = NULL, e1 = NULL;
	double best = NAN;

	*why = "cudaMalloc";
	if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess)
		goto out;
	*why = "cudaEventCreate";
	if (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess)
		goto out;
	cudaMemset(a, 1, bytes);
	for (int i = 0; i < 12; i++) {
		float ms = 0;
		cudaEventRecord(e0, 0);
		cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, 0);
		cudaEventRecord(e1, 0);
		if (cudaEventSynchronize(e1) != cudaSuccess ||
		    cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess)
			goto out;
		double gbps = 2.0 * (double)bytes / (ms * 1e6);
		if (i >= 2 && (isnan(best) || gbps > best))
			best = gbps;
	}
	*why = NULL;
out:
	cudaEventDestroy(e0);
	cudaEventDestroy(e1);
	cudaFree(a);
	cudaFree(b);
	return best;
}

static void nccl_direct(const struct bench_cfg *cfg, int ndev, struct gpu_row *row)
{
	ncclComm_t comms[16];
	cudaStream_t st[16];
	float *buf[16];
	cudaEvent_t e0 = NULL, e1 = NULL;
	size_t n = cfg->params, bytes = n * sizeof(float);
	int devs[16];
	double *t = calloc((size_t)cfg->iters, sizeof(double));

	if (ndev < 2) {
		not_run(row, "not run: needs 2 CUDA devices, %s found (one rank's busbw is 0 by "
			     "nccl-tests' formula)", "1");
		free(t);
		return;
	}
	ndev = ndev > 16 ? 16 : ndev;
	for (int d = 0; d < ndev; d++)
		devs[d] = d;
	if (!t || ncclCommInitAll(comms, ndev, devs) != ncclSuccess) {
		not_run(row, "not run: %s", "ncclCommInitAll failed");
		free(t);
		return;
	}
	for (int d = 0; d < ndev; d++) {
		cudaSetDevice(d);
		cudaStreamCreate(&st[d]);
		cudaMalloc((void **)&buf[d], bytes);
		cudaMemset(buf[d], 0, bytes);
	}
	cudaSetDevice(0);
	cudaEventCreate(&e0);
	cudaEventCreate(&e1);
	for (int i = 0; i < cfg->warmup + cfg->iters; i++) {
		float ms = 0;
		for (int d = 0; d < ndev; d++) {
			cudaSetDevice(d);
			cudaStreamSynchronize(st[d]);
		}
		cudaSetDevice(0);
		cudaEventRecord(e0, st[0]);
		ncclGroupStart();
		for (int d = 0; d < ndev; d++)
			ncclAllReduce(buf[d], buf[d], n, ncclFloat, ncclSum, comms[d], st[d]);
		ncclGroupEnd();
		cudaSetDevice(0);
		cudaEventRecord(e1, st[0]);
		for (int d = 0; d < ndev; d++) {
			cudaSetDevice(d);
			cudaStreamSynchronize(st[d]);
		}
		cudaEventElapsedTime(&ms, e0, e1);
		if (i >= cfg->warmup)
			t[i - cfg->warmup] = ms;
	}
	double ms = bench_quantile(t, (size_t)cfg->iters, 0.5);
	double alg = (double)bytes / (ms * 1e6);
	put(row, "nccl_direct_ms", ms);
	put(row, "nccl_direct_algbw", alg);
	put(row, "nccl_direct_busbw", alg * 2.0 * (ndev - 1) / ndev);
	for (int d = 0; d < ndev; d++) {
		cudaSetDevice(d);
		cudaFree(buf[d]);
		cudaStreamDestroy(st[d]);
		ncclCommDestroy(comms[d]);
	}
	cudaSetDevice(0);
	cudaEventDestroy(e0);
	cudaEventDestroy(e1);
	free(t);
}

/* One trainer of a job on the zerod --backend cuda at sock: rank of world
 * (its device the rank's), `numel` elements in one bucket, optimizer `opt`
 * with cfg's hyperparameters, shard mode `shard`: the median and p99 of its
 * iterations, ready event to the stream synced after the done event. */
struct cuda_trainer {
	const char *sock, *job;
	uint32_t rank, world;
	uint64_t numel;
	int iters;
	enum zc_optimizer opt;
	enum zc_shard_mode shard;
};

static int cuda_trainer(const struct bench_cfg *cfg, const struct cuda_trainer *ct,
			double *ret_p50_us, double *ret_p99_us, const char **why)
{
	uint64_t numel = ct->numel;
	int iters = ct->iters;
	struct zc_segment seg = {.size = sizeof(seg), .offset = 0, .numel = numel, .group = 0};
	struct zc_bucket bk = {.size = sizeof(bk), .numel = numel, .nsegments = 1, .segments = &seg};
	struct zc_plan plan = {.size = sizeof(plan),
			       .optimizer = ct->opt,
			       .shard_mode = ct->shard,
			       .step_mode = ZC_STEP_INTERLEAVED,
			       .ngroups = 1,
			       .groups = &cfg->hp,
			       .nbuckets = 1,
			       .buckets = &bk};
	struct zc_config zc = ZC_CONFIG_INIT;
	struct zc_buffers bufs = ZC_BUFFERS_INIT;
	zc_client *c = NULL;
	cudaStream_t st = NULL;
	char *dev = NULL;
	uint64_t bytes;
	int warm = iters / 10 + 3, r;
	double *t = calloc((size_t)iters, sizeof(double));

	*why = "memory";
	if (!t)
		return -ENOMEM;
	zc.socket = ct->sock;
	zc.job_id = ct->job;
	zc.rank = zc.local_rank = ct->rank;
	zc.world_size = zc.local_size = ct->world;
	*why = "CUDA buffers";
	r = zc_plan_buffer_bytes(&plan, &bytes);
	if (r >= 0 && cudaSetDevice((int)ct->rank) != cudaSuccess)
		r = -ENODEV;
	if (r < 0 || cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess ||
	    cudaMalloc((void **)&dev, (2 * bytes + IPC_ROUND - 1) / IPC_ROUND * IPC_ROUND) !=
		    cudaSuccess ||
	    cudaMemset(dev, 0, 2 * bytes) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) {
		r = r < 0 ? r : -EIO;
		goto stop;
	}
	bufs.kind = ZC_BUFFERS_CUDA;
	bufs.grad_dev = dev;
	bufs.param_dev = dev + bytes;
	*why = "zc_connect / zc_register_buffers / zc_register_plan";
	r = zc_connect(&zc, &c);
	if (r >= 0)
		r = zc_register_buffers(c, &plan, &bufs);
	if (r >= 0)
		r = zc_register_plan(c);
	for (int i = 0; r >= 0 && i < warm + iters; i++) {
		zc_future *step = NULL;
		uint64_t it = zc_iteration(c);
		int64_t t0;

		cudaStreamSynchronize(st);
		t0 = bench_ns();
		*why = "an iteration";
		r = zc_bucket_ready_cuda(c, 0, st, NULL);
		if (r >= 0)
			r = zc_step_future(c, it, &step);
		if (r >= 0)
			r = zc_future_wait(step, 60000) == 1 ? 0 : -ETIMEDOUT;
		if (r >= 0)
			r = zc_step_wait_cuda(step, st);
		if (r >= 0 && cudaStreamSynchronize(st) != cudaSuccess)
			r = -EIO;
		if (r >= 0 && i >= warm)
			t[i - warm] = (double)(bench_ns() - t0) / 1e3;
		zc_future_free(step);
	}
	if (r >= 0) {
		*ret_p99_us = bench_quantile(t, (size_t)iters, 0.99);
		*ret_p50_us = bench_quantile(t, (size_t)iters, 0.5);
		*why = NULL;
		r = 0;
	}
	zc_close(c);
stop:
	cudaFree(dev);
	if (st)
		cudaStreamDestroy(st);
	free(t);
	return r;
}

/* A world-1 job of `numel` elements in one bucket (Adam) on a zerod
 * --backend cuda of its own, this process its trainer. */
static int cuda_job(const struct bench_cfg *cfg, uint64_t numel, int iters, double *ret_p50_us,
		    double *ret_p99_us, const char **why)
{
	const char *const extra[] = {"--backend", "cuda", NULL};
	struct bench_daemon d;
	int r;

	*why = "zerod --backend cuda did not start";
	if ((r = daemon_start_args(&d, cfg->zerod, extra)) < 0)
		return r;
	struct cuda_trainer ct = {.sock = d.sock,
				  .job = "bench-gpu",
				  .rank = 0,
				  .world = 1,
				  .numel = numel,
				  .iters = iters,
				  .opt = ZC_OPT_ADAM,
				  .shard = ZC_SHARD_BUCKET};
	r = cuda_trainer(cfg, &ct, ret_p50_us, ret_p99_us, why);
	daemon_stop(&d);
	return r;
}

/* zerod-bench --gpu-trainer SOCK RANK WORLD NUMEL ITERS: one rank of the
 * busbw job (zerod_busbw), in a process of its own; prints its median
 * iteration in microseconds. */
int gpu_trainer_main(const struct bench_cfg *cfg, char **args)
{
	struct cuda_trainer ct = {.sock = args[0],
				  .job = "bench-busbw",
				  .rank = (uint32_t)strtoul(args[1], NULL, 10),
				  .world = (uint32_t)strtoul(args[2], NULL, 10),
				  .numel = strtoull(args[3], NULL, 10),
				  .iters = atoi(args[4]),
				  .opt = ZC_OPT_SGD,
				  .shard = ZC_SHARD_SLICE};
	struct bench_cfg sgd = *cfg;
	const char *why = NULL;
	double p50, p99;

	sgd.hp.momentum = 0;
	if (cuda_trainer(&sgd, &ct, &p50, &p99, &why) < 0) {
		fprintf(stderr, "zerod-bench --gpu-trainer %u: %s failed\n", ct.rank, why);
		return 1;
	}
	printf("%.3f\n", p50);
	return 0;
}

/* The busbw job: a zerod --backend cuda and one --gpu-trainer process per
 * device; the slowest rank's median iteration in ms, or NAN with *why. */
static double zerod_busbw_ms(const struct bench_cfg *cfg, int ndev, const char **why)
{
	const char *const extra[] = {"--backend", "cuda", NULL};
	struct bench_daemon d;
	FILE *out[16] = {0};
	pid_t pid[16];
	double worst = 0;
	int ok = 1;

	*why = "zerod --backend cuda did not start";
	if (daemon_start_args(&d, cfg->zerod, extra) < 0)
		return NAN;
	*why = "a trainer process";
	for (int k = 0; k < ndev; k++) {
		char rank[16], world[16], numel[32], iters[16];
		int fd[2];

		snprintf(rank, sizeof(rank), "%d", k);
		snprintf(world, sizeof(world), "%d", ndev);
		snprintf(numel, sizeof(numel), "%llu", (unsigned long long)cfg->params);
		snprintf(iters, sizeof(iters), "%d", cfg->iters);
		if (pipe(fd) < 0 || (pid[k] = fork()) < 0) {
			ok = 0;
			ndev = k;
			break;
		}
		if (pid[k] == 0) {
			dup2(fd[1], 1);
			close(fd[0]);
			close(fd[1]);
			execl("/proc/self/exe", "zerod-bench", "--gpu-trainer", d.sock, rank, world,
			      numel, iters, (char *)NULL);
			_exit(127);
		}
		close(fd[1]);
		out[k] = fdopen(fd[0], "r");
	}
	for (int k = 0; k < ndev; k++) {
		double us = NAN;
		int status = 0;

		if (!out[k] || fscanf(out[k], "%lf", &us) != 1)
			ok = 0;
		if (out[k])
			fclose(out[k]);
		if (waitpid(pid[k], &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status))
			ok = 0;
		worst = us > worst ? us : worst;
	}
	daemon_stop(&d);
	if (!ok)
		return NAN;
	*why = NULL;
	return worst / 1e3;
}

#ifndef LIBZEROCLIENT_BUILD
#define LIBZEROCLIENT_BUILD "libzeroclient.so.1"
#endif
#ifndef ZEROD_PYTHON_DIR
#define ZEROD_PYTHON_DIR "client/python"
#endif

/* The number after "key": in a one-line JSON object, or NAN. */
static double jnumber(const char *s, const char *key)
{
	char pat[64];
	const char *p;

	snprintf(pat, sizeof(pat), "\"%s\":", key);
	p = strstr(s, pat);
	return p ? strtod(p + strlen(pat), NULL) : NAN;
}

static void ddp_cuda(const struct bench_cfg *cfg, const char *python, const char *anchor,
		     struct gpu_row *row)
{
	char cmd[4096], last[4096] = "";
	const char *nr;

	snprintf(cmd, sizeof(cmd),
		 "'%s' '%s' --cuda --params %llu --layers %u --world 1 --optim adam --lr %g "
		 "--iters %d --warmup %d --zerod '%s' --libzeroclient '%s' --pythonpath '%s'",
		 python, anchor, (unsigned long long)cfg->params, cfg->nbuckets, cfg->hp.lr,
		 cfg->iters, cfg->warmup, cfg->zerod, LIBZEROCLIENT_BUILD, ZEROD_PYTHON_DIR);
	if (bench_last_json(cmd, last, sizeof(last)) < 0) {
		not_run(row, "not run: %s failed", "torch_anchor.py --cuda");
		return;
	}
	if ((nr = strstr(last, "\"not_run\": \""))) {
		snprintf(row->why, sizeof(row->why), "%.*s", (int)strcspn(nr + 12, "\""), nr + 12);
		row->ran = false;
		return;
	}
	double z = jnumber(last, "torch_cuda_zerod_ms");
	double t = jnumber(last, "torch_cuda_zero_overlap_ms");
	put(row, "zerod_optimizer_ms", z);
	put(row, "zero_overlap_ms", t);
	put(row, "zero_overlap_vs_zerod", t / z);
}

static void gpu_measure(const struct bench_cfg *cfg, const char *python, const char *anchor,
			struct gpu_row *rows)
{
	int ndev = 0;
	cudaError_t e = cudaGetDeviceCount(&ndev);
	const char *why = NULL;
	double p50, p99, copy;

	if (e != cudaSuccess || ndev < 1) {
		for (int i = 0; i < 4; i++)
			not_run(&rows[i], "not run: no CUDA device (%s)",
				e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount: 0");
		return;
	}
	cudaSetDevice(0);
	nccl_direct(cfg, ndev, &rows[0]);
	if (rows[0].ran) {
		double ms = zerod_busbw_ms(cfg, ndev, &why);
		double bus = 4.0 * (double)cfg->params / (ms * 1e6) * 2.0 * (ndev - 1) / ndev;

		if (why)
			fprintf(stderr, "zerod-bench: the busbw job through zerod: %s failed\n",
				why);
		put(&rows[0], "zerod_ms", ms);
		put(&rows[0], "zerod_busbw", bus);
		put(&rows[0], "zerod_vs_nccl", bus / rows[0].v[2]);
		why = NULL;
	}
	copy = d2d_gbps((size_t)cfg->params * sizeof(float), &why);
	if (why)
		not_run(&rows[1], "not run: device-to-device copy: %s failed", why);
	else if (cuda_job(cfg, cfg->params, cfg->iters, &p50, &p99, &why) < 0)
		not_run(&rows[1], "not run: the CUDA job: %s", why);
	else {
		double ms = p50 / 1e3, gbps = 28.0 * (double)cfg->params / (ms * 1e6);
		put(&rows[1], "adam_iter_ms", ms);
		put(&rows[1], "adam_gbps", gbps);
		put(&rows[1], "d2d_gbps", copy);
		put(&rows[1], "adam_vs_d2d", gbps / copy);
	}
	if (cuda_job(cfg, 16, cfg->handoff_iters, &p50, &p99, &why) < 0)
		not_run(&rows[2], "not run: the CUDA handoff job: %s", why);
	else {
		put(&rows[2], "handoff_cuda_p50_us", p50);
		put(&rows[2], "handoff_cuda_p99_us", p99);
	}
	ddp_cuda(cfg, python, anchor, &rows[3]);
}

#else

int gpu_trainer_main(const struct bench_cfg *cfg, char **args)
{
	(void)cfg;
	(void)args;
	fprintf(stderr, "zerod-bench: built without the CUDA toolkit\n");
	return 2;
}

static void gpu_measure(const struct bench_cfg *cfg, const char *python, const char *anchor,
			struct gpu_row *rows)
{
	(void)cfg;
	(void)python;
	(void)anchor;
	(void)put;
	for (int i = 0; i < 4; i++)
		not_run(&rows[i], "not run: %s",
			"zerod-bench was built without the CUDA toolkit (meson -Dcuda)");
}

#endif

int gpu_rows(const struct bench_cfg *cfg, bool json, const char *python, const char *anchor)
{
	struct gpu_row rows[4] = {{.name = "nccl_busbw"},
				  {.name = "adam_gbps"},
				  {.name = "handoff_cuda"},
				  {.name = "ddp_cuda"}};

	gpu_measure(cfg, python, anchor, rows);
	if (json)
		printf("{\n  \"schema\": \"zerod-bench-gpu/1\",\n  \"params\": %llu,\n",
		       (unsigned long long)cfg->params);
	else
		printf("zerod-bench --gpu: %.2fM params\n", (double)cfg->params / 1e6);
	for (int i = 0; i < 4; i++) {
		const struct gpu_row *r = &rows[i];
		if (json) {
			printf("  \"%s\": {\"ran\": %s", r->name, r->ran ? "true" : "false");
			if (!r->ran)
				printf(", \"why\": \"%s\"", r->why);
			for (unsigned k = 0; k < r->n; k++)
				isfinite(r->v[k]) ? printf(", \"%s\": %.3f", r->k[k], r->v[k])
						  : printf(", \"%s\": null", r->k[k]);
			printf("}%s\n", i == 3 ? "" : ",");
		} else {
			printf("  %-14s", r->name);
			if (!r->ran)
				printf(" %s", r->why);
			for (unsigned k = 0; k < r->n; k++)
				printf(" %s %.3f", r->k[k], r->v[k]);
			printf("\n");
		}
	}
	if (json)
		printf("}\n");
	return 0;
}
