/*
 * ckpt.c — checkpoints of a job's parameters and optimizer state on disk
 * (zc_checkpoint, zc_restore), the format docs/CHECKPOINT.md describes.
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

#define CKPT_VERSION      1
#define CKPT_MAGIC        "ZCKPTDAT"
#define CKPT_DATA         "state.zck"
#define CKPT_MANIFEST     "MANIFEST"
#define CKPT_HASH_BYTES   32
#define CKPT_MAX_MANIFEST (256u << 20)
#define CKPT_HEADER       24 /* magic, u32 version, u32 0, u64 iteration */
/* version 2 (several nodes): a data file per node, named by the manifest */
#define CKPT_VERSION_NODES 2
#define CKPT_NODE_MAGIC    "ZCKPTNOD"
#define CKPT_NODE_HEADER   32 /* magic, u32 version, u32 node, u64 iteration, u64 records */
#define CKPT_RECORD        32 /* u32 segment, u32 present, u64 offset, u64 numel, u64 step */
#define CKPT_MAX_NODES     4096
/* generations (docs/CHECKPOINT.md, "Generations") */
#define CKPT_GEN_PREFIX "ckpt-" /* a complete one: ckpt-SEQ, SEQ counting up */
#define CKPT_TMP_PREFIX ".tmp-" /* one being written: .tmp-ITERATION-RUN */
#define CKPT_GEN_NAME   48

/* One segment as the checkpoint holds it. */
struct cseg {
	uint64_t param_id, numel;
	uint32_t group, present;
	double step;
};

/* A node's data file as a version 2 manifest lists it. */
struct cfile {
	uint64_t bytes;
	unsigned char hash[CKPT_HASH_BYTES];
};

/* What a manifest says. */
struct manifest {
	uint64_t iteration, plan_hash, data_bytes;
	uint32_t version, world, nodes, ngroups, nsegs;
	uint32_t nfiles;     /* version 2: node-0.zck .. node-(nfiles-1).zck */
	struct cfile *files; /* [nodes] */
	char job[ZEROD_JOB_ID_MAX + 1], optimizer[32], shard[32], step_mode[32];
	uint8_t *group_momentum, *group_amsgrad; /* [ngroups] */
	struct cseg *segs;                       /* [nsegs] */
	unsigned char data_hash[CKPT_HASH_BYTES];
};

static void manifest_free(struct manifest *m)
{
	free(m->files);
	free(m->group_momentum);
	free(m->group_amsgrad);
	free(m->segs);
}

/* The tensors of a segment's state, in file order, and their bits. */
static const uint32_t tensor_bits[4] = {ZC_STATE_MOMENTUM_BUFFER, ZC_STATE_EXP_AVG,
					ZC_STATE_EXP_AVG_SQ, ZC_STATE_MAX_EXP_AVG_SQ};

static float **seg_slot(struct zc_segment_state *s, unsigned k)
{
	float **slots[4] = {&s->momentum_buffer, &s->exp_avg, &s->exp_avg_sq, &s->max_exp_avg_sq};
	return slots[k];
}

static unsigned ntensors(uint32_t present)
{
	unsigned n = 0;

	for (unsigned k = 0; k < 4; k++)
		n += !!(present & tensor_bits[k]);
	return n;
}

static void hex(const unsigned char *h, char *out)
{
	for (int i = 0; i < CKPT_HASH_BYTES; i++)
		sprintf(out + 2 * i, "%02x", h[i]);
}

static int unhex(const char *s, unsigned char *out)
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
static uint32_t plan_nsegs(const struct plan *p)
{
	uint32_t n = 0;

	for (uint32_t b = 0; b < p->nbuckets; b++)
		n += p->buckets[b].nsegments;
	return n;
}

static const struct zc_segment *plan_seg(const struct plan *p, uint32_t k, uint32_t *ret_b,
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
static int mkdirs(const char *dir)
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

/* An open file under a temporary name in dirfd, renamed to name by
 * atomic_commit(). */
struct afile {
	int dirfd, fd;
	const char *name;
	char tmp[64];
	crypto_generichash_state h;
};

static int afile_open(struct afile *f, int dirfd, const char *name)
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

static int afile_write(struct afile *f, const void *buf, size_t len)
{
	crypto_generichash_update(&f->h, buf, len);
	return write_all(f->fd, buf, len);
}

/* fsync, rename over name, fsync the directory. The checksum of what was
 * written goes to ret_hash. On failure the temporary file is removed. */
static int afile_commit(struct afile *f, unsigned char *ret_hash)
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

static void afile_abort(struct afile *f)
{
	if (f->fd >= 0) {
		close(f->fd);
		unlinkat(f->dirfd, f->tmp, 0);
	}
	f->fd = -1;
}

/* One record of a node file (version 2): a range of one segment this node
 * owns, at slot in the staging's state layout. */
struct crec {
	uint32_t seg, present; /* segment in plan order, its ZC_STATE_* keys */
	uint64_t off, n, slot; /* offset within the segment, numel */
	double step;
};

/* The whole job's parameters and state, by segment in plan order. */
struct image {
	uint32_t nsegs;
	struct zc_segment_state *ss; /* [nsegs], tensors into arena */
	float **params;              /* [nsegs]: into arena */
	uint64_t *numel;             /* [nsegs] */
	float *arena;
};

static void image_free(struct image *im)
{
	free(im->ss);
	free(im->params);
	free(im->numel);
	free(im->arena);
}

/* The floats image_alloc() puts in its arena for plan p. */
static uint64_t arena_floats(const struct plan *p)
{
	return 5 * p->total_numel + 1;
}

/* Room for every segment's parameters and 4 state tensors, and the
 * zc_segment_state list naming them, for plan p; without tensors only the
 * list, its pointers NULL (an export that copies nothing out). arena: the
 * room to use (arena_floats(p) floats, then the caller's), NULL: new. */
static int image_alloc(const struct plan *p, struct image *im, bool tensors, float *arena)
{
	uint64_t at = 0;

	im->nsegs = plan_nsegs(p);
	im->ss = calloc(im->nsegs ? im->nsegs : 1, sizeof(*im->ss));
	im->params = calloc(im->nsegs ? im->nsegs : 1, sizeof(*im->params));
	im->numel = calloc(im->nsegs ? im->nsegs : 1, sizeof(*im->numel));
	im->arena = arena ? arena : malloc((tensors ? arena_floats(p) : 1) * sizeof(float));
	if (!im->ss || !im->params || !im->numel || !im->arena) {
		if (arena)
			im->arena = NULL; /* the caller's */
		image_free(im);
		return -ENOMEM;
	}
	for (uint32_t k = 0; k < im->nsegs; k++) {
		uint32_t b, s;
		const struct zc_segment *seg = plan_seg(p, k, &b, &s);
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

static int write_data(int dirfd, const struct image *im, uint64_t iteration, uint64_t *ret_bytes,
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

/* A manifest's text being built: every line up to the file line is made
 * from the plan on the caller's thread (manifest_head), the file and
 * checksum lines by the writer once the data file is durable
 * (write_manifest). */
struct mtext {
	char *buf;
	size_t len, cap;
};

/* Append a line: 0, or -EOVERFLOW (the text stops growing, len stays
 * within cap). */
static int __attribute__((format(printf, 2, 3))) mput(struct mtext *t, const char *fmt, ...)
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
static int manifest_head_v(struct mtext *t, const struct ckpt_view *v, const struct image *im,
			   uint32_t nodes);

static int manifest_head(struct mtext *t, const struct ckpt_view *v, const struct image *im)
{
	return manifest_head_v(t, v, im, 0);
}

/* im NULL: version 2's head for `nodes` node files (their file lines need
 * room too: 160 bytes each, kept free). */
static int manifest_head_v(struct mtext *t, const struct ckpt_view *v, const struct image *im,
			   uint32_t nodes)
{
	const struct plan *p = v->plan;
	uint32_t nsegs = im ? im->nsegs : plan_nsegs(p);

	t->cap = 4096 + (size_t)p->ngroups * 64 + (size_t)nsegs * 160 + (size_t)nodes * 160;
	t->len = 0;
	t->buf = malloc(t->cap);
	if (!t->buf)
		return -ENOMEM;
	t->cap -= 256 + (size_t)nodes * 160; /* a segment's line is under 160 bytes */
	mput(t, "zerod-checkpoint %d\n", im ? CKPT_VERSION : CKPT_VERSION_NODES);
	mput(t, "iteration %" PRIu64 "\n", v->iteration);
	mput(t, "job %s\n", v->job_id);
	mput(t, "world %u\nnodes %u\n", v->world, im ? v->nnodes : nodes);
	mput(t, "optimizer %s\nshard_mode %s\nstep_mode %s\n", plan_optimizer_name(p->optimizer),
	     plan_shard_name(p->shard_mode), plan_step_name(p->step_mode));
	mput(t, "plan_hash %016" PRIx64 "\n", p->hash);
	mput(t, "groups %u\n", p->ngroups);
	for (uint32_t g = 0; g < p->ngroups; g++)
		mput(t, "group %u momentum %d amsgrad %d\n", g, p->groups[g].momentum != 0,
		     p->groups[g].amsgrad ? 1 : 0);
	mput(t, "segments %u\n", nsegs);
	for (uint32_t k = 0; k < nsegs; k++) {
		uint32_t b, s;
		const struct zc_segment *seg = plan_seg(p, k, &b, &s);
		if (!im) {
			mput(t, "segment %u param_id %" PRIu64 " numel %" PRIu64 " group %u\n", k,
			     seg->param_id, seg->numel, seg->group);
			continue;
		}
		mput(t,
		     "segment %u param_id %" PRIu64 " numel %" PRIu64 " group %u present %u step "
		     "%.0f\n",
		     k, seg->param_id, seg->numel, seg->group, im->ss[k].present, im->ss[k].step);
	}
	if (t->len >= t->cap)
		return -EOVERFLOW;
	t->cap += 256 + (size_t)nodes * 160;
	return 0;
}

/* t's checksum line, and t written as the manifest (both versions). */
static int manifest_commit(int dirfd, struct mtext *t)
{
	char hx[2 * CKPT_HASH_BYTES + 1];
	unsigned char h[CKPT_HASH_BYTES];
	struct afile f;
	int r;

	crypto_generichash(h, sizeof(h), (const unsigned char *)t->buf, t->len, NULL, 0);
	hex(h, hx);
	if ((r = mput(t, "checksum %s\n", hx)) < 0)
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
static int write_manifest(int dirfd, struct mtext *t, uint64_t data_bytes,
			  const unsigned char *data_hash)
{
	char hx[2 * CKPT_HASH_BYTES + 1];

	hex(data_hash, hx);
	mput(t, "file %s %" PRIu64 " %s\n", CKPT_DATA, data_bytes, hx);
	return manifest_commit(dirfd, t);
}

/* ------------------------------------------------------------ reading --- */

/* A checkpoint file that is not a regular file: -ENOTREG, its type in
 * read_file()'s *ret_mode. */
#define CKPT_ENOTREG EBADFD

/* name in dirfd, read whole (at most max bytes), the way a hostile writer
 * of the directory would make it: never following a link (-ELOOP), never
 * blocking on a FIFO or device (opened O_NONBLOCK, then anything but a
 * regular file refused: -CKPT_ENOTREG with its mode in *ret_mode), its size
 * checked before a byte is read (-EFBIG). */
static int read_file(int dirfd, const char *name, size_t max, char **ret, size_t *ret_len,
		     mode_t *ret_mode)
{
	struct stat st;
	char *buf;
	size_t got = 0;
	int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK), r = 0;

	if (fd < 0)
		return -errno;
	if (fstat(fd, &st) < 0)
		r = -errno;
	else if (!S_ISREG(st.st_mode))
		r = -CKPT_ENOTREG;
	else if ((uint64_t)st.st_size > max)
		r = -EFBIG;
	if (ret_mode)
		*ret_mode = r == -CKPT_ENOTREG ? st.st_mode : 0;
	if (r < 0) {
		close(fd);
		return r;
	}
	buf = malloc((size_t)st.st_size + 1);
	while (buf && got < (size_t)st.st_size) {
		ssize_t n = read(fd, buf + got, (size_t)st.st_size - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			r = n < 0 ? -errno : -EIO;
			break;
		}
		got += (size_t)n;
	}
	close(fd);
	if (!buf)
		return -ENOMEM;
	if (r < 0) {
		free(buf);
		return r;
	}
	buf[got] = '\0';
	*ret = buf;
	*ret_len = got;
	return 0;
}

/* What read_file()'s r says of the file, for a person. */
static const char *read_why(int r, mode_t mode)
{
	if (r == -ELOOP)
		return "a symbolic link: refused (checkpoint files are never followed)";
	if (r != -CKPT_ENOTREG)
		return strerror(-r);
	return S_ISFIFO(mode)	? "a FIFO, not a regular file: refused"
	       : S_ISDIR(mode)	? "a directory, not a regular file: refused"
	       : S_ISSOCK(mode) ? "a socket, not a regular file: refused"
	       : S_ISCHR(mode) || S_ISBLK(mode) ? "a device, not a regular file: refused"
						: "not a regular file: refused";
}

/* ------------------------------------------------------ generations --- */

/* SEQ of a complete generation's name "ckpt-SEQ", or 0 (not one). */
static uint64_t gen_seq(const char *name)
{
	const char *p = name + strlen(CKPT_GEN_PREFIX);
	uint64_t v = 0;

	if (strncmp(name, CKPT_GEN_PREFIX, strlen(CKPT_GEN_PREFIX)) != 0 || !*p ||
	    strlen(p) > 18)
		return 0;
	for (; *p; p++) {
		if (*p < '0' || *p > '9')
			return 0;
		v = 10 * v + (uint64_t)(*p - '0');
	}
	return v;
}

/* The newest complete generation in dirfd: its SEQ (0: none) and name. */
static int gen_newest(int dirfd, uint64_t *ret_seq, char *ret_name)
{
	int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	uint64_t best = 0;
	struct dirent *e;
	DIR *d;

	if (fd < 0)
		return -errno;
	if (!(d = fdopendir(fd))) {
		close(fd);
		return -errno;
	}
	while ((e = readdir(d)))
		if (gen_seq(e->d_name) > best) {
			best = gen_seq(e->d_name);
			/* gen_seq() took at most 18 digits: it fits */
			memcpy(ret_name, e->d_name, strlen(e->d_name) + 1);
		}
	closedir(d);
	*ret_seq = best;
	return 0;
}

/*
 * The checkpoint dir (open at dirfd) holds now: its newest generation
 * ckpt-SEQ, or, where there is none, dir itself (the single-generation
 * layout older versions wrote: MANIFEST and the data files in dir, read as
 * before). ret_fd: that directory; where: its path, for messages. Errors:
 * ZC_ECKPT naming the generation (a symbolic link or not a directory is
 * refused, never followed).
 */
static int gen_open_current(int dirfd, const char *dir, int *ret_fd, char *where, size_t len,
			    const char *fn)
{
	char name[CKPT_GEN_NAME];
	uint64_t seq = 0;
	int r = gen_newest(dirfd, &seq, name), fd;

	if (r < 0)
		return err_set(ZC_ECKPT, "%s: %s: %s", fn, dir, strerror(-r));
	if (!seq) {
		if ((fd = fcntl(dirfd, F_DUPFD_CLOEXEC, 0)) < 0)
			return err_set(-errno, "%s: %s: %s", fn, dir, strerror(errno));
		snprintf(where, len, "%s", dir);
		*ret_fd = fd;
		return 0;
	}
	snprintf(where, len, "%s/%s", dir, name);
	fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return err_set(ZC_ECKPT, "%s: %s: %s", fn, where,
			       errno == ELOOP || errno == ENOTDIR
				       ? "not a directory (a symbolic link or a file): refused"
				       : strerror(errno));
	*ret_fd = fd;
	return 0;
}

/* The directory a checkpoint of `iteration` (this run of the job: run, 0
 * on one node) is written into before it becomes a generation. */
static void gen_tmp_name(char *out, uint64_t iteration, uint64_t run)
{
	snprintf(out, CKPT_GEN_NAME, CKPT_TMP_PREFIX "%" PRIu64 "-%016" PRIx64, iteration, run);
}

/* Remove dirfd's entry name: a file, or a directory of files (what a
 * generation is). Best effort: what stays is removed by the next one. */
static void gen_remove(int dirfd, const char *name)
{
	int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	struct dirent *e;
	DIR *d;

	if (fd < 0) {
		unlinkat(dirfd, name, 0);
		return;
	}
	if (!(d = fdopendir(fd))) {
		close(fd);
		return;
	}
	/* the manifest first: a generation cut short by a kill reads as
	 * unfinished, never as one with files missing */
	unlinkat(fd, CKPT_MANIFEST, 0);
	while ((e = readdir(d)))
		if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
			unlinkat(fd, e->d_name, 0);
	closedir(d);
	unlinkat(dirfd, name, AT_REMOVEDIR);
}

/* The checkpoint in tmp (a directory in dirfd, every file in it durable)
 * made the current generation: renamed to ckpt-SEQ, SEQ one above the
 * newest, in one step that never replaces one, and dirfd fsynced. Then the
 * older ones go: generations below SEQ, directories of checkpoints not
 * finished (of iterations up to this one: a later one may be being written
 * by a node's stager, over several nodes), and the single-generation
 * layout's files. 0 or -errno (the checkpoint is durable and current only
 * on 0). */
static int gen_publish(int dirfd, const char *tmp, uint64_t iteration, char *ret_name)
{
	char name[CKPT_GEN_NAME];
	uint64_t seq = 0;
	struct dirent *e;
	DIR *d;
	int r, fd;

	for (int tries = 0;; tries++) {
		if ((r = gen_newest(dirfd, &seq, name)) < 0)
			return r;
		snprintf(name, sizeof(name), CKPT_GEN_PREFIX "%08" PRIu64, seq + 1);
		if (renameat2(dirfd, tmp, dirfd, name, RENAME_NOREPLACE) == 0)
			break;
		if (errno != EEXIST || tries == 8)
			return -errno;
	}
	if (fsync(dirfd) < 0)
		return -errno;
	memcpy(ret_name, name, sizeof(name));
	seq++;
	if ((fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
		return 0;
	if (!(d = fdopendir(fd))) {
		close(fd);
		return 0;
	}
	/* the old layout's manifest before its data: never a manifest naming
	 * files half removed */
	unlinkat(dirfd, CKPT_MANIFEST, 0);
	while ((e = readdir(d))) {
		const char *n = e->d_name;
		uint64_t it = 0;
		if (gen_seq(n) && gen_seq(n) < seq)
			gen_remove(dirfd, n);
		else if (strncmp(n, CKPT_TMP_PREFIX, strlen(CKPT_TMP_PREFIX)) == 0 &&
			 sscanf(n + strlen(CKPT_TMP_PREFIX), "%" SCNu64, &it) == 1 &&
			 it <= iteration)
			gen_remove(dirfd, n);
		else if (strcmp(n, CKPT_DATA) == 0 ||
			 (strncmp(n, "node-", 5) == 0 &&
			  (strstr(n, ".zck") || strstr(n, ".sum"))) ||
			 (n[0] == '.' && strstr(n, ".tmp.")))
			unlinkat(dirfd, n, 0);
	}
	closedir(d);
	return 0;
}

/* The directory to write a checkpoint of iteration (run) into, in dirfd,
 * made if missing (several nodes' stagers make it alike); fresh: whatever
 * one of the same name holds (a write a kill cut short) is removed first
 * (one writer only: one node). 0 with its fd, or -errno. */
static int gen_begin(int dirfd, uint64_t iteration, uint64_t run, bool fresh, char *ret_tmp,
		     int *ret_fd)
{
	gen_tmp_name(ret_tmp, iteration, run);
	if (fresh)
		gen_remove(dirfd, ret_tmp);
	if (mkdirat(dirfd, ret_tmp, 0755) < 0 && errno != EEXIST)
		return -errno;
	*ret_fd = openat(dirfd, ret_tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	return *ret_fd < 0 ? -errno : 0;
}

/* The iteration of dir's current checkpoint (its manifest read and
 * checked): 0 with it, or < 0 (none, or not readable: the reason set). */
static int current_iteration(const char *dir, uint64_t *ret, const char *fn);

/* Parse and check a manifest's text: 0, or ZC_ECKPT with the reason. */
static int parse_manifest(char *text, size_t len, struct manifest *m, const char *fn)
{
	char *line = text, *next, *sum = strstr(text, "checksum ");
	unsigned char h[CKPT_HASH_BYTES], want[CKPT_HASH_BYTES];
	unsigned version = 0, ng = 0, nsegs = 0, ngroups_seen = 0, nsegs_seen = 0;
	bool file_seen = false;
	char name[64], hx[2 * CKPT_HASH_BYTES + 1];

	while (sum && sum != text && sum[-1] != '\n')
		sum = strstr(sum + 1, "checksum ");
	if (!sum || unhex(sum + 9, want) < 0)
		return err_set(ZC_ECKPT,
			       "%s: the manifest has no checksum line: partial or not "
			       "a checkpoint",
			       fn);
	crypto_generichash(h, sizeof(h), (const unsigned char *)text, (size_t)(sum - text), NULL,
			   0);
	if (sodium_memcmp(h, want, sizeof(h)) != 0)
		return err_set(ZC_ECKPT,
			       "%s: the manifest's checksum does not match its contents "
			       "(corrupt)",
			       fn);
	(void)len;
	*sum = '\0';
	for (; *line; line = next) {
		unsigned a, b, c;
		uint64_t id, numel, x;
		double step;

		next = strchr(line, '\n');
		if (!next)
			return err_set(ZC_ECKPT, "%s: the manifest's last line is cut", fn);
		*next++ = '\0';
		if (sscanf(line, "zerod-checkpoint %u", &version) == 1) {
			if (version != CKPT_VERSION && version != CKPT_VERSION_NODES)
				return err_set(
					ZC_ECKPT,
					"%s: format version %u; this library reads %d and %d", fn,
					version, CKPT_VERSION, CKPT_VERSION_NODES);
			m->version = version;
		} else if (sscanf(line, "iteration %" SCNu64, &m->iteration) == 1 ||
			   sscanf(line, "world %u", &m->world) == 1 ||
			   sscanf(line, "nodes %u", &m->nodes) == 1 ||
			   sscanf(line, "plan_hash %" SCNx64, &m->plan_hash) == 1 ||
			   sscanf(line, "job %64s", m->job) == 1 ||
			   sscanf(line, "optimizer %31s", m->optimizer) == 1 ||
			   sscanf(line, "shard_mode %31s", m->shard) == 1 ||
			   sscanf(line, "step_mode %31s", m->step_mode) == 1) {
		} else if (sscanf(line, "groups %u", &ng) == 1) {
			if (m->group_momentum || ng > PLAN_MAX_GROUPS)
				return err_set(ZC_ECKPT, "%s: manifest: bad groups line", fn);
			m->ngroups = ng;
			m->group_momentum = calloc(ng ? ng : 1, 1);
			m->group_amsgrad = calloc(ng ? ng : 1, 1);
			if (!m->group_momentum || !m->group_amsgrad)
				return -ENOMEM;
		} else if (sscanf(line, "group %u momentum %u amsgrad %u", &a, &b, &c) == 3) {
			if (!m->group_momentum || a != ngroups_seen || a >= m->ngroups)
				return err_set(ZC_ECKPT, "%s: manifest: group %u out of order", fn,
					       a);
			m->group_momentum[a] = (uint8_t)b;
			m->group_amsgrad[a] = (uint8_t)c;
			ngroups_seen++;
		} else if (sscanf(line, "segments %u", &nsegs) == 1) {
			if (m->segs || nsegs > PLAN_MAX_SEGMENTS)
				return err_set(ZC_ECKPT, "%s: manifest: bad segments line", fn);
			m->nsegs = nsegs;
			m->segs = calloc(nsegs ? nsegs : 1, sizeof(*m->segs));
			if (!m->segs)
				return -ENOMEM;
		} else if (sscanf(line,
				  "segment %u param_id %" SCNu64 " numel %" SCNu64
				  " group %u present %u step %lf",
				  &a, &id, &numel, &b, &c, &step) == 6) {
			if (!m->segs || a != nsegs_seen || a >= m->nsegs || numel > PLAN_MAX_NUMEL)
				return err_set(ZC_ECKPT, "%s: manifest: segment %u out of order",
					       fn, a);
			m->segs[a] = (struct cseg){.param_id = id,
						   .numel = numel,
						   .group = b,
						   .present = c,
						   .step = step};
			nsegs_seen++;
		} else if (version == CKPT_VERSION_NODES &&
			   sscanf(line,
				  "segment %u param_id %" SCNu64 " numel %" SCNu64 " group %u", &a,
				  &id, &numel, &b) == 4) {
			/* version 2: the keys and steps are in the node files */
			if (!m->segs || a != nsegs_seen || a >= m->nsegs || numel > PLAN_MAX_NUMEL)
				return err_set(ZC_ECKPT, "%s: manifest: segment %u out of order",
					       fn, a);
			m->segs[a] = (struct cseg){.param_id = id, .numel = numel, .group = b};
			nsegs_seen++;
		} else if (sscanf(line, "file %63s %" SCNu64 " %64s", name, &x, hx) == 3) {
			char wname[32];
			if (version == CKPT_VERSION_NODES) {
				if (!m->files && m->nodes >= 1 && m->nodes <= CKPT_MAX_NODES)
					m->files = calloc(m->nodes, sizeof(*m->files));
				if (!m->files || m->nfiles >= m->nodes)
					return err_set(ZC_ECKPT,
						       "%s: manifest: file %s beyond its %u nodes",
						       fn, name, m->nodes);
				snprintf(wname, sizeof(wname), "node-%u.zck", m->nfiles);
				if (strcmp(name, wname) != 0 ||
				    unhex(hx, m->files[m->nfiles].hash) < 0)
					return err_set(ZC_ECKPT,
						       "%s: manifest: file %s where %s belongs", fn,
						       name, wname);
				m->files[m->nfiles++].bytes = x;
				file_seen = m->nfiles == m->nodes;
			} else {
				if (strcmp(name, CKPT_DATA) != 0 || unhex(hx, m->data_hash) < 0)
					return err_set(ZC_ECKPT, "%s: manifest: unknown file %s",
						       fn, name);
				m->data_bytes = x;
				file_seen = true;
			}
		} else {
			return err_set(ZC_ECKPT, "%s: manifest: a line it does not know: \"%.60s\"",
				       fn, line);
		}
	}
	if (m->iteration > (1ull << 53))
		return err_set(ZC_ECKPT, "%s: manifest: iteration %" PRIu64 " is above 2^53", fn,
			       m->iteration);
	if (!version || !m->group_momentum || !m->segs || !file_seen ||
	    ngroups_seen != m->ngroups || nsegs_seen != m->nsegs || !m->world)
		return err_set(ZC_ECKPT, "%s: the manifest lacks %s", fn,
			       !version ? "its version line"
			       : !m->group_momentum || ngroups_seen != m->ngroups ? "groups"
			       : !m->segs || nsegs_seen != m->nsegs               ? "segments"
			       : !file_seen ? "a file line (one per node)"
					    : "the world");
	return 0;
}

/* Map each of the plan's segments (plan order) to the checkpoint's: by
 * param_id when every segment of both has one, else by position. Checks
 * that the parameters are the same: 0 or ZC_ECKPT naming the difference. */
static int match(const struct plan *p, const struct manifest *m, uint32_t *map, const char *fn)
{
	uint32_t n = plan_nsegs(p);
	bool ids = true;

	if (strcmp(m->optimizer, plan_optimizer_name(p->optimizer)) != 0)
		return err_set(ZC_ECKPT, "%s: the checkpoint is of optimizer %s, the plan's is %s",
			       fn, m->optimizer, plan_optimizer_name(p->optimizer));
	if (m->ngroups != p->ngroups)
		return err_set(ZC_ECKPT, "%s: the checkpoint has %u parameter groups, the plan %u",
			       fn, m->ngroups, p->ngroups);
	for (uint32_t g = 0; g < p->ngroups; g++)
		if (m->group_momentum[g] != (p->groups[g].momentum != 0) ||
		    m->group_amsgrad[g] != (p->groups[g].amsgrad ? 1 : 0))
			return err_set(ZC_ECKPT,
				       "%s: group %u: the checkpoint's has momentum %s and amsgrad "
				       "%s, the plan's not: its state has other tensors",
				       fn, g, m->group_momentum[g] ? "!= 0" : "0",
				       m->group_amsgrad[g] ? "on" : "off");
	if (m->nsegs != n)
		return err_set(ZC_ECKPT, "%s: the checkpoint has %u segments, the plan %u", fn,
			       m->nsegs, n);
	for (uint32_t k = 0; k < n; k++) {
		uint32_t b, s;
		ids = ids && plan_seg(p, k, &b, &s)->param_id != 0 && m->segs[k].param_id != 0;
	}
	for (uint32_t k = 0; k < n; k++) {
		uint32_t b, s, at = k;
		const struct zc_segment *seg = plan_seg(p, k, &b, &s);
		if (ids) {
			for (at = 0; at < n && m->segs[at].param_id != seg->param_id; at++)
				;
			if (at == n)
				return err_set(ZC_ECKPT,
					       "%s: buckets[%u].segments[%u]: param_id %" PRIu64
					       " is not in the checkpoint",
					       fn, b, s, seg->param_id);
		}
		if (m->segs[at].numel != seg->numel || m->segs[at].group != seg->group)
			return err_set(
				ZC_ECKPT,
				"%s: buckets[%u].segments[%u]: numel %" PRIu64
				" group %u, the checkpoint's segment %u (by %s): numel %" PRIu64
				" group %u",
				fn, b, s, seg->numel, seg->group, at, ids ? "param_id" : "position",
				m->segs[at].numel, m->segs[at].group);
		map[k] = at;
	}
	if (ids) /* two of the plan's segments on one of the checkpoint's */
		for (uint32_t k = 0; k < n; k++)
			for (uint32_t i = k + 1; i < n; i++)
				if (map[i] == map[k])
					return err_set(ZC_ECKPT, "%s: param_id %" PRIu64 " twice",
						       fn, m->segs[map[k]].param_id);
	return 0;
}

static int read_manifest(int dirfd, const char *dir, struct manifest *m, const char *fn)
{
	char *text = NULL;
	size_t len = 0;
	mode_t mode = 0;
	int r = read_file(dirfd, CKPT_MANIFEST, CKPT_MAX_MANIFEST, &text, &len, &mode);

	if (r < 0)
		return err_set(ZC_ECKPT, "%s: %s/%s: %s%s", fn, dir, CKPT_MANIFEST,
			       read_why(r, mode),
			       r == -ENOENT ? " (no checkpoint, or one not finished)" : "");
	r = parse_manifest(text, len, m, fn);
	free(text);
	return r;
}

static int current_iteration(const char *dir, uint64_t *ret, const char *fn)
{
	struct manifest m = {0};
	char where[PATH_MAX];
	int dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), gfd = -1, r;

	if (dirfd < 0)
		return err_set(ZC_ECKPT, "%s: %s: %s", fn, dir, strerror(errno));
	r = gen_open_current(dirfd, dir, &gfd, where, sizeof(where), fn);
	if (r >= 0)
		r = read_manifest(gfd, where, &m, fn);
	if (r >= 0)
		*ret = m.iteration;
	manifest_free(&m);
	if (gfd >= 0)
		close(gfd);
	close(dirfd);
	return r;
}

/* ------------------------------------------------------ the writer --- */

/* A client's checkpoint in flight. On rank 0 (the writer) a thread writes
 * the exported image; on the other ranks nothing runs: they remember which
 * iteration rank 0 writes where, and zc_checkpoint_wait() reads the
 * manifest back. The thread touches only what is here (copies), never the
 * client, and records no error reason itself (err_set is per thread): it
 * leaves -errno and what it was doing, and the waiter records it. */
struct ckpt_writer {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	pthread_t th;
	bool writing;  /* rank 0: a thread started and not joined */
	bool finished; /* rank 0: the thread is done (result set) */
	bool reading;  /* other ranks: rank 0 writes `iteration` to dir */
	int result;    /* -errno, 0: durable */
	const char *doing;
	char *dir;
	uint64_t iteration;
	int timeout_ms; /* the others' wait without a limit: this one */
	struct image im;
	struct mtext mt;
	/* rank 0's staging: kept from one checkpoint to the next (its pages
	 * stay mapped: no page faults on the training path after the first).
	 * One node: a memfd zerod copies into and keeps mapped too (stage);
	 * several: the export's copy out (arena). */
	struct ckpt_stage stage;
	float *arena;
	uint64_t arena_floats;
	/* version 2, several nodes: each node's stager (local rank 0) writes
	 * its node's records from stage; rank 0 then waits for every node's
	 * sum file and writes the manifest (mt: its head). */
	bool v2;
	bool node_file; /* this rank stages its node's file */
	bool manifest;  /* rank 0 */
	uint32_t node, nnodes;
	uint64_t run; /* the job's run (StateOk.run) in node sums; 0: none known */
	uint64_t state_numel;
	struct crec *recs;
	size_t nrecs;
	/* the outcome for zerod: made by the thread as it ends, taken by the
	 * client's thread (ckpt_report_take) */
	char gen[CKPT_GEN_NAME]; /* the generation the thread made current */
	struct ckpt_report report;
	atomic_bool report_ready;
};

static void stage_free(struct ckpt_stage *st)
{
	if (st->base)
		munmap(st->base, st->bytes);
	if (st->fd >= 0)
		close(st->fd);
	*st = (struct ckpt_stage){.fd = -1};
}

/* The stage for plan p (the state round's staging size), made afresh if
 * the plan's size changed: 0 or -errno. */
static int stage_get(struct ckpt_stage *st, const struct plan *p)
{
	uint64_t bytes = (uint64_t)5 * p->state_numel * sizeof(float);
	void *base;
	int r;

	if (st->base && st->bytes == bytes)
		return 0;
	stage_free(st);
	if ((r = bufs_staging(bytes, &st->fd)) < 0)
		return r;
	base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, st->fd, 0);
	if (base == MAP_FAILED) {
		r = -errno;
		stage_free(st);
		return r;
	}
	st->base = base;
	st->bytes = bytes;
	/* The regions a checkpoint fills (0: parameters, 2-4: the state
	 * tensors the plan keeps; 1 is written sparsely) allocated now, in the
	 * kernel, rather than faulted in page by page by the copies; where
	 * the kernel cannot, they are faulted in by the copies. */
	unsigned arrays = plan_state_arrays(p->optimizer, p->groups, p->ngroups);
	for (unsigned k = 0; k < 5; k++)
		if (k == 0 || (k == 2 && (arrays & PLAN_STATE_M)) ||
		    (k == 3 && (arrays & PLAN_STATE_V)) || (k == 4 && (arrays & PLAN_STATE_VMAX)))
			(void)madvise(st->base + k * p->state_numel, p->state_numel * sizeof(float),
				      MADV_POPULATE_WRITE);
	return 0;
}

/* The writer thread's last act: its result for the waiter, and the
 * outcome for zerod (the message the waiter's error would say). */
static void writer_finish(struct ckpt_writer *w, int r)
{
	struct ckpt_report *rp = &w->report;

	*rp = (struct ckpt_report){.iteration = w->iteration, .ok = r == 0};
	snprintf(rp->dir, sizeof(rp->dir), "%s", w->dir);
	if (r == 0 && w->gen[0])
		snprintf(rp->path, sizeof(rp->path), "%s/%s", w->dir, w->gen);
	else if (r < 0)
		snprintf(rp->error, sizeof(rp->error),
			 "%s: checkpoint of iteration %" PRIu64 " in %s: %s: %s",
			 zc_strerror_name(ZC_ECKPT), w->iteration, w->dir, w->doing,
			 strerror(-r));
	atomic_store(&w->report_ready, true);
	pthread_mutex_lock(&w->mu);
	w->result = r;
	w->finished = true;
	pthread_cond_broadcast(&w->cv);
	pthread_mutex_unlock(&w->mu);
}

/* The write, off the training path: mkdir -p, a new generation's
 * directory, the data file and the manifest into it (each fsynced and
 * renamed, the directory fsynced), then the generation made current. */
static void *writer_main(void *arg)
{
	struct ckpt_writer *w = arg;
	unsigned char hash[CKPT_HASH_BYTES];
	char tmp[CKPT_GEN_NAME];
	uint64_t bytes = 0;
	int r, dirfd = -1, gfd = -1;

	w->doing = "making it";
	if ((r = mkdirs(w->dir)) < 0)
		goto out;
	w->doing = "opening it";
	if ((dirfd = open(w->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
		r = -errno;
		goto out;
	}
	w->doing = "making the new generation's directory";
	if ((r = gen_begin(dirfd, w->iteration, 0, true, tmp, &gfd)) < 0)
		goto out;
	w->doing = "writing " CKPT_DATA;
	if ((r = write_data(gfd, &w->im, w->iteration, &bytes, hash)) < 0)
		goto out;
	w->doing = "writing " CKPT_MANIFEST;
	if ((r = write_manifest(gfd, &w->mt, bytes, hash)) < 0)
		goto out;
	w->doing = "making it the current generation";
	r = gen_publish(dirfd, tmp, w->iteration, w->gen);
out:
	if (gfd >= 0)
		close(gfd);
	if (dirfd >= 0)
		close(dirfd);
	/* the staging copy is free again (its room kept in w->arena) */
	w->im.arena = NULL;
	image_free(&w->im);
	w->im = (struct image){0};
	free(w->mt.buf);
	w->mt = (struct mtext){0};
	writer_finish(w, r);
	return NULL;
}

/* The staging region of tensor t (tensor_bits order): 2 (momentum_buffer
 * or exp_avg), 3, 4. */
static unsigned tensor_region(unsigned t)
{
	return t == 0 ? 2 : t + 1;
}

/* node-K.zck from the stage, then node-K.sum naming its size and checksum,
 * each atomically. */
static int write_node(struct ckpt_writer *w, int dirfd)
{
	char name[32], sum[32], hx[2 * CKPT_HASH_BYTES + 1], line[256];
	unsigned char head[CKPT_NODE_HEADER] = {0}, hash[CKPT_HASH_BYTES];
	uint32_t version = CKPT_VERSION_NODES;
	uint64_t nrecs = w->nrecs, bytes = CKPT_NODE_HEADER;
	struct afile f;
	int r;

	snprintf(name, sizeof(name), "node-%u.zck", w->node);
	snprintf(sum, sizeof(sum), "node-%u.sum", w->node);
	w->doing = "removing the old node sum";
	if (unlinkat(dirfd, sum, 0) < 0 && errno != ENOENT)
		return -errno;
	w->doing = "writing the node file";
	if ((r = afile_open(&f, dirfd, name)) < 0)
		return r;
	memcpy(head, CKPT_NODE_MAGIC, 8);
	memcpy(head + 8, &version, 4);
	memcpy(head + 12, &w->node, 4);
	memcpy(head + 16, &w->iteration, 8);
	memcpy(head + 24, &nrecs, 8);
	r = afile_write(&f, head, sizeof(head));
	for (size_t i = 0; i < w->nrecs && r >= 0; i++) {
		const struct crec *rc = &w->recs[i];
		unsigned char rh[CKPT_RECORD] = {0};
		uint64_t step = (uint64_t)rc->step;
		memcpy(rh, &rc->seg, 4);
		memcpy(rh + 4, &rc->present, 4);
		memcpy(rh + 8, &rc->off, 8);
		memcpy(rh + 16, &rc->n, 8);
		memcpy(rh + 24, &step, 8);
		r = afile_write(&f, rh, sizeof(rh));
		bytes += CKPT_RECORD;
		if (r >= 0)
			r = afile_write(&f, w->stage.base + rc->slot, rc->n * sizeof(float));
		bytes += rc->n * sizeof(float);
		for (unsigned t = 0; t < 4 && r >= 0; t++) {
			if (!(rc->present & tensor_bits[t]))
				continue;
			r = afile_write(
				&f, w->stage.base + tensor_region(t) * w->state_numel + rc->slot,
				rc->n * sizeof(float));
			bytes += rc->n * sizeof(float);
		}
	}
	if (r < 0) {
		afile_abort(&f);
		return r;
	}
	if ((r = afile_commit(&f, hash)) < 0)
		return r;
	w->doing = "writing the node sum";
	hex(hash, hx);
	snprintf(line, sizeof(line),
		 "node %u iteration %" PRIu64 " file %s %" PRIu64 " %s run %016" PRIx64 "\n",
		 w->node, w->iteration, name, bytes, hx, w->run);
	if ((r = afile_open(&f, dirfd, sum)) < 0)
		return r;
	if ((r = afile_write(&f, line, strlen(line))) < 0) {
		afile_abort(&f);
		return r;
	}
	return afile_commit(&f, hash);
}

/* Rank 0: every node's sum for this iteration, read within the timeout;
 * their file lines appended to the manifest's head. */
static int gather_sums(struct ckpt_writer *w, int dirfd)
{
	int64_t end = now_ms() + w->timeout_ms;

	for (uint32_t k = 0; k < w->nnodes; k++) {
		char sum[32], name[64], want[32], hx[2 * CKPT_HASH_BYTES + 1];
		unsigned node;
		uint64_t it, bytes, run = 0;

		snprintf(sum, sizeof(sum), "node-%u.sum", k);
		snprintf(want, sizeof(want), "node-%u.zck", k);
		for (;;) {
			char *text = NULL;
			size_t len = 0;
			/* a sum of this iteration from another run of the job (a
			 * directory used again) is not this checkpoint's: its
			 * node has not replaced it yet */
			bool ok = read_file(dirfd, sum, 4096, &text, &len, NULL) == 0 &&
				  sscanf(text,
					 "node %u iteration %" SCNu64 " file %63s %" SCNu64
					 " %64s run %" SCNx64,
					 &node, &it, name, &bytes, hx, &run) == 6 &&
				  node == k && it == w->iteration && strcmp(name, want) == 0 &&
				  (w->run == 0 || run == w->run);
			free(text);
			if (ok)
				break;
			if (now_ms() >= end)
				return -ETIMEDOUT;
			usleep(2000);
		}
		if (mput(&w->mt, "file %s %" PRIu64 " %s\n", want, bytes, hx) < 0)
			return -EOVERFLOW;
	}
	return 0;
}

/* A stager but rank 0: dir's current manifest names this iteration (or a
 * later one) within the timeout: 0 or -ETIMEDOUT. */
static int manifest_names(struct ckpt_writer *w)
{
	int64_t end = now_ms() + w->timeout_ms;

	for (;;) {
		uint64_t it = 0;
		if (current_iteration(w->dir, &it, "") == 0 && it >= w->iteration)
			return 0;
		if (now_ms() >= end)
			return -ETIMEDOUT;
		usleep(2000);
	}
}

/* Version 2's write: this node's file into the generation's directory
 * (the stager), then on rank 0 the manifest once every node's sum names
 * this iteration, and the generation made current. */
static void *writer_nodes_main(void *arg)
{
	struct ckpt_writer *w = arg;
	char tmp[CKPT_GEN_NAME];
	int r, dirfd = -1, gfd = -1;

	w->doing = "making it";
	if ((r = mkdirs(w->dir)) < 0)
		goto out;
	w->doing = "opening it";
	if ((dirfd = open(w->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
		r = -errno;
		goto out;
	}
	/* every node's stager writes into the one directory named by the
	 * iteration and the run: no message needed to agree on it, and no
	 * file of an earlier checkpoint (or run) is overwritten or listed */
	w->doing = "making the new generation's directory";
	if ((r = gen_begin(dirfd, w->iteration, w->run, false, tmp, &gfd)) < 0)
		goto out;
	if (w->node_file && (r = write_node(w, gfd)) < 0)
		goto out;
	if (!w->manifest) {
		/* durable once rank 0 has made it the current generation */
		w->doing = "waiting for rank 0's " CKPT_MANIFEST;
		r = manifest_names(w);
		goto out;
	}
	w->doing = "waiting for every node's file (node-K.sum)";
	if ((r = gather_sums(w, gfd)) < 0)
		goto out;
	w->doing = "writing " CKPT_MANIFEST;
	if ((r = manifest_commit(gfd, &w->mt)) < 0)
		goto out;
	w->doing = "making it the current generation";
	r = gen_publish(dirfd, tmp, w->iteration, w->gen);
out:
	if (gfd >= 0)
		close(gfd);
	if (dirfd >= 0)
		close(dirfd);
	free(w->recs);
	w->recs = NULL;
	w->nrecs = 0;
	free(w->mt.buf);
	w->mt = (struct mtext){0};
	writer_finish(w, r);
	return NULL;
}

static struct ckpt_writer *writer_get(struct ckpt_writer **slot)
{
	struct ckpt_writer *w = *slot;

	if (w)
		return w;
	w = calloc(1, sizeof(*w));
	if (!w)
		return NULL;
	pthread_mutex_init(&w->mu, NULL);
	pthread_cond_init(&w->cv, NULL);
	w->stage.fd = -1;
	return *slot = w;
}

static void deadline_after(struct timespec *ts, int ms)
{
	clock_gettime(CLOCK_REALTIME, ts);
	ts->tv_sec += ms / 1000;
	ts->tv_nsec += (long)(ms % 1000) * 1000000L;
	if (ts->tv_nsec >= 1000000000L) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000L;
	}
}

/* Rank 0: wait up to timeout_ms (< 0: without limit) for the write in
 * flight; then its result (0, or ZC_ECKPT with the reason), once: the
 * writer is idle after. ZC_ETIMEDOUT: still writing. */
static int writer_join(struct ckpt_writer *w, int timeout_ms, const char *fn)
{
	struct timespec ts;
	int r = 0;

	pthread_mutex_lock(&w->mu);
	if (timeout_ms >= 0)
		deadline_after(&ts, timeout_ms);
	while (w->writing && !w->finished && r == 0)
		r = timeout_ms < 0 ? pthread_cond_wait(&w->cv, &w->mu)
				   : pthread_cond_timedwait(&w->cv, &w->mu, &ts);
	if (w->writing && !w->finished) {
		r = err_set(ZC_ETIMEDOUT,
			    "%s: the checkpoint of iteration %" PRIu64 " in %s is still being "
			    "written after %d ms",
			    fn, w->iteration, w->dir, timeout_ms);
		pthread_mutex_unlock(&w->mu);
		return r;
	}
	if (!w->writing) {
		pthread_mutex_unlock(&w->mu);
		return 0;
	}
	/* joined under the lock: a second waiter finds it joined (the thread
	 * wants the lock no more once finished) */
	pthread_join(w->th, NULL);
	w->writing = w->finished = false;
	r = w->result < 0 ? err_set(ZC_ECKPT, "%s: checkpoint of iteration %" PRIu64 " in %s: %s: %s",
				    fn, w->iteration, w->dir, w->doing, strerror(-w->result))
			  : 0;
	free(w->dir);
	w->dir = NULL;
	pthread_mutex_unlock(&w->mu);
	return r;
}

/* The other ranks: wait up to timeout_ms (< 0: the client's register
 * timeout) for dir's manifest to name the iteration rank 0 writes. */
static int reader_wait(struct ckpt_writer *w, int timeout_ms, const char *fn)
{
	int64_t end = now_ms() + (timeout_ms < 0 ? w->timeout_ms : timeout_ms);
	int r = 0;

	/* held while polling: another waiter waits for this one's answer */
	pthread_mutex_lock(&w->mu);
	if (!w->reading) {
		pthread_mutex_unlock(&w->mu);
		return 0;
	}
	for (;;) {
		uint64_t it = 0;
		if (current_iteration(w->dir, &it, fn) == 0 && it >= w->iteration)
			break;
		if (now_ms() >= end) {
			r = err_set(ZC_ECKPT,
				    "%s: %s does not hold iteration %" PRIu64 " after %d ms: rank 0 "
				    "writes it (its zc_checkpoint_wait() says why it failed), and "
				    "dir must be one directory for every node",
				    fn, w->dir, w->iteration,
				    timeout_ms < 0 ? w->timeout_ms : timeout_ms);
			break;
		}
		usleep(2000);
	}
	w->reading = false;
	free(w->dir);
	w->dir = NULL;
	pthread_mutex_unlock(&w->mu);
	return r;
}

void ckpt_writer_drain(struct ckpt_writer *w)
{
	if (w)
		(void)writer_join(w, -1, "zc_close");
}

bool ckpt_report_ready(struct ckpt_writer *w)
{
	return w && atomic_load_explicit(&w->report_ready, memory_order_acquire);
}

bool ckpt_report_take(struct ckpt_writer *w, struct ckpt_report *ret)
{
	/* the thread wrote the report before it set the flag, and the next
	 * thread starts only after zc_checkpoint() took it */
	if (!w || !atomic_exchange_explicit(&w->report_ready, false, memory_order_acq_rel))
		return false;
	*ret = w->report;
	return true;
}

void ckpt_writer_close(struct ckpt_writer **slot)
{
	struct ckpt_writer *w = *slot;

	if (!w)
		return;
	(void)writer_join(w, -1, "zc_close");
	free(w->dir);
	free(w->arena);
	stage_free(&w->stage);
	pthread_mutex_destroy(&w->mu);
	pthread_cond_destroy(&w->cv);
	free(w);
	*slot = NULL;
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
	r = w->reading ? reader_wait(w, timeout_ms, __func__) : writer_join(w, timeout_ms, __func__);
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

	if (v->rank == 0 && (r = stage_get(&w->stage, p)) < 0)
		return err_set(r, "%s: the checkpoint's staging (%" PRIu64 " bytes): %s", fn,
			       (uint64_t)5 * p->state_numel * sizeof(float), strerror(-r));
	if ((r = image_alloc(p, &im, false, NULL)) < 0)
		return err_set(r, "%s: %s", fn, strerror(-r));
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

	if (v->rank == 0 && w->arena_floats != arena_floats(v->plan)) {
		free(w->arena);
		w->arena_floats = 0;
		if (!(w->arena = malloc(arena_floats(v->plan) * sizeof(float))))
			return err_set(-ENOMEM, "%s: out of memory", fn);
		w->arena_floats = arena_floats(v->plan);
	}
	if ((r = image_alloc(v->plan, &im, v->rank == 0, v->rank == 0 ? w->arena : NULL)) < 0)
		return err_set(r, "%s: %s", fn, strerror(-r));
	r = zc_get_state(c, im.ss, im.nsegs);
	if (r < 0) {
		if (v->rank == 0)
			im.arena = NULL; /* w->arena */
		image_free(&im);
		return r;
	}
	for (uint32_t k = 0; k < im.nsegs && v->rank == 0; k++) {
		uint32_t b, s;
		const struct zc_segment *seg = plan_seg(v->plan, k, &b, &s);
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
		return err_set(-ENOMEM, "%s: out of memory", fn);
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
			return err_set(ZC_EPROTO, "%s: zerod named a range across segments", fn);
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

	if (stager && (r = stage_get(&w->stage, p)) < 0)
		return err_set(r, "%s: the checkpoint's staging (%" PRIu64 " bytes): %s", fn,
			       (uint64_t)5 * p->state_numel * sizeof(float), strerror(-r));
	r = client_ckpt_export(c, stager ? &w->stage : NULL, NULL, 0, stager ? &own : NULL, fn);
	if (r < 0)
		return r;
	if (stager && (r = node_records(p, &own, &recs, fn)) < 0)
		goto fail;
	if (v->rank == 0 &&
	    (r = manifest_head_v(&mt, v, NULL, stager ? own.nnodes : v->nnodes)) < 0) {
		r = err_set(ZC_ECKPT, "%s: the manifest: %s", fn, strerror(-r));
		goto fail;
	}
	if (!(w->dir = strdup(v->dir))) {
		r = err_set(-ENOMEM, "%s: out of memory", fn);
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
		r = err_set(ZC_ECKPT, "%s: no writer thread: %s", fn, strerror(r));
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
		return err_set(-EINVAL, "%s: no directory", fn);
	if (sodium_init() < 0)
		return err_set(-ENOMEM, "%s: libsodium does not start", fn);
	if (!(w = writer_get(v.writer)))
		return err_set(-ENOMEM, "%s: out of memory", fn);
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
		r = err_set(-ENOMEM, "%s: out of memory", fn);
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
		r = err_set(ZC_ECKPT, "%s: the manifest: %s", fn, strerror(-r));
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
		r = err_set(ZC_ECKPT, "%s: no writer thread: %s", fn, strerror(r));
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
		want += (1 + ntensors(m->segs[k].present)) * m->segs[k].numel * sizeof(float);
	if (want != m->data_bytes) {
		r = err_set(ZC_ECKPT,
			    "%s: the manifest names %" PRIu64 " bytes of %s, its segments "
			    "%" PRIu64,
			    fn, m->data_bytes, CKPT_DATA, want);
		goto out;
	}
	mode_t mode = 0;

	r = read_file(dirfd, CKPT_DATA, want, &data, &len, &mode);
	if (r < 0) {
		r = err_set(ZC_ECKPT, "%s: %s/%s: %s%s", fn, dir, CKPT_DATA, read_why(r, mode),
			    r == -EFBIG ? " (longer than the manifest says)" : "");
		goto out;
	}
	if (len != want) {
		r = err_set(ZC_ECKPT,
			    "%s: %s/%s: %zu bytes, the manifest says %" PRIu64 " (truncated)", fn,
			    dir, CKPT_DATA, len, want);
		goto out;
	}
	crypto_generichash(h, sizeof(h), (const unsigned char *)data, len, NULL, 0);
	if (sodium_memcmp(h, m->data_hash, sizeof(h)) != 0) {
		r = err_set(ZC_ECKPT, "%s: %s/%s: checksum mismatch (corrupt)", fn, dir, CKPT_DATA);
		goto out;
	}
	memcpy(&version, data + 8, 4);
	memcpy(&it, data + 16, 8);
	if (memcmp(data, CKPT_MAGIC, 8) != 0 || version != CKPT_VERSION || it != m->iteration) {
		r = err_set(ZC_ECKPT, "%s: %s/%s: not the manifest's data (header)", fn, dir,
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

/* One node file, read and checked whole (size, checksum, header), its
 * records into im and cv (its places appended at *ncv). */
static int load_node(int dirfd, const char *dir, const struct manifest *m, uint32_t node,
		     const uint32_t *inv, struct image *im, bool *seen, struct cover **cv,
		     size_t *ncv, size_t *cvcap, const char *fn)
{
	const struct cfile *cf = &m->files[node];
	unsigned char h[CKPT_HASH_BYTES];
	char name[32], *data = NULL;
	size_t len = 0;
	uint64_t it, nrecs, at = CKPT_NODE_HEADER;
	uint32_t version, nd;
	int r;

	snprintf(name, sizeof(name), "node-%u.zck", node);
	mode_t mode = 0;

	r = read_file(dirfd, name, cf->bytes, &data, &len, &mode);
	if (r < 0)
		return err_set(ZC_ECKPT, "%s: %s/%s: %s%s", fn, dir, name, read_why(r, mode),
			       r == -EFBIG    ? " (longer than the manifest says)"
			       : r == -ENOENT ? " (the manifest lists it: missing)"
					      : "");
	if (len != cf->bytes) {
		r = err_set(ZC_ECKPT,
			    "%s: %s/%s: %zu bytes, the manifest says %" PRIu64 " (truncated)", fn,
			    dir, name, len, cf->bytes);
		goto out;
	}
	crypto_generichash(h, sizeof(h), (const unsigned char *)data, len, NULL, 0);
	if (sodium_memcmp(h, cf->hash, sizeof(h)) != 0) {
		r = err_set(ZC_ECKPT, "%s: %s/%s: checksum mismatch (corrupt)", fn, dir, name);
		goto out;
	}
	if (len < CKPT_NODE_HEADER) {
		r = err_set(ZC_ECKPT, "%s: %s/%s: no header", fn, dir, name);
		goto out;
	}
	memcpy(&version, data + 8, 4);
	memcpy(&nd, data + 12, 4);
	memcpy(&it, data + 16, 8);
	memcpy(&nrecs, data + 24, 8);
	if (memcmp(data, CKPT_NODE_MAGIC, 8) != 0 || version != CKPT_VERSION_NODES ||
	    nd != node || it != m->iteration) {
		r = err_set(ZC_ECKPT, "%s: %s/%s: not the manifest's node file (header)", fn, dir,
			    name);
		goto out;
	}
	for (uint64_t i = 0; i < nrecs; i++) {
		uint32_t seg, present;
		uint64_t off, n, step, nb;
		uint32_t k;
		float *dst;

		if (len - at < CKPT_RECORD) {
			r = err_set(ZC_ECKPT, "%s: %s/%s: record %" PRIu64 " is cut", fn, dir, name,
				    i);
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
		    (present & ~(uint32_t)(ZC_STATE_STEP | ZC_STATE_MOMENTUM_BUFFER |
					   ZC_STATE_EXP_AVG | ZC_STATE_EXP_AVG_SQ |
					   ZC_STATE_MAX_EXP_AVG_SQ)) ||
		    (len - at) / sizeof(float) / (1 + ntensors(present)) < n) {
			r = err_set(ZC_ECKPT, "%s: %s/%s: record %" PRIu64 " is out of bounds", fn,
				    dir, name, i);
			goto out;
		}
		k = inv[seg];
		if (seen[seg] &&
		    (im->ss[k].present != present || im->ss[k].step != (double)step)) {
			r = err_set(ZC_ECKPT,
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
		if (*ncv == *cvcap) {
			size_t cap = *cvcap ? 2 * *cvcap : 256;
			struct cover *x = realloc(*cv, cap * sizeof(*x));
			if (!x) {
				r = err_set(-ENOMEM, "%s: out of memory", fn);
				goto out;
			}
			*cv = x;
			*cvcap = cap;
		}
		(*cv)[(*ncv)++] = (struct cover){.seg = seg, .off = off, .n = n};
	}
	if (at != len) {
		r = err_set(ZC_ECKPT, "%s: %s/%s: %zu bytes after its records", fn, dir, name,
			    len - (size_t)at);
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
		r = err_set(-ENOMEM, "%s: out of memory", fn);
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
			r = err_set(ZC_ECKPT,
				    "%s: %s: segment %u (param_id %" PRIu64 ") is %s by the node "
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
		return err_set(-EINVAL, "%s: no directory", fn);
	/* a checkpoint in flight is on disk first (rank 0 waits for its
	 * writer, the others for the manifest naming it); its result is the
	 * zc_checkpoint_wait()'s nobody called: what dir holds is checked below */
	if (*v.writer)
		(void)zc_checkpoint_wait(c, -1);
	if (v.plan->low_precision)
		return err_set(ZC_ENOTSUP,
			       "%s: plans with bf16/fp16 buckets have no checkpoints yet", fn);
	if (sodium_init() < 0)
		return err_set(-ENOMEM, "%s: libsodium does not start", fn);
	if ((dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
		r = err_set(ZC_ECKPT, "%s: %s: %s", fn, dir, strerror(errno));
		goto out;
	}
	if ((r = gen_open_current(dirfd, dir, &gfd, where, sizeof(where), fn)) < 0)
		goto out;
	if ((r = read_manifest(gfd, where, &m, fn)) < 0)
		goto out;
	map = calloc(m.nsegs ? m.nsegs : 1, sizeof(*map));
	if (!map) {
		r = err_set(-ENOMEM, "%s: out of memory", fn);
		goto out;
	}
	if ((r = match(v.plan, &m, map, fn)) < 0)
		goto out;
	if ((r = image_alloc(v.plan, &im, true, NULL)) < 0) {
		r = err_set(r, "%s: %s", fn, strerror(-r));
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
		const struct zc_segment *seg = plan_seg(v.plan, k, &b, &s);
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
