/*
 * test_lowp.c — optim/lowp.h's conversions, bit for bit, against the rules
 * zeroclient.h states for enum zc_dtype: hand-picked cases (ties both ways,
 * the largest finite values and the overflow edge, fp16 subnormals and
 * underflow, signed zeros, inf, NaN payloads), and a reference that rounds
 * by comparing distances in double (exact for these values) over every
 * fp32 exponent and sign with many mantissas. fp16 is also checked against
 * the compiler's _Float16 conversion where it has one, and widening of every
 * bf16 and fp16 pattern against the exact value.
 */
#include <math.h>
#include <stdint.h>

#include "lowp.h"
#include "testlib.h"

/* 2^e exactly */
static double pow2(int e)
{
	return ldexp(1.0, e);
}

/* The value of a finite low-precision pattern with `mbits` mantissa bits,
 * exponent bias `bias`, from its bits (the widening's definition). */
static double lp_value(uint16_t h, int ebits, int mbits)
{
	int bias = (1 << (ebits - 1)) - 1;
	uint32_t e = (h >> mbits) & ((1u << ebits) - 1), m = h & ((1u << mbits) - 1);
	double v = e ? (1.0 + m / pow2(mbits)) * pow2((int)e - bias)
		     : m / pow2(mbits) * pow2(1 - bias);

	return (h >> (ebits + mbits)) & 1 ? -v : v;
}

/* The rule: round to nearest, ties to even, overflow to inf, by distances.
 * For |x| the candidates are consecutive finite patterns lo, lo + 1 (or the
 * overflow value 2^(emax+1) past the largest). */
static uint16_t ref_narrow(float xf, int ebits, int mbits)
{
	double x = xf, ax = fabs(x);
	uint16_t sign = x < 0 || (x == 0 && signbit(xf)) ? (uint16_t)(1u << (ebits + mbits)) : 0;
	uint16_t inf = (uint16_t)(((1u << ebits) - 1) << mbits);
	uint16_t lo = 0;

	/* the largest pattern whose value is <= ax (bisection over the
	 * monotonic finite patterns 0 .. inf - 1) */
	uint16_t a = 0, b = (uint16_t)(inf - 1);
	if (lp_value(b, ebits, mbits) <= ax) {
		lo = b;
	} else {
		while (b - a > 1) {
			uint16_t mid = (uint16_t)(a + (b - a) / 2);
			if (lp_value(mid, ebits, mbits) <= ax)
				a = mid;
			else
				b = mid;
		}
		lo = a;
	}
	double vlo = lp_value(lo, ebits, mbits);
	int bias = (1 << (ebits - 1)) - 1;
	double vhi = lo + 1 == inf ? pow2(bias + 1) : lp_value((uint16_t)(lo + 1), ebits, mbits);
	double dlo = ax - vlo, dhi = vhi - ax;
	uint16_t q = dlo < dhi ? lo : dhi < dlo ? (uint16_t)(lo + 1) : (lo & 1) ? lo + 1 : lo;
	return (uint16_t)(sign | q);
}

static float f32(uint32_t u)
{
	return lowp_float(u);
}

static void t_bf16_cases(void)
{
	static const struct {
		uint32_t in;
		uint16_t out;
		const char *what;
	} c[] = {
		{0x3f800000, 0x3f80, "1.0"},
		{0x3f808000, 0x3f80, "tie, kept part even: down"},
		{0x3f818000, 0x3f82, "tie, kept part odd: up"},
		{0x3f808001, 0x3f81, "just above a tie: up"},
		{0x3f807fff, 0x3f80, "just below a tie: down"},
		{0xbf818000, 0xbf82, "negative tie to even"},
		{0x7f7f0000, 0x7f7f, "largest finite bf16"},
		{0x7f7f7fff, 0x7f7f, "below the overflow edge"},
		{0x7f7f8000, 0x7f80, "overflow edge: a tie to even is inf"},
		{0x7f7fffff, 0x7f80, "FLT_MAX: inf"},
		{0xff7fffff, 0xff80, "-FLT_MAX: -inf"},
		{0x7f800000, 0x7f80, "inf"},
		{0xff800000, 0xff80, "-inf"},
		{0x00000000, 0x0000, "+0"},
		{0x80000000, 0x8000, "-0"},
		{0x00000001, 0x0000, "smallest fp32 subnormal: 0"},
		{0x00008000, 0x0000, "subnormal tie to even: 0"},
		{0x00018000, 0x0002, "subnormal tie to even: up"},
		{0x007fffff, 0x0080, "largest fp32 subnormal rounds to the smallest normal"},
		{0x7fc00000, 0x7fc0, "quiet NaN"},
		{0x7f800001, 0x7fc0, "signalling NaN, low payload: quiet"},
		{0x7fa00000, 0x7fe0, "signalling NaN: quiet, payload's top bits kept"},
		{0xffffffff, 0xffff, "negative NaN, full payload: no carry into inf"},
	};

	for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
		uint16_t h = lowp_f32_to_bf16(f32(c[i].in));
		CHECK(h == c[i].out, "bf16(%08x) = %04x, expected %04x (%s)", c[i].in, h,
		      c[i].out, c[i].what);
	}
}

static void t_f16_cases(void)
{
	static const struct {
		uint32_t in;
		uint16_t out;
		const char *what;
	} c[] = {
		{0x3f800000, 0x3c00, "1.0"},
		{0x3f801000, 0x3c00, "tie, kept part even: down"},
		{0x3f803000, 0x3c02, "tie, kept part odd: up"},
		{0x3f801001, 0x3c01, "just above a tie: up"},
		{0x477fe000, 0x7bff, "65504, the largest finite"},
		{0x477fefff, 0x7bff, "just below the overflow edge"},
		{0x477ff000, 0x7c00, "65520, the overflow edge (a tie to even): inf"},
		{0x47800000, 0x7c00, "65536: inf"},
		{0xc7800000, 0xfc00, "-65536: -inf"},
		{0x7f7fffff, 0x7c00, "FLT_MAX: inf"},
		{0x38800000, 0x0400, "2^-14, the smallest normal"},
		{0x38000000, 0x0200, "2^-15: subnormal"},
		{0x33800000, 0x0001, "2^-24, the smallest subnormal"},
		{0x33000000, 0x0000, "2^-25: a tie to even, zero"},
		{0x33000001, 0x0001, "just above 2^-25: the smallest subnormal"},
		{0xb3000001, 0x8001, "negative: -smallest subnormal"},
		{0x32ffffff, 0x0000, "just below 2^-25: zero"},
		{0x33c00000, 0x0002, "1.5 * 2^-24: a tie, up to even"},
		{0x34200000, 0x0002, "2.5 * 2^-24: a tie, down to even"},
		{0x387fc000, 0x03ff, "1023 * 2^-24, the largest subnormal"},
		{0x387fe000, 0x0400, "largest subnormal + half: a tie, carried into the smallest normal"},
		{0x387f8000, 0x03fe, "1022.0 * 2^-24: the subnormal 0x3fe, exact"},
		{0x00000001, 0x0000, "fp32 subnormal: zero"},
		{0x80000001, 0x8000, "negative fp32 subnormal: -0"},
		{0x00000000, 0x0000, "+0"},
		{0x80000000, 0x8000, "-0"},
		{0x7f800000, 0x7c00, "inf"},
		{0xff800000, 0xfc00, "-inf"},
		{0x7fc00000, 0x7e00, "quiet NaN"},
		{0x7f800001, 0x7e00, "signalling NaN, low payload: quiet"},
		{0xffa00000, 0xff00, "negative signalling NaN: quiet, top payload kept"},
	};

	for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
		uint16_t h = lowp_f32_to_f16(f32(c[i].in));
		CHECK(h == c[i].out, "f16(%08x) = %04x, expected %04x (%s)", c[i].in, h, c[i].out,
		      c[i].what);
	}
}

/* Mantissas that matter for rounding: ties, their neighbours, both ends. */
static uint32_t probe(uint32_t k, unsigned drop)
{
	uint32_t half = 1u << (drop - 1), mask = (1u << drop) - 1;
	uint32_t low[] = {0, 1, half - 1, half, half + 1, mask, mask - 1, 0x2a5a5 & mask};
	uint32_t top = (k / 8) * 0x9e3779b1u; /* spread over the kept bits */

	return (top & ~mask & 0x7fffffu) | low[k % 8];
}

static void sweep(const char *name, uint16_t (*fn)(float), int ebits, int mbits, unsigned drop)
{
	unsigned bad = 0;

	for (uint32_t s = 0; s < 2; s++)
		for (uint32_t e = 0; e < 255; e++)
			for (uint32_t k = 0; k < 8 * 64; k++) {
				uint32_t u = s << 31 | e << 23 | probe(k, drop);
				if (!isfinite(f32(u)))
					continue; /* inf and NaN: the cases above */
				uint16_t got = fn(f32(u)), want = ref_narrow(f32(u), ebits, mbits);
				if (got != want && bad++ < 10)
					CHECK(0, "%s(%08x) = %04x, the rule gives %04x", name, u,
					      got, want);
			}
	CHECK(bad == 0, "%s: %u values differ from the rule", name, bad);
}

static void t_bf16_rule(void)
{
	sweep("bf16", lowp_f32_to_bf16, 8, 7, 16);
}

static void t_f16_rule(void)
{
	/* below fp16's range (e < 103) the kept part is smaller, so probe the
	 * ties the subnormals have too: every shift from 13 to 24 */
	sweep("f16", lowp_f32_to_f16, 5, 10, 13);
	for (unsigned d = 14; d <= 24; d++)
		sweep("f16", lowp_f32_to_f16, 5, 10, d);
}

static void t_widen(void)
{
	unsigned bad = 0;

	for (uint32_t h = 0; h < 65536; h++) {
		bool nan16 = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
		float x = lowp_f16_to_f32((uint16_t)h);
		if (nan16) {
			if (!isnan(x) || lowp_f32_to_f16(x) != (h | 0x200))
				bad++;
			continue;
		}
		double want = (h & 0x7c00) == 0x7c00 ? ((h & 0x8000) ? -INFINITY : INFINITY)
						     : lp_value((uint16_t)h, 5, 10);
		if ((double)x != want || !!signbit(x) != !!(h & 0x8000) ||
		    lowp_f32_to_f16(x) != h)
			bad++;
		float y = lowp_bf16_to_f32((uint16_t)h);
		if ((h & 0x7f80) == 0x7f80 && (h & 0x7f)) {
			if (!isnan(y) || lowp_f32_to_bf16(y) != (h | 0x40))
				bad++;
		} else if (lowp_f32_to_bf16(y) != h) {
			bad++;
		}
	}
	CHECK(bad == 0, "%u patterns do not widen exactly or come back", bad);
}

static void t_f16_compiler(void)
{
#if defined(__FLT16_MAX__)
	unsigned bad = 0;

	/* every fp32 pattern with its low 9 bits from a few values */
	for (uint32_t hi = 0; hi < (1u << 23); hi++)
		for (uint32_t lo = 0; lo < 4; lo++) {
			static const uint32_t low[] = {0, 0x100, 0x0ff, 0x1ff};
			uint32_t u = hi << 9 | low[lo];
			float x = f32(u);
			_Float16 c = (_Float16)x;
			uint16_t want;
			memcpy(&want, &c, 2);
			uint16_t got = lowp_f32_to_f16(x);
			if (isnan(x))
				continue; /* payload rules may differ: the cases above pin ours */
			if (got != want && bad++ < 10)
				CHECK(0, "f16(%08x) = %04x, _Float16 gives %04x", u, got, want);
		}
	CHECK(bad == 0, "%u values differ from _Float16", bad);
#else
	SKIP("this compiler has no _Float16");
#endif
}

static const struct test_case cases[] = {
	{"bf16_cases", t_bf16_cases},
	{"f16_cases", t_f16_cases},
	{"bf16_rule_sweep", t_bf16_rule},
	{"f16_rule_sweep", t_f16_rule, 60000},
	{"widen_every_pattern", t_widen},
	{"f16_matches_compiler", t_f16_compiler, 60000},
};

TEST_MAIN(cases)
