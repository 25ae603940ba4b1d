/*
 * handoff-bench.c — a quick measurement of the tiny-bucket handoff (issue 5
 * §3): zc_bucket_ready() -> the step future done, for a one-rank job with
 * one bucket of 16 floats, through the fast path (shared ring + doorbell)
 * and through ZeroMQ alone (ZEROD_FASTPATH=0), beside the floor it is
 * judged against, a 1-byte ping-pong over an AF_UNIX socketpair between two
 * processes, all in the same run. The real benchmark is
 * tools/bench/zerod-bench --handoff; this one only checks the target.
 *
 *   zerod-handoff-bench [--zerod PATH] [--iters N] [--rounds R] [--json] [--cpu]
 *
 * --cpu adds where the time goes: CPU time per handoff of each zerod thread
 * and of this process, from /proc/PID/task/TID/schedstat.
 *
 * It starts its own zerod (PATH, else $ZEROD_BIN) on a private socket. The
 * three measurements are interleaved over R rounds so that a noisy
 * neighbour hurts them alike; p50 and p99 are over every sample.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "zeroclient.h"

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* Run time (ns) of every thread of pid, by tid, into t[0..n). */
struct thread_time {
	int tid;
	char name[32];
	uint64_t ns;
};

static int thread_times(pid_t pid, struct thread_time *t, int max)
{
	char path[96], buf[128];
	DIR *dir;
	struct dirent *e;
	int n = 0;

	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	dir = opendir(path);
	if (!dir)
		return 0;
	while ((e = readdir(dir)) && n < max) {
		FILE *f;
		if (e->d_name[0] == '.')
			continue;
		t[n] = (struct thread_time){.tid = atoi(e->d_name)};
		snprintf(path, sizeof(path), "/proc/%d/task/%d/schedstat", (int)pid, t[n].tid);
		if ((f = fopen(path, "r"))) {
			if (fscanf(f, "%" SCNu64, &t[n].ns) != 1)
				t[n].ns = 0;
			fclose(f);
		}
		snprintf(path, sizeof(path), "/proc/%d/task/%d/comm", (int)pid, t[n].tid);
		if ((f = fopen(path, "r"))) {
			if (fgets(buf, sizeof(buf), f))
				snprintf(t[n].name, sizeof(t[n].name), "%.*s",
					 (int)strcspn(buf, "\n"), buf);
			fclose(f);
		}
		n++;
	}
	closedir(dir);
	return n;
}

static void cpu_report(const char *what, pid_t pid, const struct thread_time *a, int na,
		       const struct thread_time *b, int nb, long handoffs)
{
	for (int i = 0; i < nb; i++) {
		uint64_t before = 0;
		for (int k = 0; k < na; k++)
			if (a[k].tid == b[i].tid)
				before = a[k].ns;
		if (b[i].ns - before > 0)
			printf("  %-6s %-16s tid %-7d %6.2f us per handoff\n", what, b[i].name,
			       b[i].tid == pid ? 0 : b[i].tid,
			       (double)(b[i].ns - before) / 1e3 / (double)handoffs);
	}
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double pct(double *v, size_t n, double p)
{
	size_t i = (size_t)(p * (double)(n - 1) + 0.5);

	qsort(v, n, sizeof(*v), cmp_double);
	return v[i < n ? i : n - 1];
}

/* n round trips of one byte between this process and a forked echo. */
static int unix_rtt(double *out, int n)
{
	int sv[2];
	pid_t pid;
	char b = 'x';

	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		return -errno;
	pid = fork();
	if (pid < 0)
		return -errno;
	if (pid == 0) {
		close(sv[0]);
		while (read(sv[1], &b, 1) == 1)
			if (write(sv[1], &b, 1) != 1)
				break;
		_exit(0);
	}
	close(sv[1]);
	for (int i = -100; i < n; i++) {
		double t0 = now_us();
		if (write(sv[0], &b, 1) != 1 || read(sv[0], &b, 1) != 1)
			break;
		if (i >= 0)
			out[i] = now_us() - t0;
	}
	close(sv[0]);
	waitpid(pid, NULL, 0);
	return 0;
}

static const struct zc_param_group group = {.size = sizeof(struct zc_param_group), .lr = 1e-3};
static const struct zc_segment seg = {.size = sizeof(struct zc_segment), .numel = 16};
static const struct zc_bucket bucket = {
	.size = sizeof(struct zc_bucket), .nsegments = 1, .numel = 16, .segments = &seg};
static const struct zc_plan plan = {.size = sizeof(struct zc_plan),
				    .optimizer = ZC_OPT_SGD,
				    .shard_mode = ZC_SHARD_BUCKET,
				    .step_mode = ZC_STEP_INTERLEAVED,
				    .ngroups = 1,
				    .nbuckets = 1,
				    .groups = &group,
				    .buckets = &bucket};

struct job {
	zc_client *c;
};

/* Connect and register job `name`; the client reads ZEROD_FASTPATH when it
 * registers, so set it first. */
static int job_open(struct job *j, const char *sock, const char *name, bool fast)
{
	struct zc_config cfg = ZC_CONFIG_INIT;
	int r;

	setenv("ZEROD_FASTPATH", fast ? "1" : "0", 1);
	cfg.socket = sock;
	cfg.job_id = name;
	cfg.world_size = cfg.local_size = 1;
	r = zc_connect(&cfg, &j->c);
	if (r < 0)
		return r;
	if ((r = zc_alloc_buffers(j->c, &plan)) < 0 || (r = zc_register_plan(j->c)) < 0) {
		fprintf(stderr, "register %s: %s %s\n", name, zc_strerror_name(r),
			zc_error_message());
		zc_close(j->c);
		return r;
	}
	return 0;
}

static int handoff(struct job *j, double *out, int n)
{
	for (int i = -100; i < n; i++) {
		uint64_t it = zc_iteration(j->c);
		zc_future *f;
		double t0 = now_us();
		int r = zc_bucket_ready(j->c, 0, NULL);

		if (r >= 0)
			r = zc_step_future(j->c, it, &f);
		if (r < 0)
			return r;
		r = zc_future_wait(f, 10000);
		zc_future_free(f);
		if (r != 1)
			return r < 0 ? r : -ETIMEDOUT;
		if (i >= 0)
			out[i] = now_us() - t0;
	}
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {{"zerod", required_argument, NULL, 'z'},
					     {"iters", required_argument, NULL, 'n'},
					     {"rounds", required_argument, NULL, 'r'},
					     {"json", no_argument, NULL, 'j'},
					     {"cpu", no_argument, NULL, 'c'},
					     {NULL, 0, NULL, 0}};
	const char *bin = getenv("ZEROD_BIN");
	char dir[] = "/tmp/zerod-handoff.XXXXXX", sock[128];
	int iters = 2000, rounds = 5, opt, r = 1;
	bool json = false, cpu = false;
	double *fast, *slow, *ux;
	struct job jf = {0}, js = {0};
	pid_t zd;

	while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (opt) {
		case 'z':
			bin = optarg;
			break;
		case 'n':
			iters = atoi(optarg);
			break;
		case 'r':
			rounds = atoi(optarg);
			break;
		case 'j':
			json = true;
			break;
		case 'c':
			cpu = true;
			break;
		default:
			fprintf(stderr, "usage: %s [--zerod PATH] [--iters N] [--rounds R] [--json]\n",
				argv[0]);
			return 2;
		}
	}
	if (!bin || iters < 1 || rounds < 1) {
		fprintf(stderr, "need --zerod PATH (or $ZEROD_BIN), --iters >= 1, --rounds >= 1\n");
		return 2;
	}
	if (!mkdtemp(dir))
		return 1;
	snprintf(sock, sizeof(sock), "%s/zerod.sock", dir);
	zd = fork();
	if (zd == 0) {
		int fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
		dup2(fd, 2);
		unsetenv("ZEROD_FASTPATH");
		execl(bin, bin, "--socket", sock, "-q", (char *)NULL);
		_exit(127);
	}
	for (int i = 0; i < 500 && access(sock, F_OK) < 0; i++)
		usleep(10000);
	fast = calloc((size_t)iters * rounds, sizeof(double));
	slow = calloc((size_t)iters * rounds, sizeof(double));
	ux = calloc((size_t)iters * rounds, sizeof(double));
	if (!fast || !slow || !ux || job_open(&jf, sock, "handoff-fast", true) < 0 ||
	    job_open(&js, sock, "handoff-zmq", false) < 0)
		goto out;
	for (int k = 0; k < rounds; k++) {
		size_t at = (size_t)k * iters;
		if (unix_rtt(ux + at, iters) < 0 || handoff(&jf, fast + at, iters) < 0 ||
		    handoff(&js, slow + at, iters) < 0) {
			fprintf(stderr, "round %d failed\n", k);
			goto out;
		}
	}
	if (cpu) {
		struct thread_time za[64], zb[64], sa[64], sb[64];
		struct job *jobs[2] = {&jf, &js};
		const char *names[2] = {"fast", "zeromq"};

		for (int k = 0; k < 2; k++) {
			int nza = thread_times(zd, za, 64), nsa = thread_times(getpid(), sa, 64);
			if (handoff(jobs[k], fast, iters) < 0)
				goto out;
			int nzb = thread_times(zd, zb, 64), nsb = thread_times(getpid(), sb, 64);
			printf("CPU per handoff, %s (iterations %d):\n", names[k], iters + 100);
			cpu_report("zerod", zd, za, nza, zb, nzb, iters + 100);
			cpu_report("client", getpid(), sa, nsa, sb, nsb, iters + 100);
		}
	}
	{
		size_t n = (size_t)iters * rounds;
		double u50 = pct(ux, n, 0.5), u99 = pct(ux, n, 0.99);
		double f50 = pct(fast, n, 0.5), f99 = pct(fast, n, 0.99);
		double s50 = pct(slow, n, 0.5), s99 = pct(slow, n, 0.99);

		if (json)
			printf("{\"handoff_p50_us\": %.1f, \"handoff_p99_us\": %.1f, "
			       "\"handoff_zmq_p50_us\": %.1f, \"handoff_zmq_p99_us\": %.1f, "
			       "\"unix_rtt_us\": %.1f, \"unix_rtt_p99_us\": %.1f, "
			       "\"samples\": %zu}\n",
			       f50, f99, s50, s99, u50, u99, n);
		else
			printf("AF_UNIX ping-pong   p50 %7.1f us  p99 %7.1f us\n"
			       "handoff, fast path  p50 %7.1f us  p99 %7.1f us  (%.2fx the "
			       "ping-pong)\n"
			       "handoff, ZeroMQ     p50 %7.1f us  p99 %7.1f us  (%.2fx)\n"
			       "%zu samples each, interleaved over %d rounds\n",
			       u50, u99, f50, f99, f50 / u50, s50, s99, s50 / u50, n, rounds);
	}
	r = 0;
out:
	zc_close(jf.c);
	zc_close(js.c);
	kill(zd, SIGTERM);
	waitpid(zd, NULL, 0);
	rmdir(dir);
	free(fast);
	free(slow);
	free(ux);
	return r;
}
