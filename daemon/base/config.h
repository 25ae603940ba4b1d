/*
 * config.h — zerod's settings: one table of keys, each both a key of the
 * config file (/etc/zerod/zerod.conf, read with libinih) and a command-line
 * flag of the same name. Flags win over the file, the file over defaults.
 *
 * A reload (SIGHUP, `zeroctl reload`) reads the file again, applies the
 * flags again, and sorts what changed into what applies live and what needs
 * a restart (config_diff). A file that does not parse changes nothing.
 */
#ifndef ZEROD_CONFIG_H
#define ZEROD_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct config_src;

/* What zerod runs with, built by config_build(); owned by daemon.c, read
 * by every module through a pointer, live keys rewritten by a reload. */
struct daemon_config {
	const char *socket_path;
	int stall_timeout_ms; /* an iteration that makes no progress this long fails */
	int shutdown_timeout_ms;
	unsigned workers; /* CPU worker threads; 0: one per CPU */
	unsigned max_jobs;
	unsigned max_sessions; /* trainers at once; 0: as many as the fds allow, up to 1024 */
	int join_timeout_ms;   /* a job whose ranks connect but never register */
	int rejoin_timeout_ms; /* a re-forming job waits this long for its ranks; 0: no recovery */
	bool recovery_journal; /* interleaved jobs keep the undo journal (state.h) */
	int hello_timeout_ms;  /* a connection that has no session this long is closed */
	uint64_t max_memory;   /* bytes of optimizer state over all jobs; 0: half the RAM */
	uint64_t max_user_memory; /* of it, what one user's jobs may hold; 0: all of it */
	uint64_t max_device_memory; /* CUDA jobs' state on any one GPU; 0: no limit */
	int log_level;
	const char *backend; /* --backend auto|host|cuda; NULL: auto */
	/* operations (ops.c): the stall inspector's first report, the flight
	 * recorder's size, the metrics textfile, who may use zeroctl */
	int stall_warn_ms;
	unsigned flight_records;
	const char *metrics_textfile; /* "": none */
	const char *checkpoint_dir;   /* zeroctl checkpoint's default (DIR/JOB); "": none */
	int metrics_interval_ms;
	const char *group; /* "": zerod's own group */
	/* TLS identity between daemons (net/tls.h); "": none (the jobs' PSKs) */
	const char *tls_key;
	const char *tls_cert;
	const char *tls_peers;
	const char *tls_ca;
	bool tls_ktls;             /* kernel TLS on the mesh where the kernel has it */
	bool tls_allow_plain_nccl; /* CUDA jobs over nodes with TLS keys (NCCL is plain) */
	struct config_src *src; /* the flags and file it came from: read again on reload */
};

#ifndef ZEROD_CONFIG_PATH
#define ZEROD_CONFIG_PATH "/etc/zerod/zerod.conf"
#endif

/* Exit statuses of zerod (sysexits.h). */
#define CONFIG_EXIT_USAGE  2  /* a bad command line (as always) */
#define CONFIG_EXIT_CONFIG 78 /* EX_CONFIG: the config file is refused */

/* Parse the command line into *ret (the flags, and which config file).
 * Returns 0 to go on; 1 when it printed --help or --version (exit 0); or
 * CONFIG_EXIT_USAGE's negation after saying what was wrong on stderr. */
int config_parse_args(int argc, char **argv, struct config_src **ret);
void config_src_free(struct config_src *src);
/* The config file src reads ("" when the default file does not exist). */
const char *config_src_path(const struct config_src *src);
/* The config file src looks for (read or not). */
const char *config_src_file(const struct config_src *src);

/* Defaults, then the file, then the flags, then the socket's fallbacks
 * ($ZEROD_SOCKET over the file, $RUNTIME_DIRECTORY/zerod.sock when nothing
 * names one). On failure returns -EINVAL (or -errno of the file) and writes
 * "FILE:LINE: key K: why" into err; *ret is untouched. Strings in *ret live
 * as long as src. Loop thread (or main) only. */
int config_build(struct config_src *src, struct daemon_config *ret, char *err, size_t len);

/* For each key whose value differs between a and b: fn(key, a's value, b's
 * value, whether it applies live). Returns how many differ. */
typedef void (*config_diff_fn)(void *userdata, const char *key, const char *old_value,
			       const char *new_value, bool live);
int config_diff(const struct daemon_config *a, const struct daemon_config *b, config_diff_fn fn,
		void *userdata);
/* Copy the live keys of from into to. */
void config_apply_live(struct daemon_config *to, const struct daemon_config *from);

/* The detailed --help of zerod, every key with its default and whether a
 * reload applies it. */
void config_usage(FILE *f);

#endif
