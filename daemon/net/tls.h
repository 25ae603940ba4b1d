/*
 * tls.h — TLS 1.3 on every connection between daemons (OpenSSL 3): this
 * daemon's identity and the peers it trusts, the contexts connections are
 * made from, the job's secret as an external PSK where there are no keys,
 * and the few steps of a connection both the loop (rdzvnet.c) and the
 * blocking sides (the store client, the mesh) take.
 *
 * Identity. An Ed25519 key and its certificate (`zeroctl keygen`): zerod
 * --tls-key and --tls-cert. The peers it trusts: --tls-peers, a file of
 * SHA-256 fingerprints of their certificates (one a line, 64 hex digits,
 * colons allowed; '#' comments), and/or --tls-ca, a file of CA
 * certificates a peer's certificate may chain to. Its own certificate is
 * always trusted. Both ends of every connection present a certificate and
 * check the other's (mutual TLS); the certificates travel encrypted (TLS
 * 1.3), so an observer of the handshake learns no identity.
 *
 * Without keys, a job's connections are TLS 1.3 under an external PSK
 * derived from the job's secret (tls_psk_derive()): its identity is a hash
 * of the job id and the secret, so a ClientHello names neither, and a
 * server that has no matching job refuses every such peer the same way
 * (a handshake failure), whatever the reason.
 *
 * Identities are loaded once at start and never change: any thread may
 * read them. A context is shared; an SSL belongs to one thread at a time.
 * Nothing here logs: failures come back as a code and a reason.
 */
#ifndef ZEROD_NET_TLS_H
#define ZEROD_NET_TLS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <openssl/ssl.h>

#define TLS_FP_HEX       64 /* a SHA-256 fingerprint in hex */
#define TLS_PSK_ID_BYTES 32
#define TLS_PSK_BYTES    32
#define TLS_BIND_BYTES   32 /* what tls_bind() exports */
#define TLS_MAX_PEERS    4096

struct tls_ident;

/* Load the identity: key, cert and at least one of peers and ca, or none of
 * them (then *ret is NULL and 0 is returned: no keys). The key file must
 * not be readable by group or others, and must be the certificate's.
 * 0, or -EINVAL / -errno with "PATH[:LINE]: why" in err. */
int tls_ident_load(const char *key, const char *cert, const char *peers, const char *ca,
		   struct tls_ident **ret, char *err, size_t errlen);
/* Accepts NULL. */
void tls_ident_free(struct tls_ident *id);
/* This daemon's certificate's fingerprint (64 hex digits). */
const char *tls_ident_fingerprint(const struct tls_ident *id);
/* How many fingerprints it trusts beyond its own; whether a CA file. */
unsigned tls_ident_npeers(const struct tls_ident *id);
bool tls_ident_has_ca(const struct tls_ident *id);

/* A context for connections as server or client: TLS 1.3 only, mutual
 * authentication with id's certificate and trust (id non-NULL), or the
 * external PSK of tls_psk_client() / tls_psk_server() (id NULL; no
 * certificate is accepted then). ktls: SSL_OP_ENABLE_KTLS, where the
 * kernel has it the kernel encrypts. NULL when OpenSSL cannot (out of
 * memory), with why. Free with SSL_CTX_free(). */
SSL_CTX *tls_ctx_new(const struct tls_ident *id, bool server, bool ktls, char *why, size_t len);
/* An SSL on connected socket fd (non-blocking or not) from ctx, as the
 * side that accepted (server) or connected; NULL when out of memory. Free
 * with tls_free(). */
SSL *tls_new(SSL_CTX *ctx, int fd, bool server);
/* Sends close_notify where the connection still can (never waits), then
 * frees. Accepts NULL. */
void tls_free(SSL *ssl);

/* The PSK of job id with secret: its identity and key. */
void tls_psk_derive(const char *job, const void *secret, size_t secret_len,
		    uint8_t id[TLS_PSK_ID_BYTES], uint8_t key[TLS_PSK_BYTES]);
/* A client offers this PSK (copied). 0 or -ENOMEM. */
int tls_psk_client(SSL *ssl, const uint8_t id[TLS_PSK_ID_BYTES], const uint8_t key[TLS_PSK_BYTES]);
/* A server looks the PSK of an identity up: true and its key, or false
 * (no such job: the handshake fails). Called inside tls_step(). */
typedef bool tls_psk_find_fn(void *arg, const uint8_t id[TLS_PSK_ID_BYTES],
			     uint8_t key[TLS_PSK_BYTES]);
int tls_psk_server(SSL *ssl, tls_psk_find_fn *fn, void *arg);
/* The identity a server's handshake matched (false before, or none). */
bool tls_psk_matched(SSL *ssl, uint8_t id[TLS_PSK_ID_BYTES]);

/* What one non-blocking step came to. */
enum tls_io {
	TLS_IO_OK,    /* done (or some bytes moved) */
	TLS_IO_READ,  /* wait until the socket is readable, then again */
	TLS_IO_WRITE, /* ... writable */
	TLS_IO_EOF,   /* the peer closed: close_notify */
	TLS_IO_CUT,   /* the stream ended without close_notify: truncated */
	TLS_IO_ERROR, /* broken (a refused peer, a record that fails to open): why */
};
/* The handshake, one step. */
enum tls_io tls_handshake(SSL *ssl, char *why, size_t len);
/* At most n bytes; *done what moved (0 unless TLS_IO_OK). */
enum tls_io tls_read(SSL *ssl, void *buf, size_t n, size_t *done, char *why, size_t len);
enum tls_io tls_write(SSL *ssl, const void *buf, size_t n, size_t *done, char *why, size_t len);

/* Gather what ssl writes (its records) in a buffer of n bytes, so the
 * socket takes many records a write and the kernel's path runs once for
 * them, not once a record; nothing where the kernel encrypts. Whatever is
 * written then goes out only when the buffer fills or at tls_flush(), which
 * the writer calls once it has written what it had. 0 or -ENOMEM. */
int tls_gather_writes(SSL *ssl, size_t n);
/* The gathered bytes to the socket: OK (all out), WRITE (wait until it is
 * writable, then again), or ERROR with why and errno. */
enum tls_io tls_flush(SSL *ssl, char *why, size_t len);

/* Blocking forms on a non-blocking socket, within deadline (now_ms()):
 * 0, -ETIMEDOUT, -ECONNRESET (closed), -EPIPE (cut), -EBADMSG (broken),
 * with why where given. */
int tls_handshake_wait(SSL *ssl, int64_t deadline, char *why, size_t len);
int tls_write_all(SSL *ssl, const void *buf, size_t n, int64_t deadline);
int tls_read_all(SSL *ssl, void *buf, size_t n, int64_t deadline, char *why, size_t len);

/* The peer's certificate's fingerprint ("?" without one), into out. */
void tls_peer_fingerprint(SSL *ssl, char out[TLS_FP_HEX + 1]);
/* Whether the kernel encrypts what is sent / decrypts what comes. */
bool tls_ktls(SSL *ssl, bool send);
/* Keying material of this connection (RFC 8446's exporter) for label and
 * context: what binds a message to this one connection. 0 or -EIO. */
int tls_bind(SSL *ssl, const char *label, const void *ctx, size_t ctxlen,
	     uint8_t out[TLS_BIND_BYTES]);
/* HMAC-SHA256 of the n pieces (p[i], l[i]) under key; and a constant-time
 * comparison of 32 bytes. */
void tls_mac(uint8_t out[32], const void *key, size_t key_len, const void *const *p,
	     const size_t *l, size_t n);
bool tls_equal(const void *a, const void *b, size_t n);
void tls_random(void *buf, size_t n);
void tls_wipe(void *buf, size_t n);

#endif
