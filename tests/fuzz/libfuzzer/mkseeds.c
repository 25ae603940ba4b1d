/*
 * mkseeds.c — writes the seed corpus of the libFuzzer targets
 * (tests/fuzz/corpus/<target>/): valid messages of every kind a trainer or a
 * peer daemon sends, so the fuzzer starts from inputs that reach deep. Run
 * by hand when the protocol changes:
 *   build-fuzz/tests/fuzz-mkseeds tests/fuzz/corpus
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "plan.h"
#include "net/rdzvwire.h"
#include "net/tls.h"
#include "wire.h"

static const char *top;

static void put(const char *target, const char *name, const void *buf, size_t len)
{
	char path[512];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", top, target);
	if (mkdir(path, 0755) != 0 && errno != EEXIST)
		exit(1);
	snprintf(path, sizeof(path), "%s/%s/%s", top, target, name);
	f = fopen(path, "wb");
	if (!f || fwrite(buf, 1, len, f) != len || fclose(f) != 0)
		exit(1);
}

/* A small valid plan: Adam, 2 groups, 2 buckets. */
static void small_plan(Zerod__V1__Plan *pb)
{
	struct zc_param_group g[2] = {ZC_PARAM_GROUP_INIT, ZC_PARAM_GROUP_INIT};
	struct zc_segment s0[2] = {ZC_SEGMENT_INIT, ZC_SEGMENT_INIT}, s1[1] = {ZC_SEGMENT_INIT};
	struct zc_bucket b[2] = {ZC_BUCKET_INIT, ZC_BUCKET_INIT};
	struct zc_plan p = ZC_PLAN_INIT;
	struct plan *pl;
	char err[256];

	g[1].weight_decay = 0.01;
	s0[0].numel = 100;
	s0[1].group = 1, s0[1].offset = 100, s0[1].numel = 28;
	s1[0].numel = 64;
	b[0].numel = 128, b[0].nsegments = 2, b[0].segments = s0;
	b[1].numel = 64, b[1].nsegments = 1, b[1].segments = s1;
	p.optimizer = ZC_OPT_ADAM;
	p.ngroups = 2, p.groups = g;
	p.nbuckets = 2, p.buckets = b;
	if (plan_from_zc(&p, &pl, err, sizeof(err)) != 0 || plan_to_pb(pl, pb) != 0) {
		fprintf(stderr, "mkseeds: %s\n", err);
		exit(1);
	}
	plan_free(pl);
}

static size_t envelope(const Zerod__V1__Envelope *env, uint8_t *out, size_t cap)
{
	void *buf;
	size_t len;

	if (wire_encode(env, &buf, &len) != 0 || len > cap)
		exit(1);
	memcpy(out, buf, len);
	free(buf);
	return len;
}

/* dispatch's input: flags, then [2-byte length][message] chunks */
static size_t chunk(uint8_t *out, const uint8_t *msg, size_t len)
{
	out[0] = (uint8_t)len;
	out[1] = (uint8_t)(len >> 8);
	memcpy(out + 2, msg, len);
	return len + 2;
}

int main(int argc, char **argv)
{
	static uint8_t m[6][65536], d[65536 * 2];
	size_t ml[6], dl;
	Zerod__V1__Envelope env[6];
	Zerod__V1__Hello hello = ZEROD__V1__HELLO__INIT;
	Zerod__V1__RegisterPlan reg = ZEROD__V1__REGISTER_PLAN__INIT;
	Zerod__V1__ShmBuffers shm = ZEROD__V1__SHM_BUFFERS__INIT;
	Zerod__V1__Plan plan;
	Zerod__V1__BucketReady ready = ZEROD__V1__BUCKET_READY__INIT;
	Zerod__V1__SetHyper hyper = ZEROD__V1__SET_HYPER__INIT;
	Zerod__V1__ParamGroup pg = ZEROD__V1__PARAM_GROUP__INIT;
	Zerod__V1__Goodbye bye = ZEROD__V1__GOODBYE__INIT;
	static const char *names[6] = {"hello",     "register_plan", "bucket_ready",
				       "set_hyper", "goodbye",       "hello_rdzv"};

	if (argc != 2) {
		fprintf(stderr, "usage: mkseeds CORPUS_DIR\n");
		return 2;
	}
	top = argv[1];
	small_plan(&plan);
	for (int i = 0; i < 6; i++)
		env[i] = (Zerod__V1__Envelope)ZEROD__V1__ENVELOPE__INIT;

	hello.protocol_version = ZC_PROTOCOL_VERSION;
	hello.job_id = "fuzz";
	hello.world_size = 1;
	hello.local_size = 1;
	hello.pid = 1;
	env[0].body_case = ZEROD__V1__ENVELOPE__BODY_HELLO, env[0].hello = &hello;
	shm.grad_name = "/zerod.fuzz.g";
	shm.grad_bytes = 4 * 256;
	shm.param_name = "/zerod.fuzz.p";
	shm.param_bytes = 4 * 256;
	reg.plan = &plan;
	reg.shm = &shm;
	env[1].body_case = ZEROD__V1__ENVELOPE__BODY_REGISTER_PLAN, env[1].register_plan = &reg;
	ready.bucket = 1;
	env[2].body_case = ZEROD__V1__ENVELOPE__BODY_BUCKET_READY, env[2].bucket_ready = &ready;
	env[2].has_request_id = 1, env[2].request_id = 7;
	pg.lr = 0.5;
	hyper.group = 1;
	hyper.iteration = 3;
	hyper.values = &pg;
	env[3].body_case = ZEROD__V1__ENVELOPE__BODY_SET_HYPER, env[3].set_hyper = &hyper;
	env[4].body_case = ZEROD__V1__ENVELOPE__BODY_GOODBYE, env[4].goodbye = &bye;
	Zerod__V1__Hello h2 = hello;
	h2.rdzv = "127.0.0.1:1";
	h2.nnodes = 2, h2.has_nnodes = 1;
	h2.job_secret = (ProtobufCBinaryData){.len = 6, .data = (uint8_t *)"secret"};
	h2.has_job_secret = 1;
	env[5].body_case = ZEROD__V1__ENVELOPE__BODY_HELLO, env[5].hello = &h2;

	for (int i = 0; i < 6; i++) {
		ml[i] = envelope(&env[i], m[i], sizeof(m[i]));
		put("envelope", names[i], m[i], ml[i]);
	}
	/* dispatch: each message alone after a Hello, the plain Hello, and a
	 * whole session */
	for (int i = 0; i < 6; i++) {
		d[0] = i == 0 || i == 5 ? 0 : 1;
		dl = 1 + chunk(d + 1, m[i], ml[i]);
		put("dispatch", names[i], d, dl);
	}
	d[0] = 0;
	dl = 1;
	for (int i = 0; i < 5; i++)
		dl += chunk(d + dl, m[i], ml[i]);
	put("dispatch", "session", d, dl);

	/* rdzv: every kind a peer sends inside TLS, framed */
	Zerod__V1__RdzvEnvelope re[4];
	Zerod__V1__RdzvHello rh = ZEROD__V1__RDZV_HELLO__INIT;
	Zerod__V1__RdzvJoin rj = ZEROD__V1__RDZV_JOIN__INIT;
	Zerod__V1__StoreSet ss = ZEROD__V1__STORE_SET__INIT;
	Zerod__V1__StoreGet sg = ZEROD__V1__STORE_GET__INIT;
	static uint8_t proof[32];
	static uint32_t ranks[2] = {2, 3};
	static const char *rnames[4] = {"hello", "join", "store_set", "store_get"};
	for (int i = 0; i < 4; i++)
		re[i] = (Zerod__V1__RdzvEnvelope)ZEROD__V1__RDZV_ENVELOPE__INIT;
	rh.protocol_version = RDZV_PROTOCOL;
	rh.job_id = "fuzz";
	rh.kind = ZEROD__V1__RDZV_KIND__RDZV_JOIN;
	rh.proof = (ProtobufCBinaryData){.len = 32, .data = proof};
	re[0].body_case = ZEROD__V1__RDZV_ENVELOPE__BODY_HELLO, re[0].hello = &rh;
	rj.world_size = 4;
	rj.nnodes = 2;
	rj.n_ranks = 2, rj.ranks = ranks;
	rj.plan = &plan;
	re[1].body_case = ZEROD__V1__RDZV_ENVELOPE__BODY_JOIN, re[1].join = &rj;
	ss.key = "job.1/rank_0";
	ss.value = (ProtobufCBinaryData){.len = 4, .data = (uint8_t *)"addr"};
	re[2].body_case = ZEROD__V1__RDZV_ENVELOPE__BODY_STORE_SET, re[2].store_set = &ss;
	sg.key = "job.1/rank_0";
	re[3].body_case = ZEROD__V1__RDZV_ENVELOPE__BODY_STORE_GET, re[3].store_get = &sg;
	dl = 0;
	for (int i = 0; i < 4; i++) {
		uint8_t *buf;
		size_t len;
		if (rdzv_frame_encode(&re[i], &buf, &len) != 0)
			return 1;
		put("rdzv", rnames[i], buf, len);
		memcpy(d + dl, buf, len);
		dl += len;
		free(buf);
	}
	/* a real ClientHello under a job's PSK: the first bytes a node sends */
	{
		char why[200];
		uint8_t id[TLS_PSK_ID_BYTES], key[TLS_PSK_BYTES], ch[4096];
		SSL_CTX *ctx = tls_ctx_new(NULL, false, false, why, sizeof(why));
		int sv[2];
		SSL *ssl;
		ssize_t n;

		if (!ctx || socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
			return 1;
		ssl = tls_new(ctx, sv[0], false);
		tls_psk_derive("fuzz", "secret", 6, id, key);
		if (!ssl || tls_psk_client(ssl, id, key) < 0)
			return 1;
		fcntl(sv[0], F_SETFL, O_NONBLOCK);
		(void)tls_handshake(ssl, why, sizeof(why));
		n = read(sv[1], ch, sizeof(ch));
		if (n <= 0)
			return 1;
		put("rdzv", "client_hello", ch, (size_t)n);
		tls_free(ssl);
		SSL_CTX_free(ctx);
		close(sv[0]);
		close(sv[1]);
	}
	put("rdzv", "all", d, dl);
	plan_pb_free(&plan);
	return 0;
}
