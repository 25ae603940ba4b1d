/*
 * daemon.c — start and stop, in order. Start: worker pool, completion queue,
 * ZeroMQ ROUTER on the socket path (mode 0660), signalfd, timerfd, then the
 * loop. SIGTERM/SIGINT: every job fails with ZC_ESHUTDOWN (its ranks are
 * told), the loop runs on until every executor has stopped (bounded by
 * shutdown_timeout_ms), then mappings, socket and file are released.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <unistd.h>
#include <zmq.h>

#include "common.h"
#include "daemon.h"
#include "fastpath.h"
#include "log.h"
#include "loop.h"
#include "mem/mem.h"
#include "pool.h"

#define TICK_MS 100

static void on_completions(struct loop *l, void *userdata)
{
	struct daemon *d = userdata;
	struct exec_done *done = completion_queue_take(d->cq);

	(void)l;
	while (done) {
		struct exec_done *next = done->next;
		sched_on_done(d, done);
		free(done);
		done = next;
	}
	fastpath_flush(d);
	session_reap(d);
}

static void on_router(struct loop *l, void *userdata)
{
	session_on_router(l, userdata);
	session_reap(userdata);
}

static void begin_shutdown(struct daemon *d, const char *why)
{
	if (d->stopping)
		return;
	d->stopping = true;
	d->stop_deadline_ms = now_ms() + d->cfg.shutdown_timeout_ms;
	log_notice("%s: shutting down", why);
	for (struct job *j = d->jobs; j; j = j->next) {
		if (j->state != JOB_FAILED)
			job_fail(j, ZC_ESHUTDOWN, true, "zerod is shutting down (%s)", why);
	}
}

static bool executors_idle(struct daemon *d)
{
	for (struct job *j = d->jobs; j; j = j->next)
		if (j->exec_running)
			return false;
	return true;
}

static void on_signal(struct loop *l, void *userdata)
{
	struct daemon *d = userdata;
	struct signalfd_siginfo si;

	while (read(d->sigfd, &si, sizeof(si)) == sizeof(si)) {
		if (d->stopping) {
			/* no waiting for executors in the middle of an op: the
			 * socket goes, shared memory was unlinked when mapped */
			log_warning("second signal: stopping now");
			unlink(d->cfg.socket_path);
			_exit(1);
		}
		begin_shutdown(d, si.ssi_signo == SIGTERM ? "SIGTERM" : "SIGINT");
	}
	if (d->stopping && executors_idle(d))
		loop_quit(l);
}

static void on_tick(struct loop *l, void *userdata)
{
	struct daemon *d = userdata;
	uint64_t n;
	int64_t now = now_ms();

	(void)!read(d->timerfd, &n, sizeof(n));
	if (d->stopping) {
		if (executors_idle(d) || now >= d->stop_deadline_ms)
			loop_quit(l);
		return;
	}
	session_check_pids(d);
	sched_check_stalls(d, now);
	fastpath_tick(d, now);
	session_reap(d);
}

/* Refuse to take over the socket of a daemon that is alive (libzmq would
 * silently unlink it); remove a stale one. */
static int claim_socket_path(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int fd, r;

	if (strlen(path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	r = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
	close(fd);
	if (r == 0)
		return -EADDRINUSE;
	if (errno == ECONNREFUSED)
		unlink(path);
	return 0;
}

static int open_router(struct daemon *d)
{
	char endpoint[sizeof(((struct sockaddr_un *)0)->sun_path) + 8];
	int one = 1, zero = 0, hwm = ZEROD_QUEUE_MSGS;
	mode_t old_mask;
	int64_t maxmsg = ZEROD_MAX_MSG_BYTES;
	int r;

	r = claim_socket_path(d->cfg.socket_path);
	if (r < 0) {
		log_err("socket %s: %s", d->cfg.socket_path,
			r == -EADDRINUSE ? "another zerod is serving it" : strerror(-r));
		return r;
	}
	d->router = zmq_socket(d->zctx, ZMQ_ROUTER);
	if (!d->router)
		return -zmq_errno();
	/* No silently dropped completions: a send to a gone peer fails. */
	if (zmq_setsockopt(d->router, ZMQ_ROUTER_MANDATORY, &one, sizeof(one)) < 0 ||
	    zmq_setsockopt(d->router, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg)) < 0 ||
	    zmq_setsockopt(d->router, ZMQ_SNDHWM, &hwm, sizeof(hwm)) < 0 ||
	    zmq_setsockopt(d->router, ZMQ_RCVHWM, &hwm, sizeof(hwm)) < 0 ||
	    zmq_setsockopt(d->router, ZMQ_LINGER, &zero, sizeof(zero)) < 0) {
		r = -zmq_errno();
		log_err("ROUTER socket options: %s", zmq_strerror(-r));
		return r;
	}
	snprintf(endpoint, sizeof(endpoint), "ipc://%s", d->cfg.socket_path);
	/* the socket file is born 0660 (zmq_bind creates it on this thread):
	 * no moment with the umask's mode, and clients that see it may use it */
	old_mask = umask(0117);
	r = zmq_bind(d->router, endpoint);
	umask(old_mask);
	if (r < 0) {
		r = -zmq_errno();
		log_err("bind %s: %s", endpoint, zmq_strerror(-r));
		return r;
	}
	return 0;
}

static int open_fds(struct daemon *d)
{
	struct itimerspec its = {
		.it_interval = {.tv_nsec = TICK_MS * 1000000L},
		.it_value = {.tv_nsec = TICK_MS * 1000000L},
	};
	sigset_t mask;

	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	/* blocked in every thread: workers are created after this */
	pthread_sigmask(SIG_BLOCK, &mask, NULL);
	signal(SIGPIPE, SIG_IGN);
	d->sigfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
	if (d->sigfd < 0)
		return -errno;
	d->timerfd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
	if (d->timerfd < 0)
		return -errno;
	if (timerfd_settime(d->timerfd, 0, &its, NULL) < 0)
		return -errno;
	return 0;
}

static void daemon_close(struct daemon *d)
{
	/* executors are stopped (or the deadline passed: then stop them now) */
	for (struct job *j = d->jobs; j; j = j->next)
		if (j->exec_running)
			exec_stop(j->exec);
	session_free_all(d);
	fastpath_unlisten(d);
	job_free_all(d); /* joins executors, unmaps buffers */
	if (d->router) {
		/* the jobs' last errors (ZC_ESHUTDOWN) may still be queued: give
		 * them a moment to leave, then drop what a stuck peer never read */
		int linger = 1000;
		zmq_setsockopt(d->router, ZMQ_LINGER, &linger, sizeof(linger));
		zmq_close(d->router);
		unlink(d->cfg.socket_path);
	}
	if (d->zctx)
		zmq_ctx_term(d->zctx);
	pool_free(d->pool);
	completion_queue_free(d->cq);
	loop_free(d->loop);
	if (d->sigfd >= 0)
		close(d->sigfd);
	if (d->timerfd >= 0)
		close(d->timerfd);
}

int daemon_run(const struct daemon_config *cfg)
{
	struct daemon d = {.cfg = *cfg, .sigfd = -1, .timerfd = -1};
	char size[16];
	int r;

	if (!d.cfg.max_memory)
		d.cfg.max_memory =
			(uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGE_SIZE) / 2;
	d.mem = &mem_shm_ops;
	log_max_level = cfg->log_level;

	r = open_fds(&d);
	if (r < 0)
		goto out;
	r = pool_catch_faults();
	if (r < 0)
		goto out;
	r = pool_new(cfg->workers, &d.pool);
	if (r < 0)
		goto out;
	r = completion_queue_new(&d.cq);
	if (r < 0)
		goto out;
	r = loop_new(&d.loop);
	if (r < 0)
		goto out;
	d.zctx = zmq_ctx_new();
	if (!d.zctx) {
		r = -zmq_errno();
		goto out;
	}
	r = open_router(&d);
	if (r < 0)
		goto out;
	fastpath_listen(&d);
	if ((r = loop_add_zsock(d.loop, d.router, on_router, &d)) < 0 ||
	    (r = loop_add_fd(d.loop, completion_queue_fd(d.cq), on_completions, &d)) < 0 ||
	    (r = loop_add_fd(d.loop, d.sigfd, on_signal, &d)) < 0 ||
	    (r = loop_add_fd(d.loop, d.timerfd, on_tick, &d)) < 0)
		goto out;

	log_notice("zerod %s: serving %s (backends: %s; mem %s; %u workers; "
		   "%s for optimizer state)",
		   ZEROD_VERSION_STRING, cfg->socket_path, backend_host.name, d.mem->name,
		   pool_threads(d.pool), fmt_bytes(size, d.cfg.max_memory));
	r = loop_run(d.loop);
	log_notice("zerod: served %" PRIu64 " jobs: %" PRIu64 " iterations, %" PRIu64
		   " buckets reduced, %" PRIu64 " errors sent",
		   d.stats.jobs, d.stats.iterations, d.stats.buckets, d.stats.errors_sent);
out:
	if (r < 0)
		log_err("zerod: %s", zc_strerror(r));
	daemon_close(&d);
	return r;
}
