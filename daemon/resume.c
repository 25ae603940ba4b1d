/*
 * resume.c — a job going on from a checkpoint's iteration (zc_restore()).
 * The iteration is only a name here: the state the checkpoint holds comes
 * in through zc_set_state() (statex.c) and the parameters through the
 * ranks' own buffers. What this file owns is moving the job's count, so
 * that the ranks' next bucket (of the checkpoint's iteration) is taken.
 * Loop thread only.
 */
#include <inttypes.h>

#include "common.h"
#include "daemon.h"
#include "resume.h"

void resume_request(struct job *j, struct session *s, uint64_t from, uint64_t iteration)
{
	if (j->state != JOB_ACTIVE) {
		sink_error(j->d->sink, s, job_ended(j) ? ZC_EJOBFAILED : ZC_ESTATE,
			   job_ended(j), from, -1, "job %s: zc_restore(): the job is not active%s%s",
			   j->id, job_ended(j) ? ": " : "", job_ended(j) ? j->errmsg : "");
		return;
	}
	if (j->iter == iteration && !j->in_flight)
		return; /* another local rank moved it already */
	if (j->iter != from || j->in_flight) {
		sink_error(j->d->sink, s, ZC_ESTATE, false, from, -1,
			   "rank %u: zc_restore() at iteration %" PRIu64 " to go on at %" PRIu64
			   ", but the job is at iteration %" PRIu64 "%s: restore on every rank "
			   "between iterations, before the first bucket",
			   s->rank, from, iteration, j->iter, j->in_flight ? ", which started" : "");
		return;
	}
	if (j->changes || j->reload_pending) {
		/* values for iterations by the old count would apply at the wrong
		 * time: the ranks set them again after the restore */
		sink_error(j->d->sink, s, ZC_ESTATE, false, from, -1,
			   "rank %u: zc_restore() with hyperparameter changes or "
			   "zc_params_changed() pending: restore first",
			   s->rank);
		return;
	}
	j->iter = iteration;
	j->snap_iter = UINT64_MAX;
}
