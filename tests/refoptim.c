/*
 * refoptim.c — the reference optimizers (see refoptim.h).
 */
#include <math.h>

#include "refoptim.h"

void ref_sgd(const struct zc_param_group *h, float *p, const float *g, float *m, bool first,
	     uint64_t n)
{
	for (uint64_t i = 0; i < n; i++) {
		float d = h->maximize ? -g[i] : g[i];
		if (h->weight_decay != 0)
			d = d + (float)h->weight_decay * p[i];
		if (h->momentum != 0) {
			if (first)
				m[i] = d;
			else
				m[i] = (float)h->momentum * m[i] + (float)(1 - h->dampening) * d;
			d = h->nesterov ? d + (float)h->momentum * m[i] : m[i];
		}
		p[i] = p[i] - (float)h->lr * d;
	}
}

void ref_adam(bool decoupled, const struct zc_param_group *h, uint64_t step, float *p,
	      const float *g, float *m, float *v, float *vmax, uint64_t n)
{
	double bc1 = 1 - pow(h->beta1, (double)step), bc2 = 1 - pow(h->beta2, (double)step);
	double ss = h->lr / bc1, r2 = sqrt(bc2);

	for (uint64_t i = 0; i < n; i++) {
		float gi = h->maximize ? -g[i] : g[i], den;
		if (decoupled)
			p[i] = p[i] * (float)(1 - h->lr * h->weight_decay);
		else if (h->weight_decay != 0)
			gi = gi + (float)h->weight_decay * p[i];
		m[i] = m[i] * (float)h->beta1 + (float)(1 - h->beta1) * gi;
		v[i] = v[i] * (float)h->beta2 + ((float)(1 - h->beta2) * gi) * gi;
		if (h->amsgrad) {
			vmax[i] = vmax[i] > v[i] ? vmax[i] : v[i];
			den = sqrtf(vmax[i]) / (float)r2 + (float)h->eps;
		} else {
			den = sqrtf(v[i]) / (float)r2 + (float)h->eps;
		}
		p[i] = p[i] + ((float)(-ss) * m[i]) / den;
	}
}

float ref_clip_coef(double max_norm, double total_norm)
{
	double c = max_norm / (total_norm + 1e-6);

	return c >= 1.0 ? 1.0f : (float)c;
}

/* bf16: 8 exponent bits, 7 mantissa bits; fp16: 5 and 10. */
static void lowp_bits_of(enum zc_dtype t, int *ebits, int *mbits)
{
	*ebits = t == ZC_DTYPE_BF16 ? 8 : 5;
	*mbits = t == ZC_DTYPE_BF16 ? 7 : 10;
}

double ref_lowp_value(uint16_t h, enum zc_dtype t)
{
	int eb, mb;

	lowp_bits_of(t, &eb, &mb);
	int bias = (1 << (eb - 1)) - 1;
	uint32_t e = (h >> mb) & ((1u << eb) - 1), m = h & ((1u << mb) - 1);
	double v = e ? ldexp(1.0 + ldexp((double)m, -mb), (int)e - bias)
		     : ldexp((double)m, 1 - bias - mb);
	if (e == (1u << eb) - 1)
		v = m ? NAN : INFINITY;
	return (h >> (eb + mb)) & 1 ? -v : v;
}

float ref_lowp_widen(uint16_t h, enum zc_dtype t)
{
	return (float)ref_lowp_value(h, t);
}

uint16_t ref_lowp_round(float xf, enum zc_dtype t)
{
	int eb, mb;

	lowp_bits_of(t, &eb, &mb);
	uint16_t inf = (uint16_t)(((1u << eb) - 1) << mb);
	uint16_t sign = signbit(xf) ? (uint16_t)(1u << (eb + mb)) : 0;
	double ax = fabs((double)xf);
	uint16_t a = 0, b = inf; /* value(a) <= ax < value(b), b may be inf */

	if (isinf(xf))
		return (uint16_t)(sign | inf);
	while (b - a > 1) {
		uint16_t mid = (uint16_t)(a + (b - a) / 2);
		if (ref_lowp_value(mid, t) <= ax)
			a = mid;
		else
			b = mid;
	}
	if (ref_lowp_value(a, t) == ax)
		return (uint16_t)(sign | a);
	/* past the largest finite value, the next one would be 2^(emax + 1) */
	double hi = b == inf ? ldexp(1.0, (1 << (eb - 1))) : ref_lowp_value(b, t);
	double dlo = ax - ref_lowp_value(a, t), dhi = hi - ax;
	uint16_t q = dlo < dhi ? a : dhi < dlo ? b : (a & 1) ? b : a;
	return (uint16_t)(sign | q);
}
