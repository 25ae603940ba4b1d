/*
 * ckpt.h — what the files of libzeroclient's checkpoints share (ckpt.c: the
 * API and the export; ckdata.c: writing; ckgen.c: files and generations;
 * ckmanifest.c: the manifest read back; ckwriter.c: the writer thread;
 * ckload.c: restoring): the format's constants (docs/CHECKPOINT.md), what
 * a manifest says, the image of a job's state, the writer. Nothing outside
 * these files sees it.
 */
#ifndef ZEROCLIENT_CKPT_H
#define ZEROCLIENT_CKPT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

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

/* An open file under a temporary name in dirfd, renamed to name by
 * atomic_commit(). */
struct afile {
	int dirfd, fd;
	const char *name;
	char tmp[64];
	crypto_generichash_state h;
};

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

/* A manifest's text being built: every line up to the file line is made
 * from the plan on the caller's thread (manifest_head), the file and
 * checksum lines by the writer once the data file is durable
 * (write_manifest). */
struct mtext {
	char *buf;
	size_t len, cap;
};

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

/* A checkpoint file that is not a regular file: -ENOTREG, its type in
 * ckpt_read_file()'s *ret_mode. */
#define CKPT_ENOTREG EBADFD

/* ------------------------------------------------------ ckpt.c --- */

/* The tensors of a segment's state, in file order, and their bits; a
 * segment state's slot of tensor k, and how many of them present has. */
extern const uint32_t tensor_bits[4];
float **seg_slot(struct zc_segment_state *s, unsigned k);
unsigned ckpt_ntensors(uint32_t present);
/* A checksum as hex (2 * CKPT_HASH_BYTES + 1 bytes in out), and back: 0 or -1. */
void ckpt_hex(const unsigned char *h, char *out);
int ckpt_unhex(const char *s, unsigned char *out);
void manifest_free(struct manifest *m);
/* The plan's segments in plan order (bucket, then segment): how many, and
 * the k-th with its bucket and index. */
uint32_t ckpt_plan_nsegs(const struct plan *p);
const struct zc_segment *ckpt_plan_seg(const struct plan *p, uint32_t k, uint32_t *ret_b,
				       uint32_t *ret_s);

/* ---------------------------------------------------- ckdata.c --- */

int ckpt_mkdirs(const char *dir);
/* A file written under a temporary name in dirfd, made durable and renamed
 * to its name by afile_commit() (its checksum in *ret_hash), or removed. */
int afile_open(struct afile *f, int dirfd, const char *name);
int afile_write(struct afile *f, const void *buf, size_t len);
int afile_commit(struct afile *f, unsigned char *ret_hash);
void afile_abort(struct afile *f);
/* The image of plan p's parameters and state (its tensors too when
 * tensors), in arena if given (ckpt_arena_floats(p) floats). */
uint64_t ckpt_arena_floats(const struct plan *p);
int image_alloc(const struct plan *p, struct image *im, bool tensors, float *arena);
void image_free(struct image *im);
/* Version 1's data file of im, durable in dirfd. */
int ckpt_write_data(int dirfd, const struct image *im, uint64_t iteration, uint64_t *ret_bytes,
		    unsigned char *ret_hash);
/* The manifest's head (version 1; _v with nodes: version 2's), then its
 * last lines and the file itself. */
int manifest_head(struct mtext *t, const struct ckpt_view *v, const struct image *im);
int manifest_head_v(struct mtext *t, const struct ckpt_view *v, const struct image *im,
		    uint32_t nodes);
int manifest_commit(int dirfd, struct mtext *t);
/* Append a line to t: 0, or -EOVERFLOW (the text stops growing). */
int ckpt_mput(struct mtext *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int ckpt_write_manifest(int dirfd, struct mtext *t, uint64_t data_bytes,
			const unsigned char *data_hash);

/* ----------------------------------------------------- ckgen.c --- */

/* name in dirfd read whole, as a hostile writer would make it, and why a
 * read failed (r, the mode of a file that is not a regular one). */
int ckpt_read_file(int dirfd, const char *name, size_t max, char **ret, size_t *ret_len,
		   mode_t *ret_mode);
const char *ckpt_read_why(int r, mode_t mode);
/* dir's current generation opened (its path in where), a new one begun
 * (.tmp-ITERATION-RUN), and published as the next ckpt-SEQ. */
int gen_open_current(int dirfd, const char *dir, int *ret_fd, char *where, size_t len,
		     const char *fn);
int gen_begin(int dirfd, uint64_t iteration, uint64_t run, bool fresh, char *ret_tmp, int *ret_fd);
int gen_publish(int dirfd, const char *tmp, uint64_t iteration, char *ret_name);

/* ------------------------------------------------ ckmanifest.c --- */

/* Which of the manifest's segments is each of plan p's (map[plan's k]). */
int ckpt_match(const struct plan *p, const struct manifest *m, uint32_t *map, const char *fn);
int ckpt_read_manifest(int dirfd, const char *dir, struct manifest *m, const char *fn);
/* The iteration of dir's current checkpoint (its manifest read and
 * checked): 0 with it, or < 0 (none, or not readable: the reason set). */
int ckpt_current_iteration(const char *dir, uint64_t *ret, const char *fn);

/* -------------------------------------------------- ckwriter.c --- */

int ckpt_stage_get(struct ckpt_stage *st, const struct plan *p);
/* The writer thread: one node's checkpoint, or version 2's over nodes. */
void *writer_main(void *arg);
void *writer_nodes_main(void *arg);
/* c's writer (made at the first use), and the waits for its write (rank
 * 0's thread) or for rank 0's (the others, the manifest read back). */
struct ckpt_writer *writer_get(struct ckpt_writer **slot);
int writer_join(struct ckpt_writer *w, int timeout_ms, const char *fn);
int ckpt_reader_wait(struct ckpt_writer *w, int timeout_ms, const char *fn);

#endif
