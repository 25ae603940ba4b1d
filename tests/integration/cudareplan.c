/*
 * cudareplan.c — re-planning a CUDA job (test_cudajob's replan_* cases), on
 * the CUDA test double: statefix.h's job on CUDA buffers, whose ranks re-plan
 * between iterations with zc_register_buffers(ZC_BUFFERS_CUDA) of new device
 * buffers (new IPC handles, new event rings) and zc_register_plan(). Each
 * rank copies its parameters into the new buffers by the new layout with
 * cudaMemcpy (the trainer owns CUDA buffers: the library copies no device
 * memory), and the state (moments, steps, bf16/fp16 masters) must move to
 * the new layout by param_id without loss: the run ends bit for bit where
 * the layout-independent reference, or a run on the second layout from the
 * same state, ends.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cudareplan.h"
#include "testlib.h"

#define NDEV 4 /* ZEROD_CUDADOUBLE_DEVICES (tests/meson.build) */

const struct layout crp_layouts[] = {
	{3, {{0, 1, -1}, {2, -1}, {3, 4, 5, -1}}},
	{4, {{5, 3, -1}, {4, 2, -1}, {1, -1}, {0, -1}}},
	{1, {{2, 0, 4, 1, 5, 3, -1}}},
	{3, {{0, -1}, {1, 2, 3, -1}, {4, 5, -1}}},
	/* for sf_lowp: each bucket of one dtype */
	{3, {{0, 3, -1}, {1, 4, -1}, {2, 5, -1}}},
	{4, {{5, 2, -1}, {1, -1}, {4, -1}, {3, 0, -1}}},
};

static cudaStream_t stream_;

int crp_buffers(zc_client *c, const struct tplan *tp, char **ret_base)
{
	struct zc_buffers b = ZC_BUFFERS_INIT;
	uint64_t bytes;
	char *base;
	int r;

	if ((r = zc_plan_buffer_bytes(&tp->plan, &bytes)) < 0)
		return r;
	if (cudaMalloc((void **)&base, 2 * bytes + 512) != cudaSuccess)
		return -ENOMEM;
	b.kind = ZC_BUFFERS_CUDA;
	b.grad_dev = base + 256;
	b.param_dev = base + 256 + bytes;
	r = zc_register_buffers(c, &tp->plan, &b);
	if (r < 0)
		cudaFree(base);
	else
		*ret_base = base;
	return r;
}

/* Each parameter from where tp has it to where tp2 has it, device to
 * device, on the rank's stream: what a trainer does before re-registering. */
static int copy_params(zc_client *c, const struct tplan *tp, const void *const *from,
		       const struct tplan *tp2)
{
	for (int k = 0; k < NP; k++) {
		unsigned es = dtype_of(k) == ZC_DTYPE_F32 ? 4 : 2;
		char *dst = zc_param_ptr(c, tp2->bucket_of[k]);
		const char *src = from[tp->bucket_of[k]];

		if (!dst)
			return -1;
		dst += tp2->segs[tp2->bucket_of[k]][tp2->seg_of[k]].offset * es;
		src += tp->segs[tp->bucket_of[k]][tp->seg_of[k]].offset * es;
		if (cudaMemcpyAsync(dst, src, params[k].numel * es, cudaMemcpyDeviceToDevice,
				    stream_) != cudaSuccess)
			return -EIO;
	}
	return cudaStreamSynchronize(stream_) == cudaSuccess ? 0 : -EIO;
}

int crp_step(zc_client *c, uint64_t t, void *stream)
{
	zc_future *step = NULL;
	int r = zc_step_future(c, t, &step);

	if (r >= 0)
		r = zc_future_wait(step, test_timeout(30000));
	if (r == 0)
		r = ZC_ETIMEDOUT;
	if (r > 0)
		r = zc_step_wait_cuda(step, stream);
	if (r >= 0 && cudaStreamSynchronize(stream) != cudaSuccess)
		r = -EIO;
	zc_future_free(step);
	return r < 0 ? r : 0;
}

static int one_iteration(zc_client *c, const struct crp_script *sc, const struct tplan *tp,
			 uint32_t rank, int it)
{
	uint64_t t = zc_iteration(c);
	int r;

	if ((r = sf_fill_grads(c, tp, sc->seed, rank, it)) < 0)
		return r;
	for (uint32_t b = 0; b < tp->plan.nbuckets; b++)
		if ((r = zc_bucket_ready_cuda(c, b, stream_, NULL)) < 0)
			return r;
	return crp_step(c, t, stream_);
}

/* The re-plan before iteration `it`: 1 it took, 0 it was refused as the
 * case expects (the job goes on with the plan it had), < 0 an error. */
static int replan(zc_client *c, const struct crp_script *sc, struct tplan *tp, struct tplan *tp2,
		  char **base, uint32_t rank, const char **step)
{
	const void *old[MAXB];
	char *nbase = NULL;
	int r;

	make_plan(tp2, &crp_layouts[sc->replan_layout], sc->opt, sc->shard2, sc->step, sc->ids);
	if (sc->replan_regroup) /* a parameter moved to another group */
		tp2->segs[0][0].group = (tp2->segs[0][0].group + 1) % 3;
	for (uint32_t b = 0; b < tp->plan.nbuckets; b++)
		old[b] = zc_param_ptr(c, b);
	if (sc->replan_code) { /* the library allocates no device memory */
		r = zc_alloc_buffers(c, &tp2->plan);
		EXPECT(r == ZC_ESTATE && strstr(zc_error_message(), "zc_register_buffers"),
		       "rank %u: zc_alloc_buffers() re-planning CUDA buffers: %s: %s", rank,
		       zc_strerror_name(r), zc_error_message());
	}
	*step = "re-plan: register_buffers";
	r = crp_buffers(c, tp2, &nbase);
	if (r < 0 && sc->replan_code && r == sc->replan_code) {
		printf("# rank %u: re-plan refused: %s\n", rank, zc_error_message());
		EXPECT(zc_param_ptr(c, 0) == old[0],
		       "rank %u: a refused re-plan left the client off its buffers", rank);
		return 0;
	}
	if (r < 0)
		return r;
	EXPECT(!sc->replan_code, "rank %u: the re-plan was taken, not refused with %s", rank,
	       zc_strerror_name(sc->replan_code));
	*step = "re-plan: copying the parameters";
	r = copy_params(c, tp, old, tp2);
	if (r >= 0) {
		*step = "re-plan: register_plan";
		r = zc_register_plan(c);
	}
	if (r < 0)
		return r;
	cudaFree(*base); /* zerod closed its handles of the old buffers */
	*base = nbase;
	return 1;
}

int crp_rank(void *arg, int idx)
{
	const struct crp_script *sc = arg;
	uint32_t rank = (uint32_t)idx;
	struct zc_config cfg = test_config(sc->zd, sc->job, rank, sc->world);
	struct tplan *tp = calloc(1, sizeof(*tp)), *tp2 = calloc(1, sizeof(*tp2));
	struct snap *got = calloc(1, sizeof(*got));
	zc_client *c = NULL;
	char *base = NULL;
	const char *step = "connect";
	int r;

	cfg.register_timeout_ms = test_timeout(20000);
	if (sc->nnodes > 1) {
		cfg.socket = sc->socks[sc->node_of[rank]];
		sf_config_nodes(&cfg, rank, sc->world, sc->node_of, sc->nnodes, sc->rdzv,
				"cuda replan secret");
	}
	make_plan(tp, &crp_layouts[sc->layout], sc->opt, sc->shard, sc->step, sc->ids);
	if (cudaSetDevice((int)(rank % NDEV)) != cudaSuccess ||
	    cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking) != cudaSuccess)
		r = -ENODEV;
	else
		r = zc_connect(&cfg, &c);
	if (r >= 0) {
		step = "register_buffers";
		r = crp_buffers(c, tp, &base);
	}
	if (r >= 0)
		r = sf_begin(c, tp, sc->opt, sc->load ? sc->in : NULL, sc->seed, &step);
	for (int it = sc->start; r >= 0 && it < sc->start + sc->iters; it++) {
		step = "set_hyper";
		if ((r = sf_hyper_at(c, tp, it)) < 0)
			break;
		if (it == sc->replan_at) {
			r = replan(c, sc, tp, tp2, &base, rank, &step);
			if (r > 0) {
				struct tplan *t = tp;
				tp = tp2, tp2 = t;
			}
			if (r < 0)
				break;
		}
		step = "iteration";
		r = one_iteration(c, sc, tp, rank, it);
	}
	if (r >= 0) {
		step = "get_state";
		r = export_snap(c, tp, sc->opt, got);
	}
	if (r < 0) {
		EXPECT(0, "%s rank %u: %s: %s: %s", sc->job, rank, step, zc_strerror_name(r),
		       zc_error_message());
	} else {
		if (sc->want)
			EXPECT(snap_compare(sc->job, got, sc->want, sc->opt) == 0,
			       "rank %u: differs from the reference", rank);
		if (sc->out && rank == 0)
			*sc->out = *got;
	}
	zc_close(c);
	free(tp);
	free(tp2);
	free(got);
	return child_bad;
}
