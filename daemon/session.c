/*
 * session.c — client connections on the ROUTER socket. Receives every
 * message, decodes it (wire.c), checks that it fits the connection's state
 * and dispatches it through one table. Anything malformed or unexpected gets
 * an Error reply naming what was wrong; nothing a client sends can stop the
 * daemon or reach another job.
 *
 * A session exists from an accepted Hello until Goodbye, the trainer's death
 * (its pidfd), or a failed send.
 */
#include <errno.h>
#include <fcntl.h>
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
#include "daemon.h"
#include "fastpath.h"
#include "log.h"
#include "loop.h"
#include "mem/mem.h"
#include "wire.h"

static struct session *session_find(struct daemon *d, const void *route, size_t len)
{
	for (struct session *s = d->sessions; s; s = s->next)
		if (s->route_len == len && memcmp(s->route, route, len) == 0)
			return s;
	return NULL;
}

static struct session *session_find_serial(struct daemon *d, uint64_t serial)
{
	for (struct session *x = d->sessions; x; x = x->next)
		if (x->serial == serial)
			return x;
	return NULL;
}

int session_send(struct session *s, const Zerod__V1__Envelope *env)
{
	int r;

	fastpath_sent(s);
	r = wire_send(s->d->router, s->route, s->route_len, env);

	/* Gone (EHOSTUNREACH) or not reading (EAGAIN: its queue is full): a
	 * completion it never gets would hang it, so the session ends. Not
	 * here, though: callers walk the job's ranks. session_reap() does it. */
	if (r < 0 && !s->send_failed) {
		log_warning("job %s rank %u: cannot send %s: %s", s->job ? s->job->id : "-",
			    s->rank, wire_body_name(env->body_case), zc_strerror(r));
		s->send_failed = r;
	}
	return r;
}

void session_reap(struct daemon *d)
{
	struct session *s = d->sessions;

	while (s) {
		if (s->send_failed) {
			session_drop(s, LEAVE_UNREACHABLE);
			s = d->sessions; /* the list changed */
			continue;
		}
		s = s->next;
	}
}

static void reply_error(struct daemon *d, const void *route, size_t len, int code, const char *msg)
{
	d->stats.errors_sent++;
	(void)wire_send_error(d->router, route, len, d->cur_request, code, true, -1, -1, msg);
}

static void log_dropped(struct session *s)
{
	if (s->log_dropped)
		log_info("job %s rank %u: %u more errors sent to it were not logged",
			 s->job ? s->job->id : "-", s->rank, s->log_dropped);
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

void session_send_error(struct session *s, int code, bool fatal, int64_t iteration, int64_t bucket,
			const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	int r;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	s->d->stats.errors_sent++;
	if (log_allowed(s))
		log_info("job %s rank %u: %s: %s", s->job ? s->job->id : "-", s->rank,
			 zc_strerror_name(code), msg);
	/* only the sender of the message being handled gets its request id */
	fastpath_sent(s);
	r = wire_send_error(s->d->router, s->route, s->route_len,
			    s == s->d->cur_session ? s->d->cur_request : 0, code, fatal, iteration,
			    bucket, msg);
	if (r < 0 && !s->send_failed)
		s->send_failed = r; /* a fatal error it never gets would hang it */
}

static void on_pidfd(struct loop *l, void *userdata)
{
	struct session *s = userdata;
	struct daemon *d = s->d;
	uint64_t serial = s->serial;

	/* A Goodbye sent just before exiting may still wait in the socket:
	 * read everything first. It may free s, so look the session up again. */
	while (session_on_router(l, d) > 0 && session_find_serial(d, serial))
		;
	session_reap(d);
	s = session_find_serial(d, serial);
	if (!s)
		return;
	log_notice("job %s rank %u: trainer pid %d exited", s->job ? s->job->id : "-", s->rank,
		   (int)s->pid);
	session_drop(s, LEAVE_EXITED);
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

void session_check_pids(struct daemon *d)
{
	struct session *s = d->sessions;

	/* Only for trainers without a pidfd (old kernels, valgrind): the timer
	 * looks instead, a tick late at most. */
	while (s) {
		struct session *next = s->next;
		if (s->pidfd < 0 && s->pid > 0 && !pid_alive(s->pid)) {
			log_notice("job %s rank %u: trainer pid %d exited",
				   s->job ? s->job->id : "-", s->rank, (int)s->pid);
			session_drop(s, LEAVE_EXITED);
			next = d->sessions; /* the list changed */
		}
		s = next;
	}
}

void session_drop(struct session *s, enum leave_reason why)
{
	struct daemon *d = s->d;

	for (struct session **pp = &d->sessions; *pp; pp = &(*pp)->next)
		if (*pp == s) {
			*pp = s->next;
			d->nsessions--;
			break;
		}
	if (s->pidfd >= 0) {
		loop_remove_fd(d->loop, s->pidfd);
		close(s->pidfd);
	}
	log_dropped(s);
	/* a trainer that dies before its buffers were mapped leaves their names */
	if (s->job && why == LEAVE_EXITED && s->job->ranks[s->rank] == s &&
	    !s->job->grad_map[s->rank])
		d->mem->reclaim(s->job->id, s->rank, s->own_pid, s->uid);
	if (why == LEAVE_EXITED)
		fastpath_take_last(s);
	if (s->job)
		job_leave(s->job, s, why);
	fastpath_free(s);
	free(s);
}

void session_free_all(struct daemon *d)
{
	while (d->sessions) {
		struct session *s = d->sessions;
		d->sessions = s->next;
		if (s->pidfd >= 0)
			close(s->pidfd);
		fastpath_free(s);
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

static void on_hello(struct daemon *d, const void *route, size_t rlen, struct session *s,
		     const Zerod__V1__Envelope *env)
{
	const Zerod__V1__Hello *h = env->hello;
	Zerod__V1__Envelope out = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__HelloOk ok = ZEROD__V1__HELLO_OK__INIT;
	char err[256];
	int r;

	if (s) {
		session_send_error(s, ZC_ESTATE, false, -1, -1, "second Hello on one connection");
		return;
	}
	if (h->protocol_version != ZC_PROTOCOL_VERSION) {
		snprintf(err, sizeof(err), "client speaks protocol %u, zerod %s speaks %u",
			 h->protocol_version, ZEROD_VERSION_STRING, ZC_PROTOCOL_VERSION);
		reply_error(d, route, rlen, ZC_EVERSION, err);
		return;
	}
	if (d->stopping) {
		reply_error(d, route, rlen, ZC_ESHUTDOWN, "zerod is shutting down");
		return;
	}
	/* Who is calling: the kernel's word (SO_PEERCRED). Its pid must be the
	 * one the Hello names, seen from the trainer's own pid namespace;
	 * otherwise the connection is gone and its fd already serves someone
	 * else, or the Hello lies. */
	if (d->cur_peer.pid <= 0 || !pid_is_claimed(d->cur_peer.pid, h->pid)) {
		snprintf(err, sizeof(err),
			 "cannot confirm who is calling: Hello says pid %d, the connection %s%d",
			 (int)h->pid, d->cur_peer.pid > 0 ? "belongs to pid " : "is gone, pid ",
			 (int)d->cur_peer.pid);
		reply_error(d, route, rlen, ZC_EPROTO, err);
		return;
	}
	s = calloc(1, sizeof(*s));
	if (!s) {
		reply_error(d, route, rlen, -ENOMEM, "out of memory");
		return;
	}
	memcpy(s->route, route, rlen);
	s->route_len = rlen;
	s->d = d;
	s->serial = ++d->session_serial;
	s->pidfd = -1;
	s->rank = h->rank;
	/* the pid in our namespace, the one a pidfd can watch */
	s->pid = d->cur_peer.pid;
	s->own_pid = h->pid;
	s->uid = d->cur_peer.uid;
	r = job_join(d, s, h, err, sizeof(err));
	if (r < 0) {
		reply_error(d, route, rlen, r, err);
		free(s);
		return;
	}
	/* A dead trainer is noticed at once through its pidfd; without one
	 * (old kernel) the timer looks every tick. */
	s->pidfd = s->pid > 0 ? (int)syscall(SYS_pidfd_open, s->pid, 0) : -1;
	if (s->pidfd >= 0) {
		if (loop_add_fd(d->loop, s->pidfd, on_pidfd, s) < 0) {
			close(s->pidfd);
			s->pidfd = -1;
		}
	} else {
		log_warning("job %s rank %u: no pidfd for pid %d (%s); checking it every tick",
			    s->job->id, s->rank, (int)s->pid, strerror(errno));
	}
	s->next = d->sessions;
	d->sessions = s;
	d->nsessions++;

	ok.protocol_version = ZC_PROTOCOL_VERSION;
	ok.daemon_version = (char *)ZEROD_VERSION_STRING;
	fastpath_offer(s, &ok);
	out.body_case = ZEROD__V1__ENVELOPE__BODY_HELLO_OK;
	out.hello_ok = &ok;
	session_send(s, &out);
}

static void on_register_plan(struct daemon *d, const void *route, size_t rlen, struct session *s,
			     const Zerod__V1__Envelope *env)
{
	(void)d, (void)route, (void)rlen;
	job_register_plan(s->job, s, env->register_plan);
}

static void on_bucket_ready(struct daemon *d, const void *route, size_t rlen, struct session *s,
			    const Zerod__V1__Envelope *env)
{
	(void)d, (void)route, (void)rlen;
	sched_bucket_ready(s->job, s, env->bucket_ready->iteration, env->bucket_ready->bucket);
}

static void on_set_hyper(struct daemon *d, const void *route, size_t rlen, struct session *s,
			 const Zerod__V1__Envelope *env)
{
	(void)d, (void)route, (void)rlen;
	sched_set_hyper(s->job, s, env->set_hyper);
}

static void on_goodbye(struct daemon *d, const void *route, size_t rlen, struct session *s,
		       const Zerod__V1__Envelope *env)
{
	(void)d, (void)route, (void)rlen, (void)env;
	session_drop(s, LEAVE_GOODBYE);
}

enum { NEEDS_SESSION = 1 << 0 };

static const struct handler {
	Zerod__V1__Envelope__BodyCase body;
	void (*fn)(struct daemon *d, const void *route, size_t rlen, struct session *s,
		   const Zerod__V1__Envelope *env);
	unsigned flags;
} handlers[] = {
	{ZEROD__V1__ENVELOPE__BODY_HELLO, on_hello, 0},
	{ZEROD__V1__ENVELOPE__BODY_REGISTER_PLAN, on_register_plan, NEEDS_SESSION},
	{ZEROD__V1__ENVELOPE__BODY_BUCKET_READY, on_bucket_ready, NEEDS_SESSION},
	{ZEROD__V1__ENVELOPE__BODY_SET_HYPER, on_set_hyper, NEEDS_SESSION},
	{ZEROD__V1__ENVELOPE__BODY_GOODBYE, on_goodbye, NEEDS_SESSION},
};

static void dispatch(struct daemon *d, const void *route, size_t rlen, const void *buf, size_t len)
{
	struct session *s = session_find(d, route, rlen);
	Zerod__V1__Envelope *env;
	const struct handler *h = NULL;
	char msg[160];

	if (s)
		fastpath_received(s); /* what its ring holds from before this message */
	if (wire_decode(buf, len, &env) < 0) {
		snprintf(msg, sizeof(msg), "cannot decode a %zu-byte message as zerod.v1.Envelope",
			 len);
		if (s)
			session_send_error(s, ZC_EPROTO, false, -1, -1, "%s", msg);
		else
			reply_error(d, route, rlen, ZC_EPROTO, msg);
		return;
	}
	/* errors about this message echo its request id to its sender */
	d->cur_request = env->has_request_id ? env->request_id : 0;
	d->cur_session = s;
	for (size_t i = 0; i < ARRAY_SIZE(handlers); i++)
		if (handlers[i].body == env->body_case)
			h = &handlers[i];
	if (!h) {
		snprintf(msg, sizeof(msg), "%s is not a message a client sends",
			 wire_body_name(env->body_case));
		if (s)
			session_send_error(s, ZC_EPROTO, false, -1, -1, "%s", msg);
		else
			reply_error(d, route, rlen, ZC_EPROTO, msg);
	} else if ((h->flags & NEEDS_SESSION) && !s) {
		snprintf(msg, sizeof(msg), "%s before Hello", wire_body_name(env->body_case));
		reply_error(d, route, rlen, ZC_EPROTO, msg);
	} else {
		h->fn(d, route, rlen, s, env);
	}
	d->cur_request = 0;
	d->cur_session = NULL;
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
	int handled = 0;

	struct daemon *d = userdata;

	(void)l;
	/* Drain what is queued now, a bounded number at a time, so one busy
	 * client cannot starve completions and signals. */
	for (int budget = 256; budget > 0; budget--) {
		zmq_msg_t route, body;
		int more = 0;
		size_t more_len = sizeof(more);

		zmq_msg_init(&route);
		if (zmq_msg_recv(&route, d->router, ZMQ_DONTWAIT) < 0) {
			zmq_msg_close(&route);
			break;
		}
		zmq_msg_init(&body);
		if (!zmq_msg_more(&route) || zmq_msg_recv(&body, d->router, ZMQ_DONTWAIT) < 0) {
			zmq_msg_close(&body);
			zmq_msg_close(&route);
			continue;
		}
		zmq_getsockopt(d->router, ZMQ_RCVMORE, &more, &more_len);
		if (more) {
			/* a multi-frame message: drop the rest, answer once */
			while (more) {
				zmq_msg_t extra;
				zmq_msg_init(&extra);
				zmq_msg_recv(&extra, d->router, ZMQ_DONTWAIT);
				more = zmq_msg_more(&extra);
				zmq_msg_close(&extra);
			}
			reply_error(d, zmq_msg_data(&route), zmq_msg_size(&route), ZC_EPROTO,
				    "multi-frame message: send one Envelope per message");
		} else if (zmq_msg_size(&route) <= ZEROD_ROUTE_MAX) {
			d->cur_peer = peer_cred(&body);
			dispatch(d, zmq_msg_data(&route), zmq_msg_size(&route), zmq_msg_data(&body),
				 zmq_msg_size(&body));
			d->cur_peer = (struct ucred){.pid = 0, .uid = (uid_t)-1, .gid = (gid_t)-1};
		}
		zmq_msg_close(&body);
		zmq_msg_close(&route);
		handled++;
	}
	return handled;
}
