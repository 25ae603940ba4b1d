/*
 * rdzvwire.c — framing, proofs and blocking frame I/O of the rendezvous
 * between daemons (see rdzvwire.h). The HMAC and the exporter are
 * OpenSSL's (net/tls.h); the comparison of proofs is constant-time.
 */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common.h"
#include "net/rdzvwire.h"
#include "net/tls.h"
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
		const char *job, unsigned kind, SSL *ssl)
{
	static const char client_label[] = "zerod rendezvous 2: client";
	static const char server_label[] = "zerod rendezvous 2: server";
	uint8_t bind[TLS_BIND_BYTES], k = (uint8_t)kind;
	const void *p[4] = {server ? server_label : client_label, job, &k, bind};
	size_t l[4] = {sizeof(client_label), strlen(job) + 1, 1, sizeof(bind)};

	if (tls_bind(ssl, "EXPORTER-zerod-rendezvous", NULL, 0, bind) < 0) {
		tls_random(out, RDZV_PROOF_BYTES); /* proves nothing */
		return;
	}
	tls_mac(out, secret, secret_len, p, l, 4);
	tls_wipe(bind, sizeof(bind));
}

bool rdzv_proof_ok(const uint8_t want[RDZV_PROOF_BYTES], const ProtobufCBinaryData *got)
{
	return got->len == RDZV_PROOF_BYTES && tls_equal(want, got->data, RDZV_PROOF_BYTES);
}

int rdzv_send_tls(SSL *ssl, const Zerod__V1__RdzvEnvelope *env, int64_t deadline)
{
	uint8_t *buf;
	size_t len;
	int r = rdzv_frame_encode(env, &buf, &len);

	if (r < 0)
		return r;
	r = tls_write_all(ssl, buf, len, deadline);
	free(buf);
	return r;
}

int rdzv_recv_tls(SSL *ssl, size_t max, int64_t deadline, Zerod__V1__RdzvEnvelope **ret)
{
	uint8_t hdr[4], *buf;
	uint32_t n;
	char why[8];
	int r = tls_read_all(ssl, hdr, sizeof(hdr), deadline, why, sizeof(why));

	if (r < 0)
		return r;
	n = rdzv_frame_len(hdr);
	if (n > max)
		return -EPROTO;
	buf = malloc(n ? n : 1);
	if (!buf)
		return -ENOMEM;
	r = tls_read_all(ssl, buf, n, deadline, why, sizeof(why));
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
