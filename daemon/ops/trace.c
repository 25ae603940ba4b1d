/*
 * trace.c — the timeline: a Chrome trace (JSON "traceEvents", opens in
 * Perfetto and chrome://tracing) of each job's buckets, switched on and off
 * at run time by `zeroctl trace`. Owns the open file and the events not yet
 * handed to the spool thread.
 *
 * Layout: one process per job ("job ID (uid U)"), one thread per rank. On a
 * rank's track: `ready` (an instant: it handed over the bucket), `wait` (from
 * its ready to the bucket being complete on every local rank), `reduce`
 * (queued on the executor to BucketDone), and per iteration `update` (the
 * last BucketDone to StepDone: the steps and broadcasts still running) and
 * `done` (StepDone). Times are microseconds since the trace started.
 *
 * When off, every hook returns at a NULL test; when on, events are formatted
 * into a buffer on the loop thread and written by the spool thread in chunks.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ops/ops_int.h"
#include "base/spool.h"

#define FLUSH_BYTES (256u << 10)

struct trace {
	int fd;
	int64_t t0_us;
	uint64_t events;
	bool first; /* no event written yet: no comma before the next */
	struct sbuf buf;
	char file[];
};

static void event_begin(struct trace *t)
{
	sbuf_put(&t->buf, t->first ? "\n" : ",\n", t->first ? 1 : 2);
	t->first = false;
	t->events++;
}

void trace_flush(struct ops_env *env)
{
	struct trace *t = env->ops->trace;
	size_t len;
	char *s;

	if (!t || !t->buf.len)
		return;
	s = sbuf_take(&t->buf, &len);
	spool_append(env->ops->spool, t->fd, s, len);
}

static void maybe_flush(struct ops_env *env)
{
	if (env->ops->trace->buf.len >= FLUSH_BYTES)
		trace_flush(env);
}

int trace_start(struct ops_env *env, const char *path, struct stat *ret_st, char *why, size_t len)
{
	struct trace *t;
	int fd, r;

	if (env->ops->trace) {
		snprintf(why, len, "a trace is already being written to %s", env->ops->trace->file);
		return -EBUSY;
	}
	if (path[0] != '/') {
		snprintf(why, len, "%s: the trace file needs an absolute path", path);
		return -EINVAL;
	}
	/* opening a local file is quick; the writes are the spool's */
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0640);
	if (fd < 0) {
		r = -errno;
		snprintf(why, len, "%s: %s", path, strerror(-r));
		return r;
	}
	t = calloc(1, sizeof(*t) + strlen(path) + 1);
	if (!t || fstat(fd, ret_st) < 0) {
		r = t ? -errno : -ENOMEM;
		free(t);
		close(fd);
		snprintf(why, len, "%s: %s", path, strerror(-r));
		return r;
	}
	t->fd = fd;
	t->t0_us = ops_now_us();
	t->first = true;
	strcpy(t->file, path);
	sbuf_printf(&t->buf,
		    "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"generator\":\"zerod %s\"},"
		    "\"traceEvents\":[",
		    ZEROD_VERSION_STRING);
	env->ops->trace = t;
	/* every job is named again in this file */
	for (struct jobops *jo = env->ops->jobs; jo; jo = jo->next)
		jo->trace_named = false;
	return 0;
}

uint64_t trace_stop(struct ops_env *env)
{
	struct trace *t = env->ops->trace;
	uint64_t n;

	if (!t)
		return 0;
	sbuf_printf(&t->buf, "\n]}\n");
	trace_flush(env);
	spool_close(env->ops->spool, t->fd);
	n = t->events;
	sbuf_free(&t->buf);
	free(t);
	env->ops->trace = NULL;
	for (struct jobops *jo = env->ops->jobs; jo; jo = jo->next) {
		free(jo->ready_us);
		jo->ready_us = NULL;
	}
	return n;
}

const char *trace_file(const struct ops_env *env)
{
	return env->ops->trace ? env->ops->trace->file : NULL;
}

/* The job's process and its ranks' threads get names once per file. */
static void name_job(struct trace *t, struct jobops *jo)
{
	struct job *j = jo->job;

	if (jo->trace_named)
		return;
	jo->trace_named = true;
	event_begin(t);
	sbuf_printf(&t->buf, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%u,\"tid\":0,"
			     "\"args\":{\"name\":\"job ",
		    jo->serial);
	sbuf_json_str(&t->buf, j->id);
	sbuf_printf(&t->buf, " (uid %u)\"}}", (unsigned)j->uid);
	for (uint32_t r = 0; r < j->world && r < 4096; r++) {
		event_begin(t);
		sbuf_printf(&t->buf, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%u,\"tid\":%u,"
				     "\"args\":{\"name\":\"rank %u\"}}",
			    jo->serial, r, r);
	}
}

static void span(struct trace *t, struct jobops *jo, const char *name, uint32_t rank,
		 int64_t from_us, int64_t to_us, uint64_t it, int64_t b)
{
	event_begin(t);
	if (from_us < t->t0_us)
		from_us = t->t0_us;
	sbuf_printf(&t->buf,
		    "{\"name\":\"%s\",\"cat\":\"bucket\",\"ph\":\"X\",\"pid\":%u,\"tid\":%u,"
		    "\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"iteration\":%" PRIu64,
		    name, jo->serial, rank, (double)(from_us - t->t0_us),
		    (double)(to_us > from_us ? to_us - from_us : 0), it);
	if (b >= 0)
		sbuf_printf(&t->buf, ",\"bucket\":%" PRId64, b);
	sbuf_put(&t->buf, "}}", 2);
}

static void instant(struct trace *t, struct jobops *jo, const char *name, uint32_t rank,
		    int64_t at_us, uint64_t it, int64_t b)
{
	event_begin(t);
	sbuf_printf(&t->buf,
		    "{\"name\":\"%s\",\"cat\":\"bucket\",\"ph\":\"i\",\"s\":\"t\",\"pid\":%u,"
		    "\"tid\":%u,\"ts\":%.3f,\"args\":{\"iteration\":%" PRIu64,
		    name, jo->serial, rank, (double)(at_us - t->t0_us), it);
	if (b >= 0)
		sbuf_printf(&t->buf, ",\"bucket\":%" PRId64, b);
	sbuf_put(&t->buf, "}}", 2);
}

/* Local ranks: every rank until jobs span nodes. */
static bool local_rank(const struct job *j, uint32_t r)
{
	return !j->node_of || j->node_of[r] == j->topo.node;
}

void trace_ready(struct ops_env *env, struct jobops *jo, uint32_t rank, uint64_t t, uint32_t b,
		 int64_t us)
{
	struct trace *tr = env->ops->trace;
	struct job *j = jo->job;

	name_job(tr, jo);
	instant(tr, jo, "ready", rank, us, t, b);
	if (!jo->ready_us && jo->nb && j->world)
		jo->ready_us = calloc((size_t)j->world * jo->nb, sizeof(*jo->ready_us));
	if (jo->ready_us && b < jo->nb && rank < jo->world)
		jo->ready_us[(size_t)rank * jo->nb + b] = us;
	maybe_flush(env);
}

void trace_reduced(struct ops_env *env, struct jobops *jo, uint64_t t, uint32_t b,
		   int64_t queued_us, int64_t us)
{
	struct trace *tr = env->ops->trace;
	struct job *j = jo->job;

	name_job(tr, jo);
	for (uint32_t r = 0; r < j->world; r++) {
		int64_t ready = jo->ready_us && b < jo->nb && r < jo->world
					? jo->ready_us[(size_t)r * jo->nb + b]
					: 0;
		if (!local_rank(j, r))
			continue;
		if (ready && queued_us)
			span(tr, jo, "wait", r, ready, queued_us, t, b);
		if (queued_us)
			span(tr, jo, "reduce", r, queued_us, us, t, b);
		else
			instant(tr, jo, "reduced", r, us, t, b);
	}
	maybe_flush(env);
}

void trace_step(struct ops_env *env, struct jobops *jo, uint64_t t, int64_t since_us, int64_t us)
{
	struct trace *tr = env->ops->trace;
	struct job *j = jo->job;

	name_job(tr, jo);
	for (uint32_t r = 0; r < j->world; r++) {
		if (!local_rank(j, r))
			continue;
		if (since_us)
			span(tr, jo, "update", r, since_us, us, t, -1);
		instant(tr, jo, "done", r, us, t, -1);
	}
	maybe_flush(env);
}

void trace_ops(struct ops_env *env, struct jobops *jo, const struct exec_span *sp, size_t n)
{
	struct trace *tr = env->ops->trace;
	struct job *j = jo->job;

	name_job(tr, jo);
	for (size_t k = 0; k < n; k++) {
		/* one bucket names it; STEP/BCAST of all buckets (at_end) none */
		int64_t b = sp[k].lo == sp[k].hi ? (int64_t)sp[k].lo : -1;
		for (uint32_t r = 0; r < j->world; r++)
			if (local_rank(j, r))
				span(tr, jo, zop_name(sp[k].kind), r, sp[k].start_us, sp[k].end_us,
				     sp[k].iteration, b);
	}
	maybe_flush(env);
}
