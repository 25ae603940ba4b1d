/*
 * fuzz_envelope.c — libFuzzer target: bytes as a trainer's message. Decodes
 * them as the daemon does (wire_peek_body before a session, wire_decode,
 * the NUL check, then plan_from_pb for a plan), and checks what must hold
 * for any input: a decoded envelope encodes again; a plan the edge accepts
 * survives plan_to_pb -> plan_from_pb unchanged, with the same hash. Any
 * crash, sanitizer report or abort() here is a bug.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void plan_roundtrip(const Zerod__V1__Plan *in)
{
	struct plan *p = NULL, *q = NULL;
	Zerod__V1__Plan pb;
	char err[256], field[256];

	if (plan_from_pb(in, &p, err, sizeof(err)) != 0)
		return;
	if (plan_to_pb(p, &pb) != 0)
		abort();
	if (plan_from_pb(&pb, &q, err, sizeof(err)) != 0) {
		fprintf(stderr, "an accepted plan is refused after a round trip: %s\n", err);
		abort();
	}
	if (plan_diff(p, q, field, sizeof(field)) != 0 || p->hash != q->hash) {
		fprintf(stderr, "a plan changed in a round trip: %s\n", field);
		abort();
	}
	plan_pb_free(&pb);
	plan_free(q);
	plan_free(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	Zerod__V1__Envelope *env = NULL;
	const char *field;
	void *buf = NULL;
	size_t len = 0;

	(void)wire_peek_body(data, size);
	if (wire_decode(data, size, &env) != 0)
		return 0;
	(void)wire_has_nul(&zerod__v1__envelope__descriptor, data, size, &field);
	(void)wire_body_name(env->body_case);
	if (env->body_case == ZEROD__V1__ENVELOPE__BODY_REGISTER_PLAN && env->register_plan->plan)
		plan_roundtrip(env->register_plan->plan);
	/* what was decoded encodes (protobuf-c keeps unknown fields, even ones
	 * numbered 0, so the bytes need not decode again: not asserted) */
	if (wire_encode(env, &buf, &len) != 0)
		abort();
	free(buf);
	wire_free(env);
	return 0;
}
