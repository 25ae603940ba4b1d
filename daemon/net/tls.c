/*
 * tls.c — TLS 1.3 between daemons on OpenSSL 3 (see tls.h). Everything
 * cryptographic is OpenSSL's: the handshake, the records, the exporter, the
 * HMAC, the random bytes. What is zerod's: where identities come from, how
 * a peer's certificate is trusted (a pinned fingerprint, or a chain to the
 * operator's CA), and how a job secret becomes a PSK.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/core_names.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>

#include "common.h"
#include "net/tls.h"

struct tls_ident {
	EVP_PKEY *key;
	X509 *cert;
	char fp[TLS_FP_HEX + 1];
	uint8_t self[32];
	uint8_t (*peers)[32];
	unsigned npeers;
	X509_STORE *ca; /* NULL: fingerprints only */
};

/* What one connection carries beside its SSL (its app data). */
struct tls_conn {
	bool has_psk, matched;
	uint8_t psk_id[TLS_PSK_ID_BYTES], psk_key[TLS_PSK_BYTES];
	tls_psk_find_fn *find;
	void *arg;
	bool untrusted;   /* the peer's certificate was refused: peer_fp says which */
	bool cert_on_psk; /* a PSK client was shown a certificate */
	char peer_fp[TLS_FP_HEX + 1];
};

/* The PSK's cipher suite, the only one a PSK context offers: a PSK is
 * bound to one hash, and a server that picked another suite would skip it. */
static const unsigned char psk_suite[2] = {0x13, 0x02};
static const char psk_suite_name[] = "TLS_AES_256_GCM_SHA384";

static void hex(const uint8_t *p, size_t n, char *out)
{
	static const char d[] = "0123456789abcdef";

	for (size_t i = 0; i < n; i++) {
		out[2 * i] = d[p[i] >> 4];
		out[2 * i + 1] = d[p[i] & 15];
	}
	out[2 * n] = '\0';
}

static bool cert_digest(X509 *x, uint8_t md[32])
{
	unsigned n = 0;

	return X509_digest(x, EVP_sha256(), md, &n) == 1 && n == 32;
}

/* ------------------------------------------------------- identity --- */

/* A file of CURVE's era: one Z85 key of 40 characters. */
static bool looks_z85(const char *line)
{
	size_t n = strcspn(line, "\r\n");

	if (n != 40)
		return false;
	for (size_t i = 0; i < n; i++)
		if (isspace((unsigned char)line[i]))
			return false;
	return true;
}

static const char curve_hint[] =
	"CURVE keys are no longer used between daemons: make a TLS identity with "
	"`zeroctl keygen PREFIX` (zerod --tls-key PREFIX.key --tls-cert PREFIX.crt) and list "
	"the other nodes' fingerprints in --tls-peers";

static bool file_is_curve(const char *path)
{
	char line[128];
	FILE *f = fopen(path, "re");
	bool z85 = false;

	if (!f)
		return false;
	while (fgets(line, sizeof(line), f))
		if (line[0] != '#' && line[0] != '\n') {
			z85 = looks_z85(line);
			break;
		}
	fclose(f);
	return z85;
}

static int load_key(struct tls_ident *id, const char *path, char *err, size_t len)
{
	FILE *f = fopen(path, "re");
	struct stat st;

	if (!f) {
		snprintf(err, len, "%s: %s", path, strerror(errno));
		return -errno;
	}
	if (fstat(fileno(f), &st) < 0 || !S_ISREG(st.st_mode)) {
		fclose(f);
		snprintf(err, len, "%s: not a regular file", path);
		return -EINVAL;
	}
	if (st.st_mode & 077) {
		fclose(f);
		snprintf(err, len, "%s: readable by group or others (chmod 600 %s)", path, path);
		return -EINVAL;
	}
	id->key = PEM_read_PrivateKey(f, NULL, NULL, NULL);
	fclose(f);
	ERR_clear_error();
	if (!id->key) {
		snprintf(err, len, "%s: %s", path,
			 file_is_curve(path) ? curve_hint : "not a PEM private key");
		return -EINVAL;
	}
	return 0;
}

static int load_cert(struct tls_ident *id, const char *path, char *err, size_t len)
{
	FILE *f = fopen(path, "re");

	if (!f) {
		snprintf(err, len, "%s: %s", path, strerror(errno));
		return -errno;
	}
	id->cert = PEM_read_X509(f, NULL, NULL, NULL);
	fclose(f);
	ERR_clear_error();
	if (!id->cert) {
		snprintf(err, len, "%s: %s", path,
			 file_is_curve(path) ? curve_hint : "not a PEM certificate");
		return -EINVAL;
	}
	if (X509_check_private_key(id->cert, id->key) != 1) {
		ERR_clear_error();
		snprintf(err, len, "%s: not the certificate of the key in --tls-key", path);
		return -EINVAL;
	}
	if (!cert_digest(id->cert, id->self)) {
		snprintf(err, len, "%s: cannot hash the certificate", path);
		return -EIO;
	}
	hex(id->self, 32, id->fp);
	return 0;
}

/* One line: 64 hex digits, colons between them allowed. */
static bool parse_fp(const char *s, uint8_t md[32])
{
	unsigned n = 0;

	for (; *s && *s != '\n' && *s != '\r'; s++) {
		int v;
		if (*s == ':' || *s == ' ' || *s == '\t')
			continue;
		if (!isxdigit((unsigned char)*s) || n >= 64)
			return false;
		v = isdigit((unsigned char)*s) ? *s - '0' : (tolower((unsigned char)*s) - 'a' + 10);
		if (n % 2 == 0)
			md[n / 2] = (uint8_t)(v << 4);
		else
			md[n / 2] |= (uint8_t)v;
		n++;
	}
	return n == 64;
}

static int load_peers(struct tls_ident *id, const char *path, char *err, size_t len)
{
	FILE *f = fopen(path, "re");
	char line[512];
	unsigned lineno = 0;

	if (!f) {
		snprintf(err, len, "%s: %s", path, strerror(errno));
		return -errno;
	}
	while (fgets(line, sizeof(line), f)) {
		const char *s = line;
		uint8_t md[32], (*p)[32];
		lineno++;
		while (*s == ' ' || *s == '\t')
			s++;
		if (*s == '#' || *s == '\n' || *s == '\r' || !*s)
			continue;
		if (!parse_fp(s, md)) {
			snprintf(err, len, "%s:%u: %s", path, lineno,
				 looks_z85(s)
					 ? "a CURVE public key: list the certificates' SHA-256 "
					   "fingerprints instead (`zeroctl fingerprint CERT`)"
					 : "not a SHA-256 fingerprint (64 hex digits, as "
					   "`zeroctl keygen` prints)");
			fclose(f);
			return -EINVAL;
		}
		if (id->npeers >= TLS_MAX_PEERS) {
			snprintf(err, len, "%s:%u: more than %u peers", path, lineno,
				 TLS_MAX_PEERS);
			fclose(f);
			return -EINVAL;
		}
		p = realloc(id->peers, (id->npeers + 1) * sizeof(*p));
		if (!p) {
			fclose(f);
			snprintf(err, len, "out of memory");
			return -ENOMEM;
		}
		id->peers = p;
		memcpy(id->peers[id->npeers++], md, 32);
	}
	fclose(f);
	return 0;
}

static int load_ca(struct tls_ident *id, const char *path, char *err, size_t len)
{
	id->ca = X509_STORE_new();
	if (!id->ca || X509_STORE_load_file(id->ca, path) != 1) {
		ERR_clear_error();
		snprintf(err, len, "%s: not a file of PEM CA certificates", path);
		return -EINVAL;
	}
	return 0;
}

int tls_ident_load(const char *key, const char *cert, const char *peers, const char *ca,
		   struct tls_ident **ret, char *err, size_t errlen)
{
	bool k = key && *key, c = cert && *cert, p = peers && *peers, a = ca && *ca;
	struct tls_ident *id;
	int r;

	*ret = NULL;
	if (!k && !c && !p && !a)
		return 0;
	if (!k || !c || (!p && !a)) {
		snprintf(err, errlen,
			 "TLS keys need --tls-key, --tls-cert and --tls-peers or --tls-ca; "
			 "missing: %s%s%s",
			 k ? "" : "--tls-key ", c ? "" : "--tls-cert ",
			 p || a ? "" : "--tls-peers/--tls-ca");
		return -EINVAL;
	}
	id = calloc(1, sizeof(*id));
	if (!id) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	r = load_key(id, key, err, errlen);
	if (r >= 0)
		r = load_cert(id, cert, err, errlen);
	if (r >= 0 && p)
		r = load_peers(id, peers, err, errlen);
	if (r >= 0 && a)
		r = load_ca(id, ca, err, errlen);
	if (r < 0) {
		tls_ident_free(id);
		return r;
	}
	*ret = id;
	return 0;
}

void tls_ident_free(struct tls_ident *id)
{
	if (!id)
		return;
	EVP_PKEY_free(id->key);
	X509_free(id->cert);
	X509_STORE_free(id->ca);
	free(id->peers);
	free(id);
}

const char *tls_ident_fingerprint(const struct tls_ident *id)
{
	return id->fp;
}

unsigned tls_ident_npeers(const struct tls_ident *id)
{
	return id->npeers;
}

bool tls_ident_has_ca(const struct tls_ident *id)
{
	return id->ca != NULL;
}

/* -------------------------------------------------------- contexts --- */

static bool pinned(const struct tls_ident *id, const uint8_t md[32])
{
	if (CRYPTO_memcmp(md, id->self, 32) == 0)
		return true;
	for (unsigned i = 0; i < id->npeers; i++)
		if (CRYPTO_memcmp(md, id->peers[i], 32) == 0)
			return true;
	return false;
}

/* The whole of a peer's certificate check: its fingerprint pinned, or its
 * chain up to the CA file. */
static int verify_peer(X509_STORE_CTX *x, void *arg)
{
	const struct tls_ident *id = arg;
	SSL *ssl = X509_STORE_CTX_get_ex_data(x, SSL_get_ex_data_X509_STORE_CTX_idx());
	struct tls_conn *d = ssl ? SSL_get_app_data(ssl) : NULL;
	X509 *leaf = X509_STORE_CTX_get0_cert(x);
	uint8_t md[32];

	if (!id || !leaf || !cert_digest(leaf, md)) {
		if (!id && d)
			d->cert_on_psk = true;
		X509_STORE_CTX_set_error(x, X509_V_ERR_CERT_REJECTED);
		return 0; /* PSK: no certificate is accepted */
	}
	if (pinned(id, md))
		return 1;
	if (id->ca && X509_verify_cert(x) == 1)
		return 1;
	if (d) {
		d->untrusted = true;
		hex(md, 32, d->peer_fp);
	}
	X509_STORE_CTX_set_error(x, X509_V_ERR_CERT_UNTRUSTED);
	return 0;
}

static int psk_use(SSL *ssl, const EVP_MD *md, const unsigned char **idp, size_t *idlen,
		   SSL_SESSION **sess)
{
	struct tls_conn *d = SSL_get_app_data(ssl);
	const SSL_CIPHER *c = SSL_CIPHER_find(ssl, psk_suite);
	SSL_SESSION *s;

	*sess = NULL;
	if (!d || !d->has_psk || !c || (md && md != SSL_CIPHER_get_handshake_digest(c)))
		return 1;
	s = SSL_SESSION_new();
	if (!s || SSL_SESSION_set1_master_key(s, d->psk_key, TLS_PSK_BYTES) != 1 ||
	    SSL_SESSION_set_cipher(s, c) != 1 ||
	    SSL_SESSION_set_protocol_version(s, TLS1_3_VERSION) != 1) {
		SSL_SESSION_free(s);
		return 0;
	}
	*sess = s;
	*idp = d->psk_id;
	*idlen = TLS_PSK_ID_BYTES;
	return 1;
}

static int psk_find(SSL *ssl, const unsigned char *idp, size_t idlen, SSL_SESSION **sess)
{
	struct tls_conn *d = SSL_get_app_data(ssl);
	const SSL_CIPHER *c = SSL_CIPHER_find(ssl, psk_suite);
	uint8_t key[TLS_PSK_BYTES];
	SSL_SESSION *s;
	int ok;

	*sess = NULL;
	if (!d || !d->find || idlen != TLS_PSK_ID_BYTES || !c || !d->find(d->arg, idp, key))
		return 1; /* no such PSK: the handshake fails, as for any other */
	s = SSL_SESSION_new();
	ok = s && SSL_SESSION_set1_master_key(s, key, TLS_PSK_BYTES) == 1 &&
	     SSL_SESSION_set_cipher(s, c) == 1 &&
	     SSL_SESSION_set_protocol_version(s, TLS1_3_VERSION) == 1;
	OPENSSL_cleanse(key, sizeof(key));
	if (!ok) {
		SSL_SESSION_free(s);
		return 0;
	}
	d->matched = true;
	memcpy(d->psk_id, idp, TLS_PSK_ID_BYTES);
	*sess = s;
	return 1;
}

SSL_CTX *tls_ctx_new(const struct tls_ident *id, bool server, bool ktls, char *why, size_t len)
{
	SSL_CTX *ctx = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
	bool ok = ctx != NULL;

	ok = ok && SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION) == 1;
	if (ok) {
		SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET | (ktls ? SSL_OP_ENABLE_KTLS : 0));
		SSL_CTX_set_num_tickets(ctx, 0);
		SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
		SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE |
					      SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
		/* with certificates both sides check the other's; with a PSK
		 * a client accepts none (a server asks for none) */
		SSL_CTX_set_verify(ctx,
				   id || !server ? SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT
						 : SSL_VERIFY_NONE,
				   NULL);
		SSL_CTX_set_cert_verify_callback(ctx, verify_peer, (void *)id);
	}
	if (ok && id)
		ok = SSL_CTX_use_certificate(ctx, id->cert) == 1 &&
		     SSL_CTX_use_PrivateKey(ctx, id->key) == 1;
	if (ok && id && id->ca)
		SSL_CTX_set1_cert_store(ctx, id->ca);
	if (ok && !id) {
		ok = SSL_CTX_set_ciphersuites(ctx, psk_suite_name) == 1;
		if (server)
			SSL_CTX_set_psk_find_session_callback(ctx, psk_find);
		else
			SSL_CTX_set_psk_use_session_callback(ctx, psk_use);
	}
	if (!ok) {
		snprintf(why, len, "OpenSSL: %s",
			 ERR_reason_error_string(ERR_peek_last_error()) ?: "out of memory");
		ERR_clear_error();
		SSL_CTX_free(ctx);
		return NULL;
	}
	return ctx;
}

SSL *tls_new(SSL_CTX *ctx, int fd, bool server)
{
	struct tls_conn *d = calloc(1, sizeof(*d));
	SSL *ssl = d ? SSL_new(ctx) : NULL;

	if (!ssl || SSL_set_fd(ssl, fd) != 1) {
		SSL_free(ssl);
		free(d);
		ERR_clear_error();
		return NULL;
	}
	SSL_set_app_data(ssl, d);
	if (server)
		SSL_set_accept_state(ssl);
	else
		SSL_set_connect_state(ssl);
	return ssl;
}

void tls_free(SSL *ssl)
{
	struct tls_conn *d;

	if (!ssl)
		return;
	d = SSL_get_app_data(ssl);
	if (SSL_is_init_finished(ssl) && !(SSL_get_shutdown(ssl) & SSL_SENT_SHUTDOWN))
		SSL_shutdown(ssl); /* close_notify, if the socket takes it now */
	ERR_clear_error();
	SSL_free(ssl);
	if (d) {
		OPENSSL_cleanse(d, sizeof(*d));
		free(d);
	}
}

/* ------------------------------------------------------------- PSK --- */

void tls_psk_derive(const char *job, const void *secret, size_t secret_len,
		    uint8_t id[TLS_PSK_ID_BYTES], uint8_t key[TLS_PSK_BYTES])
{
	static const char id_label[] = "zerod rendezvous PSK 1: identity";
	static const char key_label[] = "zerod rendezvous PSK 1: key";
	const void *p[2] = {id_label, job};
	size_t l[2] = {sizeof(id_label), strlen(job) + 1};

	tls_mac(id, secret, secret_len, p, l, 2);
	p[0] = key_label;
	l[0] = sizeof(key_label);
	tls_mac(key, secret, secret_len, p, l, 2);
}

int tls_psk_client(SSL *ssl, const uint8_t id[TLS_PSK_ID_BYTES], const uint8_t key[TLS_PSK_BYTES])
{
	struct tls_conn *d = SSL_get_app_data(ssl);

	if (!d)
		return -ENOMEM;
	memcpy(d->psk_id, id, TLS_PSK_ID_BYTES);
	memcpy(d->psk_key, key, TLS_PSK_BYTES);
	d->has_psk = true;
	return 0;
}

int tls_psk_server(SSL *ssl, tls_psk_find_fn *fn, void *arg)
{
	struct tls_conn *d = SSL_get_app_data(ssl);

	if (!d)
		return -ENOMEM;
	d->find = fn;
	d->arg = arg;
	return 0;
}

bool tls_psk_matched(SSL *ssl, uint8_t id[TLS_PSK_ID_BYTES])
{
	struct tls_conn *d = SSL_get_app_data(ssl);

	if (!d || !d->matched || !SSL_session_reused(ssl))
		return false;
	memcpy(id, d->psk_id, TLS_PSK_ID_BYTES);
	return true;
}

/* ------------------------------------------------------------ steps --- */

static enum tls_io outcome(SSL *ssl, int r, char *why, size_t len)
{
	struct tls_conn *d = SSL_get_app_data(ssl);
	int e = SSL_get_error(ssl, r);
	unsigned long err = ERR_peek_last_error();
	const char *reason;

	switch (e) {
	case SSL_ERROR_WANT_READ:
		return TLS_IO_READ;
	case SSL_ERROR_WANT_WRITE:
		return TLS_IO_WRITE;
	case SSL_ERROR_ZERO_RETURN:
		snprintf(why, len, "closed the connection");
		return TLS_IO_EOF;
	default:
		break;
	}
	ERR_clear_error();
	if (e == SSL_ERROR_SSL && ERR_GET_REASON(err) == SSL_R_UNEXPECTED_EOF_WHILE_READING) {
		snprintf(why, len,
			 "the connection ended without TLS close_notify (cut, or truncated)");
		return TLS_IO_CUT;
	}
	if (e == SSL_ERROR_SYSCALL) {
		snprintf(why, len, "%s", errno ? strerror(errno) : "the connection was cut");
		return errno ? TLS_IO_ERROR : TLS_IO_CUT;
	}
	if (d && d->cert_on_psk) {
		snprintf(why, len,
			 "the peer authenticates with a certificate: it has TLS keys (--tls-key), "
			 "and this zerod has none (both sides need them, or neither)");
		return TLS_IO_ERROR;
	}
	if (d && d->untrusted) {
		snprintf(why, len,
			 "its certificate (SHA-256 %s) is not among the peers this zerod trusts "
			 "(--tls-peers, --tls-ca)",
			 d->peer_fp);
		return TLS_IO_ERROR;
	}
	reason = ERR_reason_error_string(err);
	snprintf(why, len, "TLS: %s", reason ? reason : "handshake failed");
	return TLS_IO_ERROR;
}

enum tls_io tls_handshake(SSL *ssl, char *why, size_t len)
{
	int r;

	ERR_clear_error();
	r = SSL_do_handshake(ssl);
	return r == 1 ? TLS_IO_OK : outcome(ssl, r, why, len);
}

enum tls_io tls_read(SSL *ssl, void *buf, size_t n, size_t *done, char *why, size_t len)
{
	int r;

	*done = 0;
	ERR_clear_error();
	errno = 0;
	r = SSL_read_ex(ssl, buf, n, done);
	return r == 1 ? TLS_IO_OK : outcome(ssl, r, why, len);
}

enum tls_io tls_write(SSL *ssl, const void *buf, size_t n, size_t *done, char *why, size_t len)
{
	int r;

	*done = 0;
	ERR_clear_error();
	errno = 0;
	r = SSL_write_ex(ssl, buf, n, done);
	return r == 1 ? TLS_IO_OK : outcome(ssl, r, why, len);
}

static int wait_io(SSL *ssl, enum tls_io io, int64_t deadline)
{
	for (;;) {
		struct pollfd p = {.fd = SSL_get_fd(ssl),
				   .events = io == TLS_IO_WRITE ? POLLOUT : POLLIN};
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

static int io_code(enum tls_io io)
{
	switch (io) {
	case TLS_IO_EOF:
		return -ECONNRESET;
	case TLS_IO_CUT:
		return -EPIPE;
	default:
		return -EBADMSG;
	}
}

int tls_handshake_wait(SSL *ssl, int64_t deadline, char *why, size_t len)
{
	for (;;) {
		enum tls_io io = tls_handshake(ssl, why, len);
		int r;
		if (io == TLS_IO_OK)
			return 0;
		if (io != TLS_IO_READ && io != TLS_IO_WRITE)
			return io_code(io);
		r = wait_io(ssl, io, deadline);
		if (r < 0) {
			snprintf(why, len, "no TLS handshake in time");
			return r;
		}
	}
}

int tls_write_all(SSL *ssl, const void *buf, size_t n, int64_t deadline)
{
	const uint8_t *p = buf;
	char why[8];

	while (n) {
		size_t done;
		enum tls_io io = tls_write(ssl, p, n, &done, why, sizeof(why));
		int r;
		if (io == TLS_IO_OK) {
			p += done;
			n -= done;
			continue;
		}
		if (io != TLS_IO_READ && io != TLS_IO_WRITE)
			return io_code(io);
		r = wait_io(ssl, io, deadline);
		if (r < 0)
			return r;
	}
	return 0;
}

int tls_read_all(SSL *ssl, void *buf, size_t n, int64_t deadline, char *why, size_t len)
{
	uint8_t *p = buf;

	while (n) {
		size_t done;
		enum tls_io io = tls_read(ssl, p, n, &done, why, len);
		int r;
		if (io == TLS_IO_OK) {
			p += done;
			n -= done;
			continue;
		}
		if (io != TLS_IO_READ && io != TLS_IO_WRITE)
			return io_code(io);
		r = wait_io(ssl, io, deadline);
		if (r < 0)
			return r;
	}
	return 0;
}

/* ----------------------------------------------------------- misc --- */

void tls_peer_fingerprint(SSL *ssl, char out[TLS_FP_HEX + 1])
{
	X509 *x = SSL_get0_peer_certificate(ssl);
	uint8_t md[32];

	if (x && cert_digest(x, md))
		hex(md, 32, out);
	else
		snprintf(out, TLS_FP_HEX + 1, "?");
}

int tls_gather_writes(SSL *ssl, size_t n)
{
	BIO *sock = SSL_get_wbio(ssl), *buf;

	if (tls_ktls(ssl, true))
		return 0; /* the kernel takes the records from the socket's BIO */
	buf = BIO_new(BIO_f_buffer());
	if (!buf || BIO_set_write_buffer_size(buf, (long)n) != 1 || !BIO_up_ref(sock)) {
		BIO_free(buf);
		return -ENOMEM;
	}
	SSL_set0_wbio(ssl, BIO_push(buf, sock));
	return 0;
}

enum tls_io tls_flush(SSL *ssl, char *why, size_t len)
{
	BIO *b = SSL_get_wbio(ssl);

	errno = 0;
	if (BIO_flush(b) > 0)
		return TLS_IO_OK;
	if (BIO_should_retry(b))
		return TLS_IO_WRITE;
	snprintf(why, len, "%s", errno ? strerror(errno) : "the connection was cut");
	return TLS_IO_ERROR;
}

bool tls_ktls(SSL *ssl, bool send)
{
	return send ? BIO_get_ktls_send(SSL_get_wbio(ssl)) > 0
		    : BIO_get_ktls_recv(SSL_get_rbio(ssl)) > 0;
}

int tls_bind(SSL *ssl, const char *label, const void *ctx, size_t ctxlen,
	     uint8_t out[TLS_BIND_BYTES])
{
	if (SSL_export_keying_material(ssl, out, TLS_BIND_BYTES, label, strlen(label), ctx, ctxlen,
				       1) != 1) {
		ERR_clear_error();
		return -EIO;
	}
	return 0;
}

void tls_mac(uint8_t out[32], const void *key, size_t key_len, const void *const *p,
	     const size_t *l, size_t n)
{
	EVP_MAC *mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
	EVP_MAC_CTX *c = mac ? EVP_MAC_CTX_new(mac) : NULL;
	OSSL_PARAM params[] = {
		OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, (char *)"SHA256", 0),
		OSSL_PARAM_construct_end()};
	size_t outl = 0;
	bool ok = c && EVP_MAC_init(c, key, key_len, params) == 1;

	for (size_t i = 0; ok && i < n; i++)
		ok = EVP_MAC_update(c, p[i], l[i]) == 1;
	ok = ok && EVP_MAC_final(c, out, &outl, 32) == 1 && outl == 32;
	if (!ok)
		tls_random(out, 32); /* proves nothing: never equal to what a peer sends */
	EVP_MAC_CTX_free(c);
	EVP_MAC_free(mac);
	ERR_clear_error();
}

bool tls_equal(const void *a, const void *b, size_t n)
{
	return CRYPTO_memcmp(a, b, n) == 0;
}

void tls_random(void *buf, size_t n)
{
	if (RAND_bytes(buf, (int)n) != 1)
		abort(); /* no randomness: nothing here can be made safe */
}

void tls_wipe(void *buf, size_t n)
{
	OPENSSL_cleanse(buf, n);
}
