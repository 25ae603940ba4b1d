/*
 * kern.cu — the CUDA optimizer kernels: grid-stride loops over kern.h's
 * per-item bodies: the step with one specialisation per optimizer family so
 * a launch carries only its own arithmetic, the norm's chunks a block each
 * (gradelem.h's lanes and tree), one kernel for the rest (masters,
 * clipping). Everything else (which pieces, which
 * device, the scalars, errors) is optim/cuda.c's, in C.
 *
 * Built with -fmad=false (meson.build): the rounding contract of optim.h,
 * the same as the CPU kernels' -ffp-contract=off.
 */
#include "optim/kern.h"

#define THREADS 256
/* Enough blocks to fill any current GPU several times over; past that each
 * thread loops, which costs nothing for a bandwidth-bound kernel. */
#define MAX_BLOCKS 65535u

template <bool SGD> __global__ void __launch_bounds__(THREADS) optim_kernel(const optim_kern a)
{
	const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;

	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.n; i += stride) {
		if (SGD)
			optim_kern_sgd(&a, i);
		else
			optim_kern_adam(&a, i);
	}
}

static_assert(THREADS == OPTIM_NORM_LANES, "a thread per lane of the norm's chunk");

/* The norm's chunks: block b takes chunks b, b + gridDim.x, ...; thread l
 * sums lane l (neighbouring threads read neighbouring elements), then the
 * block adds the lanes by gradelem.h's tree, level by level between
 * barriers: the host's optim_grad_measure, the same additions. */
__global__ void __launch_bounds__(THREADS) optim_kernel_measure(const optim_kern a)
{
	__shared__ double lane[THREADS];
	__shared__ uint32_t bad[THREADS];
	const uint64_t chunks = optim_kern_items(&a);
	const uint32_t l = threadIdx.x;

	for (uint64_t c = blockIdx.x; c < chunks; c += gridDim.x) {
		lane[l] = optim_grad_lane(a.g, c * OPTIM_NORM_CHUNK, optim_kern_chunk_n(&a, c), l,
					  a.dtype, a.scale, a.coef, &bad[l]);
		__syncthreads();
		for (uint32_t h = THREADS / 2; h > 0; h /= 2) {
			if (l < h) {
				optim_norm_tree_level(lane, h, l);
				bad[l] += bad[l + h];
			}
			__syncthreads();
		}
		if (l == 0) {
			a.sumsq[c] = lane[0];
			a.count[c] = bad[0];
		}
		__syncthreads(); /* lane 0 is read before the next chunk's lanes land */
	}
}

/* Everything but the step and the norm: masters, clipping. */
__global__ void __launch_bounds__(THREADS) optim_kernel_other(const optim_kern a)
{
	const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
	const uint64_t items = optim_kern_items(&a);

	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < items; i += stride)
		optim_kern_item(&a, i);
}

extern "C" cudaError_t optim_cuda_launch(const struct optim_kern *a, cudaStream_t s)
{
	/* a block per chunk for MEASURE, else a thread per item */
	uint64_t want = a->op == OPTIM_KOP_MEASURE ? optim_kern_items(a)
						   : (optim_kern_items(a) + THREADS - 1) / THREADS;
	unsigned blocks = want < MAX_BLOCKS ? (unsigned)want : MAX_BLOCKS;

	if (a->n == 0)
		return cudaSuccess;
	if (a->op == OPTIM_KOP_MEASURE)
		optim_kernel_measure<<<blocks, THREADS, 0, s>>>(*a);
	else if (a->op != OPTIM_KOP_STEP)
		optim_kernel_other<<<blocks, THREADS, 0, s>>>(*a);
	else if (a->kind == ZC_OPT_SGD)
		optim_kernel<true><<<blocks, THREADS, 0, s>>>(*a);
	else
		optim_kernel<false><<<blocks, THREADS, 0, s>>>(*a);
	return cudaGetLastError();
}
