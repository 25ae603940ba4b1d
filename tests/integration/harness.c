/* harness.c — see harness.h. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
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

	return poll(&p, 1, test_timeout(timeout_ms)) == 1 && read(fd, &ch, 1) == 1;
}

int zd_free_port(void)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof(sa);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), port = -1;

	if (fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
	    getsockname(fd, (struct sockaddr *)&sa, &len) == 0)
		port = ntohs(sa.sin_port);
	if (fd >= 0)
		close(fd);
	return port;
}

/* Exec zerod (under $ZEROD_WRAPPER), first through prlimit(1) where
 * prefix names it (see zd_start_ex). */
static _Noreturn void exec_with(const char *const *prefix, const char *bin,
				const char *const *args)
{
	const char *wrapper = getenv("ZEROD_WRAPPER");
	char *words = wrapper ? strdup(wrapper) : NULL, *save = NULL;
	const char *argv[64];
	int n = 0;

	for (; prefix && *prefix && n < 8; prefix++)
		argv[n++] = *prefix;
	for (char *w = words ? strtok_r(words, " \t", &save) : NULL; w && n < 32;
	     w = strtok_r(NULL, " \t", &save))
		argv[n++] = w;
	argv[n++] = bin;
	for (; args && *args && n < 63; args++)
		argv[n++] = *args;
	argv[n] = NULL;
	execvp(argv[0], (char *const *)argv);
	_exit(127);
}

_Noreturn void zd_exec(const char *bin, const char *const *args)
{
	exec_with(NULL, bin, args);
}

int zd_start(struct zd *d, const char *const *extra)
{
	const struct zd_opts o = {.nofile = 0, .stderr_fd = -1};

	return zd_start_ex(d, extra, &o);
}

int zd_start_ex(struct zd *d, const char *const *extra, const struct zd_opts *o)
{
	const char *bin = getenv("ZEROD_BIN");
	const char *args[32];
	char ctl[sizeof(d->sock) + 8];
	int n = 0;
	int64_t deadline;
	pid_t parent = getpid();

	memset(d, 0, sizeof(*d));
	if (!bin)
		return -ENOENT;
	snprintf(d->dir, sizeof(d->dir), "%.80s/zerod-test.XXXXXX", test_tmpdir());
	if (!mkdtemp(d->dir))
		return -errno;
	snprintf(d->sock, sizeof(d->sock), "%s/zerod.sock", d->dir);
	snprintf(d->log, sizeof(d->log), "%s/zerod.log", d->dir);
	args[n++] = "--socket";
	args[n++] = d->sock;
	for (; extra && *extra && n < 31; extra++)
		args[n++] = *extra;
	args[n] = NULL;
	fflush(stdout);
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
		/* no zerod outlives its test, however the test ends */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(127);
		if (o->nofile) {
			struct rlimit rl = {o->nofile, o->nofile};
			char lim[48];
			const char *prefix[] = {"prlimit", lim, "--", NULL};

			/* valgrind lets the test (this process, until the exec)
			 * set no hard limit: prlimit, which runs natively, does */
			if (setrlimit(RLIMIT_NOFILE, &rl) < 0) {
				snprintf(lim, sizeof(lim), "--nofile=%u:%u", o->nofile, o->nofile);
				exec_with(prefix, bin, args);
			}
		}
		zd_exec(bin, args);
	}
	deadline = test_ms() + test_timeout(10000);
	snprintf(ctl, sizeof(ctl), "%s" ZEROD_CTL_SUFFIX, d->sock);
	while (test_ms() < deadline) {
		/* the control socket comes after the trainers' one: a case
		 * may ask zeroctl first (slow under valgrind) */
		if (access(d->sock, F_OK) == 0 && access(ctl, F_OK) == 0)
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
	return d->pid > 0 && proc_alive(d->pid);
}

int zd_stop(struct zd *d, int timeout_ms)
{
	char cmd[300];
	int r;

	if (d->pid <= 0)
		return -ECHILD;
	/* a zerod the runner reaped already (a case stopped it) is not signalled:
	 * its pid may be another process's by now */
	if (test_reaped(d->pid) < 0)
		kill(d->pid, SIGTERM);
	r = wait_child(d->pid, timeout_ms);
	/* (no directory: a case stopped it, and said so then) */
	if (r == ZD_CHECKER_EXIT && access(d->dir, F_OK) == 0) {
		test_failed_++;
		printf("# zerod (pid %d) exited with %d: valgrind or a sanitizer found errors in "
		       "it. Its log:\n",
		       (int)d->pid, r);
		zd_dump_log(d);
	}
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

bool zd_wait_log(const struct zd *d, const char *needle, int timeout_ms)
{
	int64_t deadline = test_ms() + test_timeout(timeout_ms);

	while (!zd_log_has(d, needle)) {
		if (test_ms() >= deadline)
			return false;
		usleep(10000);
	}
	return true;
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
	/* a case may have stopped it already: then this reads its status */
	if (d->pid > 0 && zd_stop(d, 5000) == ZD_CHECKER_EXIT)
		r = 1;
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

/* Is pid a zombie (exited, not yet reaped by its parent)? */
static bool proc_zombie(pid_t pid)
{
	char path[64], buf[256], *p;
	ssize_t len;
	int fd;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return true; /* gone altogether */
	len = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (len <= 0)
		return true;
	buf[len] = '\0';
	p = strrchr(buf, ')'); /* "pid (comm) S ...": comm may hold anything */
	return !p || p[1] != ' ' || p[2] == 'Z' || p[2] == 'X';
}

bool proc_alive(pid_t pid)
{
	siginfo_t si = {0};

	if (pid <= 0)
		return false;
	if (waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0)
		return si.si_pid == 0; /* our child: not exited */
	/* not our child: the runner reaps it (see test_reaped()) */
	return test_reaped(pid) < 0 && kill(pid, 0) == 0 && !proc_zombie(pid);
}

int wait_child(pid_t pid, int timeout_ms)
{
	int64_t deadline = test_ms() + test_timeout(timeout_ms), gone_at = 0;
	int st;

	for (;;) {
		pid_t r = waitpid(pid, &st, WNOHANG);
		if (r == pid)
			return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
		if (r < 0 && errno != ECHILD)
			return -errno;
		if (r < 0) {
			/* not our child: the runner reaps it and says how it ended */
			int s = test_reaped(pid);
			if (s >= 0)
				return s;
			/* gone, and not recorded: the runner may be between its
			 * waitpid() and the record (a moment), or nobody knows it */
			if (kill(pid, 0) < 0 && test_reaped(pid) < 0) {
				if (!gone_at)
					gone_at = test_ms();
				else if (test_ms() - gone_at > 1000)
					return -ECHILD;
			}
		}
		if (test_ms() >= deadline) {
			kill(pid, SIGKILL);
			if (r == 0)
				waitpid(pid, &st, 0);
			return -ETIMEDOUT; /* (the runner reaps one not ours) */
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
	c.connect_timeout_ms = test_timeout(10000);
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

/* The highest status serial in d's log (0: none yet). */
static unsigned last_status(const struct zd *d)
{
	char line[1200];
	unsigned last = 0, serial;
	FILE *f = fopen(d->log, "r");

	while (f && fgets(line, sizeof(line), f)) {
		char *p = strstr(line, "status ");
		if (p && sscanf(p, "status %u:", &serial) == 1 && serial > last)
			last = serial;
	}
	if (f)
		fclose(f);
	return last;
}

/* The serial to wait for comes from the log itself, not from this process:
 * each case runs in a process of its own, and earlier cases asked too. */
int zd_status(struct zd *d, struct zd_status *ret)
{
	unsigned want = last_status(d) + 1;
	int64_t deadline = test_ms() + test_timeout(3000);
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
			    serial < want)
				continue;
			fclose(f);
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
