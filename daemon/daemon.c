/*
 * daemon.c — start and stop, in order, and what belongs to no one session
 * or job. Start: the log's writer thread, the fd limit (raised to the hard
 * limit; the session and connection limits follow from it), worker pool,
 * completion queue, the socket's lock file, the ZeroMQ ROUTER on the socket
 * path (mode 0660; or the listening socket systemd passed) and its monitor,
 * signalfd, the operator's side (ops.h: the control socket, sd_notify), then
 * the loop. The loop sleeps until the nearest deadline (a stall or its
 * report, a join or Hello timeout, a session leaving, the watchdog, the
 * shutdown); there is no periodic tick without systemd's watchdog.
 *
 * SIGTERM/SIGINT: every job fails with ZC_ESHUTDOWN (its ranks are told), the
 * loop runs on until every executor has stopped (bounded by
 * shutdown_timeout_ms), then mappings, socket and files are released. SIGHUP
 * reloads the config file (ops.c). SIGUSR1 logs one status line (jobs,
 * sessions, connections, memory, drops).
 *
 * Start-up steps return an error and say why in a buffer; daemon_run() logs
 * it, once.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <zmq.h>

#include "common.h"
#include "exec/backend.h"
#include "base/config.h"
#include "daemon.h"
#include "edge/fastpath.h"
#include "base/lockfile.h"
#include "base/log.h"
#include "base/loop.h"
#include "mem/mem.h"
#include "ops/ops.h"
#include "base/pool.h"
#include "core/job.h"
#include "core/rdzv.h"
#include "core/sched.h"
#include "edge/edge.h"
#include "exec/completion.h"
#include "exec/exec.h"
#include "net/tls.h"

/* fds kept beyond connections and pidfds: shm opens, /proc reads, the odd
 * eventfd a new ZeroMQ pipe may want */
#define FD_RESERVE       32
#define SESSIONS_DEFAULT 1024

static bool executors_idle(struct daemon *d)
{
	for (struct job *j = d->core.jobs; j; j = j->next)
		if (j->exec_running)
			return false;
	return true;
}

static void on_completions(struct loop *l, void *userdata)
{
	struct daemon *d = userdata;
	struct exec_done *done = completion_queue_take(d->core.cq);

	while (done) {
		struct exec_done *next = done->next;
		/* what a job's completions log, its owner caused */
		log_set_cause(((struct job *)done->tag)->uid);
		sched_on_done(&d->core, done);
		log_clear_cause();
		free(done);
		done = next;
	}
	fastpath_flush(&d->edge);
	session_reap(&d->edge);
	if (d->edge.stopping && executors_idle(d))
		loop_quit(l);
}

static void on_router(struct loop *l, void *userdata)
{
	struct daemon *d = userdata;

	session_on_router(l, &d->edge);
	session_reap(&d->edge);
}

static void begin_shutdown(struct daemon *d, const char *why)
{
	if (d->edge.stopping)
		return;
	d->edge.stopping = true;
	d->stop_deadline_ms = now_ms() + d->cfg.shutdown_timeout_ms;
	log_notice("%s: shutting down", why);
	ops_stopping(&d->ops);
	for (struct job *j = d->core.jobs; j; j = j->next) {
		if (!job_ended(j))
			job_fail(j, ZC_ESHUTDOWN, true, "zerod is shutting down (%s)", why);
	}
	session_reap(&d->edge);
}

/* Is the socket file still the one this process bound? */
static bool socket_is_ours(struct daemon *d)
{
	struct stat st;

	return d->bound && lstat(d->cfg.socket_path, &st) == 0 && st.st_dev == d->sock_dev &&
	       st.st_ino == d->sock_ino;
}

static void log_status(struct daemon *d)
{
	char mem[16];

	log_notice("status %" PRIu64 ": %u jobs, %u sessions, %u connections, %s (%" PRIu64
		   " bytes) of optimizer state, %" PRIu64 " replies dropped, %" PRIu64
		   " connections closed, %" PRIu64 " log lines dropped",
		   ++d->status_serial, d->core.njobs, d->edge.nsessions, d->edge.nconns,
		   fmt_bytes(mem, d->core.memory_used), d->core.memory_used,
		   d->core.stats.replies_dropped, d->core.stats.conns_shed, log_dropped_total());
}

static void on_signal(struct loop *l, void *userdata)
{
	struct daemon *d = userdata;
	struct signalfd_siginfo si;

	while (read(d->sigfd, &si, sizeof(si)) == sizeof(si)) {
		if (si.ssi_signo == SIGUSR1) {
			log_status(d);
			continue;
		}
		if (si.ssi_signo == SIGHUP) {
			ops_reload(&d->ops);
			continue;
		}
		if (d->edge.stopping) {
			/* no waiting for executors in the middle of an op: the
			 * socket goes, shared memory was unlinked when mapped */
			log_warning("second signal: stopping now");
			if (socket_is_ours(d))
				unlink(d->cfg.socket_path);
			log_stop(100);
			_exit(1);
		}
		begin_shutdown(d, si.ssi_signo == SIGTERM ? "SIGTERM" : "SIGINT");
	}
	if (d->edge.stopping && executors_idle(d))
		loop_quit(l);
}

/* When sched_check_stalls() would fail j: the same rule, as a deadline. */
static int64_t stall_deadline(const struct daemon *d, const struct job *j)
{
	bool waiting = (j->state == JOB_ACTIVE && j->in_flight) ||
		       (j->state == JOB_FORMING && j->nregistered < j->local_size);
	int limit = j->state == JOB_FORMING && j->nregistered == 0 ? d->cfg.join_timeout_ms
								   : d->cfg.stall_timeout_ms;

	return waiting ? j->progress_ms + limit : LOOP_NEVER;
}

/* Before every sleep: the timer is due at the nearest deadline. */
static void before_sleep(struct loop *l, void *userdata)
{
	struct daemon *d = userdata;
	int64_t next = MIN(session_next_deadline(&d->edge), conn_next_deadline(&d->edge));

	next = MIN(next, fastpath_next_deadline(&d->edge));
	next = MIN(next, ops_next_deadline(&d->ops));
	next = MIN(next, rdzv_next_deadline(&d->core));

	(void)l;
	if (d->edge.stopping)
		next = MIN(next, d->stop_deadline_ms);
	for (struct job *j = d->core.jobs; j; j = j->next)
		next = MIN(next, stall_deadline(d, j));
	loop_timer_set(d->timer, next);
}

static void on_timer(struct loop *l, void *userdata)
{
	struct daemon *d = userdata;
	int64_t now = now_ms();

	if (d->edge.stopping && (executors_idle(d) || now >= d->stop_deadline_ms)) {
		loop_quit(l);
		return;
	}
	session_check_leaving(&d->edge, now);
	sched_check_stalls(&d->core, now);
	fastpath_tick(&d->edge, now);
	rdzv_tick(&d->core, now);
	conn_check_idle(&d->edge, now);
	ops_tick(&d->ops, now);
	session_reap(&d->edge);
}

/* Take the lock beside the socket (so two daemons started at once cannot
 * both bind), then refuse a path that is not a stale socket: a live daemon's
 * socket (libzmq would silently unlink it), a regular file or anything else
 * (never deleted). A stale socket is removed. */
static int claim_socket_path(struct daemon *d, char *why, size_t len)
{
	const char *path = d->cfg.socket_path;
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct stat st;
	int fd, r;

	if (strlen(path) >= sizeof(sa.sun_path)) {
		snprintf(why, len, "socket path %s is too long", path);
		return -ENAMETOOLONG;
	}
	r = lockfile_take(path, &d->lockfd, why, len);
	if (r == -EWOULDBLOCK) {
		snprintf(why, len,
			 "socket %s: another zerod is serving it (it holds its lock file)", path);
		return -EADDRINUSE;
	}
	if (r < 0)
		return r;
	if (d->listen_fd >= 0)
		return 0; /* systemd's socket (socket activation): it stays as it is */
	if (lstat(path, &st) < 0) {
		if (errno == ENOENT)
			return 0;
		r = -errno;
		snprintf(why, len, "socket %s: %s", path, strerror(-r));
		return r;
	}
	if (!S_ISSOCK(st.st_mode)) {
		snprintf(why, len,
			 "socket %s: the path exists and is not a socket; not replacing it", path);
		return -EEXIST;
	}
	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		r = -errno;
		snprintf(why, len, "socket: %s", strerror(-r));
		return r;
	}
	r = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ? -errno : 0;
	close(fd);
	if (r == 0) {
		snprintf(why, len, "socket %s: a process that does not hold the lock serves it",
			 path);
		return -EADDRINUSE;
	}
	if (r != -ECONNREFUSED) {
		snprintf(why, len, "socket %s: %s", path, strerror(-r));
		return r;
	}
	unlink(path); /* stale: nobody listens */
	return 0;
}

static int open_router(struct daemon *d, char *why, size_t len)
{
	char endpoint[sizeof(((struct sockaddr_un *)0)->sun_path) + 8];
	int one = 1, zero = 0, hwm = ZEROD_QUEUE_MSGS, rcvhwm = ZEROD_RECV_QUEUE_MSGS;
	int hs = d->cfg.hello_timeout_ms;
	mode_t old_mask;
	int64_t maxmsg = ZEROD_MAX_MSG_BYTES;
	struct stat st;
	int r;

	r = claim_socket_path(d, why, len);
	if (r < 0)
		return r;
	d->edge.router = zmq_socket(d->edge.zctx, ZMQ_ROUTER);
	if (!d->edge.router) {
		r = -zmq_errno();
		snprintf(why, len, "ROUTER socket: %s", zmq_strerror(-r));
		return r;
	}
	/* No silently dropped completions: a send to a gone peer fails. A peer
	 * that never completes the ZeroMQ handshake goes like one that never
	 * says Hello. */
	if (zmq_setsockopt(d->edge.router, ZMQ_ROUTER_MANDATORY, &one, sizeof(one)) < 0 ||
	    zmq_setsockopt(d->edge.router, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg)) < 0 ||
	    zmq_setsockopt(d->edge.router, ZMQ_SNDHWM, &hwm, sizeof(hwm)) < 0 ||
	    zmq_setsockopt(d->edge.router, ZMQ_RCVHWM, &rcvhwm, sizeof(rcvhwm)) < 0 ||
	    zmq_setsockopt(d->edge.router, ZMQ_HANDSHAKE_IVL, &hs, sizeof(hs)) < 0 ||
	    zmq_setsockopt(d->edge.router, ZMQ_LINGER, &zero, sizeof(zero)) < 0) {
		r = -zmq_errno();
		snprintf(why, len, "ROUTER socket options: %s", zmq_strerror(-r));
		return r;
	}
	/* socket activation: ZeroMQ takes systemd's listening socket, whose
	 * file is systemd's (never unlinked here) */
	if (d->listen_fd >= 0 &&
	    zmq_setsockopt(d->edge.router, ZMQ_USE_FD, &d->listen_fd, sizeof(d->listen_fd)) < 0) {
		r = -zmq_errno();
		snprintf(why, len, "ROUTER socket: adopting systemd's socket: %s",
			 zmq_strerror(-r));
		return r;
	}
	snprintf(endpoint, sizeof(endpoint), "ipc://%s", d->cfg.socket_path);
	/* the socket file is born 0660 (zmq_bind creates it on this thread):
	 * no moment with the umask's mode, and clients that see it may use it */
	old_mask = umask(0117);
	r = zmq_bind(d->edge.router, endpoint);
	umask(old_mask);
	if (r < 0) {
		r = -zmq_errno();
		snprintf(why, len, "bind %s: %s", endpoint, zmq_strerror(-r));
		return r;
	}
	if (d->listen_fd < 0 && lstat(d->cfg.socket_path, &st) == 0) {
		d->bound = true;
		d->sock_dev = st.st_dev;
		d->sock_ino = st.st_ino;
	}
	r = conn_open_monitor(&d->edge);
	if (r < 0)
		snprintf(why, len, "ROUTER monitor: %s", zmq_strerror(-r));
	return r;
}

/* The soft fd limit goes up to the hard one (systemd's services start with
 * 1024): libzmq aborts the daemon when an accept() finds none left. */
static void raise_nofile(struct daemon *d)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return;
	if (rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
			getrlimit(RLIMIT_NOFILE, &rl);
	}
	d->nofile = rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > (1u << 30)
			    ? 1u << 30
			    : (unsigned)rl.rlim_cur;
}

static unsigned count_open_fds(void)
{
	DIR *dir = opendir("/proc/self/fd");
	struct dirent *e;
	unsigned n = 0;

	if (!dir)
		return 64; /* a guess on the safe side */
	while ((e = readdir(dir)))
		if (e->d_name[0] != '.')
			n++;
	closedir(dir);
	return n - 1; /* the directory's own fd */
}

/*
 * What the fds left after start-up allow. Each session holds two (its
 * connection and its pidfd); a quarter of what is left stays free for
 * connections libzmq accepted before the loop heard of them (the monitor
 * shuts down those over the limit); connections without a session may take
 * what sessions leave, up to twice their number.
 */
static int fd_limits(struct daemon *d, char *why, size_t len)
{
	unsigned used = count_open_fds();
	unsigned budget = d->nofile > used + FD_RESERVE ? d->nofile - used - FD_RESERVE : 0;
	unsigned usable = budget - budget / 4, fit = usable / 2;
	unsigned want = d->cfg.max_sessions ? d->cfg.max_sessions : 1;

	if (want > fit) {
		snprintf(why, len,
			 "--max-sessions %u needs %u file descriptors (a connection and a pidfd "
			 "each), RLIMIT_NOFILE %u leaves room for %u sessions: raise the limit "
			 "(LimitNOFILE=) or lower --max-sessions",
			 want, 2 * want, d->nofile, fit);
		return -EMFILE;
	}
	if (!d->cfg.max_sessions) {
		d->cfg.max_sessions = MIN(SESSIONS_DEFAULT, fit);
		if (d->cfg.max_sessions < SESSIONS_DEFAULT)
			log_notice("RLIMIT_NOFILE %u allows %u sessions (--max-sessions)",
				   d->nofile, d->cfg.max_sessions);
	}
	d->edge.conn_limit = MIN(usable - d->cfg.max_sessions, 2 * d->cfg.max_sessions + 64);
	return 0;
}

static int open_fds(struct daemon *d, char *why, size_t len)
{
	sigset_t mask;

	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGUSR1);
	sigaddset(&mask, SIGHUP);
	/* blocked in every thread: workers are created after this */
	pthread_sigmask(SIG_BLOCK, &mask, NULL);
	signal(SIGPIPE, SIG_IGN);
	d->sigfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
	if (d->sigfd < 0) {
		snprintf(why, len, "signalfd: %s", strerror(errno));
		return -errno;
	}
	return 0;
}

static void daemon_close(struct daemon *d)
{
	/* executors are stopped (or the deadline passed: then stop them now) */
	for (struct job *j = d->core.jobs; j; j = j->next)
		if (j->exec_running)
			exec_stop(j->exec);
	session_free_all(&d->edge);
	fastpath_unlisten(&d->edge);
	job_free_all(&d->core); /* joins executors, unmaps buffers */
	ops_close(&d->ops);    /* completes a trace, closes the control socket */
	rdzv_close_all(&d->core);
	if (d->edge.router) {
		/* the jobs' last errors (ZC_ESHUTDOWN) may still be queued: give
		 * them a moment to leave, then drop what a stuck peer never read */
		int linger = 1000;
		conn_close_all(&d->edge);
		zmq_setsockopt(d->edge.router, ZMQ_LINGER, &linger, sizeof(linger));
		zmq_close(d->edge.router);
		/* only a socket this process bound: never a winner's */
		if (socket_is_ours(d))
			unlink(d->cfg.socket_path);
	}
	if (d->edge.zctx)
		zmq_ctx_term(d->edge.zctx);
	pool_free(d->core.pool);
	completion_queue_free(d->core.cq);
	loop_timer_free(d->timer);
	loop_free(d->core.loop);
	if (d->sigfd >= 0)
		close(d->sigfd);
	lockfile_release(d->cfg.socket_path, d->lockfd); /* a zerod after it takes a new one */
}

/* daemon_run's setup, in its order: the fds, the log thread, the pool,
 * the loop, ZeroMQ, the limits, the router, the operator's side, the fast
 * path, the rendezvous with its TLS identity, and the loop's sources. why:
 * what failed, for the caller's log. */
static int daemon_setup(struct daemon *d, const struct daemon_config *cfg, char *why, size_t len)
{
	struct tls_ident *id = NULL; /* TLS, until the rendezvous takes it */
	int r;

	/* first: signals are blocked in every thread created after it */
	r = open_fds(d, why, len);
	if (r < 0)
		goto out;
	r = log_start();
	if (r < 0) {
		snprintf(why, len, "log thread: %s", strerror(-r));
		goto out;
	}
	if ((r = pool_catch_faults()) < 0 || (r = pool_new(cfg->workers, &d->core.pool)) < 0 ||
	    (r = completion_queue_new(&d->core.cq)) < 0 || (r = loop_new(&d->core.loop)) < 0 ||
	    (r = loop_timer_new(d->core.loop, on_timer, d, &d->timer)) < 0) {
		snprintf(why, len, "setting up: %s", zc_strerror(r));
		goto out;
	}
	d->edge.zctx = zmq_ctx_new();
	if (!d->edge.zctx) {
		r = -zmq_errno();
		snprintf(why, len, "ZeroMQ context: %s", zmq_strerror(-r));
		goto out;
	}
	/* before the socket exists: a daemon that cannot serve must never be
	 * seen serving (the router's own few fds are in FD_RESERVE) */
	r = fd_limits(d, why, len);
	if (r < 0)
		goto out;
	r = tls_ident_load(cfg->tls_key, cfg->tls_cert, cfg->tls_peers, cfg->tls_ca, &id, why, len);
	if (r < 0)
		goto out;
	/* the rendezvous (its TLS contexts, its resolver's eventfd) before any
	 * socket: once zeroctl can reach this zerod, all of it is there */
	r = rdzv_init(&d->core);
	if (r < 0) {
		snprintf(why, len, "rendezvous: %s", zc_strerror(r));
		goto out;
	}
	if (id) {
		r = rdzv_tls_use(&d->core, id, why, len);
		if (r < 0)
			goto out;
		id = NULL;
	}
	if (rdzv_tls_fingerprint(&d->core))
		log_notice("between daemons: TLS 1.3 with certificates (the rendezvous, its store "
			   "and the host tensors): this zerod's certificate is SHA-256 %s",
			   rdzv_tls_fingerprint(&d->core));
	else
		log_info("between daemons: TLS 1.3 under each job's secret (no --tls-key); host "
			 "tensors on gloo's plain TCP");
	r = open_router(d, why, len);
	if (r < 0)
		goto out;
	/* the fast path's socket before the control socket: once zeroctl can
	 * reach this zerod, every socket a trainer uses is there (a test that
	 * waited for the control socket once found no sock.fd yet to chown) */
	r = fastpath_listen(&d->edge, why, len);
	if (r < 0)
		goto out;
	d->ops.zctx = d->edge.zctx;
	d->ops.listen_fd = d->listen_fd;
	r = ops_open(&d->ops, cfg, why, len);
	if (r < 0)
		goto out;
	if ((r = loop_add_zsock(d->core.loop, d->edge.router, on_router, d)) < 0 ||
	    (r = loop_add_fd(d->core.loop, completion_queue_fd(d->core.cq), on_completions, d)) <
		    0 ||
	    (r = loop_add_fd(d->core.loop, d->sigfd, on_signal, d)) < 0) {
		snprintf(why, len, "event loop: %s", zc_strerror(r));
		goto out;
	}
	loop_set_prepare(d->core.loop, before_sleep, d);
	r = 0;
out:
	tls_ident_free(id);
	return r;
}

/* What a serving zerod says once: its limits, its config file, its
 * socket's origin. */
static void log_serving(const struct daemon *d, const struct daemon_config *cfg)
{
	char size[16];

	log_notice("zerod %s: serving %s (backends: %s; mem %s; %u workers; "
		   "%s for optimizer state; %u sessions, %u connections, RLIMIT_NOFILE %u)",
		   ZEROD_VERSION_STRING, cfg->socket_path, d->core.cuda ? "cuda, host" : "host",
		   d->core.mem->name, pool_threads(d->core.pool),
		   fmt_bytes(size, d->cfg.max_memory), d->cfg.max_sessions, d->edge.conn_limit,
		   d->nofile);
	/* a config file put where zerod does not look is never silently ignored */
	if (cfg->src && config_src_path(cfg->src)[0])
		log_notice("zerod: config file %s", config_src_path(cfg->src));
	else if (cfg->src)
		log_notice("zerod: no config file (%s does not exist): defaults and flags",
			   config_src_file(cfg->src));
	if (d->listen_fd >= 0)
		log_notice("the trainers' socket %s came from systemd (socket activation)",
			   cfg->socket_path);
}

int daemon_run(const struct daemon_config *cfg)
{
	struct daemon d = {.cfg = *cfg, .sigfd = -1, .lockfd = -1, .listen_fd = -1};
	char why[512] = "";
	int r;

	if (!d.cfg.max_memory)
		d.cfg.max_memory =
			(uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGE_SIZE) / 2;
	/* the modules, lowest first; each upper one registers downward: the
	 * edge answers for the core (its sink), ops/ listens to it (hooks) */
	d.core.cfg = &d.cfg;
	d.core.mem = &mem_shm_ops;
	d.core.sink = &session_sink;
	d.core.hooks = &ops_hooks;
	d.core.hooks_ctx = &d.ops;
	d.edge.cfg = &d.cfg;
	d.edge.core = &d.core;
	d.ops = (struct ops_env){.cfg = &d.cfg,
				 .core = &d.core,
				 .listen_fd = -1,
				 .nsessions = &d.edge.nsessions,
				 .nconns = &d.edge.nconns,
				 .stopping = &d.edge.stopping};
	log_max_level = cfg->log_level;
	raise_nofile(&d);
	/* before any thread: it unsets LISTEN_FDS */
	d.listen_fd = ops_listen_fd(cfg->socket_path);
	/* may load the CUDA driver: once, before anything is served */
	r = backend_choose(cfg->backend ? cfg->backend : "auto", &d.core.cuda, why, sizeof(why));
	if (r < 0)
		goto out;
	log_info("zerod: backends: %s", why);
	snprintf(d.core.backend_why, sizeof(d.core.backend_why), "%s", why);

	r = daemon_setup(&d, cfg, why, sizeof(why));
	if (r < 0)
		goto out;
	log_serving(&d, cfg);
	ops_ready(&d.ops);
	r = loop_run(d.core.loop);
	if (r < 0)
		snprintf(why, sizeof(why), "event loop: %s", strerror(-r));
	/* a clean end (its ranks left after an iteration) sends no error */
	log_notice("zerod: served %" PRIu64 " job%s (%" PRIu64 " failed): %" PRIu64
		   " iterations, %" PRIu64 " buckets reduced, %" PRIu64 " errors sent",
		   d.core.stats.jobs, d.core.stats.jobs == 1 ? "" : "s", d.core.stats.jobs_failed,
		   d.core.stats.iterations, d.core.stats.buckets, d.core.stats.errors_sent);
out:
	if (r < 0)
		log_err("zerod: %s", why[0] ? why : zc_strerror(r));
	daemon_close(&d);
	log_stop(1000);
	return r;
}
