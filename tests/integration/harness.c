/* harness.c — see harness.h. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "testlib.h"

int child_bad;

const char *test_tmpdir(void)
{
	const char *t = getenv("TMPDIR");

	return t && *t && strlen(t) <= 80 ? t : "/tmp";
}

int64_t test_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void signal_pipe(int fd)
{
	(void)!write(fd, "x", 1);
}

bool wait_pipe(int fd, int timeout_ms)
{
	struct pollfd p = {.fd = fd, .events = POLLIN};
	char ch;

	return poll(&p, 1, timeout_ms) == 1 && read(fd, &ch, 1) == 1;
}

int zd_start(struct zd *d, const char *const *extra)
{
	const struct zd_opts o = {.nofile = 0, .stderr_fd = -1};

	return zd_start_ex(d, extra, &o);
}

int zd_start_ex(struct zd *d, const char *const *extra, const struct zd_opts *o)
{
	const char *bin = getenv("ZEROD_BIN");
	const char *argv[32];
	int n = 0;
	int64_t deadline;

	memset(d, 0, sizeof(*d));
	if (!bin)
		return -ENOENT;
	snprintf(d->dir, sizeof(d->dir), "%.80s/zerod-test.XXXXXX", test_tmpdir());
	if (!mkdtemp(d->dir))
		return -errno;
	snprintf(d->sock, sizeof(d->sock), "%s/zerod.sock", d->dir);
	snprintf(d->log, sizeof(d->log), "%s/zerod.log", d->dir);
	argv[n++] = bin;
	argv[n++] = "--socket";
	argv[n++] = d->sock;
	for (; extra && *extra && n < 30; extra++)
		argv[n++] = *extra;
	argv[n] = NULL;
	d->pid = fork();
	if (d->pid < 0)
		return -errno;
	if (d->pid == 0) {
		int fd = o->stderr_fd >= 0 ? o->stderr_fd
					   : open(d->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		if (fd >= 0 && fd != 2) {
			dup2(fd, 2);
			close(fd);
		}
		if (o->nofile) {
			struct rlimit rl = {o->nofile, o->nofile};
			if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
				_exit(126);
		}
		execv(bin, (char *const *)argv);
		_exit(127);
	}
	deadline = test_ms() + 10000;
	while (test_ms() < deadline) {
		if (access(d->sock, F_OK) == 0)
			return 0;
		if (waitpid(d->pid, NULL, WNOHANG) == d->pid) {
			d->pid = 0;
			zd_dump_log(d);
			return -ECHILD;
		}
		usleep(5000);
	}
	return -ETIMEDOUT;
}

bool zd_alive(struct zd *d)
{
	return d->pid > 0 && waitpid(d->pid, NULL, WNOHANG) == 0;
}

int zd_stop(struct zd *d, int timeout_ms)
{
	char cmd[300];
	int r;

	if (d->pid <= 0)
		return -ECHILD;
	kill(d->pid, SIGTERM);
	r = wait_child(d->pid, timeout_ms);
	d->pid = 0;
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", d->dir);
	if (!getenv("ZEROD_TEST_KEEP"))
		(void)!system(cmd);
	return r;
}

void zd_dump_log(const struct zd *d)
{
	char line[1200];
	FILE *f = fopen(d->log, "r");

	if (!f)
		return;
	while (fgets(line, sizeof(line), f))
		printf("# zerod: %s", line);
	fclose(f);
	fflush(stdout);
}

bool zd_log_has(const struct zd *d, const char *needle)
{
	char line[1200];
	bool found = false;
	FILE *f = fopen(d->log, "r");

	if (!f)
		return false;
	while (!found && fgets(line, sizeof(line), f))
		found = strstr(line, needle) != NULL;
	fclose(f);
	return found;
}

int zd_test_main(struct zd *d, const char *const *extra, const struct test_case *cases, size_t n,
		 int argc, char **argv)
{
	int r = zd_start(d, extra);

	if (r < 0) {
		printf("Bail out! cannot start zerod ($ZEROD_BIN): %s\n", strerror(-r));
		return 1;
	}
	r = test_main(cases, n, argc, argv);
	if (d->pid > 0)
		zd_stop(d, 5000);
	return r;
}

pid_t spawn(int (*fn)(void *arg, int idx), void *arg, int idx)
{
	pid_t pid;

	fflush(stdout);
	fflush(stderr);
	pid = fork();
	if (pid == 0)
		_exit(fn(arg, idx));
	return pid;
}

int wait_child(pid_t pid, int timeout_ms)
{
	int64_t deadline = test_ms() + timeout_ms;
	int st;

	for (;;) {
		pid_t r = waitpid(pid, &st, WNOHANG);
		if (r == pid)
			return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
		if (r < 0)
			return -errno;
		if (test_ms() >= deadline) {
			kill(pid, SIGKILL);
			waitpid(pid, &st, 0);
			return -ETIMEDOUT;
		}
		usleep(2000);
	}
}

struct zc_config test_config(const struct zd *d, const char *job, uint32_t rank, uint32_t world)
{
	struct zc_config c = ZC_CONFIG_INIT;

	c.socket = d->sock;
	c.job_id = job;
	c.rank = rank;
	c.world_size = world;
	c.local_rank = rank;
	c.local_size = world;
	c.connect_timeout_ms = 10000;
	return c;
}

float det_uniform(uint64_t seed, uint64_t a, uint64_t b, uint64_t c)
{
	uint64_t z = seed * 0x9e3779b97f4a7c15ull ^ a * 0xc2b2ae3d27d4eb4full ^
		     b * 0x165667b19e3779f9ull ^ c * 0x27d4eb2f165667c5ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	z ^= z >> 31;
	return (float)((z >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

int shm_count(const char *prefix, bool show)
{
	DIR *dir = opendir("/dev/shm");
	struct dirent *e;
	int n = 0;

	if (!dir)
		return 0;
	while ((e = readdir(dir)))
		if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) {
			if (show)
				printf("# in /dev/shm: %s\n", e->d_name);
			n++;
		}
	closedir(dir);
	return n;
}

int zd_status(struct zd *d, struct zd_status *ret)
{
	unsigned want = d->status_seen + 1;
	int64_t deadline = test_ms() + 3000;
	char line[1200], mem[32];

	if (d->pid <= 0)
		return -ECHILD;
	kill(d->pid, SIGUSR1);
	while (test_ms() < deadline) {
		FILE *f = fopen(d->log, "r");
		while (f && fgets(line, sizeof(line), f)) {
			struct zd_status st;
			unsigned serial;
			char *p = strstr(line, "status ");
			if (!p ||
			    sscanf(p,
				   "status %u: %u jobs, %u sessions, %u connections, %31[^(](%llu "
				   "bytes) of optimizer state, %llu replies dropped, %llu "
				   "connections closed, %llu log lines dropped",
				   &serial, &st.jobs, &st.sessions, &st.conns, mem, &st.memory,
				   &st.replies_dropped, &st.conns_closed, &st.log_dropped) != 9 ||
			    serial != want)
				continue;
			fclose(f);
			d->status_seen = want;
			*ret = st;
			return 0;
		}
		if (f)
			fclose(f);
		usleep(5000);
	}
	return -ETIMEDOUT;
}

int zd_fd_count(const struct zd *d)
{
	char path[64];
	struct dirent *e;
	DIR *dir;
	int n = 0;

	snprintf(path, sizeof(path), "/proc/%d/fd", (int)d->pid);
	dir = opendir(path);
	if (!dir)
		return -1;
	while ((e = readdir(dir)))
		n += e->d_name[0] != '.';
	closedir(dir);
	return n;
}

long zd_status_kb(const struct zd *d, const char *field)
{
	char path[64], line[256];
	size_t n = strlen(field);
	long kb = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)d->pid);
	f = fopen(path, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (strncmp(line, field, n) == 0 && line[n] == ':') {
			kb = atol(line + n + 1);
			break;
		}
	fclose(f);
	return kb;
}

int zd_log_lines(const struct zd *d)
{
	FILE *f = fopen(d->log, "r");
	int n = 0, ch;

	if (!f)
		return 0;
	while ((ch = getc(f)) != EOF)
		n += ch == '\n';
	fclose(f);
	return n;
}
