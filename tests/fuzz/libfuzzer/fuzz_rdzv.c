/*
 * fuzz_rdzv.c — libFuzzer target: bytes as what anyone who reaches a
 * rendezvous port sends to it. They go two ways:
 *  - to a host's TLS server under a job's PSK (net/tls.h), as the first
 *    bytes of a connection: OpenSSL's ClientHello parser and zerod's PSK
 *    lookup; the handshake must fail or wait for more, never complete (the
 *    fuzzer does not hold the PSK);
 *  - as the plaintext a TLS connection delivers, to the framing and
 *    decoding the rendezvous uses (net/rdzvwire.h): a 4-byte length, then
 *    one RdzvEnvelope, at most RDZV_FUZZ_MAX bytes. Frames are read until
 *    the bytes run out; each must end in a message or a clean refusal, and
 *    a decoded message must encode again.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common.h"
#include "net/rdzvwire.h"
#include "net/tls.h"

#define RDZV_FUZZ_MAX (1u << 20)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static SSL_CTX *server;
static uint8_t psk_id[TLS_PSK_ID_BYTES], psk_key[TLS_PSK_BYTES];

static bool find(void *arg, const uint8_t id[TLS_PSK_ID_BYTES], uint8_t key[TLS_PSK_BYTES])
{
	(void)arg;
	if (!tls_equal(id, psk_id, TLS_PSK_ID_BYTES))
		return false;
	memcpy(key, psk_key, TLS_PSK_BYTES);
	return true;
}

static void handshake(const uint8_t *data, size_t size)
{
	char why[300];
	int sv[2];
	SSL *ssl;

	if (!server) {
		signal(SIGPIPE, SIG_IGN);
		server = tls_ctx_new(NULL, true, false, why, sizeof(why));
		tls_psk_derive("fuzz", "secret", 6, psk_id, psk_key);
		if (!server)
			abort();
	}
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
		abort();
	fcntl(sv[1], F_SETFL, O_NONBLOCK);
	if (size && write(sv[0], data, size) != (ssize_t)size)
		abort();
	shutdown(sv[0], SHUT_WR);
	ssl = tls_new(server, sv[1], true);
	if (!ssl || tls_psk_server(ssl, find, NULL) < 0)
		abort();
	for (int i = 0; i < 8; i++) {
		enum tls_io io = tls_handshake(ssl, why, sizeof(why));
		if (io == TLS_IO_OK)
			abort(); /* a handshake without the PSK */
		if (io != TLS_IO_READ && io != TLS_IO_WRITE)
			break;
	}
	tls_free(ssl);
	close(sv[0]);
	close(sv[1]);
}

static void frames(const uint8_t *data, size_t size)
{
	for (int n = 0; n < 64 && size >= 4; n++) {
		Zerod__V1__RdzvEnvelope *env;
		uint32_t len = rdzv_frame_len(data);
		uint8_t *buf = NULL;
		size_t blen = 0;

		if (len > RDZV_FUZZ_MAX || len > size - 4)
			return; /* refused, or not all there */
		env = rdzv_msg_decode(data + 4, len);
		if (!env)
			return;
		(void)rdzv_msg_name(env->body_case);
		if (rdzv_frame_encode(env, &buf, &blen) != 0)
			abort();
		free(buf);
		rdzv_msg_free(env);
		data += 4 + len;
		size -= 4 + len;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size > 64 * 1024)
		return 0; /* a socketpair's buffer: the writer must not block */
	handshake(data, size);
	frames(data, size);
	return 0;
}
