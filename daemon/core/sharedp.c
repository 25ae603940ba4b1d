/*
 * sharedp.c — shared parameter buffers: the local ranks of a job that
 * register one memfd for their parameters (ZC_BUFFERS_SHARED_PARAMS).
 *
 * Data-parallel replicas hold the same parameters after every step, so on
 * one node they can live in one buffer: the fused pass then reads the master
 * and writes each updated parameter once, instead of once per local rank
 * (4N(R + 2 + 2S) bytes an iteration instead of 4N(2R + 1 + 2S)). Sharing is
 * never guessed: each rank declares it, and the buffer must be the same
 * file (st_dev, st_ino of the memfd) at the same offset on every local rank
 * that declares it, and every local rank must declare it or none. Then
 * the buffer is mapped once (by the first sharing rank to register; the
 * others' j->param_map stays NULL), every local rank's entry in the
 * executor's params[] is that one pointer, and the writers skip a store
 * whose destination is its source (optim/cpu.c, coll/host.c): every path
 * that writes parameters writes each element once.
 *
 * Owns: nothing: j->sharedp (one record per rank) is job.c's.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/job.h"
#include "core/sharedp.h"
#include "zeroclient.h"

int sharedp_check(const struct job *j, uint32_t rank, const struct mem_desc *pd,
		  struct sharedp *ret, char *err, size_t errlen)
{
	return sharedp_check_in(j, j->sharedp, rank, pd, ret, err, errlen);
}

int sharedp_check_in(const struct job *j, const struct sharedp *recs, uint32_t rank,
		     const struct mem_desc *pd, struct sharedp *ret, char *err, size_t errlen)
{
	struct sharedp sp = {.set = true, .shared = pd && pd->shared};
	struct stat st;

	if (sp.shared && j->rdzv) {
		snprintf(err, errlen,
			 "rank %u: shared parameters (ZC_BUFFERS_SHARED_PARAMS) on a job over "
			 "several nodes: not supported",
			 rank);
		return ZC_ENOTSUP;
	}
	if (sp.shared && pd->kind != MEM_FD) {
		snprintf(err, errlen, "rank %u: shared parameters need memfd buffers", rank);
		return ZC_ENOTSUP;
	}
	if (sp.shared) {
		/* fdbufs.c checked the fd as mem_ops.map does: a memfd, so fstat
	 * cannot block */
		if (fstat(pd->fd, &st) < 0) {
			snprintf(err, errlen, "rank %u: fstat of its parameter buffer: %s", rank,
				 zc_strerror(-errno));
			return ZC_EBUFFER;
		}
		sp.dev = st.st_dev;
		sp.ino = st.st_ino;
		sp.offset = pd->offset;
	}
	for (uint32_t k = 0; k < j->world; k++) {
		const struct sharedp *o = &recs[k];

		if (k == rank || !o->set)
			continue;
		if (o->shared != sp.shared) {
			snprintf(
				err, errlen,
				"rank %u registered %s parameter buffer and rank %u %s: the local "
				"ranks of a job share one (ZC_BUFFERS_SHARED_PARAMS on every rank) "
				"or none",
				rank, sp.shared ? "a shared" : "its own", k,
				o->shared ? "a shared one" : "its own");
			return ZC_ESHAREDPARAMS;
		}
		if (sp.shared && (o->dev != sp.dev || o->ino != sp.ino || o->offset != sp.offset)) {
			snprintf(err, errlen,
				 "rank %u's shared parameter buffer is not rank %u's: %s (offsets "
				 "%" PRIu64 " and %" PRIu64
				 "); every local rank registers the same one",
				 rank, k,
				 o->dev != sp.dev || o->ino != sp.ino ? "another memfd"
								      : "another offset",
				 sp.offset, o->offset);
			return ZC_ESHAREDPARAMS;
		}
	}
	*ret = sp;
	return 0;
}

void sharedp_commit(struct job *j, uint32_t rank, const struct sharedp *sp)
{
	j->sharedp[rank] = *sp;
}

bool sharedp_mapped(const struct job *j, const struct sharedp *sp)
{
	return sharedp_mapped_in(j, j->sharedp, j->param_map, sp);
}

bool sharedp_mapped_in(const struct job *j, const struct sharedp *recs,
		       struct mem_map *const *maps, const struct sharedp *sp)
{
	for (uint32_t k = 0; sp->shared && k < j->world; k++)
		if (recs[k].shared && maps[k])
			return true;
	return false;
}

void sharedp_alias(const struct job *j, float **params)
{
	float *one = NULL;

	for (uint32_t k = 0; k < j->world && !one; k++)
		if (j->sharedp[k].shared)
			one = params[k];
	for (uint32_t k = 0; k < j->world; k++)
		if (j->sharedp[k].shared)
			params[k] = one;
}

void sharedp_take(struct job *j, const struct sharedp *recs)
{
	memcpy(j->sharedp, recs, j->world * sizeof(*j->sharedp));
}
