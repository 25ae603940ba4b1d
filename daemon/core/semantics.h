/*
 * semantics.h — what ranks say about an iteration besides their buckets
 * (semantics.c): the segments a rank has no gradient for (zc_bucket_ready_ex)
 * and the iteration's grad scale (zc_set_grad_scale). Loop thread. A job
 * that never uses them has no record (job.sem NULL) and pays nothing.
 */
#ifndef ZEROD_SEMANTICS_H
#define ZEROD_SEMANTICS_H

#include <stdint.h>

#include "exec/exec.h"

struct job;
struct member;
struct sem_job;

/* sched_bucket_ready(), once the bucket is in order: its segment mask
 * (nwords words) checked and recorded. 0, or a code already sent to s
 * (ZC_ESEGMASK, ZC_ELIMIT): the bucket is not taken. Never calls back. */
int sem_mark(struct job *j, struct member *s, uint64_t iteration, uint32_t bucket,
	     const uint64_t *unused, size_t nwords);

/* SetGradScale of s for iteration (its current one). */
void sem_set_grad_scale(struct job *j, struct member *s, uint64_t iteration, double inv_scale);

/* Bucket b of iteration t is in from every local rank: what it brings for
 * exec_bucket_ex(), in *in (pointing into j's record until sem_clear()).
 * 1 if there is something, 0 if not, ZC_EHYPER if the local ranks disagree
 * on the grad scale (the reason in why). */
int sem_take(struct job *j, uint64_t t, uint32_t b, struct exec_bucket_in *in, char *why,
	     size_t len);
/* The bucket's ops are queued: its marks start over. */
void sem_clear(struct job *j, uint32_t b);

void sem_free(struct sem_job *s);

#endif
