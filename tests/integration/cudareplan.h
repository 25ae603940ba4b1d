/*
 * cudareplan.h — a rank of statefix.h's job on CUDA buffers (the CUDA test
 * double) that may re-plan between iterations: test_cudajob's replan_*
 * cases (cudareplan.c).
 */
#ifndef ZEROD_TEST_CUDAREPLAN_H
#define ZEROD_TEST_CUDAREPLAN_H

#include "harness.h"
#include "statefix.h"

/* What one job does; every rank runs the same script (in shared memory). */
struct crp_script {
	const struct zd *zd;
	char job[64];
	uint32_t world;
	enum zc_optimizer opt;
	enum zc_shard_mode shard, shard2; /* before and after the re-plan */
	enum zc_step_mode step;
	int layout; /* crp_layouts[] */
	bool ids;
	uint64_t seed;
	int start, iters;    /* iterations [start, start + iters) */
	bool load;           /* start from *in (parameters and state) */
	int replan_at;       /* before this iteration, re-plan (-1: never) */
	int replan_layout;   /* to crp_layouts[replan_layout] */
	bool replan_regroup; /* the new plan moves a parameter to another group */
	int replan_code;     /* the re-plan's expected error (0: it is taken) */
	struct snap *in, *out, *want;
	/* over several zerods (nnodes > 1): rank r on node node_of[r] */
	uint32_t nnodes;
	uint32_t node_of[4];
	char socks[2][192];
	char rdzv[32];
};

extern const struct layout crp_layouts[];

/* Device buffers for tp's plan (both in one allocation, at offsets, on
 * the current device), and zc_register_buffers(): the first registration
 * or a re-plan's; the allocation in *ret_base. */
int crp_buffers(zc_client *c, const struct tplan *tp, char **ret_base);

/* Iteration t's step on a CUDA client: its future, waited for (30 s),
 * then stream ordered behind zerod's writes and synchronised. 0 or the
 * error (ZC_ETIMEDOUT if it did not complete). */
int crp_step(zc_client *c, uint64_t t, void *stream);

/* spawn()'s function: rank idx runs the script arg; 0 if all went as
 * expected. */
int crp_rank(void *arg, int idx);

#endif
