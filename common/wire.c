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
		    bool fatal, uint64_t iteration, int64_t bucket, const char *msg)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__Error e = ZEROD__V1__ERROR__INIT;

	e.code = wire_error_code(code);
	e.message = (char *)(msg ? msg : zc_strerror(code));
	if (iteration != WIRE_NO_ITERATION) {
		e.has_iteration = 1;
		e.iteration = iteration;
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

static bool read_varint(const uint8_t **p, const uint8_t *end, uint64_t *ret)
{
	uint64_t v = 0;

	for (int shift = 0; shift < 64 && *p < end; shift += 7) {
		uint8_t b = *(*p)++;
		v |= (uint64_t)(b & 0x7f) << shift;
		if (!(b & 0x80)) {
			*ret = v;
			return true;
		}
	}
	return false;
}

static bool has_nul(const ProtobufCMessageDescriptor *desc, const uint8_t *p, const uint8_t *end,
		    int depth, const char **ret_field)
{
	while (p < end) {
		const ProtobufCFieldDescriptor *f;
		uint64_t key, n;

		if (!read_varint(&p, end, &key))
			return false;
		switch (key & 7) {
		case 0: /* varint */
			if (!read_varint(&p, end, &n))
				return false;
			continue;
		case 1: /* 64 bits */
			p += MIN((size_t)(end - p), (size_t)8);
			continue;
		case 5: /* 32 bits */
			p += MIN((size_t)(end - p), (size_t)4);
			continue;
		case 2: /* length-delimited: the strings and sub-messages */
			break;
		default:
			return false;
		}
		if (!read_varint(&p, end, &n) || n > (uint64_t)(end - p))
			return false;
		f = protobuf_c_message_descriptor_get_field(desc, (unsigned)(key >> 3));
		if (f && f->type == PROTOBUF_C_TYPE_STRING && memchr(p, 0, n)) {
			*ret_field = f->name;
			return true;
		}
		if (f && f->type == PROTOBUF_C_TYPE_MESSAGE && depth < 16 &&
		    has_nul(f->descriptor, p, p + n, depth + 1, ret_field))
			return true;
		p += n;
	}
	return false;
}

bool wire_has_nul(const ProtobufCMessageDescriptor *desc, const void *buf, size_t len,
		  const char **ret_field)
{
	const uint8_t *p = buf;

	return has_nul(desc, p, p + len, 0, ret_field);
}

Zerod__V1__Envelope__BodyCase wire_peek_body(const void *buf, size_t len)
{
	const uint8_t *p = buf, *end = p + len;
	Zerod__V1__Envelope__BodyCase body = ZEROD__V1__ENVELOPE__BODY__NOT_SET;

	while (p < end) {
		const ProtobufCFieldDescriptor *f;
		uint64_t key, n;

		if (!read_varint(&p, end, &key))
			return ZEROD__V1__ENVELOPE__BODY__NOT_SET;
		switch (key & 7) {
		case 0:
			if (!read_varint(&p, end, &n))
				return ZEROD__V1__ENVELOPE__BODY__NOT_SET;
			continue;
		case 1:
		case 5:
			n = (key & 7) == 1 ? 8 : 4;
			break;
		case 2:
			if (!read_varint(&p, end, &n))
				return ZEROD__V1__ENVELOPE__BODY__NOT_SET;
			break;
		default:
			return ZEROD__V1__ENVELOPE__BODY__NOT_SET;
		}
		if (n > (uint64_t)(end - p))
			return ZEROD__V1__ENVELOPE__BODY__NOT_SET;
		p += n;
		f = protobuf_c_message_descriptor_get_field(&zerod__v1__envelope__descriptor,
							    (unsigned)(key >> 3));
		if (f && (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF))
			body = (Zerod__V1__Envelope__BodyCase)f->id;
	}
	return body;
}
