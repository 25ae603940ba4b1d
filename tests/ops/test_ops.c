/*
 * test_ops.c — operating a real zerod (issue 10 §8): zeroctl's every verb,
 * in tables and in JSON checked against tools/zeroctl/zeroctl.schema.json;
 * metrics checked by promtool (where Debian's prometheus is installed) and
 * two parsers; the stall inspector's reports and `inspect` of a wedged job;
 * the trace timeline; reload (live keys applied, others reported, flags
 * winning over the file, a bad file refused and the old config kept);
 * zeroctl's exit codes 0, 1, 64, 69, 76, 77 (the last as a member of the
 * group running an admin verb, and as a user outside it); sd_notify states
 * seen by a fake NOTIFY_SOCKET listener; socket activation through
 * systemd-socket-activate; a clean job end (C trainers, and torch's
 * tools/torch-train.py) that sends, counts and logs no error, a job whose
 * rank is stopped by SIGINT ending failed while another trains on; and a
 * second zerod refused the first one's metrics textfile.
 *
 * zerod runs with --config FILE (whose stall-timeout the --stall-timeout
 * flag overrides), --stall-warn 300, a metrics textfile, and --group of a
 * throwaway user when the test runs as root (removed at the end).
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "common.h"
#include "harness.h"
#include "testlib.h"
#include "trainer.h"
#include "zerod.pb-c.h"

#define TEST_USER "zerodopstest"

static struct zd daemon_;
static char cfgdir[96], cfgfile[192], textfile[192];

struct shared {
	uid_t uid;
	gid_t gid;
	bool user_created;
	const char *no_user; /* why the permission cases skip */
	struct train_stop *stop;
};
static struct shared *sh;

/* ------------------------------------------------------------ helpers --- */

static const char *env(const char *name)
{
	const char *v = getenv(name);
	return v ? v : "";
}

/* Run argv (NULL-terminated), as uid/gid if uid != -1, stdout to out and
 * stderr to err (paths, or NULL: /dev/null): its exit status, or -1. */
static int run_as(uid_t uid, gid_t gid, const char *const *argv, const char *out, const char *err)
{
	pid_t pid;

	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		int o = open(out ? out : "/dev/null", O_WRONLY | O_CREAT | O_TRUNC, 0644);
		int e = open(err ? err : "/dev/null", O_WRONLY | O_CREAT | O_TRUNC, 0644);
		if (o < 0 || e < 0)
			_exit(126);
		dup2(o, 1);
		dup2(e, 2);
		if (uid != (uid_t)-1 &&
		    (setgroups(0, NULL) < 0 || setgid(gid) < 0 || setuid(uid) < 0))
			_exit(125);
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	return pid < 0 ? -1 : wait_child(pid, 30000);
}

static int run(const char *const *argv, const char *out, const char *err)
{
	return run_as((uid_t)-1, (gid_t)-1, argv, out, err);
}

/* zeroctl --socket SOCK ARGS... ; stdout in DIR/NAME.out, stderr NAME.err. */
static int zeroctl(const struct zd *d, const char *name, const char *a1, const char *a2,
		   const char *a3, const char *a4)
{
	char out[256], err[256];
	const char *argv[] = {env("ZEROCTL_BIN"), "--socket", d->sock, a1, a2, a3, a4, NULL};

	snprintf(out, sizeof(out), "%s/%s.out", cfgdir, name);
	snprintf(err, sizeof(err), "%s/%s.err", cfgdir, name);
	return run(argv, out, err);
}

static char *slurp(const char *path)
{
	FILE *f = fopen(path, "r");
	char *buf;
	long n;

	if (!f)
		return strdup("");
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	rewind(f);
	buf = calloc(1, (size_t)n + 1);
	if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n)
		buf[0] = 0;
	fclose(f);
	return buf ? buf : strdup("");
}

/* Does DIR/NAME.out (or .err) contain needle? Prints the file if not. */
static bool has(const char *name, const char *ext, const char *needle)
{
	char path[256];
	char *s;
	bool found;

	snprintf(path, sizeof(path), "%s/%s.%s", cfgdir, name, ext);
	s = slurp(path);
	found = strstr(s, needle) != NULL;
	if (!found) {
		printf("# %s has no '%s'; it holds:\n", path, needle);
		for (char *save = NULL, *l = strtok_r(s, "\n", &save); l;
		     l = strtok_r(NULL, "\n", &save))
			printf("#   %s\n", l);
	}
	free(s);
	return found;
}

/* ...and the opposite: true if it does not. */
static bool lacks(const char *name, const char *ext, const char *needle)
{
	char path[256];
	char *s;
	bool found;

	snprintf(path, sizeof(path), "%s/%s.%s", cfgdir, name, ext);
	s = slurp(path);
	found = strstr(s, needle) != NULL;
	if (found)
		printf("# %s has '%s'\n", path, needle);
	free(s);
	return !found;
}

/* DIR/NAME.EXT (in a static buffer). */
static const char *path_of(const char *name, const char *ext)
{
	static char p[256];

	snprintf(p, sizeof(p), "%s/%s.%s", cfgdir, name, ext);
	return p;
}

/* check.py MODE [SCHEMA] DIR/NAME.out: 0 if the check passed. */
static int check(const char *mode, const char *name)
{
	char path[256], out[256];
	const char *argv[] = {"/usr/bin/python3", env("OPS_CHECK"), mode, NULL, NULL, NULL};
	int st;

	snprintf(path, sizeof(path), "%s/%s.out", cfgdir, name);
	snprintf(out, sizeof(out), "%s/%s.check", cfgdir, name);
	if (strcmp(mode, "json") == 0) {
		argv[3] = env("ZEROCTL_SCHEMA");
		argv[4] = path;
	} else {
		argv[3] = path;
	}
	st = run(argv, out, out);
	if (st != 0) {
		char *s = slurp(out);
		printf("# check.py %s %s: exit %d:\n# %s\n", mode, path, st, s);
		free(s);
	}
	return st;
}

static void write_config(const char *text)
{
	FILE *f = fopen(cfgfile, "w");

	if (f) {
		fputs(text, f);
		fclose(f);
	}
}

static const char base_config[] = "# the ops suite's zerod\n"
				  "[zerod]\n"
				  "stall-warn = 300\n"
				  "# the flag --stall-timeout wins over this\n"
				  "stall-timeout = 50\n"
				  "flight-records = 64\n";

static void write_base_config(void)
{
	write_config(base_config);
}

/* A plan of two 64-element buckets, SGD, and what it points at. */
struct small {
	struct zc_param_group g;
	struct zc_segment s[2];
	struct zc_bucket b[2];
	struct zc_plan plan;
};

/* A rank of a small job: connected, its buffers allocated, its plan (in
 * *sm, which must outlive the client) registered. */
static int small_join(const struct zc_config *cfg, struct small *sm, zc_client **c)
{
	int r;

	sm->g = (struct zc_param_group)ZC_PARAM_GROUP_INIT;
	sm->g.lr = 0.1;
	for (int i = 0; i < 2; i++) {
		sm->s[i] = (struct zc_segment){.size = sizeof(sm->s[i]), .offset = 0, .numel = 64};
		sm->b[i] = (struct zc_bucket){
			.size = sizeof(sm->b[i]), .numel = 64, .nsegments = 1, .segments = &sm->s[i]};
	}
	sm->plan = (struct zc_plan){.size = sizeof(sm->plan),
				    .optimizer = ZC_OPT_SGD,
				    .shard_mode = ZC_SHARD_BUCKET,
				    .step_mode = ZC_STEP_INTERLEAVED,
				    .ngroups = 1,
				    .groups = &sm->g,
				    .nbuckets = 2,
				    .buckets = sm->b};
	r = zc_connect(cfg, c);
	if (r == 0)
		r = zc_alloc_buffers(*c, &sm->plan);
	if (r == 0)
		r = zc_register_plan(*c);
	return r;
}

/* A rank of a job that wedges: both register, rank 0 hands over bucket 0,
 * rank 1 nothing; each waits for the pipe to close. */
static int wedge_pipe[2];
static int c_wedge(void *arg, int rank)
{
	struct zc_config cfg = test_config(&daemon_, arg, (uint32_t)rank, 2);
	struct small sm;
	zc_client *c = NULL;
	char ch;
	int r;

	close(wedge_pipe[1]);
	r = small_join(&cfg, &sm, &c);
	if (r == 0 && rank == 0)
		r = zc_bucket_ready(c, 0, NULL);
	EXPECT(r == 0, "rank %d: %s", rank, zc_strerror_name(r));
	(void)!read(wedge_pipe[0], &ch, 1); /* until the test closes it */
	zc_close(c);
	return child_bad;
}

static int c_train(void *arg, int idx)
{
	return train_rank(arg, (uint32_t)idx);
}

static struct train_spec train_spec(const char *sock, const char *job, uint32_t world, int iters,
				     struct train_stop *stop)
{
	return (struct train_spec){
		.socket = sock,
		.job = job,
		.world = world,
		.optimizer = ZC_OPT_ADAM,
		.shard_mode = ZC_SHARD_BUCKET,
		.step_mode = ZC_STEP_INTERLEAVED,
		.iters = iters,
		.stop = stop,
		.seed = 99,
		.hyper_iter = -1,
		.sleep_us = 2000,
		.tolerance = 1e-6,
	};
}

/* -------------------------------------------------------------- cases --- */

static void t_status_idle(void)
{
	CHECK(zeroctl(&daemon_, "st0", "status", NULL, NULL, NULL) == 0, "zeroctl status");
	CHECK(has("st0", "out", "zerod " ZEROD_VERSION_STRING), "version");
	CHECK(has("st0", "out", "backends host"), "backends");
	CHECK(has("st0", "out", "no jobs"), "no jobs yet");
	CHECK(has("st0", "out", cfgfile), "the config file read");
	CHECK(zd_log_has(&daemon_, "; mem memfd;"), "the start line names the buffers' kind");
	{
		char line[256];
		snprintf(line, sizeof(line), "zerod: config file %s", cfgfile);
		CHECK(zd_log_has(&daemon_, line), "the start says which config file it read");
	}
	CHECK(zeroctl(&daemon_, "st0j", "-o", "json", "status", NULL) == 0, "zeroctl -o json");
	CHECK(check("json", "st0j") == 0, "schema");
	CHECK(has("st0j", "out", "\"schema_version\":1"), "schema_version");
	CHECK(has("st0j", "out", "\"rendezvous\":[]"), "no rendezvous served");
	{
		/* SIGUSR1 logs what the control socket says */
		struct zd_status logged, ctl;
		CHECK(zd_status(&daemon_, &logged) == 0, "no status line logged on SIGUSR1");
		CHECK(zd_ctl_levels(&daemon_, &ctl) == 0, "no status on the control socket");
		CHECK(logged.jobs == ctl.jobs && logged.sessions == ctl.sessions &&
			      logged.memory == ctl.memory,
		      "logged: %u jobs, %u sessions, %llu bytes; control socket: %u, %u, %llu",
		      logged.jobs, logged.sessions, logged.memory, ctl.jobs, ctl.sessions,
		      ctl.memory);
	}
}

/* A job of two ranks runs while zeroctl looks at it, with a trace on. */
static void t_job_and_trace(void)
{
	struct train_spec spec = train_spec(daemon_.sock, "ops-train", 2, 1000000, sh->stop);
	char trace[256];
	pid_t pids[2];

	snprintf(trace, sizeof(trace), "%s/trace.json", cfgdir);
	REQUIRE(zeroctl(&daemon_, "tr_on", "trace", "on", trace, NULL) == 0, "trace on");
	CHECK(has("tr_on", "out", "tracing to"), "trace on says so");
	CHECK(zeroctl(&daemon_, "tr_on2", "trace", "on", trace, NULL) == 1,
	      "a second trace on fails (exit 1)");
	for (int r = 0; r < 2; r++)
		pids[r] = spawn(c_train, &spec, r);
	for (int i = 0; i < test_timeout(1500) && atomic_load(&sh->stop->done) < 5; i++)
		usleep(10000);
	CHECK(atomic_load(&sh->stop->done) >= 5, "the job ran 5 iterations");

	CHECK(zeroctl(&daemon_, "st1", "status", NULL, NULL, NULL) == 0, "status");
	CHECK(has("st1", "out", "ops-train"), "the job");
	CHECK(has("st1", "out", "active"), "active");
	CHECK(has("st1", "out", "2/2"), "its ranks");
	CHECK(has("st1", "out", "trace: on"), "the trace");
	CHECK(zeroctl(&daemon_, "st1j", "-o", "json", "status", NULL) == 0, "status json");
	CHECK(check("json", "st1j") == 0, "schema");
	CHECK(has("st1j", "out", "\"id\":\"ops-train\""), "the job in JSON");

	CHECK(zeroctl(&daemon_, "in1", "inspect", "ops-train", NULL, NULL) == 0, "inspect");
	CHECK(has("in1", "out", "plan "), "the plan");
	CHECK(has("in1", "out", "adam, shard bucket, step interleaved"), "its modes");
	CHECK(has("in1", "out", "OWNERS"), "ownership");
	CHECK(has("in1", "out", "flight recorder: the last 32 of 64 operations (it keeps the last 64; "
		  "--ops N shows more)"),
	      "the flight recorder, its size said once");
	CHECK(has("in1", "out", " step "), "a step in it");
	CHECK(has("in1", "out", " reduced "), "a reduced bucket in it");
	CHECK(zeroctl(&daemon_, "in1j", "-o", "json", "inspect", "ops-train") == 0,
	      "inspect json");
	CHECK(check("json", "in1j") == 0, "schema");
	CHECK(has("in1j", "out", "\"what\":\"step\""), "steps in JSON");
	{
		const char *argv[] = {env("ZEROCTL_BIN"), "--socket", daemon_.sock, "-o", "json",
				      "inspect", "ops-train", "--rank", "1", "--bucket", "0",
				      NULL};
		CHECK(run(argv, path_of("in1f", "out"), NULL) == 0, "inspect --rank 1 --bucket 0");
		CHECK(check("json", "in1f") == 0, "schema");
		CHECK(has("in1f", "out", "{\"rank\":1,\"connected\""), "rank 1");
		CHECK(lacks("in1f", "out", "{\"rank\":0,\"connected\""), "not rank 0");
		CHECK(has("in1f", "out", "{\"index\":0,"), "bucket 0");
		CHECK(lacks("in1f", "out", "{\"index\":1,"), "not bucket 1");
		CHECK(lacks("in1f", "out", "\"bucket\":1,"), "no op of bucket 1");
	}

	atomic_store(&sh->stop->requested, 1);
	for (int r = 0; r < 2; r++)
		CHECK(wait_child(pids[r], 30000) == 0, "rank %d trained to the reference", r);

	CHECK(zeroctl(&daemon_, "tr_off", "trace", "off", NULL, NULL) == 0, "trace off");
	CHECK(has("tr_off", "out", "trace stopped"), "trace off says so");
	{
		/* check.py reads DIR/trace.out: the trace file itself */
		char from[256], to[256];
		snprintf(from, sizeof(from), "%s/trace.json", cfgdir);
		snprintf(to, sizeof(to), "%s/trace.out", cfgdir);
		CHECK(rename(from, to) == 0, "the trace file exists");
	}
	CHECK(check("trace", "trace") == 0, "the trace is a valid Chrome trace");
	CHECK(has("trace", "check", "done="), "StepDone events");
	/* the executor's own ops, per bucket: this job runs fused passes */
	CHECK(has("trace", "check", "fused="), "the executor's fused passes");
	CHECK(has("trace", "check", "reduced=") || has("trace", "check", "reduce="),
	      "BucketDone events");
	CHECK(has("trace", "check", "process_name="), "the job is named");
	CHECK(zeroctl(&daemon_, "tr_off2", "trace", "off", NULL, NULL) == 1,
	      "trace off without a trace: exit 1");
}

static void t_metrics(void)
{
	char *text;
	unsigned long long iters = 0, count = 0;
	char *p;

	REQUIRE(zeroctl(&daemon_, "m1", "metrics", NULL, NULL, NULL) == 0, "metrics");
	CHECK(check("metrics", "m1") == 0, "the exposition format");
	text = slurp(path_of("m1", "out"));
	p = strstr(text, "\nzerod_iterations_total ");
	CHECK(p && sscanf(p, "\nzerod_iterations_total %llu", &iters) == 1 && iters >= 5,
	      "zerod_iterations_total %llu: the job's iterations", iters);
	p = strstr(text, "\nzerod_iteration_seconds_count ");
	CHECK(p && sscanf(p, "\nzerod_iteration_seconds_count %llu", &count) == 1 && count >= 5,
	      "zerod_iteration_seconds_count %llu", count);
	CHECK(strstr(text, "zerod_build_info{version=\"" ZEROD_VERSION_STRING "\""),
	      "zerod_build_info");
	free(text);
	CHECK(zeroctl(&daemon_, "m1j", "-o", "json", "metrics", NULL) == 0, "metrics json");
	CHECK(check("json", "m1j") == 0, "schema");
	/* the node-exporter textfile, written by the spool thread */
	{
		char out[256];
		snprintf(out, sizeof(out), "%s/tf.out", cfgdir);
		for (int i = 0; i < test_timeout(300) && access(textfile, F_OK) < 0; i++)
			usleep(10000);
		REQUIRE(access(textfile, R_OK) == 0, "the textfile %s", textfile);
		CHECK(rename(textfile, out) == 0, "move it");
		CHECK(check("metrics", "tf") == 0, "the textfile's format");
		for (int i = 0; i < test_timeout(300) && access(textfile, F_OK) < 0; i++)
			usleep(10000);
		CHECK(access(textfile, R_OK) == 0, "it is written again (metrics-interval)");
	}
	/* a second zerod given the same textfile (two nodes on one machine
	 * sharing a config file) writes none, says so, and races on nothing */
	{
		struct zd other = {0};
		const char *args[] = {"--config",	      "/dev/null", "--metrics-textfile",
				      textfile,	      "--metrics-interval", "100",
				      NULL};
		REQUIRE(zd_start(&other, args) == 0, "a second zerod");
		CHECK(zd_wait_log(&other, "another zerod writes it", 3000),
		      "it says another zerod writes the textfile");
		usleep(300000); /* its intervals pass */
		CHECK(!zd_log_has(&daemon_, "cannot write") && !zd_log_has(&other, "cannot write"),
		      "no write failed");
		CHECK(zd_stop(&other, 10000) == 0, "the second zerod stops");
	}
}

/* The zerod_errors_total samples of `zeroctl metrics` (at most len - 1
 * bytes into buf, each line ended by '\n'): 0, or -1 if zeroctl failed. */
static int errors_total(const char *name, char *buf, size_t len)
{
	char *text, *save = NULL;
	size_t n = 0;

	buf[0] = 0;
	if (zeroctl(&daemon_, name, "metrics", NULL, NULL, NULL) != 0)
		return -1;
	text = slurp(path_of(name, "out"));
	for (char *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save))
		if (strncmp(l, "zerod_errors_total", 18) == 0 && n + strlen(l) + 2 < len)
			n += (size_t)snprintf(buf + n, len - n, "%s\n", l);
	free(text);
	return 0;
}

/* What zerod logged when job ended ("ok", or the code and why): in buf. */
static bool ended_as(const char *job, char *buf, size_t len)
{
	char needle[96], *s, *p;

	snprintf(needle, sizeof(needle), "job %s: ended (", job);
	if (!zd_wait_log(&daemon_, needle, 10000))
		return false;
	s = slurp(daemon_.log);
	p = strstr(s, needle);
	snprintf(buf, len, "%.*s", p ? (int)strcspn(p + strlen(needle), "\n") : 0,
		 p ? p + strlen(needle) : "");
	free(s);
	return p != NULL;
}

/* Issue 20 §3: ranks that all leave after the last iteration end their job
 * cleanly: no error sent, counted or logged, and "ended (ok)" with every
 * rank. */
static void t_clean_end(void)
{
	struct train_spec spec = train_spec(daemon_.sock, "ops-clean", 3, 6, NULL);
	char before[4096], after[4096], how[256];
	pid_t pids[3];

	REQUIRE(errors_total("ce0", before, sizeof(before)) == 0, "metrics before");
	for (int r = 0; r < 3; r++)
		pids[r] = spawn(c_train, &spec, r);
	for (int r = 0; r < 3; r++)
		CHECK(wait_child(pids[r], 30000) == 0, "rank %d trained to the reference", r);
	REQUIRE(ended_as("ops-clean", how, sizeof(how)), "the job's end is logged");
	CHECK(strncmp(how, "ok): 3 ranks", 12) == 0, "ended (%s", how);
	REQUIRE(errors_total("ce1", after, sizeof(after)) == 0, "metrics after");
	CHECK(strcmp(before, after) == 0, "zerod_errors_total unchanged:\n# before:\n%s# after:\n%s",
	      before, after);
	CHECK(!zd_log_has(&daemon_, "job ops-clean failed") &&
		      !zd_log_has(&daemon_, "job ops-clean: failed"),
	      "no failure logged");
	if (test_failed_)
		zd_dump_log(&daemon_);
}

/* The same with PyTorch: two ranks of tools/torch-train.py (DDP over gloo,
 * ZerodOptimizer) end, and no error was sent for it (every healthy torch job
 * once added ZC_EJOBFAILED and ZC_EPROTO, its last rank's Goodbye). */
static void t_clean_end_torch(void)
{
	const char *py = env("OPS_TORCH_PYTHON");
	const char *check[] = {py, "-c", "import torch", NULL};
	char before[4096], after[4096], store[256], script[256], pypath[256];
	char *log, *p;
	pid_t pids[2];

	if (!*py)
		SKIP("a sanitized build: python would load an instrumented libzeroclient");
	if (getenv("ZEROD_WRAPPER") && *getenv("ZEROD_WRAPPER"))
		SKIP("zerod under $ZEROD_WRAPPER: the torch ranks would take minutes");
	if (run(check, NULL, NULL) != 0)
		SKIP("no torch in OPS_TORCH_PYTHON (Debian's python3-torch)");
	snprintf(store, sizeof(store), "%s/torch-store", cfgdir);
	snprintf(script, sizeof(script), "%s/tools/torch-train.py", env("ZEROD_SRC"));
	snprintf(pypath, sizeof(pypath), "%s/client/python", env("ZEROD_SRC"));
	REQUIRE(errors_total("ct0", before, sizeof(before)) == 0, "metrics before");
	for (int r = 0; r < 2; r++) {
		char rank[8], out[256];
		snprintf(rank, sizeof(rank), "%d", r);
		snprintf(out, sizeof(out), "%s/torch%d.out", cfgdir, r);
		fflush(stdout);
		pids[r] = fork();
		if (pids[r] == 0) {
			const char *argv[] = {py,	 script,   "--rank",  rank,	    "--world",
					      "2",	 "--store", store,    "--iters", "6",
					      "--device", "cpu",	   NULL};
			int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
			dup2(fd, 1);
			dup2(fd, 2);
			setenv("ZEROD_SOCKET", daemon_.sock, 1);
			setenv("ZEROD_LIBZEROCLIENT", env("OPS_LIBZEROCLIENT"), 1);
			setenv("PYTHONPATH", pypath, 1);
			setenv("PYTHONDONTWRITEBYTECODE", "1", 1);
			setenv("OMP_NUM_THREADS", "1", 1);
			execv(py, (char *const *)argv);
			_exit(127);
		}
	}
	for (int r = 0; r < 2; r++) {
		int st = wait_child(pids[r], 120000);
		CHECK(st == 0, "torch rank %d: exit %d", r, st);
		if (st != 0) {
			char out[256], *t;
			snprintf(out, sizeof(out), "%s/torch%d.out", cfgdir, r);
			t = slurp(out);
			printf("# %s\n", t);
			free(t);
		}
	}
	REQUIRE(zd_wait_log(&daemon_, ": ended (ok): 2 ranks, 6 iterations", 10000),
		"the torch job ended (ok) after its 6 iterations");
	REQUIRE(errors_total("ct1", after, sizeof(after)) == 0, "metrics after");
	CHECK(strcmp(before, after) == 0, "zerod_errors_total unchanged:\n# before:\n%s# after:\n%s",
	      before, after);
	log = slurp(daemon_.log);
	for (p = strstr(log, "job torch-"); p; p = strstr(p + 1, "job torch-")) {
		int n = (int)strcspn(p, "\n");
		CHECK(!memmem(p, (size_t)n, "ZC_E", 4), "an error logged: %.*s", n, p);
	}
	free(log);
}

/* Both ranks register; rank 1 leaves at once (between iterations), rank 0
 * stays until the pipe closes. */
static int c_leave_early(void *arg, int rank)
{
	struct zc_config cfg = test_config(&daemon_, arg, (uint32_t)rank, 2);
	struct small sm;
	zc_client *c = NULL;
	char ch;
	int r;

	close(wedge_pipe[1]);
	r = small_join(&cfg, &sm, &c);
	EXPECT(r == 0, "rank %d: %s", rank, zc_strerror_name(r));
	if (rank == 0)
		(void)!read(wedge_pipe[0], &ch, 1);
	zc_close(c);
	return child_bad;
}

/* A job that ended cleanly while a rank is still to leave is "ended", not
 * a failure: zeroctl status is not degraded by it. */
static void t_ended_not_failed(void)
{
	char how[256];
	pid_t pids[2];

	REQUIRE(pipe(wedge_pipe) == 0, "pipe");
	for (int r = 0; r < 2; r++)
		pids[r] = spawn(c_leave_early, "ops-lingers", r);
	close(wedge_pipe[0]);
	CHECK(wait_child(pids[1], 10000) == 0, "rank 1 registered and left");
	CHECK(zd_wait_log(&daemon_, "job ops-lingers: ends: rank 1", 5000), "the job ends");
	CHECK(zeroctl(&daemon_, "el1", "status", NULL, NULL, NULL) == 0,
	      "status: exit 0 (nothing degraded)");
	CHECK(has("el1", "out", "ops-lingers") && has("el1", "out", "ended"), "the job: ended");
	CHECK(zeroctl(&daemon_, "el1j", "-o", "json", "status", NULL) == 0, "json: exit 0");
	CHECK(check("json", "el1j") == 0, "schema");
	CHECK(has("el1j", "out", "\"state\":\"ended\""), "ended in JSON");
	CHECK(zeroctl(&daemon_, "el1m", "metrics", NULL, NULL, NULL) == 0, "metrics");
	CHECK(has("el1m", "out", "zerod_jobs{state=\"ended\"} 1") &&
		      has("el1m", "out", "zerod_jobs{state=\"failed\"} 0"),
	      "counted as ended, not failed");
	close(wedge_pipe[1]);
	CHECK(wait_child(pids[0], 10000) == 0, "rank 0 left");
	REQUIRE(ended_as("ops-lingers", how, sizeof(how)), "the job's end is logged");
	CHECK(strncmp(how, "ok): 2 ranks", 12) == 0, "ended (%s", how);
}

/* A job whose rank 2 never connected ends with the ranks it had. */
static int c_join_leave(void *arg, int rank)
{
	struct zc_config cfg = test_config(&daemon_, arg, (uint32_t)rank, 3);
	zc_client *c = NULL;
	char ch;
	int r = zc_connect(&cfg, &c);

	close(wedge_pipe[1]);
	EXPECT(r == 0, "rank %d: %s", rank, zc_strerror_name(r));
	(void)!read(wedge_pipe[0], &ch, 1);
	zc_close(c);
	return child_bad;
}

static void t_ranks_counted(void)
{
	char how[256];
	pid_t pids[2];

	REQUIRE(pipe(wedge_pipe) == 0, "pipe");
	for (int r = 0; r < 2; r++)
		pids[r] = spawn(c_join_leave, "ops-partial", r);
	close(wedge_pipe[0]);
	CHECK(zd_wait_connected(&daemon_, "ops-partial", 2, 10000) == 0, "ranks 0 and 1 joined");
	close(wedge_pipe[1]);
	for (int r = 0; r < 2; r++)
		CHECK(wait_child(pids[r], 10000) == 0, "rank %d", r);
	REQUIRE(ended_as("ops-partial", how, sizeof(how)), "the job's end is logged");
	CHECK(strstr(how, "): 2 of 3 ranks, 0 iterations"), "ended (%s", how);
}

/* ... but a job whose rank is stopped by Ctrl-C (SIGINT) while the others
 * go on ends failed, never "ok"; a job beside it trains on. */
static void t_sigint_rank(void)
{
	struct train_stop *beside_stop = train_stop_new(), *stop = train_stop_new();
	struct train_spec beside = train_spec(daemon_.sock, "ops-beside", 2, 1000000, beside_stop);
	struct train_spec spec = train_spec(daemon_.sock, "ops-int", 2, 1000000, stop);
	pid_t bp[2], ip[2];
	char how[256];
	int done;

	/* both ranks of ops-int rest 100 ms after each iteration: the signal
	 * lands between iterations, where a leaving rank once ended a job "ok" */
	spec.sleep_us = 100000;
	for (int r = 0; r < 2; r++) {
		bp[r] = spawn(c_train, &beside, r);
		ip[r] = spawn(c_train, &spec, r);
	}
	for (int i = 0; i < test_timeout(1500) &&
			(atomic_load(&stop->done) < 5 || atomic_load(&beside_stop->done) < 5);
	     i++)
		usleep(10000);
	REQUIRE(atomic_load(&stop->done) >= 5 && atomic_load(&beside_stop->done) >= 5,
		"both jobs trained 5 iterations");
	kill(ip[1], SIGINT);
	CHECK(wait_child(ip[1], 10000) != 0, "rank 1 of ops-int stopped by SIGINT");
	CHECK(wait_child(ip[0], 30000) != 0, "rank 0 of ops-int did not end as if trained");
	REQUIRE(ended_as("ops-int", how, sizeof(how)), "the job's end is logged");
	CHECK(strncmp(how, "ok)", 3) != 0 && strstr(how, "rank 1"),
	      "ended (%s: not ok, names rank 1", how);
	done = atomic_load(&beside_stop->done);
	for (int i = 0; i < test_timeout(1500) && atomic_load(&beside_stop->done) < done + 5; i++)
		usleep(10000);
	CHECK(atomic_load(&beside_stop->done) >= done + 5, "the job beside trains on");
	atomic_store(&beside_stop->requested, 1);
	for (int r = 0; r < 2; r++)
		CHECK(wait_child(bp[r], 30000) == 0, "ops-beside rank %d trained to the reference", r);
	if (test_failed_)
		zd_dump_log(&daemon_);
}

static int count_lines(const struct zd *d, const char *needle)
{
	char *s = slurp(d->log);
	int n = 0;

	for (char *p = s; (p = strstr(p, needle)); p++)
		n++;
	free(s);
	return n;
}

#define STALL_LINE "job ops-wedge: iteration 0 has made no progress"

static void t_stall(void)
{
	pid_t pids[2];

	REQUIRE(pipe(wedge_pipe) == 0, "pipe");
	for (int r = 0; r < 2; r++)
		pids[r] = spawn(c_wedge, "ops-wedge", r);
	close(wedge_pipe[0]);
	/* stall-warn 300 ms: reports at 0.3 s, 0.6 s, 1.2 s ... of the wait */
	CHECK(zd_wait_stalled(&daemon_, "ops-wedge", 10000) == 0, "the job never stalled");
	CHECK(zd_wait_log(&daemon_, STALL_LINE, 2000), "a stall report");
	/* rank 0 owes bucket 1 as well: both are named */
	CHECK(zd_wait_log(&daemon_, "rank 1 (bucket 0 of 2)", 1000),
	      "it names the rank and the bucket");
	for (int i = 0; i < test_timeout(300) && count_lines(&daemon_, STALL_LINE) < 2; i++)
		usleep(10000);
	/* the second report comes at twice the wait of the first */
	CHECK(count_lines(&daemon_, STALL_LINE) >= 2, "the report repeats");
	CHECK(count_lines(&daemon_, STALL_LINE) <= 3, "... with backoff: %d reports",
	      count_lines(&daemon_, STALL_LINE));
	CHECK(!zd_log_has(&daemon_, "job ops-wedge: failed"),
	      "the flag's stall-timeout (20 s), not the file's 50 ms");

	CHECK(zeroctl(&daemon_, "st2", "status", NULL, NULL, NULL) == 1,
	      "status with a stalled job: exit 1 (degraded)");
	CHECK(has("st2", "out", "rank 1 (bucket 0 of 2)"), "status says who it waits for");
	CHECK(zeroctl(&daemon_, "st2j", "-o", "json", "status", NULL) == 1, "json: exit 1");
	CHECK(check("json", "st2j") == 0, "schema");
	CHECK(has("st2j", "out", "\"stalled\":true"), "stalled in JSON");
	CHECK(zeroctl(&daemon_, "in2", "inspect", "ops-wedge", NULL, NULL) == 1, "inspect: exit 1");
	CHECK(has("in2", "out", "waiting"), "inspect: waiting");
	CHECK(has("in2", "out", "rank 1 (bucket 0 of 2)"), "inspect: for whom");
	CHECK(has("in2", "out", " stall "), "inspect: the stall in the flight recorder");
	CHECK(has("in2", "out", "1/2"), "inspect: bucket 0 arrived from 1 of 2 ranks");
	CHECK(zeroctl(&daemon_, "in2j", "-o", "json", "inspect", "ops-wedge") == 1, "json");
	CHECK(check("json", "in2j") == 0, "schema");
	CHECK(has("in2j", "out", "\"what\":\"stall\""), "the stall in JSON");
	CHECK(zeroctl(&daemon_, "in3", "inspect", "no-such-job", NULL, NULL) == 1,
	      "inspect of no job: exit 1");
	CHECK(has("in3", "err", "no job no-such-job"), "says so");

	/* a member of the group sees only its own jobs: none, so nothing stalls */
	if (!sh->no_user) {
		const char *argv[] = {env("ZEROCTL_BIN"), "--socket", daemon_.sock, "status",
				      NULL};
		CHECK(chmod(daemon_.dir, 0711) == 0, "let the member traverse %s", daemon_.dir);
		CHECK(run_as(sh->uid, sh->gid, argv, path_of("st3", "out"), NULL) == 0,
		      "status as a member of the group: exit 0");
		CHECK(has("st3", "out", "no jobs") && lacks("st3", "out", "ops-wedge"),
		      "root's job is not shown to it");
		CHECK(chmod(daemon_.dir, 0700) == 0, "chmod back");
	}

	close(wedge_pipe[1]);
	for (int r = 0; r < 2; r++)
		CHECK(wait_child(pids[r], 10000) == 0, "wedged rank %d", r);
}

static void t_reload(void)
{
	write_config("[zerod]\nstall-warn = 400\nstall-timeout = 60\nflight-records = 64\n"
		     "workers = 1\n");
	CHECK(zeroctl(&daemon_, "rl1", "reload", NULL, NULL, NULL) == 0, "reload");
	CHECK(has("rl1", "out", "applied        stall-warn: 300 -> 400"), "a live key applied");
	CHECK(has("rl1", "out", "needs restart  workers: 0 -> 1"), "a restart key reported");
	{
		char *s = slurp(path_of("rl1", "out"));
		CHECK(!strstr(s, "stall-timeout"), "the flag --stall-timeout still wins: %s", s);
		free(s);
	}
	CHECK(zd_wait_log(&daemon_, "reload: stall-warn: 300 -> 400", 2000), "logged");
	CHECK(zd_wait_log(&daemon_, "reload: workers: 0 -> 1 needs a restart", 2000), "logged");
	CHECK(zeroctl(&daemon_, "rl1j", "-o", "json", "reload", NULL) == 0, "reload json");
	CHECK(check("json", "rl1j") == 0, "schema");

	/* SIGHUP does the same */
	write_config("[zerod]\nstall-warn = 300\nlog-level = debug\nflight-records = 64\n");
	kill(daemon_.pid, SIGHUP);
	CHECK(zd_wait_log(&daemon_, "reload: log-level: info -> debug", 3000), "SIGHUP reloads");
	write_base_config();
	kill(daemon_.pid, SIGHUP);
	CHECK(zd_wait_log(&daemon_, "reload: log-level: debug -> info", 3000), "and back");
}

static void t_reload_bad(void)
{
	char *text;

	write_config("[zerod]\nstall-warn = 300\nmax-jobs = lots\n");
	CHECK(zeroctl(&daemon_, "rl2", "reload", NULL, NULL, NULL) == 1, "a bad file: exit 1");
	CHECK(has("rl2", "err", "zerod.conf:3: key max-jobs: 'lots'"), "names file, line, key");
	CHECK(has("rl2", "err", "keeps its running config"), "says the old one stays");
	CHECK(zd_wait_log(&daemon_, "keeping the running config", 2000), "logged");
	write_config("[zerod]\nstall-wran = 3\n");
	CHECK(zeroctl(&daemon_, "rl3", "reload", NULL, NULL, NULL) == 1, "an unknown key: exit 1");
	CHECK(has("rl3", "err", "zerod.conf:2: key stall-wran: no such key"), "names it");
	CHECK(zeroctl(&daemon_, "rl3j", "-o", "json", "reload", NULL) == 1, "json: exit 1");
	CHECK(check("json", "rl3j") == 0, "schema");
	CHECK(has("rl3j", "out", "\"ok\":false"), "ok false");
	write_base_config();
	CHECK(zd_alive(&daemon_), "zerod runs on");
	REQUIRE(zeroctl(&daemon_, "m2", "metrics", NULL, NULL, NULL) == 0, "metrics");
	text = slurp(path_of("m2", "out"));
	CHECK(strstr(text, "zerod_reloads_total{result=\"refused\"} 3"), "3 refused reloads");
	free(text);
}

/* A fake zerod that answers every request with a Ctl of another version. */
static int c_fake_daemon(void *arg, int idx)
{
	void *ctx = zmq_ctx_new(), *s = zmq_socket(ctx, ZMQ_ROUTER);
	char ep[256];
	uint8_t buf[64];
	Zerod__V1__Ctl rep = ZEROD__V1__CTL__INIT;
	Zerod__V1__StatusRequest sr = ZEROD__V1__STATUS_REQUEST__INIT;
	size_t n;

	(void)idx;
	snprintf(ep, sizeof(ep), "ipc://%s" ZEROD_CTL_SUFFIX, (const char *)arg);
	if (zmq_bind(s, ep) < 0)
		return 1;
	rep.version = 99;
	rep.body_case = ZEROD__V1__CTL__BODY_STATUS_REQUEST;
	rep.status_request = &sr;
	n = zerod__v1__ctl__pack(&rep, buf);
	for (int i = 0; i < 2; i++) {
		zmq_msg_t route, body;
		zmq_msg_init(&route);
		zmq_msg_init(&body);
		if (zmq_msg_recv(&route, s, 0) < 0 || zmq_msg_recv(&body, s, 0) < 0)
			return 1;
		zmq_send(s, zmq_msg_data(&route), zmq_msg_size(&route), ZMQ_SNDMORE);
		if (i == 0)
			zmq_send(s, buf, n, 0);
		else
			zmq_send(s, "\xff\xff\xff", 3, 0); /* not a Ctl at all */
		zmq_msg_close(&route);
		zmq_msg_close(&body);
	}
	usleep(100000);
	zmq_close(s);
	zmq_ctx_term(ctx);
	return 0;
}

static void t_exit_codes(void)
{
	struct zd fake = {0};
	pid_t pid;

	CHECK(zeroctl(&daemon_, "u1", "frobnicate", NULL, NULL, NULL) == 64, "unknown verb: 64");
	CHECK(zeroctl(&daemon_, "u2", "-o", "yaml", "status", NULL) == 64, "-o yaml: 64");
	CHECK(zeroctl(&daemon_, "u3", "inspect", NULL, NULL, NULL) == 64, "inspect, no job: 64");
	CHECK(zeroctl(&daemon_, "u4", "inspect", "bad job!", NULL, NULL) == 64,
	      "a job id zerod refuses: 64");
	CHECK(zeroctl(&daemon_, "u5", "-o", "json", "frobnicate", NULL) == 64, "json usage: 64");
	CHECK(check("json", "u5") == 0, "an error document fits the schema");

	snprintf(fake.dir, sizeof(fake.dir), "%s", cfgdir);
	snprintf(fake.sock, sizeof(fake.sock), "%s/nobody-here.sock", cfgdir);
	CHECK(zeroctl(&fake, "n1", "status", NULL, NULL, NULL) == 69, "no daemon: 69");
	CHECK(has("n1", "err", "no zerod at"), "says so");
	CHECK(zeroctl(&fake, "n1j", "-o", "json", "status", NULL) == 69, "no daemon, json: 69");
	CHECK(check("json", "n1j") == 0, "schema");

	snprintf(fake.sock, sizeof(fake.sock), "%s/fake.sock", cfgdir);
	pid = spawn(c_fake_daemon, fake.sock, 0);
	for (int i = 0; i < test_timeout(500); i++) {
		char p[256];
		snprintf(p, sizeof(p), "%s" ZEROD_CTL_SUFFIX, fake.sock);
		if (access(p, F_OK) == 0)
			break;
		usleep(5000);
	}
	CHECK(zeroctl(&fake, "v1", "status", NULL, NULL, NULL) == 76, "another version: 76");
	CHECK(has("v1", "err", "control protocol 99"), "names it");
	CHECK(zeroctl(&fake, "v2", "status", NULL, NULL, NULL) == 76, "not a Ctl reply: 76");
	CHECK(wait_child(pid, 5000) == 0, "the fake daemon");
}

static void t_permissions(void)
{
	const char *zc = env("ZEROCTL_BIN");
	const char *st[] = {zc, "--socket", daemon_.sock, "status", NULL};
	const char *rl[] = {zc, "--socket", daemon_.sock, "reload", NULL};
	const char *tr[] = {zc, "--socket", daemon_.sock, "trace", "on", "/tmp/x.json", NULL};
	char out[256], err[256];
	struct passwd *nobody = getpwnam("nobody");

	if (sh->no_user)
		SKIP(sh->no_user);
	/* the test user may traverse to the sockets (the group grants the rest) */
	REQUIRE(chmod(daemon_.dir, 0711) == 0, "chmod %s", daemon_.dir);
	snprintf(out, sizeof(out), "%s/p1.out", cfgdir);
	snprintf(err, sizeof(err), "%s/p1.err", cfgdir);
	CHECK(run_as(sh->uid, sh->gid, st, out, err) == 0, "a member of the group: status");
	CHECK(has("p1", "out", "backends host"), "... gets it");
	snprintf(err, sizeof(err), "%s/p2.err", cfgdir);
	CHECK(run_as(sh->uid, sh->gid, rl, NULL, err) == 77, "a member: reload is denied (77)");
	CHECK(has("p2", "err", "permission denied"), "says so");
	CHECK(run_as(sh->uid, sh->gid, tr, NULL, NULL) == 77, "a member: trace is denied (77)");
	if (nobody) {
		snprintf(err, sizeof(err), "%s/p3.err", cfgdir);
		CHECK(run_as(nobody->pw_uid, nobody->pw_gid, st, NULL, err) == 77,
		      "outside the group: 77");
		CHECK(has("p3", "err", "permission denied"), "says so");
	}
	CHECK(chmod(daemon_.dir, 0700) == 0, "chmod back");
}

/* -------------------------------------------------------- checkpoints --- */

/* A job whose trainers run as the test user (zerod runs as root: files
 * root owns are beyond them, as the zerod user's would be) and take the
 * checkpoints zeroctl asks for (zc_checkpoint_due between iterations). */
struct ckjob {
	struct zd d;
	/* stop: 0 while the ranks train; then the iteration both stop at, so
	 * that neither leaves while the other goes on (a failure, issue 20 §3) */
	atomic_int stop, iters;
	uid_t uid;
	gid_t gid;
};

static int c_ckpt_rank(void *arg, int rank)
{
	struct ckjob *k = arg;
	struct zc_config cfg = test_config(&k->d, "ops-ckpt", (uint32_t)rank, 2);
	struct small sm;
	zc_client *c = NULL;
	int r;

	if (setgroups(0, NULL) < 0 || setgid(k->gid) < 0 || setuid(k->uid) < 0) {
		EXPECT(0, "rank %d: becoming uid %u: %s", rank, (unsigned)k->uid, strerror(errno));
		return child_bad;
	}
	r = small_join(&cfg, &sm, &c);
	while (r >= 0) {
		zc_future *step = NULL;
		uint64_t t = zc_iteration(c);
		int stop_at = atomic_load(&k->stop);
		char due[512];

		if (stop_at > 0 && t >= (uint64_t)stop_at)
			break;
		if ((r = zc_checkpoint_due(c, due, sizeof(due))) == 1)
			r = zc_checkpoint(c, due); /* the write's outcome goes to zerod */
		for (uint32_t i = 0; r >= 0 && i < 2; i++) {
			for (int e = 0; e < 64; e++)
				zc_grad_buffer(c, i)[e] = 0.01f * (float)(rank + e);
			r = zc_bucket_ready(c, i, NULL);
		}
		if (r >= 0)
			r = zc_step_future(c, t, &step);
		if (r >= 0)
			r = zc_future_wait(step, test_timeout(20000));
		zc_future_free(step);
		if (r >= 0 && rank == 0)
			atomic_fetch_add(&k->iters, 1);
		usleep(2000);
	}
	EXPECT(r >= 0, "rank %d: %s: %s", rank, zc_strerror_name(r), zc_error_message());
	zc_close(c);
	return child_bad;
}

/* zeroctl --socket SOCK ARGS (up to 6) into DIR/NAME.out and .err. */
static int zeroctl6(const struct zd *d, const char *name, const char *const a[6])
{
	char out[256], err[256];
	const char *argv[] = {env("ZEROCTL_BIN"), "--socket", d->sock, a[0], a[1], a[2],
			      a[3], a[4], a[5], NULL};

	snprintf(out, sizeof(out), "%s/%s.out", cfgdir, name);
	snprintf(err, sizeof(err), "%s/%s.err", cfgdir, name);
	return run(argv, out, err);
}

/*
 * Issue 20 §2: every checkpoint's outcome reaches the operator. The job's
 * trainers run as another user. (1) zeroctl checkpoint JOB with the
 * default directory (zerod's checkpoint-dir, root's, mode 0755) is refused
 * up front, naming why. (2) zeroctl checkpoint --wait into a directory the
 * trainers cannot make (under root's 0755 one) exits 1 with the trainers'
 * reason; zerod logged it, zerod_checkpoints_total{result="failed"} is 1,
 * status and inspect (tables and JSON, against the schema) show it failed.
 * (3) --wait into one they own exits 0 naming the generation written; the
 * log, the metric {result="done"}, status and inspect show it. A job beside
 * it on the same zerod trains on to its reference.
 */
static void t_checkpoint_outcomes(void)
{
	struct ckjob *k = test_shared(sizeof(*k));
	struct train_stop *stop = train_stop_new();
	char cdir[256], bad[300], good[300], want[400];
	const char *args[] = {"--checkpoint-dir", cdir, "--group", TEST_USER, NULL};
	pid_t pids[2], bpids[2];
	struct train_spec by;
	struct zd own;
	int r;

	if (sh->no_user)
		SKIP(sh->no_user);
	snprintf(cdir, sizeof(cdir), "%s/ck-default", cfgdir);
	snprintf(bad, sizeof(bad), "%s/ck-root/job", cfgdir);
	snprintf(good, sizeof(good), "%s/ck-user", cfgdir);
	REQUIRE(mkdir(cdir, 0755) == 0, "mkdir %s: %s", cdir, strerror(errno));
	snprintf(want, sizeof(want), "%s/ck-root", cfgdir);
	REQUIRE(mkdir(want, 0755) == 0, "mkdir %s: %s", want, strerror(errno));
	REQUIRE(mkdir(good, 0755) == 0 && chown(good, sh->uid, sh->gid) == 0, "mkdir %s", good);
	r = zd_start(&own, args); /* not into shared memory: its child writes its pid */
	REQUIRE(r == 0, "cannot start zerod: %s", strerror(-r));
	k->d = own;
	/* the test user may traverse to the trainers' sockets, which its group
	 * may use (zeroclient.h, "Running zerod as another user") */
	snprintf(want, sizeof(want), "%s.fd", k->d.sock);
	REQUIRE(chmod(k->d.dir, 0711) == 0 && chown(k->d.sock, 0, sh->gid) == 0 &&
			chown(want, 0, sh->gid) == 0,
		"sharing %s: %s", k->d.sock, strerror(errno));
	k->uid = sh->uid;
	k->gid = sh->gid;
	by = train_spec(k->d.sock, "ops-ckpt-beside", 2, 1000000, stop);
	for (int i = 0; i < 2; i++) {
		pids[i] = spawn(c_ckpt_rank, k, i);
		bpids[i] = spawn(c_train, &by, i);
	}
	for (int i = 0; i < test_timeout(2000) && atomic_load(&k->iters) < 3; i++)
		usleep(5000);
	REQUIRE(atomic_load(&k->iters) >= 3, "the job did not train");

	/* (1) the default directory: refused before anyone is told */
	CHECK(zeroctl(&k->d, "ck1", "checkpoint", "ops-ckpt", NULL, NULL) == 1,
	      "the default directory: exit 1");
	CHECK(has("ck1", "err", "cannot be written by the job's trainers"), "says why");
	CHECK(has("ck1", "err", cdir), "names the directory");
	{
		char *o = slurp(path_of("ck1", "out"));
		CHECK(!strstr(o, "ranks told"), "nobody was told: %s", o);
		free(o);
	}

	/* (2) a directory the trainers cannot make */
	CHECK(zeroctl6(&k->d, "ck2", (const char *const[]){"checkpoint", "--wait", "ops-ckpt", bad,
							   NULL, NULL}) == 1,
	      "--wait on a checkpoint that fails: exit 1");
	CHECK(has("ck2", "out", "ranks told"), "the ranks were told");
	CHECK(has("ck2", "out", "FAILED"), "--wait says it failed");
	CHECK(has("ck2", "out", "Permission denied"), "... and why");
	snprintf(want, sizeof(want), "into %s failed (rank 0)", bad);
	CHECK(count_lines(&k->d, want) == 1, "zerod logged the failure once: '%s'", want);
	CHECK(zeroctl(&k->d, "ck2m", "metrics", NULL, NULL, NULL) == 0, "metrics");
	CHECK(has("ck2m", "out", "zerod_checkpoints_total{result=\"failed\"} 1"), "counted failed");
	CHECK(has("ck2m", "out", "zerod_checkpoints_total{result=\"done\"} 0"), "none done");
	CHECK(check("metrics", "ck2m") == 0, "the metrics parse");
	CHECK(zeroctl(&k->d, "ck2s", "status", NULL, NULL, NULL) == 0, "status");
	CHECK(has("ck2s", "out", "job ops-ckpt: last checkpoint: iteration"), "status shows it");
	CHECK(has("ck2s", "out", "FAILED") && has("ck2s", "out", "Permission denied"),
	      "... failed, and why");
	CHECK(zeroctl(&k->d, "ck2sj", "-o", "json", "status", NULL) == 0, "status -o json");
	CHECK(check("json", "ck2sj") == 0, "schema");
	CHECK(has("ck2sj", "out", "\"checkpoint\":{\"state\":\"failed\""), "JSON: failed");
	CHECK(zeroctl(&k->d, "ck2i", "inspect", "ops-ckpt", NULL, NULL) == 0, "inspect");
	CHECK(has("ck2i", "out", "FAILED"), "inspect shows it");
	CHECK(zeroctl(&k->d, "ck2ij", "-o", "json", "inspect", "ops-ckpt") == 0, "inspect json");
	CHECK(check("json", "ck2ij") == 0, "schema");
	CHECK(has("ck2ij", "out", "\"state\":\"failed\""), "JSON: failed");

	/* (3) one they can write */
	CHECK(zeroctl6(&k->d, "ck3", (const char *const[]){"-o", "json", "checkpoint", "--wait",
							   "ops-ckpt", good}) == 0,
	      "--wait on a good checkpoint: exit 0");
	CHECK(check("json", "ck3") == 0, "schema");
	snprintf(want, sizeof(want), "\"state\":\"done\",");
	CHECK(has("ck3", "out", want), "JSON: done");
	snprintf(want, sizeof(want), "%s/ckpt-00000001", good);
	CHECK(has("ck3", "out", want), "names the generation written");
	snprintf(want, sizeof(want), "written to %s/ckpt-00000001 (rank 0)", good);
	CHECK(count_lines(&k->d, want) == 1, "zerod logged it: '%s'", want);
	CHECK(zeroctl(&k->d, "ck3m", "metrics", NULL, NULL, NULL) == 0, "metrics");
	CHECK(has("ck3m", "out", "zerod_checkpoints_total{result=\"done\"} 1"), "counted done");
	CHECK(zeroctl(&k->d, "ck3s", "status", NULL, NULL, NULL) == 0, "status");
	CHECK(has("ck3s", "out", "written to"), "status shows it written");

	/* rank 0 has stepped iters iterations; neither rank is more than one
	 * past it */
	atomic_store(&k->stop, atomic_load(&k->iters) + 3);
	atomic_store(&stop->requested, 1);
	for (int i = 0; i < 2; i++) {
		CHECK(wait_child(pids[i], 30000) == 0, "rank %d of the checkpointing job", i);
		CHECK(wait_child(bpids[i], 30000) == 0,
		      "the job beside it, rank %d, did not train to its reference", i);
	}
	if (test_failed_)
		zd_dump_log(&own);
	CHECK(zd_stop(&own, 10000) == 0, "zerod stops");
}

/* ------------------------------------------------- sd_notify, activation --- */

struct notify_listener {
	int fd;
	char path[128];
	char got[16384];
	size_t len;
};

/* Read datagrams for up to ms, or until needle has arrived at or after
 * offset from of what came. */
static bool notify_wait_from(struct notify_listener *nl, size_t from, const char *needle, int ms)
{
	int64_t until = test_ms() + test_timeout(ms);

	while (!strstr(nl->got + from, needle)) {
		struct pollfd p = {.fd = nl->fd, .events = POLLIN};
		int left = (int)(until - test_ms());
		char buf[1024];
		ssize_t n;
		if (left <= 0 || poll(&p, 1, left) <= 0)
			return false;
		n = recv(nl->fd, buf, sizeof(buf) - 1, 0);
		if (n <= 0 || nl->len + (size_t)n + 2 >= sizeof(nl->got))
			continue;
		memcpy(nl->got + nl->len, buf, (size_t)n);
		nl->len += (size_t)n;
		nl->got[nl->len++] = '\n';
		nl->got[nl->len] = 0;
	}
	return true;
}

static bool notify_wait(struct notify_listener *nl, const char *needle, int ms)
{
	return notify_wait_from(nl, 0, needle, ms);
}

static int count(const char *hay, const char *needle)
{
	int n = 0;

	for (const char *p = hay; (p = strstr(p, needle)); p++)
		n++;
	return n;
}

static void t_notify(void)
{
	struct notify_listener nl = {0};
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	char sock[192], log[192], ctl[200];
	const char *args[] = {"--socket", sock, "--config", "/dev/null", NULL};
	pid_t pid;
	size_t at;
	int st;

	snprintf(nl.path, sizeof(nl.path), "%s/notify", cfgdir);
	snprintf(sock, sizeof(sock), "%s/n.sock", cfgdir);
	snprintf(ctl, sizeof(ctl), "%s" ZEROD_CTL_SUFFIX, sock);
	snprintf(log, sizeof(log), "%s/n.log", cfgdir);
	nl.fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	strcpy(sa.sun_path, nl.path);
	REQUIRE(nl.fd >= 0 && bind(nl.fd, (struct sockaddr *)&sa, sizeof(sa)) == 0, "bind %s",
		nl.path);
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		char wpid[32];
		int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		dup2(fd, 2);
		snprintf(wpid, sizeof(wpid), "%d", (int)getpid());
		setenv("NOTIFY_SOCKET", nl.path, 1);
		setenv("WATCHDOG_USEC", "300000", 1); /* pings every 150 ms */
		setenv("WATCHDOG_PID", wpid, 1);
		zd_exec(env("ZEROD_BIN"), args);
	}
	REQUIRE(notify_wait(&nl, "READY=1", 10000), "READY=1; got: %s", nl.got);
	CHECK(access(sock, F_OK) == 0 && access(ctl, F_OK) == 0,
	      "READY=1 only once both sockets are there");
	CHECK(notify_wait(&nl, "STATUS=0 jobs (0 active), 0 ranks", 3000),
	      "a STATUS= line: jobs, ranks, rate; got: %s", nl.got);
	at = nl.len;
	notify_wait_from(&nl, at, "never sent", 700); /* what comes in 0.7 s */
	CHECK(count(nl.got + at, "WATCHDOG=1") >= 2, "WATCHDOG=1 every half interval: %d in 0.7 s",
	      count(nl.got + at, "WATCHDOG=1"));
	at = nl.len;
	kill(pid, SIGHUP);
	CHECK(notify_wait_from(&nl, at, "RELOADING=1\nMONOTONIC_USEC=", 3000),
	      "RELOADING=1 with the time");
	at = (size_t)(strstr(nl.got + at, "RELOADING=1") - nl.got);
	CHECK(notify_wait_from(&nl, at, "READY=1", 3000), "READY=1 after the reload: %s",
	      nl.got + at);
	kill(pid, SIGTERM);
	CHECK(notify_wait(&nl, "STOPPING=1", 3000), "STOPPING=1");
	st = wait_child(pid, 10000);
	CHECK(st == 0, "zerod exits 0: %d", st);
	close(nl.fd);
	{
		struct zd z = {0};
		char lock[200];
		snprintf(z.log, sizeof(z.log), "%s", log);
		snprintf(lock, sizeof(lock), "%s.lock", sock);
		CHECK(access(lock, F_OK) < 0, "its lock file %s is gone", lock);
		CHECK(zd_log_has(&z, "zerod: served 0 jobs (0 failed): 0 iterations"),
		      "its last line: jobs served, how many failed");
	}
}

static void t_socket_activation(void)
{
	char dir[128], sock[192], log[192], ctl[200];
	const char *bin = "/usr/bin/systemd-socket-activate";
	struct train_spec spec;
	pid_t act, trainer;
	int st;

	if (access(bin, X_OK) < 0)
		SKIP("no systemd-socket-activate (Debian's systemd package)");
	if (getenv("ZEROD_WRAPPER") && *getenv("ZEROD_WRAPPER"))
		SKIP("zerod under $ZEROD_WRAPPER: systemd-socket-activate execs zerod itself");
	snprintf(dir, sizeof(dir), "%s/act", cfgdir);
	mkdir(dir, 0700);
	snprintf(sock, sizeof(sock), "%s/s.sock", dir);
	snprintf(ctl, sizeof(ctl), "%s" ZEROD_CTL_SUFFIX, sock);
	snprintf(log, sizeof(log), "%s/zerod.log", dir);
	fflush(stdout);
	act = fork();
	if (act == 0) {
		/* it passes zerod only the environment it is told to: a
		 * sanitizer's options (suppressions, exit code) go through */
		static const char *const keep[] = {"ASAN_OPTIONS", "UBSAN_OPTIONS",
						   "TSAN_OPTIONS", "LSAN_OPTIONS"};
		const char *argv[20];
		int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644), n = 0;

		dup2(fd, 2);
		argv[n++] = bin;
		for (size_t i = 0; i < ARRAY_SIZE(keep); i++)
			if (getenv(keep[i])) {
				argv[n++] = "-E";
				argv[n++] = keep[i];
			}
		argv[n++] = "-l";
		argv[n++] = sock;
		argv[n++] = env("ZEROD_BIN");
		argv[n++] = "--socket";
		argv[n++] = sock;
		argv[n++] = "--config";
		argv[n++] = "/dev/null";
		argv[n] = NULL;
		execv(bin, (char *const *)argv);
		_exit(127);
	}
	for (int i = 0; i < test_timeout(500) && access(sock, F_OK) < 0; i++)
		usleep(10000);
	REQUIRE(access(sock, F_OK) == 0, "systemd-socket-activate listens on %s", sock);
	CHECK(access(ctl, F_OK) < 0, "no zerod before the first trainer");
	spec = train_spec(sock, "ops-activated", 1, 3, NULL);
	trainer = spawn(c_train, &spec, 0);
	st = wait_child(trainer, 30000);
	CHECK(st == 0, "a trainer was served through the socket systemd passed: %d", st);
	{
		struct zd z = {0};
		snprintf(z.sock, sizeof(z.sock), "%s", sock);
		snprintf(z.log, sizeof(z.log), "%s", log);
		CHECK(zd_wait_ctl(&z, 5000) == 0, "zerod answers on its control socket");
		CHECK(zd_wait_log(&z, "came from systemd (socket activation)", 2000), "zerod says so");
		CHECK(zeroctl(&z, "sa1", "status", NULL, NULL, NULL) == 0, "zeroctl reaches it");
		CHECK(has("sa1", "out", sock), "its socket");
		if (test_failed_)
			zd_dump_log(&z);
	}
	kill(act, SIGTERM); /* it became zerod (exec) */
	st = wait_child(act, 10000);
	CHECK(st == 0, "zerod exits 0: %d", st);
	CHECK(access(sock, F_OK) == 0, "systemd's socket file is left to systemd");
	CHECK(access(ctl, F_OK) < 0, "zerod's own control socket is gone");
}

static const struct test_case cases[] = {
	{"status_idle", t_status_idle, 20000},
	{"job_and_trace", t_job_and_trace, 60000},
	{"metrics", t_metrics, 20000},
	{"clean_end", t_clean_end, 40000},
	{"sigint_rank", t_sigint_rank, 60000},
	{"clean_end_torch", t_clean_end_torch, 150000},
	{"ranks_counted", t_ranks_counted, 20000},
	{"ended_not_failed", t_ended_not_failed, 20000},
	{"stall_inspector", t_stall, 30000},
	{"reload", t_reload, 20000},
	{"reload_bad", t_reload_bad, 20000},
	{"exit_codes", t_exit_codes, 20000},
	{"permissions", t_permissions, 20000},
	{"sd_notify", t_notify, 20000},
	{"socket_activation", t_socket_activation, 40000},
	{"checkpoint_outcomes_logged_counted_shown", t_checkpoint_outcomes, 60000},
};

static void make_user(void)
{
	struct passwd *pw;
	struct group *gr;

	if (geteuid() != 0) {
		sh->no_user = "not root: cannot add a throwaway user (useradd) or switch to it";
		return;
	}
	pw = getpwnam(TEST_USER);
	if (!pw) {
		if (system("useradd --system --user-group --no-create-home --shell "
			   "/usr/sbin/nologin " TEST_USER " >/dev/null 2>&1") != 0 ||
		    !(pw = getpwnam(TEST_USER))) {
			sh->no_user = "useradd " TEST_USER " failed";
			return;
		}
		sh->user_created = true;
	}
	gr = getgrgid(pw->pw_gid);
	if (!gr || strcmp(gr->gr_name, TEST_USER) != 0) {
		sh->no_user = TEST_USER " has no group of its own";
		return;
	}
	sh->uid = pw->pw_uid;
	sh->gid = pw->pw_gid;
}

int main(int argc, char **argv)
{
	char stall[16], cmd[300];
	const char *extra[16];
	int n = 0, r;

	sh = test_shared(sizeof(*sh));
	sh->stop = train_stop_new();
	snprintf(cfgdir, sizeof(cfgdir), "%.60s/zerod-ops.XXXXXX", test_tmpdir());
	if (!mkdtemp(cfgdir)) {
		printf("Bail out! mkdtemp: %s\n", strerror(errno));
		return 1;
	}
	chmod(cfgdir, 0755);
	snprintf(cfgfile, sizeof(cfgfile), "%s/zerod.conf", cfgdir);
	snprintf(textfile, sizeof(textfile), "%s/zerod.prom", cfgdir);
	write_base_config();
	make_user();
	snprintf(stall, sizeof(stall), "%d", test_timeout(20000));
	extra[n++] = "--config";
	extra[n++] = cfgfile;
	extra[n++] = "--stall-timeout";
	extra[n++] = stall;
	extra[n++] = "--metrics-textfile";
	extra[n++] = textfile;
	extra[n++] = "--metrics-interval";
	extra[n++] = "200";
	/* the ends of jobs whose rank dies, as an operator sees them: the job
	 * fails at once (re-forming is the recovery suite's) */
	extra[n++] = "--rejoin-timeout";
	extra[n++] = "0";
	if (!sh->no_user) {
		extra[n++] = "--group";
		extra[n++] = TEST_USER;
	}
	extra[n] = NULL;
	r = zd_test_main(&daemon_, extra, cases, ARRAY_SIZE(cases), argc, argv);
	if (sh->user_created)
		(void)!system("userdel " TEST_USER " >/dev/null 2>&1");
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", cfgdir);
	if (!getenv("ZEROD_TEST_KEEP"))
		(void)!system(cmd);
	return r;
}
