/*
 * test_sharedparams.c — one parameter buffer shared by the local ranks of a
 * job (ZC_BUFFERS_SHARED_PARAMS) against a real zerod: two ranks that share
 * train to the same bits as two ranks with their own buffers, in both shard
 * and both step modes and through a checkpoint and its restore, an edit
 * made between iterations (on one rank only: the buffer is one) is what the
 * next step starts from, a restore that zerod refuses (the ranks restore
 * different checkpoints: ZC_ESTATEINVAL) leaves every rank's parameters
 * as they were, shared or not, zc_alloc_buffers_shared() shares without
 * the ranks passing fds (and refuses handles naming no usable memfd), and
 * a rank whose
 * buffer or flag differs from the other rank's fails zc_register_plan()
 * with ZC_ESHAREDPARAMS naming both ranks, while the background job "bg"
 * trains on through all of it.
 *
 * The test process creates the memfds before it forks the ranks, so the
 * ranks inherit them, and reads the results from its own mappings after
 * the ranks have gone.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "harness.h"
#include "testlib.h"
#include "trainer.h"
#include "zctest.h"

static struct zd daemon_;

#define N0    1000
#define N1    3000
#define NUMEL (N0 + N1)
#define ITERS 6
#define EDIT    3 /* the parameters are edited before this iteration */
#define SHARED_NAME "test-sharedparams-shared" /* the shared parameters' memfd */
#define CKPT    2 /* with a checkpoint directory: zc_checkpoint() before this one */
#define RESTORE 5 /* and zc_restore() of it before this one */

static const struct zc_segment segs[2][1] = {{SEG(0, N0, 0)}, {SEG(0, N1, 0)}};
static const struct zc_bucket buckets[2] = {BUCKET(N0, 1, segs[0]), BUCKET(N1, 1, segs[1])};

/* A memfd of `bytes` named `name`, sealed against shrinking, zero-filled. */
static int make_memfd_named(const char *name, size_t bytes)
{
	int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);

	if (fd < 0 || ftruncate(fd, (off_t)bytes) < 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) < 0) {
		printf("# memfd: %s\n", strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	return fd;
}

static int make_memfd(size_t bytes)
{
	return make_memfd_named("test-sharedparams", bytes);
}

/* Lines of /proc/PID/maps naming needle: the mappings of a memfd. */
static int maps_lines(pid_t pid, const char *needle)
{
	char path[64], line[512];
	FILE *f;
	int n = 0;

	snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
	f = fopen(path, "re");
	while (f && fgets(line, sizeof(line), f))
		n += strstr(line, needle) != NULL;
	if (f)
		fclose(f);
	return n;
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st, (void)flag, (void)ftw;
	return remove(path) < 0 ? -1 : 0;
}

static void rm_tree(const char *dir)
{
	nftw(dir, rm_one, 8, FTW_DEPTH | FTW_PHYS);
}

static float *map_fd(int fd, size_t bytes, size_t offset)
{
	float *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)offset);

	return p == MAP_FAILED ? NULL : p;
}

/* What a job of two ranks is given: its plan, each rank's gradient memfd and
 * parameter memfd (the same one twice when they share) with its offset. */
struct job_spec {
	const char *job;
	struct zc_plan plan;
	struct zc_param_group group;
	int grad_fd[2], param_fd[2];
	size_t param_offset[2];
	bool shared[2]; /* ZC_BUFFERS_SHARED_PARAMS */
	bool edit_one;  /* the edit is made by rank 0 alone (the buffer is shared) */
	/* checkpointed here before iteration CKPT, restored from before RESTORE */
	const char *ckpt_dir;
	const char *ckpt_dir2; /* refused_restore(): the second checkpoint */
	size_t bytes;   /* zc_plan_buffer_bytes() */
};

/* Rank idx's gradient for element e (bucket order) at iteration it: varied,
 * so that any element stepped from the wrong value shows. */
static float grad_of(int idx, int it, size_t e)
{
	return (float)(idx + 1) * 0.01f * sinf(0.37f * (float)e + 1.3f * (float)it) +
	       0.001f * (float)(e % 5);
}

/* Element e of the plan in a mapping of a buffer, where the library says
 * each bucket starts. */
static float *elem(zc_client *c, float *base, size_t e)
{
	size_t b = e < N0 ? 0 : 1,
	       at = (size_t)(zc_param_buffer(c, (uint32_t)b) - zc_param_buffer(c, 0));

	return base + at + (b ? e - N0 : e);
}

static zc_client *connect_c(const char *job, uint32_t rank)
{
	struct zc_config cfg = test_config(&daemon_, job, rank, 2);
	zc_client *c = NULL;
	int r = zc_connect(&cfg, &c);

	EXPECT(r == 0, "zc_connect %s rank %u: %s: %s", job, rank, zc_strerror_name(r),
	       zc_error_message());
	return r == 0 ? c : NULL;
}

static int register_rank(const struct job_spec *js, int idx, zc_client *c)
{
	struct zc_buffers b = ZC_BUFFERS_INIT;

	b.grad_fd = js->grad_fd[idx];
	b.param_fd = js->param_fd[idx];
	b.param_offset = js->param_offset[idx];
	b.flags = js->shared[idx] ? ZC_BUFFERS_SHARED_PARAMS : 0;
	return zc_register_buffers(c, &js->plan, &b);
}

/* Connect rank idx (*c), map its own buffers (*grad, *param) and register
 * them (register_rank); the caller writes the starting parameters and
 * registers the plan. 0, or nonzero after an EXPECT that says why; the
 * rank ends with rank_close() either way. */
static int rank_open(const struct job_spec *js, int idx, zc_client **c, float **grad,
		     float **param)
{
	int r;

	*grad = *param = NULL;
	*c = connect_c(js->job, (uint32_t)idx);
	if (!*c)
		return -1;
	*grad = map_fd(js->grad_fd[idx], js->bytes, 0);
	*param = map_fd(js->param_fd[idx], js->bytes, js->param_offset[idx]);
	EXPECT(*grad && *param, "mmap: %s", strerror(errno));
	if (!*grad || !*param)
		return -1;
	r = register_rank(js, idx, *c);
	EXPECT(r == 0, "zc_register_buffers: %s: %s", zc_strerror_name(r), zc_error_message());
	return r;
}

/* zc_register_plan(), EXPECTed. */
static int register_plan(zc_client *c)
{
	int r = zc_register_plan(c);

	EXPECT(r == 0, "zc_register_plan: %s: %s", zc_strerror_name(r), zc_error_message());
	return r;
}

static int rank_close(const struct job_spec *js, zc_client *c, float *grad, float *param)
{
	zc_close(c);
	if (grad)
		munmap(grad, js->bytes);
	if (param)
		munmap(param, js->bytes);
	return child_bad;
}

/* Hand over buckets 0..n-1 (their gradients written) and wait for the
 * step of the current iteration; `it` names it in the failure. */
static int step_buckets(zc_client *c, uint32_t n, int it)
{
	zc_future *step = NULL;
	uint64_t iter = zc_iteration(c);
	int r = 0;

	for (uint32_t b = 0; b < n && r == 0; b++)
		r = zc_bucket_ready(c, b, NULL);
	if (r == 0)
		r = zc_step_future(c, iter, &step);
	if (r == 0)
		r = zc_future_wait(step, test_timeout(10000)) == 1 ? 0 : -1;
	EXPECT(r == 0, "iteration %d: %s", it, step ? zc_future_message(step) : "no step");
	zc_future_free(step);
	return r;
}

/* One rank of a job that trains: ITERS iterations; before iteration EDIT
 * every element becomes p * 0.5 + 0.25, made by each rank on its own
 * buffer, or by rank 0 alone on a shared one. */
static int share_rank(void *arg, int idx)
{
	const struct job_spec *js = arg;
	zc_client *c;
	float *grad, *param;
	int r = rank_open(js, idx, &c, &grad, &param);

	if (r == 0) {
		/* rank 0's initial values win: rank 1's start elsewhere */
		for (size_t e = 0; e < NUMEL; e++)
			*elem(c, param, e) = idx == 0 || js->shared[idx] ? 0.5f + 1e-3f * (float)(e % 97)
								       : -7.0f;
		r = register_plan(c);
	}
	/* every rank registered: zerod mapped the shared buffer once */
	if (r == 0 && js->shared[idx] && idx == 0) {
		int n = maps_lines(daemon_.pid, "memfd:" SHARED_NAME);
		EXPECT(n == 1, "zerod maps the shared parameter memfd %d times", n);
	}
	for (int it = 0; it < ITERS && r == 0; it++) {
		if (js->ckpt_dir && it == CKPT) {
			r = zc_checkpoint(c, js->ckpt_dir);
			if (r == 0)
				r = zc_checkpoint_wait(c, test_timeout(10000));
			EXPECT(r == 0, "checkpoint: %s: %s", zc_strerror_name(r), zc_error_message());
		}
		if (js->ckpt_dir && it == RESTORE && r == 0) {
			r = zc_restore(c, js->ckpt_dir);
			EXPECT(r == 0, "restore: %s: %s", zc_strerror_name(r), zc_error_message());
		}
		if (r != 0)
			break;
		if (it == EDIT && (idx == 0 || !js->edit_one))
			for (size_t e = 0; e < NUMEL; e++)
				*elem(c, param, e) = *elem(c, param, e) * 0.5f + 0.25f;
		for (size_t e = 0; e < NUMEL; e++)
			*elem(c, grad, e) = grad_of(idx, it, e);
		r = step_buckets(c, 2, it);
	}
	return rank_close(js, c, grad, param);
}

static void spec_init(struct job_spec *js, const char *job, enum zc_optimizer opt,
		      enum zc_shard_mode shard, enum zc_step_mode step)
{
	uint64_t bytes = 0;

	memset(js, 0, sizeof(*js));
	js->job = job;
	js->group = (struct zc_param_group)ZC_PARAM_GROUP_INIT;
	js->group.lr = 0.05;
	js->group.weight_decay = opt == ZC_OPT_ADAMW ? 0.01 : 0;
	js->plan = (struct zc_plan)PLAN(opt, shard, step, 1, &js->group, 2, buckets);
	CHECK(zc_plan_buffer_bytes(&js->plan, &bytes) == 0, "zc_plan_buffer_bytes: %s",
	      zc_error_message());
	js->bytes = (size_t)bytes;
	for (int i = 0; i < 2; i++)
		js->grad_fd[i] = js->param_fd[i] = -1;
}

static void spec_close(struct job_spec *js)
{
	for (int i = 0; i < 2; i++) {
		if (js->grad_fd[i] >= 0)
			close(js->grad_fd[i]);
		if (js->param_fd[i] >= 0 && (i == 0 || js->param_fd[1] != js->param_fd[0]))
			close(js->param_fd[i]);
	}
}

/* ---- the background job ---- */

static struct bg_job *bg;

static void t_background_job_starts(void)
{
	bg_job_start(bg, &(struct train_spec){
		.socket = daemon_.sock,
		.job = "bg",
		.world = 2,
		.optimizer = ZC_OPT_ADAM,
		.shard_mode = ZC_SHARD_SLICE,
		.step_mode = ZC_STEP_INTERLEAVED,
		.iters = 100000,
		.seed = 5,
		.sleep_us = 2000,
	});
}

/* ---- sharing trains to the bits of not sharing ---- */

/*
 * Two jobs side by side on the same plan and gradients: "own-*" gives each
 * rank its own parameters, "shared-*" one memfd both register. The edit
 * before iteration EDIT is made on each own buffer, and once on the shared
 * one. Every parameter must end as the same float in all three buffers.
 */
static void shared_vs_own(const char *tag, enum zc_optimizer opt, enum zc_shard_mode shard,
			  enum zc_step_mode step, bool ckpt)
{
	struct job_spec own, shared;
	char own_id[32], shared_id[32], dirs[2][64] = {"", ""};
	float *po[2] = {NULL, NULL}, *ps = NULL;
	pid_t pid[4];
	int st[4];

	snprintf(own_id, sizeof(own_id), "own-%s", tag);
	snprintf(shared_id, sizeof(shared_id), "shared-%s", tag);
	spec_init(&own, own_id, opt, shard, step);
	spec_init(&shared, shared_id, opt, shard, step);
	shared.edit_one = true;
	for (int i = 0; ckpt && i < 2; i++) {
		snprintf(dirs[i], sizeof(dirs[i]), "/tmp/zerod-test-shared-ckpt.XXXXXX");
		CHECK(mkdtemp(dirs[i]), "mkdtemp: %s", strerror(errno));
	}
	own.ckpt_dir = ckpt ? dirs[0] : NULL;
	shared.ckpt_dir = ckpt ? dirs[1] : NULL;
	for (int i = 0; i < 2; i++) {
		own.grad_fd[i] = make_memfd(own.bytes);
		own.param_fd[i] = make_memfd(own.bytes);
		shared.grad_fd[i] = make_memfd(shared.bytes);
		shared.shared[i] = true;
	}
	/* the shared parameters one page into their memfd, on both ranks */
	shared.param_fd[0] = shared.param_fd[1] = make_memfd_named(SHARED_NAME, shared.bytes + 4096);
	shared.param_offset[0] = shared.param_offset[1] = 4096;
	for (int i = 0; i < 2; i++)
		CHECK(own.grad_fd[i] >= 0 && own.param_fd[i] >= 0 && shared.grad_fd[i] >= 0 &&
			      shared.param_fd[i] >= 0,
		      "memfds");
	for (int i = 0; i < 2; i++) {
		pid[i] = spawn(share_rank, &own, i);
		pid[2 + i] = spawn(share_rank, &shared, i);
	}
	for (int i = 0; i < 4; i++)
		st[i] = wait_child(pid[i], 60000);
	for (int i = 0; i < 4; i++)
		CHECK(st[i] == 0, "%s rank %d", i < 2 ? own_id : shared_id, i % 2);
	for (int i = 0; i < 2; i++)
		po[i] = map_fd(own.param_fd[i], own.bytes, 0);
	ps = map_fd(shared.param_fd[0], shared.bytes, 4096);
	CHECK(po[0] && po[1] && ps, "mmap: %s", strerror(errno));
	/* the same layout in all three: bucket 1 starts where the library put it */
	size_t n = own.bytes / sizeof(float), diff = 0, first = 0;
	for (size_t i = 0; i < n; i++)
		if (memcmp(&po[0][i], &ps[i], sizeof(float)) ||
		    memcmp(&po[1][i], &ps[i], sizeof(float))) {
			if (!diff++)
				first = i;
		}
	CHECK(diff == 0, "%zu of %zu floats differ; the first at %zu: own %a / %a, shared %a", diff,
	      n, first, po[0][first], po[1][first], ps[first]);
	/* it trained: nothing is left at its start or at the edit's value */
	CHECK(ps[0] != 0.5f && ps[0] != 0.5f * 0.5f + 0.25f && isfinite(ps[0]), "ps[0] = %a",
	      ps[0]);
	for (int i = 0; i < 2; i++)
		munmap(po[i], own.bytes);
	munmap(ps, shared.bytes);
	spec_close(&own);
	spec_close(&shared);
	for (int i = 0; ckpt && i < 2; i++)
		rm_tree(dirs[i]);
}

static void t_bucket_interleaved(void)
{
	shared_vs_own("bi", ZC_OPT_ADAM, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED, false);
}

static void t_slice_interleaved(void)
{
	shared_vs_own("si", ZC_OPT_ADAM, ZC_SHARD_SLICE, ZC_STEP_INTERLEAVED, false);
}

static void t_bucket_at_end(void)
{
	shared_vs_own("ba", ZC_OPT_ADAMW, ZC_SHARD_BUCKET, ZC_STEP_AT_END, false);
}

static void t_slice_at_end(void)
{
	shared_vs_own("sa", ZC_OPT_SGD, ZC_SHARD_SLICE, ZC_STEP_AT_END, false);
}

/* The same through a checkpoint and zc_restore() of it (every rank writes
 * the checkpoint's parameters into its view: the shared buffer twice). */
static void t_checkpoint_restore(void)
{
	shared_vs_own("cr", ZC_OPT_ADAM, ZC_SHARD_SLICE, ZC_STEP_INTERLEAVED, true);
}

/* ---- an edit between iterations is where the next step starts ---- */

/*
 * SGD, lr 0.5, gradients 0.125 and 0.375 (average 0.25): each step takes
 * 0.125 off, exactly. Two steps from 1.0 leave 0.75; rank 0 alone then
 * writes 2.0 into the shared buffer, and the third step must leave 1.875,
 * which rank 1 reads through its own mapping.
 */
static int edit_rank(void *arg, int idx)
{
	const struct job_spec *js = arg;
	zc_client *c;
	float *grad, *param;
	int r = rank_open(js, idx, &c, &grad, &param);

	if (r == 0) {
		for (size_t e = 0; idx == 0 && e < NUMEL; e++)
			*elem(c, param, e) = 1.0f;
		r = register_plan(c);
	}
	for (int it = 0; it < 3 && r == 0; it++) {
		if (it == 2 && idx == 0) {
			for (size_t e = 0; e < NUMEL; e++) {
				EXPECT(*elem(c, param, e) == 0.75f, "element %zu = %a before the edit",
				       e, *elem(c, param, e));
				*elem(c, param, e) = 2.0f;
				if (child_bad)
					break;
			}
		}
		for (size_t e = 0; e < NUMEL; e++)
			*elem(c, grad, e) = idx == 0 ? 0.125f : 0.375f;
		r = step_buckets(c, 2, it);
	}
	for (size_t e = 0; e < NUMEL && r == 0 && !child_bad; e++)
		EXPECT(*elem(c, param, e) == 1.875f, "rank %d: element %zu = %a, want 1.875", idx,
		       e, *elem(c, param, e));
	return rank_close(js, c, grad, param);
}

static void t_edit_between_iterations(void)
{
	struct job_spec js;
	pid_t pid[2];

	spec_init(&js, "edit", ZC_OPT_SGD, ZC_SHARD_SLICE, ZC_STEP_INTERLEAVED);
	js.group.lr = 0.5;
	js.grad_fd[0] = make_memfd(js.bytes);
	js.grad_fd[1] = make_memfd(js.bytes);
	js.param_fd[0] = js.param_fd[1] = make_memfd(js.bytes);
	js.shared[0] = js.shared[1] = true;
	CHECK(js.grad_fd[0] >= 0 && js.grad_fd[1] >= 0 && js.param_fd[0] >= 0, "memfds");
	for (int i = 0; i < 2; i++)
		pid[i] = spawn(edit_rank, &js, i);
	for (int i = 0; i < 2; i++)
		CHECK(wait_child(pid[i], 30000) == 0, "rank %d", i);
	spec_close(&js);
}

/* ---- a re-plan gives each rank its own buffers ---- */

/*
 * The SGD job above: two steps on the shared buffer leave 0.75; then each
 * rank re-plans with zc_alloc_buffers() (the same layout), which gives it a
 * buffer of its own holding the parameters, and two more steps must leave
 * 0.5 in both ranks' new buffers, and the old shared buffer as it was.
 */
static int replan_rank(void *arg, int idx)
{
	const struct job_spec *js = arg;
	zc_client *c;
	float *grad, *param;
	int r = rank_open(js, idx, &c, &grad, &param);

	if (r == 0) {
		for (size_t e = 0; idx == 0 && e < NUMEL; e++)
			*elem(c, param, e) = 1.0f;
		r = register_plan(c);
	}
	for (int it = 0; it < 4 && r == 0; it++) {
		if (it == 2) {
			r = zc_alloc_buffers(c, &js->plan);
			if (r == 0)
				r = zc_register_plan(c);
			EXPECT(r == 0, "re-plan: %s: %s", zc_strerror_name(r), zc_error_message());
			if (r != 0)
				break;
			EXPECT(zc_param_buffer(c, 0) != elem(c, param, 0),
			       "the re-plan kept the shared buffer");
		}
		for (uint32_t b = 0; b < 2; b++) {
			float *g = zc_grad_buffer(c, b);
			for (uint64_t e = 0; e < buckets[b].numel; e++)
				g[e] = idx == 0 ? 0.125f : 0.375f;
		}
		r = step_buckets(c, 2, it);
	}
	for (uint32_t b = 0; b < 2 && r == 0 && !child_bad; b++)
		for (uint64_t e = 0; e < buckets[b].numel && !child_bad; e++)
			EXPECT(zc_param_buffer(c, b)[e] == 0.5f, "rank %d: bucket %u[%llu] = %a, "
			       "want 0.5", idx, b, (unsigned long long)e, zc_param_buffer(c, b)[e]);
	return rank_close(js, c, grad, param);
}

static void t_replan_own_buffers(void)
{
	struct job_spec js;
	pid_t pid[2];
	float *p;

	spec_init(&js, "replan", ZC_OPT_SGD, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED);
	js.group.lr = 0.5;
	js.grad_fd[0] = make_memfd(js.bytes);
	js.grad_fd[1] = make_memfd(js.bytes);
	js.param_fd[0] = js.param_fd[1] = make_memfd(js.bytes);
	js.shared[0] = js.shared[1] = true;
	CHECK(js.grad_fd[0] >= 0 && js.grad_fd[1] >= 0 && js.param_fd[0] >= 0, "memfds");
	for (int i = 0; i < 2; i++)
		pid[i] = spawn(replan_rank, &js, i);
	for (int i = 0; i < 2; i++)
		CHECK(wait_child(pid[i], 30000) == 0, "rank %d", i);
	p = map_fd(js.param_fd[0], js.bytes, 0);
	CHECK(p && p[0] == 0.75f, "the old shared buffer: %a, want 0.75 (two steps)",
	      p ? p[0] : 0.0f);
	munmap(p, js.bytes);
	spec_close(&js);
}

/* ---- a refused restore leaves the parameters as they were ---- */

/*
 * Adam, two ranks: two iterations, a checkpoint into dirs[0], two more, a
 * checkpoint into dirs[1], one more. Then rank 0 restores dirs[0] and rank
 * 1 dirs[1]: both checkpoints are sound, but their steps differ, so zerod
 * refuses the import for both ranks with ZC_ESTATEINVAL. Every rank's
 * parameters (one buffer when they share) must be the bits they were before,
 * its iteration unchanged, and the job must train on. Each rank snapshots
 * its parameters before either calls zc_restore() and compares once both
 * returned (a rank putting back after the other compared would show too).
 */
struct restore_sync {
	int before, after;
};

static struct restore_sync *rsync;

/* Wait for both ranks at *count (a guard against a hang, not a time
 * assertion: the other rank is there at once unless it failed). */
static bool both_at(int *count)
{
	__atomic_add_fetch(count, 1, __ATOMIC_SEQ_CST);
	for (int i = 0; i < test_timeout(30000); i++) {
		if (__atomic_load_n(count, __ATOMIC_SEQ_CST) >= 2)
			return true;
		usleep(1000);
	}
	return false;
}

static int train_one(zc_client *c, int idx, int it, float *grad)
{
	for (size_t e = 0; e < NUMEL; e++)
		*elem(c, grad, e) = grad_of(idx, it, e);
	return step_buckets(c, 2, it);
}

static int refused_restore_rank(void *arg, int idx)
{
	const struct job_spec *js = arg;
	const char *dirs[2] = {js->ckpt_dir, js->ckpt_dir2};
	float *before = malloc(NUMEL * sizeof(float));
	zc_client *c;
	float *grad, *param;
	int r = rank_open(js, idx, &c, &grad, &param);
	uint64_t iter = 0;
	size_t diff = 0, first = 0;

	EXPECT(before, "out of memory");
	if (r == 0 && before) {
		for (size_t e = 0; idx == 0 && e < NUMEL; e++)
			*elem(c, param, e) = 0.5f + 1e-3f * (float)(e % 97);
		r = register_plan(c);
	}
	for (int it = 0; it < 5 && r == 0; it++) {
		if (it == 2 || it == 4) {
			r = zc_checkpoint(c, dirs[it / 2 - 1]);
			if (r == 0)
				r = zc_checkpoint_wait(c, test_timeout(10000));
			EXPECT(r == 0, "checkpoint: %s: %s", zc_strerror_name(r),
			       zc_error_message());
		}
		if (r == 0)
			r = train_one(c, idx, it, grad);
	}
	if (r == 0) {
		for (size_t e = 0; e < NUMEL; e++)
			before[e] = *elem(c, param, e);
		iter = zc_iteration(c);
		EXPECT(both_at(&rsync->before), "the other rank never came to its restore");
		r = zc_restore(c, dirs[idx]);
		printf("# rank %d: zc_restore(%s): %s: %s\n", idx, dirs[idx], zc_strerror_name(r),
		       zc_error_message());
		EXPECT(r == ZC_ESTATEINVAL, "rank %d: restoring another checkpoint than rank %d's: "
		       "%s", idx, 1 - idx, zc_strerror_name(r));
		EXPECT(zc_iteration(c) == iter,
		       "rank %d: iteration %llu after the refusal, was %llu", idx,
		       (unsigned long long)zc_iteration(c), (unsigned long long)iter);
		EXPECT(both_at(&rsync->after), "the other rank never returned from its restore");
		for (size_t e = 0; e < NUMEL; e++)
			if (memcmp(elem(c, param, e), &before[e], sizeof(float)) && !diff++)
				first = e;
		EXPECT(diff == 0, "rank %d: %zu of %d parameters changed by a refused restore; "
		       "the first, %zu: %a, was %a", idx, diff, NUMEL, first,
		       *elem(c, param, first), before[first]);
		r = child_bad ? -1 : train_one(c, idx, 5, grad);
	}
	free(before);
	return rank_close(js, c, grad, param);
}

static void refused_restore(const char *job, bool share)
{
	struct job_spec js;
	char dirs[2][64];
	pid_t pid[2];

	spec_init(&js, job, ZC_OPT_ADAM, ZC_SHARD_SLICE, ZC_STEP_INTERLEAVED);
	for (int i = 0; i < 2; i++) {
		snprintf(dirs[i], sizeof(dirs[i]), "/tmp/zerod-test-shared-ckpt.XXXXXX");
		CHECK(mkdtemp(dirs[i]), "mkdtemp: %s", strerror(errno));
	}
	js.ckpt_dir = dirs[0];
	js.ckpt_dir2 = dirs[1];
	for (int i = 0; i < 2; i++) {
		js.grad_fd[i] = make_memfd(js.bytes);
		js.shared[i] = share;
		if (!share)
			js.param_fd[i] = make_memfd(js.bytes);
	}
	if (share)
		js.param_fd[0] = js.param_fd[1] = make_memfd(js.bytes);
	CHECK(js.grad_fd[0] >= 0 && js.grad_fd[1] >= 0 && js.param_fd[0] >= 0 &&
		      js.param_fd[1] >= 0,
	      "memfds");
	memset(rsync, 0, sizeof(*rsync));
	for (int i = 0; i < 2; i++)
		pid[i] = spawn(refused_restore_rank, &js, i);
	for (int i = 0; i < 2; i++)
		CHECK(wait_child(pid[i], 60000) == 0, "rank %d", i);
	spec_close(&js);
	for (int i = 0; i < 2; i++)
		rm_tree(dirs[i]);
}

static void t_refused_restore_shared(void)
{
	refused_restore("refused-shared", true);
}

static void t_refused_restore_own(void)
{
	refused_restore("refused-own", false);
}

/* ---- zc_alloc_buffers_shared(): sharing without passing fds ---- */

/*
 * The ranks are forked before any memfd exists, so nothing is inherited:
 * rank 0 creates the buffer and publishes its handle in shared memory (as
 * a trainer would in a store), rank 1 opens it from that. SGD, lr 0.5,
 * gradients 0.125 and 0.375: three steps from 1.0 leave 0.625, on both
 * ranks; rank 1 sees rank 0's initial values, and zerod maps the buffer
 * once.
 */
struct handoff {
	int ready;
	struct zc_shared_params h;
	int ready2; /* the re-plan's */
	struct zc_shared_params h2;
};

static struct handoff *hand;

static int alloc_shared_rank(void *arg, int idx)
{
	const struct job_spec *js = arg;
	zc_client *c = connect_c(js->job, (uint32_t)idx);
	struct zc_shared_params h = ZC_SHARED_PARAMS_INIT;
	int r = 0;

	if (!c)
		return 1;
	if (idx == 1) {
		for (int i = 0; i < test_timeout(30000) && !__atomic_load_n(&hand->ready,
									 __ATOMIC_ACQUIRE);
		     i++)
			usleep(1000);
		EXPECT(hand->ready, "rank 0 never published its handle");
		r = hand->ready ? 0 : -1;
	}
	if (r == 0)
		r = zc_alloc_buffers_shared(c, &js->plan, idx ? &hand->h : NULL, &h);
	EXPECT(r == 0, "zc_alloc_buffers_shared: %s: %s", zc_strerror_name(r), zc_error_message());
	if (r == 0 && idx == 0) {
		EXPECT(h.pid == getpid() && h.fd >= 0, "the handle: pid %d fd %d", h.pid, h.fd);
		for (uint32_t b = 0; b < 2; b++)
			for (uint64_t e = 0; e < buckets[b].numel; e++)
				zc_param_buffer(c, b)[e] = 1.0f;
		hand->h = h;
		__atomic_store_n(&hand->ready, 1, __ATOMIC_RELEASE);
	}
	if (r == 0)
		r = zc_register_plan(c);
	EXPECT(r == 0, "zc_register_plan: %s: %s", zc_strerror_name(r), zc_error_message());
	if (r == 0 && idx == 0) {
		int n = maps_lines(daemon_.pid, "memfd:zerod-shared-params");
		EXPECT(n == 1, "zerod maps the shared parameter memfd %d times", n);
	}
	for (int it = 0; it < 3 && r == 0; it++) {
		for (uint32_t b = 0; b < 2; b++)
			for (uint64_t e = 0; e < buckets[b].numel; e++)
				zc_grad_buffer(c, b)[e] = idx == 0 ? 0.125f : 0.375f;
		r = step_buckets(c, 2, it);
	}
	for (uint32_t b = 0; b < 2 && r == 0 && !child_bad; b++)
		for (uint64_t e = 0; e < buckets[b].numel && !child_bad; e++)
			EXPECT(zc_param_buffer(c, b)[e] == 0.625f,
			       "rank %d: bucket %u[%llu] = %a, want 0.625", idx, b,
			       (unsigned long long)e, zc_param_buffer(c, b)[e]);
	zc_close(c);
	return child_bad;
}

static void t_alloc_shared(void)
{
	struct job_spec js;
	pid_t pid[2];

	spec_init(&js, "alloc-shared", ZC_OPT_SGD, ZC_SHARD_SLICE, ZC_STEP_INTERLEAVED);
	js.group.lr = 0.5;
	memset(hand, 0, sizeof(*hand));
	for (int i = 0; i < 2; i++)
		pid[i] = spawn(alloc_shared_rank, &js, i);
	for (int i = 0; i < 2; i++)
		CHECK(wait_child(pid[i], 30000) == 0, "rank %d", i);
}

/*
 * A re-plan that keeps sharing: two SGD steps on a shared buffer, then a
 * re-plan into one bucket holding both segments with
 * zc_alloc_buffers_shared() (rank 0 creates the new buffer and copies the
 * parameters in by the new layout, rank 1 opens it from rank 0's new
 * handle), and two more steps. Element e starts at 1 + e/1024 and each
 * step takes 0.125 off exactly, so every element must end at
 * 0.5 + e/1024 where the new layout puts it, on both ranks, in the one new
 * buffer, which zerod maps once (the old one no longer).
 */
static const struct zc_segment one_segs[2] = {SEG(0, N0, 0), SEG(N0, N1, 0)};
static const struct zc_bucket one_bucket[1] = {BUCKET(NUMEL, 2, one_segs)};

static int wait_flag(int *flag)
{
	for (int i = 0; i < test_timeout(30000) && !__atomic_load_n(flag, __ATOMIC_ACQUIRE); i++)
		usleep(1000);
	return __atomic_load_n(flag, __ATOMIC_ACQUIRE) ? 0 : -1;
}

static int sgd_step(zc_client *c, int idx, int it)
{
	uint32_t nb = zc_param_buffer(c, 1) ? 2 : 1;

	for (uint32_t b = 0; b < nb; b++) {
		float *g = zc_grad_buffer(c, b);
		uint64_t n = nb == 2 ? buckets[b].numel : NUMEL;
		for (uint64_t e = 0; e < n; e++)
			g[e] = idx == 0 ? 0.125f : 0.375f;
	}
	return step_buckets(c, nb, it);
}

static int replan_shared_rank(void *arg, int idx)
{
	const struct job_spec *js = arg;
	zc_client *c = connect_c(js->job, (uint32_t)idx);
	struct zc_shared_params h = ZC_SHARED_PARAMS_INIT;
	struct zc_plan np = js->plan;
	int r = 0;

	if (!c)
		return 1;
	np.buckets = one_bucket;
	np.nbuckets = 1;
	if (idx == 1)
		r = wait_flag(&hand->ready);
	if (r == 0)
		r = zc_alloc_buffers_shared(c, &js->plan, idx ? &hand->h : NULL, &h);
	EXPECT(r == 0, "zc_alloc_buffers_shared: %s: %s", zc_strerror_name(r), zc_error_message());
	if (r == 0 && idx == 0) {
		for (size_t e = 0; e < NUMEL; e++)
			*elem(c, zc_param_buffer(c, 0), e) = 1.0f + (float)e / 1024.0f;
		hand->h = h;
		__atomic_store_n(&hand->ready, 1, __ATOMIC_RELEASE);
	}
	if (r == 0)
		r = zc_register_plan(c);
	EXPECT(r == 0, "zc_register_plan: %s: %s", zc_strerror_name(r), zc_error_message());
	for (int it = 0; it < 4 && r == 0; it++) {
		if (it == 2) {
			float *old = zc_param_buffer(c, 0);

			if (idx == 1)
				r = wait_flag(&hand->ready2);
			if (r == 0)
				r = zc_alloc_buffers_shared(c, &np, idx ? &hand->h2 : NULL, &h);
			if (r == 0 && idx == 0) {
				EXPECT(h.fd >= 0 && h.fd != hand->h.fd,
				       "the re-plan's handle is the first buffer's");
				hand->h2 = h;
				__atomic_store_n(&hand->ready2, 1, __ATOMIC_RELEASE);
			}
			if (r == 0)
				r = zc_register_plan(c);
			EXPECT(r == 0, "shared re-plan: %s: %s", zc_strerror_name(r),
			       zc_error_message());
			if (r != 0)
				break;
			EXPECT(zc_param_buffer(c, 0) != old && !zc_param_buffer(c, 1),
			       "the re-plan's buffers are not the new one-bucket plan's");
			if (idx == 0) {
				int n = maps_lines(daemon_.pid, "memfd:zerod-shared-params");
				EXPECT(n == 1, "after the re-plan zerod maps %d shared parameter "
				       "memfds", n);
			}
		}
		r = sgd_step(c, idx, it);
	}
	for (size_t e = 0; e < NUMEL && r == 0 && !child_bad; e++) {
		float want = 0.5f + (float)e / 1024.0f, got = zc_param_buffer(c, 0)[e];
		EXPECT(got == want, "rank %d: element %zu = %a, want %a", idx, e, got, want);
	}
	zc_close(c);
	return child_bad;
}

static void t_replan_keeps_sharing(void)
{
	struct job_spec js;
	pid_t pid[2];

	spec_init(&js, "replan-shared", ZC_OPT_SGD, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED);
	js.group.lr = 0.5;
	memset(hand, 0, sizeof(*hand));
	for (int i = 0; i < 2; i++)
		pid[i] = spawn(replan_shared_rank, &js, i);
	for (int i = 0; i < 2; i++)
		CHECK(wait_child(pid[i], 30000) == 0, "rank %d", i);
}

/* Handles that name no usable memfd are refused with the reason, before
 * anything reaches zerod: a pipe, an fd nobody has open, a memfd too
 * small for the plan, a wrong struct size. */
static int bad_handle_child(void *arg, int idx)
{
	zc_client *c = connect_c("bad-handle", 0);
	struct zc_shared_params h = ZC_SHARED_PARAMS_INIT, out = ZC_SHARED_PARAMS_INIT;
	struct job_spec js;
	int p[2], small, r;

	(void)arg, (void)idx;
	if (!c || pipe2(p, O_CLOEXEC) < 0)
		return 1;
	spec_init(&js, "bad-handle", ZC_OPT_SGD, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED);
	h.pid = getpid();
	h.fd = p[0];
	r = zc_alloc_buffers_shared(c, &js.plan, &h, &out);
	EXPECT(r == -EINVAL && strstr(zc_error_message(), "not a memfd"), "a pipe: %s: %s",
	       zc_strerror_name(r), zc_error_message());
	h.fd = 1000;
	r = zc_alloc_buffers_shared(c, &js.plan, &h, &out);
	EXPECT(r == -ENOENT && strstr(zc_error_message(), "/proc/"), "an fd not open: %s: %s",
	       zc_strerror_name(r), zc_error_message());
	small = make_memfd(64);
	h.fd = small;
	r = zc_alloc_buffers_shared(c, &js.plan, &h, &out);
	EXPECT(r == -EINVAL && strstr(zc_error_message(), "holds"), "a small memfd: %s: %s",
	       zc_strerror_name(r), zc_error_message());
	h.size = 8;
	r = zc_alloc_buffers_shared(c, &js.plan, &h, &out);
	EXPECT(r == -EINVAL, "size 8: %s", zc_strerror_name(r));
	EXPECT(out.fd == -1 && out.pid == 0, "*ret written on failure");
	/* the client is still free to take buffers */
	r = zc_alloc_buffers(c, &js.plan);
	EXPECT(r == 0, "zc_alloc_buffers after the refusals: %s: %s", zc_strerror_name(r),
	       zc_error_message());
	zc_close(c);
	return child_bad;
}

static void t_alloc_shared_bad_handle(void)
{
	CHECK(wait_child(spawn(bad_handle_child, NULL, 0), 30000) == 0, "child");
}

/* ---- a rank that does not share as the other does ---- */

enum mismatch { OTHER_MEMFD, OTHER_OFFSET, NOT_FLAGGED };

/* Both ranks register; whichever comes second is refused with
 * ZC_ESHAREDPARAMS (the first then learns the second left). Each rank
 * writes what it got into the shared page of the test. */
struct mismatch_out {
	int r[2];
	char msg[2][300];
};

static struct mismatch_out *mout;

static int mismatch_rank(void *arg, int idx)
{
	const struct job_spec *js = arg;
	zc_client *c = connect_c(js->job, (uint32_t)idx);
	int r;

	if (!c)
		return 1;
	r = register_rank(js, idx, c);
	EXPECT(r == 0, "zc_register_buffers: %s: %s", zc_strerror_name(r), zc_error_message());
	if (r == 0)
		r = zc_register_plan(c);
	mout->r[idx] = r;
	snprintf(mout->msg[idx], sizeof(mout->msg[idx]), "%s", zc_error_message());
	zc_close(c);
	return child_bad;
}

static void run_mismatch(enum mismatch k)
{
	static const char *const jobs[] = {"mis-memfd", "mis-offset", "mis-flag"};
	static const char *const words[] = {"another memfd", "another offset", "its own"};
	struct job_spec js;
	pid_t pid[2];
	bool named = false;

	spec_init(&js, jobs[k], ZC_OPT_ADAM, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED);
	js.grad_fd[0] = make_memfd(js.bytes);
	js.grad_fd[1] = make_memfd(js.bytes);
	js.param_fd[0] = make_memfd(js.bytes + 4096);
	js.param_fd[1] = k == OTHER_MEMFD ? make_memfd(js.bytes) : js.param_fd[0];
	js.param_offset[1] = k == OTHER_OFFSET ? 4096 : 0;
	js.shared[0] = true;
	js.shared[1] = k != NOT_FLAGGED;
	CHECK(js.grad_fd[0] >= 0 && js.grad_fd[1] >= 0 && js.param_fd[0] >= 0 &&
		      js.param_fd[1] >= 0,
	      "memfds");
	memset(mout, 0, sizeof(*mout));
	for (int i = 0; i < 2; i++)
		pid[i] = spawn(mismatch_rank, &js, i);
	for (int i = 0; i < 2; i++)
		CHECK(wait_child(pid[i], 30000) == 0, "rank %d", i);
	for (int i = 0; i < 2; i++) {
		printf("# rank %d: %s: %s\n", i, zc_strerror_name(mout->r[i]), mout->msg[i]);
		CHECK(mout->r[i] < 0, "rank %d registered a job that does not share as declared",
		      i);
		if (mout->r[i] == ZC_ESHAREDPARAMS && strstr(mout->msg[i], words[k]) &&
		    strstr(mout->msg[i], "rank 0") && strstr(mout->msg[i], "rank 1"))
			named = true;
	}
	CHECK(named, "no rank got ZC_ESHAREDPARAMS naming both ranks and \"%s\"", words[k]);
	spec_close(&js);
}

static void t_other_memfd(void)
{
	run_mismatch(OTHER_MEMFD);
}

static void t_other_offset(void)
{
	run_mismatch(OTHER_OFFSET);
}

static void t_not_flagged(void)
{
	run_mismatch(NOT_FLAGGED);
}

/* ---- flags zc_register_buffers() refuses ---- */

static int flags_child(void *arg, int idx)
{
	zc_client *c = connect_c("flags", 0);
	struct job_spec js;
	struct zc_buffers b = ZC_BUFFERS_INIT;
	int r;

	(void)arg, (void)idx;
	if (!c)
		return 1;
	spec_init(&js, "flags", ZC_OPT_SGD, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED);
	b.param_offset = (js.bytes + 4095) / 4096 * 4096;
	b.grad_fd = b.param_fd = make_memfd(b.param_offset + js.bytes);
	b.flags = 2;
	r = zc_register_buffers(c, &js.plan, &b);
	EXPECT(r == -EINVAL, "an unknown flag: %s", zc_strerror_name(r));
	b.kind = ZC_BUFFERS_CUDA;
	b.flags = ZC_BUFFERS_SHARED_PARAMS;
	b.grad_dev = b.param_dev = (void *)0x1000;
	r = zc_register_buffers(c, &js.plan, &b);
	EXPECT(r == ZC_ENOTSUP && strstr(zc_error_message(), "host buffers"),
	       "shared CUDA buffers: %s: %s", zc_strerror_name(r), zc_error_message());
	/* an older caller's struct (56 bytes) has no flags: it does not share */
	b = (struct zc_buffers)ZC_BUFFERS_INIT;
	b.size = 56;
	b.param_offset = (js.bytes + 4095) / 4096 * 4096;
	b.grad_fd = b.param_fd = make_memfd(b.param_offset + js.bytes);
	r = zc_register_buffers(c, &js.plan, &b);
	EXPECT(r == 0, "a 56-byte zc_buffers: %s: %s", zc_strerror_name(r), zc_error_message());
	zc_close(c);
	return child_bad;
}

static void t_flags_refused(void)
{
	CHECK(wait_child(spawn(flags_child, NULL, 0), 30000) == 0, "child");
}

/* ---- the background job trained through all of it ---- */

static void t_background_job_unharmed(void)
{
	bg_job_finish(bg);
	CHECK(zd_alive(&daemon_), "zerod died");
}

static void t_daemon_stops_cleanly(void)
{
	int st = zd_stop(&daemon_, 10000);

	CHECK(st == 0, "zerod exited with %d after SIGTERM", st);
}

static const struct test_case cases[] = {
	{"background_job_starts", t_background_job_starts},
	{"shared_equals_own_bucket_interleaved", t_bucket_interleaved},
	{"shared_equals_own_slice_interleaved", t_slice_interleaved},
	{"shared_equals_own_bucket_at_end", t_bucket_at_end},
	{"shared_equals_own_slice_at_end", t_slice_at_end},
	{"shared_equals_own_through_checkpoint_restore", t_checkpoint_restore},
	{"edit_between_iterations_is_the_start", t_edit_between_iterations},
	{"replan_gives_each_rank_its_own_buffers", t_replan_own_buffers},
	{"refused_restore_leaves_shared_params", t_refused_restore_shared},
	{"refused_restore_leaves_own_params", t_refused_restore_own},
	{"alloc_buffers_shared_without_passing_fds", t_alloc_shared},
	{"alloc_buffers_shared_bad_handle_refused", t_alloc_shared_bad_handle},
	{"replan_keeps_sharing_with_alloc_buffers_shared", t_replan_keeps_sharing},
	{"other_memfd_ESHAREDPARAMS", t_other_memfd},
	{"other_offset_ESHAREDPARAMS", t_other_offset},
	{"one_rank_not_flagged_ESHAREDPARAMS", t_not_flagged},
	{"flags_refused", t_flags_refused},
	{"background_job_unharmed", t_background_job_unharmed},
	{"daemon_stops_cleanly", t_daemon_stops_cleanly},
};

int main(int argc, char **argv)
{
	bg = bg_job_new();
	mout = mmap(NULL, sizeof(*mout), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	rsync = test_shared(sizeof(*rsync));
	hand = test_shared(sizeof(*hand));
	if (mout == MAP_FAILED || !rsync || !hand)
		return 1;
	return zd_test_main(&daemon_, NULL, cases, sizeof(cases) / sizeof(cases[0]), argc, argv);
}
