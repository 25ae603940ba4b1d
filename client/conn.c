/*
 * conn.c — a client's connection to its node's zerod: zc_connect() (the
 * checks of the socket before ZeroMQ is asked, the job's settings over
 * several nodes, the Hello) and zc_close(), which ends the session and frees
 * everything the client owns.
 *
 * Owns: the client object's lifetime. Runs on the caller's thread.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <zmq.h>

#include "abi.h"
#include "bufs.h"
#include "devbufs.h"
#include "common.h"
#include "fastpath.h"
#include "internal.h"
/* zeroclient.h's rounding of bf16/fp16, the daemon's own (header only):
 * zc_set_state() rounds a given master into the parameters */
#include "lowp.h"
#include "plan.h"
#include "wire.h"
#include "zeroclient.h"
#include "client.h"

#define DEFAULT_CONNECT_TIMEOUT_MS 30000

/* ----------------------------------------------------------- connect --- */

static const char *default_socket(char *buf, size_t len)
{
	const char *s = getenv("ZEROD_SOCKET");

	if (s && *s)
		return s;
	s = getenv("XDG_RUNTIME_DIR");
	if (s && *s) {
		snprintf(buf, len, "%s/zerod/zerod.sock", s);
		if (access(buf, F_OK) == 0)
			return buf;
	}
	return "/run/zerod/zerod.sock";
}

/* what the trainer's error says to do (err_msg holds 256 bytes) */
#define HOW_TO_START     "start zerod (zerod --socket PATH) or set ZEROD_SOCKET to its socket"
#define PROBE_REFUSED_MS 200 /* a zerod between its bind() and listen() */

/* What is at path, told at once: ZeroMQ would retry a missing socket, a
 * refused connect or a peer that is no ZeroMQ socket until the connect
 * timeout and say only that no zerod answered. A plain connection sends
 * ZMTP's signature (0xff, 8 bytes, 0x7f) and reads the peer's: libzmq sends
 * its own at once, so anything else (an answer that is not one, an end of
 * file) is a socket that is not zerod's. zerod's libzmq takes the probe
 * for a peer whose handshake broke off, as it takes any. */
static int probe_socket(const char *path, int timeout_ms)
{
	static const uint8_t sig[10] = {0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f};
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = timeout_ms % 1000 * 1000};
	int64_t deadline = now_ms() + timeout_ms, refused_until = now_ms() + PROBE_REFUSED_MS;
	uint8_t got[10];
	size_t have = 0;
	struct stat st;
	int fd, r = 0;

	if (stat(path, &st) < 0)
		return client_err_set(ZC_ECONNECT, "no zerod socket at %.180s (%s): " HOW_TO_START,
				      path, strerror(errno));
	if (S_ISDIR(st.st_mode))
		return client_err_set(ZC_ECONNECT,
				      "%.180s is a directory, not zerod's socket: " HOW_TO_START,
				      path);
	if (!S_ISSOCK(st.st_mode))
		return client_err_set(
			ZC_ECONNECT, "%.180s is not a socket, so not zerod's: " HOW_TO_START, path);
	if (strlen(path) >= sizeof(sa.sun_path))
		return 0; /* ZeroMQ says what it makes of it */
	memcpy(sa.sun_path, path, strlen(path) + 1);
	for (;;) {
		fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0)
			return 0; /* no fd for a probe: ZeroMQ's connect will say */
		setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
		if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
			break;
		r = errno;
		close(fd);
		if (r != ECONNREFUSED || now_ms() >= refused_until)
			break;
		poll(NULL, 0, 20);
	}
	if (r == ECONNREFUSED)
		return client_err_set(ZC_ECONNECT,
				      "nothing listens on %.180s (a socket left by a zerod that "
				      "exited?): " HOW_TO_START,
				      path);
	if (r)
		return 0; /* EACCES, EAGAIN...: ZeroMQ's connect and the Hello say */
	if (send(fd, sig, sizeof(sig), MSG_NOSIGNAL) != (ssize_t)sizeof(sig))
		goto not_zerod;
	while (have < sizeof(got)) {
		struct pollfd pfd = {.fd = fd, .events = POLLIN};
		int64_t left = deadline - now_ms();
		ssize_t n;

		if (left <= 0 || poll(&pfd, 1, (int)left) == 0) {
			close(fd);
			return client_err_set(
				ZC_ECONNECT,
				"%.180s accepted a connection but sent no ZeroMQ greeting "
				"within %d ms: not zerod's socket? " HOW_TO_START,
				path, timeout_ms);
		}
		n = recv(fd, got + have, sizeof(got) - have, MSG_DONTWAIT);
		if (n < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (n <= 0)
			break;
		have += (size_t)n;
	}
	if (have == sizeof(got) && got[0] == 0xff && (got[9] & 1)) {
		close(fd);
		return 0;
	}
not_zerod:
	close(fd);
	return client_err_set(
		ZC_ECONNECT,
		"%.180s is a socket that does not speak ZeroMQ, not zerod's: " HOW_TO_START, path);
}

/* A job over several nodes: the settings the Hello carries. */
struct multinode {
	const char *rdzv; /* NULL: one node */
	uint32_t nnodes;
	bool has_node_rank;
	uint32_t node_rank;
	const char *secret;
};

#define RDZV_MAX_LEN   255
#define SECRET_MAX_LEN 256

static int env_u32(const char *name, bool *ret_set, uint32_t *ret)
{
	const char *v = getenv(name);
	char *end;
	unsigned long n;

	*ret_set = v && *v;
	if (!*ret_set)
		return 0;
	errno = 0;
	n = strtoul(v, &end, 10);
	if (errno || *end || n > UINT32_MAX || *v == '-')
		return -EINVAL;
	*ret = (uint32_t)n;
	return 0;
}

/* cfg's fields, else the environment's (ZEROD_RDZV, ZEROD_NNODES,
 * ZEROD_NODE_RANK, ZEROD_JOB_SECRET), checked. -EINVAL with err filled. */
static int multinode_settings(const struct zc_config *cfg, struct multinode *ret, char *err,
			      size_t errlen)
{
	struct multinode m = {.rdzv = cfg->rdzv ? cfg->rdzv : getenv("ZEROD_RDZV")};
	const char *colon;
	bool set;
	char *end;
	unsigned long port;

	if (!m.rdzv || !*m.rdzv) {
		*ret = (struct multinode){0};
		return 0;
	}
	colon = strrchr(m.rdzv, ':');
	port = colon ? strtoul(colon + 1, &end, 10) : 0;
	if (strlen(m.rdzv) > RDZV_MAX_LEN || !colon || colon == m.rdzv || !colon[1] || *end ||
	    port == 0 || port > 65535) {
		snprintf(err, errlen, "rendezvous \"%.64s\": want host:port (port 1..65535)",
			 m.rdzv);
		return -EINVAL;
	}
	m.nnodes = cfg->nnodes;
	if (!m.nnodes && (env_u32("ZEROD_NNODES", &set, &m.nnodes) < 0 || !set)) {
		snprintf(err, errlen,
			 "a rendezvous is named but not the number of nodes "
			 "(zc_config.nnodes or ZEROD_NNODES)");
		return -EINVAL;
	}
	if (m.nnodes == 0 || m.nnodes > cfg->world_size) {
		snprintf(err, errlen, "%u nodes for %u ranks: need 1 <= nnodes <= world size",
			 m.nnodes, cfg->world_size);
		return -EINVAL;
	}
	m.has_node_rank = cfg->has_node_rank != 0;
	m.node_rank = cfg->node_rank;
	if (!m.has_node_rank && env_u32("ZEROD_NODE_RANK", &m.has_node_rank, &m.node_rank) < 0) {
		snprintf(err, errlen, "ZEROD_NODE_RANK is not a number");
		return -EINVAL;
	}
	if (m.has_node_rank && m.node_rank >= m.nnodes) {
		snprintf(err, errlen, "node rank %u of %u nodes", m.node_rank, m.nnodes);
		return -EINVAL;
	}
	m.secret = cfg->job_secret ? cfg->job_secret : getenv("ZEROD_JOB_SECRET");
	if (!m.secret || !*m.secret || strlen(m.secret) > SECRET_MAX_LEN) {
		snprintf(err, errlen,
			 "a job over several nodes needs a secret of 1..%d bytes "
			 "(zc_config.job_secret or ZEROD_JOB_SECRET)",
			 SECRET_MAX_LEN);
		return -EINVAL;
	}
	*ret = m;
	return 0;
}

/* Watch a ZeroMQ socket's ZMQ_FD in the client's epoll fd. */
static int epoll_add_zsock(int efd, void *zsock)
{
	struct epoll_event ev = {.events = EPOLLIN};
	size_t len = sizeof(int);
	int fd;

	if (zmq_getsockopt(zsock, ZMQ_FD, &fd, &len) < 0)
		return -zmq_errno();
	ev.data.fd = fd;
	return epoll_ctl(efd, EPOLL_CTL_ADD, fd, &ev) < 0 ? -errno : 0;
}

static int monitor_open(zc_client *c)
{
	char ep[64];

	c->conn.efd = epoll_create1(EPOLL_CLOEXEC);
	if (c->conn.efd < 0)
		return -errno;
	snprintf(ep, sizeof(ep), "inproc://zeroclient-monitor-%p", (void *)c);
	if (zmq_socket_monitor(c->conn.sock, ep, ZMQ_EVENT_DISCONNECTED) < 0)
		return -zmq_errno();
	c->conn.mon = zmq_socket(c->conn.zctx, ZMQ_PAIR);
	if (!c->conn.mon || zmq_connect(c->conn.mon, ep) < 0)
		return -zmq_errno();
	return epoll_add_zsock(c->conn.efd, c->conn.mon);
}

/* ZeroMQ's errors, converted once: -errno, and the option in the reason. */
static int zopt(void *sock, int opt, const char *name, const void *val, size_t len)
{
	int e;

	if (zmq_setsockopt(sock, opt, val, len) == 0)
		return 0;
	e = zmq_errno();
	return client_err_set(-e, "zc_connect: zmq_setsockopt(%s): %s", name, zmq_strerror(e));
}
#define ZOPT(sock, opt, val) zopt((sock), (opt), #opt, &(val), sizeof(val))

/* zc_connect()'s checks of the caller's config (a copy, in *cfg), and the
 * job's settings over several nodes into *mn: 0, or the error recorded. */
static int connect_config(const struct zc_config *ucfg, struct zc_config *cfg, struct multinode *mn)
{
	char mnerr[200];
	int r;

	r = structs_config_from_zc(ucfg, cfg);
	if (r < 0)
		return r;
	if (!job_id_valid(cfg->job_id))
		return client_err_set(-EINVAL,
				      "zc_connect: job_id must be 1..%d characters of "
				      "[A-Za-z0-9._-]",
				      ZEROD_JOB_ID_MAX);
	if (cfg->world_size == 0 || cfg->rank >= cfg->world_size || cfg->local_size == 0 ||
	    cfg->local_rank >= cfg->local_size)
		return client_err_set(
			-EINVAL,
			"zc_connect: rank %u of world_size %u, local_rank %u of local_size %u",
			cfg->rank, cfg->world_size, cfg->local_rank, cfg->local_size);
	if (cfg->connect_timeout_ms < 0 || cfg->register_timeout_ms < 0)
		return client_err_set(-EINVAL, "zc_connect: a negative timeout");
	r = fork_watch();
	if (r < 0)
		return client_err_set(r, "zc_connect: pthread_atfork: %s", strerror(-r));
	r = multinode_settings(cfg, mn, mnerr, sizeof(mnerr));
	if (r < 0)
		return client_err_set(r, "zc_connect: %s", mnerr);
	return 0;
}

/* A client of cfg (checked), not connected yet; NULL: out of memory. */
static zc_client *client_new(const struct zc_config *cfg)
{
	zc_client *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	pthread_mutex_init(&c->mu, NULL);
	c->forks = fork_count();
	c->pid = getpid();
	c->conn.efd = -1;
	c->replan.fd = -1;
	c->replan.pfd = -1;
	c->share_fd = -1;
	for (unsigned i = 0; i < STEP_RECS; i++)
		c->it.step_recs[i].iteration = UINT64_MAX;
	c->cfg = *cfg;
	snprintf(c->job_id, sizeof(c->job_id), "%s", cfg->job_id);
	c->cfg.job_id = c->job_id;
	c->cfg.socket = NULL;
	c->cfg.connect_timeout_ms =
		cfg->connect_timeout_ms ? cfg->connect_timeout_ms : DEFAULT_CONNECT_TIMEOUT_MS;
	return c;
}

/* c's DEALER socket connected to zerod's socket at path, with its monitor,
 * both in c->conn.efd: 0, or the error recorded. */
static int socket_open(zc_client *c, const char *path)
{
	int zero = 0, hwm = ZEROD_QUEUE_MSGS, r, timeout = c->cfg.connect_timeout_ms;
	int64_t maxmsg = ZEROD_MAX_MSG_BYTES;
	char endpoint[600];

	snprintf(endpoint, sizeof(endpoint), "ipc://%s", path);
	/* ZeroMQ retries a refused connect until the timeout; a socket this
	 * user may not use (connecting needs write permission on it) is told
	 * at once, and so is one that is missing, where nothing listens, or
	 * that is not zerod's (probe_socket). */
	if (faccessat(AT_FDCWD, path, W_OK, AT_EACCESS) < 0 && (errno == EACCES || errno == EPERM))
		return client_err_set(
			-EACCES,
			"no permission to use the socket %.180s (its mode or group, or a "
			"directory above it)",
			path);
	r = probe_socket(path, timeout);
	if (r < 0)
		return r;
	if ((size_t)snprintf(c->conn.fp_mine, sizeof(c->conn.fp_mine), "%s.fd", path) >=
	    sizeof(c->conn.fp_mine))
		c->conn.fp_mine[0] = 0;
	c->conn.zctx = zmq_ctx_new();
	if (!c->conn.zctx)
		return client_err_set(-ENOMEM, "zc_connect: zmq_ctx_new failed");
	c->conn.sock = zmq_socket(c->conn.zctx, ZMQ_DEALER);
	if (!c->conn.sock)
		return client_err_set(-zmq_errno(), "zc_connect: zmq_socket: %s",
				      zmq_strerror(zmq_errno()));
	if ((r = ZOPT(c->conn.sock, ZMQ_LINGER, zero)) < 0 ||
	    (r = ZOPT(c->conn.sock, ZMQ_MAXMSGSIZE, maxmsg)) < 0 ||
	    (r = ZOPT(c->conn.sock, ZMQ_SNDHWM, hwm)) < 0 ||
	    (r = ZOPT(c->conn.sock, ZMQ_RCVHWM, hwm)) < 0)
		return r;
	r = monitor_open(c);
	if (r < 0)
		return client_err_set(r, "zc_connect: the socket's monitor: %s", zc_strerror(r));
	if (zmq_connect(c->conn.sock, endpoint) < 0)
		return client_err_set(ZC_ECONNECT, "zc_connect: %.180s: %s", endpoint,
				      zmq_strerror(zmq_errno()));
	r = epoll_add_zsock(c->conn.efd, c->conn.sock);
	if (r < 0)
		return client_err_set(r, "zc_connect: epoll: %s", zc_strerror(r));
	return 0;
}

/* The Hello, and zerod's answer (HelloOk) within the connect timeout: 0, or
 * the error recorded. */
static int hello(zc_client *c, const struct multinode *mn, const char *path)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__Hello h = ZEROD__V1__HELLO__INIT;
	int r, timeout = c->cfg.connect_timeout_ms;

	h.protocol_version = ZC_PROTOCOL_VERSION;
	h.job_id = c->job_id;
	h.rank = c->cfg.rank;
	h.world_size = c->cfg.world_size;
	h.local_rank = c->cfg.local_rank;
	h.local_size = c->cfg.local_size;
	h.pid = getpid();
	if (mn->rdzv) {
		h.rdzv = (char *)mn->rdzv;
		h.has_nnodes = 1;
		h.nnodes = mn->nnodes;
		h.has_node_rank = mn->has_node_rank;
		h.node_rank = mn->node_rank;
		h.has_job_secret = 1;
		h.job_secret.data = (uint8_t *)mn->secret;
		h.job_secret.len = strlen(mn->secret);
	}
	env.body_case = ZEROD__V1__ENVELOPE__BODY_HELLO;
	env.hello = &h;
	r = client_send_env(c, &env, NULL);
	if (r < 0)
		return client_err_set(r, "zc_connect: sending Hello: %s", zc_strerror(r));
	r = client_wait_for(c, &c->hello_result, NULL, now_ms() + timeout);
	if (r == 0)
		return client_err_set(
			ZC_ECONNECT,
			"no zerod answered on %.180s within %d ms (something listens there: "
			"not zerod's socket, or a zerod that hangs?)",
			path, timeout);
	if (r < 0)
		return client_err_set(r, "%s", c->answer_msg);
	return 0;
}

int zc_connect(const struct zc_config *ucfg, zc_client **ret_client)
{
	char pathbuf[512];
	struct zc_config cfg;
	const char *path;
	struct multinode mn = {0};
	zc_client *c;
	int r;

	if (!ret_client)
		return client_err_set(-EINVAL, "zc_connect: ret_client is NULL");
	r = connect_config(ucfg, &cfg, &mn);
	if (r < 0)
		return r;
	c = client_new(&cfg);
	if (!c)
		return client_err_set(-ENOMEM, NULL);
	path = cfg.socket ? cfg.socket : default_socket(pathbuf, sizeof(pathbuf));
	r = socket_open(c, path);
	if (r < 0)
		goto fail;
	r = hello(c, &mn, path);
	if (r < 0)
		goto fail;
	/* Waits for the other ranks (zc_register_plan...) last longer than
	 * the daemon's own clock, which fails them naming the ranks missing:
	 * its stall timeout runs from the last progress, so twice it. */
	if (!c->cfg.register_timeout_ms)
		c->cfg.register_timeout_ms = (int)MIN(
			(int64_t)c->cfg.connect_timeout_ms + 2 * (int64_t)c->stall_ms, INT32_MAX);
	*ret_client = c;
	return 0;
fail:
	zc_close(c);
	return r;
}

void zc_close(zc_client *c)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__Goodbye bye = ZEROD__V1__GOODBYE__INIT;

	int linger = 200;

	/* a child's copy: the session, its sockets and its lock are the
	 * parent's (the lock may even be held by a thread the child lacks) */
	if (!c || client_forked(c->forks))
		return;
	/* a checkpoint still being written is finished first, and how it
	 * ended said to zerod */
	ckpt_writer_drain(c->ckpt.writer);
	pthread_mutex_lock(&c->mu);
	client_ckpt_report_locked(c);
	pthread_mutex_unlock(&c->mu);
	ckpt_writer_close(&c->ckpt.writer);
	free(c->ckpt.ranges);
	c->ckpt.ranges = NULL;
	free(c->ckpt.prev);
	c->ckpt.prev = NULL;
	/* The goodbye needs a linger to leave before the socket goes; without
	 * one it is not sent, and zerod ends the session when the connection
	 * closes, as for a trainer that died. */
	if (c->conn.sock && c->hello_result == 1 &&
	    zmq_setsockopt(c->conn.sock, ZMQ_LINGER, &linger, sizeof(linger)) == 0) {
		env.body_case = ZEROD__V1__ENVELOPE__BODY_GOODBYE;
		env.goodbye = &bye;
		(void)client_send_env(c, &env, NULL);
	}
	pthread_mutex_lock(&c->mu);
	while (c->futures) {
		struct zc_future *f = c->futures;
		future_settle(f, ZC_ESTATE, "the client was closed");
		future_unlink(f);
		f->c = NULL;
	}
	pthread_mutex_unlock(&c->mu);
	/* the callbacks of the futures failed here (and any still due) */
	client_run_callbacks(c);
	if (c->conn.mon) {
		zmq_socket_monitor(c->conn.sock, NULL, 0);
		zmq_close(c->conn.mon);
	}
	if (c->conn.efd >= 0)
		close(c->conn.efd);
	if (c->share_fd >= 0)
		close(c->share_fd);
	fpc_free(c->conn.fp);
	if (c->conn.sock)
		zmq_close(c->conn.sock);
	if (c->conn.zctx)
		zmq_ctx_term(c->conn.zctx);
	client_buf_release(&c->grad);
	client_buf_release(&c->param);
	/* zerod may still use the exported events while it tears the job
	 * down after the goodbye, which nothing answers (the re-plan path
	 * frees them once zerod answered that it closed them) */
	if (c->hello_result == 1) {
		devbufs_keep_events(c->dev);
		devbufs_keep_events(c->replan.old_dev);
	} else {
		devbufs_free(c->dev);
		devbufs_free(c->replan.old_dev);
	}
	client_buf_release(&c->replan.old_grad);
	client_buf_release(&c->replan.old_param);
	plan_free(c->replan.old_plan);
	free(c->replan.map);
	if (c->replan.fd >= 0)
		close(c->replan.fd);
	if (c->replan.pfd >= 0)
		close(c->replan.pfd);
	plan_free(c->plan);
	free(c->ckpt.due_dir);
	pthread_mutex_destroy(&c->mu);
	free(c);
}
