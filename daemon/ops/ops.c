/*
 * ops.c — the operator's side of zerod, glued to the core (see ops.h): the
 * per-job records (flight recorder, iteration timing, stall reports, the
 * last checkpoint asked or reported), the hooks that fill them (ops_hooks,
 * core/hooks.h), the stall inspector, the config reload, and the timer that
 * pings the watchdog, updates STATUS= and writes the metrics textfile (under
 * its lock file, so that two zerods never write one). Owns struct ops, every
 * struct jobops and the textfile's lock.
 *
 * A job's record is made the first time the ops side sees the job and goes
 * with it: the job_free hook when job.c frees it, else the next sweep finds
 * the job gone from core->jobs (a record remembers its job, and the job its
 * record, so a new job at a freed job's address is never taken for it).
 *
 * The stall inspector: a job that owes progress (an iteration in flight, or
 * ranks registering) and has waited stall-warn is reported, naming the
 * ranks and buckets it waits for, again at 2x, 4x ... the wait, until
 * stall-timeout fails it (sched.c). Reports are warnings in the log and
 * entries of the flight recorder.
 */
#include <errno.h>
#include <grp.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "base/config.h"
#include "base/lockfile.h"
#include "base/log.h"
#include "ops/ops_int.h"
#include "base/spool.h"
#include "zeroclient.h"

int64_t ops_now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* ------------------------------------------------------- job records --- */

static void jobops_free(struct jobops *jo)
{
	if (!jo)
		return;
	free(jo->flight);
	free(jo->queued_us);
	free(jo->ready_us);
	free(jo->ckpt.dir);
	free(jo->ckpt.path);
	free(jo->ckpt.error);
	free(jo);
}

static void record_failure(struct ops *o, struct jobops *jo)
{
	struct job *j = jo->job;
	struct flight_op *op;

	/* a quiet end (a rank left between iterations) is no failure, unless
	 * another rank goes on after it (job_went_on): looked at again */
	if (jo->failed_seen || !job_ended(j) || j->quiet_end)
		return;
	jo->failed_seen = true;
	metrics_count(o->m.failures, j->err);
	op = flight_add(jo->flight, ops_now_us() - jo->seen_us, FL_FAILED, j->iter, -1, -1, 0);
	snprintf(op->detail, sizeof(op->detail), "%s: %.96s", zc_strerror_name(j->err),
		 j->errmsg);
}

struct jobops *jobops_of(struct job *j)
{
	struct ops *o = ops_env_of(j)->ops;
	struct jobops *jo;

	if (!o)
		return NULL;
	if (j->ops)
		return j->ops;
	jo = calloc(1, sizeof(*jo));
	if (!jo || flight_new(o->configured.flight_records, &jo->flight) < 0) {
		free(jo);
		return NULL;
	}
	jo->job = j;
	jo->serial = ++o->job_serial;
	jo->seen_us = ops_now_us();
	jo->iter_mark_us = jo->seen_us;
	jo->stall_next_ms = INT64_MAX;
	jo->next = o->jobs;
	o->jobs = jo;
	j->ops = jo;
	flight_add(jo->flight, 0, FL_SEEN, j->iter, -1, -1, 0);
	return jo;
}

void jobops_sweep(struct ops_env *env)
{
	struct ops *o = env->ops;

	for (struct jobops **pp = &o->jobs; *pp;) {
		struct jobops *jo = *pp;
		bool live = false;
		for (struct job *j = env->core->jobs; j && !live; j = j->next)
			live = j == jo->job && j->ops == jo;
		if (live) {
			pp = &jo->next;
			continue;
		}
		*pp = jo->next;
		jobops_free(jo);
	}
}

static void ops_job_free(void *ctx, struct job *j)
{
	struct ops *o = ((struct ops_env *)ctx)->ops;
	struct jobops *jo = j->ops;

	if (!o || !jo)
		return;
	record_failure(o, jo);
	for (struct jobops **pp = &o->jobs; *pp; pp = &(*pp)->next)
		if (*pp == jo) {
			*pp = jo->next;
			break;
		}
	j->ops = NULL;
	jobops_free(jo);
}

double jobops_rate(const struct jobops *jo, int64_t now)
{
	const int64_t window = 10000;
	unsigned n = 0, kept = MIN(jo->nsteps, (unsigned)ARRAY_SIZE(jo->step_ms));
	int64_t oldest = now, span;

	for (unsigned i = 0; i < kept; i++)
		if (now - jo->step_ms[i] <= window) {
			n++;
			oldest = MIN(oldest, jo->step_ms[i]);
		}
	if (n == 0)
		return 0;
	/* a full ring covers less than the window: its own span */
	span = kept == ARRAY_SIZE(jo->step_ms) && n == kept ? now - oldest : window;
	span = MIN(span, now - jo->seen_us / 1000);
	return span > 0 ? n * 1000.0 / (double)span : 0;
}

bool ops_job_waiting(const struct job *j)
{
	return (j->state == JOB_ACTIVE && j->in_flight) || j->state == JOB_FORMING ||
	       j->state == JOB_REFORMING;
}

const char *ops_job_state_name(const struct job *j)
{
	/* a clean end whose last ranks are still to leave: not a failure */
	if (j->state == JOB_FAILED && j->quiet_end)
		return "ended";
	return job_state_name(j->state);
}

void ops_describe_wait(const struct job *j, char *buf, size_t len)
{
	size_t at = 0;
	int shown = 0, more = 0;

	buf[0] = 0;
	for (uint32_t r = 0; r < j->world; r++) {
		uint32_t nb = j->state == JOB_ACTIVE ? j->plan->nbuckets : 1;
		bool waiting;
		if (j->node_of && j->node_of[r] != j->topo.node)
			continue; /* another node's rank: its daemon names it */
		waiting = j->state == JOB_ACTIVE ? j->next_bucket[r] < nb : !j->plans[r];
		if (!waiting)
			continue;
		if (at + 64 >= len) {
			more++;
			continue;
		}
		if (j->state == JOB_ACTIVE)
			at += (size_t)snprintf(buf + at, len - at, "%srank %u (bucket %u of %u)%s",
					       shown ? ", " : "", r, j->next_bucket[r], nb,
					       j->ranks[r] ? "" : " (not connected)");
		else
			at += (size_t)snprintf(
				buf + at, len - at, "%srank %u%s", shown ? ", " : "", r,
				j->ranks[r] ? " (not registered)" : " (not connected)");
		shown++;
	}
	if (more)
		snprintf(buf + at, len - at, " and %d more ranks", more);
	if (!shown)
		snprintf(buf, len, j->state == JOB_ACTIVE ? "the executor (no rank is missing)"
							  : "the executor to start");
}

/* ------------------------------------------------------------ hooks --- */

static void ops_exec_done(void *ctx, const struct exec_done *done)
{
	struct ops_env *env = ctx;
	struct job *j = done->tag;
	struct ops *o = env->ops;
	struct jobops *jo;
	int64_t now;

	if (!o || !(jo = jobops_of(j)))
		return;
	now = ops_now_us();
	/* the executor records its ops only while a trace is on */
	if (j->exec && done->ev != EXEC_STOPPED)
		exec_trace(j->exec, o->trace != NULL);
	switch (done->ev) {
	case EXEC_STARTED:
		flight_add(jo->flight, now - jo->seen_us, FL_STARTED, 0, -1, -1, 0);
		jo->iter_mark_us = now;
		jo->iter = 0;
		break;
	case EXEC_BUCKET_DONE: {
		int64_t queued = 0;
		if (jo->iter != done->iteration) {
			jo->iter = done->iteration;
			jo->reduced = 0;
		}
		if (jo->queued_us && done->bucket < jo->nb)
			queued = jo->queued_us[done->bucket];
		jo->reduced++;
		flight_add(jo->flight, now - jo->seen_us, FL_REDUCED, done->iteration,
			   (int32_t)done->bucket, -1, queued ? (uint64_t)(now - queued) : 0);
		if (queued)
			hist_observe(&o->m.handoff, (double)(now - queued) / 1e6);
		if (o->trace)
			trace_reduced(env, jo, done->iteration, done->bucket, queued, now);
		jo->iter_last_reduced_us = now;
		break;
	}
	case EXEC_STEP_DONE:
		flight_add(jo->flight, now - jo->seen_us, FL_STEP, done->iteration, -1, -1,
			   (uint64_t)(now - jo->iter_mark_us));
		hist_observe(&o->m.iteration, (double)(now - jo->iter_mark_us) / 1e6);
		if (jo->first_ready_us)
			hist_observe(&o->m.step, (double)(now - jo->first_ready_us) / 1e6);
		if (o->trace) {
			struct exec_span sp[64];
			size_t n;
			while (j->exec && (n = exec_take_spans(j->exec, sp, ARRAY_SIZE(sp))) > 0)
				trace_ops(env, jo, sp, n);
			trace_step(env, jo, done->iteration, jo->iter_last_reduced_us, now);
		}
		jo->step_ms[jo->nsteps++ % ARRAY_SIZE(jo->step_ms)] = now / 1000;
		jo->iter_mark_us = now;
		jo->first_ready_us = 0;
		jo->iter = done->iteration + 1;
		jo->reduced = 0;
		jo->iter_last_reduced_us = 0;
		if (jo->queued_us)
			memset(jo->queued_us, 0, jo->nb * sizeof(*jo->queued_us));
		break;
	case EXEC_FAILED: {
		struct flight_op *op = flight_add(jo->flight, now - jo->seen_us, FL_FAILED,
						  j->iter, -1, -1, 0);
		snprintf(op->detail, sizeof(op->detail), "%s of buckets %u..%u: %s",
			 done->op ? done->op : "an op", done->lo, done->hi,
			 zc_strerror(done->status));
		break;
	}
	case EXEC_STOPPED: {
		/* its counts stay in the totals once the executor is gone */
		struct exec_stats es;
		exec_stats(j->exec, &es);
		o->ended.reduced_elems += es.reduced_elems;
		o->ended.stepped_elems += es.stepped_elems;
		o->ended.bcast_elems += es.bcast_elems;
		flight_add(jo->flight, now - jo->seen_us, FL_STOPPED, j->iter, -1, -1, 0);
		record_failure(o, jo);
		break;
	}
	case EXEC_STATE_DONE:
		break;
	}
}

/* The per-bucket arrays, sized once the plan is known, and again for
 * another plan or world size (a re-plan, a re-formed job). */
static bool jobops_buckets(struct jobops *jo)
{
	struct job *j = jo->job;

	if (!j->plan)
		return jo->queued_us != NULL;
	if (jo->queued_us && jo->nb == j->plan->nbuckets && jo->world == j->world)
		return true;
	free(jo->queued_us);
	free(jo->ready_us); /* trace.c's, [world][nb] */
	jo->queued_us = NULL;
	jo->ready_us = NULL;
	jo->queued_us = calloc(j->plan->nbuckets, sizeof(*jo->queued_us));
	if (!jo->queued_us)
		return false;
	jo->nb = j->plan->nbuckets;
	jo->world = j->world;
	return true;
}

static void ops_bucket_ready(void *ctx, struct job *j, uint32_t rank, uint64_t t, uint32_t b)
{
	struct ops_env *env = ctx;
	struct jobops *jo;
	int64_t now;

	if (!env->ops || !(jo = jobops_of(j)))
		return;
	now = ops_now_us();
	if (!jo->first_ready_us)
		jo->first_ready_us = now;
	flight_add(jo->flight, now - jo->seen_us, FL_READY, t, (int32_t)b, (int32_t)rank, 0);
	if (env->ops->trace && jobops_buckets(jo))
		trace_ready(env, jo, rank, t, b, now);
}

static void ops_bucket_queued(void *ctx, struct job *j, uint64_t t, uint32_t b)
{
	struct jobops *jo;
	int64_t now;

	if (!((struct ops_env *)ctx)->ops || !(jo = jobops_of(j)) || !jobops_buckets(jo))
		return;
	now = ops_now_us();
	if (b < jo->nb)
		jo->queued_us[b] = now;
	flight_add(jo->flight, now - jo->seen_us, FL_QUEUED, t, (int32_t)b, -1,
		   jo->first_ready_us ? (uint64_t)(now - jo->first_ready_us) : 0);
}

static void ops_error_sent(void *ctx, int code)
{
	struct ops_env *env = ctx;
	if (env->ops)
		metrics_count(env->ops->m.errors, code);
}

/* ------------------------------------------------------ checkpoints --- */

const char *ckpt_seen_name(enum ckpt_seen_state s)
{
	static const char *const names[] = {"none", "asked", "done", "failed"};
	return s <= CKPT_SEEN_FAILED ? names[s] : "?";
}

/* jo's last checkpoint replaced (out of memory: the strings it could not
 * copy are NULL; dir then "?"). */
static void ckpt_seen_set(struct jobops *jo, enum ckpt_seen_state state, uint64_t iteration,
			  uint32_t rank, const char *dir, const char *path, const char *error)
{
	struct ckpt_seen *k = &jo->ckpt;

	free(k->dir);
	free(k->path);
	free(k->error);
	*k = (struct ckpt_seen){.state = state,
				.iteration = iteration,
				.rank = rank,
				.at_ms = now_ms(),
				.dir = strdup(dir),
				.path = path && *path ? strdup(path) : NULL,
				.error = error ? strdup(error) : NULL};
}

void ops_checkpoint_asked(struct job *j, uint64_t iteration, const char *dir)
{
	struct jobops *jo = ops_env_of(j)->ops ? jobops_of(j) : NULL;

	if (jo)
		ckpt_seen_set(jo, CKPT_SEEN_ASKED, iteration, 0, dir, NULL, NULL);
}

static void ops_checkpoint_done(void *ctx, struct job *j, uint32_t rank, bool ok,
				uint64_t iteration, const char *dir, const char *path,
				const char *error)
{
	struct ops *o = ((struct ops_env *)ctx)->ops;
	struct jobops *jo;
	char why[400];
	size_t n = 0;

	if (!o)
		return;
	/* the trainer's words: one line of printable bytes in the log and
	 * zeroctl's tables */
	for (const char *p = error ? error : "no reason given"; *p && n + 1 < sizeof(why); p++)
		why[n++] = (unsigned char)*p < 0x20 || *p == 0x7f ? '?' : *p;
	why[n] = '\0';
	if (ok) {
		o->m.checkpoints_done++;
		log_notice("job %s: checkpoint of iteration %" PRIu64 " written to %s (rank %u)",
			   j->id, iteration, path && *path ? path : dir, rank);
	} else {
		o->m.checkpoints_failed++;
		log_warning("job %s: checkpoint of iteration %" PRIu64 " into %s failed (rank %u): "
			    "%s",
			    j->id, iteration, dir, rank, why);
	}
	if ((jo = jobops_of(j)))
		ckpt_seen_set(jo, ok ? CKPT_SEEN_DONE : CKPT_SEEN_FAILED, iteration, rank, dir,
			      path, ok ? NULL : why);
}

/* ------------------------------------------------- stall inspector --- */

static int stall_limit(const struct ops_env *env, const struct job *j)
{
	return j->state == JOB_FORMING && j->nregistered == 0 ? env->cfg->join_timeout_ms
							       : env->cfg->stall_timeout_ms;
}

static void stall_check(struct ops_env *env, struct jobops *jo, int64_t now)
{
	struct job *j = jo->job;
	int warn = env->cfg->stall_warn_ms, limit = stall_limit(env, j);
	int64_t waited = now - j->progress_ms, next;
	struct flight_op *op;
	char who[400];

	if (!ops_job_waiting(j) || warn <= 0 || warn >= limit) {
		jo->stall_next_ms = INT64_MAX;
		return;
	}
	if (jo->stall_progress != j->progress_ms) {
		/* it moved since the last report: a new stall, if any */
		jo->stall_progress = j->progress_ms;
		jo->stall_reports = 0;
		jo->stall_next_ms = j->progress_ms + warn;
	}
	if (now < jo->stall_next_ms)
		return;
	ops_describe_wait(j, who, sizeof(who));
	log_set_cause(j->uid);
	if (j->state == JOB_ACTIVE)
		log_warning("job %s: iteration %" PRIu64 " has made no progress for %.1f s; "
			    "waiting for %s; it fails after %.1f s (stall-timeout)",
			    j->id, j->iter, (double)waited / 1000, who, limit / 1000.0);
	else
		log_warning("job %s: plan registration has made no progress for %.1f s; waiting "
			    "for %s; it fails after %.1f s (%s)",
			    j->id, (double)waited / 1000, who, limit / 1000.0,
			    j->nregistered ? "stall-timeout" : "join-timeout");
	log_clear_cause();
	op = flight_add(jo->flight, ops_now_us() - jo->seen_us, FL_STALL, j->iter, -1, -1,
			(uint64_t)waited * 1000);
	snprintf(op->detail, sizeof(op->detail), "waiting for %.100s", who);
	jo->stall_reports++;
	/* backoff: at warn x 2, x 4, ... of the wait, while it can still matter */
	next = j->progress_ms + ((int64_t)warn << MIN(jo->stall_reports, 20u));
	jo->stall_next_ms = next < j->progress_ms + limit ? next : INT64_MAX;
}

/* -------------------------------------------------------- the timer --- */

static void update_status(struct ops_env *env, int64_t now)
{
	unsigned active = 0, ranks = 0;
	double rate = 0;
	char text[256];

	for (struct job *j = env->core->jobs; j; j = j->next) {
		struct jobops *jo = jobops_of(j);
		active += j->state == JOB_ACTIVE;
		ranks += j->nconnected;
		if (jo)
			rate += jobops_rate(jo, now);
	}
	snprintf(text, sizeof(text), "%u jobs (%u active), %u ranks, %.1f iterations/s%s",
		 env->core->njobs, active, ranks, rate, (*env->stopping) ? ", stopping" : "");
	notify_status(&env->ops->notify, text);
}

/* May this zerod write the textfile at path? Only while it holds
 * PATH.lock: two zerods sharing a config file (nodes on one machine)
 * would each overwrite the other's metrics. A path another one holds is
 * refused once, loudly, and asked about again when the config changes. */
static bool textfile_claimed(struct ops *o, const char *path)
{
	char why[512];
	int r;

	if (strcmp(o->textfile_held, path) == 0)
		return o->textfile_lock >= 0;
	lockfile_release(o->textfile_held, o->textfile_lock);
	o->textfile_lock = -1;
	snprintf(o->textfile_held, sizeof(o->textfile_held), "%s", path);
	if (!path[0])
		return false; /* a reload turned it off */
	r = lockfile_take(path, &o->textfile_lock, why, sizeof(why));
	if (r == -EWOULDBLOCK)
		log_warning("metrics-textfile %s: another zerod writes it (it holds %s.lock); "
			    "this one writes none: give each zerod its own --metrics-textfile",
			    path, path);
	else if (r < 0)
		log_warning("metrics-textfile %s: %s; not writing it", path, why);
	return r == 0;
}

static void write_textfile(struct ops_env *env)
{
	struct sbuf b = {0};
	size_t len;
	char *s;

	metrics_render(env, &b);
	if (b.failed) {
		sbuf_free(&b);
		return;
	}
	s = sbuf_take(&b, &len);
	spool_replace(env->ops->spool, env->cfg->metrics_textfile, s, len);
}

void ops_tick(struct ops_env *env, int64_t now)
{
	struct ops *o = env->ops;

	if (!o)
		return;
	ctl_tick(env);
	jobops_sweep(env);
	for (struct job *j = env->core->jobs; j; j = j->next) {
		struct jobops *jo = jobops_of(j);
		if (!jo)
			continue;
		record_failure(o, jo);
		stall_check(env, jo, now);
	}
	if (o->notify.enabled && now >= o->notify.next_ping_ms)
		update_status(env, now);
	notify_tick(&o->notify, now);
	if (!env->cfg->metrics_textfile[0] && o->textfile_held[0])
		textfile_claimed(o, ""); /* its lock goes */
	if (env->cfg->metrics_textfile[0] && now >= o->textfile_next_ms) {
		if (textfile_claimed(o, env->cfg->metrics_textfile))
			write_textfile(env);
		o->textfile_next_ms = now + env->cfg->metrics_interval_ms;
	}
	trace_flush(env);
}

int64_t ops_next_deadline(struct ops_env *env)
{
	struct ops *o = env->ops;
	int64_t next;

	if (!o)
		return INT64_MAX;
	next = MIN(notify_next(&o->notify), ctl_next_deadline(env));
	/* (core->jobs, not o->jobs: a record may outlive its job until a sweep) */
	for (struct job *j = env->core->jobs; j; j = j->next) {
		struct jobops *jo = j->ops;
		/* a job that moved since its last report (or was never looked
		 * at): its first one is due at progress + warn */
		bool fresh = !jo || jo->stall_progress != j->progress_ms;
		if (fresh && ops_job_waiting(j) && env->cfg->stall_warn_ms > 0)
			next = MIN(next, j->progress_ms + env->cfg->stall_warn_ms);
		else if (!fresh)
			next = MIN(next, jo->stall_next_ms);
	}
	if (env->cfg->metrics_textfile[0])
		next = MIN(next, o->textfile_next_ms);
	if (o->trace)
		next = MIN(next, now_ms() + 1000); /* the trace reaches its file within 1 s */
	return next;
}

/* ----------------------------------------------------------- reload --- */

struct diff_ctx {
	struct reload_report *rep;
};

static void on_diff(void *userdata, const char *key, const char *old_value, const char *new_value,
		    bool live)
{
	struct diff_ctx *c = userdata;

	if (live) {
		log_notice("reload: %s: %s -> %s", key, old_value, new_value);
		sbuf_printf(&c->rep->applied, "%s: %s -> %s\n", key, old_value, new_value);
	} else {
		log_warning("reload: %s: %s -> %s needs a restart; keeping %s", key, old_value,
			    new_value, old_value);
		sbuf_printf(&c->rep->restart, "%s: %s -> %s\n", key, old_value, new_value);
	}
}

static uint64_t half_the_ram(void)
{
	return (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGE_SIZE) / 2;
}

void ops_reload_report(struct ops_env *env, struct reload_report *rep)
{
	struct ops *o = env->ops;
	struct daemon_config next;
	struct diff_ctx dc = {.rep = rep};
	int r;

	notify_reloading(&o->notify);
	r = config_build(env->cfg->src, &next, rep->error, sizeof(rep->error));
	if (r < 0) {
		log_err("reload: %s; keeping the running config", rep->error);
		o->m.reloads_failed++;
		rep->ok = false;
		notify_ready(&o->notify);
		return;
	}
	rep->ok = true;
	if (config_diff(&o->configured, &next, on_diff, &dc) == 0)
		log_notice("reload: %s: nothing changed", config_src_path(env->cfg->src));
	config_apply_live(&o->configured, &next);
	config_apply_live(env->cfg, &next);
	if (!env->cfg->max_memory)
		env->cfg->max_memory = half_the_ram();
	log_max_level = env->cfg->log_level;
	o->textfile_next_ms = now_ms(); /* a new path or interval takes effect now */
	o->m.reloads_ok++;
	notify_ready(&o->notify);
}

void ops_reload(struct ops_env *env)
{
	struct reload_report rep = {0};

	if (!env->ops)
		return;
	log_notice("reload: SIGHUP");
	ops_reload_report(env, &rep);
	sbuf_free(&rep.applied);
	sbuf_free(&rep.restart);
}

/* -------------------------------------------------------- lifecycle --- */

int ops_listen_fd(const char *path)
{
	return notify_listen_fd(path);
}

static int find_group(const char *name, gid_t *ret, char *why, size_t len)
{
	struct group gr, *res = NULL;
	char buf[4096];
	int r;

	if (!name[0]) {
		*ret = getegid();
		return 0;
	}
	r = getgrnam_r(name, &gr, buf, sizeof(buf), &res);
	if (r || !res) {
		snprintf(why, len, "group %s: %s", name, r ? strerror(r) : "no such group");
		return r ? -r : -ENOENT;
	}
	*ret = res->gr_gid;
	return 0;
}

int ops_open(struct ops_env *env, const struct daemon_config *configured, char *why, size_t len)
{
	struct ops *o = calloc(1, sizeof(*o));
	struct timespec ts;
	int r;

	if (!o) {
		snprintf(why, len, "out of memory");
		return -ENOMEM;
	}
	env->ops = o;
	o->env = env;
	o->configured = *configured;
	o->start_ms = now_ms();
	clock_gettime(CLOCK_REALTIME, &ts);
	o->start_wall = (double)ts.tv_sec + ts.tv_nsec / 1e9;
	o->activated = env->listen_fd >= 0;
	o->textfile_next_ms = o->start_ms;
	o->textfile_lock = -1;
	metrics_init(&o->m);
	notify_init(&o->notify);
	r = find_group(env->cfg->group, &o->group, why, len);
	if (r < 0)
		return r;
	r = spool_new(&o->spool);
	if (r < 0) {
		snprintf(why, len, "file writer thread: %s", strerror(-r));
		return r;
	}
	return ctl_open(env, why, len);
}

void ops_ready(struct ops_env *env)
{
	if (env->ops)
		notify_ready(&env->ops->notify);
}

void ops_stopping(struct ops_env *env)
{
	if (!env->ops)
		return;
	notify_stopping(&env->ops->notify);
	update_status(env, now_ms());
}

void ops_close(struct ops_env *env)
{
	struct ops *o = env->ops;

	if (!o)
		return;
	if (o->trace) {
		uint64_t n = trace_stop(env);
		log_notice("trace: stopped at exit, %" PRIu64 " events written", n);
	}
	ctl_close(env);
	spool_free(o->spool, 1000);
	lockfile_release(o->textfile_held, o->textfile_lock); /* after its last write */
	while (o->jobs) {
		struct jobops *jo = o->jobs;
		o->jobs = jo->next;
		/* its job may be gone already: only a live one is told */
		for (struct job *j = env->core->jobs; j; j = j->next)
			if (j->ops == jo)
				j->ops = NULL;
		jobops_free(jo);
	}
	free(o);
	env->ops = NULL;
}

const struct core_hooks ops_hooks = {
	.exec_done = ops_exec_done,
	.bucket_ready = ops_bucket_ready,
	.bucket_queued = ops_bucket_queued,
	.job_free = ops_job_free,
	.error_sent = ops_error_sent,
	.checkpoint_done = ops_checkpoint_done,
};
