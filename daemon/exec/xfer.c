/*
 * xfer.c — the optimizer state's export and import (exec_state(), for
 * statex.c): between iterations, each owned piece's values to or from every
 * local rank's staging in the state's layout, straight on one node, over
 * several through broadcasts or a gather of packed records; and the owned
 * ranges of that layout. Owns nothing between two requests. The compute
 * lane, except exec_owned_ranges() (loop thread).
 */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "exec/exec_int.h"
#include "base/hostmem.h"

/*
 * The staging is in the state's layout (plan.h: every element an fp32 slot,
 * bucket b from sbase), not the buffers': a bf16/fp16 bucket's moments and
 * masters are fp32 and must not be rounded on the way.
 */
static float *region(float *stg, uint64_t slots, unsigned k)
{
	return stg + (size_t)k * slots;
}

/* Where piece pc of bucket b is in the state's layout. */
static uint64_t piece_slot(const struct plan *p, uint32_t b, const struct optim_piece *pc)
{
	return p->buckets[b].sbase + (pc->off - p->buckets[b].base);
}

static uint32_t piece_meta(const struct exec *e, const struct optim_piece *pc)
{
	const struct zc_param_group *g = &e->groups[pc->group];
	const struct state *s = e->cfg.state;
	uint32_t w;

	if (e->cfg.plan->optimizer == ZC_OPT_SGD)
		return (s->arrays & PLAN_STATE_M) && !pc->first_momentum ? EXEC_META_MOMENTUM : 0;
	w = (uint32_t)MIN(pc->step - 1, (uint64_t)EXEC_META_STEP);
	if (w && (s->arrays & PLAN_STATE_VMAX) && g->amsgrad)
		w |= EXEC_META_VMAX;
	return w;
}

/* The backend's array (enum optim_array) of staging region k. */
static unsigned state_array(unsigned k)
{
	return k == EXEC_REGION_M   ? OPTIM_ARRAY_M
	       : k == EXEC_REGION_V ? OPTIM_ARRAY_V
	       : k == EXEC_REGION_VMAX ? OPTIM_ARRAY_VMAX
				       : OPTIM_ARRAY_MASTER;
}

/* Piece pc's values of region k, as 32-bit words (n of them) into dst. */
static int piece_values(const struct exec *e, const struct optim_piece *pc, unsigned k, void *dst)
{
	const struct state *s = e->cfg.state;
	const float *src = k == EXEC_REGION_M      ? s->m
			   : k == EXEC_REGION_V    ? s->v
			   : k == EXEC_REGION_VMAX ? s->vmax
						   : NULL;

	if (k == EXEC_REGION_META) {
		uint32_t w = piece_meta(e, pc);
		for (uint64_t x = 0; x < pc->n; x++)
			memcpy((char *)dst + x * sizeof(w), &w, sizeof(w));
	} else if (e->cfg.optim->state_io) { /* the backend's (cuda: device memory) */
		if (k != EXEC_REGION_MASTER || pc->dtype != ZC_DTYPE_F32)
			return e->cfg.optim->state_io(e->oc, pc, state_array(k), dst, false);
	} else if (k == EXEC_REGION_MASTER) {
		if (pc->dtype != ZC_DTYPE_F32)
			memcpy(dst, s->master + pc->mat, pc->n * sizeof(float));
	} else {
		memcpy(dst, src + pc->at, pc->n * sizeof(float));
	}
	return 0;
}

static bool region_kept(const struct exec *e, unsigned k)
{
	const struct state *s = e->cfg.state;

	switch (k) {
	case EXEC_REGION_META:
		return true;
	case EXEC_REGION_M:
		return s->arrays & PLAN_STATE_M;
	case EXEC_REGION_V:
		return s->arrays & PLAN_STATE_V;
	case EXEC_REGION_VMAX:
		return s->arrays & PLAN_STATE_VMAX;
	case EXEC_REGION_MASTER:
		return s->nmaster;
	}
	return false;
}

/* One node, or a checkpoint's export on any node: each piece this node
 * owns goes straight into each local rank's staging (the ranks given
 * one). A sparse export writes the step word at each piece's first element
 * only: a segment starts a piece, and a reader reads it there. The state
 * arrays go with non-temporal stores: the staging is the trainer's, read
 * by its writer later if at all, and a piece of tens of MB is below the
 * size where memcpy streams (a checkpoint's copy is half as fast again). */
static int export_local(struct exec *e, const struct exec_state_req *rq)
{
	const struct plan *p = e->cfg.plan;
	const struct state *s = e->cfg.state;
	int r;

	for (unsigned k = EXEC_REGION_META; k < exec_state_regions(p); k++) {
		if (!region_kept(e, k))
			continue;
		for (uint32_t b = 0; b < p->nbuckets; b++)
			for (uint32_t i = s->bucket_first[b]; i < s->bucket_first[b + 1]; i++) {
				const struct optim_piece *pc = &s->pieces[i];
				uint64_t at = piece_slot(p, b, pc);
				bool one = k == EXEC_REGION_META && rq->sparse_meta;
				const float *array = k == EXEC_REGION_M      ? s->m
						     : k == EXEC_REGION_V    ? s->v
						     : k == EXEC_REGION_VMAX ? s->vmax
									     : NULL;
				uint64_t n = one ? 1 : pc->n;
				float *first = NULL;

				for (uint32_t l = 0; l < e->nlocal; l++) {
					float *stg = rq->staging[e->local[l]], *dst;
					if (!stg)
						continue;
					dst = region(stg, p->state_numel, k) + at;
					if (first) {
						host_store(dst, first, n);
						continue;
					}
					if (one) {
						uint32_t w = piece_meta(e, pc);
						memcpy(dst, &w, sizeof(w));
					} else if (array && !e->cfg.optim->state_io) {
						host_store(dst, array + pc->at, n);
					} else {
						r = piece_values(e, pc, k, dst);
						if (r < 0)
							return r;
					}
					first = dst;
				}
			}
	}
	return 0;
}

/*
 * Several nodes: region k travels in the parameter buffers by the job's own
 * broadcast of every shard unit, then each local rank's buffer goes into
 * its staging. Such a job has fp32 buckets only (backend_host_multi takes
 * no bf16/fp16: job.c), so the buffers' layout is the state's.
 */
static int export_region(struct exec *e, struct lane *ln, const struct exec_state_req *rq,
			 unsigned k)
{
	const struct plan *p = e->cfg.plan;
	const struct state *s = e->cfg.state;
	int r;

	for (uint32_t i = 0; i < s->npieces; i++) {
		const struct optim_piece *pc = &s->pieces[i];
		piece_values(e, pc, k, e->cfg.params[pc->owner] + pc->off);
	}
	r = lane_coll(e, ln, COLL_BCAST, p->shard_mode, e->ranges, e->cfg.shard->nunits);
	if (r < 0)
		return r;
	for (uint32_t l = 0; l < e->nlocal; l++) {
		uint32_t lr = e->local[l];
		memcpy(region(rq->staging[lr], p->state_numel, k), e->cfg.params[lr],
		       p->total_numel * sizeof(float));
	}
	return 0;
}

static int export_bcast(struct exec *e, struct lane *ln, const struct exec_state_req *rq)
{
	const struct plan *p = e->cfg.plan;
	uint64_t bytes = plan_buffer_bytes(p);
	int r = 0;

	if (p->low_precision)
		return -ENOTSUP; /* not taken over several nodes (above) */
	if (e->cfg.optim->state_io)
		return -EOPNOTSUPP; /* device buffers: not through host copies (yet) */
	for (uint32_t l = 0; l < e->nlocal; l++) {
		uint32_t lr = e->local[l];
		memcpy(region(rq->staging[lr], p->state_numel, EXEC_REGION_SAVE), e->cfg.params[lr],
		       bytes);
	}
	for (unsigned k = EXEC_REGION_META; k < exec_state_regions(p) && r >= 0; k++)
		if (region_kept(e, k))
			r = export_region(e, ln, rq, k);
	/* the parameters as they were, whatever came of it */
	for (uint32_t l = 0; l < e->nlocal; l++) {
		uint32_t lr = e->local[l];
		memcpy(e->cfg.params[lr], region(rq->staging[lr], p->state_numel, EXEC_REGION_SAVE),
		       bytes);
	}
	return r;
}

/* Rank r is on this node. */
static bool rank_here(const struct exec *e, uint32_t r)
{
	for (uint32_t l = 0; l < e->nlocal; l++)
		if (e->local[l] == r)
			return true;
	return false;
}

/* Region k of piece pc travels in an export (an fp32 piece has no master). */
static bool piece_region(const struct exec *e, const struct optim_piece *pc, unsigned k)
{
	return region_kept(e, k) && (k != EXEC_REGION_MASTER || pc->dtype != ZC_DTYPE_F32);
}

#define PACK_HEAD 5 /* words per record: slot (2), n (2), region */

/* Piece pc's region k is packed here: its owner is on this node. */
static bool packed_here(const struct exec *e, const struct optim_piece *pc, unsigned k)
{
	return piece_region(e, pc, k) && rank_here(e, pc->owner);
}

/* The 32-bit words this node's export pack takes: the record count (2
 * words), then a record per piece and region. */
static uint64_t pack_words(const struct exec *e)
{
	const struct state *s = e->cfg.state;
	uint64_t w = 2;

	for (uint32_t i = 0; i < s->npieces; i++)
		for (unsigned k = EXEC_REGION_META; k < exec_state_regions(e->cfg.plan); k++)
			if (packed_here(e, &s->pieces[i], k))
				w += PACK_HEAD + s->pieces[i].n;
	return w;
}

/* Unpack one node's records into every local rank's staging. */
static int unpack(struct exec *e, const struct exec_state_req *rq, const uint32_t *w, uint64_t len)
{
	const struct plan *p = e->cfg.plan;
	uint64_t nrec, pos = 2;

	memcpy(&nrec, w, sizeof(nrec));
	for (uint64_t i = 0; i < nrec; i++) {
		uint64_t at, n;
		unsigned k;

		if (pos + PACK_HEAD > len)
			return -EPROTO;
		memcpy(&at, w + pos, sizeof(at));
		memcpy(&n, w + pos + 2, sizeof(n));
		k = w[pos + 4];
		pos += PACK_HEAD;
		if (pos + n > len || k >= exec_state_regions(p) || at + n > p->state_numel)
			return -EPROTO;
		for (uint32_t l = 0; l < e->nlocal; l++)
			memcpy(region(rq->staging[e->local[l]], p->state_numel, k) + at, w + pos,
			       n * sizeof(float));
		pos += n;
	}
	return 0;
}

/*
 * Several nodes, state on the devices (optim_ops.state_io, cuda): a node's
 * state holds its own owners' pieces only, so each node packs them as
 * records (slot, length, region, values), one gather agrees on the longest
 * pack, a second brings every node's (padded to it), and each node unpacks
 * them all into every local rank's staging. The state crosses as bytes:
 * the staging holds the owners' bits.
 */
static int export_gather(struct exec *e, struct lane *ln, const struct exec_state_req *rq)
{
	const struct plan *p = e->cfg.plan;
	const struct state *s = e->cfg.state;
	uint64_t mine = pack_words(e), maxw = 0, pos = 2, nrec = 0;
	uint32_t *w;
	double *all;
	size_t n;
	int r;

	r = gbuf_reserve(e, 1);
	if (r < 0)
		return r;
	e->gbuf[0] = (double)mine;
	r = lane_gather(e, ln, 1, &all);
	if (r < 0)
		return r;
	for (uint32_t nd = 0; nd < e->cfg.net->nnodes; nd++)
		maxw = MAX(maxw, (uint64_t)all[nd]);
	n = (size_t)(maxw + 1) / 2; /* doubles: two words each */
	r = gbuf_reserve(e, n);
	if (r < 0)
		return r;
	w = (uint32_t *)e->gbuf;
	memset(w, 0, n * sizeof(double));
	for (uint32_t b = 0; b < p->nbuckets && r >= 0; b++)
		for (uint32_t i = s->bucket_first[b]; i < s->bucket_first[b + 1] && r >= 0; i++)
			for (unsigned k = EXEC_REGION_META; k < exec_state_regions(p) && r >= 0;
			     k++) {
				const struct optim_piece *pc = &s->pieces[i];
				uint64_t at = piece_slot(p, b, pc), len = pc->n;
				if (!packed_here(e, pc, k))
					continue;
				memcpy(w + pos, &at, sizeof(at));
				memcpy(w + pos + 2, &len, sizeof(len));
				w[pos + 4] = k;
				r = piece_values(e, pc, k, w + pos + PACK_HEAD);
				pos += PACK_HEAD + len;
				nrec++;
			}
	memcpy(w, &nrec, sizeof(nrec));
	/* a failed copy still gathers: the other nodes wait for this one */
	int g = lane_gather(e, ln, n, &all);
	if (r < 0 || g < 0)
		return r < 0 ? r : g;
	for (uint32_t nd = 0; nd < e->cfg.net->nnodes && r >= 0; nd++)
		r = unpack(e, rq, (const uint32_t *)(all + (size_t)nd * n), 2 * (uint64_t)n);
	return r;
}

int xfer_export(struct exec *e, struct lane *ln, const struct exec_state_req *rq)
{
	/* a checkpoint's export stays on its node: each node's stager gets
	 * this node's pieces only, and its trainer writes them */
	if (e->nlocal == e->cfg.world || rq->sparse_meta)
		return export_local(e, rq);
	return e->cfg.optim->state_io ? export_gather(e, ln, rq) : export_bcast(e, ln, rq);
}

/* The segment of bucket b that holds flat element off. */
static uint32_t piece_segment(const struct plan *p, uint32_t b, uint64_t off)
{
	const struct plan_bucket *bk = &p->buckets[b];
	uint64_t a = off - bk->base;
	uint32_t lo = 0, hi = bk->nsegments - 1;

	while (lo < hi) {
		uint32_t mid = lo + (hi - lo + 1) / 2;
		if (bk->segments[mid].offset <= a)
			lo = mid;
		else
			hi = mid - 1;
	}
	return lo;
}

/* Piece pc's array `which` (host: arr) from src, or zeros where not given;
 * nothing where the state has no such array. */
static int import_array(struct exec *e, const struct optim_piece *pc, unsigned which, float *arr,
			const float *src, bool given)
{
	if (e->cfg.optim->state_io) {
		/* over several nodes each node imports its own owners' pieces */
		if (!(e->cfg.state->arrays & (PLAN_STATE_M << which)) || !rank_here(e, pc->owner))
			return 0;
		return e->cfg.optim->state_io(e->oc, pc, which, given ? (float *)src : NULL, true);
	}
	if (!arr)
		return 0;
	if (given)
		memcpy(arr + pc->at, src, pc->n * sizeof(float));
	else
		memset(arr + pc->at, 0, pc->n * sizeof(float));
	return 0;
}

/* A bf16/fp16 piece's master: given, or its owner's parameters widened. */
static int import_master(struct exec *e, const struct optim_piece *pc, const float *src)
{
	struct state *s = e->cfg.state;

	if (e->cfg.optim->state_io && !rank_here(e, pc->owner))
		return 0; /* its owner's node imports it */
	if (e->cfg.optim->state_io)
		return src ? e->cfg.optim->state_io(e->oc, pc, OPTIM_ARRAY_MASTER, (float *)src,
						    true)
			   : e->cfg.optim->masters(e->oc, pc, 1, OPTIM_MASTER_LOAD);
	if (src)
		memcpy(s->master + pc->mat, src, pc->n * sizeof(float));
	else
		host_widen(s->master + pc->mat,
			   (const uint16_t *)e->cfg.params[pc->owner] + pc->off, pc->n, pc->dtype);
	return 0;
}

/* Some bf16/fp16 segment is given with its master. */
static bool masters_given(const struct plan *p, const struct exec_state_req *rq)
{
	for (uint32_t b = 0; b < p->nbuckets; b++)
		for (uint32_t i = 0;
		     p->buckets[b].dtype != ZC_DTYPE_F32 && i < p->buckets[b].nsegments; i++) {
			const struct exec_seg_state *g = &rq->segs[rq->seg_first[b] + i];
			if (g->given && (g->present & ZC_STATE_MASTER))
				return true;
		}
	return false;
}

/* Validated on the loop thread already (statex.c): nothing here can fail
 * on the host backend, so nothing is applied partially; a backend that
 * keeps the state (cuda) can fail a copy, and the job then fails. A
 * bf16/fp16 piece given without its master takes it from its owner's
 * parameters, widened. */
int xfer_import(struct exec *e, struct lane *ln, const struct exec_state_req *rq)
{
	const struct plan *p = e->cfg.plan;
	struct state *s = e->cfg.state;
	uint64_t slots = p->state_numel;
	bool stored = false;
	int r = 0;

	for (uint32_t b = 0; b < p->nbuckets; b++)
		for (uint32_t i = s->bucket_first[b]; i < s->bucket_first[b + 1] && r >= 0; i++) {
			struct optim_piece *pc = &s->pieces[i];
			const struct exec_seg_state *g =
				&rq->segs[rq->seg_first[b] + piece_segment(p, b, pc->off)];
			float *stg = rq->staging[pc->owner];
			uint64_t at = piece_slot(p, b, pc);
			bool has;

			if (!g->given)
				continue;
			if (pc->dtype != ZC_DTYPE_F32) {
				bool given = g->present & ZC_STATE_MASTER;
				r = import_master(e, pc,
						  given ? region(stg, slots, EXEC_REGION_MASTER) +
								  at
							: NULL);
				/* device buffers: the client cannot write them, so the
				 * owner's parameters take the narrowed master here */
				if (r >= 0 && given && e->cfg.optim->masters) {
					if (rank_here(e, pc->owner))
						r = e->cfg.optim->masters(e->oc, pc, 1,
									  OPTIM_MASTER_STORE);
					stored = true; /* on every node: all broadcast */
				}
				if (r < 0)
					break;
			}
			if (p->optimizer == ZC_OPT_SGD) {
				has = g->present & ZC_STATE_MOMENTUM_BUFFER;
				r = import_array(e, pc, OPTIM_ARRAY_M, s->m,
						 region(stg, slots, EXEC_REGION_M) + at, has);
				pc->first_momentum = !has;
				continue;
			}
			has = g->present & ZC_STATE_STEP;
			r = import_array(e, pc, OPTIM_ARRAY_M, s->m,
					 region(stg, slots, EXEC_REGION_M) + at, has);
			if (r >= 0)
				r = import_array(e, pc, OPTIM_ARRAY_V, s->v,
						 region(stg, slots, EXEC_REGION_V) + at, has);
			if (r >= 0)
				r = import_array(e, pc, OPTIM_ARRAY_VMAX, s->vmax,
						 region(stg, slots, EXEC_REGION_VMAX) + at,
						 g->present & ZC_STATE_MAX_EXP_AVG_SQ);
			pc->step = has ? g->step + 1 : 1;
		}
	/* ... and every other local rank's from its owner (the client does this
	 * itself for host buffers: zeroclient.h's zc_set_state); over several
	 * nodes every node broadcasts if any may have stored one, since each
	 * holds only its own owners' pieces */
	if (e->cfg.net && e->cfg.net->nnodes > 1 && e->cfg.optim->masters)
		stored = masters_given(p, rq);
	if (r >= 0 && stored)
		r = lane_coll(e, ln, COLL_BCAST, p->shard_mode, e->ranges, e->cfg.shard->nunits);
	/* the fp32 copies a recovery needs: from the parameters as they are now */
	if (r >= 0 && e->cfg.keep_params)
		r = e->cfg.optim->masters(e->oc, s->pieces, s->npieces, OPTIM_MASTER_KEEP);
	return r;
}

int exec_owned_ranges(const struct exec *e, uint64_t **ret, size_t *ret_n)
{
	const struct plan *p = e->cfg.plan;
	const struct state *s = e->cfg.state;
	uint64_t *w = malloc((2 * (size_t)s->npieces + 1) * sizeof(*w));
	size_t n = 0;

	if (!w)
		return -ENOMEM;
	for (uint32_t b = 0; b < p->nbuckets; b++)
		for (uint32_t i = s->bucket_first[b]; i < s->bucket_first[b + 1]; i++) {
			w[n++] = piece_slot(p, b, &s->pieces[i]);
			w[n++] = s->pieces[i].n;
		}
	*ret = w;
	*ret_n = n;
	return 0;
}
