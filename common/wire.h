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
/* request_id: the refused request's id (0: none). iteration: any uint64, or
 * WIRE_NO_ITERATION for none; bucket < 0: none. */
#define WIRE_NO_ITERATION UINT64_MAX
int wire_send_error(void *zsock, const void *route, size_t route_len, uint64_t request_id, int code,
		    bool fatal, uint64_t iteration, int64_t bucket, const char *msg);

/* Walk the len bytes of a message of type desc, as they came off the wire:
 * true if a string field (at any depth) holds a NUL byte, which protobuf-c
 * would silently cut the string at; its name in *ret_field. Call it only on
 * bytes that decoded. */
bool wire_has_nul(const ProtobufCMessageDescriptor *desc, const void *buf, size_t len,
		  const char **ret_field);

/* The body an Envelope's bytes carry (the last of the oneof, as a decode
 * would take it), read from the top-level field keys alone: no allocation,
 * so a message that is refused for its kind costs nothing to decode.
 * BODY__NOT_SET if there is none or the bytes are malformed. */
Zerod__V1__Envelope__BodyCase wire_peek_body(const void *buf, size_t len);

/* ZC_E... code -> wire enum and back (unknown -> EINTERNAL / EPROTO). */
Zerod__V1__ErrorCode wire_error_code(int code);
int wire_error_from_pb(Zerod__V1__ErrorCode c);

#endif
