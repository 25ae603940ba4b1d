/* testkeys.c — see testkeys.h. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "testkeys.h"

static int write_pem(const char *path, mode_t mode, EVP_PKEY *key, X509 *cert)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
	FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
	int ok;

	if (!f) {
		if (fd >= 0)
			close(fd);
		return -errno;
	}
	ok = key ? PEM_write_PrivateKey(f, key, NULL, NULL, 0, NULL, NULL)
		 : PEM_write_X509(f, cert);
	return fclose(f) == 0 && ok ? 0 : -EIO;
}

int testkeys_make(const char *dir, const char *name, char fp[TLS_FP_HEX + 1])
{
	EVP_PKEY *key = EVP_PKEY_Q_keygen(NULL, NULL, "ED25519");
	X509 *x = X509_new();
	X509_NAME *n = X509_get_subject_name(x);
	unsigned char md[32];
	unsigned mdlen = 0;
	char path[512];
	int r = -EIO;

	if (!key || !x)
		goto out;
	ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
	X509_gmtime_adj(X509_getm_notBefore(x), -3600);
	X509_gmtime_adj(X509_getm_notAfter(x), 86400L * 30);
	X509_NAME_add_entry_by_txt(n, "CN", MBSTRING_ASC, (const unsigned char *)name, -1, -1, 0);
	X509_set_issuer_name(x, n);
	if (X509_set_version(x, 2) != 1 || X509_set_pubkey(x, key) != 1 ||
	    X509_sign(x, key, NULL) <= 0 || X509_digest(x, EVP_sha256(), md, &mdlen) != 1)
		goto out;
	for (unsigned i = 0; i < mdlen; i++)
		sprintf(fp + 2 * i, "%02x", md[i]);
	snprintf(path, sizeof(path), "%s/%s.key", dir, name);
	r = write_pem(path, 0600, key, NULL);
	if (r == 0) {
		snprintf(path, sizeof(path), "%s/%s.crt", dir, name);
		r = write_pem(path, 0644, NULL, x);
	}
out:
	X509_free(x);
	EVP_PKEY_free(key);
	return r;
}

int testkeys_peers(const char *dir, const char *name, const char *const *trust, int n)
{
	char path[512];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s.peers", dir, name);
	f = fopen(path, "we");
	if (!f)
		return -errno;
	for (int i = 0; i < n; i++)
		fprintf(f, "%s\n", trust[i]);
	return fclose(f) == 0 ? 0 : -EIO;
}

struct tls_ident *testkeys_load(const char *dir, const char *name, const char *const *trust, int n)
{
	char key[512], cert[512], peers[512], err[256] = "";
	struct tls_ident *id = NULL;

	snprintf(key, sizeof(key), "%s/%s.key", dir, name);
	snprintf(cert, sizeof(cert), "%s/%s.crt", dir, name);
	snprintf(peers, sizeof(peers), "%s/%s.peers", dir, name);
	if (testkeys_peers(dir, name, trust, n) < 0)
		return NULL;
	if (tls_ident_load(key, cert, peers, NULL, &id, err, sizeof(err)) < 0) {
		printf("# keys %s: %s\n", name, err);
		return NULL;
	}
	return id;
}
