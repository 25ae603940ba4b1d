/*
 * test_tls.c — TLS 1.3 between daemons (daemon/net/tls.c), against real
 * OpenSSL: identity files loaded, or refused with a reason naming the file
 * (and line), the CURVE files of earlier versions with how to make the new
 * ones; two ends joined through a relay this test drives byte by byte
 * (socketpairs), with certificates (pinned each way, or chained to a CA)
 * and with a job's PSK; a refusal that says nothing about which job a
 * server serves; a record changed on the way, a stream cut without
 * close_notify and one closed with it, each told apart; the exporter
 * binding one connection only; the HMAC against RFC 4231.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "common.h"
#include "multinode/testkeys.h"
#include "net/tls.h"
#include "testlib.h"

static char dir[64];
static char fp_a[TLS_FP_HEX + 1], fp_b[TLS_FP_HEX + 1];

static const char *path(const char *name)
{
	static char paths[16][128];
	static int n;
	char *p = paths[n++ % 16];

	snprintf(p, 128, "%s/%s", dir, name);
	return p;
}

static const char *put(const char *name, mode_t mode, const char *text)
{
	const char *p = path(name);
	FILE *f;

	unlink(p);
	f = fopen(p, "w");
	if (!f)
		abort();
	fputs(text, f);
	fclose(f);
	chmod(p, mode);
	return p;
}

static void setup(void)
{
	signal(SIGPIPE, SIG_IGN); /* OpenSSL writes with write(), as zerod has it */
	snprintf(dir, sizeof(dir), "/tmp/zerod-tls-XXXXXX");
	REQUIRE(mkdtemp(dir), "mkdtemp");
	REQUIRE(testkeys_make(dir, "a", fp_a) == 0, "identity a");
	REQUIRE(testkeys_make(dir, "b", fp_b) == 0, "identity b");
}

static void cleanup(void)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	(void)!system(cmd);
}

static struct tls_ident *ident(const char *name, const char *peers_text)
{
	char key[16], crt[16], err[256] = "";
	struct tls_ident *id = NULL;

	snprintf(key, sizeof(key), "%s.key", name);
	snprintf(crt, sizeof(crt), "%s.crt", name);
	if (tls_ident_load(path(key), path(crt), put("p", 0644, peers_text), NULL, &id, err,
			   sizeof(err)) < 0)
		test_note("%s: %s", name, err);
	return id;
}

/* ------------------------------------------------------ identities --- */

static int load(const char *key, const char *cert, const char *peers, char *err, size_t len)
{
	struct tls_ident *id = NULL;
	int r = tls_ident_load(key, cert, peers, NULL, &id, err, len);

	tls_ident_free(id);
	return r;
}

static void t_identity_files(void)
{
	char err[400], line[200];
	struct tls_ident *id = NULL;
	const char *key = path("a.key"), *crt = path("a.crt"), *crt_b = path("b.crt");
	const char *peers = put("peers", 0644, "# node b\n");

	snprintf(line, sizeof(line), "# b\n%s\n", fp_b);
	peers = put("peers", 0644, line);
	CHECK(tls_ident_load(key, crt, peers, NULL, &id, err, sizeof(err)) == 0 && id,
	      "a good identity loads: %s", err);
	if (id) {
		CHECK(strcmp(tls_ident_fingerprint(id), fp_a) == 0 && tls_ident_npeers(id) == 1 &&
			      !tls_ident_has_ca(id),
		      "its fingerprint %s is the certificate's SHA-256 %s, one peer",
		      tls_ident_fingerprint(id), fp_a);
		tls_ident_free(id);
	}
	id = (struct tls_ident *)1;
	CHECK(tls_ident_load("", "", "", "", &id, err, sizeof(err)) == 0 && !id,
	      "no files: no identity, no error");

	chmod(key, 0644);
	CHECK(load(key, crt, peers, err, sizeof(err)) == -EINVAL && strstr(err, key) &&
		      strstr(err, "chmod 600"),
	      "a key readable by others: %s", err);
	chmod(key, 0600);
	CHECK(load(key, crt_b, peers, err, sizeof(err)) == -EINVAL && strstr(err, crt_b) &&
		      strstr(err, "not the certificate of the key"),
	      "another key's certificate: %s", err);
	CHECK(load(key, crt, put("bad", 0644, "# ok\nabc\n"), err, sizeof(err)) == -EINVAL &&
		      strstr(err, "bad:2: not a SHA-256 fingerprint"),
	      "a bad peers line, named: %s", err);
	CHECK(load(key, crt, put("cv", 0644, "Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID\n"), err,
		   sizeof(err)) == -EINVAL &&
		      strstr(err, "cv:1: a CURVE public key") && strstr(err, "zeroctl fingerprint"),
	      "a CURVE public key in the peers file: %s", err);
	CHECK(load(put("z.key", 0600,
		       "# zerod CURVE secret key\nJTKVSB%%)wK0E.X)V>+}o?pNmC{O&4W4b!Ni{Lh6\n"),
		   crt, peers, err, sizeof(err)) == -EINVAL &&
		      strstr(err, "CURVE keys are no longer used") && strstr(err, "zeroctl keygen"),
	      "a CURVE key file as the key: %s", err);
	CHECK(load(key, "", peers, err, sizeof(err)) == -EINVAL && strstr(err, "--tls-cert"),
	      "a key without its certificate: %s", err);
	CHECK(load(key, crt, "", err, sizeof(err)) == -EINVAL && strstr(err, "--tls-peers"),
	      "no peers and no CA: %s", err);
	snprintf(line, sizeof(line), "%.2s:%s\n", fp_b, fp_b + 2);
	CHECK(load(key, crt, put("colon", 0644, line), err, sizeof(err)) == 0,
	      "a fingerprint with a colon: %s", err);
}

/* ------------------------------------------------ the two ends --- */

/* a <-> relay <-> b over two socketpairs; the relay copies what each side
 * wrote, and can flip one byte of what a sends after `after` bytes. */
struct link {
	int a, ra, b, rb; /* a's end, the relay's end toward a, likewise b */
	SSL *sa, *sb;
	long flip_after; /* < 0: none */
	long from_a;
};

static void nonblock(int fd)
{
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

static void link_open(struct link *l, SSL_CTX *ca, SSL_CTX *cb)
{
	int p[2], q[2];

	REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, p) == 0 &&
			socketpair(AF_UNIX, SOCK_STREAM, 0, q) == 0,
		"socketpair");
	*l = (struct link){.a = p[0], .ra = p[1], .b = q[0], .rb = q[1], .flip_after = -1};
	nonblock(l->a);
	nonblock(l->ra);
	nonblock(l->b);
	nonblock(l->rb);
	l->sa = tls_new(ca, l->a, false);
	l->sb = tls_new(cb, l->b, true);
	REQUIRE(l->sa && l->sb, "tls_new");
}

static void relay(struct link *l)
{
	uint8_t buf[65536];
	ssize_t n;

	while ((n = read(l->ra, buf, sizeof(buf))) > 0) {
		if (l->flip_after >= 0 && l->from_a <= l->flip_after &&
		    l->from_a + n > l->flip_after) {
			buf[l->flip_after - l->from_a] ^= 0x20;
			l->flip_after = -1;
		}
		l->from_a += n;
		(void)!write(l->rb, buf, (size_t)n);
	}
	while ((n = read(l->rb, buf, sizeof(buf))) > 0)
		(void)!write(l->ra, buf, (size_t)n);
}

/* Both handshakes to their end; each one's outcome and why. */
static void handshake(struct link *l, enum tls_io *ra, enum tls_io *rb, char *wa, char *wb)
{
	bool da = false, db = false;

	wa[0] = wb[0] = '\0';
	*ra = *rb = TLS_IO_READ;
	for (int i = 0; i < 50 && (!da || !db); i++) {
		if (!da) {
			*ra = tls_handshake(l->sa, wa, 300);
			da = *ra != TLS_IO_READ && *ra != TLS_IO_WRITE;
		}
		relay(l);
		if (!db) {
			*rb = tls_handshake(l->sb, wb, 300);
			db = *rb != TLS_IO_READ && *rb != TLS_IO_WRITE;
		}
		relay(l);
	}
}

static void link_close(struct link *l)
{
	tls_free(l->sa);
	tls_free(l->sb);
	close(l->a);
	close(l->ra);
	close(l->b);
	close(l->rb);
}

/* b reads what there is after the relay moved it. */
static enum tls_io read_b(struct link *l, char *buf, size_t n, size_t *got, char *why)
{
	enum tls_io io = TLS_IO_READ;

	for (int i = 0; i < 10 && io == TLS_IO_READ; i++) {
		relay(l);
		io = tls_read(l->sb, buf, n, got, why, 300);
	}
	return io;
}

static void t_certificates(void)
{
	char wa[300], wb[300], fp[TLS_FP_HEX + 1];
	struct tls_ident *a = ident("a", fp_b), *b = ident("b", fp_a), *b_alone = ident("b", "");
	SSL_CTX *ca = tls_ctx_new(a, false, false, wa, sizeof(wa));
	SSL_CTX *cb = tls_ctx_new(b, true, false, wb, sizeof(wb));
	SSL_CTX *cb_alone = tls_ctx_new(b_alone, true, false, wb, sizeof(wb));
	SSL_CTX *cb_client = tls_ctx_new(b_alone, false, false, wb, sizeof(wb));
	SSL_CTX *ca_server = tls_ctx_new(a, true, false, wb, sizeof(wb));
	enum tls_io ra, rb;
	struct link l;

	REQUIRE(a && b && b_alone && ca && cb && cb_alone && cb_client && ca_server, "contexts");
	link_open(&l, ca, cb);
	handshake(&l, &ra, &rb, wa, wb);
	CHECK(ra == TLS_IO_OK && rb == TLS_IO_OK, "pinned both ways: %s | %s", wa, wb);
	tls_peer_fingerprint(l.sa, fp);
	CHECK(strcmp(fp, fp_b) == 0, "a sees b's certificate: %s", fp);
	tls_peer_fingerprint(l.sb, fp);
	CHECK(strcmp(fp, fp_a) == 0, "b sees a's certificate: %s", fp);
	link_close(&l);

	/* a server that does not trust the client: its why names the client */
	link_open(&l, ca, cb_alone);
	handshake(&l, &ra, &rb, wa, wb);
	CHECK(rb == TLS_IO_ERROR && strstr(wb, fp_a) && strstr(wb, "not among the peers"),
	      "the server refuses a, naming it: %s", wb);
	/* TLS 1.3: the client's handshake may end before the server has seen
	 * its certificate; the server's alert fails it at the next read */
	if (ra == TLS_IO_OK) {
		char buf[16];
		size_t n;
		for (int i = 0; i < 10 && ra == TLS_IO_OK; i++) {
			relay(&l);
			ra = tls_read(l.sa, buf, sizeof(buf), &n, wa, sizeof(wa));
			if (ra == TLS_IO_READ)
				ra = TLS_IO_OK;
		}
	}
	CHECK(ra == TLS_IO_ERROR, "the refused client fails too: %s", wa);
	link_close(&l);

	/* a client that does not trust the server */
	link_open(&l, cb_client, ca_server);
	handshake(&l, &ra, &rb, wa, wb);
	CHECK(ra == TLS_IO_ERROR && strstr(wa, fp_a) && strstr(wa, "not among the peers"),
	      "b as client refuses server a, naming it: %s", wa);
	CHECK(rb != TLS_IO_OK, "the server's handshake fails too: %s", wb);
	link_close(&l);

	SSL_CTX_free(ca);
	SSL_CTX_free(cb);
	SSL_CTX_free(cb_alone);
	SSL_CTX_free(cb_client);
	SSL_CTX_free(ca_server);
	tls_ident_free(a);
	tls_ident_free(b);
	tls_ident_free(b_alone);
}

/* A CA (DIR/ca.crt) and a key DIR/c.key whose certificate DIR/c.crt it
 * signed: c is trusted through --tls-ca, not pinned. */
static void make_ca(void)
{
	EVP_PKEY *cak = EVP_PKEY_Q_keygen(NULL, NULL, "ED25519");
	EVP_PKEY *k = EVP_PKEY_Q_keygen(NULL, NULL, "ED25519");
	X509 *ca = X509_new(), *x = X509_new();
	FILE *f;

	REQUIRE(cak && k && ca && x, "keys");
	for (int i = 0; i < 2; i++) {
		X509 *c = i ? x : ca;
		ASN1_INTEGER_set(X509_get_serialNumber(c), i + 10);
		X509_set_version(c, 2);
		X509_gmtime_adj(X509_getm_notBefore(c), -3600);
		X509_gmtime_adj(X509_getm_notAfter(c), 86400);
		X509_NAME_add_entry_by_txt(X509_get_subject_name(c), "CN", MBSTRING_ASC,
					   (const unsigned char *)(i ? "leaf" : "test CA"), -1, -1,
					   0);
		X509_set_issuer_name(c, X509_get_subject_name(ca));
		X509_set_pubkey(c, i ? k : cak);
	}
	{
		X509V3_CTX v;
		X509_EXTENSION *e;
		X509V3_set_ctx_nodb(&v);
		X509V3_set_ctx(&v, ca, ca, NULL, NULL, 0);
		e = X509V3_EXT_conf_nid(NULL, &v, NID_basic_constraints, "critical,CA:TRUE");
		X509_add_ext(ca, e, -1);
		X509_EXTENSION_free(e);
	}
	REQUIRE(X509_sign(ca, cak, NULL) > 0 && X509_sign(x, cak, NULL) > 0, "sign");
	f = fopen(path("ca.crt"), "w");
	REQUIRE(f && PEM_write_X509(f, ca), "ca.crt");
	fclose(f);
	f = fopen(path("c.crt"), "w");
	REQUIRE(f && PEM_write_X509(f, x), "c.crt");
	fclose(f);
	f = fopen(path("c.key"), "w");
	REQUIRE(f && PEM_write_PrivateKey(f, k, NULL, NULL, 0, NULL, NULL), "c.key");
	fclose(f);
	chmod(path("c.key"), 0600);
	X509_free(ca);
	X509_free(x);
	EVP_PKEY_free(cak);
	EVP_PKEY_free(k);
}

static void t_ca(void)
{
	char err[300] = "", wa[300], wb[300];
	struct tls_ident *c = NULL, *b = NULL;
	SSL_CTX *cc, *cb;
	enum tls_io ra, rb;
	struct link l;

	make_ca();
	/* b trusts no fingerprint but the CA; c trusts b's fingerprint */
	CHECK(tls_ident_load(path("b.key"), path("b.crt"), "", path("ca.crt"), &b, err,
			     sizeof(err)) == 0 &&
		      b && tls_ident_has_ca(b) && tls_ident_npeers(b) == 0,
	      "an identity with only a CA file: %s", err);
	CHECK(tls_ident_load(path("c.key"), path("c.crt"), put("cp", 0644, fp_b), NULL, &c, err,
			     sizeof(err)) == 0 &&
		      c,
	      "the CA-signed identity: %s", err);
	REQUIRE(b && c, "identities");
	cc = tls_ctx_new(c, false, false, wa, sizeof(wa));
	cb = tls_ctx_new(b, true, false, wb, sizeof(wb));
	REQUIRE(cc && cb, "contexts");
	link_open(&l, cc, cb);
	handshake(&l, &ra, &rb, wa, wb);
	CHECK(ra == TLS_IO_OK && rb == TLS_IO_OK,
	      "a certificate that chains to --tls-ca is trusted unpinned: %s | %s", wa, wb);
	link_close(&l);
	SSL_CTX_free(cc);
	SSL_CTX_free(cb);
	tls_ident_free(c);
	tls_ident_free(b);
	CHECK(tls_ident_load(path("b.key"), path("b.crt"), "", put("notca", 0644, "x\n"), &b, err,
			     sizeof(err)) == -EINVAL &&
		      strstr(err, "notca"),
	      "a CA file that holds no certificate: %s", err);
}

/* ------------------------------------------------------------ PSK --- */

struct served {
	uint8_t id[TLS_PSK_ID_BYTES], key[TLS_PSK_BYTES];
	int asked, refused;
};

static bool find(void *arg, const uint8_t id[TLS_PSK_ID_BYTES], uint8_t key[TLS_PSK_BYTES])
{
	struct served *s = arg;

	s->asked++;
	if (!tls_equal(id, s->id, TLS_PSK_ID_BYTES)) {
		s->refused++;
		return false;
	}
	memcpy(key, s->key, TLS_PSK_BYTES);
	return true;
}

/* A PSK client of (job, secret) against a server serving `sv`. */
static void psk_try(SSL_CTX *cc, SSL_CTX *sc, struct served *sv, const char *job,
		    const char *secret, enum tls_io *ra, enum tls_io *rb, char *wa, char *wb,
		    struct link *l)
{
	uint8_t id[TLS_PSK_ID_BYTES], key[TLS_PSK_BYTES];

	tls_psk_derive(job, secret, strlen(secret), id, key);
	link_open(l, cc, sc);
	REQUIRE(tls_psk_client(l->sa, id, key) == 0 && tls_psk_server(l->sb, find, sv) == 0,
		"PSK callbacks");
	handshake(l, ra, rb, wa, wb);
}

static void t_psk(void)
{
	char wa[300], wb[300], w1[300], w2[300];
	uint8_t id1[TLS_PSK_ID_BYTES], k1[TLS_PSK_BYTES], id2[TLS_PSK_ID_BYTES], k2[TLS_PSK_BYTES];
	uint8_t got[TLS_PSK_ID_BYTES];
	struct tls_ident *b = ident("b", fp_a);
	SSL_CTX *cc = tls_ctx_new(NULL, false, false, wa, sizeof(wa));
	SSL_CTX *sc = tls_ctx_new(NULL, true, false, wb, sizeof(wb));
	SSL_CTX *cert_server = tls_ctx_new(b, true, false, wb, sizeof(wb));
	struct served sv = {0};
	enum tls_io ra, rb, r1, r2;
	struct link l;

	REQUIRE(b && cc && sc && cert_server, "contexts");
	tls_psk_derive("job", "s3cret", 6, id1, k1);
	tls_psk_derive("job", "s3cret", 6, id2, k2);
	CHECK(memcmp(id1, id2, 32) == 0 && memcmp(k1, k2, 32) == 0, "derivation is stable");
	tls_psk_derive("job", "other", 5, id2, k2);
	CHECK(memcmp(id1, id2, 32) != 0 && memcmp(k1, k2, 32) != 0, "another secret, another PSK");
	tls_psk_derive("jo", "bs3cret", 7, id2, k2);
	CHECK(memcmp(id1, id2, 32) != 0, "the job id and the secret do not run together");
	CHECK(memmem(id1, 32, "job", 3) == NULL, "the identity does not carry the job id");

	memcpy(sv.id, id1, 32);
	memcpy(sv.key, k1, 32);
	psk_try(cc, sc, &sv, "job", "s3cret", &ra, &rb, wa, wb, &l);
	CHECK(ra == TLS_IO_OK && rb == TLS_IO_OK, "the job's PSK: %s | %s", wa, wb);
	CHECK(tls_psk_matched(l.sb, got) && memcmp(got, id1, 32) == 0,
	      "the server knows which PSK matched");
	link_close(&l);

	/* a wrong secret and a job not served: the same refusal */
	psk_try(cc, sc, &sv, "job", "wrong", &r1, &rb, w1, wb, &l);
	CHECK(rb == TLS_IO_ERROR && sv.refused == 1 && !tls_psk_matched(l.sb, got),
	      "a wrong secret: the server finds no PSK and fails (%d: %s)", rb, wb);
	link_close(&l);
	psk_try(cc, sc, &sv, "nosuchjob", "s3cret", &r2, &rb, w2, wb, &l);
	CHECK(rb == TLS_IO_ERROR && sv.refused == 2, "a job not served: the server fails (%d: %s)",
	      rb, wb);
	link_close(&l);
	CHECK(r1 == TLS_IO_ERROR && r1 == r2 && strcmp(w1, w2) == 0,
	      "a wrong secret and an unknown job look the same to the client: '%s' / '%s'", w1, w2);
	CHECK(sv.asked >= 3, "the server looked each PSK up (%d)", sv.asked);

	/* a PSK client never takes a certificate instead */
	psk_try(cc, cert_server, &sv, "job", "s3cret", &ra, &rb, wa, wb, &l);
	CHECK(ra == TLS_IO_ERROR && strstr(wa, "authenticates with a certificate"),
	      "a certificate shown to a PSK client is refused: %s", wa);
	link_close(&l);

	SSL_CTX_free(cc);
	SSL_CTX_free(sc);
	SSL_CTX_free(cert_server);
	tls_ident_free(b);
}

/* -------------------------------------------------------- records --- */

static void t_records(void)
{
	char wa[300], wb[300], buf[64];
	uint8_t x1[TLS_BIND_BYTES], x2[TLS_BIND_BYTES], y1[TLS_BIND_BYTES];
	struct tls_ident *a = ident("a", fp_b), *b = ident("b", fp_a);
	SSL_CTX *ca = tls_ctx_new(a, false, false, wa, sizeof(wa));
	SSL_CTX *cb = tls_ctx_new(b, true, false, wb, sizeof(wb));
	enum tls_io ra, rb, io;
	struct link l, m;
	size_t n;

	REQUIRE(a && b && ca && cb, "contexts");
	/* data, then close_notify: an end */
	link_open(&l, ca, cb);
	handshake(&l, &ra, &rb, wa, wb);
	REQUIRE(ra == TLS_IO_OK && rb == TLS_IO_OK, "handshake: %s | %s", wa, wb);
	CHECK(tls_write(l.sa, "hello", 5, &n, wa, sizeof(wa)) == TLS_IO_OK && n == 5, "write");
	io = read_b(&l, buf, sizeof(buf), &n, wb);
	CHECK(io == TLS_IO_OK && n == 5 && memcmp(buf, "hello", 5) == 0, "the bytes arrive");
	CHECK(tls_bind(l.sa, "EXPORTER-test", "c", 1, x1) == 0 &&
		      tls_bind(l.sb, "EXPORTER-test", "c", 1, y1) == 0 && memcmp(x1, y1, 32) == 0,
	      "both ends export the same binding");
	tls_free(l.sa);
	l.sa = NULL;
	io = read_b(&l, buf, sizeof(buf), &n, wb);
	CHECK(io == TLS_IO_EOF, "close_notify is an end (%d: %s)", io, wb);
	link_close(&l);

	/* a cut without close_notify: truncation */
	link_open(&m, ca, cb);
	handshake(&m, &ra, &rb, wa, wb);
	REQUIRE(ra == TLS_IO_OK && rb == TLS_IO_OK, "handshake: %s | %s", wa, wb);
	CHECK(tls_bind(m.sa, "EXPORTER-test", "c", 1, x2) == 0 && memcmp(x1, x2, 32) != 0,
	      "another connection, another binding");
	CHECK(tls_write(m.sa, "part", 4, &n, wa, sizeof(wa)) == TLS_IO_OK, "write");
	io = read_b(&m, buf, sizeof(buf), &n, wb);
	relay(&m);
	shutdown(m.ra, SHUT_RDWR); /* the relay drops it: a FIN, no close_notify */
	close(m.rb);
	m.rb = -1;
	io = read_b(&m, buf, sizeof(buf), &n, wb);
	CHECK(io == TLS_IO_CUT && strstr(wb, "close_notify"), "a cut is truncation (%d: %s)", io,
	      wb);
	link_close(&m);

	/* one byte changed in a record: it does not open */
	link_open(&l, ca, cb);
	handshake(&l, &ra, &rb, wa, wb);
	REQUIRE(ra == TLS_IO_OK && rb == TLS_IO_OK, "handshake: %s | %s", wa, wb);
	l.flip_after = l.from_a + 10;
	CHECK(tls_write(l.sa, "changed on the way", 18, &n, wa, sizeof(wa)) == TLS_IO_OK, "write");
	io = read_b(&l, buf, sizeof(buf), &n, wb);
	CHECK(io == TLS_IO_ERROR && strstr(wb, "bad record mac"),
	      "a changed record does not open (%d: %s)", io, wb);
	link_close(&l);

	SSL_CTX_free(ca);
	SSL_CTX_free(cb);
	tls_ident_free(a);
	tls_ident_free(b);
}

static void t_mac(void)
{
	/* RFC 4231, test case 2 */
	static const uint8_t want[32] = {0x5b, 0xdc, 0xc1, 0x46, 0xbf, 0x60, 0x75, 0x4e,
					 0x6a, 0x04, 0x24, 0x26, 0x08, 0x95, 0x75, 0xc7,
					 0x5a, 0x00, 0x3f, 0x08, 0x9d, 0x27, 0x39, 0x83,
					 0x9d, 0xec, 0x58, 0xb9, 0x64, 0xec, 0x38, 0x43};
	const void *p[2] = {"what do ya want ", "for nothing?"};
	size_t l[2] = {16, 12};
	uint8_t out[32];

	tls_mac(out, "Jefe", 4, p, l, 2);
	CHECK(tls_equal(out, want, 32), "HMAC-SHA256 of RFC 4231's case 2, in two pieces");
	out[31] ^= 1;
	CHECK(!tls_equal(out, want, 32), "one bit off is not equal");
}

#define WITH_FILES(name, fn)                                                                       \
	static void name(void)                                                                     \
	{                                                                                          \
		setup();                                                                           \
		fn();                                                                              \
		cleanup();                                                                         \
	}
WITH_FILES(t_identity_files_case, t_identity_files)
WITH_FILES(t_certificates_case, t_certificates)
WITH_FILES(t_psk_case, t_psk)
WITH_FILES(t_ca_case, t_ca)
WITH_FILES(t_records_case, t_records)

static const struct test_case cases[] = {
	{"identity_files_loaded_or_refused_with_reasons", t_identity_files_case, 10000},
	{"certificates_pinned_both_ways_untrusted_named", t_certificates_case, 10000},
	{"ca_file_trusts_what_it_signed", t_ca_case, 10000},
	{"psk_of_the_job_refusals_alike", t_psk_case, 10000},
	{"records_changed_cut_closed_told_apart", t_records_case, 10000},
	{"hmac_rfc4231", t_mac, 10000},
};

TEST_MAIN(cases)
