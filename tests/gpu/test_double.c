/*
 * test_double.c — the CUDA/NCCL test double itself (cudadouble.c): that it
 * refuses what the CUDA runtime and NCCL refuse, and behaves as they do
 * where the backend's correctness depends on it (issue 21 §2), so a
 * backend bug of each kind fails in CI. One case per rule:
 *  - CUDA in a child forked after its parent initialised CUDA fails with
 *    cudaErrorInitializationError (a child forked before works);
 *  - a process opening its own IPC handle fails; a handle opened twice in
 *    another process gives one pointer, counted, and each close matches;
 *  - a small cudaMalloc lives inside a 2 MiB block, at an offset: the
 *    importer's cuMemGetAddressRange reports the block;
 *  - cudaFree waits for the work queued on its device (and is counted as a
 *    free during work, as cudaMalloc is);
 *  - a pageable cudaMemcpy to the device lands after it returns, unseen by
 *    a non-blocking stream until synchronised; cudaMemset likewise;
 *  - host functions of one device's streams run one at a time;
 *  - a wait on an imported event outlives its exporter;
 *  - memory imported from a process that exited is garbage (NaN) from the
 *    importer's next task on;
 *  - cudaEventRecord on a stream of another device fails;
 *  - NCCL: two threads issuing to communicators of one device at once are
 *    a violation; a collective waits for every rank of its communicator,
 *    so launch orders that differ between two devices hang (caught here
 *    with a deadline), and the same order completes.
 * Each case runs in its own process (testlib), which initialises CUDA
 * only after any fork it needs.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>

#include "cudadouble.h"
#include "testlib.h"

static void reset(int ndevices)
{
	struct cudadouble_config c = {.ndevices = ndevices, .driver_version = 13000};
	cudadouble_reset(&c);
}

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static unsigned violations(void)
{
	struct cudadouble_stats s;

	cudadouble_stats(&s);
	return s.violations;
}

/* --------------------------------------------------------------- fork --- */

/* Runs CUDA in a child: its cudaMalloc's result (as the exit status). */
static int child_malloc(void)
{
	int st = 0;
	pid_t pid;

	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		void *p = NULL;
		cudaError_t e = cudaMalloc(&p, 64);
		_exit(e == cudaSuccess ? 0 : (int)e);
	}
	if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st))
		return -1;
	return WEXITSTATUS(st);
}

static void t_fork_after_init(void)
{
	void *p = NULL;
	int r;

	reset(2);
	r = child_malloc();
	CHECK(r == 0, "a child forked before CUDA was initialised: cudaMalloc %d", r);
	REQUIRE(cudaMalloc(&p, 64) == cudaSuccess, "the parent's cudaMalloc");
	r = child_malloc();
	CHECK(r == cudaErrorInitializationError,
	      "a child forked after the parent initialised CUDA: cudaMalloc %d, want %d", r,
	      cudaErrorInitializationError);
	cudaFree(p);
}

/* ---------------------------------------------------------------- IPC --- */

typedef CUresult (*range_fn)(CUdeviceptr *, size_t *, CUdeviceptr);

static range_fn range(void)
{
	enum cudaDriverEntryPointQueryResult q;
	void *fn = NULL;

	if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault,
					     &q) != cudaSuccess ||
	    q != cudaDriverEntryPointSuccess)
		return NULL;
	return (range_fn)fn;
}

/* A child that allocates 8 KiB (small) and 3 MiB (large) on device 0,
 * writes float i at i, checks its own ranges, sends both handles and waits
 * for a byte to exit. Its pid, or -1. */
static pid_t exporter(int *ret_rx, int *ret_tx)
{
	int up[2], down[2];
	pid_t pid;

	if (pipe(up) || pipe(down))
		return -1;
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		const size_t n[2] = {2048, (3u << 20) / 4};
		cudaIpcMemHandle_t h[2];
		CUdeviceptr base;
		size_t size;
		float *p[2];
		char c;

		reset(2);
		for (int k = 0; k < 2; k++) {
			if (cudaMalloc((void **)&p[k], n[k] * 4) != cudaSuccess ||
			    cudaIpcGetMemHandle(&h[k], p[k]) != cudaSuccess)
				_exit(1);
			for (size_t i = 0; i < n[k]; i++)
				p[k][i] = (float)i;
			/* the exporter sees its allocation as cudaMalloc gave it */
			if (range()(&base, &size, (CUdeviceptr)(uintptr_t)(p[k] + 1)) !=
				    CUDA_SUCCESS ||
			    base != (CUdeviceptr)(uintptr_t)p[k] || size != n[k] * 4)
				_exit(2);
		}
		if (write(up[1], h, sizeof(h)) != sizeof(h))
			_exit(1);
		(void)!read(down[0], &c, 1);
		_exit(0);
	}
	close(up[1]);
	close(down[0]);
	*ret_rx = up[0];
	*ret_tx = down[1];
	return pid;
}

static void t_ipc_own_handle_refused(void)
{
	cudaIpcMemHandle_t h;
	void *p = NULL, *q = NULL;
	cudaError_t e;

	reset(2);
	REQUIRE(cudaMalloc(&p, 4096) == cudaSuccess && cudaIpcGetMemHandle(&h, p) == cudaSuccess,
		"allocation and handle");
	e = cudaIpcOpenMemHandle(&q, h, cudaIpcMemLazyEnablePeerAccess);
	CHECK(e == cudaErrorDeviceUninitialized,
	      "a process opening its own handle: %d, want cudaErrorDeviceUninitialized (%d)", e,
	      cudaErrorDeviceUninitialized);
	CHECK(violations() == 1, "%u violations, want 1", violations());
	cudaFree(p);
}

static void t_ipc_opened_twice_refcounted(void)
{
	cudaIpcMemHandle_t h[2];
	struct cudadouble_stats s;
	float *a = NULL, *b = NULL;
	int rx, tx, st = 0;
	pid_t pid = exporter(&rx, &tx);

	REQUIRE(pid > 0 && read(rx, h, sizeof(h)) == sizeof(h), "the exporter's handles");
	reset(2);
	REQUIRE(cudaIpcOpenMemHandle((void **)&a, h[0], cudaIpcMemLazyEnablePeerAccess) ==
			cudaSuccess,
		"first open");
	REQUIRE(cudaIpcOpenMemHandle((void **)&b, h[0], cudaIpcMemLazyEnablePeerAccess) ==
			cudaSuccess,
		"second open");
	CHECK(a == b, "one handle opened twice gives one pointer (%p, %p)", (void *)a, (void *)b);
	cudadouble_stats(&s);
	CHECK(s.ipc_open == 2, "%u opens counted, want 2", s.ipc_open);
	CHECK(cudaIpcCloseMemHandle(a) == cudaSuccess, "first close");
	CHECK(a[7] == 7.0f, "still mapped after one of two closes (%g)", a[7]);
	CHECK(cudaIpcCloseMemHandle(a) == cudaSuccess, "second close");
	cudadouble_stats(&s);
	CHECK(s.ipc_open == 0 && s.violations == 0, "%u open, %u violations", s.ipc_open,
	      s.violations);
	CHECK(cudaIpcCloseMemHandle(a) == cudaErrorInvalidValue && violations() == 1,
	      "a third close matches no open: refused, a violation");
	(void)!write(tx, "x", 1);
	waitpid(pid, &st, 0);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the exporter: %#x", st);
}

/* The exporter exits: what the importer reads of its memory afterwards is
 * 0xff bytes (NaN), as reading freed device memory is undefined. */
static void t_imported_memory_dies_with_exporter(void)
{
	cudaIpcMemHandle_t h[2];
	cudaStream_t s;
	float *a = NULL, got[64];
	int rx, tx, st = 0, nan = 0;
	pid_t pid = exporter(&rx, &tx);

	REQUIRE(pid > 0 && read(rx, h, sizeof(h)) == sizeof(h), "the exporter's handles");
	reset(2);
	REQUIRE(cudaIpcOpenMemHandle((void **)&a, h[0], cudaIpcMemLazyEnablePeerAccess) ==
				cudaSuccess &&
			cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess,
		"open, stream");
	CHECK(cudaMemcpyAsync(got, a, sizeof(got), cudaMemcpyDeviceToHost, s) == cudaSuccess &&
		      cudaStreamSynchronize(s) == cudaSuccess && got[7] == 7.0f,
	      "while the exporter lives: %g at 7", got[7]);
	(void)!write(tx, "x", 1);
	waitpid(pid, &st, 0);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the exporter: %#x", st);
	usleep(5 * 1000);
	CHECK(cudaMemcpyAsync(got, a, sizeof(got), cudaMemcpyDeviceToHost, s) == cudaSuccess &&
		      cudaStreamSynchronize(s) == cudaSuccess,
	      "the copy after the exporter's exit");
	for (int i = 0; i < 64; i++)
		nan += got[i] != got[i];
	CHECK(nan == 64, "%d of 64 floats NaN after the exporter exited (7: %g)", nan, got[7]);
	CHECK(cudaIpcCloseMemHandle(a) == cudaSuccess && violations() == 0,
	      "closing it is allowed");
	cudaStreamDestroy(s);
}

static void t_small_allocation_inside_block(void)
{
	cudaIpcMemHandle_t h[2];
	float *small = NULL, *large = NULL;
	CUdeviceptr base;
	size_t size;
	int rx, tx, st = 0;
	pid_t pid = exporter(&rx, &tx);

	REQUIRE(pid > 0 && read(rx, h, sizeof(h)) == sizeof(h), "the exporter's handles");
	reset(2);
	REQUIRE(cudaIpcOpenMemHandle((void **)&small, h[0], cudaIpcMemLazyEnablePeerAccess) ==
				cudaSuccess &&
			cudaIpcOpenMemHandle((void **)&large, h[1],
					     cudaIpcMemLazyEnablePeerAccess) == cudaSuccess,
		"opens");
	CHECK(small[0] == 0.0f && small[2047] == 2047.0f, "the opened pointer is the allocation's");
	REQUIRE(range()(&base, &size, (CUdeviceptr)(uintptr_t)small) == CUDA_SUCCESS, "range");
	CHECK(size == (2u << 20) && base < (CUdeviceptr)(uintptr_t)small &&
		      (CUdeviceptr)(uintptr_t)small + 8192 <= base + size,
	      "an 8 KiB allocation: the importer's range is its 2 MiB block, the pointer at "
	      "offset %lld in it (size %zu)",
	      (long long)((CUdeviceptr)(uintptr_t)small - base), size);
	REQUIRE(range()(&base, &size, (CUdeviceptr)(uintptr_t)(large + 5)) == CUDA_SUCCESS,
		"range");
	CHECK(base == (CUdeviceptr)(uintptr_t)large && size == (4u << 20),
	      "a 3 MiB allocation: its own block, from its pointer (size %zu)", size);
	cudaIpcCloseMemHandle(small);
	cudaIpcCloseMemHandle(large);
	(void)!write(tx, "x", 1);
	waitpid(pid, &st, 0);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the exporter (its own ranges): %#x", st);
	CHECK(violations() == 0, "%u violations", violations());
}

/* ------------------------------------------------------------ streams --- */

static void sleep_fn(void *arg)
{
	usleep((useconds_t)(uintptr_t)arg);
}

static atomic_int inside_, most_;

static void overlap_fn(void *arg)
{
	int n = atomic_fetch_add(&inside_, 1) + 1, m = atomic_load(&most_);

	while (n > m && !atomic_compare_exchange_weak(&most_, &m, n))
		;
	usleep((useconds_t)(uintptr_t)arg);
	atomic_fetch_sub(&inside_, 1);
}

static void t_free_waits_for_device(void)
{
	cudaStream_t s0, s1;
	struct cudadouble_stats s;
	void *p = NULL, *q = NULL;
	double t0, t;

	reset(2);
	REQUIRE(cudaSetDevice(1) == cudaSuccess &&
			cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking) == cudaSuccess &&
			cudaSetDevice(0) == cudaSuccess &&
			cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking) == cudaSuccess,
		"streams");
	REQUIRE(cudaMalloc(&p, 1024) == cudaSuccess, "idle cudaMalloc");
	cudadouble_stats(&s);
	CHECK(s.mallocs_busy == 0, "a cudaMalloc with every stream idle counted busy");
	cudaLaunchHostFunc(s0, sleep_fn, (void *)(uintptr_t)300000);
	REQUIRE(cudaMalloc(&q, 1024) == cudaSuccess, "busy cudaMalloc");
	t0 = now_ms();
	CHECK(cudaFree(p) == cudaSuccess, "cudaFree");
	t = now_ms() - t0;
	cudadouble_stats(&s);
	CHECK(t >= 250 && s.host_funcs == 1,
	      "cudaFree returned after %.0f ms, %u host functions run: it waits for device "
	      "0's work",
	      t, s.host_funcs);
	CHECK(s.mallocs_busy == 1 && s.frees_busy == 1 && strstr(s.first_busy, "cudaMalloc"),
	      "counted: %u mallocs, %u frees during work (%s)", s.mallocs_busy, s.frees_busy,
	      s.first_busy);
	/* another device's work does not hold it */
	cudaSetDevice(1);
	cudaLaunchHostFunc(s1, sleep_fn, (void *)(uintptr_t)300000);
	cudaSetDevice(0);
	t0 = now_ms();
	cudaFree(q);
	t = now_ms() - t0;
	CHECK(t < 200, "cudaFree on device 0 waited %.0f ms for device 1", t);
	cudaStreamSynchronize(s1);
	cudaStreamDestroy(s0);
	cudaStreamDestroy(s1);
	CHECK(violations() == 0, "%u violations", violations());
}

static void t_pageable_copy_lands_later(void)
{
	/* a second: what the test reads before it cannot be late by that much,
	 * even on a loaded machine (100 ms was, once) */
	struct cudadouble_config c = {.ndevices = 1, .driver_version = 13000,
				      .pageable_land_us = 1000000};
	float host[64], seen[64], *d = NULL, *pin = NULL;
	cudaStream_t s;
	cudaEvent_t ev;

	cudadouble_reset(&c);
	REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess &&
			cudaMalloc((void **)&d, sizeof(host)) == cudaSuccess &&
			cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) == cudaSuccess,
		"stream, memory, event");
	for (int i = 0; i < 64; i++)
		host[i] = (float)i;
	REQUIRE(cudaMemcpy(d, host, sizeof(host), cudaMemcpyHostToDevice) == cudaSuccess, "H2D");
	cudaMemcpyAsync(seen, d, sizeof(seen), cudaMemcpyDeviceToHost, s);
	cudaStreamSynchronize(s);
	CHECK(memcmp(seen, host, sizeof(host)) != 0,
	      "a non-blocking stream saw a pageable copy at once: it has not landed yet on a GPU");
	cudaDeviceSynchronize();
	cudaMemcpyAsync(seen, d, sizeof(seen), cudaMemcpyDeviceToHost, s);
	cudaStreamSynchronize(s);
	CHECK(memcmp(seen, host, sizeof(host)) == 0, "after cudaDeviceSynchronize it has");

	/* an event recorded on stream 0 orders a stream behind the copy */
	host[0] = 100;
	cudaMemcpy(d, host, sizeof(host), cudaMemcpyHostToDevice);
	cudaEventRecord(ev, 0);
	cudaStreamWaitEvent(s, ev, 0);
	cudaMemcpyAsync(seen, d, sizeof(seen), cudaMemcpyDeviceToHost, s);
	cudaStreamSynchronize(s);
	CHECK(seen[0] == 100, "behind stream 0's event: %g", seen[0]);

	/* a pinned source: synchronous */
	REQUIRE(cudaMallocHost((void **)&pin, sizeof(host)) == cudaSuccess, "pinned");
	memcpy(pin, host, sizeof(host));
	pin[0] = 200;
	cudaMemcpy(d, pin, sizeof(host), cudaMemcpyHostToDevice);
	cudaMemcpyAsync(seen, d, sizeof(seen), cudaMemcpyDeviceToHost, s);
	cudaStreamSynchronize(s);
	CHECK(seen[0] == 200, "a pinned copy landed at once: %g", seen[0]);

	/* cudaMemset is asynchronous (on stream 0): unseen until synchronised */
	cudaLaunchHostFunc(0, sleep_fn, (void *)(uintptr_t)1000000);
	cudaMemset(d, 0, sizeof(host));
	cudaMemcpyAsync(seen, d, sizeof(seen), cudaMemcpyDeviceToHost, s);
	cudaStreamSynchronize(s);
	CHECK(seen[0] == 200, "cudaMemset ran before stream 0's earlier work: %g", seen[0]);
	cudaStreamSynchronize(0);
	cudaMemcpyAsync(seen, d, sizeof(seen), cudaMemcpyDeviceToHost, s);
	cudaStreamSynchronize(s);
	CHECK(seen[0] == 0, "after cudaStreamSynchronize(0): %g", seen[0]);
	cudaFreeHost(pin);
	cudaFree(d);
	cudaEventDestroy(ev);
	cudaStreamDestroy(s);
	CHECK(violations() == 0, "%u violations", violations());
}

static void t_host_functions_one_at_a_time(void)
{
	cudaStream_t s[4];
	struct cudadouble_stats st;

	reset(2);
	for (int k = 0; k < 4; k++) {
		cudaSetDevice(k / 3); /* three streams on device 0, one on device 1 */
		REQUIRE(cudaStreamCreateWithFlags(&s[k], cudaStreamNonBlocking) == cudaSuccess,
			"stream");
	}
	cudaSetDevice(0);
	for (int i = 0; i < 3; i++)
		for (int k = 0; k < 3; k++)
			cudaLaunchHostFunc(s[k], overlap_fn, (void *)(uintptr_t)20000);
	for (int k = 0; k < 3; k++)
		cudaStreamSynchronize(s[k]);
	CHECK(atomic_load(&most_) == 1,
	      "%d host functions of device 0's streams ran at once (CUDA: one at a time)",
	      atomic_load(&most_));
	/* two devices' host functions do overlap */
	atomic_store(&most_, 0);
	cudaLaunchHostFunc(s[0], overlap_fn, (void *)(uintptr_t)200000);
	cudaSetDevice(1);
	cudaLaunchHostFunc(s[3], overlap_fn, (void *)(uintptr_t)200000);
	cudaSetDevice(0);
	cudaStreamSynchronize(s[0]);
	cudaStreamSynchronize(s[3]);
	CHECK(atomic_load(&most_) == 2, "devices 0 and 1: %d at once, want 2", atomic_load(&most_));
	for (int k = 0; k < 4; k++)
		cudaStreamDestroy(s[k]);
	cudadouble_stats(&st);
	CHECK(st.violations == 0 && st.host_funcs == 11, "%u violations, %u host functions",
	      st.violations, st.host_funcs);
}

/* ------------------------------------------------------------- events --- */

static atomic_bool passed_;

static void passed_fn(void *arg)
{
	(void)arg;
	atomic_store(&passed_, true);
}

static void t_imported_event_outlives_exporter(void)
{
	cudaIpcEventHandle_t h;
	cudaEvent_t ev;
	cudaStream_t s;
	int up[2], st = 0;
	pid_t pid;

	REQUIRE(pipe(up) == 0, "pipe");
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		cudaEvent_t e;
		cudaStream_t es;

		/* a trainer whose ready event is recorded behind work that
		 * takes a long time; it is killed before that ends */
		reset(1);
		if (cudaStreamCreateWithFlags(&es, cudaStreamNonBlocking) != cudaSuccess ||
		    cudaEventCreateWithFlags(&e, cudaEventInterprocess | cudaEventDisableTiming) !=
			    cudaSuccess ||
		    cudaLaunchHostFunc(es, sleep_fn, (void *)(uintptr_t)30000000) != cudaSuccess ||
		    cudaEventRecord(e, es) != cudaSuccess || cudaIpcGetEventHandle(&h, e) != cudaSuccess)
			_exit(1);
		(void)!write(up[1], &h, sizeof(h));
		pause();
		_exit(0);
	}
	REQUIRE(pid > 0 && read(up[0], &h, sizeof(h)) == sizeof(h), "the exporter's event");
	reset(1);
	REQUIRE(cudaIpcOpenEventHandle(&ev, h) == cudaSuccess &&
			cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess,
		"open, stream");
	cudaStreamWaitEvent(s, ev, 0);
	cudaLaunchHostFunc(s, passed_fn, NULL);
	kill(pid, SIGKILL);
	waitpid(pid, &st, 0);
	usleep(1000 * 1000);
	CHECK(!atomic_load(&passed_),
	      "the stream passed an imported event whose exporter died before recording it "
	      "completed (CUDA's waits on)");
	CHECK(cudaEventQuery(ev) == cudaErrorNotReady, "cudaEventQuery: not ready, for ever");
	/* the stream stays stuck; destroy returns all the same (CUDA's does) */
	CHECK(cudaStreamDestroy(s) == cudaSuccess, "destroy");
	cudaEventDestroy(ev);
}

static void t_event_record_other_device(void)
{
	cudaStream_t s0, s1;
	cudaEvent_t ev;
	cudaError_t e;

	reset(2);
	REQUIRE(cudaSetDevice(1) == cudaSuccess &&
			cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking) == cudaSuccess &&
			cudaSetDevice(0) == cudaSuccess &&
			cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking) == cudaSuccess &&
			cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) == cudaSuccess,
		"streams and an event of device 0");
	CHECK(cudaEventRecord(ev, s0) == cudaSuccess, "on device 0's stream");
	CHECK(cudaEventRecord(ev, 0) == cudaSuccess, "on stream 0, device 0 current");
	e = cudaEventRecord(ev, s1);
	CHECK(e == cudaErrorInvalidResourceHandle,
	      "on device 1's stream: %d, want cudaErrorInvalidResourceHandle", e);
	cudaSetDevice(1);
	e = cudaEventRecord(ev, 0);
	CHECK(e == cudaErrorInvalidResourceHandle,
	      "on stream 0 with device 1 current: %d, want cudaErrorInvalidResourceHandle", e);
	CHECK(cudaStreamWaitEvent(s1, ev, 0) == cudaSuccess,
	      "a stream of device 1 may wait for it (CUDA allows that)");
	CHECK(violations() == 2, "%u violations, want 2", violations());
	cudaStreamSynchronize(s1);
	cudaStreamDestroy(s1);
	cudaSetDevice(0);
	cudaStreamSynchronize(s0);
	cudaStreamDestroy(s0);
	cudaEventDestroy(ev);
}

/* cudaEventElapsedTime (zerod-bench's GPU rows) as CUDA answers it: only
 * between two timing events whose records have run; a stream held behind a
 * host function keeps the second one pending. */
static atomic_int hold;

static void CUDART_CB hold_fn(void *arg)
{
	(void)arg;
	while (atomic_load(&hold))
		usleep(1000);
}

static void t_event_elapsed_time(void)
{
	cudaStream_t s;
	cudaEvent_t a, b, nt;
	cudaError_t e;
	float ms = -1;

	reset(1);
	REQUIRE(cudaStreamCreate(&s) == cudaSuccess && cudaEventCreate(&a) == cudaSuccess &&
			cudaEventCreate(&b) == cudaSuccess &&
			cudaEventCreateWithFlags(&nt, cudaEventDisableTiming) == cudaSuccess,
		"a stream and three events");
	e = cudaEventElapsedTime(&ms, a, b);
	CHECK(e == cudaErrorInvalidResourceHandle, "never recorded: %d", e);
	atomic_store(&hold, 1);
	cudaEventRecord(a, s);
	cudaLaunchHostFunc(s, hold_fn, NULL);
	cudaEventRecord(b, s);
	cudaEventRecord(nt, s);
	usleep(20000);
	e = cudaEventElapsedTime(&ms, a, b);
	CHECK(e == cudaErrorNotReady, "the second record not yet run: %d", e);
	atomic_store(&hold, 0);
	cudaStreamSynchronize(s);
	e = cudaEventElapsedTime(&ms, a, b);
	CHECK(e == cudaSuccess && ms >= 15, "both run, 20 ms apart: %d, %.3f ms", e, ms);
	e = cudaEventElapsedTime(&ms, a, nt);
	CHECK(e == cudaErrorInvalidResourceHandle, "an event without timing: %d", e);
	CHECK(violations() == 0, "%u violations", violations());
	cudaEventDestroy(a);
	cudaEventDestroy(b);
	cudaEventDestroy(nt);
	cudaStreamDestroy(s);
}

/* --------------------------------------------------------------- NCCL --- */

/* Two communicators, A and B, of two ranks each on devices 0 and 1, and a
 * stream per rank and communicator; 0 or why not. */
struct two {
	ncclComm_t c[2][2]; /* [communicator][rank] */
	cudaStream_t s[2][2];
	float *buf[2][2];
};

static int two_open(struct two *t)
{
	for (int k = 0; k < 2; k++) {
		ncclConfig_t conf = NCCL_CONFIG_INITIALIZER;
		ncclUniqueId id;
		ncclResult_t a;

		conf.blocking = 0;
		if (ncclGetUniqueId(&id) != ncclSuccess || ncclGroupStart() != ncclSuccess)
			return -1;
		for (int r = 0; r < 2; r++) {
			cudaSetDevice(r);
			if (ncclCommInitRankConfig(&t->c[k][r], 2, id, r, &conf) != ncclSuccess ||
			    cudaStreamCreateWithFlags(&t->s[k][r], cudaStreamNonBlocking) !=
				    cudaSuccess ||
			    cudaMalloc((void **)&t->buf[k][r], 64 * sizeof(float)) != cudaSuccess)
				return -1;
		}
		(void)ncclGroupEnd();
		for (int r = 0; r < 2; r++)
			do
				(void)ncclCommGetAsyncError(t->c[k][r], &a);
			while (a == ncclInProgress);
	}
	return 0;
}

static void two_close(struct two *t, bool abort_first)
{
	for (int k = 0; k < 2; k++)
		for (int r = 0; r < 2; r++) {
			cudaSetDevice(r);
			if (abort_first)
				ncclCommAbort(t->c[k][r]);
			cudaStreamSynchronize(t->s[k][r]);
			if (!abort_first)
				ncclCommDestroy(t->c[k][r]);
			cudaStreamDestroy(t->s[k][r]);
			cudaFree(t->buf[k][r]);
		}
}

/* Communicator k's all-reduce on rank r's stream. */
static void allreduce(struct two *t, int k, int r)
{
	cudaSetDevice(r);
	ncclAllReduce(t->buf[k][r], t->buf[k][r], 64, ncclFloat32, ncclSum, t->c[k][r], t->s[k][r]);
}

struct issuer {
	struct two *t;
	int k;
	pthread_mutex_t *serial; /* NULL: none */
};

/* One group of communicator k's two ranks, held open a while. */
static void *issue_group(void *arg)
{
	struct issuer *is = arg;

	if (is->serial)
		pthread_mutex_lock(is->serial);
	ncclGroupStart();
	allreduce(is->t, is->k, 0);
	allreduce(is->t, is->k, 1);
	usleep(100000);
	ncclGroupEnd();
	if (is->serial)
		pthread_mutex_unlock(is->serial);
	return NULL;
}

static void two_threads(bool serialised, unsigned *ret_violations, char *first, size_t len)
{
	pthread_mutex_t serial = PTHREAD_MUTEX_INITIALIZER;
	struct issuer is[2];
	struct cudadouble_stats s;
	pthread_t thr[2];
	struct two t;

	reset(2);
	*ret_violations = ~0u;
	if (two_open(&t) != 0)
		return;
	for (int k = 0; k < 2; k++) {
		is[k] = (struct issuer){.t = &t, .k = k, .serial = serialised ? &serial : NULL};
		pthread_create(&thr[k], NULL, issue_group, &is[k]);
		usleep(20000);
	}
	for (int k = 0; k < 2; k++)
		pthread_join(thr[k], NULL);
	two_close(&t, false);
	cudadouble_stats(&s);
	*ret_violations = s.violations;
	snprintf(first, len, "%s", s.first_violation);
}

static void t_nccl_two_threads_one_device(void)
{
	char first[256];
	unsigned v;

	two_threads(true, &v, first, sizeof(first));
	CHECK(v == 0, "serialised per device: %u violations (%s)", v, first);
	two_threads(false, &v, first, sizeof(first));
	CHECK(v > 0 && strstr(first, "two threads issue NCCL work to communicators of device 0"),
	      "two threads at once on devices 0 and 1: %u violations (%s)", v, first);
}

static atomic_int finished_;

static void finished_fn(void *arg)
{
	(void)arg;
	atomic_fetch_add(&finished_, 1);
}

/* Device 0 launches A then B; device 1 `same` ? A then B : B then A. The
 * collectives finished after `wait_ms`. */
static int launch_order(bool same, int wait_ms)
{
	const int order[2][2] = {{0, 1}, {same ? 0 : 1, same ? 1 : 0}};
	struct two t;
	int done;

	reset(2);
	atomic_store(&finished_, 0);
	if (two_open(&t) != 0)
		return -1;
	for (int r = 0; r < 2; r++)
		for (int i = 0; i < 2; i++) {
			int k = order[r][i];
			allreduce(&t, k, r);
			cudaLaunchHostFunc(t.s[k][r], finished_fn, NULL);
		}
	for (int i = 0; i < wait_ms / 10 && atomic_load(&finished_) < 4; i++)
		usleep(10000);
	done = atomic_load(&finished_);
	two_close(&t, done < 4); /* a hang ends by abort, as zerod's watchdog would */
	return done;
}

static void t_nccl_launch_order(void)
{
	int done;

	done = launch_order(true, 5000);
	CHECK(done == 4, "one launch order on both devices: %d of 4 collectives done", done);
	done = launch_order(false, 1000);
	CHECK(done == 0,
	      "A then B on device 0, B then A on device 1: %d of 4 done, want a hang (0)", done);
	CHECK(violations() == 0, "%u violations", violations());
}

static const struct test_case cases[] = {
	{"fork_after_init_fails", t_fork_after_init},
	{"ipc_own_handle_refused", t_ipc_own_handle_refused},
	{"ipc_opened_twice_refcounted", t_ipc_opened_twice_refcounted},
	{"small_allocation_inside_block", t_small_allocation_inside_block},
	{"free_waits_for_device", t_free_waits_for_device},
	{"pageable_copy_lands_later", t_pageable_copy_lands_later},
	{"host_functions_one_at_a_time", t_host_functions_one_at_a_time},
	{"imported_event_outlives_exporter", t_imported_event_outlives_exporter},
	{"imported_memory_dies_with_exporter", t_imported_memory_dies_with_exporter},
	{"event_record_other_device_refused", t_event_record_other_device},
	{"event_elapsed_time_as_cuda", t_event_elapsed_time},
	{"nccl_two_threads_one_device", t_nccl_two_threads_one_device},
	{"nccl_launch_order_hangs", t_nccl_launch_order},
};

TEST_MAIN(cases)
