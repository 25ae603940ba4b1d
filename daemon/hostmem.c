/*
 * hostmem.c — see hostmem.h. The sum keeps the foundation's order (copy the
 * first rank, add the others in rank order, one division), so results are
 * bit-identical whatever the chunking.
 */
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "common.h"
#include "hostmem.h"

ZEROD_SIMD_CLONES void host_sum(float *restrict out, const float *const *src, uint32_t nsrc,
				uint64_t off, size_t n, float div)
{
	const float *restrict s0 = src[0] + off;

	for (size_t i = 0; i < n; i++)
		out[i] = s0[i];
	for (uint32_t r = 1; r < nsrc; r++) {
		const float *restrict sr = src[r] + off;
		for (size_t i = 0; i < n; i++)
			out[i] += sr[i];
	}
	for (size_t i = 0; i < n; i++)
		out[i] /= div;
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
