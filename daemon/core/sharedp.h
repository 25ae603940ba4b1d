/*
 * sharedp.h — shared parameter buffers (ZC_BUFFERS_SHARED_PARAMS): the
 * local ranks of a job that all register one parameter buffer, which the
 * daemon then writes once per step (docs/DATAPLANE.md, "Shared
 * parameters"). All on the loop thread.
 */
#ifndef ZEROD_SHAREDP_H
#define ZEROD_SHAREDP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "mem/mem.h"

struct job;

/* What one rank registered as its parameter buffer. */
struct sharedp {
	bool set;    /* the rank registered */
	bool shared; /* with ZC_BUFFERS_SHARED_PARAMS */
	dev_t dev;   /* the memfd's file, when shared */
	ino_t ino;
	uint64_t offset;
};

/* job.c, as rank registers pd (NULL: CUDA buffers), before mapping it: its
 * record in *ret, or ZC_ESHAREDPARAMS (its flag or its buffer differs from
 * a local rank's that registered before), ZC_ENOTSUP (the flag on a job
 * over several nodes, or on buffers that are not memfds), with the reason
 * in err. */
int sharedp_check(const struct job *j, uint32_t rank, const struct mem_desc *pd,
		  struct sharedp *ret, char *err, size_t errlen);

/* The same against the records recs[world] (statex.c: a re-plan's, before
 * they replace the job's). */
int sharedp_check_in(const struct job *j, const struct sharedp *recs, uint32_t rank,
		     const struct mem_desc *pd, struct sharedp *ret, char *err, size_t errlen);

/* job.c, after sharedp_check(): true if sp is shared and a local rank
 * registered before mapped the buffer: this rank's is not mapped again (its
 * j->param_map entry stays NULL). Every sharing rank registers the same
 * memfd at the same offset for the same plan, so the first one's mapping
 * (which passed mem_ops.map's checks) serves them all. */
bool sharedp_mapped(const struct job *j, const struct sharedp *sp);
/* The same against a re-plan's records and mappings ([world] each). */
bool sharedp_mapped_in(const struct job *j, const struct sharedp *recs,
		       struct mem_map *const *maps, const struct sharedp *sp);

/* job.c: rank registered with record sp (from sharedp_check). */
void sharedp_commit(struct job *j, uint32_t rank, const struct sharedp *sp);

/* job.c, as the job starts: every local rank that shares points at the
 * one mapping of the buffer in params[] (the executor's; NULL for the
 * ranks that did not map it), so that every writer sees one buffer and
 * writes it once. */
void sharedp_alias(const struct job *j, float **params);

/* statex.c, as a re-plan's buffers replace the job's: its records recs
 * [world] replace the job's (all unset when every rank re-planned into its
 * own buffers, zc_alloc_buffers(); shared ones from
 * zc_alloc_buffers_shared()). */
void sharedp_take(struct job *j, const struct sharedp *recs);

#endif
