/*
 * wire.h — the codec: Envelope <-> bytes, and ZeroMQ send/receive of one
 * envelope. Decoding checks that the envelope carries a body; the fields of
 * that body are checked by whoever handles it.
 */
#ifndef ZEROD_WIRE_H
#define ZEROD_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "zerod.pb-c.h"

/* Pack env into a new buffer (caller frees *ret_buf). */
int wire_encode(const Zerod__V1__Envelope *env, void **ret_buf, size_t *ret_len);

/* Unpack len bytes: ZC_EPROTO if they are not one Envelope with a body.
 * Free *ret_env with wire_free(). */
int wire_decode(const void *buf, size_t len, Zerod__V1__Envelope **ret_env);
void wire_free(Zerod__V1__Envelope *env);

/* Name of an envelope body case, for logs and errors. */
const char *wire_body_name(Zerod__V1__Envelope__BodyCase c);

/* Send env on a ZeroMQ socket, after an optional routing-id frame (ROUTER).
 * Never blocks (ZMQ_DONTWAIT): -EAGAIN when the peer's queue is full,
 * -EHOSTUNREACH when the peer is gone. */
int wire_send(void *zsock, const void *route, size_t route_len, const Zerod__V1__Envelope *env);

/* Convenience senders. */
/* request_id: the refused request's id (0: none). */
int wire_send_error(void *zsock, const void *route, size_t route_len, uint64_t request_id, int code,
		    bool fatal, int64_t iteration, int64_t bucket, const char *msg);

/* ZC_E... code -> wire enum and back (unknown -> EINTERNAL / EPROTO). */
Zerod__V1__ErrorCode wire_error_code(int code);
int wire_error_from_pb(Zerod__V1__ErrorCode c);

#endif
