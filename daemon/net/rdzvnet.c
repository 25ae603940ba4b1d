/*
 * rdzvnet.c — the daemon-to-daemon transport of the rendezvous (see
 * rdzvnet.h), on the loop thread. Owns the listening sockets and every
 * daemon-to-daemon TCP connection; what a connection's messages mean for
 * the job it belongs to is its owner's (core/rdzv.c), told through the
 * owner's table of callbacks.
 *
 * A connection. Plain TCP, frames of rdzvwire.h, non-blocking both ways
 * (output waits in a buffer for EPOLLOUT). It authenticates first: the
 * joiner's nonce, the host's nonce, the joiner's HMAC over both, the host's
 * HMAC back. Until then a peer may send one small frame at a time, has
 * hello_timeout_ms, and at most RDZV_MAX_UNAUTH such peers are kept, at
 * most RDZV_MAX_UNAUTH_ADDR of them from one address (so that a few silent
 * strangers cannot keep the nodes of a job out); a
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

#include <sodium.h>

#include "common.h"
#include "zeroclient.h"
#include "base/log.h"
#include "base/loop.h"
#include "net/rdzvcurve.h"
#include "net/rdzvnet.h"
#include "net/rnet_int.h"
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
	size_t extra = c->sec ? RDZV_CURVE_OVERHEAD : 0;

	return (c->st == CS_OPEN ? ZEROD_MAX_MSG_BYTES : RDZV_UNAUTH_FRAME) + extra;
}

/* Write what is queued; want EPOLLOUT while some is left. Never frees c. */
static void flush(struct rnet_conn *c)
{
	struct loop *l = c->rn->loop;

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
void rnet_send(struct rnet_conn *c, const Zerod__V1__RdzvEnvelope *env)
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
	close(c->fd);
	rdzv_sec_free(c->sec);
	free(c->in);
	free(c->out);
	free(c);
}

/* The host: a client's Curve (rdzvcurve.h). A host without keys refuses
 * it, as one with keys refuses a key it does not trust. */
static void on_curve(struct rnet_conn *c, const Zerod__V1__RdzvEnvelope *m)
{
	Zerod__V1__RdzvEnvelope env = ZEROD__V1__RDZV_ENVELOPE__INIT;
	Zerod__V1__RdzvCurve reply;
	char why[160], msg[400];
	int code;

	if (!c->sec) {
		rnet_peer_log(
			c->rn,
			"rendezvous %s: refused %s: it speaks CURVE, and this zerod has no CURVE "
			"keys (--curve-secret-key)",
			c->lst->name, c->peer);
		snprintf(msg, sizeof(msg),
			 "the rendezvous at %s refused this node: it has no CURVE keys configured, "
			 "and this node has",
			 c->lst->name);
		rnet_refuse(c, ZC_ECONNECT, msg);
		return;
	}
	code = rdzv_sec_on_hello(c->sec, m->curve, &reply, why, sizeof(why));
	if (code) {
		rnet_peer_log(c->rn, "rendezvous %s: refused %s: %s", c->lst->name, c->peer, why);
		snprintf(msg, sizeof(msg), "the rendezvous at %s refused this node: %s",
			 c->lst->name, why);
		rnet_refuse(c, code, msg);
		return;
	}
	env.body_case = ZEROD__V1__RDZV_ENVELOPE__BODY_CURVE;
	env.curve = &reply;
	rnet_send(c, &env);
}

/* The host: the client's proof; frames are sealed both ways from here. */
static void on_curve_auth(struct rnet_conn *c, const Zerod__V1__RdzvEnvelope *m)
{
	char why[160], msg[400];
	int code = rdzv_sec_on_auth(c->sec, m->curve_auth, why, sizeof(why));

	if (code) {
		rnet_peer_log(c->rn, "rendezvous %s: refused %s: %s", c->lst->name, c->peer, why);
		snprintf(msg, sizeof(msg), "the rendezvous at %s refused this node: %s",
			 c->lst->name, why);
		rnet_refuse(c, code, msg);
		return;
	}
	c->st = CS_HELLO;
	log_debug("rendezvous %s: %s proved CURVE key %s", c->lst->name, c->peer,
		  rdzv_sec_peer(c->sec));
}

/* The host requires CURVE: a plain Hello is refused, saying why. */
static void on_plain_hello(struct rnet_conn *c, const Zerod__V1__RdzvEnvelope *m)
{
	char msg[256];

	(void)m;
	rnet_peer_log(c->rn,
		      "rendezvous %s: refused %s: a plain Hello, and this zerod requires CURVE",
		      c->lst->name, c->peer);
	snprintf(msg, sizeof(msg),
		 "the rendezvous at %s refused this node: it requires CURVE, and this node's "
		 "zerod has no CURVE keys (--curve-secret-key, --curve-peers)",
		 c->lst->name);
	rnet_refuse(c, ZC_ECONNECT, msg);
}

static void on_hello(struct rnet_conn *c, const Zerod__V1__RdzvEnvelope *m)
{
	Zerod__V1__RdzvEnvelope env = ZEROD__V1__RDZV_ENVELOPE__INIT;
	Zerod__V1__RdzvChallenge ch = ZEROD__V1__RDZV_CHALLENGE__INIT;
	const Zerod__V1__RdzvHello *h = m->hello;
	struct rnet_scope *sc;
	char msg[256];
	int code = 0;

	if (h->protocol_version != RDZV_PROTOCOL || !job_id_valid(h->job_id) ||
	    (h->kind != ZEROD__V1__RDZV_KIND__RDZV_JOIN &&
	     h->kind != ZEROD__V1__RDZV_KIND__RDZV_STORE) ||
	    h->nonce.len != RDZV_NONCE_BYTES) {
		rnet_peer_log(c->rn, "rendezvous %s: refused %s: a Hello of another protocol",
			      c->lst->name, c->peer);
		rnet_refuse(c, ZC_EVERSION, "not a zerod rendezvous Hello this zerod speaks");
		return;
	}
	/* a job id this zerod does not serve (not yet, not any more) gets its
	 * Challenge like any other, and after the Auth the one refusal a wrong
	 * secret gets: before the secret is proven, nothing says which jobs are
	 * served here. The reason is the operator's, in the log. */
	sc = c->rn->ops->hello(c->rn->ctx, c->lst, h->job_id, &code, msg, sizeof(msg));
	if (!sc) {
		rnet_peer_log(c->rn, "rendezvous %s: %s: %s (refused after its Auth)", c->lst->name,
			      c->peer, msg);
		c->no_scope = true;
	}
	c->sc = sc;
	c->kind = h->kind;
	memcpy(c->cn, h->nonce.data, RDZV_NONCE_BYTES);
	rdzv_random(c->sn, sizeof(c->sn));
	ch.nonce = (ProtobufCBinaryData){sizeof(c->sn), c->sn};
	env.body_case = ZEROD__V1__RDZV_ENVELOPE__BODY_CHALLENGE;
	env.challenge = &ch;
	c->st = CS_AUTH;
	rnet_send(c, &env);
}

static void on_auth(struct rnet_conn *c, const Zerod__V1__RdzvEnvelope *m)
{
	Zerod__V1__RdzvEnvelope env = ZEROD__V1__RDZV_ENVELOPE__INIT;
	Zerod__V1__RdzvWelcome w = ZEROD__V1__RDZV_WELCOME__INIT;
	struct rnet_scope *sc = c->sc;
	uint8_t want[RDZV_PROOF_BYTES];
	char msg[200];

	if (sc)
		rdzv_proof(want, sc->secret, sc->secret_len, false, sc->id, c->kind, c->cn, c->sn);
	if (c->no_scope || !rdzv_proof_ok(want, &m->auth->proof)) {
		if (!c->no_scope)
			rnet_peer_log(c->rn, "rendezvous %s: refused %s: wrong secret for job %s",
				      c->lst->name, c->peer, sc->id);
		/* the same bytes for every refusal before the secret is proven
		 * (ZC_ESTATE: a node asks again until its join timeout) */
		snprintf(msg, sizeof(msg),
			 "the rendezvous at %s refused this node: the secrets differ, or it "
			 "serves no job of that id (yet, or any more)",
			 c->lst->name);
		c->sc = NULL; /* it never belonged to the job */
		rnet_refuse(c, ZC_ESTATE, msg);
		return;
	}
	rdzv_proof(want, sc->secret, sc->secret_len, true, sc->id, c->kind, c->cn, c->sn);
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
		c->st = CS_HELLO;
		if (rn->keys) {
			if (rdzv_sec_new(rn->keys, true, &c->sec) < 0) {
				conn_free(c);
				continue;
			}
			c->st = CS_CURVE;
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

static void on_challenge(struct rnet_conn *c, const Zerod__V1__RdzvEnvelope *m)
{
	Zerod__V1__RdzvEnvelope env = ZEROD__V1__RDZV_ENVELOPE__INIT;
	Zerod__V1__RdzvAuth a = ZEROD__V1__RDZV_AUTH__INIT;
	struct rnet_scope *sc = c->sc;
	uint8_t proof[RDZV_PROOF_BYTES];

	if (m->challenge->nonce.len != RDZV_NONCE_BYTES) {
		rnet_gone(c, "a malformed challenge");
		return;
	}
	memcpy(c->sn, m->challenge->nonce.data, RDZV_NONCE_BYTES);
	rdzv_proof(proof, sc->secret, sc->secret_len, false, sc->id, c->kind, c->cn, c->sn);
	a.proof = (ProtobufCBinaryData){sizeof(proof), proof};
	env.body_case = ZEROD__V1__RDZV_ENVELOPE__BODY_AUTH;
	env.auth = &a;
	c->st = CS_AUTH;
	rnet_send(c, &env);
}

static void on_welcome(struct rnet_conn *c, const Zerod__V1__RdzvEnvelope *m)
{
	struct rnet_scope *sc = c->sc;
	uint8_t want[RDZV_PROOF_BYTES];
	char msg[400];

	rdzv_proof(want, sc->secret, sc->secret_len, true, sc->id, c->kind, c->cn, c->sn);
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

/* A node's Hello (sealed once its CURVE channel is ready). */
static void send_hello(struct rnet_conn *c)
{
	Zerod__V1__RdzvEnvelope env = ZEROD__V1__RDZV_ENVELOPE__INIT;
	Zerod__V1__RdzvHello h = ZEROD__V1__RDZV_HELLO__INIT;

	rdzv_random(c->cn, sizeof(c->cn));
	h.protocol_version = RDZV_PROTOCOL;
	h.job_id = (char *)c->sc->id;
	h.kind = ZEROD__V1__RDZV_KIND__RDZV_JOIN;
	h.nonce = (ProtobufCBinaryData){sizeof(c->cn), c->cn};
	env.body_case = ZEROD__V1__RDZV_ENVELOPE__BODY_HELLO;
	env.hello = &h;
	rnet_send(c, &env);
}

/* A node: the host's Curve. Its key must be one this node trusts, and
 * proven; then this node's proof, and the Hello, sealed. */
static void on_curve_reply(struct rnet_conn *c, const Zerod__V1__RdzvEnvelope *m)
{
	Zerod__V1__RdzvEnvelope env = ZEROD__V1__RDZV_ENVELOPE__INIT;
	Zerod__V1__RdzvCurveAuth auth;
	char why[160], msg[480];

	if (rdzv_sec_on_reply(c->sec, m->curve, &auth, why, sizeof(why)) != 0) {
		snprintf(msg, sizeof(msg), "the zerod serving the rendezvous at %s: %s",
			 c->sc->endpoint, why);
		c->rn->ops->refused(c->rn->ctx, c, ZC_ECONNECT, msg);
		rnet_gone(c, why);
		return;
	}
	env.body_case = ZEROD__V1__RDZV_ENVELOPE__BODY_CURVE_AUTH;
	env.curve_auth = &auth;
	rnet_send(c, &env);
	rdzv_sec_start(c->sec);
	c->st = CS_HELLO;
	send_hello(c);
}

int rnet_connect(struct rnet *rn, struct rnet_scope *sc, const struct sockaddr_storage *addr,
		 socklen_t addrlen, const char *peer, struct rnet_conn **ret, char *why,
		 size_t whylen)
{
	Zerod__V1__RdzvEnvelope env = ZEROD__V1__RDZV_ENVELOPE__INIT;
	Zerod__V1__RdzvCurve cv;
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
	/* queued: it leaves once connected */
	if (rn->keys) {
		if (rdzv_sec_new(rn->keys, false, &c->sec) < 0) {
			c->dead = true;
			snprintf(why, whylen, "out of memory");
			return -ENOMEM;
		}
		rdzv_sec_hello(c->sec, &cv);
		env.body_case = ZEROD__V1__RDZV_ENVELOPE__BODY_CURVE;
		env.curve = &cv;
		rnet_send(c, &env);
	} else {
		send_hello(c);
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
	{ZEROD__V1__RDZV_ENVELOPE__BODY_CURVE, ROLE_HOST, CS_CURVE, 0, on_curve},
	{ZEROD__V1__RDZV_ENVELOPE__BODY_CURVE, ROLE_HOST, CS_HELLO, 0, on_curve},
	{ZEROD__V1__RDZV_ENVELOPE__BODY_CURVE_AUTH, ROLE_HOST, CS_CURVE, 0, on_curve_auth},
	{ZEROD__V1__RDZV_ENVELOPE__BODY_HELLO, ROLE_HOST, CS_CURVE, 0, on_plain_hello},
	{ZEROD__V1__RDZV_ENVELOPE__BODY_HELLO, ROLE_HOST, CS_HELLO, 0, on_hello},
	{ZEROD__V1__RDZV_ENVELOPE__BODY_AUTH, ROLE_HOST, CS_AUTH, 0, on_auth},
	{ZEROD__V1__RDZV_ENVELOPE__BODY_JOIN, ROLE_HOST, CS_OPEN, ZEROD__V1__RDZV_KIND__RDZV_JOIN,
	 NULL},
	{ZEROD__V1__RDZV_ENVELOPE__BODY_FAIL, ROLE_HOST, CS_OPEN, ZEROD__V1__RDZV_KIND__RDZV_JOIN,
	 NULL},
	{ZEROD__V1__RDZV_ENVELOPE__BODY_STORE_SET, ROLE_HOST, CS_OPEN,
	 ZEROD__V1__RDZV_KIND__RDZV_STORE, rnet_kv_set},
	{ZEROD__V1__RDZV_ENVELOPE__BODY_STORE_GET, ROLE_HOST, CS_OPEN,
	 ZEROD__V1__RDZV_KIND__RDZV_STORE, rnet_kv_get},
	{ZEROD__V1__RDZV_ENVELOPE__BODY_CURVE, ROLE_NODE, CS_CURVE, 0, on_curve_reply},
	{ZEROD__V1__RDZV_ENVELOPE__BODY_CHALLENGE, ROLE_NODE, CS_HELLO, 0, on_challenge},
	{ZEROD__V1__RDZV_ENVELOPE__BODY_WELCOME, ROLE_NODE, CS_AUTH, 0, on_welcome},
	{ZEROD__V1__RDZV_ENVELOPE__BODY_FAIL, ROLE_NODE, ANY_STATE, 0, NULL},
	{ZEROD__V1__RDZV_ENVELOPE__BODY_FORMED, ROLE_NODE, CS_OPEN, 0, NULL},
	{ZEROD__V1__RDZV_ENVELOPE__BODY_NODE_LOST, ROLE_NODE, CS_OPEN, 0, NULL},
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

/* A sealed frame did not open: changed, replayed, reordered or cut on the
 * way. The host refuses the peer (a joined node hears why, sealed: the
 * way out still works); a node drops its connection as lost. */
static void curve_broken(struct rnet_conn *c)
{
	static const char what[] = "a sealed frame that fails to open (changed, replayed, "
				   "reordered or cut on the way)";
	char msg[256];

	if (!c->server) {
		log_notice("rendezvous %s: %s", c->peer, what);
		snprintf(msg, sizeof(msg), "the rendezvous sent %s", what);
		rnet_gone(c, msg);
		return;
	}
	rnet_peer_log(c->rn, "rendezvous %s: refused %s (CURVE key %s): %s", c->lst->name, c->peer,
		      rdzv_sec_peer(c->sec), what);
	snprintf(msg, sizeof(msg), "the rendezvous at %s refused this node: it received %s",
		 c->lst->name, what);
	if (c->st == CS_OPEN)
		rnet_refuse(c, ZC_ECONNECT, msg);
	else
		c->dead = true;
}

/* One frame in: on a CURVE connection, once its handshake is done, every
 * frame must be sealed and open; before it (or without CURVE) none may be. */
static void on_frame(struct rnet_conn *c, const Zerod__V1__RdzvEnvelope *m)
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
	c->st = c->sec ? CS_CURVE : CS_HELLO;
	flush(c); /* the Hello, or the Curve before it */
}

/* Read what is there (at most RDZV_READ_CHUNK a turn; epoll calls again for
 * more) and handle every whole frame. */
static void read_in(struct rnet_conn *c)
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
			rnet_gone(c, "out of memory");
			return;
		}
		c->in = b;
		c->in_cap = have;
	}
	n = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, MSG_DONTWAIT);
	if (n == 0) {
		rnet_gone(c, "closed the connection");
		return;
	}
	if (n < 0) {
		if (errno != EAGAIN && errno != EINTR)
			rnet_gone(c, strerror(errno));
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
	if (!c->dead)
		flush(c);
	if (!c->dead && c->st == CS_CLOSING)
		drain(c);
	else if (!c->dead && c->st != CS_CONNECTING)
		read_in(c);
	if (c->dead) {
		rnet_gone(c, "closed");
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
			rnet_gone(c, "closed");
			conn_free(c);
			next = rn->conns; /* rnet_gone() may have marked others */
		}
	}
}

/* --------------------------------------------------- the transport --- */

int rnet_new(struct loop *l, const int *hello_timeout_ms, const struct rnet_ops *ops, void *ctx,
	     struct rnet **ret)
{
	struct rnet *rn;
	int r;

	if (sodium_init() < 0)
		return -EIO;
	rn = calloc(1, sizeof(*rn));
	if (!rn)
		return -ENOMEM;
	rn->loop = l;
	rn->hello_timeout_ms = hello_timeout_ms;
	rn->ops = ops;
	rn->ctx = ctx;
	r = rnet_resolver_init(rn);
	if (r < 0) {
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
	rdzv_keys_free(rn->keys);
	free(rn);
}

void rnet_keys_use(struct rnet *rn, struct rdzv_keys *keys)
{
	rn->keys = keys;
}

const struct rdzv_keys *rnet_keys(const struct rnet *rn)
{
	return rn->keys;
}

void rnet_conn_free(struct rnet_conn *c)
{
	conn_free(c);
}

struct rnet_conn *rnet_conns(const struct rnet *rn)
{
	return rn->conns;
}
