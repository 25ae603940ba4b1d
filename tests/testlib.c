/*
 * testlib.c — the TAP runner behind testlib.h.
 *
 * The runner forks one child per case and waits for it with the case's
 * timeout; the child runs the case and leaves its result in shared memory.
 * The child leads a process group of its own, so a case that hangs is killed
 * with everything it started, and it dies with the runner (PDEATHSIG). The
 * runner is a child subreaper: what a case leaves running (a background job
 * for later cases) is reparented to it, and it reaps those, and the zerod
 * main() started, recording their statuses for test_reaped().
 */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "testlib.h"

int test_failed_;
const char *test_skip_;

#define REAPED_MAX 256

/* What a case's child tells the runner, and what the runner tells later
 * cases: shared by the runner and every case. */
struct runner_shared {
	int done; /* the case returned (the result below is valid) */
	int failed;
	int skipped;
	char skip_reason[256];
	unsigned nreaped; /* entries ever written to reaped[] (a ring) */
	struct {
		pid_t pid; /* 0 while the entry is being written */
		int status;
	} reaped[REAPED_MAX];
};

static struct runner_shared *rs;
static volatile sig_atomic_t running_case; /* the case's process (group) while it runs */

int test_timeout(int ms)
{
	static double scale;
	double t;

	if (scale == 0) {
		const char *s = getenv("ZEROD_TEST_TIMEOUT_SCALE");
		scale = s ? strtod(s, NULL) : 1;
		if (!(scale > 0))
			scale = 1;
	}
	if (ms < 0)
		return ms;
	t = ms * scale;
	return t >= INT_MAX ? INT_MAX : (int)t;
}

void *test_shared(size_t size)
{
	void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED) {
		printf("Bail out! mmap of %zu shared bytes: %s\n", size, strerror(errno));
		abort();
	}
	return p;
}

/* status: 0..255, or 128 + signal */
static void record_reaped(pid_t pid, int status)
{
	unsigned i = __atomic_load_n(&rs->nreaped, __ATOMIC_RELAXED) % REAPED_MAX;

	__atomic_store_n(&rs->reaped[i].pid, 0, __ATOMIC_RELEASE);
	rs->reaped[i].status = status;
	__atomic_store_n(&rs->reaped[i].pid, pid, __ATOMIC_RELEASE);
	__atomic_add_fetch(&rs->nreaped, 1, __ATOMIC_RELEASE);
}

int test_reaped(pid_t pid)
{
	unsigned n;

	if (!rs || pid <= 0)
		return -1;
	n = __atomic_load_n(&rs->nreaped, __ATOMIC_ACQUIRE);
	/* newest first: a pid reused after a reap is the later entry */
	for (unsigned k = 0; k < n && k < REAPED_MAX; k++) {
		unsigned i = (n - 1 - k) % REAPED_MAX;
		if (__atomic_load_n(&rs->reaped[i].pid, __ATOMIC_ACQUIRE) == pid)
			return rs->reaped[i].status;
	}
	return -1;
}

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Reap every child that has exited; true (and *ret_st) if `pid` was one.
 * Each other child is recorded before it is reaped (waitid's WNOWAIT looks
 * first): a case that finds its process gone (kill(pid, 0) fails) must find
 * its status already there, however long this process is preempted between
 * the two. */
static bool reap(pid_t pid, int *ret_st)
{
	bool found = false;

	for (;;) {
		siginfo_t si = {0};
		int st;

		if (waitid(P_ALL, 0, &si, WEXITED | WNOHANG | WNOWAIT) < 0 || si.si_pid == 0)
			break;
		if (si.si_pid != pid)
			record_reaped(si.si_pid,
				      si.si_code == CLD_EXITED ? si.si_status : 128 + si.si_status);
		if (waitpid(si.si_pid, &st, 0) < 0)
			break;
		if (si.si_pid == pid) {
			*ret_st = st;
			found = true;
		}
	}
	return found;
}

/* meson stops a test that ran out of time with SIGTERM to the runner's
 * process group: the running case, in a group of its own, goes too. */
static void on_stop(int sig)
{
	if (running_case > 0)
		kill(-running_case, SIGKILL);
	signal(sig, SIG_DFL);
	raise(sig);
}

/* In the child: run the case and leave its result for the runner. */
static _Noreturn void case_child(const struct test_case *c, pid_t runner)
{
	signal(SIGTERM, SIG_DFL);
	signal(SIGINT, SIG_DFL);
	setpgid(0, 0);
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != runner)
		_exit(127);
	test_failed_ = 0;
	test_skip_ = NULL;
	c->fn();
	rs->failed = test_failed_;
	rs->skipped = test_skip_ != NULL;
	if (test_skip_)
		snprintf(rs->skip_reason, sizeof(rs->skip_reason), "%s", test_skip_);
	__atomic_store_n(&rs->done, 1, __ATOMIC_RELEASE);
	fflush(stdout);
	/* exit(), not _exit(): leak checkers look at the case's process */
	exit(0);
}

/* Run case c as TAP case number num; true if it passed or was skipped. */
static bool run_case(const struct test_case *c, size_t num, pid_t *ret_pgid)
{
	int tmo = test_timeout(c->timeout_ms > 0 ? c->timeout_ms : TEST_CASE_TIMEOUT_MS);
	int64_t deadline = now_ms() + tmo;
	pid_t runner = getpid(), pid;
	int st = 0;

	rs->done = rs->failed = rs->skipped = 0;
	rs->skip_reason[0] = '\0';
	fflush(stdout);
	fflush(stderr);
	pid = fork();
	if (pid < 0) {
		printf("not ok %zu - %s # fork: %s\n", num, c->name, strerror(errno));
		return false;
	}
	if (pid == 0)
		case_child(c, runner);
	setpgid(pid, pid); /* as the child does: whichever runs first */
	*ret_pgid = running_case = pid;
	for (;;) {
		int64_t left;

		if (reap(pid, &st)) {
			running_case = 0;
			break;
		}
		left = deadline - now_ms();
		if (left <= 0) {
			kill(-pid, SIGKILL);
			kill(pid, SIGKILL);
			while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
				;
			running_case = 0;
			printf("not ok %zu - %s # timed out after %d ms\n", num, c->name, tmo);
			return false;
		}
		/* polled, not a pidfd: valgrind 3.19 lacks pidfd_open */
		usleep(left < 5 ? (useconds_t)left * 1000 : 5000);
	}
	if (!WIFEXITED(st)) {
		printf("not ok %zu - %s # killed by signal %d (%s)\n", num, c->name, WTERMSIG(st),
		       strsignal(WTERMSIG(st)));
		return false;
	}
	if (!__atomic_load_n(&rs->done, __ATOMIC_ACQUIRE)) {
		printf("not ok %zu - %s # exited with %d before the case returned\n", num, c->name,
		       WEXITSTATUS(st));
		return false;
	}
	if (WEXITSTATUS(st) != 0) {
		/* e.g. valgrind's --error-exitcode, or a leak checker's */
		printf("not ok %zu - %s # exited with %d\n", num, c->name, WEXITSTATUS(st));
		return false;
	}
	if (rs->skipped) {
		printf("ok %zu - %s # SKIP %s\n", num, c->name, rs->skip_reason);
		return true;
	}
	printf("%s %zu - %s\n", rs->failed ? "not ok" : "ok", num, c->name);
	return !rs->failed;
}

static bool selected(const struct test_case *c, int argc, char **argv)
{
	if (argc < 2)
		return true;
	for (int a = 1; a < argc; a++)
		if (strcmp(argv[a], c->name) == 0)
			return true;
	return false;
}

int test_main(const struct test_case *cases, size_t n, int argc, char **argv)
{
	size_t run = 0, failed = 0;
	pid_t *pgids = calloc(n ? n : 1, sizeof(*pgids));
	int st;

	setvbuf(stdout, NULL, _IOLBF, 0);
	rs = test_shared(sizeof(*rs));
	if (!pgids || prctl(PR_SET_CHILD_SUBREAPER, 1) < 0) {
		printf("Bail out! cannot become the subreaper of the cases: %s\n", strerror(errno));
		return 1;
	}
	signal(SIGTERM, on_stop);
	signal(SIGINT, on_stop);
	for (size_t i = 0; i < n; i++)
		run += selected(&cases[i], argc, argv);
	printf("1..%zu\n", run);
	run = 0;
	for (size_t i = 0; i < n; i++) {
		if (!selected(&cases[i], argc, argv))
			continue;
		failed += !run_case(&cases[i], ++run, &pgids[i]);
	}
	/* nothing a case started outlives the suite */
	for (size_t i = 0; i < n; i++)
		if (pgids[i] > 0)
			kill(-pgids[i], SIGKILL);
	reap(0, &st);
	free(pgids);
	return failed ? 1 : 0;
}
