/*
 * host.c — collectives among the ranks of one node on the CPU. The daemon has
 * every local rank's buffers mapped, so a reduction is a sum over them (rank
 * order, then one division: the same rounding as the fused pass) and a
 * broadcast is a copy into each of them. Requests run to completion on the
 * submitting lane thread, cut into cache-sized chunks over the worker pool.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "common.h"
#include "base/hostmem.h"
#include "base/pool.h"

struct coll_group {
	uint32_t world;
	float **grads;
	float **params;
	struct pool *pool;
	atomic_bool aborted;
};

static void host_close(struct coll_group *g)
{
	if (!g)
		return;
	free(g->grads);
	free(g->params);
	free(g);
}

static int host_open(const struct coll_config *cfg, struct coll_group **ret)
{
	struct coll_group *g = calloc(1, sizeof(*g));

	if (!g)
		return -ENOMEM;
	g->world = cfg->world;
	g->pool = cfg->pool;
	g->grads = calloc(cfg->world, sizeof(*g->grads));
	g->params = calloc(cfg->world, sizeof(*g->params));
	if (!g->grads || !g->params) {
		host_close(g);
		return -ENOMEM;
	}
	for (uint32_t r = 0; r < cfg->world; r++) {
		if (!cfg->grads[r] || !cfg->params[r]) {
			/* ranks on other nodes need the gloo backend */
			host_close(g);
			return -EOPNOTSUPP;
		}
		g->grads[r] = cfg->grads[r];
		g->params[r] = cfg->params[r];
	}
	atomic_init(&g->aborted, false);
	*ret = g;
	return 0;
}

struct task {
	struct coll_group *g;
	const struct coll_range *rg;
	uint32_t nranges;
	const uint64_t *first; /* [nranges + 1]: first chunk of each range */
	enum coll_kind kind;
};

/* A bf16/fp16 range: the reduction sums in fp32 and leaves the average,
 * rounded to the dtype, in the owner's gradient (hostmem.h). */
static void task_chunk_lowp(struct coll_group *g, const struct coll_range *rg,
			    enum coll_kind kind, uint64_t off, size_t n, float *scratch)
{
	if (kind == COLL_REDUCE) {
		host_sum_lowp(scratch, (const uint16_t *const *)g->grads, g->world, off, n,
			      (float)g->world, rg->dtype);
		host_narrow((uint16_t *)g->grads[rg->owner] + off, scratch, n, rg->dtype);
		return;
	}
	/* ranks that share the owner's parameter buffer have them (sharedp.h) */
	for (uint32_t r = 0; r < g->world; r++)
		if (g->params[r] != g->params[rg->owner])
			memcpy((uint16_t *)g->params[r] + off, (uint16_t *)g->params[rg->owner] + off,
			       n * sizeof(uint16_t));
}

static void task_chunk(void *arg, size_t i)
{
	const struct task *t = arg;
	struct coll_group *g = t->g;
	uint32_t k = 0;
	float scratch[HOST_CHUNK] __attribute__((aligned(64)));

	while (t->first[k + 1] <= i)
		k++;
	const struct coll_range *rg = &t->rg[k];
	uint64_t x = (i - t->first[k]) * HOST_CHUNK, off = rg->off + x;
	size_t n = (size_t)MIN((uint64_t)HOST_CHUNK, rg->n - x);

	if (atomic_load_explicit(&g->aborted, memory_order_relaxed))
		return;
	if (rg->dtype != ZC_DTYPE_F32) {
		task_chunk_lowp(g, rg, t->kind, off, n, scratch);
		return;
	}
	if (t->kind == COLL_REDUCE) {
		/* through scratch: the owner's buffer is a source too */
		host_sum(scratch, (const float *const *)g->grads, g->world, off, n,
			 (float)g->world);
		memcpy(g->grads[rg->owner] + off, scratch, n * sizeof(float));
		return;
	}
	for (uint32_t r = 0; r < g->world; r++)
		if (g->params[r] != g->params[rg->owner])
			host_store(g->params[r] + off, g->params[rg->owner] + off, n);
}

static int host_submit(struct coll_group *g, struct coll_req *req)
{
	uint64_t *first, n = 0;
	int r;

	if (req->kind == COLL_GATHER) { /* one node: its own part is all */
		memcpy(req->gout, req->gin, req->gbytes);
		req->done(req, atomic_load(&g->aborted) ? -ECANCELED : 0);
		return 0;
	}
	first = malloc((req->nranges + 1) * sizeof(*first));
	if (!first)
		return -ENOMEM;
	for (uint32_t k = 0; k < req->nranges; k++) {
		first[k] = n;
		n += (req->ranges[k].n + HOST_CHUNK - 1) / HOST_CHUNK;
	}
	first[req->nranges] = n;
	struct task t = {.g = g,
			 .rg = req->ranges,
			 .nranges = req->nranges,
			 .first = first,
			 .kind = req->kind};
	r = pool_parallel_for(g->pool, n, task_chunk, &t);
	free(first);
	if (r >= 0 && atomic_load(&g->aborted))
		r = -ECANCELED;
	req->done(req, r);
	return 0;
}

static void host_abort(struct coll_group *g)
{
	atomic_store(&g->aborted, true);
}

const struct coll_ops coll_host_ops = {
	.name = "host",
	.local_fuse = true,
	.open = host_open,
	.submit = host_submit,
	.abort = host_abort,
	.close = host_close,
};
