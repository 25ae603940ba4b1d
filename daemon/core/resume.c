/*
 * resume.c — a job going on from a checkpoint's iteration (zc_restore()),
 * and checkpoints the operator asks for (zeroctl checkpoint).
 * The iteration is only a name here: the state the checkpoint holds comes
 * in through zc_set_state() (statex.c) and the parameters through the
 * ranks' own buffers. What this file owns is moving the job's count, so
 * that the ranks' next bucket (of the checkpoint's iteration) is taken.
 * Loop thread only.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "common.h"
#include "core/job.h"
#include "core/sink.h"
#include "core/resume.h"

#define RESUME_MAX_ITERATION (1ull << 53)

void resume_request(struct job *j, struct member *s, uint64_t from, uint64_t iteration)
{
	if (j->state != JOB_ACTIVE) {
		sink_error(j->core->sink, s, job_ended(j) ? ZC_EJOBFAILED : ZC_ESTATE, job_ended(j),
			   from, -1, "job %s: zc_restore(): the job is not active%s%s", j->id,
			   job_ended(j) ? ": " : "", job_ended(j) ? j->errmsg : "");
		return;
	}
	if (iteration > RESUME_MAX_ITERATION) {
		/* counts near 2^64 would wrap in j->iter + 2 and the like */
		sink_error(j->core->sink, s, ZC_ESTATE, false, from, -1,
			   "rank %u: zc_restore() to iteration %" PRIu64 ": above 2^53", s->rank,
			   iteration);
		return;
	}
	if (j->iter == iteration && !j->in_flight)
		return; /* another local rank moved it already */
	if (j->iter != from || j->in_flight) {
		sink_error(j->core->sink, s, ZC_ESTATE, false, from, -1,
			   "rank %u: zc_restore() at iteration %" PRIu64 " to go on at %" PRIu64
			   ", but the job is at iteration %" PRIu64 "%s: restore on every rank "
			   "between iterations, before the first bucket",
			   s->rank, from, iteration, j->iter,
			   j->in_flight ? ", which started" : "");
		return;
	}
	if (j->changes || j->reload_pending) {
		/* values for iterations by the old count would apply at the wrong
		 * time: the ranks set them again after the restore */
		sink_error(j->core->sink, s, ZC_ESTATE, false, from, -1,
			   "rank %u: zc_restore() with hyperparameter changes or "
			   "zc_params_changed() pending: restore first",
			   s->rank);
		return;
	}
	j->iter = iteration;
	j->snap_iter = UINT64_MAX;
}

/* The trainers write checkpoints (client/ckpt.c); the daemon only picks
 * the boundary every local rank can still see coming: j->iter + 1. The
 * step of j->iter has not been sent, so no rank is past it, and the
 * message goes before that StepDone (ZeroMQ, in order with the ring's
 * slots), so every rank knows before it gets there. Across nodes the
 * daemons' counts may differ by one at this moment: refused there. */
int resume_checkpoint_ask(struct job *j, const char *dir, uint64_t *ret_iteration,
			  uint32_t *ret_ranks, char *why, size_t len)
{
	uint32_t told = 0;

	if (!dir || dir[0] != '/' || strlen(dir) > 4000 || strpbrk(dir, "\n\r")) {
		snprintf(why, len, "the directory must be an absolute path of one line");
		return -EINVAL;
	}
	if (j->state != JOB_ACTIVE) {
		snprintf(why, len, "job %s is not active", j->id);
		return -ESTALE;
	}
	if (j->rdzv) {
		snprintf(why, len,
			 "job %s spans several nodes: its trainers call zc_checkpoint() at an "
			 "iteration they agree on",
			 j->id);
		return -ENOTSUP;
	}
	if (!j->core->sink->checkpoint_due) {
		snprintf(why, len, "no way to tell the ranks");
		return -ENOTSUP;
	}
	for (uint32_t r = 0; r < j->world; r++)
		if (j->ranks[r]) {
			j->core->sink->checkpoint_due(j->ranks[r], dir, j->iter + 1);
			told++;
		}
	*ret_iteration = j->iter + 1;
	*ret_ranks = told;
	return 0;
}
