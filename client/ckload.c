/*
 * ckload.c — zc_restore(): a checkpoint's data read back (version 1's
 * state.zck, version 2's node files and their coverage of every segment),
 * checked whole before anything changes, then set into the job through
 * zc_set_state's round.
 *
 * Runs on the caller's thread.
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

/* Version 1: state.zck, every segment's parameters and state, into im
 * (the plan's segment k gets the checkpoint's map[k]). */
static int load_v1(int dirfd, const char *dir, const struct manifest *m, const uint32_t *map,
		   struct image *im, const char *fn)
{
	unsigned char h[CKPT_HASH_BYTES];
	uint64_t want = CKPT_HEADER, at = CKPT_HEADER, it;
	uint32_t version;
	char *data = NULL;
	size_t len = 0;
	int r;

	for (uint32_t k = 0; k < m->nsegs; k++)
		want += (1 + ckpt_ntensors(m->segs[k].present)) * m->segs[k].numel * sizeof(float);
	if (want != m->data_bytes) {
		r = client_err_set(ZC_ECKPT,
				   "%s: the manifest names %" PRIu64 " bytes of %s, its segments "
				   "%" PRIu64,
				   fn, m->data_bytes, CKPT_DATA, want);
		goto out;
	}
	mode_t mode = 0;

	r = ckpt_read_file(dirfd, CKPT_DATA, want, &data, &len, &mode);
	if (r < 0) {
		r = client_err_set(ZC_ECKPT, "%s: %s/%s: %s%s", fn, dir, CKPT_DATA,
				   ckpt_read_why(r, mode),
				   r == -EFBIG ? " (longer than the manifest says)" : "");
		goto out;
	}
	if (len != want) {
		r = client_err_set(
			ZC_ECKPT, "%s: %s/%s: %zu bytes, the manifest says %" PRIu64 " (truncated)",
			fn, dir, CKPT_DATA, len, want);
		goto out;
	}
	crypto_generichash(h, sizeof(h), (const unsigned char *)data, len, NULL, 0);
	if (sodium_memcmp(h, m->data_hash, sizeof(h)) != 0) {
		r = client_err_set(ZC_ECKPT, "%s: %s/%s: checksum mismatch (corrupt)", fn, dir,
				   CKPT_DATA);
		goto out;
	}
	memcpy(&version, data + 8, 4);
	memcpy(&it, data + 16, 8);
	if (memcmp(data, CKPT_MAGIC, 8) != 0 || version != CKPT_VERSION || it != m->iteration) {
		r = client_err_set(ZC_ECKPT, "%s: %s/%s: not the manifest's data (header)", fn, dir,
				   CKPT_DATA);
		goto out;
	}
	/* checkpoint segment i's data → the plan's segment k with map[k] == i */
	for (uint32_t i = 0; i < m->nsegs; i++) {
		uint32_t k = 0;
		while (map[k] != i)
			k++;
		uint64_t nb = m->segs[i].numel * sizeof(float);
		memcpy(im->params[k], data + at, nb);
		at += nb;
		im->ss[k].present = m->segs[i].present;
		im->ss[k].step = m->segs[i].step;
		for (unsigned t = 0; t < 4; t++) {
			if (!(m->segs[i].present & tensor_bits[t]))
				continue;
			memcpy(*seg_slot(&im->ss[k], t), data + at, nb);
			at += nb;
		}
	}
	r = 0;
out:
	free(data);
	return r;
}

/* A record's place, for the coverage check. */
struct cover {
	uint32_t seg;
	uint64_t off, n;
};

static int cover_cmp(const void *a, const void *b)
{
	const struct cover *x = a, *y = b;

	if (x->seg != y->seg)
		return x->seg < y->seg ? -1 : 1;
	return x->off < y->off ? -1 : x->off > y->off;
}

/* Node file `node` (name) read whole and checked against the manifest
 * (size, checksum, header): 0 with it in *ret_data (the caller frees it),
 * its length and its count of records, or the error recorded. */
static int node_file_read(int dirfd, const char *dir, const struct manifest *m, uint32_t node,
			  const char *name, char **ret_data, size_t *ret_len, uint64_t *ret_nrecs,
			  const char *fn)
{
	const struct cfile *cf = &m->files[node];
	unsigned char h[CKPT_HASH_BYTES];
	char *data = NULL;
	size_t len = 0;
	uint64_t it, nrecs;
	uint32_t version, nd;
	mode_t mode = 0;
	int r;

	r = ckpt_read_file(dirfd, name, cf->bytes, &data, &len, &mode);
	if (r < 0)
		return client_err_set(ZC_ECKPT, "%s: %s/%s: %s%s", fn, dir, name,
				      ckpt_read_why(r, mode),
				      r == -EFBIG    ? " (longer than the manifest says)"
				      : r == -ENOENT ? " (the manifest lists it: missing)"
						     : "");
	if (len != cf->bytes) {
		r = client_err_set(
			ZC_ECKPT, "%s: %s/%s: %zu bytes, the manifest says %" PRIu64 " (truncated)",
			fn, dir, name, len, cf->bytes);
		goto fail;
	}
	crypto_generichash(h, sizeof(h), (const unsigned char *)data, len, NULL, 0);
	if (sodium_memcmp(h, cf->hash, sizeof(h)) != 0) {
		r = client_err_set(ZC_ECKPT, "%s: %s/%s: checksum mismatch (corrupt)", fn, dir,
				   name);
		goto fail;
	}
	if (len < CKPT_NODE_HEADER) {
		r = client_err_set(ZC_ECKPT, "%s: %s/%s: no header", fn, dir, name);
		goto fail;
	}
	memcpy(&version, data + 8, 4);
	memcpy(&nd, data + 12, 4);
	memcpy(&it, data + 16, 8);
	memcpy(&nrecs, data + 24, 8);
	if (memcmp(data, CKPT_NODE_MAGIC, 8) != 0 || version != CKPT_VERSION_NODES ||
	    nd != node || it != m->iteration) {
		r = client_err_set(ZC_ECKPT, "%s: %s/%s: not the manifest's node file (header)", fn,
				   dir, name);
		goto fail;
	}
	*ret_data = data;
	*ret_len = len;
	*ret_nrecs = nrecs;
	return 0;
fail:
	free(data);
	return r;
}

/* Append a record's place to cv (*ncv of *cvcap): 0 or -ENOMEM. */
static int cover_add(struct cover **cv, size_t *ncv, size_t *cvcap, uint32_t seg, uint64_t off,
		     uint64_t n)
{
	if (*ncv == *cvcap) {
		size_t cap = *cvcap ? 2 * *cvcap : 256;
		struct cover *x = realloc(*cv, cap * sizeof(*x));
		if (!x)
			return -ENOMEM;
		*cv = x;
		*cvcap = cap;
	}
	(*cv)[(*ncv)++] = (struct cover){.seg = seg, .off = off, .n = n};
	return 0;
}

/* One node file, read and checked whole (size, checksum, header), its
 * records into im and cv (its places appended at *ncv). */
static int load_node(int dirfd, const char *dir, const struct manifest *m, uint32_t node,
		     const uint32_t *inv, struct image *im, bool *seen, struct cover **cv,
		     size_t *ncv, size_t *cvcap, const char *fn)
{
	char name[32], *data = NULL;
	size_t len = 0;
	uint64_t nrecs = 0, at = CKPT_NODE_HEADER;
	int r;

	snprintf(name, sizeof(name), "node-%u.zck", node);
	r = node_file_read(dirfd, dir, m, node, name, &data, &len, &nrecs, fn);
	if (r < 0)
		return r;
	for (uint64_t i = 0; i < nrecs; i++) {
		uint32_t seg, present;
		uint64_t off, n, step, nb;
		uint32_t k;
		float *dst;

		if (len - at < CKPT_RECORD) {
			r = client_err_set(ZC_ECKPT, "%s: %s/%s: record %" PRIu64 " is cut", fn,
					   dir, name, i);
			goto out;
		}
		memcpy(&seg, data + at, 4);
		memcpy(&present, data + at + 4, 4);
		memcpy(&off, data + at + 8, 8);
		memcpy(&n, data + at + 16, 8);
		memcpy(&step, data + at + 24, 8);
		at += CKPT_RECORD;
		if (seg >= m->nsegs || n == 0 || off > m->segs[seg].numel ||
		    n > m->segs[seg].numel - off ||
		    (present &
		     ~(uint32_t)(ZC_STATE_STEP | ZC_STATE_MOMENTUM_BUFFER | ZC_STATE_EXP_AVG |
				 ZC_STATE_EXP_AVG_SQ | ZC_STATE_MAX_EXP_AVG_SQ)) ||
		    (len - at) / sizeof(float) / (1 + ckpt_ntensors(present)) < n) {
			r = client_err_set(ZC_ECKPT,
					   "%s: %s/%s: record %" PRIu64 " is out of bounds", fn,
					   dir, name, i);
			goto out;
		}
		k = inv[seg];
		if (seen[seg] &&
		    (im->ss[k].present != present || im->ss[k].step != (double)step)) {
			r = client_err_set(
				ZC_ECKPT,
				"%s: %s/%s: segment %u's keys or step differ between its "
				"records",
				fn, dir, name, seg);
			goto out;
		}
		seen[seg] = true;
		im->ss[k].present = present;
		im->ss[k].step = (double)step;
		nb = n * sizeof(float);
		memcpy(im->params[k] + off, data + at, nb);
		at += nb;
		for (unsigned t = 0; t < 4; t++) {
			if (!(present & tensor_bits[t]))
				continue;
			dst = *seg_slot(&im->ss[k], t);
			memcpy(dst + off, data + at, nb);
			at += nb;
		}
		if (cover_add(cv, ncv, cvcap, seg, off, n) < 0) {
			r = client_err_set(-ENOMEM, "%s: out of memory", fn);
			goto out;
		}
	}
	if (at != len) {
		r = client_err_set(ZC_ECKPT, "%s: %s/%s: %zu bytes after its records", fn, dir,
				   name, len - (size_t)at);
		goto out;
	}
	r = 0;
out:
	free(data);
	return r;
}

/* Version 2: every node file the manifest lists, checked, into im; every
 * element of every segment given exactly once over the files. */
static int load_nodes(int dirfd, const char *dir, const struct manifest *m, const uint32_t *map,
		      struct image *im, const char *fn)
{
	uint32_t *inv = calloc(m->nsegs ? m->nsegs : 1, sizeof(*inv));
	bool *seen = calloc(m->nsegs ? m->nsegs : 1, sizeof(*seen));
	struct cover *cv = NULL;
	size_t ncv = 0, cvcap = 0, c = 0;
	int r = 0;

	if (!inv || !seen) {
		r = client_err_set(-ENOMEM, "%s: out of memory", fn);
		goto out;
	}
	for (uint32_t k = 0; k < m->nsegs; k++)
		inv[map[k]] = k;
	for (uint32_t nd = 0; nd < m->nfiles && r >= 0; nd++)
		r = load_node(dirfd, dir, m, nd, inv, im, seen, &cv, &ncv, &cvcap, fn);
	if (r < 0)
		goto out;
	qsort(cv, ncv, sizeof(*cv), cover_cmp);
	for (uint32_t i = 0; i < m->nsegs; i++) {
		uint64_t next = 0;
		for (; c < ncv && cv[c].seg == i; c++) {
			if (cv[c].off != next)
				break;
			next += cv[c].n;
		}
		if (next != m->segs[i].numel || (c < ncv && cv[c].seg == i)) {
			r = client_err_set(ZC_ECKPT,
					   "%s: %s: segment %u (param_id %" PRIu64
					   ") is %s by the node "
					   "files (%" PRIu64 " of %" PRIu64 " elements in order)",
					   fn, dir, i, m->segs[i].param_id,
					   c < ncv && cv[c].seg == i ? "given twice in part"
								     : "not given whole",
					   next, m->segs[i].numel);
			goto out;
		}
	}
out:
	free(inv);
	free(seen);
	free(cv);
	return r;
}

int zc_restore(zc_client *c, const char *dir)
{
	static const char fn[] = "zc_restore";
	struct ckpt_view v;
	struct image im = {0};
	struct manifest m = {0};
	uint32_t *map = NULL;
	char where[PATH_MAX];
	int r, dirfd = -1, gfd = -1;

	if ((r = client_ckpt_view(c, fn, &v)) < 0)
		return r;
	if (!dir || !*dir)
		return client_err_set(-EINVAL, "%s: no directory", fn);
	/* a checkpoint in flight is on disk first (rank 0 waits for its
	 * writer, the others for the manifest naming it); its result is the
	 * zc_checkpoint_wait()'s nobody called: what dir holds is checked below */
	if (*v.writer)
		(void)zc_checkpoint_wait(c, -1);
	if (v.plan->low_precision)
		return client_err_set(
			ZC_ENOTSUP, "%s: plans with bf16/fp16 buckets have no checkpoints yet", fn);
	if (sodium_init() < 0)
		return client_err_set(-ENOMEM, "%s: libsodium does not start", fn);
	if ((dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
		r = client_err_set(ZC_ECKPT, "%s: %s: %s", fn, dir, strerror(errno));
		goto out;
	}
	if ((r = gen_open_current(dirfd, dir, &gfd, where, sizeof(where), fn)) < 0)
		goto out;
	if ((r = ckpt_read_manifest(gfd, where, &m, fn)) < 0)
		goto out;
	map = calloc(m.nsegs ? m.nsegs : 1, sizeof(*map));
	if (!map) {
		r = client_err_set(-ENOMEM, "%s: out of memory", fn);
		goto out;
	}
	if ((r = ckpt_match(v.plan, &m, map, fn)) < 0)
		goto out;
	if ((r = image_alloc(v.plan, &im, true, NULL)) < 0) {
		r = client_err_set(r, "%s: %s", fn, strerror(-r));
		goto out;
	}
	r = m.version == CKPT_VERSION_NODES ? load_nodes(gfd, where, &m, map, &im, fn)
					    : load_v1(gfd, where, &m, map, &im, fn);
	if (r < 0)
		goto out;
	/*
	 * The parameters go in only once the import is accepted, so a refused
	 * one changes no parameter and nothing is put back. The import is one
	 * round of every local rank (docs/STATE.md): zerod answers each of
	 * them only once all are in, and refuses it for all of them alike.
	 * Writing first and putting back a saved copy on refusal was wrong
	 * with a shared parameter buffer (ZC_BUFFERS_SHARED_PARAMS): a rank
	 * could save what another rank had already written (the checkpoint's
	 * values), and put that back after the other had restored the
	 * originals. Written after, the ranks that share write the same
	 * checkpoint values into one buffer, and before the next step reads
	 * them: that step waits for every local rank's first bucket, which
	 * each sends after its copy. Nothing reads the parameters in between:
	 * the import of an fp32 plan (the only kind restored) touches only the
	 * state.
	 */
	r = zc_set_state(c, im.ss, im.nsegs);
	if (r >= 0)
		r = client_resume(c, m.iteration, fn);
	for (uint32_t k = 0; r >= 0 && k < im.nsegs; k++) {
		uint32_t b, s;
		const struct zc_segment *seg = ckpt_plan_seg(v.plan, k, &b, &s);
		memcpy(zc_param_buffer(c, b) + seg->offset, im.params[k],
		       seg->numel * sizeof(float));
	}
out:
	if (gfd >= 0)
		close(gfd);
	if (dirfd >= 0)
		close(dirfd);
	free(map);
	manifest_free(&m);
	image_free(&im);
	return r;
}
