/*
 * rdzvcurve.h — CURVE on the rendezvous between daemons: the daemon's key
 * pair and the peers' public keys it trusts (in ZeroMQ's Z85 form, files
 * that `zeroctl keygen` writes), and one connection's secure channel: the
 * handshake (proto/zerod.proto, RdzvCurve and RdzvCurveAuth) and then
 * every frame sealed with libsodium's crypto_secretstream_xchacha20poly1305,
 * one stream per direction.
 *
 * Keys are loaded once, at start, and never change: any thread may read
 * them. A channel belongs to its connection's thread (the loop for rdzv.c,
 * the executor's for the store client in rdzvstore.c). No function here
 * logs: failures come back as a code and a reason.
 */
#ifndef ZEROD_RDZVCURVE_H
#define ZEROD_RDZVCURVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "zerod.pb-c.h"

#define RDZV_CURVE_KEY_BYTES 32
#define RDZV_CURVE_Z85_LEN   40 /* a key as ZeroMQ writes it */
#define RDZV_CURVE_MAX_PEERS 4096
/* what a sealed frame adds to the message it carries (the secretstream
 * tag and MAC, the envelope's field header) */
#define RDZV_CURVE_OVERHEAD 64

struct rdzv_keys;
struct rdzv_sec;

/* Z85 text (exactly 40 characters) into 32 bytes; false if it is not one. */
bool rdzv_curve_z85_decode(const char *text, uint8_t out[RDZV_CURVE_KEY_BYTES]);
/* 32 bytes into Z85 (out: 41 bytes with the NUL). */
void rdzv_curve_z85_encode(const uint8_t key[RDZV_CURVE_KEY_BYTES],
			   char out[RDZV_CURVE_Z85_LEN + 1]);

/* Load the daemon's secret key (a file of one Z85 key, not readable by
 * group or others) and the public keys it trusts (a file, one Z85 key per
 * line, blank lines and lines that begin with '#' allowed). Both paths, or neither:
 * with neither, *ret is NULL and 0 is returned (no CURVE). Else 0 and the
 * keys, or -EINVAL / -errno with "PATH[:LINE]: why" in err. */
int rdzv_keys_load(const char *secret_path, const char *peers_path, struct rdzv_keys **ret,
		   char *err, size_t errlen);
/* Accepts NULL; wipes the secret key. */
void rdzv_keys_free(struct rdzv_keys *k);
/* The daemon's own public key, Z85. */
const char *rdzv_keys_public(const struct rdzv_keys *k);
/* How many peer keys it trusts (its own key is always trusted). */
unsigned rdzv_keys_npeers(const struct rdzv_keys *k);

/* A channel for one connection, as its client (the side that connects) or
 * its server. 0 or -ENOMEM. */
int rdzv_sec_new(const struct rdzv_keys *k, bool server, struct rdzv_sec **ret);
/* Accepts NULL; wipes the keys. */
void rdzv_sec_free(struct rdzv_sec *s);

/* The client's first message: *out points into s. */
void rdzv_sec_hello(struct rdzv_sec *s, Zerod__V1__RdzvCurve *out);
/* The server, given the client's Curve: 0 and its reply in *out (pointing
 * into s), or ZC_ECONNECT with why (a key it does not trust, a malformed
 * or weak key). */
int rdzv_sec_on_hello(struct rdzv_sec *s, const Zerod__V1__RdzvCurve *in, Zerod__V1__RdzvCurve *out,
		      char *why, size_t len);
/* The client, given the server's Curve: 0 and its CurveAuth in *out; the
 * channel is ready once *out is sent (rdzv_sec_ready()). ZC_ECONNECT with
 * why if the server's key is not trusted or it did not prove it. */
int rdzv_sec_on_reply(struct rdzv_sec *s, const Zerod__V1__RdzvCurve *in,
		      Zerod__V1__RdzvCurveAuth *out, char *why, size_t len);
/* The server, given the client's CurveAuth: 0 (ready), or ZC_ECONNECT. */
int rdzv_sec_on_auth(struct rdzv_sec *s, const Zerod__V1__RdzvCurveAuth *in, char *why, size_t len);
/* Frames both ways are sealed from now on. */
bool rdzv_sec_ready(const struct rdzv_sec *s);
/* The client marks its CurveAuth sent: frames after it are sealed. */
void rdzv_sec_start(struct rdzv_sec *s);
/* The peer's long-term public key, Z85 ("?" before its Curve came). */
const char *rdzv_sec_peer(const struct rdzv_sec *s);

/* Seal env into one frame (length, then an envelope holding only
 * `sealed`): *ret_buf malloc'd. 0 or -ENOMEM. */
int rdzv_sec_encode(struct rdzv_sec *s, const Zerod__V1__RdzvEnvelope *env, uint8_t **ret_buf,
		    size_t *ret_len);
/* Open a sealed body: 0 and the message inside (free with rdzv_msg_free),
 * -EBADMSG if it fails to open (changed, replayed, reordered or cut; the
 * stream is useless after it), -EPROTO if what is inside is not a message. */
int rdzv_sec_open(struct rdzv_sec *s, const ProtobufCBinaryData *sealed,
		  Zerod__V1__RdzvEnvelope **ret);

/* Raw frames on a ready channel, for bulk data (coll/sealmesh.c): the same
 * two streams as the envelopes above without protobuf around them, or,
 * once both ends switched (rdzv_sec_use_aes), AES-256-GCM under two more
 * keys of the handshake, one per direction, each frame's nonce its number
 * in that direction. */
#define RDZV_SEC_ABYTES 17 /* the most sealing adds: secretstream's tag and MAC */
/* What sealing adds now: 17 (secretstream), or 16 (AES-256-GCM). */
size_t rdzv_sec_abytes(const struct rdzv_sec *s);
/* Seal in[0..n) into out[0..n + rdzv_sec_abytes(s)) (not overlapping).
 * 0, or -EINVAL before the channel is ready. */
int rdzv_sec_seal(struct rdzv_sec *s, uint8_t *out, const void *in, size_t n);
/* Open in[0..n) (n > rdzv_sec_abytes(s)) into out[0..n - abytes): 0, or
 * -EBADMSG if it fails to (changed, replayed, reordered, forged or cut;
 * the channel is useless after it). */
int rdzv_sec_unseal(struct rdzv_sec *s, void *out, const uint8_t *in, size_t n);
/* Whether this CPU runs libsodium's AES-256-GCM (AES-NI): several times
 * faster than secretstream where it does. */
bool rdzv_sec_aes_available(void);
/* Raw frames from now on in AES-256-GCM, both ways: both ends call it at
 * the same point of their streams, once they agreed (over sealed frames)
 * that both can. 0, or -ENOTSUP (not ready, or no AES-NI). */
int rdzv_sec_use_aes(struct rdzv_sec *s);

#endif
