/*
 * test_tls.c — TLS 1.3 between daemons (issue 24): real zerods on loopback
 * with identities made by `zeroctl keygen`, real trainers, and a TCP relay
 * between node 1 and the rendezvous that records every byte, follows the
 * TLS records (5-byte headers) and can change one, cut the stream at a
 * record boundary or answer in the rendezvous's place.
 *
 *  - a job over two daemons with identities trains to the reference (SGD
 *    bit for bit), its tensors over TLS 1.3 (each daemon says so); through
 *    the relay, neither the job id, nor its store keys, nor either
 *    certificate (its DER bytes, its subject's CN) is on the wire; the same
 *    job without identities (the job's PSK) trains, and the job id and the
 *    store keys are not on the wire either (the PSK identity names no job);
 *  - a node whose certificate the rendezvous does not trust is refused (node
 *    0 names the fingerprint; the node, which sees only a TLS alert, asks
 *    again until its join timeout and names the last refusal); a node that
 *    does not trust the rendezvous's certificate fails at once with
 *    ZC_ECONNECT naming it; a job beside them over two trusted daemons trains;
 *  - a daemon without identity against a rendezvous with one, and the
 *    reverse: both refused in the handshake, with named errors, no plain
 *    fallback;
 *  - one flipped bit in node 1's Join (after the handshake): node 0 logs the
 *    broken record and closes; node 1 hears the alert, connects again and
 *    the job trains; one flipped in the host's Welcome: node 1 logs it,
 *    connects again and the job trains;
 *  - a forged plaintext rendezvous Fail in answer to node 1's ClientHello:
 *    never taken for the host's word (no "FORGED" anywhere), a job beside
 *    trains, and once the relay forwards again the node joins and trains;
 *  - the relay ends node 1's connection at a record boundary after the job
 *    formed, a plain FIN: both daemons name it a cut without close_notify;
 *  - a key file readable by others, a peers line that is not a
 *    fingerprint, a key without a certificate, an old CURVE key as --tls-key,
 *    --curve-secret-key, curve-peers in a config file: zerod does not start
 *    (exit 78, the config refused; the flag: a bad command line, exit 2) and
 *    says why;
 *  - the mesh between the two daemons through a relay (node 0 listens on
 *    one port and publishes the relay's: ZEROD_TEST_MESH_RELAY, test only):
 *    one tensor record flipped, replayed, or swapped with the next fails
 *    every rank of its job, and the daemons then train a next job.
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "base/config.h"
#include "cluster.h"
#include "harness.h"
#include "testkeys.h"
#include "testlib.h"
#include "trainer.h"

#define STALL_MS 4000
#define JOIN_MS  3000
#define HELLO_MS 2000

static char keydir[160];

/* ------------------------------------------------------------ keys --- */

struct ident {
	char name[32];
	char fp[TLS_FP_HEX + 1];
	uint8_t der[4096]; /* the certificate as it would cross the wire */
	int der_len;
	char cn[128]; /* its subject's CN */
};

/* The certificate DIR/NAME.crt: its DER, its CN, and its SHA-256
 * fingerprint (computed here) in fp. */
static bool read_cert(struct ident *id, char fp[TLS_FP_HEX + 1])
{
	unsigned char md[32];
	unsigned mdlen = 0;
	char path[256];
	uint8_t *p = id->der;
	FILE *f;
	X509 *x;

	snprintf(path, sizeof(path), "%s/%s.crt", keydir, id->name);
	f = fopen(path, "re");
	x = f ? PEM_read_X509(f, NULL, NULL, NULL) : NULL;
	if (f)
		fclose(f);
	if (!x)
		return false;
	id->der_len = i2d_X509(x, NULL);
	if (id->der_len <= 0 || id->der_len > (int)sizeof(id->der)) {
		X509_free(x);
		return false;
	}
	i2d_X509(x, &p);
	if (X509_digest(x, EVP_sha256(), md, &mdlen) != 1 || mdlen != 32) {
		X509_free(x);
		return false;
	}
	for (unsigned i = 0; i < mdlen; i++)
		snprintf(fp + 2 * i, 3, "%02x", md[i]);
	id->cn[0] = '\0';
	X509_NAME_get_text_by_NID(X509_get_subject_name(x), NID_commonName, id->cn, sizeof(id->cn));
	X509_free(x);
	return true;
}

static bool is_fp(const char *s)
{
	for (int i = 0; i < TLS_FP_HEX; i++)
		if (!isxdigit((unsigned char)s[i]) || isupper((unsigned char)s[i]))
			return false;
	return s[TLS_FP_HEX] == '\0';
}

/* `zeroctl keygen DIR/NAME`: DIR/NAME.key, DIR/NAME.crt, and the
 * fingerprint it prints. A keygen of CURVE's era (no .crt: the tool is
 * being rewritten beside this suite) is replaced by testkeys_make(), which
 * makes the same files, and the case says so. */
static int keygen(struct ident *id, const char *name)
{
	const char *bin = getenv("ZEROCTL_BIN");
	char prefix[200], crt[220], out[256] = "", fp[TLS_FP_HEX + 1];
	int pfd[2], st;
	ssize_t n = 0, got;
	pid_t pid;

	snprintf(id->name, sizeof(id->name), "%s", name);
	if (!bin || pipe(pfd) < 0)
		return -1;
	snprintf(prefix, sizeof(prefix), "%s/%s", keydir, name);
	snprintf(crt, sizeof(crt), "%s.crt", prefix);
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		dup2(pfd[1], 1);
		execl(bin, bin, "keygen", prefix, (char *)NULL);
		_exit(127);
	}
	close(pfd[1]);
	while (n < (ssize_t)sizeof(out) - 1 &&
	       (got = read(pfd[0], out + n, sizeof(out) - 1 - (size_t)n)) > 0)
		n += got;
	close(pfd[0]);
	st = wait_child(pid, 10000);
	out[n] = '\0';
	out[strcspn(out, "\r\n")] = '\0';
	if (st == 0 && access(crt, R_OK) != 0) {
		char pub[220];
		snprintf(pub, sizeof(pub), "%s.pub", prefix);
		unlink(pub);
		snprintf(pub, sizeof(pub), "%s.key", prefix);
		unlink(pub);
		test_note("zeroctl keygen made no %s.crt (a CURVE keygen): testkeys_make instead",
			  name);
		if (testkeys_make(keydir, name, id->fp) < 0)
			return -1;
		return read_cert(id, fp) && strcmp(fp, id->fp) == 0 ? 0 : -1;
	}
	if (st != 0 || !is_fp(out)) {
		test_note("zeroctl keygen %s: exit %d, printed \"%s\"", name, st, out);
		return -1;
	}
	snprintf(id->fp, sizeof(id->fp), "%s", out);
	if (!read_cert(id, fp))
		return -1;
	if (strcmp(fp, id->fp) != 0) {
		test_note("zeroctl keygen %s printed %s, and %s.crt's SHA-256 is %s", name, id->fp,
			  name, fp);
		return -1;
	}
	return 0;
}

/* A peers file DIR/NAME.peers of the fingerprints given. */
static void peers_file(const char *name, const char *const *fps, int n)
{
	char path[200];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s.peers", keydir, name);
	f = fopen(path, "w");
	if (!f)
		abort();
	fprintf(f, "# the zerods this one trusts\n");
	for (int i = 0; i < n; i++)
		fprintf(f, "%s\n", fps[i]);
	fclose(f);
}

static void rm_keydir(void)
{
	char cmd[200];

	if (keydir[0]) {
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", keydir);
		(void)!system(cmd);
	}
}

static struct ident ids[3]; /* a, b, c */

/* Identities for daemons a, b, c; a and b trust each other (peers file
 * "ab"), c trusts a and b (peers file "c") but neither trusts c. */
static bool make_keys(void)
{
	const char *ab[2];

	snprintf(keydir, sizeof(keydir), "%s/zerod-tls-XXXXXX", test_tmpdir());
	if (!mkdtemp(keydir)) {
		CHECK(0, "mkdtemp: %s", strerror(errno));
		return false;
	}
	atexit(rm_keydir);
	if (keygen(&ids[0], "tlsnode-a") < 0 || keygen(&ids[1], "tlsnode-b") < 0 ||
	    keygen(&ids[2], "tlsnode-c") < 0) {
		CHECK(0, "zeroctl keygen failed (ZEROCTL_BIN=%s)", getenv("ZEROCTL_BIN"));
		return false;
	}
	ab[0] = ids[0].fp;
	ab[1] = ids[1].fp;
	peers_file("ab", ab, 2);
	peers_file("c", ab, 2);
	return true;
}

/* --------------------------------------------------------- daemons --- */

/* Start n daemons; daemon k with the identity ids[key[k]] and peers file
 * peers[k] when key[k] >= 0, without (the jobs' PSKs) when it is -1. */
static int tls_cluster_start(struct cluster *cl, uint32_t n, const int *key,
			     const char *const *peers)
{
	char kpath[CLUSTER_MAXN][200], cpath[CLUSTER_MAXN][200], ppath[CLUSTER_MAXN][200];
	const char *kp[CLUSTER_MAXN] = {NULL}, *cp[CLUSTER_MAXN] = {NULL},
		   *pp[CLUSTER_MAXN] = {NULL};
	const struct cluster_opts o = {
		.stall_ms = STALL_MS,
		.join_ms = JOIN_MS,
		.hello_ms = HELLO_MS,
		.tls_key = kp,
		.tls_cert = cp,
		.tls_peers = pp,
	};

	for (uint32_t k = 0; key && k < n; k++)
		if (key[k] >= 0) {
			snprintf(kpath[k], sizeof(kpath[k]), "%s/%s.key", keydir, ids[key[k]].name);
			snprintf(cpath[k], sizeof(cpath[k]), "%s/%s.crt", keydir, ids[key[k]].name);
			snprintf(ppath[k], sizeof(ppath[k]), "%s/%s.peers", keydir, peers[k]);
			kp[k] = kpath[k];
			cp[k] = cpath[k];
			pp[k] = ppath[k];
		}
	return cluster_start(cl, n, &o);
}

static int rank_main(void *arg, int idx)
{
	return train_rank(arg, (uint32_t)idx);
}

/* A 2-rank SGD job, rank r on node r (socks[r]), the rendezvous at rdzv;
 * its results in slot `slot` (0..3) of the shared ones, so that jobs side
 * by side do not write over each other's. */
static struct train_spec spec2(const char *job, const char *rdzv, const char *const *socks,
			       int slot)
{
	static const uint32_t node_of[] = {0, 1};
	struct train_spec s = cluster_spec(job, 2, 2, rdzv, socks, node_of);

	s.seed = 11;
	s.results += 2 * slot;
	memset(s.results, 0, 2 * sizeof(*s.results));
	return s;
}

static void start2(struct train_spec *s, pid_t *pids)
{
	for (int r = 0; r < 2; r++)
		pids[r] = spawn(rank_main, s, r);
}

static void wait2(const pid_t *pids, int *st)
{
	for (int r = 0; r < 2; r++)
		st[r] = wait_child(pids[r], 60000);
}

static void run2(struct train_spec *s, int *st)
{
	pid_t pids[2];

	start2(s, pids);
	wait2(pids, st);
}

static bool has(const char *msg, const char *needle)
{
	return strstr(msg, needle) != NULL;
}

/* Both ranks of s trained every iteration to the reference. */
static void check_trained(const struct train_spec *s, const int *st)
{
	for (int r = 0; r < 2; r++)
		CHECK(st[r] == 0 && s->results[r].iterations == s->iters,
		      "%s rank %d: exit %d after %d iterations: %s: %s", s->job, r, st[r],
		      s->results[r].iterations, zc_strerror_name(s->results[r].code),
		      s->results[r].msg);
}

/* Job `job` on daemon d failed with `code` saying `why`: in its log, and to
 * its rank res, with that code and reason. */
static bool failed_with(const struct zd *d, const struct train_result *res, const char *job,
			int code, const char *why)
{
	char want[128];

	snprintf(want, sizeof(want), "job %s: failed: %s: ", job, zc_strerror_name(code));
	if (!zd_wait_log(d, want, 2000) || !zd_log_has(d, why))
		return false;
	return res->code == code && has(res->msg, why);
}

/* The first line of d's log that holds both a and b (b NULL: a), without
 * its newline, in out; false if there is none. */
static bool log_line(const struct zd *d, const char *a, const char *b, char *out, size_t len)
{
	char line[2048];
	FILE *f = fopen(d->log, "re");
	bool ok = false;

	while (f && !ok && fgets(line, sizeof(line), f))
		ok = strstr(line, a) && (!b || strstr(line, b));
	if (f)
		fclose(f);
	if (ok && out) {
		line[strcspn(line, "\n")] = '\0';
		snprintf(out, len, "%s", line);
	}
	return ok;
}

static bool log_line_has(const struct zd *d, const char *a, const char *b)
{
	return log_line(d, a, b, NULL, 0);
}

/* ----------------------------------------------------------- relay --- */

/* A TCP relay from port `from` to `to` on loopback, until killed: every
 * byte both ways is appended to rec_fd. It follows each direction's TLS
 * records (type, 2 version bytes, 2 length bytes, the body) and, on the
 * first connection it accepts (node 1's join connection: the store's come
 * after the job formed), does what `mode` says once. A host record is
 * "after the handshake" when the node had sent an encrypted record before
 * it (TLS 1.3: the host's flight is all before the node's Finished, and no
 * tickets are sent): the first is the Welcome, the second the Formed. */
enum relay_mode {
	RELAY_RECORD,    /* only record */
	RELAY_FLIP_UP,   /* flip the last bit of node 1's first record after the Welcome */
	RELAY_FLIP_DOWN, /* ... of the host's Welcome */
	RELAY_CUT,       /* after the host's Formed, a FIN both ways (no close_notify) */
	RELAY_FORGE,     /* answer the ClientHello with a plaintext Fail, not the host */
	/* the mesh's lanes (any connection, either way), once, on the first
	 * application-data record of >= 1 KiB (tensor data): */
	RELAY_MESH_PASS,   /* only forward */
	RELAY_MESH_FLIP,   /* flip a bit in its middle */
	RELAY_MESH_REPLAY, /* send it twice */
	RELAY_MESH_SWAP,   /* send the next record of that direction before it */
};

struct relay_cfg {
	enum relay_mode mode;
	int forge_conns; /* RELAY_FORGE: on that many connections (from the first) */
	int port;        /* listen on it (0: a free port) */
};

struct tlsrec {
	uint8_t hdr[5];
	int have;
	uint32_t left;
	bool post; /* a host record after the handshake */
};

struct pair {
	int idx;              /* accepted as the idx-th connection */
	int node_app;         /* node 1's encrypted records seen */
	int host_post;        /* host records after the handshake, whole */
	bool forged, cut;     /* nothing more is forwarded */
	struct tlsrec rec[2]; /* [0]: from node 1, [1]: from the host */
};

/* A plaintext rendezvous frame: 4-byte length, RdzvEnvelope{fail = 7:
 * RdzvFail{code = 1: ECONNECT (1022), message = 2}}. */
static size_t forged_fail(uint8_t *out)
{
	static const char text[] = "FORGED by the relay: this node is banned, give up";
	uint8_t fail[128], *p = out + 4;
	size_t fl = 0, tl = sizeof(text) - 1, el;

	fail[fl++] = 0x08; /* code, varint */
	fail[fl++] = 0xfe; /* 1022 */
	fail[fl++] = 0x07;
	fail[fl++] = 0x12; /* message, bytes */
	fail[fl++] = (uint8_t)tl;
	memcpy(fail + fl, text, tl);
	fl += tl;
	*p++ = 0x3a; /* fail = 7, bytes */
	*p++ = (uint8_t)fl;
	memcpy(p, fail, fl);
	el = 2 + fl;
	out[0] = out[1] = out[2] = 0;
	out[3] = (uint8_t)el;
	return 4 + el;
}

/* Walk one read from direction d (0: node 1, 1: the host) of pair q,
 * changing what the mode says; how many of its bytes to forward (less than
 * got where the stream is cut after a record). */
static ssize_t follow(struct pair *q, int d, uint8_t *buf, ssize_t got, const struct relay_cfg *cfg,
		      bool *done)
{
	struct tlsrec *t = &q->rec[d];

	for (ssize_t k = 0; k < got; k++) {
		if (t->left == 0) {
			t->hdr[t->have++] = buf[k];
			if (t->have < 5)
				continue;
			t->have = 0;
			t->left = (uint32_t)t->hdr[3] << 8 | t->hdr[4];
			t->post = d == 1 && t->hdr[0] == 23 && q->node_app > 0;
			if (d == 0 && t->hdr[0] == 23)
				q->node_app++;
			continue;
		}
		if (--t->left > 0)
			continue;
		/* buf[k] ends a record */
		if (t->post)
			q->host_post++;
		if (q->idx != 0 || *done)
			continue;
		if (cfg->mode == RELAY_FLIP_UP && d == 0 && t->hdr[0] == 23 && q->host_post >= 1) {
			buf[k] ^= 0x01;
			*done = true;
		} else if (cfg->mode == RELAY_FLIP_DOWN && t->post && q->host_post == 1) {
			buf[k] ^= 0x01;
			*done = true;
		} else if (cfg->mode == RELAY_CUT && t->post && q->host_post == 2) {
			*done = true;
			q->cut = true;
			return k + 1;
		}
	}
	return got;
}

static void relay_main(int from, int to, int ready_fd, int rec_fd, struct relay_cfg cfg)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	struct pollfd p[1 + 2 * 32];
	struct pair pairs[32]; /* pairs[i / 2]: what p[1 + i] carries (even: node 1) */
	int lfd = socket(AF_INET, SOCK_STREAM, 0), one = 1, n = 0, accepted = 0;
	bool done = false;

	prctl(PR_SET_PDEATHSIG, SIGKILL);
	setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	sa.sin_port = htons((uint16_t)from);
	if (bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(lfd, 16) < 0)
		_exit(2);
	signal_pipe(ready_fd);
	p[0] = (struct pollfd){.fd = lfd, .events = POLLIN};
	for (;;) {
		if (poll(p, (nfds_t)(1 + n), -1) < 0)
			_exit(2);
		if ((p[0].revents & POLLIN) && n < 64) {
			int a = accept(lfd, NULL, NULL), b = socket(AF_INET, SOCK_STREAM, 0);
			sa.sin_port = htons((uint16_t)to);
			if (a >= 0 && b >= 0 &&
			    connect(b, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
				pairs[n / 2] = (struct pair){.idx = accepted++};
				pairs[n / 2].forged = cfg.mode == RELAY_FORGE &&
						      pairs[n / 2].idx < cfg.forge_conns;
				p[1 + n++] = (struct pollfd){.fd = a, .events = POLLIN};
				p[1 + n++] = (struct pollfd){.fd = b, .events = POLLIN};
			} else {
				close(a);
				close(b);
			}
		}
		for (int i = 0; i < n; i++) {
			struct pair *q = &pairs[i / 2];
			uint8_t buf[65536];
			ssize_t got, fwd;
			if (p[1 + i].fd < 0 || !(p[1 + i].revents & (POLLIN | POLLHUP | POLLERR)))
				continue;
			got = read(p[1 + i].fd, buf, sizeof(buf));
			int peer = p[1 + (i ^ 1)].fd;
			if (got > 0)
				(void)!write(rec_fd, buf, (size_t)got);
			if (got > 0 && (q->forged || q->cut)) {
				/* the node's ClientHello: answered here, never
				 * forwarded; then whatever comes is dropped */
				if (q->forged && i % 2 == 0 && peer >= 0) {
					uint8_t f[256];
					size_t fl = forged_fail(f);
					(void)!write(p[1 + i].fd, f, fl);
					close(peer);
					p[1 + (i ^ 1)].fd = -1;
				}
				continue;
			}
			fwd = got > 0 ? follow(q, i % 2, buf, got, &cfg, &done) : got;
			if (fwd > 0 && peer >= 0 && write(peer, buf, (size_t)fwd) != fwd)
				fwd = -1;
			if (got > 0 && q->cut) {
				/* a plain FIN to both, at the record's end */
				shutdown(p[1 + i].fd, SHUT_WR);
				shutdown(peer, SHUT_WR);
				continue;
			}
			if (fwd <= 0 || peer < 0) {
				close(p[1 + i].fd);
				if (peer >= 0)
					close(peer);
				p[1 + i].fd = p[1 + (i ^ 1)].fd = -1;
			}
		}
	}
}

/* One direction of a mesh lane: the bytes of a record not whole yet, and
 * a record held back (RELAY_MESH_SWAP). */
struct mstream {
	uint8_t pend[20000], hold[20000];
	size_t plen, hlen;
};

/* Append got bytes to s; whole records, changed as mode says (once per
 * relay: *done), into out; how many bytes to forward. */
static size_t mesh_follow(struct mstream *s, const uint8_t *in, size_t got, uint8_t *out,
			  enum relay_mode mode, bool *done)
{
	size_t n = 0, rl;

	memcpy(s->pend + s->plen, in, got);
	s->plen += got;
	while (s->plen >= 5 && s->plen >= (rl = 5 + ((size_t)s->pend[3] << 8 | s->pend[4]))) {
		uint8_t *r = s->pend;
		bool big = r[0] == 23 && rl - 5 >= 1024;
		memcpy(out + n, r, rl);
		n += rl;
		if (s->hlen) {
			memcpy(out + n, s->hold, s->hlen);
			n += s->hlen;
			s->hlen = 0;
		} else if (big && !*done && mode == RELAY_MESH_FLIP) {
			out[n - rl + 5 + (rl - 5) / 2] ^= 0x01;
			*done = true;
		} else if (big && !*done && mode == RELAY_MESH_REPLAY) {
			memcpy(out + n, r, rl);
			n += rl;
			*done = true;
		} else if (big && !*done && mode == RELAY_MESH_SWAP) {
			memcpy(s->hold, r, rl);
			s->hlen = rl;
			n -= rl;
			*done = true;
		}
		memmove(s->pend, s->pend + rl, s->plen - rl);
		s->plen -= rl;
	}
	return n;
}

/* A relay for the mesh's lanes, from port `from` to `to` on loopback. */
static void mesh_relay_main(int from, int to, int ready_fd, struct relay_cfg cfg)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	enum { MAXC = 64 };
	static struct mstream st[2 * MAXC];
	static uint8_t buf[16384], out[3 * 20000];
	struct pollfd p[1 + 2 * MAXC];
	int lfd = socket(AF_INET, SOCK_STREAM, 0), one = 1, n = 0;
	bool done = false;

	prctl(PR_SET_PDEATHSIG, SIGKILL);
	setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	sa.sin_port = htons((uint16_t)from);
	if (bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(lfd, 64) < 0)
		_exit(2);
	signal_pipe(ready_fd);
	p[0] = (struct pollfd){.fd = lfd, .events = POLLIN};
	for (;;) {
		if (poll(p, (nfds_t)(1 + n), -1) < 0)
			_exit(2);
		if ((p[0].revents & POLLIN) && n < 2 * MAXC) {
			int a = accept(lfd, NULL, NULL), b = socket(AF_INET, SOCK_STREAM, 0);
			sa.sin_port = htons((uint16_t)to);
			if (a >= 0 && b >= 0 &&
			    connect(b, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
				st[n].plen = st[n].hlen = st[n + 1].plen = st[n + 1].hlen = 0;
				p[1 + n++] = (struct pollfd){.fd = a, .events = POLLIN};
				p[1 + n++] = (struct pollfd){.fd = b, .events = POLLIN};
			} else {
				close(a);
				close(b);
			}
		}
		for (int i = 0; i < n; i++) {
			int peer = p[1 + (i ^ 1)].fd;
			ssize_t got;
			size_t fwd;
			if (p[1 + i].fd < 0 || !(p[1 + i].revents & (POLLIN | POLLHUP | POLLERR)))
				continue;
			got = read(p[1 + i].fd, buf, sizeof(buf));
			fwd = got > 0 ? mesh_follow(&st[i], buf, (size_t)got, out, cfg.mode, &done)
				      : 0;
			if (got > 0 && peer >= 0 &&
			    (fwd == 0 || write(peer, out, fwd) == (ssize_t)fwd))
				continue;
			close(p[1 + i].fd);
			if (peer >= 0)
				close(peer);
			p[1 + i].fd = p[1 + (i ^ 1)].fd = -1;
		}
	}
}

struct relay {
	pid_t pid;
	int port;
	char rdzv[32];
	char rec[200];
};

static bool relay_start(struct relay *r, int to, struct relay_cfg cfg, const char *name)
{
	int pfd[2], rec;
	bool ok;

	r->port = cfg.port > 0 ? cfg.port : zd_free_port();
	snprintf(r->rdzv, sizeof(r->rdzv), "127.0.0.1:%d", r->port);
	snprintf(r->rec, sizeof(r->rec), "%s/%s.rec", keydir, name);
	rec = open(r->rec, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
	if (rec < 0 || pipe(pfd) < 0)
		return false;
	fflush(stdout);
	r->pid = fork();
	if (r->pid == 0 && cfg.mode >= RELAY_MESH_PASS)
		mesh_relay_main(r->port, to, pfd[1], cfg);
	if (r->pid == 0)
		relay_main(r->port, to, pfd[1], rec, cfg);
	close(rec);
	ok = wait_pipe(pfd[0], 5000);
	close(pfd[0]);
	close(pfd[1]);
	return ok;
}

static void relay_stop(struct relay *r)
{
	kill(r->pid, SIGKILL);
	wait_child(r->pid, 5000);
}

/* How often the len bytes of needle are in what the relay carried; its
 * size in *ret_bytes. */
static int recorded(const struct relay *r, const void *needle, size_t len, size_t *ret_bytes)
{
	static char buf[8 << 20];
	int fd = open(r->rec, O_RDONLY | O_CLOEXEC), count = 0;
	ssize_t n = 0, got;

	while (fd >= 0 && n < (ssize_t)sizeof(buf) &&
	       (got = read(fd, buf + n, sizeof(buf) - (size_t)n)) > 0)
		n += got;
	if (fd >= 0)
		close(fd);
	*ret_bytes = (size_t)n;
	for (char *p = buf; len && n > 0 && (p = memmem(p, (size_t)(buf + n - p), needle, len));
	     p++)
		count++;
	return count;
}

static int recorded_str(const struct relay *r, const char *needle)
{
	size_t bytes;

	return recorded(r, needle, strlen(needle), &bytes);
}

/* The random part of the job's store prefix ("JOB/0123456789abcdef/"), in
 * every store key: from the host's "store prefix" line. */
static bool store_nonce(const struct zd *d, const char *job, char nonce[24])
{
	char want[96], line[512];
	FILE *f = fopen(d->log, "re");
	bool ok = false;

	snprintf(want, sizeof(want), "store prefix %s/", job);
	while (f && !ok && fgets(line, sizeof(line), f)) {
		char *p = strstr(line, want);
		if (p && sscanf(p + strlen(want), "%16[0-9a-f]", nonce) == 1 && strlen(nonce) == 16)
			ok = true;
	}
	if (f)
		fclose(f);
	return ok;
}

/* ----------------------------------------------------------- cases --- */

/* One job through the relay, node 1 reaching the rendezvous by it: trains
 * to the reference, each daemon says how its tensors went, and nothing
 * that names the job or a daemon is on the wire. */
static void job_through_relay(const int *key, const char *const *peers, const char *job)
{
	struct cluster cl;
	struct relay rl;
	struct train_spec s;
	const char *rdzvs[2];
	char nonce[24] = "";
	size_t bytes = 0;
	int st[2];

	if (tls_cluster_start(&cl, 2, key, peers) < 0 ||
	    !relay_start(&rl, cl.port, (struct relay_cfg){RELAY_RECORD, 0}, job)) {
		CHECK(0, "cannot start 2 daemons and the relay");
		return;
	}
	rdzvs[0] = cl.rdzv;
	rdzvs[1] = rl.rdzv;
	s = spec2(job, cl.rdzv, cl.socks, 0);
	s.rdzvs = rdzvs;
	run2(&s, st);
	check_trained(&s, st);
	for (int k = 0; k < 2; k++)
		CHECK(zd_log_has(&cl.zd[k],
				 key ? "tensors between nodes over TLS 1.3"
				     : "tensors between nodes over gloo (not encrypted)"),
		      "daemon %d does not say its tensors went %s", k,
		      key ? "over TLS 1.3" : "over gloo");
	if (key)
		CHECK(zd_log_has(&cl.zd[0], ids[key[0]].fp) &&
			      zd_log_has(&cl.zd[1], ids[key[1]].fp),
		      "a daemon does not name its certificate's fingerprint");
	relay_stop(&rl);
	CHECK(store_nonce(&cl.zd[0], job, nonce), "no store prefix of job %s in node 0's log", job);
	CHECK(recorded(&rl, "\x16\x03\x01", 3, &bytes) >= 1 && bytes > 1000,
	      "the relay recorded no ClientHello (%zu bytes)", bytes);
	CHECK(recorded_str(&rl, job) == 0, "the job id %s is on the wire %d times", job,
	      recorded_str(&rl, job));
	CHECK(nonce[0] && recorded_str(&rl, nonce) == 0,
	      "the store keys (prefix %s/%s/) are on the wire %d times", job, nonce,
	      recorded_str(&rl, nonce));
	for (int k = 0; key && k < 2; k++) {
		const struct ident *id = &ids[key[k]];
		size_t b;
		CHECK(recorded(&rl, id->der, (size_t)id->der_len, &b) == 0,
		      "%s's certificate (%d bytes of DER) is on the wire", id->name, id->der_len);
		/* its last 32 bytes: part of the signature, in no other cert */
		CHECK(recorded(&rl, id->der + id->der_len - 32, 32, &b) == 0,
		      "a piece of %s's certificate is on the wire", id->name);
		CHECK(strlen(id->cn) >= 4 && recorded_str(&rl, id->cn) == 0,
		      "%s's CN \"%s\" is on the wire %d times", id->name, id->cn,
		      recorded_str(&rl, id->cn));
	}
	test_note("%s: the relay carried %zu bytes", job, bytes);
	cluster_stop(&cl, -1);
}

static void t_job_trains_and_hides(void)
{
	static const int key[] = {0, 1};
	static const char *const peers[] = {"ab", "ab"};

	REQUIRE(make_keys(), "no keys");
	job_through_relay(key, peers, "tlsjob-certs");
	job_through_relay(NULL, NULL, "tlsjob-psk");
}

static void t_untrusted_cert_refused(void)
{
	/* daemon 0 (a) and 1 (b) trust each other; daemon 2 (c) trusts them,
	 * nobody trusts c */
	static const int key[] = {0, 1, 2};
	static const char *const peers[] = {"ab", "ab", "c"};
	struct cluster cl;
	struct train_spec bad, good, rev;
	const char *bad_socks[2], *good_socks[2], *rev_socks[2];
	char good_rdzv[32], rev_rdzv[32], why[256], host[96];
	pid_t pids[2], bad_pids[2], rev_pids[2];
	int st[2];

	REQUIRE(make_keys(), "no keys");
	REQUIRE(tls_cluster_start(&cl, 3, key, peers) == 0, "cannot start 3 daemons");
	/* the job beside it: daemons 0 and 1, its own rendezvous port */
	snprintf(good_rdzv, sizeof(good_rdzv), "127.0.0.1:%d", zd_free_port());
	good_socks[0] = cl.socks[0];
	good_socks[1] = cl.socks[1];
	good = spec2("trusted", good_rdzv, good_socks, 0);
	good.iters = 8;
	good.sleep_us = 100000;
	start2(&good, pids);
	/* daemon 2 as node 1 of a job whose rendezvous daemon 0 serves */
	bad_socks[0] = cl.socks[0];
	bad_socks[1] = cl.socks[2];
	bad = spec2("untrusted", cl.rdzv, bad_socks, 1);
	/* daemon 0 as node 1 of a job whose rendezvous daemon 2 serves: c
	 * trusts a, a does not trust c */
	snprintf(rev_rdzv, sizeof(rev_rdzv), "127.0.0.1:%d", zd_free_port());
	rev_socks[0] = cl.socks[2];
	rev_socks[1] = cl.socks[0];
	rev = spec2("untrustedhost", rev_rdzv, rev_socks, 2);
	start2(&bad, bad_pids);
	start2(&rev, rev_pids);
	for (int r = 0; r < 2; r++) {
		wait_child(bad_pids[r], 30000);
		wait_child(rev_pids[r], 30000);
	}
	snprintf(why, sizeof(why),
		 "its certificate (SHA-256 %s) is not among the peers this zerod trusts",
		 ids[2].fp);
	/* the node that does not trust the host: at once, named */
	CHECK(failed_with(&cl.zd[0], &rev.results[1], "untrustedhost", ZC_ECONNECT, why),
	      "node 1 of the job with an untrusted rendezvous: %s: %s",
	      zc_strerror_name(rev.results[1].code), rev.results[1].msg);
	CHECK(has(rev.results[1].msg, rev_rdzv), "it does not name the rendezvous %s: %s", rev_rdzv,
	      rev.results[1].msg);
	CHECK(rev.results[0].code != 0, "node 0 of the job with an untrusted rendezvous trained");
	/* the host that does not trust the node: logs the fingerprint; the
	 * node sees a TLS alert, asks again until its join timeout */
	snprintf(host, sizeof(host), "rendezvous %s: refused 127.0.0.1:", cl.rdzv);
	CHECK(log_line_has(&cl.zd[0], host, why),
	      "daemon 0 did not log that it refused c's certificate, naming its address");
	CHECK(failed_with(&cl.zd[2], &bad.results[1], "untrusted", ZC_ETIMEDOUT,
			  "did not let this node join"),
	      "node 1 of the refused job: %s: %s", zc_strerror_name(bad.results[1].code),
	      bad.results[1].msg);
	/* each try's refusal is the host's alert, which the node logs; the
	 * last try's, in the error, is "closed" where the node's Hello met the
	 * host's reset before it read the alert (rdzvnet.c flush() drops the
	 * write's reason), so the error is not checked for it */
	snprintf(host, sizeof(host), "rendezvous %s: TLS: ", cl.rdzv);
	CHECK(log_line_has(&cl.zd[2], host, "alert"), "node 1 did not log the host's TLS alert");
	test_note("node 1 of the refused job: %s", bad.results[1].msg);
	CHECK(bad.results[0].code != 0, "node 0 of the refused job trained");
	wait2(pids, st);
	check_trained(&good, st);
	cluster_stop(&cl, -1);
}

static void t_psk_peer_vs_cert_peer(void)
{
	/* daemon 0 with an identity, daemon 1 without */
	static const int key[] = {0, -1};
	static const char *const peers[] = {"ab", NULL};
	struct cluster cl;
	struct train_spec s, t;
	const char *swapped[2];
	char rdzv2[32], host[96], line[2048] = "";
	int st[2];
	int64_t t0;

	REQUIRE(make_keys(), "no keys");
	REQUIRE(tls_cluster_start(&cl, 2, key, peers) == 0, "cannot start 2 daemons");
	/* a PSK node against a rendezvous with certificates */
	s = spec2("psknode", cl.rdzv, cl.socks, 0);
	t0 = test_ms();
	run2(&s, st);
	CHECK(s.results[1].code != 0 && s.results[1].iterations == 0 && s.results[0].code != 0,
	      "the PSK node: %s: %s", zc_strerror_name(s.results[1].code), s.results[1].msg);
	CHECK(failed_with(&cl.zd[1], &s.results[1], "psknode", ZC_ETIMEDOUT,
			  "authenticates with a certificate: it has TLS keys (--tls-key), and this "
			  "zerod has none"),
	      "the PSK node: %s: %s", zc_strerror_name(s.results[1].code), s.results[1].msg);
	snprintf(host, sizeof(host), "rendezvous %s: refused 127.0.0.1:", cl.rdzv);
	CHECK(log_line(&cl.zd[0], host, "TLS: ", line, sizeof(line)),
	      "daemon 0 did not log the refused PSK node");
	test_note("the PSK node ended after %lld ms: %s; node 0: %s", (long long)(test_ms() - t0),
		  s.results[1].msg, line);
	/* a node with a certificate against a PSK rendezvous (daemon 1 serves) */
	snprintf(rdzv2, sizeof(rdzv2), "127.0.0.1:%d", zd_free_port());
	swapped[0] = cl.socks[1];
	swapped[1] = cl.socks[0];
	t = spec2("certnode", rdzv2, swapped, 1);
	run2(&t, st);
	CHECK(t.results[1].code != 0 && t.results[1].iterations == 0 && t.results[0].code != 0,
	      "the certificate node: %s: %s", zc_strerror_name(t.results[1].code),
	      t.results[1].msg);
	CHECK(failed_with(&cl.zd[0], &t.results[1], "certnode", ZC_ETIMEDOUT,
			  "the TLS handshake with the rendezvous failed (TLS: "),
	      "the certificate node: %s: %s", zc_strerror_name(t.results[1].code),
	      t.results[1].msg);
	snprintf(host, sizeof(host), "rendezvous %s: refused 127.0.0.1:", rdzv2);
	CHECK(log_line(&cl.zd[1], host, "it offered no PSK (it has TLS keys", line, sizeof(line)),
	      "daemon 1 did not log the refused certificate node");
	test_note("the certificate node: %s; node 0: %s", t.results[1].msg, line);
	cluster_stop(&cl, -1);
}

/* A job through a relay in mode m on two daemons that trust each other;
 * the relay and the cluster are left for the case to check and stop. */
static bool relay_job(struct cluster *cl, struct relay *rl, struct relay_cfg cfg, const char *job,
		      struct train_spec *s, int *st)
{
	static const int key[] = {0, 1};
	static const char *const peers[] = {"ab", "ab"};
	static const char *rdzvs[2];

	if (tls_cluster_start(cl, 2, key, peers) < 0 || !relay_start(rl, cl->port, cfg, job)) {
		CHECK(0, "cannot start 2 daemons and the relay");
		return false;
	}
	rdzvs[0] = cl->rdzv;
	rdzvs[1] = rl->rdzv;
	*s = spec2(job, cl->rdzv, cl->socks, 0);
	s->rdzvs = rdzvs;
	run2(s, st);
	return true;
}

static void t_flipped_bit(void)
{
	struct cluster cl;
	struct relay rl;
	struct train_spec s;
	char want[128];
	int st[2] = {-1, -1};

	REQUIRE(make_keys(), "no keys");
	/* node 1's Join, after the handshake and the Welcome: the host finds
	 * the record broken, closes (an alert to the node); the node, not
	 * formed yet, asks again and joins (the relay flips once) */
	REQUIRE(relay_job(&cl, &rl, (struct relay_cfg){RELAY_FLIP_UP, 0}, "flipped", &s, st),
		"no job");
	check_trained(&s, st);
	snprintf(want, sizeof(want), "rendezvous %s: closed 127.0.0.1:", cl.rdzv);
	CHECK(zd_wait_log(&cl.zd[0], want, 2000) &&
		      zd_log_has(&cl.zd[0], "decryption failed or bad record mac"),
	      "daemon 0 did not log the broken record");
	snprintf(want, sizeof(want), "rendezvous %s: TLS: ", rl.rdzv);
	CHECK(zd_log_has(&cl.zd[1], want), "node 1 did not log the host's alert");
	relay_stop(&rl);
	cluster_stop(&cl, -1);

	/* the host's Welcome: node 1 logs the record that fails to open,
	 * connects again, and the job trains */
	REQUIRE(relay_job(&cl, &rl, (struct relay_cfg){RELAY_FLIP_DOWN, 0}, "flippeddown", &s, st),
		"no job");
	check_trained(&s, st);
	snprintf(want, sizeof(want), "rendezvous %s: TLS: decryption failed or bad record mac",
		 rl.rdzv);
	CHECK(zd_wait_log(&cl.zd[1], want, 2000), "node 1 did not log the changed record");
	relay_stop(&rl);
	cluster_stop(&cl, -1);
}

static void t_forged_plaintext_fail(void)
{
	static const int key[] = {0, 1};
	static const char *const peers[] = {"ab", "ab"};
	struct cluster cl;
	struct relay rl, once;
	struct train_spec forged, beside, again;
	const char *rdzvs[2], *rdzvs2[2];
	char rdzv_b[32], rdzv_o[32];
	pid_t fp[2], bp[2], op[2];
	int st[2];

	REQUIRE(make_keys(), "no keys");
	REQUIRE(tls_cluster_start(&cl, 2, key, peers) == 0, "cannot start 2 daemons");
	/* every connection of node 1 answered by the relay */
	REQUIRE(relay_start(&rl, cl.port, (struct relay_cfg){RELAY_FORGE, 1000}, "forge"),
		"the relay did not start");
	/* another job: its first connection answered so, then forwarded */
	snprintf(rdzv_o, sizeof(rdzv_o), "127.0.0.1:%d", zd_free_port());
	REQUIRE(relay_start(&once, atoi(strchr(rdzv_o, ':') + 1),
			    (struct relay_cfg){RELAY_FORGE, 1}, "forgeonce"),
		"the second relay did not start");
	rdzvs[0] = cl.rdzv;
	rdzvs[1] = rl.rdzv;
	forged = spec2("forged", cl.rdzv, cl.socks, 0);
	forged.rdzvs = rdzvs;
	rdzvs2[0] = rdzv_o;
	rdzvs2[1] = once.rdzv;
	again = spec2("forgedonce", rdzv_o, cl.socks, 1);
	again.rdzvs = rdzvs2;
	snprintf(rdzv_b, sizeof(rdzv_b), "127.0.0.1:%d", zd_free_port());
	beside = spec2("besideforged", rdzv_b, cl.socks, 2);
	start2(&forged, fp);
	start2(&again, op);
	start2(&beside, bp);
	wait2(bp, st);
	check_trained(&beside, st);
	wait2(op, st);
	check_trained(&again, st);
	wait2(fp, st);
	CHECK(forged.results[1].code == ZC_ETIMEDOUT &&
		      has(forged.results[1].msg, "did not let this node join") &&
		      has(forged.results[1].msg, "TLS"),
	      "node 1 of the forged job: %s: %s", zc_strerror_name(forged.results[1].code),
	      forged.results[1].msg);
	for (int r = 0; r < 2; r++)
		CHECK(!has(forged.results[r].msg, "FORGED") && !has(again.results[r].msg, "FORGED"),
		      "rank %d ended with the attacker's words: %s", r, forged.results[r].msg);
	for (int k = 0; k < 2; k++)
		CHECK(!zd_log_has(&cl.zd[k], "FORGED"), "daemon %d took the forged Fail in", k);
	relay_stop(&rl);
	relay_stop(&once);
	cluster_stop(&cl, -1);
}

static void t_cut_at_record_boundary(void)
{
	struct cluster cl;
	struct relay rl;
	struct train_spec s;
	char want[160];
	int st[2] = {-1, -1};

	REQUIRE(make_keys(), "no keys");
	REQUIRE(relay_job(&cl, &rl, (struct relay_cfg){RELAY_CUT, 0}, "cutjob", &s, st), "no job");
	snprintf(want, sizeof(want),
		 "job cutjob: lost the rendezvous at %s (the connection ended without TLS "
		 "close_notify (cut, or truncated))",
		 rl.rdzv);
	CHECK(zd_wait_log(&cl.zd[1], want, 2000), "node 1 did not name the cut");
	snprintf(want, sizeof(want), "rendezvous %s: 127.0.0.1:", cl.rdzv);
	CHECK(zd_log_has(&cl.zd[0], want) &&
		      zd_log_has(&cl.zd[0],
				 "the connection ended without TLS close_notify (cut, or "
				 "truncated)"),
	      "node 0 did not name the cut");
	/* the job formed: it goes on without the rendezvous */
	check_trained(&s, st);
	relay_stop(&rl);
	cluster_stop(&cl, -1);
}

/* zerod ARGS... with stderr (and stdout) into DIR/out: its exit status
 * (-ETIMEDOUT if it started and served), and what it wrote in out. */
static int zerod_exit(const char *const *args, char *out, size_t outlen)
{
	const char *argv[16] = {"--socket", NULL};
	char sock[200], path[200];
	int n = 2, st, fd;
	ssize_t got;
	pid_t pid;

	snprintf(sock, sizeof(sock), "%s/z.sock", keydir);
	snprintf(path, sizeof(path), "%s/zerod.out", keydir);
	argv[1] = sock;
	for (int i = 0; args[i] && n < 15; i++)
		argv[n++] = args[i];
	argv[n] = NULL;
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
		dup2(fd, 1);
		dup2(fd, 2);
		zd_exec(getenv("ZEROD_BIN"), argv);
	}
	st = wait_child(pid, 10000);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	got = fd >= 0 ? read(fd, out, outlen - 1) : 0;
	out[got > 0 ? got : 0] = '\0';
	if (fd >= 0)
		close(fd);
	return st;
}

static void write_file(const char *path, mode_t mode, const char *text)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);

	if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text))
		abort();
	fchmod(fd, mode);
	close(fd);
}

/* zerod with key files it must refuse: it does not start and says why. */
static void t_bad_key_files(void)
{
	static const char curve_text[] = "CURVE keys are no longer used between daemons";
	char kpath[200], cpath[200], ppath[200], bad[200], z85[200], conf[200];
	struct {
		const char *what;
		const char *why;
		int exit;
		const char *args[8];
	} tries[] = {
		{"a key of mode 0644",
		 "readable by group or others (chmod 600",
		 78,
		 {"--tls-key", kpath, "--tls-cert", cpath, "--tls-peers", ppath, NULL}},
		{"a peers line that is not a fingerprint",
		 "bad.peers:2: not a SHA-256 fingerprint",
		 78,
		 {"--tls-key", kpath, "--tls-cert", cpath, "--tls-peers", bad, NULL}},
		{"--tls-key without --tls-cert",
		 "missing: --tls-cert",
		 78,
		 {"--tls-key", kpath, "--tls-peers", ppath, NULL}},
		{"a CURVE key file as --tls-key",
		 curve_text,
		 78,
		 {"--tls-key", z85, "--tls-cert", cpath, "--tls-peers", ppath, NULL}},
		{"--curve-secret-key",
		 curve_text,
		 CONFIG_EXIT_USAGE,
		 {"--curve-secret-key", kpath, NULL}},
		{"curve-peers in the config file",
		 curve_text,
		 CONFIG_EXIT_CONFIG,
		 {"-c", conf, NULL}},
	};
	char out[4096], text[256];

	REQUIRE(make_keys(), "no keys");
	snprintf(kpath, sizeof(kpath), "%s/%s.key", keydir, ids[0].name);
	snprintf(cpath, sizeof(cpath), "%s/%s.crt", keydir, ids[0].name);
	snprintf(ppath, sizeof(ppath), "%s/ab.peers", keydir);
	snprintf(bad, sizeof(bad), "%s/bad.peers", keydir);
	snprintf(text, sizeof(text), "%s\n%.20s\n", ids[1].fp, ids[1].fp);
	write_file(bad, 0644, text);
	snprintf(z85, sizeof(z85), "%s/old.key", keydir);
	write_file(z85, 0600,
		   "# zerod CURVE secret key (zerod --curve-secret-key); keep it mode 0600\n"
		   "E.7K4-YOHK5].&JQtwRnT?T.Y-]}WLed6#}168h/\n");
	snprintf(conf, sizeof(conf), "%s/zerod.conf", keydir);
	snprintf(text, sizeof(text), "# a config of CURVE's era\ncurve-peers = %s\n", ppath);
	write_file(conf, 0644, text);
	for (size_t i = 0; i < sizeof(tries) / sizeof(tries[0]); i++) {
		int st;
		chmod(kpath, i == 0 ? 0644 : 0600);
		st = zerod_exit(tries[i].args, out, sizeof(out));
		CHECK(st == tries[i].exit, "zerod with %s: exit %d, not %d", tries[i].what, st,
		      tries[i].exit);
		CHECK(has(out, tries[i].why), "zerod with %s did not say \"%s\": %s", tries[i].what,
		      tries[i].why, out);
	}
	/* and with the same files in order, it starts: the refusals above are
	 * the files', not the way it was started */
	{
		struct zd d;
		const char *const ok[] = {"--tls-key",   kpath, "--tls-cert", cpath,
					  "--tls-peers", ppath, NULL};
		CHECK(zd_start(&d, ok) == 0, "zerod with good key files did not start");
		if (d.pid > 0)
			CHECK(zd_stop(&d, 10000) == 0, "zerod with good key files: bad exit");
	}
}

/* The mesh between two real daemons through a relay (node 0 listens on P
 * and publishes the relay's R: ZEROD_TEST_MESH_RELAY, test only): one
 * tensor record (>= 1 KiB) flipped, replayed, or swapped with the next is
 * refused by the job's every rank, and the daemons then train a next job
 * through the relay forwarding only. */
static void t_mesh_relay(void)
{
	static const int key[] = {0, 1};
	static const char *const peers[] = {"ab", "ab"};
	static const struct {
		enum relay_mode mode;
		const char *job;
	} runs[] = {
		{RELAY_MESH_FLIP, "meshflip"},
		{RELAY_MESH_REPLAY, "meshreplay"},
		{RELAY_MESH_SWAP, "meshswap"},
	};
	struct cluster cl;
	char env[64];
	int P = zd_free_port(), R = zd_free_port(), r;

	REQUIRE(make_keys(), "no keys");
	snprintf(env, sizeof(env), "0:%d:%d", P, R);
	setenv("ZEROD_TEST_MESH_RELAY", env, 1);
	r = tls_cluster_start(&cl, 2, key, peers);
	unsetenv("ZEROD_TEST_MESH_RELAY");
	REQUIRE(r == 0, "cannot start 2 daemons");
	for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); i++) {
		struct relay rl;
		struct train_spec s;
		char after[32], want[128];
		int st[2] = {-1, -1};

		REQUIRE(relay_start(&rl, P, (struct relay_cfg){runs[i].mode, 0, R}, runs[i].job),
			"the mesh relay did not start");
		s = spec2(runs[i].job, cl.rdzv, cl.socks, 0);
		run2(&s, st);
		relay_stop(&rl);
		/* the job's error is the first failure of either node, in the
		 * mesh's words: the lane, the peer node and its certificate, and
		 * what happened (a record that does not open where it came; the
		 * alert or the close at the other) */
		for (int k = 0; k < 2; k++) {
			const char *m = s.results[k].msg;
			CHECK(st[k] != 0 && s.results[k].code == ZC_EINTERNAL &&
				      has(m, "start failed") && has(m, "TLS mesh: lane ") &&
				      has(m, "(certificate ") &&
				      ((has(m, "Bad message") && has(m, "does not open")) ||
				       (has(m, "Connection reset by peer") &&
					has(m, "closed the connection"))),
			      "%s rank %d: exit %d after %d iterations: %s: %s: not refused", s.job,
			      k, st[k], s.results[k].iterations,
			      zc_strerror_name(s.results[k].code), m);
			test_note("%s rank %d: %s: %s", s.job, k,
				  zc_strerror_name(s.results[k].code), m);
		}
		snprintf(want, sizeof(want), "job %s: failed: ZC_EINTERNAL: ", s.job);
		CHECK(zd_wait_log(&cl.zd[0], want, 5000) && zd_wait_log(&cl.zd[1], want, 5000),
		      "%s: a daemon did not log the job's failure", s.job);
		snprintf(after, sizeof(after), "%s-after", runs[i].job);
		REQUIRE(relay_start(&rl, P, (struct relay_cfg){RELAY_MESH_PASS, 0, R}, after),
			"the mesh relay did not start");
		s = spec2(after, cl.rdzv, cl.socks, 0);
		run2(&s, st);
		relay_stop(&rl);
		check_trained(&s, st);
	}
	cluster_stop(&cl, -1);
}

static const struct test_case cases[] = {
	{"tls_job_trains_and_hides_identities", t_job_trains_and_hides, 90000},
	{"tls_untrusted_cert_refused_job_beside_trains", t_untrusted_cert_refused, 90000},
	{"tls_psk_peer_vs_cert_peer_refused", t_psk_peer_vs_cert_peer, 60000},
	{"tls_flipped_bit_refused", t_flipped_bit, 90000},
	{"tls_forged_plaintext_fail_before_handshake", t_forged_plaintext_fail, 60000},
	{"tls_cut_at_record_boundary_named_truncation", t_cut_at_record_boundary, 60000},
	{"tls_bad_key_files_zerod_does_not_start", t_bad_key_files, 60000},
	{"tls_mesh_relay_between_daemons_flip_replay_reorder", t_mesh_relay, 90000},
};

TEST_MAIN(cases)
