/*
 * sealmesh.c — coll/mesh.h over TCP, sealed with the daemons' CURVE keys:
 * what carries a job's tensors between nodes when zerod has
 * --curve-secret-key and --curve-peers (gloo's TCP transport has no
 * encryption at all). It owns its sockets, one eventfd for abort and the
 * sealing buffers; the keys are the daemon's (rdzvcurve.h), read-only.
 *
 * Connections. One TCP connection per pair of nodes and lane (mesh.h's
 * COLL_MESH_LANES), so the calls of one lane are in order on the wire and
 * no lane waits behind another's bytes. Each node listens on an ephemeral
 * port of its address and publishes "host:port" in the job's store under
 * PREFIX "sealmesh/" NODE; the higher node of a pair connects to the lower.
 *
 * Wire format, per connection:
 *   1. rdzvcurve.h's handshake in RdzvEnvelope frames (a 4-byte big-endian
 *      length, then the message): the connecting node's Curve (static key,
 *      fresh key, nonce), the listener's Curve with its proof and
 *      secretstream header, the connector's CurveAuth with its proof and
 *      header. Each side must hold a key the other trusts, and proves it
 *      holds its secret key; the stream keys come from four X25519 results
 *      (fresh and static keys of both sides), fresh for every connection.
 *   2. One binding frame each way, sealed (secretstream): "zerod sealmesh 1
 *      PREFIX FROM TO LANE CIPHER". The mesh prefix is fresh for every run
 *      of a job (and every re-plan), so a connection is bound to this mesh,
 *      this pair of nodes in this direction and this lane; anything else is
 *      refused. CIPHER is what the sender offers for the data: aes256gcm
 *      where its CPU has AES-NI, else xchacha20poly1305. Both offers travel
 *      sealed, so no one between the nodes can downgrade them.
 *   3. Data: each call's bytes to a peer cut into frames of at most
 *      SEALMESH_CHUNK bytes, each frame a 4-byte big-endian length and the
 *      data sealed: AES-256-GCM (+16 bytes) if both offered it, under a key
 *      per direction from the handshake and a nonce that is the frame's
 *      number in that direction; else one more secretstream message (+17
 *      bytes). A receiver knows how many bytes each frame must carry;
 *      another length is refused before anything is opened.
 *
 * Threat model. An attacker on the network can read, drop, change, replay,
 * reorder and inject bytes. Authenticated: both ends (static keys in the
 * trusted set, proven each connection), and every byte of every frame; the
 * keys are fresh for every connection and each frame's nonce is its place
 * in its direction's stream (secretstream chains them; AES-GCM counts), so
 * a frame changed, replayed from this or another connection, reordered, or
 * forged fails to open, the call fails naming the peer node and its key,
 * and the connection is shut (nothing after the first bad frame is
 * trusted). What
 * the attacker learns: which nodes talk, when, and how much (frame sizes
 * give the tensors' sizes and the calls' timing); not a byte of data. What
 * the attacker can do: cut connections or delay them (the call times out),
 * which is a failed job, never a wrong parameter. Not covered: a node that
 * holds a trusted key (it is part of the job), and the job's data inside a
 * node (shared memory, the trainers' sockets).
 *
 * Progress. A call moves every peer's bytes at once on non-blocking sockets
 * under one poll(), sealing the next frame to a peer when the previous one
 * is written and opening a frame as soon as it is whole, so both directions
 * of an alltoallv move together and full socket buffers cannot deadlock
 * two nodes. A call fails with -ETIMEDOUT when no byte moves for the
 * mesh's timeout; abort() makes the eventfd readable, which every poll
 * watches, so it wakes every blocked call at once.
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
#include <unistd.h>

#include "coll/sealmesh.h"
#include "common.h"
#include "net/rdzvcurve.h"
#include "net/rdzvwire.h"
#include "zeroclient.h"

#define LANES      COLL_MESH_LANES
#define FRAME_MAX  (SEALMESH_CHUNK + RDZV_SEC_ABYTES) /* the most a frame holds */
#define BIND_MAX   512
#define ADDR_MAX   (INET6_ADDRSTRLEN + 16)
#define WHY_LEN    256
#define BIND_MAGIC "zerod sealmesh 1"
#define STORE_KEY  "sealmesh/"
/* what one accepted connection may take to prove itself, so a stranger
 * that connects and says nothing holds the others up this long at most */
#define HANDSHAKE_MS 5000

struct conn {
	int fd; /* -1: none (this node) */
	struct rdzv_sec *sec;
	uint8_t *sbuf, *rbuf; /* a frame out, a frame in: 4 + FRAME_MAX each */
	int err;              /* sticky: the connection is shut */
	char why[WHY_LEN];
};

struct coll_mesh {
	uint32_t node, nnodes;
	int timeout_ms;
	char *prefix;
	const struct rdzv_keys *keys;
	struct conn *conns; /* [peer * LANES + lane] */
	int abort_fd;       /* an eventfd: readable once aborted */
	atomic_bool aborted;
};

static struct conn *conn_of(struct coll_mesh *m, uint32_t peer, unsigned lane)
{
	return &m->conns[(size_t)peer * LANES + lane];
}

static void put_be32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8);
	p[3] = (uint8_t)v;
}

/* ------------------------------------------------------ blocking I/O --- */


/* One sealed frame of at most max bytes of data into buf; its length. */
static int recv_sealed(struct conn *c, uint8_t *buf, size_t max, int64_t deadline)
{
	uint8_t hdr[4], *frame;
	uint32_t n;
	int r = rdzv_recv_all(c->fd, hdr, sizeof(hdr), deadline);

	if (r < 0)
		return r;
	n = rdzv_frame_len(hdr);
	if (n <= rdzv_sec_abytes(c->sec) || n > max + rdzv_sec_abytes(c->sec))
		return -EPROTO;
	frame = malloc(n);
	if (!frame)
		return -ENOMEM;
	r = rdzv_recv_all(c->fd, frame, n, deadline);
	if (r >= 0)
		r = rdzv_sec_unseal(c->sec, buf, frame, n);
	free(frame);
	return r < 0 ? r : (int)(n - rdzv_sec_abytes(c->sec));
}

static int send_sealed(struct conn *c, const void *data, size_t n, int64_t deadline)
{
	uint8_t *frame = malloc(4 + n + rdzv_sec_abytes(c->sec));
	int r;

	if (!frame)
		return -ENOMEM;
	put_be32(frame, (uint32_t)(n + rdzv_sec_abytes(c->sec)));
	r = rdzv_sec_seal(c->sec, frame + 4, data, n);
	if (r >= 0)
		r = rdzv_send_frame_blocking(c->fd, frame, 4 + n + rdzv_sec_abytes(c->sec),
					     deadline);
	free(frame);
	return r;
}

/* ----------------------------------------------------------- open --- */

#define CIPHER_AES    "aes256gcm"
#define CIPHER_STREAM "xchacha20poly1305"

/* The cipher this node offers for data: AES-256-GCM where the CPU has
 * AES-NI, unless ZEROD_SEALMESH_NO_AES is set (a diagnostic knob, which the
 * tests use to run the other cipher). */
static const char *cipher_offer(void)
{
	const char *no = getenv("ZEROD_SEALMESH_NO_AES");

	return rdzv_sec_aes_available() && !(no && *no && strcmp(no, "0") != 0) ? CIPHER_AES
										: CIPHER_STREAM;
}

static int bind_text(char *buf, size_t len, const char *prefix, uint32_t from, uint32_t to,
		     unsigned lane, const char *cipher)
{
	return snprintf(buf, len, "%s %s %u %u %u %s", BIND_MAGIC, prefix, from, to, lane, cipher);
}

/* Data in AES-256-GCM if both ends offered it (over sealed frames, so no
 * one between them can make them settle for less). */
static int agree_cipher(struct conn *c, const char *mine, const char *theirs)
{
	if (strcmp(mine, CIPHER_AES) == 0 && strcmp(theirs, CIPHER_AES) == 0)
		return rdzv_sec_use_aes(c->sec);
	return 0;
}

/* The connector's side of one connection to node `to`, lane `lane`, at
 * addr: CURVE handshake, binding frames. 0, or a code with why. */
static int client_secure(struct coll_mesh *m, struct conn *c, uint32_t to, unsigned lane,
			 const char *addr, int64_t deadline, char *why, size_t len)
{
	Zerod__V1__RdzvEnvelope env = ZEROD__V1__RDZV_ENVELOPE__INIT, *in = NULL;
	Zerod__V1__RdzvCurve cv;
	Zerod__V1__RdzvCurveAuth auth;
	char mine[BIND_MAX], want[2][BIND_MAX], got[BIND_MAX + 1], sub[160];
	const char *offer = cipher_offer();
	int r = rdzv_sec_new(m->keys, false, &c->sec);

	if (r < 0)
		return r;
	rdzv_sec_hello(c->sec, &cv);
	env.body_case = ZEROD__V1__RDZV_ENVELOPE__BODY_CURVE;
	env.curve = &cv;
	r = rdzv_send_blocking(c->fd, &env, deadline);
	if (r >= 0)
		r = rdzv_recv_blocking(c->fd, RDZV_UNAUTH_FRAME, deadline, &in);
	if (r == -ECONNRESET) {
		snprintf(why, len,
			 "node %u at %s closed the connection in the CURVE handshake: it does not "
			 "trust this node's key %s, or this node is not in its mesh",
			 to, addr, rdzv_keys_public(m->keys));
		return ZC_ECONNECT;
	}
	if (r < 0) {
		snprintf(why, len, "node %u at %s: CURVE handshake: %s", to, addr, strerror(-r));
		return r;
	}
	if (in->body_case != ZEROD__V1__RDZV_ENVELOPE__BODY_CURVE) {
		snprintf(why, len, "node %u at %s: not a CURVE reply", to, addr);
		rdzv_msg_free(in);
		return ZC_ECONNECT;
	}
	r = rdzv_sec_on_reply(c->sec, in->curve, &auth, sub, sizeof(sub));
	rdzv_msg_free(in);
	if (r != 0) {
		snprintf(why, len, "node %u at %s: %s", to, addr, sub);
		return ZC_ECONNECT;
	}
	env.body_case = ZEROD__V1__RDZV_ENVELOPE__BODY_CURVE_AUTH;
	env.curve_auth = &auth;
	r = rdzv_send_blocking(c->fd, &env, deadline);
	rdzv_sec_start(c->sec);
	bind_text(mine, sizeof(mine), m->prefix, m->node, to, lane, offer);
	bind_text(want[0], sizeof(want[0]), m->prefix, to, m->node, lane, CIPHER_AES);
	bind_text(want[1], sizeof(want[1]), m->prefix, to, m->node, lane, CIPHER_STREAM);
	if (r >= 0)
		r = send_sealed(c, mine, strlen(mine), deadline);
	if (r >= 0)
		r = recv_sealed(c, (uint8_t *)got, BIND_MAX, deadline);
	if (r >= 0) {
		got[r] = '\0';
		bool aes = strcmp(got, want[0]) == 0;
		if (aes || strcmp(got, want[1]) == 0)
			r = agree_cipher(c, offer, aes ? CIPHER_AES : CIPHER_STREAM);
		else
			r = -EPROTO;
		if (r == -EPROTO) {
			snprintf(why, len,
				 "node %u at %s (CURVE key %s) answered for another mesh, node or "
				 "lane",
				 to, addr, rdzv_sec_peer(c->sec));
			return ZC_ECONNECT;
		}
		if (r == 0)
			return 0;
	}
	snprintf(why, len, "node %u at %s (CURVE key %s): %s", to, addr, rdzv_sec_peer(c->sec),
		 r == -ECONNRESET ? "it refused the connection to this mesh"
		 : r == -EBADMSG  ? "its binding frame did not open"
				  : strerror(-r));
	return ZC_ECONNECT;
}

/* The listener's side of a connection just accepted: handshake, binding;
 * the connection is filed under its node and lane. 0, or a code with why
 * (the connection is then dropped; the mesh goes on waiting). */
static int server_secure(struct coll_mesh *m, int fd, int64_t deadline, char *why, size_t len)
{
	Zerod__V1__RdzvEnvelope env = ZEROD__V1__RDZV_ENVELOPE__INIT, *in = NULL;
	Zerod__V1__RdzvCurve reply;
	struct conn tmp = {.fd = fd}, *c;
	char got[BIND_MAX + 1], want[BIND_MAX], sub[160], head[BIND_MAX], theirs[32];
	const char *offer = cipher_offer();
	unsigned from, to, lane;
	int r = rdzv_sec_new(m->keys, true, &tmp.sec), n = 0;

	if (r < 0)
		return r;
	r = rdzv_recv_blocking(fd, RDZV_UNAUTH_FRAME, deadline, &in);
	if (r < 0 || in->body_case != ZEROD__V1__RDZV_ENVELOPE__BODY_CURVE) {
		snprintf(why, len, "a connection that did not start a CURVE handshake (%s)",
			 r < 0 ? strerror(-r) : "another message");
		goto fail;
	}
	r = rdzv_sec_on_hello(tmp.sec, in->curve, &reply, sub, sizeof(sub));
	rdzv_msg_free(in);
	in = NULL;
	if (r != 0) {
		snprintf(why, len, "%s", sub);
		goto fail;
	}
	env.body_case = ZEROD__V1__RDZV_ENVELOPE__BODY_CURVE;
	env.curve = &reply;
	r = rdzv_send_blocking(fd, &env, deadline);
	if (r >= 0)
		r = rdzv_recv_blocking(fd, RDZV_UNAUTH_FRAME, deadline, &in);
	if (r < 0 || in->body_case != ZEROD__V1__RDZV_ENVELOPE__BODY_CURVE_AUTH) {
		snprintf(why, len, "CURVE key %s: no CurveAuth (%s)", rdzv_sec_peer(tmp.sec),
			 r < 0 ? strerror(-r) : "another message");
		goto fail;
	}
	r = rdzv_sec_on_auth(tmp.sec, in->curve_auth, sub, sizeof(sub));
	rdzv_msg_free(in);
	in = NULL;
	if (r != 0) {
		snprintf(why, len, "%s", sub);
		goto fail;
	}
	r = recv_sealed(&tmp, (uint8_t *)got, BIND_MAX, deadline);
	if (r < 0) {
		snprintf(why, len, "CURVE key %s: its binding frame: %s", rdzv_sec_peer(tmp.sec),
			 r == -EBADMSG ? "did not open" : strerror(-r));
		goto fail;
	}
	got[r] = '\0';
	snprintf(head, sizeof(head), "%s %s ", BIND_MAGIC, m->prefix);
	if (strncmp(got, head, strlen(head)) != 0 ||
	    sscanf(got + strlen(head), "%u %u %u %31s%n", &from, &to, &lane, theirs, &n) != 4 ||
	    got[strlen(head) + (size_t)n] != '\0' || to != m->node || from <= m->node ||
	    from >= m->nnodes || lane >= LANES ||
	    (strcmp(theirs, CIPHER_AES) != 0 && strcmp(theirs, CIPHER_STREAM) != 0)) {
		snprintf(why, len, "CURVE key %s: a connection for another mesh, node or lane",
			 rdzv_sec_peer(tmp.sec));
		goto fail;
	}
	c = conn_of(m, from, lane);
	if (c->fd >= 0) {
		snprintf(why, len, "CURVE key %s: node %u's lane %u connected twice",
			 rdzv_sec_peer(tmp.sec), from, lane);
		goto fail;
	}
	bind_text(want, sizeof(want), m->prefix, m->node, from, lane, offer);
	r = send_sealed(&tmp, want, strlen(want), deadline);
	if (r >= 0)
		r = agree_cipher(&tmp, offer, theirs);
	if (r < 0) {
		snprintf(why, len, "node %u: %s", from, strerror(-r));
		goto fail;
	}
	c->fd = fd;
	c->sec = tmp.sec;
	return 0;
fail:
	rdzv_msg_free(in);
	rdzv_sec_free(tmp.sec);
	close(fd);
	return ZC_ECONNECT;
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
			snprintf(why, wlen, "sealed mesh: address %s: %s", cfg->host,
				 gai_strerror(r));
			return -EINVAL;
		}
		memcpy(ss, ai->ai_addr, ai->ai_addrlen);
		*len = ai->ai_addrlen;
		freeaddrinfo(ai);
		return 0;
	}
	struct ifaddrs *ifs = NULL, *v6 = NULL;
	if (getifaddrs(&ifs) < 0) {
		snprintf(why, wlen, "sealed mesh: getifaddrs: %s", strerror(errno));
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
		snprintf(why, wlen, "sealed mesh: interface %s has no address", cfg->iface);
		return -EINVAL;
	}
	return 0;
}

/* Listen on the node's address, port 0; its "host:port" in text. */
static int listen_on(const struct coll_mesh_config *cfg, int *ret_fd, char *text, char *why,
		     size_t wlen)
{
	struct sockaddr_storage ss = {0};
	socklen_t len = 0;
	char host[INET6_ADDRSTRLEN];
	int fd, r = local_addr(cfg, &ss, &len, why, wlen);

	if (r < 0)
		return r;
	if (ss.ss_family == AF_INET)
		((struct sockaddr_in *)&ss)->sin_port = 0;
	else
		((struct sockaddr_in6 *)&ss)->sin6_port = 0;
	fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0 || bind(fd, (struct sockaddr *)&ss, len) < 0 ||
	    listen(fd, (int)MIN(cfg->nnodes * LANES, 4096u)) < 0 ||
	    getsockname(fd, (struct sockaddr *)&ss, &len) < 0) {
		r = -errno;
		snprintf(why, wlen, "sealed mesh: listen on %s: %s",
			 cfg->host ? cfg->host : cfg->iface, strerror(errno));
		if (fd >= 0)
			close(fd);
		return r;
	}
	if (ss.ss_family == AF_INET) {
		struct sockaddr_in *a = (struct sockaddr_in *)&ss;
		inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
		snprintf(text, ADDR_MAX, "%s:%u", host, ntohs(a->sin_port));
	} else {
		struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
		inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
		snprintf(text, ADDR_MAX, "[%s]:%u", host, ntohs(a->sin6_port));
	}
	*ret_fd = fd;
	return 0;
}

static int connect_to(const char *addr, int64_t deadline)
{
	char host[RDZV_ENDPOINT_MAX + 1], port[16];
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM,
				 .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV},
			*ai = NULL;
	int fd, one = 1, err = 0, r;
	socklen_t elen = sizeof(err);

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
	if (r >= 0)
		r = rdzv_wait_fd(fd, POLLOUT, deadline);
	if (r >= 0 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) == 0 && err)
		r = -err;
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
		if (c->fd >= 0)
			close(c->fd);
		rdzv_sec_free(c->sec);
		free(c->sbuf);
		free(c->rbuf);
	}
	if (m->abort_fd >= 0)
		close(m->abort_fd);
	free(m->conns);
	free(m->prefix);
	free(m);
}

/* Connect to every lower node, every lane. */
static int connect_lower(struct coll_mesh *m, const struct coll_mesh_config *cfg, int64_t deadline,
			 char *err, size_t errlen)
{
	char key[512], why[WHY_LEN];

	for (uint32_t j = 0; j < m->node; j++) {
		char addr[ADDR_MAX + 1];
		void *v = NULL;
		size_t vlen = 0;
		int64_t left = deadline - now_ms();
		int r;

		snprintf(key, sizeof(key), "%s" STORE_KEY "%u", m->prefix, j);
		r = cfg->store->get(cfg->store->ctx, key, left > 0 ? (int)left : 0, &v, &vlen);
		if (r == -ETIMEDOUT)
			snprintf(err, errlen, "sealed mesh: node %u did not join within %d ms", j,
				 m->timeout_ms);
		else if (r < 0)
			snprintf(err, errlen, "sealed mesh: node %u's address: %s", j,
				 zc_strerror(r));
		if (r < 0)
			return r;
		if (vlen == 0 || vlen > ADDR_MAX) {
			free(v);
			snprintf(err, errlen, "sealed mesh: node %u published a bad address", j);
			return -EPROTO;
		}
		memcpy(addr, v, vlen);
		addr[vlen] = '\0';
		free(v);
		for (unsigned l = 0; l < LANES; l++) {
			struct conn *c = conn_of(m, j, l);
			c->fd = connect_to(addr, deadline);
			if (c->fd < 0) {
				r = c->fd;
				snprintf(err, errlen, "sealed mesh: connect to node %u at %s: %s",
					 j, addr, r == -EINVAL ? "not an address" : strerror(-r));
				return r;
			}
			r = client_secure(m, c, j, l, addr, deadline, why, sizeof(why));
			if (r != 0) {
				snprintf(err, errlen, "sealed mesh: %s", why);
				return r;
			}
		}
	}
	return 0;
}

/* Take every higher node's connections; refuse any other. */
static int accept_higher(struct coll_mesh *m, int lfd, int64_t deadline, char *err, size_t errlen)
{
	uint32_t want = (m->nnodes - 1 - m->node) * LANES, have = 0;
	char why[WHY_LEN], refused[WHY_LEN] = "";
	int one = 1;

	while (have < want) {
		int r = rdzv_wait_fd(lfd, POLLIN, deadline);
		if (r == -ETIMEDOUT) {
			uint32_t j = m->node + 1;
			while (j < m->nnodes && conn_of(m, j, LANES - 1)->fd >= 0)
				j++;
			snprintf(err, errlen,
				 "sealed mesh: node %u did not connect within %d ms%s%s", j,
				 m->timeout_ms, refused[0] ? "; refused: " : "", refused);
			return refused[0] ? ZC_ECONNECT : -ETIMEDOUT;
		}
		if (r < 0) {
			snprintf(err, errlen, "sealed mesh: %s", strerror(-r));
			return r;
		}
		int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0)
			continue;
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		if (server_secure(m, fd, MIN(deadline, now_ms() + HANDSHAKE_MS), why,
				  sizeof(why)) == 0)
			have++;
		else
			snprintf(refused, sizeof(refused), "%s", why);
	}
	return 0;
}

static int sm_open(const struct coll_mesh_config *cfg, struct coll_mesh **ret, char *err,
		   size_t errlen)
{
	int64_t deadline = now_ms() + cfg->timeout_ms;
	char addr[ADDR_MAX], key[512];
	struct coll_mesh *m;
	int lfd = -1, r;

	if (!cfg->keys || !cfg->store || !cfg->prefix || cfg->nnodes < 2 ||
	    cfg->node >= cfg->nnodes || (!cfg->host && !cfg->iface) || cfg->timeout_ms <= 0) {
		snprintf(err, errlen, "sealed mesh: no CURVE keys or bad settings");
		return -EINVAL;
	}
	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->abort_fd = -1;
	m->node = cfg->node;
	m->nnodes = cfg->nnodes;
	m->timeout_ms = cfg->timeout_ms;
	m->keys = cfg->keys;
	atomic_init(&m->aborted, false);
	m->prefix = strdup(cfg->prefix);
	m->conns = calloc((size_t)cfg->nnodes * LANES, sizeof(*m->conns));
	m->abort_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (!m->prefix || !m->conns || m->abort_fd < 0) {
		r = m->abort_fd < 0 && m->prefix && m->conns ? -errno : -ENOMEM;
		snprintf(err, errlen, "sealed mesh: %s", strerror(-r));
		goto fail;
	}
	for (size_t i = 0; i < (size_t)cfg->nnodes * LANES; i++)
		m->conns[i].fd = -1;
	r = listen_on(cfg, &lfd, addr, err, errlen);
	if (r < 0)
		goto fail;
	snprintf(key, sizeof(key), "%s" STORE_KEY "%u", m->prefix, m->node);
	r = cfg->store->set(cfg->store->ctx, key, addr, strlen(addr));
	if (r < 0) {
		snprintf(err, errlen, "sealed mesh: store: set %s: %s", key, zc_strerror(r));
		goto fail;
	}
	r = connect_lower(m, cfg, deadline, err, errlen);
	if (r >= 0)
		r = accept_higher(m, lfd, deadline, err, errlen);
	if (r < 0)
		goto fail;
	close(lfd);
	*ret = m;
	return 0;
fail:
	if (lfd >= 0)
		close(lfd);
	sm_close(m);
	return r;
}

/* ----------------------------------------------------------- calls --- */

/* One peer's part of a call: bytes out, bytes in, and the frames between. */
struct xfer {
	struct conn *c;
	uint32_t peer;
	const uint8_t *src;
	size_t sleft;     /* bytes not yet sealed */
	size_t slen, sat; /* the frame in sbuf: its length, how much is written */
	uint8_t *dst;
	size_t rleft; /* bytes not yet opened */
	size_t rat;   /* bytes of the next frame in rbuf */
};

static bool xfer_done(const struct xfer *x)
{
	return x->sleft == 0 && x->sat == x->slen && x->rleft == 0;
}

/* The connection failed: shut it (its stream is out of step now), file why,
 * and hand the code back. */
static int conn_fail(struct conn *c, int code, const char *why)
{
	if (!c->err) {
		c->err = code;
		snprintf(c->why, sizeof(c->why), "%s", why);
		shutdown(c->fd, SHUT_RDWR);
	}
	return code;
}

/* Move what can move now without blocking. 0 (and *moved), or a code. */
static int xfer_step(struct xfer *x, unsigned lane, bool *moved, char *why, size_t wlen)
{
	struct conn *c = x->c;
	size_t ab = rdzv_sec_abytes(c->sec);

	/* out: seal the next frame once the last one is written */
	for (;;) {
		if (x->sat == x->slen) {
			if (x->sleft == 0)
				break;
			size_t n = MIN(x->sleft, (size_t)SEALMESH_CHUNK);
			put_be32(c->sbuf, (uint32_t)(n + ab));
			rdzv_sec_seal(c->sec, c->sbuf + 4, x->src, n);
			x->src += n;
			x->sleft -= n;
			x->slen = 4 + n + ab;
			x->sat = 0;
		}
		ssize_t w = send(c->fd, c->sbuf + x->sat, x->slen - x->sat,
				 MSG_NOSIGNAL | MSG_DONTWAIT);
		if (w < 0 && (errno == EAGAIN || errno == EINTR))
			break;
		if (w < 0) {
			snprintf(why, wlen, "sealed mesh: lane %u: node %u (CURVE key %s): %s",
				 lane, x->peer, rdzv_sec_peer(c->sec),
				 errno == EPIPE || errno == ECONNRESET ? "the connection is closed"
								       : strerror(errno));
			return conn_fail(c, -ECONNRESET, why);
		}
		x->sat += (size_t)w;
		*moved = true;
	}
	/* in: a whole frame at a time, opened straight into place */
	while (x->rleft) {
		size_t n = MIN(x->rleft, (size_t)SEALMESH_CHUNK), need = 4 + n + ab;
		ssize_t got = recv(c->fd, c->rbuf + x->rat, need - x->rat, MSG_DONTWAIT);
		if (got < 0 && (errno == EAGAIN || errno == EINTR))
			break;
		if (got <= 0) {
			snprintf(why, wlen, "sealed mesh: lane %u: node %u (CURVE key %s)%s%s",
				 lane, x->peer, rdzv_sec_peer(c->sec),
				 got == 0 || errno == ECONNRESET ? " closed the connection" : ": ",
				 got == 0 || errno == ECONNRESET ? "" : strerror(errno));
			return conn_fail(c, -ECONNRESET, why);
		}
		*moved = true;
		x->rat += (size_t)got;
		if (x->rat >= 4 && rdzv_frame_len(c->rbuf) != n + ab) {
			snprintf(why, wlen,
				 "sealed mesh: lane %u: node %u (CURVE key %s) sent a frame of %u "
				 "bytes where %zu were due: refused",
				 lane, x->peer, rdzv_sec_peer(c->sec), rdzv_frame_len(c->rbuf),
				 n + ab);
			return conn_fail(c, -EPROTO, why);
		}
		if (x->rat < need)
			continue;
		if (rdzv_sec_unseal(c->sec, x->dst, c->rbuf + 4, n + ab) < 0) {
			snprintf(why, wlen,
				 "sealed mesh: lane %u: a frame from node %u (CURVE key %s) does "
				 "not open: changed, replayed, reordered or forged on the wire; "
				 "refused",
				 lane, x->peer, rdzv_sec_peer(c->sec));
			return conn_fail(c, -EBADMSG, why);
		}
		x->dst += n;
		x->rleft -= n;
		x->rat = 0;
	}
	return 0;
}

/* Run one call's transfers to the end, each peer's both ways at once. */
static int run(struct coll_mesh *m, unsigned lane, struct xfer *x, uint32_t nx, char *err,
	       size_t errlen)
{
	struct pollfd p[nx + 1];
	int64_t stall = now_ms() + m->timeout_ms;
	int r = 0;

	for (uint32_t i = 0; i < nx; i++) {
		struct conn *c = x[i].c;
		if (c->err) {
			snprintf(err, errlen, "%s (earlier)", c->why);
			return c->err;
		}
		if (!c->sbuf)
			c->sbuf = malloc(4 + FRAME_MAX);
		if (!c->rbuf)
			c->rbuf = malloc(4 + FRAME_MAX);
		if (!c->sbuf || !c->rbuf)
			return -ENOMEM;
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
				r = xfer_step(&x[i], lane, &moved, err, errlen);
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
				.events =
					(short)((x[i].rleft ? POLLIN : 0) |
						(x[i].sat < x[i].slen || x[i].sleft ? POLLOUT : 0)),
			};
		}
		if (all)
			return 0;
		if (now >= stall) {
			for (uint32_t i = 0; i < nx; i++)
				if (!xfer_done(&x[i])) {
					snprintf(err, errlen,
						 "sealed mesh: lane %u: node %u moved nothing for "
						 "%d "
						 "ms",
						 lane, x[i].peer, m->timeout_ms);
					break;
				}
			r = -ETIMEDOUT;
			break;
		}
		p[np++] = (struct pollfd){.fd = m->abort_fd, .events = POLLIN};
		if (poll(p, np, (int)(stall - now)) < 0 && errno != EINTR) {
			r = -errno;
			break;
		}
	}
	/* the other connections of the call are out of step too: shut them,
	 * so their peers hear of it now rather than at their timeout */
	for (uint32_t i = 0; i < nx; i++)
		if (!xfer_done(&x[i]))
			conn_fail(x[i].c, r, err[0] ? err : zc_strerror(r));
	if (r == -ECANCELED)
		snprintf(err, errlen, "sealed mesh: aborted");
	return r;
}

static unsigned tag_lane(uint32_t tag)
{
	return tag & (LANES - 1);
}

static int sm_alltoallv(struct coll_mesh *m, uint32_t tag, const float *in, const size_t *scnt,
			float *out, const size_t *rcnt, char *err, size_t errlen)
{
	struct xfer x[m->nnodes];
	size_t so = 0, ro = 0;
	uint32_t nx = 0;
	unsigned lane = tag_lane(tag);

	for (uint32_t j = 0; j < m->nnodes; j++) {
		if (j == m->node) {
			if (scnt[j]) /* a node that receives nothing may pass no out */
				memmove(out + ro, in + so, scnt[j] * sizeof(float));
		} else if (scnt[j] || rcnt[j]) {
			x[nx++] = (struct xfer){.c = conn_of(m, j, lane),
						.peer = j,
						.src = (const uint8_t *)(in + so),
						.sleft = scnt[j] * sizeof(float),
						.dst = (uint8_t *)(out + ro),
						.rleft = rcnt[j] * sizeof(float)};
		}
		so += scnt[j];
		ro += rcnt[j];
	}
	return run(m, lane, x, nx, err, errlen);
}

static int sm_allgatherv(struct coll_mesh *m, uint32_t tag, float *out, const size_t *cnt,
			 char *err, size_t errlen)
{
	struct xfer x[m->nnodes];
	size_t off = 0, mine = 0;
	uint32_t nx = 0;
	unsigned lane = tag_lane(tag);

	for (uint32_t j = 0; j < m->node; j++)
		mine += cnt[j];
	for (uint32_t j = 0; j < m->nnodes; j++) {
		if (j != m->node && (cnt[j] || cnt[m->node]))
			x[nx++] = (struct xfer){.c = conn_of(m, j, lane),
						.peer = j,
						.src = (const uint8_t *)(out + mine),
						.sleft = cnt[m->node] * sizeof(float),
						.dst = (uint8_t *)(out + off),
						.rleft = cnt[j] * sizeof(float)};
		off += cnt[j];
	}
	return run(m, lane, x, nx, err, errlen);
}

static int sm_broadcast(struct coll_mesh *m, uint32_t tag, uint32_t root, float *buf, size_t n,
			char *err, size_t errlen)
{
	struct xfer x[m->nnodes];
	uint32_t nx = 0;
	unsigned lane = tag_lane(tag);

	if (root >= m->nnodes)
		return -EINVAL;
	if (n == 0)
		return 0;
	for (uint32_t j = 0; j < m->nnodes; j++) {
		if (j == m->node || (m->node != root && j != root))
			continue;
		x[nx++] = (struct xfer){.c = conn_of(m, j, lane), .peer = j};
		if (m->node == root)
			x[nx - 1].src = (const uint8_t *)buf, x[nx - 1].sleft = n * sizeof(float);
		else
			x[nx - 1].dst = (uint8_t *)buf, x[nx - 1].rleft = n * sizeof(float);
	}
	return run(m, lane, x, nx, err, errlen);
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
	.abort = sm_abort,
	.close = sm_close,
};
