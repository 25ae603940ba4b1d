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
