/* main.c — parse the command line, then daemon_run(). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "daemon.h"

static void usage(FILE *f)
{
	fprintf(f, "usage: zerod [options]\n"
		   "  -s, --socket PATH        socket (default $ZEROD_SOCKET, else\n"
		   "                           $RUNTIME_DIRECTORY/zerod.sock)\n"
		   "      --stall-timeout MS   fail an iteration stalled this long (60000)\n"
		   "      --workers N          CPU worker threads (0: one per CPU)\n"
		   "      --join-timeout MS    fail a job whose ranks connect but never register\n"
		   "                           (300000)\n"
		   "      --max-jobs N         jobs served at once (64)\n"
		   "      --max-sessions N     trainers at once (default: 1024, or what\n"
		   "                           RLIMIT_NOFILE allows if less)\n"
		   "      --hello-timeout MS   close a connection that has no session this\n"
		   "                           long (10000)\n"
		   "      --max-memory SIZE    optimizer state of all jobs together, in bytes\n"
		   "                           or with K, M, G, T (default: half the RAM)\n"
		   "      --backend B          auto (cuda where a GPU is visible, else host),\n"
		   "                           host, or cuda (refuse to start without a GPU)\n"
		   "  -v, --verbose            debug logging\n"
		   "  -q, --quiet              warnings and errors only\n"
		   "      --version\n");
}

static int parse_int(const char *s, int min, int *ret)
{
	char *end;
	long v = strtol(s, &end, 10);

	if (*s == 0 || *end || v < min || v > 1 << 30)
		return -1;
	*ret = (int)v;
	return 0;
}

/* "123", "64K", "1.5G" (binary units) -> bytes > 0. */
static int parse_size(const char *s, uint64_t *ret)
{
	static const char units[] = "KMGT";
	const char *u;
	char *end;
	double v = strtod(s, &end);

	if (end == s || !(v > 0))
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
	return *ret ? 0 : -1;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"socket", required_argument, NULL, 's'},
		{"stall-timeout", required_argument, NULL, 'T'},
		{"workers", required_argument, NULL, 'w'},
		{"max-jobs", required_argument, NULL, 'J'},
		{"max-sessions", required_argument, NULL, 'S'},
		{"max-memory", required_argument, NULL, 'M'},
		{"join-timeout", required_argument, NULL, 'j'},
		{"hello-timeout", required_argument, NULL, 'H'},
		{"backend", required_argument, NULL, 'B'},
		{"verbose", no_argument, NULL, 'v'},
		{"quiet", no_argument, NULL, 'q'},
		{"version", no_argument, NULL, 'V'},
		{"help", no_argument, NULL, 'h'},
		{0},
	};
	struct daemon_config cfg = {
		.stall_timeout_ms = 60000,
		.shutdown_timeout_ms = 10000,
		.max_jobs = 64,
		.max_sessions = 0, /* from the fd limit, up to 1024 */
		.join_timeout_ms = 300000,
		.hello_timeout_ms = 10000,
		.log_level = 6,
	};
	char pathbuf[4096];
	int c, v;

	while ((c = getopt_long(argc, argv, "s:vqh", opts, NULL)) != -1) {
		switch (c) {
		case 's':
			cfg.socket_path = optarg;
			break;
		case 'T':
			if (parse_int(optarg, 1, &cfg.stall_timeout_ms) < 0)
				goto bad;
			break;
		case 'w':
			if (parse_int(optarg, 0, &v) < 0)
				goto bad;
			cfg.workers = (unsigned)v;
			break;
		case 'J':
			if (parse_int(optarg, 1, &v) < 0)
				goto bad;
			cfg.max_jobs = (unsigned)v;
			break;
		case 'S':
			if (parse_int(optarg, 1, &v) < 0)
				goto bad;
			cfg.max_sessions = (unsigned)v;
			break;
		case 'j':
			if (parse_int(optarg, 1, &cfg.join_timeout_ms) < 0)
				goto bad;
			break;
		case 'H':
			if (parse_int(optarg, 1, &cfg.hello_timeout_ms) < 0)
				goto bad;
			break;
		case 'M':
			if (parse_size(optarg, &cfg.max_memory) < 0)
				goto bad;
			break;
		case 'B':
			cfg.backend = optarg;
			break;
		case 'v':
			cfg.log_level = 7;
			break;
		case 'q':
			cfg.log_level = 4;
			break;
		case 'V':
			printf("zerod %s (protocol %d)\n", ZEROD_VERSION_STRING,
			       ZC_PROTOCOL_VERSION);
			return 0;
		case 'h':
			usage(stdout);
			return 0;
		default:
			goto bad;
		}
	}
	if (optind != argc)
		goto bad;
	if (!cfg.socket_path)
		cfg.socket_path = getenv("ZEROD_SOCKET");
	if (!cfg.socket_path && getenv("RUNTIME_DIRECTORY")) {
		/* systemd may list several directories: the first is ours */
		snprintf(pathbuf, sizeof(pathbuf), "%s", getenv("RUNTIME_DIRECTORY"));
		pathbuf[strcspn(pathbuf, ":")] = 0;
		strncat(pathbuf, "/zerod.sock", sizeof(pathbuf) - strlen(pathbuf) - 1);
		cfg.socket_path = pathbuf;
	}
	if (!cfg.socket_path) {
		fprintf(stderr, "zerod: no socket path: pass --socket, or set ZEROD_SOCKET or "
				"RUNTIME_DIRECTORY\n");
		return 2;
	}
	return daemon_run(&cfg) < 0 ? 1 : 0;
bad:
	usage(stderr);
	return 2;
}
