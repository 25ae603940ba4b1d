/*
 * cudarecover.c — recovery of a CUDA job from zerod's memory (test_cudajob's
 * recover_* cases), on the CUDA test double. A trainer's device memory dies
 * with it (the double turns memory imported from an exited process into
 * garbage, NaN), so zerod must hold what the job needs: its state and, for
 * fp32 parameters, the copy of each owned piece it keeps current after
 * every step (bf16/fp16: the masters). The restarted ranks bring new device
 * buffers; zerod writes the parameters into them. Where a death leaves
 * nothing exact to go back to on CUDA buffers (the step had every bucket
 * and would read the dead trainer's memory; an interleaved iteration partly
 * stepped, with no undo journal on the devices) the job fails with
 * ZC_ERANKDEAD saying so.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "cudarecover.h"
#include "cudareplan.h"
#include "testlib.h"

#define NDEV 4 /* ZEROD_CUDADOUBLE_DEVICES (tests/meson.build) */

static cudaStream_t stream_;

static void die(void)
{
	fflush(stdout);
	raise(SIGKILL);
}

/* On the victim's stream: the events behind it never complete. */
static void hold_forever(void *arg)
{
	(void)arg;
	for (;;)
		pause();
}

static int one_iteration(zc_client *c, const struct crc_script *sc, const struct tplan *tp,
			 uint32_t rank)
{
	uint64_t t = zc_iteration(c);
	bool victim = sc->armed && rank == sc->victim && t == (uint64_t)sc->kill_iter;
	uint32_t nb = tp->plan.nbuckets;
	int r;

	if (victim && sc->phase == CRC_BEFORE_FIRST)
		die();
	if ((r = sf_fill_grads(c, tp, sc->seed, rank, (int)t)) < 0)
		return r;
	for (uint32_t b = 0; b < nb; b++) {
		if (victim && sc->phase == CRC_BETWEEN && b == nb / 2 + 1) {
			usleep(100 * 1000); /* the others' first buckets are in */
			die();
		}
		if (victim && sc->phase == CRC_DURING_STEP && b == nb - 1 &&
		    cudaLaunchHostFunc(stream_, hold_forever, NULL) != cudaSuccess)
			return -EIO;
		if ((r = zc_bucket_ready_cuda(c, b, stream_, NULL)) < 0)
			return r;
	}
	if (victim && sc->phase == CRC_DURING_STEP) {
		usleep(200 * 1000); /* every bucket is in; the last one's event never completes */
		die();
	}
	return crp_step(c, t, stream_);
}

/* The end of a rank that could not train on: what it was told. */
static int ended(struct crc_script *sc, zc_client *c, uint32_t rank, const char *what, int r)
{
	printf("# %s rank %u: %s: %s: %s\n", sc->job, rank, what, zc_strerror_name(r),
	       zc_error_message());
	if (!(sc->armed && zc_error_recoverable(r))) {
		atomic_store(&sc->fatal_code[rank], r);
		snprintf(sc->fatal_msg[rank], sizeof(sc->fatal_msg[rank]), "%s",
			 zc_error_message());
	}
	zc_close(c);
	return sc->armed && zc_error_recoverable(r) ? CRC_EXIT_LOST : CRC_EXIT_FATAL;
}

int crc_rank(void *arg, int idx)
{
	struct crc_script *sc = arg;
	uint32_t rank = (uint32_t)idx;
	struct zc_config cfg = test_config(sc->zd, sc->job, rank, sc->world);
	struct tplan *tp = calloc(1, sizeof(*tp));
	struct snap *got = calloc(1, sizeof(*got));
	const char *what = "connect";
	zc_client *c = NULL;
	uint64_t at = 0;
	int r;

	cfg.register_timeout_ms = test_timeout(30000);
	make_plan(tp, &crp_layouts[sc->layout], sc->opt, sc->shard, sc->step, true);
	if (!tp || !got || cudaSetDevice((int)(rank % NDEV)) != cudaSuccess ||
	    cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking) != cudaSuccess)
		return 1;
	r = zc_connect(&cfg, &c);
	if (r >= 0) {
		char *base;

		what = "register_buffers";
		r = crp_buffers(c, tp, &base);
	}
	/* the trainer's own initial values: a recovery overwrites them */
	if (r >= 0)
		r = sf_begin(c, tp, sc->opt, NULL, sc->seed + 1000 * (uint64_t)sc->restarted,
			     &what);
	if (r >= 0) {
		what = "zc_recovered";
		r = zc_recovered(c, &at);
		if (r >= 0 && sc->restarted)
			atomic_store(&sc->recovered[rank], r == 1 ? (long long)at : -1);
		EXPECT(r == sc->restarted, "%s rank %u: zc_recovered() %d, want %d", sc->job, rank,
		       r, sc->restarted);
	}
	while (r >= 0 && (int)zc_iteration(c) < sc->iters) {
		uint64_t t = zc_iteration(c);

		if (sc->armed && rank == sc->victim && sc->phase == CRC_BETWEEN_ITERS &&
		    t == (uint64_t)sc->kill_iter)
			die();
		what = "iteration";
		r = one_iteration(c, sc, tp, rank);
		if (r >= 0)
			atomic_store(&sc->seen[rank], (int)t + 1);
	}
	if (r < 0) {
		free(tp);
		free(got);
		return ended(sc, c, rank, what, r);
	}
	r = export_snap(c, tp, sc->opt, got);
	EXPECT(r >= 0, "%s rank %u: export: %s", sc->job, rank, zc_strerror_name(r));
	if (r >= 0 && sc->want)
		EXPECT(snap_compare(sc->job, got, sc->want, sc->opt) == 0,
		       "%s rank %u: differs from the uninterrupted run", sc->job, rank);
	if (r >= 0 && sc->out && rank == 0)
		*sc->out = *got;
	zc_close(c);
	free(tp);
	free(got);
	return child_bad;
}
