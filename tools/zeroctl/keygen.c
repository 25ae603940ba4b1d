/*
 * keygen.c — `zeroctl keygen [PREFIX]`: a TLS identity for zerod's
 * connections between daemons (zerod --tls-key PREFIX.key --tls-cert
 * PREFIX.crt), made with OpenSSL's libcrypto. Writes PREFIX.key (an Ed25519
 * private key, PEM PKCS#8, unencrypted, mode 0600) and PREFIX.crt (its
 * self-signed X.509 v3 certificate, PEM, mode 0644; CN "zerod HOSTNAME",
 * valid from a day ago for 10 years), neither over an existing file, and
 * prints the certificate's fingerprint: SHA-256 over its DER encoding, 64
 * lowercase hex digits, the line the other nodes put in their --tls-peers
 * files. `zeroctl fingerprint CERT` prints the same of any PEM certificate.
 * Needs no zerod.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "keygen.h"

#define EXIT_FAILED 1
#define EXIT_USAGE  64

#define FP_LEN      32 /* SHA-256 */
#define VALID_YEARS 10
#define CN_MAX      64 /* ub-common-name (RFC 5280) */

/* why: what failed, then OpenSSL's reason for it. Returns -1. */
static int ossl_fail(char *why, size_t len, const char *what)
{
	unsigned long e = ERR_peek_last_error();
	const char *reason = e ? ERR_reason_error_string(e) : NULL;

	snprintf(why, len, "%s: %s", what, reason ? reason : "OpenSSL failed");
	ERR_clear_error();
	return -1;
}

/* The certificate's fingerprint into hex (65 bytes). Returns 0 or -1. */
static int fingerprint(X509 *x, char hex[2 * FP_LEN + 1])
{
	unsigned char md[EVP_MAX_MD_SIZE];
	unsigned int n = 0;

	if (X509_digest(x, EVP_sha256(), md, &n) != 1 || n != FP_LEN)
		return -1;
	for (unsigned int i = 0; i < n; i++)
		snprintf(hex + 2 * i, 3, "%02x", md[i]);
	return 0;
}

/* "zerod " and this host's name, cut to fit a CN (at a UTF-8 boundary). */
static void common_name(char cn[CN_MAX + 1])
{
	char host[HOST_NAME_MAX + 1] = "";
	size_t n;

	if (gethostname(host, sizeof(host)) < 0 || !host[0])
		snprintf(host, sizeof(host), "localhost");
	host[HOST_NAME_MAX] = '\0';
	n = strlen(host);
	if (n > CN_MAX - 6) {
		n = CN_MAX - 6;
		while (n > 0 && ((unsigned char)host[n] & 0xc0) == 0x80)
			n--;
	}
	snprintf(cn, CN_MAX + 1, "zerod %.*s", (int)n, host);
}

/* A random positive 128-bit serial number for x. Returns 0 or -1. */
static int set_serial(X509 *x)
{
	unsigned char r[16];
	BIGNUM *bn;
	int ok;

	if (RAND_bytes(r, sizeof(r)) != 1)
		return -1;
	bn = BN_bin2bn(r, sizeof(r), NULL);
	ok = bn && (!BN_is_zero(bn) || BN_set_word(bn, 1)) &&
	     BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(x));
	BN_free(bn);
	return ok ? 0 : -1;
}

/* From a day ago until VALID_YEARS years after that. Returns 0 or -1. */
static int set_validity(X509 *x)
{
	time_t from = time(NULL) - 24 * 60 * 60, until;
	struct tm tm;

	if (!gmtime_r(&from, &tm))
		return -1;
	tm.tm_year += VALID_YEARS;
	until = timegm(&tm);
	if (until == (time_t)-1 || !ASN1_TIME_set(X509_getm_notBefore(x), from) ||
	    !ASN1_TIME_set(X509_getm_notAfter(x), until))
		return -1;
	return 0;
}

/* The v3 extensions of a certificate for both ends of a connection. */
static int add_extensions(X509 *x)
{
	static const struct {
		int nid;
		const char *value;
	} ext[] = {
		{NID_basic_constraints, "critical,CA:FALSE"},
		{NID_key_usage, "critical,digitalSignature"},
		{NID_ext_key_usage, "serverAuth,clientAuth"},
		{NID_subject_key_identifier, "hash"},
	};
	X509V3_CTX ctx;

	X509V3_set_ctx_nodb(&ctx);
	X509V3_set_ctx(&ctx, x, x, NULL, NULL, 0);
	for (size_t i = 0; i < sizeof(ext) / sizeof(ext[0]); i++) {
		X509_EXTENSION *e = X509V3_EXT_conf_nid(NULL, &ctx, ext[i].nid, ext[i].value);
		int ok = e && X509_add_ext(x, e, -1);

		X509_EXTENSION_free(e);
		if (!ok)
			return -1;
	}
	return 0;
}

/* A self-signed certificate for key into *out. Returns 0, or -1 with why. */
static int make_cert(EVP_PKEY *key, X509 **out, char *why, size_t len)
{
	char cn[CN_MAX + 1];
	X509 *x = X509_new();
	X509_NAME *name;

	common_name(cn);
	if (!x || !X509_set_version(x, X509_VERSION_3)) {
		X509_free(x);
		return ossl_fail(why, len, "a new certificate");
	}
	if (set_serial(x) < 0) {
		X509_free(x);
		return ossl_fail(why, len, "a random serial number");
	}
	if (set_validity(x) < 0) {
		X509_free(x);
		return ossl_fail(why, len, "the validity period");
	}
	name = X509_get_subject_name(x);
	if (!X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8, (const unsigned char *)cn, -1,
					-1, 0) ||
	    !X509_set_issuer_name(x, name) || !X509_set_pubkey(x, key)) {
		X509_free(x);
		return ossl_fail(why, len, "subject and issuer");
	}
	if (add_extensions(x) < 0) {
		X509_free(x);
		return ossl_fail(why, len, "the extensions");
	}
	if (X509_sign(x, key, NULL) <= 0) {
		X509_free(x);
		return ossl_fail(why, len, "signing it");
	}
	*out = x;
	return 0;
}

/* The bytes in bio into a new file path, mode mode, synced to disk; never
 * over an existing file or through a symbolic link. Returns 0 or -errno
 * (no file left behind). */
static int write_new(const char *path, mode_t mode, BIO *bio)
{
	char *p;
	long n = BIO_get_mem_data(bio, &p);
	int fd, r = 0;

	if (n <= 0)
		return -EIO;
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
	if (fd < 0)
		return -errno;
	if (fchmod(fd, mode) < 0)
		r = -errno;
	while (!r && n > 0) {
		ssize_t w = write(fd, p, (size_t)n);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			r = w < 0 ? -errno : -EIO;
		else {
			p += w;
			n -= w;
		}
	}
	if (!r && fsync(fd) < 0)
		r = -errno;
	if (close(fd) < 0 && !r)
		r = -errno;
	if (r < 0)
		unlink(path);
	return r;
}

int zeroctl_keygen(const char *prefix, FILE *out, FILE *err)
{
	char path[4096], crtpath[4096], why[256], fp[2 * FP_LEN + 1];
	EVP_PKEY *key = NULL;
	X509 *x = NULL;
	BIO *kb = NULL, *cb = NULL;
	int r, code = EXIT_FAILED;

	if (strlen(prefix) + 5 >= sizeof(path) || !*prefix) {
		fprintf(err, "zeroctl: keygen: a prefix of 1..%zu characters\n", sizeof(path) - 6);
		return EXIT_USAGE;
	}
	snprintf(path, sizeof(path), "%s.key", prefix);
	snprintf(crtpath, sizeof(crtpath), "%s.crt", prefix);

	key = EVP_PKEY_Q_keygen(NULL, NULL, "ED25519");
	if (!key) {
		ossl_fail(why, sizeof(why), "an Ed25519 key");
		fprintf(err, "zeroctl: keygen: %s: %s\n", path, why);
		goto out;
	}
	if (make_cert(key, &x, why, sizeof(why)) < 0) {
		fprintf(err, "zeroctl: keygen: %s: %s\n", crtpath, why);
		goto out;
	}
	kb = BIO_new(BIO_s_secmem());
	cb = BIO_new(BIO_s_mem());
	if (!kb || !cb || !PEM_write_bio_PrivateKey(kb, key, NULL, NULL, 0, NULL, NULL)) {
		ossl_fail(why, sizeof(why), "PEM");
		fprintf(err, "zeroctl: keygen: %s: %s\n", path, why);
		goto out;
	}
	if (!PEM_write_bio_X509(cb, x) || fingerprint(x, fp) < 0) {
		ossl_fail(why, sizeof(why), "PEM and fingerprint");
		fprintf(err, "zeroctl: keygen: %s: %s\n", crtpath, why);
		goto out;
	}
	r = write_new(path, 0600, kb);
	if (r < 0) {
		fprintf(err, "zeroctl: keygen: %s: %s\n", path, strerror(-r));
		goto out;
	}
	r = write_new(crtpath, 0644, cb);
	if (r < 0) {
		fprintf(err, "zeroctl: keygen: %s: %s\n", crtpath, strerror(-r));
		unlink(path);
		goto out;
	}
	fprintf(out, "%s\n", fp);
	code = 0;
out:
	BIO_free(kb);
	BIO_free(cb);
	X509_free(x);
	EVP_PKEY_free(key);
	return code;
}

int zeroctl_fingerprint(const char *path, FILE *out, FILE *err)
{
	char why[256], fp[2 * FP_LEN + 1];
	FILE *f = fopen(path, "re");
	X509 *x;

	if (!f) {
		fprintf(err, "zeroctl: fingerprint: %s: %s\n", path, strerror(errno));
		return EXIT_FAILED;
	}
	x = PEM_read_X509(f, NULL, NULL, NULL);
	fclose(f);
	if (!x) {
		ossl_fail(why, sizeof(why), "not a PEM certificate");
		fprintf(err, "zeroctl: fingerprint: %s: %s\n", path, why);
		return EXIT_FAILED;
	}
	if (fingerprint(x, fp) < 0) {
		X509_free(x);
		ossl_fail(why, sizeof(why), "its SHA-256 digest");
		fprintf(err, "zeroctl: fingerprint: %s: %s\n", path, why);
		return EXIT_FAILED;
	}
	X509_free(x);
	fprintf(out, "%s\n", fp);
	return 0;
}
