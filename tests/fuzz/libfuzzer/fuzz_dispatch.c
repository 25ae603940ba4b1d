/*
 * fuzz_dispatch.c — libFuzzer target: a real zerod, run in this process on
 * a thread (daemon_run, as main.c runs it), fed each input as the messages
 * of one trainer connection over its real ZeroMQ socket. Coverage comes from
 * the daemon's own code: the dispatch, the edge checks, the session and job
 * state machines.
 *
 * An input: one flags byte, then chunks of [2-byte length][bytes], each sent
 * as one message (at most 8). Flags bit 0 first sends a valid Hello (job
 * "fuzz", world 1), so later chunks reach the handlers that need a session;
 * bit 1 sends each chunk twice.
 *
 * After the chunks the connection sends a message no client may send (a
 * BucketDone) and waits for the daemon's Error about it: the daemon has then
 * handled everything before it. The oracle: no crash or sanitizer report in
 * the daemon, and the daemon keeps answering: if a fresh connection's Hello
 * gets no answer within 10 s, the target aborts.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <unistd.h>
#include <zmq.h>

#include "base/config.h"
#include "daemon.h"
#include "wire.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_CHUNKS 8

static char sock_path[128], endpoint[160];
static void *zctx;
static struct daemon_config cfg;

static void *daemon_thread(void *arg)
{
	(void)arg;
	daemon_run(&cfg);
	fprintf(stderr, "fuzz_dispatch: daemon_run returned\n");
	abort();
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	static char dir[] = "/tmp/zerod-fuzz.XXXXXX";
	char *args[] = {"zerod",     "--socket", sock_path,         "--log-level", "err",
			"--workers", "1",        "--hello-timeout", "2000",        NULL};
	struct config_src *src;
	char err[512];
	pthread_t th;

	(void)argc;
	(void)argv;
	if (!mkdtemp(dir))
		abort();
	snprintf(sock_path, sizeof(sock_path), "%s/zerod.sock", dir);
	snprintf(endpoint, sizeof(endpoint), "ipc://%s", sock_path);
	if (config_parse_args(9, args, &src) != 0 ||
	    config_build(src, &cfg, err, sizeof(err)) < 0) {
		fprintf(stderr, "fuzz_dispatch: config: %s\n", err);
		abort();
	}
	if (pthread_create(&th, NULL, daemon_thread, NULL) != 0)
		abort();
	for (int i = 0; access(sock_path, F_OK) != 0; i++) {
		if (i > 1000)
			abort();
		usleep(10000);
	}
	zctx = zmq_ctx_new();
	return 0;
}

static int send_env(void *z, const Zerod__V1__Envelope *env)
{
	void *buf;
	size_t len;
	int r;

	if (wire_encode(env, &buf, &len) != 0)
		abort();
	r = zmq_send(z, buf, len, 0);
	free(buf);
	return r;
}

static void send_hello(void *z)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__Hello h = ZEROD__V1__HELLO__INIT;

	h.protocol_version = ZC_PROTOCOL_VERSION;
	h.job_id = "fuzz";
	h.world_size = 1;
	h.local_size = 1;
	h.pid = getpid();
	env.body_case = ZEROD__V1__ENVELOPE__BODY_HELLO;
	env.hello = &h;
	send_env(z, &env);
}

/* Wait for an Error that names the BucketDone: everything sent before it
 * was handled. false after timeout_ms. */
static bool synced(void *z, int timeout_ms)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__BucketDone bd = ZEROD__V1__BUCKET_DONE__INIT;
	int64_t deadline = now_ms() + timeout_ms;
	char buf[4096];

	env.body_case = ZEROD__V1__ENVELOPE__BODY_BUCKET_DONE;
	env.bucket_done = &bd;
	if (send_env(z, &env) < 0)
		return false;
	for (;;) {
		zmq_pollitem_t it = {.socket = z, .events = ZMQ_POLLIN};
		int64_t left = deadline - now_ms();
		Zerod__V1__Envelope *got = NULL;
		int n;

		if (left <= 0 || zmq_poll(&it, 1, (long)left) <= 0)
			return false;
		n = zmq_recv(z, buf, sizeof(buf), ZMQ_DONTWAIT);
		if (n < 0 || (size_t)n > sizeof(buf))
			continue;
		if (wire_decode(buf, (size_t)n, &got) != 0)
			continue;
		bool done = got->body_case == ZEROD__V1__ENVELOPE__BODY_ERROR &&
			    got->error->message && strstr(got->error->message, "bucket_done");
		wire_free(got);
		if (done)
			return true;
	}
}

static void *dealer(void)
{
	void *z = zmq_socket(zctx, ZMQ_DEALER);
	int zero = 0;

	if (!z || zmq_setsockopt(z, ZMQ_LINGER, &zero, sizeof(zero)) != 0 ||
	    zmq_connect(z, endpoint) != 0)
		abort();
	return z;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static unsigned unsynced;
	uint8_t flags;
	void *z;

	if (size < 1)
		return 0;
	flags = data[0];
	data++, size--;
	z = dealer();
	if (flags & 1)
		send_hello(z);
	for (int k = 0; k < MAX_CHUNKS && size >= 2; k++) {
		size_t len = (size_t)data[0] | (size_t)data[1] << 8;
		data += 2, size -= 2;
		if (len > size)
			len = size;
		for (int rep = 0; rep < ((flags & 2) ? 2 : 1); rep++)
			zmq_send(z, data, len, 0);
		data += len, size -= len;
	}
	if (synced(z, 1000)) {
		unsynced = 0;
	} else if (++unsynced >= 3) {
		/* it may only have dropped this connection: ask on a fresh one */
		void *y = dealer();
		if (!synced(y, 10000)) {
			fprintf(stderr, "fuzz_dispatch: the daemon stopped answering\n");
			abort();
		}
		zmq_close(y);
		unsynced = 0;
	}
	zmq_close(z);
	return 0;
}
