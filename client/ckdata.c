/*
 * ckdata.c — what a checkpoint writes: files made durable under a temporary
 * name and renamed into place (afile), the image of the job's parameters and
 * state, version 1's data file, and the manifest's text (its head from the
 * plan, its file and checksum lines once the data is durable).
 *
 * Runs on the caller's thread (the image, the manifest's head) and on the
 * writer thread (ckwriter.c: the files).
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

/* ------------------------------------------------------------ writing --- */

static int write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len) {
		ssize_t w = write(fd, p, len);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return -errno;
		p += w;
		len -= (size_t)w;
	}
	return 0;
}

/* mkdir -p dir: 0 or -errno. */
int ckpt_mkdirs(const char *dir)
{
	char path[PATH_MAX];
	size_t n = strlen(dir);

	if (n >= sizeof(path))
		return -ENAMETOOLONG;
	memcpy(path, dir, n + 1);
	for (char *p = path + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (mkdir(path, 0755) < 0 && errno != EEXIST)
			return -errno;
		*p = '/';
	}
	return mkdir(path, 0755) < 0 && errno != EEXIST ? -errno : 0;
}

int afile_open(struct afile *f, int dirfd, const char *name)
{
	f->dirfd = dirfd;
	f->name = name;
	snprintf(f->tmp, sizeof(f->tmp), ".%s.tmp.%ld", name, (long)getpid());
	/* a name left by a write a kill cut short is made anew, never followed */
	(void)unlinkat(dirfd, f->tmp, 0);
	f->fd = openat(dirfd, f->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
	if (f->fd < 0)
		return -errno;
	crypto_generichash_init(&f->h, NULL, 0, CKPT_HASH_BYTES);
	return 0;
}

int afile_write(struct afile *f, const void *buf, size_t len)
{
	crypto_generichash_update(&f->h, buf, len);
	return write_all(f->fd, buf, len);
}

/* fsync, rename over name, fsync the directory. The checksum of what was
 * written goes to ret_hash. On failure the temporary file is removed. */
int afile_commit(struct afile *f, unsigned char *ret_hash)
{
	int r = 0;

	crypto_generichash_final(&f->h, ret_hash, CKPT_HASH_BYTES);
	if (fsync(f->fd) < 0)
		r = -errno;
	if (close(f->fd) < 0 && r == 0)
		r = -errno;
	f->fd = -1;
	if (r == 0 && renameat(f->dirfd, f->tmp, f->dirfd, f->name) < 0)
		r = -errno;
	if (r == 0 && fsync(f->dirfd) < 0)
		r = -errno;
	if (r < 0)
		unlinkat(f->dirfd, f->tmp, 0);
	return r;
}

void afile_abort(struct afile *f)
{
	if (f->fd >= 0) {
		close(f->fd);
		unlinkat(f->dirfd, f->tmp, 0);
	}
	f->fd = -1;
}

void image_free(struct image *im)
{
	free(im->ss);
	free(im->params);
	free(im->numel);
	free(im->arena);
}

/* The floats image_alloc() puts in its arena for plan p. */
uint64_t ckpt_arena_floats(const struct plan *p)
{
	return 5 * p->total_numel + 1;
}

/* Room for every segment's parameters and 4 state tensors, and the
 * zc_segment_state list naming them, for plan p; without tensors only the
 * list, its pointers NULL (an export that copies nothing out). arena: the
 * room to use (ckpt_arena_floats(p) floats, then the caller's), NULL: new. */
int image_alloc(const struct plan *p, struct image *im, bool tensors, float *arena)
{
	uint64_t at = 0;

	im->nsegs = ckpt_plan_nsegs(p);
	im->ss = calloc(im->nsegs ? im->nsegs : 1, sizeof(*im->ss));
	im->params = calloc(im->nsegs ? im->nsegs : 1, sizeof(*im->params));
	im->numel = calloc(im->nsegs ? im->nsegs : 1, sizeof(*im->numel));
	im->arena = arena ? arena : malloc((tensors ? ckpt_arena_floats(p) : 1) * sizeof(float));
	if (!im->ss || !im->params || !im->numel || !im->arena) {
		if (arena)
			im->arena = NULL; /* the caller's */
		image_free(im);
		return -ENOMEM;
	}
	for (uint32_t k = 0; k < im->nsegs; k++) {
		uint32_t b, s;
		const struct zc_segment *seg = ckpt_plan_seg(p, k, &b, &s);
		im->ss[k] = (struct zc_segment_state)ZC_SEGMENT_STATE_INIT;
		im->ss[k].bucket = b;
		im->ss[k].segment = s;
		im->numel[k] = seg->numel;
		if (!tensors)
			continue;
		im->params[k] = im->arena + at;
		at += seg->numel;
		for (unsigned t = 0; t < 4; t++) {
			*seg_slot(&im->ss[k], t) = im->arena + at;
			at += seg->numel;
		}
	}
	return 0;
}

int ckpt_write_data(int dirfd, const struct image *im, uint64_t iteration, uint64_t *ret_bytes,
		    unsigned char *ret_hash)
{
	struct afile f;
	unsigned char head[CKPT_HEADER] = {0};
	uint32_t version = CKPT_VERSION;
	uint64_t bytes = CKPT_HEADER;
	int r;

	if ((r = afile_open(&f, dirfd, CKPT_DATA)) < 0)
		return r;
	memcpy(head, CKPT_MAGIC, 8);
	memcpy(head + 8, &version, 4);
	memcpy(head + 16, &iteration, 8);
	r = afile_write(&f, head, sizeof(head));
	for (uint32_t k = 0; k < im->nsegs && r >= 0; k++) {
		uint64_t n = im->numel[k];
		struct zc_segment_state ss = im->ss[k];
		r = afile_write(&f, im->params[k], n * sizeof(float));
		bytes += n * sizeof(float);
		for (unsigned t = 0; t < 4 && r >= 0; t++) {
			if (!(ss.present & tensor_bits[t]))
				continue;
			r = afile_write(&f, *seg_slot(&ss, t), n * sizeof(float));
			bytes += n * sizeof(float);
		}
	}
	if (r < 0) {
		afile_abort(&f);
		return r;
	}
	*ret_bytes = bytes;
	return afile_commit(&f, ret_hash);
}

/* Append a line: 0, or -EOVERFLOW (the text stops growing, len stays
 * within cap). */
int ckpt_mput(struct mtext *t, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (t->len >= t->cap)
		return -EOVERFLOW;
	va_start(ap, fmt);
	n = vsnprintf(t->buf + t->len, t->cap - t->len, fmt, ap);
	va_end(ap);
	t->len = n < 0 || (size_t)n >= t->cap - t->len ? t->cap : t->len + (size_t)n;
	return t->len >= t->cap ? -EOVERFLOW : 0;
}

/* Every manifest line before the file line; the file and checksum lines
 * need room for another 256 bytes, kept free. */
int manifest_head(struct mtext *t, const struct ckpt_view *v, const struct image *im)
{
	return manifest_head_v(t, v, im, 0);
}

/* im NULL: version 2's head for `nodes` node files (their file lines need
 * room too: 160 bytes each, kept free). */
int manifest_head_v(struct mtext *t, const struct ckpt_view *v, const struct image *im,
		    uint32_t nodes)
{
	const struct plan *p = v->plan;
	uint32_t nsegs = im ? im->nsegs : ckpt_plan_nsegs(p);

	t->cap = 4096 + (size_t)p->ngroups * 64 + (size_t)nsegs * 160 + (size_t)nodes * 160;
	t->len = 0;
	t->buf = malloc(t->cap);
	if (!t->buf)
		return -ENOMEM;
	t->cap -= 256 + (size_t)nodes * 160; /* a segment's line is under 160 bytes */
	ckpt_mput(t, "zerod-checkpoint %d\n", im ? CKPT_VERSION : CKPT_VERSION_NODES);
	ckpt_mput(t, "iteration %" PRIu64 "\n", v->iteration);
	ckpt_mput(t, "job %s\n", v->job_id);
	ckpt_mput(t, "world %u\nnodes %u\n", v->world, im ? v->nnodes : nodes);
	ckpt_mput(t, "optimizer %s\nshard_mode %s\nstep_mode %s\n",
		  plan_optimizer_name(p->optimizer), plan_shard_name(p->shard_mode),
		  plan_step_name(p->step_mode));
	ckpt_mput(t, "plan_hash %016" PRIx64 "\n", p->hash);
	ckpt_mput(t, "groups %u\n", p->ngroups);
	for (uint32_t g = 0; g < p->ngroups; g++)
		ckpt_mput(t, "group %u momentum %d amsgrad %d\n", g, p->groups[g].momentum != 0,
			  p->groups[g].amsgrad ? 1 : 0);
	ckpt_mput(t, "segments %u\n", nsegs);
	for (uint32_t k = 0; k < nsegs; k++) {
		uint32_t b, s;
		const struct zc_segment *seg = ckpt_plan_seg(p, k, &b, &s);
		if (!im) {
			ckpt_mput(t, "segment %u param_id %" PRIu64 " numel %" PRIu64 " group %u\n",
				  k, seg->param_id, seg->numel, seg->group);
			continue;
		}
		ckpt_mput(t,
			  "segment %u param_id %" PRIu64 " numel %" PRIu64
			  " group %u present %u step "
			  "%.0f\n",
			  k, seg->param_id, seg->numel, seg->group, im->ss[k].present,
			  im->ss[k].step);
	}
	if (t->len >= t->cap)
		return -EOVERFLOW;
	t->cap += 256 + (size_t)nodes * 160;
	return 0;
}

/* t's checksum line, and t written as the manifest (both versions). */
int manifest_commit(int dirfd, struct mtext *t)
{
	char hx[2 * CKPT_HASH_BYTES + 1];
	unsigned char h[CKPT_HASH_BYTES];
	struct afile f;
	int r;

	crypto_generichash(h, sizeof(h), (const unsigned char *)t->buf, t->len, NULL, 0);
	ckpt_hex(h, hx);
	if ((r = ckpt_mput(t, "checksum %s\n", hx)) < 0)
		return r;
	if ((r = afile_open(&f, dirfd, CKPT_MANIFEST)) < 0)
		return r;
	if ((r = afile_write(&f, t->buf, t->len)) < 0) {
		afile_abort(&f);
		return r;
	}
	return afile_commit(&f, h);
}

/* The file and checksum lines after t's head, and the manifest written. */
int ckpt_write_manifest(int dirfd, struct mtext *t, uint64_t data_bytes,
			const unsigned char *data_hash)
{
	char hx[2 * CKPT_HASH_BYTES + 1];

	ckpt_hex(data_hash, hx);
	ckpt_mput(t, "file %s %" PRIu64 " %s\n", CKPT_DATA, data_bytes, hx);
	return manifest_commit(dirfd, t);
}
