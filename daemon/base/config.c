/*
 * config.c — the table of zerod's settings and the three places a value can
 * come from: defaults, the config file, the command line (in that order, the
 * last one wins). Owns the parsed flags, the file's path and the strings
 * every built config points into (kept until config_src_free()).
 *
 * Why one table: a key added here is at once a flag, a file key, a line of
 * --help and a line of a reload's report, so the four never disagree.
 *
 * The file is INI (libinih): `key = value` lines, `#` or `;` comments, keys
 * at the top or under [zerod]. Unknown keys and sections are errors, named
 * with the file and line, so a typo never silently keeps a default. A reload
 * reads it on the loop thread, so it is read as a hostile user could have
 * made it: without blocking, a regular file only, bounded, no NUL inside.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <ini.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "common.h"
#include "base/config.h"
#include "zeroclient.h"

enum key_type {
	K_PATH,  /* a path ("" allowed where the key says so) */
	K_NAME,  /* a name ("" allowed) */
	K_MS,    /* int milliseconds >= min */
	K_COUNT, /* unsigned >= min */
	K_SIZE,  /* bytes: 123, 64K, 1.5G */
	K_LEVEL, /* 3..7 or err, warning, notice, info, debug */
	K_BOOL,  /* yes/no, true/false, on/off, 1/0; a flag without a value is yes */
};

static const struct key {
	const char *name;
	enum key_type type;
	size_t off;
	int min;
	bool live; /* a reload applies it */
	const char *arg, *help;
} keys[] = {
	{"socket", K_PATH, offsetof(struct daemon_config, socket_path), 0, false, "PATH",
	 "the trainers' ipc socket, mode 0660; beside it PATH.ctl (zeroctl), PATH.fd (fast "
	 "path), PATH.lock (default: $ZEROD_SOCKET, else $RUNTIME_DIRECTORY/zerod.sock)"},
	{"stall-timeout", K_MS, offsetof(struct daemon_config, stall_timeout_ms), 1, true, "MS",
	 "fail an iteration (or a plan registration) that makes no progress this long; the "
	 "error names the ranks and buckets it waits for"},
	{"stall-warn", K_MS, offsetof(struct daemon_config, stall_warn_ms), 0, true, "MS",
	 "the stall inspector: log what a job waits for once it waited this long, again at "
	 "2x, 4x, ... until stall-timeout fails it (0: never)"},
	{"rejoin-timeout", K_MS, offsetof(struct daemon_config, rejoin_timeout_ms), 0, true, "MS",
	 "a trainer of a running job dies: keep the job's optimizer state and parameters this "
	 "long for its restarted ranks to rejoin, and go on from the last iteration boundary "
	 "(0: the job fails at once, ZC_ERANKDEAD)"},
	{"recovery-journal", K_BOOL, offsetof(struct daemon_config, recovery_journal), 0, true, "B",
	 "keep each bucket's state from before its step (step mode interleaved; on CUDA "
	 "buffers both modes, on the devices), so that a trainer dying after some buckets "
	 "stepped recovers too (costs a copy of the state per iteration; without it that "
	 "death fails the job); jobs that start later"},
	{"join-timeout", K_MS, offsetof(struct daemon_config, join_timeout_ms), 1, true, "MS",
	 "fail a job whose ranks connect but do not register"},
	{"hello-timeout", K_MS, offsetof(struct daemon_config, hello_timeout_ms), 1, false, "MS",
	 "close a connection that has no session (no Hello yet, or its job ended)"},
	{"shutdown-timeout", K_MS, offsetof(struct daemon_config, shutdown_timeout_ms), 1, true,
	 "MS", "on SIGTERM, wait this long for executors to stop"},
	{"workers", K_COUNT, offsetof(struct daemon_config, workers), 0, false, "N",
	 "CPU worker threads for reductions and optimizer kernels (0: one per CPU)"},
	{"max-jobs", K_COUNT, offsetof(struct daemon_config, max_jobs), 1, true, "N",
	 "jobs served at once (new jobs past it get ZC_ELIMIT)"},
	{"max-sessions", K_COUNT, offsetof(struct daemon_config, max_sessions), 0, false, "N",
	 "trainers at once (0: 1024, or fewer if RLIMIT_NOFILE cannot hold them; two fds each)"},
	{"max-memory", K_SIZE, offsetof(struct daemon_config, max_memory), 0, true, "SIZE",
	 "optimizer state of all jobs together, with what their recovery keeps (the undo "
	 "journal, a CUDA job's copies off its devices), bytes or with K, M, G, T (0: half the "
	 "RAM); a reload applies it to jobs that start later"},
	{"max-user-memory", K_SIZE, offsetof(struct daemon_config, max_user_memory), 0, true,
	 "SIZE",
	 "of --max-memory, what the jobs of one user (the trainers' uid) may hold together "
	 "(0: all of it), so one user cannot starve the others; a reload applies it to jobs "
	 "that start later"},
	{"max-device-memory", K_SIZE, offsetof(struct daemon_config, max_device_memory), 0, true,
	 "SIZE",
	 "optimizer state CUDA jobs may hold on any one GPU together, besides --max-memory "
	 "(0: no limit); a reload applies it to jobs that start later"},
	{"log-level", K_LEVEL, offsetof(struct daemon_config, log_level), 3, true, "LEVEL",
	 "err, warning, notice, info or debug (3..7); -v is debug, -q warning"},
	{"flight-records", K_COUNT, offsetof(struct daemon_config, flight_records), 1, true, "N",
	 "operations kept per job for `zeroctl inspect` (a reload applies it to new jobs)"},
	{"metrics-textfile", K_PATH, offsetof(struct daemon_config, metrics_textfile), 0, true,
	 "PATH",
	 "also write the metrics to PATH (atomically: PATH.tmp, then rename) for "
	 "node-exporter's textfile collector (\"\": no file)"},
	{"metrics-interval", K_MS, offsetof(struct daemon_config, metrics_interval_ms), 100, true,
	 "MS", "how often the metrics textfile is written"},
	{"backend", K_NAME, offsetof(struct daemon_config, backend), 0, false, "B",
	 "auto (CUDA where a GPU is visible, else host), host, or cuda (refuse to start "
	 "without a usable GPU)"},
	{"checkpoint-dir", K_PATH, offsetof(struct daemon_config, checkpoint_dir), 0, true, "DIR",
	 "where `zeroctl checkpoint JOB` has the job's trainers write, as DIR/JOB, when it names "
	 "no directory (\"\": it must name one); shared by every node of a job"},
	{"group", K_NAME, offsetof(struct daemon_config, group), 0, false, "NAME",
	 "members of this group may run zeroctl status, inspect, metrics and checkpoint, on "
	 "their own jobs only; root and zerod's own user may run every verb, reload and trace "
	 "too (\"\": zerod's own group)"},
	{"tls-key", K_PATH, offsetof(struct daemon_config, tls_key), 0, false, "FILE",
	 "this zerod's TLS private key (PEM, as `zeroctl keygen PREFIX` writes PREFIX.key; mode "
	 "0600): with --tls-cert and --tls-peers or --tls-ca, every connection between daemons "
	 "is TLS 1.3 with both ends' certificates checked, and a job's host tensors cross the "
	 "mesh over TLS (\"\": TLS under each job's secret as a PSK, host tensors on gloo's "
	 "plain TCP)"},
	{"tls-cert", K_PATH, offsetof(struct daemon_config, tls_cert), 0, false, "FILE",
	 "this zerod's certificate (PEM; `zeroctl keygen` makes a self-signed one)"},
	{"tls-peers", K_PATH, offsetof(struct daemon_config, tls_peers), 0, false, "FILE",
	 "the SHA-256 fingerprints of the certificates of the zerods this one trusts, one a "
	 "line (as `zeroctl keygen` and `zeroctl fingerprint CERT` print them; '#' begins a "
	 "comment); its own certificate is always trusted"},
	{"tls-ca", K_PATH, offsetof(struct daemon_config, tls_ca), 0, false, "FILE",
	 "CA certificates (PEM): a peer whose certificate chains to one is trusted too"},
	{"tls-ktls", K_BOOL, offsetof(struct daemon_config, tls_ktls), 0, true, "B",
	 "ask for kernel TLS on the mesh's connections, so that the kernel encrypts where it "
	 "can (the job's start line says whether it does); a reload applies it to meshes that "
	 "open later"},
	{"tls-allow-plain-nccl", K_BOOL, offsetof(struct daemon_config, tls_allow_plain_nccl), 0,
	 true, "B",
	 "with TLS keys, still run CUDA jobs over several nodes, whose tensors NCCL moves "
	 "between the nodes unencrypted (no: such a job is refused with ZC_ENOTSUP; host jobs "
	 "cross the mesh over TLS either way); a reload applies it to jobs that start later"},
};

#define NKEYS ARRAY_SIZE(keys)

/* A config file is a few hundred bytes: anything past this is not one. */
#define CONFIG_MAX_BYTES (1 << 20)

/* A string a built config points into: all are kept until the end. */
struct str {
	struct str *next;
	char s[];
};

struct config_src {
	char *path;     /* the config file */
	bool path_given; /* --config: it must exist */
	bool path_read;  /* the last build read it (else it did not exist) */
	struct {
		unsigned key;
		char *value;
	} *flags;
	unsigned nflags;
	struct str *strs;
};

static void defaults(struct daemon_config *c)
{
	*c = (struct daemon_config){
		.socket_path = "",
		.stall_timeout_ms = 60000,
		.stall_warn_ms = 10000,
		.shutdown_timeout_ms = 10000,
		.max_jobs = 64,
		.max_sessions = 0,
		.join_timeout_ms = 300000,
		.rejoin_timeout_ms = 60000,
		.hello_timeout_ms = 10000,
		.log_level = 6,
		.flight_records = 256,
		.metrics_textfile = "",
		.checkpoint_dir = "",
		.metrics_interval_ms = 15000,
		.group = "",
		.tls_key = "",
		.tls_cert = "",
		.tls_peers = "",
		.tls_ca = "",
		.tls_ktls = true,
		.backend = "auto",
	};
}

static const char *keep(struct config_src *src, const char *s)
{
	size_t n = strlen(s) + 1;
	struct str *e = malloc(sizeof(*e) + n);

	if (!e)
		return NULL;
	memcpy(e->s, s, n);
	e->next = src->strs;
	src->strs = e;
	return e->s;
}

/* "123", "64K", "1.5G" (binary units) -> bytes; "0" allowed. */
static int parse_size(const char *s, uint64_t *ret)
{
	static const char units[] = "KMGT";
	const char *u;
	char *end;
	double v = strtod(s, &end);

	if (end == s || !(v >= 0))
		return -1;
	if (*end) {
		u = strchr(units, *end);
		if (!u || end[1])
			return -1;
		for (long i = 0; i <= u - units; i++)
			v *= 1024;
	}
	if (v >= 18e18)
		return -1;
	*ret = (uint64_t)v;
	return 0;
}

static const char *const level_names[] = {"emerg", "alert", "crit",   "err",
					  "warning", "notice", "info", "debug"};

/* Set key k of c from text; 0, or -EINVAL with why in err. */
static int set_key(struct config_src *src, struct daemon_config *c, const struct key *k,
		   const char *v, char *err, size_t len)
{
	void *field = (char *)c + k->off;
	char *end;
	long n;

	switch (k->type) {
	case K_PATH:
	case K_NAME: {
		const char *s = keep(src, v);
		if (!s) {
			snprintf(err, len, "out of memory");
			return -ENOMEM;
		}
		if (k->type == K_NAME && strpbrk(s, " \t/:")) {
			snprintf(err, len, "'%s' is not a name", v);
			return -EINVAL;
		}
		*(const char **)field = s;
		return 0;
	}
	case K_MS:
	case K_COUNT:
		errno = 0;
		n = strtol(v, &end, 10);
		if (*v == 0 || *end || errno || n < k->min || n > 1 << 30) {
			snprintf(err, len, "'%s' is not a whole number%s from %d to %d", v,
				 k->type == K_MS ? " of milliseconds" : "", k->min, 1 << 30);
			return -EINVAL;
		}
		if (k->type == K_MS)
			*(int *)field = (int)n;
		else
			*(unsigned *)field = (unsigned)n;
		return 0;
	case K_SIZE:
		if (parse_size(v, (uint64_t *)field) < 0) {
			snprintf(err, len,
				 "'%s' is not a size (bytes, or a number with K, M, G or T)", v);
			return -EINVAL;
		}
		return 0;
	case K_LEVEL:
		for (int i = 3; i < 8; i++)
			if (strcasecmp(v, level_names[i]) == 0 ||
			    (v[0] == '0' + i && v[1] == 0)) {
				*(int *)field = i;
				return 0;
			}
		snprintf(err, len,
			 "'%s' is not a level (err, warning, notice, info, debug or 3..7)", v);
		return -EINVAL;
	case K_BOOL:
		for (int i = 0; i < 8; i++) {
			static const char *const words[] = {"no",  "false", "off", "0",
							    "yes", "true",  "on",  "1"};
			if (strcasecmp(v, words[i]) == 0) {
				*(bool *)field = i >= 4;
				return 0;
			}
		}
		snprintf(err, len, "'%s' is not yes or no", v);
		return -EINVAL;
	}
	return -EINVAL;
}

static void format_key(const struct daemon_config *c, const struct key *k, char *buf, size_t len)
{
	const void *field = (const char *)c + k->off;

	switch (k->type) {
	case K_PATH:
	case K_NAME:
		snprintf(buf, len, "\"%s\"", *(const char *const *)field);
		break;
	case K_MS:
		snprintf(buf, len, "%d", *(const int *)field);
		break;
	case K_COUNT:
		snprintf(buf, len, "%u", *(const unsigned *)field);
		break;
	case K_SIZE:
		snprintf(buf, len, "%llu", (unsigned long long)*(const uint64_t *)field);
		break;
	case K_LEVEL:
		snprintf(buf, len, "%s", level_names[*(const int *)field & 7]);
		break;
	case K_BOOL:
		snprintf(buf, len, "%s", *(const bool *)field ? "yes" : "no");
		break;
	}
}

static bool key_equal(const struct daemon_config *a, const struct daemon_config *b,
		      const struct key *k)
{
	char x[512], y[512];

	format_key(a, k, x, sizeof(x));
	format_key(b, k, y, sizeof(y));
	return strcmp(x, y) == 0;
}

/* Keys of earlier versions: naming one is an error that says what replaced
 * it, never a silent start without it. */
static const char *const retired[] = {"curve-secret-key", "curve-peers", "curve-allow-plain-nccl"};
static const char retired_why[] =
	"CURVE keys are no longer used between daemons: make a TLS identity with `zeroctl "
	"keygen PREFIX`, set tls-key = PREFIX.key and tls-cert = PREFIX.crt, and list the "
	"other nodes' fingerprints in tls-peers (curve-allow-plain-nccl is now "
	"tls-allow-plain-nccl)";

static bool is_retired(const char *name)
{
	for (size_t i = 0; i < ARRAY_SIZE(retired); i++)
		if (strcmp(name, retired[i]) == 0)
			return true;
	return false;
}

static const struct key *find_key(const char *name)
{
	for (size_t i = 0; i < NKEYS; i++)
		if (strcmp(keys[i].name, name) == 0)
			return &keys[i];
	return NULL;
}

/* ------------------------------------------------------ the file --- */

struct file_ctx {
	struct config_src *src;
	struct daemon_config *cfg;
	char err[400]; /* the first key that failed: "key K: why" */
};

static int on_ini(void *user, const char *section, const char *name, const char *value)
{
	struct file_ctx *fc = user;
	const struct key *k;
	char why[200];

	if (fc->err[0])
		return 0; /* the first error is the one reported */
	if (section[0] && strcmp(section, "zerod") != 0) {
		snprintf(fc->err, sizeof(fc->err), "section [%.64s]: zerod's keys go at the top or "
			 "under [zerod]", section);
		return 0;
	}
	k = find_key(name);
	if (!k && is_retired(name)) {
		snprintf(fc->err, sizeof(fc->err), "key %s: %s", name, retired_why);
		return 0;
	}
	if (!k) {
		snprintf(fc->err, sizeof(fc->err),
			 "key %.64s: no such key (zerod --help lists them)", name);
		return 0;
	}
	if (set_key(fc->src, fc->cfg, k, value, why, sizeof(why)) < 0) {
		snprintf(fc->err, sizeof(fc->err), "key %s: %s", name, why);
		return 0;
	}
	return 1;
}

/* What a file's mode says it is, for the refusal of what is not text. */
static const char *file_kind(mode_t mode)
{
	return S_ISFIFO(mode)  ? "a FIFO"
	       : S_ISSOCK(mode) ? "a socket"
	       : S_ISDIR(mode)  ? "a directory"
	       : S_ISCHR(mode)  ? "a character device"
	       : S_ISBLK(mode)  ? "a block device"
				: "not a regular file";
}

/*
 * The whole file into *ret (NUL-terminated, malloc'd), read the way STYLE.md
 * asks, since a reload reads it on the loop thread: opened non-blocking (a
 * FIFO's open and read would wait for a writer for good), its type checked
 * on the open fd (no window for a swap), at most CONFIG_MAX_BYTES, and no
 * NUL inside (inih stops a line at one, so "\0garbage" would read as no
 * settings). A symlink is followed: configs under /etc often are ones, and
 * what it ends at is checked like any file. /dev/null is "no config file".
 * 0, -ENOENT (nothing there; err says so), or another code with why in err.
 */
static int slurp(const char *path, char **ret, char *err, size_t len)
{
	char *buf = NULL;
	size_t n = 0;
	struct stat st;
	int fd, r;

	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	if (fd < 0) {
		r = -errno;
		snprintf(err, len, "%s: %s", path, strerror(-r));
		return r;
	}
	if (fstat(fd, &st) < 0) {
		r = -errno;
		snprintf(err, len, "%s: %s", path, strerror(-r));
		goto out;
	}
	if (S_ISCHR(st.st_mode) && st.st_rdev == makedev(1, 3)) {
		st.st_size = 0; /* /dev/null */
	} else if (!S_ISREG(st.st_mode)) {
		r = -EINVAL;
		snprintf(err, len, "%s: %s, not a regular file: not read", path,
			 file_kind(st.st_mode));
		goto out;
	}
	if (st.st_size > CONFIG_MAX_BYTES) {
		r = -EFBIG;
		snprintf(err, len, "%s: %lld bytes, more than a config file's %d: not read", path,
			 (long long)st.st_size, CONFIG_MAX_BYTES);
		goto out;
	}
	/* one byte more than fstat said: a file that grew since shows */
	buf = malloc((size_t)st.st_size + 2);
	if (!buf) {
		r = -ENOMEM;
		snprintf(err, len, "%s: out of memory", path);
		goto out;
	}
	while (n <= (size_t)st.st_size && S_ISREG(st.st_mode)) {
		ssize_t k = read(fd, buf + n, (size_t)st.st_size + 1 - n);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0) {
			r = -errno;
			snprintf(err, len, "%s: cannot read it: %s", path, strerror(-r));
			goto out;
		}
		if (k == 0)
			break;
		n += (size_t)k;
	}
	if (n > (size_t)st.st_size) {
		r = -EAGAIN;
		snprintf(err, len, "%s: it grew while it was read: not read", path);
		goto out;
	}
	buf[n] = 0;
	if (strlen(buf) != n) {
		const char *nul = buf + strlen(buf);
		int line = 1;
		for (const char *p = buf; p < nul; p++)
			line += *p == '\n';
		r = -EINVAL;
		snprintf(err, len, "%s:%d: a NUL byte: a damaged file, or not text", path, line);
		goto out;
	}
	*ret = buf;
	buf = NULL;
	r = 0;
out:
	free(buf);
	close(fd);
	return r;
}

static int read_file(struct config_src *src, struct daemon_config *c, char *err, size_t len)
{
	struct file_ctx fc = {.src = src, .cfg = c};
	char *text = NULL;
	int line, r;

	src->path_read = false;
	r = slurp(src->path, &text, err, len);
	if (r == -ENOENT && !src->path_given) {
		err[0] = 0;
		return 0; /* no file at the default place: defaults and flags */
	}
	if (r < 0)
		return r;
	line = ini_parse_string(text, on_ini, &fc);
	free(text);
	src->path_read = true;
	if (line == 0)
		return 0;
	if (line < 0) {
		snprintf(err, len, "%s: cannot parse it", src->path);
		return -EIO;
	}
	if (fc.err[0])
		snprintf(err, len, "%s:%d: %s", src->path, line, fc.err);
	else
		snprintf(err, len, "%s:%d: not a 'key = value' line (nor a [section] or a comment)",
			 src->path, line);
	return -EINVAL;
}

/* --------------------------------------------------- command line --- */

/* The config file when --config names none: zerod.conf in systemd's
 * ConfigurationDirectory= (the first one listed), else ZEROD_CONFIG_PATH. */
static char *default_path(void)
{
	const char *env = getenv("CONFIGURATION_DIRECTORY");
	char path[4096];

	if (!env || !*env)
		return strdup(ZEROD_CONFIG_PATH);
	snprintf(path, sizeof(path), "%.*s/zerod.conf", (int)strcspn(env, ":"), env);
	return strdup(path);
}

enum { OPT_CONFIG = 'c', OPT_HELP = 'h', OPT_VERSION = 1000, OPT_RETIRED = 1050, OPT_KEY = 1100 };

void config_usage(FILE *f)
{
	struct daemon_config d;
	char def[64];

	defaults(&d);
	fprintf(f,
		"usage: zerod [--config FILE] [--KEY VALUE ...] [-v | -q]\n"
		"\n"
		"zerod is the per-node daemon of data-parallel training with a sharded (ZeRO-1)\n"
		"optimizer: trainers hand it their gradient buckets, it averages them over the\n"
		"ranks, steps the optimizer shard each rank owns and writes the parameters back.\n"
		"\n"
		"Settings come from defaults, then the config file, then the flags (flags win).\n"
		"Every KEY below is a line `KEY = VALUE` of the file and a flag `--KEY VALUE`.\n"
		"  -c, --config FILE        the config file (default\n"
		"                           $CONFIGURATION_DIRECTORY/zerod.conf, which is\n"
		"                           /etc/zerod/zerod.conf under zerod.service, else\n"
		"                           %s); a missing default file is\n"
		"                           no error, a missing FILE named here is one)\n"
		"  -s, --socket PATH        same as --socket below\n"
		"  -v, --verbose            log-level debug\n"
		"  -q, --quiet              log-level warning\n"
		"      --version            print the version and the protocol, and exit\n"
		"  -h, --help               this text\n"
		"\n"
		"Keys (\"live\": a reload applies it; \"restart\": it waits for a restart):\n",
		ZEROD_CONFIG_PATH);
	for (size_t i = 0; i < NKEYS; i++) {
		const struct key *k = &keys[i];
		char opt[48];
		format_key(&d, k, def, sizeof(def));
		snprintf(opt, sizeof(opt), k->type == K_BOOL ? "--%s[=%s]" : "--%s %s", k->name,
			 k->arg);
		fprintf(f, "  %-26s %s\n  %-26s (default %s; %s)\n", opt, k->help, "", def,
			k->live ? "live" : "restart");
	}
	fprintf(f,
		"\n"
		"Signals: SIGTERM/SIGINT stop gracefully (running iterations fail with\n"
		"ZC_ESHUTDOWN); SIGHUP reloads the config file (as `zeroctl reload` does: a\n"
		"file that does not parse keeps the running config and says why); SIGUSR1 logs\n"
		"a status line.\n"
		"\n"
		"systemd: Type=notify (READY=1 once it serves, STATUS= lines, WATCHDOG=1 from\n"
		"the event loop when WatchdogSec= is set, RELOADING=1/READY=1 around a reload,\n"
		"STOPPING=1); a listening socket passed by socket activation (zerod.socket) is\n"
		"adopted for the trainers' socket. Logs go to stderr with <N> level prefixes.\n"
		"\n"
		"Exit status: 0 stopped by a signal; 1 could not serve (says why); %d bad\n"
		"command line or no socket path; %d the config file was refused (names the\n"
		"file, the line and the key).\n"
		"\n"
		"Operate it with zeroctl (zeroctl --help says more): zeroctl status |\n"
		"inspect JOB | metrics | reload | trace on FILE | trace off |\n"
		"checkpoint JOB [DIR] | keygen PREFIX | fingerprint CERT.\n",
		CONFIG_EXIT_USAGE, CONFIG_EXIT_CONFIG);
}

static int add_flag(struct config_src *src, unsigned key, const char *value)
{
	void *t = realloc(src->flags, (src->nflags + 1) * sizeof(*src->flags));

	if (!t)
		return -ENOMEM;
	src->flags = t;
	src->flags[src->nflags].key = key;
	src->flags[src->nflags].value = strdup(value);
	if (!src->flags[src->nflags].value)
		return -ENOMEM;
	src->nflags++;
	return 0;
}

int config_parse_args(int argc, char **argv, struct config_src **ret)
{
	struct option opts[NKEYS + ARRAY_SIZE(retired) + 8];
	struct config_src *src = calloc(1, sizeof(*src));
	size_t n = 0;
	int c, r = 0;

	if (!src)
		return -ENOMEM;
	for (size_t i = 0; i < NKEYS; i++)
		opts[n++] = (struct option){keys[i].name,
					    keys[i].type == K_BOOL ? optional_argument
								   : required_argument,
					    NULL, OPT_KEY + (int)i};
	for (size_t i = 0; i < ARRAY_SIZE(retired); i++)
		opts[n++] =
			(struct option){retired[i], optional_argument, NULL, OPT_RETIRED + (int)i};
	opts[n++] = (struct option){"config", required_argument, NULL, OPT_CONFIG};
	opts[n++] = (struct option){"verbose", no_argument, NULL, 'v'};
	opts[n++] = (struct option){"quiet", no_argument, NULL, 'q'};
	opts[n++] = (struct option){"version", no_argument, NULL, OPT_VERSION};
	opts[n++] = (struct option){"help", no_argument, NULL, OPT_HELP};
	opts[n] = (struct option){0};

	optind = 1;
	while (r == 0 && (c = getopt_long(argc, argv, "c:s:vqh", opts, NULL)) != -1) {
		char err[200];
		struct daemon_config probe;
		switch (c) {
		case OPT_CONFIG:
			free(src->path);
			src->path = strdup(optarg);
			src->path_given = true;
			if (!src->path)
				r = -ENOMEM;
			break;
		case 's':
			r = add_flag(src, 0, optarg); /* keys[0] is socket */
			break;
		case 'v':
			r = add_flag(src, (unsigned)(find_key("log-level") - keys), "debug");
			break;
		case 'q':
			r = add_flag(src, (unsigned)(find_key("log-level") - keys), "warning");
			break;
		case OPT_VERSION:
			printf("zerod %s (protocol %d)\n", ZEROD_VERSION_STRING,
			       ZC_PROTOCOL_VERSION);
			r = 1;
			break;
		case OPT_HELP:
			config_usage(stdout);
			r = 1;
			break;
		default:
			if (c >= OPT_RETIRED && c < OPT_RETIRED + (int)ARRAY_SIZE(retired)) {
				fprintf(stderr, "zerod: --%s: %s\n", retired[c - OPT_RETIRED],
					retired_why);
				r = -CONFIG_EXIT_USAGE;
				break;
			}
			if (c < OPT_KEY || c >= OPT_KEY + (int)NKEYS) {
				fprintf(stderr, "zerod: see zerod --help\n");
				r = -CONFIG_EXIT_USAGE;
				break;
			}
			/* a bad value is a usage error now, not at start */
			defaults(&probe);
			const char *v = optarg ? optarg : "yes"; /* K_BOOL's bare flag */
			if (set_key(src, &probe, &keys[c - OPT_KEY], v, err, sizeof(err)) < 0) {
				fprintf(stderr, "zerod: --%s: %s\n", keys[c - OPT_KEY].name, err);
				r = -CONFIG_EXIT_USAGE;
				break;
			}
			r = add_flag(src, (unsigned)(c - OPT_KEY), v);
			break;
		}
	}
	if (r == 0 && optind != argc) {
		fprintf(stderr, "zerod: unexpected argument '%s'; see zerod --help\n",
			argv[optind]);
		r = -CONFIG_EXIT_USAGE;
	}
	if (r == 0 && !src->path && !(src->path = default_path()))
		r = -ENOMEM;
	if (r == -ENOMEM)
		fprintf(stderr, "zerod: out of memory\n");
	if (r != 0) {
		config_src_free(src);
		return r == -ENOMEM ? -CONFIG_EXIT_USAGE : r;
	}
	*ret = src;
	return 0;
}

void config_src_free(struct config_src *src)
{
	if (!src)
		return;
	for (unsigned i = 0; i < src->nflags; i++)
		free(src->flags[i].value);
	free(src->flags);
	while (src->strs) {
		struct str *e = src->strs;
		src->strs = e->next;
		free(e);
	}
	free(src->path);
	free(src);
}

const char *config_src_path(const struct config_src *src)
{
	return src->path_read ? src->path : "";
}

const char *config_src_file(const struct config_src *src)
{
	return src->path;
}

int config_build(struct config_src *src, struct daemon_config *ret, char *err, size_t len)
{
	struct daemon_config c;
	const char *env;
	int r;

	defaults(&c);
	r = read_file(src, &c, err, len);
	if (r < 0)
		return r;
	for (unsigned i = 0; i < src->nflags; i++) {
		r = set_key(src, &c, &keys[src->flags[i].key], src->flags[i].value, err, len);
		if (r < 0)
			return r; /* checked when parsed: out of memory */
	}
	/* the socket: --socket, $ZEROD_SOCKET, the file, $RUNTIME_DIRECTORY */
	env = getenv("ZEROD_SOCKET");
	if (env && *env) {
		bool flagged = false;
		for (unsigned i = 0; i < src->nflags; i++)
			flagged |= src->flags[i].key == 0;
		if (!flagged && !(c.socket_path = keep(src, env)))
			return -ENOMEM;
	}
	env = getenv("RUNTIME_DIRECTORY");
	if (!c.socket_path[0] && env && *env) {
		/* systemd may list several directories: the first is ours */
		char path[4096];
		snprintf(path, sizeof(path), "%.*s/zerod.sock", (int)strcspn(env, ":"), env);
		if (!(c.socket_path = keep(src, path)))
			return -ENOMEM;
	}
	c.src = src;
	*ret = c;
	return 0;
}

int config_diff(const struct daemon_config *a, const struct daemon_config *b, config_diff_fn fn,
		void *userdata)
{
	int n = 0;

	for (size_t i = 0; i < NKEYS; i++) {
		char x[512], y[512];
		if (key_equal(a, b, &keys[i]))
			continue;
		format_key(a, &keys[i], x, sizeof(x));
		format_key(b, &keys[i], y, sizeof(y));
		fn(userdata, keys[i].name, x, y, keys[i].live);
		n++;
	}
	return n;
}

void config_apply_live(struct daemon_config *to, const struct daemon_config *from)
{
	for (size_t i = 0; i < NKEYS; i++) {
		const struct key *k = &keys[i];
		size_t size = k->type == K_PATH || k->type == K_NAME ? sizeof(const char *)
			      : k->type == K_SIZE			 ? sizeof(uint64_t)
			      : k->type == K_BOOL			 ? sizeof(bool)
										 : sizeof(int);
		if (k->live)
			memcpy((char *)to + k->off, (const char *)from + k->off, size);
	}
}
