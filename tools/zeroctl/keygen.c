/*
 * keygen.c — `zeroctl keygen [PREFIX]`: a TLS identity for zerod's
 * connections between daemons (zerod --tls-key PREFIX.key --tls-cert
 * PREFIX.crt), made with OpenSSL: an Ed25519 key and a self-signed X.509
 * certificate for it. Writes PREFIX.key (PKCS#8 PEM, mode 0600) and
 * PREFIX.crt (PEM), never over an existing file, and prints the
 * certificate's SHA-256 fingerprint (64 hex digits), the line the other
 * nodes' --tls-peers file lists. `zeroctl fingerprint CERT` prints that
 * line for any certificate. Needs no zerod.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "keygen.h"

#define VALID_DAYS (10 * 366)

/* path, created exclusively with mode, holding key's PEM or cert's. */
static int write_new(const char *path, mode_t mode, EVP_PKEY *key, X509 *cert)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
	FILE *f;
	int ok, r = 0;

	if (fd < 0)
		return -errno;
	if (fchmod(fd, mode) < 0 || !(f = fdopen(fd, "w"))) {
		r = -errno;
		close(fd);
		unlink(path);
		return r;
	}
	ok = key ? PEM_write_PKCS8PrivateKey(f, key, NULL, NULL, 0, NULL, NULL)
		 : PEM_write_X509(f, cert);
	if (!ok || fflush(f) != 0 || fsync(fileno(f)) < 0)
		r = errno ? -errno : -EIO;
	if (fclose(f) != 0 && !r)
		r = -errno;
	if (r < 0)
		unlink(path);
	return r;
}

static bool add_ext(X509 *x, int nid, const char *value)
{
	X509V3_CTX ctx;
	X509_EXTENSION *e;
	bool ok;

	X509V3_set_ctx_nodb(&ctx);
	X509V3_set_ctx(&ctx, x, x, NULL, NULL, 0);
	e = X509V3_EXT_conf_nid(NULL, &ctx, nid, value);
	ok = e && X509_add_ext(x, e, -1) == 1;
	X509_EXTENSION_free(e);
	return ok;
}

/* A self-signed certificate of key, CN "zerod HOST"; NULL on failure. */
static X509 *self_signed(EVP_PKEY *key)
{
	X509 *x = X509_new();
	unsigned char serial[16];
	char host[256] = "?", cn[300];
	BIGNUM *bn = NULL;
	bool ok;

	gethostname(host, sizeof(host) - 1);
	snprintf(cn, sizeof(cn), "zerod %s", host);
	ok = x && RAND_bytes(serial, sizeof(serial)) == 1;
	serial[0] &= 0x7f; /* positive */
	ok = ok && (bn = BN_bin2bn(serial, sizeof(serial), NULL)) &&
	     BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(x)) && X509_set_version(x, 2) == 1 &&
	     X509_gmtime_adj(X509_getm_notBefore(x), -86400) &&
	     X509_time_adj_ex(X509_getm_notAfter(x), VALID_DAYS, 0, NULL) &&
	     X509_NAME_add_entry_by_txt(X509_get_subject_name(x), "CN", MBSTRING_UTF8,
					(const unsigned char *)cn, -1, -1, 0) == 1 &&
	     X509_set_issuer_name(x, X509_get_subject_name(x)) == 1 &&
	     X509_set_pubkey(x, key) == 1 &&
	     add_ext(x, NID_basic_constraints, "critical,CA:FALSE") &&
	     add_ext(x, NID_key_usage, "critical,digitalSignature") &&
	     add_ext(x, NID_ext_key_usage, "serverAuth,clientAuth") &&
	     add_ext(x, NID_subject_key_identifier, "hash") && X509_sign(x, key, NULL) > 0;
	BN_free(bn);
	if (!ok) {
		X509_free(x);
		return NULL;
	}
	return x;
}

static bool print_fingerprint(X509 *x, FILE *out)
{
	unsigned char md[EVP_MAX_MD_SIZE];
	unsigned n = 0;

	if (X509_digest(x, EVP_sha256(), md, &n) != 1 || n != 32)
		return false;
	for (unsigned i = 0; i < n; i++)
		fprintf(out, "%02x", md[i]);
	fprintf(out, "\n");
	return true;
}

int zeroctl_keygen(const char *prefix, FILE *out, FILE *err)
{
	char path[4096], crtpath[4096];
	EVP_PKEY *key = NULL;
	X509 *x = NULL;
	int r, code = 1;

	if (!*prefix || strlen(prefix) + 5 >= sizeof(path)) {
		fprintf(err, "zeroctl: keygen: a prefix of 1..%zu characters\n", sizeof(path) - 6);
		return 64;
	}
	snprintf(path, sizeof(path), "%s.key", prefix);
	snprintf(crtpath, sizeof(crtpath), "%s.crt", prefix);
	key = EVP_PKEY_Q_keygen(NULL, NULL, "ED25519");
	x = key ? self_signed(key) : NULL;
	if (!x) {
		fprintf(err, "zeroctl: keygen: OpenSSL: %s\n",
			ERR_reason_error_string(ERR_get_error()) ?: "cannot make the key");
		goto out;
	}
	r = write_new(path, 0600, key, NULL);
	if (r < 0) {
		fprintf(err, "zeroctl: keygen: %s: %s\n", path, strerror(-r));
		goto out;
	}
	r = write_new(crtpath, 0644, NULL, x);
	if (r < 0) {
		fprintf(err, "zeroctl: keygen: %s: %s\n", crtpath, strerror(-r));
		unlink(path);
		goto out;
	}
	code = print_fingerprint(x, out) ? 0 : 1;
out:
	X509_free(x);
	EVP_PKEY_free(key);
	return code;
}

int zeroctl_fingerprint(const char *cert, FILE *out, FILE *err)
{
	FILE *f = fopen(cert, "re");
	X509 *x = f ? PEM_read_X509(f, NULL, NULL, NULL) : NULL;
	int code = 0;

	if (!f) {
		fprintf(err, "zeroctl: fingerprint: %s: %s\n", cert, strerror(errno));
		return 1;
	}
	fclose(f);
	if (!x || !print_fingerprint(x, out)) {
		fprintf(err, "zeroctl: fingerprint: %s: not a PEM certificate\n", cert);
		code = 1;
	}
	X509_free(x);
	return code;
}
