/*
 * lowp.h — the conversions between fp32 and the low-precision parameter
 * types (bf16, fp16), on bit patterns, so they round the same whatever the
 * compiler and the machine: zeroclient.h's enum zc_dtype states the rules.
 *
 * Widening is exact. Narrowing rounds to nearest, ties to even (IEEE 754
 * roundTiesToEven): overflow becomes inf of the value's sign, fp16 results
 * below 2^-14 become subnormals rounded the same way, a NaN stays a quiet NaN
 * of its sign keeping the top bits of its payload.
 *
 * Host and device (hd.h): the CUDA kernels (kern.h) round with these very
 * functions, so a bf16/fp16 job on the GPU rounds as on the CPU, bit for bit.
 */
#ifndef ZEROD_OPTIM_LOWP_H
#define ZEROD_OPTIM_LOWP_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "hd.h"
#include "zeroclient.h"

static inline ZD_HD uint32_t lowp_bits(float x)
{
	uint32_t u;

	memcpy(&u, &x, sizeof(u));
	return u;
}

static inline ZD_HD float lowp_float(uint32_t u)
{
	float x;

	memcpy(&x, &u, sizeof(x));
	return x;
}

/* bf16: fp32's top half. */
static inline ZD_HD float lowp_bf16_to_f32(uint16_t h)
{
	return lowp_float((uint32_t)h << 16);
}

static inline ZD_HD uint16_t lowp_f32_to_bf16(float x)
{
	uint32_t u = lowp_bits(x);

	if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: quiet, payload's top 7 bits */
		return (uint16_t)((u >> 16) | 0x0040u);
	/* add just under half an ulp, plus one if the kept part is odd (ties to
	 * even); a carry out of the mantissa steps the exponent, into inf past
	 * the largest finite value */
	return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* fp16: 1 sign, 5 exponent (bias 15), 10 mantissa bits. */
static inline ZD_HD float lowp_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;

	if (exp == 0x1f) /* inf, NaN (payload kept) */
		return lowp_float(sign | 0x7f800000u | (man << 13));
	if (exp == 0) {
		if (man == 0)
			return lowp_float(sign);
		/* subnormal: man * 2^-24, exact in fp32 */
		exp = 1;
		while (!(man & 0x400u)) {
			man <<= 1;
			exp--;
		}
		man &= 0x3ffu;
		return lowp_float(sign | ((exp + 112u) << 23) | (man << 13));
	}
	return lowp_float(sign | ((exp + 112u) << 23) | (man << 13));
}

static inline ZD_HD uint16_t lowp_f32_to_f16(float x)
{
	uint32_t u = lowp_bits(x);
	uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
	uint32_t a = u & 0x7fffffffu;
	int32_t e = (int32_t)(a >> 23) - 127; /* unbiased exponent */
	uint32_t man, shift, q, rest, half;

	if (a > 0x7f800000u) /* NaN: quiet, payload's top 10 bits */
		return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
	if (a == 0x7f800000u || e > 15) /* inf, or past fp16's range */
		return (uint16_t)(sign | 0x7c00u);
	if (e < -25) /* below half the smallest subnormal (2^-25): zero */
		return sign;
	man = (a & 0x7fffffu) | (e > -127 ? 0x800000u : 0); /* 24 significant bits */
	/* keep 11 bits for a normal result; fewer for a subnormal one, whose
	 * last bit weighs 2^-24 */
	shift = e >= -14 ? 13u : (uint32_t)(13 + (-14 - e));
	q = man >> shift;
	rest = man & ((1u << shift) - 1u);
	half = 1u << (shift - 1);
	if (rest > half || (rest == half && (q & 1u)))
		q++;
	if (e >= -14) /* normal: the implicit bit goes, the exponent comes in;
		       * a carry into the exponent is right, up to inf */
		return (uint16_t)(sign | ((((uint32_t)(e + 15) << 10) + (q - 0x400u))));
	return (uint16_t)(sign | q); /* subnormal, or the smallest normal by a carry */
}

/* Element k of a buffer of dtype dt, widened (exact). */
static inline ZD_HD float lowp_get(const void *buf, uint64_t k, enum zc_dtype dt)
{
	const uint16_t *h = (const uint16_t *)buf;

	return dt == ZC_DTYPE_F32    ? ((const float *)buf)[k]
	       : dt == ZC_DTYPE_BF16 ? lowp_bf16_to_f32(h[k])
				     : lowp_f16_to_f32(h[k]);
}

/* x narrowed to dt (bf16 or fp16), as a bit pattern. */
static inline ZD_HD uint16_t lowp_narrow(float x, enum zc_dtype dt)
{
	return dt == ZC_DTYPE_BF16 ? lowp_f32_to_bf16(x) : lowp_f32_to_f16(x);
}

/* Store x into element k (rounded to nearest even for bf16/fp16); what the
 * element now holds, widened. */
static inline ZD_HD float lowp_put(void *buf, uint64_t k, enum zc_dtype dt, float x)
{
	uint16_t *h = (uint16_t *)buf;

	if (dt == ZC_DTYPE_F32)
		return ((float *)buf)[k] = x;
	h[k] = lowp_narrow(x, dt);
	return lowp_get(buf, k, dt);
}

/* A bf16/fp16 parameter p still is the narrowed master nar: equal bits, or
 * both NaN (loading a signalling NaN's master quietens it). */
static inline ZD_HD bool lowp_same(uint16_t p, uint16_t nar, enum zc_dtype dt)
{
	uint16_t exp = dt == ZC_DTYPE_BF16 ? 0x7f80 : 0x7c00;
	bool pn = (p & exp) == exp && (p & ~exp & 0x7fff);
	bool nn = (nar & exp) == exp && (nar & ~exp & 0x7fff);

	return p == nar || (pn && nn);
}

#endif
