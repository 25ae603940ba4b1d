/*
 * ctl.c — the control socket: a ZeroMQ ROUTER on <socket>.ctl, beside the
 * trainers' socket and apart from it, served from the loop. Owns that
 * socket and its file. One Ctl request in, one Ctl reply out; the verbs are
 * a table (body case -> handler, who may call it).
 *
 * Who may call (SO_PEERCRED, SO_PEERGROUPS of the request's connection; the
 * socket file is mode 0660, so the kernel already keeps others out):
 *   - root and zerod's own user: every verb, every user's jobs;
 *   - members of the group (config key `group`, default zerod's own group):
 *     status, inspect, metrics and checkpoint, and only their own jobs in
 *     status, inspect and checkpoint (jobs are per uid, as on the trainers'
 *     socket);
 *   - anyone else: DENIED. Trainers are members, so they cannot reload the
 *     config or start a trace.
 * Requests are small (ZEROD_CTL_REQUEST_BYTES) and a batch per loop turn is
 * bounded, so zeroctl in a loop cannot starve the trainers.
 *
 * checkpoint with no DIR: the default (checkpoint-dir/JOB) is checked
 * first against the job's trainers' credentials (they write as themselves)
 * and refused when they could not write it (docs/CHECKPOINT.md).
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <zmq.h>

#include "common.h"
#include "base/config.h"
#include "base/log.h"
#include "base/loop.h"
#include "ops/ops_int.h"
#include "base/pool.h"
#include "core/rdzv.h"
#include "exec/backend.h"
#include "core/resume.h"
#include "zeroclient.h"

#define CTL_BATCH 32

enum role { ROLE_NONE, ROLE_MEMBER, ROLE_ADMIN };

struct caller {
	struct ucred cred;
	enum role role;
};

typedef Zerod__V1__Ctl Ctl;

/* a route ZeroMQ gives a peer is 5 bytes; one longer is no zeroctl (as the
 * trainers' ROUTER, edge-t.h's ZEROD_ROUTE_MAX) */
#define CTL_ROUTE_MAX 256

static void send_reply(struct ops_env *env, const void *route, size_t rlen, Ctl *reply)
{
	size_t n;
	void *buf;

	reply->version = ZEROD_CTL_VERSION;
	n = zerod__v1__ctl__get_packed_size(reply);
	buf = malloc(n ? n : 1);
	if (!buf)
		return; /* zeroctl times out and says so */
	zerod__v1__ctl__pack(reply, buf);
	/* a caller gone before its answer: nothing to do (ROUTER_MANDATORY) */
	if (zmq_send(env->ops->ctl, route, rlen, ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0)
		zmq_send(env->ops->ctl, buf, n, ZMQ_DONTWAIT);
	free(buf);
}

static void send_error(struct ops_env *env, const void *route, size_t rlen,
		       Zerod__V1__CtlError__Kind kind, const char *fmt, ...)
	__attribute__((format(printf, 5, 6)));
static void send_error(struct ops_env *env, const void *route, size_t rlen,
		       Zerod__V1__CtlError__Kind kind, const char *fmt, ...)
{
	Ctl reply = ZEROD__V1__CTL__INIT;
	Zerod__V1__CtlError e = ZEROD__V1__CTL_ERROR__INIT;
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	e.kind = kind;
	e.message = msg;
	reply.body_case = ZEROD__V1__CTL__BODY_ERROR;
	reply.error = &e;
	send_reply(env, route, rlen, &reply);
}

/* May caller c see job j? */
static bool visible(const struct caller *c, const struct job *j)
{
	return c->role == ROLE_ADMIN || j->uid == c->cred.uid;
}

/* The job's last checkpoint into *ck (pointing into jo), or NULL: none. */
static Zerod__V1__CtlCheckpoint *fill_ckpt(const struct jobops *jo, Zerod__V1__CtlCheckpoint *ck,
					   int64_t now)
{
	const struct ckpt_seen *k = jo ? &jo->ckpt : NULL;

	if (!k || k->state == CKPT_SEEN_NONE)
		return NULL;
	*ck = (Zerod__V1__CtlCheckpoint)ZEROD__V1__CTL_CHECKPOINT__INIT;
	ck->state = (char *)ckpt_seen_name(k->state);
	ck->iteration = k->iteration;
	ck->dir = k->dir ? k->dir : (char *)"?";
	ck->path = k->path;
	ck->error = k->error;
	ck->has_rank = k->state != CKPT_SEEN_ASKED;
	ck->rank = k->rank;
	ck->age_ms = now > k->at_ms ? (uint64_t)(now - k->at_ms) : 0;
	return ck;
}

/* Fill one CtlJob; the strings point into bufs (2 x 256 bytes), its
 * checkpoint into ck. */
static void fill_job(struct job *j, Zerod__V1__CtlJob *out, char *err, char *who,
		     Zerod__V1__CtlCheckpoint *ck, int64_t now)
{
	struct jobops *jo = jobops_of(j);
	bool serving = false;

	*out = (Zerod__V1__CtlJob)ZEROD__V1__CTL_JOB__INIT;
	out->id = j->id;
	out->uid = (uint32_t)j->uid;
	out->state = (char *)ops_job_state_name(j);
	out->world = j->world;
	out->local_ranks = j->local_size;
	out->nodes = j->topo.nnodes ? j->topo.nnodes : 1;
	out->connected = j->nconnected;
	out->iteration = j->iter;
	out->step_rate = jo ? jobops_rate(jo, now) : 0;
	out->age_ms = jo ? (uint64_t)(ops_now_us() - jo->seen_us) / 1000 : 0;
	out->idle_ms = now > j->progress_ms ? (uint64_t)(now - j->progress_ms) : 0;
	out->waiting = ops_job_waiting(j);
	out->stalled = out->waiting && ops_env_of(j)->cfg->stall_warn_ms > 0 &&
		       now - j->progress_ms >= ops_env_of(j)->cfg->stall_warn_ms;
	if (job_ended(j) && !j->quiet_end) {
		snprintf(err, 256, "%s: %.200s", zc_strerror_name(j->err), j->errmsg);
		out->error = err;
	}
	if (out->waiting) {
		ops_describe_wait(j, who, 256);
		out->waiting_for = who;
	}
	out->rendezvous = (char *)rdzv_job_endpoint(j, &serving);
	out->has_rendezvous_serving = out->rendezvous != NULL;
	out->rendezvous_serving = out->has_rendezvous_serving && serving;
	out->checkpoint = fill_ckpt(jo, ck, now);
}

static void do_status(struct ops_env *env, const struct caller *c, const void *route, size_t rlen,
		      const Ctl *req)
{
	struct ops *o = env->ops;
	Ctl reply = ZEROD__V1__CTL__INIT;
	Zerod__V1__StatusReply st = ZEROD__V1__STATUS_REPLY__INIT;
	Zerod__V1__CtlJob *jobs = NULL, **jp = NULL;
	Zerod__V1__CtlCheckpoint *cks = NULL;
	char (*text)[2][256] = NULL, *devices[] = {"cpu"};
	const char *serving[64];
	size_t n = 0;
	int64_t now = now_ms();

	(void)req;
	if (env->core->njobs) {
		jobs = calloc(env->core->njobs, sizeof(*jobs));
		jp = calloc(env->core->njobs, sizeof(*jp));
		text = calloc(env->core->njobs, sizeof(*text));
		cks = calloc(env->core->njobs, sizeof(*cks));
		if (!jobs || !jp || !text || !cks) {
			send_error(env, route, rlen, ZEROD__V1__CTL_ERROR__KIND__FAILED,
				   "out of memory");
			goto out;
		}
	}
	for (struct job *j = env->core->jobs; j && n < env->core->njobs; j = j->next) {
		if (!visible(c, j))
			continue;
		fill_job(j, &jobs[n], text[n][0], text[n][1], &cks[n], now);
		jp[n] = &jobs[n];
		n++;
	}
	st.version = (char *)ZEROD_VERSION_STRING;
	st.protocol_version = ZC_PROTOCOL_VERSION;
	st.backends = (char *)backend_host.name;
	st.n_devices = 1;
	st.devices = devices;
	st.uptime_seconds = (double)(now - o->start_ms) / 1000.0;
	st.sessions = (*env->nsessions);
	st.connections = (*env->nconns);
	st.state_bytes = env->core->memory_used;
	st.max_state_bytes = env->cfg->max_memory;
	st.workers = pool_threads(env->core->pool);
	st.socket = (char *)env->cfg->socket_path;
	st.tracing = o->trace != NULL;
	st.trace_file = (char *)trace_file(env);
	st.config = (char *)config_src_path(env->cfg->src);
	st.n_jobs = n;
	st.jobs = jp;
	st.n_rendezvous = rdzv_serving(env->core, serving, sizeof(serving) / sizeof(serving[0]));
	st.rendezvous = (char **)serving;
	reply.body_case = ZEROD__V1__CTL__BODY_STATUS;
	reply.status = &st;
	send_reply(env, route, rlen, &reply);
out:
	free(jobs);
	free(jp);
	free(text);
	free(cks);
}

/* The one job req names that c may see; else an error went out and NULL. */
static struct job *find_job(struct ops_env *env, const struct caller *c, const void *route,
			    size_t rlen, const Zerod__V1__InspectRequest *q)
{
	struct job *found = NULL;
	unsigned matches = 0;

	for (struct job *j = env->core->jobs; j; j = j->next) {
		if (strcmp(j->id, q->job) != 0 || !visible(c, j))
			continue;
		if (q->has_uid && j->uid != q->uid)
			continue;
		matches++;
		found = j;
	}
	if (matches == 1)
		return found;
	if (matches == 0)
		send_error(env, route, rlen, ZEROD__V1__CTL_ERROR__KIND__NOT_FOUND,
			   "no job %s%s", q->job,
			   c->role == ROLE_ADMIN ? "" : " of yours (you see only your own jobs)");
	else
		send_error(env, route, rlen, ZEROD__V1__CTL_ERROR__KIND__BAD_REQUEST,
			   "%u users have a job %s: name one with --uid", matches, q->job);
	return NULL;
}

/* What do_inspect allocates for its reply, freed once it went out. */
struct inspect_bufs {
	Zerod__V1__CtlBucket *bk, **bkp;
	Zerod__V1__CtlUnit *un, **unp;
	Zerod__V1__CtlRank *rk, **rkp;
	Zerod__V1__CtlOp *op, **opp;
};

/* Plan p's buckets q asks for, and who owns which range (once the job has
 * its shard). 0 or -ENOMEM. */
static int inspect_buckets(const struct job *j, const struct plan *p,
			   const Zerod__V1__InspectRequest *q, Zerod__V1__InspectReply *in,
			   struct inspect_bufs *ib)
{
	uint32_t nunits = j->shard ? j->shard->nunits : 0;
	Zerod__V1__CtlUnit *un, **unp;
	size_t nb = 0, nu = 0;

	ib->bk = calloc(p->nbuckets, sizeof(*ib->bk));
	ib->bkp = calloc(p->nbuckets, sizeof(*ib->bkp));
	un = ib->un = calloc(nunits + 1, sizeof(*un));
	unp = ib->unp = calloc(nunits + 1, sizeof(*unp));
	if (!ib->bk || !ib->bkp || !un || !unp)
		return -ENOMEM;
	for (uint32_t b = 0; b < p->nbuckets; b++) {
		Zerod__V1__CtlBucket *x = &ib->bk[nb];
		if (q->bucket >= 0 && (uint32_t)q->bucket != b)
			continue;
		*x = (Zerod__V1__CtlBucket)ZEROD__V1__CTL_BUCKET__INIT;
		x->index = b;
		x->numel = p->buckets[b].numel;
		x->segments = p->buckets[b].nsegments;
		x->arrived = j->arrived ? j->arrived[b] : 0;
		x->units = &unp[nu];
		for (uint32_t u = j->shard ? j->shard->bucket_first[b] : 0;
		     j->shard && u < j->shard->bucket_first[b + 1]; u++) {
			const struct shard_unit *su = &j->shard->units[u];
			if (q->rank >= 0 && (uint32_t)q->rank != su->owner)
				continue;
			un[nu] = (Zerod__V1__CtlUnit)ZEROD__V1__CTL_UNIT__INIT;
			un[nu].bucket = su->bucket;
			un[nu].owner = su->owner;
			un[nu].offset = su->offset;
			un[nu].numel = su->numel;
			unp[nu] = &un[nu];
			nu++;
			x->n_units++;
		}
		ib->bkp[nb++] = x;
	}
	in->n_buckets = nb;
	in->buckets = ib->bkp;
	return 0;
}

/* The ranks q asks for. 0 or -ENOMEM. */
static int inspect_ranks(const struct job *j, const Zerod__V1__InspectRequest *q,
			 Zerod__V1__InspectReply *in, struct inspect_bufs *ib)
{
	size_t nr = 0;

	ib->rk = calloc(j->world, sizeof(*ib->rk));
	ib->rkp = calloc(j->world, sizeof(*ib->rkp));
	if (!ib->rk || !ib->rkp)
		return -ENOMEM;
	for (uint32_t r = 0; r < j->world; r++) {
		Zerod__V1__CtlRank *x = &ib->rk[nr];
		if (q->rank >= 0 && (uint32_t)q->rank != r)
			continue;
		*x = (Zerod__V1__CtlRank)ZEROD__V1__CTL_RANK__INIT;
		x->rank = r;
		x->connected = j->ranks[r] != NULL;
		if (j->ranks[r]) {
			x->has_pid = true;
			x->pid = j->ranks[r]->pid;
		}
		x->registered = j->plans[r] != NULL || j->plan != NULL;
		x->next_bucket = j->next_bucket[r];
		x->owned_elements = j->shard && r < j->shard->world ? j->shard->load[r] : 0;
		ib->rkp[nr++] = x;
	}
	in->n_ranks = nr;
	in->ranks = ib->rkp;
	return 0;
}

/* The flight recorder's operations q asks for. 0 or -ENOMEM. */
static int inspect_ops(const struct jobops *jo, const Zerod__V1__InspectRequest *q,
		       Zerod__V1__InspectReply *in, struct inspect_bufs *ib)
{
	const struct flight *f = jo->flight;
	size_t no = 0;

	ib->op = calloc(f->count + 1, sizeof(*ib->op));
	ib->opp = calloc(f->count + 1, sizeof(*ib->opp));
	if (!ib->op || !ib->opp)
		return -ENOMEM;
	for (unsigned i = 0; i < f->count; i++) {
		const struct flight_op *e = flight_get(f, i);
		Zerod__V1__CtlOp *x = &ib->op[no];
		if (q->rank >= 0 && e->rank >= 0 && e->rank != q->rank)
			continue;
		if (q->bucket >= 0 && e->bucket >= 0 && e->bucket != q->bucket)
			continue;
		*x = (Zerod__V1__CtlOp)ZEROD__V1__CTL_OP__INIT;
		x->at_us = (uint64_t)e->at_us;
		x->what = (char *)flight_what_name(e->what);
		x->has_iteration = e->what != FL_SEEN && e->what != FL_STARTED;
		x->iteration = e->iteration;
		x->has_bucket = e->bucket >= 0;
		x->bucket = e->bucket;
		x->has_rank = e->rank >= 0;
		x->rank = e->rank;
		x->has_duration_us = e->dur_us > 0;
		x->duration_us = e->dur_us;
		x->detail = e->detail[0] ? (char *)e->detail : NULL;
		ib->opp[no++] = x;
	}
	in->ops_kept = f->cap;
	in->n_ops = no;
	in->ops = ib->opp;
	return 0;
}

static void do_inspect(struct ops_env *env, const struct caller *c, const void *route, size_t rlen,
		       const Ctl *req)
{
	const Zerod__V1__InspectRequest *q = req->inspect_request;
	Ctl reply = ZEROD__V1__CTL__INIT;
	Zerod__V1__InspectReply in = ZEROD__V1__INSPECT_REPLY__INIT;
	Zerod__V1__CtlJob job;
	Zerod__V1__CtlCheckpoint ck;
	struct inspect_bufs ib = {0};
	char err[256], who[256];
	const struct plan *p;
	struct jobops *jo;
	struct job *j;

	j = find_job(env, c, route, rlen, q);
	if (!j)
		return;
	jo = jobops_of(j);
	fill_job(j, &job, err, who, &ck, now_ms());
	in.job = &job;
	p = j->plan;
	for (uint32_t r = 0; !p && r < j->world; r++)
		p = j->plans[r];
	if (p) {
		in.optimizer = (char *)plan_optimizer_name(p->optimizer);
		in.shard_mode = (char *)plan_shard_name(p->shard_mode);
		in.step_mode = (char *)plan_step_name(p->step_mode);
		in.has_plan_hash = in.has_total_elements = true;
		in.plan_hash = p->hash;
		in.total_elements = p->total_numel;
	}
	in.has_state_bytes = true;
	in.state_bytes = j->memory;
	in.backend = j->be ? (char *)j->be->name : NULL;
	if ((p && inspect_buckets(j, p, q, &in, &ib) < 0) || inspect_ranks(j, q, &in, &ib) < 0 ||
	    (jo && inspect_ops(jo, q, &in, &ib) < 0)) {
		send_error(env, route, rlen, ZEROD__V1__CTL_ERROR__KIND__FAILED, "out of memory");
		goto out;
	}
	reply.body_case = ZEROD__V1__CTL__BODY_INSPECT;
	reply.inspect = &in;
	send_reply(env, route, rlen, &reply);
out:
	free(ib.bk);
	free(ib.bkp);
	free(ib.un);
	free(ib.unp);
	free(ib.rk);
	free(ib.rkp);
	free(ib.op);
	free(ib.opp);
}

static void do_metrics(struct ops_env *env, const struct caller *c, const void *route, size_t rlen,
		       const Ctl *req)
{
	Ctl reply = ZEROD__V1__CTL__INIT;
	Zerod__V1__MetricsReply m = ZEROD__V1__METRICS_REPLY__INIT;
	struct sbuf b = {0};

	(void)c, (void)req;
	metrics_render(env, &b);
	if (b.failed || !b.s) {
		sbuf_free(&b);
		send_error(env, route, rlen, ZEROD__V1__CTL_ERROR__KIND__FAILED, "out of memory");
		return;
	}
	m.text = b.s;
	reply.body_case = ZEROD__V1__CTL__BODY_METRICS;
	reply.metrics = &m;
	send_reply(env, route, rlen, &reply);
	sbuf_free(&b);
}

/* Lines joined by '\n' -> an array of pointers into s (modified). */
static size_t split_lines(char *s, char **out, size_t max)
{
	size_t n = 0;

	for (char *save = NULL, *l = s ? strtok_r(s, "\n", &save) : NULL; l && n < max;
	     l = strtok_r(NULL, "\n", &save))
		out[n++] = l;
	return n;
}

static void do_reload(struct ops_env *env, const struct caller *c, const void *route, size_t rlen,
		      const Ctl *req)
{
	Ctl reply = ZEROD__V1__CTL__INIT;
	Zerod__V1__ReloadReply rr = ZEROD__V1__RELOAD_REPLY__INIT;
	struct reload_report rep = {0};
	char *applied[64], *restart[64];

	(void)req;
	log_notice("reload asked by uid %u (pid %d, zeroctl)", (unsigned)c->cred.uid,
		   (int)c->cred.pid);
	ops_reload_report(env, &rep);
	rr.ok = rep.ok;
	rr.error = rep.ok ? NULL : rep.error;
	rr.n_applied = split_lines(rep.applied.s, applied, ARRAY_SIZE(applied));
	rr.applied = applied;
	rr.n_needs_restart = split_lines(rep.restart.s, restart, ARRAY_SIZE(restart));
	rr.needs_restart = restart;
	rr.config = (char *)config_src_path(env->cfg->src);
	reply.body_case = ZEROD__V1__CTL__BODY_RELOAD;
	reply.reload = &rr;
	send_reply(env, route, rlen, &reply);
	sbuf_free(&rep.applied);
	sbuf_free(&rep.restart);
}

static void do_trace(struct ops_env *env, const struct caller *c, const void *route, size_t rlen,
		     const Ctl *req)
{
	const Zerod__V1__TraceRequest *q = req->trace_request;
	Ctl reply = ZEROD__V1__CTL__INIT;
	Zerod__V1__TraceReply tr = ZEROD__V1__TRACE_REPLY__INIT;
	char why[512], file[512] = "";
	struct stat st;
	int r;

	if (q->on) {
		if (!q->file || !q->file[0]) {
			send_error(env, route, rlen, ZEROD__V1__CTL_ERROR__KIND__BAD_REQUEST,
				   "trace on needs a file");
			return;
		}
		r = trace_start(env, q->file, &st, why, sizeof(why));
		if (r < 0) {
			send_error(env, route, rlen, ZEROD__V1__CTL_ERROR__KIND__FAILED,
				   "cannot start the trace: %s", why);
			return;
		}
		log_notice("trace: writing the timeline to %s (uid %u)", q->file,
			   (unsigned)c->cred.uid);
		tr.on = true;
		tr.file = q->file;
		tr.events = 0;
		tr.has_dev = tr.has_ino = true;
		tr.dev = (uint64_t)st.st_dev;
		tr.ino = (uint64_t)st.st_ino;
	} else {
		if (!env->ops->trace) {
			send_error(env, route, rlen, ZEROD__V1__CTL_ERROR__KIND__FAILED,
				   "no trace is running");
			return;
		}
		snprintf(file, sizeof(file), "%s", trace_file(env));
		tr.events = trace_stop(env);
		log_notice("trace: stopped, %" PRIu64 " events in %s", tr.events, file);
		tr.on = false;
		tr.file = file;
	}
	reply.body_case = ZEROD__V1__CTL__BODY_TRACE;
	reply.trace = &tr;
	send_reply(env, route, rlen, &reply);
}

/* Who a job's trainers are: the job's uid, and the gid and groups of one
 * connected local rank (/proc/PID/status; known false when none is
 * connected or the file cannot be read: then only the uid is known). */
struct owner {
	uid_t uid;
	bool known;
	gid_t gid;
	gid_t groups[64];
	size_t ngroups;
};

static struct owner job_owner(const struct job *j)
{
	struct owner ow = {.uid = j->uid};
	char path[64], buf[8192], *l;
	ssize_t n = -1;
	int fd = -1;

	for (uint32_t r = 0; r < j->world && fd < 0; r++)
		if (j->ranks[r] && j->ranks[r]->pid > 0) {
			snprintf(path, sizeof(path), "/proc/%d/status", (int)j->ranks[r]->pid);
			fd = open(path, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
		}
	if (fd >= 0) {
		n = read(fd, buf, sizeof(buf) - 1); /* procfs: one read, never blocks */
		close(fd);
	}
	if (n <= 0)
		return ow;
	buf[n] = '\0';
	if ((l = strstr(buf, "\nGid:")) && sscanf(l + 5, "%u", &ow.gid) == 1)
		ow.known = true;
	if ((l = strstr(buf, "\nGroups:"))) {
		char *e = strchr(l + 1, '\n'), *p = l + 8;
		unsigned g;
		int used;
		if (e)
			*e = '\0';
		while (ow.ngroups < ARRAY_SIZE(ow.groups) && sscanf(p, "%u%n", &g, &used) == 1) {
			ow.groups[ow.ngroups++] = g;
			p += used;
		}
	}
	return ow;
}

/* May ow do `want` (mode bits: 1 search, 2 write) to a file of st? Mode
 * bits only (ACLs are not read); a group unknown grants what its bits do. */
static bool owner_may(const struct owner *ow, const struct stat *st, unsigned want)
{
	bool member = !ow->known || st->st_gid == ow->gid;
	unsigned bits;

	for (size_t i = 0; i < ow->ngroups && !member; i++)
		member = st->st_gid == ow->groups[i];
	if (ow->uid == 0)
		return true;
	bits = st->st_uid == ow->uid ? st->st_mode >> 6 : member ? st->st_mode >> 3 : st->st_mode;
	return (bits & want) == want;
}

/*
 * Can the job's trainers make and write dir (they write checkpoints as
 * themselves, docs/CHECKPOINT.md)? Every existing directory on the way must
 * let them search it, and the deepest existing one write into it. 0, or
 * -EACCES with why. Run on the loop thread for the configured
 * checkpoint-dir only (zerod's own config: a local path an operator chose);
 * a few stat() calls.
 */
static int owner_can_write(const struct owner *ow, const char *dir, char *why, size_t len)
{
	char p[4096], last[4096] = "/";
	struct stat st, last_st;
	size_t n = strlen(dir);

	if (n >= sizeof(p) || stat("/", &last_st) < 0)
		return 0; /* not known: the trainers' outcome says it */
	memcpy(p, dir, n + 1);
	for (size_t i = 1; i <= n; i++) {
		if (p[i] != '/' && p[i] != '\0')
			continue;
		char ch = p[i];
		p[i] = '\0';
		if (stat(p, &st) < 0) {
			if (errno != ENOENT)
				return 0;
			p[i] = ch;
			break; /* the rest is made below `last` */
		}
		if (!S_ISDIR(st.st_mode) || !owner_may(ow, &st, 1)) {
			snprintf(why, len, "%.200s is %s for uid %u", p,
				 S_ISDIR(st.st_mode) ? "not searchable" : "not a directory",
				 (unsigned)ow->uid);
			return -EACCES;
		}
		memcpy(last, p, i + 1);
		last_st = st;
		p[i] = ch;
	}
	if (!owner_may(ow, &last_st, 3)) {
		snprintf(why, len, "uid %u cannot write into %.200s (mode %03o, owner %u:%u)",
			 (unsigned)ow->uid, last, (unsigned)(last_st.st_mode & 07777),
			 (unsigned)last_st.st_uid, (unsigned)last_st.st_gid);
		return -EACCES;
	}
	return 0;
}

static void do_checkpoint(struct ops_env *env, const struct caller *c, const void *route,
			  size_t rlen, const Ctl *req)
{
	const Zerod__V1__CheckpointRequest *q = req->checkpoint_request;
	Zerod__V1__InspectRequest iq = ZEROD__V1__INSPECT_REQUEST__INIT;
	Ctl reply = ZEROD__V1__CTL__INIT;
	Zerod__V1__CheckpointReply cr = ZEROD__V1__CHECKPOINT_REPLY__INIT;
	char dir[4096], why[512];
	struct job *j;
	int r;

	iq.job = q->job;
	iq.has_uid = q->has_uid;
	iq.uid = q->uid;
	if (!(j = find_job(env, c, route, rlen, &iq)))
		return;
	if (q->dir && q->dir[0])
		snprintf(dir, sizeof(dir), "%s", q->dir);
	else if (env->cfg->checkpoint_dir[0])
		snprintf(dir, sizeof(dir), "%s/%s", env->cfg->checkpoint_dir, j->id);
	else
		dir[0] = '\0';
	if (!dir[0]) {
		send_error(env, route, rlen, ZEROD__V1__CTL_ERROR__KIND__BAD_REQUEST,
			   "no directory named and no checkpoint-dir configured");
		return;
	}
	/* the trainers write as themselves: a default they cannot write into
	 * is refused here, before anyone is told (a DIR named is tried, and
	 * its outcome reported) */
	if (!(q->dir && q->dir[0])) {
		struct owner ow = job_owner(j);
		if (owner_can_write(&ow, dir, why, sizeof(why)) < 0) {
			send_error(env, route, rlen, ZEROD__V1__CTL_ERROR__KIND__FAILED,
				   "job %s: the default checkpoint directory %s cannot be written "
				   "by the job's trainers: %s; name a DIR they can write, or make "
				   "checkpoint-dir one they can (docs/CHECKPOINT.md)",
				   j->id, dir, why);
			return;
		}
	}
	r = resume_checkpoint_ask(j, dir, &cr.iteration, &cr.ranks, why, sizeof(why));
	if (r < 0) {
		send_error(env, route, rlen, ZEROD__V1__CTL_ERROR__KIND__FAILED, "%s", why);
		return;
	}
	log_notice("job %s: checkpoint into %s at iteration %" PRIu64 " asked by uid %u", j->id,
		   dir, cr.iteration, (unsigned)c->cred.uid);
	ops_checkpoint_asked(j, cr.iteration, dir);
	cr.job = j->id;
	cr.dir = dir;
	reply.body_case = ZEROD__V1__CTL__BODY_CHECKPOINT;
	reply.checkpoint = &cr;
	send_reply(env, route, rlen, &reply);
}

static const struct verb {
	Zerod__V1__Ctl__BodyCase body;
	const char *name;
	void (*fn)(struct ops_env *env, const struct caller *c, const void *route, size_t rlen,
		   const Ctl *req);
	enum role needs;
} verbs[] = {
	{ZEROD__V1__CTL__BODY_STATUS_REQUEST, "status", do_status, ROLE_MEMBER},
	{ZEROD__V1__CTL__BODY_INSPECT_REQUEST, "inspect", do_inspect, ROLE_MEMBER},
	{ZEROD__V1__CTL__BODY_METRICS_REQUEST, "metrics", do_metrics, ROLE_MEMBER},
	{ZEROD__V1__CTL__BODY_RELOAD_REQUEST, "reload", do_reload, ROLE_ADMIN},
	{ZEROD__V1__CTL__BODY_TRACE_REQUEST, "trace", do_trace, ROLE_ADMIN},
	{ZEROD__V1__CTL__BODY_CHECKPOINT_REQUEST, "checkpoint", do_checkpoint, ROLE_MEMBER},
};

/* Who is calling, from the connection the request came on. */
static struct caller identify(struct ops *o, zmq_msg_t *msg)
{
	struct caller c = {.cred = {.pid = 0, .uid = (uid_t)-1, .gid = (gid_t)-1}};
	socklen_t len = sizeof(c.cred);
	int fd = zmq_msg_get(msg, ZMQ_SRCFD);
	gid_t groups[256];

	if (fd < 0 || getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &c.cred, &len) < 0)
		return c;
	if (c.cred.uid == 0 || c.cred.uid == geteuid()) {
		c.role = ROLE_ADMIN;
		return c;
	}
	if (c.cred.gid == o->group) {
		c.role = ROLE_MEMBER;
		return c;
	}
	len = sizeof(groups);
	if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) == 0)
		for (size_t i = 0; i < len / sizeof(gid_t); i++)
			if (groups[i] == o->group)
				c.role = ROLE_MEMBER;
	return c;
}

static void handle(struct ops_env *env, const void *route, size_t rlen, zmq_msg_t *body)
{
	struct caller c = identify(env->ops, body);
	const struct verb *v = NULL;
	Ctl *req;

	if (zmq_msg_size(body) > ZEROD_CTL_REQUEST_BYTES) {
		send_error(env, route, rlen, ZEROD__V1__CTL_ERROR__KIND__BAD_REQUEST,
			   "a %zu-byte request: at most %d bytes", zmq_msg_size(body),
			   ZEROD_CTL_REQUEST_BYTES);
		return;
	}
	req = zerod__v1__ctl__unpack(NULL, zmq_msg_size(body), zmq_msg_data(body));
	if (!req) {
		send_error(env, route, rlen, ZEROD__V1__CTL_ERROR__KIND__VERSION,
			   "cannot decode the request as zerod.v1.Ctl version %d (zerod %s)",
			   ZEROD_CTL_VERSION, ZEROD_VERSION_STRING);
		return;
	}
	for (size_t i = 0; i < ARRAY_SIZE(verbs); i++)
		if (verbs[i].body == req->body_case)
			v = &verbs[i];
	if (req->version != ZEROD_CTL_VERSION)
		send_error(env, route, rlen, ZEROD__V1__CTL_ERROR__KIND__VERSION,
			   "zeroctl speaks control protocol %u, zerod %s speaks %d",
			   req->version, ZEROD_VERSION_STRING, ZEROD_CTL_VERSION);
	else if (!v)
		send_error(env, route, rlen, ZEROD__V1__CTL_ERROR__KIND__BAD_REQUEST,
			   "not a request zerod knows (body %d)", (int)req->body_case);
	else if (c.role < v->needs)
		send_error(
			env, route, rlen, ZEROD__V1__CTL_ERROR__KIND__DENIED,
			"uid %u may not run %s: %s", (unsigned)c.cred.uid, v->name,
			v->needs == ROLE_ADMIN
				? "it needs root or zerod's own user"
				: "it needs root, zerod's own user or a member of zerod's group");
	else if (req->body_case == ZEROD__V1__CTL__BODY_INSPECT_REQUEST &&
		 (!req->inspect_request->job || !job_id_valid(req->inspect_request->job)))
		send_error(env, route, rlen, ZEROD__V1__CTL_ERROR__KIND__BAD_REQUEST,
			   "job ids are 1..%d characters of [A-Za-z0-9._-]", ZEROD_JOB_ID_MAX);
	else
		v->fn(env, &c, route, rlen, req);
	zerod__v1__ctl__free_unpacked(req, NULL);
}

static bool ctl_readable(void *zsock)
{
	int events = 0;
	size_t len = sizeof(events);

	return zmq_getsockopt(zsock, ZMQ_EVENTS, &events, &len) == 0 && (events & ZMQ_POLLIN);
}

/*
 * The control socket is watched through its ZMQ_FD as a plain fd, not with
 * loop_add_zsock(): that would read ZMQ_EVENTS (a system call) on every turn
 * of the loop, which costs every trainer's handoff ~1.6 us for a socket that
 * is used a few times a day. ZMQ_FD is edge-like: it fires again only once
 * ZMQ_EVENTS was read after the last receive and send. So a batch ends by
 * reading it; a batch cut short leaves ctl_pending set and ops_tick() comes
 * back at once (ctl_next_deadline).
 */
static void on_ctl(struct loop *l, void *userdata)
{
	struct ops_env *env = userdata;

	(void)l;
	env->ops->ctl_pending = false;
	for (int n = 0;; n++) {
		zmq_msg_t route, body;

		if (n == CTL_BATCH) {
			env->ops->ctl_pending = ctl_readable(env->ops->ctl);
			return;
		}
		zmq_msg_init(&route);
		if (zmq_msg_recv(&route, env->ops->ctl, ZMQ_DONTWAIT) < 0) {
			zmq_msg_close(&route);
			/* re-arm ZMQ_FD; a reply sent may have taken its edge */
			if (!ctl_readable(env->ops->ctl))
				return;
			continue;
		}
		zmq_msg_init(&body);
		if (zmq_msg_more(&route) && zmq_msg_recv(&body, env->ops->ctl, ZMQ_DONTWAIT) >= 0) {
			/* one frame per request: the rest of a multi-frame one goes */
			bool more = zmq_msg_more(&body);
			while (more) {
				zmq_msg_t extra;
				zmq_msg_init(&extra);
				more = zmq_msg_recv(&extra, env->ops->ctl, ZMQ_DONTWAIT) >= 0 &&
				       zmq_msg_more(&extra);
				zmq_msg_close(&extra);
			}
			if (zmq_msg_size(&route) <= CTL_ROUTE_MAX)
				handle(env, zmq_msg_data(&route), zmq_msg_size(&route), &body);
		}
		zmq_msg_close(&body);
		zmq_msg_close(&route);
	}
}

/* Only a stale socket is replaced: zerod holds the trainers' socket's lock,
 * so no other zerod serves this path; anything but a socket stays. */
static int claim(const char *path, char *why, size_t len)
{
	struct stat st;

	if (lstat(path, &st) < 0)
		return errno == ENOENT ? 0 : -errno;
	if (!S_ISSOCK(st.st_mode)) {
		snprintf(why, len, "control socket %s: the path exists and is not a socket; "
			 "not replacing it", path);
		return -EEXIST;
	}
	unlink(path);
	return 0;
}

int ctl_open(struct ops_env *env, char *why, size_t len)
{
	struct ops *o = env->ops;
	char endpoint[sizeof(o->ctl_path) + 8];
	int one = 1, zero = 0, hwm = 1000, hs = 5000;
	int64_t maxmsg = ZEROD_CTL_REQUEST_BYTES * 2;
	struct stat st;
	mode_t old_mask;
	size_t len2;
	int r;

	if (snprintf(o->ctl_path, sizeof(o->ctl_path), "%s" ZEROD_CTL_SUFFIX,
		     env->cfg->socket_path) >= (int)sizeof(((struct sockaddr_un *)0)->sun_path)) {
		snprintf(why, len, "control socket %s" ZEROD_CTL_SUFFIX " is too long",
			 env->cfg->socket_path);
		return -ENAMETOOLONG;
	}
	r = claim(o->ctl_path, why, len);
	if (r < 0) {
		if (!why[0])
			snprintf(why, len, "control socket %s: %s", o->ctl_path, strerror(-r));
		return r;
	}
	o->ctl = zmq_socket(env->zctx, ZMQ_ROUTER);
	if (!o->ctl ||
	    zmq_setsockopt(o->ctl, ZMQ_ROUTER_MANDATORY, &one, sizeof(one)) < 0 ||
	    zmq_setsockopt(o->ctl, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg)) < 0 ||
	    zmq_setsockopt(o->ctl, ZMQ_SNDHWM, &hwm, sizeof(hwm)) < 0 ||
	    zmq_setsockopt(o->ctl, ZMQ_RCVHWM, &hwm, sizeof(hwm)) < 0 ||
	    zmq_setsockopt(o->ctl, ZMQ_HANDSHAKE_IVL, &hs, sizeof(hs)) < 0 ||
	    zmq_setsockopt(o->ctl, ZMQ_LINGER, &zero, sizeof(zero)) < 0) {
		r = -zmq_errno();
		snprintf(why, len, "control socket: %s", zmq_strerror(-r));
		return r;
	}
	snprintf(endpoint, sizeof(endpoint), "ipc://%s", o->ctl_path);
	old_mask = umask(0117); /* born 0660, as the trainers' socket */
	r = zmq_bind(o->ctl, endpoint);
	umask(old_mask);
	if (r < 0) {
		r = -zmq_errno();
		snprintf(why, len, "bind %s: %s", endpoint, zmq_strerror(-r));
		return r;
	}
	if (lstat(o->ctl_path, &st) == 0) {
		o->ctl_bound = true;
		o->ctl_dev = st.st_dev;
		o->ctl_ino = st.st_ino;
		if (st.st_gid != o->group && lchown(o->ctl_path, (uid_t)-1, o->group) < 0)
			log_warning("control socket %s: cannot give it to group %u: %s "
				    "(members of the group cannot reach it)",
				    o->ctl_path, (unsigned)o->group, strerror(errno));
	}
	len2 = sizeof(o->ctl_fd);
	if (zmq_getsockopt(o->ctl, ZMQ_FD, &o->ctl_fd, &len2) < 0) {
		r = -zmq_errno();
		snprintf(why, len, "control socket: ZMQ_FD: %s", zmq_strerror(-r));
		return r;
	}
	r = loop_add_fd(env->core->loop, o->ctl_fd, on_ctl, env);
	if (r < 0)
		snprintf(why, len, "control socket: event loop: %s", strerror(-r));
	return r;
}

void ctl_tick(struct ops_env *env)
{
	if (env->ops->ctl && env->ops->ctl_pending)
		on_ctl(env->core->loop, env);
}

int64_t ctl_next_deadline(struct ops_env *env)
{
	return env->ops->ctl_pending ? 0 : INT64_MAX;
}

void ctl_close(struct ops_env *env)
{
	struct ops *o = env->ops;
	struct stat st;

	if (!o->ctl)
		return;
	loop_remove_fd(env->core->loop, o->ctl_fd);
	zmq_close(o->ctl);
	o->ctl = NULL;
	/* only the file this process bound */
	if (o->ctl_bound && lstat(o->ctl_path, &st) == 0 && st.st_dev == o->ctl_dev &&
	    st.st_ino == o->ctl_ino)
		unlink(o->ctl_path);
}
