/*
 * hostmem.h — the element loops the host backends share: a sum over the
 * local ranks' buffers and a store into a rank's buffer. coll/host.c and
 * optim/cpu.c both use them, so a reduction rounds the same whichever op runs
 * it.
 */
#ifndef ZEROD_HOSTMEM_H
#define ZEROD_HOSTMEM_H

#include <stddef.h>
#include <stdint.h>

#include "zeroclient.h"

/* Elements per host task: 32 KiB per buffer, so one chunk's gradients,
 * parameters and moments stay in L2 between the sum, the step and the
 * stores. */
#define HOST_CHUNK (8u * 1024u)

/* out[i] = (src[0][off+i] + src[1][off+i] + ... ) / div, summed in the order
 * of src. out must not alias any source. */
void host_sum(float *restrict out, const float *const *src, uint32_t nsrc, uint64_t off, size_t n,
	      float div);

/* dst[0..n) = src[0..n), with non-temporal stores: the destination is a
 * trainer's buffer that this pass will not read again. */
void host_store(float *restrict dst, const float *restrict src, size_t n);

/* The same for bf16/fp16 buckets (zeroclient.h, enum zc_dtype): each source
 * element widened to fp32, summed in the order of src in fp32, divided once
 * by div; then out[i] = widen(narrow(that)), the averaged gradient rounded to
 * the bucket's dtype, as the optimizer sees it. src[r] + off addresses
 * 16-bit elements. */
void host_sum_lowp(float *restrict out, const uint16_t *const *src, uint32_t nsrc, uint64_t off,
		   size_t n, float div, enum zc_dtype t);

/* dst[i] = narrow(src[i]) to dtype t (round to nearest even). */
void host_narrow(uint16_t *restrict dst, const float *restrict src, size_t n, enum zc_dtype t);

/* dst[i] = widen(src[i]) from dtype t (exact). */
void host_widen(float *restrict dst, const uint16_t *restrict src, size_t n, enum zc_dtype t);

/* zc_params_changed(): master[i] = widen(p[i]) where p[i] is not
 * narrow(master[i]) (an edit; two NaNs count as equal); the other masters
 * keep their fp32 values, which the parameters round. */
void host_reload(float *restrict master, const uint16_t *restrict p, size_t n, enum zc_dtype t);

#endif
