/*
 * rdzvwire.c — framing, proofs and blocking frame I/O of the rendezvous
 * between daemons (see rdzvwire.h). The HMAC and the random nonces come from
 * libsodium; the comparison of proofs is constant-time.
 */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <sodium.h>

#include "common.h"
#include "net/rdzvwire.h"
#include "wire.h"

int rdzv_frame_encode(const Zerod__V1__RdzvEnvelope *env, uint8_t **ret_buf, size_t *ret_len)
{
	size_t n = zerod__v1__rdzv_envelope__get_packed_size(env);
	uint8_t *buf = malloc(4 + n);

	if (!buf || n > UINT32_MAX) {
		free(buf);
		return -ENOMEM;
	}
	buf[0] = (uint8_t)(n >> 24);
	buf[1] = (uint8_t)(n >> 16);
	buf[2] = (uint8_t)(n >> 8);
	buf[3] = (uint8_t)n;
	zerod__v1__rdzv_envelope__pack(env, buf + 4);
	*ret_buf = buf;
	*ret_len = 4 + n;
	return 0;
}

Zerod__V1__RdzvEnvelope *rdzv_msg_decode(const uint8_t *buf, size_t len)
{
	Zerod__V1__RdzvEnvelope *env = zerod__v1__rdzv_envelope__unpack(NULL, len, buf);
	const char *field;

	if (env && wire_has_nul(&zerod__v1__rdzv_envelope__descriptor, buf, len, &field)) {
		zerod__v1__rdzv_envelope__free_unpacked(env, NULL);
		return NULL;
	}
	return env;
}

void rdzv_msg_free(Zerod__V1__RdzvEnvelope *env)
{
	if (env)
		zerod__v1__rdzv_envelope__free_unpacked(env, NULL);
}

const char *rdzv_msg_name(Zerod__V1__RdzvEnvelope__BodyCase c)
{
	const ProtobufCFieldDescriptor *f =
		protobuf_c_message_descriptor_get_field(&zerod__v1__rdzv_envelope__descriptor, c);

	return f ? f->name : "an empty message";
}

void rdzv_proof(uint8_t out[RDZV_PROOF_BYTES], const void *secret, size_t secret_len, bool server,
		const char *job, unsigned kind, const uint8_t client_nonce[RDZV_NONCE_BYTES],
		const uint8_t server_nonce[RDZV_NONCE_BYTES])
{
	static const char client_label[] = "zerod rendezvous 1: client";
	static const char server_label[] = "zerod rendezvous 1: server";
	crypto_auth_hmacsha256_state st;
	uint8_t k = (uint8_t)kind;

	crypto_auth_hmacsha256_init(&st, secret, secret_len);
	if (server)
		crypto_auth_hmacsha256_update(&st, (const uint8_t *)server_label,
					      sizeof(server_label));
	else
		crypto_auth_hmacsha256_update(&st, (const uint8_t *)client_label,
					      sizeof(client_label));
	crypto_auth_hmacsha256_update(&st, (const uint8_t *)job, strlen(job) + 1);
	crypto_auth_hmacsha256_update(&st, &k, 1);
	if (server) {
		crypto_auth_hmacsha256_update(&st, server_nonce, RDZV_NONCE_BYTES);
		crypto_auth_hmacsha256_update(&st, client_nonce, RDZV_NONCE_BYTES);
	} else {
		crypto_auth_hmacsha256_update(&st, client_nonce, RDZV_NONCE_BYTES);
		crypto_auth_hmacsha256_update(&st, server_nonce, RDZV_NONCE_BYTES);
	}
	crypto_auth_hmacsha256_final(&st, out);
	sodium_memzero(&st, sizeof(st));
}

bool rdzv_proof_ok(const uint8_t want[RDZV_PROOF_BYTES], const ProtobufCBinaryData *got)
{
	return got->len == RDZV_PROOF_BYTES &&
	       sodium_memcmp(want, got->data, RDZV_PROOF_BYTES) == 0;
}

void rdzv_random(void *buf, size_t len)
{
	randombytes_buf(buf, len);
}

int rdzv_wait_fd(int fd, short events, int64_t deadline)
{
	for (;;) {
		struct pollfd p = {.fd = fd, .events = events};
		int64_t left = deadline - now_ms();
		int r;

		if (left <= 0)
			return -ETIMEDOUT;
		r = poll(&p, 1, (int)MIN(left, (int64_t)1000));
		if (r < 0 && errno != EINTR)
			return -errno;
		if (r > 0)
			return 0;
	}
}

static int send_all(int fd, const uint8_t *p, size_t n, int64_t deadline)
{
	while (n) {
		ssize_t w = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
			int r = rdzv_wait_fd(fd, POLLOUT, deadline);
			if (r < 0)
				return r;
			continue;
		}
		if (w < 0)
			return errno == EPIPE ? -ECONNRESET : -errno;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

int rdzv_recv_all(int fd, uint8_t *p, size_t n, int64_t deadline)
{
	while (n) {
		ssize_t got = recv(fd, p, n, MSG_DONTWAIT);
		if (got < 0 && (errno == EAGAIN || errno == EINTR)) {
			int r = rdzv_wait_fd(fd, POLLIN, deadline);
			if (r < 0)
				return r;
			continue;
		}
		if (got == 0)
			return -ECONNRESET;
		if (got < 0)
			return -errno;
		p += got;
		n -= (size_t)got;
	}
	return 0;
}

int rdzv_send_blocking(int fd, const Zerod__V1__RdzvEnvelope *env, int64_t deadline)
{
	uint8_t *buf;
	size_t len;
	int r = rdzv_frame_encode(env, &buf, &len);

	if (r < 0)
		return r;
	r = send_all(fd, buf, len, deadline);
	free(buf);
	return r;
}

int rdzv_send_frame_blocking(int fd, const uint8_t *buf, size_t len, int64_t deadline)
{
	return send_all(fd, buf, len, deadline);
}

int rdzv_recv_blocking(int fd, size_t max, int64_t deadline, Zerod__V1__RdzvEnvelope **ret)
{
	uint8_t hdr[4], *buf;
	uint32_t n;
	int r = rdzv_recv_all(fd, hdr, sizeof(hdr), deadline);

	if (r < 0)
		return r;
	n = rdzv_frame_len(hdr);
	if (n > max)
		return -EPROTO;
	buf = malloc(n ? n : 1);
	if (!buf)
		return -ENOMEM;
	r = rdzv_recv_all(fd, buf, n, deadline);
	if (r >= 0) {
		*ret = rdzv_msg_decode(buf, n);
		r = *ret ? 0 : -EPROTO;
	}
	free(buf);
	return r;
}

bool rdzv_split_endpoint(const char *ep, char *host, size_t hostlen, char *port, size_t portlen)
{
	const char *colon, *h = ep, *hend;
	char *end;
	unsigned long n;

	if (!ep || strlen(ep) > RDZV_ENDPOINT_MAX)
		return false;
	if (ep[0] == '[') {
		hend = strchr(ep, ']');
		if (!hend || hend[1] != ':')
			return false;
		h = ep + 1;
		colon = hend + 1;
	} else {
		colon = strrchr(ep, ':');
		if (!colon)
			return false;
		hend = colon;
	}
	n = strtoul(colon + 1, &end, 10);
	if (hend == h || !colon[1] || *end || n == 0 || n > 65535 || colon[1] == '-' ||
	    (size_t)(hend - h) >= hostlen || strlen(colon + 1) >= portlen)
		return false;
	memcpy(host, h, (size_t)(hend - h));
	host[hend - h] = '\0';
	strcpy(port, colon + 1);
	return true;
}
