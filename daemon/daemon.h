/*
 * daemon.h — the daemon as a whole, owned by the loop thread: what daemon.c
 * wires together (its start/stop order, signals, deadlines, limits) and
 * main.c runs. Each module's state is its own struct, held here:
 *   core   (core/core-t.h) jobs, their iterations and rendezvous, memory
 *   edge   (edge/edge-t.h) the trainers' sessions and connections
 *   ops    (ops/ops.h)     what the operator's side is given
 * and nothing below this folder includes this header (docs/LAYOUT.md).
 */
#ifndef ZEROD_DAEMON_H
#define ZEROD_DAEMON_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "base/config.h"
#include "core/core-t.h"
#include "edge/edge-t.h"
#include "ops/ops.h"

struct loop_timer;

struct daemon {
	struct daemon_config cfg;
	struct core core;
	struct edge edge;
	struct ops_env ops; /* what the operator's side is given (ops.h) */
	int sigfd;
	struct loop_timer *timer; /* housekeeping, due at the nearest deadline */
	int lockfd;               /* flock()ed lock file beside the socket */
	bool bound;               /* this process bound the socket (only then unlink it) */
	dev_t sock_dev;
	ino_t sock_ino;
	unsigned nofile; /* RLIMIT_NOFILE, raised to the hard limit */
	uint64_t status_serial;
	int64_t stop_deadline_ms;
	int listen_fd; /* socket activation: the trainers' socket from systemd, or -1 */
};

int daemon_run(const struct daemon_config *cfg);

#endif
