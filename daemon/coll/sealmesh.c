/*
 * sealmesh.c — coll/mesh.h over TCP with TLS 1.3 on every connection: what
 * carries a job's tensors between nodes when zerod has a TLS identity
 * (--tls-key, --tls-cert, --tls-peers or --tls-ca; gloo's TCP transport
 * has no encryption at all). It owns its sockets, their SSLs, a server's
 * and a client's SSL_CTX and one eventfd for abort; the identity is the
 * daemon's (net/tls.h), read-only.
 *
 * Why it is over 1,200 lines: opening the mesh (every peer's and
 * stranger's handshake side by side under one poll, with per-address
 * limits) and moving a call's bytes share one state of sockets and SSLs;
 * split, each half would reach into the other's.
 *
 * Connections. One TCP connection per pair of nodes and lane (mesh.h's
 * COLL_MESH_LANES), so the calls of one lane are in order on the wire and
 * no lane waits behind another's bytes. Each node listens on an ephemeral
 * port of its address and publishes "host:port" in the job's store under
 * PREFIX "sealmesh/" NODE; the higher node of a pair connects to the lower
 * and is the TLS client.
 *
 * Wire format, per connection:
 *   1. A TLS 1.3 handshake (tls_ctx_new()): both ends present their
 *      certificate and each checks the other's against its trust (a
 *      pinned SHA-256 fingerprint, or a chain to the CA file).
 *   2. One binding message each way, inside TLS: a 2-byte big-endian
 *      length, then "zerod tlsmesh 1 PREFIX FROM TO LANE"; the client's
 *      first, the listener's once it has checked the client's. The prefix
 *      is fresh for every run of a job (and every re-plan), so a
 *      connection is taken only for this mesh, this pair of nodes in this
 *      direction and this lane; anything else is refused. The message
 *      travels in this connection's records, which no other connection's
 *      keys open, so it needs no exporter to tie it to the connection.
 *   3. Data: each call's bytes to a peer as they are, SSL_write on one
 *      side, SSL_read on the other. TLS's records (16 KiB at most, under
 *      the cipher the two ends agreed on) frame and authenticate them;
 *      both ends know how many bytes a call moves, so there is no framing
 *      of zerod's own. Each SSL_write makes records of its own, so no
 *      record holds bytes of two calls. A call's records are gathered,
 *      GATHER_BYTES at a time, before they go to the socket
 *      (tls_gather_writes(); not where the kernel encrypts), so the
 *      kernel's TCP path runs once for many records; a call is done once
 *      its last ones are flushed.
 *
 * Threat model. An attacker on the network can read, drop, change, replay,
 * reorder and inject bytes, and connect to the mesh's port. Authenticated:
 * both ends (a certificate in the trusted set, whose key signs this
 * handshake), and every byte of every record: the keys are fresh for
 * every connection and each record's nonce is its place in its direction,
 * so a record changed, replayed, reordered or forged fails to open, the
 * call fails naming the peer node and its certificate, and the connection
 * is not used again (nothing after the first bad record is trusted). A
 * TCP close without TLS close_notify is a cut, reported as truncation,
 * never taken as the end of the data. What the attacker learns: which
 * nodes talk, when, and how much (record sizes give the tensors' sizes and
 * the calls' timing; the certificates travel encrypted); not a byte of
 * data. What the attacker can do: cut connections or delay them (the call
 * times out), which is a failed job, never a wrong parameter; and open
 * connections to the port that never finish a handshake, which cost the
 * mesh a bounded number of sockets for a bounded time and hold no one up.
 * Not covered: a node that holds a trusted certificate (it is part of the
 * job), and the job's data inside a node (shared memory, the trainers'
 * sockets).
 *
 * Progress. open() steps every connection of this node under one poll():
 * the connects to the lower nodes, and every connection the listener
 * accepts, each through its handshake and binding, until every pair and
 * lane is bound or the open timeout passes. An accepted connection has
 * HANDSHAKE_MS to be bound; beyond the connections the mesh still
 * expects, at most PENDING_PER_ADDR unbound ones from one address and
 * PENDING_MAX in all are kept: a new one pushes out the one that has sent
 * the least, oldest first, so silent strangers cannot crowd out a peer. A
 * refused connection is dropped and the others go on.
 *
 * A call moves every peer's bytes at once on the non-blocking sockets
 * under one poll(), both directions of an alltoallv together, so full
 * socket buffers cannot deadlock two nodes. OpenSSL may hold plaintext of
 * a record already read while the socket shows nothing, so a connection is
 * read until OpenSSL wants the socket before poll() waits on it; an
 * SSL_read that wants to write waits for POLLOUT, an SSL_write that wants
 * to read for POLLIN. A call fails with -ETIMEDOUT when no byte moves for
 * the mesh's timeout; abort() makes the eventfd readable, which every poll
 * watches, so it wakes every blocked call at once. A call that completes
 * adds its bytes, both ways, and its thread's CPU time from start to end to
 * coll/netstats.h (the metrics zerod_tls_mesh_*).
 *
 * Kernel TLS. With cfg->ktls the contexts ask for it (SSL_OP_ENABLE_KTLS):
 * where the kernel has its tls module, OpenSSL hands it each connection's
 * keys after the handshake and the kernel encrypts (and maybe decrypts);
 * elsewhere OpenSSL does, unchanged. coll_sealmesh_ktls() says which.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <openssl/err.h>

#include "coll/netstats.h"
#include "coll/sealmesh.h"
#include "common.h"
#include "net/rdzvwire.h"
#include "net/tls.h"
#include "zeroclient.h"

#define LANES      COLL_MESH_LANES
#define BIND_MAX   512 /* the most a binding message holds */
#define PREFIX_MAX (BIND_MAX - 64)
#define ADDR_MAX   (INET6_ADDRSTRLEN + 16)
#define WHY_LEN    256
#define BIND_MAGIC "zerod tlsmesh 1"
#define STORE_KEY  "sealmesh/"
/* what one accepted connection may take to be bound */
#define HANDSHAKE_MS 5000
/* unbound accepted connections kept beyond those the mesh still expects:
 * from one address, and in all */
#define PENDING_PER_ADDR 8
#define PENDING_MAX      64
/* connections accepted in one turn of the open loop */
#define ACCEPT_BURST 64
/* bytes one SSL_write is handed (it writes a record at a time) */
#define WRITE_MAX (1u << 30)
/* the records gathered before they go to the socket (tls_gather_writes()) */
#define GATHER_BYTES (256u << 10)

struct conn {
	int fd; /* -1: none (this node) */
	SSL *ssl;
	char fp[TLS_FP_HEX + 1]; /* the peer's certificate's fingerprint */
	int err;                 /* sticky: the connection is shut */
	bool broken;             /* a TLS error or end: no close_notify either */
	char why[WHY_LEN];
};

struct coll_mesh {
	uint32_t node, nnodes;
	int timeout_ms;
	char *prefix;
	SSL_CTX *sctx, *cctx;
	struct conn *conns; /* [peer * LANES + lane] */
	int abort_fd;       /* an eventfd: readable once aborted */
	atomic_bool aborted;
	bool ktls_send, ktls_recv; /* the kernel does it on every connection */
};

static struct conn *conn_of(struct coll_mesh *m, uint32_t peer, unsigned lane)
{
	return &m->conns[(size_t)peer * LANES + lane];
}

/* The peer ended or refused the connection, as what it came to shows: a
 * close_notify, a close without one, its fatal alert, or a reset (e: the
 * errno right after the step). */
static bool peer_closed(SSL *ssl, enum tls_io io, int e)
{
	return io == TLS_IO_EOF || io == TLS_IO_CUT || e == ECONNRESET || e == EPIPE ||
	       (ssl && (SSL_get_shutdown(ssl) & SSL_RECEIVED_SHUTDOWN));
}

/* ----------------------------------------------------------- open --- */

enum hs_state {
	HS_CONNECT, /* client: the TCP connect under way */
	HS_TLS,     /* the TLS handshake */
	HS_SEND,    /* this side's binding message going out */
	HS_RECV,    /* the other side's coming in */
	HS_BOUND,   /* done: the connection is the mesh's */
	HS_DEAD,    /* dropped (an accepted one), or handed to the mesh */
};

/* One connection on its way to being bound. The client's go
 * CONNECT -> TLS -> SEND -> RECV -> BOUND, the server's TLS -> RECV ->
 * SEND -> BOUND; any step may fail instead. */
struct hs {
	int fd;
	SSL *ssl;
	bool server;
	enum hs_state st;
	short wait;              /* what poll() waits for */
	int64_t since, deadline; /* accepted (server), and by when bound */
	uint32_t peer;           /* client: the node it is for; server: once its binding is in */
	unsigned lane;
	char addr[ADDR_MAX + 1];    /* the other end, in text */
	struct sockaddr_storage sa; /* server: where it came from */
	uint8_t out[2 + BIND_MAX], in[2 + BIND_MAX];
	size_t olen, oat, iat;
	int rank; /* server: how much its refusal says (drop()) */
};

/* Everything open() juggles. */
struct opening {
	struct coll_mesh *m;
	const struct tls_ident *tls;
	int lfd;
	int64_t deadline;
	struct hs *cl; /* [node * LANES]: to the lower nodes */
	struct hs *sv; /* accepted, not yet bound: nsv of cap */
	uint32_t ncl, nsv, cap;
	bool *claimed;         /* [nnodes * LANES]: a higher node's lane, bound or answering */
	uint32_t want, have;   /* accepted connections the mesh needs, bound */
	char refused[WHY_LEN]; /* the last refusal of the highest rank, for a timeout's reason */
	int rank;
};

static void hs_free(struct hs *h)
{
	tls_free(h->ssl);
	/* what the peer sent that nobody read would make close() a reset,
	 * which can overtake the alert that says why it is refused */
	for (int i = 0; i < 16 && h->fd >= 0; i++) {
		char sink[4096];
		if (recv(h->fd, sink, sizeof(sink), MSG_DONTWAIT) <= 0)
			break;
	}
	if (h->fd >= 0)
		close(h->fd);
	h->ssl = NULL;
	h->fd = -1;
	h->st = HS_DEAD;
}

/* The binding message of from -> to on lane, into out: its length. */
static size_t bind_msg(uint8_t *out, const char *prefix, uint32_t from, uint32_t to, unsigned lane)
{
	int n = snprintf((char *)out + 2, BIND_MAX + 1, "%s %s %u %u %u", BIND_MAGIC, prefix, from,
			 to, lane);

	out[0] = (uint8_t)(n >> 8), out[1] = (uint8_t)n;
	return 2 + (size_t)n;
}

/* h's binding message out, as far as the socket takes it. */
static enum tls_io hs_send(struct hs *h, char *sub, size_t len)
{
	while (h->oat < h->olen) {
		size_t done;
		enum tls_io io =
			tls_write(h->ssl, h->out + h->oat, h->olen - h->oat, &done, sub, len);
		if (io != TLS_IO_OK)
			return io;
		h->oat += done;
	}
	return TLS_IO_OK;
}

/* The other side's binding message in, not a byte past it (what follows is
 * a call's). TLS_IO_ERROR if it claims more than BIND_MAX. */
static enum tls_io hs_recv(struct hs *h, char *sub, size_t len)
{
	for (;;) {
		size_t need = h->iat < 2 ? 2 : 2 + ((size_t)h->in[0] << 8 | h->in[1]), done;
		enum tls_io io;
		if (need > 2 + BIND_MAX) {
			snprintf(sub, len, "a binding message of %zu bytes", need - 2);
			return TLS_IO_ERROR;
		}
		if (h->iat >= 2 && h->iat == need)
			return TLS_IO_OK;
		io = tls_read(h->ssl, h->in + h->iat, need - h->iat, &done, sub, len);
		if (io != TLS_IO_OK)
			return io;
		h->iat += done;
	}
}

/* The server's check of a client's binding: for this mesh, to this node,
 * from a higher node, a lane not bound yet. Then its answer is due. */
static int server_check(struct opening *o, struct hs *h, char *why, size_t len)
{
	struct coll_mesh *m = o->m;
	char got[BIND_MAX + 1], head[BIND_MAX + 8], fp[TLS_FP_HEX + 1];
	size_t n = h->iat - 2, hl;
	unsigned from, to, lane;
	int end = 0;

	memcpy(got, h->in + 2, n);
	got[n] = '\0';
	hl = (size_t)snprintf(head, sizeof(head), "%s %s ", BIND_MAGIC, m->prefix);
	tls_peer_fingerprint(h->ssl, fp);
	if (strlen(got) != n || strncmp(got, head, hl) != 0 ||
	    sscanf(got + hl, "%u %u %u%n", &from, &to, &lane, &end) != 3 || got[hl + (size_t)end] ||
	    to != m->node || from <= m->node || from >= m->nnodes || lane >= LANES) {
		snprintf(why, len,
			 "certificate %s from %s: a connection for another mesh, node or lane", fp,
			 h->addr);
		h->rank = 2;
		return ZC_ECONNECT;
	}
	if (o->claimed[(size_t)from * LANES + lane]) {
		snprintf(why, len, "certificate %s from %s: node %u's lane %u connected twice", fp,
			 h->addr, from, lane);
		h->rank = 2;
		return ZC_ECONNECT;
	}
	o->claimed[(size_t)from * LANES + lane] = true;
	h->peer = from;
	h->lane = lane;
	h->olen = bind_msg(h->out, m->prefix, m->node, from, lane);
	h->oat = 0;
	return 0;
}

/* The client's check of the server's answer: this mesh, from the node it
 * connected to, to this one, this lane. */
static int client_check(struct opening *o, struct hs *h, char *why, size_t len)
{
	uint8_t want[2 + BIND_MAX];
	size_t n = bind_msg(want, o->m->prefix, h->peer, o->m->node, h->lane);
	char fp[TLS_FP_HEX + 1];

	if (n == h->iat && memcmp(want, h->in, n) == 0)
		return 0;
	tls_peer_fingerprint(h->ssl, fp);
	snprintf(why, len, "node %u at %s (certificate %s) answered for another mesh, node or lane",
		 h->peer, h->addr, fp);
	return ZC_ECONNECT;
}

/* How much a refusal of an accepted connection says, for the one a timeout
 * names: a certificate refused or a trusted peer's binding (2) over a TLS
 * error (1) over a close, a reset or silence (0). */
static int refusal_rank(const struct hs *h, bool closed)
{
	if (h->ssl && SSL_get_verify_result(h->ssl) != X509_V_OK)
		return 2;
	return closed ? 0 : 1;
}

/* Why h failed in a step that came to io (e: errno right after it; sub:
 * the step's reason), into why; the code. */
static int hs_failed(struct opening *o, struct hs *h, enum tls_io io, int e, const char *sub,
		     char *why, size_t len)
{
	char fp[TLS_FP_HEX + 1];

	if (h->server) {
		h->rank = refusal_rank(h, io == TLS_IO_EOF || io == TLS_IO_CUT || e == ECONNRESET ||
						  e == EPIPE);
		if (h->st == HS_TLS && (SSL_get_shutdown(h->ssl) & SSL_RECEIVED_SHUTDOWN))
			snprintf(
				why, len,
				"a connection from %s ended its handshake with an alert (%s): does "
				"it trust this node's certificate %s?",
				h->addr, sub, tls_ident_fingerprint(o->tls));
		else if (h->st == HS_TLS)
			snprintf(why, len, "a connection from %s: %s", h->addr, sub);
		else {
			tls_peer_fingerprint(h->ssl, fp);
			snprintf(why, len, "certificate %s from %s: %s", fp, h->addr, sub);
		}
		return ZC_ECONNECT;
	}
	if (h->st == HS_TLS) {
		snprintf(why, len, "node %u at %s: %s", h->peer, h->addr, sub);
		return ZC_ECONNECT;
	}
	/* TLS 1.3: the client is through its handshake before the server has
	 * checked the client's certificate, so a refusal shows here */
	if (peer_closed(h->ssl, io, e))
		snprintf(why, len,
			 "node %u at %s refused the connection (%s): it does not trust this node's "
			 "certificate %s, or this node is not in its mesh",
			 h->peer, h->addr, sub, tls_ident_fingerprint(o->tls));
	else
		snprintf(why, len, "node %u at %s: its binding message: %s", h->peer, h->addr, sub);
	return ZC_ECONNECT;
}

/* One step of h: 0 (h->wait says for what), 1 (bound), or a code with why. */
static int hs_step(struct opening *o, struct hs *h, char *why, size_t len)
{
	char sub[WHY_LEN] = "";
	enum tls_io io = TLS_IO_OK;
	int e = 0, r;

	for (;;) {
		switch (h->st) {
		case HS_CONNECT: {
			socklen_t el = sizeof(e);
			if (getsockopt(h->fd, SOL_SOCKET, SO_ERROR, &e, &el) < 0)
				e = errno;
			if (e) {
				snprintf(why, len, "connect to node %u at %s: %s", h->peer, h->addr,
					 strerror(e));
				return -e;
			}
			h->ssl = tls_new(o->m->cctx, h->fd, false);
			if (!h->ssl) {
				snprintf(why, len, "out of memory");
				return -ENOMEM;
			}
			h->st = HS_TLS;
			continue;
		}
		case HS_TLS:
			errno = 0;
			io = tls_handshake(h->ssl, sub, sizeof(sub));
			e = errno;
			if (io != TLS_IO_OK)
				break;
			if (h->server) {
				h->st = HS_RECV;
			} else {
				h->olen = bind_msg(h->out, o->m->prefix, o->m->node, h->peer,
						   h->lane);
				h->st = HS_SEND;
			}
			continue;
		case HS_SEND:
			errno = 0;
			io = hs_send(h, sub, sizeof(sub));
			e = errno;
			if (io != TLS_IO_OK)
				break;
			if (h->server) {
				h->st = HS_BOUND;
				return 1;
			}
			h->st = HS_RECV;
			continue;
		case HS_RECV:
			errno = 0;
			io = hs_recv(h, sub, sizeof(sub));
			e = errno;
			if (io != TLS_IO_OK)
				break;
			r = h->server ? server_check(o, h, why, len) : client_check(o, h, why, len);
			if (r < 0)
				return r;
			if (!h->server) {
				h->st = HS_BOUND;
				return 1;
			}
			h->st = HS_SEND;
			continue;
		case HS_BOUND:
			return 1;
		case HS_DEAD:
			return ZC_ECONNECT;
		}
		if (io == TLS_IO_READ || io == TLS_IO_WRITE) {
			h->wait = io == TLS_IO_READ ? POLLIN : POLLOUT;
			return 0;
		}
		return hs_failed(o, h, io, e, sub, why, len);
	}
}

/* The address to listen on: host (a name or a number) or iface's first
 * IPv4 address (else IPv6). */
static int local_addr(const struct coll_mesh_config *cfg, struct sockaddr_storage *ss,
		      socklen_t *len, char *why, size_t wlen)
{
	if (cfg->host) {
		struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
		int r = getaddrinfo(cfg->host, NULL, &hints, &ai);
		if (r != 0 || !ai) {
			snprintf(why, wlen, "TLS mesh: address %s: %s", cfg->host, gai_strerror(r));
			return -EINVAL;
		}
		memcpy(ss, ai->ai_addr, ai->ai_addrlen);
		*len = ai->ai_addrlen;
		freeaddrinfo(ai);
		return 0;
	}
	struct ifaddrs *ifs = NULL, *v6 = NULL;
	if (getifaddrs(&ifs) < 0) {
		snprintf(why, wlen, "TLS mesh: getifaddrs: %s", strerror(errno));
		return -EIO;
	}
	for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
		if (!i->ifa_addr || strcmp(i->ifa_name, cfg->iface) != 0)
			continue;
		if (i->ifa_addr->sa_family == AF_INET) {
			*len = sizeof(struct sockaddr_in);
			memcpy(ss, i->ifa_addr, *len);
			freeifaddrs(ifs);
			return 0;
		}
		/* a link-local address needs its scope, which "[addr]:port" has not */
		if (i->ifa_addr->sa_family == AF_INET6 && !v6 &&
		    !IN6_IS_ADDR_LINKLOCAL(&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr))
			v6 = i;
	}
	if (v6) {
		*len = sizeof(struct sockaddr_in6);
		memcpy(ss, v6->ifa_addr, *len);
	}
	freeifaddrs(ifs);
	if (!v6) {
		snprintf(why, wlen, "TLS mesh: interface %s has no address", cfg->iface);
		return -EINVAL;
	}
	return 0;
}

/* Listen on the node's address, port 0 (a test may name one, below); its
 * "host:port" in text. */
static int listen_on(const struct coll_mesh_config *cfg, int *ret_fd, char *text, char *why,
		     size_t wlen)
{
	struct sockaddr_storage ss = {0};
	socklen_t len = 0;
	char host[INET6_ADDRSTRLEN];
	int fd, one = 1, r = local_addr(cfg, &ss, &len, why, wlen);
	/* Test only, never set in production: ZEROD_TEST_MESH_RELAY="NODE:
	 * LISTEN:PUBLISH" makes node NODE listen on port LISTEN and publish
	 * PUBLISH (a test's relay to LISTEN). Only the ports change: every
	 * check of the connections still applies. */
	const char *t = getenv("ZEROD_TEST_MESH_RELAY");
	unsigned tn, tl = 0, tp = 0;

	if (!t || sscanf(t, "%u:%u:%u", &tn, &tl, &tp) != 3 || tn != cfg->node || tl > 65535 ||
	    tp > 65535)
		tl = tp = 0;
	if (r < 0)
		return r;
	if (ss.ss_family == AF_INET)
		((struct sockaddr_in *)&ss)->sin_port = htons((uint16_t)tl);
	else
		((struct sockaddr_in6 *)&ss)->sin6_port = htons((uint16_t)tl);
	fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd >= 0 && tl)
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (fd < 0 || bind(fd, (struct sockaddr *)&ss, len) < 0 ||
	    listen(fd, (int)MIN(cfg->nnodes * LANES + PENDING_MAX, 4096u)) < 0 ||
	    getsockname(fd, (struct sockaddr *)&ss, &len) < 0) {
		r = -errno;
		snprintf(why, wlen, "TLS mesh: listen on %s: %s",
			 cfg->host ? cfg->host : cfg->iface, strerror(errno));
		if (fd >= 0)
			close(fd);
		return r;
	}
	if (ss.ss_family == AF_INET) {
		struct sockaddr_in *a = (struct sockaddr_in *)&ss;
		inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
		snprintf(text, ADDR_MAX, "%s:%u", host, tp ? tp : ntohs(a->sin_port));
	} else {
		struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
		inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
		snprintf(text, ADDR_MAX, "[%s]:%u", host, tp ? tp : ntohs(a->sin6_port));
	}
	*ret_fd = fd;
	return 0;
}

/* A non-blocking connect to addr ("host:port") begun: the socket, or a
 * code. */
static int connect_start(const char *addr)
{
	char host[RDZV_ENDPOINT_MAX + 1], port[16];
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM,
				 .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV},
			*ai = NULL;
	int fd, one = 1, r;

	if (!rdzv_split_endpoint(addr, host, sizeof(host), port, sizeof(port)) ||
	    getaddrinfo(host, port, &hints, &ai) != 0 || !ai)
		return -EINVAL;
	fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		freeaddrinfo(ai);
		return -errno;
	}
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	r = connect(fd, ai->ai_addr, ai->ai_addrlen) < 0 && errno != EINPROGRESS ? -errno : 0;
	freeaddrinfo(ai);
	if (r < 0) {
		close(fd);
		return r;
	}
	return fd;
}

static void sm_close(struct coll_mesh *m)
{
	if (!m)
		return;
	for (size_t i = 0; m->conns && i < (size_t)m->nnodes * LANES; i++) {
		struct conn *c = &m->conns[i];
		if (c->broken && c->ssl) /* no close_notify after a TLS error or end */
			SSL_set_shutdown(c->ssl, SSL_SENT_SHUTDOWN | SSL_RECEIVED_SHUTDOWN);
		tls_free(c->ssl); /* close_notify, where the socket takes it */
		if (c->fd >= 0)
			close(c->fd);
	}
	SSL_CTX_free(m->sctx);
	SSL_CTX_free(m->cctx);
	if (m->abort_fd >= 0)
		close(m->abort_fd);
	free(m->conns);
	free(m->prefix);
	free(m);
}

/* Every lower node's address from the store, and a connection begun to it
 * for every lane. */
static int connect_lower(struct opening *o, const struct coll_mesh_config *cfg, char *err,
			 size_t errlen)
{
	struct coll_mesh *m = o->m;
	char key[PREFIX_MAX + 64];

	for (uint32_t j = 0; j < m->node; j++) {
		char addr[ADDR_MAX + 1];
		void *v = NULL;
		size_t vlen = 0;
		int64_t left = o->deadline - now_ms();
		int r;

		snprintf(key, sizeof(key), "%s" STORE_KEY "%u", m->prefix, j);
		r = cfg->store->get(cfg->store->ctx, key, left > 0 ? (int)left : 0, &v, &vlen);
		if (r == -ETIMEDOUT)
			snprintf(err, errlen, "TLS mesh: node %u did not join within %d ms", j,
				 m->timeout_ms);
		else if (r < 0)
			snprintf(err, errlen, "TLS mesh: node %u's address: %s", j, zc_strerror(r));
		if (r < 0)
			return r;
		if (vlen == 0 || vlen > ADDR_MAX) {
			free(v);
			snprintf(err, errlen, "TLS mesh: node %u published a bad address", j);
			return -EPROTO;
		}
		memcpy(addr, v, vlen);
		addr[vlen] = '\0';
		free(v);
		for (unsigned l = 0; l < LANES; l++) {
			struct hs *h = &o->cl[o->ncl++];
			*h = (struct hs){.fd = connect_start(addr),
					 .st = HS_CONNECT,
					 .wait = POLLOUT,
					 .deadline = o->deadline,
					 .peer = j,
					 .lane = l};
			snprintf(h->addr, sizeof(h->addr), "%s", addr);
			if (h->fd < 0) {
				r = h->fd;
				snprintf(err, errlen, "TLS mesh: connect to node %u at %s: %s", j,
					 addr, r == -EINVAL ? "not an address" : strerror(-r));
				return r;
			}
		}
	}
	return 0;
}

static bool same_host(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
	if (a->ss_family != b->ss_family)
		return false;
	if (a->ss_family == AF_INET)
		return ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
		       ((const struct sockaddr_in *)b)->sin_addr.s_addr;
	if (a->ss_family == AF_INET6)
		return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
			      &((const struct sockaddr_in6 *)b)->sin6_addr,
			      sizeof(struct in6_addr)) == 0;
	return true;
}

static void addr_text(const struct sockaddr_storage *ss, char *out, size_t len)
{
	char host[INET6_ADDRSTRLEN] = "?";

	if (ss->ss_family == AF_INET) {
		const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
		inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
		snprintf(out, len, "%s:%u", host, ntohs(a->sin_port));
	} else if (ss->ss_family == AF_INET6) {
		const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
		inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
		snprintf(out, len, "[%s]:%u", host, ntohs(a->sin6_port));
	} else {
		snprintf(out, len, "?");
	}
}

/* Of the unbound accepted connections (from sa's host only, or all): the
 * one to push out for a new one. The one that has sent the least (a silent
 * one before one that is speaking), the oldest of those. -1: none. */
static int victim(const struct opening *o, const struct sockaddr_storage *sa)
{
	int best = -1;
	uint64_t best_in = 0;

	for (uint32_t i = 0; i < o->nsv; i++) {
		const struct hs *h = &o->sv[i];
		uint64_t in;
		if (h->st == HS_DEAD || h->peer || (sa && !same_host(&h->sa, sa)))
			continue; /* h->peer: it is answering a binding, nearly bound */
		in = BIO_number_read(SSL_get_rbio(h->ssl));
		if (best < 0 || in < best_in || (in == best_in && h->since < o->sv[best].since))
			best = (int)i, best_in = in;
	}
	return best;
}

/* Drop an accepted connection; why (NULL: none) at rank. */
static void drop(struct opening *o, struct hs *h, const char *why, int rank)
{
	if (h->server && h->peer && h->st == HS_SEND)
		o->claimed[(size_t)h->peer * LANES + h->lane] = false;
	if (why && rank >= o->rank) {
		snprintf(o->refused, sizeof(o->refused), "%s", why);
		o->rank = rank;
	}
	hs_free(h);
}

/* Forget the dropped accepted connections. */
static void compact(struct opening *o)
{
	uint32_t k = 0;

	for (uint32_t i = 0; i < o->nsv; i++)
		if (o->sv[i].st != HS_DEAD)
			o->sv[k++] = o->sv[i];
	o->nsv = k;
}

/* Take what the listener has, within the limits. */
static void accept_some(struct opening *o, int64_t now)
{
	uint32_t left = o->want - o->have;
	int one = 1;

	for (int k = 0; k < ACCEPT_BURST; k++) {
		struct sockaddr_storage sa = {0};
		socklen_t sl = sizeof(sa);
		uint32_t from = 0;
		int fd = accept4(o->lfd, (struct sockaddr *)&sa, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
		int v;

		if (fd < 0)
			return; /* EAGAIN, or out of fds: the peers' connects wait in the backlog */
		for (uint32_t i = 0; i < o->nsv; i++)
			from += o->sv[i].st != HS_DEAD && same_host(&o->sv[i].sa, &sa);
		v = -1;
		if (from >= PENDING_PER_ADDR + left)
			v = victim(o, &sa);
		else if (o->nsv >= PENDING_MAX + left || o->nsv == o->cap)
			v = victim(o, NULL);
		if (v >= 0) {
			drop(o, &o->sv[v], NULL, 0);
			compact(o);
		}
		if (o->nsv == o->cap) {
			close(fd); /* every one is answering a binding: cannot be */
			continue;
		}
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		struct hs *h = &o->sv[o->nsv];
		*h = (struct hs){.fd = fd,
				 .ssl = tls_new(o->m->sctx, fd, true),
				 .server = true,
				 .st = HS_TLS,
				 .wait = POLLIN,
				 .since = now,
				 .deadline = MIN(o->deadline, now + HANDSHAKE_MS),
				 .sa = sa};
		addr_text(&sa, h->addr, sizeof(h->addr));
		if (!h->ssl) {
			close(fd);
			continue;
		}
		o->nsv++;
	}
}

/* The open's reason when the time is up: the first connection not bound. */
static int open_timeout(struct opening *o, char *err, size_t errlen)
{
	struct coll_mesh *m = o->m;

	for (uint32_t i = 0; i < o->ncl; i++)
		if (o->cl[i].st != HS_BOUND) {
			snprintf(err, errlen,
				 "TLS mesh: node %u at %s, lane %u: no TLS handshake and binding "
				 "within %d ms",
				 o->cl[i].peer, o->cl[i].addr, o->cl[i].lane, m->timeout_ms);
			return -ETIMEDOUT;
		}
	for (uint32_t j = m->node + 1; j < m->nnodes; j++)
		for (unsigned l = 0; l < LANES; l++)
			if (conn_of(m, j, l)->fd < 0) {
				snprintf(err, errlen,
					 "TLS mesh: node %u did not connect within %d ms%s%s", j,
					 m->timeout_ms, o->refused[0] ? "; refused: " : "",
					 o->refused);
				return o->refused[0] ? ZC_ECONNECT : -ETIMEDOUT;
			}
	snprintf(err, errlen, "TLS mesh: timed out");
	return -ETIMEDOUT;
}

/* A bound connection into the mesh. */
static void hand_over(struct coll_mesh *m, struct hs *h)
{
	struct conn *c = conn_of(m, h->peer, h->lane);

	c->fd = h->fd;
	c->ssl = h->ssl;
	tls_peer_fingerprint(c->ssl, c->fp);
	h->fd = -1;
	h->ssl = NULL;
	h->st = h->server ? HS_DEAD : HS_BOUND;
}

/* Every connection of this node stepped under one poll() until all are
 * bound: 0, or a code with why in err. */
static int open_loop(struct opening *o, char *err, size_t errlen)
{
	struct coll_mesh *m = o->m;
	size_t maxp = 1 + o->ncl + o->cap;
	struct pollfd *p = calloc(maxp, sizeof(*p));
	struct hs **who = calloc(maxp, sizeof(*who));
	char why[WHY_LEN];
	int r = 0;

	if (!p || !who) {
		snprintf(err, errlen, "TLS mesh: out of memory");
		r = -ENOMEM;
		goto out;
	}
	for (;;) {
		int64_t now = now_ms(), wake = o->deadline;
		uint32_t np = 0, bound = 0;
		bool listening = o->have < o->want;

		for (uint32_t i = 0; i < o->ncl; i++)
			bound += o->cl[i].st == HS_BOUND;
		if (bound == o->ncl && !listening)
			break;
		if (now >= o->deadline) {
			r = open_timeout(o, err, errlen);
			goto out;
		}
		for (uint32_t i = 0; i < o->nsv; i++)
			if (now >= o->sv[i].deadline) {
				snprintf(why, sizeof(why),
					 "a connection from %s was not bound within %d ms",
					 o->sv[i].addr, HANDSHAKE_MS);
				drop(o, &o->sv[i], why, 0);
			}
		compact(o);
		for (uint32_t i = 0; i < o->ncl; i++)
			if (o->cl[i].st != HS_BOUND) {
				p[np] = (struct pollfd){.fd = o->cl[i].fd, .events = o->cl[i].wait};
				who[np++] = &o->cl[i];
			}
		for (uint32_t i = 0; i < o->nsv; i++) {
			p[np] = (struct pollfd){.fd = o->sv[i].fd, .events = o->sv[i].wait};
			who[np++] = &o->sv[i];
			wake = MIN(wake, o->sv[i].deadline);
		}
		if (listening) {
			p[np] = (struct pollfd){.fd = o->lfd, .events = POLLIN};
			who[np++] = NULL;
		}
		if (poll(p, np, (int)(wake - now)) < 0 && errno != EINTR) {
			r = -errno;
			snprintf(err, errlen, "TLS mesh: poll: %s", strerror(errno));
			goto out;
		}
		now = now_ms();
		for (uint32_t i = 0; i < np; i++) {
			struct hs *h = who[i];
			if (!h || !p[i].revents)
				continue;
			r = hs_step(o, h, why, sizeof(why));
			if (r == 0)
				continue;
			if (r == 1 && h->server)
				o->have++;
			if (r == 1)
				hand_over(m, h);
			else if (h->server)
				drop(o, h, why, h->rank);
			else {
				snprintf(err, errlen, "TLS mesh: %s", why);
				goto out;
			}
			r = 0;
		}
		compact(o);
		if (listening && (p[np - 1].revents & POLLIN))
			accept_some(o, now);
	}
out:
	free(p);
	free(who);
	return r;
}

static int sm_open(const struct coll_mesh_config *cfg, struct coll_mesh **ret, char *err,
		   size_t errlen)
{
	struct opening o = {.lfd = -1, .tls = cfg->tls};
	char addr[ADDR_MAX], key[PREFIX_MAX + 64], why[WHY_LEN];
	struct coll_mesh *m;
	int r;

	if (!cfg->tls || !cfg->store || !cfg->prefix || strlen(cfg->prefix) > PREFIX_MAX ||
	    cfg->nnodes < 2 || cfg->node >= cfg->nnodes || (!cfg->host && !cfg->iface) ||
	    cfg->timeout_ms <= 0) {
		snprintf(err, errlen, "TLS mesh: no TLS identity or bad settings");
		return -EINVAL;
	}
	o.deadline = now_ms() + cfg->timeout_ms;
	m = calloc(1, sizeof(*m));
	if (!m) {
		snprintf(err, errlen, "TLS mesh: out of memory");
		return -ENOMEM;
	}
	o.m = m;
	m->abort_fd = -1;
	m->node = cfg->node;
	m->nnodes = cfg->nnodes;
	m->timeout_ms = cfg->timeout_ms;
	atomic_init(&m->aborted, false);
	m->prefix = strdup(cfg->prefix);
	m->conns = calloc((size_t)cfg->nnodes * LANES, sizeof(*m->conns));
	o.want = (cfg->nnodes - 1 - cfg->node) * LANES;
	o.cap = PENDING_MAX + o.want;
	o.cl = calloc((size_t)cfg->node * LANES + 1, sizeof(*o.cl));
	o.sv = calloc(o.cap, sizeof(*o.sv));
	o.claimed = calloc((size_t)cfg->nnodes * LANES, sizeof(*o.claimed));
	m->abort_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (!m->prefix || !m->conns || !o.cl || !o.sv || !o.claimed || m->abort_fd < 0) {
		r = m->abort_fd < 0 ? -errno : -ENOMEM;
		snprintf(err, errlen, "TLS mesh: %s", strerror(-r));
		goto out;
	}
	for (size_t i = 0; i < (size_t)cfg->nnodes * LANES; i++)
		m->conns[i].fd = -1;
	m->sctx = tls_ctx_new(cfg->tls, true, cfg->ktls, why, sizeof(why));
	m->cctx = m->sctx ? tls_ctx_new(cfg->tls, false, cfg->ktls, why, sizeof(why)) : NULL;
	if (!m->cctx) {
		snprintf(err, errlen, "TLS mesh: %s", why);
		r = -ENOMEM;
		goto out;
	}
	r = listen_on(cfg, &o.lfd, addr, err, errlen);
	if (r < 0)
		goto out;
	snprintf(key, sizeof(key), "%s" STORE_KEY "%u", m->prefix, m->node);
	r = cfg->store->set(cfg->store->ctx, key, addr, strlen(addr));
	if (r < 0) {
		snprintf(err, errlen, "TLS mesh: store: set %s: %s", key, zc_strerror(r));
		goto out;
	}
	r = connect_lower(&o, cfg, err, errlen);
	if (r >= 0)
		r = open_loop(&o, err, errlen);
	if (r >= 0) {
		m->ktls_send = m->ktls_recv = true;
		for (uint32_t j = 0; j < m->nnodes; j++)
			for (unsigned l = 0; j != m->node && l < LANES; l++) {
				m->ktls_send &= tls_ktls(conn_of(m, j, l)->ssl, true);
				m->ktls_recv &= tls_ktls(conn_of(m, j, l)->ssl, false);
				if (r >= 0)
					r = tls_gather_writes(conn_of(m, j, l)->ssl, GATHER_BYTES);
			}
		if (r < 0)
			snprintf(err, errlen, "TLS mesh: out of memory");
	}
out:
	for (uint32_t i = 0; o.cl && i < o.ncl; i++)
		hs_free(&o.cl[i]);
	for (uint32_t i = 0; o.sv && i < o.nsv; i++)
		hs_free(&o.sv[i]);
	free(o.cl);
	free(o.sv);
	free(o.claimed);
	if (o.lfd >= 0)
		close(o.lfd);
	if (r < 0) {
		sm_close(m);
		return r;
	}
	*ret = m;
	return 0;
}

bool coll_sealmesh_ktls(const struct coll_mesh *m, bool send)
{
	return send ? m->ktls_send : m->ktls_recv;
}

/* ----------------------------------------------------------- calls --- */

/* Bytes to send or to receive into, in order. */
struct span {
	uint8_t *p; /* only read where they are sent */
	size_t n;
};

/* One connection's part of a call: its spans out and in, how far each is. */
struct xfer {
	struct conn *c;
	uint32_t peer;
	unsigned lane;
	const struct span *out, *in;
	uint32_t nout, nin;
	uint32_t io, ii;    /* the span under way each way */
	size_t oat, iat;    /* bytes of it done */
	bool unflushed;     /* records still gathered, not yet on the socket */
	short wwait, rwait; /* what the write side and the read side wait for */
};

/* Past the spans done (and the empty ones). */
static void settle(struct xfer *x)
{
	while (x->io < x->nout && x->oat == x->out[x->io].n)
		x->io++, x->oat = 0;
	while (x->ii < x->nin && x->iat == x->in[x->ii].n)
		x->ii++, x->iat = 0;
}

static bool out_done(const struct xfer *x)
{
	return x->io == x->nout && !x->unflushed;
}

static bool xfer_done(const struct xfer *x)
{
	return out_done(x) && x->ii == x->nin;
}

/* The connection failed: file why, and shut it (its stream is out of step
 * now), with a close_notify where TLS is still whole, so the peer hears of
 * it at once. The code back. */
static int conn_fail(struct conn *c, int code, const char *why)
{
	if (!c->err) {
		c->err = code;
		snprintf(c->why, sizeof(c->why), "%s", why);
		if (!c->broken && SSL_is_init_finished(c->ssl) &&
		    !(SSL_get_shutdown(c->ssl) & SSL_SENT_SHUTDOWN))
			SSL_shutdown(c->ssl);
		ERR_clear_error();
		shutdown(c->fd, SHUT_RDWR);
	}
	return code;
}

/* A step came to io (not OK, READ or WRITE): why, from the peer's side of
 * things, and the connection is done. */
static int xfer_broken(struct xfer *x, bool reading, enum tls_io io, int e, const char *sub,
		       char *why, size_t wlen)
{
	struct conn *c = x->c;
	int code;

	c->broken = true;
	if (io == TLS_IO_CUT) {
		snprintf(why, wlen,
			 "TLS mesh: lane %u: node %u (certificate %s): the connection was cut "
			 "(truncated): it ended without TLS close_notify",
			 x->lane, x->peer, c->fp);
		code = -EPIPE;
	} else if (peer_closed(c->ssl, io, e)) {
		snprintf(why, wlen,
			 "TLS mesh: lane %u: node %u (certificate %s) closed the connection%s%s",
			 x->lane, x->peer, c->fp, io == TLS_IO_ERROR ? ": " : "",
			 io == TLS_IO_ERROR ? sub : "");
		code = -ECONNRESET;
	} else if (reading) {
		snprintf(why, wlen,
			 "TLS mesh: lane %u: a record from node %u (certificate %s) does not open "
			 "(%s): changed, replayed, reordered or forged on the wire; refused",
			 x->lane, x->peer, c->fp, sub);
		code = -EBADMSG;
	} else {
		snprintf(why, wlen, "TLS mesh: lane %u: node %u (certificate %s): %s", x->lane,
			 x->peer, c->fp, sub);
		code = -EIO;
	}
	return conn_fail(c, code, why);
}

static short wait_of(enum tls_io io)
{
	return io == TLS_IO_READ ? POLLIN : POLLOUT;
}

/* Move what can move now without blocking. 0 (and *moved), or a code. */
static int xfer_step(struct xfer *x, bool *moved, char *why, size_t wlen)
{
	SSL *ssl = x->c->ssl;
	char sub[WHY_LEN] = "";
	enum tls_io io;
	size_t done;
	int e;

	/* out: as much as the socket takes. After a WANT the same bytes go
	 * again (OpenSSL asks for it), which they do: nothing has moved. */
	while (x->io < x->nout) {
		const struct span *s = &x->out[x->io];
		io = tls_write(ssl, s->p + x->oat, MIN(s->n - x->oat, (size_t)WRITE_MAX), &done,
			       sub, sizeof(sub));
		e = errno;
		if (io == TLS_IO_READ || io == TLS_IO_WRITE) {
			x->wwait = wait_of(io);
			break;
		}
		if (io != TLS_IO_OK)
			return xfer_broken(x, false, io, e, sub, why, wlen);
		x->oat += done;
		x->unflushed = true;
		*moved = true;
		settle(x);
	}
	/* once all is written, what was gathered goes to the socket */
	if (x->io == x->nout && x->unflushed) {
		io = tls_flush(ssl, sub, sizeof(sub));
		e = errno;
		if (io == TLS_IO_WRITE)
			x->wwait = POLLOUT;
		else if (io != TLS_IO_OK)
			return xfer_broken(x, false, io, e, sub, why, wlen);
		else
			x->unflushed = false;
	}
	/* in: until OpenSSL wants the socket, since what it holds already
	 * would show on no poll() */
	while (x->ii < x->nin) {
		const struct span *s = &x->in[x->ii];
		io = tls_read(ssl, s->p + x->iat, s->n - x->iat, &done, sub, sizeof(sub));
		e = errno;
		if (io == TLS_IO_READ || io == TLS_IO_WRITE) {
			x->rwait = wait_of(io);
			break;
		}
		if (io != TLS_IO_OK)
			return xfer_broken(x, true, io, e, sub, why, wlen);
		x->iat += done;
		*moved = true;
		settle(x);
	}
	return 0;
}

static uint64_t thread_cpu_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* The bytes a call's transfers send and receive. */
static uint64_t call_bytes(const struct xfer *x, uint32_t nx)
{
	uint64_t n = 0;

	for (uint32_t i = 0; i < nx; i++) {
		for (uint32_t k = 0; k < x[i].nout; k++)
			n += x[i].out[k].n;
		for (uint32_t k = 0; k < x[i].nin; k++)
			n += x[i].in[k].n;
	}
	return n;
}

/* Run one call's transfers to the end, each connection's both ways at once. */
static int run(struct coll_mesh *m, struct xfer *x, uint32_t nx, char *err, size_t errlen)
{
	struct pollfd p[nx + 1];
	int64_t stall = now_ms() + m->timeout_ms;
	uint64_t cpu0 = thread_cpu_ns();
	int r = 0;

	for (uint32_t i = 0; i < nx; i++) {
		struct conn *c = x[i].c;
		if (c->err) {
			snprintf(err, errlen, "%s (earlier)", c->why);
			return c->err;
		}
		settle(&x[i]);
	}
	for (;;) {
		bool moved = false, all = true;
		uint32_t np = 0;

		if (atomic_load(&m->aborted)) {
			r = -ECANCELED;
			break;
		}
		for (uint32_t i = 0; i < nx && r >= 0; i++)
			if (!xfer_done(&x[i]))
				r = xfer_step(&x[i], &moved, err, errlen);
		if (r < 0)
			break;
		int64_t now = now_ms();
		if (moved)
			stall = now + m->timeout_ms;
		for (uint32_t i = 0; i < nx; i++) {
			if (xfer_done(&x[i]))
				continue;
			all = false;
			p[np++] = (struct pollfd){
				.fd = x[i].c->fd,
				.events = (short)((x[i].ii < x[i].nin ? x[i].rwait : 0) |
						  (!out_done(&x[i]) ? x[i].wwait : 0)),
			};
		}
		if (all) {
			netstats_tls(call_bytes(x, nx), thread_cpu_ns() - cpu0);
			return 0;
		}
		if (now >= stall) {
			for (uint32_t i = 0; i < nx; i++)
				if (!xfer_done(&x[i])) {
					snprintf(err, errlen,
						 "TLS mesh: lane %u: node %u moved nothing for %d "
						 "ms",
						 x[i].lane, x[i].peer, m->timeout_ms);
					break;
				}
			r = -ETIMEDOUT;
			break;
		}
		p[np++] = (struct pollfd){.fd = m->abort_fd, .events = POLLIN};
		if (poll(p, np, (int)(stall - now)) < 0 && errno != EINTR) {
			r = -errno;
			snprintf(err, errlen, "TLS mesh: poll: %s", strerror(errno));
			break;
		}
	}
	/* the other connections of the call are out of step too: shut them,
	 * so their peers hear of it now rather than at their timeout */
	if (r == -ECANCELED)
		snprintf(err, errlen, "TLS mesh: aborted");
	for (uint32_t i = 0; i < nx; i++)
		if (!xfer_done(&x[i]))
			conn_fail(x[i].c, r, err[0] ? err : zc_strerror(r));
	return r;
}

static unsigned tag_lane(uint32_t tag)
{
	return tag & (LANES - 1);
}

/* x's one span out and one span in (either may be empty). */
static struct xfer xfer_one(struct coll_mesh *m, uint32_t peer, unsigned lane, struct span *sp,
			    const void *src, size_t sn, void *dst, size_t rn)
{
	sp[0] = (struct span){.p = (uint8_t *)src, .n = sn};
	sp[1] = (struct span){.p = dst, .n = rn};
	return (struct xfer){.c = conn_of(m, peer, lane),
			     .peer = peer,
			     .lane = lane,
			     .out = &sp[0],
			     .in = &sp[1],
			     .nout = 1,
			     .nin = 1};
}

static int sm_alltoallv(struct coll_mesh *m, uint32_t tag, const float *in, const size_t *scnt,
			float *out, const size_t *rcnt, char *err, size_t errlen)
{
	struct xfer x[m->nnodes];
	struct span sp[2 * m->nnodes];
	size_t so = 0, ro = 0;
	uint32_t nx = 0;
	unsigned lane = tag_lane(tag);

	for (uint32_t j = 0; j < m->nnodes; j++) {
		if (j == m->node) {
			if (scnt[j]) /* a node that receives nothing may pass no out */
				memmove(out + ro, in + so, scnt[j] * sizeof(float));
		} else if (scnt[j] || rcnt[j]) {
			x[nx] = xfer_one(m, j, lane, &sp[2 * nx], in + so, scnt[j] * sizeof(float),
					 out + ro, rcnt[j] * sizeof(float));
			nx++;
		}
		so += scnt[j];
		ro += rcnt[j];
	}
	return run(m, x, nx, err, errlen);
}

static int sm_allgatherv(struct coll_mesh *m, uint32_t tag, float *out, const size_t *cnt,
			 char *err, size_t errlen)
{
	struct xfer x[m->nnodes];
	struct span sp[2 * m->nnodes];
	size_t off = 0, mine = 0;
	uint32_t nx = 0;
	unsigned lane = tag_lane(tag);

	for (uint32_t j = 0; j < m->node; j++)
		mine += cnt[j];
	for (uint32_t j = 0; j < m->nnodes; j++) {
		if (j != m->node && (cnt[j] || cnt[m->node])) {
			x[nx] = xfer_one(m, j, lane, &sp[2 * nx], out + mine,
					 cnt[m->node] * sizeof(float), out + off,
					 cnt[j] * sizeof(float));
			nx++;
		}
		off += cnt[j];
	}
	return run(m, x, nx, err, errlen);
}

/* Each broadcast root's bytes to every other node, on its tag's lane: one
 * transfer per peer and lane, its spans in the list's order on both ends,
 * so every connection carries them in the same order both ways. */
static int sm_broadcasts(struct coll_mesh *m, const struct coll_mesh_bcast *b, size_t n, char *err,
			 size_t errlen)
{
	size_t nk = (size_t)m->nnodes * LANES, total = 0, pos = 0;
	uint32_t *nout = calloc(nk, sizeof(*nout)), *nin = calloc(nk, sizeof(*nin));
	uint32_t *xi = calloc(nk, sizeof(*xi));
	struct xfer *x = calloc(nk, sizeof(*x));
	struct span *sp = NULL;
	uint32_t nx = 0;
	int r = -ENOMEM;

	if (!nout || !nin || !xi || !x)
		goto out;
	for (size_t i = 0; i < n; i++) {
		size_t lane = tag_lane(b[i].tag);
		if (b[i].root >= m->nnodes) {
			snprintf(err, errlen, "TLS mesh: a broadcast from node %u of %u", b[i].root,
				 m->nnodes);
			r = -EINVAL;
			goto out;
		}
		if (!b[i].n)
			continue;
		if (b[i].root == m->node) {
			for (uint32_t j = 0; j < m->nnodes; j++)
				nout[j * LANES + lane] += j != m->node;
			total += m->nnodes - 1;
		} else {
			nin[b[i].root * LANES + lane]++;
			total++;
		}
	}
	sp = calloc(total + 1, sizeof(*sp));
	if (!sp)
		goto out;
	for (size_t k = 0; k < nk; k++) {
		if (!nout[k] && !nin[k])
			continue;
		x[nx] = (struct xfer){.c = &m->conns[k],
				      .peer = (uint32_t)(k / LANES),
				      .lane = (unsigned)(k % LANES),
				      .out = &sp[pos],
				      .in = &sp[pos + nout[k]]};
		pos += nout[k] + nin[k];
		xi[k] = nx++;
	}
	for (size_t i = 0; i < n; i++) {
		size_t lane = tag_lane(b[i].tag), bytes = b[i].n * sizeof(float);
		struct xfer *t;
		if (!bytes)
			continue;
		if (b[i].root != m->node) {
			t = &x[xi[b[i].root * LANES + lane]];
			sp[t->in - sp + t->nin++] =
				(struct span){.p = (uint8_t *)b[i].buf, .n = bytes};
			continue;
		}
		for (uint32_t j = 0; j < m->nnodes; j++) {
			if (j == m->node)
				continue;
			t = &x[xi[j * LANES + lane]];
			sp[t->out - sp + t->nout++] =
				(struct span){.p = (uint8_t *)b[i].buf, .n = bytes};
		}
	}
	r = run(m, x, nx, err, errlen);
out:
	if (r == -ENOMEM)
		snprintf(err, errlen, "TLS mesh: out of memory");
	free(nout);
	free(nin);
	free(xi);
	free(x);
	free(sp);
	return r;
}

static int sm_broadcast(struct coll_mesh *m, uint32_t tag, uint32_t root, float *buf, size_t n,
			char *err, size_t errlen)
{
	struct coll_mesh_bcast b = {.tag = tag, .root = root, .buf = buf, .n = n};

	return sm_broadcasts(m, &b, 1, err, errlen);
}

static void sm_abort(struct coll_mesh *m)
{
	uint64_t one = 1;

	atomic_store(&m->aborted, true);
	(void)!write(m->abort_fd, &one, sizeof(one));
}

const struct coll_mesh_ops coll_sealmesh_ops = {
	.name = "sealed",
	.open = sm_open,
	.alltoallv = sm_alltoallv,
	.allgatherv = sm_allgatherv,
	.broadcast = sm_broadcast,
	.broadcasts = sm_broadcasts,
	.abort = sm_abort,
	.close = sm_close,
};
