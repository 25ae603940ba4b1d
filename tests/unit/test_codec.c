/*
 * test_codec.c — the wire codec: every message a client or the daemon sends
 * survives a round trip; garbage, truncation, an empty envelope and an
 * oversized buffer are ZC_EPROTO; the error list and the protocol's
 * ErrorCode enum mirror each other; zc_strerror names every code.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "testlib.h"
#include "wire.h"
#include "zeroclient.h"

static Zerod__V1__Envelope *round_trip(const Zerod__V1__Envelope *env)
{
	Zerod__V1__Envelope *out = NULL;
	void *buf;
	size_t len;

	if (wire_encode(env, &buf, &len) < 0)
		return NULL;
	if (wire_decode(buf, len, &out) < 0)
		out = NULL;
	free(buf);
	return out;
}

static void t_round_trips(void)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT, *out;
	Zerod__V1__Hello h = ZEROD__V1__HELLO__INIT;
	Zerod__V1__BucketReady br = ZEROD__V1__BUCKET_READY__INIT;
	Zerod__V1__StepDone sd = ZEROD__V1__STEP_DONE__INIT;
	Zerod__V1__Error e = ZEROD__V1__ERROR__INIT;

	h.protocol_version = 1;
	h.job_id = "job-1";
	h.rank = 3;
	h.world_size = 4;
	h.local_rank = 3;
	h.local_size = 4;
	h.pid = 4242;
	env.body_case = ZEROD__V1__ENVELOPE__BODY_HELLO;
	env.hello = &h;
	out = round_trip(&env);
	REQUIRE(out && out->body_case == ZEROD__V1__ENVELOPE__BODY_HELLO, "hello");
	CHECK(strcmp(out->hello->job_id, "job-1") == 0 && out->hello->rank == 3 &&
		      out->hello->world_size == 4 && out->hello->pid == 4242,
	      "hello fields changed");
	wire_free(out);

	br.iteration = 1ull << 40;
	br.bucket = 65535;
	env.body_case = ZEROD__V1__ENVELOPE__BODY_BUCKET_READY;
	env.bucket_ready = &br;
	out = round_trip(&env);
	REQUIRE(out && out->body_case == ZEROD__V1__ENVELOPE__BODY_BUCKET_READY, "bucket_ready");
	CHECK(out->bucket_ready->iteration == 1ull << 40 && out->bucket_ready->bucket == 65535,
	      "bucket_ready fields changed");
	wire_free(out);

	sd.iteration = 7;
	env.body_case = ZEROD__V1__ENVELOPE__BODY_STEP_DONE;
	env.step_done = &sd;
	out = round_trip(&env);
	REQUIRE(out && out->step_done->iteration == 7, "step_done");
	wire_free(out);

	env.has_request_id = 1;
	env.request_id = 99;
	e.code = wire_error_code(ZC_EORDER);
	e.message = "rank 1 sent bucket 2";
	e.has_bucket = 1;
	e.bucket = 2;
	env.body_case = ZEROD__V1__ENVELOPE__BODY_ERROR;
	env.error = &e;
	out = round_trip(&env);
	REQUIRE(out && out->body_case == ZEROD__V1__ENVELOPE__BODY_ERROR, "error");
	CHECK(wire_error_from_pb(out->error->code) == ZC_EORDER, "code %d",
	      wire_error_from_pb(out->error->code));
	CHECK(out->error->has_bucket && out->error->bucket == 2 && !out->error->has_iteration,
	      "error optional fields changed");
	CHECK(!out->error->fatal, "fatal defaults to false");
	CHECK(out->has_request_id && out->request_id == 99, "request id lost");
	wire_free(out);
}

static void t_malformed(void)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT, *out = NULL;
	Zerod__V1__Hello h = ZEROD__V1__HELLO__INIT;
	uint8_t garbage[64];
	void *buf;
	size_t len;

	for (size_t i = 0; i < sizeof(garbage); i++)
		garbage[i] = (uint8_t)(i * 37 + 11);
	CHECK(wire_decode(garbage, sizeof(garbage), &out) == ZC_EPROTO, "garbage decoded");

	h.protocol_version = 1;
	h.job_id = "a-job-with-a-long-name";
	env.body_case = ZEROD__V1__ENVELOPE__BODY_HELLO;
	env.hello = &h;
	REQUIRE(wire_encode(&env, &buf, &len) == 0, "encode");
	for (size_t cut = 1; cut < len; cut++)
		CHECK(wire_decode(buf, cut, &out) == ZC_EPROTO, "hello cut to %zu of %zu decoded",
		      cut, len);
	CHECK(wire_decode(buf, ZEROD_MAX_MSG_BYTES + 1, &out) == ZC_EPROTO,
	      "oversized length accepted");
	free(buf);

	/* an envelope with no body */
	env.body_case = ZEROD__V1__ENVELOPE__BODY__NOT_SET;
	REQUIRE(wire_encode(&env, &buf, &len) == 0, "encode empty");
	CHECK(wire_decode(buf, len, &out) == ZC_EPROTO, "empty envelope decoded");
	free(buf);
	CHECK(wire_decode("", 0, &out) == ZC_EPROTO, "zero bytes decoded");
}

static void t_error_mirror(void)
{
	const ProtobufCEnumDescriptor *d = &zerod__v1__error_code__descriptor;
	unsigned n = 0;

#define CHECK_MIRROR(name, code, text)                                                             \
	do {                                                                                       \
		const ProtobufCEnumValue *v =                                                      \
			protobuf_c_enum_descriptor_get_value_by_name(d, #name);                    \
		n++;                                                                               \
		CHECK(v && v->value == -(code), "ErrorCode." #name " missing or not %d", -(code)); \
		CHECK(wire_error_code(ZC_##name) == -(code), #name " maps to %d",                  \
		      (int)wire_error_code(ZC_##name));                                            \
		CHECK(wire_error_from_pb((Zerod__V1__ErrorCode)(-(code))) == ZC_##name,            \
		      #name " does not map back");                                                 \
		CHECK(strcmp(zc_strerror(ZC_##name), text) == 0, #name " text");                   \
		CHECK(strcmp(zc_strerror_name(ZC_##name), "ZC_" #name) == 0, #name " name");       \
	} while (0);
	ZC_ERRORS(CHECK_MIRROR)
#undef CHECK_MIRROR
	CHECK(d->n_values == n + 1, "proto ErrorCode has %u values, zeroclient.h %u (+ NONE)",
	      d->n_values, n);
	CHECK(strcmp(zc_strerror(-ENOENT), strerror(ENOENT)) == 0, "-ENOENT text");
	CHECK(strcmp(zc_strerror_name(-ENOENT), "ENOENT") == 0, "-ENOENT name");
	CHECK(strcmp(zc_strerror_name(-999999), "ZC_EUNKNOWN") == 0, "unknown name");
	CHECK(wire_error_code(-ENOENT) == ZEROD__V1__ERROR_CODE__EINTERNAL,
	      "errno codes travel as EINTERNAL");
}

static void t_job_ids(void)
{
	CHECK(job_id_valid("train.v2_run-7"), "valid id refused");
	CHECK(!job_id_valid(""), "empty id accepted");
	CHECK(!job_id_valid("a/b"), "slash accepted");
	CHECK(!job_id_valid("a b"), "space accepted");
	CHECK(!job_id_valid("x0123456789012345678901234567890123456789012345678901234567890123"),
	      "65 characters accepted");
}

static const struct test_case cases[] = {
	{"round_trips", t_round_trips},
	{"malformed_is_eproto", t_malformed},
	{"error_list_mirrors_proto", t_error_mirror},
	{"job_ids", t_job_ids},
};

TEST_MAIN(cases)
