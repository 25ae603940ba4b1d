/*
 * ckpt.c — checkpoints of a job's parameters and optimizer state on disk
 * (zc_checkpoint, zc_restore), the format docs/CHECKPOINT.md describes.
 * This file is zc_checkpoint() and zc_checkpoint_wait(): the export of the
 * state into the writer's staging, the writer started. Beside it (ckpt.h):
 * ckdata.c (the files written), ckgen.c (reading files, generations),
 * ckmanifest.c (the manifest parsed and matched), ckwriter.c (the writer
 * thread), ckload.c (zc_restore).
 *
 * Built on the state export/import rounds (zc_get_state / zc_set_state):
 * the state is torch's per parameter segment (keyed by param_id, or the
 * position in plan order), so a restore maps it onto any layout, world
 * size, shard mode or node count holding the same parameters. On one node
 * rank 0 writes it all (version 1: state.zck); on several each node's local
 * rank 0 writes the ranges its zerod owns (version 2: node-K.zck, records
 * of (segment, offset, numel)), and rank 0 the manifest once every node's
 * node-K.sum names the iteration.
 * Each checkpoint is a new generation: its files are written into a
 * directory of their own (.tmp-ITERATION-RUN), each fsynced, the manifest
 * last (it names the data files' sizes and BLAKE2b checksums, libsodium's
 * crypto_generichash, and carries its own); then that directory is renamed
 * to ckpt-SEQ in one step and the older generations removed. A restore
 * takes the newest ckpt-SEQ (or the single-generation layout of older
 * versions, files directly in dir), opens every file without following
 * links or blocking, and checks everything before it changes anything.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bufs.h"
#include "internal.h"
#include "plan.h"
#include "zeroclient.h"
#include "ckpt.h"

void manifest_free(struct manifest *m)
{
	free(m->files);
	free(m->group_momentum);
	free(m->group_amsgrad);
	free(m->segs);
}

/* The tensors of a segment's state, in file order, and their bits. */
const uint32_t tensor_bits[4] = {ZC_STATE_MOMENTUM_BUFFER, ZC_STATE_EXP_AVG, ZC_STATE_EXP_AVG_SQ,
				 ZC_STATE_MAX_EXP_AVG_SQ};

float **seg_slot(struct zc_segment_state *s, unsigned k)
{
	float **slots[4] = {&s->momentum_buffer, &s->exp_avg, &s->exp_avg_sq, &s->max_exp_avg_sq};
	return slots[k];
}

unsigned ckpt_ntensors(uint32_t present)
{
	unsigned n = 0;

	for (unsigned k = 0; k < 4; k++)
		n += !!(present & tensor_bits[k]);
	return n;
}

void ckpt_hex(const unsigned char *h, char *out)
{
	for (int i = 0; i < CKPT_HASH_BYTES; i++)
		sprintf(out + 2 * i, "%02x", h[i]);
}

int ckpt_unhex(const char *s, unsigned char *out)
{
	for (int i = 0; i < CKPT_HASH_BYTES; i++) {
		unsigned v;
		if (sscanf(s + 2 * i, "%2x", &v) != 1)
			return -1;
		out[i] = (unsigned char)v;
	}
	return s[2 * CKPT_HASH_BYTES] == '\0' || s[2 * CKPT_HASH_BYTES] == '\n' ? 0 : -1;
}

/* The plan's segments in plan order (bucket, then segment). */
uint32_t ckpt_plan_nsegs(const struct plan *p)
{
	uint32_t n = 0;

	for (uint32_t b = 0; b < p->nbuckets; b++)
		n += p->buckets[b].nsegments;
	return n;
}

const struct zc_segment *ckpt_plan_seg(const struct plan *p, uint32_t k, uint32_t *ret_b,
				       uint32_t *ret_s)
{
	*ret_b = *ret_s = 0;
	for (uint32_t b = 0; b < p->nbuckets; b++) {
		if (k < p->buckets[b].nsegments) {
			*ret_b = b;
			*ret_s = k;
			return &p->buckets[b].segments[k];
		}
		k -= p->buckets[b].nsegments;
	}
	return NULL;
}

/* ----------------------------------------------------------------- API --- */

int zc_checkpoint_wait(zc_client *c, int timeout_ms)
{
	struct ckpt_writer **slot, *w;
	int r;

	if ((r = client_ckpt_writer(c, __func__, &slot)) < 0)
		return r;
	if (!(w = *slot))
		return 0;
	r = w->reading ? ckpt_reader_wait(w, timeout_ms, __func__)
		       : writer_join(w, timeout_ms, __func__);
	client_ckpt_report(c);
	return r;
}

/* One node: zerod copies its state into rank 0's kept stage while rank 0
 * copies its parameters beside it (client_ckpt_export); the image points
 * into the stage, which the writer writes from. The other ranks take part
 * and get nothing. */
static int export_staged(zc_client *c, const struct ckpt_view *v, struct ckpt_writer *w,
			 struct image *ret, const char *fn)
{
	const struct plan *p = v->plan;
	struct image im = {0};
	int r;

	if (v->rank == 0 && (r = ckpt_stage_get(&w->stage, p)) < 0)
		return client_err_set(r, "%s: the checkpoint's staging (%" PRIu64 " bytes): %s", fn,
				      (uint64_t)5 * p->state_numel * sizeof(float), strerror(-r));
	if ((r = image_alloc(p, &im, false, NULL)) < 0)
		return client_err_set(r, "%s: %s", fn, strerror(-r));
	free(im.arena);
	im.arena = NULL;
	r = client_ckpt_export(c, v->rank == 0 ? &w->stage : NULL, im.ss, im.nsegs, NULL, fn);
	if (r < 0) {
		image_free(&im);
		return r;
	}
	for (uint32_t k = 0; k < im.nsegs && v->rank == 0; k++) {
		const struct zc_segment_state *s = &im.ss[k];
		im.params[k] = w->stage.base + p->buckets[s->bucket].sbase +
			       p->buckets[s->bucket].segments[s->segment].offset;
	}
	*ret = im;
	return 0;
}

/* Several nodes (or bf16/fp16 buckets): an export round of every segment,
 * rank 0 copying it out into its kept arena, and its parameters beside. */
static int export_copied(zc_client *c, const struct ckpt_view *v, struct ckpt_writer *w,
			 struct image *ret, const char *fn)
{
	struct image im = {0};
	int r;

	if (v->rank == 0 && w->arena_floats != ckpt_arena_floats(v->plan)) {
		free(w->arena);
		w->arena_floats = 0;
		if (!(w->arena = malloc(ckpt_arena_floats(v->plan) * sizeof(float))))
			return client_err_set(-ENOMEM, "%s: out of memory", fn);
		w->arena_floats = ckpt_arena_floats(v->plan);
	}
	if ((r = image_alloc(v->plan, &im, v->rank == 0, v->rank == 0 ? w->arena : NULL)) < 0)
		return client_err_set(r, "%s: %s", fn, strerror(-r));
	r = zc_get_state(c, im.ss, im.nsegs);
	if (r < 0) {
		if (v->rank == 0)
			im.arena = NULL; /* w->arena */
		image_free(&im);
		return r;
	}
	for (uint32_t k = 0; k < im.nsegs && v->rank == 0; k++) {
		uint32_t b, s;
		const struct zc_segment *seg = ckpt_plan_seg(v->plan, k, &b, &s);
		memcpy(im.params[k], zc_param_buffer(c, b) + seg->offset,
		       seg->numel * sizeof(float));
	}
	if (v->rank == 0)
		im.arena = NULL; /* w->arena: image_free() leaves it */
	*ret = im;
	return 0;
}

/* The records of this node's file from the ranges zerod filled: each
 * within one segment (a piece never crosses one). */
static int node_records(const struct plan *p, const struct ckpt_owned *o, struct crec **ret,
			const char *fn)
{
	struct crec *rc = calloc(o->count ? o->count : 1, sizeof(*rc));
	uint32_t first = 0, b = 0;

	if (!rc)
		return client_err_set(-ENOMEM, "%s: out of memory", fn);
	for (size_t i = 0; i < o->count; i++) {
		const struct plan_bucket *bk;
		uint64_t off;
		uint32_t sg = 0;

		for (; b < o->bucket[i]; b++)
			first += p->buckets[b].nsegments;
		bk = &p->buckets[b];
		off = o->slot[i] - bk->sbase;
		while (sg + 1 < bk->nsegments && bk->segments[sg + 1].offset <= off)
			sg++;
		if (off < bk->segments[sg].offset ||
		    off + o->n[i] > bk->segments[sg].offset + bk->segments[sg].numel) {
			free(rc);
			return client_err_set(ZC_EPROTO, "%s: zerod named a range across segments",
					      fn);
		}
		rc[i] = (struct crec){.seg = first + sg,
				      .present = o->present[i],
				      .off = off - bk->segments[sg].offset,
				      .n = o->n[i],
				      .slot = o->slot[i],
				      .step = o->step[i]};
	}
	*ret = rc;
	return 0;
}

/* Several nodes: every node's local rank 0 gets its node's pieces in its
 * stage (its parameters beside), and its writer thread writes the node's
 * file; rank 0's also writes the manifest, last. */
static int checkpoint_nodes(zc_client *c, const struct ckpt_view *v, struct ckpt_writer *w,
			    const char *fn)
{
	const struct plan *p = v->plan;
	bool stager = v->local_rank == 0;
	struct ckpt_owned own = {0};
	struct mtext mt = {0};
	struct crec *recs = NULL;
	int r;

	if (stager && (r = ckpt_stage_get(&w->stage, p)) < 0)
		return client_err_set(r, "%s: the checkpoint's staging (%" PRIu64 " bytes): %s", fn,
				      (uint64_t)5 * p->state_numel * sizeof(float), strerror(-r));
	r = client_ckpt_export(c, stager ? &w->stage : NULL, NULL, 0, stager ? &own : NULL, fn);
	if (r < 0)
		return r;
	if (stager && (r = node_records(p, &own, &recs, fn)) < 0)
		goto fail;
	if (v->rank == 0 &&
	    (r = manifest_head_v(&mt, v, NULL, stager ? own.nnodes : v->nnodes)) < 0) {
		r = client_err_set(ZC_ECKPT, "%s: the manifest: %s", fn, strerror(-r));
		goto fail;
	}
	if (!(w->dir = strdup(v->dir))) {
		r = client_err_set(-ENOMEM, "%s: out of memory", fn);
		goto fail;
	}
	w->iteration = v->iteration;
	w->timeout_ms = v->timeout_ms;
	if (!stager && v->rank != 0) {
		w->reading = true;
		ckpt_owned_free(&own);
		return 0;
	}
	w->v2 = true;
	w->node_file = stager;
	w->manifest = v->rank == 0;
	w->node = own.node;
	w->run = stager ? own.run : 0;
	w->nnodes = stager ? own.nnodes : v->nnodes;
	w->state_numel = p->state_numel;
	w->recs = recs;
	w->nrecs = stager ? own.count : 0;
	w->mt = mt;
	w->result = 0;
	w->doing = "";
	w->finished = false;
	w->writing = true;
	ckpt_owned_free(&own);
	if ((r = pthread_create(&w->th, NULL, writer_nodes_main, w)) != 0) {
		w->writing = false;
		w->recs = NULL;
		w->mt = (struct mtext){0};
		free(w->dir);
		w->dir = NULL;
		r = client_err_set(ZC_ECKPT, "%s: no writer thread: %s", fn, strerror(r));
		goto fail;
	}
	return 0;
fail:
	ckpt_owned_free(&own);
	free(recs);
	free(mt.buf);
	return r;
}

static int checkpoint_start(zc_client *c, const char *dir, struct ckpt_view *ret_v)
{
	static const char fn[] = "zc_checkpoint";
	struct ckpt_view v;
	struct ckpt_writer *w;
	struct image im = {0};
	struct mtext mt = {0};
	int r;

	if ((r = client_ckpt_view(c, fn, &v)) < 0)
		return r;
	*ret_v = v;
	if (!dir || !*dir)
		return client_err_set(-EINVAL, "%s: no directory", fn);
	if (sodium_init() < 0)
		return client_err_set(-ENOMEM, "%s: libsodium does not start", fn);
	if (!(w = writer_get(v.writer)))
		return client_err_set(-ENOMEM, "%s: out of memory", fn);
	/* One write at a time: the last one's ends first (its result, if
	 * nobody waited for it, goes; its outcome goes to zerod). On the other
	 * ranks the export round below cannot start before rank 0 is in it,
	 * that is after. */
	(void)writer_join(w, -1, fn);
	client_ckpt_report(c);
	w->gen[0] = '\0';
	w->reading = false;
	free(w->dir);
	w->dir = NULL;
	w->v2 = false;
	if (!v.one_node && !v.plan->low_precision && !getenv("ZEROD_CKPT_V1")) {
		v.dir = dir;
		return checkpoint_nodes(c, &v, w, fn);
	}
	if (v.one_node && !v.plan->low_precision)
		r = export_staged(c, &v, w, &im, fn);
	else
		r = export_copied(c, &v, w, &im, fn);
	if (r < 0)
		return r;
	if (!(w->dir = strdup(dir))) {
		r = client_err_set(-ENOMEM, "%s: out of memory", fn);
		goto fail;
	}
	w->iteration = v.iteration;
	w->timeout_ms = v.timeout_ms;
	if (v.rank != 0) {
		image_free(&im);
		w->reading = true;
		return 0;
	}
	if ((r = manifest_head(&mt, &v, &im)) < 0) {
		r = client_err_set(ZC_ECKPT, "%s: the manifest: %s", fn, strerror(-r));
		goto fail;
	}
	/* the staging copy is the writer's now */
	w->im = im;
	w->mt = mt;
	w->result = 0;
	w->doing = "";
	w->finished = false;
	w->writing = true;
	if ((r = pthread_create(&w->th, NULL, writer_main, w)) != 0) {
		w->writing = false;
		im = w->im;
		mt = w->mt;
		w->im = (struct image){0};
		w->mt = (struct mtext){0};
		r = client_err_set(ZC_ECKPT, "%s: no writer thread: %s", fn, strerror(r));
		goto fail;
	}
	return 0;
fail:
	free(w->dir);
	w->dir = NULL;
	free(mt.buf);
	image_free(&im); /* its arena is never w->arena (export_copied) */
	return r;
}

int zc_checkpoint(zc_client *c, const char *dir)
{
	struct ckpt_view v = {0};
	int r = checkpoint_start(c, dir, &v);

	/* a checkpoint that failed before its write began: the rank that
	 * would have written it says so to zerod too (the others' calls fail
	 * alike) */
	if (r < 0 && v.plan && (v.rank == 0 || v.local_rank == 0) && r != ZC_ECONNECT) {
		struct ckpt_report rp = {.iteration = v.iteration, .ok = false};
		snprintf(rp.dir, sizeof(rp.dir), "%s", dir ? dir : "");
		snprintf(rp.error, sizeof(rp.error), "%s: %s", zc_strerror_name(r),
			 zc_error_message());
		client_ckpt_report_now(c, &rp);
	}
	return r;
}
