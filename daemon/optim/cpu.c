/*
 * cpu.c — the CPU optimizer backend: torch 1.13's SGD / Adam / AdamW element
 * updates over one contiguous range (the formulas and their order are in
 * optim.h; the element arithmetic is elem.h's, which the CUDA kernels share),
 * and the fused pass that runs them for a job: per cache-sized chunk, sum the
 * local ranks' gradients (or take the owner's reduced one), step the owner's
 * parameters in place, and store the result into every other local rank
 * while the chunk is still in cache. Chunks are spread over the pool;
 * disjoint ranges may be stepped concurrently.
 *
 * Results must be bit-identical to the scalar formula, so the compiler may
 * vectorise but never reassociate or contract: this file relies on the build's
 * -ffp-contract=off and -fno-math-errno (so sqrtf is an instruction and can be
 * vectorised) and must never see -ffast-math.
 *
 * To keep the element loops branch-free, each hyperparameter flag is a
 * compile-time constant of one kernel variant: an always_inline body is
 * instantiated once per flag combination and step() picks the variant from a
 * table. Each variant is cloned for AVX-512, AVX2 and baseline x86-64 and the
 * clone is chosen at load time, so one portable binary runs as wide as the
 * machine allows.
 */
#include <assert.h>
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>

#include "common.h"
#include "base/hostmem.h"
#include "optim/elem.h"
#include "optim/optim.h"
#include "base/pool.h"

/* -DZEROD_SIMD_CLONES= builds only the baseline code, so a test can cover it
 * on a machine that would otherwise pick a wider clone. */
#define OPTIM_CLONES ZEROD_SIMD_CLONES

/* The bodies below take their flags as constants; inlining is what turns
 * them into branch-free loops, so it must not be left to heuristics. */
#define BODY static inline __attribute__((always_inline)) void

/* ----------------------------------------------------------------- SGD --- */

typedef void sgd_kernel(float *restrict p, const float *restrict g, float *restrict m, size_t n,
			struct optim_sgd_k k);

BODY sgd_body(float *restrict p, const float *restrict g, float *restrict m, size_t n,
	      struct optim_sgd_k k, bool maximize, bool wd, enum optim_sgd_mom mode, bool nesterov)
{
	for (size_t i = 0; i < n; i++) {
		float pi = p[i], mi = mode == OPTIM_MOM_LATER ? m[i] : 0.0f;
		optim_sgd_elem(&pi, &mi, g[i], k, maximize, wd, mode, nesterov);
		p[i] = pi;
		if (mode != OPTIM_MOM_NONE)
			m[i] = mi;
	}
}

/* clang-format would read SGD_NAME(...)(params) as a call and mangle it. */
/* clang-format off */
#define SGD_NAME(mx, wd, mo, ne) sgd_##mx##wd##_##mo##_##ne
#define SGD_DEFINE(mx, wd, mo, ne)                                                                 \
	static OPTIM_CLONES void SGD_NAME(mx, wd, mo, ne)(                                         \
		float *restrict p, const float *restrict g, float *restrict m, size_t n,           \
		struct optim_sgd_k k)                                                              \
	{                                                                                          \
		sgd_body(p, g, m, n, k, mx, wd, mo, ne);                                           \
	}
#define SGD_ENTRY(mx, wd, mo, ne) [mx][wd][mo][ne] = SGD_NAME(mx, wd, mo, ne),

/* nesterov only means something with momentum (torch rejects it otherwise). */
#define SGD_MODES(X, mx, wd)                                                                       \
	X(mx, wd, OPTIM_MOM_NONE, 0)                                                               \
	X(mx, wd, OPTIM_MOM_FIRST, 0) X(mx, wd, OPTIM_MOM_FIRST, 1)                                \
	X(mx, wd, OPTIM_MOM_LATER, 0) X(mx, wd, OPTIM_MOM_LATER, 1)
#define SGD_VARIANTS(X) SGD_MODES(X, 0, 0) SGD_MODES(X, 0, 1) SGD_MODES(X, 1, 0) SGD_MODES(X, 1, 1)
/* clang-format on */

SGD_VARIANTS(SGD_DEFINE)

/* [maximize][weight_decay != 0][mode][nesterov && mode != OPTIM_MOM_NONE] */
static sgd_kernel *const sgd_kernels[2][2][3][2] = {SGD_VARIANTS(SGD_ENTRY)};

static void sgd_step(const struct optim_args *a)
{
	struct optim_sgd_cfg c = optim_sgd_setup(a->hp, a->first_momentum);

	sgd_kernels[c.maximize][c.wd][c.mode][c.nesterov](a->param, a->grad, a->m, a->n, c.k);
}

/* ---------------------------------------------------------- Adam/AdamW --- */

typedef void adam_kernel(float *restrict p, const float *restrict g, float *restrict m,
			 float *restrict v, float *restrict vmax, size_t n, struct optim_adam_k k);

BODY adam_body(float *restrict p, const float *restrict g, float *restrict m, float *restrict v,
	       float *restrict vmax, size_t n, struct optim_adam_k k, bool maximize,
	       enum optim_adam_wd wd, bool amsgrad)
{
	for (size_t i = 0; i < n; i++) {
		float pi = p[i], mi = m[i], vi = v[i], xi = amsgrad ? vmax[i] : 0.0f;
		optim_adam_elem(&pi, &mi, &vi, &xi, g[i], k, maximize, wd, amsgrad);
		p[i] = pi;
		m[i] = mi;
		v[i] = vi;
		if (amsgrad)
			vmax[i] = xi;
	}
}

#define ADAM_NAME(mx, wd, ams) adam_##mx##_##wd##_##ams
#define ADAM_DEFINE(mx, wd, ams)                                                                   \
	static OPTIM_CLONES void ADAM_NAME(mx, wd, ams)(                                           \
		float *restrict p, const float *restrict g, float *restrict m, float *restrict v,  \
		float *restrict vmax, size_t n, struct optim_adam_k k)                             \
	{                                                                                          \
		adam_body(p, g, m, v, vmax, n, k, mx, wd, ams);                                    \
	}
#define ADAM_ENTRY(mx, wd, ams) [mx][wd][ams] = ADAM_NAME(mx, wd, ams),

/* clang-format off */
#define ADAM_AMS(X, mx, wd) X(mx, wd, 0) X(mx, wd, 1)
#define ADAM_WD(X, mx)                                                                             \
	ADAM_AMS(X, mx, OPTIM_WD_NONE) ADAM_AMS(X, mx, OPTIM_WD_L2)                                \
	ADAM_AMS(X, mx, OPTIM_WD_DECOUPLED)
#define ADAM_VARIANTS(X) ADAM_WD(X, 0) ADAM_WD(X, 1)
/* clang-format on */

ADAM_VARIANTS(ADAM_DEFINE)

/* [maximize][optim_adam_wd][amsgrad] */
static adam_kernel *const adam_kernels[2][3][2] = {ADAM_VARIANTS(ADAM_ENTRY)};

static void adam_step(const struct optim_args *a)
{
	struct optim_adam_cfg c;

	assert(a->step >= 1);
	c = optim_adam_setup(a->hp, a->step, a->kind == ZC_OPT_ADAMW);
	adam_kernels[c.maximize][c.wd][c.amsgrad](a->param, a->grad, a->m, a->v, a->vmax, a->n,
						  c.k);
}

/* ------------------------------------------------------------------ ops --- */

static void cpu_step(const struct optim_args *a)
{
	if (a->n == 0)
		return;
	switch (a->kind) {
	case ZC_OPT_SGD:
		sgd_step(a);
		return;
	case ZC_OPT_ADAM:
	case ZC_OPT_ADAMW:
		adam_step(a);
		return;
	}
	assert(!"unknown optimizer kind");
}

/* ----------------------------------------------------- the fused pass --- */

struct optim_ctx {
	struct optim_config cfg; /* with its own copies of the arrays */
};

static void cpu_close(struct optim_ctx *c)
{
	if (!c)
		return;
	free((void *)c->cfg.grads);
	free((void *)c->cfg.params);
	free((void *)c->cfg.local);
	free(c);
}

static int cpu_open(const struct optim_config *cfg, struct optim_ctx **ret)
{
	struct optim_ctx *c = calloc(1, sizeof(*c));
	float **g, **p;
	uint32_t *l;

	if (!c)
		return -ENOMEM;
	c->cfg = *cfg;
	g = calloc(cfg->world, sizeof(*g));
	p = calloc(cfg->world, sizeof(*p));
	l = calloc(cfg->nlocal ? cfg->nlocal : 1, sizeof(*l));
	c->cfg.grads = g;
	c->cfg.params = p;
	c->cfg.local = l;
	if (!g || !p || !l) {
		cpu_close(c);
		return -ENOMEM;
	}
	memcpy(g, cfg->grads, cfg->world * sizeof(*g));
	memcpy(p, cfg->params, cfg->world * sizeof(*p));
	memcpy(l, cfg->local, cfg->nlocal * sizeof(*l));
	*ret = c;
	return 0;
}

struct run_task {
	const struct optim_ctx *c;
	const struct optim_call *call;
	const uint64_t *first; /* [npieces + 1]: first chunk of each piece */
	_Atomic uint32_t edited; /* the lowest piece found edited, or UINT32_MAX */
};

/* The owner's parameter still is the narrowed master (a NaN matches any NaN:
 * loading a signalling NaN's master quietens it). */
static bool lowp_unchanged(const uint16_t *restrict p, const uint16_t *restrict nar, size_t n,
			   enum zc_dtype t)
{
	uint16_t exp = t == ZC_DTYPE_BF16 ? 0x7f80 : 0x7c00;

	if (memcmp(p, nar, n * sizeof(*p)) == 0)
		return true;
	for (size_t i = 0; i < n; i++) {
		bool pn = (p[i] & exp) == exp && (p[i] & ~exp & 0x7fff);
		bool nn = (nar[i] & exp) == exp && (nar[i] & ~exp & 0x7fff);
		if (p[i] != nar[i] && !(pn && nn))
			return false;
	}
	return true;
}

/* One chunk of a bf16/fp16 piece (zeroclient.h's rules): the averaged
 * gradient in fp32 (rounded to the dtype once), the step on the fp32 master,
 * then the narrowed master into every local rank, the owner's included.
 * Nothing is written if the owner's parameters were edited since the last
 * narrowing. */
static void run_chunk_lowp(struct run_task *t, uint32_t k, uint64_t x, size_t n, float *scratch)
{
	const struct optim_config *cfg = &t->c->cfg;
	const struct optim_call *call = t->call;
	const struct optim_piece *pc = &call->pieces[k];
	uint64_t off = pc->off + x;
	float *mp = call->master + pc->mat + x;
	uint16_t *pp = (uint16_t *)cfg->params[pc->owner] + off;
	uint16_t nar[HOST_CHUNK] __attribute__((aligned(64)));

	host_narrow(nar, mp, n, pc->dtype);
	if (!lowp_unchanged(pp, nar, n, pc->dtype)) {
		uint32_t cur = atomic_load(&t->edited);
		while (k < cur && !atomic_compare_exchange_weak(&t->edited, &cur, k))
			;
		return;
	}
	if (call->grad == OPTIM_GRAD_SUM_LOCAL) {
		const uint16_t *src[cfg->nlocal];
		for (uint32_t r = 0; r < cfg->nlocal; r++)
			src[r] = (const uint16_t *)cfg->grads[cfg->local[r]];
		host_sum_lowp(scratch, src, cfg->nlocal, off, n, (float)cfg->world, pc->dtype);
	} else {
		host_widen(scratch, (const uint16_t *)cfg->grads[pc->owner] + off, n, pc->dtype);
	}
	struct optim_args a = {
		.kind = call->kind,
		.hp = &call->groups[pc->group],
		.step = pc->step,
		.first_momentum = pc->first_momentum,
		.param = mp,
		.grad = scratch,
		.m = call->m ? call->m + pc->at + x : NULL,
		.v = call->v ? call->v + pc->at + x : NULL,
		.vmax = call->vmax ? call->vmax + pc->at + x : NULL,
		.n = n,
	};
	cpu_step(&a);
	host_narrow(nar, mp, n, pc->dtype);
	/* local ranks share one parameter buffer, or none do (sharedp.h) */
	for (uint32_t r = 0; r < cfg->nlocal; r++)
		if (r == 0 || cfg->params[cfg->local[r]] != cfg->params[cfg->local[r - 1]])
			memcpy((uint16_t *)cfg->params[cfg->local[r]] + off, nar, n * sizeof(*nar));
}

/* One chunk: its gradient (summed over the local ranks, or the owner's
 * average), the step on the owner's parameters, then the stores into every
 * other local rank while the chunk is still in cache. */
static void run_chunk(void *arg, size_t i)
{
	struct run_task *t = arg;
	const struct optim_config *cfg = &t->c->cfg;
	const struct optim_call *call = t->call;
	uint32_t lo = 0, hi = call->npieces;
	float scratch[HOST_CHUNK] __attribute__((aligned(64)));

	while (hi - lo > 1) { /* the piece holding chunk i */
		uint32_t mid = lo + (hi - lo) / 2;
		if (t->first[mid] <= i)
			lo = mid;
		else
			hi = mid;
	}
	const struct optim_piece *pc = &call->pieces[lo];
	uint64_t x = (i - t->first[lo]) * HOST_CHUNK;
	uint64_t off = pc->off + x;
	size_t n = (size_t)MIN((uint64_t)HOST_CHUNK, pc->n - x);

	if (pc->dtype != ZC_DTYPE_F32) {
		run_chunk_lowp(t, lo, x, n, scratch);
		return;
	}
	float *p = cfg->params[pc->owner] + off;
	const float *g;

	if (call->grad == OPTIM_GRAD_SUM_LOCAL) {
		const float *src[cfg->nlocal];
		for (uint32_t k = 0; k < cfg->nlocal; k++)
			src[k] = cfg->grads[cfg->local[k]];
		host_sum(scratch, src, cfg->nlocal, off, n, (float)cfg->world);
		g = scratch;
	} else {
		g = cfg->grads[pc->owner] + off;
	}
	struct optim_args a = {
		.kind = call->kind,
		.hp = &call->groups[pc->group],
		.step = pc->step,
		.first_momentum = pc->first_momentum,
		.param = p,
		.grad = g,
		.m = call->m ? call->m + pc->at + x : NULL,
		.v = call->v ? call->v + pc->at + x : NULL,
		.vmax = call->vmax ? call->vmax + pc->at + x : NULL,
		.n = n,
	};
	cpu_step(&a);
	/* ranks that share the owner's parameter buffer hold p already (sharedp.h) */
	for (uint32_t k = 0; k < cfg->nlocal; k++)
		if (cfg->params[cfg->local[k]] != cfg->params[pc->owner])
			host_store(cfg->params[cfg->local[k]] + off, p, n);
}

static int cpu_run(struct optim_ctx *c, const struct optim_call *call)
{
	uint64_t *first, nchunks = 0;
	int r;

	first = malloc((call->npieces + 1) * sizeof(*first));
	if (!first)
		return -ENOMEM;
	for (uint32_t k = 0; k < call->npieces; k++) {
		first[k] = nchunks;
		nchunks += (call->pieces[k].n + HOST_CHUNK - 1) / HOST_CHUNK;
	}
	first[call->npieces] = nchunks;
	struct run_task t = {.c = c, .call = call, .first = first};
	atomic_init(&t.edited, UINT32_MAX);
	/* through the guarded pool: these are trainers' shared buffers */
	r = pool_parallel_for(c->cfg.pool, nchunks, run_chunk, &t);
	free(first);
	if (r >= 0 && atomic_load(&t.edited) != UINT32_MAX) {
		if (call->edited)
			*call->edited = atomic_load(&t.edited);
		r = ZC_EPARAMEDIT;
	}
	return r;
}

const struct optim_ops optim_cpu_ops = {
	.name = "cpu",
	.step = cpu_step,
	.open = cpu_open,
	.run = cpu_run,
	.close = cpu_close,
};
