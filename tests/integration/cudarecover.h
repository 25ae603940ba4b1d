/*
 * cudarecover.h — a trainer of a CUDA job dies and the job goes on from
 * zerod's memory (issue 23 §1), on the CUDA test double: test_cudajob's
 * recover_* cases (cudarecover.c). statefix.h's job on CUDA buffers; one
 * rank SIGKILLs itself at a phase of an iteration, the survivors are told
 * ZC_ERANKLOST and exit, and the whole group starts again with new device
 * buffers, rejoins the job id and trains to the end.
 */
#ifndef ZEROD_TEST_CUDARECOVER_H
#define ZEROD_TEST_CUDARECOVER_H

#include <stdatomic.h>

#include "harness.h"
#include "statefix.h"

#define CRC_MAXR 4

enum crc_phase {
	CRC_BEFORE_FIRST,  /* at the start of the kill iteration, before its bucket 0 */
	CRC_BETWEEN,       /* after the first buckets of it */
	CRC_DURING_STEP,   /* every bucket handed over, the last one's event held back */
	CRC_BETWEEN_ITERS, /* before the kill iteration, after the step before it */
	CRC_NPHASES,
};

#define CRC_EXIT_LOST  42 /* a survivor told ZC_ERANKLOST */
#define CRC_EXIT_FATAL 43 /* a rank told a fatal error */

/* What one job does; every rank runs it (in shared memory). */
struct crc_script {
	const struct zd *zd;
	char job[64];
	uint32_t world;
	enum zc_optimizer opt;
	enum zc_shard_mode shard;
	enum zc_step_mode step;
	int layout; /* crp_layouts[] */
	uint64_t seed;
	int iters, kill_iter;
	bool armed;     /* the victim dies at kill_iter, at phase */
	bool restarted; /* the group's restart: every rank must be recovered */
	uint32_t victim;
	enum crc_phase phase;
	const struct snap *want;          /* the uninterrupted run's end; NULL: no comparison */
	struct snap *out;                 /* rank 0's end, if not NULL */
	atomic_int seen[CRC_MAXR];        /* iterations whose step each rank saw complete */
	atomic_llong recovered[CRC_MAXR]; /* restarted: zc_recovered()'s iteration, -1: none */
	atomic_int fatal_code[CRC_MAXR];
	char fatal_msg[CRC_MAXR][256];
};

/* spawn()'s function: rank idx runs the script arg. 0 when it trained to
 * the end (and matched want), CRC_EXIT_LOST, CRC_EXIT_FATAL, or 1. */
int crc_rank(void *arg, int idx);

#endif
