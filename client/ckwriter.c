/*
 * ckwriter.c — a client's checkpoint in flight (struct ckpt_writer): the
 * staging it keeps from one checkpoint to the next, the thread that writes
 * the data files and the manifest (one node, or a node's file and rank 0's
 * manifest over several), the waits for it, and the outcome it leaves for
 * zerod (ckpt_report_take).
 *
 * Owns: the writer thread; it touches only the writer, never the client.
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

/* ------------------------------------------------------ the writer --- */

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
int ckpt_stage_get(struct ckpt_stage *st, const struct plan *p)
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
void *writer_main(void *arg)
{
	struct ckpt_writer *w = arg;
	unsigned char hash[CKPT_HASH_BYTES];
	char tmp[CKPT_GEN_NAME];
	uint64_t bytes = 0;
	int r, dirfd = -1, gfd = -1;

	w->doing = "making it";
	if ((r = ckpt_mkdirs(w->dir)) < 0)
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
	if ((r = ckpt_write_data(gfd, &w->im, w->iteration, &bytes, hash)) < 0)
		goto out;
	w->doing = "writing " CKPT_MANIFEST;
	if ((r = ckpt_write_manifest(gfd, &w->mt, bytes, hash)) < 0)
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
	ckpt_hex(hash, hx);
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
			bool ok = ckpt_read_file(dirfd, sum, 4096, &text, &len, NULL) == 0 &&
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
		if (ckpt_mput(&w->mt, "file %s %" PRIu64 " %s\n", want, bytes, hx) < 0)
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
		if (ckpt_current_iteration(w->dir, &it, "") == 0 && it >= w->iteration)
			return 0;
		if (now_ms() >= end)
			return -ETIMEDOUT;
		usleep(2000);
	}
}

/* Version 2's write: this node's file into the generation's directory
 * (the stager), then on rank 0 the manifest once every node's sum names
 * this iteration, and the generation made current. */
void *writer_nodes_main(void *arg)
{
	struct ckpt_writer *w = arg;
	char tmp[CKPT_GEN_NAME];
	int r, dirfd = -1, gfd = -1;

	w->doing = "making it";
	if ((r = ckpt_mkdirs(w->dir)) < 0)
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

struct ckpt_writer *writer_get(struct ckpt_writer **slot)
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
int writer_join(struct ckpt_writer *w, int timeout_ms, const char *fn)
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
		r = client_err_set(ZC_ETIMEDOUT,
				   "%s: the checkpoint of iteration %" PRIu64
				   " in %s is still being "
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
	r = w->result < 0 ? client_err_set(ZC_ECKPT,
					   "%s: checkpoint of iteration %" PRIu64 " in %s: %s: %s",
					   fn, w->iteration, w->dir, w->doing, strerror(-w->result))
			  : 0;
	free(w->dir);
	w->dir = NULL;
	pthread_mutex_unlock(&w->mu);
	return r;
}

/* The other ranks: wait up to timeout_ms (< 0: the client's register
 * timeout) for dir's manifest to name the iteration rank 0 writes. */
int ckpt_reader_wait(struct ckpt_writer *w, int timeout_ms, const char *fn)
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
		if (ckpt_current_iteration(w->dir, &it, fn) == 0 && it >= w->iteration)
			break;
		if (now_ms() >= end) {
			r = client_err_set(
				ZC_ECKPT,
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
