/*
 * state.c — the compact optimizer state of the owned pieces (see state.h).
 * Pieces come from merging each bucket's shard units with its segments, both
 * sorted by offset: linear in units + segments.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "plan/state.h"

static unsigned count_arrays(unsigned arrays)
{
	return !!(arrays & PLAN_STATE_M) + !!(arrays & PLAN_STATE_V) + !!(arrays & PLAN_STATE_VMAX);
}

/* One pass counts (s->pieces NULL), the second fills. */
static uint32_t walk(const struct plan *p, const struct shard_map *sm, const struct zero_topo *t,
		     struct state *s)
{
	uint32_t k = 0, seg0 = 0;
	uint64_t at = 0, mat = 0;

	for (uint32_t b = 0; b < p->nbuckets; b++) {
		const struct plan_bucket *bk = &p->buckets[b];
		uint32_t s0 = 0;

		if (b > 0)
			seg0 += p->buckets[b - 1].nsegments;

		if (s->pieces)
			s->bucket_first[b] = k;
		for (uint32_t u = sm->bucket_first[b]; u < sm->bucket_first[b + 1]; u++) {
			const struct shard_unit *un = &sm->units[u];
			uint64_t lo = un->offset, hi = un->offset + un->numel;

			if (!zero_local(t, un->owner))
				continue;
			while (s0 < bk->nsegments &&
			       bk->segments[s0].offset + bk->segments[s0].numel <= lo)
				s0++;
			for (uint32_t g = s0; g < bk->nsegments && bk->segments[g].offset < hi; g++) {
				const struct zc_segment *sg = &bk->segments[g];
				uint64_t a = MAX(lo, sg->offset), z = MIN(hi, sg->offset + sg->numel);
				if (a >= z)
					continue;
				if (s->pieces)
					s->pieces[k] = (struct optim_piece){
						.group = sg->group,
						.owner = un->owner,
						.off = bk->base + a,
						.n = z - a,
						.at = at,
						.step = 1,
						.first_momentum = true,
						.seg = seg0 + g,
						.dtype = bk->dtype,
						.mat = mat,
					};
				at += z - a;
				if (bk->dtype != ZC_DTYPE_F32)
					mat += z - a;
				k++;
			}
		}
	}
	if (s->pieces)
		s->bucket_first[p->nbuckets] = k;
	s->nelems = at;
	s->nmaster = mat;
	return k;
}

int state_layout(const struct plan *p, const struct shard_map *sm, const struct zero_topo *t,
		 unsigned arrays, struct state **ret)
{
	struct state *s = calloc(1, sizeof(*s));
	uint32_t n;

	if (!s)
		return -ENOMEM;
	s->arrays = arrays;
	n = walk(p, sm, t, s);
	s->pieces = calloc(n ? n : 1, sizeof(*s->pieces));
	s->bucket_first = calloc(p->nbuckets + 1, sizeof(*s->bucket_first));
	if (!s->pieces || !s->bucket_first) {
		state_free(s);
		return -ENOMEM;
	}
	s->npieces = walk(p, sm, t, s);
	*ret = s;
	return 0;
}

uint64_t state_bytes(const struct state *s)
{
	return (s->nelems * count_arrays(s->arrays) + s->nmaster) * sizeof(float);
}

int state_alloc(struct state *s)
{
	unsigned na = count_arrays(s->arrays);
	uint64_t total = s->nelems * na + s->nmaster;
	float *at;

	if (total == 0)
		return 0;
	s->arena = calloc(total, sizeof(float));
	if (!s->arena)
		return -ENOMEM;
	at = s->arena;
	if (s->arrays & PLAN_STATE_M)
		s->m = at, at += s->nelems;
	if (s->arrays & PLAN_STATE_V)
		s->v = at, at += s->nelems;
	if (s->arrays & PLAN_STATE_VMAX)
		s->vmax = at, at += s->nelems;
	if (s->nmaster)
		s->master = at;
	return 0;
}

void state_release(struct state *s)
{
	free(s->arena);
	s->arena = s->m = s->v = s->vmax = s->master = NULL;
	free(s->undo);
	free(s->undo_pc);
	free(s->undo_iter);
	free(s->undo_params);
	s->undo = NULL;
	s->undo_pc = NULL;
	s->undo_iter = NULL;
	s->undo_params = NULL;
}

int state_undo_marks(struct state *s, uint32_t nbuckets)
{
	if (s->undo_iter)
		return 0;
	s->nbuckets = nbuckets;
	s->undo_pc = calloc(s->npieces ? s->npieces : 1, sizeof(*s->undo_pc));
	s->undo_iter = malloc((nbuckets ? nbuckets : 1) * sizeof(*s->undo_iter));
	if (!s->undo_pc || !s->undo_iter)
		return -ENOMEM;
	for (uint32_t b = 0; b < nbuckets; b++)
		s->undo_iter[b] = UINT64_MAX;
	return 0;
}

int state_undo_alloc(struct state *s, uint32_t nbuckets)
{
	uint64_t total = s->nelems * count_arrays(s->arrays) + s->nmaster;
	int r = state_undo_marks(s, nbuckets);

	if (r < 0)
		return r;
	if (!s->undo)
		s->undo = calloc(total ? total : 1, sizeof(float));
	if (!s->undo_params)
		s->undo_params = calloc(s->nelems ? s->nelems : 1, sizeof(*s->undo_params));
	return s->undo && s->undo_params ? 0 : -ENOMEM;
}

/* The arena's arrays, by index (m, v, vmax) into their undo copies. */
static void undo_arrays(struct state *s, float **from, float **to, unsigned *n)
{
	unsigned k = 0;
	float *arr[3] = {s->m, s->v, s->vmax};

	for (unsigned i = 0; i < 3; i++)
		if (arr[i]) {
			from[k] = arr[i];
			to[k] = s->undo + (arr[i] - s->arena);
			k++;
		}
	*n = k;
}

static size_t param_size(enum zc_dtype dt)
{
	return dt == ZC_DTYPE_F32 ? 4 : 2;
}

void state_undo_save(struct state *s, uint32_t k, uint64_t x, uint64_t n, void *const *params)
{
	const struct optim_piece *pc = &s->pieces[k];
	size_t es = param_size(pc->dtype);
	float *from[3], *to[3];
	unsigned na;

	undo_arrays(s, from, to, &na);
	for (unsigned i = 0; i < na; i++)
		memcpy(to[i] + pc->at + x, from[i] + pc->at + x, n * sizeof(float));
	if (s->master && pc->dtype != ZC_DTYPE_F32)
		memcpy(s->undo + (s->master - s->arena) + pc->mat + x, s->master + pc->mat + x,
		       n * sizeof(float));
	if (x == 0)
		s->undo_pc[k] = (struct state_undo){pc->step, pc->first_momentum};
	if (es == 4)
		memcpy(s->undo_params + pc->at + x,
		       (const char *)params[pc->owner] + (pc->off + x) * es, n * es);
	else
		for (uint64_t e = x; e < x + n; e++)
			s->undo_params[pc->at + e] =
				((const uint16_t *)params[pc->owner])[pc->off + e];
}

uint32_t state_undo_restore(struct state *s, uint64_t t, void *params)
{
	float *from[3], *to[3];
	uint32_t nb = 0;
	unsigned na;

	if (!s->undo_iter)
		return 0;
	undo_arrays(s, from, to, &na);
	for (uint32_t b = 0; b < s->nbuckets; b++) {
		if (s->undo_iter[b] != t)
			continue;
		for (uint32_t k = s->bucket_first[b]; k < s->bucket_first[b + 1]; k++) {
			struct optim_piece *pc = &s->pieces[k];
			size_t es = param_size(pc->dtype);

			for (unsigned i = 0; i < na; i++)
				memcpy(from[i] + pc->at, to[i] + pc->at, pc->n * sizeof(float));
			if (s->master && pc->dtype != ZC_DTYPE_F32)
				memcpy(s->master + pc->mat,
				       s->undo + (s->master - s->arena) + pc->mat,
				       pc->n * sizeof(float));
			pc->step = s->undo_pc[k].step;
			pc->first_momentum = s->undo_pc[k].first_momentum;
			if (es == 4)
				memcpy((char *)params + pc->off * es, s->undo_params + pc->at,
				       pc->n * es);
			else
				for (uint64_t x = 0; x < pc->n; x++)
					((uint16_t *)params)[pc->off + x] =
						(uint16_t)s->undo_params[pc->at + x];
		}
		s->undo_iter[b] = UINT64_MAX;
		nb++;
	}
	return nb;
}

void state_free(struct state *s)
{
	if (!s)
		return;
	state_release(s);
	free(s->pieces);
	free(s->bucket_first);
	free(s);
}

/* Segment i (flat, plan order) of p: its first element in the buffers. */
static uint64_t seg_base(const struct plan *p, uint32_t i, uint64_t *numel)
{
	for (uint32_t b = 0; b < p->nbuckets; b++) {
		if (i < p->buckets[b].nsegments) {
			*numel = p->buckets[b].segments[i].numel;
			return p->buckets[b].base + p->buckets[b].segments[i].offset;
		}
		i -= p->buckets[b].nsegments;
	}
	*numel = 0;
	return 0;
}

int state_relayout(const struct plan *old, const struct state *k, const void *from,
		   const struct plan *p, struct state *st, void *to)
{
	uint32_t nsegs = 0, *map;
	int r;

	for (uint32_t b = 0; b < p->nbuckets; b++)
		nsegs += p->buckets[b].nsegments;
	map = calloc(nsegs ? nsegs : 1, sizeof(*map));
	if (!map)
		return -ENOMEM;
	if (plan_replan_match(old, p, map, NULL, 0) < 0 || old->low_precision || p->low_precision) {
		free(map);
		return -EINVAL;
	}
	if ((r = state_alloc(st)) < 0) {
		free(map);
		return r;
	}
	for (uint32_t i = 0; i < nsegs; i++) {
		uint64_t n, n_old, nb = seg_base(p, i, &n), ob = seg_base(old, map[i], &n_old);
		memcpy((float *)to + nb, (const float *)from + ob, n * sizeof(float));
	}
	for (uint32_t i = 0; i < st->npieces; i++) {
		struct optim_piece *pc = &st->pieces[i];
		uint64_t n, nb = seg_base(p, pc->seg, &n), ob = seg_base(old, map[pc->seg], &n);
		uint64_t at = ob + (pc->off - nb); /* its first element, by old's offsets */
		uint32_t lo = 0, hi = k->npieces;

		while (hi - lo > 1) { /* the old piece holding `at`: pieces go by offset */
			uint32_t mid = lo + (hi - lo) / 2;
			if (k->pieces[mid].off <= at)
				lo = mid;
			else
				hi = mid;
		}
		pc->step = k->pieces[lo].step; /* one segment's pieces step together */
		pc->first_momentum = k->pieces[lo].first_momentum;
		for (uint64_t x = 0; x < pc->n;) {
			const struct optim_piece *op = &k->pieces[lo];
			uint64_t e = at + x, in = e - op->off, len = MIN(op->n - in, pc->n - x);

			if (e < op->off || in >= op->n) { /* not the next piece: a hole */
				free(map);
				return -EINVAL;
			}
			if (st->m)
				memcpy(st->m + pc->at + x, k->m + op->at + in, len * sizeof(float));
			if (st->v)
				memcpy(st->v + pc->at + x, k->v + op->at + in, len * sizeof(float));
			if (st->vmax)
				memcpy(st->vmax + pc->at + x, k->vmax + op->at + in,
				       len * sizeof(float));
			x += len;
			lo++;
		}
	}
	free(map);
	return 0;
}
