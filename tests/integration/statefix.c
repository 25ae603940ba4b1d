/*
 * statefix.c — the job the optimizer-state tests train (statefix.h): its
 * parameters, plans over any layout of them, the single-process reference,
 * snapshots of parameters and state by parameter, and the steps of a rank of
 * the job. Shared by tests/integration/test_state.c, cudareplan.c and
 * tests/reliability/test_ckpt.c.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "refoptim.h"
#include "statefix.h"

const struct sf_param params[NP] = {{1000, 0}, {37, 1}, {5001, 2}, {16, 0}, {2500, 1}, {300, 2}};

bool sf_lowp;
const enum zc_dtype sf_lowp_dt[NP] = {ZC_DTYPE_F32, ZC_DTYPE_BF16, ZC_DTYPE_F16,
				      ZC_DTYPE_F32, ZC_DTYPE_BF16, ZC_DTYPE_F16};

enum zc_dtype dtype_of(int k)
{
	return sf_lowp ? sf_lowp_dt[k] : ZC_DTYPE_F32;
}

uint64_t total_numel(void)
{
	uint64_t n = 0;

	for (int k = 0; k < NP; k++)
		n += params[k].numel;
	return n;
}

uint64_t param_base(int k)
{
	uint64_t n = 0;

	for (int i = 0; i < k; i++)
		n += params[i].numel;
	return n;
}

void set_groups(enum zc_optimizer opt, struct zc_param_group *g)
{
	for (int i = 0; i < 3; i++)
		g[i] = (struct zc_param_group)ZC_PARAM_GROUP_INIT;
	if (opt == ZC_OPT_SGD) {
		g[0].lr = 0.05, g[0].momentum = 0.9, g[0].nesterov = true;
		g[1].lr = 0.02, g[1].momentum = 0.5, g[1].dampening = 0.1, g[1].weight_decay = 0.01;
		g[2].lr = 0.01, g[2].weight_decay = 0.001, g[2].maximize = true; /* momentum 0 */
	} else {
		g[0].lr = 1e-2;
		g[1].lr = 2e-3, g[1].beta1 = 0.8, g[1].beta2 = 0.99, g[1].eps = 1e-6;
		g[1].weight_decay = 0.01, g[1].amsgrad = true;
		g[2].lr = 5e-3, g[2].weight_decay = 0.05, g[2].maximize = true;
	}
}

void make_plan(struct tplan *tp, const struct layout *l, enum zc_optimizer opt,
	       enum zc_shard_mode shard, enum zc_step_mode step, bool ids)
{
	memset(tp, 0, sizeof(*tp));
	set_groups(opt, tp->groups);
	for (uint32_t b = 0; b < l->nbuckets; b++) {
		uint64_t off = 0;
		uint32_t s = 0;
		for (; l->b[b][s] >= 0; s++) {
			int k = l->b[b][s];
			tp->segs[b][s] =
				(struct zc_segment){.size = sizeof(struct zc_segment),
						    .group = params[k].group,
						    .offset = off,
						    .numel = params[k].numel,
						    .param_id = ids ? 100 + (uint64_t)k : 0};
			tp->bucket_of[k] = b;
			tp->seg_of[k] = s;
			off += params[k].numel;
		}
		tp->buckets[b] = (struct zc_bucket){.size = sizeof(struct zc_bucket),
						    .nsegments = s,
						    .numel = off,
						    .segments = tp->segs[b],
						    .dtype = dtype_of(l->b[b][0])};
	}
	tp->plan = (struct zc_plan){.size = sizeof(struct zc_plan),
				    .optimizer = opt,
				    .shard_mode = shard,
				    .step_mode = step,
				    .ngroups = 3,
				    .groups = tp->groups,
				    .nbuckets = l->nbuckets,
				    .buckets = tp->buckets};
}

float grad_value(uint64_t seed, uint32_t rank, int it, int k, uint64_t i)
{
	return det_uniform(seed, rank, (uint64_t)it, ((uint64_t)k << 32) | i);
}

float init_value(uint64_t seed, int k, uint64_t i)
{
	return det_uniform(seed ^ 0x5eed, 1, (uint64_t)k, i);
}

void snap_init(struct snap *s, uint64_t seed)
{
	memset(s, 0, sizeof(*s));
	for (int k = 0; k < NP; k++)
		for (uint64_t i = 0; i < params[k].numel; i++)
			s->p[param_base(k) + i] = init_value(seed, k, i);
	s->valid = true;
}

/* The gradients' sum in the daemons' order (docs/DATAPLANE.md): each node's
 * ranks in rank order, then the nodes in node order; node_of NULL: one node. */
float grad_sum(uint64_t seed, uint32_t world, const uint32_t *node_of, int it, int k, uint64_t i)
{
	float sum = 0;
	uint32_t nnodes = 1;

	for (uint32_t r = 0; node_of && r < world; r++)
		nnodes = node_of[r] + 1 > nnodes ? node_of[r] + 1 : nnodes;
	for (uint32_t n = 0; n < nnodes; n++) {
		float part = 0;
		bool any = false;
		for (uint32_t r = 0; r < world; r++) {
			if (node_of && node_of[r] != n)
				continue;
			part = any ? part + grad_value(seed, r, it, k, i)
				   : grad_value(seed, r, it, k, i);
			any = true;
		}
		sum = n ? sum + part : part;
	}
	return sum;
}

int sf_hyper_iter = -1;

void ref_train(struct snap *s, enum zc_optimizer opt, uint64_t seed, uint32_t world, int from,
	       int to)
{
	ref_train_nodes(s, opt, seed, world, NULL, from, to);
}

void ref_train_nodes(struct snap *s, enum zc_optimizer opt, uint64_t seed, uint32_t world,
		     const uint32_t *node_of, int from, int to)
{
	struct zc_param_group g[3];
	float *gr = calloc(total_numel(), sizeof(float));

	set_groups(opt, g);
	double lr0 = g[0].lr;
	for (int it = from; it < to; it++)
		for (int k = 0; k < NP; k++) {
			g[0].lr = sf_hyper_iter >= 0 && it >= sf_hyper_iter ? lr0 * 0.5 : lr0;
			uint64_t o = param_base(k), n = params[k].numel;
			const struct zc_param_group *h = &g[params[k].group];
			for (uint64_t i = 0; i < n; i++)
				gr[o + i] = grad_sum(seed, world, node_of, it, k, i) / (float)world;
			if (opt == ZC_OPT_SGD) {
				bool first = !(s->present[k] & ZC_STATE_MOMENTUM_BUFFER);
				ref_sgd(h, s->p + o, gr + o, s->m + o, first, n);
				if (h->momentum != 0)
					s->present[k] = ZC_STATE_MOMENTUM_BUFFER;
			} else {
				s->step[k] += 1;
				ref_adam(opt == ZC_OPT_ADAMW, h, (uint64_t)s->step[k], s->p + o,
					 gr + o, s->m + o, s->v + o, s->vmax + o, n);
				s->present[k] = ZC_STATE_STEP | ZC_STATE_EXP_AVG |
						ZC_STATE_EXP_AVG_SQ |
						(h->amsgrad ? ZC_STATE_MAX_EXP_AVG_SQ : 0);
			}
		}
	free(gr);
}

/* segs[k] for parameter k in tp's layout, pointing into s. */
void snap_segs(struct snap *s, const struct tplan *tp, enum zc_optimizer opt,
	       struct zc_segment_state *segs)
{
	for (int k = 0; k < NP; k++) {
		uint64_t o = param_base(k);
		segs[k] = (struct zc_segment_state)ZC_SEGMENT_STATE_INIT;
		segs[k].bucket = tp->bucket_of[k];
		segs[k].segment = tp->seg_of[k];
		segs[k].present = s->present[k];
		segs[k].step = s->step[k];
		if (dtype_of(k) != ZC_DTYPE_F32)
			segs[k].master = s->master + o;
		if (opt == ZC_OPT_SGD) {
			segs[k].momentum_buffer = s->m + o;
		} else {
			segs[k].exp_avg = s->m + o;
			segs[k].exp_avg_sq = s->v + o;
			segs[k].max_exp_avg_sq = s->vmax + o;
		}
	}
}

/* Export the client's parameters and state into a snap. */
int export_snap(zc_client *c, const struct tplan *tp, enum zc_optimizer opt, struct snap *out)
{
	struct zc_segment_state segs[NP];
	int r;

	memset(out, 0, sizeof(*out));
	snap_segs(out, tp, opt, segs);
	r = zc_get_state(c, segs, NP);
	if (r < 0)
		return r;
	for (int k = 0; k < NP; k++) {
		const void *pb = zc_param_ptr(c, tp->bucket_of[k]);
		uint64_t at = tp->segs[tp->bucket_of[k]][tp->seg_of[k]].offset;

		if (!pb)
			return -1;
		out->present[k] = segs[k].present;
		out->step[k] = segs[k].step;
		for (uint64_t i = 0; i < params[k].numel; i++)
			out->p[param_base(k) + i] =
				dtype_of(k) == ZC_DTYPE_F32
					? ((const float *)pb)[at + i]
					: ref_lowp_widen(((const uint16_t *)pb)[at + i],
							 dtype_of(k));
	}
	out->valid = true;
	return 0;
}

void sf_config_nodes(struct zc_config *cfg, uint32_t rank, uint32_t world, const uint32_t *node_of,
		     uint32_t nnodes, const char *rdzv, const char *secret)
{
	cfg->local_rank = cfg->local_size = 0;
	for (uint32_t r = 0; r < world; r++)
		if (node_of[r] == node_of[rank]) {
			cfg->local_rank += r < rank;
			cfg->local_size++;
		}
	cfg->rdzv = rdzv;
	cfg->nnodes = nnodes;
	cfg->node_rank = node_of[rank];
	cfg->has_node_rank = 1;
	cfg->job_secret = secret;
}

/* A value into a bucket of dtype t at element i (narrowed by the rules). */
static void put_value(void *buf, enum zc_dtype t, uint64_t i, float x)
{
	if (t == ZC_DTYPE_F32)
		((float *)buf)[i] = x;
	else
		((uint16_t *)buf)[i] = ref_lowp_round(x, t);
}

int sf_fill_params(zc_client *c, const struct tplan *tp, const struct snap *from)
{
	for (int k = 0; k < NP; k++) {
		void *pb = zc_param_ptr(c, tp->bucket_of[k]);
		uint64_t at = tp->segs[tp->bucket_of[k]][tp->seg_of[k]].offset;
		if (!pb)
			return -1;
		for (uint64_t i = 0; i < params[k].numel; i++)
			put_value(pb, dtype_of(k), at + i, from->p[param_base(k) + i]);
	}
	return 0;
}

int sf_fill_grads(zc_client *c, const struct tplan *tp, uint64_t seed, uint32_t rank, int it)
{
	for (int k = 0; k < NP; k++) {
		void *gb = zc_grad_ptr(c, tp->bucket_of[k]);
		uint64_t at = tp->segs[tp->bucket_of[k]][tp->seg_of[k]].offset;
		if (!gb)
			return -1;
		for (uint64_t i = 0; i < params[k].numel; i++)
			put_value(gb, dtype_of(k), at + i, grad_value(seed, rank, it, k, i));
	}
	return 0;
}

int sf_import(zc_client *c, const struct tplan *tp, enum zc_optimizer opt, struct snap *s)
{
	struct zc_segment_state segs[NP];

	snap_segs(s, tp, opt, segs);
	return zc_set_state(c, segs, NP);
}

int sf_begin(zc_client *c, const struct tplan *tp, enum zc_optimizer opt, const struct snap *in,
	     uint64_t seed, const char **step)
{
	struct snap *init = malloc(sizeof(*init));
	int r = -ENOMEM;

	if (!init)
		return r;
	if (in)
		*init = *in;
	else
		snap_init(init, seed);
	r = sf_fill_params(c, tp, init);
	if (r >= 0) {
		*step = "register_plan";
		r = zc_register_plan(c);
	}
	if (r >= 0 && in) {
		*step = "set_state";
		r = sf_import(c, tp, opt, init);
	}
	free(init);
	return r;
}

int sf_hyper_at(zc_client *c, const struct tplan *tp, int it)
{
	struct zc_param_group h = tp->groups[0];

	if (it != sf_hyper_iter)
		return 0;
	h.lr *= 0.5;
	return zc_set_hyper(c, 0, &h);
}

/* Bit for bit, reasons as TAP comments; how many differences (at most a few
 * are printed). */
int snap_compare(const char *what, const struct snap *got, const struct snap *want,
		 enum zc_optimizer opt)
{
	int bad = 0;

	for (int k = 0; k < NP; k++) {
		uint64_t o = param_base(k);
		const float *ga[] = {got->p + o, got->m + o, got->v + o, got->vmax + o,
				     got->master + o};
		const float *wa[] = {want->p + o, want->m + o, want->v + o, want->vmax + o,
				     want->master + o};
		const char *names[] = {"param", opt == ZC_OPT_SGD ? "momentum_buffer" : "exp_avg",
				       "exp_avg_sq", "max_exp_avg_sq", "master"};
		uint32_t bits[] = {~0u, ZC_STATE_MOMENTUM_BUFFER | ZC_STATE_EXP_AVG,
				   ZC_STATE_EXP_AVG_SQ, ZC_STATE_MAX_EXP_AVG_SQ, ZC_STATE_MASTER};

		if (got->present[k] != want->present[k] || got->step[k] != want->step[k]) {
			printf("# %s: param %d: present 0x%x step %g, want 0x%x step %g\n", what, k,
			       got->present[k], got->step[k], want->present[k], want->step[k]);
			bad++;
			continue;
		}
		for (int a = 0; a < 5; a++) {
			if (a > 0 && !(want->present[k] & bits[a]))
				continue;
			if (memcmp(ga[a], wa[a], params[k].numel * sizeof(float)) == 0)
				continue;
			for (uint64_t i = 0; i < params[k].numel; i++)
				if (memcmp(&ga[a][i], &wa[a][i], sizeof(float)) != 0) {
					printf("# %s: param %d %s[%llu] = %.9g, want %.9g\n", what,
					       k, names[a], (unsigned long long)i, ga[a][i],
					       wa[a][i]);
					break;
				}
			bad++;
		}
	}
	return bad;
}
