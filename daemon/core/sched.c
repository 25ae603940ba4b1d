/*
 * sched.c — iterations. Checks the hook order of every bucket (0, 1, 2, ...
 * per rank and iteration), counts arrivals, and once bucket b is ready on
 * every rank queues its ops (zero.h) on the job's executor.
 *
 * Completions become BucketDone(t, b) once bucket b is reduced and StepDone(t)
 * once every op of the iteration is done. Bucket b is complete on all ranks only after every rank
 * sent b, and each rank sends in order, so ops are always submitted in bucket order. A bad bucket
 * is an error to its sender and changes nothing else; a rank that stops sending is named by the
 * stall check.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "base/config.h"
#include "core/hooks.h"
#include "core/job.h"
#include "core/rdzv.h"
#include "core/reform.h"
#include "core/sched.h"
#include "core/statex.h"
#include "exec/exec.h"
#include "core/sink.h"
#include "base/log.h"
#include "core/semantics.h"

void sched_start(struct job *j)
{
	struct zc_param_group *snap = NULL;
	uint64_t recovered;

	j->arrived = calloc(j->plan->nbuckets, sizeof(*j->arrived));
	if (j->groups) {
		/* a re-plan (same groups): the hyperparameters in force go on */
		snap = malloc(j->plan->ngroups * sizeof(*snap));
		if (snap)
			memcpy(snap, j->groups, j->plan->ngroups * sizeof(*snap));
		if (!snap || exec_hyper(j->exec, snap) < 0) {
			job_fail(j, ZC_ELIMIT, true, "out of memory");
			return;
		}
	} else {
		j->groups = calloc(j->plan->ngroups, sizeof(*j->groups));
		if (j->groups)
			memcpy(j->groups, j->plan->groups, j->plan->ngroups * sizeof(*j->groups));
	}
	if (!j->arrived || !j->groups) {
		job_fail(j, ZC_ELIMIT, true, "out of memory");
		return;
	}
	recovered = reform_started(j); /* a re-formed job goes on where it was */
	job_set_state(j, JOB_ACTIVE);
	j->progress_ms = now_ms();
	for (uint32_t r = 0; r < j->world; r++)
		if (j->ranks[r])
			j->core->sink->plan_ok(j->ranks[r], j->plan->hash, recovered);
	/* unmapping the old buffers frees their pages (zerod held the last
	 * mapping): after the ranks were told, who meanwhile fill their first
	 * gradients */
	reform_free(j);
	log_info("job %s: active", j->id);
}

static bool job_usable(struct job *j, struct member *s, uint64_t iteration, int64_t bucket)
{
	if (j->state == JOB_ACTIVE)
		return true;
	if (job_ended(j)) {
		job_went_on(j, s);
		sink_error(j->core->sink, s, ZC_EJOBFAILED, true, iteration, bucket,
			   "job %s failed: %s: %s", j->id, zc_strerror_name(j->err), j->errmsg);
	} else
		sink_error(j->core->sink, s, ZC_ESTATE, false, iteration, bucket,
			   "job %s: the plan is not registered by every rank yet", j->id);
	return false;
}

/* Another rank's values than the ones that apply: ZC_EHYPER to that rank.
 * Not the answer to the message being handled (some rank's bucket 0), so it
 * carries no request id: it must fail no future of that request. */
static void hyper_disagrees(struct job *j, const struct hyper_change *c,
			    const struct hyper_change *applied)
{
	char msg[256];

	if (!j->ranks[c->rank])
		return;
	snprintf(msg, sizeof(msg),
		 "rank %u set other hyperparameters for group %u at iteration %" PRIu64
		 " than rank %u (lr %g vs %g): rank %u's apply",
		 c->rank, c->group, c->iteration, applied->rank, c->values.lr, applied->values.lr,
		 applied->rank);
	j->core->sink->error_unasked(j->ranks[c->rank], ZC_EHYPER, c->iteration, msg);
}

/* Fix iteration t's hyperparameters: apply the changes due by t. The list
 * holds each rank's last values per (iteration, group), sorted by iteration,
 * group and rank, and every local rank's calls for t came before its bucket
 * 0 of t: so here, at bucket 0 of t, the ranks are compared. Where they
 * differ, the lowest rank's values apply (its initial parameters did too). */
static int take_snapshot(struct job *j, uint64_t t)
{
	struct hyper_change *applied = NULL;
	struct zc_param_group *snap;
	bool changed = false;

	while (j->changes && j->changes->iteration <= t) {
		struct hyper_change *c = j->changes;

		j->changes = c->next;
		if (applied && applied->iteration == c->iteration && applied->group == c->group) {
			if (!plan_group_equal(&c->values, &applied->values))
				hyper_disagrees(j, c, applied);
			free(c);
			continue;
		}
		j->groups[c->group] = c->values;
		changed = true;
		free(applied);
		applied = c;
	}
	free(applied);
	j->snap_iter = t;
	if (!changed)
		return 0;
	snap = malloc(j->plan->ngroups * sizeof(*snap));
	if (!snap)
		return -ENOMEM;
	memcpy(snap, j->groups, j->plan->ngroups * sizeof(*snap));
	return exec_hyper(j->exec, snap);
}

static void bucket_complete(struct job *j, uint32_t b)
{
	struct exec_bucket_in in;
	uint64_t t = j->iter;
	char why[256];
	int r = 0, has;

	has = sem_take(j, t, b, &in, why, sizeof(why));
	if (has < 0) {
		job_fail(j, has, true, "%s", why);
		return;
	}
	if (b == 0)
		r = take_snapshot(j, t);
	/* every local rank handed bucket 0 over: their edits are done */
	if (r >= 0 && b == 0 && j->reload_pending && j->reload_iter == t) {
		j->reload_pending = false;
		r = exec_reload(j->exec);
	}
	if (r >= 0)
		r = exec_bucket_ex(j->exec, t, b, has ? &in : NULL);
	sem_clear(j, b);
	if (r >= 0)
		CORE_HOOK(j->core, bucket_queued, j, t, b);
	if (r < 0)
		job_fail(j, ZC_EINTERNAL, true, "cannot queue iteration %" PRIu64 " bucket %u: %s",
			 t, b, zc_strerror(r));
}

void sched_bucket_ready(struct job *j, struct member *s, uint64_t iteration, uint32_t bucket,
			const uint64_t *unused, size_t nwords)
{
	uint64_t it = iteration;
	int64_t bk = bucket;
	uint32_t nb, next;

	if (!job_usable(j, s, it, bk))
		return;
	nb = j->plan->nbuckets;
	if (bucket >= nb) {
		sink_error(j->core->sink, s, ZC_EBUCKET, false, it, bk,
			   "bucket %u does not exist: the plan has %u buckets", bucket, nb);
		return;
	}
	if (iteration > j->iter) {
		sink_error(j->core->sink, s, ZC_EEARLY, false, it, bk,
			   "bucket %u of iteration %" PRIu64 " arrived while iteration %" PRIu64
			   " is still in flight: wait for its step before the next backward",
			   bucket, iteration, j->iter);
		return;
	}
	if (iteration < j->iter) {
		sink_error(j->core->sink, s, ZC_EDUPBUCKET, false, it, bk,
			   "iteration %" PRIu64 " is already complete (now %" PRIu64 ")", iteration,
			   j->iter);
		return;
	}
	next = j->next_bucket[s->rank];
	if (bucket < next) {
		sink_error(j->core->sink, s, ZC_EDUPBUCKET, false, it, bk,
			   "rank %u sent bucket %u twice in iteration %" PRIu64, s->rank, bucket,
			   iteration);
		return;
	}
	if (bucket > next) {
		sink_error(j->core->sink, s, ZC_EORDER, false, it, bk,
			   "rank %u sent bucket %u but bucket %u comes first (buckets go "
			   "0, 1, 2, ... every iteration)",
			   s->rank, bucket, next);
		return;
	}
	if (nwords && sem_mark(j, s, iteration, bucket, unused, nwords) < 0)
		return;
	j->next_bucket[s->rank] = next + 1;
	CORE_HOOK(j->core, bucket_ready, j, s->rank, iteration, bucket);
	j->in_flight = true;
	j->progress_ms = now_ms();
	if (++j->arrived[bucket] == j->local_size)
		bucket_complete(j, bucket);
}

void sched_set_hyper(struct job *j, struct member *s, uint64_t iteration, uint32_t group,
		     const struct zc_param_group *hp)
{
	struct zc_param_group g = *hp;
	struct hyper_change **pp, *c;
	char err[192];

	if (!job_usable(j, s, iteration, -1))
		return;
	if (group >= j->plan->ngroups) {
		sink_error(j->core->sink, s, ZC_EHYPER, false, SINK_NO_ITERATION, -1,
			   "group %u does not exist: the plan has %u groups", group,
			   j->plan->ngroups);
		return;
	}
	if (plan_group_check(j->plan->optimizer, &g, err, sizeof(err)) < 0 ||
	    plan_clip_check(j->plan, &g, err, sizeof(err)) < 0) {
		sink_error(j->core->sink, s, ZC_EHYPER, false, SINK_NO_ITERATION, -1,
			   "group %u: %s", group, err);
		return;
	}
	/* The state was sized for the plan's groups: an array the job never
	 * had cannot appear mid-run (torch cannot turn amsgrad on either). */
	if (plan_state_arrays(j->plan->optimizer, &g, 1) & ~j->state_arrays) {
		sink_error(j->core->sink, s, ZC_EHYPER, false, SINK_NO_ITERATION, -1,
			   "group %u: %s needs optimizer state this job does not keep: "
			   "declare it in the plan's groups",
			   group, j->plan->optimizer == ZC_OPT_SGD ? "momentum" : "amsgrad");
		return;
	}
	/* A trainer names the next iteration it has not started, which is at
	 * most two ahead of the job's; anything further is refused so pending
	 * changes stay few (at most 3 per group). */
	if (iteration > j->iter + 2) {
		sink_error(j->core->sink, s, ZC_EHYPER, false, iteration, -1,
			   "rank %u: hyperparameters for iteration %" PRIu64
			   " are too far ahead of iteration %" PRIu64,
			   s->rank, iteration, j->iter);
		return;
	}
	if (j->snap_iter != UINT64_MAX && iteration <= j->snap_iter) {
		sink_error(j->core->sink, s, ZC_EHYPER, false, iteration, -1,
			   "rank %u: hyperparameters for iteration %" PRIu64
			   " arrived after it started",
			   s->rank, iteration);
		return;
	}
	/* One entry per rank, iteration and group, in that order (by
	 * iteration first): a rank's second call replaces its first, as an
	 * assignment in torch does; ranks are compared when the iteration
	 * starts (take_snapshot). Each rank keeps at most 3 iterations of its
	 * groups here. */
	for (pp = &j->changes; *pp; pp = &(*pp)->next) {
		c = *pp;
		if (c->iteration == iteration && c->group == group && c->rank == s->rank) {
			c->values = g;
			return;
		}
		if (c->iteration > iteration ||
		    (c->iteration == iteration &&
		     (c->group > group || (c->group == group && c->rank > s->rank))))
			break;
	}
	c = calloc(1, sizeof(*c));
	if (!c) {
		sink_error(j->core->sink, s, ZC_ELIMIT, false, SINK_NO_ITERATION, -1,
			   "out of memory");
		return;
	}
	*c = (struct hyper_change){
		.iteration = iteration, .group = group, .rank = s->rank, .values = g, .next = *pp};
	*pp = c;
}

void sched_params_changed(struct job *j, struct member *s, uint64_t iteration)
{
	if (!job_usable(j, s, iteration, -1))
		return;
	/* the client sends it between iterations, naming the next one; the
	 * daemon reloads when that one starts, so it must not have yet */
	if (iteration != j->iter || j->arrived[0] == j->local_size) {
		sink_error(j->core->sink, s, ZC_ESTATE, false, iteration, -1,
			   "rank %u: zc_params_changed() before iteration %" PRIu64
			   ", but the job is at iteration %" PRIu64
			   "%s: call it between iterations",
			   s->rank, iteration, j->iter,
			   j->arrived[0] == j->local_size ? ", which started" : "");
		return;
	}
	if (!j->plan->low_precision)
		return; /* fp32: the owners' buffers are the masters */
	j->reload_pending = true;
	j->reload_iter = iteration;
}

/* Completions go through each rank's fast-path ring where it has one; a
 * rank that broke its ring fails the job, and the others hear that instead. */
static void send_bucket_done(struct job *j, uint64_t t, uint32_t b)
{
	for (uint32_t r = 0; r < j->world && j->state == JOB_ACTIVE; r++)
		if (j->ranks[r])
			j->core->sink->bucket_done(j->ranks[r], t, b);
}

static void finish_iteration(struct job *j, uint64_t t, bool found_inf, double grad_norm)
{
	bool info = (found_inf || !isnan(grad_norm)) && j->core->sink->step_done_info;

	/* Every rank sent every bucket (early buckets are refused), so the
	 * counters can start over. */
	memset(j->next_bucket, 0, j->world * sizeof(*j->next_bucket));
	memset(j->arrived, 0, j->plan->nbuckets * sizeof(*j->arrived));
	j->iter = t + 1;
	j->in_flight = false;
	j->iterations_done++;
	j->core->stats.iterations++;
	j->progress_ms = now_ms();
	if (j->state == JOB_REFORMING) {
		reform_step_done(j); /* the boundary it goes back to: nobody to tell */
		return;
	}
	for (uint32_t r = 0; r < j->world && !job_ended(j); r++)
		if (j->ranks[r] && info)
			j->core->sink->step_done_info(j->ranks[r], t, found_inf, grad_norm);
		else if (j->ranks[r])
			j->core->sink->step_done(j->ranks[r], t);
	if (j->rdzv && !job_ended(j))
		job_iteration_done(j); /* another node may have ended after t */
	if (j->rf && !job_ended(j))
		reform_boundary(j); /* another node's rank died: go back there */
}

void sched_on_done(struct core *core, struct exec_done *done)
{
	struct job *j = done->tag;

	CORE_HOOK(core, exec_done, done); /* before anything acts on it */
	if (done->ev == EXEC_STOPPED) {
		/* the executor freed the state: its memory is free for other
		 * jobs now, not when the last rank of this one leaves */
		core->memory_used -= j->memory;
		j->memory = 0;
		j->exec_running = false;
		if (statex_replan_stopped(j))
			return; /* a re-plan: the job starts again */
		if (reform_stopped(j))
			return; /* re-forming: the state is kept */
		job_maybe_free(j);
		return;
	}
	if (job_ended(j))
		return;
	j->progress_ms = now_ms();
	switch (done->ev) {
	case EXEC_STARTED:
		sched_start(j);
		break;
	case EXEC_BUCKET_DONE:
		j->buckets_done++;
		j->core->stats.buckets++;
		send_bucket_done(j, done->iteration, done->bucket);
		break;
	case EXEC_STEP_DONE:
		finish_iteration(j, done->iteration, done->found_inf, done->grad_norm);
		break;
	case EXEC_FAILED: {
		char what[256];

		if (reform_failure_expected(j)) {
			/* the old executor of a re-forming job, stopped inside
			 * an iteration: its collectives were aborted */
			log_info("job %s: the stopped executor: %s of buckets %u..%u: %s", j->id,
				 done->op, done->lo, done->hi, zc_strerror(done->status));
			break;
		}
		if (done->status == -EFAULT) {
			job_fail(j, ZC_EMAP, true,
				 "%s of buckets %u..%u touched a shared buffer that a trainer "
				 "shrank",
				 done->op, done->lo, done->hi);
			break;
		}
		/* a trainer's CUDA buffers or events could not be opened
		 * (exec.h's start): the job's error names which and why */
		if (done->status == ZC_EMAP || done->status == ZC_ESIZE ||
		    done->status == ZC_EBUFFER) {
			job_fail(j, done->status, true, "%s: %s", zc_strerror(done->status),
				 done->detail ? done->detail : done->op);
			break;
		}
		if (done->status == ZC_EPARAMEDIT) {
			job_fail(j, ZC_EPARAMEDIT, true, "iteration %" PRIu64 ": %s: %s",
				 done->iteration, zc_strerror(done->status), done->detail);
			break;
		}
		if (done->detail && done->detail[0])
			snprintf(what, sizeof(what), "%s failed: %s: %s", done->op,
				 zc_strerror(done->status), done->detail);
		else
			snprintf(what, sizeof(what), "%s of buckets %u..%u failed: %s", done->op,
				 done->lo, done->hi, zc_strerror(done->status));
		/* the nodes disagreed on what every rank must say alike (the
		 * grad scale): the job's error is that, not the executor's */
		if (done->status == ZC_EHYPER || done->status == ZC_EPLANMISMATCH) {
			/* ZC_EPLANMISMATCH: nodes re-planned to different plans */
			job_fail(j, done->status, true, "%s", done->detail ? done->detail : what);
			break;
		}
		/* over several nodes, a failed collective most likely means a
		 * node went: the rendezvous names it */
		if (!j->rdzv || !rdzv_exec_failed(j, what))
			job_fail(j, ZC_EINTERNAL, true, "%s", what);
		break;
	}
	case EXEC_STATE_DONE:
		statex_done(j);
		break;
	case EXEC_STOPPED:
		break;
	}
}

int sched_describe_wait(const struct job *j, char *buf, size_t len)
{
	size_t at = 0;
	int shown = 0;

	buf[0] = 0;
	for (uint32_t r = 0; r < j->world && at + 64 < len; r++) {
		uint32_t nb = j->state == JOB_ACTIVE ? j->plan->nbuckets : 1;
		if (j->node_of && j->node_of[r] != j->topo.node)
			continue; /* another node's rank: its daemon names it */
		bool waiting = j->state == JOB_ACTIVE ? j->next_bucket[r] < nb : !j->plans[r];
		if (!waiting)
			continue;
		if (j->state == JOB_ACTIVE)
			at += (size_t)snprintf(buf + at, len - at, "%srank %u (bucket %u of %u)",
					       shown ? ", " : "", r, j->next_bucket[r], nb);
		else
			at += (size_t)snprintf(buf + at, len - at, "%srank %u%s", shown ? ", " : "",
					       r, j->ranks[r] ? "" : " (not connected)");
		shown++;
	}
	if (!shown)
		snprintf(buf, len, "the executor (no rank is missing)");
	return shown;
}

void sched_check_stalls(struct core *core, int64_t now)
{
	reform_check(core, now); /* re-forming jobs wait for --rejoin-timeout */
	for (struct job *j = core->jobs; j; j = j->next) {
		char who[384];
		/* Ranks wait in an iteration or in zc_register_plan: the stall
		 * timeout. Nobody waits yet (ranks connected, none registered),
		 * but the job holds a slot: the longer join timeout. */
		int limit = j->state == JOB_FORMING && j->nregistered == 0
				    ? core->cfg->join_timeout_ms
				    : core->cfg->stall_timeout_ms;
		/* every local rank registered: a job over several nodes waits for
		 * the others, and the rendezvous has its own clock */
		bool waiting = (j->state == JOB_ACTIVE && j->in_flight) ||
			       (j->state == JOB_FORMING && j->nregistered < j->local_size);

		if (!waiting || now - j->progress_ms < limit)
			continue;
		sched_describe_wait(j, who, sizeof(who));
		if (j->state == JOB_ACTIVE)
			job_fail(j, ZC_ETIMEDOUT, true,
				 "iteration %" PRIu64 " made no progress for %d ms; waiting for %s",
				 j->iter, limit, who);
		else
			job_fail(j, ZC_ETIMEDOUT, true,
				 "plan registration made no progress for %d ms; waiting for %s",
				 limit, who);
	}
}
