/*
 * test_shutdown.c — a real zerod's socket and its stop: the socket file is
 * mode 0660; a second zerod on the same path refuses to start and leaves the
 * first one serving; SIGTERM in the middle of an iteration fails the waiting
 * ranks with ZC_ESHUTDOWN, the daemon exits 0, and neither its socket file
 * nor any shared memory object of the job is left behind.
 *
 * The parent never creates a ZeroMQ context: clients live in forked children
 * that exit 0 when everything they saw was as expected.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "testlib.h"
#include "zctest.h"

static struct zd daemon_;
static char shut_job[64]; /* unique per run: its shm names are looked for in /dev/shm */

/* ---- the socket ---- */

static void t_socket_mode(void)
{
	struct stat st;

	REQUIRE(stat(daemon_.sock, &st) == 0, "stat %s: %s", daemon_.sock, strerror(errno));
	CHECK(S_ISSOCK(st.st_mode), "%s is not a socket (mode %o)", daemon_.sock,
	      (unsigned)st.st_mode);
	CHECK((st.st_mode & 07777) == 0660, "%s has mode %04o, want 0660", daemon_.sock,
	      (unsigned)(st.st_mode & 07777));
}

/* A world-1 job connects, registers and runs one iteration. */
static int c_probe(void *arg, int idx)
{
	struct zc_config cfg = test_config(&daemon_, arg, 0, 1);
	struct zc_param_group g = ZC_PARAM_GROUP_INIT;
	struct zc_segment seg = SEG(0, 32, 0);
	struct zc_bucket b = BUCKET(32, 1, &seg);
	struct zc_plan plan = PLAN(ZC_OPT_SGD, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED, 1, &g, 1, &b);
	const char *err = "";
	zc_client *c = NULL;
	zc_future *step = NULL;
	int r;

	(void)idx;
	r = zc_connect(&cfg, &c);
	err = zc_error_message();
	EXPECT(r == 0, "zc_connect: %s: %s", zc_strerror_name(r), err);
	if (r < 0)
		return 1;
	r = zc_alloc_buffers(c, &plan);
	if (r == 0)
		r = zc_register_plan(c);
	if (r == 0)
		r = zc_bucket_ready(c, 0, NULL);
	if (r == 0)
		r = zc_step_future(c, 0, &step);
	if (r == 0)
		r = zc_future_wait(step, test_timeout(5000));
	EXPECT(r == 1, "one iteration: %s: %s", r ? zc_strerror_name(r) : "timed out",
	       step ? zc_future_message(step) : zc_error_message());
	zc_future_free(step);
	zc_close(c);
	return child_bad;
}

static void t_second_daemon_refused(void)
{
	char log[256];
	const char *bin = getenv("ZEROD_BIN");
	pid_t pid;
	int st;

	REQUIRE(bin, "ZEROD_BIN is not set");
	REQUIRE(zd_alive(&daemon_), "zerod is not running");
	snprintf(log, sizeof(log), "%s/second.log", daemon_.dir);
	fflush(stdout);
	pid = fork();
	REQUIRE(pid >= 0, "fork: %s", strerror(errno));
	if (pid == 0) {
		int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		if (fd >= 0) {
			dup2(fd, 2);
			close(fd);
		}
		zd_exec(bin, (const char *const[]){"--socket", daemon_.sock, NULL});
	}
	st = wait_child(pid, 5000);
	CHECK(st > 0 && st < 128, "a second zerod on %s exited with %d, want a failure exit",
	      daemon_.sock, st);
	{
		char line[512];
		bool said = false;
		FILE *f = fopen(log, "r");
		while (f && fgets(line, sizeof(line), f)) {
			printf("# second zerod: %s", line);
			said |= strstr(line, "another zerod is serving it") != NULL;
		}
		if (f)
			fclose(f);
		CHECK(said, "the second zerod did not say why it refused");
	}
	/* the first one still owns the path and serves */
	CHECK(zd_alive(&daemon_), "the first zerod died");
	CHECK(access(daemon_.sock, F_OK) == 0, "the socket file %s is gone", daemon_.sock);
	pid = spawn(c_probe, "probe", 0);
	st = wait_child(pid, 15000);
	CHECK(st == 0, "a job on the first zerod after the refused start: exit %d", st);
	if (test_failed_)
		zd_dump_log(&daemon_);
}

/* ---- SIGTERM in the middle of an iteration ---- */

static int ready_pipe[2], gone_pipe[2];

/* rank 0 sends its buckets and waits for the step; rank 1 registers, sends
 * nothing, and is busy elsewhere until zerod has exited: only then does it
 * look. Both must see ZC_ESHUTDOWN, which arrived before the connection
 * was lost (not ZC_ECONNECT). */
static int c_shut(void *arg, int idx)
{
	struct zc_config cfg = test_config(&daemon_, shut_job, (uint32_t)idx, 2);
	struct zc_param_group g = ZC_PARAM_GROUP_INIT;
	struct zc_segment segs[2] = {SEG(0, 300, 0), SEG(0, 77, 0)};
	struct zc_bucket b[2] = {BUCKET(300, 1, &segs[0]), BUCKET(77, 1, &segs[1])};
	struct zc_plan plan = PLAN(ZC_OPT_ADAM, ZC_SHARD_SLICE, ZC_STEP_INTERLEAVED, 1, &g, 2, b);
	const char *err = "";
	zc_client *c = NULL;
	zc_future *step = NULL;
	int r;

	(void)arg;
	r = zc_connect(&cfg, &c);
	err = zc_error_message();
	EXPECT(r == 0, "rank %d zc_connect: %s: %s", idx, zc_strerror_name(r), err);
	if (r < 0)
		return 1;
	r = zc_alloc_buffers(c, &plan);
	if (r == 0)
		r = zc_register_plan(c);
	EXPECT(r == 0, "rank %d: %s: %s", idx, zc_strerror_name(r), zc_error_message());
	if (r < 0) {
		zc_close(c);
		return 1;
	}
	if (idx == 0)
		for (uint32_t k = 0; k < 2; k++)
			EXPECT(zc_bucket_ready(c, k, NULL) == 0, "zc_bucket_ready(%u)", k);
	EXPECT(zc_step_future(c, 0, &step) == 0, "zc_step_future");
	(void)!write(ready_pipe[1], "x", 1);
	if (idx == 1)
		EXPECT(wait_pipe(gone_pipe[0], 20000), "rank 1 never heard that zerod exited");
	r = zc_future_wait(step, test_timeout(15000));
	printf("# rank %d step 0 -> %s: %s\n", idx, r == 1 ? "done" : zc_strerror_name(r),
	       zc_future_message(step));
	EXPECT(r == ZC_ESHUTDOWN, "rank %d step 0: %s (%d), want ZC_ESHUTDOWN", idx,
	       r == 1   ? "done"
	       : r == 0 ? "pending after 15 s"
			: zc_strerror_name(r),
	       r);
	EXPECT(strstr(zc_future_message(step), "shutting down"), "message \"%s\"",
	       zc_future_message(step));
	zc_future_free(step);
	zc_close(c);
	return child_bad;
}

/* Names in /dev/shm that start with prefix; printed. */
static void t_sigterm_mid_iteration(void)
{
	char prefix[96], dir[sizeof(daemon_.dir)], sock[sizeof(daemon_.sock)], cmd[300];
	pid_t pids[2];
	int st, ready = 0;

	REQUIRE(zd_alive(&daemon_), "zerod is not running");
	REQUIRE(pipe(ready_pipe) == 0 && pipe(gone_pipe) == 0, "pipe");
	snprintf(prefix, sizeof(prefix), "zerod.%s.", shut_job);
	for (int r = 0; r < 2; r++)
		pids[r] = spawn(c_shut, NULL, r);
	for (int r = 0; r < 2; r++)
		ready += wait_pipe(ready_pipe[0], 15000);
	CHECK(ready == 2, "only %d of 2 ranks got to the iteration", ready);
	/* rank 0's buckets reached the daemon: the iteration is in flight */
	CHECK(zd_wait_arrived(&daemon_, shut_job, 1, 1, 10000) == 0,
	      "rank 0's buckets did not reach zerod");
	CHECK(shm_count(prefix, true) == 0, "the daemon left the names of mapped buffers");

	snprintf(dir, sizeof(dir), "%s", daemon_.dir);
	snprintf(sock, sizeof(sock), "%s", daemon_.sock);
	setenv("ZEROD_TEST_KEEP", "1", 1); /* zd_stop must not remove the directory yet */
	st = zd_stop(&daemon_, 15000);
	unsetenv("ZEROD_TEST_KEEP");
	CHECK(st == 0, "zerod exited with %d after SIGTERM", st);
	CHECK(access(sock, F_OK) < 0 && errno == ENOENT, "socket file %s is still there", sock);
	signal_pipe(gone_pipe[1]);

	for (int r = 0; r < 2; r++) {
		int cs = wait_child(pids[r], 20000);
		CHECK(cs == 0, "rank %d exited with %d", r, cs);
	}
	CHECK(shm_count(prefix, true) == 0, "shared memory of job %s left in /dev/shm", shut_job);
	if (test_failed_)
		zd_dump_log(&daemon_);
	for (int i = 0; i < 2; i++)
		close(ready_pipe[i]), close(gone_pipe[i]);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (!getenv("ZEROD_TEST_KEEP"))
		(void)!system(cmd);
}

static const struct test_case cases[] = {
	{"socket_mode_0660", t_socket_mode},
	{"second_daemon_refused", t_second_daemon_refused},
	{"sigterm_mid_iteration_ESHUTDOWN", t_sigterm_mid_iteration},
};

int main(int argc, char **argv)
{
	snprintf(shut_job, sizeof(shut_job), "shutdown-%d", (int)getpid());
	return zd_test_main(&daemon_, NULL, cases, sizeof(cases) / sizeof(cases[0]), argc, argv);
}
