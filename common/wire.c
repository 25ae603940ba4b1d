/*
 * wire.c — the protobuf-c codec and ZeroMQ framing shared by client and
 * daemon. Messages are single frames on DEALER; on ROUTER a routing-id frame
 * comes first.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common.h"
#include "wire.h"
#include "zeroclient.h"

int wire_encode(const Zerod__V1__Envelope *env, void **ret_buf, size_t *ret_len)
{
	size_t n = zerod__v1__envelope__get_packed_size(env);
	void *buf = malloc(n ? n : 1);

	if (!buf)
		return -ENOMEM;
	zerod__v1__envelope__pack(env, buf);
	*ret_buf = buf;
	*ret_len = n;
	return 0;
}

int wire_decode(const void *buf, size_t len, Zerod__V1__Envelope **ret_env)
{
	Zerod__V1__Envelope *env;

	if (len > ZEROD_MAX_MSG_BYTES)
		return ZC_EPROTO;
	env = zerod__v1__envelope__unpack(NULL, len, buf);
	if (!env)
		return ZC_EPROTO;
	if (env->body_case == ZEROD__V1__ENVELOPE__BODY__NOT_SET) {
		zerod__v1__envelope__free_unpacked(env, NULL);
		return ZC_EPROTO;
	}
	*ret_env = env;
	return 0;
}

void wire_free(Zerod__V1__Envelope *env)
{
	if (env)
		zerod__v1__envelope__free_unpacked(env, NULL);
}

const char *wire_body_name(Zerod__V1__Envelope__BodyCase c)
{
	const ProtobufCFieldDescriptor *f;

	f = protobuf_c_message_descriptor_get_field(&zerod__v1__envelope__descriptor, (unsigned)c);
	return f ? f->name : "none";
}

int wire_send(void *zsock, const void *route, size_t route_len, const Zerod__V1__Envelope *env)
{
	void *buf;
	size_t len;
	int r;

	r = wire_encode(env, &buf, &len);
	if (r < 0)
		return r;
	if (route && zmq_send(zsock, route, route_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) {
		r = -zmq_errno();
		goto out;
	}
	if (zmq_send(zsock, buf, len, ZMQ_DONTWAIT) < 0)
		r = -zmq_errno();
out:
	free(buf);
	return r;
}

Zerod__V1__ErrorCode wire_error_code(int code)
{
	if (error_is_zc_code(code))
		return (Zerod__V1__ErrorCode)-code;
	return ZEROD__V1__ERROR_CODE__EINTERNAL;
}

int wire_error_from_pb(Zerod__V1__ErrorCode c)
{
	if (error_is_zc_code(-(int)c))
		return -(int)c;
	return ZC_EPROTO;
}

int wire_send_error(void *zsock, const void *route, size_t route_len, uint64_t request_id, int code,
		    bool fatal, int64_t iteration, int64_t bucket, const char *msg)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__Error e = ZEROD__V1__ERROR__INIT;

	e.code = wire_error_code(code);
	e.message = (char *)(msg ? msg : zc_strerror(code));
	if (iteration >= 0) {
		e.has_iteration = 1;
		e.iteration = (uint64_t)iteration;
	}
	if (bucket >= 0) {
		e.has_bucket = 1;
		e.bucket = (uint32_t)bucket;
	}
	e.has_fatal = 1;
	e.fatal = fatal;
	env.has_request_id = request_id != 0;
	env.request_id = request_id;
	env.body_case = ZEROD__V1__ENVELOPE__BODY_ERROR;
	env.error = &e;
	return wire_send(zsock, route, route_len, &env);
}
