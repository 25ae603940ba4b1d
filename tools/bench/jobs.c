/*
 * jobs.c — the part of zerod-bench that runs a real zerod on a private socket
 * and forks real trainer processes that speak to it only through the public
 * libzeroclient API.
 *
 * Every rank fills its gradients outside the timed region, then all ranks
 * meet at a barrier, and each times from its first zc_bucket_ready() to its
 * step future done: the daemon's handoff, reduction, optimizer step and
 * write-back, net of the trainers' own work. With run->overlap every
 * iteration also runs a second kind, accounted as torch's DDP figure is
 * (synced − no_sync): the fill of each bucket followed at once by its
 * zc_bucket_ready(), so the daemon's work overlaps the fill of the next
 * bucket on the same cores, timed from the first fill to the step done; the
 * fill alone is timed in the first kind, and the comparable figure is
 * median(overlapped) − median(fill alone). With cfg->cold, rank 0 of the job
 * evicts the caches (bench_evict) before each fill and each timed region, so
 * no measurement starts with the working set in the last-level cache. The
 * ranks share one anonymous
 * MAP_SHARED region (inherited through fork) for the barrier, their samples
 * and their errors. The barrier sleeps on a futex, so a waiting rank leaves
 * both cores to the daemon, and it can be aborted, so a failed rank ends the
 * run instead of hanging it.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

#define STEP_TIMEOUT_MS 60000

int bench_last_json(const char *cmd, char *last, size_t len)
{
	char line[4096];
	FILE *f;
	int st;

	last[0] = 0;
	fflush(stdout);
	f = popen(cmd, "r");
	if (!f)
		return -errno;
	while (fgets(line, sizeof(line), f))
		if (line[0] == '{')
			snprintf(last, len, "%s", line);
	st = pclose(f);
	return st != 0 || !last[0] ? -EIO : 0;
}

/* ---- the daemon ---- */

void bench_rmdir(const char *path)
{
	DIR *dir = opendir(path);
	struct dirent *e;

	while (dir && (e = readdir(dir)))
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
			unlinkat(dirfd(dir), e->d_name, 0);
	if (dir)
		closedir(dir);
	rmdir(path);
}

int daemon_start(struct bench_daemon *d, const char *bin)
{
	return daemon_start_args(d, bin, NULL);
}

int daemon_start_args(struct bench_daemon *d, const char *bin, const char *const *extra)
{
	const char *argv[16] = {bin, "--socket", NULL};
	int64_t deadline;
	int a = 3;

	memset(d, 0, sizeof(*d));
	snprintf(d->dir, sizeof(d->dir), "/tmp/zerod-bench.XXXXXX");
	if (!mkdtemp(d->dir))
		return -errno;
	snprintf(d->sock, sizeof(d->sock), "%s/zerod.sock", d->dir);
	snprintf(d->log, sizeof(d->log), "%s/zerod.log", d->dir);
	d->pid = fork();
	if (d->pid < 0)
		return -errno;
	if (d->pid == 0) {
		int fd = open(d->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		if (fd >= 0)
			dup2(fd, 2);
		argv[2] = d->sock;
		for (int i = 0; extra && extra[i] && a < 15; i++)
			argv[a++] = extra[i];
		argv[a] = NULL;
		execv(bin, (char *const *)argv);
		_exit(127);
	}
	deadline = bench_ns() + 10000000000ll;
	while (bench_ns() < deadline) {
		if (access(d->sock, F_OK) == 0)
			return 0;
		if (waitpid(d->pid, NULL, WNOHANG) == d->pid) {
			d->pid = 0;
			return -ECHILD;
		}
		usleep(5000);
	}
	return -ETIMEDOUT;
}

int daemon_stop(struct bench_daemon *d)
{
	int st = 0, r = 0;
	pid_t w = 0;

	if (d->pid > 0) {
		kill(d->pid, SIGTERM);
		for (int i = 0; i < 1000 && (w = waitpid(d->pid, &st, WNOHANG)) == 0; i++)
			usleep(10000);
		if (w == 0) {
			kill(d->pid, SIGKILL);
			waitpid(d->pid, &st, 0);
			r = -ETIMEDOUT;
		} else if (w < 0) {
			r = -errno;
		} else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
			r = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
		}
		d->pid = 0;
	}
	if (d->dir[0]) {
		/* The socket, the log, and whatever else zerod left beside them
		 * (its socket's lock file). */
		bench_rmdir(d->dir);
		d->dir[0] = 0;
	}
	return r;
}

/* ---- a barrier across processes that sleeps and can be aborted ---- */

struct xbar {
	atomic_uint count;
	atomic_uint gen;
	atomic_int abort;
	unsigned n;
};

static void futex_wait(atomic_uint *a, unsigned val)
{
	struct timespec ts = {0, 100000000}; /* look at abort every 100 ms */

	syscall(SYS_futex, a, FUTEX_WAIT, val, &ts, NULL, 0);
}

static void futex_wake_all(atomic_uint *a)
{
	syscall(SYS_futex, a, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static int xbar_wait(struct xbar *b)
{
	unsigned g = atomic_load(&b->gen);

	if (atomic_fetch_add(&b->count, 1) + 1 == b->n) {
		atomic_store(&b->count, 0);
		atomic_fetch_add(&b->gen, 1);
		futex_wake_all(&b->gen);
		return 0;
	}
	while (atomic_load(&b->gen) == g && !atomic_load(&b->abort))
		futex_wait(&b->gen, g);
	return atomic_load(&b->abort) ? -ECANCELED : 0;
}

static void xbar_abort(struct xbar *b)
{
	atomic_store(&b->abort, 1);
	atomic_fetch_add(&b->gen, 1);
	futex_wake_all(&b->gen);
}

/* ---- the ranks ---- */

#define MAX_CKPTS 256

struct shared {
	struct xbar bar;
	double ck[64][MAX_CKPTS]; /* [rank][checkpoint]: zc_checkpoint() in ns */
	uint64_t rss_anon;
	/* [kind]: zerod's CPU (utime + stime, clock ticks) over the first job's
	 * timed iterations of each kind, read by its rank 0 around them */
	uint64_t zticks[2];
	double copy_ns[MAX_CKPTS]; /* [checkpoint]: the staging copy's floor before it */
	int err[128]; /* [process]: 2 x --ranks with --shared-params */
	char msg[128][200];
	double t[]; /* [series][process][sample]: SER_* series */
};

/* The series of samples each process records per iteration. */
enum { SER_HANDOVER, SER_FILL, SER_OVERLAP, SER_N };

struct run {
	const struct bench_daemon *d;
	const struct bench_cfg *cfg;
	const char *job;
	char rdzv[32];   /* "127.0.0.1:PORT" with several daemons */
	char secret[33]; /* random hex, likewise */
	struct zc_plan plan;
	int warmup, iters; /* samples = iters */
	/* --shared-params: a second job (`job2`) of the same plan whose ranks
	 * share one parameter memfd, param_fd; its ranks are processes R..2R-1,
	 * and the two jobs take turns, one iteration each (rank_run) */
	const char *job2;
	int param_fd;
	uint32_t nproc; /* R, or 2R with job2 */
	bool overlap;   /* also the overlapped kind (fill + hand-over, SER_OVERLAP) */
	bool cold;      /* evict the caches before each fill and timed region */
	pid_t zerod;
	struct shared *sh;
};

static uint64_t rss_anon_bytes(pid_t pid)
{
	char path[64], line[256];
	unsigned long long kb = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "RssAnon: %llu kB", &kb) == 1)
			break;
	fclose(f);
	return kb * 1024;
}

/* utime + stime of pid in clock ticks (/proc/PID/stat), 0 if unreadable. */
static uint64_t cpu_ticks(pid_t pid)
{
	char path[64], buf[1024];
	unsigned long long ut = 0, st = 0;
	const char *p;
	FILE *f;
	size_t n;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	if (!(f = fopen(path, "re")))
		return 0;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	p = strrchr(buf, ')'); /* the name may hold spaces; fields 14, 15 follow */
	if (!p ||
	    sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
		return 0;
	return ut + st;
}

/* The staging copy's floor: one memcpy of what a checkpoint stages between
 * two buffers kept warm, timed by rank 0 between the iterations just before
 * each checkpoint's (the other ranks wait at the barrier, the last write is
 * done), so under the load the checkpoint meets. */
struct copy_floor {
	char *src, *dst;
	uint64_t bytes;
};

static double copy_floor_ns(struct copy_floor *f)
{
	int64_t t0;

	if (!f->src) {
		f->src = malloc(f->bytes);
		f->dst = malloc(f->bytes);
		if (!f->src || !f->dst)
			return 0;
		memset(f->src, 1, f->bytes);
		memset(f->dst, 2, f->bytes);
	}
	t0 = bench_ns();
	memcpy(f->dst, f->src, f->bytes);
	t0 = bench_ns() - t0;
	f->src[0] ^= f->dst[f->bytes - 1]; /* the copy is used */
	return (double)t0;
}

static void fill(float *p, uint64_t n, float v)
{
	for (uint64_t i = 0; i < n; i++)
		p[i] = v;
}

/* One iteration: every bucket handed over, then the step future waited for;
 * with fill_v >= 0 each bucket's gradients are filled with fill_v just
 * before it is handed over (the overlapped kind), inside the timed region.
 * Returns the time from the first fill or zc_bucket_ready() to the step done
 * in ns, or a negative code with the reason in why. */
static int64_t iteration(zc_client *c, const struct zc_plan *plan, float fill_v, char *why,
			 size_t whylen)
{
	uint64_t it = zc_iteration(c);
	zc_future *step = NULL;
	int64_t t0 = bench_ns(), t;
	int r = 0;

	for (uint32_t b = 0; b < plan->nbuckets && r >= 0; b++) {
		if (fill_v >= 0)
			fill(zc_grad_buffer(c, b), plan->buckets[b].numel, fill_v);
		r = zc_bucket_ready(c, b, NULL);
	}
	if (r >= 0)
		r = zc_step_future(c, it, &step);
	if (r >= 0)
		r = zc_future_wait(step, STEP_TIMEOUT_MS);
	t = bench_ns() - t0;
	if (r == 0)
		r = ZC_ETIMEDOUT;
	if (r < 0)
		snprintf(why, whylen, "%s", step ? zc_future_message(step) : zc_error_message());
	zc_future_free(step);
	return r < 0 ? r : t;
}

/* What a checkpoint stages: the parameters and every state tensor. */
static uint64_t ckpt_bytes(const struct bench_cfg *cfg)
{
	return cfg->params * (1 + bench_state_floats(cfg)) * sizeof(float);
}

/* Process proc (rank proc % R of job proc / R): with two jobs, the first
 * job's ranks run each kind of each iteration while the second's wait at the
 * barrier, then the other way round, so both see the same machine,
 * iteration by iteration. The plain kind: fill (timed: SER_FILL), barrier,
 * hand-over (SER_HANDOVER); the overlapped kind: fill and hand-over bucket
 * by bucket (SER_OVERLAP). */
static int rank_run(struct run *run, uint32_t proc, zc_client *c, char *why, size_t whylen)
{
	const struct zc_plan *plan = &run->plan;
	uint32_t rank = proc % run->cfg->ranks, job = proc / run->cfg->ranks;
	bool turns = run->nproc > run->cfg->ranks;
	double *t = run->sh->t + (size_t)proc * (size_t)run->iters;
	struct copy_floor cf = {.bytes = ckpt_bytes(run->cfg)};
	int r = 0;

	for (uint32_t b = 0; b < plan->nbuckets; b++)
		fill(zc_param_buffer(c, b), plan->buckets[b].numel, 0.01f);
	r = zc_register_plan(c);
	if (r < 0)
		return r;
	for (int i = 0; i < run->warmup + run->iters; i++) {
		float v = 1e-3f * (float)(rank + 1) * (float)(1 + (i & 3));
		int64_t ns, fill_ns = 0, over_ns = 0;

		/* Each kind is a turn of each job in order (one job: one turn):
		 * the job whose turn it is runs it, the other's ranks sleep
		 * through as many barriers. */
		for (int kind = 0; kind < (run->overlap ? 2 : 1) && r == 0; kind++)
			for (uint32_t j = 0; j < (turns ? 2u : 1u) && r == 0; j++) {
				int nbar = kind == 0 ? 5 : 3;
				if (j != job) {
					while (nbar-- > 0 && r == 0)
						r = xbar_wait(&run->sh->bar);
					continue;
				}
				r = xbar_wait(&run->sh->bar);
				if (r == 0 && rank == 0 && run->cold)
					bench_evict();
				if (r == 0)
					r = xbar_wait(&run->sh->bar);
				if (r < 0)
					break;
				if (kind == 0) {
					int64_t t0 = bench_ns();
					for (uint32_t b = 0; b < plan->nbuckets; b++)
						fill(zc_grad_buffer(c, b), plan->buckets[b].numel,
						     v);
					fill_ns = bench_ns() - t0;
					r = xbar_wait(&run->sh->bar);
					if (r == 0 && rank == 0 && run->cold)
						bench_evict();
					if (r == 0)
						r = xbar_wait(&run->sh->bar);
					if (r < 0)
						break;
				}
				bool tick = rank == 0 && job == 0 && i >= run->warmup;
				uint64_t k0 = tick ? cpu_ticks(run->zerod) : 0;
				ns = iteration(c, plan, kind == 0 ? -1.0f : v, why, whylen);
				if (ns < 0) {
					r = (int)ns;
					goto out;
				}
				if (kind == 1)
					over_ns = ns;
				else if (i >= run->warmup)
					t[i - run->warmup] = (double)ns;
				r = xbar_wait(&run->sh->bar); /* every rank's step is done */
				if (tick)
					run->sh->zticks[kind] += cpu_ticks(run->zerod) - k0;
			}
		if (r < 0)
			goto out;
		if (i >= run->warmup) {
			size_t series = (size_t)run->nproc * (size_t)run->iters;
			t[SER_FILL * series + (size_t)(i - run->warmup)] = (double)fill_ns;
			t[SER_OVERLAP * series + (size_t)(i - run->warmup)] = (double)over_ns;
		}
		if (job == 1)
			continue; /* checkpoints: the first job's */
		int every = run->cfg->checkpoint_every,
		    k = (i + 1 - run->warmup) / (every ? every : 1),
		    kn = (i + 2 - run->warmup) / (every ? every : 1);
		if (every && rank == 0 && i + 1 >= run->warmup &&
		    (i + 2 - run->warmup) % every == 0 && kn <= MAX_CKPTS)
			run->sh->copy_ns[kn - 1] = copy_floor_ns(&cf);
		if (every && i >= run->warmup && (i + 1 - run->warmup) % every == 0 &&
		    k <= MAX_CKPTS) {
			int64_t t0 = bench_ns();
			r = zc_checkpoint(c, run->cfg->checkpoint_dir);
			if (r >= 0 && run->cfg->checkpoint_sync)
				r = zc_checkpoint_wait(c, -1);
			if (r < 0) {
				snprintf(why, whylen, "zc_checkpoint: %s", zc_error_message());
				goto out;
			}
			run->sh->ck[rank][k - 1] = (double)(bench_ns() - t0);
		}
	}
	/* the last checkpoint written: it must have been (not timed) */
	if (run->cfg->checkpoint_every && (r = zc_checkpoint_wait(c, -1)) < 0) {
		snprintf(why, whylen, "zc_checkpoint_wait: %s", zc_error_message());
		goto out;
	}
	/* Every rank is still connected: the job is active with all its state. */
	r = xbar_wait(&run->sh->bar);
	if (r == 0 && rank == 0)
		run->sh->rss_anon = rss_anon_bytes(run->zerod);
	if (r == 0)
		r = xbar_wait(&run->sh->bar);
out:
	free(cf.src);
	free(cf.dst);
	return r;
}

/* Memfd-backed buffers, sealed as zerod wants them. */
static int bench_memfd(uint64_t bytes, int *ret_fd)
{
	int fd = memfd_create("zerod-bench", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)bytes) < 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) < 0) {
		int r = -errno;
		close(fd);
		return r;
	}
	*ret_fd = fd;
	return 0;
}

/* --shared-params: this rank's own gradient memfd, and the parameter memfd
 * every rank inherited from the bench (ZC_BUFFERS_SHARED_PARAMS). */
static int shared_buffers(struct run *run, zc_client *c)
{
	struct zc_buffers b = ZC_BUFFERS_INIT;
	uint64_t bytes;
	int r = zc_plan_buffer_bytes(&run->plan, &bytes);

	if (r >= 0)
		r = bench_memfd(bytes, &b.grad_fd);
	if (r < 0)
		return r;
	b.param_fd = run->param_fd;
	b.flags = ZC_BUFFERS_SHARED_PARAMS;
	r = zc_register_buffers(c, &run->plan, &b);
	close(b.grad_fd);
	return r;
}

static int rank_main(struct run *run, uint32_t proc)
{
	struct zc_config zc = ZC_CONFIG_INIT;
	char why[200] = "";
	zc_client *c = NULL;
	/* process proc is rank proc % R of job proc / R */
	uint32_t rank = proc % run->cfg->ranks, job = proc / run->cfg->ranks;
	int r;

	zc.socket = run->d->sock;
	zc.job_id = job ? run->job2 : run->job;
	zc.rank = zc.local_rank = rank;
	zc.world_size = zc.local_size = run->cfg->ranks;
	if (run->cfg->daemons >= 2) {
		uint32_t n = run->cfg->daemons, node;

		bench_node_of(n, run->cfg->ranks, rank, &node, &zc.local_rank, &zc.local_size);
		zc.socket = run->d[node].sock;
		zc.rdzv = run->rdzv;
		zc.job_secret = run->secret;
		zc.nnodes = n;
		zc.node_rank = node;
		zc.has_node_rank = 1;
	}
	zc.connect_timeout_ms = 10000;
	zc.register_timeout_ms = 120000;
	r = zc_connect(&zc, &c);
	if (r < 0) {
		snprintf(why, sizeof(why), "%s", zc_error_message());
		goto out;
	}
	r = job ? shared_buffers(run, c) : zc_alloc_buffers(c, &run->plan);
	if (r >= 0)
		r = rank_run(run, proc, c, why, sizeof(why));
	if (r < 0 && !why[0])
		snprintf(why, sizeof(why), "%s", zc_error_message());
out:
	if (r < 0 && r != -ECANCELED) {
		run->sh->err[proc] = r;
		snprintf(run->sh->msg[proc], sizeof(run->sh->msg[proc]), "%s", why);
		xbar_abort(&run->sh->bar);
	}
	zc_close(c);
	return r < 0 ? 1 : 0;
}

/* Fork the ranks, wait for them (killing all at the deadline), report the
 * first error. */
static int run_ranks(struct run *run, int timeout_s)
{
	uint32_t n = run->nproc;
	size_t size = sizeof(struct shared) + SER_N * (size_t)n * (size_t)run->iters * sizeof(double);
	pid_t pids[128] = {0};
	int r = 0;
	int64_t deadline = bench_ns() + (int64_t)timeout_s * 1000000000ll;

	run->sh = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (run->sh == MAP_FAILED)
		return -errno;
	run->sh->bar.n = n;
	fflush(stdout);
	fflush(stderr);
	for (uint32_t k = 0; k < n; k++) {
		pids[k] = fork();
		if (pids[k] == 0)
			_exit(rank_main(run, k));
		if (pids[k] < 0) {
			r = -errno;
			xbar_abort(&run->sh->bar);
			break;
		}
	}
	for (uint32_t k = 0; k < n; k++) {
		int st;
		while (pids[k] > 0 && waitpid(pids[k], &st, WNOHANG) == 0) {
			if (bench_ns() > deadline) {
				for (uint32_t j = 0; j < n; j++)
					if (pids[j] > 0)
						kill(pids[j], SIGKILL);
				r = -ETIMEDOUT;
			}
			usleep(2000);
		}
	}
	for (uint32_t k = 0; k < n && r == 0; k++)
		if (run->sh->err[k]) {
			r = run->sh->err[k];
			fprintf(stderr, "zerod-bench: %s rank %u: %s: %s\n",
				k < run->cfg->ranks ? run->job : run->job2, k % run->cfg->ranks,
				zc_strerror_name(r), run->sh->msg[k]);
		}
	return r;
}

static void end_run(struct run *run)
{
	size_t size = sizeof(struct shared) +
		      SER_N * (size_t)run->nproc * (size_t)run->iters * sizeof(double);

	if (run->sh && run->sh != MAP_FAILED)
		munmap(run->sh, size);
}

int bench_rdzv(char rdzv[32], char secret[33])
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof(a);
	unsigned char key[16];
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	int r = 0;

	if (fd < 0)
		return -errno;
	if (bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 ||
	    getsockname(fd, (struct sockaddr *)&a, &len) < 0)
		r = -errno;
	close(fd);
	if (r < 0)
		return r;
	if (getrandom(key, sizeof(key), 0) != (ssize_t)sizeof(key))
		return -EIO;
	for (size_t i = 0; i < sizeof(key); i++)
		snprintf(secret + 2 * i, 3, "%02x", key[i]);
	snprintf(rdzv, 32, "127.0.0.1:%u", (unsigned)ntohs(a.sin_port));
	return 0;
}

void bench_node_of(uint32_t nodes, uint32_t world, uint32_t rank, uint32_t *node,
		   uint32_t *local_rank, uint32_t *local_size)
{
	uint32_t k = 0;

	while (k + 1 < nodes && rank >= (k + 1) * world / nodes)
		k++;
	*node = k;
	*local_rank = rank - k * world / nodes;
	*local_size = (k + 1) * world / nodes - k * world / nodes;
}

/* The stall of the iterations that checkpoint (checkpoint k after timed
 * iteration (k+1)*every - 1): each one's slowest rank's iteration +
 * zc_checkpoint() over the median of the iterations that do not. */
static void ckpt_stall(const struct run *run, const struct bench_cfg *cfg, struct job_result *ret)
{
	int every = cfg->checkpoint_every, n = 0;
	double *plain = calloc((size_t)cfg->iters, sizeof(double)),
	       *extra = calloc((size_t)ret->checkpoints, sizeof(double)), base;

	if (!plain || !extra)
		goto out;
	for (int i = 0; i < cfg->iters; i++) {
		double slowest = 0;
		if ((i + 1) % every == 0 && (i + 1) / every <= ret->checkpoints)
			continue;
		for (uint32_t k = 0; k < cfg->ranks; k++) {
			double v = run->sh->t[(size_t)k * (size_t)cfg->iters + (size_t)i];
			slowest = v > slowest ? v : slowest;
		}
		plain[n++] = slowest;
	}
	if (n == 0)
		goto out;
	base = bench_quantile(plain, (size_t)n, 0.5);
	for (int j = 0; j < ret->checkpoints; j++) {
		size_t i = (size_t)(j + 1) * (size_t)every - 1;
		double slowest = 0;
		for (uint32_t k = 0; k < cfg->ranks; k++) {
			double v =
				run->sh->t[(size_t)k * (size_t)cfg->iters + i] + run->sh->ck[k][j];
			slowest = v > slowest ? v : slowest;
		}
		extra[j] = slowest - base;
	}
	ret->ckpt_stall_max_ms = bench_quantile(extra, (size_t)ret->checkpoints, 1) / 1e6;
	ret->ckpt_stall_ms = bench_quantile(extra, (size_t)ret->checkpoints, 0.5) / 1e6;
	for (int j = 0; j < ret->checkpoints; j++)
		plain[j] = run->sh->copy_ns[j];
	ret->ckpt_copy_ms = bench_quantile(plain, (size_t)ret->checkpoints, 0.5) / 1e6;
	ret->ckpt_bytes = ckpt_bytes(cfg);
out:
	free(plain);
	free(extra);
}

/* The iterations of job `job` (0, or 1 for the shared one) in series ser,
 * each its slowest rank's, into it[]. */
static void series_slowest(const struct run *run, uint32_t job, int ser, double *it)
{
	const struct bench_cfg *cfg = run->cfg;
	const double *t = run->sh->t + (size_t)ser * run->nproc * (size_t)cfg->iters;

	for (int i = 0; i < cfg->iters; i++) {
		it[i] = 0;
		for (uint32_t k = job * cfg->ranks; k < (job + 1) * cfg->ranks; k++) {
			double v = t[(size_t)k * (size_t)cfg->iters + (size_t)i];
			it[i] = v > it[i] ? v : it[i];
		}
	}
}

/* The median and fastest of the iterations of job `job`, and with the
 * overlapped kind its median, the fill's, and their difference. */
static void iter_times(const struct run *run, uint32_t job, double *it, struct job_result *ret)
{
	size_t n = (size_t)run->cfg->iters;

	series_slowest(run, job, SER_HANDOVER, it);
	ret->iter_min_ms = bench_quantile(it, n, 0) / 1e6;
	ret->iter_ms = bench_quantile(it, n, 0.5) / 1e6;
	series_slowest(run, job, SER_FILL, it);
	ret->fill_ms = bench_quantile(it, n, 0.5) / 1e6;
	ret->overlap_ms = ret->comparable_ms = NAN;
	if (!run->overlap)
		return;
	series_slowest(run, job, SER_OVERLAP, it);
	ret->overlap_ms = bench_quantile(it, n, 0.5) / 1e6;
	ret->comparable_ms = ret->overlap_ms - ret->fill_ms;
}

int job_iterations(const struct bench_daemon *d, const struct bench_cfg *cfg,
		   struct job_result *ret, struct job_result *ret_shared)
{
	struct zc_segment *segs = calloc(cfg->nbuckets, sizeof(*segs));
	struct zc_bucket *bks = calloc(cfg->nbuckets, sizeof(*bks));
	double *it = calloc((size_t)cfg->iters, sizeof(double));
	struct run run = {.d = d,
			  .cfg = cfg,
			  .job = "bench-iter",
			  .job2 = "bench-iter-shared",
			  .warmup = cfg->warmup,
			  .iters = cfg->iters,
			  .param_fd = -1,
			  .nproc = ret_shared ? 2 * cfg->ranks : cfg->ranks,
			  .overlap = cfg->overlap,
			  .cold = cfg->cold,
			  .zerod = d->pid};
	uint64_t left = cfg->params;
	int r = -ENOMEM;

	if (!segs || !bks || !it)
		goto out;
	if (cfg->daemons >= 2) {
		r = bench_rdzv(run.rdzv, run.secret);
		if (r < 0)
			goto out;
		r = -ENOMEM;
	}
	for (uint32_t b = 0; b < cfg->nbuckets; b++) {
		uint64_t numel = left < cfg->bucket_numel ? left : cfg->bucket_numel;
		segs[b] = (struct zc_segment){
			.size = sizeof(segs[b]), .offset = 0, .numel = numel, .group = 0};
		bks[b] = (struct zc_bucket){
			.size = sizeof(bks[b]), .numel = numel, .nsegments = 1, .segments = &segs[b]};
		left -= numel;
	}
	run.plan = (struct zc_plan){.size = sizeof(run.plan),
				    .optimizer = cfg->optim,
				    .shard_mode = cfg->shard,
				    .step_mode = cfg->step,
				    .ngroups = 1,
				    .groups = &cfg->hp,
				    .nbuckets = cfg->nbuckets,
				    .buckets = bks};
	if (ret_shared) {
		uint64_t bytes;
		r = zc_plan_buffer_bytes(&run.plan, &bytes);
		if (r >= 0)
			r = bench_memfd(bytes, &run.param_fd);
		if (r < 0)
			goto out;
	}
	r = run_ranks(&run, 120 + 5 * (cfg->warmup + cfg->iters));
	if (r < 0)
		goto out;
	/* An iteration ends when its slowest rank has its step. */
	iter_times(&run, 0, it, ret);
	if (ret_shared) {
		iter_times(&run, 1, it, ret_shared);
		ret_shared->rss_anon_bytes = run.sh->rss_anon;
	}
	ret->rss_anon_bytes = run.sh->rss_anon;
	ret->zerod_cpu_ms =
		(double)run.sh->zticks[0] / (double)sysconf(_SC_CLK_TCK) / cfg->iters * 1e3;
	ret->zerod_overlap_cpu_ms = cfg->overlap ? (double)run.sh->zticks[1] /
							   (double)sysconf(_SC_CLK_TCK) /
							   cfg->iters * 1e3
						 : NAN;
	ret->checkpoints = cfg->checkpoint_every ? cfg->iters / cfg->checkpoint_every : 0;
	if (ret->checkpoints > MAX_CKPTS)
		ret->checkpoints = MAX_CKPTS;
	for (int i = 0; i < ret->checkpoints; i++) {
		it[i] = 0;
		for (uint32_t k = 0; k < cfg->ranks; k++)
			it[i] = run.sh->ck[k][i] > it[i] ? run.sh->ck[k][i] : it[i];
	}
	if (ret->checkpoints) {
		ret->ckpt_max_ms = bench_quantile(it, (size_t)ret->checkpoints, 1) / 1e6;
		ret->ckpt_ms = bench_quantile(it, (size_t)ret->checkpoints, 0.5) / 1e6;
		ckpt_stall(&run, cfg, ret);
	}
out:
	end_run(&run);
	if (run.param_fd >= 0)
		close(run.param_fd);
	free(segs);
	free(bks);
	free(it);
	return r;
}

int job_handoff(const struct bench_daemon *d, const struct bench_cfg *cfg, double *ret_p50_us,
		double *ret_p99_us)
{
	const struct zc_segment seg = {.size = sizeof(seg), .offset = 0, .numel = 16, .group = 0};
	const struct zc_bucket bk = {
		.size = sizeof(bk), .numel = 16, .nsegments = 1, .segments = &seg};
	struct run run = {.d = d,
			  .cfg = cfg,
			  .nproc = cfg->ranks,
			  .job = "bench-handoff",
			  .iters = cfg->handoff_iters,
			  .warmup = cfg->handoff_iters / 10 + 10,
			  .param_fd = -1,
			  .zerod = d->pid};
	size_t n = (size_t)cfg->ranks * (size_t)cfg->handoff_iters;
	int r;

	run.plan = (struct zc_plan){.size = sizeof(run.plan),
				    .optimizer = cfg->optim,
				    .shard_mode = cfg->shard,
				    .step_mode = cfg->step,
				    .ngroups = 1,
				    .groups = &cfg->hp,
				    .nbuckets = 1,
				    .buckets = &bk};
	r = run_ranks(&run, 120 + cfg->handoff_iters / 100);
	if (r == 0) {
		/* every rank's own ready -> done, pooled */
		*ret_p50_us = bench_quantile(run.sh->t, n, 0.5) / 1e3;
		*ret_p99_us = bench_quantile(run.sh->t, n, 0.99) / 1e3;
	}
	end_run(&run);
	return r;
}
