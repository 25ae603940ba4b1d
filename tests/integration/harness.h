/*
 * harness.h — what integration tests need to run real processes: a real zerod
 * on a private socket in a fresh temporary directory, forked trainer
 * processes with timeouts, and the deterministic data both the trainers and
 * the reference computations use.
 */
#ifndef ZEROD_TEST_HARNESS_H
#define ZEROD_TEST_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "zeroclient.h"

struct zd {
	char dir[128];
	char sock[192];
	char log[192];
	pid_t pid;
};

/* Every timeout the harness takes is nominal: it waits test_timeout(ms).
 *
 * $ZEROD_WRAPPER, when set, is a command (words split at blanks) that every
 * zerod the harness starts runs under: the valgrind setup sets it to
 * `valgrind --error-exitcode=86 ...`, so that zerod itself is checked, not
 * only the test programs. ZD_CHECKER_EXIT is that exit status, and the one
 * the sanitizer setups give ASAN/UBSAN/TSAN_OPTIONS=exitcode: a zerod that
 * exits with it had errors found in it, and zd_stop() fails the case. */
#define ZD_CHECKER_EXIT 86

/* Start $ZEROD_BIN --socket DIR/zerod.sock [extra...] (NULL-terminated) and
 * wait until it serves (its socket and its control socket exist). 0 or
 * -errno. It dies with the process that started it (PDEATHSIG). */
int zd_start(struct zd *d, const char *const *extra);

/* How zd_start_ex() starts it. */
struct zd_opts {
	unsigned nofile; /* RLIMIT_NOFILE (soft and hard) of zerod; 0: as is */
	int stderr_fd;   /* zerod's stderr (kept open by the caller); < 0: DIR/zerod.log */
};
int zd_start_ex(struct zd *d, const char *const *extra, const struct zd_opts *o);

/* What zerod's SIGUSR1 status line says. */
struct zd_status {
	unsigned jobs, sessions, conns;
	unsigned long long memory, replies_dropped, conns_closed, log_dropped;
	unsigned long long recovered, recovery_failed; /* zerod_recoveries_total */
};
/* Ask for a status line (SIGUSR1) and read it from the log: 0, or -ETIMEDOUT
 * if none came within 3 s. */
int zd_status(struct zd *d, struct zd_status *ret);
/* Open fds of zerod (/proc/PID/fd), or -1. */
int zd_fd_count(const struct zd *d);
/* A "kB" field of /proc/PID/status ("VmRSS", "VmHWM"), or -1. */
long zd_status_kb(const struct zd *d, const char *field);
/* Lines in zerod's log. */
int zd_log_lines(const struct zd *d);
/* SIGTERM and wait up to timeout_ms: the exit status (0..255), 128+signal,
 * or -ETIMEDOUT (then it is SIGKILLed). Removes the directory. Works from a
 * case's process for a zerod main() started. An exit with ZD_CHECKER_EXIT
 * prints the daemon's log and fails the current case. */
int zd_stop(struct zd *d, int timeout_ms);
bool zd_alive(struct zd *d);
/* Copy the daemon's log into the TAP output as comments. */
void zd_dump_log(const struct zd *d);
/* true if the daemon's log contains needle. */
bool zd_log_has(const struct zd *d, const char *needle);
/* Poll the daemon's log for needle for up to timeout_ms: true once it is there. */
bool zd_wait_log(const struct zd *d, const char *needle, int timeout_ms);

/* Waiting on zerod's control socket (zdctl.c): how tests synchronise with a
 * daemon. Each returns 0 once the state is there, or -ETIMEDOUT (after
 * test_timeout(timeout_ms)), -ECHILD (the daemon exited) or another -errno,
 * and then says in a TAP comment what it saw last. */
enum {
	ZD_JOB_GONE = 1u << 0, /* no job by that id: not come yet, or ended and freed */
	ZD_JOB_FORMING = 1u << 1,
	ZD_JOB_REGISTERING = 1u << 2, /* every rank (and node) agreed on the plan */
	ZD_JOB_ACTIVE = 1u << 3,
	ZD_JOB_FAILED = 1u << 4, /* ended: its ranks were told */
	ZD_JOB_DRAINING = 1u << 5,
	ZD_JOB_REFORMING = 1u << 6, /* a trainer died: waits for the ranks to rejoin */
};
#define ZD_JOB_ENDED (ZD_JOB_FAILED | ZD_JOB_DRAINING)
/* A job as `zeroctl status` shows it. */
struct zd_job {
	unsigned state; /* one ZD_JOB_ bit */
	char state_name[16];
	uint32_t world, local_ranks, nodes, connected;
	uint64_t iteration;      /* in flight, or next */
	bool rendezvous_serving; /* over several nodes: this zerod listens for it */
	bool stalled;            /* waiting for ranks or the executor past stall-warn */
	char error[256];         /* ended: "ZC_E...: message" */
};
/* One status request: job's state (ZD_JOB_GONE if there is none by that id). */
int zd_job_status(const struct zd *d, const char *job, struct zd_job *ret);
/* Until job is in one of the states (ZD_JOB_ bits). */
int zd_wait_job(const struct zd *d, const char *job, unsigned states, int timeout_ms);
/* What zd_status() tells, from the control socket (status and metrics: the
 * same counters, jobs of every user): 0 or -errno. The levels tests compare
 * come from here, not from the log. */
int zd_ctl_levels(const struct zd *d, struct zd_status *ret);
/* Until the daemon answers on its control socket. */
int zd_wait_ctl(const struct zd *d, int timeout_ms);
/* Until job is active at `iteration` or later (its iteration n: every local
 * rank handed over every bucket of iteration n - 1). */
int zd_wait_iteration(const struct zd *d, const char *job, uint64_t iteration, int timeout_ms);
/* Until at least `ranks` of job's local ranks are connected here. */
int zd_wait_connected(const struct zd *d, const char *job, uint32_t ranks, int timeout_ms);
/* Until rank `rank` of job has registered its plan here. */
int zd_wait_registered(const struct zd *d, const char *job, uint32_t rank, int timeout_ms);
/* Until bucket `bucket` of job's iteration in flight arrived here from at
 * least `ranks` of its local ranks (it is not done before they all sent it). */
int zd_wait_arrived(const struct zd *d, const char *job, uint32_t bucket, uint32_t ranks,
		    int timeout_ms);
/* Until job waits (for ranks or its executor) longer than stall-warn. */
int zd_wait_stalled(const struct zd *d, const char *job, int timeout_ms);
/* Until this zerod serves job's rendezvous (job NULL: any rendezvous). */
int zd_wait_serving(const struct zd *d, const char *job, int timeout_ms);

/* exec bin with args (argv[1]..., NULL-terminated) under $ZEROD_WRAPPER; on
 * failure _exit(127). For a forked child that becomes a zerod. */
_Noreturn void zd_exec(const char *bin, const char *const *args);

/* main() of an integration test: start d (with extra arguments), run the
 * cases, stop d if a case has not. Bails out (TAP) if zerod cannot start. */
struct test_case;
int zd_test_main(struct zd *d, const char *const *extra, const struct test_case *cases, size_t n,
		 int argc, char **argv);

/* Fork a child that returns fn(arg, idx) as its exit status. */
pid_t spawn(int (*fn)(void *arg, int idx), void *arg, int idx);
/* Wait for a process up to timeout_ms: its exit status, 128+signal, or
 * -ETIMEDOUT (then it is SIGKILLed and reaped). pid is a child of the caller,
 * or a process the runner reaps (see test_reaped()). */
int wait_child(pid_t pid, int timeout_ms);
/* pid has not exited (not reaping it): a child of the caller, or a process
 * the runner reaps. */
bool proc_alive(pid_t pid);

/* Children of a test report through their exit status: EXPECT() prints a
 * TAP comment and sets child_bad (each forked child starts from 0). */
extern int child_bad;
#define EXPECT(cond, ...)                                                                          \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			child_bad = 1;                                                             \
			printf("# [%s] EXPECT(%s) failed: ", __func__, #cond);                     \
			printf(__VA_ARGS__);                                                       \
			printf("\n");                                                              \
			fflush(stdout);                                                            \
		}                                                                                  \
	} while (0)

/* One byte through a pipe, to order the steps of different processes. */
void signal_pipe(int fd);
bool wait_pipe(int fd, int timeout_ms);

/* A loopback TCP port nobody listens on now (the kernel's pick), for a
 * rendezvous; -1 if none. */
int zd_free_port(void);

/* How many objects in /dev/shm have names starting with prefix (no leading
 * '/'); with show, each is printed as a TAP comment. */
int shm_count(const char *prefix, bool show);

/* Monotonic milliseconds. */
int64_t test_ms(void);

/* Where tests make their directories: $TMPDIR (if short enough for a
 * socket path below it), else /tmp. */
const char *test_tmpdir(void);

/* A client config for `job` rank/world on d's socket, single node. */
struct zc_config test_config(const struct zd *d, const char *job, uint32_t rank, uint32_t world);

/* Deterministic value in [-1, 1) for (seed, a, b, c). */
float det_uniform(uint64_t seed, uint64_t a, uint64_t b, uint64_t c);

#endif
