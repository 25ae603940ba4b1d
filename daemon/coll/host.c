/*
 * host.c — collectives among the ranks of one node on the CPU. The daemon has
 * every local rank's shm buffers mapped, so a reduction is a sum over those
 * buffers (rank order 0, 1, 2, ... then one division: the same rounding on
 * every element, whatever the chunking) and a broadcast is a copy into each
 * of them. Work is cut into cache-sized chunks and spread over the pool.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "common.h"
#include "pool.h"

#define CHUNK (16u * 1024u) /* elements per task: 64 KiB per buffer */

struct coll_group {
	uint32_t world;
	float **grads;
	float **params;
	struct pool *pool;
};

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
		free(g->grads);
		free(g->params);
		free(g);
		return -ENOMEM;
	}
	for (uint32_t r = 0; r < cfg->world; r++) {
		if (!cfg->grads[r] || !cfg->params[r]) {
			/* ranks on other nodes need the gloo backend */
			free(g->grads);
			free(g->params);
			free(g);
			return -EOPNOTSUPP;
		}
		g->grads[r] = cfg->grads[r];
		g->params[r] = cfg->params[r];
	}
	*ret = g;
	return 0;
}

static void host_close(struct coll_group *g)
{
	if (!g)
		return;
	free(g->grads);
	free(g->params);
	free(g);
}

/* ---- reduction ---- */

struct reduce_task {
	struct coll_group *g;
	uint64_t off, n;
	float *out;
};

static ZEROD_SIMD_CLONES void reduce_chunk(float *restrict out, float *const *grads, uint32_t world,
					   uint64_t off, size_t n)
{
	const float *restrict g0 = grads[0] + off;
	float fw = (float)world;

	for (size_t i = 0; i < n; i++)
		out[i] = g0[i];
	for (uint32_t r = 1; r < world; r++) {
		const float *restrict gr = grads[r] + off;
		for (size_t i = 0; i < n; i++)
			out[i] += gr[i];
	}
	for (size_t i = 0; i < n; i++)
		out[i] /= fw;
}

static void reduce_task_run(void *ctx, size_t i)
{
	struct reduce_task *t = ctx;
	uint64_t start = (uint64_t)i * CHUNK;
	uint64_t len = t->n - start < CHUNK ? t->n - start : CHUNK;

	reduce_chunk(t->out + t->off + start, t->g->grads, t->g->world, t->off + start, len);
}

static int host_all_reduce(struct coll_group *g, uint64_t off, uint64_t n, float *out)
{
	struct reduce_task t = {.g = g, .off = off, .n = n, .out = out};

	return pool_parallel_for(g->pool, (n + CHUNK - 1) / CHUNK, reduce_task_run, &t);
}

static int host_reduce_scatter(struct coll_group *g, const struct coll_range *r, uint32_t nr,
			       float *out)
{
	int rc = 0;

	/* Every owner is on this node: each range is an all-reduce of its own. */
	for (uint32_t k = 0; k < nr && rc >= 0; k++)
		rc = host_all_reduce(g, r[k].off, r[k].n, out);
	return rc;
}

/* ---- broadcast ---- */

struct copy_task {
	struct coll_group *g;
	uint64_t off, n;
	const float *src;
};

static void copy_task_run(void *ctx, size_t i)
{
	struct copy_task *t = ctx;
	uint64_t start = (uint64_t)i * CHUNK;
	uint64_t len = t->n - start < CHUNK ? t->n - start : CHUNK;

	for (uint32_t r = 0; r < t->g->world; r++)
		memcpy(t->g->params[r] + t->off + start, t->src + t->off + start,
		       len * sizeof(float));
}

static int host_broadcast(struct coll_group *g, uint32_t root, uint64_t off, uint64_t n,
			  const float *src)
{
	struct copy_task t = {.g = g, .off = off, .n = n, .src = src};

	(void)root; /* the owner's master copy lives in this daemon */
	return pool_parallel_for(g->pool, (n + CHUNK - 1) / CHUNK, copy_task_run, &t);
}

static int host_all_gather(struct coll_group *g, const struct coll_range *r, uint32_t nr,
			   const float *src)
{
	int rc = 0;

	for (uint32_t k = 0; k < nr && rc >= 0; k++)
		rc = host_broadcast(g, r[k].owner, r[k].off, r[k].n, src);
	return rc;
}

const struct coll_ops coll_host_ops = {
	.name = "host",
	.open = host_open,
	.all_reduce = host_all_reduce,
	.reduce_scatter = host_reduce_scatter,
	.broadcast = host_broadcast,
	.all_gather = host_all_gather,
	.close = host_close,
};
