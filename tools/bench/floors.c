/*
 * floors.c — what the machine allows without zerod, measured in the same run
 * as the daemon so that ratios hold on a noisy machine: memcpy and STREAM
 * triad bandwidth, an AF_UNIX ping-pong, and the plain-C fused reference pass.
 *
 * The fused pass is a reference, not a bound (a pass that writes fewer
 * bytes, or with other stores, can beat it): per
 * chunk that stays in L2, sum the R ranks' gradients in rank order into a
 * scratch, divide by R, step the optimizer with torch's arithmetic
 * (daemon/optim/optim.h) on rank 0's parameters, which are the master, and
 * copy the result into every other rank's parameter buffer. Threads split the
 * elements into contiguous ranges, as the daemon's worker pool does.
 *
 * The bytes-moved floor of one iteration counts every byte the same way as
 * the bandwidth it is divided by, in one of two consistent ways, and is the
 * lower of them (a pass may use either kind of store):
 *   - no write-allocate: every input read once, every output written once,
 *     R gradient buffers and the master parameters read, the optimizer
 *     state read and written, R parameter buffers written,
 *         bytes_nt = 4 N (2R + 1 + 2S)   (N elements, S state floats each)
 *     over STREAM triad with non-temporal stores (no write-allocate either),
 *     counted as 3 arrays: floor_nt = bytes_nt / triad_nt_gbps;
 *   - write-allocate for every written buffer: a buffer that is only
 *     written (the R-1 other ranks' parameters) is also read first, the
 *     others were read anyway,
 *         bytes_wa = 4 N (3R + 2S)
 *     over plain-store triad counted with its write-allocate, 4 arrays:
 *     floor_wa = bytes_wa / (triad_gbps * 4/3).
 * When the ranks share one parameter buffer (--shared-params) it is read
 * and written once and nothing is only written: both count
 *     bytes = 4 N (R + 2 + 2S).
 * Every pass here starts with the caches emptied (bench_evict) when the
 * configuration says cold, and triad's arrays are at least twice the
 * last-level cache, so no figure is a cache's.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "bench.h"

/* Elements per chunk of the fused pass: R gradients, the scratch, the
 * parameters and the state of a chunk stay in L2 (~200 KiB for R = 2). */
#define CHUNK 8192

#if defined(__x86_64__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#endif
#ifndef CLONES
#define CLONES
#endif

/* ---- a team of threads that runs one function per pass ---- */

struct team {
	pthread_mutex_t mu;
	pthread_cond_t go, done;
	unsigned n, started, pending;
	uint64_t gen;
	bool quit;
	void (*fn)(void *ctx, unsigned id, unsigned n);
	void *ctx;
	pthread_t th[];
};

struct team_arg {
	struct team *t;
	unsigned id;
};

static void *team_worker(void *p)
{
	struct team_arg a = *(struct team_arg *)p;
	struct team *t = a.t;
	uint64_t seen = 0;

	free(p);
	pthread_mutex_lock(&t->mu);
	for (;;) {
		while (t->gen == seen && !t->quit)
			pthread_cond_wait(&t->go, &t->mu);
		if (t->quit)
			break;
		seen = t->gen;
		pthread_mutex_unlock(&t->mu);
		t->fn(t->ctx, a.id, t->n);
		pthread_mutex_lock(&t->mu);
		if (--t->pending == 0)
			pthread_cond_signal(&t->done);
	}
	pthread_mutex_unlock(&t->mu);
	return NULL;
}

static void team_free(struct team *t)
{
	if (!t)
		return;
	pthread_mutex_lock(&t->mu);
	t->quit = true;
	pthread_cond_broadcast(&t->go);
	pthread_mutex_unlock(&t->mu);
	for (unsigned i = 1; i < t->started; i++)
		pthread_join(t->th[i], NULL);
	pthread_mutex_destroy(&t->mu);
	pthread_cond_destroy(&t->go);
	pthread_cond_destroy(&t->done);
	free(t);
}

/* n threads, the caller being thread 0. */
static int team_new(unsigned n, struct team **ret)
{
	struct team *t = calloc(1, sizeof(*t) + n * sizeof(pthread_t));

	if (!t)
		return -ENOMEM;
	pthread_mutex_init(&t->mu, NULL);
	pthread_cond_init(&t->go, NULL);
	pthread_cond_init(&t->done, NULL);
	t->n = n;
	for (t->started = 1; t->started < n; t->started++) {
		struct team_arg *a = malloc(sizeof(*a));
		if (a)
			*a = (struct team_arg){t, t->started};
		if (!a || pthread_create(&t->th[t->started], NULL, team_worker, a)) {
			free(a);
			team_free(t);
			return -EAGAIN;
		}
	}
	*ret = t;
	return 0;
}

static void team_run(struct team *t, void (*fn)(void *, unsigned, unsigned), void *ctx)
{
	pthread_mutex_lock(&t->mu);
	t->fn = fn;
	t->ctx = ctx;
	t->pending = t->n - 1;
	t->gen++;
	pthread_cond_broadcast(&t->go);
	pthread_mutex_unlock(&t->mu);
	fn(ctx, 0, t->n);
	pthread_mutex_lock(&t->mu);
	while (t->pending)
		pthread_cond_wait(&t->done, &t->mu);
	pthread_mutex_unlock(&t->mu);
}

/* Thread id's share of n elements, cut at multiples of 16 (64 bytes). */
static void split(size_t n, unsigned id, unsigned nt, size_t *lo, size_t *hi)
{
	*lo = (n * id / nt) & ~(size_t)15;
	*hi = id + 1 == nt ? n : (n * (id + 1) / nt) & ~(size_t)15;
}

static float *alloc_floats(size_t n, float value)
{
	void *p = NULL;

	if (posix_memalign(&p, 64, n * sizeof(float) + 64))
		return NULL;
	for (size_t i = 0; i < n; i++)
		((float *)p)[i] = value;
	return p;
}

/* ---- the caches ---- */

size_t bench_llc_bytes(void)
{
	size_t best = 0;

	for (int i = 0; i < 8; i++) {
		char path[96], unit = 0;
		unsigned long v = 0;
		int level = 0;
		FILE *f;

		snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
		f = fopen(path, "re");
		if (!f)
			break;
		if (fscanf(f, "%d", &level) != 1)
			level = 0;
		fclose(f);
		snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
		f = fopen(path, "re");
		if (f && fscanf(f, "%lu%c", &v, &unit) >= 1) {
			size_t b = v * (unit == 'K' ? 1024ul : unit == 'M' ? 1048576ul : 1ul);
			if (level >= 2 && b > best)
				best = b;
		}
		if (f)
			fclose(f);
	}
	return best ? best : 32ul << 20;
}

void bench_evict(void)
{
	static char *buf;
	static size_t n;

	if (!buf) {
		n = 4 * bench_llc_bytes();
		n = n < (64ul << 20) ? 64ul << 20 : n;
		buf = malloc(n);
		if (!buf)
			return;
		memset(buf, 0, n);
	}
	/* a read and a write of every line: volatile, so it is not elided */
	for (size_t i = 0; i < n; i += 64)
		((volatile char *)buf)[i]++;
}

/* ---- bandwidth ---- */

int floor_memcpy_gbps(size_t bytes, double *ret_gbps)
{
	char *a = malloc(bytes), *b = malloc(bytes);
	double best = 0;

	if (!a || !b) {
		free(a);
		free(b);
		return -ENOMEM;
	}
	memset(a, 1, bytes);
	memset(b, 2, bytes);
	/* Best of at least 6, and of at least 0.3 s: a busy neighbour on a
	 * shared machine lowers some passes, never raises one. */
	for (int64_t end = bench_ns() + 300000000, k = 0; k < 6 || bench_ns() < end; k++) {
		int64_t t0 = bench_ns();
		memcpy(k & 1 ? a : b, k & 1 ? b : a, bytes);
		double gbps = (double)bytes / (double)(bench_ns() - t0);
		if (gbps > best)
			best = gbps;
	}
	free(a);
	free(b);
	*ret_gbps = best;
	return 0;
}

struct triad {
	float *a, *b, *c;
	size_t n;
	bool nt;   /* non-temporal stores: no write-allocate */
	bool cold; /* the caches emptied before each pass */
};

static CLONES void triad_range(float *restrict a, const float *restrict b, const float *restrict c,
			       size_t n)
{
	for (size_t i = 0; i < n; i++)
		a[i] = b[i] + 3.0f * c[i];
}

/* The same with streaming stores (a, b, c 16-byte aligned, n a multiple of
 * 4 but for the tail): the line of a is written without being read. */
static void triad_range_nt(float *restrict a, const float *restrict b, const float *restrict c,
			   size_t n)
{
#if defined(__x86_64__)
	const __m128 three = _mm_set1_ps(3.0f);
	size_t i = 0;

	for (; i + 4 <= n; i += 4)
		_mm_stream_ps(a + i, _mm_add_ps(_mm_load_ps(b + i),
						_mm_mul_ps(three, _mm_load_ps(c + i))));
	for (; i < n; i++)
		a[i] = b[i] + 3.0f * c[i];
	_mm_sfence();
#else
	triad_range(a, b, c, n);
#endif
}

static void triad_run(void *ctx, unsigned id, unsigned nt)
{
	struct triad *t = ctx;
	size_t lo, hi;

	split(t->n, id, nt, &lo, &hi);
	if (t->nt)
		triad_range_nt(t->a + lo, t->b + lo, t->c + lo, hi - lo);
	else
		triad_range(t->a + lo, t->b + lo, t->c + lo, hi - lo);
}

int floor_triad_gbps(size_t bytes, unsigned threads, bool nt, bool cold, double *ret_gbps)
{
	struct triad t = {.n = bytes / sizeof(float), .nt = nt, .cold = cold};
	struct team *team = NULL;
	double best = 0;
	int r;

	t.a = alloc_floats(t.n, 0);
	t.b = alloc_floats(t.n, 1);
	t.c = alloc_floats(t.n, 2);
	r = t.a && t.b && t.c ? team_new(threads, &team) : -ENOMEM;
	if (r < 0)
		goto out;
	/* At least a second: triad sets the floor, and a neighbour's burst on
	 * one of the 2 cores must not set it for the whole run. */
	for (int64_t end = bench_ns() + 1000000000, k = 0; k < 8 || bench_ns() < end; k++) {
		if (t.cold)
			bench_evict();
		int64_t t0 = bench_ns();
		team_run(team, triad_run, &t);
		double gbps = 3.0 * (double)(t.n * sizeof(float)) / (double)(bench_ns() - t0);
		if (gbps > best)
			best = gbps;
	}
	*ret_gbps = best;
out:
	team_free(team);
	free(t.a);
	free(t.b);
	free(t.c);
	return r;
}

/* ---- AF_UNIX ping-pong ---- */

static int full_io(int fd, char *buf, size_t n, bool wr)
{
	size_t done = 0;

	while (done < n) {
		ssize_t k = wr ? write(fd, buf + done, n - done) : read(fd, buf + done, n - done);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return k < 0 ? -errno : -EPIPE;
		done += (size_t)k;
	}
	return 0;
}

/* Pin the calling thread to one CPU (cpu < 0: leave it). */
static void pin(int cpu)
{
	cpu_set_t set;

	if (cpu < 0)
		return;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	sched_setaffinity(0, sizeof(set), &set);
}

int floor_unix_rtt_us(int iters, int cpu_a, int cpu_b, double *ret_us)
{
	int sv[2], r = 0, warm = iters / 10 + 10;
	char msg[64] = "ping";
	double *t = calloc((size_t)iters, sizeof(double));
	cpu_set_t saved;
	pid_t pid;

	if (!t)
		return -ENOMEM;
	if (sched_getaffinity(0, sizeof(saved), &saved) < 0 ||
	    socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
		r = -errno;
		goto out;
	}
	pid = fork();
	if (pid < 0) {
		r = -errno;
		close(sv[0]);
		close(sv[1]);
		goto out;
	}
	if (pid == 0) {
		pin(cpu_b);
		close(sv[0]);
		while (full_io(sv[1], msg, sizeof(msg), false) == 0 &&
		       full_io(sv[1], msg, sizeof(msg), true) == 0)
			;
		_exit(0);
	}
	pin(cpu_a);
	close(sv[1]);
	for (int i = 0; i < warm + iters && r == 0; i++) {
		int64_t t0 = bench_ns();
		r = full_io(sv[0], msg, sizeof(msg), true);
		if (r == 0)
			r = full_io(sv[0], msg, sizeof(msg), false);
		if (i >= warm)
			t[i - warm] = (double)(bench_ns() - t0) / 1e3;
	}
	close(sv[0]);
	waitpid(pid, NULL, 0);
	sched_setaffinity(0, sizeof(saved), &saved);
	if (r == 0)
		*ret_us = bench_quantile(t, (size_t)iters, 0.5);
out:
	free(t);
	return r;
}

int floor_two_cpus(int *ret_a, int *ret_b)
{
	cpu_set_t set;
	int found = 0, cpus[2] = {-1, -1};

	if (sched_getaffinity(0, sizeof(set), &set) < 0)
		return -errno;
	for (int c = 0; c < CPU_SETSIZE && found < 2; c++)
		if (CPU_ISSET(c, &set))
			cpus[found++] = c;
	*ret_a = cpus[0];
	*ret_b = cpus[1];
	return found;
}

/* ---- the fused reference pass ---- */

/* The optimizer's scalars, each cast to float once from the double value,
 * as optim.h says. */
struct kconst {
	float lr, wd, mom, damp1;         /* SGD */
	float b1, omb1, b2, omb2, eps, r; /* Adam */
	float ns;                         /* -lr / bias correction 1 */
	float decay;                      /* AdamW: 1 - lr * wd */
};

struct fused {
	const struct bench_cfg *cfg;
	size_t n;
	float **g, **p, *m, *v, *scratch;
	uint64_t step;
	struct kconst k;
};

static CLONES void sum_chunk(float *restrict s, float *const *g, uint32_t world, size_t off,
			     size_t n)
{
	const float *restrict g0 = g[0] + off;
	float fw = (float)world;

	for (size_t i = 0; i < n; i++)
		s[i] = g0[i];
	for (uint32_t r = 1; r < world; r++) {
		const float *restrict gr = g[r] + off;
		for (size_t i = 0; i < n; i++)
			s[i] += gr[i];
	}
	for (size_t i = 0; i < n; i++)
		s[i] /= fw;
}

static CLONES void adam_chunk(float *restrict p, const float *restrict g, float *restrict m,
			      float *restrict v, size_t n, struct kconst k, bool adamw)
{
	for (size_t i = 0; i < n; i++) {
		float gi = g[i];
		if (adamw)
			p[i] = p[i] * k.decay;
		else if (k.wd != 0)
			gi = gi + k.wd * p[i];
		m[i] = m[i] * k.b1 + k.omb1 * gi;
		v[i] = v[i] * k.b2 + (k.omb2 * gi) * gi;
		float den = sqrtf(v[i]) / k.r + k.eps;
		p[i] = p[i] + (k.ns * m[i]) / den;
	}
}

static CLONES void sgd_chunk(float *restrict p, const float *restrict g, float *restrict m,
			     size_t n, struct kconst k, bool first)
{
	for (size_t i = 0; i < n; i++) {
		float d = g[i];
		if (k.wd != 0)
			d = d + k.wd * p[i];
		if (m) {
			float b = first ? d : k.mom * m[i] + k.damp1 * d;
			m[i] = b;
			d = b;
		}
		p[i] = p[i] - k.lr * d;
	}
}

static void fused_run(void *ctx, unsigned id, unsigned nt)
{
	struct fused *f = ctx;
	float *s = f->scratch + (size_t)id * CHUNK;
	uint32_t world = f->cfg->ranks;
	size_t lo, hi;

	split(f->n, id, nt, &lo, &hi);
	for (size_t off = lo; off < hi; off += CHUNK) {
		size_t n = hi - off < CHUNK ? hi - off : CHUNK;
		float *p = f->p[0] + off;

		sum_chunk(s, f->g, world, off, n);
		if (f->cfg->optim == ZC_OPT_SGD)
			sgd_chunk(p, s, f->m ? f->m + off : NULL, n, f->k, f->step == 1);
		else
			adam_chunk(p, s, f->m + off, f->v + off, n, f->k,
				   f->cfg->optim == ZC_OPT_ADAMW);
		for (uint32_t r = 1; r < world; r++)
			memcpy(f->p[r] + off, p, n * sizeof(float));
	}
}

static void fused_consts(struct fused *f)
{
	const struct zc_param_group *hp = &f->cfg->hp;
	double bc1 = 1 - pow(hp->beta1, (double)f->step);
	double bc2 = 1 - pow(hp->beta2, (double)f->step);

	f->k = (struct kconst){
		.lr = (float)hp->lr,
		.wd = (float)hp->weight_decay,
		.mom = (float)hp->momentum,
		.damp1 = (float)(1 - hp->dampening),
		.b1 = (float)hp->beta1,
		.omb1 = (float)(1 - hp->beta1),
		.b2 = (float)hp->beta2,
		.omb2 = (float)(1 - hp->beta2),
		.eps = (float)hp->eps,
		.r = (float)sqrt(bc2),
		.ns = (float)(-(hp->lr / bc1)),
		.decay = (float)(1 - hp->lr * hp->weight_decay),
	};
}

int floor_fused_ms(const struct bench_cfg *cfg, double *ret_ms, double *ret_min_ms)
{
	struct fused f = {.cfg = cfg, .n = cfg->params};
	unsigned sf = bench_state_floats(cfg);
	int passes = cfg->warmup + cfg->iters, r = -ENOMEM;
	double *t = calloc((size_t)passes, sizeof(double));
	struct team *team = NULL;

	f.g = calloc(cfg->ranks, sizeof(float *));
	f.p = calloc(cfg->ranks, sizeof(float *));
	f.scratch = alloc_floats((size_t)cfg->threads * CHUNK, 0);
	if (!t || !f.g || !f.p || !f.scratch)
		goto out;
	for (uint32_t k = 0; k < cfg->ranks; k++) {
		f.g[k] = alloc_floats(f.n, 1e-3f * (float)(k + 1));
		f.p[k] = alloc_floats(f.n, 0.01f);
		if (!f.g[k] || !f.p[k])
			goto out;
	}
	if ((sf >= 1 && !(f.m = alloc_floats(f.n, 0))) ||
	    (sf >= 2 && !(f.v = alloc_floats(f.n, 0))))
		goto out;
	r = team_new(cfg->threads, &team);
	if (r < 0)
		goto out;
	for (int i = 0; i < passes; i++) {
		f.step = (uint64_t)i + 1;
		fused_consts(&f);
		if (cfg->cold)
			bench_evict();
		int64_t t0 = bench_ns();
		team_run(team, fused_run, &f);
		t[i] = (double)(bench_ns() - t0) / 1e6;
	}
	*ret_ms = bench_quantile(t + cfg->warmup, (size_t)cfg->iters, 0.5);
	*ret_min_ms = bench_quantile(t + cfg->warmup, (size_t)cfg->iters, 0);
out:
	team_free(team);
	for (uint32_t k = 0; k < cfg->ranks; k++) {
		free(f.g ? f.g[k] : NULL);
		free(f.p ? f.p[k] : NULL);
	}
	free(f.g);
	free(f.p);
	free(f.m);
	free(f.v);
	free(f.scratch);
	free(t);
	return r;
}

double floor_bytes_moved(const struct bench_cfg *cfg)
{
	return 4.0 * (double)cfg->params * (2.0 * cfg->ranks + 1.0 + 2.0 * bench_state_floats(cfg));
}

double floor_bytes_moved_wa(const struct bench_cfg *cfg)
{
	/* the R-1 parameter buffers that are only written are read first */
	return 4.0 * (double)cfg->params * (3.0 * cfg->ranks + 2.0 * bench_state_floats(cfg));
}

double floor_bytes_shared(const struct bench_cfg *cfg)
{
	/* R gradients read, the parameters read and written once, the state */
	return 4.0 * (double)cfg->params * (cfg->ranks + 2.0 + 2.0 * bench_state_floats(cfg));
}
