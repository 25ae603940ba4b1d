/*
 * test_curve.c — CURVE on the rendezvous (daemon/net/rdzvcurve.c): key files
 * as zmq_curve_keypair's keys are written, refused with a reason when a key
 * is too short or not Z85, when the secret key file is readable by others,
 * when a peers line is bad (named by its line), when one of the two files
 * is missing; and the channel: two sides that trust each other agree and
 * exchange sealed frames; a key not trusted by either side is refused; a
 * changed, replayed or reordered frame does not open.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "common.h"
#include "net/rdzvcurve.h"
#include "net/rdzvwire.h"
#include "testlib.h"
#include "zeroclient.h"

static char dir[64];

static const char *put(const char *name, mode_t mode, const char *text)
{
	static char paths[16][128];
	static int n;
	char *path = paths[n++ % 16];
	FILE *f;

	snprintf(path, 128, "%s/%s", dir, name);
	unlink(path);
	f = fopen(path, "w");
	if (!f)
		abort();
	fputs(text, f);
	fclose(f);
	chmod(path, mode);
	return path;
}

struct pair {
	char pub[41], sec[41];
};

static void keypair(struct pair *p)
{
	if (zmq_curve_keypair(p->pub, p->sec) != 0)
		abort();
}

/* Load a secret key text (mode) and a peers text: the code and the reason. */
static int load(const char *sec_text, mode_t mode, const char *peers_text, struct rdzv_keys **ret,
		char *err, size_t len)
{
	const char *s = sec_text ? put("k.key", mode, sec_text) : "";
	const char *p = peers_text ? put("peers", 0644, peers_text) : "";

	err[0] = '\0';
	return rdzv_keys_load(s, p, ret, err, len);
}

static void t_key_files(void)
{
	struct pair a, b;
	struct rdzv_keys *k = NULL;
	char text[256], peers[256], err[300];
	int r;

	keypair(&a);
	keypair(&b);
	snprintf(text, sizeof(text), "# a comment\n\n  %s  \n", a.sec);
	snprintf(peers, sizeof(peers), "# the others\n%s\n\n%s\n", b.pub, a.pub);
	r = load(text, 0600, peers, &k, err, sizeof(err));
	REQUIRE(r == 0 && k, "good files refused: %d %s", r, err);
	CHECK(strcmp(rdzv_keys_public(k), a.pub) == 0, "public key %s, zmq says %s",
	      rdzv_keys_public(k), a.pub);
	CHECK(rdzv_keys_npeers(k) == 2, "%u peers", rdzv_keys_npeers(k));
	rdzv_keys_free(k);

	/* neither file: no CURVE, no error */
	k = (struct rdzv_keys *)1;
	CHECK(rdzv_keys_load("", "", &k, err, sizeof(err)) == 0 && !k, "no files: not plain");

	/* one without the other */
	r = load(text, 0600, NULL, &k, err, sizeof(err));
	CHECK(r == -EINVAL && strstr(err, "without --curve-peers"), "no peers: %d %s", r, err);
	r = load(NULL, 0600, peers, &k, err, sizeof(err));
	CHECK(r == -EINVAL && strstr(err, "without --curve-secret-key"), "no secret: %d %s", r,
	      err);

	/* the secret key readable by others */
	r = load(text, 0644, peers, &k, err, sizeof(err));
	CHECK(r == -EPERM && strstr(err, "mode 0644") && strstr(err, "chmod 600"),
	      "mode 0644: %d %s", r, err);
	r = load(text, 0640, peers, &k, err, sizeof(err));
	CHECK(r == -EPERM && strstr(err, "mode 0640"), "mode 0640: %d %s", r, err);

	/* too short, too long, not Z85 */
	snprintf(text, sizeof(text), "%.39s\n", a.sec);
	r = load(text, 0600, peers, &k, err, sizeof(err));
	CHECK(r == -EINVAL && strstr(err, "k.key:1: not a CURVE secret key"), "39 chars: %d %s", r,
	      err);
	snprintf(text, sizeof(text), "%sA\n", a.sec);
	r = load(text, 0600, peers, &k, err, sizeof(err));
	CHECK(r == -EINVAL && strstr(err, "not a CURVE secret key"), "41 chars: %d %s", r, err);
	snprintf(text, sizeof(text), "%s\n", a.sec);
	text[7] = '~'; /* not in Z85's alphabet */
	r = load(text, 0600, peers, &k, err, sizeof(err));
	CHECK(r == -EINVAL && strstr(err, "not a CURVE secret key"), "bad Z85: %d %s", r, err);
	r = load("\n# nothing\n", 0600, peers, &k, err, sizeof(err));
	CHECK(r == -EINVAL && strstr(err, "no CURVE secret key"), "empty: %d %s", r, err);

	/* a bad peers line is named by its number */
	snprintf(text, sizeof(text), "%s\n", a.sec);
	snprintf(peers, sizeof(peers), "%s\n# ok\n%.30s\n", b.pub, a.pub);
	r = load(text, 0600, peers, &k, err, sizeof(err));
	CHECK(r == -EINVAL && strstr(err, "peers:3: not a CURVE public key"), "bad peer: %d %s", r,
	      err);
	snprintf(peers, sizeof(peers), "%s,\n", b.pub);
	r = load(text, 0600, peers, &k, err, sizeof(err));
	CHECK(r == -EINVAL && strstr(err, "peers:1:"), "peer with a comma: %d %s", r, err);

	/* missing files name themselves */
	r = rdzv_keys_load("/nonexistent/k.key", put("peers", 0644, "\n"), &k, err, sizeof(err));
	CHECK(r == -ENOENT && strstr(err, "/nonexistent/k.key"), "missing: %d %s", r, err);
}

/* Keys of a side: its pair, trusting the public keys given. */
static struct rdzv_keys *side(const struct pair *p, const char *trust)
{
	struct rdzv_keys *k = NULL;
	char text[64], err[300];

	snprintf(text, sizeof(text), "%s\n", p->sec);
	if (load(text, 0600, trust, &k, err, sizeof(err)) != 0)
		abort();
	return k;
}

/* A sealed frame's body (the frame decoded again, as the peer reads it). */
static Zerod__V1__RdzvEnvelope *seal(struct rdzv_sec *s, const char *job)
{
	Zerod__V1__RdzvEnvelope env = ZEROD__V1__RDZV_ENVELOPE__INIT, *out;
	Zerod__V1__StoreGet g = ZEROD__V1__STORE_GET__INIT;
	uint8_t *buf;
	size_t len;

	g.key = (char *)job;
	env.body_case = ZEROD__V1__RDZV_ENVELOPE__BODY_STORE_GET;
	env.store_get = &g;
	if (rdzv_sec_encode(s, &env, &buf, &len) != 0)
		abort();
	if (memmem(buf, len, job, strlen(job)))
		abort(); /* the key in the clear */
	out = rdzv_msg_decode(buf + 4, len - 4);
	free(buf);
	if (!out || out->body_case != ZEROD__V1__RDZV_ENVELOPE__BODY_SEALED)
		abort();
	return out;
}

/* Run the handshake between client keys kc and server keys ks: 0, or the
 * code of the side that refused (why in err). */
static int handshake(struct rdzv_keys *kc, struct rdzv_keys *ks, struct rdzv_sec **ret_c,
		     struct rdzv_sec **ret_s, char *err, size_t len)
{
	Zerod__V1__RdzvCurve hello, reply;
	Zerod__V1__RdzvCurveAuth auth;
	int r;

	if (rdzv_sec_new(kc, false, ret_c) != 0 || rdzv_sec_new(ks, true, ret_s) != 0)
		abort();
	rdzv_sec_hello(*ret_c, &hello);
	r = rdzv_sec_on_hello(*ret_s, &hello, &reply, err, len);
	if (r)
		return r;
	r = rdzv_sec_on_reply(*ret_c, &reply, &auth, err, len);
	if (r)
		return r;
	rdzv_sec_start(*ret_c);
	return rdzv_sec_on_auth(*ret_s, &auth, err, len);
}

static void t_channel(void)
{
	struct pair a, b, x;
	char trust[200], err[300];
	struct rdzv_keys *ka, *kb, *kx, *kb_only;
	struct rdzv_sec *c = NULL, *s = NULL;
	Zerod__V1__RdzvEnvelope *f1, *f2, *f3, *in;
	int r;

	keypair(&a);
	keypair(&b);
	keypair(&x);
	snprintf(trust, sizeof(trust), "%s\n%s\n", a.pub, b.pub);
	ka = side(&a, trust);
	kb = side(&b, trust);
	snprintf(trust, sizeof(trust), "%s\n", a.pub);
	kx = side(&x, trust);     /* trusts a; nobody trusts it */
	kb_only = side(&b, "\n"); /* trusts nobody but itself */

	r = handshake(ka, kb, &c, &s, err, sizeof(err));
	REQUIRE(r == 0 && rdzv_sec_ready(c) && rdzv_sec_ready(s), "handshake: %d %s", r, err);
	CHECK(strcmp(rdzv_sec_peer(s), a.pub) == 0 && strcmp(rdzv_sec_peer(c), b.pub) == 0,
	      "peers %s %s", rdzv_sec_peer(s), rdzv_sec_peer(c));
	/* both ways, in order */
	f1 = seal(c, "job-a/1");
	f2 = seal(c, "job-a/2");
	f3 = seal(c, "job-a/3");
	CHECK(rdzv_sec_open(s, &f1->sealed, &in) == 0 && strcmp(in->store_get->key, "job-a/1") == 0,
	      "frame 1 did not open");
	rdzv_msg_free(in);
	/* replayed: frame 1 again */
	CHECK(rdzv_sec_open(s, &f1->sealed, &in) == -EBADMSG, "a replayed frame opened");
	rdzv_msg_free(f1);
	rdzv_msg_free(f2);
	rdzv_msg_free(f3);
	rdzv_sec_free(c);
	rdzv_sec_free(s);

	/* reordered: frame 2 before frame 1 */
	REQUIRE(handshake(ka, kb, &c, &s, err, sizeof(err)) == 0, "handshake 2: %s", err);
	f1 = seal(c, "job-b/1");
	f2 = seal(c, "job-b/2");
	CHECK(rdzv_sec_open(s, &f2->sealed, &in) == -EBADMSG, "a reordered frame opened");
	rdzv_msg_free(f1);
	rdzv_msg_free(f2);
	/* the server's way too, and a changed byte */
	f1 = seal(s, "job-b/s1");
	f1->sealed.data[f1->sealed.len / 2] ^= 1;
	CHECK(rdzv_sec_open(c, &f1->sealed, &in) == -EBADMSG, "a changed frame opened");
	rdzv_msg_free(f1);
	rdzv_sec_free(c);
	rdzv_sec_free(s);

	/* the server does not trust the client's key */
	r = handshake(kx, kb, &c, &s, err, sizeof(err));
	CHECK(r == ZC_ECONNECT && strstr(err, x.pub) && strstr(err, "not among the authorized"),
	      "untrusted client: %d %s", r, err);
	rdzv_sec_free(c);
	rdzv_sec_free(s);
	/* the client does not trust the server's key */
	snprintf(trust, sizeof(trust), "%s\n", x.pub);
	struct rdzv_keys *kb_x = side(&b, trust); /* b trusts x, x does not trust b */
	r = handshake(kx, kb_x, &c, &s, err, sizeof(err));
	CHECK(r == ZC_ECONNECT && strstr(err, b.pub) && strstr(err, "this node's authorized"),
	      "untrusted server: %d %s", r, err);
	rdzv_sec_free(c);
	rdzv_sec_free(s);
	/* a server that shows a key it does not hold: the proof fails */
	{
		Zerod__V1__RdzvCurve hello, reply;
		Zerod__V1__RdzvCurveAuth auth;
		REQUIRE(rdzv_sec_new(ka, false, &c) == 0 && rdzv_sec_new(kb_only, true, &s) == 0,
			"rdzv_sec_new");
		rdzv_sec_hello(c, &hello);
		/* kb_only does not trust a: refused by the server */
		r = rdzv_sec_on_hello(s, &hello, &reply, err, sizeof(err));
		CHECK(r == ZC_ECONNECT, "kb_only took a: %d", r);
		rdzv_sec_free(s);
		REQUIRE(rdzv_sec_new(kb, true, &s) == 0, "rdzv_sec_new");
		REQUIRE(rdzv_sec_on_hello(s, &hello, &reply, err, sizeof(err)) == 0, "%s", err);
		reply.proof.data[0] ^= 1;
		r = rdzv_sec_on_reply(c, &reply, &auth, err, sizeof(err));
		CHECK(r == ZC_ECONNECT && strstr(err, "did not prove"), "bad proof: %d %s", r, err);
		rdzv_sec_free(c);
		rdzv_sec_free(s);
	}
	rdzv_keys_free(ka);
	rdzv_keys_free(kb);
	rdzv_keys_free(kx);
	rdzv_keys_free(kb_only);
	rdzv_keys_free(kb_x);
}

static void setup(void)
{
	snprintf(dir, sizeof(dir), "/tmp/zerod-curve-XXXXXX");
	if (!mkdtemp(dir))
		abort();
}

static void cleanup(void)
{
	char path[128];

	snprintf(path, sizeof(path), "%s/k.key", dir);
	unlink(path);
	snprintf(path, sizeof(path), "%s/peers", dir);
	unlink(path);
	rmdir(dir);
}

static void t_key_files_case(void)
{
	setup();
	t_key_files();
	cleanup();
}

static void t_channel_case(void)
{
	setup();
	t_channel();
	cleanup();
}

static const struct test_case cases[] = {
	{"key_files_refused_with_reasons", t_key_files_case, 10000},
	{"channel_seals_and_refuses", t_channel_case, 10000},
};

TEST_MAIN(cases)
