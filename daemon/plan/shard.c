/*
 * shard.c — the ownership function (see shard.h). Deterministic: no hash
 * tables, no pointers compared, every tie broken by index.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>

#include "common.h"
#include "plan/shard.h"

void shard_map_free(struct shard_map *m)
{
	if (!m)
		return;
	free(m->units);
	free(m->bucket_first);
	free(m->load);
	free(m);
}

static int unit_cmp_size_desc(const void *a, const void *b)
{
	const struct shard_unit *x = a, *y = b;

	if (x->numel != y->numel)
		return x->numel > y->numel ? -1 : 1;
	if (x->bucket != y->bucket)
		return x->bucket < y->bucket ? -1 : 1;
	return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static int unit_cmp_position(const void *a, const void *b)
{
	const struct shard_unit *x = a, *y = b;

	if (x->bucket != y->bucket)
		return x->bucket < y->bucket ? -1 : 1;
	return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static uint64_t total_numel(const struct plan *p)
{
	uint64_t t = 0;

	for (uint32_t b = 0; b < p->nbuckets; b++)
		t += p->buckets[b].numel;
	return t;
}

/* Pieces of every bucket, none larger than cap (near-equal splits). */
static int split_buckets(const struct plan *p, uint64_t cap, struct shard_unit **ret,
			 uint32_t *ret_n)
{
	struct shard_unit *u;
	uint64_t n = 0;
	uint32_t k = 0;

	for (uint32_t b = 0; b < p->nbuckets; b++)
		n += (p->buckets[b].numel + cap - 1) / cap;
	if (n > UINT32_MAX)
		return -E2BIG;
	u = calloc(n, sizeof(*u));
	if (!u)
		return -ENOMEM;
	for (uint32_t b = 0; b < p->nbuckets; b++) {
		uint64_t numel = p->buckets[b].numel;
		uint64_t pieces = (numel + cap - 1) / cap, off = 0;
		for (uint64_t i = 0; i < pieces; i++) {
			uint64_t len = numel / pieces + (i < numel % pieces);
			u[k++] = (struct shard_unit){.bucket = b, .offset = off, .numel = len};
			off += len;
		}
	}
	*ret = u;
	*ret_n = k;
	return 0;
}

/* A min-heap of ranks by (load, rank): the least-loaded rank, lowest first. */
static bool rank_before(const struct shard_map *m, uint32_t a, uint32_t b)
{
	return m->load[a] != m->load[b] ? m->load[a] < m->load[b] : a < b;
}

static void heap_sift_down(const struct shard_map *m, uint32_t *h, uint32_t n, uint32_t i)
{
	for (;;) {
		uint32_t l = 2 * i + 1, r = l + 1, best = i, t;
		if (l < n && rank_before(m, h[l], h[best]))
			best = l;
		if (r < n && rank_before(m, h[r], h[best]))
			best = r;
		if (best == i)
			return;
		t = h[i];
		h[i] = h[best];
		h[best] = t;
		i = best;
	}
}

static int assign_bucket_mode(const struct plan *p, struct shard_map *m)
{
	uint64_t cap = (total_numel(p) + m->world - 1) / m->world;
	uint32_t *heap;
	int r;

	r = split_buckets(p, cap ? cap : 1, &m->units, &m->nunits);
	if (r < 0)
		return r;
	heap = malloc(m->world * sizeof(*heap));
	if (!heap)
		return -ENOMEM;
	for (uint32_t w = 0; w < m->world; w++)
		heap[w] = w; /* all loads 0: already a heap in rank order */
	qsort(m->units, m->nunits, sizeof(*m->units), unit_cmp_size_desc);
	for (uint32_t i = 0; i < m->nunits; i++) {
		uint32_t best = heap[0];
		m->units[i].owner = best;
		m->load[best] += m->units[i].numel;
		heap_sift_down(m, heap, m->world, 0);
	}
	free(heap);
	qsort(m->units, m->nunits, sizeof(*m->units), unit_cmp_position);
	return 0;
}

static int assign_slice_mode(const struct plan *p, struct shard_map *m)
{
	uint64_t n = 0;
	uint32_t cursor = 0, k = 0;

	for (uint32_t b = 0; b < p->nbuckets; b++)
		n += MIN(p->buckets[b].numel, (uint64_t)m->world);
	if (n > UINT32_MAX)
		return -E2BIG;
	m->units = calloc(n, sizeof(*m->units));
	if (!m->units)
		return -ENOMEM;
	for (uint32_t b = 0; b < p->nbuckets; b++) {
		uint64_t numel = p->buckets[b].numel, base = numel / m->world, off = 0;
		uint32_t rem = (uint32_t)(numel % m->world);
		for (uint32_t w = 0; w < m->world; w++) {
			/* ranks cursor, cursor+1, ... (mod world) take the rem longer slices */
			uint32_t pos = (w + m->world - cursor) % m->world;
			uint64_t len = base + (pos < rem);
			if (len == 0)
				continue;
			m->units[k++] = (struct shard_unit){
				.bucket = b, .owner = w, .offset = off, .numel = len};
			m->load[w] += len;
			off += len;
		}
		cursor = (cursor + rem) % m->world;
	}
	m->nunits = k;
	return 0;
}

int shard_assign(const struct plan *p, uint32_t world, struct shard_map **ret)
{
	struct shard_map *m;
	int r;

	if (world == 0)
		return -EINVAL;
	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->world = world;
	m->nbuckets = p->nbuckets;
	m->load = calloc(world, sizeof(*m->load));
	m->bucket_first = calloc(p->nbuckets + 1, sizeof(*m->bucket_first));
	if (!m->load || !m->bucket_first) {
		r = -ENOMEM;
		goto fail;
	}
	r = p->shard_mode == ZC_SHARD_SLICE ? assign_slice_mode(p, m) : assign_bucket_mode(p, m);
	if (r < 0)
		goto fail;
	for (uint32_t i = 0, b = 0; b <= p->nbuckets; b++) {
		while (i < m->nunits && m->units[i].bucket < b)
			i++;
		m->bucket_first[b] = i;
	}
	for (uint32_t i = 0; i < m->nunits; i++)
		m->max_unit = MAX(m->max_unit, m->units[i].numel);
	*ret = m;
	return 0;
fail:
	shard_map_free(m);
	return r;
}
