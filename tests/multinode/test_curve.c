/*
 * test_curve.c — CURVE on the rendezvous between daemons (issue 11 §5):
 * real zerods on loopback with keys made by `zeroctl keygen`, real trainers,
 * and a TCP relay between node 1 and the rendezvous that records every byte
 * and can change one.
 *
 *  - a job over two daemons with CURVE trains to the reference (SGD bit for
 *    bit), its tensors over the sealed mesh (coll/sealmesh.c; each daemon
 *    says so), as the same job does without, over gloo; through the relay,
 *    the job id and its store keys are on the wire without CURVE (so the
 *    check can fail) and nowhere with it;
 *  - a daemon whose key the rendezvous does not trust is refused: its job
 *    fails with ZC_ECONNECT naming the key, node 0 logs why; a rendezvous whose
 *    key the joining node does not trust is left, named the same way; a
 *    CURVE job beside them over two trusted daemons trains to the reference;
 *  - a plain daemon against a CURVE rendezvous, and a CURVE daemon against a
 *    plain one: each refused with ZC_ECONNECT saying which side lacks CURVE;
 *  - one flipped bit in a sealed frame (node 1's Join) through the relay:
 *    node 0 logs the frame that fails to open and refuses node 1, whose
 *    ranks get ZC_ECONNECT naming it; one flipped in the host's sealed
 *    Welcome: node 1 logs it, connects again and the job trains;
 *  - a secret key file readable by others, a bad line in the peers file, a
 *    secret key without peers: zerod does not start (exit 78), and says why.
 */
#include <arpa/inet.h>
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

#include "cluster.h"
#include "harness.h"
#include "testlib.h"
#include "trainer.h"

#define STALL_MS 4000
#define JOIN_MS  3000
#define HELLO_MS 2000

static char keydir[160];

/* ------------------------------------------------------------ keys --- */

/* `zeroctl keygen DIR/NAME`; its public key (the line it prints) in pub. */
static int keygen(const char *name, char pub[64])
{
	const char *bin = getenv("ZEROCTL_BIN");
	char prefix[200];
	int pfd[2], st;
	ssize_t n;
	pid_t pid;

	if (!bin || pipe(pfd) < 0)
		return -1;
	snprintf(prefix, sizeof(prefix), "%s/%s", keydir, name);
	pid = fork();
	if (pid == 0) {
		dup2(pfd[1], 1);
		execl(bin, bin, "keygen", prefix, (char *)NULL);
		_exit(127);
	}
	close(pfd[1]);
	n = read(pfd[0], pub, 63);
	close(pfd[0]);
	st = wait_child(pid, 10000);
	if (st != 0 || n != 41)
		return -1;
	pub[40] = '\0';
	return 0;
}

/* A peers file DIR/NAME of the keys given. */
static void peers_file(const char *name, const char *const *keys, int n)
{
	char path[200];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", keydir, name);
	f = fopen(path, "w");
	if (!f)
		abort();
	fprintf(f, "# the zerods this one trusts\n");
	for (int i = 0; i < n; i++)
		fprintf(f, "%s\n", keys[i]);
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

/* --------------------------------------------------------- daemons --- */

/* Start n daemons; daemon k with CURVE when key[k] names a key pair made
 * by keygen() (with peers file peers[k]), plain when it is NULL. */
static int curve_cluster_start(struct cluster *cl, uint32_t n, const char *const *key,
			       const char *const *peers)
{
	char kpath[CLUSTER_MAXN][200], ppath[CLUSTER_MAXN][200];
	const char *kp[CLUSTER_MAXN] = {NULL}, *pp[CLUSTER_MAXN] = {NULL};
	const struct cluster_opts o = {
		.stall_ms = STALL_MS,
		.join_ms = JOIN_MS,
		.hello_ms = HELLO_MS,
		.curve_key = kp,
		.curve_peers = pp,
	};

	for (uint32_t k = 0; key && k < n; k++)
		if (key[k]) {
			snprintf(kpath[k], sizeof(kpath[k]), "%s/%s.key", keydir, key[k]);
			snprintf(ppath[k], sizeof(ppath[k]), "%s/%s", keydir, peers[k]);
			kp[k] = kpath[k];
			pp[k] = ppath[k];
		}
	return cluster_start(cl, n, &o);
}

static int rank_main(void *arg, int idx)
{
	return train_rank(arg, (uint32_t)idx);
}

/* A 2-rank SGD job, rank r on node r, the rendezvous at rdzv. */
static struct train_spec spec2(const char *job, const char *rdzv, const char *const *socks)
{
	static const uint32_t node_of[] = {0, 1};
	struct train_spec s = cluster_spec(job, 2, 2, rdzv, socks, node_of);

	s.seed = 11;
	return s;
}

static void run2(struct train_spec *s, int *st)
{
	pid_t pids[2];

	for (int r = 0; r < 2; r++)
		pids[r] = spawn(rank_main, s, r);
	for (int r = 0; r < 2; r++)
		st[r] = wait_child(pids[r], 60000);
}

static bool has(const char *msg, const char *needle)
{
	return strstr(msg, needle) != NULL;
}

/* Job `job` on daemon d was refused at the rendezvous with ZC_ECONNECT
 * saying `why`: in its log, and to its rank res, with that code and reason
 * whichever way the rank hears it (its buffer offer refused while its
 * session lasts or after it ended, fastpath.c's retired tokens). */
static bool refused(const struct zd *d, const struct train_result *res, const char *job,
		    const char *why)
{
	char want[96];

	snprintf(want, sizeof(want), "job %s: failed: ZC_ECONNECT: ", job);
	if (!zd_wait_log(d, want, 2000) || !zd_log_has(d, why))
		return false;
	return res->code == ZC_ECONNECT && has(res->msg, why);
}

/* ----------------------------------------------------------- relay --- */

/* A TCP relay from port `from` to `to` on loopback, until killed: every
 * byte both ways is appended to rec_fd; with flip > 0, the last byte of
 * the flip-th frame (4-byte length, then the body) a client sends on one
 * connection is changed, once; with flip < 0, of the -flip-th frame the
 * server sends. */
struct frames {
	uint8_t hdr[4];
	int have, frames;
	uint32_t left;
};

static void relay_main(int from, int to, int ready_fd, int rec_fd, int flip)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	struct pollfd p[1 + 2 * 16];
	struct frames fr[32]; /* [i]: what p[1 + i] reads (even: client, odd: server) */
	int lfd = socket(AF_INET, SOCK_STREAM, 0), one = 1, n = 0;
	bool flipped = false;

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
		if ((p[0].revents & POLLIN) && n < 32) {
			int a = accept(lfd, NULL, NULL), b = socket(AF_INET, SOCK_STREAM, 0);
			sa.sin_port = htons((uint16_t)to);
			if (a >= 0 && b >= 0 &&
			    connect(b, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
				memset(&fr[n], 0, 2 * sizeof(fr[0]));
				p[1 + n++] = (struct pollfd){.fd = a, .events = POLLIN};
				p[1 + n++] = (struct pollfd){.fd = b, .events = POLLIN};
			} else {
				close(a);
				close(b);
			}
		}
		for (int i = 0; i < n; i++) {
			uint8_t buf[65536];
			ssize_t got;
			if (p[1 + i].fd < 0 || !(p[1 + i].revents & (POLLIN | POLLHUP | POLLERR)))
				continue;
			got = read(p[1 + i].fd, buf, sizeof(buf));
			int peer = p[1 + (i ^ 1)].fd;
			if (got > 0)
				(void)!write(rec_fd, buf, (size_t)got);
			for (ssize_t k = 0;
			     got > 0 && flip && (flip > 0) == (i % 2 == 0) && k < got; k++) {
				struct frames *u = &fr[i];
				if (u->left == 0) {
					u->hdr[u->have++] = buf[k];
					if (u->have == 4) {
						u->left = (uint32_t)u->hdr[0] << 24 |
							  (uint32_t)u->hdr[1] << 16 |
							  (uint32_t)u->hdr[2] << 8 | u->hdr[3];
						u->have = 0;
						u->frames++;
					}
					continue;
				}
				if (--u->left == 0 && u->frames == abs(flip) && !flipped) {
					buf[k] ^= 0x01;
					flipped = true;
				}
			}
			if (got <= 0 || peer < 0 || write(peer, buf, (size_t)got) != got) {
				close(p[1 + i].fd);
				if (peer >= 0)
					close(peer);
				p[1 + i].fd = p[1 + (i ^ 1)].fd = -1;
			}
		}
	}
}

struct relay {
	pid_t pid;
	int port;
	char rdzv[32];
	char rec[200];
};

static bool relay_start(struct relay *r, int to, int flip, const char *name)
{
	int pfd[2], rec;
	bool ok;

	r->port = zd_free_port();
	snprintf(r->rdzv, sizeof(r->rdzv), "127.0.0.1:%d", r->port);
	snprintf(r->rec, sizeof(r->rec), "%s/%s.rec", keydir, name);
	rec = open(r->rec, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
	if (rec < 0 || pipe(pfd) < 0)
		return false;
	fflush(stdout);
	r->pid = fork();
	if (r->pid == 0)
		relay_main(r->port, to, pfd[1], rec, flip);
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

/* How often needle is in what the relay carried; its size in *ret_bytes. */
static int recorded(const struct relay *r, const char *needle, size_t *ret_bytes)
{
	static char buf[4 << 20];
	int fd = open(r->rec, O_RDONLY | O_CLOEXEC), count = 0;
	ssize_t n = fd >= 0 ? read(fd, buf, sizeof(buf)) : -1;
	size_t len = strlen(needle);

	if (fd >= 0)
		close(fd);
	*ret_bytes = n > 0 ? (size_t)n : 0;
	for (char *p = buf; n > 0 && (p = memmem(p, (size_t)(buf + n - p), needle, len)); p++)
		count++;
	return count;
}

/* ----------------------------------------------------------- cases --- */

static char pub[CLUSTER_MAXN + 1][64];

/* Keys for daemons a, b, c; a and b trust each other (files "ab"), c trusts
 * a and b but neither trusts c. */
static bool make_keys(void)
{
	const char *ab[2];

	snprintf(keydir, sizeof(keydir), "%s/zerod-curve-XXXXXX", test_tmpdir());
	if (!mkdtemp(keydir)) {
		CHECK(0, "mkdtemp: %s", strerror(errno));
		return false;
	}
	atexit(rm_keydir);
	if (keygen("a", pub[0]) < 0 || keygen("b", pub[1]) < 0 || keygen("c", pub[2]) < 0) {
		CHECK(0, "zeroctl keygen failed (ZEROCTL_BIN=%s)", getenv("ZEROCTL_BIN"));
		return false;
	}
	ab[0] = pub[0];
	ab[1] = pub[1];
	peers_file("ab", ab, 2);
	peers_file("c", ab, 2);
	return true;
}

/* One job through the relay, node 1 reaching the rendezvous by it: trains
 * to the reference; how often the job id is on the wire. */
static int job_through_relay(const char *const *key, const char *const *peers, const char *job,
			     size_t *ret_bytes)
{
	struct cluster cl;
	struct relay rl;
	struct train_spec s;
	const char *rdzvs[2];
	int st[2], seen;

	if (curve_cluster_start(&cl, 2, key, peers) < 0 || !relay_start(&rl, cl.port, 0, job)) {
		CHECK(0, "cannot start 2 daemons and the relay");
		return -1;
	}
	rdzvs[0] = cl.rdzv;
	rdzvs[1] = rl.rdzv;
	s = spec2(job, cl.rdzv, cl.socks);
	s.rdzvs = rdzvs;
	run2(&s, st);
	for (int r = 0; r < 2; r++)
		CHECK(st[r] == 0 && s.results[r].iterations == s.iters,
		      "%s rank %d: exit %d after %d iterations: %s: %s", job, r, st[r],
		      s.results[r].iterations, zc_strerror_name(s.results[r].code),
		      s.results[r].msg);
	if (key)
		CHECK(zd_log_has(&cl.zd[0], "CURVE on") && zd_log_has(&cl.zd[1], "CURVE on"),
		      "a daemon does not say CURVE is on");
	/* the tensors: the sealed mesh with keys (test-sealmesh shows what
	 * is on its wire), gloo without */
	for (int k = 0; k < 2; k++)
		CHECK(zd_log_has(&cl.zd[k], key ? "tensors between nodes sealed (CURVE)"
						: "tensors between nodes over gloo (not encrypted)"),
		      "daemon %d does not say its tensors went %s", k,
		      key ? "over the sealed mesh" : "over gloo");
	relay_stop(&rl);
	seen = recorded(&rl, job, ret_bytes);
	cluster_stop(&cl, -1);
	return seen;
}

static void t_curve_trains_and_hides(void)
{
	static const char *const key[] = {"a", "b"}, *const peers[] = {"ab", "ab"};
	size_t plain_bytes = 0, curve_bytes = 0;
	int plain, curve;

	REQUIRE(make_keys(), "no keys");
	/* without CURVE the Hello, the Join and the store keys carry the job
	 * id in the clear: the check below can fail */
	plain = job_through_relay(NULL, NULL, "curvejob-plain", &plain_bytes);
	CHECK(plain >= 2, "without CURVE the job id is on the wire %d times (%zu bytes)", plain,
	      plain_bytes);
	curve = job_through_relay(key, peers, "curvejob-sealed", &curve_bytes);
	CHECK(curve_bytes > 1000 && curve == 0,
	      "with CURVE the job id is on the wire %d times (%zu bytes carried)", curve,
	      curve_bytes);
	test_note("the relay carried %zu bytes without CURVE, %zu with", plain_bytes, curve_bytes);
}

static void t_untrusted_key_refused(void)
{
	/* daemon 0 (a) and 1 (b) trust each other; daemon 2 (c) trusts them,
	 * nobody trusts c */
	static const char *const key[] = {"a", "b", "c"}, *const peers[] = {"ab", "ab", "c"};
	struct cluster cl;
	struct train_spec bad, good, rev;
	const char *bad_socks[2], *good_socks[2], *rev_socks[2];
	char good_rdzv[32], rev_rdzv[32], why[200];
	pid_t pids[2], bad_pids[2], rev_pids[2];
	int st[2];

	REQUIRE(make_keys(), "no keys");
	REQUIRE(curve_cluster_start(&cl, 3, key, peers) == 0, "cannot start 3 daemons");
	/* the job beside it: daemons 0 and 1, its own rendezvous port */
	snprintf(good_rdzv, sizeof(good_rdzv), "127.0.0.1:%d", zd_free_port());
	good_socks[0] = cl.socks[0];
	good_socks[1] = cl.socks[1];
	good = spec2("trusted", good_rdzv, good_socks);
	good.iters = 8;
	good.sleep_us = 100000;
	for (int r = 0; r < 2; r++)
		pids[r] = spawn(rank_main, &good, r);
	/* daemon 2 as node 1 of a job whose rendezvous daemon 0 serves */
	bad_socks[0] = cl.socks[0];
	bad_socks[1] = cl.socks[2];
	bad = spec2("untrusted", cl.rdzv, bad_socks);
	/* daemon 0 as node 1 of a job whose rendezvous daemon 2 serves: c
	 * trusts a, a does not trust c */
	snprintf(rev_rdzv, sizeof(rev_rdzv), "127.0.0.1:%d", zd_free_port());
	rev_socks[0] = cl.socks[2];
	rev_socks[1] = cl.socks[0];
	rev = spec2("untrustedhost", rev_rdzv, rev_socks);
	for (int r = 0; r < 2; r++) {
		bad_pids[r] = spawn(rank_main, &bad, r);
		rev_pids[r] = spawn(rank_main, &rev, r);
	}
	for (int r = 0; r < 2; r++) {
		wait_child(bad_pids[r], 30000);
		wait_child(rev_pids[r], 30000);
	}
	snprintf(why, sizeof(why),
		 "it presented CURVE key %s, which is not among this node's "
		 "authorized keys",
		 pub[2]);
	CHECK(refused(&cl.zd[0], &rev.results[1], "untrustedhost", why),
	      "node 1 of the job with an untrusted rendezvous: %s: %s",
	      zc_strerror_name(rev.results[1].code), rev.results[1].msg);
	snprintf(why, sizeof(why), "CURVE key %s is not among the authorized keys", pub[2]);
	CHECK(refused(&cl.zd[2], &bad.results[1], "untrusted", why),
	      "node 1 of the refused job: %s: %s", zc_strerror_name(bad.results[1].code),
	      bad.results[1].msg);
	CHECK(bad.results[0].code != 0, "node 0 of the refused job trained");
	CHECK(zd_wait_log(&cl.zd[0], why, 2000), "daemon 0 did not log why it refused c");
	CHECK(zd_log_has(&cl.zd[0], "refused 127.0.0.1:"), "no peer address logged");
	for (int r = 0; r < 2; r++)
		st[r] = wait_child(pids[r], 60000);
	for (int r = 0; r < 2; r++)
		CHECK(st[r] == 0 && good.results[r].iterations == good.iters,
		      "the trusted job's rank %d: exit %d after %d iterations: %s", r, st[r],
		      good.results[r].iterations, good.results[r].msg);
	cluster_stop(&cl, -1);
}

static void t_plain_peer_refused(void)
{
	/* daemon 0 with CURVE, daemon 1 without */
	static const char *const key[] = {"a", NULL}, *const peers[] = {"ab", NULL};
	struct cluster cl;
	struct train_spec s, t;
	const char *swapped[2];
	char rdzv2[32];
	int st[2];

	REQUIRE(make_keys(), "no keys");
	REQUIRE(curve_cluster_start(&cl, 2, key, peers) == 0, "cannot start 2 daemons");
	/* a plain node against the CURVE rendezvous */
	s = spec2("plainnode", cl.rdzv, cl.socks);
	run2(&s, st);
	CHECK(refused(&cl.zd[1], &s.results[1], "plainnode", "it requires CURVE"),
	      "the plain node: %s: %s", zc_strerror_name(s.results[1].code), s.results[1].msg);
	CHECK(zd_wait_log(&cl.zd[0], "a plain Hello, and this zerod requires CURVE", 2000),
	      "daemon 0 did not log the plain Hello");
	/* a CURVE node against a plain rendezvous (daemon 1 serves it) */
	snprintf(rdzv2, sizeof(rdzv2), "127.0.0.1:%d", zd_free_port());
	swapped[0] = cl.socks[1];
	swapped[1] = cl.socks[0];
	t = spec2("curvenode", rdzv2, swapped);
	run2(&t, st);
	CHECK(refused(&cl.zd[0], &t.results[1], "curvenode", "it has no CURVE keys configured"),
	      "the CURVE node: %s: %s", zc_strerror_name(t.results[1].code), t.results[1].msg);
	CHECK(zd_wait_log(&cl.zd[1], "it speaks CURVE, and this zerod has no CURVE keys", 2000),
	      "daemon 1 did not log the Curve");
	cluster_stop(&cl, -1);
}

static void t_flipped_bit_refused(void)
{
	static const char *const key[] = {"a", "b"}, *const peers[] = {"ab", "ab"};
	struct cluster cl;
	struct relay rl;
	struct train_spec s;
	const char *rdzvs[2];
	int st[2];

	REQUIRE(make_keys(), "no keys");
	REQUIRE(curve_cluster_start(&cl, 2, key, peers) == 0, "cannot start 2 daemons");
	/* node 1's frames: Curve, CurveAuth, then sealed: Hello, Auth, Join */
	REQUIRE(relay_start(&rl, cl.port, 5, "flip"), "the relay did not start");
	rdzvs[0] = cl.rdzv;
	rdzvs[1] = rl.rdzv;
	s = spec2("flipped", cl.rdzv, cl.socks);
	s.rdzvs = rdzvs;
	run2(&s, st);
	CHECK(s.results[1].code == ZC_ECONNECT && has(s.results[1].msg, "fails to open"),
	      "node 1: %s: %s", zc_strerror_name(s.results[1].code), s.results[1].msg);
	CHECK(s.results[0].code != 0 && s.results[0].iterations == 0, "node 0 trained: %s",
	      s.results[0].msg);
	CHECK(zd_wait_log(&cl.zd[0], "a sealed frame that fails to open", 2000),
	      "daemon 0 did not log the changed frame");
	relay_stop(&rl);
	cluster_stop(&cl, -1);
}

/* zerod with key files it must refuse: it does not start and says why. */
static void t_bad_key_files(void)
{
	char kpath[200], ppath[200], bad[200];
	struct {
		const char *why;
		const char *args[6];
	} tries[] = {
		{"mode 0644: a secret key must not be readable by group or others",
		 {"--curve-secret-key", kpath, "--curve-peers", ppath, NULL}},
		{"bad:2: not a CURVE public key",
		 {"--curve-secret-key", kpath, "--curve-peers", bad, NULL}},
		{"--curve-secret-key without --curve-peers: CURVE needs both",
		 {"--curve-secret-key", kpath, NULL}},
	};
	const char *lines[] = {"# a short one", "abc"};
	FILE *f;

	REQUIRE(make_keys(), "no keys");
	snprintf(kpath, sizeof(kpath), "%s/a.key", keydir);
	snprintf(ppath, sizeof(ppath), "%s/ab", keydir);
	snprintf(bad, sizeof(bad), "%s/bad", keydir);
	f = fopen(bad, "w");
	REQUIRE(f, "fopen");
	fprintf(f, "%s\n%s\n", lines[0], lines[1]);
	fclose(f);
	for (size_t i = 0; i < sizeof(tries) / sizeof(tries[0]); i++) {
		struct zd d;
		int r;
		chmod(kpath, i == 0 ? 0644 : 0600);
		r = zd_start(&d, tries[i].args);
		CHECK(r < 0, "zerod started with %s", tries[i].why);
		CHECK(zd_log_has(&d, tries[i].why), "zerod did not say \"%s\"", tries[i].why);
		if (r >= 0)
			zd_stop(&d, 10000);
		else if (test_failed_)
			zd_dump_log(&d);
	}
	/* exit 78, as for any config zerod refuses: systemd does not restart it */
	{
		char sock[200];
		pid_t pid;
		int st;
		snprintf(sock, sizeof(sock), "%s/z.sock", keydir);
		fflush(stdout);
		pid = fork();
		if (pid == 0) {
			int fd = open("/dev/null", O_WRONLY);
			dup2(fd, 2);
			execl(getenv("ZEROD_BIN"), "zerod", "--socket", sock, "--curve-secret-key",
			      kpath, (char *)NULL);
			_exit(127);
		}
		st = wait_child(pid, 10000);
		CHECK(st == 78, "zerod with a secret key and no peers exited with %d, not 78", st);
	}
}

/* One bit flipped in the host's sealed Welcome: node 1 logs the frame that
 * fails to open, drops the connection, connects again (the relay flips
 * once), and the job trains to the reference. */
static void t_flipped_bit_from_host(void)
{
	static const char *const key[] = {"a", "b"}, *const peers[] = {"ab", "ab"};
	struct cluster cl;
	struct relay rl;
	struct train_spec s;
	const char *rdzvs[2];
	char want[96];
	int st[2];

	REQUIRE(make_keys(), "no keys");
	REQUIRE(curve_cluster_start(&cl, 2, key, peers) == 0, "cannot start 2 daemons");
	/* the host's frames: Curve, then sealed: Challenge, Welcome */
	REQUIRE(relay_start(&rl, cl.port, -3, "flipdown"), "the relay did not start");
	rdzvs[0] = cl.rdzv;
	rdzvs[1] = rl.rdzv;
	s = spec2("flippeddown", cl.rdzv, cl.socks);
	s.rdzvs = rdzvs;
	run2(&s, st);
	for (int r = 0; r < 2; r++)
		CHECK(st[r] == 0 && s.results[r].iterations == s.iters,
		      "rank %d: exit %d after %d iterations: %s: %s", r, st[r],
		      s.results[r].iterations, zc_strerror_name(s.results[r].code),
		      s.results[r].msg);
	snprintf(want, sizeof(want), "rendezvous %s: a sealed frame that fails to open", rl.rdzv);
	CHECK(zd_wait_log(&cl.zd[1], want, 2000), "node 1 did not log the changed frame");
	relay_stop(&rl);
	cluster_stop(&cl, -1);
}

static const struct test_case cases[] = {
	{"curve_job_trains_like_plain_and_hides_the_job", t_curve_trains_and_hides, 90000},
	{"curve_untrusted_key_refused_job_beside_trains", t_untrusted_key_refused, 90000},
	{"curve_plain_peer_refused_both_ways", t_plain_peer_refused, 60000},
	{"curve_flipped_bit_in_sealed_frame_refused", t_flipped_bit_refused, 60000},
	{"curve_flipped_bit_from_host_logged_node_joins_again", t_flipped_bit_from_host, 60000},
	{"curve_bad_key_files_zerod_does_not_start", t_bad_key_files, 60000},
};

TEST_MAIN(cases)
