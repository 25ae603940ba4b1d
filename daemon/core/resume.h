/*
 * resume.h — the job's iteration count moved to a checkpoint's (resume.c).
 * Loop thread only.
 */
#ifndef ZEROD_RESUME_H
#define ZEROD_RESUME_H

#include <stdint.h>

struct job;
struct member;

/* Rank s, at iteration `from` between iterations, goes on at `iteration`:
 * the first local rank moves the job, the others find it moved. A refusal
 * is an Error to s (ZC_ESTATE: the job is elsewhere or mid-iteration). */
void resume_request(struct job *j, struct member *s, uint64_t from, uint64_t iteration);

/* zeroctl checkpoint: tell every local rank of j to checkpoint into dir at
 * the next iteration boundary. 0 with that iteration and the ranks told, or
 * -EINVAL / -ENOTSUP / -ESTALE with the reason in why. */
int resume_checkpoint_ask(struct job *j, const char *dir, uint64_t *ret_iteration,
			  uint32_t *ret_ranks, char *why, size_t len);

#endif
