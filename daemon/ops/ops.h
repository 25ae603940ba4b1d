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

struct daemon;
struct daemon_config;
struct job;
struct exec_done;

/* After the ROUTER is bound: the control socket, the spool, metrics, the
 * watchdog. configured: the config as built (reloads compare with it). 0,
 * or a negative errno with why written into why. */
int ops_open(struct daemon *d, const struct daemon_config *configured, char *why, size_t len);
/* zerod serves: READY=1. */
void ops_ready(struct daemon *d);
/* Shutdown began: STOPPING=1. */
void ops_stopping(struct daemon *d);
/* Stop the trace (its file is completed), write what is queued, close the
 * control socket. NULL-safe on a daemon that never ran ops_open(). */
void ops_close(struct daemon *d);
/* SIGHUP, or zeroctl reload: read the config file again; see ctl.c. */
void ops_reload(struct daemon *d);

/* The timer (on_timer): watchdog, STATUS=, stall reports, the textfile, the
 * trace's flush; and before every sleep, when it wants to run next. */
void ops_tick(struct daemon *d, int64_t now_ms);
int64_t ops_next_deadline(struct daemon *d);

/* Socket activation: the listening socket systemd passed for path, or
 * -ENOENT. Before any thread starts. */
int ops_listen_fd(const char *path);

/* ---- hooks: the core calls these ---- */

/* Every completion of an executor, before sched_on_done() acts on it
 * (daemon.c's on_completions). */
void ops_exec_done(struct daemon *d, const struct exec_done *done);
/* Rank `rank` handed over bucket b of iteration t (sched_bucket_ready, once
 * the bucket is accepted). */
void ops_bucket_ready(struct job *j, uint32_t rank, uint64_t t, uint32_t b);
/* Bucket b of iteration t is complete on every local rank and queued on the
 * executor (sched.c's bucket_complete, after exec_bucket_ex succeeded). */
void ops_bucket_queued(struct job *j, uint64_t t, uint32_t b);
/* j is about to be freed (job.c's job_free, first line). */
void ops_job_free(struct job *j);
/* An Error with code went to a trainer (session.c: session_send_error and
 * reply_error). */
void ops_error_sent(struct daemon *d, int code);
/* A trainer of j (rank) said how a checkpoint of iteration ended
 * (CheckpointDone, session.c; dir one line): logged, counted, kept as the
 * job's last. path: ok, the generation written (may be NULL); error: !ok,
 * why (any bytes: cleaned here). */
void ops_checkpoint_done(struct job *j, uint32_t rank, bool ok, uint64_t iteration,
			 const char *dir, const char *path, const char *error);
/* zeroctl asked j for a checkpoint of iteration into dir (ctl.c): the job's
 * last checkpoint is that one, asked, until its outcome comes. */
void ops_checkpoint_asked(struct job *j, uint64_t iteration, const char *dir);

#endif
