/*
 * ops.h — operating zerod: what daemon.c calls to run the operator's side
 * (systemd notifications, the config reload, the control socket zeroctl
 * speaks to, metrics, the stall inspector, the per-job flight recorder and
 * the trace timeline), and the hooks through which the core tells it what
 * happened. Everything here runs on the loop thread and never blocks: files
 * are written by a spool thread (spool.h).
 *
 * The hooks cost a pointer test when nobody looks (no trace running); each
 * is safe with a job the ops side has not seen yet.
 */
#ifndef ZEROD_OPS_H
#define ZEROD_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct core;
struct core_hooks;
struct daemon_config;
struct job;
struct ops;

/* What the operator's side is given of the rest of zerod (daemon.c fills
 * it before ops_open and keeps it for the daemon's life): it reads jobs and
 * counters through core, and the edge's counts through the pointers; core's
 * hooks_ctx is this struct. */
struct ops_env {
	struct daemon_config *cfg; /* the running config: a reload rewrites its live keys */
	struct core *core;
	void *zctx;    /* the ZeroMQ context the control socket is made in */
	int listen_fd; /* the trainers' socket from systemd (socket activation), or -1 */
	const unsigned *nsessions, *nconns; /* the edge's trainers and connections */
	const bool *stopping;               /* shutdown began */
	struct ops *ops;                    /* ops_open()'s; NULL before */
};

/* After the ROUTER is bound: the control socket, the spool, metrics, the
 * watchdog. configured: the config as built (reloads compare with it). 0,
 * or a negative errno with why written into why. */
int ops_open(struct ops_env *env, const struct daemon_config *configured, char *why, size_t len);
/* zerod serves: READY=1. */
void ops_ready(struct ops_env *env);
/* Shutdown began: STOPPING=1. */
void ops_stopping(struct ops_env *env);
/* Stop the trace (its file is completed), write what is queued, close the
 * control socket. NULL-safe on a daemon that never ran ops_open(). */
void ops_close(struct ops_env *env);
/* SIGHUP, or zeroctl reload: read the config file again; see ctl.c. */
void ops_reload(struct ops_env *env);

/* The timer (on_timer): watchdog, STATUS=, stall reports, the textfile, the
 * trace's flush; and before every sleep, when it wants to run next. */
void ops_tick(struct ops_env *env, int64_t now_ms);
int64_t ops_next_deadline(struct ops_env *env);

/* Socket activation: the listening socket systemd passed for path, or
 * -ENOENT. Before any thread starts. */
int ops_listen_fd(const char *path);

/* The hooks (core/hooks.h) the core and the edge call, with hooks_ctx the
 * ops_env: trace, flight recorder, metrics, the job's last checkpoint. */
extern const struct core_hooks ops_hooks;

/* zeroctl asked j for a checkpoint of iteration into dir (ctl.c): the job's
 * last checkpoint is that one, asked, until its outcome comes. */
void ops_checkpoint_asked(struct job *j, uint64_t iteration, const char *dir);

#endif
