/*
 * rdzvstore.c — the store client a job's gloo group opens through (see
 * rdzvstore.h). One TCP connection to the rendezvous, authenticated like a
 * node's join (rdzvwire.h) and made on first use; calls are serialised on
 * it. A get polls: the host answers at once, with the value or without one,
 * and the client asks again after a short, growing pause until the key is
 * there or its time is up. gloo sets and reads one key per node when its
 * group opens, so a few round trips on a quiet connection are all it costs,
 * and the host never holds a waiter. The connection is TLS, as a node's
 * is (net/tls.h): the daemon's certificates, or the job's PSK.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdatomic.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common.h"
#include "core/rdzvstore.h"
#include "net/rdzvwire.h"
#include "net/tls.h"

struct rdzv_store {
	pthread_mutex_t mu;
	int fd;   /* -1: not connected */
	SSL *ssl; /* its TLS */
	struct sockaddr_storage addr;
	socklen_t addrlen;
	char job[ZEROD_JOB_ID_MAX + 1];
	uint8_t secret[RDZV_SECRET_MAX];
	size_t secret_len;
	uint8_t psk_id[TLS_PSK_ID_BYTES], psk_key[TLS_PSK_BYTES];
	SSL_CTX *ctx; /* certificates (the daemon's identity), or the job's PSK */
	bool psk;
	int timeout_ms;
	atomic_bool cancelled; /* st_cancel(): gets fail until rdzv_store_resume() */
};

static void drop(struct rdzv_store *s)
{
	tls_free(s->ssl);
	s->ssl = NULL;
	if (s->fd >= 0)
		close(s->fd);
	s->fd = -1;
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

/* TLS, then Hello -> Welcome, each proof bound to this connection. */
static int handshake(struct rdzv_store *s, int64_t deadline)
{
	Zerod__V1__RdzvEnvelope env = ZEROD__V1__RDZV_ENVELOPE__INIT, *in = NULL;
	Zerod__V1__RdzvHello h = ZEROD__V1__RDZV_HELLO__INIT;
	uint8_t proof[RDZV_PROOF_BYTES];
	char why[200];
	int r;

	s->ssl = tls_new(s->ctx, s->fd, false);
	if (!s->ssl || (s->psk && tls_psk_client(s->ssl, s->psk_id, s->psk_key) < 0))
		return -ENOMEM;
	r = tls_handshake_wait(s->ssl, deadline, why, sizeof(why));
	if (r < 0)
		return r == -ETIMEDOUT ? r : -EACCES;
	h.protocol_version = RDZV_PROTOCOL;
	h.job_id = s->job;
	h.kind = ZEROD__V1__RDZV_KIND__RDZV_STORE;
	rdzv_proof(proof, s->secret, s->secret_len, false, s->job, h.kind, s->ssl);
	h.proof = (ProtobufCBinaryData){sizeof(proof), proof};
	env.body_case = ZEROD__V1__RDZV_ENVELOPE__BODY_HELLO;
	env.hello = &h;
	r = rdzv_send_tls(s->ssl, &env, deadline);
	if (r >= 0)
		r = rdzv_recv_tls(s->ssl, RDZV_UNAUTH_FRAME, deadline, &in);
	if (r < 0)
		return r;
	rdzv_proof(proof, s->secret, s->secret_len, true, s->job, h.kind, s->ssl);
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
static int request_once(struct rdzv_store *s, const Zerod__V1__RdzvEnvelope *env, int64_t deadline,
			Zerod__V1__RdzvEnvelope **ret)
{
	Zerod__V1__RdzvEnvelope *in = NULL;
	int r = ensure(s, deadline);

	if (r >= 0)
		r = rdzv_send_tls(s->ssl, env, deadline);
	if (r >= 0)
		r = rdzv_recv_tls(s->ssl, RDZV_VALUE_MAX + 1024, deadline, &in);
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

/* Under s->mu: one request, its StoreReply. A connection that broke on
 * the way (a record that failed to open, a cut) is made again once: a set
 * or a get may be sent twice. */
static int request(struct rdzv_store *s, const Zerod__V1__RdzvEnvelope *env, int64_t deadline,
		   Zerod__V1__RdzvEnvelope **ret)
{
	int r = request_once(s, env, deadline, ret);

	if (r == -EBADMSG || r == -EPIPE || r == -ECONNRESET)
		r = request_once(s, env, deadline, ret);
	return r;
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
		if (atomic_load(&s->cancelled))
			return -ECANCELED;
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
		   const void *secret, size_t secret_len, const struct tls_ident *tls,
		   int timeout_ms, struct rdzv_store **ret)
{
	struct rdzv_store *s;
	char why[200];

	if (addrlen > sizeof(s->addr) || secret_len > RDZV_SECRET_MAX ||
	    strlen(job) > ZEROD_JOB_ID_MAX)
		return -EINVAL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->ctx = tls_ctx_new(tls, false, false, why, sizeof(why));
	if (!s->ctx) {
		free(s);
		return -ENOMEM;
	}
	s->psk = !tls;
	tls_psk_derive(job, secret, secret_len, s->psk_id, s->psk_key);
	pthread_mutex_init(&s->mu, NULL);
	s->fd = -1;
	memcpy(&s->addr, addr, addrlen);
	s->addrlen = addrlen;
	strcpy(s->job, job);
	memcpy(s->secret, secret, secret_len);
	s->secret_len = secret_len;
	s->timeout_ms = timeout_ms > 0 ? timeout_ms : 30000;
	*ret = s;
	return 0;
}

static void st_cancel(void *ctx)
{
	struct rdzv_store *s = ctx;

	atomic_store(&s->cancelled, true);
}

void rdzv_store_resume(struct rdzv_store *s)
{
	atomic_store(&s->cancelled, false);
}

struct coll_store rdzv_store_ops(struct rdzv_store *s)
{
	return (struct coll_store){.ctx = s, .set = st_set, .get = st_get, .cancel = st_cancel};
}

void rdzv_store_free(struct rdzv_store *s)
{
	if (!s)
		return;
	drop(s);
	SSL_CTX_free(s->ctx);
	pthread_mutex_destroy(&s->mu);
	tls_wipe(s->secret, sizeof(s->secret));
	tls_wipe(s->psk_key, sizeof(s->psk_key));
	free(s);
}
