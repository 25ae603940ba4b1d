/*
 * semtrain.h — a test trainer for torch's semantics (issue 6 §4): segments
 * some ranks (or all) have no gradient for, set_hyper twice, gradient
 * clipping (global and per group), a grad scale with a non-finite gradient,
 * and the single-process reference written from torch's formulas
 * (clip_grad_norm_, GradScaler's unscale and skip, an optimizer that skips a
 * parameter whose .grad is None). Every rank computes the reference itself
 * and compares its parameters after every iteration, and its step futures'
 * zc_step_info.
 */
#ifndef ZEROD_TEST_SEMTRAIN_H
#define ZEROD_TEST_SEMTRAIN_H

#include <stdbool.h>
#include <stdint.h>

#include "zeroclient.h"

/* The plan: 2 groups; bucket 0 of 3 segments, bucket 1 of 2, bucket 2 of
 * 70 small ones (a two-word mask). */
#define SEM_NB   3
#define SEM_MAXW 4

struct sem_spec {
	const char *job;
	uint32_t world;
	const char *socket; /* one node */
	/* several nodes: rank r on sockets[node_of[r]] */
	const char *rdzv;
	uint32_t nnodes;
	const char *const *sockets;
	const uint32_t *node_of;

	enum zc_optimizer opt;
	enum zc_shard_mode shard;
	enum zc_step_mode step;
	int iters;
	uint64_t seed;
	struct zc_param_group hp[2]; /* the groups as declared */
	double max_grad_norm;        /* the plan's */
	bool masks;                  /* segments unused by all ranks, or some, by iteration */
	int hyper_iter;              /* set_hyper of group 0 twice before this iteration */
	struct zc_param_group hyper_first, hyper_last;
	bool scale;             /* gradients x 1024, zc_set_grad_scale(1/1024) */
	int scale_odd_rank;     /* this rank sets 1/512 (< 0: none) */
	int inf_rank, inf_iter; /* that rank writes +inf into a gradient (< 0: never) */
	int bad_masks_rank;     /* that rank first tries bad masks (< 0: none) */
	double tolerance;       /* 0: bit for bit */
	int expect_code;        /* a rank's step must fail with this (0: succeed) */
	const char *expect_msg; /* ... its message holding this */
	/* instead of zc_alloc_buffers() (the CUDA tests: device buffers the
	 * host can write, on the test double); NULL: host buffers */
	int (*buffers)(zc_client *c, const struct zc_plan *plan, uint32_t rank);
};

/* Defaults: no masks, no clipping, no scale, 6 iterations, lr 0.05. */
void sem_spec_init(struct sem_spec *s, const char *job, uint32_t world);

/* Run rank `rank` of s: 0 if everything matched, else 1 (reasons as TAP
 * comments). */
int sem_rank(const struct sem_spec *s, uint32_t rank);

#endif
