/*
 * hd.h — how the element functions shared by the CPU and CUDA backends are
 * declared: __host__ __device__ under nvcc (kern.cu compiles them for the
 * device), plain C functions otherwise (optim/cpu.c, gradpass.c, hostmem.c,
 * and the test double, which runs the kernels' bodies on the host).
 */
#ifndef ZEROD_OPTIM_HD_H
#define ZEROD_OPTIM_HD_H

#if defined(__CUDACC__)
#define ZD_HD     __host__ __device__
#define ZD_INLINE __forceinline__
#else
#define ZD_HD
/* The CPU kernels vectorise only once the element function is inlined into
 * the loop, so it must not be left to heuristics. */
#define ZD_INLINE inline __attribute__((always_inline))
#endif

#endif
