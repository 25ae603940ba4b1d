/*
 * test_plan.c — plan validation at the edge, the flat layout, the hash, the
 * field-by-field comparison and the round trip through the wire form.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "testlib.h"
#include "wire.h"
#include "zctest.h"

struct fixture {
	struct zc_param_group g[2];
	struct zc_segment s0[2], s1[1];
	struct zc_bucket b[2];
	struct zc_plan p;
};

static void fixture_init(struct fixture *f)
{
	f->g[0] = (struct zc_param_group)ZC_PARAM_GROUP_INIT;
	f->g[1] = (struct zc_param_group)ZC_PARAM_GROUP_INIT;
	f->g[0].lr = 0.1;
	f->g[0].momentum = 0.9;
	f->g[1].lr = 0.01;
	f->s0[0] = (struct zc_segment)SEG(0, 30, 0);
	f->s0[1] = (struct zc_segment)SEG(30, 70, 1);
	f->s1[0] = (struct zc_segment)SEG(0, 17, 1);
	f->b[0] = (struct zc_bucket)BUCKET(100, 2, f->s0);
	f->b[1] = (struct zc_bucket)BUCKET(17, 1, f->s1);
	f->p = (struct zc_plan)PLAN(ZC_OPT_SGD, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED, 2, f->g, 2,
				    f->b);
}

static void t_valid_layout(void)
{
	struct fixture f;
	struct plan *p = NULL;
	char err[200] = "";

	fixture_init(&f);
	REQUIRE(plan_from_zc(&f.p, &p, err, sizeof(err)) == 0, "valid plan refused: %s", err);
	CHECK(p->buckets[0].base == 0, "bucket 0 base %lu", (unsigned long)p->buckets[0].base);
	CHECK(p->buckets[1].base == 112, "bucket 1 base %lu, expected 112 (100 aligned to 16)",
	      (unsigned long)p->buckets[1].base);
	CHECK(p->total_numel == 144, "total %lu, expected 144 (112 + 17 padded to 32)",
	      (unsigned long)p->total_numel);
	CHECK(plan_buffer_bytes(p) == 576, "bytes %lu", (unsigned long)plan_buffer_bytes(p));
	plan_free(p);
}

/* Each mutation must be refused with ZC_EPLANINVAL and a reason naming the
 * field. */
static const struct {
	const char *name, *needle;
} invalid_cases[] = {
	{"gap", "offset"},
	{"overrun", "numel"},
	{"short", "cover"},
	{"group", "group"},
	{"no buckets", "buckets"},
	{"no groups", "groups"},
	{"optimizer", "optimizer"},
	{"shard", "shard_mode"},
	{"step", "step_mode"},
	{"lr<0", "lr"},
	{"lr nan", "lr"},
	{"nesterov", "nesterov"},
	{"beta1", "beta1"},
	{"empty bucket", "numel"},
	{"no segments", "segments"},
	/* found by the libFuzzer target fuzz_envelope: a NaN where the
	 * optimizer does not look made equal plans unequal */
	{"momentum nan under adam", "momentum must be finite (got nan), even where unused"},
	{"beta2 inf under sgd", "beta2 must be finite"},
	{"dtype", "buckets[1].dtype: unknown value 3"},
};

static void mutate(struct fixture *f, size_t i)
{
	switch (i) {
	case 0:
		f->s0[1].offset = 31;
		break;
	case 1:
		f->s0[1].numel = 71;
		break;
	case 2:
		f->s0[1].numel = 69;
		break;
	case 3:
		f->s1[0].group = 2;
		break;
	case 4:
		f->p.nbuckets = 0;
		break;
	case 5:
		f->p.ngroups = 0;
		break;
	case 6:
		f->p.optimizer = (enum zc_optimizer)9;
		break;
	case 7:
		f->p.shard_mode = (enum zc_shard_mode)0;
		break;
	case 8:
		f->p.step_mode = (enum zc_step_mode)7;
		break;
	case 9:
		f->g[0].lr = -1;
		break;
	case 10:
		f->g[0].lr = NAN;
		break;
	case 11:
		f->g[0].nesterov = true;
		f->g[0].dampening = 0.1;
		break;
	case 12:
		f->p.optimizer = ZC_OPT_ADAM;
		f->g[1].beta1 = 1.0;
		break;
	case 13:
		f->b[1].numel = 0;
		break;
	case 14:
		f->b[1].nsegments = 0;
		break;
	case 15:
		f->p.optimizer = ZC_OPT_ADAM;
		f->g[0].momentum = NAN;
		break;
	case 16:
		f->g[1].beta2 = INFINITY;
		break;
	case 17:
		f->b[1].dtype = 3;
		break;
	}
}

static void t_invalid(void)
{
	for (size_t i = 0; i < sizeof(invalid_cases) / sizeof(invalid_cases[0]); i++) {
		struct fixture f;
		struct plan *p = NULL;
		char err[200] = "";
		int r;

		fixture_init(&f);
		mutate(&f, i);
		r = plan_from_zc(&f.p, &p, err, sizeof(err));
		CHECK(r == ZC_EPLANINVAL, "%s: got %d, expected ZC_EPLANINVAL",
		      invalid_cases[i].name, r);
		CHECK(strstr(err, invalid_cases[i].needle), "%s: reason '%s' does not name '%s'",
		      invalid_cases[i].name, err, invalid_cases[i].needle);
		plan_free(p);
	}
}

static void t_diff_names_field(void)
{
	struct fixture a, b;
	struct plan *pa = NULL, *pb = NULL;
	char field[200] = "";

	fixture_init(&a);
	fixture_init(&b);
	REQUIRE(plan_from_zc(&a.p, &pa, NULL, 0) == 0, "plan a");
	REQUIRE(plan_from_zc(&b.p, &pb, NULL, 0) == 0, "plan b");
	CHECK(plan_diff(pa, pb, field, sizeof(field)) == 0, "equal plans differ at %s", field);
	CHECK(pa->hash == pb->hash, "equal plans hash differently");
	plan_free(pb);

	b.s1[0].numel = 16;
	b.b[1].numel = 16;
	REQUIRE(plan_from_zc(&b.p, &pb, NULL, 0) == 0, "plan b'");
	CHECK(plan_diff(pa, pb, field, sizeof(field)) == 1, "different plans are equal");
	CHECK(strcmp(field, "buckets[1].numel: 17 vs 16") == 0, "field: '%s'", field);
	CHECK(pa->hash != pb->hash, "different plans hash alike");
	plan_free(pb);

	/* -0.0 == 0.0: the same plan, so the same hash (nodes compare hashes) */
	fixture_init(&b);
	b.g[1].weight_decay = -0.0;
	REQUIRE(plan_from_zc(&b.p, &pb, NULL, 0) == 0, "plan with -0.0");
	CHECK(plan_diff(pa, pb, field, sizeof(field)) == 0 && pa->hash == pb->hash,
	      "-0.0 vs 0.0: diff '%s', hashes %016llx %016llx", field,
	      (unsigned long long)pa->hash, (unsigned long long)pb->hash);
	plan_free(pb);

	fixture_init(&b);
	b.g[1].lr = 0.02;
	REQUIRE(plan_from_zc(&b.p, &pb, NULL, 0) == 0, "plan b''");
	CHECK(plan_diff(pa, pb, field, sizeof(field)) == 1 && strstr(field, "groups[1].lr"),
	      "field: '%s'", field);
	plan_free(pb);
	plan_free(pa);
}

static void t_wire_round_trip(void)
{
	struct fixture f;
	struct plan *p = NULL, *q = NULL;
	Zerod__V1__Plan pb;
	Zerod__V1__Plan *back;
	uint8_t *buf;
	size_t len;
	char field[200] = "", err[200] = "";

	fixture_init(&f);
	f.g[1].amsgrad = true;
	f.g[1].maximize = true;
	REQUIRE(plan_from_zc(&f.p, &p, NULL, 0) == 0, "plan");
	REQUIRE(plan_to_pb(p, &pb) == 0, "plan_to_pb");
	len = zerod__v1__plan__get_packed_size(&pb);
	buf = malloc(len);
	zerod__v1__plan__pack(&pb, buf);
	plan_pb_free(&pb);
	back = zerod__v1__plan__unpack(NULL, len, buf);
	REQUIRE(back, "unpack");
	CHECK(plan_from_pb(back, &q, err, sizeof(err)) == 0, "plan_from_pb: %s", err);
	if (q) {
		CHECK(plan_diff(p, q, field, sizeof(field)) == 0, "round trip differs at %s",
		      field);
		CHECK(p->hash == q->hash, "hash changed over the wire");
	}
	zerod__v1__plan__free_unpacked(back, NULL);
	free(buf);
	plan_free(p);
	plan_free(q);
}

/* Buckets of several dtypes: laid out by bytes, each on 64 bytes, base in
 * elements of its own dtype; the dtype is part of the plan's identity and
 * survives the wire; an older caller's 24-byte zc_bucket is fp32. */
static void t_dtypes(void)
{
	struct fixture f, g;
	struct plan *p = NULL, *q = NULL, *r = NULL;
	Zerod__V1__Plan pb;
	char field[200] = "", err[200] = "";

	fixture_init(&f);
	f.b[0].dtype = ZC_DTYPE_BF16; /* 100 x 2 = 200 bytes -> 256 */
	REQUIRE(plan_from_zc(&f.p, &p, err, sizeof(err)) == 0, "bf16 plan refused: %s", err);
	CHECK(p->buckets[0].dtype == ZC_DTYPE_BF16 && p->low_precision, "dtype not kept");
	CHECK(plan_bucket_offset(p, 1) == 256 && p->buckets[1].base == 64,
	      "bucket 1 at byte %lu (base %lu), expected 256 (64)",
	      (unsigned long)plan_bucket_offset(p, 1), (unsigned long)p->buckets[1].base);
	CHECK(plan_bucket_bytes(p, 0) == 200 && plan_bucket_bytes(p, 1) == 68,
	      "bucket bytes %lu, %lu", (unsigned long)plan_bucket_bytes(p, 0),
	      (unsigned long)plan_bucket_bytes(p, 1));
	CHECK(plan_buffer_bytes(p) == 256 + 128, "bytes %lu", (unsigned long)plan_buffer_bytes(p));

	fixture_init(&g);
	REQUIRE(plan_from_zc(&g.p, &q, NULL, 0) == 0, "fp32 plan");
	CHECK(plan_diff(q, p, field, sizeof(field)) == 1 &&
		      strcmp(field, "buckets[0].dtype: fp32 vs bf16") == 0,
	      "field: '%s'", field);
	CHECK(p->hash != q->hash, "the dtype does not change the hash");
	CHECK(!q->low_precision, "an fp32 plan says low_precision");

	REQUIRE(plan_to_pb(p, &pb) == 0, "plan_to_pb");
	CHECK(plan_from_pb(&pb, &r, err, sizeof(err)) == 0, "plan_from_pb: %s", err);
	if (r)
		CHECK(plan_diff(p, r, field, sizeof(field)) == 0 && r->hash == p->hash,
		      "round trip differs at %s", field);
	plan_pb_free(&pb);
	plan_free(r);
	r = NULL;

	/* an older caller's buckets (24 bytes, no dtype): read as fp32 */
	static const uint32_t old_size = 24;
	uint8_t packed[2][24] __attribute__((aligned(8)));
	for (int k = 0; k < 2; k++) {
		memcpy(packed[k], &g.b[k], 24);
		memcpy(packed[k], &old_size, sizeof(old_size));
	}
	g.p.buckets = (const struct zc_bucket *)(const void *)packed;
	CHECK(plan_from_zc(&g.p, &r, err, sizeof(err)) == 0, "24-byte buckets: %s", err);
	if (r)
		CHECK(plan_diff(q, r, field, sizeof(field)) == 0, "24-byte buckets differ at %s",
		      field);
	plan_free(r);
	plan_free(q);
	plan_free(p);
}

/* param_id: an older caller's 24-byte zc_segment is read as id 0 (and its
 * plan's hash is the one it had); ids take part in the hash, the diff and
 * the wire; a nonzero id named twice is refused, naming both places. */
struct seg_v0 {
	uint32_t size, group;
	uint64_t offset, numel;
};

static void t_param_id(void)
{
	struct fixture f;
	struct seg_v0 old0[2] = {{sizeof(struct seg_v0), 0, 0, 30},
				 {sizeof(struct seg_v0), 1, 30, 70}};
	struct seg_v0 old1[1] = {{sizeof(struct seg_v0), 1, 0, 17}};
	struct plan *a = NULL, *b = NULL, *c = NULL;
	Zerod__V1__Plan pb;
	char err[200] = "", field[200] = "";
	uint64_t hash0;

	fixture_init(&f);
	REQUIRE(plan_from_zc(&f.p, &a, err, sizeof(err)) == 0, "%s", err);
	hash0 = a->hash;
	f.b[0].segments = (const struct zc_segment *)old0;
	f.b[1].segments = (const struct zc_segment *)old1;
	REQUIRE(plan_from_zc(&f.p, &b, err, sizeof(err)) == 0, "old segments refused: %s", err);
	CHECK(b->buckets[0].segments[1].numel == 70 && b->buckets[0].segments[1].param_id == 0,
	      "an old segment read wrong");
	CHECK(b->hash == hash0, "ids 0: the hash changed");
	plan_free(b);
	b = NULL;

	fixture_init(&f);
	f.s0[0].param_id = 7, f.s0[1].param_id = 8, f.s1[0].param_id = 9;
	REQUIRE(plan_from_zc(&f.p, &b, err, sizeof(err)) == 0, "%s", err);
	CHECK(b->hash != hash0, "the ids are not in the hash");
	CHECK(plan_diff(a, b, field, sizeof(field)) == 1 && strstr(field, "param_id: 0 vs 7"),
	      "diff: %s", field);
	REQUIRE(plan_to_pb(b, &pb) == 0, "plan_to_pb");
	CHECK(plan_from_pb(&pb, &c, err, sizeof(err)) == 0 && c &&
		      c->buckets[1].segments[0].param_id == 9 && c->hash == b->hash,
	      "param_id lost on the wire");
	plan_pb_free(&pb);
	plan_free(c);

	fixture_init(&f);
	f.s0[1].param_id = 5, f.s1[0].param_id = 5;
	c = NULL;
	CHECK(plan_from_zc(&f.p, &c, err, sizeof(err)) == ZC_EPLANINVAL &&
		      strstr(err,
			     "buckets[1].segments[0].param_id: 5 is also buckets[0].segments[1]"),
	      "a duplicate id: %s", err);
	plan_free(a);
	plan_free(b);
	plan_free(c);
}

/* A re-plan: same parameters in another grouping passes (by id or by
 * position) with the map from new to old; anything else is ZC_EREPLAN. */
static void t_replan_match(void)
{
	struct fixture f;
	struct zc_segment n0[1], n1[2];
	struct zc_bucket nb[2];
	struct plan *old = NULL, *p = NULL;
	uint32_t map[3];
	char err[200] = "";

	fixture_init(&f);
	f.s0[0].param_id = 7, f.s0[1].param_id = 8, f.s1[0].param_id = 9;
	REQUIRE(plan_from_zc(&f.p, &old, err, sizeof(err)) == 0, "%s", err);
	/* by id: {9} then {8, 7} */
	n0[0] = (struct zc_segment)SEG(0, 17, 1);
	n0[0].param_id = 9;
	n1[0] = (struct zc_segment)SEG(0, 70, 1);
	n1[0].param_id = 8;
	n1[1] = (struct zc_segment)SEG(70, 30, 0);
	n1[1].param_id = 7;
	nb[0] = (struct zc_bucket)BUCKET(17, 1, n0);
	nb[1] = (struct zc_bucket)BUCKET(100, 2, n1);
	f.p.buckets = nb;
	REQUIRE(plan_from_zc(&f.p, &p, err, sizeof(err)) == 0, "%s", err);
	CHECK(plan_replan_match(old, p, map, err, sizeof(err)) == 0, "by id: %s", err);
	CHECK(map[0] == 2 && map[1] == 1 && map[2] == 0, "map %u %u %u", map[0], map[1], map[2]);
	plan_free(p);
	p = NULL;
	/* by position that does not hold: the sizes differ */
	n0[0].param_id = n1[0].param_id = n1[1].param_id = 0;
	REQUIRE(plan_from_zc(&f.p, &p, err, sizeof(err)) == 0, "%s", err);
	CHECK(plan_replan_match(old, p, map, err, sizeof(err)) == ZC_EREPLAN &&
		      strstr(err, "by position"),
	      "by position: %s", err);
	plan_free(p);
	p = NULL;
	/* another lr */
	fixture_init(&f);
	f.s0[0].param_id = 7, f.s0[1].param_id = 8, f.s1[0].param_id = 9;
	f.g[1].lr = 0.5;
	REQUIRE(plan_from_zc(&f.p, &p, err, sizeof(err)) == 0, "%s", err);
	CHECK(plan_replan_match(old, p, map, err, sizeof(err)) == ZC_EREPLAN &&
		      strstr(err, "groups[1].lr"),
	      "another lr: %s", err);
	plan_free(p);
	p = NULL;
	/* a parameter keeps its dtype */
	fixture_init(&f);
	f.s0[0].param_id = 7, f.s0[1].param_id = 8, f.s1[0].param_id = 9;
	f.b[1].dtype = ZC_DTYPE_BF16;
	REQUIRE(plan_from_zc(&f.p, &p, err, sizeof(err)) == 0, "%s", err);
	CHECK(plan_replan_match(old, p, map, err, sizeof(err)) == ZC_EREPLAN &&
		      strstr(err, "buckets[1].segments[0] (by param_id): a bf16 parameter"),
	      "another dtype: %s", err);
	plan_free(p);
	plan_free(old);
}

/* The state's layout: an fp32 plan's is its buffers'; bf16/fp16 buckets
 * take one fp32 slot per element there, each bucket padded to 16. */
static void t_state_layout(void)
{
	struct fixture f;
	struct plan *p = NULL;
	char err[200] = "";

	fixture_init(&f);
	REQUIRE(plan_from_zc(&f.p, &p, err, sizeof(err)) == 0, "%s", err);
	CHECK(p->state_numel == p->total_numel && p->buckets[1].sbase == p->buckets[1].base,
	      "fp32: state %llu, total %llu", (unsigned long long)p->state_numel,
	      (unsigned long long)p->total_numel);
	plan_free(p);
	p = NULL;
	f.b[0].dtype = ZC_DTYPE_F16; /* 100 elements: 200 bytes, 256 with padding */
	REQUIRE(plan_from_zc(&f.p, &p, err, sizeof(err)) == 0, "%s", err);
	CHECK(p->buckets[1].base == 64 && p->buckets[1].sbase == 112 && p->state_numel == 112 + 32,
	      "fp16 bucket 0: bucket 1 at %llu, state at %llu of %llu",
	      (unsigned long long)p->buckets[1].base, (unsigned long long)p->buckets[1].sbase,
	      (unsigned long long)p->state_numel);
	plan_free(p);
}

/* zc_set_state's per-segment rules (torch's state keys per optimizer). */
static void t_state_check(void)
{
	struct fixture f;
	struct plan *sgd = NULL, *adam = NULL;
	char err[200] = "";

	fixture_init(&f); /* group 0 momentum 0.9, group 1 none */
	REQUIRE(plan_from_zc(&f.p, &sgd, err, sizeof(err)) == 0, "%s", err);
	f.p.optimizer = ZC_OPT_ADAM;
	f.g[1].amsgrad = true;
	REQUIRE(plan_from_zc(&f.p, &adam, err, sizeof(err)) == 0, "%s", err);
	const uint32_t full = ZC_STATE_STEP | ZC_STATE_EXP_AVG | ZC_STATE_EXP_AVG_SQ;
	CHECK(plan_state_check(sgd, 0, 0, ZC_STATE_MOMENTUM_BUFFER, 0, err, sizeof(err)) == 0, "%s",
	      err);
	CHECK(plan_state_check(sgd, 0, 0, 0, 0, err, sizeof(err)) == 0, "%s", err);
	CHECK(plan_state_check(sgd, 0, 1, ZC_STATE_MOMENTUM_BUFFER, 0, err, sizeof(err)) ==
		      ZC_ESTATEINVAL,
	      "a momentum buffer where momentum is 0");
	CHECK(plan_state_check(sgd, 0, 0, ZC_STATE_STEP, 3, err, sizeof(err)) == ZC_ESTATEINVAL,
	      "a step for SGD");
	CHECK(plan_state_check(adam, 0, 0, full, 3, err, sizeof(err)) == 0, "%s", err);
	CHECK(plan_state_check(adam, 0, 1, full | ZC_STATE_MAX_EXP_AVG_SQ, 3, err, sizeof(err)) ==
		      0,
	      "%s", err);
	CHECK(plan_state_check(adam, 0, 1, full, 3, err, sizeof(err)) == ZC_ESTATEINVAL,
	      "amsgrad without max_exp_avg_sq");
	CHECK(plan_state_check(adam, 0, 0, full | ZC_STATE_MAX_EXP_AVG_SQ, 3, err, sizeof(err)) ==
		      ZC_ESTATEINVAL,
	      "max_exp_avg_sq without amsgrad");
	CHECK(plan_state_check(adam, 0, 0, full, NAN, err, sizeof(err)) == ZC_ESTATEINVAL &&
		      strstr(err, "buckets[0].segments[0].step"),
	      "NaN step: %s", err);
	CHECK(plan_state_check(adam, 0, 0, full, 1073741824.0, err, sizeof(err)) == ZC_ESTATEINVAL,
	      "a step of 2^30");
	CHECK(plan_state_check(adam, 2, 0, 0, 0, err, sizeof(err)) == ZC_ESTATEINVAL,
	      "bucket 2 of 2");
	CHECK(plan_state_check(adam, 1, 1, 0, 0, err, sizeof(err)) == ZC_ESTATEINVAL,
	      "segment 1 of 1");
	CHECK(plan_state_check(adam, 0, 0, ZC_STATE_MASTER, 0, err, sizeof(err)) ==
			      ZC_ESTATEINVAL &&
		      strstr(err, "fp32 parameters have no master"),
	      "a master for fp32: %s", err);
	plan_free(sgd);
	plan_free(adam);
}

static const struct test_case cases[] = {
	{"valid_layout", t_valid_layout},
	{"dtypes_by_bytes", t_dtypes},
	{"param_id", t_param_id},
	{"replan_match", t_replan_match},
	{"state_layout", t_state_layout},
	{"state_check", t_state_check},
	{"invalid_plans_refused", t_invalid},
	{"diff_names_first_field", t_diff_names_field},
	{"wire_round_trip", t_wire_round_trip},
};

TEST_MAIN(cases)
