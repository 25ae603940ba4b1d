/*
 * trainer.h — a test trainer rank and its single-process reference.
 *
 * Every rank of a job feeds gradients that differ per rank, iteration and
 * element (det_uniform), hands its buckets over in order, waits for the
 * step, and at the end compares its parameter buffers with a non-sharded,
 * single-process reference computed here: the average of all ranks'
 * gradients, then the optimizer loops written out independently of the
 * daemon's kernels (in the order optim.h documents).
 */
#ifndef ZEROD_TEST_TRAINER_H
#define ZEROD_TEST_TRAINER_H

#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include "zeroclient.h"

#define TRAIN_MAX_GROUPS  3
#define TRAIN_MAX_BUCKETS 8

/*
 * A job that trains until the test says stop, in shared memory (MAP_SHARED)
 * the ranks inherit. Rank 0 alone picks the last iteration: it sees the
 * request at the start of iteration i and lets every rank run through i.
 * No rank can have started i + 1 by then (that needs rank 0's buckets of i),
 * so all ranks stop at the same iteration.
 */
struct train_stop {
	atomic_int requested;
	atomic_int stop_at;         /* INT_MAX until rank 0 picks */
	atomic_int done;            /* iterations rank 0 completed */
	atomic_llong worst_iter_us; /* rank 0's slowest iteration (the test may reset it) */
	atomic_llong iter_start_ms; /* when rank 0's iteration in flight began; 0: none */
};
/* A fresh train_stop in shared memory (abort()s if it cannot map). */
struct train_stop *train_stop_new(void);

struct train_spec {
	const char *socket;
	const char *job;
	uint32_t world;
	enum zc_optimizer optimizer;
	enum zc_shard_mode shard_mode;
	enum zc_step_mode step_mode;
	int iters;               /* how many, or the most with stop */
	struct train_stop *stop; /* NULL: run all iters */
	uint64_t seed;
	int hyper_iter;   /* from this iteration on, group 0's lr is halved (< 0: never) */
	int sleep_us;     /* pause per iteration (to make a job last) */
	double tolerance; /* 0: bit-exact, else max relative difference */

	/* A job over several nodes (rdzv NULL: every rank on `socket`'s node). */
	const char *rdzv;            /* host:port */
	uint32_t nnodes;
	const char *secret;
	const uint32_t *node_of;     /* [world]: each rank's node as the rendezvous numbers them;
					the reference sums in that order (docs/DATAPLANE.md) */
	bool explicit_nodes;         /* name each rank's node (else the rendezvous derives it) */
	const char *const *sockets;  /* [nnodes]: each node's zerod */
	const char *const *rdzvs;    /* optional [nnodes]: the rendezvous as each node names it */
	int plan_variant_node;       /* that node's ranks declare another group 0 lr (-1: none) */
	int die_rank, die_iter;      /* that rank exits after half its buckets of that iteration
					(die_iter < 0: never) */
	struct train_result *results; /* optional [world], shared memory: how each rank ended */
	int kill_rank1, kill_iter;    /* rank kill_rank1 - 1 SIGKILLs itself after half its buckets
					of iteration kill_iter, on any job (kill_rank1 0: never) */
	const struct train_hooks *hooks; /* NULL: host buffers, zc_bucket_ready */
};

/* Another way to give the buffers and hand buckets over (the CUDA tests):
 * each member may be NULL (the default). */
struct train_hooks {
	/* instead of zc_alloc_buffers() */
	int (*buffers)(zc_client *c, const struct zc_plan *plan, uint32_t rank);
	/* instead of zc_bucket_ready(), once bucket b's gradients are written */
	int (*ready)(zc_client *c, uint32_t b, uint64_t numel, zc_future **ret);
	/* after iteration it's step future completed (before it is freed) */
	int (*stepped)(zc_client *c, zc_future *step, int it);
};

/* How a rank ended: 0, or the first error and its message. */
struct train_result {
	int code;
	int iterations; /* completed */
	char msg[400];
};

/* The plan the tests use for spec (groups and buckets in static storage
 * owned by *storage). */
struct train_plan {
	struct zc_param_group groups[TRAIN_MAX_GROUPS];
	struct zc_segment segs[TRAIN_MAX_BUCKETS][4];
	struct zc_bucket buckets[TRAIN_MAX_BUCKETS];
	struct zc_plan plan;
};
void train_make_plan(const struct train_spec *s, struct train_plan *tp);

/* Run rank `rank` to the end; 0 if its final parameters match the
 * reference, else 1 (reasons printed as TAP comments). */
int train_rank(const struct train_spec *s, uint32_t rank);

/*
 * A 2-rank job that trains in the background of a test's cases, to show that
 * what the cases do to zerod harms no one else: bg_job_new() in main()
 * (memory the case processes share), bg_job_start() in the first case with
 * its spec (stop is set here), bg_job_finish() in the last: it stops the job
 * and checks both ranks ended at the reference (CHECK, as a case does).
 */
struct bg_job {
	struct train_stop *stop;
	pid_t pids[2];
	struct train_spec spec;
};
struct bg_job *bg_job_new(void);
void bg_job_start(struct bg_job *bg, const struct train_spec *spec);
void bg_job_finish(struct bg_job *bg);

#endif
