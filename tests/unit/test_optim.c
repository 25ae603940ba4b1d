/*
 * test_optim.c — the CPU optimizer backend (daemon/optim/cpu.c) against
 * reference loops written here straight from the formulas in optim.h, bit for
 * bit, over several steps, random data and lengths that leave vector tails;
 * plus a few numbers derived by hand or known from torch; and the norm's
 * summation order (gradelem.h: lanes, then a tree), through gradpass.c,
 * against the contract written out here.
 *
 * The reference rounds every product through a volatile, so it can never be
 * contracted into an FMA whatever the flags: a kernel that contracts (or
 * reassociates) fails here instead of agreeing with an equally wrong oracle.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "base/hostmem.h"
#include "base/pool.h"
#include "exec/gradpass.h"
#include "optim/optim.h"
#include "plan.h"
#include "testlib.h"

/* Lengths: empty, one element, tails below and above one vector, and a large
 * run whose tail is odd. */
static const size_t lengths[] = {0, 1, 7, 33, 1000 + 3};
#define NSTEPS 5
#define GUARD  16
static const uint32_t SENTINEL = 0x7fa5a5a5; /* a NaN: poisons any read of it */

/* ------------------------------------------------------------- helpers --- */

static uint64_t rng_state;

static uint64_t rng_next(void)
{
	/* splitmix64: deterministic, so a failure reproduces. */
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Uniform double in [lo, hi). */
static double rng_range(double lo, double hi)
{
	return lo + (hi - lo) * ((double)(rng_next() >> 11) * 0x1p-53);
}

static float sentinel(void)
{
	float f;
	memcpy(&f, &SENTINEL, sizeof(f));
	return f;
}

/* A product rounded to float on its own, so it cannot fuse with an add. */
static float mul(float a, float b)
{
	volatile float r = a * b;
	return r;
}

/* n floats with GUARD sentinel floats on each side, starting off floats past
 * a 64-byte boundary so both aligned and unaligned starts are exercised. */
static float *guarded_alloc(size_t n, size_t off)
{
	size_t total = off + GUARD + n + GUARD;
	float *base = aligned_alloc(64, (total * sizeof(float) + 63) / 64 * 64);
	if (!base) {
		perror("aligned_alloc");
		exit(2);
	}
	for (size_t i = 0; i < total; i++)
		base[i] = sentinel();
	return base + off + GUARD;
}

static void guarded_free(float *a, size_t off)
{
	free(a - GUARD - off);
}

static void check_guards(const float *a, size_t n, const char *what, const char *ctx)
{
	for (size_t i = 0; i < GUARD; i++) {
		CHECK(memcmp(&a[-1 - (ptrdiff_t)i], &SENTINEL, 4) == 0, "%s: %s written before [0]",
		      ctx, what);
		CHECK(memcmp(&a[n + i], &SENTINEL, 4) == 0, "%s: %s written past [n-1]", ctx, what);
	}
}

/* Bit-exact comparison; reports the first difference only. */
static void check_same(const float *got, const float *want, size_t n, const char *what,
		       const char *ctx)
{
	for (size_t i = 0; i < n; i++) {
		if (memcmp(&got[i], &want[i], sizeof(float)) != 0) {
			CHECK(memcmp(&got[i], &want[i], sizeof(float)) == 0,
			      "%s: %s[%zu] = %a, want %a", ctx, what, i, got[i], want[i]);
			return;
		}
	}
}

/* ----------------------------------------------------------- reference --- */

static void ref_sgd(const struct zc_param_group *hp, bool first, float *p, const float *g, float *m,
		    size_t n)
{
	for (size_t i = 0; i < n; i++) {
		float d = hp->maximize ? -g[i] : g[i];
		if (hp->weight_decay != 0)
			d = d + mul((float)hp->weight_decay, p[i]);
		if (hp->momentum != 0) {
			if (first)
				m[i] = d;
			else
				m[i] = mul((float)hp->momentum, m[i]) +
				       mul((float)(1.0 - hp->dampening), d);
			if (hp->nesterov)
				d = d + mul((float)hp->momentum, m[i]);
			else
				d = m[i];
		}
		p[i] = p[i] - mul((float)hp->lr, d);
	}
}

static void ref_adam(enum zc_optimizer kind, const struct zc_param_group *hp, uint64_t step,
		     float *p, const float *g, float *m, float *v, float *vmax, size_t n)
{
	double bc1 = 1.0 - pow(hp->beta1, (double)step);
	double bc2 = 1.0 - pow(hp->beta2, (double)step);
	double step_size = hp->lr / bc1;
	double bc2_sqrt = sqrt(bc2);

	for (size_t i = 0; i < n; i++) {
		float grad = hp->maximize ? -g[i] : g[i];
		if (kind == ZC_OPT_ADAMW)
			p[i] = mul(p[i], (float)(1.0 - hp->lr * hp->weight_decay));
		else if (hp->weight_decay != 0)
			grad = grad + mul((float)hp->weight_decay, p[i]);
		m[i] = mul(m[i], (float)hp->beta1) + mul((float)(1.0 - hp->beta1), grad);
		v[i] = mul(v[i], (float)hp->beta2) + mul(mul((float)(1.0 - hp->beta2), grad), grad);
		float vv = v[i];
		if (hp->amsgrad) {
			if (isnan(v[i]) || isnan(vmax[i]))
				vmax[i] = NAN;
			else if (v[i] > vmax[i])
				vmax[i] = v[i];
			vv = vmax[i];
		}
		float den = sqrtf(vv) / (float)bc2_sqrt + (float)hp->eps;
		p[i] = p[i] + mul((float)-step_size, m[i]) / den;
	}
}

/* --------------------------------------------------------------- runner --- */

struct state {
	float *p, *m, *v, *vmax;
};

static void state_alloc(struct state *s, size_t n, size_t off)
{
	s->p = guarded_alloc(n, off);
	s->m = guarded_alloc(n, off);
	s->v = guarded_alloc(n, off);
	s->vmax = guarded_alloc(n, off);
}

static void state_free(struct state *s, size_t off)
{
	guarded_free(s->p, off);
	guarded_free(s->m, off);
	guarded_free(s->v, off);
	guarded_free(s->vmax, off);
}

static void state_copy(struct state *dst, const struct state *src, size_t n)
{
	memcpy(dst->p, src->p, n * sizeof(float));
	memcpy(dst->m, src->m, n * sizeof(float));
	memcpy(dst->v, src->v, n * sizeof(float));
	memcpy(dst->vmax, src->vmax, n * sizeof(float));
}

static void kernel_step(enum zc_optimizer kind, const struct zc_param_group *hp, uint64_t step,
			const struct state *s, const float *g, size_t lo, size_t hi)
{
	struct optim_args a = {
		.kind = kind,
		.hp = hp,
		.step = step,
		.first_momentum = step == 1,
		.param = s->p + lo,
		.grad = g + lo,
		.m = s->m + lo,
		.v = kind == ZC_OPT_SGD ? NULL : s->v + lo,
		.vmax = s->vmax + lo,
		.n = hi - lo,
	};
	optim_cpu_ops.step(&a);
}

static void ref_step(enum zc_optimizer kind, const struct zc_param_group *hp, uint64_t step,
		     const struct state *s, const float *g, size_t n)
{
	if (kind == ZC_OPT_SGD)
		ref_sgd(hp, step == 1, s->p, g, s->m, n);
	else
		ref_adam(kind, hp, step, s->p, g, s->m, s->v, s->vmax, n);
}

static void check_state(const struct state *got, const struct state *want, size_t n,
			const char *ctx)
{
	check_same(got->p, want->p, n, "param", ctx);
	check_same(got->m, want->m, n, "m", ctx);
	check_same(got->v, want->v, n, "v", ctx);
	check_same(got->vmax, want->vmax, n, "vmax", ctx);
	check_guards(got->p, n, "param", ctx);
	check_guards(got->m, n, "m", ctx);
	check_guards(got->v, n, "v", ctx);
	check_guards(got->vmax, n, "vmax", ctx);
}

/*
 * Steps kind with hp NSTEPS times over every length, from torch's fresh state,
 * with a new random gradient each step, and compares after every step: the
 * kernel on the whole range, the kernel on the range cut in two (as worker
 * threads would), and the reference. State the formulas must not read starts
 * as a NaN sentinel (SGD's buffer before the first step, everything unused),
 * so a stray read or write shows.
 */
static void run(enum zc_optimizer kind, const struct zc_param_group *hp, const char *name)
{
	for (size_t li = 0; li < sizeof(lengths) / sizeof(lengths[0]); li++) {
		size_t n = lengths[li], off = li % 4;
		struct state ref, whole, split;
		float *g = guarded_alloc(n, off);
		float *p0 = guarded_alloc(n, off);
		char ctx[192];

		state_alloc(&ref, n, off);
		state_alloc(&whole, n, off);
		state_alloc(&split, n, off);
		rng_state = 0x5eed0000 + n;
		for (size_t i = 0; i < n; i++) {
			ref.p[i] = (float)rng_range(-2, 2);
			if (kind != ZC_OPT_SGD) {
				ref.m[i] = 0;
				ref.v[i] = 0;
				if (hp->amsgrad)
					ref.vmax[i] = 0;
			}
		}
		memcpy(p0, ref.p, n * sizeof(float));
		state_copy(&whole, &ref, n);
		state_copy(&split, &ref, n);

		for (uint64_t t = 1; t <= NSTEPS; t++) {
			snprintf(ctx, sizeof(ctx), "%s n=%zu step=%llu", name, n,
				 (unsigned long long)t);
			for (size_t i = 0; i < n; i++)
				g[i] = (float)rng_range(-3, 3);
			ref_step(kind, hp, t, &ref, g, n);
			kernel_step(kind, hp, t, &whole, g, 0, n);
			kernel_step(kind, hp, t, &split, g, 0, n / 3);
			kernel_step(kind, hp, t, &split, g, n / 3, n);
			check_state(&whole, &ref, n, ctx);
			snprintf(ctx, sizeof(ctx), "%s n=%zu step=%llu (split)", name, n,
				 (unsigned long long)t);
			check_state(&split, &whole, n, ctx);
		}
		/* Not vacuous: the parameters really moved. */
		if (n > 0)
			CHECK(memcmp(p0, whole.p, n * sizeof(float)) != 0, "%s n=%zu: no update",
			      name, n);

		state_free(&ref, off);
		state_free(&whole, off);
		state_free(&split, off);
		guarded_free(g, off);
		guarded_free(p0, off);
	}
}

/* --------------------------------------------------------------- cases --- */

static struct zc_param_group sgd_hp(void)
{
	struct zc_param_group hp = ZC_PARAM_GROUP_INIT;
	hp.lr = 0.0123;
	return hp;
}

/* The state a job keeps: only the arrays its groups need. */
static void test_ops(void)
{
	struct zc_param_group g[2] = {ZC_PARAM_GROUP_INIT, ZC_PARAM_GROUP_INIT};
	static const struct {
		enum zc_optimizer kind;
		double momentum1;
		bool amsgrad1;
		unsigned want;
	} cases[] = {
		{ZC_OPT_SGD, 0, false, 0},
		{ZC_OPT_SGD, 0.9, false, PLAN_STATE_M},
		{ZC_OPT_ADAM, 0, false, PLAN_STATE_M | PLAN_STATE_V},
		{ZC_OPT_ADAM, 0, true, PLAN_STATE_M | PLAN_STATE_V | PLAN_STATE_VMAX},
		{ZC_OPT_ADAMW, 0, false, PLAN_STATE_M | PLAN_STATE_V},
		{ZC_OPT_ADAMW, 0, true, PLAN_STATE_M | PLAN_STATE_V | PLAN_STATE_VMAX},
	};

	CHECK(strcmp(optim_cpu_ops.name, "cpu") == 0, "name %s", optim_cpu_ops.name);
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		unsigned got;
		/* the second group decides: one group is enough to need an array */
		g[1].momentum = cases[i].momentum1;
		g[1].amsgrad = cases[i].amsgrad1;
		got = plan_state_arrays(cases[i].kind, g, 2);
		CHECK(got == cases[i].want, "case %zu: state %#x, want %#x", i, got, cases[i].want);
		CHECK(plan_state_arrays(cases[i].kind, g, 1) ==
			      (cases[i].kind == ZC_OPT_SGD ? 0u : (unsigned)(PLAN_STATE_M | PLAN_STATE_V)),
		      "case %zu: first group alone", i);
	}
}

static void test_sgd_plain(void)
{
	struct zc_param_group hp = sgd_hp();
	run(ZC_OPT_SGD, &hp, "sgd plain");
}

static void test_sgd_momentum(void)
{
	struct zc_param_group hp = sgd_hp();
	hp.momentum = 0.9;
	run(ZC_OPT_SGD, &hp, "sgd momentum");
}

static void test_sgd_dampening(void)
{
	struct zc_param_group hp = sgd_hp();
	hp.momentum = 0.85;
	hp.dampening = 0.3;
	run(ZC_OPT_SGD, &hp, "sgd dampening");
}

static void test_sgd_nesterov(void)
{
	struct zc_param_group hp = sgd_hp();
	hp.momentum = 0.9;
	hp.nesterov = true;
	run(ZC_OPT_SGD, &hp, "sgd nesterov");
}

static void test_sgd_weight_decay(void)
{
	struct zc_param_group hp = sgd_hp();
	hp.weight_decay = 0.01;
	run(ZC_OPT_SGD, &hp, "sgd weight_decay");
	hp.momentum = 0.9;
	run(ZC_OPT_SGD, &hp, "sgd weight_decay momentum");
}

static void test_sgd_maximize(void)
{
	struct zc_param_group hp = sgd_hp();
	hp.maximize = true;
	run(ZC_OPT_SGD, &hp, "sgd maximize");
	hp.momentum = 0.9;
	hp.weight_decay = 0.05;
	hp.nesterov = true;
	run(ZC_OPT_SGD, &hp, "sgd maximize momentum weight_decay nesterov");
}

/* The first step takes d as the buffer (no dampening, old contents ignored),
 * later steps blend: checked on one element whose buffer starts as a NaN. */
static void test_sgd_first_momentum(void)
{
	struct zc_param_group hp = sgd_hp();
	hp.lr = 0.5;
	hp.momentum = 0.5;
	hp.dampening = 0.5;
	float p = 1, g = 2, m = sentinel();
	struct optim_args a = {
		.kind = ZC_OPT_SGD,
		.hp = &hp,
		.step = 1,
		.first_momentum = true,
		.param = &p,
		.grad = &g,
		.m = &m,
		.n = 1,
	};

	optim_cpu_ops.step(&a);
	CHECK(m == 2.0f, "first: m = %a, want 2 (d, undamped)", m);
	CHECK(p == 0.0f, "first: p = %a, want 1 - 0.5 * 2", p);
	a.first_momentum = false;
	a.step = 2;
	g = 1;
	optim_cpu_ops.step(&a);
	CHECK(m == 1.5f, "later: m = %a, want 0.5 * 2 + 0.5 * 1", m);
	CHECK(p == -0.75f, "later: p = %a, want 0 - 0.5 * 1.5", p);
}

/* momentum == 0 must not touch m at all, so it may be NULL. */
static void test_sgd_no_momentum_null_m(void)
{
	struct zc_param_group hp = sgd_hp();
	hp.lr = 0.25;
	hp.weight_decay = 0.5;
	float p[7], g[7], want[7];
	for (int i = 0; i < 7; i++) {
		p[i] = (float)i;
		g[i] = 1;
		want[i] = (float)i - 0.25f * (1 + 0.5f * (float)i);
	}
	struct optim_args a = {
		.kind = ZC_OPT_SGD,
		.hp = &hp,
		.step = 1,
		.first_momentum = true,
		.param = p,
		.grad = g,
		.n = 7,
	};
	optim_cpu_ops.step(&a);
	check_same(p, want, 7, "param", "sgd m=NULL");
}

/* torch: x = 1, grad 1, SGD(lr=0.1, momentum=0.9) gives 0.9 then 0.71, buffer
 * 1 then 1.9. */
static void test_sgd_torch_numbers(void)
{
	struct zc_param_group hp = ZC_PARAM_GROUP_INIT;
	hp.lr = 0.1;
	hp.momentum = 0.9;
	float x = 1, g = 1, buf = 0;
	struct optim_args a = {
		.kind = ZC_OPT_SGD,
		.hp = &hp,
		.step = 1,
		.first_momentum = true,
		.param = &x,
		.grad = &g,
		.m = &buf,
		.n = 1,
	};

	optim_cpu_ops.step(&a);
	CHECK(fabsf(x - 0.9f) <= 1e-7f, "x = %.9g after one step", x);
	CHECK(buf == 1.0f, "buffer = %.9g after one step", buf);
	a.first_momentum = false;
	a.step = 2;
	optim_cpu_ops.step(&a);
	CHECK(fabsf(x - 0.71f) <= 1e-6f, "x = %.9g after two steps", x);
	CHECK(fabsf(buf - 1.9f) <= 1e-6f, "buffer = %.9g after two steps", buf);
}

static struct zc_param_group adam_hp(void)
{
	struct zc_param_group hp = ZC_PARAM_GROUP_INIT;
	hp.lr = 0.0123;
	hp.beta1 = 0.87;
	hp.beta2 = 0.995;
	hp.eps = 1e-6;
	return hp;
}

/* Adam and AdamW over the same flag combinations. */
static void run_adams(const struct zc_param_group *hp, const char *name)
{
	char buf[128];
	snprintf(buf, sizeof(buf), "adam %s", name);
	run(ZC_OPT_ADAM, hp, buf);
	snprintf(buf, sizeof(buf), "adamw %s", name);
	run(ZC_OPT_ADAMW, hp, buf);
}

static void test_adam_plain(void)
{
	struct zc_param_group hp = adam_hp();
	run_adams(&hp, "plain");
	hp = (struct zc_param_group)ZC_PARAM_GROUP_INIT;
	run_adams(&hp, "torch defaults");
}

static void test_adam_amsgrad(void)
{
	struct zc_param_group hp = adam_hp();
	hp.amsgrad = true;
	run_adams(&hp, "amsgrad");
}

static void test_adam_maximize(void)
{
	struct zc_param_group hp = adam_hp();
	hp.maximize = true;
	run_adams(&hp, "maximize");
	hp.amsgrad = true;
	run_adams(&hp, "maximize amsgrad");
}

static void test_adam_weight_decay(void)
{
	struct zc_param_group hp = adam_hp();
	hp.weight_decay = 0.05;
	run_adams(&hp, "weight_decay");
	hp.amsgrad = true;
	run_adams(&hp, "weight_decay amsgrad");
	hp.maximize = true;
	run_adams(&hp, "weight_decay amsgrad maximize");
	hp.amsgrad = false;
	run_adams(&hp, "weight_decay maximize");
}

/* Without amsgrad vmax is never touched, so it may be NULL. */
static void test_adam_no_amsgrad_null_vmax(void)
{
	for (int kind = ZC_OPT_ADAM; kind <= ZC_OPT_ADAMW; kind++) {
		struct zc_param_group hp = adam_hp();
		hp.weight_decay = 0.01;
		float p[33], g[33], m[33] = {0}, v[33] = {0};
		float rp[33], rm[33] = {0}, rv[33] = {0};
		rng_state = 33;
		for (int i = 0; i < 33; i++) {
			p[i] = rp[i] = (float)rng_range(-1, 1);
			g[i] = (float)rng_range(-1, 1);
		}
		struct optim_args a = {
			.kind = kind,
			.hp = &hp,
			.step = 1,
			.param = p,
			.grad = g,
			.m = m,
			.v = v,
			.n = 33,
		};
		optim_cpu_ops.step(&a);
		ref_adam(kind, &hp, 1, rp, g, rm, rv, NULL, 33);
		check_same(p, rp, 33, "param", kind == ZC_OPT_ADAM ? "adam" : "adamw");
	}
}

/* Adam's first step is lr * g / (|g| + eps) after bias correction: a move of
 * almost exactly lr against the gradient's sign, whatever its size. */
static void test_adam_first_step(void)
{
	struct zc_param_group hp = ZC_PARAM_GROUP_INIT;
	hp.lr = 0.1;
	float p[2] = {1, 1}, g[2] = {1, -250}, m[2] = {0}, v[2] = {0}, vmax[2] = {0};
	struct optim_args a = {
		.kind = ZC_OPT_ADAM,
		.hp = &hp,
		.step = 1,
		.param = p,
		.grad = g,
		.m = m,
		.v = v,
		.vmax = vmax,
		.n = 2,
	};

	optim_cpu_ops.step(&a);
	CHECK(fabsf(p[0] - 0.9f) <= 1e-6f, "p = %.9g, want 1 - 0.1", p[0]);
	CHECK(fabsf(p[1] - 1.1f) <= 1e-6f, "p = %.9g, want 1 + 0.1", p[1]);
	CHECK(fabsf(m[0] - 0.1f) <= 1e-7f, "m = %.9g, want 0.1 * g", m[0]);
	CHECK(fabsf(v[0] - 0.001f) <= 1e-9f, "v = %.9g, want 0.001 * g^2", v[0]);
}

/* AdamW with a zero gradient only decays: p * (1 - lr * wd), exactly. */
static void test_adamw_decay(void)
{
	struct zc_param_group hp = ZC_PARAM_GROUP_INIT;
	hp.lr = 0.1;
	hp.weight_decay = 0.5;
	float p = 1, g = 0, m = 0, v = 0;
	struct optim_args a = {
		.kind = ZC_OPT_ADAMW,
		.hp = &hp,
		.step = 1,
		.param = &p,
		.grad = &g,
		.m = &m,
		.v = &v,
		.n = 1,
	};

	optim_cpu_ops.step(&a);
	CHECK(p == 0.95f, "p = %.9g, want 0.95", p);
	a.kind = ZC_OPT_ADAM;
	p = 1;
	optim_cpu_ops.step(&a);
	CHECK(p != 0.95f && fabsf(p - 0.9f) <= 1e-6f, "adam L2: p = %.9g, want ~0.9", p);
}

/* amsgrad keeps the running max of v, and a NaN on either side wins as in
 * torch.maximum. */
static void test_adam_amsgrad_max(void)
{
	struct zc_param_group hp = ZC_PARAM_GROUP_INIT;
	hp.amsgrad = true;
	float p[3] = {0, 0, 0}, g[3] = {4, 4, NAN}, m[3] = {0}, v[3] = {0};
	float vmax[3] = {0, NAN, 0};
	struct optim_args a = {
		.kind = ZC_OPT_ADAM,
		.hp = &hp,
		.step = 1,
		.param = p,
		.grad = g,
		.m = m,
		.v = v,
		.vmax = vmax,
		.n = 3,
	};

	optim_cpu_ops.step(&a);
	CHECK(vmax[0] == v[0] && v[0] > 0, "vmax %a v %a", vmax[0], v[0]);
	CHECK(isnan(vmax[1]) && isnan(p[1]), "old NaN vmax: vmax %a p %a", vmax[1], p[1]);
	CHECK(isnan(vmax[2]) && isnan(p[2]), "NaN v: vmax %a p %a", vmax[2], p[2]);
	g[0] = 0;
	a.step = 2;
	float peak = vmax[0];
	optim_cpu_ops.step(&a);
	CHECK(v[0] < peak && vmax[0] == peak, "v fell to %a, vmax %a, want %a", v[0], vmax[0],
	      peak);
}

/* weight_decay == 0 skips the term (torch's `if weight_decay != 0`) rather
 * than adding 0 * p, which would turn an infinite parameter into a NaN. */
static void test_zero_weight_decay_skipped(void)
{
	for (int kind = ZC_OPT_SGD; kind <= ZC_OPT_ADAM; kind++) {
		struct zc_param_group hp = ZC_PARAM_GROUP_INIT;
		float p = INFINITY, g = 1, m = 0, v = 0;
		struct optim_args a = {
			.kind = kind,
			.hp = &hp,
			.step = 1,
			.first_momentum = true,
			.param = &p,
			.grad = &g,
			.m = &m,
			.v = kind == ZC_OPT_SGD ? NULL : &v,
			.n = 1,
		};
		optim_cpu_ops.step(&a);
		CHECK(p == INFINITY, "%s: p = %a", kind == ZC_OPT_SGD ? "sgd" : "adam", p);
	}
}

/* Every flag combination, with random double hyperparameters so the casts and
 * the order of operations are exercised beyond round numbers. */
static void test_random_sweep(void)
{
	char name[32];
	for (int combo = 0; combo < 32; combo++) {
		struct zc_param_group hp = ZC_PARAM_GROUP_INIT;
		rng_state = 0xabc00 + (uint64_t)combo;
		hp.lr = rng_range(1e-4, 0.5);
		hp.momentum = combo & 1 ? rng_range(0.01, 0.99) : 0;
		hp.dampening = combo & 2 ? rng_range(0.01, 0.5) : 0;
		hp.weight_decay = combo & 4 ? rng_range(1e-4, 0.1) : 0;
		hp.maximize = combo & 8;
		hp.nesterov = combo & 16;
		hp.amsgrad = combo & 16;
		hp.beta1 = rng_range(0.5, 0.99);
		hp.beta2 = rng_range(0.9, 0.9999);
		hp.eps = rng_range(1e-10, 1e-6);
		snprintf(name, sizeof(name), "sweep %d sgd", combo);
		run(ZC_OPT_SGD, &hp, name);
		if (combo & 3)
			continue; /* momentum and dampening mean nothing to Adam */
		snprintf(name, sizeof(name), "sweep %d", combo);
		run_adams(&hp, name);
	}
}

/* host_sum (hostmem.h) rounds as copy, add each source in order, divide
 * once, for every source count and any offset, whatever passes it runs in:
 * the reference is that order, one element at a time. */
static void test_host_sum_order(void)
{
	enum { N = 1000, R = 5, OFF = 3 };
	static float src[R][N], out[N];
	const float *sp[R];

	rng_state = 0x5eed;
	for (int r = 0; r < R; r++) {
		for (int i = 0; i < N; i++)
			src[r][i] = (float)rng_range(-1e3, 1e3) * (i % 7 ? 1.0f : 1e-6f);
		sp[r] = src[r];
	}
	for (uint32_t nsrc = 1; nsrc <= R; nsrc++) {
		size_t n = N - OFF - nsrc; /* odd lengths: the vector loops' tails */
		host_sum(out, sp, nsrc, OFF, n, (float)nsrc);
		for (size_t i = 0; i < n; i++) {
			float want = src[0][OFF + i];
			for (uint32_t r = 1; r < nsrc; r++)
				want += src[r][OFF + i];
			want /= (float)nsrc;
			if (memcmp(&out[i], &want, sizeof(want))) {
				CHECK(0, "%u sources, element %zu: %a, want %a", nsrc, i, out[i], want);
				break;
			}
		}
	}
}

/* gradelem.h's order for one chunk, from its words: lane l adds elements
 * l, l + 256, ... in order into a double from 0; then lane l += lane l + h
 * for h = 128, 64, ..., 1. Every sum goes through a volatile. */
static double contract_chunk(const float *g, size_t n)
{
	volatile double lane[256];

	for (size_t l = 0; l < 256; l++) {
		lane[l] = 0;
		for (size_t k = l; k < n; k += 256)
			lane[l] = lane[l] + (double)g[k] * (double)g[k];
	}
	for (size_t h = 128; h > 0; h /= 2)
		for (size_t l = 0; l < h; l++)
			lane[l] = lane[l] + lane[l + h];
	return lane[0];
}

/* The squared norm of a piece of 3 chunks and a partial fourth, its values
 * of mixed magnitudes so that the order of the additions shows in the bits:
 * gradpass_measure (the CPU path, and the double's kernels through the same
 * header) gives the contract's bits, and a chunk summed in element order
 * (the old order) would not. */
static void test_norm_order(void)
{
	enum { N = 3 * 8192 + 1000 };
	static float g[N];
	float *const grads[1] = {g};
	struct optim_piece pc = {.group = 0, .owner = 0, .off = 0, .n = N, .dtype = ZC_DTYPE_F32};
	double got[1] = {0}, want = 0, serial = 0, bad = -1;
	struct pool *pool;

	rng_state = 0x0dd5;
	for (size_t i = 0; i < N; i++)
		g[i] = (float)rng_range(-1, 1) * (i % 5 == 0 ? 4096.0f : i % 3 ? 1.0f : 1e-3f);
	for (size_t x = 0; x < N; x += 8192) {
		size_t n = N - x < 8192 ? N - x : 8192;
		volatile double s = 0;

		want += contract_chunk(g + x, n);
		for (size_t k = 0; k < n; k++)
			s = s + (double)g[x + k] * (double)g[x + k];
		serial += s;
	}
	REQUIRE(pool_new(2, &pool) == 0, "pool");
	CHECK(gradpass_measure(pool, grads, &pc, 1, false, 1.0f, got, &bad) == 0 && bad == 0,
	      "measure");
	CHECK(memcmp(&got[0], &want, sizeof(want)) == 0, "norm %a, the contract's %a", got[0],
	      want);
	/* the data tells the orders apart, or the check above proves nothing */
	CHECK(memcmp(&serial, &want, sizeof(want)) != 0, "element order gives the same %a", want);
	pool_free(pool);
}

static const struct test_case cases[] = {
	{"norm_order", test_norm_order},
	{"ops", test_ops},
	{"host_sum_order", test_host_sum_order},
	{"sgd_plain", test_sgd_plain},
	{"sgd_momentum", test_sgd_momentum},
	{"sgd_dampening", test_sgd_dampening},
	{"sgd_nesterov", test_sgd_nesterov},
	{"sgd_weight_decay", test_sgd_weight_decay},
	{"sgd_maximize", test_sgd_maximize},
	{"sgd_first_momentum", test_sgd_first_momentum},
	{"sgd_no_momentum_null_m", test_sgd_no_momentum_null_m},
	{"sgd_torch_numbers", test_sgd_torch_numbers},
	{"adam_plain", test_adam_plain},
	{"adam_amsgrad", test_adam_amsgrad},
	{"adam_maximize", test_adam_maximize},
	{"adam_weight_decay", test_adam_weight_decay},
	{"adam_no_amsgrad_null_vmax", test_adam_no_amsgrad_null_vmax},
	{"adam_first_step", test_adam_first_step},
	{"adamw_decay", test_adamw_decay},
	{"adam_amsgrad_max", test_adam_amsgrad_max},
	{"zero_weight_decay_skipped", test_zero_weight_decay_skipped},
	{"random_sweep", test_random_sweep},
};

TEST_MAIN(cases)
