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
#include <stdio.h>

struct daemon_config;
struct config_src;

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
