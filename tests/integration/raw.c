/* raw.c — see raw.h. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <zmq.h>

#include "harness.h"
#include "raw.h"
#include "testlib.h"
#include "wire.h"
#include "zctest.h"

int raw_open(struct raw *r, const char *sock_path, int rcvhwm)
{
	char ep[256];
	int zero = 0, tmo = test_timeout(5000);

	r->ctx = zmq_ctx_new();
	r->sock = r->ctx ? zmq_socket(r->ctx, ZMQ_DEALER) : NULL;
	if (!r->sock) {
		printf("# raw socket: %s\n", zmq_strerror(zmq_errno()));
		return -1;
	}
	zmq_setsockopt(r->sock, ZMQ_LINGER, &zero, sizeof(zero));
	zmq_setsockopt(r->sock, ZMQ_RCVTIMEO, &tmo, sizeof(tmo));
	if (rcvhwm > 0)
		zmq_setsockopt(r->sock, ZMQ_RCVHWM, &rcvhwm, sizeof(rcvhwm));
	snprintf(ep, sizeof(ep), "ipc://%s", sock_path);
	if (zmq_connect(r->sock, ep) < 0) {
		printf("# raw connect %s: %s\n", ep, zmq_strerror(zmq_errno()));
		return -1;
	}
	return 0;
}

void raw_close(struct raw *r)
{
	if (r->sock)
		zmq_close(r->sock);
	if (r->ctx)
		zmq_ctx_term(r->ctx);
	r->sock = r->ctx = NULL;
}

void raw_send_bytes(struct raw *r, const void *buf, size_t len, int flags)
{
	int rc = zmq_send(r->sock, buf, len, flags);
	EXPECT(rc == (int)len, "zmq_send: %s", zmq_strerror(zmq_errno()));
}

void raw_send(struct raw *r, const Zerod__V1__Envelope *env)
{
	int rc = wire_send(r->sock, NULL, 0, env);
	EXPECT(rc >= 0, "wire_send: %d", rc);
}

Zerod__V1__Envelope *raw_recv(struct raw *r, const char *what)
{
	Zerod__V1__Envelope *env = NULL;
	zmq_msg_t m;
	int rc;

	zmq_msg_init(&m);
	rc = zmq_msg_recv(&m, r->sock, 0);
	if (rc < 0) {
		EXPECT(rc >= 0, "%s: no reply from zerod: %s", what, zmq_strerror(zmq_errno()));
		zmq_msg_close(&m);
		return NULL;
	}
	rc = wire_decode(zmq_msg_data(&m), zmq_msg_size(&m), &env);
	EXPECT(rc == 0, "%s: the reply (%zu bytes) does not decode", what, zmq_msg_size(&m));
	zmq_msg_close(&m);
	return rc == 0 ? env : NULL;
}

void raw_expect_error(struct raw *r, int code, const char *needle, const char *what)
{
	Zerod__V1__Envelope *env = raw_recv(r, what);

	if (!env)
		return;
	if (env->body_case != ZEROD__V1__ENVELOPE__BODY_ERROR) {
		EXPECT(env->body_case == ZEROD__V1__ENVELOPE__BODY_ERROR,
		       "%s: got %s, not Error %s", what, wire_body_name(env->body_case),
		       zc_strerror_name(code));
	} else {
		int got = -(int)env->error->code;
		char shown[512];
		size_t n = 0;

		/* a TAP comment is one line: control bytes shown as '?' */
		for (const char *p = env->error->message; *p && n + 1 < sizeof(shown); p++)
			shown[n++] = (unsigned char)*p < 0x20 ? '?' : *p;
		shown[n] = 0;
		printf("# %s -> %s: %s\n", what, zc_strerror_name(got), shown);
		EXPECT(got == code, "%s: got %s, want %s: %s", what, zc_strerror_name(got),
		       zc_strerror_name(code), env->error->message);
		EXPECT(strstr(env->error->message, needle), "%s: message \"%s\" lacks \"%s\"", what,
		       env->error->message, needle);
	}
	wire_free(env);
}

void raw_expect_body(struct raw *r, Zerod__V1__Envelope__BodyCase body, const char *what)
{
	Zerod__V1__Envelope *env = raw_recv(r, what);

	if (!env)
		return;
	EXPECT(env->body_case == body, "%s: got %s (%s), want %s", what,
	       wire_body_name(env->body_case),
	       env->body_case == ZEROD__V1__ENVELOPE__BODY_ERROR ? env->error->message : "",
	       wire_body_name(body));
	wire_free(env);
}

void raw_fill_hello(Zerod__V1__Hello *h, const char *job, uint32_t rank, uint32_t world)
{
	*h = (Zerod__V1__Hello)ZEROD__V1__HELLO__INIT;
	h->protocol_version = ZC_PROTOCOL_VERSION;
	h->job_id = (char *)job;
	h->rank = rank;
	h->world_size = world;
	h->local_rank = rank;
	h->local_size = world;
	h->pid = getpid();
}

void raw_hello(struct raw *r, const char *job)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__Hello h;

	raw_fill_hello(&h, job, 0, 1);
	env.body_case = ZEROD__V1__ENVELOPE__BODY_HELLO;
	env.hello = &h;
	raw_send(r, &env);
	raw_expect_body(r, ZEROD__V1__ENVELOPE__BODY_HELLO_OK, "Hello");
}

void raw_goodbye(struct raw *r)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__Goodbye g = ZEROD__V1__GOODBYE__INIT;

	env.body_case = ZEROD__V1__ENVELOPE__BODY_GOODBYE;
	env.goodbye = &g;
	raw_send(r, &env);
}

void raw_bucket(struct raw *r, uint64_t it, uint32_t bucket)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__BucketReady br = ZEROD__V1__BUCKET_READY__INIT;

	br.iteration = it;
	br.bucket = bucket;
	env.body_case = ZEROD__V1__ENVELOPE__BODY_BUCKET_READY;
	env.bucket_ready = &br;
	raw_send(r, &env);
}

int raw_make_shm(const char *name, size_t bytes)
{
	int fd = shm_open(name, O_RDWR | O_CREAT | O_TRUNC, 0600);

	if (fd < 0 || ftruncate(fd, (off_t)bytes) < 0) {
		printf("# shm %s: %s\n", name, strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	close(fd);
	return 0;
}

int raw_reg_init(struct raw_reg *g, const char *tag)
{
	static const uint64_t sizes[2] = {64, 100};
	char err[256];

	memset(g, 0, sizeof(*g));
	g->group = (struct zc_param_group)ZC_PARAM_GROUP_INIT;
	g->group.lr = 0.1;
	for (uint32_t b = 0; b < 2; b++) {
		g->segs[b] = (struct zc_segment)SEG(0, sizes[b], 0);
		g->buckets[b] = (struct zc_bucket)BUCKET(sizes[b], 1, &g->segs[b]);
	}
	g->zp = (struct zc_plan)PLAN(ZC_OPT_SGD, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED, 1, &g->group,
				     2, g->buckets);
	if (plan_from_zc(&g->zp, &g->p, err, sizeof(err)) < 0 || plan_to_pb(g->p, &g->pb) < 0) {
		printf("# plan: %s\n", err);
		return -1;
	}
	g->bytes = plan_buffer_bytes(g->p);
	snprintf(g->grad, sizeof(g->grad), "/zerodtest-%s-%d-grad", tag, (int)getpid());
	snprintf(g->param, sizeof(g->param), "/zerodtest-%s-%d-param", tag, (int)getpid());
	if (raw_make_shm(g->grad, g->bytes) < 0 || raw_make_shm(g->param, g->bytes) < 0)
		return -1;
	g->shm = (Zerod__V1__ShmBuffers)ZEROD__V1__SHM_BUFFERS__INIT;
	g->shm.grad_name = g->grad;
	g->shm.grad_bytes = g->bytes;
	g->shm.param_name = g->param;
	g->shm.param_bytes = g->bytes;
	g->rp = (Zerod__V1__RegisterPlan)ZEROD__V1__REGISTER_PLAN__INIT;
	g->rp.plan = &g->pb;
	g->rp.shm = &g->shm;
	g->env = (Zerod__V1__Envelope)ZEROD__V1__ENVELOPE__INIT;
	g->env.body_case = ZEROD__V1__ENVELOPE__BODY_REGISTER_PLAN;
	g->env.register_plan = &g->rp;
	return 0;
}

void raw_reg_free(struct raw_reg *g)
{
	shm_unlink(g->grad);
	shm_unlink(g->param);
	if (g->p)
		plan_pb_free(&g->pb);
	plan_free(g->p);
}
