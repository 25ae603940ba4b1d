/*
 * kern.cu — the CUDA optimizer kernels: grid-stride loops over kern.h's
 * per-item bodies: the step with one specialisation per optimizer family so
 * a launch carries only its own arithmetic, one kernel for the rest
 * (masters, the norm's chunks, clipping). Everything else (which pieces, which
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

/* Everything but the step: masters, the norm's chunks, clipping. */
__global__ void __launch_bounds__(THREADS) optim_kernel_other(const optim_kern a)
{
	const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
	const uint64_t items = optim_kern_items(&a);

	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < items; i += stride)
		optim_kern_item(&a, i);
}

extern "C" cudaError_t optim_cuda_launch(const struct optim_kern *a, cudaStream_t s)
{
	uint64_t want = (optim_kern_items(a) + THREADS - 1) / THREADS;
	unsigned blocks = want < MAX_BLOCKS ? (unsigned)want : MAX_BLOCKS;

	if (a->n == 0)
		return cudaSuccess;
	if (a->op != OPTIM_KOP_STEP)
		optim_kernel_other<<<blocks, THREADS, 0, s>>>(*a);
	else if (a->kind == ZC_OPT_SGD)
		optim_kernel<true><<<blocks, THREADS, 0, s>>>(*a);
	else
		optim_kernel<false><<<blocks, THREADS, 0, s>>>(*a);
	return cudaGetLastError();
}
