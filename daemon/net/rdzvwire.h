/*
 * rdzvwire.h — the bytes of the rendezvous between daemons (proto/zerod.proto,
 * RdzvEnvelope), inside TLS (net/tls.h): framing (a 4-byte big-endian
 * length, then the message), the HMAC proofs that bind a connection to its
 * job, and blocking frame I/O for the store client.
 * Shared by the loop's side (rdzv.c) and the executor's (rdzvstore.c); no
 * state, any thread.
 */
#ifndef ZEROD_RDZVWIRE_H
#define ZEROD_RDZVWIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <openssl/ssl.h>

#include "zerod.pb-c.h"

#define RDZV_PROTOCOL     2
#define RDZV_PROOF_BYTES  32
#define RDZV_SECRET_MAX   256
#define RDZV_ENDPOINT_MAX 255
/* Frames a peer may send before it authenticated (a Hello is ~100 bytes). */
#define RDZV_UNAUTH_FRAME 1024
/* Store keys and values a node may keep on the host. */
#define RDZV_KEY_MAX   256
#define RDZV_VALUE_MAX (1u << 20)

/* Encode env as one frame: *ret_buf (malloc'd) holds the length and the
 * message. 0 or -ENOMEM. */
int rdzv_frame_encode(const Zerod__V1__RdzvEnvelope *env, uint8_t **ret_buf, size_t *ret_len);

/* The length a frame header announces. */
static inline uint32_t rdzv_frame_len(const uint8_t hdr[4])
{
	return (uint32_t)hdr[0] << 24 | (uint32_t)hdr[1] << 16 | (uint32_t)hdr[2] << 8 | hdr[3];
}

/* Decode one message; NULL if it is not a RdzvEnvelope, or a string field
 * holds a NUL byte. Free with rdzv_msg_free(). */
Zerod__V1__RdzvEnvelope *rdzv_msg_decode(const uint8_t *buf, size_t len);
void rdzv_msg_free(Zerod__V1__RdzvEnvelope *env);
const char *rdzv_msg_name(Zerod__V1__RdzvEnvelope__BodyCase c);

/* The proofs that bind a connection to its job, sent inside TLS (Hello,
 * Welcome): HMAC-SHA256 keyed with the job's secret over a label of the
 * prover's side, the job id, the connection's kind and this TLS
 * connection's exporter, so a proof is never valid in the other direction
 * or on another connection. */
void rdzv_proof(uint8_t out[RDZV_PROOF_BYTES], const void *secret, size_t secret_len, bool server,
		const char *job, unsigned kind, SSL *ssl);
/* Constant-time comparison of a received proof with the expected one. */
bool rdzv_proof_ok(const uint8_t want[RDZV_PROOF_BYTES], const ProtobufCBinaryData *got);

/* Blocking I/O on a TLS connection for the store client: send one frame,
 * receive one frame (at most max bytes), each within the deadline (now_ms()
 * clock). 0, -ETIMEDOUT, -ECONNRESET (closed), -EPIPE (cut), -EBADMSG (a
 * record that fails to open), -EPROTO (too big or not a message), or
 * -errno. */
int rdzv_send_tls(SSL *ssl, const Zerod__V1__RdzvEnvelope *env, int64_t deadline);
int rdzv_recv_tls(SSL *ssl, size_t max, int64_t deadline, Zerod__V1__RdzvEnvelope **ret);

/* "host:port" or "[v6]:port" into host and port; false if it is not. */
bool rdzv_split_endpoint(const char *ep, char *host, size_t hostlen, char *port, size_t portlen);

#endif
