/*
 * session.c — client sessions on the ROUTER socket. Receives every message,
 * bounds it before decoding (a small size until Hello), decodes it (wire.c),
 * checks that it fits the connection's state and dispatches it through one
 * table. Anything malformed or unexpected gets an Error reply naming what was
 * wrong, within the connection's reply budget (conn.c); nothing a client sends
 * can stop the daemon, stall it, or reach another job.
 *
 * A session exists from an accepted Hello until Goodbye, the trainer's death
 * (its pidfd), its connection closing, a failed send, or the end of its job.
 * Owns the sessions and, per session, a grad mapping kept for a retried
 * registration.
 */
#include <errno.h>
#include <poll.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <zmq.h>

#include "common.h"
#include "mem/cudabufs.h"
#include "base/config.h"
#include "core/hooks.h"
#include "core/job.h"
#include "core/rdzv.h"
#include "core/resume.h"
#include "core/sched.h"
#include "core/semantics.h"
#include "core/statex.h"
#include "edge/edge.h"
#include "edge/fastpath.h"
#include "edge/fdbufs.h"
#include "base/log.h"
#include "core/resume.h"
#include "core/semantics.h"
#include "base/loop.h"
#include "mem/mem.h"
#include "wire.h"

/* A Hello is small: anything bigger before it is refused undecoded. After the
 * plan is registered only small messages remain. Until then a RegisterPlan
 * may take the whole ZEROD_MAX_MSG_BYTES. */
#define HELLO_MAX_BYTES 4096
/* Registered: a BucketReady may carry a segment mask (9 bytes a word of 64
 * segments, PLAN_MAX_SEGMENTS at most) */
#define REGISTERED_MAX_BYTES (4096 + 9 * (PLAN_MAX_SEGMENTS / 64))
/* Decoding work per loop turn: after this many bytes the rest waits a turn,
 * so completions and other jobs are served between big messages. */
#define DECODE_BYTES_PER_TURN (1u << 20)
#define BATCH_PER_TURN        256
/* How long a session whose process exited or whose connection closed
 * lingers, for a Goodbye still queued to be read (ROUTER queues are fair,
 * so behind a flood it is a few messages away, not the whole flood). */
#define LEAVE_GRACE_MS 50
/* Trainers without a pidfd (old kernels, valgrind) are looked at so often. */
#define PID_POLL_MS 100

static struct session *session_find(struct edge *e, const void *route, size_t len)
{
	for (struct session *s = e->sessions; s; s = s->next)
		if (s->route_len == len && memcmp(s->route, route, len) == 0)
			return s;
	return NULL;
}

int session_send(struct session *s, const Zerod__V1__Envelope *env)
{
	int r;

	fastpath_sent(s);
	r = wire_send(s->e->router, s->route, s->route_len, env);

	/* Gone (EHOSTUNREACH) or not reading (EAGAIN: its queue is full): a
	 * completion it never gets would hang it, so the session ends. Not
	 * here, though: callers walk the job's ranks. session_reap() does it. */
	if (r < 0 && !s->send_failed) {
		log_warning("job %s rank %u: cannot send %s: %s", s->m.job ? s->m.job->id : "-",
			    s->m.rank, wire_body_name(env->body_case), zc_strerror(r));
		s->send_failed = r;
	}
	return r;
}

void session_reap(struct edge *e)
{
	struct session *s = e->sessions;

	while (s) {
		if (s->send_failed || s->detached) {
			/* a send that failed because the process is gone (its
			 * pidfd not seen yet) is its exit: what its ring still
			 * holds is taken (session_drop) */
			bool gone = s->exited || (s->send_failed && session_gone(s));

			log_set_cause(s->m.uid);
			session_drop(s, gone             ? LEAVE_EXITED
					: s->send_failed ? LEAVE_UNREACHABLE
							 : LEAVE_GOODBYE);
			log_clear_cause();
			s = e->sessions; /* the list changed */
			continue;
		}
		s = s->next;
	}
}

/* An error to a peer without a session, within its connection's budget. */
static void reply_error(struct edge *e, const void *route, size_t len, int code, const char *msg)
{
	if (!conn_may_reply(e, e->cur_conn))
		return;
	e->core->stats.errors_sent++;
	CORE_HOOK(e->core, error_sent, code);
	(void)wire_send_error(e->router, route, len, e->cur_request, code, true, WIRE_NO_ITERATION,
			      -1, msg);
}

static void log_dropped(struct session *s)
{
	if (s->log_dropped)
		log_info("job %s rank %u: %u more errors sent to it were not logged",
			 s->m.job ? s->m.job->id : "-", s->m.rank, s->log_dropped);
	s->log_dropped = 0;
}

/* A trainer that sends bad messages in a loop must not flood the log (and
 * stall the loop thread on a slow journal): SESSION_LOG_BURST a second. */
static bool log_allowed(struct session *s)
{
	int64_t now = now_ms();

	if (now - s->log_window >= 1000) {
		log_dropped(s);
		s->log_window = now;
		s->log_count = 0;
	}
	if (s->log_count < SESSION_LOG_BURST) {
		s->log_count++;
		return true;
	}
	s->log_dropped++;
	return false;
}

void session_send_error(struct session *s, int code, bool fatal, uint64_t iteration, int64_t bucket,
			const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	int r;

	/* a fatal error always goes: a rank that never gets it would hang */
	if (!fatal && s->conn && !conn_may_reply(s->e, s->conn))
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	s->e->core->stats.errors_sent++;
	CORE_HOOK(s->e->core, error_sent, code);
	if (log_allowed(s))
		log_info("job %s rank %u: %s: %s", s->m.job ? s->m.job->id : "-", s->m.rank,
			 zc_strerror_name(code), msg);
	/* only the sender of the message being handled gets its request id */
	fastpath_sent(s);
	r = wire_send_error(s->e->router, s->route, s->route_len,
			    s == s->e->cur_session ? s->e->cur_request : 0, code, fatal,
			    iteration == SESSION_NO_ITERATION ? WIRE_NO_ITERATION : iteration,
			    bucket, msg);
	if (r < 0 && !s->send_failed)
		s->send_failed = r; /* a fatal error it never gets would hang it */
}

/* The session's process is gone: it leaves after LEAVE_GRACE_MS (a Goodbye
 * it sent just before exiting may still be queued). Nothing is drained here:
 * a flooding peer beside it must not keep the loop in this handler. */
static void mark_exited(struct session *s)
{
	struct edge *e = s->e;

	if (s->pidfd >= 0) {
		loop_remove_fd(e->core->loop, s->pidfd);
		close(s->pidfd);
		s->pidfd = -1;
	}
	s->exited = true;
	if (!s->leave_at)
		s->leave_at = now_ms() + LEAVE_GRACE_MS;
	s->leave_why = LEAVE_EXITED;
}

static void on_pidfd(struct loop *l, void *userdata)
{
	(void)l;
	mark_exited(userdata);
}

void session_conn_closed(struct session *s)
{
	s->conn = NULL;
	if (!s->leave_at) {
		s->leave_at = now_ms() + LEAVE_GRACE_MS;
		s->leave_why = LEAVE_CLOSED;
	}
}

void session_detach(struct session *s)
{
	s->detached = true;
}

/* A zombie has exited too: kill(pid, 0) alone would call it alive. */
static bool pid_alive(pid_t pid)
{
	char path[64], buf[256], *p;
	ssize_t n;
	int fd;

	if (kill(pid, 0) < 0 && errno == ESRCH)
		return false;
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return errno != ENOENT;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return true;
	buf[n] = 0;
	p = strrchr(buf, ')'); /* "pid (comm) S ..." */
	return !(p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X'));
}

bool session_gone(struct session *s)
{
	struct pollfd p = {.fd = s->pidfd, .events = POLLIN};

	if (s->exited)
		return true;
	if (s->pidfd >= 0)
		return poll(&p, 1, 0) == 1;
	return s->m.pid > 0 && !pid_alive(s->m.pid);
}

void session_check_leaving(struct edge *e, int64_t now)
{
	struct session *s = e->sessions;

	while (s) {
		struct session *next = s->next;
		/* only trainers without a pidfd are looked at */
		if (s->pidfd < 0 && !s->exited && s->m.pid > 0 && !pid_alive(s->m.pid))
			mark_exited(s);
		if (s->leave_at && s->leave_at <= now) {
			log_set_cause(s->m.uid);
			if (s->exited)
				log_notice("job %s rank %u: trainer pid %d exited",
					   s->m.job ? s->m.job->id : "-", s->m.rank, (int)s->m.pid);
			else
				log_notice("job %s rank %u: trainer pid %d closed its connection",
					   s->m.job ? s->m.job->id : "-", s->m.rank, (int)s->m.pid);
			session_drop(s, s->leave_why);
			log_clear_cause();
			next = e->sessions; /* the list changed */
		}
		s = next;
	}
}

int64_t session_next_deadline(struct edge *e)
{
	int64_t next = LOOP_NEVER;

	for (struct session *s = e->sessions; s; s = s->next) {
		if (s->leave_at)
			next = MIN(next, s->leave_at);
		else if (s->pidfd < 0 && s->m.pid > 0)
			next = MIN(next, now_ms() + PID_POLL_MS);
	}
	return next;
}

void session_drop(struct session *s, enum leave_reason why)
{
	struct edge *e = s->e;

	for (struct session **pp = &e->sessions; *pp; pp = &(*pp)->next)
		if (*pp == s) {
			*pp = s->next;
			e->nsessions--;
			break;
		}
	if (s->pidfd >= 0) {
		loop_remove_fd(e->core->loop, s->pidfd);
		close(s->pidfd);
	}
	log_dropped(s);
	/* A trainer that dies before its buffers were mapped leaves their
	 * names; so does one whose job ended before it registered (its own
	 * mappings stay valid without the names, and the job cannot use them). */
	if (s->m.job && (why == LEAVE_EXITED || s->detached) &&
	    s->m.job->ranks[s->m.rank] == &s->m && !s->m.job->grad_map[s->m.rank])
		e->core->mem->reclaim(s->m.job->id, s->m.rank, s->own_pid, s->m.uid);
	if (why == LEAVE_EXITED)
		fastpath_take_last(s);
	fdbufs_free(s);
	if (s->conn)
		conn_unbind(s->conn);
	if (e->cur_session == s)
		e->cur_session = NULL;
	if (s->m.job && (job_ended(s->m.job) || s->m.job->state == JOB_REFORMING)) {
		/* as fdbufs_offer() answers while the session lasts */
		char reason[400];

		(void)snprintf(reason, sizeof(reason), "job %s %s: %s", s->m.job->id,
			       job_ended(s->m.job) ? "failed" : "re-forms", s->m.job->errmsg);
		fastpath_retire(s, s->m.job->err ? s->m.job->err : ZC_EJOBFAILED, reason);
	}
	if (s->m.job)
		job_leave(s->m.job, &s->m, why);
	fastpath_free(s);
	free(s);
}

void session_free_all(struct edge *e)
{
	while (e->sessions) {
		struct session *s = e->sessions;
		e->sessions = s->next;
		if (s->pidfd >= 0)
			close(s->pidfd);
		fastpath_free(s);
		fdbufs_free(s);
			free(s);
	}
}

/*
 * Is `claimed` the pid of process `pid` as seen from that process's own pid
 * namespace? /proc/PID/status lists it last on the NSpid line (a trainer in a
 * container knows itself by that number).
 */
static bool pid_is_claimed(pid_t pid, pid_t claimed)
{
	char path[64], line[256];
	bool match = pid == claimed;
	FILE *f;

	if (match)
		return true;
	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return false;
	while (fgets(line, sizeof(line), f)) {
		char *last;
		if (strncmp(line, "NSpid:", 6) != 0)
			continue;
		last = strrchr(line, '\t');
		match = last && atoi(last + 1) == (int)claimed;
		break;
	}
	fclose(f);
	return match;
}

/* ------------------------------------------------------- handlers --- */

/* Whether a Hello (the sender has no session yet) may join at all: 0, or a
 * code with why in err. */
static int hello_check(struct edge *e, const Zerod__V1__Hello *h, char *err, size_t len)
{
	if (h->protocol_version != ZC_PROTOCOL_VERSION) {
		snprintf(err, len, "client speaks protocol %u, zerod %s speaks %u",
			 h->protocol_version, ZEROD_VERSION_STRING, ZC_PROTOCOL_VERSION);
		return ZC_EVERSION;
	}
	if (e->stopping) {
		snprintf(err, len, "zerod is shutting down");
		return ZC_ESHUTDOWN;
	}
	/* Who is calling: the kernel's word (SO_PEERCRED). Its pid must be the
	 * one the Hello names, seen from the trainer's own pid namespace;
	 * otherwise the connection is gone and its fd already serves someone
	 * else, or the Hello lies. */
	if (e->cur_peer.pid <= 0 || !pid_is_claimed(e->cur_peer.pid, h->pid)) {
		snprintf(err, len,
			 "cannot confirm who is calling: Hello says pid %d, the connection %s%d",
			 (int)h->pid, e->cur_peer.pid > 0 ? "belongs to pid " : "is gone, pid ",
			 (int)e->cur_peer.pid);
		return ZC_EPROTO;
	}
	if (e->nsessions >= e->cfg->max_sessions) {
		snprintf(err, len, "zerod already serves %u trainers (--max-sessions)",
			 e->nsessions);
		return ZC_ELIMIT;
	}
	return 0;
}

static void on_hello(struct edge *e, const void *route, size_t rlen, struct session *s,
		     const Zerod__V1__Envelope *env)
{
	const Zerod__V1__Hello *h = env->hello;
	Zerod__V1__Envelope out = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__HelloOk ok = ZEROD__V1__HELLO_OK__INIT;
	struct rdzv_spec rs = {0};
	char err[256];
	int r;

	if (s) {
		session_send_error(s, ZC_ESTATE, false, -1, -1, "second Hello on one connection");
		return;
	}
	if ((r = hello_check(e, h, err, sizeof(err))) < 0) {
		reply_error(e, route, rlen, r, err);
		return;
	}
	s = calloc(1, sizeof(*s));
	if (!s) {
		reply_error(e, route, rlen, -ENOMEM, "out of memory");
		return;
	}
	memcpy(s->route, route, rlen);
	s->route_len = rlen;
	s->e = e;
	s->serial = ++e->session_serial;
	s->pidfd = -1;
	s->m.rank = h->rank;
	/* the pid in our namespace, the one a pidfd can watch */
	s->m.pid = e->cur_peer.pid;
	s->own_pid = h->pid;
	s->m.uid = e->cur_peer.uid;
	/* a job over several nodes: the core (job.c, rdzv.c) checks what it says */
	if (h->rdzv && h->rdzv[0])
		rs = (struct rdzv_spec){.endpoint = h->rdzv,
					.nnodes = h->has_nnodes ? h->nnodes : 0,
					.has_node_rank = h->has_node_rank,
					.node_rank = h->node_rank,
					.secret = h->job_secret.data,
					.secret_len = h->has_job_secret ? h->job_secret.len : 0};
	r = job_join(e->core, &s->m,
		     &(struct join_req){.job_id = h->job_id,
					.rank = h->rank,
					.world = h->world_size,
					.local_rank = h->local_rank,
					.local_size = h->local_size,
					.rdzv = rs.endpoint ? &rs : NULL},
		     err, sizeof(err));
	if (r < 0) {
		reply_error(e, route, rlen, r, err);
		free(s);
		return;
	}
	/* A dead trainer is noticed at once through its pidfd; without one
	 * (old kernel) the timer looks every tick. */
	s->pidfd = s->m.pid > 0 ? (int)syscall(SYS_pidfd_open, s->m.pid, 0) : -1;
	if (s->pidfd >= 0) {
		if (loop_add_fd(e->core->loop, s->pidfd, on_pidfd, s) < 0) {
			close(s->pidfd);
			s->pidfd = -1;
		}
	} else {
		log_warning("job %s rank %u: no pidfd for pid %d (%s); checking it every tick",
			    s->m.job->id, s->m.rank, (int)s->m.pid, strerror(errno));
	}
	s->next = e->sessions;
	e->sessions = s;
	e->nsessions++;
	if (e->cur_conn)
		conn_bind(e->cur_conn, s);

	ok.protocol_version = ZC_PROTOCOL_VERSION;
	ok.daemon_version = (char *)ZEROD_VERSION_STRING;
	ok.has_stall_timeout_ms = 1;
	ok.stall_timeout_ms = (uint32_t)e->cfg->stall_timeout_ms;
	fastpath_offer(s, &ok);
	out.body_case = ZEROD__V1__ENVELOPE__BODY_HELLO_OK;
	out.hello_ok = &ok;
	session_send(s, &out);
}

static void on_register_plan(struct edge *e, const void *route, size_t rlen, struct session *s,
			     const Zerod__V1__Envelope *env)
{
	const Zerod__V1__RegisterPlan *m = env->register_plan;
	struct mem_desc gd, pd;
	struct plan *p = NULL;
	char err[256];
	int r;

	(void)e, (void)route, (void)rlen;
	r = plan_from_pb(m->plan, &p, err, sizeof(err));
	if (r < 0) {
		session_send_error(s, r, false, SESSION_NO_ITERATION, -1,
				   "rank %u: invalid plan: %s", s->m.rank, err);
		return;
	}
	if (!!m->shm + !!m->fds + !!m->cuda != 1) {
		plan_free(p);
		session_send_error(
			s, ZC_EPROTO, false, SESSION_NO_ITERATION, -1,
			"rank %u: RegisterPlan must name its buffers once: shm or fds, or cuda",
			s->m.rank);
		return;
	}
	if (m->cuda) {
		struct cudabufs *cb;

		r = cudabufs_from_pb(m->cuda, p, s->m.uid, &cb, err, sizeof(err));
		if (r < 0) {
			plan_free(p);
			session_send_error(s, r, false, SESSION_NO_ITERATION, -1,
					   "rank %u: CUDA buffers: %s", s->m.rank, err);
			return;
		}
		job_register_cuda(s->m.job, &s->m, p, cb);
		return;
	}
	if (m->fds) {
		r = fdbufs_descs(s, m->fds->serial, &gd, &pd, err, sizeof(err));
		pd.shared = m->fds->has_shared_params && m->fds->shared_params;
		if (r < 0) {
			plan_free(p);
			session_send_error(s, r, false, SESSION_NO_ITERATION, -1, "rank %u: %s",
					   s->m.rank, err);
			return;
		}
	} else {
		gd = (struct mem_desc){.shm_name = m->shm->grad_name,
				       .bytes = m->shm->grad_bytes,
				       .owner = s->m.uid};
		pd = (struct mem_desc){.shm_name = m->shm->param_name,
				       .bytes = m->shm->param_bytes,
				       .owner = s->m.uid};
	}
	job_register_plan(s->m.job, &s->m, p, &gd, &pd);
	/* mapped, or refused: done with them either way (to try again, a
	 * client passes buffers anew) */
	fdbufs_free(s);
}

static void on_bucket_ready(struct edge *e, const void *route, size_t rlen, struct session *s,
			    const Zerod__V1__Envelope *env)
{
	const Zerod__V1__BucketReady *m = env->bucket_ready;

	(void)e, (void)route, (void)rlen;
	sched_bucket_ready(s->m.job, &s->m, m->iteration, m->bucket, m->unused, m->n_unused);
}

static void on_set_grad_scale(struct edge *e, const void *route, size_t rlen, struct session *s,
			      const Zerod__V1__Envelope *env)
{
	(void)e, (void)route, (void)rlen;
	sem_set_grad_scale(s->m.job, &s->m, env->set_grad_scale->iteration,
			   env->set_grad_scale->inv_scale);
}

static void on_set_hyper(struct edge *e, const void *route, size_t rlen, struct session *s,
			 const Zerod__V1__Envelope *env)
{
	const Zerod__V1__SetHyper *m = env->set_hyper;
	struct zc_param_group g;

	(void)e, (void)route, (void)rlen;
	plan_group_from_pb(m->values, &g);
	sched_set_hyper(s->m.job, &s->m, m->iteration, m->group, &g);
}

static void on_params_changed(struct edge *e, const void *route, size_t rlen,
			      struct session *s, const Zerod__V1__Envelope *env)
{
	(void)e, (void)route, (void)rlen;
	sched_params_changed(s->m.job, &s->m, env->params_changed->iteration);
}

static void on_resume(struct edge *e, const void *route, size_t rlen, struct session *s,
		      const Zerod__V1__Envelope *env)
{
	(void)e, (void)route, (void)rlen;
	resume_request(s->m.job, &s->m, env->resume->from, env->resume->iteration);
}

static void on_get_state(struct edge *e, const void *route, size_t rlen, struct session *s,
			 const Zerod__V1__Envelope *env)
{
	(void)e, (void)route, (void)rlen;
	statex_request(s->m.job, &s->m, s->m.rank, false, env->get_state->staging, NULL, 0);
}

static void on_set_state(struct edge *e, const void *route, size_t rlen, struct session *s,
			 const Zerod__V1__Envelope *env)
{
	const Zerod__V1__SetState *m = env->set_state;

	(void)e, (void)route, (void)rlen;
	statex_request(s->m.job, &s->m, s->m.rank, true, m->staging, m->segments, m->n_segments);
}

static void on_checkpoint_state(struct edge *e, const void *route, size_t rlen, struct session *s,
				const Zerod__V1__Envelope *env)
{
	(void)e, (void)route, (void)rlen;
	statex_ckpt_request(s->m.job, &s->m, s->m.rank, env->checkpoint_state->staging);
}

/* How a checkpoint the rank wrote ended (docs/CHECKPOINT.md, "Outcomes"):
 * for the operator only; the paths must be one line each (they go into the
 * log and zeroctl's tables), the reason is cleaned where it is shown. */
static void on_checkpoint_done(struct edge *e, const void *route, size_t rlen,
			       struct session *s, const Zerod__V1__Envelope *env)
{
	const Zerod__V1__CheckpointDone *m = env->checkpoint_done;

	(void)route, (void)rlen;
	if (strlen(m->dir) > 4096 || strpbrk(m->dir, "\n\r") ||
	    (m->path && (strlen(m->path) > 4200 || strpbrk(m->path, "\n\r")))) {
		session_send_error(s, ZC_EPROTO, false, SESSION_NO_ITERATION, -1,
				   "CheckpointDone: the directory and path must be one line of "
				   "at most 4096 bytes each");
		return;
	}
	CORE_HOOK(e->core, checkpoint_done, s->m.job, s->m.rank, m->ok, m->iteration, m->dir,
		  m->ok ? m->path : NULL, m->ok ? NULL : m->error);
}

static void on_goodbye(struct edge *e, const void *route, size_t rlen, struct session *s,
		       const Zerod__V1__Envelope *env)
{
	(void)e, (void)route, (void)rlen, (void)env;
	session_drop(s, LEAVE_GOODBYE);
}

enum { NEEDS_SESSION = 1 << 0 };

static const struct handler {
	Zerod__V1__Envelope__BodyCase body;
	void (*fn)(struct edge *e, const void *route, size_t rlen, struct session *s,
		   const Zerod__V1__Envelope *env);
	unsigned flags;
} handlers[] = {
	{ZEROD__V1__ENVELOPE__BODY_HELLO, on_hello, 0},
	{ZEROD__V1__ENVELOPE__BODY_REGISTER_PLAN, on_register_plan, NEEDS_SESSION},
	{ZEROD__V1__ENVELOPE__BODY_BUCKET_READY, on_bucket_ready, NEEDS_SESSION},
	{ZEROD__V1__ENVELOPE__BODY_SET_HYPER, on_set_hyper, NEEDS_SESSION},
	{ZEROD__V1__ENVELOPE__BODY_SET_GRAD_SCALE, on_set_grad_scale, NEEDS_SESSION},
	{ZEROD__V1__ENVELOPE__BODY_GOODBYE, on_goodbye, NEEDS_SESSION},
	{ZEROD__V1__ENVELOPE__BODY_PARAMS_CHANGED, on_params_changed, NEEDS_SESSION},
	{ZEROD__V1__ENVELOPE__BODY_GET_STATE, on_get_state, NEEDS_SESSION},
	{ZEROD__V1__ENVELOPE__BODY_SET_STATE, on_set_state, NEEDS_SESSION},
	{ZEROD__V1__ENVELOPE__BODY_RESUME, on_resume, NEEDS_SESSION},
	{ZEROD__V1__ENVELOPE__BODY_CHECKPOINT_STATE, on_checkpoint_state, NEEDS_SESSION},
	{ZEROD__V1__ENVELOPE__BODY_CHECKPOINT_DONE, on_checkpoint_done, NEEDS_SESSION},
};

/* The largest message s may send now (no session: before Hello). */
static size_t max_message(const struct session *s)
{
	if (!s)
		return HELLO_MAX_BYTES;
	if (s->m.job && job_awaits_plan(s->m.job, s->m.rank))
		return ZEROD_MAX_MSG_BYTES; /* its RegisterPlan is still to come */
	if (s->m.job && s->m.job->state == JOB_ACTIVE && !s->m.job->in_flight)
		return ZEROD_MAX_MSG_BYTES; /* between iterations: a SetState, a new plan */
	return REGISTERED_MAX_BYTES;
}

static void refuse(struct edge *e, const void *route, size_t rlen, struct session *s,
		   const char *msg)
{
	if (s)
		session_send_error(s, ZC_EPROTO, false, SESSION_NO_ITERATION, -1, "%s", msg);
	else
		reply_error(e, route, rlen, ZC_EPROTO, msg);
}

static void dispatch(struct edge *e, const void *route, size_t rlen, const void *buf, size_t len)
{
	struct session *s = session_find(e, route, rlen);
	Zerod__V1__Envelope *env;
	const struct handler *h = NULL;
	const char *field;
	char msg[160];

	/* every message counts for the ring's order marks, refused ones too */
	if (s)
		fastpath_received(s); /* what its ring holds from before this message */
	/* refused before it costs a decode (protobuf-c's allocations can be
	 * many times the message) */
	if (len > max_message(s)) {
		snprintf(msg, sizeof(msg), "a %zu-byte message %s: at most %zu bytes", len,
			 s ? "after the plan was registered" : "before Hello", max_message(s));
		refuse(e, route, rlen, s, msg);
		return;
	}
	if (!s) {
		/* before Hello only a Hello is decoded: the rest is refused by
		 * its kind, read from the field keys */
		Zerod__V1__Envelope__BodyCase body = wire_peek_body(buf, len);
		for (size_t i = 0; i < ARRAY_SIZE(handlers); i++)
			if (handlers[i].body == body)
				h = &handlers[i];
		if (body != ZEROD__V1__ENVELOPE__BODY__NOT_SET &&
		    (!h || (h->flags & NEEDS_SESSION))) {
			snprintf(msg, sizeof(msg),
				 h ? "%s before Hello" : "%s is not a message a client sends",
				 wire_body_name(body));
			reply_error(e, route, rlen, ZC_EPROTO, msg);
			return;
		}
		h = NULL;
	}
	if (wire_decode(buf, len, &env) < 0) {
		snprintf(msg, sizeof(msg), "cannot decode a %zu-byte message as zerod.v1.Envelope",
			 len);
		refuse(e, route, rlen, s, msg);
		return;
	}
	/* errors about this message echo its request id to its sender */
	e->cur_request = env->has_request_id ? env->request_id : 0;
	e->cur_session = s;
	for (size_t i = 0; i < ARRAY_SIZE(handlers); i++)
		if (handlers[i].body == env->body_case)
			h = &handlers[i];
	if (wire_has_nul(&zerod__v1__envelope__descriptor, buf, len, &field)) {
		/* protobuf-c cut the string there: "job\0x" would read "job" */
		snprintf(msg, sizeof(msg), "%s: field %s holds a NUL byte",
			 wire_body_name(env->body_case), field);
		refuse(e, route, rlen, s, msg);
	} else if (!h) {
		snprintf(msg, sizeof(msg), "%s is not a message a client sends",
			 wire_body_name(env->body_case));
		refuse(e, route, rlen, s, msg);
	} else if ((h->flags & NEEDS_SESSION) && !s) {
		snprintf(msg, sizeof(msg), "%s before Hello", wire_body_name(env->body_case));
		reply_error(e, route, rlen, ZC_EPROTO, msg);
	} else {
		h->fn(e, route, rlen, s, env);
	}
	e->cur_request = 0;
	e->cur_session = NULL;
	wire_free(env);
}

/* Who is at the other end of the ipc connection a message came on
 * (SO_PEERCRED on the message's source fd); pid 0 if unknown. */
static struct ucred peer_cred(zmq_msg_t *msg)
{
	struct ucred cred = {.pid = 0, .uid = (uid_t)-1, .gid = (gid_t)-1};
	socklen_t len = sizeof(cred);
	int fd = zmq_msg_get(msg, ZMQ_SRCFD);

	if (fd < 0 || getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0)
		return (struct ucred){.pid = 0, .uid = (uid_t)-1, .gid = (gid_t)-1};
	return cred;
}

int session_on_router(struct loop *l, void *userdata)
{
	struct edge *e = userdata;
	size_t decoded = 0;
	int handled = 0;

	(void)l;
	/* every connection a message below came on is known now */
	conn_update(e);
	/* A bounded batch, in messages and in bytes, so one busy client cannot
	 * starve completions, signals and other jobs: the loop comes back for
	 * the rest after they had their turn. */
	for (; handled < BATCH_PER_TURN && decoded < DECODE_BYTES_PER_TURN; handled++) {
		zmq_msg_t route, body;
		int more = 0, fd;
		size_t more_len = sizeof(more);
		bool drop;

		zmq_msg_init(&route);
		if (zmq_msg_recv(&route, e->router, ZMQ_DONTWAIT) < 0) {
			zmq_msg_close(&route);
			break;
		}
		zmq_msg_init(&body);
		if (!zmq_msg_more(&route) || zmq_msg_recv(&body, e->router, ZMQ_DONTWAIT) < 0) {
			zmq_msg_close(&body);
			zmq_msg_close(&route);
			continue;
		}
		fd = zmq_msg_get(&body, ZMQ_SRCFD);
		e->cur_peer = peer_cred(&body);
		e->cur_conn = conn_of_msg(e, fd, zmq_msg_data(&route), zmq_msg_size(&route));
		log_set_cause(e->cur_peer.uid);
		drop = conn_drop_msg(e, fd, e->cur_conn);
		zmq_getsockopt(e->router, ZMQ_RCVMORE, &more, &more_len);
		if (more) {
			/* a multi-frame message: drop the rest, answer once */
			while (more) {
				zmq_msg_t extra;
				zmq_msg_init(&extra);
				zmq_msg_recv(&extra, e->router, ZMQ_DONTWAIT);
				more = zmq_msg_more(&extra);
				zmq_msg_close(&extra);
			}
			if (!drop)
				reply_error(e, zmq_msg_data(&route), zmq_msg_size(&route),
					    ZC_EPROTO,
					    "multi-frame message: send one Envelope per message");
		} else if (!drop && zmq_msg_size(&route) <= ZEROD_ROUTE_MAX) {
			decoded += zmq_msg_size(&body);
			dispatch(e, zmq_msg_data(&route), zmq_msg_size(&route), zmq_msg_data(&body),
				 zmq_msg_size(&body));
		}
		log_clear_cause();
		e->cur_peer = (struct ucred){.pid = 0, .uid = (uid_t)-1, .gid = (gid_t)-1};
		e->cur_conn = NULL;
		zmq_msg_close(&body);
		zmq_msg_close(&route);
	}
	return handled;
}

/* ------------------------------------------------------------ the sink --- */

static void sink_plan_ok(struct member *m, uint64_t plan_hash, uint64_t recovered)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__PlanOk ok = ZEROD__V1__PLAN_OK__INIT;

	ok.plan_hash = plan_hash;
	ok.has_recovered_iteration = recovered != SINK_NO_ITERATION;
	ok.recovered_iteration = ok.has_recovered_iteration ? recovered : 0;
	env.body_case = ZEROD__V1__ENVELOPE__BODY_PLAN_OK;
	env.plan_ok = &ok;
	session_send(session_of(m), &env);
}

static void sink_state_ok(struct member *m, const struct sink_ranges *rg)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__StateOk ok = ZEROD__V1__STATE_OK__INIT;

	if (rg) {
		ok.n_ranges = rg->n;
		ok.ranges = (uint64_t *)rg->ranges;
		ok.has_node = ok.has_nnodes = true;
		ok.node = rg->node;
		ok.nnodes = rg->nnodes;
		ok.has_run = true;
		ok.run = rg->run;
	}

	env.body_case = ZEROD__V1__ENVELOPE__BODY_STATE_OK;
	env.state_ok = &ok;
	session_send(session_of(m), &env);
}

static void sink_checkpoint_due(struct member *m, const char *dir, uint64_t iteration)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__CheckpointDue cd = ZEROD__V1__CHECKPOINT_DUE__INIT;

	cd.dir = (char *)dir;
	cd.iteration = iteration;
	env.body_case = ZEROD__V1__ENVELOPE__BODY_CHECKPOINT_DUE;
	env.checkpoint_due = &cd;
	session_send(session_of(m), &env);
}

static void sink_err(struct member *m, int code, bool fatal, uint64_t iteration, int64_t bucket,
		     const char *msg)
{
	session_send_error(session_of(m), code, fatal, iteration, bucket, "%s", msg);
}

/* A StepDone with what the step did: the ring's slot has no room for it,
 * so it goes over ZeroMQ, in order with the ring's slots (ring.h's MARK). */
static void sink_step_info(struct member *m, uint64_t t, bool found_inf, double grad_norm)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__StepDone sd = ZEROD__V1__STEP_DONE__INIT;

	sd.iteration = t;
	sd.has_found_inf = found_inf;
	sd.found_inf = found_inf;
	sd.has_grad_norm = !isnan(grad_norm);
	sd.grad_norm = grad_norm;
	env.body_case = ZEROD__V1__ENVELOPE__BODY_STEP_DONE;
	env.step_done = &sd;
	session_send(session_of(m), &env);
}

/* Not the answer to the message being handled: no request id, so that it
 * fails no future of that request. */
static void sink_err_unasked(struct member *m, int code, uint64_t iteration, const char *msg)
{
	struct edge *e = session_of(m)->e;
	uint64_t request = e->cur_request;

	e->cur_request = 0;
	session_send_error(session_of(m), code, false, iteration, -1, "%s", msg);
	e->cur_request = request;
}

/* Completions go through the rank's fast-path ring where it has one. */
static void sink_bucket_done(struct member *m, uint64_t t, uint32_t b)
{
	fastpath_bucket_done(session_of(m), t, b);
}

static void sink_step_done(struct member *m, uint64_t t)
{
	fastpath_step_done(session_of(m), t);
}

static void sink_detach(struct member *m)
{
	session_detach(session_of(m));
}

static bool sink_gone(struct member *m)
{
	return session_gone(session_of(m));
}

static void sink_drop(struct member *m, enum leave_reason why)
{
	session_drop(session_of(m), why);
}

static int sink_fd_staging(struct member *m, uint64_t serial, struct mem_desc *ret, char *err,
			   size_t errlen)
{
	return fdbufs_staging(session_of(m), serial, ret, err, errlen);
}

static void sink_fd_release(struct member *m)
{
	fdbufs_free(session_of(m));
}

const struct sink_ops session_sink = {
	.plan_ok = sink_plan_ok,
	.bucket_done = sink_bucket_done,
	.step_done = sink_step_done,
	.step_done_info = sink_step_info,
	.error = sink_err,
	.error_unasked = sink_err_unasked,
	.state_ok = sink_state_ok,
	.checkpoint_due = sink_checkpoint_due,
	.detach = sink_detach,
	.gone = sink_gone,
	.drop = sink_drop,
	.fd_staging = sink_fd_staging,
	.fd_release = sink_fd_release,
};
