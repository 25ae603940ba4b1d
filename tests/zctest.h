/*
 * zctest.h — zeroclient.h's plan structs in one expression, for tests: each
 * with its size set (zeroclient.h, "ABI"), the arguments in field order of
 * the structs before they had one.
 */
#ifndef ZEROD_ZCTEST_H
#define ZEROD_ZCTEST_H

#include "zeroclient.h"

#define SEG(off, n, grp)                                                                           \
	{                                                                                          \
		.size = sizeof(struct zc_segment), .group = (grp), .offset = (off), .numel = (n)   \
	}
#define BUCKET(n, nseg, segs)                                                                      \
	{                                                                                          \
		.size = sizeof(struct zc_bucket), .nsegments = (nseg), .numel = (n),               \
		.segments = (segs)                                                                 \
	}
#define PLAN(opt, shard, step, ng, g, nb, b)                                                       \
	{                                                                                          \
		.size = sizeof(struct zc_plan), .optimizer = (opt), .shard_mode = (shard),         \
		.step_mode = (step), .ngroups = (ng), .nbuckets = (nb), .groups = (g),             \
		.buckets = (b)                                                                     \
	}
/* A param group of designated fields: {GROUP_SIZE, .lr = 0.1} (the others 0). */
#define GROUP_SIZE .size = sizeof(struct zc_param_group)

#endif
