/*
 * fuzz_rdzv.c — libFuzzer target: bytes as what a peer daemon (or anyone who
 * reaches the port) sends to a rendezvous. They go down a socketpair and are
 * read with rdzv_recv_blocking(), the framing and decoding the rendezvous
 * server and its clients use: a 4-byte length, then one RdzvEnvelope, at
 * most RDZV_FUZZ_MAX bytes. Frames are read until the bytes run out; each
 * must end in a message or a clean error, and a decoded message must encode
 * again. CURVE's messages (rdzvcurve.h) go on into a channel as a host
 * meets them: a Curve to a host's fresh channel, a CurveAuth to one that
 * answered a real client, a sealed body to one whose handshake is done
 * (none of them may open: the fuzzer does not hold the keys).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "common.h"
#include "net/rdzvcurve.h"
#include "net/rdzvwire.h"

#define RDZV_FUZZ_MAX (1u << 20)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct rdzv_keys *keys;

/* One key pair that trusts itself, from files as zerod reads them. */
static struct rdzv_keys *load_keys(void)
{
	char dir[] = "/tmp/fuzz-rdzv-XXXXXX", sec[64], pub[64], err[300];
	char pub_z85[41], sec_z85[41];
	struct rdzv_keys *k = NULL;
	FILE *f;

	if (!mkdtemp(dir) || zmq_curve_keypair(pub_z85, sec_z85) != 0)
		abort();
	snprintf(sec, sizeof(sec), "%s/k.key", dir);
	snprintf(pub, sizeof(pub), "%s/peers", dir);
	f = fopen(sec, "w");
	if (!f || fprintf(f, "%s\n", sec_z85) < 0 || fclose(f) != 0 || chmod(sec, 0600) != 0)
		abort();
	f = fopen(pub, "w");
	if (!f || fprintf(f, "%s\n", pub_z85) < 0 || fclose(f) != 0)
		abort();
	if (rdzv_keys_load(sec, pub, &k, err, sizeof(err)) != 0) {
		fprintf(stderr, "fuzz_rdzv: %s\n", err);
		abort();
	}
	unlink(sec);
	unlink(pub);
	rmdir(dir);
	return k;
}

/* A host's channel after a real client's Curve (and, with done, its
 * CurveAuth): the client's channel in *ret_client. */
static struct rdzv_sec *host_channel(bool done, struct rdzv_sec **ret_client)
{
	Zerod__V1__RdzvCurve hello, reply;
	Zerod__V1__RdzvCurveAuth auth;
	struct rdzv_sec *c, *s;
	char why[200];

	if (rdzv_sec_new(keys, false, &c) != 0 || rdzv_sec_new(keys, true, &s) != 0)
		abort();
	rdzv_sec_hello(c, &hello);
	if (rdzv_sec_on_hello(s, &hello, &reply, why, sizeof(why)) != 0 ||
	    rdzv_sec_on_reply(c, &reply, &auth, why, sizeof(why)) != 0)
		abort();
	if (done && rdzv_sec_on_auth(s, &auth, why, sizeof(why)) != 0)
		abort();
	*ret_client = c;
	return s;
}

static void curve(const Zerod__V1__RdzvEnvelope *env)
{
	struct rdzv_sec *s = NULL, *c = NULL;
	Zerod__V1__RdzvEnvelope *in = NULL;
	Zerod__V1__RdzvCurve reply;
	char why[200];
	int r;

	switch (env->body_case) {
	case ZEROD__V1__RDZV_ENVELOPE__BODY_CURVE:
		if (rdzv_sec_new(keys, true, &s) != 0)
			abort();
		r = rdzv_sec_on_hello(s, env->curve, &reply, why, sizeof(why));
		if (r == 0 && !reply.has_proof)
			abort();
		break;
	case ZEROD__V1__RDZV_ENVELOPE__BODY_CURVE_AUTH:
		s = host_channel(false, &c);
		if (rdzv_sec_on_auth(s, env->curve_auth, why, sizeof(why)) == 0)
			abort(); /* a proof nobody but the client could make */
		break;
	case ZEROD__V1__RDZV_ENVELOPE__BODY_SEALED:
		s = host_channel(true, &c);
		r = rdzv_sec_open(s, &env->sealed, &in);
		if (r != -EBADMSG)
			abort(); /* opened without the key */
		break;
	default:
		return;
	}
	rdzv_sec_free(s);
	rdzv_sec_free(c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	int sv[2];

	if (size > 64 * 1024)
		return 0; /* a socketpair's buffer: the writer must not block */
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
		abort();
	if (size && write(sv[0], data, size) != (ssize_t)size)
		abort();
	shutdown(sv[0], SHUT_WR);
	for (int n = 0; n < 64; n++) {
		Zerod__V1__RdzvEnvelope *env = NULL;
		uint8_t *buf = NULL;
		size_t len = 0;
		int r = rdzv_recv_blocking(sv[1], RDZV_FUZZ_MAX, now_ms() + 1000, &env);

		if (r == -ETIMEDOUT) {
			fprintf(stderr, "a frame of bytes that are all there timed out\n");
			abort();
		}
		if (r < 0)
			break;
		(void)rdzv_msg_name(env->body_case);
		if (!keys)
			keys = load_keys();
		curve(env);
		if (rdzv_frame_encode(env, &buf, &len) != 0)
			abort();
		free(buf);
		rdzv_msg_free(env);
	}
	close(sv[0]);
	close(sv[1]);
	return 0;
}
