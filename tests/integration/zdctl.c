/*
 * zdctl.c — waiting on a zerod's control socket (<socket>.ctl: the Ctl
 * messages of proto/zerod.proto that zeroctl speaks, served by
 * daemon/ops/ctl.c) for the state a test needs next: a job in a state or at an
 * iteration, a rank registered, a rendezvous served. Tests synchronise
 * through these, never by reading the daemon's log: what is logged is only
 * asserted (zd_wait_log), after the state it belongs to was waited for here.
 *
 * Each wait asks again every ZDCTL_POLL_MS until the state is there, the
 * (scaled) timeout passed, or the daemon exited; a wait that fails says in
 * a TAP comment what it saw last.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "common.h"
#include "harness.h"
#include "testlib.h"
#include "zerod.pb-c.h"

#define ZDCTL_POLL_MS  20
#define ZDCTL_SLICE_MS 200 /* how often a wait for an answer looks at the daemon */

typedef Zerod__V1__Ctl Ctl;

struct ctlconn {
	const struct zd *d;
	void *ctx, *sock;
};

static void ctl_close(struct ctlconn *c)
{
	if (c->sock)
		zmq_close(c->sock);
	if (c->ctx)
		zmq_ctx_term(c->ctx);
	c->sock = c->ctx = NULL;
}

static int ctl_open(const struct zd *d, struct ctlconn *c)
{
	char endpoint[sizeof(d->sock) + 16];
	int zero = 0;

	*c = (struct ctlconn){.d = d};
	snprintf(endpoint, sizeof(endpoint), "ipc://%s" ZEROD_CTL_SUFFIX, d->sock);
	c->ctx = zmq_ctx_new();
	c->sock = c->ctx ? zmq_socket(c->ctx, ZMQ_DEALER) : NULL;
	if (!c->sock || zmq_setsockopt(c->sock, ZMQ_LINGER, &zero, sizeof(zero)) < 0 ||
	    zmq_connect(c->sock, endpoint) < 0) {
		int r = -(zmq_errno() ? zmq_errno() : ENOMEM);
		ctl_close(c);
		return r;
	}
	return 0;
}

/* The daemon behind c has exited (a zerod not started by zd_start, pid 0,
 * is taken to be alive). */
static bool ctl_daemon_gone(const struct ctlconn *c)
{
	return c->d->pid > 0 && !proc_alive(c->d->pid);
}

/* Send req and take its answer by deadline: 0 and *ret (free with
 * zerod__v1__ctl__free_unpacked), -ETIMEDOUT, -ECHILD (the daemon exited),
 * -EPROTO (an answer that is not a Ctl), or another -errno. One request is
 * in flight at a time, so the answer is req's. */
static int ctl_call(struct ctlconn *c, const Ctl *req, int64_t deadline, Ctl **ret)
{
	size_t n = zerod__v1__ctl__get_packed_size(req);
	uint8_t *buf = malloc(n ? n : 1);
	zmq_msg_t msg;
	Ctl *rep;
	int r;

	if (!buf)
		return -ENOMEM;
	zerod__v1__ctl__pack(req, buf);
	r = zmq_send(c->sock, buf, n, 0);
	free(buf);
	if (r < 0)
		return -zmq_errno();
	for (;;) {
		zmq_pollitem_t pi = {.socket = c->sock, .events = ZMQ_POLLIN};
		int64_t left = deadline - test_ms();
		if (left <= 0)
			return -ETIMEDOUT;
		r = zmq_poll(&pi, 1, left < ZDCTL_SLICE_MS ? (long)left : ZDCTL_SLICE_MS);
		if (r < 0 && zmq_errno() != EINTR)
			return -zmq_errno();
		if (r > 0)
			break;
		if (ctl_daemon_gone(c))
			return -ECHILD;
	}
	zmq_msg_init(&msg);
	if (zmq_msg_recv(&msg, c->sock, 0) < 0) {
		r = -zmq_errno();
		zmq_msg_close(&msg);
		return r;
	}
	rep = zerod__v1__ctl__unpack(NULL, zmq_msg_size(&msg), zmq_msg_data(&msg));
	zmq_msg_close(&msg);
	if (!rep)
		return -EPROTO;
	*ret = rep;
	return 0;
}

static unsigned state_bit(const char *name)
{
	static const struct {
		const char *name;
		unsigned bit;
	} states[] = {
		{"forming", ZD_JOB_FORMING},   {"registering", ZD_JOB_REGISTERING},
		{"active", ZD_JOB_ACTIVE},     {"failed", ZD_JOB_FAILED},
		{"draining", ZD_JOB_DRAINING}, {"re-forming", ZD_JOB_REFORMING},
	};

	for (size_t i = 0; i < sizeof(states) / sizeof(states[0]); i++)
		if (strcmp(states[i].name, name) == 0)
			return states[i].bit;
	return 0;
}

static void job_from(const Zerod__V1__CtlJob *j, struct zd_job *out)
{
	*out = (struct zd_job){
		.state = state_bit(j->state),
		.world = j->world,
		.local_ranks = j->local_ranks,
		.nodes = j->nodes,
		.connected = j->connected,
		.iteration = j->iteration,
		.rendezvous_serving = j->has_rendezvous_serving && j->rendezvous_serving,
		.stalled = j->stalled,
	};
	snprintf(out->state_name, sizeof(out->state_name), "%s", j->state);
	if (j->error)
		snprintf(out->error, sizeof(out->error), "%s", j->error);
}

/* One status request: the job (state ZD_JOB_GONE if there is none by that
 * id) and, in *ret_serving when not NULL, whether any rendezvous is served. */
static int status_once(struct ctlconn *c, const char *job, int64_t deadline, struct zd_job *ret,
		       bool *ret_serving)
{
	Ctl req = ZEROD__V1__CTL__INIT, *rep = NULL;
	Zerod__V1__StatusRequest q = ZEROD__V1__STATUS_REQUEST__INIT;
	int r;

	req.version = ZEROD_CTL_VERSION;
	req.body_case = ZEROD__V1__CTL__BODY_STATUS_REQUEST;
	req.status_request = &q;
	r = ctl_call(c, &req, deadline, &rep);
	if (r < 0)
		return r;
	if (rep->body_case != ZEROD__V1__CTL__BODY_STATUS) {
		zerod__v1__ctl__free_unpacked(rep, NULL);
		return -EPROTO;
	}
	*ret = (struct zd_job){.state = ZD_JOB_GONE};
	snprintf(ret->state_name, sizeof(ret->state_name), "gone");
	for (size_t i = 0; job && i < rep->status->n_jobs; i++)
		if (strcmp(rep->status->jobs[i]->id, job) == 0)
			job_from(rep->status->jobs[i], ret);
	if (ret_serving)
		*ret_serving = rep->status->n_rendezvous > 0;
	zerod__v1__ctl__free_unpacked(rep, NULL);
	return 0;
}

int zd_job_status(const struct zd *d, const char *job, struct zd_job *ret)
{
	struct ctlconn c;
	int r = ctl_open(d, &c);

	if (r < 0)
		return r;
	r = status_once(&c, job, test_ms() + test_timeout(5000), ret, NULL);
	ctl_close(&c);
	return r;
}

/* What a wait is for; true once it is there. */
struct want {
	const char *job;
	unsigned states;    /* ZD_JOB_ bits; 0: any but ZD_JOB_GONE */
	uint64_t iteration; /* and at least this iteration */
	uint32_t connected; /* and at least this many local ranks connected */
	bool serving;       /* and the job's rendezvous served here (job NULL: any) */
	bool stalled;       /* and the job waits past stall-warn */
	int rank;           /* >= 0: and this rank registered (an inspect) */
	int bucket;         /* >= 0: and this bucket arrived from `arrived` ranks (an inspect) */
	uint32_t arrived;
};

static bool wanted(const struct want *w, const struct zd_job *j, bool any_serving)
{
	unsigned states = w->states ? w->states : ~(unsigned)ZD_JOB_GONE;

	if (!w->job)
		return !w->serving || any_serving;
	return (j->state & states) && j->iteration >= w->iteration &&
	       j->connected >= w->connected && (!w->serving || j->rendezvous_serving) &&
	       (!w->stalled || j->stalled);
}

/* 1: what w asks of an inspect is there (w->rank registered, w->bucket
 * arrived from w->arrived local ranks this iteration); 0: not (yet); or
 * -errno. */
static int inspect_wanted(struct ctlconn *c, const struct want *w, int64_t deadline)
{
	Ctl req = ZEROD__V1__CTL__INIT, *rep = NULL;
	Zerod__V1__InspectRequest q = ZEROD__V1__INSPECT_REQUEST__INIT;
	int r;

	q.job = (char *)w->job;
	req.version = ZEROD_CTL_VERSION;
	req.body_case = ZEROD__V1__CTL__BODY_INSPECT_REQUEST;
	req.inspect_request = &q;
	r = ctl_call(c, &req, deadline, &rep);
	if (r < 0)
		return r;
	r = 0;
	if (rep->body_case == ZEROD__V1__CTL__BODY_INSPECT) {
		bool rank_ok = w->rank < 0, bucket_ok = w->bucket < 0;
		for (size_t i = 0; i < rep->inspect->n_ranks; i++)
			if (rep->inspect->ranks[i]->rank == (uint32_t)w->rank)
				rank_ok = rep->inspect->ranks[i]->registered;
		for (size_t i = 0; i < rep->inspect->n_buckets; i++)
			if (rep->inspect->buckets[i]->index == (uint32_t)w->bucket)
				bucket_ok = rep->inspect->buckets[i]->arrived >= w->arrived;
		r = rank_ok && bucket_ok;
	} else if (rep->body_case != ZEROD__V1__CTL__BODY_ERROR ||
		   rep->error->kind != ZEROD__V1__CTL_ERROR__KIND__NOT_FOUND) {
		r = -EPROTO; /* (no such job yet: not registered yet) */
	}
	zerod__v1__ctl__free_unpacked(rep, NULL);
	return r;
}

static int wait_for(const struct zd *d, const struct want *w, const char *what, int timeout_ms)
{
	int64_t start = test_ms(), deadline = start + test_timeout(timeout_ms);
	struct zd_job j = {.state = ZD_JOB_GONE, .state_name = "(no answer)"};
	struct ctlconn c;
	bool serving = false;
	int r = ctl_open(d, &c);

	while (r == 0) {
		r = status_once(&c, w->job, deadline, &j, &serving);
		if (r == 0 && wanted(w, &j, serving)) {
			if (w->rank < 0 && w->bucket < 0)
				break;
			r = inspect_wanted(&c, w, deadline);
			if (r > 0) {
				r = 0;
				break;
			}
		}
		if (r < 0)
			break;
		if (test_ms() + ZDCTL_POLL_MS >= deadline) {
			r = -ETIMEDOUT;
			break;
		}
		usleep(ZDCTL_POLL_MS * 1000);
	}
	ctl_close(&c);
	if (r < 0)
		printf("# zerod %s: no %s within %lld ms (%s); last seen: job %s %s, iteration "
		       "%llu%s%s%s\n",
		       d->sock, what, (long long)(test_ms() - start),
		       r == -ECHILD ? "zerod exited" : strerror(-r), w->job ? w->job : "-",
		       j.state_name, (unsigned long long)j.iteration,
		       j.error[0] ? ", error \"" : "", j.error, j.error[0] ? "\"" : "");
	fflush(stdout);
	return r;
}

int zd_wait_job(const struct zd *d, const char *job, unsigned states, int timeout_ms)
{
	static const char *const names[] = {"gone",   "forming",  "registering", "active",
					    "failed", "draining", "re-forming"};
	const struct want w = {.job = job, .states = states, .rank = -1, .bucket = -1};
	char what[160];
	int at = snprintf(what, sizeof(what), "job %s", job);

	for (unsigned b = 0; b < sizeof(names) / sizeof(names[0]); b++)
		if (states & (1u << b))
			at += snprintf(what + at, sizeof(what) - (size_t)at, "%s%s",
				       at > (int)strlen(job) + 4 ? " or " : " ", names[b]);
	return wait_for(d, &w, what, timeout_ms);
}

int zd_wait_iteration(const struct zd *d, const char *job, uint64_t iteration, int timeout_ms)
{
	const struct want w = {.job = job,
			       .states = ZD_JOB_ACTIVE,
			       .iteration = iteration,
			       .rank = -1,
			       .bucket = -1};
	char what[128];

	snprintf(what, sizeof(what), "job %s active at iteration %llu", job,
		 (unsigned long long)iteration);
	return wait_for(d, &w, what, timeout_ms);
}

int zd_wait_registered(const struct zd *d, const char *job, uint32_t rank, int timeout_ms)
{
	const struct want w = {.job = job, .rank = (int)rank, .bucket = -1};
	char what[128];

	snprintf(what, sizeof(what), "job %s with rank %u registered", job, rank);
	return wait_for(d, &w, what, timeout_ms);
}

int zd_wait_serving(const struct zd *d, const char *job, int timeout_ms)
{
	const struct want w = {.job = job, .serving = true, .rank = -1, .bucket = -1};
	char what[128];

	snprintf(what, sizeof(what), "rendezvous served%s%s", job ? " for job " : "",
		 job ? job : "");
	return wait_for(d, &w, what, timeout_ms);
}

int zd_wait_connected(const struct zd *d, const char *job, uint32_t ranks, int timeout_ms)
{
	const struct want w = {.job = job, .connected = ranks, .rank = -1, .bucket = -1};
	char what[128];

	snprintf(what, sizeof(what), "job %s with %u ranks connected", job, ranks);
	return wait_for(d, &w, what, timeout_ms);
}

int zd_wait_ctl(const struct zd *d, int timeout_ms)
{
	const struct want w = {.rank = -1, .bucket = -1};

	return wait_for(d, &w, "answer on the control socket", timeout_ms);
}

/* The value of metric `name` (no labels) in Prometheus text, or 0. */
static unsigned long long metric(const char *text, const char *name)
{
	size_t n = strlen(name);

	for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
		if (strncmp(p, name, n) == 0 && p[n] == ' ')
			return (unsigned long long)strtod(p + n + 1, NULL);
	return 0;
}

int zd_ctl_levels(const struct zd *d, struct zd_status *ret)
{
	int64_t deadline = test_ms() + test_timeout(5000);
	Ctl req = ZEROD__V1__CTL__INIT, *st = NULL, *m = NULL;
	Zerod__V1__StatusRequest sq = ZEROD__V1__STATUS_REQUEST__INIT;
	Zerod__V1__MetricsRequest mq = ZEROD__V1__METRICS_REQUEST__INIT;
	struct ctlconn c;
	int r = ctl_open(d, &c);

	if (r < 0)
		return r;
	req.version = ZEROD_CTL_VERSION;
	req.body_case = ZEROD__V1__CTL__BODY_STATUS_REQUEST;
	req.status_request = &sq;
	r = ctl_call(&c, &req, deadline, &st);
	if (r == 0) {
		req.body_case = ZEROD__V1__CTL__BODY_METRICS_REQUEST;
		req.metrics_request = &mq;
		r = ctl_call(&c, &req, deadline, &m);
	}
	if (r == 0 && (st->body_case != ZEROD__V1__CTL__BODY_STATUS ||
		       m->body_case != ZEROD__V1__CTL__BODY_METRICS))
		r = -EPROTO;
	if (r == 0)
		*ret = (struct zd_status){
			.jobs = (unsigned)st->status->n_jobs,
			.sessions = st->status->sessions,
			.conns = st->status->connections,
			.memory = st->status->state_bytes,
			.replies_dropped =
				metric(m->metrics->text, "zerod_error_replies_dropped_total"),
			.conns_closed = metric(m->metrics->text, "zerod_connections_closed_total"),
			.log_dropped = metric(m->metrics->text, "zerod_log_lines_dropped_total"),
			.recovered = metric(m->metrics->text,
					    "zerod_recoveries_total{result=\"recovered\"}"),
			.recovery_failed = metric(m->metrics->text,
						  "zerod_recoveries_total{result=\"failed\"}"),
		};
	if (st)
		zerod__v1__ctl__free_unpacked(st, NULL);
	if (m)
		zerod__v1__ctl__free_unpacked(m, NULL);
	ctl_close(&c);
	return r;
}

int zd_wait_arrived(const struct zd *d, const char *job, uint32_t bucket, uint32_t ranks,
		    int timeout_ms)
{
	const struct want w = {.job = job,
			       .states = ZD_JOB_ACTIVE,
			       .rank = -1,
			       .bucket = (int)bucket,
			       .arrived = ranks};
	char what[128];

	snprintf(what, sizeof(what), "job %s with bucket %u from %u ranks", job, bucket, ranks);
	return wait_for(d, &w, what, timeout_ms);
}

int zd_wait_stalled(const struct zd *d, const char *job, int timeout_ms)
{
	const struct want w = {.job = job, .stalled = true, .rank = -1, .bucket = -1};
	char what[128];

	snprintf(what, sizeof(what), "job %s stalled (waiting past stall-warn)", job);
	return wait_for(d, &w, what, timeout_ms);
}
