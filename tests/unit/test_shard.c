/*
 * test_shard.c — the ownership function: units tile every bucket, loads are
 * balanced within the largest indivisible unit, no rank sits idle when there
 * are at least as many buckets as ranks, and the map is a pure function of
 * (plan, W).
 */
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "plan/shard.h"
#include "testlib.h"
#include "zctest.h"

static struct plan *make_plan(const uint64_t *sizes, uint32_t n, enum zc_shard_mode mode)
{
	struct zc_param_group g = ZC_PARAM_GROUP_INIT;
	struct zc_bucket *b = calloc(n, sizeof(*b));
	struct zc_segment *s = calloc(n, sizeof(*s));
	struct zc_plan zp = PLAN(ZC_OPT_SGD, mode, ZC_STEP_INTERLEAVED, 1, &g, n, b);
	struct plan *p = NULL;
	char err[200];

	for (uint32_t i = 0; i < n; i++) {
		s[i] = (struct zc_segment)SEG(0, sizes[i], 0);
		b[i] = (struct zc_bucket)BUCKET(sizes[i], 1, &s[i]);
	}
	if (plan_from_zc(&zp, &p, err, sizeof(err)) < 0)
		test_note("plan_from_zc: %s", err);
	free(b);
	free(s);
	return p;
}

/* Every invariant of a map; returns the number of violations. */
static int check_map(const struct plan *p, uint32_t world, const struct shard_map *m)
{
	uint64_t total = 0, *load = calloc(world, sizeof(*load)), maxload = 0, minload = UINT64_MAX;
	int bad = test_failed_;

	for (uint32_t b = 0; b < p->nbuckets; b++) {
		uint64_t at = 0;
		total += p->buckets[b].numel;
		for (uint32_t u = m->bucket_first[b]; u < m->bucket_first[b + 1]; u++) {
			const struct shard_unit *un = &m->units[u];
			CHECK(un->bucket == b, "unit %u in bucket %u's range says bucket %u", u, b,
			      un->bucket);
			CHECK(un->offset == at, "bucket %u: unit at %lu, expected %lu", b,
			      (unsigned long)un->offset, (unsigned long)at);
			CHECK(un->numel > 0, "empty unit");
			CHECK(un->owner < world, "owner %u >= world %u", un->owner, world);
			if (un->owner < world)
				load[un->owner] += un->numel;
			at += un->numel;
		}
		CHECK(at == p->buckets[b].numel, "bucket %u: units cover %lu of %lu", b,
		      (unsigned long)at, (unsigned long)p->buckets[b].numel);
	}
	CHECK(m->bucket_first[p->nbuckets] == m->nunits, "bucket_first does not end at nunits");
	for (uint32_t w = 0; w < world; w++) {
		CHECK(load[w] == m->load[w], "rank %u: load %lu, map says %lu", w,
		      (unsigned long)load[w], (unsigned long)m->load[w]);
		maxload = load[w] > maxload ? load[w] : maxload;
		minload = load[w] < minload ? load[w] : minload;
	}
	uint64_t ideal = (total + world - 1) / world;
	CHECK(maxload <= ideal + m->max_unit,
	      "max load %lu exceeds ideal %lu + largest unit %lu (W=%u, %u buckets)",
	      (unsigned long)maxload, (unsigned long)ideal, (unsigned long)m->max_unit, world,
	      p->nbuckets);
	if (p->shard_mode == ZC_SHARD_SLICE)
		CHECK(maxload - minload <= 1, "slice mode: loads differ by %lu > 1",
		      (unsigned long)(maxload - minload));
	if (p->nbuckets >= world)
		CHECK(minload > 0, "a rank sits idle with %u buckets and W=%u", p->nbuckets, world);
	free(load);
	return test_failed_ - bad;
}

static void assign_and_check(const uint64_t *sizes, uint32_t n, uint32_t world,
			     enum zc_shard_mode mode)
{
	struct plan *p = make_plan(sizes, n, mode);
	struct shard_map *m = NULL, *m2 = NULL;

	REQUIRE(p, "plan");
	REQUIRE(shard_assign(p, world, &m) == 0, "shard_assign failed");
	REQUIRE(shard_assign(p, world, &m2) == 0, "shard_assign failed");
	if (check_map(p, world, m))
		test_note("  (sizes[0]=%lu, n=%u, W=%u, mode=%d)", (unsigned long)sizes[0], n,
			  world, mode);
	CHECK(m->nunits == m2->nunits &&
		      memcmp(m->units, m2->units, m->nunits * sizeof(*m->units)) == 0,
	      "two calls gave different maps");
	shard_map_free(m);
	shard_map_free(m2);
	plan_free(p);
}

static void t_table(void)
{
	static const struct {
		uint64_t sizes[8];
		uint32_t n;
	} plans[] = {
		{{100}, 1},
		{{1, 1, 1}, 3},
		{{1000, 37, 4099, 16, 2500}, 5},
		{{25000000, 1000, 1000, 1000}, 4},
		{{7, 7, 7, 7, 7, 7, 7, 7}, 8},
		{{3}, 1},
		{{5000, 5000, 5000, 5000, 1}, 5},
		{{1 << 20, 1 << 19, 1 << 18, 1 << 17, 1 << 16, 1 << 15, 1 << 14, 1 << 13}, 8},
	};
	for (size_t i = 0; i < sizeof(plans) / sizeof(plans[0]); i++)
		for (uint32_t w = 1; w <= 9; w++) {
			assign_and_check(plans[i].sizes, plans[i].n, w, ZC_SHARD_BUCKET);
			assign_and_check(plans[i].sizes, plans[i].n, w, ZC_SHARD_SLICE);
		}
}

static void t_random(void)
{
	uint64_t s = 12345, sizes[40];

	for (int round = 0; round < 300; round++) {
		uint32_t n, w;
		s = s * 6364136223846793005ull + 1442695040888963407ull;
		n = 1 + (uint32_t)(s >> 33) % 40;
		w = 1 + (uint32_t)(s >> 20) % 16;
		for (uint32_t i = 0; i < n; i++) {
			s = s * 6364136223846793005ull + 1442695040888963407ull;
			sizes[i] = 1 + (s >> 33) % ((s >> 60) ? 100000 : 50);
		}
		assign_and_check(sizes, n, w, ZC_SHARD_BUCKET);
		assign_and_check(sizes, n, w, ZC_SHARD_SLICE);
	}
}

static void t_big_bucket_is_split(void)
{
	uint64_t sizes[] = {1000000};
	struct plan *p = make_plan(sizes, 1, ZC_SHARD_BUCKET);
	struct shard_map *m = NULL;

	REQUIRE(p && shard_assign(p, 4, &m) == 0, "assign");
	CHECK(m->nunits == 4, "one bucket over 4 ranks: %u units, expected 4", m->nunits);
	for (uint32_t w = 0; w < 4; w++)
		CHECK(m->load[w] == 250000, "rank %u load %lu", w, (unsigned long)m->load[w]);
	shard_map_free(m);
	plan_free(p);
}

static void t_not_round_robin(void)
{
	/* round-robin (torch) would give rank 0 both big buckets */
	uint64_t sizes[] = {1000, 10, 1000, 10};
	struct plan *p = make_plan(sizes, 4, ZC_SHARD_BUCKET);
	struct shard_map *m = NULL;

	REQUIRE(p && shard_assign(p, 2, &m) == 0, "assign");
	CHECK(m->load[0] == 1010 && m->load[1] == 1010, "loads %lu / %lu, expected 1010 / 1010",
	      (unsigned long)m->load[0], (unsigned long)m->load[1]);
	shard_map_free(m);
	plan_free(p);
}

static void t_bad_world(void)
{
	uint64_t sizes[] = {10};
	struct plan *p = make_plan(sizes, 1, ZC_SHARD_BUCKET);
	struct shard_map *m = NULL;

	REQUIRE(p, "plan");
	CHECK(shard_assign(p, 0, &m) < 0, "world 0 accepted");
	plan_free(p);
}

static const struct test_case cases[] = {
	{"table", t_table},
	{"random_plans", t_random},
	{"big_bucket_is_split", t_big_bucket_is_split},
	{"size_balanced_not_round_robin", t_not_round_robin},
	{"world_zero_refused", t_bad_world},
};

TEST_MAIN(cases)
