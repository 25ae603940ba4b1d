/*
 * rdzvnet.c — the daemon-to-daemon transport of the rendezvous (see
 * rdzvnet.h), on the loop thread. Owns the listening sockets and every
 * daemon-to-daemon TCP connection; what a connection's messages mean for
 * the job it belongs to is its owner's (core/rdzv.c), told through the
 * owner's table of callbacks.
 *
 * A connection. TCP, and TLS 1.3 over it from its first byte (net/tls.h):
 * mutual certificates where this zerod has a TLS identity (--tls-key,
 * --tls-cert, --tls-peers/--tls-ca), else the external PSK of the job's
 * secret, whose identity names no job. Inside it, frames of rdzvwire.h,
 * non-blocking both ways (output waits in a buffer until the socket takes
 * it). Nothing is read as a message before the handshake ends. Then the
 * node's Hello binds the connection to its job (the job id, its kind, an
 * HMAC under the job's secret over them and this connection's exporter)
 * and the host's Welcome proves the same the other way. Until its Hello
 * is proven a peer may send one small frame, has hello_timeout_ms for the
 * handshake and the Hello together, and at most RDZV_MAX_UNAUTH such peers
 * are kept, at most RDZV_MAX_UNAUTH_ADDR of them from one address (so that
 * a few silent strangers cannot keep the nodes of a job out); handshakes
 * run side by side on the loop. A failed handshake, a wrong proof, a frame
 * that is not a message, a message out of turn are refused, logged with
 * the peer's address (at most RDZV_LOG_PER_SEC lines a second) and closed.
 * Every refusal a peer can see before its Hello is proven is the same: a
 * TLS handshake failure, or one Fail text. None of it touches a job.
 *
 * The end of a connection: close_notify on the way out; a stream that ends
 * without one was cut (or truncated on the way), and is named so.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common.h"
#include "zeroclient.h"
#include "base/log.h"
#include "base/loop.h"
#include "net/rdzvnet.h"
#include "net/rnet_int.h"
#include "net/tls.h"
#include "wire.h"

#define RDZV_MAX_UNAUTH  64   /* connections that have not proven a secret */
#define RDZV_MAX_UNAUTH_ADDR 16   /* ... of them from one address */
#define RDZV_CLOSE_MS    1000 /* flushing a last message before closing */
#define RDZV_READ_CHUNK  (1u << 20)
#define RDZV_OUT_MAX     (64u << 20)
#define RDZV_LOG_PER_SEC 20

static void conn_free(struct rnet_conn *c);
static void on_conn(struct loop *l, void *userdata);

/* --------------------------------------------------------- helpers --- */

void rnet_peer_log(struct rnet *rn, const char *fmt, ...)
{
	int64_t now = now_ms();
	char line[400];
	va_list ap;

	if (now - rn->log_window >= 1000) {
		if (rn->log_dropped)
			log_notice("rendezvous: %u more refusals were not logged", rn->log_dropped);
		rn->log_window = now;
		rn->log_count = 0;
		rn->log_dropped = 0;
	}
	if (rn->log_count >= RDZV_LOG_PER_SEC) {
		rn->log_dropped++;
		return;
	}
	rn->log_count++;
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

void rnet_local_name(int fd, char *buf, size_t len)
{
	struct sockaddr_storage sa;
	socklen_t sl = sizeof(sa);

	if (getsockname(fd, (struct sockaddr *)&sa, &sl) < 0)
		snprintf(buf, len, "?");
	else
		addr_name(&sa, false, buf, len);
}

/* ------------------------------------------------------ connections --- */

static size_t max_frame(const struct rnet_conn *c)
{
	return c->st == CS_OPEN ? ZEROD_MAX_MSG_BYTES : RDZV_UNAUTH_FRAME;
}

static void want_out(struct rnet_conn *c, bool on)
{
	if (!c->dead && c->want_out != on) {
		c->want_out = on;
		loop_want_out(c->rn->loop, c->fd, on);
	}
}

/* Write what is queued, once the TLS handshake is done; want EPOLLOUT
 * while some is left. Never frees c. */
static void flush(struct rnet_conn *c)
{
	char why[200];
	bool blocked = false;

	if (c->st < CS_HELLO)
		return; /* the handshake writes its own */
	while (c->out_off < c->out_len && !c->dead) {
		size_t n;
		enum tls_io io = tls_write(c->ssl, c->out + c->out_off, c->out_len - c->out_off, &n,
					   why, sizeof(why));
		if (io == TLS_IO_OK) {
			c->out_off += n;
			continue;
		}
		if (io == TLS_IO_WRITE || io == TLS_IO_READ) {
			blocked = io == TLS_IO_WRITE;
			break;
		}
		snprintf(c->err, sizeof(c->err), "%.150s", why);
		c->dead = true;
	}
	if (c->out_off == c->out_len) {
		c->out_off = c->out_len = 0;
		if (c->st == CS_CLOSING)
			c->dead = true; /* its close_notify leaves as it is freed */
	}
	want_out(c, blocked || c->out_len > 0);
}

/* Queue one message and write what can be (once the handshake is done).
 * Never frees c: a connection that cannot take it is marked dead. */
void rnet_send(struct rnet_conn *c, const Zerod__V1__RdzvEnvelope *env)
{
	uint8_t *buf;
	size_t len;
	int r;

	if (c->dead || c->st == CS_CLOSING)
		return;
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
	flush(c);
}

void rnet_send_fail(struct rnet_conn *c, int code, const char *msg, uint64_t iteration, bool quiet)
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
	rnet_send(c, &env);
}

void rnet_send_reform(struct rnet_conn *c, uint32_t rank, uint64_t iteration, bool undo,
		      const char *msg)
{
	Zerod__V1__RdzvEnvelope env = ZEROD__V1__RDZV_ENVELOPE__INIT;
	Zerod__V1__RdzvReform f = ZEROD__V1__RDZV_REFORM__INIT;

	f.rank = rank;
	f.iteration = iteration;
	f.message = (char *)msg;
	f.has_undo = undo;
	f.undo = undo;
	env.body_case = ZEROD__V1__RDZV_ENVELOPE__BODY_REFORM;
	env.reform = &f;
	rnet_send(c, &env);
}

/* Send a last word, then close once it is out (or after RDZV_CLOSE_MS). */
void rnet_refuse(struct rnet_conn *c, int code, const char *msg)
{
	rnet_send_fail(c, code, msg, UINT64_MAX, false);
	if (c->dead)
		return;
	c->st = CS_CLOSING;
	c->deadline = now_ms() + RDZV_CLOSE_MS;
	flush(c);
}

static struct rnet_conn *conn_new(struct rnet *rn, int fd, bool server)
{
	struct rnet_conn *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	c->rn = rn;
	c->fd = fd;
	c->server = server;
	if (loop_add_fd(rn->loop, fd, on_conn, c) < 0) {
		free(c);
		return NULL;
	}
	c->next = rn->conns;
	rn->conns = c;
	return c;
}

static void conn_free(struct rnet_conn *c)
{
	struct rnet *rn = c->rn;

	for (struct rnet_conn **pp = &rn->conns; *pp; pp = &(*pp)->next)
		if (*pp == c) {
			*pp = c->next;
			break;
		}
	if (c->unauth)
		rn->nunauth--;
	if (c->sc || c->priv)
		rn->ops->freed(rn->ctx, c);
	loop_remove_fd(rn->loop, c->fd);
	tls_free(c->ssl);
	close(c->fd);
	free(c->in);
	free(c->out);
	free(c);
}

/* The one refusal every peer gets before its Hello is proven, whatever
 * the reason (ZC_ESTATE: a node asks again until its join timeout); the
 * reason is the operator's, in the log. */
static void refuse_unproven(struct rnet_conn *c)
{
	char msg[200];

	snprintf(msg, sizeof(msg),
		 "the rendezvous at %s refused this node: the secrets differ, or it serves no "
		 "job of that id (yet, or any more)",
		 c->lst->name);
	c->sc = NULL; /* it never belonged to a job */
	rnet_refuse(c, ZC_ESTATE, msg);
}

/* The host: a node's Hello, inside TLS. It names its job and proves the
 * job's secret on this connection; under a PSK it must be the job whose
 * PSK the handshake matched. */
static void on_hello(struct rnet_conn *c, const Zerod__V1__RdzvEnvelope *m)
{
	Zerod__V1__RdzvEnvelope env = ZEROD__V1__RDZV_ENVELOPE__INIT;
	Zerod__V1__RdzvWelcome w = ZEROD__V1__RDZV_WELCOME__INIT;
	const Zerod__V1__RdzvHello *h = m->hello;
	uint8_t want[RDZV_PROOF_BYTES];
	struct rnet_scope *sc;
	char msg[256];
	int code = 0;

	if (h->protocol_version != RDZV_PROTOCOL || !job_id_valid(h->job_id) ||
	    (h->kind != ZEROD__V1__RDZV_KIND__RDZV_JOIN &&
	     h->kind != ZEROD__V1__RDZV_KIND__RDZV_STORE)) {
		rnet_peer_log(c->rn, "rendezvous %s: refused %s: a Hello of another protocol",
			      c->lst->name, c->peer);
		rnet_refuse(c, ZC_EVERSION, "not a zerod rendezvous Hello this zerod speaks");
		return;
	}
	sc = c->rn->ops->hello(c->rn->ctx, c->lst, h->job_id, &code, msg, sizeof(msg));
	if (!sc) {
		rnet_peer_log(c->rn, "rendezvous %s: refused %s: %s", c->lst->name, c->peer, msg);
		refuse_unproven(c);
		return;
	}
	if (!c->rn->ident && !tls_equal(c->psk_id, sc->psk_id, TLS_PSK_ID_BYTES)) {
		rnet_peer_log(c->rn,
			      "rendezvous %s: refused %s: its Hello names job %s, and its PSK is "
			      "another job's",
			      c->lst->name, c->peer, sc->id);
		refuse_unproven(c);
		return;
	}
	rdzv_proof(want, sc->secret, sc->secret_len, false, sc->id, h->kind, c->ssl);
	if (!rdzv_proof_ok(want, &h->proof)) {
		rnet_peer_log(c->rn, "rendezvous %s: refused %s: wrong secret for job %s",
			      c->lst->name, c->peer, sc->id);
		refuse_unproven(c);
		return;
	}
	c->sc = sc;
	c->kind = h->kind;
	rdzv_proof(want, sc->secret, sc->secret_len, true, sc->id, c->kind, c->ssl);
	w.proof = (ProtobufCBinaryData){sizeof(want), want};
	env.body_case = ZEROD__V1__RDZV_ENVELOPE__BODY_WELCOME;
	env.welcome = &w;
	c->st = CS_OPEN;
	c->deadline = 0; /* a node's connection lasts as long as its job */
	c->unauth = false;
	c->rn->nunauth--;
	rnet_send(c, &env);
	log_debug("job %s: rendezvous: %s authenticated (%s)", sc->id, c->peer,
		  c->kind == ZEROD__V1__RDZV_KIND__RDZV_JOIN ? "join" : "store");
}

/* How many connections still to prove a secret come from the address of
 * peer ("ADDR:PORT", or "[ADDR]:PORT"). */
static unsigned unauth_from(const struct rnet *rn, const char *peer)
{
	size_t n = strrchr(peer, ':') ? (size_t)(strrchr(peer, ':') - peer) : strlen(peer);
	unsigned k = 0;

	for (const struct rnet_conn *c = rn->conns; c; c = c->next)
		if (c->unauth && !c->dead && strncmp(c->peer, peer, n) == 0 && c->peer[n] == ':')
			k++;
	return k;
}

/* The host, inside a PSK handshake: the key of the job whose PSK identity
 * the peer offers, if this zerod serves one on the peer's listener. */
static bool find_psk(void *arg, const uint8_t id[TLS_PSK_ID_BYTES], uint8_t key[TLS_PSK_BYTES])
{
	struct rnet_conn *c = arg;
	const struct rnet_scope *sc = c->rn->ops->psk(c->rn->ctx, c->lst, id);

	if (!sc) {
		c->psk_unknown = true;
		return false;
	}
	memcpy(c->psk_id, id, TLS_PSK_ID_BYTES);
	memcpy(key, sc->psk_key, TLS_PSK_BYTES);
	return true;
}

static void on_accept(struct loop *l, void *userdata)
{
	struct rnet_listener *ls = userdata;
	struct rnet *rn = ls->rn;

	(void)l;
	for (int n = 0; n < 64; n++) {
		struct sockaddr_storage sa;
		socklen_t sl = sizeof(sa);
		int fd = accept4(ls->fd, (struct sockaddr *)&sa, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
		struct rnet_conn *c;
		char peer[RNET_NAME_LEN];
		int one = 1;

		if (fd < 0)
			return;
		addr_name(&sa, true, peer, sizeof(peer));
		if (unauth_from(rn, peer) >= RDZV_MAX_UNAUTH_ADDR) {
			rnet_peer_log(rn,
				      "rendezvous %s: refused %s: %u connections from its address "
				      "are still to prove a secret",
				      ls->name, peer, RDZV_MAX_UNAUTH_ADDR);
			close(fd);
			continue;
		}
		if (rn->nunauth >= RDZV_MAX_UNAUTH) {
			rnet_peer_log(
				rn,
				"rendezvous %s: refused %s: %u connections are still to prove "
				"a secret",
				ls->name, peer, rn->nunauth);
			close(fd);
			continue;
		}
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		c = conn_new(rn, fd, true);
		if (!c) {
			close(fd);
			continue;
		}
		c->lst = ls;
		c->st = CS_TLS;
		c->ssl = tls_new(rn->ident ? rn->srv : rn->psk_srv, fd, true);
		if (!c->ssl || (!rn->ident && tls_psk_server(c->ssl, find_psk, c) < 0)) {
			conn_free(c);
			continue;
		}
		c->unauth = true;
		rn->nunauth++;
		c->deadline = now_ms() + *rn->hello_timeout_ms;
		snprintf(c->peer, sizeof(c->peer), "%s", peer);
	}
}

void rnet_listener_put(struct rnet_listener *ls)
{
	struct rnet *rn;

	if (!ls || --ls->refs > 0)
		return;
	rn = ls->rn;
	for (struct rnet_conn *c = rn->conns; c; c = c->next)
		if (c->lst == ls)
			c->dead = true;
	for (struct rnet_listener **pp = &rn->listeners; *pp; pp = &(*pp)->next)
		if (*pp == ls) {
			*pp = ls->next;
			break;
		}
	log_info("rendezvous: stopped serving %s", ls->name);
	loop_remove_fd(rn->loop, ls->fd);
	close(ls->fd);
	free(ls);
}

static uint16_t sa_port(const struct sockaddr_storage *sa)
{
	return sa->ss_family == AF_INET6 ? ntohs(((const struct sockaddr_in6 *)sa)->sin6_port)
					 : ntohs(((const struct sockaddr_in *)sa)->sin_port);
}

/* Serve the port of an endpoint: bind the address it names (or, when that
 * is not this machine's, e.g. behind NAT, every address), or join the
 * listener already there. */
int rnet_listen(struct rnet *rn, const struct sockaddr_storage *addr, socklen_t addrlen,
		const char *endpoint, struct rnet_listener **ret, char *err, size_t errlen)
{
	uint16_t port = sa_port(addr);
	struct sockaddr_storage sa = *addr;
	socklen_t sl = addrlen;
	struct rnet_listener *ls;
	int one = 1, fd, r;

	for (ls = rn->listeners; ls; ls = ls->next)
		if (ls->port == port)
			break;
	if (ls) {
		ls->refs++;
		*ret = ls;
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
		sa.ss_family = addr->ss_family;
		if (sa.ss_family == AF_INET6)
			((struct sockaddr_in6 *)&sa)->sin6_port = htons(port);
		else
			((struct sockaddr_in *)&sa)->sin_port = htons(port);
		r = bind(fd, (struct sockaddr *)&sa, sl);
	}
	if (r < 0 || listen(fd, 64) < 0) {
		snprintf(err, errlen, "cannot serve the rendezvous on %.100s: %s", endpoint,
			 strerror(errno));
		close(fd);
		return ZC_ECONNECT;
	}
	ls = calloc(1, sizeof(*ls));
	if (!ls || loop_add_fd(rn->loop, fd, on_accept, ls) < 0) {
		free(ls);
		close(fd);
		snprintf(err, errlen, "out of memory");
		return ZC_ELIMIT;
	}
	*ls = (struct rnet_listener){
		.rn = rn, .fd = fd, .port = port, .refs = 1, .next = rn->listeners};
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
	rn->listeners = ls;
	*ret = ls;
	log_info("rendezvous: serving %s", ls->name);
	return 0;
}
const char *rnet_listener_name(const struct rnet_listener *ls)
{
	return ls->name;
}

const struct sockaddr *rnet_listener_addr(const struct rnet_listener *ls, socklen_t *ret_len)
{
	*ret_len = ls->addrlen;
	return (const struct sockaddr *)&ls->addr;
}

size_t rnet_serving(const struct rnet *rn, const char **names, size_t max)
{
	size_t n = 0;

	for (const struct rnet_listener *ls = rn ? rn->listeners : NULL; ls && n < max;
	     ls = ls->next)
		names[n++] = ls->name;
	return n;
}

/* -------------------------------------------------- a node's side --- */

static void on_welcome(struct rnet_conn *c, const Zerod__V1__RdzvEnvelope *m)
{
	struct rnet_scope *sc = c->sc;
	uint8_t want[RDZV_PROOF_BYTES];
	char msg[400];

	rdzv_proof(want, sc->secret, sc->secret_len, true, sc->id, c->kind, c->ssl);
	if (!rdzv_proof_ok(want, &m->welcome->proof)) {
		snprintf(msg, sizeof(msg),
			 "the zerod serving the rendezvous at %s does not know job %s's secret",
			 sc->endpoint, sc->id);
		c->rn->ops->refused(c->rn->ctx, c, ZC_ECONNECT, msg);
		rnet_gone(c, "wrong secret");
		return;
	}
	c->st = CS_OPEN;
	c->deadline = 0;
	c->rn->ops->open(c->rn->ctx, c);
}

/* A node's Hello, once its TLS handshake is done: its job, and the proof
 * that it knows the job's secret, bound to this connection. */
static void send_hello(struct rnet_conn *c)
{
	Zerod__V1__RdzvEnvelope env = ZEROD__V1__RDZV_ENVELOPE__INIT;
	Zerod__V1__RdzvHello h = ZEROD__V1__RDZV_HELLO__INIT;
	uint8_t proof[RDZV_PROOF_BYTES];

	rdzv_proof(proof, c->sc->secret, c->sc->secret_len, false, c->sc->id, c->kind, c->ssl);
	h.protocol_version = RDZV_PROTOCOL;
	h.job_id = (char *)c->sc->id;
	h.kind = c->kind;
	h.proof = (ProtobufCBinaryData){sizeof(proof), proof};
	env.body_case = ZEROD__V1__RDZV_ENVELOPE__BODY_HELLO;
	env.hello = &h;
	rnet_send(c, &env);
}

int rnet_connect(struct rnet *rn, struct rnet_scope *sc, const struct sockaddr_storage *addr,
		 socklen_t addrlen, const char *peer, struct rnet_conn **ret, char *why,
		 size_t whylen)
{
	int one = 1, fd = socket(addr->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	struct rnet_conn *c;

	*ret = NULL;
	if (fd < 0) {
		snprintf(why, whylen, "%s", strerror(errno));
		return -errno;
	}
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	if (connect(fd, (const struct sockaddr *)addr, addrlen) < 0 && errno != EINPROGRESS) {
		int r = -errno;
		snprintf(why, whylen, "%s", strerror(errno));
		close(fd);
		return r;
	}
	c = conn_new(rn, fd, false);
	if (!c) {
		close(fd);
		snprintf(why, whylen, "out of memory");
		return -ENOMEM;
	}
	c->sc = sc;
	c->kind = ZEROD__V1__RDZV_KIND__RDZV_JOIN;
	c->st = CS_CONNECTING;
	c->deadline = now_ms() + *rn->hello_timeout_ms;
	snprintf(c->peer, sizeof(c->peer), "%.63s", peer);
	*ret = c; /* a dead one too: its owner hears of it as it goes */
	c->ssl = tls_new(rn->ident ? rn->cli : rn->psk_cli, fd, false);
	if (c->ssl && !rn->ident && tls_psk_client(c->ssl, sc->psk_id, sc->psk_key) < 0) {
		tls_free(c->ssl);
		c->ssl = NULL;
	}
	if (!c->ssl) {
		c->dead = true;
		snprintf(why, whylen, "out of memory");
		return -ENOMEM;
	}
	c->want_out = true;
	loop_want_out(rn->loop, fd, true);
	return 0;
}

/* ------------------------------------------------------- dispatch --- */

enum { ROLE_HOST = 1, ROLE_NODE = 2 };
#define ANY_STATE (-1)

static const struct handler {
	Zerod__V1__RdzvEnvelope__BodyCase body;
	unsigned role;
	int state;     /* enum rnet_conn_state, or ANY_STATE */
	unsigned kind; /* 0: any */
	/* NULL: the owner's (ops->message) */
	void (*fn)(struct rnet_conn *c, const Zerod__V1__RdzvEnvelope *m);
} handlers[] = {
	{ZEROD__V1__RDZV_ENVELOPE__BODY_HELLO, ROLE_HOST, CS_HELLO, 0, on_hello},
	{ZEROD__V1__RDZV_ENVELOPE__BODY_JOIN, ROLE_HOST, CS_OPEN, ZEROD__V1__RDZV_KIND__RDZV_JOIN,
	 NULL},
	{ZEROD__V1__RDZV_ENVELOPE__BODY_FAIL, ROLE_HOST, CS_OPEN, ZEROD__V1__RDZV_KIND__RDZV_JOIN,
	 NULL},
	{ZEROD__V1__RDZV_ENVELOPE__BODY_REFORM, ROLE_HOST, CS_OPEN, ZEROD__V1__RDZV_KIND__RDZV_JOIN,
	 NULL},
	{ZEROD__V1__RDZV_ENVELOPE__BODY_STORE_SET, ROLE_HOST, CS_OPEN,
	 ZEROD__V1__RDZV_KIND__RDZV_STORE, rnet_kv_set},
	{ZEROD__V1__RDZV_ENVELOPE__BODY_STORE_GET, ROLE_HOST, CS_OPEN,
	 ZEROD__V1__RDZV_KIND__RDZV_STORE, rnet_kv_get},
	{ZEROD__V1__RDZV_ENVELOPE__BODY_WELCOME, ROLE_NODE, CS_HELLO, 0, on_welcome},
	/* from the host, inside TLS: its refusal of the Hello, or the job's end */
	{ZEROD__V1__RDZV_ENVELOPE__BODY_FAIL, ROLE_NODE, ANY_STATE, 0, NULL},
	{ZEROD__V1__RDZV_ENVELOPE__BODY_FORMED, ROLE_NODE, CS_OPEN, 0, NULL},
	{ZEROD__V1__RDZV_ENVELOPE__BODY_NODE_LOST, ROLE_NODE, CS_OPEN, 0, NULL},
	{ZEROD__V1__RDZV_ENVELOPE__BODY_REFORM, ROLE_NODE, CS_OPEN, 0, NULL},
};

/* A peer broke the protocol: the host refuses it (and logs it), a node
 * treats it as a lost connection. */
static void protocol_error(struct rnet_conn *c, const char *what)
{
	char msg[200];

	if (!c->server) {
		snprintf(msg, sizeof(msg), "the rendezvous sent %s", what);
		rnet_gone(c, msg);
		return;
	}
	rnet_peer_log(c->rn, "rendezvous %s: refused %s: %s", c->lst ? c->lst->name : "?", c->peer,
		      what);
	snprintf(msg, sizeof(msg), "refused: %s", what);
	if (c->st == CS_OPEN)
		rnet_refuse(c, ZC_EPROTO, msg);
	else
		c->dead = true; /* garbage gets no answer */
}

static void dispatch(struct rnet_conn *c, const Zerod__V1__RdzvEnvelope *m)
{
	unsigned role = c->server ? ROLE_HOST : ROLE_NODE;
	char what[96];

	for (size_t i = 0; i < ARRAY_SIZE(handlers); i++) {
		const struct handler *h = &handlers[i];
		if (h->body != m->body_case || h->role != role ||
		    (h->state != ANY_STATE && h->state != (int)c->st) ||
		    (h->kind && h->kind != c->kind))
			continue;
		if (h->fn)
			h->fn(c, m);
		else
			c->rn->ops->message(c->rn->ctx, c, m);
		return;
	}
	snprintf(what, sizeof(what), "%s out of turn", rdzv_msg_name(m->body_case));
	protocol_error(c, what);
}

/* A record that failed to open (changed, replayed, reordered on the way),
 * or a TLS error after the handshake: nothing more from c is trusted. */
static void broken(struct rnet_conn *c, const char *why)
{
	char msg[400];

	if (!c->server) {
		log_notice("rendezvous %s: %s", c->peer, why);
		snprintf(msg, sizeof(msg), "the connection to the rendezvous broke: %s", why);
		rnet_gone(c, msg);
		return;
	}
	rnet_peer_log(c->rn, "rendezvous %s: closed %s: %s", c->lst->name, c->peer, why);
	c->dead = true;
}

/* ------------------------------------------------ connection events --- */

void rnet_gone(struct rnet_conn *c, const char *why)
{
	if (c->dead && !c->sc)
		return;
	c->dead = true;
	if (!c->sc)
		return;
	c->rn->ops->gone(c->rn->ctx, c, why);
	c->sc = NULL;
}

static void connected(struct rnet_conn *c)
{
	int err = 0;
	socklen_t len = sizeof(err);

	if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
		err = errno;
	if (err) {
		rnet_gone(c, strerror(err));
		return;
	}
	c->st = CS_TLS;
}

/* A handshake that failed. The host logs why and closes (the peer saw a
 * TLS alert, the same for every reason); a node whose own check refused
 * the host's certificate gives up (ops->refused), else it asks again
 * later: the host may not serve the job yet. */
static void handshake_failed(struct rnet_conn *c, enum tls_io io, const char *why)
{
	char msg[480];

	if (c->server) {
		if (io == TLS_IO_ERROR)
			rnet_peer_log(
				c->rn, "rendezvous %s: refused %s: %s", c->lst->name, c->peer,
				c->psk_unknown ? "its PSK matches no job served here (another "
						 "secret, or a job not served yet or any more)"
				: !c->rn->ident && strstr(why, "signature algorithm")
					? "it offered no PSK (it has TLS keys, --tls-key, and "
					  "this zerod has none; or it is not a zerod)"
					: why);
		c->dead = true;
		return;
	}
	if (strstr(why, "not among the peers")) {
		snprintf(msg, sizeof(msg), "the zerod serving the rendezvous at %s: %s",
			 c->sc->endpoint, why);
		c->rn->ops->refused(c->rn->ctx, c, ZC_ECONNECT, msg);
		rnet_gone(c, why);
		return;
	}
	snprintf(msg, sizeof(msg), "the TLS handshake with the rendezvous failed (%s)%s", why,
		 c->rn->ident ? ""
			      : ": the secrets differ, or it serves no job of that id (yet, or "
				"any more)");
	rnet_gone(c, msg);
}

/* One step of the TLS handshake; once it is done, a node sends its Hello
 * and a host waits for it. */
static void handshake(struct rnet_conn *c)
{
	char why[300];
	enum tls_io io = tls_handshake(c->ssl, why, sizeof(why));

	if (io == TLS_IO_READ || io == TLS_IO_WRITE) {
		want_out(c, io == TLS_IO_WRITE);
		return;
	}
	if (io != TLS_IO_OK) {
		handshake_failed(c, io, why);
		return;
	}
	c->st = CS_HELLO;
	want_out(c, false);
	if (!c->server)
		send_hello(c);
}

/* Read what is there (at most RDZV_READ_CHUNK from the socket a turn;
 * epoll calls again for more, and what TLS holds already is read too) and
 * handle every whole frame. */
static void read_in(struct rnet_conn *c)
{
	size_t budget = RDZV_READ_CHUNK;
	char why[300];

	while (!c->dead && c->st != CS_CLOSING && (budget > 0 || SSL_pending(c->ssl) > 0)) {
		size_t want = 4, have, n;
		enum tls_io io;

		if (c->in_len >= 4)
			want = 4 + (size_t)rdzv_frame_len(c->in);
		if (c->in_len >= 4 && want - 4 > max_frame(c)) {
			protocol_error(c, "a frame larger than allowed (not a zerod rendezvous?)");
			return;
		}
		have = MAX(want, c->in_len + 4096);
		if (have > c->in_cap) {
			uint8_t *b = realloc(c->in, have);
			if (!b) {
				rnet_gone(c, "out of memory");
				return;
			}
			c->in = b;
			c->in_cap = have;
		}
		io = tls_read(c->ssl, c->in + c->in_len, c->in_cap - c->in_len, &n, why,
			      sizeof(why));
		if (io == TLS_IO_READ)
			return;
		if (io == TLS_IO_WRITE) {
			want_out(c, true);
			return;
		}
		if (io == TLS_IO_EOF) {
			rnet_gone(c, "closed the connection");
			return;
		}
		if (io == TLS_IO_CUT) {
			if (c->server && c->st == CS_OPEN)
				rnet_peer_log(c->rn, "rendezvous %s: %s: %s", c->lst->name, c->peer,
					      why);
			rnet_gone(c, why);
			return;
		}
		if (io != TLS_IO_OK) {
			broken(c, why);
			return;
		}
		c->in_len += n;
		budget = n >= budget ? 0 : budget - n;
		while (!c->dead && c->in_len >= 4) {
			size_t len = rdzv_frame_len(c->in);
			Zerod__V1__RdzvEnvelope *m;
			if (len > max_frame(c)) {
				protocol_error(
					c, "a frame larger than allowed (not a zerod rendezvous?)");
				return;
			}
			if (c->in_len < 4 + len)
				break;
			m = rdzv_msg_decode(c->in + 4, len);
			if (!m) {
				protocol_error(c, "bytes that are not a rendezvous message");
				return;
			}
			dispatch(c, m);
			rdzv_msg_free(m);
			memmove(c->in, c->in + 4 + len, c->in_len - 4 - len);
			c->in_len -= 4 + len;
			if (c->st == CS_CLOSING)
				return; /* nothing more is read from it */
		}
	}
}

/* A connection on its way out reads nothing more: what comes is dropped
 * (level-triggered epoll would call again and again for it). */
static void drain(struct rnet_conn *c)
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
	struct rnet_conn *c = userdata;

	(void)l;
	if (!c->dead && c->st == CS_CONNECTING)
		connected(c);
	if (!c->dead && c->st == CS_TLS)
		handshake(c);
	if (!c->dead)
		flush(c);
	if (!c->dead && c->st == CS_CLOSING)
		drain(c);
	else if (!c->dead && c->st >= CS_HELLO)
		read_in(c);
	if (c->dead) {
		rnet_gone(c, c->err[0] ? c->err : "closed");
		conn_free(c);
	}
}

/* ------------------------------------------------------- deadlines --- */

int64_t rnet_next_deadline(const struct rnet *rn)
{
	int64_t next = LOOP_NEVER;

	for (struct rnet_conn *c = rn->conns; c; c = c->next) {
		if (c->dead)
			return 0;
		if (c->deadline)
			next = MIN(next, c->deadline);
	}
	return next;
}

void rnet_tick(struct rnet *rn, int64_t now)
{
	for (struct rnet_conn *c = rn->conns, *next; c; c = next) {
		next = c->next;
		if (!c->dead && c->deadline && now >= c->deadline) {
			if (c->server && c->st != CS_CLOSING)
				rnet_peer_log(rn,
					      "rendezvous %s: closed %s: no handshake within %d ms",
					      c->lst ? c->lst->name : "?", c->peer,
					      *rn->hello_timeout_ms);
			rnet_gone(c, c->st == CS_CLOSING ? "closed" : "no answer in time");
		}
	}
	/* freeing last: rnet_gone() above may have marked others */
	for (struct rnet_conn *c = rn->conns, *next; c; c = next) {
		next = c->next;
		if (c->dead) {
			rnet_gone(c, c->err[0] ? c->err : "closed");
			conn_free(c);
			next = rn->conns; /* rnet_gone() may have marked others */
		}
	}
}

/* --------------------------------------------------- the transport --- */

int rnet_new(struct loop *l, const int *hello_timeout_ms, const struct rnet_ops *ops, void *ctx,
	     struct rnet **ret)
{
	struct rnet *rn = calloc(1, sizeof(*rn));
	char why[200];
	int r;

	if (!rn)
		return -ENOMEM;
	rn->loop = l;
	rn->hello_timeout_ms = hello_timeout_ms;
	rn->ops = ops;
	rn->ctx = ctx;
	rn->psk_srv = tls_ctx_new(NULL, true, false, why, sizeof(why));
	rn->psk_cli = tls_ctx_new(NULL, false, false, why, sizeof(why));
	r = rn->psk_srv && rn->psk_cli ? rnet_resolver_init(rn) : -ENOMEM;
	if (r < 0) {
		SSL_CTX_free(rn->psk_srv);
		SSL_CTX_free(rn->psk_cli);
		free(rn);
		return r;
	}
	*ret = rn;
	return 0;
}

void rnet_free(struct rnet *rn)
{
	if (!rn)
		return;
	while (rn->conns)
		conn_free(rn->conns);
	while (rn->listeners) {
		rn->listeners->refs = 1;
		rnet_listener_put(rn->listeners);
	}
	rnet_resolver_fini(rn);
	SSL_CTX_free(rn->psk_srv);
	SSL_CTX_free(rn->psk_cli);
	SSL_CTX_free(rn->srv);
	SSL_CTX_free(rn->cli);
	tls_ident_free(rn->ident);
	free(rn);
}

int rnet_tls_use(struct rnet *rn, struct tls_ident *id, char *why, size_t len)
{
	SSL_CTX *srv = tls_ctx_new(id, true, false, why, len);
	SSL_CTX *cli = srv ? tls_ctx_new(id, false, false, why, len) : NULL;

	if (!cli) {
		SSL_CTX_free(srv);
		return -ENOMEM;
	}
	rn->ident = id;
	rn->srv = srv;
	rn->cli = cli;
	return 0;
}

const struct tls_ident *rnet_tls(const struct rnet *rn)
{
	return rn->ident;
}

void rnet_scope_keys(struct rnet_scope *sc)
{
	tls_psk_derive(sc->id, sc->secret, sc->secret_len, sc->psk_id, sc->psk_key);
}

void rnet_conn_free(struct rnet_conn *c)
{
	conn_free(c);
}

struct rnet_conn *rnet_conns(const struct rnet *rn)
{
	return rn->conns;
}
