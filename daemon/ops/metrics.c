/*
 * metrics.c — zerod's metrics in the Prometheus text exposition format
 * (0.0.4): names start with zerod_, values are in base units (seconds,
 * bytes), counters end in _total. Owns the histograms and the counts by
 * error code; everything else is read from the daemon's state when rendered,
 * so nothing is counted twice and a scrape costs only the rendering.
 *
 * Series carry no job label: job ids belong to their users (zeroctl's read
 * verbs show a member only their own jobs), and jobs come and go.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "coll/netstats.h"
#include "common.h"
#include "base/log.h"
#include "mem/mem.h"
#include "ops/ops_int.h"
#include "base/spool.h"
#include "zeroclient.h"

static const double iteration_le[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
				      0.5,   1,      2.5,   5,    10,    30,   60,  120};
static const double handoff_le[] = {1e-5,   2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3,
				    5e-3,   0.01,   0.025, 0.05, 0.1,   0.25, 1,    5};

void metrics_init(struct metrics *m)
{
	*m = (struct metrics){0};
	m->iteration = (struct hist){.le = iteration_le, .n = ARRAY_SIZE(iteration_le)};
	m->step = (struct hist){.le = iteration_le, .n = ARRAY_SIZE(iteration_le)};
	m->handoff = (struct hist){.le = handoff_le, .n = ARRAY_SIZE(handoff_le)};
}

void hist_observe(struct hist *h, double v)
{
	unsigned i = 0;

	while (i < h->n && v > h->le[i])
		i++;
	if (i < h->n)
		h->bucket[i]++;
	h->count++;
	h->sum += v;
}

void metrics_count(struct code_count *t, int code)
{
	for (unsigned i = 0; i < ERR_SLOTS; i++) {
		if (t[i].n && t[i].code == code) {
			t[i].n++;
			return;
		}
		if (!t[i].n) {
			t[i] = (struct code_count){.code = code, .n = 1};
			return;
		}
	}
	/* more distinct codes than slots: the last slot takes the rest */
	t[ERR_SLOTS - 1].n++;
}

static void head(struct sbuf *b, const char *name, const char *type, const char *help)
{
	sbuf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void one(struct sbuf *b, const char *name, const char *type, const char *help, double v)
{
	head(b, name, type, help);
	sbuf_printf(b, "%s %.17g\n", name, v);
}

static void hist(struct sbuf *b, const char *name, const char *help, const struct hist *h)
{
	uint64_t cum = 0;

	head(b, name, "histogram", help);
	for (unsigned i = 0; i < h->n; i++) {
		cum += h->bucket[i];
		sbuf_printf(b, "%s_bucket{le=\"%g\"} %" PRIu64 "\n", name, h->le[i], cum);
	}
	sbuf_printf(b, "%s_bucket{le=\"+Inf\"} %" PRIu64 "\n", name, h->count);
	sbuf_printf(b, "%s_sum %.17g\n%s_count %" PRIu64 "\n", name, h->sum, name, h->count);
}

static void by_code(struct sbuf *b, const char *name, const char *help, const struct code_count *t)
{
	head(b, name, "counter", help);
	for (unsigned i = 0; i < ERR_SLOTS && t[i].n; i++)
		sbuf_printf(b, "%s{code=\"%s\"} %" PRIu64 "\n", name, zc_strerror_name(t[i].code),
			    t[i].n);
}

static uint64_t resident_bytes(void)
{
	unsigned long size = 0, rss = 0;
	FILE *f = fopen("/proc/self/statm", "re");

	if (!f)
		return 0;
	if (fscanf(f, "%lu %lu", &size, &rss) != 2)
		rss = 0;
	fclose(f);
	return (uint64_t)rss * (uint64_t)sysconf(_SC_PAGE_SIZE);
}

/* What metrics_render counts over the jobs. */
struct job_tally {
	struct exec_stats total; /* the ended jobs' and the running executors' */
	unsigned states[JOB_DRAINING + 1], queued, stalled, ended;
	uint64_t mapped;
};

static void tally_jobs(struct ops_env *env, struct job_tally *tl)
{
	int64_t now = now_ms();

	*tl = (struct job_tally){.total = env->ops->ended};
	for (struct job *j = env->core->jobs; j; j = j->next) {
		struct exec_stats es;
		if (j->state == JOB_FAILED && j->quiet_end)
			tl->ended++; /* a clean end, its last ranks still leaving */
		else
			tl->states[j->state]++;
		if (j->exec && j->exec_running) {
			exec_stats(j->exec, &es);
			tl->total.reduced_elems += es.reduced_elems;
			tl->total.stepped_elems += es.stepped_elems;
			tl->total.bcast_elems += es.bcast_elems;
		}
		for (uint32_t r = 0; r < j->world; r++) {
			const struct plan *p = j->plan ? j->plan : j->plans[r];
			if (p && j->grad_map[r])
				tl->mapped += plan_buffer_bytes(p);
			if (p && j->param_map[r])
				tl->mapped += plan_buffer_bytes(p);
		}
		if (j->state == JOB_ACTIVE && j->in_flight && j->arrived) {
			struct jobops *jo = jobops_of(j);
			uint32_t full = 0;
			for (uint32_t k = 0; k < j->plan->nbuckets; k++)
				full += j->arrived[k] == j->local_size;
			if (jo && jo->iter == j->iter && full >= jo->reduced)
				tl->queued += full - jo->reduced;
		}
		if (ops_job_waiting(j) && env->cfg->stall_warn_ms > 0 &&
		    now - j->progress_ms >= env->cfg->stall_warn_ms)
			tl->stalled++;
	}
}

void metrics_render(struct ops_env *env, struct sbuf *b)
{
	struct ops *o = env->ops;
	struct job_tally tl;
	struct netstats net;

	tally_jobs(env, &tl);
	head(b, "zerod_build_info", "gauge", "zerod's version, trainer protocol and backends");
	sbuf_printf(b, "zerod_build_info{version=\"%s\",protocol=\"%d\",backends=\"%s\"} 1\n",
		    ZEROD_VERSION_STRING, ZC_PROTOCOL_VERSION,
		    env->core->cuda ? "cuda,host" : "host");
	one(b, "zerod_start_time_seconds", "gauge", "when zerod started, unix time",
	    o->start_wall);
	head(b, "zerod_jobs", "gauge", "jobs by state");
	for (unsigned s = 0; s <= JOB_DRAINING; s++)
		sbuf_printf(b, "zerod_jobs{state=\"%s\"} %u\n", job_state_name(s), tl.states[s]);
	sbuf_printf(b, "zerod_jobs{state=\"ended\"} %u\n", tl.ended);
	one(b, "zerod_jobs_stalled", "gauge", "jobs waiting longer than stall-warn", tl.stalled);
	one(b, "zerod_sessions", "gauge", "trainers connected", (*env->nsessions));
	one(b, "zerod_connections", "gauge", "connections to the trainers' socket", (*env->nconns));
	one(b, "zerod_jobs_started_total", "counter", "jobs created",
	    (double)env->core->stats.jobs);
	one(b, "zerod_iterations_total", "counter", "iterations completed (StepDone), all jobs",
	    (double)env->core->stats.iterations);
	one(b, "zerod_buckets_reduced_total", "counter", "buckets reduced (BucketDone)",
	    (double)env->core->stats.buckets);
	one(b, "zerod_reduced_bytes_total", "counter", "gradient bytes reduced",
	    (double)tl.total.reduced_elems * sizeof(float));
	one(b, "zerod_broadcast_bytes_total", "counter",
	    "parameter bytes broadcast or gathered after the step",
	    (double)tl.total.bcast_elems * sizeof(float));
	one(b, "zerod_stepped_parameters_total", "counter", "parameters updated by the optimizer",
	    (double)tl.total.stepped_elems);
	netstats_read(&net);
	one(b, "zerod_net_allreduce_bytes_total", "counter",
	    "bytes all-reduced across nodes (bucket mode; each bucket once)",
	    (double)net.allreduce_bytes);
	one(b, "zerod_net_allreduce_seconds_total", "counter",
	    "time in those all-reduces: exchange, fold and gather, without the local sums",
	    (double)net.allreduce_ns / 1e9);
	one(b, "zerod_net_allreduce_calls_total", "counter", "those all-reduces (network windows)",
	    (double)net.allreduce_calls);
	one(b, "zerod_tls_mesh_bytes_total", "counter",
	    "bytes the TLS mesh sealed and opened (sent and received)", (double)net.tls_bytes);
	one(b, "zerod_tls_mesh_cpu_seconds_total", "counter",
	    "CPU time of the TLS mesh's calls: records and socket calls, not the waits",
	    (double)net.tls_cpu_ns / 1e9);
	hist(b, "zerod_iteration_seconds", "time between two StepDones of a job",
	     &o->m.iteration);
	hist(b, "zerod_step_seconds", "an iteration's first BucketReady to its StepDone",
	     &o->m.step);
	hist(b, "zerod_handoff_seconds",
	     "a bucket ready on every local rank to its BucketDone (queue and reduction)",
	     &o->m.handoff);
	one(b, "zerod_buckets_queued", "gauge",
	    "buckets handed to executors and not yet reduced (queue depth)", tl.queued);
	by_code(b, "zerod_errors_total", "Error replies sent to trainers, by code", o->m.errors);
	by_code(b, "zerod_job_failures_total", "jobs that failed, by code", o->m.failures);
	one(b, "zerod_error_replies_total", "counter", "Error replies sent to trainers",
	    (double)env->core->stats.errors_sent);
	one(b, "zerod_error_replies_dropped_total", "counter",
	    "Error replies over a connection's budget, not sent",
	    (double)env->core->stats.replies_dropped);
	one(b, "zerod_connections_closed_total", "counter",
	    "connections closed over the limit or idle", (double)env->core->stats.conns_shed);
	one(b, "zerod_log_lines_dropped_total", "counter", "log lines dropped (stderr not read)",
	    (double)log_dropped_total());
	one(b, "zerod_file_write_failures_total", "counter",
	    "metrics textfile or trace writes that failed or were dropped",
	    o->spool ? (double)spool_failures(o->spool) : 0);
	head(b, "zerod_checkpoints_total", "counter",
	     "checkpoints the trainers reported written or failed (CheckpointDone), by result");
	sbuf_printf(b, "zerod_checkpoints_total{result=\"done\"} %" PRIu64 "\n"
		       "zerod_checkpoints_total{result=\"failed\"} %" PRIu64 "\n",
		    o->m.checkpoints_done, o->m.checkpoints_failed);
	head(b, "zerod_recoveries_total", "counter",
	     "trainers' deaths a job re-formed after, by result: went on from zerod's memory, "
	     "or failed");
	sbuf_printf(b,
		    "zerod_recoveries_total{result=\"recovered\"} %" PRIu64 "\n"
		    "zerod_recoveries_total{result=\"failed\"} %" PRIu64 "\n",
		    env->core->stats.recoveries, env->core->stats.recoveries_failed);
	head(b, "zerod_reloads_total", "counter", "config reloads, by result");
	sbuf_printf(b, "zerod_reloads_total{result=\"ok\"} %" PRIu64 "\n"
		       "zerod_reloads_total{result=\"refused\"} %" PRIu64 "\n",
		    o->m.reloads_ok, o->m.reloads_failed);
	one(b, "zerod_state_bytes", "gauge", "optimizer state held (moments, masters)",
	    (double)env->core->memory_used);
	one(b, "zerod_state_limit_bytes", "gauge", "max-memory: the optimizer state allowed",
	    (double)env->cfg->max_memory);
	one(b, "zerod_mapped_bytes", "gauge", "trainers' buffers mapped", (double)tl.mapped);
	one(b, "zerod_resident_memory_bytes", "gauge", "zerod's resident memory",
	    (double)resident_bytes());
	one(b, "zerod_tracing", "gauge", "1 while a trace timeline is written", o->trace ? 1 : 0);
}
