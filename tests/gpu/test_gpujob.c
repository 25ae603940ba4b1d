/*
 * test_gpujob.c — a world-size-1 CUDA job through the whole path on a real
 * GPU (suite gpu; tests/gpu/run): a real zerod --backend cuda, this process
 * as its trainer with libzeroclient loading the CUDA runtime ($ZEROD_CUDART):
 * device buffers registered by IPC handle + offset and UUID, gradients
 * copied asynchronously on the trainer's stream, behind a host function that
 * holds the stream back, and handed over with zc_bucket_ready_cuda() at once
 * (zerod's reduction must wait on the ready event: read early, it would see
 * the last iteration's gradients, and the parameters would differ), NCCL,
 * the CUDA Adam kernels, and zc_step_wait_cuda() on the done events; the
 * parameters are read back and compared with tests/refoptim.c's Adam
 * (world 1: the average is the gradient). Exits 77 without a GPU.
 *
 * --killed: a trainer (a child; this process never initialises CUDA, which
 * a forked child could not use then) SIGKILLed mid-iteration, after it
 * handed a bucket over whose ready event is held back on its stream behind
 * a 60 s host function, so the event never completes: zerod must tear the
 * job down within its stall timeout (a wait on that event never ends by
 * itself: zerod has to abandon it) and then stop cleanly.
 */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "harness.h"
#include "refoptim.h"
#include "trainer.h"

#define ITERS 6

#define CU(call)                                                                                   \
	do {                                                                                       \
		cudaError_t e_ = (call);                                                           \
		if (e_ != cudaSuccess) {                                                           \
			printf("not ok 1 - gpujob # %s: %s\n", #call, cudaGetErrorString(e_));     \
			goto out;                                                                  \
		}                                                                                  \
	} while (0)

#define ZC(call)                                                                                   \
	do {                                                                                       \
		int r_ = (call);                                                                   \
		if (r_ < 0) {                                                                      \
			printf("not ok 1 - gpujob # %s: %s: %s\n", #call, zc_strerror_name(r_),    \
			       zc_error_message());                                                \
			goto out;                                                                  \
		}                                                                                  \
	} while (0)

/* IPC shares a cudaMalloc's whole underlying block, and the driver may
 * carve small allocations out of a larger one: buffers for IPC are whole
 * allocations of a multiple of 2 MiB (zeroclient.h) */
#define IPC_ROUND ((uint64_t)2 << 20)

/* On the trainer's stream before each gradient copy: the copy, and so the
 * bucket's ready event, comes well after zc_bucket_ready_cuda() returned. */
static void CUDART_CB hold_stream(void *arg)
{
	(void)arg;
	usleep(20000);
}

#define KILL_STALL_MS 5000

static void CUDART_CB hold_long(void *arg)
{
	(void)arg;
	sleep(60);
}

/* The trainer of --killed: iteration 0 whole, then bucket 0 of iteration 1
 * behind hold_long; says so on fd and waits to be killed. */
static int killed_trainer(const struct zd *d, int fd)
{
	struct train_spec s = {.job = "gpujob-killed",
			       .world = 1,
			       .optimizer = ZC_OPT_SGD,
			       .shard_mode = ZC_SHARD_BUCKET,
			       .step_mode = ZC_STEP_INTERLEAVED};
	struct zc_buffers bufs = ZC_BUFFERS_INIT;
	struct zc_config cfg = test_config(d, s.job, 0, 1);
	struct train_plan tp;
	zc_client *c = NULL;
	cudaStream_t st;
	uint64_t bytes;
	char *dev;

	train_make_plan(&s, &tp);
	if (zc_plan_buffer_bytes(&tp.plan, &bytes) < 0 || cudaSetDevice(0) != cudaSuccess ||
	    cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess ||
	    cudaMalloc((void **)&dev, (2 * bytes + IPC_ROUND - 1) / IPC_ROUND * IPC_ROUND) !=
		    cudaSuccess ||
	    cudaMemset(dev, 0, 2 * bytes) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess)
		return 2;
	bufs.kind = ZC_BUFFERS_CUDA;
	bufs.grad_dev = dev;
	bufs.param_dev = dev + bytes;
	if (zc_connect(&cfg, &c) < 0 || zc_register_buffers(c, &tp.plan, &bufs) < 0 ||
	    zc_register_plan(c) < 0)
		return 3;
	for (int it = 0; it < 2; it++) {
		zc_future *step = NULL;

		for (uint32_t b = 0; b < tp.plan.nbuckets; b++) {
			if (it == 1) {
				/* the ready event comes after a minute: never */
				if (cudaLaunchHostFunc(st, hold_long, NULL) != cudaSuccess ||
				    zc_bucket_ready_cuda(c, b, st, NULL) < 0)
					return 4;
				(void)!write(fd, "k", 1);
				pause();
			}
			if (zc_bucket_ready_cuda(c, b, st, NULL) < 0)
				return 5;
		}
		if (zc_step_future(c, (uint64_t)it, &step) < 0 || zc_future_wait(step, 60000) != 1 ||
		    zc_step_wait_cuda(step, st) < 0)
			return 6;
		zc_future_free(step);
	}
	return 7;
}

static int killed_main(void)
{
	char stall[16];
	/* the job fails rather than re-forming after its trainer's death */
	const char *const extra[] = {
		"--backend", "cuda", "--stall-timeout", stall, "--rejoin-timeout", "0", NULL};
	int fds[2], status = 1, st = 0;
	int64_t t0;
	struct zd d;
	pid_t pid;
	char k;

	printf("1..1\n");
	snprintf(stall, sizeof(stall), "%d", KILL_STALL_MS);
	if (zd_start(&d, extra) != 0) {
		printf("not ok 1 - gpujob-killed # zerod --backend cuda did not start\n");
		return 1;
	}
	if (pipe(fds) != 0)
		goto out;
	fflush(stdout);
	pid = fork();
	if (pid == 0)
		_exit(killed_trainer(&d, fds[1]));
	close(fds[1]);
	if (pid < 0 || read(fds[0], &k, 1) != 1) {
		waitpid(pid, &st, 0);
		printf("not ok 1 - gpujob-killed # the trainer failed before the kill (%#x)\n", st);
		goto out;
	}
	usleep(100000);
	kill(pid, SIGKILL);
	waitpid(pid, &st, 0);
	t0 = test_ms();
	if (zd_wait_job(&d, "gpujob-killed", ZD_JOB_GONE, KILL_STALL_MS + 10000) != 0) {
		printf("not ok 1 - gpujob-killed # the job was not torn down %d ms after its "
		       "trainer was killed (stall timeout %d ms)\n",
		       KILL_STALL_MS + 10000, KILL_STALL_MS);
		goto out;
	}
	printf("# torn down %lld ms after the kill (stall timeout %d ms)\n",
	       (long long)(test_ms() - t0), KILL_STALL_MS);
	status = 0;
out:
	if (zd_stop(&d, 10000) != 0) {
		printf("# zerod did not stop cleanly\n");
		status = 1;
	}
	if (status)
		zd_dump_log(&d);
	else
		printf("ok 1 - gpujob-killed # a trainer SIGKILLed mid-iteration, its ready event "
		       "never completing: the job torn down, zerod stopped cleanly\n");
	return status;
}

int main(int argc, char **argv)
{
	const char *const extra[] = {"--backend", "cuda", NULL};
	struct train_spec s = {.job = "gpujob",
			       .world = 1,
			       .optimizer = ZC_OPT_ADAM,
			       .shard_mode = ZC_SHARD_BUCKET,
			       .step_mode = ZC_STEP_INTERLEAVED};
	struct zc_buffers bufs = ZC_BUFFERS_INIT;
	struct zc_config cfg;
	struct train_plan tp;
	struct zd d;
	zc_client *c = NULL;
	cudaStream_t st = NULL;
	uint64_t bytes, total = 0, bad = 0;
	float *host_p = NULL, *host_g = NULL, *ref_p = NULL, *m = NULL, *v = NULL, *vmax = NULL;
	char *dev = NULL;
	int ndev = 0, status = 1;
	bool started = false;

	if (argc > 1 && strcmp(argv[1], "--killed") == 0) {
		/* no CUDA here: the probe in a child that exits */
		pid_t pid = fork();
		int ps = 0;

		if (pid == 0)
			_exit(cudaGetDeviceCount(&ndev) == cudaSuccess && ndev > 0 ? 0 : 77);
		if (pid < 0 || waitpid(pid, &ps, 0) != pid || !WIFEXITED(ps) || WEXITSTATUS(ps)) {
			printf("1..1\nok 1 - gpujob-killed # SKIP no usable GPU\n");
			return 77;
		}
		return killed_main();
	}
	if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
		printf("1..1\nok 1 - gpujob # SKIP no usable GPU\n");
		return 77;
	}
	printf("1..1\n");
	train_make_plan(&s, &tp);
	for (uint32_t b = 0; b < tp.plan.nbuckets; b++)
		total += tp.buckets[b].numel;
	ZC(zc_plan_buffer_bytes(&tp.plan, &bytes));
	host_p = calloc(bytes, 1);
	/* pinned, so the copies are truly asynchronous */
	if (cudaMallocHost((void **)&host_g, bytes) != cudaSuccess)
		goto out;
	memset(host_g, 0, bytes);
	ref_p = calloc(bytes, 1);
	m = calloc(bytes, 1);
	v = calloc(bytes, 1);
	vmax = calloc(bytes, 1);
	if (!host_p || !host_g || !ref_p || !m || !v || !vmax)
		goto out;
	if (zd_start(&d, extra) != 0) {
		printf("not ok 1 - gpujob # zerod --backend cuda did not start\n");
		goto out;
	}
	started = true;
	CU(cudaSetDevice(0));
	CU(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
	/* one allocation, both buffers at offsets into it */
	CU(cudaMalloc((void **)&dev, (2 * bytes + 512 + IPC_ROUND - 1) / IPC_ROUND * IPC_ROUND));
	cfg = test_config(&d, s.job, 0, 1);
	ZC(zc_connect(&cfg, &c));
	bufs.kind = ZC_BUFFERS_CUDA;
	bufs.grad_dev = dev + 256;
	bufs.param_dev = dev + 256 + bytes;
	ZC(zc_register_buffers(c, &tp.plan, &bufs));
	for (uint32_t b = 0; b < tp.plan.nbuckets; b++) {
		float *p = (float *)((char *)host_p +
				     ((char *)zc_param_ptr(c, b) - (char *)bufs.param_dev));
		for (uint64_t i = 0; i < tp.buckets[b].numel; i++)
			p[i] = det_uniform(7, 0, b, i);
	}
	memcpy(ref_p, host_p, bytes);
	CU(cudaMemcpy(bufs.param_dev, host_p, bytes, cudaMemcpyHostToDevice));
	/* a pageable copy lands after it returns, unordered with zerod's
	 * non-blocking streams */
	CU(cudaDeviceSynchronize());
	ZC(zc_register_plan(c));
	for (int it = 0; it < ITERS; it++) {
		zc_future *step = NULL;

		for (uint32_t b = 0; b < tp.plan.nbuckets; b++) {
			size_t at = (char *)zc_grad_ptr(c, b) - (char *)bufs.grad_dev;
			float *g = (float *)((char *)host_g + at);
			uint64_t n = tp.buckets[b].numel;

			for (uint64_t i = 0; i < n; i++)
				g[i] = det_uniform(8, (uint64_t)it, b, i);
			/* the gradients are not yet copied when the bucket goes */
			CU(cudaLaunchHostFunc(st, hold_stream, NULL));
			CU(cudaMemcpyAsync((char *)bufs.grad_dev + at, g, n * sizeof(float),
					   cudaMemcpyHostToDevice, st));
			ZC(zc_bucket_ready_cuda(c, b, st, NULL));
			for (uint32_t k = 0; k < tp.buckets[b].nsegments; k++) {
				const struct zc_segment *sg = &tp.buckets[b].segments[k];
				size_t o = at / sizeof(float) + sg->offset;

				ref_adam(false, &tp.groups[sg->group], (uint64_t)it + 1, ref_p + o,
					 host_g + o, m + o, v + o, vmax + o, sg->numel);
			}
		}
		ZC(zc_step_future(c, (uint64_t)it, &step));
		if (zc_future_wait(step, 60000) != 1) {
			printf("not ok 1 - gpujob # iteration %d: %s\n", it,
			       zc_future_message(step));
			zc_future_free(step);
			goto out;
		}
		ZC(zc_step_wait_cuda(step, st));
		zc_future_free(step);
	}
	CU(cudaStreamSynchronize(st));
	CU(cudaMemcpy(host_p, bufs.param_dev, bytes, cudaMemcpyDeviceToHost));
	for (uint32_t b = 0; b < tp.plan.nbuckets; b++) {
		size_t at = ((char *)zc_param_ptr(c, b) - (char *)bufs.param_dev) / sizeof(float);

		for (uint64_t i = 0; i < tp.buckets[b].numel; i++) {
			float got = host_p[at + i], want = ref_p[at + i];

			if (!(fabsf(got - want) <= 1e-6f * fmaxf(1.0f, fabsf(want))) && bad++ < 5)
				printf("# bucket %u[%llu]: %.9g, reference %.9g\n", b,
				       (unsigned long long)i, got, want);
		}
	}
	if (bad)
		printf("not ok 1 - gpujob # %llu of %llu parameters differ from the reference\n",
		       (unsigned long long)bad, (unsigned long long)total);
	else
		printf("ok 1 - gpujob # world 1, Adam, %d iterations, %llu parameters through IPC "
		       "buffers, ready/done events, NCCL and the kernels\n",
		       ITERS, (unsigned long long)total);
	status = bad ? 1 : 0;
out:
	zc_close(c);
	if (started && zd_stop(&d, 10000) != 0 && status == 0) {
		printf("# zerod did not stop cleanly\n");
		status = 1;
	}
	if (st)
		cudaStreamDestroy(st);
	cudaFree(dev);
	free(host_p);
	cudaFreeHost(host_g);
	free(ref_p);
	free(m);
	free(v);
	free(vmax);
	return status;
}
