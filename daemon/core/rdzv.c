/*
 * rdzv.c — the rendezvous of a job over several nodes, on the loop thread
 * (see rdzv.h). Owns the listening sockets, every daemon-to-daemon TCP
 * connection, the per-job key-value store node 0 serves, and the resolver
 * threads (getaddrinfo may block; the loop must not).
 *
 * Roles. The node that serves the rendezvous is node 0: the one whose
 * trainers say node_rank 0, or, when the trainers leave the numbering to
 * the rendezvous, the one that holds rank 0. It listens on the port the
 * trainers name (one listener per port, shared by the jobs it hosts, a
 * connection finds its job by id). Every other node connects and retries,
 * with a growing pause, until the host answers or its join timeout passes.
 *
 * A connection. Plain TCP, frames of rdzvwire.h, non-blocking both ways
 * (output waits in a buffer for EPOLLOUT). It authenticates first: the
 * joiner's nonce, the host's nonce, the joiner's HMAC over both, the host's
 * HMAC back. Until then a peer may send one small frame at a time, has
 * hello_timeout_ms, and at most RDZV_MAX_UNAUTH such peers are kept; a
 * wrong proof, a frame that is not a message, a message out of turn are
 * refused, logged with the peer's address (at most RDZV_LOG_PER_SEC lines a
 * second) and closed. None of it touches a job.
 *
 * CURVE. With keys (zerod --curve-secret-key, --curve-peers), every
 * connection first runs rdzvcurve.h's handshake (Curve both ways, then the
 * joiner's CurveAuth: both long-term keys proven, each trusted by the other
 * side), and from then on every frame both ways is sealed (on_frame());
 * the handshake above runs inside. A host with keys refuses a plain Hello,
 * one without refuses a Curve, each with a Fail that says which side lacks
 * CURVE; a frame that fails to open closes the connection, named.
 *
 * Forming. A node joins with its world size, node count, node index (if its
 * trainers gave one), its ranks and its plan. Once every node joined, the
 * host checks, in this order: node count, world size, node indices (given
 * ones unique and in range; the others fill the free indices in the order of
 * their lowest rank), the plans (plan_diff: the first differing field), and
 * that every rank is on exactly one node. A failed check fails the job on
 * every node with the same message; else every node gets the numbering, the
 * nodes' addresses (for messages) and a store prefix fresh for this run
 * ("<job>/<random>/"), and starts its executor.
 *
 * After forming. Each node keeps its connection to the host. A job that
 * fails anywhere is reported to the host, which relays it to every node;
 * a quiet end (a rank left between iterations) carries the iteration it
 * ended before, and a node that is still finishing that iteration ends after
 * it. The host tells every node when it loses one's connection. A failed
 * collective waits up to RDZV_BLAME_MS for word of a lost node, so every
 * survivor's error names it. Losing the connection to the host alone does
 * not stop a running job: gloo's mesh does not need the rendezvous; only
 * a new run of the job id, which needs it again, fails (at its join timeout).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <sodium.h>

#include "coll/coll.h"
#include "common.h"
#include "daemon.h"
#include "base/log.h"
#include "base/loop.h"
#include "core/rdzv.h"
#include "net/rdzvcurve.h"
#include "core/rdzvstore.h"
#include "net/rdzvwire.h"
#include "wire.h"

#define RDZV_MAX_UNAUTH   64 /* connections that have not proven a secret */
#define RDZV_RETRY_MIN_MS 50
#define RDZV_RETRY_MAX_MS 1000
#define RDZV_BLAME_MS     1000 /* a failed collective waits this long to learn who went */
#define RDZV_CLOSE_MS     1000 /* flushing a last message before closing */
#define RDZV_READ_CHUNK   (1u << 20)
#define RDZV_OUT_MAX      (64u << 20)
#define RDZV_KV_KEYS      1024
#define RDZV_KV_BYTES     (16u << 20)
#define RDZV_LOG_PER_SEC  20
#define NAME_LEN          64

enum conn_state {
	CS_CONNECTING, /* a node's connect() is in progress */
	CS_CURVE,      /* CURVE: securing the connection (rdzvcurve.h) before the Hello */
	CS_HELLO,      /* host: waits for Hello; node: for Challenge */
	CS_AUTH,       /* host: waits for Auth; node: for Welcome */
	CS_OPEN,       /* authenticated */
	CS_CLOSING,    /* sends what is queued, then closes */
};

struct listener {
	struct rdzv_daemon *rd;
	struct listener *next;
	int fd;
	uint16_t port;
	unsigned refs; /* jobs hosting on it */
	char name[NAME_LEN];
	struct sockaddr_storage addr; /* bound; where this host's own store client connects */
	socklen_t addrlen;
};

struct rconn {
	struct rdzv_daemon *rd;
	struct rconn *next;
	int fd;
	bool server;          /* accepted by a listener (else a node's join) */
	struct listener *lst; /* server: where */
	struct rdzv_job *rj;  /* its job (server: once its Hello named one) */
	enum conn_state st;
	unsigned kind; /* ZEROD__V1__RDZV_KIND__RDZV_JOIN or _STORE */
	bool unauth;   /* counts against RDZV_MAX_UNAUTH */
	bool dead;     /* freed at the next chance, never inside a call that walks conns */
	bool want_out;
	int64_t deadline; /* handshake, or CS_CLOSING's flush */
	char peer[NAME_LEN];
	struct rdzv_sec *sec; /* CURVE: the channel (NULL: plain TCP) */
	uint8_t cn[RDZV_NONCE_BYTES], sn[RDZV_NONCE_BYTES];
	uint8_t *in;
	size_t in_len, in_cap;
	uint8_t *out;
	size_t out_len, out_off;
	/* host: what the node joined with */
	bool joined;
	uint32_t world, nnodes;
	bool has_idx;
	uint32_t idx;
	uint32_t *ranks;
	uint32_t nranks;
	struct plan *plan;
};

struct resolve {
	struct resolve *next;
	struct rdzv_daemon *rd;
	struct rdzv_job *rj; /* NULL once the job went (loop thread only) */
	pthread_t thread;
	bool done; /* under rd->mu */
	char host[RDZV_ENDPOINT_MAX + 1], port[8];
	int err;
	char why[160];
	struct sockaddr_storage addr;
	socklen_t addrlen;
};

struct kv {
	struct kv *next;
	char *key;
	void *value;
	size_t len;
};

struct rdzv_daemon {
	struct daemon *d;
	struct listener *listeners;
	struct rconn *conns;
	unsigned nunauth;
	int efd; /* a resolver finished */
	pthread_mutex_t mu;
	struct resolve *resolving;
	int64_t log_window;
	unsigned log_count, log_dropped;
	struct rdzv_keys *keys; /* CURVE (NULL: plain TCP) */
};

struct rdzv_job {
	struct job *j;
	struct rdzv_daemon *rd;
	char endpoint[RDZV_ENDPOINT_MAX + 1];
	char host[RDZV_ENDPOINT_MAX + 1], port[8];
	uint32_t nnodes;
	bool has_node_rank;
	uint32_t node_rank;
	uint8_t secret[RDZV_SECRET_MAX];
	size_t secret_len;

	struct resolve *res;
	bool resolved;
	struct sockaddr_storage addr; /* the rendezvous */
	socklen_t addrlen;
	bool hosting;
	struct listener *lst;
	bool local_ready;
	int64_t ready_ms;

	/* a node: its connection to the host */
	struct rconn *up;
	int64_t retry_at;
	int retry_ms;
	bool join_sent;
	char last_err[160];

	/* formed */
	bool formed;
	uint32_t node, host_node;
	uint32_t *node_of;        /* [world] */
	char (*names)[NAME_LEN];  /* [nnodes] */
	bool *lost;               /* [nnodes] */
	struct rconn **node_conn; /* host: [nnodes] */
	char prefix[ZEROD_JOB_ID_MAX + 24];
	unsigned run;                           /* re-plans so far */
	char run_prefix[ZEROD_JOB_ID_MAX + 40]; /* the executor's keys since */
	char bind_addr[NAME_LEN];
	struct rdzv_store *store;
	struct coll_store store_ops;
	struct coll_net net;

	/* host: the store */
	struct kv *kv;
	unsigned nkv;
	size_t kv_bytes;

	/* failures */
	bool from_remote; /* the failure being applied came from another node */
	bool blame_pending;
	int64_t blame_deadline;
	char blame_what[256];
	bool end_pending; /* another node ended quietly before iteration end_iter */
	uint64_t end_iter;
	int end_code;
	char end_msg[256];
};

static void conn_free(struct rconn *c);
static void conn_gone(struct rconn *c, const char *why);
static void on_conn(struct loop *l, void *userdata);

/* --------------------------------------------------------- helpers --- */

/* Lines a remote peer causes: at most RDZV_LOG_PER_SEC a second. */
__attribute__((format(printf, 2, 3))) static void peer_log(struct rdzv_daemon *rd, const char *fmt,
							   ...)
{
	int64_t now = now_ms();
	char line[400];
	va_list ap;

	if (now - rd->log_window >= 1000) {
		if (rd->log_dropped)
			log_notice("rendezvous: %u more refusals were not logged", rd->log_dropped);
		rd->log_window = now;
		rd->log_count = 0;
		rd->log_dropped = 0;
	}
	if (rd->log_count >= RDZV_LOG_PER_SEC) {
		rd->log_dropped++;
		return;
	}
	rd->log_count++;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	log_notice("%s", line);
}

static void addr_name(const struct sockaddr_storage *sa, bool with_port, char *buf, size_t len)
{
	char host[INET6_ADDRSTRLEN] = "?";
	unsigned port = 0;

	if (sa->ss_family == AF_INET) {
		const struct sockaddr_in *s4 = (const struct sockaddr_in *)sa;
		inet_ntop(AF_INET, &s4->sin_addr, host, sizeof(host));
		port = ntohs(s4->sin_port);
	} else if (sa->ss_family == AF_INET6) {
		const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)sa;
		inet_ntop(AF_INET6, &s6->sin6_addr, host, sizeof(host));
		port = ntohs(s6->sin6_port);
	}
	if (!with_port)
		snprintf(buf, len, "%s", host);
	else if (sa->ss_family == AF_INET6)
		snprintf(buf, len, "[%s]:%u", host, port);
	else
		snprintf(buf, len, "%s:%u", host, port);
}

static void local_name(int fd, char *buf, size_t len)
{
	struct sockaddr_storage sa;
	socklen_t sl = sizeof(sa);

	if (getsockname(fd, (struct sockaddr *)&sa, &sl) < 0)
		snprintf(buf, len, "?");
	else
		addr_name(&sa, false, buf, len);
}

static const char *node_name(const struct rdzv_job *rj, uint32_t k, char *buf, size_t len)
{
	snprintf(buf, len, "node %u (%s)", k, rj->names ? rj->names[k] : "?");
	return buf;
}

/* How a host names a node that joined: its index if known, its address. */
static const char *joiner_name(const struct rconn *c, char *buf, size_t len)
{
	const struct rdzv_job *rj = c->rj;
	char host[NAME_LEN];

	if (rj && rj->formed) {
		for (uint32_t k = 0; k < rj->nnodes; k++)
			if (rj->node_conn[k] == c)
				return node_name(rj, k, buf, len);
	}
	snprintf(host, sizeof(host), "%s", c->peer);
	if (strrchr(host, ':') && host[0] != '[')
		*strrchr(host, ':') = '\0';
	if (c->joined && c->has_idx)
		snprintf(buf, len, "node %u (%s)", c->idx, host);
	else
		snprintf(buf, len, "the node at %s", host);
	return buf;
}

/* ------------------------------------------------------ connections --- */

static size_t max_frame(const struct rconn *c)
{
	size_t extra = c->sec ? RDZV_CURVE_OVERHEAD : 0;

	return (c->st == CS_OPEN ? ZEROD_MAX_MSG_BYTES : RDZV_UNAUTH_FRAME) + extra;
}

/* Write what is queued; want EPOLLOUT while some is left. Never frees c. */
static void flush(struct rconn *c)
{
	struct loop *l = c->rd->d->loop;

	while (c->out_off < c->out_len && !c->dead) {
		ssize_t w = send(c->fd, c->out + c->out_off, c->out_len - c->out_off,
				 MSG_NOSIGNAL | MSG_DONTWAIT);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0 && errno == EAGAIN)
			break;
		if (w < 0) {
			c->dead = true;
			break;
		}
		c->out_off += (size_t)w;
	}
	if (c->out_off == c->out_len) {
		c->out_off = c->out_len = 0;
		if (c->st == CS_CLOSING)
			c->dead = true;
	}
	if (!c->dead && c->want_out != (c->out_len > 0)) {
		c->want_out = c->out_len > 0;
		loop_want_out(l, c->fd, c->want_out);
	}
}

/* Queue one message, sealed once the connection's CURVE channel is ready
 * (plain: the handshake's own messages, a refusal before it), and write
 * what can be. Never frees c: a connection that cannot take it is marked
 * dead. */
static void conn_send(struct rconn *c, const Zerod__V1__RdzvEnvelope *env)
{
	uint8_t *buf;
	size_t len;
	int r;

	if (c->dead || c->st == CS_CLOSING)
		return;
	if (c->sec && rdzv_sec_ready(c->sec))
		r = rdzv_sec_encode(c->sec, env, &buf, &len);
	else
		r = rdzv_frame_encode(env, &buf, &len);
	if (r < 0) {
		c->dead = true;
		return;
	}
	if (c->out_off) {
		memmove(c->out, c->out + c->out_off, c->out_len - c->out_off);
		c->out_len -= c->out_off;
		c->out_off = 0;
	}
	if (c->out_len + len > RDZV_OUT_MAX) {
		c->dead = true; /* a peer that never reads */
	} else {
		uint8_t *o = realloc(c->out, c->out_len + len);
		if (!o) {
			c->dead = true;
		} else {
			c->out = o;
			memcpy(c->out + c->out_len, buf, len);
			c->out_len += len;
		}
	}
	free(buf);
	if (c->st != CS_CONNECTING)
		flush(c);
}

static void send_fail(struct rconn *c, int code, const char *msg, uint64_t iteration, bool quiet)
{
	Zerod__V1__RdzvEnvelope env = ZEROD__V1__RDZV_ENVELOPE__INIT;
	Zerod__V1__RdzvFail f = ZEROD__V1__RDZV_FAIL__INIT;

	f.code = wire_error_code(code);
	f.message = (char *)msg;
	f.has_iteration = iteration != UINT64_MAX;
	f.iteration = iteration;
	f.has_quiet = quiet;
	f.quiet = quiet;
	env.body_case = ZEROD__V1__RDZV_ENVELOPE__BODY_FAIL;
	env.fail = &f;
	conn_send(c, &env);
}

/* Send a last word, then close once it is out (or after RDZV_CLOSE_MS). */
static void refuse(struct rconn *c, int code, const char *msg)
{
	send_fail(c, code, msg, UINT64_MAX, false);
	if (c->dead)
		return;
	c->st = CS_CLOSING;
	c->deadline = now_ms() + RDZV_CLOSE_MS;
	flush(c);
}

static struct rconn *conn_new(struct rdzv_daemon *rd, int fd, bool server)
{
	struct rconn *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	c->rd = rd;
	c->fd = fd;
	c->server = server;
	if (loop_add_fd(rd->d->loop, fd, on_conn, c) < 0) {
		free(c);
		return NULL;
	}
	c->next = rd->conns;
	rd->conns = c;
	return c;
}

static void conn_free(struct rconn *c)
{
	struct rdzv_daemon *rd = c->rd;

	for (struct rconn **pp = &rd->conns; *pp; pp = &(*pp)->next)
		if (*pp == c) {
			*pp = c->next;
			break;
		}
	if (c->unauth)
		rd->nunauth--;
	if (c->rj) {
		if (c->rj->up == c)
			c->rj->up = NULL;
		for (uint32_t k = 0; c->rj->node_conn && k < c->rj->nnodes; k++)
			if (c->rj->node_conn[k] == c)
				c->rj->node_conn[k] = NULL;
	}
	loop_remove_fd(rd->d->loop, c->fd);
	close(c->fd);
	rdzv_sec_free(c->sec);
	free(c->in);
	free(c->out);
	free(c->ranks);
	plan_free(c->plan);
	free(c);
}

/* ------------------------------------------------------------- store --- */

static struct kv *kv_find(struct rdzv_job *rj, const char *key)
{
	for (struct kv *e = rj->kv; e; e = e->next)
		if (strcmp(e->key, key) == 0)
			return e;
	return NULL;
}

static bool key_ok(const struct rdzv_job *rj, const char *key)
{
	size_t n = strlen(rj->prefix);

	if (strlen(key) > RDZV_KEY_MAX || strncmp(key, rj->prefix, n) != 0)
		return false;
	for (const char *k = key; *k; k++)
		if (*k < 0x21 || *k > 0x7e)
			return false;
	return true;
}

static void on_store_set(struct rconn *c, const Zerod__V1__RdzvEnvelope *m)
{
	Zerod__V1__RdzvEnvelope env = ZEROD__V1__RDZV_ENVELOPE__INIT;
	Zerod__V1__StoreReply rep = ZEROD__V1__STORE_REPLY__INIT;
	struct rdzv_job *rj = c->rj;
	const Zerod__V1__StoreSet *s = m->store_set;
	struct kv *e;
	void *v;

	if (!rj->formed || !key_ok(rj, s->key) || s->value.len > RDZV_VALUE_MAX) {
		refuse(c, ZC_EPROTO, "store: that key or value is not this job's to set");
		return;
	}
	e = kv_find(rj, s->key);
	if ((!e && rj->nkv >= RDZV_KV_KEYS) ||
	    rj->kv_bytes - (e ? e->len : 0) + s->value.len > RDZV_KV_BYTES) {
		refuse(c, ZC_ELIMIT, "store: full");
		return;
	}
	v = malloc(s->value.len ? s->value.len : 1);
	if (!v || (!e && !(e = calloc(1, sizeof(*e))))) {
		free(v);
		refuse(c, ZC_ELIMIT, "store: out of memory");
		return;
	}
	if (!e->key) {
		e->key = strdup(s->key);
		if (!e->key) {
			free(e);
			free(v);
			refuse(c, ZC_ELIMIT, "store: out of memory");
			return;
		}
		e->next = rj->kv;
		rj->kv = e;
		rj->nkv++;
	}
	rj->kv_bytes += s->value.len - e->len;
	free(e->value);
	memcpy(v, s->value.data, s->value.len);
	e->value = v;
	e->len = s->value.len;
	env.body_case = ZEROD__V1__RDZV_ENVELOPE__BODY_STORE_REPLY;
	env.store_reply = &rep;
	conn_send(c, &env);
}

static void on_store_get(struct rconn *c, const Zerod__V1__RdzvEnvelope *m)
{
	Zerod__V1__RdzvEnvelope env = ZEROD__V1__RDZV_ENVELOPE__INIT;
	Zerod__V1__StoreReply rep = ZEROD__V1__STORE_REPLY__INIT;
	struct rdzv_job *rj = c->rj;
	struct kv *e;

	if (!rj->formed || !key_ok(rj, m->store_get->key)) {
		refuse(c, ZC_EPROTO, "store: that key is not this job's");
		return;
	}
	e = kv_find(rj, m->store_get->key);
	if (e) {
		rep.has_value = 1;
		rep.value = (ProtobufCBinaryData){e->len, e->value};
	}
	env.body_case = ZEROD__V1__RDZV_ENVELOPE__BODY_STORE_REPLY;
	env.store_reply = &rep;
	conn_send(c, &env);
}

/* -------------------------------------------------------- failures --- */

/* Fail the job here with what another node said. A quiet end before
 * iteration `iter` waits until this node has finished the iteration before
 * it (rdzv_iteration_done); one that finds this node inside `iter` is an
 * error for its ranks. */
static void apply_remote_end(struct rdzv_job *rj, int code, bool quiet, uint64_t iter,
			     const char *msg)
{
	struct job *j = rj->j;

	if (job_ended(j))
		return;
	/* a state round already in this node's executor is answered first:
	 * the node that ended served it (its collectives are done) */
	if (quiet && j->state == JOB_ACTIVE && (j->iter < iter || statex_busy(j))) {
		rj->end_pending = true;
		rj->end_iter = iter;
		rj->end_code = code;
		snprintf(rj->end_msg, sizeof(rj->end_msg), "%s", msg);
		return;
	}
	rj->from_remote = true;
	if (quiet && !(j->state == JOB_ACTIVE && j->in_flight))
		job_fail(j, code, false, "%s", msg);
	else
		job_fail(j, code, true, "%s", msg);
	rj->from_remote = false;
}

static void fail_lost(struct rdzv_job *rj, uint32_t k, const char *what)
{
	char name[NAME_LEN + 16];

	rj->blame_pending = false;
	job_fail(rj->j, ZC_ERANKDEAD, true, "%s was lost: %s", node_name(rj, k, name, sizeof(name)),
		 what);
}

/* Node k's connection went: name it if a failed collective waits for that. */
static void node_lost(struct rdzv_job *rj, uint32_t k)
{
	if (!rj->formed || k >= rj->nnodes || rj->lost[k])
		return;
	rj->lost[k] = true;
	if (rj->blame_pending && !job_ended(rj->j))
		fail_lost(rj, k, rj->blame_what);
}

void rdzv_job_failed(struct job *j)
{
	struct rdzv_job *rj = j->rdzv;
	uint64_t iter = j->iter;
	char msg[400], name[NAME_LEN + 16];

	rj->blame_pending = rj->end_pending = false;
	if (rj->from_remote)
		return; /* the host relays it; a node that was told has nothing to add */
	if (!rj->hosting) {
		if (rj->up && rj->up->st == CS_OPEN)
			send_fail(rj->up, j->err, j->errmsg, iter, j->quiet_end);
		return;
	}
	if (rj->formed)
		node_name(rj, rj->node, name, sizeof(name));
	else
		snprintf(name, sizeof(name), "node 0 (the rendezvous)");
	snprintf(msg, sizeof(msg), "on %s: %s", name, j->errmsg);
	for (struct rconn *c = rj->rd->conns; c; c = c->next)
		if (c->rj == rj && c->kind == ZEROD__V1__RDZV_KIND__RDZV_JOIN && c->st == CS_OPEN)
			send_fail(c, j->err, msg, iter, j->quiet_end);
}

bool rdzv_exec_failed(struct job *j, const char *what)
{
	struct rdzv_job *rj = j->rdzv;

	if (!rj->formed)
		return false;
	for (uint32_t k = 0; k < rj->nnodes; k++)
		if (rj->lost[k]) {
			fail_lost(rj, k, what);
			return true;
		}
	rj->blame_pending = true;
	rj->blame_deadline = now_ms() + RDZV_BLAME_MS;
	snprintf(rj->blame_what, sizeof(rj->blame_what), "%s", what);
	return true;
}

void rdzv_iteration_done(struct job *j)
{
	struct rdzv_job *rj = j->rdzv;

	if (rj->end_pending && !job_ended(j) && j->iter >= rj->end_iter && !statex_busy(j)) {
		rj->end_pending = false;
		apply_remote_end(rj, rj->end_code, true, rj->end_iter, rj->end_msg);
	}
}

/* The host: a node's job failed there. Every other node hears it now,
 * then it applies here. */
static void on_node_fail(struct rconn *c, const Zerod__V1__RdzvEnvelope *m)
{
	struct rdzv_job *rj = c->rj;
	const Zerod__V1__RdzvFail *f = m->fail;
	uint64_t iter = f->has_iteration ? f->iteration : UINT64_MAX;
	int code = wire_error_from_pb(f->code);
	char msg[400], name[NAME_LEN + 16];

	if (job_ended(rj->j))
		return;
	snprintf(msg, sizeof(msg), "on %s: %s", joiner_name(c, name, sizeof(name)), f->message);
	for (struct rconn *o = rj->rd->conns; o; o = o->next)
		if (o != c && o->rj == rj && o->kind == ZEROD__V1__RDZV_KIND__RDZV_JOIN &&
		    o->st == CS_OPEN)
			send_fail(o, code, msg, iter, f->quiet);
	apply_remote_end(rj, code, f->quiet, iter, msg);
}

/* A node: the host says the job failed (or refuses this node). */
static void on_host_fail(struct rconn *c, const Zerod__V1__RdzvEnvelope *m)
{
	struct rdzv_job *rj = c->rj;
	const Zerod__V1__RdzvFail *f = m->fail;
	int code = wire_error_from_pb(f->code);

	if (code == ZC_ESTATE && !rj->formed) {
		/* not serving the job yet: ask again later */
		conn_gone(c, f->message);
		return;
	}
	apply_remote_end(rj, code, f->quiet, f->has_iteration ? f->iteration : UINT64_MAX,
			 f->message);
}

static void on_node_lost(struct rconn *c, const Zerod__V1__RdzvEnvelope *m)
{
	struct rdzv_job *rj = c->rj;
	char name[NAME_LEN + 16];

	if (!rj->formed || m->node_lost->node >= rj->nnodes)
		return;
	log_notice("job %s: the rendezvous lost %s", rj->j->id,
		   node_name(rj, m->node_lost->node, name, sizeof(name)));
	node_lost(rj, m->node_lost->node);
}

/* ------------------------------------------------------- forming --- */

/* The executor's network: a store client of the rendezvous, this node's
 * address (the one its connection to the host leaves from). */
static int setup_net(struct rdzv_job *rj, const struct sockaddr *store_at, socklen_t len)
{
	struct daemon *d = rj->rd->d;
	int r = rdzv_store_new(store_at, len, rj->j->id, rj->secret, rj->secret_len, rj->rd->keys,
			       d->cfg.stall_timeout_ms, &rj->store);

	if (r < 0)
		return r;
	rj->store_ops = rdzv_store_ops(rj->store);
	rj->net = (struct coll_net){
		.nnodes = rj->nnodes,
		.node = rj->node,
		.node_of = rj->node_of,
		.host = rj->bind_addr,
		.prefix = rj->prefix,
		.store = &rj->store_ops,
		.timeout_ms = (uint32_t)d->cfg.stall_timeout_ms,
		.keys = rj->rd->keys,
	};
	return 0;
}

static int alloc_formed(struct rdzv_job *rj)
{
	uint32_t w = rj->j->world, n = rj->nnodes;

	rj->node_of = calloc(w, sizeof(*rj->node_of));
	rj->names = calloc(n, sizeof(*rj->names));
	rj->lost = calloc(n, sizeof(*rj->lost));
	rj->node_conn = calloc(n, sizeof(*rj->node_conn));
	return rj->node_of && rj->names && rj->lost && rj->node_conn ? 0 : -ENOMEM;
}

/* What one node brings to the table, the host's own included. */
struct member {
	struct rconn *c; /* NULL: the host */
	char name[NAME_LEN + 16];
	uint32_t world, nnodes;
	bool has_idx;
	uint32_t idx;
	const uint32_t *ranks;
	uint32_t nranks;
	const struct plan *plan;
	uint32_t lowest;
	uint32_t node; /* assigned */
};

static int by_lowest(const void *a, const void *b)
{
	const struct member *x = *(const struct member *const *)a;
	const struct member *y = *(const struct member *const *)b;

	return x->lowest < y->lowest ? -1 : x->lowest > y->lowest;
}

/* Number the nodes: given indices first, the rest in order of their lowest
 * rank. 0, or a code with msg saying which nodes clash. */
static int assign_nodes(struct rdzv_job *rj, struct member *mb, uint32_t n, char *msg, size_t len)
{
	struct member *taken[n], *rest[n];
	uint32_t nrest = 0, next = 0;

	memset(taken, 0, sizeof(taken));
	for (uint32_t k = 0; k < n; k++) {
		struct member *m = &mb[k];
		if (!m->has_idx) {
			rest[nrest++] = m;
			continue;
		}
		if (taken[m->idx]) {
			snprintf(msg, len, "node %u is claimed by %s and by %s", m->idx,
				 taken[m->idx]->name, m->name);
			return ZC_EWORLD;
		}
		taken[m->idx] = m;
	}
	/* the host is node 0: by its trainers' word, or because it holds rank 0 */
	if (!mb[0].has_idx && taken[0]) {
		snprintf(msg, len,
			 "node 0 is claimed by %s, but %s serves the rendezvous (it holds rank 0)",
			 taken[0]->name, mb[0].name);
		return ZC_EWORLD;
	}
	qsort(rest, nrest, sizeof(rest[0]), by_lowest);
	for (uint32_t i = 0; i < nrest; i++) {
		while (taken[next])
			next++;
		taken[next] = rest[i];
	}
	for (uint32_t k = 0; k < n; k++)
		taken[k]->node = k;
	(void)rj;
	return 0;
}

/* Every rank on exactly one node: 0, or a code with msg. */
static int check_ranks(struct rdzv_job *rj, struct member *mb, uint32_t n, char *msg, size_t len)
{
	uint32_t w = rj->j->world, missing = 0;
	size_t at;

	for (uint32_t r = 0; r < w; r++)
		rj->node_of[r] = UINT32_MAX;
	for (uint32_t k = 0; k < n; k++)
		for (uint32_t i = 0; i < mb[k].nranks; i++) {
			uint32_t r = mb[k].ranks[i], prev = rj->node_of[r];
			if (prev != UINT32_MAX) {
				for (uint32_t q = 0; q < n; q++)
					if (mb[q].node == prev)
						snprintf(msg, len, "rank %u is on %s and on %s", r,
							 mb[q].name, mb[k].name);
				return ZC_EDUPRANK;
			}
			rj->node_of[r] = mb[k].node;
		}
	at = (size_t)snprintf(msg, len, "no node has rank");
	for (uint32_t r = 0; r < w; r++)
		if (rj->node_of[r] == UINT32_MAX && at + 16 < len)
			at += (size_t)snprintf(msg + at, len - at, "%s %u", missing++ ? "," : "",
					       r);
	return missing ? ZC_EWORLD : 0;
}

static void send_formed(struct rdzv_job *rj, struct rconn *c, uint32_t node)
{
	Zerod__V1__RdzvEnvelope env = ZEROD__V1__RDZV_ENVELOPE__INIT;
	Zerod__V1__RdzvFormed f = ZEROD__V1__RDZV_FORMED__INIT;
	char *names[rj->nnodes];

	for (uint32_t k = 0; k < rj->nnodes; k++)
		names[k] = rj->names[k];
	f.node = node;
	f.n_node_of = rj->j->world;
	f.node_of = rj->node_of;
	f.prefix = rj->prefix;
	f.n_names = rj->nnodes;
	f.names = names;
	env.body_case = ZEROD__V1__RDZV_ENVELOPE__BODY_FORMED;
	env.formed = &f;
	conn_send(c, &env);
}

/* The host's first local plan (the ranks agreed on it). */
static const struct plan *local_plan(const struct job *j)
{
	for (uint32_t r = 0; r < j->world; r++)
		if (j->plans[r])
			return j->plans[r];
	return NULL;
}

/* The host: every node joined; check and form, or fail on every node. */
static void form(struct rdzv_job *rj)
{
	struct job *j = rj->j;
	uint32_t n = rj->nnodes, k = 1, *mine = calloc(j->world, sizeof(*mine)), nmine = 0;
	struct member *mb = calloc(n, sizeof(*mb));
	char msg[400], field[192], here[NAME_LEN];
	uint8_t rnd[8];
	int code = 0;

	if (!mine || !mb || alloc_formed(rj) < 0) {
		snprintf(msg, sizeof(msg), "out of memory forming the job");
		code = ZC_ELIMIT;
		goto out;
	}
	for (uint32_t r = 0; r < j->world; r++)
		if (j->plans[r])
			mine[nmine++] = r;
	here[0] = '\0';
	for (struct rconn *c = rj->rd->conns; c; c = c->next) {
		if (c->rj != rj || !c->joined || c->dead)
			continue;
		if (!here[0])
			local_name(c->fd, here, sizeof(here));
		mb[k] = (struct member){.c = c,
					.world = c->world,
					.nnodes = c->nnodes,
					.has_idx = c->has_idx,
					.idx = c->idx,
					.ranks = c->ranks,
					.nranks = c->nranks,
					.plan = c->plan,
					.lowest = c->ranks[0]};
		joiner_name(c, mb[k].name, sizeof(mb[k].name));
		for (uint32_t i = 0; i < c->nranks; i++)
			mb[k].lowest = MIN(mb[k].lowest, c->ranks[i]);
		k++;
	}
	mb[0] = (struct member){.world = j->world,
				.nnodes = rj->nnodes,
				.has_idx = rj->has_node_rank,
				.idx = rj->node_rank,
				.ranks = mine,
				.nranks = nmine,
				.plan = local_plan(j),
				.lowest = mine[0]};
	snprintf(mb[0].name, sizeof(mb[0].name), "node %u (%s)",
		 rj->has_node_rank ? rj->node_rank : 0, here);
	for (k = 1; k < n && !code; k++) {
		if (mb[k].nnodes != n) {
			snprintf(msg, sizeof(msg), "%s and %s differ at nnodes: %u vs %u",
				 mb[0].name, mb[k].name, n, mb[k].nnodes);
			code = ZC_EWORLD;
		} else if (mb[k].world != j->world) {
			snprintf(msg, sizeof(msg), "%s and %s differ at world_size: %u vs %u",
				 mb[0].name, mb[k].name, j->world, mb[k].world);
			code = ZC_EWORLD;
		}
	}
	if (!code)
		code = assign_nodes(rj, mb, n, msg, sizeof(msg));
	for (k = 0; k < n && !code; k++) {
		snprintf(rj->names[mb[k].node], NAME_LEN, "%s", k ? mb[k].c->peer : here);
		if (k && strrchr(rj->names[mb[k].node], ':') && rj->names[mb[k].node][0] != '[')
			*strrchr(rj->names[mb[k].node], ':') = '\0';
	}
	for (k = 0; k < n && !code; k++)
		snprintf(mb[k].name, sizeof(mb[k].name), "node %u (%s)", mb[k].node,
			 rj->names[mb[k].node]);
	for (k = 1; k < n && !code; k++)
		if (plan_diff(mb[0].plan, mb[k].plan, field, sizeof(field))) {
			snprintf(msg, sizeof(msg), "plans differ between %s and %s at %s",
				 mb[0].name, mb[k].name, field);
			code = ZC_EPLANMISMATCH;
		}
	if (!code)
		code = check_ranks(rj, mb, n, msg, sizeof(msg));
	if (code)
		goto out;
	rdzv_random(rnd, sizeof(rnd));
	snprintf(rj->prefix, sizeof(rj->prefix), "%s/%02x%02x%02x%02x%02x%02x%02x%02x/", j->id,
		 rnd[0], rnd[1], rnd[2], rnd[3], rnd[4], rnd[5], rnd[6], rnd[7]);
	rj->node = mb[0].node;
	rj->host_node = mb[0].node;
	snprintf(rj->bind_addr, sizeof(rj->bind_addr), "%s", here);
	for (k = 1; k < n; k++) {
		rj->node_conn[mb[k].node] = mb[k].c;
		send_formed(rj, mb[k].c, mb[k].node);
	}
	if (setup_net(rj, (struct sockaddr *)&rj->lst->addr, rj->lst->addrlen) < 0) {
		snprintf(msg, sizeof(msg), "out of memory forming the job");
		code = ZC_ELIMIT;
		goto out;
	}
	rj->formed = true;
	log_info("job %s: formed over %u nodes (rendezvous %s, store prefix %s)", j->id, n,
		 rj->lst->name, rj->prefix);
out:
	free(mine);
	free(mb);
	if (code)
		job_fail(j, code, true, "%s", msg); /* every node hears it */
	else
		job_formed(j);
}

static void maybe_form(struct rdzv_job *rj)
{
	uint32_t joined = 0;

	if (!rj->hosting || !rj->lst || rj->formed || !rj->local_ready || job_ended(rj->j))
		return;
	for (struct rconn *c = rj->rd->conns; c; c = c->next)
		joined += c->rj == rj && c->joined && !c->dead;
	if (joined == rj->nnodes - 1)
		form(rj);
}

/* The host: why the job cannot form, once its join timeout passed. */
static void fail_missing(struct rdzv_job *rj)
{
	struct job *j = rj->j;
	uint32_t n = rj->nnodes, joined = 1, nmissing = 0;
	bool named = rj->has_node_rank, *has_idx = calloc(n, sizeof(bool));
	bool *has_rank = calloc(j->world, sizeof(bool));
	char nodes[160] = "", ranks[160] = "";
	size_t at = 0;

	if (!has_idx || !has_rank) {
		free(has_idx);
		free(has_rank);
		job_fail(j, ZC_ETIMEDOUT, true, "not every node joined within %d ms",
			 j->d->cfg.join_timeout_ms);
		return;
	}
	if (rj->has_node_rank)
		has_idx[rj->node_rank] = true;
	for (uint32_t r = 0; r < j->world; r++)
		has_rank[r] = j->plans[r] != NULL;
	for (struct rconn *c = rj->rd->conns; c; c = c->next) {
		if (c->rj != rj || !c->joined)
			continue;
		joined++;
		named = named && c->has_idx;
		if (c->has_idx && c->idx < n)
			has_idx[c->idx] = true;
		for (uint32_t i = 0; i < c->nranks; i++)
			if (c->ranks[i] < j->world)
				has_rank[c->ranks[i]] = true;
	}
	for (uint32_t k = 0; named && k < n && at + 12 < sizeof(nodes); k++)
		if (!has_idx[k])
			at += (size_t)snprintf(nodes + at, sizeof(nodes) - at, "%s%u",
					       nmissing++ ? ", " : "", k);
	at = 0;
	for (uint32_t r = 0, m = 0; r < j->world && at + 12 < sizeof(ranks); r++)
		if (!has_rank[r])
			at += (size_t)snprintf(ranks + at, sizeof(ranks) - at, "%s%u",
					       m++ ? ", " : "", r);
	if (named && nmissing)
		job_fail(j, ZC_ETIMEDOUT, true,
			 "node%s %s did not join within %d ms (%u of %u nodes joined; no node has "
			 "rank%s %s)",
			 nmissing > 1 ? "s" : "", nodes, j->d->cfg.join_timeout_ms, joined, n,
			 strchr(ranks, ',') ? "s" : "", ranks[0] ? ranks : "-");
	else
		job_fail(j, ZC_ETIMEDOUT, true,
			 "%u of %u nodes did not join within %d ms (no node has rank%s %s)",
			 n - joined, n, j->d->cfg.join_timeout_ms, strchr(ranks, ',') ? "s" : "",
			 ranks[0] ? ranks : "-");
	free(has_idx);
	free(has_rank);
}

/* ------------------------------------------------- the host's side --- */

static struct rdzv_job *hosted_job(struct rconn *c, const char *id, bool *ret_ended)
{
	struct rdzv_job *ended = NULL;

	for (struct job *j = c->rd->d->jobs; j; j = j->next) {
		struct rdzv_job *rj = j->rdzv;
		if (!rj || !rj->hosting || rj->lst != c->lst || strcmp(j->id, id) != 0)
			continue;
		if (!job_ended(j)) {
			*ret_ended = false;
			return rj;
		}
		ended = rj;
	}
	*ret_ended = ended != NULL;
	return ended;
}

/* The host: a client's Curve (rdzvcurve.h). A host without keys refuses
 * it, as one with keys refuses a key it does not trust. */
static void on_curve(struct rconn *c, const Zerod__V1__RdzvEnvelope *m)
{
	Zerod__V1__RdzvEnvelope env = ZEROD__V1__RDZV_ENVELOPE__INIT;
	Zerod__V1__RdzvCurve reply;
	char why[160], msg[400];
	int code;

	if (!c->sec) {
		peer_log(c->rd,
			 "rendezvous %s: refused %s: it speaks CURVE, and this zerod has no CURVE "
			 "keys (--curve-secret-key)",
			 c->lst->name, c->peer);
		snprintf(msg, sizeof(msg),
			 "the rendezvous at %s refused this node: it has no CURVE keys configured, "
			 "and this node has",
			 c->lst->name);
		refuse(c, ZC_ECONNECT, msg);
		return;
	}
	code = rdzv_sec_on_hello(c->sec, m->curve, &reply, why, sizeof(why));
	if (code) {
		peer_log(c->rd, "rendezvous %s: refused %s: %s", c->lst->name, c->peer, why);
		snprintf(msg, sizeof(msg), "the rendezvous at %s refused this node: %s",
			 c->lst->name, why);
		refuse(c, code, msg);
		return;
	}
	env.body_case = ZEROD__V1__RDZV_ENVELOPE__BODY_CURVE;
	env.curve = &reply;
	conn_send(c, &env);
}

/* The host: the client's proof; frames are sealed both ways from here. */
static void on_curve_auth(struct rconn *c, const Zerod__V1__RdzvEnvelope *m)
{
	char why[160], msg[400];
	int code = rdzv_sec_on_auth(c->sec, m->curve_auth, why, sizeof(why));

	if (code) {
		peer_log(c->rd, "rendezvous %s: refused %s: %s", c->lst->name, c->peer, why);
		snprintf(msg, sizeof(msg), "the rendezvous at %s refused this node: %s",
			 c->lst->name, why);
		refuse(c, code, msg);
		return;
	}
	c->st = CS_HELLO;
	log_debug("rendezvous %s: %s proved CURVE key %s", c->lst->name, c->peer,
		  rdzv_sec_peer(c->sec));
}

/* The host requires CURVE: a plain Hello is refused, saying why. */
static void on_plain_hello(struct rconn *c, const Zerod__V1__RdzvEnvelope *m)
{
	char msg[256];

	(void)m;
	peer_log(c->rd, "rendezvous %s: refused %s: a plain Hello, and this zerod requires CURVE",
		 c->lst->name, c->peer);
	snprintf(msg, sizeof(msg),
		 "the rendezvous at %s refused this node: it requires CURVE, and this node's "
		 "zerod has no CURVE keys (--curve-secret-key, --curve-peers)",
		 c->lst->name);
	refuse(c, ZC_ECONNECT, msg);
}

static void on_hello(struct rconn *c, const Zerod__V1__RdzvEnvelope *m)
{
	Zerod__V1__RdzvEnvelope env = ZEROD__V1__RDZV_ENVELOPE__INIT;
	Zerod__V1__RdzvChallenge ch = ZEROD__V1__RDZV_CHALLENGE__INIT;
	const Zerod__V1__RdzvHello *h = m->hello;
	struct rdzv_job *rj;
	char msg[256];
	bool ended;

	if (h->protocol_version != RDZV_PROTOCOL || !job_id_valid(h->job_id) ||
	    (h->kind != ZEROD__V1__RDZV_KIND__RDZV_JOIN &&
	     h->kind != ZEROD__V1__RDZV_KIND__RDZV_STORE) ||
	    h->nonce.len != RDZV_NONCE_BYTES) {
		peer_log(c->rd, "rendezvous %s: refused %s: a Hello of another protocol",
			 c->lst->name, c->peer);
		refuse(c, ZC_EVERSION, "not a zerod rendezvous Hello this zerod speaks");
		return;
	}
	rj = hosted_job(c, h->job_id, &ended);
	if (!rj) {
		snprintf(msg, sizeof(msg), "the zerod at %s does not serve job %s (yet)",
			 c->lst->name, h->job_id);
		refuse(c, ZC_ESTATE, msg);
		return;
	}
	if (ended) {
		snprintf(msg, sizeof(msg), "job %s failed on node 0: %s: %.160s", h->job_id,
			 zc_strerror_name(rj->j->err), rj->j->errmsg);
		refuse(c, ZC_EJOBFAILED, msg);
		return;
	}
	c->rj = rj;
	c->kind = h->kind;
	memcpy(c->cn, h->nonce.data, RDZV_NONCE_BYTES);
	rdzv_random(c->sn, sizeof(c->sn));
	ch.nonce = (ProtobufCBinaryData){sizeof(c->sn), c->sn};
	env.body_case = ZEROD__V1__RDZV_ENVELOPE__BODY_CHALLENGE;
	env.challenge = &ch;
	c->st = CS_AUTH;
	conn_send(c, &env);
}

static void on_auth(struct rconn *c, const Zerod__V1__RdzvEnvelope *m)
{
	Zerod__V1__RdzvEnvelope env = ZEROD__V1__RDZV_ENVELOPE__INIT;
	Zerod__V1__RdzvWelcome w = ZEROD__V1__RDZV_WELCOME__INIT;
	struct rdzv_job *rj = c->rj;
	uint8_t want[RDZV_PROOF_BYTES];
	char msg[200];

	rdzv_proof(want, rj->secret, rj->secret_len, false, rj->j->id, c->kind, c->cn, c->sn);
	if (!rdzv_proof_ok(want, &m->auth->proof)) {
		peer_log(c->rd, "rendezvous %s: refused %s: wrong secret for job %s", c->lst->name,
			 c->peer, rj->j->id);
		snprintf(msg, sizeof(msg),
			 "the rendezvous at %s refused this node: wrong secret "
			 "for job %s",
			 c->lst->name, rj->j->id);
		c->rj = NULL; /* it never belonged to the job */
		refuse(c, ZC_ECONNECT, msg);
		return;
	}
	rdzv_proof(want, rj->secret, rj->secret_len, true, rj->j->id, c->kind, c->cn, c->sn);
	w.proof = (ProtobufCBinaryData){sizeof(want), want};
	env.body_case = ZEROD__V1__RDZV_ENVELOPE__BODY_WELCOME;
	env.welcome = &w;
	c->st = CS_OPEN;
	c->deadline = 0; /* a node's connection lasts as long as its job */
	c->unauth = false;
	c->rd->nunauth--;
	conn_send(c, &env);
	log_debug("job %s: rendezvous: %s authenticated (%s)", rj->j->id, c->peer,
		  c->kind == ZEROD__V1__RDZV_KIND__RDZV_JOIN ? "join" : "store");
}

/* A Join that cannot be one of the job's nodes next to those here already:
 * it brings a rank this node (the host) or a node that joined has, or the
 * node index another claimed. Only that joiner is refused: the job waits on
 * for its real node. 0, or a code with msg. */
static int join_conflict(struct rdzv_job *rj, struct rconn *c, const Zerod__V1__RdzvJoin *jn,
			 char *msg, size_t len)
{
	struct job *j = rj->j;

	if (jn->world_size != j->world)
		return 0; /* told when forming, naming both nodes */
	for (size_t i = 0; i < jn->n_ranks; i++) {
		uint32_t r = jn->ranks[i];
		if (j->ranks[r] || j->plans[r]) {
			snprintf(msg, len, "rank %u is on node %u (the rendezvous) already", r,
				 rj->has_node_rank ? rj->node_rank : 0);
			return ZC_EDUPRANK;
		}
		for (struct rconn *o = rj->rd->conns; o; o = o->next) {
			if (o == c || o->rj != rj || !o->joined || o->dead)
				continue;
			for (uint32_t q = 0; q < o->nranks; q++)
				if (o->ranks[q] == r) {
					snprintf(msg, len, "rank %u is on %s already", r, o->peer);
					return ZC_EDUPRANK;
				}
		}
	}
	if (!jn->has_node_rank)
		return 0;
	if (rj->has_node_rank && rj->node_rank == jn->node_rank) {
		snprintf(msg, len, "node %u is the rendezvous's own", jn->node_rank);
		return ZC_EWORLD;
	}
	for (struct rconn *o = rj->rd->conns; o; o = o->next)
		if (o != c && o->rj == rj && o->joined && !o->dead && o->has_idx &&
		    o->idx == jn->node_rank) {
			snprintf(msg, len, "node %u is %s already", jn->node_rank, o->peer);
			return ZC_EWORLD;
		}
	return 0;
}

static void on_join(struct rconn *c, const Zerod__V1__RdzvEnvelope *m)
{
	const Zerod__V1__RdzvJoin *jn = m->join;
	struct rdzv_job *rj = c->rj;
	uint32_t joined = 0;
	char err[192], msg[256];
	bool *seen;
	int code;

	if (c->joined || rj->formed) {
		snprintf(msg, sizeof(msg), "job %s has formed already with its %u nodes", rj->j->id,
			 rj->nnodes);
		refuse(c, ZC_EJOBFAILED, msg);
		return;
	}
	for (struct rconn *o = rj->rd->conns; o; o = o->next)
		joined += o->rj == rj && o->joined && !o->dead;
	if (joined >= rj->nnodes - 1) {
		snprintf(msg, sizeof(msg), "job %s has all its %u nodes", rj->j->id, rj->nnodes);
		peer_log(c->rd, "job %s: rendezvous: refused %s: %s", rj->j->id, c->peer, msg);
		refuse(c, ZC_EWORLD, msg);
		return;
	}
	if (jn->world_size == 0 || jn->world_size > ZEROD_MAX_WORLD || jn->n_ranks == 0 ||
	    jn->n_ranks > jn->world_size || jn->nnodes == 0 || jn->nnodes > ZEROD_MAX_WORLD ||
	    (jn->has_node_rank && jn->node_rank >= jn->nnodes)) {
		refuse(c, ZC_EPROTO, "a Join with impossible ranks or nodes");
		return;
	}
	seen = calloc(jn->world_size, sizeof(*seen));
	if (!seen) {
		refuse(c, ZC_ELIMIT, "out of memory");
		return;
	}
	for (size_t i = 0; i < jn->n_ranks; i++) {
		if (jn->ranks[i] >= jn->world_size || seen[jn->ranks[i]]) {
			free(seen);
			refuse(c, ZC_EPROTO, "a Join with impossible ranks or nodes");
			return;
		}
		seen[jn->ranks[i]] = true;
	}
	free(seen);
	code = join_conflict(rj, c, jn, msg, sizeof(msg));
	if (code) {
		peer_log(c->rd, "job %s: rendezvous: refused %s: %s", rj->j->id, c->peer, msg);
		refuse(c, code, msg);
		return;
	}
	if (jn->world_size == rj->j->world && jn->nnodes == rj->nnodes &&
	    plan_from_pb(jn->plan, &c->plan, err, sizeof(err)) < 0) {
		snprintf(msg, sizeof(msg), "invalid plan: %s", err);
		refuse(c, ZC_EPLANINVAL, msg);
		return;
	}
	c->ranks = malloc(jn->n_ranks * sizeof(*c->ranks));
	if (!c->ranks) {
		refuse(c, ZC_ELIMIT, "out of memory");
		return;
	}
	memcpy(c->ranks, jn->ranks, jn->n_ranks * sizeof(*c->ranks));
	c->nranks = (uint32_t)jn->n_ranks;
	c->world = jn->world_size;
	c->nnodes = jn->nnodes;
	c->has_idx = jn->has_node_rank;
	c->idx = jn->node_rank;
	c->joined = true;
	log_info("job %s: rendezvous: %s joined with %u ranks (%u of %u nodes)", rj->j->id, c->peer,
		 c->nranks, joined + 2, rj->nnodes);
	maybe_form(rj);
}

/* A world or node count that differs is reported when forming (it names the
 * nodes), so a Join may carry no plan the host can read. */

static void on_accept(struct loop *l, void *userdata)
{
	struct listener *ls = userdata;
	struct rdzv_daemon *rd = ls->rd;

	(void)l;
	for (int n = 0; n < 64; n++) {
		struct sockaddr_storage sa;
		socklen_t sl = sizeof(sa);
		int fd = accept4(ls->fd, (struct sockaddr *)&sa, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
		struct rconn *c;
		char peer[NAME_LEN];
		int one = 1;

		if (fd < 0)
			return;
		addr_name(&sa, true, peer, sizeof(peer));
		if (rd->nunauth >= RDZV_MAX_UNAUTH) {
			peer_log(rd,
				 "rendezvous %s: refused %s: %u connections are still to prove "
				 "a secret",
				 ls->name, peer, rd->nunauth);
			close(fd);
			continue;
		}
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		c = conn_new(rd, fd, true);
		if (!c) {
			close(fd);
			continue;
		}
		c->lst = ls;
		c->st = CS_HELLO;
		if (rd->keys) {
			if (rdzv_sec_new(rd->keys, true, &c->sec) < 0) {
				conn_free(c);
				continue;
			}
			c->st = CS_CURVE;
		}
		c->unauth = true;
		rd->nunauth++;
		c->deadline = now_ms() + rd->d->cfg.hello_timeout_ms;
		snprintf(c->peer, sizeof(c->peer), "%s", peer);
	}
}

static void listener_put(struct listener *ls)
{
	struct rdzv_daemon *rd;

	if (!ls || --ls->refs > 0)
		return;
	rd = ls->rd;
	for (struct rconn *c = rd->conns; c; c = c->next)
		if (c->lst == ls)
			c->dead = true;
	for (struct listener **pp = &rd->listeners; *pp; pp = &(*pp)->next)
		if (*pp == ls) {
			*pp = ls->next;
			break;
		}
	log_info("rendezvous: stopped serving %s", ls->name);
	loop_remove_fd(rd->d->loop, ls->fd);
	close(ls->fd);
	free(ls);
}

static uint16_t sa_port(const struct sockaddr_storage *sa)
{
	return sa->ss_family == AF_INET6 ? ntohs(((const struct sockaddr_in6 *)sa)->sin6_port)
					 : ntohs(((const struct sockaddr_in *)sa)->sin_port);
}

/* Serve port of rj's endpoint: bind the address it names (or, when that is
 * not this machine's, e.g. behind NAT, every address), or join the listener
 * already there. */
static int start_hosting(struct rdzv_job *rj, char *err, size_t errlen)
{
	struct rdzv_daemon *rd = rj->rd;
	uint16_t port = sa_port(&rj->addr);
	struct sockaddr_storage sa = rj->addr;
	socklen_t sl = rj->addrlen;
	struct listener *ls;
	int one = 1, fd, r;

	for (ls = rd->listeners; ls; ls = ls->next)
		if (ls->port == port)
			break;
	if (ls) {
		for (struct job *o = rd->d->jobs; o; o = o->next)
			if (o != rj->j && o->rdzv && o->rdzv->lst == ls && !job_ended(o) &&
			    strcmp(o->id, rj->j->id) == 0) {
				snprintf(
					err, errlen,
					"another user's job %s serves its rendezvous on %s already",
					rj->j->id, ls->name);
				return ZC_EDUPRANK;
			}
		ls->refs++;
		rj->lst = ls;
		return 0;
	}
	fd = socket(sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		snprintf(err, errlen, "socket: %s", strerror(errno));
		return ZC_EINTERNAL;
	}
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	r = bind(fd, (struct sockaddr *)&sa, sl);
	if (r < 0 && errno == EADDRNOTAVAIL) {
		/* a name for this machine that is not one of its addresses */
		memset(&sa, 0, sizeof(sa));
		sa.ss_family = rj->addr.ss_family;
		if (sa.ss_family == AF_INET6)
			((struct sockaddr_in6 *)&sa)->sin6_port = htons(port);
		else
			((struct sockaddr_in *)&sa)->sin_port = htons(port);
		r = bind(fd, (struct sockaddr *)&sa, sl);
	}
	if (r < 0 || listen(fd, 64) < 0) {
		snprintf(err, errlen, "cannot serve the rendezvous on %.100s: %s", rj->endpoint,
			 strerror(errno));
		close(fd);
		return ZC_ECONNECT;
	}
	ls = calloc(1, sizeof(*ls));
	if (!ls || loop_add_fd(rd->d->loop, fd, on_accept, ls) < 0) {
		free(ls);
		close(fd);
		snprintf(err, errlen, "out of memory");
		return ZC_ELIMIT;
	}
	*ls = (struct listener){.rd = rd, .fd = fd, .port = port, .refs = 1, .next = rd->listeners};
	addr_name(&sa, true, ls->name, sizeof(ls->name));
	/* the host's own store client comes here: the bound address, or
	 * loopback when every address is */
	ls->addr = sa;
	ls->addrlen = sl;
	if (sa.ss_family == AF_INET &&
	    ((struct sockaddr_in *)&sa)->sin_addr.s_addr == htonl(INADDR_ANY))
		((struct sockaddr_in *)&ls->addr)->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (sa.ss_family == AF_INET6 &&
	    IN6_IS_ADDR_UNSPECIFIED(&((struct sockaddr_in6 *)&sa)->sin6_addr))
		((struct sockaddr_in6 *)&ls->addr)->sin6_addr = in6addr_loopback;
	rd->listeners = ls;
	rj->lst = ls;
	log_info("rendezvous: serving %s", ls->name);
	return 0;
}

/* -------------------------------------------------- a node's side --- */

static void schedule_retry(struct rdzv_job *rj, const char *why)
{
	snprintf(rj->last_err, sizeof(rj->last_err), "%s", why);
	rj->retry_ms = rj->retry_ms ? MIN(rj->retry_ms * 2, RDZV_RETRY_MAX_MS) : RDZV_RETRY_MIN_MS;
	rj->retry_at = now_ms() + rj->retry_ms;
	rj->join_sent = false;
}

static void send_join(struct rdzv_job *rj)
{
	Zerod__V1__RdzvEnvelope env = ZEROD__V1__RDZV_ENVELOPE__INIT;
	Zerod__V1__RdzvJoin jn = ZEROD__V1__RDZV_JOIN__INIT;
	Zerod__V1__Plan pb = ZEROD__V1__PLAN__INIT;
	struct job *j = rj->j;
	uint32_t ranks[j->world], n = 0;

	for (uint32_t r = 0; r < j->world; r++)
		if (j->plans[r])
			ranks[n++] = r;
	if (plan_to_pb(local_plan(j), &pb) < 0) {
		job_fail(j, ZC_ELIMIT, true, "out of memory joining the rendezvous");
		return;
	}
	jn.world_size = j->world;
	jn.nnodes = rj->nnodes;
	jn.has_node_rank = rj->has_node_rank;
	jn.node_rank = rj->node_rank;
	jn.n_ranks = n;
	jn.ranks = ranks;
	jn.plan = &pb;
	env.body_case = ZEROD__V1__RDZV_ENVELOPE__BODY_JOIN;
	env.join = &jn;
	conn_send(rj->up, &env);
	plan_pb_free(&pb);
	rj->join_sent = true;
	log_info("job %s: joined the rendezvous at %s with %u ranks", j->id, rj->endpoint, n);
}

static void on_challenge(struct rconn *c, const Zerod__V1__RdzvEnvelope *m)
{
	Zerod__V1__RdzvEnvelope env = ZEROD__V1__RDZV_ENVELOPE__INIT;
	Zerod__V1__RdzvAuth a = ZEROD__V1__RDZV_AUTH__INIT;
	struct rdzv_job *rj = c->rj;
	uint8_t proof[RDZV_PROOF_BYTES];

	if (m->challenge->nonce.len != RDZV_NONCE_BYTES) {
		conn_gone(c, "a malformed challenge");
		return;
	}
	memcpy(c->sn, m->challenge->nonce.data, RDZV_NONCE_BYTES);
	rdzv_proof(proof, rj->secret, rj->secret_len, false, rj->j->id, c->kind, c->cn, c->sn);
	a.proof = (ProtobufCBinaryData){sizeof(proof), proof};
	env.body_case = ZEROD__V1__RDZV_ENVELOPE__BODY_AUTH;
	env.auth = &a;
	c->st = CS_AUTH;
	conn_send(c, &env);
}

static void on_welcome(struct rconn *c, const Zerod__V1__RdzvEnvelope *m)
{
	struct rdzv_job *rj = c->rj;
	uint8_t want[RDZV_PROOF_BYTES];

	rdzv_proof(want, rj->secret, rj->secret_len, true, rj->j->id, c->kind, c->cn, c->sn);
	if (!rdzv_proof_ok(want, &m->welcome->proof)) {
		job_fail(rj->j, ZC_ECONNECT, true,
			 "the zerod serving the rendezvous at %s does not know job %s's secret",
			 rj->endpoint, rj->j->id);
		conn_gone(c, "wrong secret");
		return;
	}
	c->st = CS_OPEN;
	c->deadline = 0;
	rj->retry_ms = 0;
	if (rj->local_ready && !rj->join_sent)
		send_join(rj);
}

static void on_formed(struct rconn *c, const Zerod__V1__RdzvEnvelope *m)
{
	const Zerod__V1__RdzvFormed *f = m->formed;
	struct rdzv_job *rj = c->rj;
	struct job *j = rj->j;
	bool bad;

	if (job_ended(j))
		return; /* it failed here meanwhile, and the host was told */
	bad = f->node >= rj->nnodes || f->n_node_of != j->world || f->n_names != rj->nnodes ||
	      !f->prefix[0] || strlen(f->prefix) >= sizeof(rj->prefix) || rj->formed ||
	      !rj->join_sent;

	if (!bad && alloc_formed(rj) < 0) {
		job_fail(j, ZC_ELIMIT, true, "out of memory forming the job");
		return;
	}
	for (uint32_t r = 0; r < j->world && !bad; r++) {
		bool here = j->plans[r] != NULL;
		bad = f->node_of[r] >= rj->nnodes || here != (f->node_of[r] == f->node);
		rj->node_of[r] = f->node_of[r];
	}
	if (bad) {
		job_fail(j, ZC_EPROTO, true, "the rendezvous at %s formed the job wrongly",
			 rj->endpoint);
		return;
	}
	for (uint32_t k = 0; k < rj->nnodes; k++)
		snprintf(rj->names[k], NAME_LEN, "%s", f->names[k]);
	snprintf(rj->prefix, sizeof(rj->prefix), "%s", f->prefix);
	rj->node = f->node;
	rj->host_node = 0; /* the host is node 0, by its trainers' word or by holding rank 0 */
	local_name(c->fd, rj->bind_addr, sizeof(rj->bind_addr));
	if (setup_net(rj, (struct sockaddr *)&rj->addr, rj->addrlen) < 0) {
		job_fail(j, ZC_ELIMIT, true, "out of memory forming the job");
		return;
	}
	rj->formed = true;
	log_info("job %s: formed: this is node %u of %u (rendezvous %s)", j->id, rj->node,
		 rj->nnodes, rj->endpoint);
	job_formed(j);
}

/* A node's Hello (sealed once its CURVE channel is ready). */
static void send_hello(struct rconn *c)
{
	Zerod__V1__RdzvEnvelope env = ZEROD__V1__RDZV_ENVELOPE__INIT;
	Zerod__V1__RdzvHello h = ZEROD__V1__RDZV_HELLO__INIT;

	rdzv_random(c->cn, sizeof(c->cn));
	h.protocol_version = RDZV_PROTOCOL;
	h.job_id = c->rj->j->id;
	h.kind = ZEROD__V1__RDZV_KIND__RDZV_JOIN;
	h.nonce = (ProtobufCBinaryData){sizeof(c->cn), c->cn};
	env.body_case = ZEROD__V1__RDZV_ENVELOPE__BODY_HELLO;
	env.hello = &h;
	conn_send(c, &env);
}

/* A node: the host's Curve. Its key must be one this node trusts, and
 * proven; then this node's proof, and the Hello, sealed. */
static void on_curve_reply(struct rconn *c, const Zerod__V1__RdzvEnvelope *m)
{
	Zerod__V1__RdzvEnvelope env = ZEROD__V1__RDZV_ENVELOPE__INIT;
	Zerod__V1__RdzvCurveAuth auth;
	struct rdzv_job *rj = c->rj;
	char why[160];

	if (rdzv_sec_on_reply(c->sec, m->curve, &auth, why, sizeof(why)) != 0) {
		job_fail(rj->j, ZC_ECONNECT, true, "the zerod serving the rendezvous at %s: %s",
			 rj->endpoint, why);
		conn_gone(c, why);
		return;
	}
	env.body_case = ZEROD__V1__RDZV_ENVELOPE__BODY_CURVE_AUTH;
	env.curve_auth = &auth;
	conn_send(c, &env);
	rdzv_sec_start(c->sec);
	c->st = CS_HELLO;
	send_hello(c);
}

static void connect_up(struct rdzv_job *rj)
{
	struct rdzv_daemon *rd = rj->rd;
	Zerod__V1__RdzvEnvelope env = ZEROD__V1__RDZV_ENVELOPE__INIT;
	Zerod__V1__RdzvCurve cv;
	int one = 1, fd = socket(rj->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	struct rconn *c;

	if (fd < 0) {
		schedule_retry(rj, strerror(errno));
		return;
	}
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	if (connect(fd, (struct sockaddr *)&rj->addr, rj->addrlen) < 0 && errno != EINPROGRESS) {
		schedule_retry(rj, strerror(errno));
		close(fd);
		return;
	}
	c = conn_new(rd, fd, false);
	if (!c) {
		close(fd);
		schedule_retry(rj, "out of memory");
		return;
	}
	c->rj = rj;
	c->kind = ZEROD__V1__RDZV_KIND__RDZV_JOIN;
	c->st = CS_CONNECTING;
	c->deadline = now_ms() + rd->d->cfg.hello_timeout_ms;
	snprintf(c->peer, sizeof(c->peer), "%.63s", rj->endpoint);
	rj->up = c;
	/* queued: it leaves once connected */
	if (rd->keys) {
		if (rdzv_sec_new(rd->keys, false, &c->sec) < 0) {
			c->dead = true;
			schedule_retry(rj, "out of memory");
			return;
		}
		rdzv_sec_hello(c->sec, &cv);
		env.body_case = ZEROD__V1__RDZV_ENVELOPE__BODY_CURVE;
		env.curve = &cv;
		conn_send(c, &env);
	} else {
		send_hello(c);
	}
	c->want_out = true;
	loop_want_out(rd->d->loop, fd, true);
}

/* ------------------------------------------------------- dispatch --- */

enum { ROLE_HOST = 1, ROLE_NODE = 2 };
#define ANY_STATE (-1)

static const struct handler {
	Zerod__V1__RdzvEnvelope__BodyCase body;
	unsigned role;
	int state;     /* enum conn_state, or ANY_STATE */
	unsigned kind; /* 0: any */
	void (*fn)(struct rconn *c, const Zerod__V1__RdzvEnvelope *m);
} handlers[] = {
	{ZEROD__V1__RDZV_ENVELOPE__BODY_CURVE, ROLE_HOST, CS_CURVE, 0, on_curve},
	{ZEROD__V1__RDZV_ENVELOPE__BODY_CURVE, ROLE_HOST, CS_HELLO, 0, on_curve},
	{ZEROD__V1__RDZV_ENVELOPE__BODY_CURVE_AUTH, ROLE_HOST, CS_CURVE, 0, on_curve_auth},
	{ZEROD__V1__RDZV_ENVELOPE__BODY_HELLO, ROLE_HOST, CS_CURVE, 0, on_plain_hello},
	{ZEROD__V1__RDZV_ENVELOPE__BODY_HELLO, ROLE_HOST, CS_HELLO, 0, on_hello},
	{ZEROD__V1__RDZV_ENVELOPE__BODY_AUTH, ROLE_HOST, CS_AUTH, 0, on_auth},
	{ZEROD__V1__RDZV_ENVELOPE__BODY_JOIN, ROLE_HOST, CS_OPEN, ZEROD__V1__RDZV_KIND__RDZV_JOIN,
	 on_join},
	{ZEROD__V1__RDZV_ENVELOPE__BODY_FAIL, ROLE_HOST, CS_OPEN, ZEROD__V1__RDZV_KIND__RDZV_JOIN,
	 on_node_fail},
	{ZEROD__V1__RDZV_ENVELOPE__BODY_STORE_SET, ROLE_HOST, CS_OPEN,
	 ZEROD__V1__RDZV_KIND__RDZV_STORE, on_store_set},
	{ZEROD__V1__RDZV_ENVELOPE__BODY_STORE_GET, ROLE_HOST, CS_OPEN,
	 ZEROD__V1__RDZV_KIND__RDZV_STORE, on_store_get},
	{ZEROD__V1__RDZV_ENVELOPE__BODY_CURVE, ROLE_NODE, CS_CURVE, 0, on_curve_reply},
	{ZEROD__V1__RDZV_ENVELOPE__BODY_CHALLENGE, ROLE_NODE, CS_HELLO, 0, on_challenge},
	{ZEROD__V1__RDZV_ENVELOPE__BODY_WELCOME, ROLE_NODE, CS_AUTH, 0, on_welcome},
	{ZEROD__V1__RDZV_ENVELOPE__BODY_FAIL, ROLE_NODE, ANY_STATE, 0, on_host_fail},
	{ZEROD__V1__RDZV_ENVELOPE__BODY_FORMED, ROLE_NODE, CS_OPEN, 0, on_formed},
	{ZEROD__V1__RDZV_ENVELOPE__BODY_NODE_LOST, ROLE_NODE, CS_OPEN, 0, on_node_lost},
};

/* A peer broke the protocol: the host refuses it (and logs it), a node
 * treats it as a lost connection. */
static void protocol_error(struct rconn *c, const char *what)
{
	char msg[200];

	if (!c->server) {
		snprintf(msg, sizeof(msg), "the rendezvous sent %s", what);
		conn_gone(c, msg);
		return;
	}
	peer_log(c->rd, "rendezvous %s: refused %s: %s", c->lst ? c->lst->name : "?", c->peer,
		 what);
	snprintf(msg, sizeof(msg), "refused: %s", what);
	if (c->st == CS_OPEN)
		refuse(c, ZC_EPROTO, msg);
	else
		c->dead = true; /* garbage gets no answer */
}

static void dispatch(struct rconn *c, const Zerod__V1__RdzvEnvelope *m)
{
	unsigned role = c->server ? ROLE_HOST : ROLE_NODE;
	char what[96];

	for (size_t i = 0; i < ARRAY_SIZE(handlers); i++) {
		const struct handler *h = &handlers[i];
		if (h->body != m->body_case || h->role != role ||
		    (h->state != ANY_STATE && h->state != (int)c->st) ||
		    (h->kind && h->kind != c->kind))
			continue;
		h->fn(c, m);
		return;
	}
	snprintf(what, sizeof(what), "%s out of turn", rdzv_msg_name(m->body_case));
	protocol_error(c, what);
}

/* A sealed frame did not open: changed, replayed, reordered or cut on the
 * way. The host refuses the peer (a joined node hears why, sealed: the
 * way out still works); a node drops its connection as lost. */
static void curve_broken(struct rconn *c)
{
	static const char what[] = "a sealed frame that fails to open (changed, replayed, "
				   "reordered or cut on the way)";
	char msg[256];

	if (!c->server) {
		log_notice("rendezvous %s: %s", c->peer, what);
		snprintf(msg, sizeof(msg), "the rendezvous sent %s", what);
		conn_gone(c, msg);
		return;
	}
	peer_log(c->rd, "rendezvous %s: refused %s (CURVE key %s): %s", c->lst->name, c->peer,
		 rdzv_sec_peer(c->sec), what);
	snprintf(msg, sizeof(msg), "the rendezvous at %s refused this node: it received %s",
		 c->lst->name, what);
	if (c->st == CS_OPEN)
		refuse(c, ZC_ECONNECT, msg);
	else
		c->dead = true;
}

/* One frame in: on a CURVE connection, once its handshake is done, every
 * frame must be sealed and open; before it (or without CURVE) none may be. */
static void on_frame(struct rconn *c, const Zerod__V1__RdzvEnvelope *m)
{
	bool sealed = m->body_case == ZEROD__V1__RDZV_ENVELOPE__BODY_SEALED;
	bool secure = c->sec && rdzv_sec_ready(c->sec);
	Zerod__V1__RdzvEnvelope *inner = NULL;
	int r;

	if (!sealed && !secure) {
		dispatch(c, m);
		return;
	}
	if (!secure) {
		protocol_error(c, c->sec ? "a sealed frame before its CURVE handshake ended"
					 : "a sealed frame, and this connection has no CURVE");
		return;
	}
	if (!sealed) {
		protocol_error(c, "a plain frame on a CURVE connection");
		return;
	}
	r = rdzv_sec_open(c->sec, &m->sealed, &inner);
	if (r == -EBADMSG) {
		curve_broken(c);
		return;
	}
	if (r < 0) {
		protocol_error(c, "a sealed frame that holds no rendezvous message");
		return;
	}
	dispatch(c, inner);
	rdzv_msg_free(inner);
}

/* ------------------------------------------------ connection events --- */

/* c is gone (closed, broken, refused the node): what that means for its
 * job. Marks it dead; its owner frees it. */
static void conn_gone(struct rconn *c, const char *why)
{
	struct rdzv_job *rj = c->rj;
	char name[NAME_LEN + 16];

	if (c->dead && !rj)
		return;
	c->dead = true;
	if (!rj)
		return;
	if (!c->server && rj->up == c) {
		rj->up = NULL;
		c->rj = NULL;
		if (job_ended(rj->j))
			return;
		if (!rj->formed) {
			schedule_retry(rj, why);
			return;
		}
		log_notice("job %s: lost the rendezvous at %s (%s); the job goes on until it "
			   "needs it",
			   rj->j->id, rj->endpoint, why);
		node_lost(rj, rj->host_node);
		return;
	}
	if (c->server && c->kind == ZEROD__V1__RDZV_KIND__RDZV_JOIN && c->joined &&
	    !job_ended(rj->j)) {
		if (!rj->formed) {
			log_notice("job %s: rendezvous: %s left before the job formed (%s)",
				   rj->j->id, c->peer, why);
			c->rj = NULL;
			return;
		}
		for (uint32_t k = 0; k < rj->nnodes; k++) {
			Zerod__V1__RdzvEnvelope env = ZEROD__V1__RDZV_ENVELOPE__INIT;
			Zerod__V1__RdzvNodeLost nl = ZEROD__V1__RDZV_NODE_LOST__INIT;
			if (rj->node_conn[k] != c)
				continue;
			log_notice("job %s: rendezvous: lost %s (%s)", rj->j->id,
				   node_name(rj, k, name, sizeof(name)), why);
			rj->node_conn[k] = NULL;
			nl.node = k;
			env.body_case = ZEROD__V1__RDZV_ENVELOPE__BODY_NODE_LOST;
			env.node_lost = &nl;
			for (uint32_t q = 0; q < rj->nnodes; q++)
				if (rj->node_conn[q])
					conn_send(rj->node_conn[q], &env);
			node_lost(rj, k);
		}
	}
	c->rj = NULL;
}

static void connected(struct rconn *c)
{
	int err = 0;
	socklen_t len = sizeof(err);

	if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
		err = errno;
	if (err) {
		conn_gone(c, strerror(err));
		return;
	}
	c->st = c->sec ? CS_CURVE : CS_HELLO;
	flush(c); /* the Hello, or the Curve before it */
}

/* Read what is there (at most RDZV_READ_CHUNK a turn; epoll calls again for
 * more) and handle every whole frame. */
static void read_in(struct rconn *c)
{
	size_t want = 4, have;
	ssize_t n;

	if (c->in_len >= 4)
		want = 4 + (size_t)rdzv_frame_len(c->in);
	if (c->in_len >= 4 && want - 4 > max_frame(c)) {
		protocol_error(c, "a frame larger than allowed");
		return;
	}
	have = MAX(want, c->in_len + 4096);
	have = MIN(have, c->in_len + RDZV_READ_CHUNK);
	if (have > c->in_cap) {
		uint8_t *b = realloc(c->in, have);
		if (!b) {
			conn_gone(c, "out of memory");
			return;
		}
		c->in = b;
		c->in_cap = have;
	}
	n = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, MSG_DONTWAIT);
	if (n == 0) {
		conn_gone(c, "closed the connection");
		return;
	}
	if (n < 0) {
		if (errno != EAGAIN && errno != EINTR)
			conn_gone(c, strerror(errno));
		return;
	}
	c->in_len += (size_t)n;
	while (!c->dead && c->in_len >= 4) {
		size_t len = rdzv_frame_len(c->in);
		Zerod__V1__RdzvEnvelope *m;
		if (len > max_frame(c)) {
			protocol_error(c, "a frame larger than allowed (not a zerod rendezvous?)");
			return;
		}
		if (c->in_len < 4 + len)
			return;
		m = rdzv_msg_decode(c->in + 4, len);
		if (!m) {
			protocol_error(c, "bytes that are not a rendezvous message");
			return;
		}
		on_frame(c, m);
		rdzv_msg_free(m);
		memmove(c->in, c->in + 4 + len, c->in_len - 4 - len);
		c->in_len -= 4 + len;
		if (c->st == CS_CLOSING)
			return; /* nothing more is read from it */
	}
}

/* A connection on its way out reads nothing more: what comes is dropped
 * (level-triggered epoll would call again and again for it). */
static void drain(struct rconn *c)
{
	uint8_t scratch[4096];

	for (int i = 0; i < 16; i++) {
		ssize_t n = recv(c->fd, scratch, sizeof(scratch), MSG_DONTWAIT);
		if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
			c->dead = true;
		if (n <= 0)
			return;
	}
}

static void on_conn(struct loop *l, void *userdata)
{
	struct rconn *c = userdata;

	(void)l;
	if (!c->dead && c->st == CS_CONNECTING)
		connected(c);
	if (!c->dead)
		flush(c);
	if (!c->dead && c->st == CS_CLOSING)
		drain(c);
	else if (!c->dead && c->st != CS_CONNECTING)
		read_in(c);
	if (c->dead) {
		conn_gone(c, "closed");
		conn_free(c);
	}
}

/* ---------------------------------------------------- the resolver --- */

static void *resolve_main(void *arg)
{
	struct resolve *res = arg;
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
	uint64_t one = 1;
	int r = getaddrinfo(res->host, res->port, &hints, &ai);

	if (r != 0) {
		res->err = r == EAI_SYSTEM ? -errno : -EHOSTUNREACH;
		snprintf(res->why, sizeof(res->why), "cannot resolve %.64s: %s", res->host,
			 gai_strerror(r));
	} else {
		/* IPv4 first: what a plain host:port usually means */
		struct addrinfo *pick = ai;
		for (struct addrinfo *p = ai; p; p = p->ai_next)
			if (p->ai_family == AF_INET) {
				pick = p;
				break;
			}
		memcpy(&res->addr, pick->ai_addr, pick->ai_addrlen);
		res->addrlen = pick->ai_addrlen;
		freeaddrinfo(ai);
	}
	pthread_mutex_lock(&res->rd->mu);
	res->done = true;
	pthread_mutex_unlock(&res->rd->mu);
	(void)!write(res->rd->efd, &one, sizeof(one));
	return NULL;
}

static void resolved(struct rdzv_job *rj, struct resolve *res)
{
	char err[256];
	int r;

	rj->res = NULL;
	if (job_ended(rj->j))
		return;
	if (res->err) {
		job_fail(rj->j, ZC_ECONNECT, true, "rendezvous %s: %s", rj->endpoint, res->why);
		return;
	}
	rj->addr = res->addr;
	rj->addrlen = res->addrlen;
	rj->resolved = true;
	if (!rj->hosting) {
		connect_up(rj);
		return;
	}
	r = start_hosting(rj, err, sizeof(err));
	if (r < 0) {
		job_fail(rj->j, r, true, "%s", err);
		return;
	}
	maybe_form(rj);
}

static void on_resolved(struct loop *l, void *userdata)
{
	struct rdzv_daemon *rd = userdata;
	uint64_t n;

	(void)l;
	(void)!read(rd->efd, &n, sizeof(n));
	for (;;) {
		struct resolve *res = NULL, **pp;
		pthread_mutex_lock(&rd->mu);
		for (pp = &rd->resolving; *pp; pp = &(*pp)->next)
			if ((*pp)->done) {
				res = *pp;
				*pp = res->next;
				break;
			}
		pthread_mutex_unlock(&rd->mu);
		if (!res)
			return;
		pthread_join(res->thread, NULL);
		if (res->rj)
			resolved(res->rj, res);
		free(res);
	}
}

static void start_resolve(struct rdzv_job *rj)
{
	struct rdzv_daemon *rd = rj->rd;
	struct resolve *res = calloc(1, sizeof(*res));

	if (!res) {
		job_fail(rj->j, ZC_ELIMIT, true, "out of memory");
		return;
	}
	res->rd = rd;
	res->rj = rj;
	snprintf(res->host, sizeof(res->host), "%s", rj->host);
	snprintf(res->port, sizeof(res->port), "%s", rj->port);
	pthread_mutex_lock(&rd->mu);
	if (pthread_create(&res->thread, NULL, resolve_main, res) != 0) {
		pthread_mutex_unlock(&rd->mu);
		free(res);
		job_fail(rj->j, ZC_ELIMIT, true, "cannot start a thread to resolve %s",
			 rj->endpoint);
		return;
	}
	res->next = rd->resolving;
	rd->resolving = res;
	pthread_mutex_unlock(&rd->mu);
	rj->res = res;
}

/* ------------------------------------------------------- the jobs --- */

int rdzv_job_new(struct job *j, const struct rdzv_spec *sp, char *err, size_t errlen)
{
	struct rdzv_job *rj;

	if (!j->d->rdzv) {
		snprintf(err, errlen, "this zerod cannot serve jobs over several nodes");
		return ZC_ENOTSUP;
	}
	if (sp->secret_len == 0 || sp->secret_len > RDZV_SECRET_MAX) {
		snprintf(err, errlen, "a job over several nodes needs a secret of 1..%d bytes",
			 RDZV_SECRET_MAX);
		return ZC_EPROTO;
	}
	rj = calloc(1, sizeof(*rj));
	if (!rj) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	if (!rdzv_split_endpoint(sp->endpoint, rj->host, sizeof(rj->host), rj->port,
				 sizeof(rj->port))) {
		snprintf(err, errlen, "rendezvous \"%.64s\": want host:port", sp->endpoint);
		free(rj);
		return ZC_EPROTO;
	}
	/* a zerod running as root must not squat a privileged port for anyone */
	if (atoi(rj->port) < 1024 && j->uid != 0) {
		snprintf(err, errlen, "rendezvous port %s: ports below 1024 only for root's jobs",
			 rj->port);
		free(rj);
		return ZC_EPROTO;
	}
	rj->j = j;
	rj->rd = j->d->rdzv;
	snprintf(rj->endpoint, sizeof(rj->endpoint), "%s", sp->endpoint);
	rj->nnodes = sp->nnodes;
	rj->has_node_rank = sp->has_node_rank;
	rj->node_rank = sp->node_rank;
	memcpy(rj->secret, sp->secret, sp->secret_len);
	rj->secret_len = sp->secret_len;
	j->rdzv = rj;
	return 0;
}

int rdzv_check_spec(const struct job *j, uint32_t rank, const struct rdzv_spec *sp, char *err,
		    size_t errlen)
{
	const struct rdzv_job *rj = j->rdzv;
	const char *field = NULL;

	if (!rj != !sp)
		field = "rendezvous (ZEROD_RDZV)";
	else if (!rj)
		return 0;
	else if (strcmp(rj->endpoint, sp->endpoint) != 0)
		field = "rendezvous (ZEROD_RDZV)";
	else if (rj->nnodes != sp->nnodes)
		field = "node count (ZEROD_NNODES)";
	else if (rj->has_node_rank != sp->has_node_rank || rj->node_rank != sp->node_rank)
		field = "node rank (ZEROD_NODE_RANK)";
	else if (rj->secret_len != sp->secret_len ||
		 sodium_memcmp(rj->secret, sp->secret, sp->secret_len) != 0)
		field = "secret (ZEROD_JOB_SECRET)";
	if (!field)
		return 0;
	snprintf(err, errlen, "job %s: rank %u names another %s than the ranks before it", j->id,
		 rank, field);
	return ZC_EWORLD;
}

void rdzv_local_joined(struct job *j)
{
	struct rdzv_job *rj = j->rdzv;

	rj->hosting = rj->has_node_rank ? rj->node_rank == 0 : j->ranks[0] != NULL;
	log_info("job %s: %s the rendezvous at %s (%u nodes)", j->id,
		 rj->hosting ? "serving" : "joining", rj->endpoint, rj->nnodes);
	start_resolve(rj);
}

void rdzv_local_ready(struct job *j)
{
	struct rdzv_job *rj = j->rdzv;

	rj->local_ready = true;
	rj->ready_ms = now_ms();
	if (rj->hosting)
		maybe_form(rj);
	else if (rj->up && rj->up->st == CS_OPEN && !rj->join_sent)
		send_join(rj);
}

void rdzv_topology(const struct job *j, uint32_t *node_of, uint32_t *ret_node, uint32_t *ret_nnodes)
{
	const struct rdzv_job *rj = j->rdzv;

	memcpy(node_of, rj->node_of, j->world * sizeof(*node_of));
	*ret_node = rj->node;
	*ret_nnodes = rj->nnodes;
}

const struct coll_net *rdzv_net(struct job *j)
{
	return &j->rdzv->net;
}

void rdzv_replanned(struct job *j)
{
	struct rdzv_job *rj = j->rdzv;

	/* under the job's prefix (node 0's store takes nothing else), and the
	 * same on every node: each counts the job's re-plans alike */
	rj->run++;
	snprintf(rj->run_prefix, sizeof(rj->run_prefix), "%sp%u/", rj->prefix, rj->run);
	rj->net.prefix = rj->run_prefix;
}

void rdzv_job_free(struct job *j)
{
	struct rdzv_job *rj = j->rdzv;

	if (!rj)
		return;
	if (rj->res)
		rj->res->rj = NULL;
	for (struct rconn *c = rj->rd->conns, *next; c; c = next) {
		next = c->next;
		if (c->rj == rj)
			conn_free(c);
	}
	listener_put(rj->lst);
	rdzv_store_free(rj->store);
	while (rj->kv) {
		struct kv *e = rj->kv;
		rj->kv = e->next;
		free(e->key);
		free(e->value);
		free(e);
	}
	free(rj->node_of);
	free(rj->names);
	free(rj->lost);
	free(rj->node_conn);
	sodium_memzero(rj->secret, sizeof(rj->secret));
	free(rj);
	j->rdzv = NULL;
}

/* ------------------------------------------------------- deadlines --- */

static int64_t job_deadline(const struct rdzv_job *rj, bool *ret_joined)
{
	const struct daemon *d = rj->rd->d;
	bool joined = !rj->hosting && rj->join_sent && rj->up && rj->up->st == CS_OPEN;

	*ret_joined = joined;
	if (!rj->local_ready || rj->formed || job_ended(rj->j))
		return LOOP_NEVER;
	/* a node that joined leaves the verdict to the host, which relays
	 * it; its own clock only guards against a host that went silent */
	if (joined)
		return rj->ready_ms + 2 * (int64_t)d->cfg.join_timeout_ms + 5000;
	return rj->ready_ms + d->cfg.join_timeout_ms;
}

int64_t rdzv_next_deadline(struct daemon *d)
{
	struct rdzv_daemon *rd = d->rdzv;
	int64_t next = LOOP_NEVER;
	bool joined;

	if (!rd)
		return next;
	for (struct rconn *c = rd->conns; c; c = c->next) {
		if (c->dead)
			return 0;
		if (c->deadline)
			next = MIN(next, c->deadline);
	}
	for (struct job *j = d->jobs; j; j = j->next) {
		struct rdzv_job *rj = j->rdzv;
		if (!rj || job_ended(j))
			continue;
		next = MIN(next, job_deadline(rj, &joined));
		if (rj->blame_pending)
			next = MIN(next, rj->blame_deadline);
		if (!rj->hosting && rj->resolved && !rj->up && !rj->formed)
			next = MIN(next, rj->retry_at);
	}
	return next;
}

void rdzv_tick(struct daemon *d, int64_t now)
{
	struct rdzv_daemon *rd = d->rdzv;
	bool joined;

	if (!rd)
		return;
	for (struct job *j = d->jobs; j; j = j->next) {
		struct rdzv_job *rj = j->rdzv;
		if (!rj || job_ended(j))
			continue;
		if (rj->blame_pending && now >= rj->blame_deadline) {
			rj->blame_pending = false;
			job_fail(j, ZC_EINTERNAL, true, "%s (no node was reported lost)",
				 rj->blame_what);
			continue;
		}
		if (now >= job_deadline(rj, &joined)) {
			if (rj->hosting)
				fail_missing(rj);
			else if (joined)
				job_fail(j, ZC_ETIMEDOUT, true,
					 "the rendezvous at %s (node 0) has not formed the job in "
					 "%d ms",
					 rj->endpoint, (int)(now - rj->ready_ms));
			else
				job_fail(j, ZC_ETIMEDOUT, true,
					 "node 0 did not let this node join within %d ms: the "
					 "rendezvous at %s: %s",
					 d->cfg.join_timeout_ms, rj->endpoint,
					 rj->last_err[0] ? rj->last_err : "no answer");
			continue;
		}
		if (!rj->hosting && rj->resolved && !rj->up && !rj->formed && now >= rj->retry_at)
			connect_up(rj);
	}
	for (struct rconn *c = rd->conns, *next; c; c = next) {
		next = c->next;
		if (!c->dead && c->deadline && now >= c->deadline) {
			if (c->server && c->st != CS_CLOSING)
				peer_log(rd, "rendezvous %s: closed %s: no handshake within %d ms",
					 c->lst ? c->lst->name : "?", c->peer,
					 d->cfg.hello_timeout_ms);
			conn_gone(c, c->st == CS_CLOSING ? "closed" : "no answer in time");
		}
	}
	/* freeing last: conn_gone() above may have marked others */
	for (struct rconn *c = rd->conns, *next; c; c = next) {
		next = c->next;
		if (c->dead) {
			conn_gone(c, "closed");
			conn_free(c);
			next = rd->conns; /* conn_gone() may have marked others */
		}
	}
}

/* ------------------------------------------------------- the daemon --- */

int rdzv_init(struct daemon *d)
{
	struct rdzv_daemon *rd;
	int r;

	if (sodium_init() < 0)
		return -EIO;
	rd = calloc(1, sizeof(*rd));
	if (!rd)
		return -ENOMEM;
	rd->d = d;
	pthread_mutex_init(&rd->mu, NULL);
	rd->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (rd->efd < 0) {
		r = -errno;
		free(rd);
		return r;
	}
	r = loop_add_fd(d->loop, rd->efd, on_resolved, rd);
	if (r < 0) {
		close(rd->efd);
		free(rd);
		return r;
	}
	d->rdzv = rd;
	return 0;
}

void rdzv_close_all(struct daemon *d)
{
	struct rdzv_daemon *rd = d->rdzv;

	if (!rd)
		return;
	while (rd->conns)
		conn_free(rd->conns);
	while (rd->listeners) {
		rd->listeners->refs = 1;
		listener_put(rd->listeners);
	}
	pthread_mutex_lock(&rd->mu);
	while (rd->resolving) {
		struct resolve *res = rd->resolving;
		rd->resolving = res->next;
		pthread_mutex_unlock(&rd->mu);
		pthread_join(res->thread, NULL);
		free(res);
		pthread_mutex_lock(&rd->mu);
	}
	pthread_mutex_unlock(&rd->mu);
	loop_remove_fd(d->loop, rd->efd);
	close(rd->efd);
	pthread_mutex_destroy(&rd->mu);
	rdzv_keys_free(rd->keys);
	free(rd);
	d->rdzv = NULL;
}

/* ------------------------------------------- for the control socket --- */

size_t rdzv_serving(const struct daemon *d, const char **names, size_t max)
{
	size_t n = 0;

	for (const struct listener *ls = d->rdzv ? d->rdzv->listeners : NULL; ls && n < max;
	     ls = ls->next)
		names[n++] = ls->name;
	return n;
}

const char *rdzv_job_endpoint(const struct job *j, bool *ret_serving)
{
	if (!j->rdzv)
		return NULL;
	*ret_serving = j->rdzv->hosting && j->rdzv->lst;
	return j->rdzv->endpoint;
}

void rdzv_curve_use(struct daemon *d, struct rdzv_keys *keys)
{
	d->rdzv->keys = keys;
}

const char *rdzv_curve_public(const struct daemon *d)
{
	return d->rdzv && d->rdzv->keys ? rdzv_keys_public(d->rdzv->keys) : NULL;
}
