/*
 * rdzvstore.c — the store client a job's gloo group opens through (see
 * rdzvstore.h). One TCP connection to the rendezvous, authenticated like a
 * node's join (rdzvwire.h) and made on first use; calls are serialised on
 * it. A get polls: the host answers at once, with the value or without one,
 * and the client asks again after a short, growing pause until the key is
 * there or its time is up. gloo sets and reads one key per node when its
 * group opens, so a few round trips on a quiet connection are all it costs,
 * and the host never holds a waiter. With CURVE keys, the connection is
 * secured first, as a node's is (rdzvcurve.h), and every frame after that
 * is sealed.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common.h"
#include "net/rdzvcurve.h"
#include "core/rdzvstore.h"
#include "net/rdzvwire.h"

struct rdzv_store {
	pthread_mutex_t mu;
	int fd; /* -1: not connected */
	struct sockaddr_storage addr;
	socklen_t addrlen;
	char job[ZEROD_JOB_ID_MAX + 1];
	uint8_t secret[RDZV_SECRET_MAX];
	size_t secret_len;
	const struct rdzv_keys *keys; /* NULL: plain TCP */
	struct rdzv_sec *sec;         /* this connection's channel */
	int timeout_ms;
};

static void drop(struct rdzv_store *s)
{
	if (s->fd >= 0)
		close(s->fd);
	s->fd = -1;
	rdzv_sec_free(s->sec);
	s->sec = NULL;
}

/* One message out, sealed once the channel is ready. */
static int xsend(struct rdzv_store *s, const Zerod__V1__RdzvEnvelope *env, int64_t deadline)
{
	uint8_t *buf;
	size_t len;
	int r;

	if (!s->sec || !rdzv_sec_ready(s->sec))
		return rdzv_send_blocking(s->fd, env, deadline);
	r = rdzv_sec_encode(s->sec, env, &buf, &len);
	if (r < 0)
		return r;
	r = rdzv_send_frame_blocking(s->fd, buf, len, deadline);
	free(buf);
	return r;
}

/* One message in (at most max bytes), opened once the channel is ready:
 * -EBADMSG if it fails to. */
static int xrecv(struct rdzv_store *s, size_t max, int64_t deadline, Zerod__V1__RdzvEnvelope **ret)
{
	Zerod__V1__RdzvEnvelope *in = NULL;
	int r;

	if (!s->sec || !rdzv_sec_ready(s->sec))
		return rdzv_recv_blocking(s->fd, max, deadline, ret);
	r = rdzv_recv_blocking(s->fd, max + RDZV_CURVE_OVERHEAD, deadline, &in);
	if (r < 0)
		return r;
	if (in->body_case != ZEROD__V1__RDZV_ENVELOPE__BODY_SEALED) {
		r = in->body_case == ZEROD__V1__RDZV_ENVELOPE__BODY_FAIL ? -EACCES : -EPROTO;
		rdzv_msg_free(in);
		return r;
	}
	r = rdzv_sec_open(s->sec, &in->sealed, ret);
	rdzv_msg_free(in);
	return r;
}

/* CURVE: Curve, the host's Curve, CurveAuth; sealed from then on. */
static int secure(struct rdzv_store *s, int64_t deadline)
{
	Zerod__V1__RdzvEnvelope env = ZEROD__V1__RDZV_ENVELOPE__INIT, *in = NULL;
	Zerod__V1__RdzvCurve cv;
	Zerod__V1__RdzvCurveAuth auth;
	char why[160];
	int r = rdzv_sec_new(s->keys, false, &s->sec);

	if (r < 0)
		return r;
	rdzv_sec_hello(s->sec, &cv);
	env.body_case = ZEROD__V1__RDZV_ENVELOPE__BODY_CURVE;
	env.curve = &cv;
	r = rdzv_send_blocking(s->fd, &env, deadline);
	if (r >= 0)
		r = rdzv_recv_blocking(s->fd, RDZV_UNAUTH_FRAME, deadline, &in);
	if (r < 0)
		return r;
	if (in->body_case != ZEROD__V1__RDZV_ENVELOPE__BODY_CURVE)
		r = in->body_case == ZEROD__V1__RDZV_ENVELOPE__BODY_FAIL ? -EACCES : -EPROTO;
	else if (rdzv_sec_on_reply(s->sec, in->curve, &auth, why, sizeof(why)) != 0)
		r = -EACCES; /* a host this node does not trust, or one that did not prove it */
	rdzv_msg_free(in);
	if (r < 0)
		return r;
	env.body_case = ZEROD__V1__RDZV_ENVELOPE__BODY_CURVE_AUTH;
	env.curve_auth = &auth;
	r = rdzv_send_blocking(s->fd, &env, deadline);
	rdzv_sec_start(s->sec);
	return r;
}

static int connect_by(struct rdzv_store *s, int64_t deadline)
{
	int one = 1, err = 0, r;
	socklen_t len = sizeof(err);
	int fd = socket(s->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return -errno;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	if (connect(fd, (struct sockaddr *)&s->addr, s->addrlen) < 0 && errno != EINPROGRESS) {
		r = -errno;
		close(fd);
		return r;
	}
	for (;;) {
		struct pollfd p = {.fd = fd, .events = POLLOUT};
		int64_t left = deadline - now_ms();
		if (left <= 0) {
			close(fd);
			return -ETIMEDOUT;
		}
		r = poll(&p, 1, (int)MIN(left, (int64_t)1000));
		if (r > 0)
			break;
		if (r < 0 && errno != EINTR) {
			r = -errno;
			close(fd);
			return r;
		}
	}
	if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0 || err) {
		close(fd);
		return err ? -err : -EIO;
	}
	s->fd = fd;
	return 0;
}

/* A Fail from the host: its code as -errno-like for the caller. */
static int fail_code(const Zerod__V1__RdzvEnvelope *m)
{
	return m->body_case == ZEROD__V1__RDZV_ENVELOPE__BODY_FAIL ? -EACCES : -EPROTO;
}

static int handshake(struct rdzv_store *s, int64_t deadline)
{
	Zerod__V1__RdzvEnvelope env = ZEROD__V1__RDZV_ENVELOPE__INIT, *in = NULL;
	Zerod__V1__RdzvHello h = ZEROD__V1__RDZV_HELLO__INIT;
	Zerod__V1__RdzvAuth a = ZEROD__V1__RDZV_AUTH__INIT;
	uint8_t cn[RDZV_NONCE_BYTES], sn[RDZV_NONCE_BYTES], proof[RDZV_PROOF_BYTES];
	int r;

	rdzv_random(cn, sizeof(cn));
	h.protocol_version = RDZV_PROTOCOL;
	h.job_id = s->job;
	h.kind = ZEROD__V1__RDZV_KIND__RDZV_STORE;
	h.nonce = (ProtobufCBinaryData){sizeof(cn), cn};
	env.body_case = ZEROD__V1__RDZV_ENVELOPE__BODY_HELLO;
	env.hello = &h;
	r = s->keys ? secure(s, deadline) : 0;
	if (r >= 0)
		r = xsend(s, &env, deadline);
	if (r >= 0)
		r = xrecv(s, RDZV_UNAUTH_FRAME, deadline, &in);
	if (r < 0)
		return r;
	if (in->body_case != ZEROD__V1__RDZV_ENVELOPE__BODY_CHALLENGE ||
	    in->challenge->nonce.len != sizeof(sn)) {
		r = fail_code(in);
		rdzv_msg_free(in);
		return r;
	}
	memcpy(sn, in->challenge->nonce.data, sizeof(sn));
	rdzv_msg_free(in);
	in = NULL;
	rdzv_proof(proof, s->secret, s->secret_len, false, s->job, h.kind, cn, sn);
	a.proof = (ProtobufCBinaryData){sizeof(proof), proof};
	env.body_case = ZEROD__V1__RDZV_ENVELOPE__BODY_AUTH;
	env.auth = &a;
	r = xsend(s, &env, deadline);
	if (r >= 0)
		r = xrecv(s, RDZV_UNAUTH_FRAME, deadline, &in);
	if (r < 0)
		return r;
	rdzv_proof(proof, s->secret, s->secret_len, true, s->job, h.kind, cn, sn);
	if (in->body_case != ZEROD__V1__RDZV_ENVELOPE__BODY_WELCOME)
		r = fail_code(in);
	else if (!rdzv_proof_ok(proof, &in->welcome->proof))
		r = -EACCES; /* the host does not know the secret */
	rdzv_msg_free(in);
	return r;
}

/* Under s->mu: a connection, authenticated. */
static int ensure(struct rdzv_store *s, int64_t deadline)
{
	int r;

	if (s->fd >= 0)
		return 0;
	r = connect_by(s, deadline);
	if (r >= 0)
		r = handshake(s, deadline);
	if (r < 0)
		drop(s);
	return r;
}

/* Under s->mu: one request, its StoreReply. */
static int request(struct rdzv_store *s, const Zerod__V1__RdzvEnvelope *env, int64_t deadline,
		   Zerod__V1__RdzvEnvelope **ret)
{
	Zerod__V1__RdzvEnvelope *in = NULL;
	int r = ensure(s, deadline);

	if (r >= 0)
		r = xsend(s, env, deadline);
	if (r >= 0)
		r = xrecv(s, RDZV_VALUE_MAX + 1024, deadline, &in);
	if (r >= 0 && in->body_case != ZEROD__V1__RDZV_ENVELOPE__BODY_STORE_REPLY) {
		r = fail_code(in);
		rdzv_msg_free(in);
	}
	if (r < 0) {
		drop(s);
		return r;
	}
	*ret = in;
	return 0;
}

static int st_set(void *ctx, const char *key, const void *value, size_t len)
{
	struct rdzv_store *s = ctx;
	Zerod__V1__RdzvEnvelope env = ZEROD__V1__RDZV_ENVELOPE__INIT, *in = NULL;
	Zerod__V1__StoreSet m = ZEROD__V1__STORE_SET__INIT;
	int r;

	if (strlen(key) > RDZV_KEY_MAX || len > RDZV_VALUE_MAX)
		return -E2BIG;
	m.key = (char *)key;
	m.value = (ProtobufCBinaryData){len, (uint8_t *)value};
	env.body_case = ZEROD__V1__RDZV_ENVELOPE__BODY_STORE_SET;
	env.store_set = &m;
	pthread_mutex_lock(&s->mu);
	r = request(s, &env, now_ms() + s->timeout_ms, &in);
	pthread_mutex_unlock(&s->mu);
	rdzv_msg_free(in);
	return r;
}

static int st_get(void *ctx, const char *key, int timeout_ms, void **ret_value, size_t *ret_len)
{
	struct rdzv_store *s = ctx;
	Zerod__V1__RdzvEnvelope env = ZEROD__V1__RDZV_ENVELOPE__INIT, *in;
	Zerod__V1__StoreGet m = ZEROD__V1__STORE_GET__INIT;
	int64_t deadline = now_ms() + MAX(timeout_ms, 0);
	int pause = 2, r;

	if (strlen(key) > RDZV_KEY_MAX)
		return -E2BIG;
	m.key = (char *)key;
	env.body_case = ZEROD__V1__RDZV_ENVELOPE__BODY_STORE_GET;
	env.store_get = &m;
	for (;;) {
		/* each request may take the store's own timeout: a get that
		 * waits 0 ms still asks once */
		in = NULL;
		pthread_mutex_lock(&s->mu);
		r = request(s, &env, MAX(deadline, now_ms() + s->timeout_ms), &in);
		pthread_mutex_unlock(&s->mu);
		if (r < 0)
			return r;
		if (in->store_reply->has_value) {
			void *v = malloc(in->store_reply->value.len + 1);
			if (!v) {
				rdzv_msg_free(in);
				return -ENOMEM;
			}
			memcpy(v, in->store_reply->value.data, in->store_reply->value.len);
			*ret_len = in->store_reply->value.len;
			*ret_value = v;
			rdzv_msg_free(in);
			return 0;
		}
		rdzv_msg_free(in);
		if (now_ms() >= deadline)
			return -ETIMEDOUT;
		poll(NULL, 0, (int)MIN((int64_t)pause, MAX(deadline - now_ms(), (int64_t)1)));
		pause = MIN(pause * 2, 50);
	}
}

int rdzv_store_new(const struct sockaddr *addr, socklen_t addrlen, const char *job,
		   const void *secret, size_t secret_len, const struct rdzv_keys *keys,
		   int timeout_ms, struct rdzv_store **ret)
{
	struct rdzv_store *s;

	if (addrlen > sizeof(s->addr) || secret_len > RDZV_SECRET_MAX ||
	    strlen(job) > ZEROD_JOB_ID_MAX)
		return -EINVAL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	pthread_mutex_init(&s->mu, NULL);
	s->fd = -1;
	memcpy(&s->addr, addr, addrlen);
	s->addrlen = addrlen;
	strcpy(s->job, job);
	memcpy(s->secret, secret, secret_len);
	s->secret_len = secret_len;
	s->keys = keys;
	s->timeout_ms = timeout_ms > 0 ? timeout_ms : 30000;
	*ret = s;
	return 0;
}

struct coll_store rdzv_store_ops(struct rdzv_store *s)
{
	return (struct coll_store){.ctx = s, .set = st_set, .get = st_get};
}

void rdzv_store_free(struct rdzv_store *s)
{
	if (!s)
		return;
	drop(s);
	pthread_mutex_destroy(&s->mu);
	explicit_bzero(s->secret, sizeof(s->secret));
	free(s);
}
