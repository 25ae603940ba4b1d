/*
 * test_core.c — the core (daemon/core/: job.c, sched.c, statex.c, and
 * semantics.c on the path every bucket takes) driven without the edge: a
 * real struct core with a real loop, worker pool, completion queue, memfd
 * buffers mapped by mem_shm_ops and the real host executor, but ranks that
 * are plain struct members made here, a recording sink in place of the
 * sessions and recording hooks in place of ops/. The test plays the edge
 * and daemon.c: it calls job_join, job_register_plan, sched_bucket_ready and
 * job_leave as a session would, drains the completion queue into
 * sched_on_done as on_completions does, and drops the detached ranks as the
 * edge's reap does.
 *
 * What is checked: a job's states and transitions with the answers to each
 * rank and the parameters after each step against refoptim.c's SGD; every
 * hook order error as a named code to its sender alone; a rank dying in
 * each state (forming, half registered, registering, between iterations,
 * mid-iteration) with what the others are told and the job freed with its
 * memory; the same death re-forming the job (--rejoin-timeout) and its
 * restarted ranks going on; a re-plan; a quiet end; a stall; a rejoin of an
 * ended job.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common.h"
#include "base/config.h"
#include "base/loop.h"
#include "base/pool.h"
#include "core/core-t.h"
#include "core/hooks.h"
#include "core/job.h"
#include "core/sched.h"
#include "core/sink.h"
#include "exec/completion.h"
#include "mem/mem.h"
#include "refoptim.h"
#include "testlib.h"
#include "zctest.h"

#define W        2    /* ranks, all on this node */
#define WAIT_MS  5000 /* the longest wait for a completion: then the case fails */
#define JOB_ID   "corejob"
#define MAX_RECS 1024

/* ------------------------------------------- what the core said and did --- */

enum rec_kind {
	/* the sink: answers to ranks */
	R_PLAN_OK,
	R_BUCKET_DONE,
	R_STEP_DONE,
	R_ERROR,
	R_ERROR_UNASKED,
	R_STATE_OK,
	R_CHECKPOINT_DUE,
	R_DETACH,
	R_DROP,
	R_FD_STAGING,
	R_FD_RELEASE,
	/* the hooks */
	R_HOOKS_,
	R_H_EXEC_DONE = R_HOOKS_,
	R_H_BUCKET_READY,
	R_H_BUCKET_QUEUED,
	R_H_JOB_FREE,
};

static const char *const kind_names[] = {
	[R_PLAN_OK] = "plan_ok",
	[R_BUCKET_DONE] = "bucket_done",
	[R_STEP_DONE] = "step_done",
	[R_ERROR] = "error",
	[R_ERROR_UNASKED] = "error_unasked",
	[R_STATE_OK] = "state_ok",
	[R_CHECKPOINT_DUE] = "checkpoint_due",
	[R_DETACH] = "detach",
	[R_DROP] = "drop",
	[R_FD_STAGING] = "fd_staging",
	[R_FD_RELEASE] = "fd_release",
	[R_H_EXEC_DONE] = "hook exec_done",
	[R_H_BUCKET_READY] = "hook bucket_ready",
	[R_H_BUCKET_QUEUED] = "hook bucket_queued",
	[R_H_JOB_FREE] = "hook job_free",
};

struct rec {
	enum rec_kind kind;
	uint32_t rank; /* UINT32_MAX: none (a hook about the job) */
	uint64_t iteration;
	int64_t bucket;
	int code; /* error: its code; exec_done: the event; job_free: j->err */
	bool fatal;
	uint64_t hash;         /* plan_ok */
	enum job_state state;  /* job_free: the state it was freed in */
	bool quiet_end;        /* job_free */
	enum leave_reason why; /* drop */
	char msg[384];
};

static struct {
	struct rec r[MAX_RECS];
	unsigned n;
	bool overflow;
} L;

static struct rec *rec_add(enum rec_kind kind, uint32_t rank)
{
	static struct rec spare;

	if (L.n >= MAX_RECS) {
		L.overflow = true;
		return &spare;
	}
	L.r[L.n] = (struct rec){.kind = kind, .rank = rank, .bucket = -1};
	return &L.r[L.n++];
}

static void rec_dump(unsigned from)
{
	for (unsigned i = from; i < L.n; i++) {
		const struct rec *r = &L.r[i];
		test_note("  %u: %s rank %d it %lld bucket %lld code %s%s %s", i,
			  kind_names[r->kind], r->rank == UINT32_MAX ? -1 : (int)r->rank,
			  (long long)r->iteration, (long long)r->bucket,
			  r->kind == R_ERROR ? zc_strerror_name(r->code) : "",
			  r->fatal ? " fatal" : "", r->msg);
	}
}

/* Records of kind (for rank, or any with UINT32_MAX) from index `from` on. */
static unsigned count_from(unsigned from, enum rec_kind kind, uint32_t rank)
{
	unsigned n = 0;

	for (unsigned i = from; i < L.n; i++)
		n += L.r[i].kind == kind && (rank == UINT32_MAX || L.r[i].rank == rank);
	return n;
}

static unsigned count(enum rec_kind kind, uint32_t rank)
{
	return count_from(0, kind, rank);
}

/* The sink's records (answers to ranks) from index `from` on. */
static unsigned answers_from(unsigned from)
{
	unsigned n = 0;

	for (unsigned i = from; i < L.n; i++)
		n += L.r[i].kind < R_HOOKS_;
	return n;
}

/* The first record of kind from `from` on (for rank, or any), or NULL. */
static const struct rec *find_from(unsigned from, enum rec_kind kind, uint32_t rank)
{
	for (unsigned i = from; i < L.n; i++)
		if (L.r[i].kind == kind && (rank == UINT32_MAX || L.r[i].rank == rank))
			return &L.r[i];
	return NULL;
}

/* -------------------------------------------------------------- ranks --- */

/* A rank as the edge would hold it: the core's member, its memfd buffers
 * (mapped here as the trainer maps them), and what the edge knows of it. */
struct trank {
	struct member m;
	int gfd, pfd;
	float *g, *p;
	uint64_t bytes;
	bool gone;     /* what sink.gone() says */
	bool detached; /* the core detached it: the next reap drops it */
	bool left;     /* dropped: no longer in a job */
};

static struct trank T[W];

static struct trank *trank_of(struct member *m)
{
	return (struct trank *)((char *)m - offsetof(struct trank, m));
}

/* ------------------------------------------------------ recording sink --- */

static void s_plan_ok(struct member *m, uint64_t hash, uint64_t recovered)
{
	struct rec *r = rec_add(R_PLAN_OK, m->rank);
	r->hash = hash;
	r->iteration = recovered;
}

static void s_bucket_done(struct member *m, uint64_t t, uint32_t b)
{
	struct rec *r = rec_add(R_BUCKET_DONE, m->rank);
	r->iteration = t;
	r->bucket = b;
}

static void s_step_done(struct member *m, uint64_t t)
{
	rec_add(R_STEP_DONE, m->rank)->iteration = t;
}

static void s_step_done_info(struct member *m, uint64_t t, bool found_inf, double grad_norm)
{
	(void)found_inf, (void)grad_norm;
	s_step_done(m, t);
}

static void s_error(struct member *m, int code, bool fatal, uint64_t iteration, int64_t bucket,
		    const char *msg)
{
	struct rec *r = rec_add(R_ERROR, m->rank);

	r->code = code;
	r->fatal = fatal;
	r->iteration = iteration;
	r->bucket = bucket;
	snprintf(r->msg, sizeof(r->msg), "%s", msg);
}

static void s_error_unasked(struct member *m, int code, uint64_t iteration, const char *msg)
{
	struct rec *r = rec_add(R_ERROR_UNASKED, m->rank);

	r->code = code;
	r->iteration = iteration;
	snprintf(r->msg, sizeof(r->msg), "%s", msg);
}

static void s_state_ok(struct member *m, const struct sink_ranges *rg)
{
	(void)rg;
	rec_add(R_STATE_OK, m->rank);
}

static void s_checkpoint_due(struct member *m, const char *dir, uint64_t iteration)
{
	struct rec *r = rec_add(R_CHECKPOINT_DUE, m->rank);
	r->iteration = iteration;
	snprintf(r->msg, sizeof(r->msg), "%s", dir);
}

static void s_detach(struct member *m)
{
	rec_add(R_DETACH, m->rank);
	trank_of(m)->detached = true;
}

static bool s_gone(struct member *m)
{
	return trank_of(m)->gone;
}

static int s_fd_staging(struct member *m, uint64_t serial, struct mem_desc *ret, char *err,
			size_t errlen)
{
	(void)serial, (void)ret;
	rec_add(R_FD_STAGING, m->rank);
	snprintf(err, errlen, "the test passes no staging");
	return ZC_EBUFFER;
}

static void s_fd_release(struct member *m)
{
	rec_add(R_FD_RELEASE, m->rank);
}

/* As the edge's session_drop: the rank leaves its job now (which may free
 * the job) and its session is gone. */
static void s_drop(struct member *m, enum leave_reason why)
{
	struct trank *t = trank_of(m);

	rec_add(R_DROP, m->rank)->why = why;
	if (m->job)
		job_leave(m->job, m, why);
	m->job = NULL;
	t->left = true;
}

static const struct sink_ops rec_sink = {
	.plan_ok = s_plan_ok,
	.bucket_done = s_bucket_done,
	.step_done = s_step_done,
	.step_done_info = s_step_done_info,
	.error = s_error,
	.state_ok = s_state_ok,
	.checkpoint_due = s_checkpoint_due,
	.error_unasked = s_error_unasked,
	.detach = s_detach,
	.gone = s_gone,
	.fd_staging = s_fd_staging,
	.fd_release = s_fd_release,
	.drop = s_drop,
};

/* ----------------------------------------------------- recording hooks --- */

static int hook_bad_ctx; /* hooks given another ctx than core.hooks_ctx */

static void h_exec_done(void *ctx, const struct exec_done *d)
{
	hook_bad_ctx += ctx != &L;
	struct rec *r = rec_add(R_H_EXEC_DONE, UINT32_MAX);
	r->code = (int)d->ev;
	r->iteration = d->iteration;
	r->bucket = d->bucket;
}

static void h_bucket_ready(void *ctx, struct job *j, uint32_t rank, uint64_t t, uint32_t b)
{
	(void)j;
	hook_bad_ctx += ctx != &L;
	struct rec *r = rec_add(R_H_BUCKET_READY, rank);
	r->iteration = t;
	r->bucket = b;
}

static void h_bucket_queued(void *ctx, struct job *j, uint64_t t, uint32_t b)
{
	(void)j;
	hook_bad_ctx += ctx != &L;
	struct rec *r = rec_add(R_H_BUCKET_QUEUED, UINT32_MAX);
	r->iteration = t;
	r->bucket = b;
}

static void h_job_free(void *ctx, struct job *j)
{
	hook_bad_ctx += ctx != &L;
	struct rec *r = rec_add(R_H_JOB_FREE, UINT32_MAX);
	r->state = j->state;
	r->quiet_end = j->quiet_end;
	r->code = j->err;
	snprintf(r->msg, sizeof(r->msg), "%s", j->errmsg);
}

static const struct core_hooks rec_hooks = {
	.exec_done = h_exec_done,
	.bucket_ready = h_bucket_ready,
	.bucket_queued = h_bucket_queued,
	.job_free = h_job_free,
};

/* --------------------------------------------------------- the daemon --- */

static struct daemon_config cfg_;
static struct core core_;

/* What daemon.c's daemon_setup does for the core (each case is a process
 * of its own: testlib.h). */
static int core_setup(void)
{
	int r;

	cfg_ = (struct daemon_config){
		.stall_timeout_ms = 60000,
		.join_timeout_ms = 60000,
		.hello_timeout_ms = 1000,
		.max_jobs = 4,
		.max_memory = 1ull << 30,
	};
	core_ = (struct core){.cfg = &cfg_,
			      .mem = &mem_shm_ops,
			      .sink = &rec_sink,
			      .hooks = &rec_hooks,
			      .hooks_ctx = &L};
	if ((r = pool_new(2, &core_.pool)) < 0 || (r = completion_queue_new(&core_.cq)) < 0 ||
	    (r = loop_new(&core_.loop)) < 0)
		return r;
	for (uint32_t k = 0; k < W; k++)
		T[k] = (struct trank){
			.m = {.pid = getpid(), .uid = getuid()}, .gfd = -1, .pfd = -1};
	return 0;
}

/* As daemon.c's on_completions: every completion posted by now, or within
 * ms if none is, into sched_on_done. How many were handled. */
static unsigned pump(int ms)
{
	struct pollfd pfd = {.fd = completion_queue_fd(core_.cq), .events = POLLIN};
	struct exec_done *d;
	unsigned n = 0;

	if (poll(&pfd, 1, ms < 0 ? 0 : ms) <= 0)
		return 0;
	d = completion_queue_take(core_.cq);
	while (d) {
		struct exec_done *next = d->next;
		sched_on_done(&core_, d);
		free(d);
		d = next;
		n++;
	}
	return n;
}

/* Drain completions until cond(arg) holds; false after WAIT_MS (scaled)
 * without. */
static bool pump_until(bool (*cond)(const void *), const void *arg)
{
	int64_t deadline = now_ms() + test_timeout(WAIT_MS);

	while (!cond(arg)) {
		int64_t left = deadline - now_ms();
		if (left <= 0)
			return false;
		pump((int)MIN(left, 100));
	}
	return true;
}

static bool c_active(const void *arg)
{
	const struct job *j = arg;
	return j->state == JOB_ACTIVE;
}

static bool c_no_jobs(const void *arg)
{
	(void)arg;
	return core_.njobs == 0;
}

/* the job (core_'s only one) is active on plan arg */
static bool c_on_plan(const void *arg)
{
	const struct plan *p = arg;
	const struct job *j = core_.jobs;

	return j && j->state == JOB_ACTIVE && j->plan && j->plan->hash == p->hash;
}

static bool c_exec_stopped(const void *arg)
{
	const struct job *j = arg;
	return !j->exec_running;
}

/* every rank still in the job has StepDone(*t) */
static bool c_stepped(const void *arg)
{
	uint64_t t = *(const uint64_t *)arg;

	for (uint32_t k = 0; k < W; k++) {
		bool seen = false;
		if (T[k].left || T[k].detached)
			continue;
		for (unsigned i = 0; i < L.n && !seen; i++)
			seen = L.r[i].kind == R_STEP_DONE && L.r[i].rank == k &&
			       L.r[i].iteration == t;
		if (!seen)
			return false;
	}
	return true;
}

/* As the edge's reap: a detached rank's session ends. */
static void reap(void)
{
	for (uint32_t k = 0; k < W; k++)
		if (T[k].detached && !T[k].left)
			s_drop(&T[k].m, LEAVE_GOODBYE);
}

/* Every rank still here leaves (reason why), then the executor stops: the
 * job must be freed with everything it held. */
static void end_all(enum leave_reason why)
{
	for (uint32_t k = 0; k < W; k++)
		if (!T[k].left && T[k].m.job)
			s_drop(&T[k].m, why);
	CHECK(pump_until(c_no_jobs, NULL), "the job was not freed once its ranks left (%u jobs)",
	      core_.njobs);
	CHECK(core_.memory_used == 0, "memory_used %llu after the last job",
	      (unsigned long long)core_.memory_used);
	CHECK(count(R_H_JOB_FREE, UINT32_MAX) == 1, "job_free hook %u times",
	      count(R_H_JOB_FREE, UINT32_MAX));
	CHECK(hook_bad_ctx == 0, "%d hooks got another ctx than core.hooks_ctx", hook_bad_ctx);
	CHECK(!L.overflow, "more than %u records", MAX_RECS);
}

static bool c_executors_idle(const void *arg)
{
	(void)arg;
	for (const struct job *j = core_.jobs; j; j = j->next)
		if (j->exec_running)
			return false;
	return true;
}

static void core_teardown(void)
{
	/* a case that failed may leave a job: as daemon.c's shutdown, its
	 * executor is stopped before the job is freed */
	for (struct job *j = core_.jobs; j; j = j->next)
		job_fail(j, ZC_ESHUTDOWN, true, "the test ends");
	if (!pump_until(c_executors_idle, NULL)) {
		CHECK(false, "an executor did not stop: its job and the core are left");
		return;
	}
	job_free_all(&core_);
	for (uint32_t k = 0; k < W; k++) {
		if (T[k].g)
			munmap(T[k].g, T[k].bytes);
		if (T[k].p)
			munmap(T[k].p, T[k].bytes);
		if (T[k].gfd >= 0)
			close(T[k].gfd);
		if (T[k].pfd >= 0)
			close(T[k].pfd);
	}
	pool_free(core_.pool);
	completion_queue_free(core_.cq);
	loop_free(core_.loop);
}

/* ---------------------------------------------------------- the plans --- */

/* Three buckets of 5, 20 and 3 elements, one segment each (group 0), or
 * (merged) the same segments in two buckets: {5, 20} and {3}, which is a
 * re-plan of the first. SGD, lr 0.25, with the given momentum. */
static struct plan *make_plan(bool merged, double momentum)
{
	struct zc_param_group g[1] = {{GROUP_SIZE, .lr = 0.25, .momentum = momentum}};
	struct zc_segment s3[3][1] = {{SEG(0, 5, 0)}, {SEG(0, 20, 0)}, {SEG(0, 3, 0)}};
	struct zc_segment s2a[2] = {SEG(0, 5, 0), SEG(5, 20, 0)}, s2b[1] = {SEG(0, 3, 0)};
	struct zc_bucket b3[3] = {BUCKET(5, 1, s3[0]), BUCKET(20, 1, s3[1]), BUCKET(3, 1, s3[2])};
	struct zc_bucket b2[2] = {BUCKET(25, 2, s2a), BUCKET(3, 1, s2b)};
	struct zc_plan zp = merged ? (struct zc_plan)PLAN(ZC_OPT_SGD, ZC_SHARD_BUCKET,
							  ZC_STEP_INTERLEAVED, 1, g, 2, b2)
				   : (struct zc_plan)PLAN(ZC_OPT_SGD, ZC_SHARD_BUCKET,
							  ZC_STEP_INTERLEAVED, 1, g, 3, b3);
	struct plan *p = NULL;
	char err[200];

	if (plan_from_zc(&zp, &p, err, sizeof(err)) < 0)
		test_note("plan_from_zc: %s", err);
	return p;
}

#define NPARAMS 28 /* 5 + 20 + 3 */

/* Parameter i (0..NPARAMS-1, in segment order) in a buffer of plan p. */
static float *param_at(const struct plan *p, float *buf, unsigned i)
{
	for (uint32_t b = 0; b < p->nbuckets; b++)
		for (uint32_t s = 0; s < p->buckets[b].nsegments; s++) {
			const struct zc_segment *sg = &p->buckets[b].segments[s];
			if (i < sg->numel)
				return &buf[p->buckets[b].base + sg->offset + i];
			i -= (unsigned)sg->numel;
		}
	return NULL;
}

/* The gradient rank r hands over for parameter i at iteration t: values
 * that sum and halve exactly. */
static float grad_value(uint32_t r, uint64_t t, unsigned i)
{
	return 0.125f * (float)((r + 1) * (i % 5 + 1)) - 0.5f * (float)t;
}

static float init_value(unsigned i)
{
	return 0.5f * (float)(i % 9) - 1.0f;
}

/* A sealed memfd of `bytes`, mapped; -1 on failure. */
static int memfd_buffer(const char *name, uint64_t bytes, float **ret)
{
	int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	void *m;

	if (fd < 0)
		return -1;
	if (ftruncate(fd, (off_t)bytes) < 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) < 0 ||
	    (m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
		close(fd);
		return -1;
	}
	*ret = m;
	return fd;
}

/* Rank k's buffers for plan p (new ones: a re-plan's are others), its
 * parameters from vals (NPARAMS), or 99s as a rank whose parameters must
 * be overwritten by rank 0's at the start. */
static int make_buffers(uint32_t k, const struct plan *p, const float *vals)
{
	struct trank *t = &T[k];

	if (t->g)
		munmap(t->g, t->bytes);
	if (t->p)
		munmap(t->p, t->bytes);
	if (t->gfd >= 0)
		close(t->gfd);
	if (t->pfd >= 0)
		close(t->pfd);
	t->g = t->p = NULL;
	t->bytes = plan_buffer_bytes(p);
	t->gfd = memfd_buffer("grad", t->bytes, &t->g);
	t->pfd = memfd_buffer("param", t->bytes, &t->p);
	if (t->gfd < 0 || t->pfd < 0)
		return -1;
	for (unsigned i = 0; i < NPARAMS; i++)
		*param_at(p, t->p, i) = vals ? vals[i] : 99.0f;
	return 0;
}

/* ------------------------------------------------------- the edge's part --- */

static int join(uint32_t k, char *err, size_t len)
{
	struct join_req h = {
		.job_id = JOB_ID, .rank = k, .world = W, .local_rank = k, .local_size = W};

	T[k].left = T[k].detached = false;
	T[k].m.rank = k; /* as session.c's on_hello */
	return job_join(&core_, &T[k].m, &h, err, len);
}

/* As session.c's on_register_plan: a fresh plan (the core takes it) and the
 * rank's memfds. */
static void register_plan(uint32_t k, bool merged, double momentum)
{
	struct plan *p = make_plan(merged, momentum);
	struct mem_desc gd = {
		.kind = MEM_FD, .fd = T[k].gfd, .bytes = T[k].bytes, .owner = getuid()};
	struct mem_desc pd = gd;

	pd.fd = T[k].pfd;
	job_register_plan(T[k].m.job, &T[k].m, p, &gd, &pd);
}

static void bucket_ready(uint32_t k, uint64_t t, uint32_t b)
{
	sched_bucket_ready(T[k].m.job, &T[k].m, t, b, NULL, 0);
}

/* ------------------------------------------------ the reference trainer --- */

/* What the parameters must be: refoptim.c's SGD on the averaged gradient. */
struct ref {
	float p[NPARAMS], m[NPARAMS];
	struct zc_param_group h;
	unsigned steps; /* since the state was new */
};

static void ref_init(struct ref *rf, double momentum)
{
	memset(rf, 0, sizeof(*rf));
	for (unsigned i = 0; i < NPARAMS; i++)
		rf->p[i] = init_value(i);
	rf->h = (struct zc_param_group){GROUP_SIZE, .lr = 0.25, .momentum = momentum};
}

static void ref_step(struct ref *rf, uint64_t t)
{
	float g[NPARAMS];

	for (unsigned i = 0; i < NPARAMS; i++)
		g[i] = (grad_value(0, t, i) + grad_value(1, t, i)) / (float)W;
	ref_sgd(&rf->h, rf->p, g, rf->m, rf->steps == 0, NPARAMS);
	rf->steps++;
}

/* Every rank's parameters equal the reference's, bit for bit. */
static void check_params(const struct plan *p, const struct ref *rf, const char *when)
{
	for (uint32_t k = 0; k < W; k++) {
		unsigned bad = 0, first = 0;
		for (unsigned i = 0; i < NPARAMS; i++)
			if (memcmp(param_at(p, T[k].p, i), &rf->p[i], sizeof(float)) != 0 && !bad++)
				first = i;
		CHECK(bad == 0, "%s: rank %u: %u parameters differ, first %u: %g, expected %g",
		      when, k, bad, first, (double)*param_at(p, T[k].p, first),
		      (double)rf->p[first]);
	}
}

/* Each rank's gradients of iteration t into its buffer. */
static void write_grads(const struct plan *p, uint64_t t)
{
	for (uint32_t k = 0; k < W; k++)
		for (unsigned i = 0; i < NPARAMS; i++)
			*param_at(p, T[k].g, i) = grad_value(k, t, i);
}

/* One iteration t of both ranks over plan p (the job's): every bucket
 * handed over, bucket-major (b0 r0, b0 r1, ...) or rank-major (r0's all,
 * then r1's). Checks every answer and hook it caused, in order, and the
 * parameters against rf. */
static void iterate(struct job *j, const struct plan *p, uint64_t t, bool rank_major,
		    struct ref *rf)
{
	unsigned mark = L.n, at, nb = p->nbuckets;
	uint32_t want[W] = {0};
	unsigned steps[W] = {0}, queued = 0, ready = 0;
	char when[64];

	snprintf(when, sizeof(when), "iteration %llu", (unsigned long long)t);
	write_grads(p, t);
	if (rank_major) {
		for (uint32_t k = 0; k < W; k++)
			for (uint32_t b = 0; b < nb; b++)
				bucket_ready(k, t, b);
	} else {
		for (uint32_t b = 0; b < nb; b++)
			for (uint32_t k = 0; k < W; k++)
				bucket_ready(k, t, b);
	}
	REQUIRE(pump_until(c_stepped, &t), "%s: no StepDone for every rank", when);
	pump(0);
	ref_step(rf, t);
	/* the hooks: bucket_ready in the order handed over, bucket_queued(b)
	 * right after the last rank's bucket_ready(b) */
	for (at = mark; at < L.n; at++) {
		const struct rec *r = &L.r[at];
		if (r->kind == R_H_BUCKET_READY) {
			uint32_t k = rank_major ? ready / nb : ready % W;
			uint32_t b = rank_major ? ready % nb : ready / W;
			CHECK(r->rank == k && r->bucket == b && r->iteration == t,
			      "%s: hook bucket_ready %u is rank %u bucket %lld, expected rank %u "
			      "bucket %u",
			      when, ready, r->rank, (long long)r->bucket, k, b);
			ready++;
		} else if (r->kind == R_H_BUCKET_QUEUED) {
			const struct rec *prev = &L.r[at - 1];
			CHECK(r->bucket == queued && r->iteration == t,
			      "%s: bucket_queued %lld, expected %u", when, (long long)r->bucket,
			      queued);
			CHECK(prev->kind == R_H_BUCKET_READY && prev->rank == W - 1 &&
				      prev->bucket == r->bucket,
			      "%s: bucket %lld queued before rank %u handed it over", when,
			      (long long)r->bucket, W - 1);
			queued++;
		} else if (r->kind == R_BUCKET_DONE) {
			CHECK(r->iteration == t && r->bucket == want[r->rank] && !steps[r->rank],
			      "%s: rank %u: BucketDone(%llu, %lld), expected (%llu, %u)%s", when,
			      r->rank, (unsigned long long)r->iteration, (long long)r->bucket,
			      (unsigned long long)t, want[r->rank],
			      steps[r->rank] ? " after StepDone" : "");
			want[r->rank]++;
		} else if (r->kind == R_STEP_DONE) {
			CHECK(r->iteration == t && want[r->rank] == nb,
			      "%s: rank %u: StepDone(%llu) after %u BucketDones", when, r->rank,
			      (unsigned long long)r->iteration, want[r->rank]);
			steps[r->rank]++;
		} else if (r->kind < R_HOOKS_) {
			CHECK(false, "%s: unexpected %s to rank %u: %s", when, kind_names[r->kind],
			      r->rank, r->msg);
		}
	}
	CHECK(ready == W * nb && queued == nb, "%s: %u bucket_ready and %u bucket_queued hooks",
	      when, ready, queued);
	for (uint32_t k = 0; k < W; k++)
		CHECK(want[k] == nb && steps[k] == 1, "%s: rank %u: %u BucketDones, %u StepDones",
		      when, k, want[k], steps[k]);
	CHECK(j->iter == t + 1 && !j->in_flight && j->state == JOB_ACTIVE,
	      "%s: the job is at iteration %llu, in flight %d, %s", when,
	      (unsigned long long)j->iter, j->in_flight, job_state_name(j->state));
	check_params(p, rf, when);
	if (test_failed_)
		rec_dump(mark);
}

/* Both ranks joined, registered plan (merged, momentum) and the job ACTIVE;
 * the job, or NULL (the case failed). */
static struct job *start_job(bool merged, double momentum, struct ref *rf)
{
	struct plan *p = make_plan(merged, momentum);
	float init[NPARAMS];
	char err[256];
	struct job *j;

	ref_init(rf, momentum);
	for (unsigned i = 0; i < NPARAMS; i++)
		init[i] = init_value(i);
	CHECK(p != NULL, "plan");
	for (uint32_t k = 0; k < W && p; k++)
		CHECK(make_buffers(k, p, k == 0 ? init : NULL) == 0, "rank %u: memfds", k);
	plan_free(p);
	for (uint32_t k = 0; k < W && !test_failed_; k++)
		CHECK(join(k, err, sizeof(err)) == 0, "rank %u joins: %s", k, err);
	if (test_failed_)
		return NULL;
	j = T[0].m.job;
	for (uint32_t k = 0; k < W; k++)
		register_plan(k, merged, momentum);
	if (!pump_until(c_active, j)) {
		CHECK(false, "the job is %s, not active", job_state_name(j->state));
		rec_dump(0);
		return NULL;
	}
	return j;
}

/* ============================================================ the cases === */

/* FORMING -> REGISTERING -> ACTIVE, plan_ok once to each rank with the
 * plan's hash, rank 0's parameters on every rank, two iterations checked
 * (both hand-over orders, SGD with momentum: the state lives on), and the
 * job freed at the end. */
static void t_states_and_iterations(void)
{
	struct plan *p = make_plan(false, 0.5);
	float init[NPARAMS];
	struct ref rf;
	char err[256];
	struct job *j;
	unsigned mark;

	REQUIRE(core_setup() == 0, "core setup");
	REQUIRE(p, "plan");
	ref_init(&rf, 0.5);
	for (unsigned i = 0; i < NPARAMS; i++)
		init[i] = init_value(i);
	for (uint32_t k = 0; k < W; k++)
		REQUIRE(make_buffers(k, p, k == 0 ? init : NULL) == 0, "rank %u: memfds", k);

	/* a member whose rank the edge left unset: job_join sets it (core-t.h) */
	T[1].m.rank = 0;
	REQUIRE(job_join(&core_, &T[1].m,
			 &(struct join_req){.job_id = JOB_ID,
					    .rank = 1,
					    .world = W,
					    .local_rank = 1,
					    .local_size = W},
			 err, sizeof(err)) == 0,
		"rank 1 joins: %s", err);
	j = T[1].m.job;
	REQUIRE(j && core_.njobs == 1 && j->state == JOB_FORMING && j->nconnected == 1,
		"after one Hello: a job forming (%u jobs)", core_.njobs);
	CHECK(T[1].m.rank == 1 && j->ranks[1] == &T[1].m, "job_join set the member's rank (%u)",
	      T[1].m.rank);
	/* rank 1 again: refused, nothing changes */
	{
		struct trank dup = {.m = {.pid = getpid(), .uid = getuid(), .rank = 1}};
		struct join_req h = {
			.job_id = JOB_ID, .rank = 1, .world = W, .local_rank = 1, .local_size = W};
		CHECK(job_join(&core_, &dup.m, &h, err, sizeof(err)) == ZC_EDUPRANK && !dup.m.job &&
			      j->nconnected == 1 && j->ranks[1] == &T[1].m,
		      "a second rank 1 is ZC_EDUPRANK and joins nothing");
	}
	/* a bucket before the plan is registered: ZC_ESTATE, not fatal */
	mark = L.n;
	bucket_ready(1, 0, 0);
	CHECK(answers_from(mark) == 1 && find_from(mark, R_ERROR, 1) &&
		      find_from(mark, R_ERROR, 1)->code == ZC_ESTATE &&
		      !find_from(mark, R_ERROR, 1)->fatal,
	      "a bucket while forming: one ZC_ESTATE to its rank");
	REQUIRE(join(0, err, sizeof(err)) == 0 && T[0].m.job == j, "rank 0 joins: %s", err);
	CHECK(j->state == JOB_FORMING && j->nconnected == W, "all joined: still forming (%s)",
	      job_state_name(j->state));

	register_plan(0, false, 0.5);
	CHECK(j->state == JOB_FORMING && j->nregistered == 1 && !j->exec,
	      "one plan of two: still forming, no executor");
	register_plan(1, false, 0.5);
	CHECK(j->state == JOB_REGISTERING && j->exec && j->exec_running && core_.memory_used > 0 &&
		      core_.memory_used == j->memory,
	      "every plan: registering, the executor started, its state charged (%s, %llu)",
	      job_state_name(j->state), (unsigned long long)core_.memory_used);
	CHECK(count(R_PLAN_OK, UINT32_MAX) == 0, "no PlanOk before the executor started");
	/* a second plan from a registered rank while registering */
	mark = L.n;
	register_plan(0, false, 0.5);
	CHECK(answers_from(mark) == 1 && find_from(mark, R_ERROR, 0) &&
		      find_from(mark, R_ERROR, 0)->code == ZC_ENOTSUP &&
		      j->state == JOB_REGISTERING,
	      "a second plan while registering: ZC_ENOTSUP to that rank");
	REQUIRE(pump_until(c_active, j), "the job is %s, not active", job_state_name(j->state));
	for (uint32_t k = 0; k < W; k++) {
		const struct rec *ok = find_from(0, R_PLAN_OK, k);
		CHECK(count(R_PLAN_OK, k) == 1 && ok && ok->hash == p->hash,
		      "rank %u: PlanOk once with the plan's hash (%u times)", k,
		      count(R_PLAN_OK, k));
	}
	for (unsigned i = 0; i < NPARAMS; i++)
		CHECK(*param_at(p, T[1].p, i) == init_value(i),
		      "rank 1's parameter %u is %g: not rank 0's %g", i,
		      (double)*param_at(p, T[1].p, i), (double)init_value(i));

	iterate(j, p, 0, false, &rf);
	iterate(j, p, 1, true, &rf);
	CHECK(core_.stats.iterations == 2 && core_.stats.buckets == 2 * p->nbuckets &&
		      j->iterations_done == 2,
	      "stats: %llu iterations, %llu buckets", (unsigned long long)core_.stats.iterations,
	      (unsigned long long)core_.stats.buckets);
	CHECK(count(R_ERROR, UINT32_MAX) == 2, "no error but the two asked for");
	end_all(LEAVE_GOODBYE);
	plan_free(p);
	core_teardown();
}

/* Each hook order error is a named code to its sender, not fatal, and
 * changes nothing: the iteration then completes with the right values. */
static void t_hook_order_errors(void)
{
	static const struct {
		const char *what;
		uint32_t rank;
		uint64_t t;
		uint32_t b;
		int code;
	} bad0[] =
		{
			{"bucket out of range", 0, 0, 3, ZC_EBUCKET},
			{"bucket far out of range", 1, 0, UINT32_MAX, ZC_EBUCKET},
			{"bucket 1 before 0", 0, 0, 1, ZC_EORDER},
		},
	  bad1[] =
		  {
			  {"bucket 0 twice", 0, 0, 0, ZC_EDUPBUCKET},
			  {"bucket 2 before 1", 0, 0, 2, ZC_EORDER},
			  {"next iteration's bucket early", 0, 1, 0, ZC_EEARLY},
			  {"next iteration's bucket early, other rank", 1, 1, 0, ZC_EEARLY},
		  },
	  bad2[] = {
		  {"an old iteration's bucket", 0, 0, 0, ZC_EDUPBUCKET},
		  {"an old iteration's last bucket", 1, 0, 2, ZC_EDUPBUCKET},
	  };
	struct plan *p = make_plan(false, 0);
	struct ref rf;
	struct job *j;

	REQUIRE(core_setup() == 0, "core setup");
	REQUIRE(p, "plan");
	j = start_job(false, 0, &rf);
	REQUIRE(j, "job");

#define TRY(list)                                                                                  \
	for (size_t i = 0; i < ARRAY_SIZE(list); i++) {                                            \
		unsigned mark = L.n;                                                               \
		uint32_t nb0 = j->next_bucket[0], nb1 = j->next_bucket[1];                         \
		uint64_t it = j->iter;                                                             \
		bucket_ready(list[i].rank, list[i].t, list[i].b);                                  \
		const struct rec *e = find_from(mark, R_ERROR, list[i].rank);                      \
		CHECK(L.n == mark + 1 && e && e->code == list[i].code && !e->fatal &&              \
			      e->iteration == list[i].t && e->bucket == (int64_t)list[i].b,        \
		      "%s: one %s to rank %u, got %s", list[i].what,                               \
		      zc_strerror_name(list[i].code), list[i].rank,                                \
		      e ? zc_strerror_name(e->code) : "nothing");                                  \
		CHECK(j->next_bucket[0] == nb0 && j->next_bucket[1] == nb1 && j->iter == it &&     \
			      j->state == JOB_ACTIVE,                                              \
		      "%s changed the job", list[i].what);                                         \
		if (test_failed_)                                                                  \
			rec_dump(mark);                                                            \
	}

	TRY(bad0);
	/* rank 0's bucket 0 goes in alone: no BucketDone until rank 1's */
	write_grads(p, 0);
	bucket_ready(0, 0, 0);
	CHECK(j->in_flight && j->next_bucket[0] == 1 && j->arrived[0] == 1,
	      "rank 0's bucket 0 taken");
	TRY(bad1);
	for (uint32_t b = 1; b < p->nbuckets; b++)
		bucket_ready(0, 0, b);
	for (uint32_t b = 0; b < p->nbuckets; b++)
		bucket_ready(1, 0, b);
	{
		uint64_t t = 0;
		REQUIRE(pump_until(c_stepped, &t), "iteration 0 completes");
	}
	pump(0);
	ref_step(&rf, 0);
	check_params(p, &rf, "iteration 0 after the refused buckets");
	for (uint32_t k = 0; k < W; k++)
		CHECK(count(R_BUCKET_DONE, k) == p->nbuckets && count(R_STEP_DONE, k) == 1,
		      "rank %u: %u BucketDones, %u StepDones", k, count(R_BUCKET_DONE, k),
		      count(R_STEP_DONE, k));
	TRY(bad2);
#undef TRY
	iterate(j, p, 1, false, &rf);
	CHECK(count(R_ERROR, UINT32_MAX) == ARRAY_SIZE(bad0) + ARRAY_SIZE(bad1) + ARRAY_SIZE(bad2),
	      "no other error (%u)", count(R_ERROR, UINT32_MAX));
	CHECK(count(R_DETACH, UINT32_MAX) == 0, "nobody detached");
	end_all(LEAVE_GOODBYE);
	CHECK(core_.stats.jobs_failed == 0, "refused buckets fail no job");
	plan_free(p);
	core_teardown();
}

/* The job's end as job_free saw it. */
static void check_freed_as(bool quiet, int code, const char *words)
{
	const struct rec *f = find_from(0, R_H_JOB_FREE, UINT32_MAX);

	CHECK(f && f->quiet_end == quiet && f->code == code && (!words || strstr(f->msg, words)),
	      "the job ended %s %s (\"%s\"), expected %s %s with \"%s\"",
	      f ? f->quiet_end ? "quietly" : "failed" : "never", f ? zc_strerror_name(f->code) : "",
	      f ? f->msg : "", quiet ? "quietly" : "failed", zc_strerror_name(code),
	      words ? words : "");
	CHECK(core_.stats.jobs_failed == !quiet, "stats: %llu jobs failed",
	      (unsigned long long)core_.stats.jobs_failed);
}

/* A lone rank dies while forming (through the sink's drop, as the edge's
 * pidfd would): nothing waits, the job is freed at once. */
static void t_dies_forming_alone(void)
{
	char err[256];

	REQUIRE(core_setup() == 0, "core setup");
	REQUIRE(join(0, err, sizeof(err)) == 0, "rank 0 joins: %s", err);
	core_.sink->drop(&T[0].m, LEAVE_EXITED);
	CHECK(core_.njobs == 0 && core_.jobs == NULL, "the job is freed at once (%u jobs)",
	      core_.njobs);
	CHECK(answers_from(0) == 1 && count(R_DROP, 0) == 1, "nothing told to anyone");
	check_freed_as(false, ZC_ERANKDEAD, "exited before the job started");
	end_all(LEAVE_GOODBYE);
	core_teardown();
}

/* Both joined, none registered; rank 1 dies: rank 0 hears ZC_ERANKDEAD
 * (fatal) and is detached; a new Hello for the id while rank 0 is still
 * there is ZC_EJOBFAILED; once rank 0 goes, the job is freed. */
static void t_dies_forming(void)
{
	struct trank late = {.m = {.pid = getpid(), .uid = getuid()}};
	struct join_req h = {
		.job_id = JOB_ID, .rank = 1, .world = W, .local_rank = 1, .local_size = W};
	const struct rec *e;
	char err[256];
	struct job *j;

	REQUIRE(core_setup() == 0, "core setup");
	REQUIRE(join(0, err, sizeof(err)) == 0 && join(1, err, sizeof(err)) == 0, "join: %s", err);
	j = T[0].m.job;
	core_.sink->drop(&T[1].m, LEAVE_EXITED);
	e = find_from(0, R_ERROR, 0);
	CHECK(e && e->code == ZC_ERANKDEAD && e->fatal && strstr(e->msg, "rank 1") &&
		      count(R_DETACH, 0) == 1,
	      "rank 0: a fatal ZC_ERANKDEAD naming rank 1, then detached");
	CHECK(core_.njobs == 1 && j->state == JOB_FAILED && j->nconnected == 1,
	      "the job waits for rank 0 to leave (%s)", job_state_name(j->state));
	CHECK(job_join(&core_, &late.m, &h, err, sizeof(err)) == ZC_EJOBFAILED && !late.m.job,
	      "a Hello for the failed job while a rank is still there: ZC_EJOBFAILED");
	reap();
	CHECK(core_.njobs == 0, "freed once rank 0 left");
	check_freed_as(false, ZC_ERANKDEAD, "exited before the job started");
	end_all(LEAVE_GOODBYE);
	core_teardown();
}

/* Rank 0 registered, rank 1 not yet; rank 0 dies: rank 1 hears why, and
 * that the job waited for it. */
static void t_dies_half_registered(void)
{
	struct plan *p = make_plan(false, 0);
	const struct rec *e;
	char err[256];

	REQUIRE(core_setup() == 0, "core setup");
	REQUIRE(p, "plan");
	for (uint32_t k = 0; k < W; k++)
		REQUIRE(make_buffers(k, p, NULL) == 0, "memfds");
	REQUIRE(join(0, err, sizeof(err)) == 0 && join(1, err, sizeof(err)) == 0, "join: %s", err);
	register_plan(0, false, 0);
	REQUIRE(T[0].m.job->nregistered == 1, "rank 0 registered");
	job_leave(T[0].m.job, &T[0].m, LEAVE_EXITED);
	T[0].m.job = NULL;
	T[0].left = true;
	e = find_from(0, R_ERROR, 1);
	CHECK(e && e->code == ZC_ERANKDEAD && e->fatal && strstr(e->msg, "rank 0") &&
		      strstr(e->msg, "waited for rank 1"),
	      "rank 1: a fatal ZC_ERANKDEAD naming rank 0 and who the job waited for: \"%s\"",
	      e ? e->msg : "");
	CHECK(count(R_ERROR, 0) == 0 && count(R_PLAN_OK, UINT32_MAX) == 0,
	      "nothing to the rank that left, no PlanOk");
	reap();
	CHECK(core_.njobs == 0, "freed once rank 1 left");
	check_freed_as(false, ZC_ERANKDEAD, NULL);
	end_all(LEAVE_GOODBYE);
	plan_free(p);
	core_teardown();
}

/* Every plan registered, the executor starting (REGISTERING); rank 1 dies:
 * rank 0 hears it, never PlanOk; the executor's EXEC_STARTED changes
 * nothing; its state's memory is given back when it stops. */
static void t_dies_registering(void)
{
	struct plan *p = make_plan(false, 0.5); /* momentum: state to charge */
	const struct rec *e;
	char err[256];
	struct job *j;

	REQUIRE(core_setup() == 0, "core setup");
	REQUIRE(p, "plan");
	for (uint32_t k = 0; k < W; k++)
		REQUIRE(make_buffers(k, p, NULL) == 0, "memfds");
	REQUIRE(join(0, err, sizeof(err)) == 0 && join(1, err, sizeof(err)) == 0, "join: %s", err);
	j = T[0].m.job;
	register_plan(0, false, 0.5);
	register_plan(1, false, 0.5);
	REQUIRE(j->state == JOB_REGISTERING && core_.memory_used > 0, "registering");
	core_.sink->drop(&T[1].m, LEAVE_EXITED);
	e = find_from(0, R_ERROR, 0);
	CHECK(e && e->code == ZC_ERANKDEAD && e->fatal && count(R_DETACH, 0) == 1,
	      "rank 0: a fatal ZC_ERANKDEAD, detached");
	CHECK(pump_until(c_exec_stopped, j), "the executor stops");
	CHECK(count(R_PLAN_OK, UINT32_MAX) == 0 && core_.memory_used == 0 && core_.njobs == 1,
	      "no PlanOk after the failure; its state given back (%llu) while rank 0 is here",
	      (unsigned long long)core_.memory_used);
	reap();
	CHECK(core_.njobs == 0, "freed once rank 0 left");
	check_freed_as(false, ZC_ERANKDEAD, NULL);
	end_all(LEAVE_GOODBYE);
	plan_free(p);
	core_teardown();
}

/* ACTIVE, between iterations, rank 1 exits: a quiet end, nobody told;
 * rank 0 asking for more (its next bucket) is then told ZC_EJOBFAILED and
 * the end becomes the job's failure (job_went_on). */
static void t_dies_between_iterations(void)
{
	struct plan *p = make_plan(false, 0);
	struct ref rf;
	const struct rec *e;
	struct job *j;
	unsigned mark;

	REQUIRE(core_setup() == 0, "core setup");
	REQUIRE(p, "plan");
	j = start_job(false, 0, &rf);
	REQUIRE(j, "job");
	iterate(j, p, 0, false, &rf);
	mark = L.n;
	core_.sink->drop(&T[1].m, LEAVE_EXITED);
	CHECK(j->state == JOB_FAILED && j->quiet_end && j->err == ZC_ERANKDEAD,
	      "a quiet end (%s, quiet %d)", job_state_name(j->state), j->quiet_end);
	CHECK(answers_from(mark) == 1 && count_from(mark, R_DROP, 1) == 1,
	      "nobody is told anything yet");
	mark = L.n;
	bucket_ready(0, 1, 0);
	e = find_from(mark, R_ERROR, 0);
	CHECK(e && e->code == ZC_EJOBFAILED && e->fatal && e->iteration == 1 && e->bucket == 0 &&
		      strstr(e->msg, "rank 1") && answers_from(mark) == 1,
	      "rank 0's next bucket: one fatal ZC_EJOBFAILED naming rank 1");
	CHECK(!j->quiet_end, "going on made the end a failure");
	CHECK(pump_until(c_exec_stopped, j), "the executor stops");
	end_all(LEAVE_GOODBYE);
	check_freed_as(false, ZC_ERANKDEAD, "exited between iterations");
	plan_free(p);
	core_teardown();
}

/* ACTIVE, mid-iteration (buckets in flight, one queued on the executor):
 * rank 1 dies; rank 0 hears a fatal ZC_ERANKDEAD, nothing of the iteration
 * completes for it afterwards. */
static void t_dies_mid_iteration(void)
{
	struct plan *p = make_plan(false, 0.5); /* momentum: state to give back */
	struct ref rf;
	const struct rec *e;
	struct job *j;
	unsigned mark;

	REQUIRE(core_setup() == 0, "core setup");
	REQUIRE(p, "plan");
	j = start_job(false, 0.5, &rf);
	REQUIRE(j, "job");
	iterate(j, p, 0, false, &rf);
	write_grads(p, 1);
	bucket_ready(0, 1, 0);
	bucket_ready(0, 1, 1);
	bucket_ready(1, 1, 0); /* bucket 0 queued */
	CHECK(j->in_flight && count(R_H_BUCKET_QUEUED, UINT32_MAX) == p->nbuckets + 1,
	      "bucket 0 of iteration 1 queued");
	mark = L.n;
	core_.sink->drop(&T[1].m, LEAVE_EXITED);
	e = find_from(mark, R_ERROR, 0);
	CHECK(e && e->code == ZC_ERANKDEAD && e->fatal &&
		      strstr(e->msg, "died during an iteration"),
	      "rank 0: a fatal ZC_ERANKDEAD: \"%s\"", e ? e->msg : "");
	CHECK(count_from(mark, R_DETACH, 0) == 1 && !j->quiet_end && j->state == JOB_FAILED,
	      "rank 0 detached, the job failed");
	CHECK(pump_until(c_exec_stopped, j), "the executor stops");
	CHECK(count_from(mark, R_BUCKET_DONE, UINT32_MAX) == 0 &&
		      count_from(mark, R_STEP_DONE, UINT32_MAX) == 0,
	      "no BucketDone or StepDone after the failure");
	CHECK(core_.memory_used == 0 && core_.njobs == 1,
	      "its state's memory given back when the executor stopped, rank 0 still there");
	reap();
	CHECK(core_.njobs == 0, "freed once rank 0 left");
	check_freed_as(false, ZC_ERANKDEAD, "died during an iteration");
	end_all(LEAVE_GOODBYE);
	plan_free(p);
	core_teardown();
}

/* The same death with --rejoin-timeout: the job re-forms (reform.c). Rank
 * 0 hears a fatal ZC_ERANKLOST and is detached; the old executor stops
 * keeping the state, which stays charged with no rank connected; the
 * restarted ranks join the same id with fresh buffers (99s) and register;
 * PlanOk says iteration 1 (nothing of it was stepped); every rank's buffer
 * holds the parameters after iteration 0, and iteration 1 steps with the
 * momentum kept: equal to the uninterrupted reference. */
static void t_reforms_mid_iteration(void)
{
	struct plan *p = make_plan(false, 0.5);
	struct ref rf;
	const struct rec *e;
	struct job *j;
	unsigned mark;
	char err[256];

	REQUIRE(core_setup() == 0, "core setup");
	REQUIRE(p, "plan");
	cfg_.rejoin_timeout_ms = 60000;
	j = start_job(false, 0.5, &rf);
	REQUIRE(j, "job");
	iterate(j, p, 0, false, &rf);
	write_grads(p, 1);
	bucket_ready(0, 1, 0); /* rank 1 never hands bucket 0 over */
	mark = L.n;
	core_.sink->drop(&T[1].m, LEAVE_EXITED);
	e = find_from(mark, R_ERROR, 0);
	CHECK(j->state == JOB_REFORMING && e && e->code == ZC_ERANKLOST && e->fatal &&
		      zc_error_recoverable(e->code) && strstr(e->msg, "rank 1") &&
		      strstr(e->msg, "--rejoin-timeout"),
	      "re-forming, rank 0 told ZC_ERANKLOST: %s \"%s\"", job_state_name(j->state),
	      e ? e->msg : "");
	CHECK(count_from(mark, R_DETACH, 0) == 1, "rank 0 detached");
	CHECK(pump_until(c_exec_stopped, j), "the old executor stops");
	reap();
	CHECK(core_.njobs == 1 && j->state == JOB_REFORMING && j->nconnected == 0 &&
		      core_.memory_used > 0,
	      "the job stays with its state and no rank (%u jobs, %s, %llu bytes)", core_.njobs,
	      job_state_name(j->state), (unsigned long long)core_.memory_used);
	mark = L.n;
	for (uint32_t k = 0; k < W; k++) {
		CHECK(make_buffers(k, p, NULL) == 0, "rank %u: fresh memfds", k);
		CHECK(join(k, err, sizeof(err)) == 0 && T[k].m.job == j, "rank %u rejoins: %s", k,
		      err);
	}
	for (uint32_t k = 0; k < W; k++)
		register_plan(k, false, 0.5);
	REQUIRE(pump_until(c_active, j), "active again (%s)", job_state_name(j->state));
	for (uint32_t k = 0; k < W; k++) {
		e = find_from(mark, R_PLAN_OK, k);
		CHECK(e && e->iteration == 1, "rank %u: PlanOk recovered at %lld", k,
		      e ? (long long)e->iteration : -2);
	}
	check_params(p, &rf, "after the recovery");
	iterate(j, p, 1, false, &rf);
	end_all(LEAVE_GOODBYE);
	plan_free(p);
	core_teardown();
}

/* A re-plan between iterations: the same parameters in two buckets instead
 * of three, on new buffers. Refused mid-iteration (ZC_ESTATE) and when it
 * changes the parameters (ZC_EREPLAN); then REGISTERING again, PlanOk with
 * the new hash, iterations go on counting on the new buffers, the
 * momentum starting over (the daemon keeps no state over a re-plan). */
static void t_replan(void)
{
	struct plan *p3 = make_plan(false, 0.5), *p2 = make_plan(true, 0.5);
	struct ref rf;
	const struct rec *e;
	struct job *j;
	unsigned mark;

	REQUIRE(core_setup() == 0, "core setup");
	REQUIRE(p3 && p2 && p3->hash != p2->hash, "plans");
	j = start_job(false, 0.5, &rf);
	REQUIRE(j, "job");
	iterate(j, p3, 0, false, &rf);
	/* mid-iteration: refused to that rank, the job goes on */
	write_grads(p3, 1);
	bucket_ready(0, 1, 0);
	mark = L.n;
	register_plan(0, true, 0.5);
	e = find_from(mark, R_ERROR, 0);
	CHECK(e && e->code == ZC_ESTATE && !e->fatal && answers_from(mark) == 1 && !j->rp,
	      "a new plan mid-iteration: ZC_ESTATE to that rank alone");
	for (uint32_t b = 1; b < p3->nbuckets; b++)
		bucket_ready(0, 1, b);
	for (uint32_t b = 0; b < p3->nbuckets; b++)
		bucket_ready(1, 1, b);
	{
		uint64_t t = 1;
		REQUIRE(pump_until(c_stepped, &t), "iteration 1");
		ref_step(&rf, 1);
		check_params(p3, &rf, "iteration 1");
	}
	/* a plan whose parameters differ: ZC_EREPLAN, nothing else */
	{
		struct zc_param_group g[1] = {{GROUP_SIZE, .lr = 0.25, .momentum = 0.5}};
		struct zc_segment s[1] = {SEG(0, 27, 0)};
		struct zc_bucket b[1] = {BUCKET(27, 1, s)};
		struct zc_plan zp =
			PLAN(ZC_OPT_SGD, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED, 1, g, 1, b);
		struct mem_desc gd = {
			.kind = MEM_FD, .fd = T[1].gfd, .bytes = T[1].bytes, .owner = getuid()};
		struct plan *bad = NULL;
		char err[200];

		REQUIRE(plan_from_zc(&zp, &bad, err, sizeof(err)) == 0, "plan: %s", err);
		mark = L.n;
		job_register_plan(j, &T[1].m, bad, &gd, &gd);
		e = find_from(mark, R_ERROR, 1);
		CHECK(e && e->code == ZC_EREPLAN && !e->fatal && answers_from(mark) == 1 &&
			      j->state == JOB_ACTIVE,
		      "a new plan of other parameters: ZC_EREPLAN to that rank alone (%s)",
		      e ? zc_strerror_name(e->code) : "nothing");
	}
	/* the trainers copy their parameters into new buffers, as
	 * zc_register_plan's re-plan does */
	for (uint32_t k = 0; k < W; k++)
		REQUIRE(make_buffers(k, p2, rf.p) == 0, "rank %u: new memfds", k);
	mark = L.n;
	register_plan(0, true, 0.5);
	CHECK(j->state == JOB_ACTIVE && j->rp && answers_from(mark) == 0,
	      "one new plan of two: still active, nothing said");
	register_plan(1, true, 0.5);
	CHECK(j->state == JOB_ACTIVE, "the old executor stops first: still active");
	REQUIRE(pump_until(c_on_plan, p2), "active again on the new plan (%s)",
		job_state_name(j->state));
	CHECK(count_from(mark, R_H_EXEC_DONE, UINT32_MAX) >= 2 &&
		      find_from(mark, R_H_EXEC_DONE, UINT32_MAX)->code == EXEC_STOPPED,
	      "the old executor stopped, then the new one started");
	for (uint32_t k = 0; k < W; k++) {
		const struct rec *ok = find_from(mark, R_PLAN_OK, k);
		CHECK(ok && ok->hash == p2->hash && count_from(mark, R_PLAN_OK, k) == 1,
		      "rank %u: PlanOk once with the new plan's hash", k);
	}
	CHECK(answers_from(mark) == W && j->iter == 2 && core_.memory_used == j->memory &&
		      j->memory > 0,
	      "nothing but PlanOk; iterations go on at 2 (%llu); the new state charged",
	      (unsigned long long)j->iter);
	/* the daemon keeps no state over a re-plan: the client moves it
	 * (zc_register_plan exports and imports it), this test does not */
	rf.steps = 0;
	memset(rf.m, 0, sizeof(rf.m));
	iterate(j, p2, 2, false, &rf);
	iterate(j, p2, 3, true, &rf);
	CHECK(count(R_ERROR, UINT32_MAX) == 2, "no error but the two asked for");
	end_all(LEAVE_GOODBYE);
	CHECK(core_.stats.jobs_failed == 0, "no failure");
	plan_free(p3);
	plan_free(p2);
	core_teardown();
}

/* Every rank says Goodbye between iterations: the job ended well. */
static void t_quiet_end(void)
{
	struct plan *p = make_plan(false, 0);
	struct ref rf;
	struct job *j;
	unsigned mark;

	REQUIRE(core_setup() == 0, "core setup");
	REQUIRE(p, "plan");
	j = start_job(false, 0, &rf);
	REQUIRE(j, "job");
	iterate(j, p, 0, false, &rf);
	iterate(j, p, 1, false, &rf);
	mark = L.n;
	core_.sink->drop(&T[0].m, LEAVE_GOODBYE);
	CHECK(j->state == JOB_FAILED && j->quiet_end && answers_from(mark) == 1,
	      "after the first Goodbye: ended quietly, nobody told");
	core_.sink->drop(&T[1].m, LEAVE_GOODBYE);
	CHECK(answers_from(mark) == 2 && count(R_ERROR, UINT32_MAX) == 0 &&
		      count(R_DETACH, UINT32_MAX) == 0,
	      "no error, no detach");
	end_all(LEAVE_GOODBYE);
	check_freed_as(true, ZC_ERANKDEAD, "left the job");
	plan_free(p);
	core_teardown();
}

/* A rank that stops handing over buckets: the stall check fails the job
 * with ZC_ETIMEDOUT naming it and its bucket, to every rank. */
static void t_stall(void)
{
	struct plan *p = make_plan(false, 0);
	struct ref rf;
	struct job *j;

	REQUIRE(core_setup() == 0, "core setup");
	REQUIRE(p, "plan");
	j = start_job(false, 0, &rf);
	REQUIRE(j, "job");
	sched_check_stalls(&core_, now_ms() + cfg_.stall_timeout_ms * 2);
	CHECK(j->state == JOB_ACTIVE && count(R_ERROR, UINT32_MAX) == 0,
	      "between iterations nothing stalls");
	write_grads(p, 0);
	for (uint32_t b = 0; b < p->nbuckets; b++)
		bucket_ready(0, 0, b);
	bucket_ready(1, 0, 0);
	sched_check_stalls(&core_, now_ms() + cfg_.stall_timeout_ms / 2);
	CHECK(j->state == JOB_ACTIVE, "not yet stalled");
	sched_check_stalls(&core_, now_ms() + cfg_.stall_timeout_ms + 1000);
	for (uint32_t k = 0; k < W; k++) {
		const struct rec *e = find_from(0, R_ERROR, k);
		CHECK(e && e->code == ZC_ETIMEDOUT && e->fatal &&
			      strstr(e->msg, "rank 1 (bucket 1 of 3)") && count(R_DETACH, k) == 1,
		      "rank %u: fatal ZC_ETIMEDOUT naming rank 1's bucket: \"%s\"", k,
		      e ? e->msg : "");
	}
	CHECK(pump_until(c_exec_stopped, j), "the executor stops");
	reap();
	end_all(LEAVE_GOODBYE);
	check_freed_as(false, ZC_ETIMEDOUT, NULL);
	plan_free(p);
	core_teardown();
}

/* A failed job whose last rank's process has exited (sink.gone) but whose
 * leave was not seen yet: the next run's Hello drops it (sink.drop) and a
 * fresh job forms under the same id. */
static void t_rejoin_after_exit(void)
{
	struct trank fresh = {.m = {.pid = getpid(), .uid = getuid()}};
	struct join_req h = {
		.job_id = JOB_ID, .rank = 0, .world = W, .local_rank = 0, .local_size = W};
	char err[256];
	struct job *j;

	REQUIRE(core_setup() == 0, "core setup");
	REQUIRE(join(0, err, sizeof(err)) == 0 && join(1, err, sizeof(err)) == 0, "join: %s", err);
	j = T[0].m.job;
	core_.sink->drop(&T[1].m, LEAVE_EXITED);
	REQUIRE(j->state == JOB_FAILED && j->nconnected == 1, "failed, rank 0 still there");
	CHECK(job_join(&core_, &fresh.m, &h, err, sizeof(err)) == ZC_EJOBFAILED,
	      "rank 0 lives: the id is still the failed job's");
	T[0].gone = true;
	CHECK(job_join(&core_, &fresh.m, &h, err, sizeof(err)) == 0 && fresh.m.job &&
		      fresh.m.job->state == JOB_FORMING && core_.njobs == 1,
	      "rank 0 exited: dropped, and a fresh job formed: %s", err);
	CHECK(count(R_DROP, 0) == 1 && find_from(0, R_DROP, 0)->why == LEAVE_EXITED,
	      "the exited rank was dropped through the sink as exited");
	check_freed_as(false, ZC_ERANKDEAD, NULL);
	if (fresh.m.job)
		job_leave(fresh.m.job, &fresh.m, LEAVE_GOODBYE);
	CHECK(core_.njobs == 0, "the fresh job freed when its rank left");
	core_teardown();
}

static const struct test_case cases[] = {
	{"states_and_iterations", t_states_and_iterations},
	{"hook_order_errors", t_hook_order_errors},
	{"rank_dies_forming_alone", t_dies_forming_alone},
	{"rank_dies_forming", t_dies_forming},
	{"rank_dies_half_registered", t_dies_half_registered},
	{"rank_dies_registering", t_dies_registering},
	{"rank_dies_between_iterations_quiet", t_dies_between_iterations},
	{"rank_dies_mid_iteration", t_dies_mid_iteration},
	{"rank_dies_mid_iteration_job_reforms", t_reforms_mid_iteration},
	{"replan", t_replan},
	{"quiet_end", t_quiet_end},
	{"stall", t_stall},
	{"rejoin_after_exit", t_rejoin_after_exit},
};

TEST_MAIN(cases)
