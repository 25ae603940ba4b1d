/*
 * statefix.h — the job the optimizer-state tests train: NP parameter tensors
 * (numel, group); a layout groups them into buckets in some order.
 * Gradients are a function of (rank, iteration, parameter, element), never
 * of the layout, so every layout trains the same numbers, and the
 * single-process reference here (refoptim.c's loops, per parameter, the
 * gradient summed in the daemons' order and divided once) must equal the
 * daemon's parameters and state bit for bit, in any layout, shard mode, world
 * size and node count. Used by test_state.c (export, import, re-plan) and
 * test_ckpt.c (checkpoints, crashes).
 */
#ifndef ZEROD_TEST_STATEFIX_H
#define ZEROD_TEST_STATEFIX_H

#include <stdbool.h>
#include <stdint.h>

#include "zeroclient.h"

#define NP   6
#define MAXB 4

struct sf_param {
	uint64_t numel;
	uint32_t group;
};
extern const struct sf_param params[NP];

/* A layout: buckets of parameter indices, -1 ends a bucket's list. */
struct layout {
	uint32_t nbuckets;
	int b[MAXB][NP + 1];
};

/* The bf16/fp16 cases set this before their scripts: parameters then have
 * the dtypes fp32, bf16, fp16, fp32, bf16, fp16 (else all fp32); every
 * bucket of their layouts must hold one dtype. */
extern bool sf_lowp;
extern const enum zc_dtype sf_lowp_dt[NP];
/* From this iteration on group 0's lr is halved (zc_set_hyper), -1: never;
 * the case sets it for both the reference and its script. */
extern int sf_hyper_iter;

enum zc_dtype dtype_of(int k);
uint64_t total_numel(void);
/* Parameter k's first element in parameter order. */
uint64_t param_base(int k);

struct tplan {
	struct zc_param_group groups[3];
	struct zc_segment segs[MAXB][NP];
	struct zc_bucket buckets[MAXB];
	struct zc_plan plan;
	/* where each parameter is */
	uint32_t bucket_of[NP], seg_of[NP];
};
/* The three groups of optimizer opt. */
void set_groups(enum zc_optimizer opt, struct zc_param_group *g);
/* The plan of layout l; ids: every segment's param_id is 100 + its index
 * (else 0: matched by position). */
void make_plan(struct tplan *tp, const struct layout *l, enum zc_optimizer opt,
	       enum zc_shard_mode shard, enum zc_step_mode step, bool ids);

float grad_value(uint64_t seed, uint32_t rank, int it, int k, uint64_t i);
float init_value(uint64_t seed, int k, uint64_t i);

/* A whole job's parameters and optimizer state, by parameter (flat in
 * parameter order), in memory shared by the test's processes. */
struct snap {
	bool valid;
	uint32_t present[NP];
	double step[NP];
	float p[9000], m[9000], v[9000], vmax[9000];
	float master[9000]; /* bf16/fp16 parameters (sf_lowp) */
};
_Static_assert(9000 >= 1000 + 37 + 5001 + 16 + 2500 + 300, "snap holds every parameter");

void snap_init(struct snap *s, uint64_t seed);
/* The gradients' sum in the daemons' order (docs/DATAPLANE.md): each node's
 * ranks in rank order, then the nodes in node order; node_of NULL: one node. */
float grad_sum(uint64_t seed, uint32_t world, const uint32_t *node_of, int it, int k, uint64_t i);
/* The reference: iterations [from, to) with `world` ranks, on s (one node,
 * or ranks on node_of's nodes). */
void ref_train(struct snap *s, enum zc_optimizer opt, uint64_t seed, uint32_t world, int from,
	       int to);
void ref_train_nodes(struct snap *s, enum zc_optimizer opt, uint64_t seed, uint32_t world,
		     const uint32_t *node_of, int from, int to);
/* segs[k] for parameter k in tp's layout, pointing into s. */
void snap_segs(struct snap *s, const struct tplan *tp, enum zc_optimizer opt,
	       struct zc_segment_state *segs);
/* Export the client's parameters and state into a snap (zc_get_state). */
int export_snap(zc_client *c, const struct tplan *tp, enum zc_optimizer opt, struct snap *out);
/* The rank's side of a job over nnodes > 1 zerods, rank r on node_of[r]:
 * cfg's node fields and its place among its node's ranks (not its socket). */
void sf_config_nodes(struct zc_config *cfg, uint32_t rank, uint32_t world, const uint32_t *node_of,
		     uint32_t nnodes, const char *rdzv, const char *secret);
/* from's parameters into the client's parameter buffers, by tp's layout; 0,
 * or -1 if the client has no buffer for a bucket. */
int sf_fill_params(zc_client *c, const struct tplan *tp, const struct snap *from);
/* rank's gradients of iteration it into the client's gradient buffers, by
 * tp's layout; 0, or -1 if the client has no buffer for a bucket. */
int sf_fill_grads(zc_client *c, const struct tplan *tp, uint64_t seed, uint32_t rank, int it);
/* The job's start on a client whose buffers tp's plan has: *in's parameters
 * (or snap_init()'s for seed when in is NULL), zc_register_plan(), then with
 * in, its state imported (zc_set_state). 0, or the failing step's error with
 * *step naming it ("register_plan", "set_state"; left as it was if a buffer
 * is missing). */
int sf_begin(zc_client *c, const struct tplan *tp, enum zc_optimizer opt, const struct snap *in,
	     uint64_t seed, const char **step);
/* Import s (parameters are not touched) with zc_set_state; its result. */
int sf_import(zc_client *c, const struct tplan *tp, enum zc_optimizer opt, struct snap *s);
/* Before iteration it: at sf_hyper_iter, group 0's lr halved
 * (zc_set_hyper); zc_set_hyper's result then, else 0. */
int sf_hyper_at(zc_client *c, const struct tplan *tp, int it);
/* Bit for bit, reasons as TAP comments; how many differences (at most a few
 * are printed). */
int snap_compare(const char *what, const struct snap *got, const struct snap *want,
		 enum zc_optimizer opt);

#endif
