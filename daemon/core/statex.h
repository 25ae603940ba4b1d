/*
 * statex.h — optimizer state export/import rounds of a running job, and
 * re-planning (statex.c). Loop thread only.
 */
#ifndef ZEROD_STATEX_H
#define ZEROD_STATEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "zerod.pb-c.h"

struct job;
struct plan;
struct member;

/* Rank `rank` (on this node, session s) asks to export (set false) or import
 * its state through staging stg; list: the segments it gives (import). */
void statex_request(struct job *j, struct member *s, uint32_t rank, bool set,
		    const Zerod__V1__StateStaging *stg, Zerod__V1__SegmentState *const *list,
		    size_t n);

/* zc_checkpoint()'s export (CheckpointState): an export round in which only
 * the ranks passing a staging (stg non-NULL) get the state, the step word at
 * each piece's first element only; a staging passed as a memfd is kept
 * mapped for the job's next such round (statex_kept_free). One node only. */
void statex_ckpt_request(struct job *j, struct member *s, uint32_t rank,
			 const Zerod__V1__StateStaging *stg);
/* Unmap the kept checkpoint staging: the job ends, after its executor. */
void statex_kept_free(struct job *j);
/* Rank s registers plan p (taken over) with buffers gd and pd, or CUDA
 * buffers cb (taken over; gd and pd NULL), while the job runs: a re-plan.
 * Once every local rank did, the executor stops, and
 * statex_replan_stopped() starts the job on the new plan. */
struct mem_desc;
struct cudabufs;
void statex_replan(struct job *j, struct member *s, struct plan *p, const struct mem_desc *gd,
		   const struct mem_desc *pd, struct cudabufs *cb);
/* EXEC_STOPPED of a job that re-plans: true if it was that (the job is
 * starting again), false if the job just stopped. */
bool statex_replan_stopped(struct job *j);
/* Free the re-plan in progress, if any (the job ends). */
void statex_replan_free(struct job *j);

/* The executor finished the round (EXEC_STATE_DONE): StateOk to each rank. */
void statex_done(struct job *j);

/* A state round of j is in its executor (a quiet end from another node
 * waits for it: rdzv.c). */
bool statex_busy(const struct job *j);

/* Drop the round, unmapping the staging: after the executor stopped, or
 * when nothing was queued. Accepts a job without one. */
void statex_free(struct job *j);

#endif
