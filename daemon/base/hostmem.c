/*
 * hostmem.c — see hostmem.h. The sum keeps the foundation's order (copy the
 * first rank, add the others in rank order, one division), so results are
 * bit-identical whatever the chunking.
 */
#include <stdbool.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "common.h"
#include "base/hostmem.h"
#include "lowp.h"

ZEROD_SIMD_CLONES void host_sum(float *restrict out, const float *const *src, uint32_t nsrc,
				uint64_t off, size_t n, float div)
{
	const float *restrict s0 = src[0] + off;

	/* The same operations in the same order as copy, add each, divide
	 * (so the same bits), in as few passes as that allows: the first two
	 * sources are read together (two streams keep more loads in flight
	 * than one), and the divide joins the last add. */
	if (nsrc == 1) {
		for (size_t i = 0; i < n; i++)
			out[i] = s0[i] / div;
		return;
	}
	const float *restrict s1 = src[1] + off;
	if (nsrc == 2) {
		for (size_t i = 0; i < n; i++)
			out[i] = (s0[i] + s1[i]) / div;
		return;
	}
	for (size_t i = 0; i < n; i++)
		out[i] = s0[i] + s1[i];
	for (uint32_t r = 2; r + 1 < nsrc; r++) {
		const float *restrict sr = src[r] + off;
		for (size_t i = 0; i < n; i++)
			out[i] += sr[i];
	}
	const float *restrict sl = src[nsrc - 1] + off;
	for (size_t i = 0; i < n; i++)
		out[i] = (out[i] + sl[i]) / div;
}

void host_store(float *restrict dst, const float *restrict src, size_t n)
{
#if defined(__x86_64__)
	size_t i = 0;

	/* scalar head up to a 16-byte boundary, streaming body, scalar tail */
	while (i < n && ((uintptr_t)(dst + i) & 15))
		dst[i] = src[i], i++;
	for (; i + 4 <= n; i += 4)
		_mm_stream_ps(dst + i, _mm_loadu_ps(src + i));
	for (; i < n; i++)
		dst[i] = src[i];
	_mm_sfence();
#else
	memcpy(dst, src, n * sizeof(float));
#endif
}

/* bf16 and fp16 each get their own loops: the conversion inlines into them
 * (a branch per element would keep them from vectorising). */
#define LOWP_LOOPS(sfx, widen, narrow)                                                             \
	static ZEROD_SIMD_CLONES void sum_##sfx(float *restrict out, const uint16_t *const *src,    \
						uint32_t nsrc, uint64_t off, size_t n, float div)   \
	{                                                                                          \
		const uint16_t *restrict s0 = src[0] + off;                                        \
		for (size_t i = 0; i < n; i++)                                                     \
			out[i] = widen(s0[i]);                                                     \
		for (uint32_t r = 1; r < nsrc; r++) {                                              \
			const uint16_t *restrict sr = src[r] + off;                                \
			for (size_t i = 0; i < n; i++)                                             \
				out[i] += widen(sr[i]);                                            \
		}                                                                                  \
		for (size_t i = 0; i < n; i++)                                                     \
			out[i] = widen(narrow(out[i] / div));                                      \
	}                                                                                          \
	static ZEROD_SIMD_CLONES void narrow_##sfx(uint16_t *restrict dst,                         \
						   const float *restrict src, size_t n)            \
	{                                                                                          \
		for (size_t i = 0; i < n; i++)                                                     \
			dst[i] = narrow(src[i]);                                                   \
	}                                                                                          \
	static ZEROD_SIMD_CLONES void widen_##sfx(float *restrict dst,                             \
						  const uint16_t *restrict src, size_t n)          \
	{                                                                                          \
		for (size_t i = 0; i < n; i++)                                                     \
			dst[i] = widen(src[i]);                                                    \
	}

LOWP_LOOPS(bf16, lowp_bf16_to_f32, lowp_f32_to_bf16)
LOWP_LOOPS(f16, lowp_f16_to_f32, lowp_f32_to_f16)

void host_sum_lowp(float *restrict out, const uint16_t *const *src, uint32_t nsrc, uint64_t off,
		   size_t n, float div, enum zc_dtype t)
{
	if (t == ZC_DTYPE_BF16)
		sum_bf16(out, src, nsrc, off, n, div);
	else
		sum_f16(out, src, nsrc, off, n, div);
}

void host_narrow(uint16_t *restrict dst, const float *restrict src, size_t n, enum zc_dtype t)
{
	if (t == ZC_DTYPE_BF16)
		narrow_bf16(dst, src, n);
	else
		narrow_f16(dst, src, n);
}

void host_widen(float *restrict dst, const uint16_t *restrict src, size_t n, enum zc_dtype t)
{
	if (t == ZC_DTYPE_BF16)
		widen_bf16(dst, src, n);
	else
		widen_f16(dst, src, n);
}

void host_reload(float *restrict master, const uint16_t *restrict p, size_t n, enum zc_dtype t)
{
	bool bf = t == ZC_DTYPE_BF16;

	for (size_t i = 0; i < n; i++) {
		uint16_t now = bf ? lowp_f32_to_bf16(master[i]) : lowp_f32_to_f16(master[i]);
		float x = bf ? lowp_bf16_to_f32(p[i]) : lowp_f16_to_f32(p[i]);
		if (p[i] != now && !(x != x && master[i] != master[i]))
			master[i] = x;
	}
}
