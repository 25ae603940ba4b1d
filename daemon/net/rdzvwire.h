/*
 * rdzvwire.h — the bytes of the rendezvous between daemons (proto/zerod.proto,
 * RdzvEnvelope): framing (a 4-byte big-endian length, then the message), the
 * HMAC proofs of the handshake, and blocking frame I/O for the store client.
 * Shared by the loop's side (rdzv.c) and the executor's (rdzvstore.c); no
 * state, any thread.
 */
#ifndef ZEROD_RDZVWIRE_H
#define ZEROD_RDZVWIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "zerod.pb-c.h"

#define RDZV_PROTOCOL     1
#define RDZV_NONCE_BYTES  32
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

/* The handshake's proofs: HMAC-SHA256 keyed with the job's secret over a
 * label, the job id, the connection's kind and both nonces, the prover's
 * peer's nonce last, so a proof is never valid in the other direction or
 * for another connection. */
void rdzv_proof(uint8_t out[RDZV_PROOF_BYTES], const void *secret, size_t secret_len, bool server,
		const char *job, unsigned kind, const uint8_t client_nonce[RDZV_NONCE_BYTES],
		const uint8_t server_nonce[RDZV_NONCE_BYTES]);
/* Constant-time comparison of a received proof with the expected one. */
bool rdzv_proof_ok(const uint8_t want[RDZV_PROOF_BYTES], const ProtobufCBinaryData *got);
void rdzv_random(void *buf, size_t len);

/* Blocking I/O on a connected socket for the store client: send one frame,
 * receive one frame (at most max bytes), each within the deadline (now_ms()
 * clock). 0, -ETIMEDOUT, -ECONNRESET (closed), -EPROTO (too big or not a
 * message), or -errno. */
int rdzv_send_blocking(int fd, const Zerod__V1__RdzvEnvelope *env, int64_t deadline);
/* A frame already encoded (rdzvcurve.h's sealed ones). */
int rdzv_send_frame_blocking(int fd, const uint8_t *buf, size_t len, int64_t deadline);
int rdzv_recv_blocking(int fd, size_t max, int64_t deadline, Zerod__V1__RdzvEnvelope **ret);
/* Wait until fd is ready for events (poll's), or the deadline: 0,
 * -ETIMEDOUT or -errno. */
int rdzv_wait_fd(int fd, short events, int64_t deadline);
/* Exactly n bytes into p (fd non-blocking or not): 0, -ETIMEDOUT,
 * -ECONNRESET (closed first) or -errno. */
int rdzv_recv_all(int fd, uint8_t *p, size_t n, int64_t deadline);

/* "host:port" or "[v6]:port" into host and port; false if it is not. */
bool rdzv_split_endpoint(const char *ep, char *host, size_t hostlen, char *port, size_t portlen);

#endif
