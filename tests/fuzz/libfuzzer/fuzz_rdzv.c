/*
 * fuzz_rdzv.c — libFuzzer target: bytes as what a peer daemon (or anyone who
 * reaches the port) sends to a rendezvous. They go down a socketpair and are
 * read with rdzv_recv_blocking(), the framing and decoding the rendezvous
 * server and its clients use: a 4-byte length, then one RdzvEnvelope, at
 * most RDZV_FUZZ_MAX bytes. Frames are read until the bytes run out; each
 * must end in a message or a clean error, and a decoded message must encode
 * again.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common.h"
#include "rdzvwire.h"

#define RDZV_FUZZ_MAX (1u << 20)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

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
		if (rdzv_frame_encode(env, &buf, &len) != 0)
			abort();
		free(buf);
		rdzv_msg_free(env);
	}
	close(sv[0]);
	close(sv[1]);
	return 0;
}
