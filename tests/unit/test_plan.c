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

static const struct test_case cases[] = {
	{"valid_layout", t_valid_layout},
	{"invalid_plans_refused", t_invalid},
	{"diff_names_first_field", t_diff_names_field},
	{"wire_round_trip", t_wire_round_trip},
};

TEST_MAIN(cases)
