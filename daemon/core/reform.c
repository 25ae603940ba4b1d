/*
 * reform.c — recovery from zerod's memory (docs/RELIABILITY.md,
 * "Recovery"): a trainer of an active job dies (kill -9, the OOM killer, a
 * Ctrl-C: any leave but Goodbye), and the job does not end. It re-forms:
 *
 *  - The iteration boundary. The daemon holds the optimizer state, and on
 *    host buffers the parameters too (the buffers stay mapped here after
 *    their trainers are gone), so nothing is lost that an iteration
 *    boundary needs. If every bucket of the iteration in flight had come
 *    from every rank, its step is queued with all its inputs: the job waits
 *    for it, and the boundary is the next iteration (a rank may have seen
 *    that StepDone). Otherwise no step of it ran in step mode at_end (only
 *    reductions, which write gradients): the old executor stops at once and
 *    the boundary is the iteration in flight. In step mode interleaved,
 *    some buckets stepped and others not: with --recovery-journal the
 *    stepped ones are taken back (state.h's undo journal) and the boundary
 *    is the iteration in flight; without it (the step overwrote the
 *    moments in place) that job fails, saying so.
 *  - The old executor stops keeping its state (exec_stop_keep). The ranks
 *    still connected are told ZC_ERANKLOST (zc_error_recoverable()) and
 *    detached: the worker group restarts (torchrun --max-restarts), and
 *    every rank rejoins with the same job id and registers the plan the job
 *    ran, or another layout of its parameters, with new buffers.
 *  - Once all have, the job starts again on the new buffers
 *    (job_restart): its next executor, off the loop thread, takes back
 *    what the journal holds, lays the kept state out for the new plan if
 *    it is another, and gives every rank the parameters from the old
 *    buffers (exec.h's exec_recover). PlanOk carries the iteration the job
 *    goes on at (zc_recovered()); the ranks' count moves there.
 *  - The restarted group may be of another world size (on this node):
 *    the first of its ranks to join, once the old group is gone, resizes
 *    the job's per-rank arrays (reform_resize); the old buffers stay
 *    mapped until the start, and the kept state is sharded again for the
 *    new world as for another layout.
 *  - Ranks that do not all rejoin within --rejoin-timeout fail the job with
 *    ZC_ERANKDEAD, naming the dead rank and the missing ones; everything it
 *    held is freed then.
 *
 * A job of CUDA buffers: its trainers' device memory dies with them, so
 * its executor keeps a copy of each owned fp32 piece's parameters, made
 * current by every step (optim.h's keep_params; bf16/fp16 have their
 * masters), and as it stops copies the state and those parameters off the
 * devices (exec_take_params); the next executor copies them back and
 * writes the parameters into the new buffers. A step after the death may
 * have read the dead memory, so the old executor stops at once and the
 * iteration in flight goes back, whatever of it stepped, through the undo
 * journal, which on CUDA buffers is kept on the devices (--recovery-journal,
 * in both step modes). Without it, where something may have stepped (every
 * bucket had come, or an interleaved iteration was partly stepped), the
 * job fails, saying so.
 *
 * A job over several nodes (host buffers): the node whose rank died picks
 * the boundary as above (the next iteration if every bucket of the one in
 * flight came from every rank here, else that one) and tells the others
 * through the rendezvous (rdzv_reform(): to the host, which takes it only
 * from the node of that rank and relays it; several deaths: the lowest
 * boundary said). Every node then finishes the iterations before the
 * boundary, which it can (its own ranks live, and the dead one's buckets
 * before it are all in), and only then re-forms and stops its executor:
 * nothing of the boundary's iteration completes anywhere, since the dead
 * rank sends none of it, and no node aborts a collective another still
 * needs. Each node keeps its shard and its old buffers, its restarted
 * ranks rejoin it, and its next executor meets the others' under a new
 * store prefix (rdzv_replanned()). A death between the buckets of an
 * interleaved iteration (some stepped on every node) says so (undo): each
 * node takes back what it stepped through its journal, and each owner
 * gives its pieces of the parameters (exec's start, by_owners()); a node
 * without --recovery-journal fails the job then, saying so.
 * Not here yet: another plan or world size, CUDA buffers over several
 * nodes, and a node's zerod lost.
 */
#include <errno.h>
#include <stdarg.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "base/config.h"
#include "base/log.h"
#include "core/job.h"
#include "core/rdzv.h"
#include "core/reform.h"
#include "core/semantics.h"
#include "core/sharedp.h"
#include "core/sink.h"
#include "exec/exec.h"
#include "mem/cudabufs.h"
#include "mem/mem.h"
#include "plan/state.h"

struct reform {
	int64_t since_ms;
	uint32_t dead_rank;
	int dead_pid;
	uint64_t died_in;                       /* the iteration in flight (or next) when it died */
	bool stop_after_step;                   /* every bucket had come: its step first */
	bool stopping;                          /* exec_stop_keep() asked */
	bool undo; /* an interleaved iteration cut between buckets: its stepped buckets go back */
	/* a job over several nodes: the boundary every node goes back to (the
	 * first iteration none completes), the lowest any node said; each
	 * finishes the iterations before it, then stops */
	bool nodes;
	uint64_t cap;
	char why[256];                          /* nodes: what happened, for the ranks */
	struct state *state;                    /* kept */
	uint32_t n;                             /* local ranks registered again */
	struct plan **plans;                    /* [world]: the rejoined ranks' */
	struct mem_map **grad_map, **param_map; /* [world]: their buffers */
	struct sharedp *sharedp;                /* [world]: their sharing */
	/* the old group's buffers ([old_world()]), mapped until the next
	 * executor has read them (it unmaps them: reform_handed) */
	struct mem_map **old_param, **old_grad;
	/* the restarted group came with another world size (reform_resize):
	 * the old group's size; 0: the same size */
	uint32_t resized_from;
	/* a job of CUDA buffers: the rejoined ranks' ([world]), the old
	 * group's after a resize ([resized_from]), and the parameters the old
	 * executor copied off the devices (exec_take_params) */
	struct cudabufs **cuda, **old_cuda;
	void *params;
	struct plan *old_plan;                  /* the plan the kept state is laid out by */
	struct exec_recover rec;                /* what the next executor starts from */
};

/* The iteration a re-forming's undo journal takes back: over several nodes
 * the boundary they agreed on, else the one the death cut. */
static uint64_t undo_at(const struct reform *rf)
{
	return rf->nodes ? rf->cap : rf->died_in;
}

/* The old group's size: its arrays (old_param, old_grad, old_cuda) have
 * this many entries. */
static uint32_t old_world(const struct job *j)
{
	return j->rf->resized_from ? j->rf->resized_from : j->world;
}

void reform_free(struct job *j)
{
	struct reform *rf = j->rf;
	const struct mem_ops *mem = j->core->mem;

	if (!rf)
		return;
	for (uint32_t r = 0; r < j->world; r++) {
		if (rf->cuda)
			cudabufs_free(rf->cuda[r]);
		if (rf->plans)
			plan_free(rf->plans[r]);
		if (rf->grad_map)
			mem->unmap(rf->grad_map[r]);
		if (rf->param_map)
			mem->unmap(rf->param_map[r]);
	}
	for (uint32_t r = 0; r < old_world(j); r++) {
		if (rf->old_param)
			mem->unmap(rf->old_param[r]);
		if (rf->old_grad)
			mem->unmap(rf->old_grad[r]);
		if (rf->old_cuda)
			cudabufs_free(rf->old_cuda[r]);
	}
	free(rf->old_grad);
	free(rf->rec.release); /* not handed to an executor: the mappings are freed above */
	free(rf->old_cuda);
	free(rf->cuda);
	free(rf->params);
	state_free(rf->state);
	plan_free(rf->old_plan);
	free(rf->plans);
	free(rf->grad_map);
	free(rf->param_map);
	free(rf->sharedp);
	free(rf->old_param);
	free(rf);
	j->rf = NULL;
}

/* j->rf, its arrays for j's world: 0 or -ENOMEM (nothing left behind). */
static int reform_new(struct job *j)
{
	struct reform *rf = calloc(1, sizeof(*rf));

	if (!rf)
		return -ENOMEM;
	j->rf = rf;
	rf->plans = calloc(j->world, sizeof(*rf->plans));
	rf->grad_map = calloc(j->world, sizeof(*rf->grad_map));
	rf->param_map = calloc(j->world, sizeof(*rf->param_map));
	rf->sharedp = calloc(j->world, sizeof(*rf->sharedp));
	rf->old_param = calloc(j->world, sizeof(*rf->old_param));
	rf->old_grad = calloc(j->world, sizeof(*rf->old_grad));
	rf->cuda = j->cuda ? calloc(j->world, sizeof(*rf->cuda)) : NULL;
	if (!rf->plans || !rf->grad_map || !rf->param_map || !rf->sharedp || !rf->old_param ||
	    !rf->old_grad || (j->cuda && !rf->cuda)) {
		reform_free(j);
		return -ENOMEM;
	}
	return 0;
}

/* Whether j can re-form at all: on this node only (CUDA buffers: its
 * executor keeps the fp32 copies), between or inside an iteration, nothing
 * else under way. */
static bool reformable(const struct job *j)
{
	return j->core->cfg->rejoin_timeout_ms > 0 && (!j->cuda || j->keep_params) && j->exec &&
	       j->exec_running && !j->sx && !j->rp && !j->reload_pending && j->arrived;
}

/* A trainer's death that the job cannot recover from: counted (the
 * caller fails the job). */
static void recovery_failed(struct job *j)
{
	j->core->stats.recoveries_failed++;
}

/* j re-forms from now (why, the reason its sessions are told): its local
 * ranks hear ZC_ERANKLOST (zc_error_recoverable) and are detached. */
static void __attribute__((format(printf, 2, 3))) enter(struct job *j, const char *fmt, ...)
{
	const struct sink_ops *sink = j->core->sink;
	va_list ap;

	j->rf->since_ms = now_ms();
	job_set_state(j, JOB_REFORMING);
	/* while it re-forms, what the job's sessions are told as they go
	 * (the edge retires their fast paths with it) */
	j->err = ZC_ERANKLOST;
	va_start(ap, fmt);
	vsnprintf(j->errmsg, sizeof(j->errmsg), fmt, ap);
	va_end(ap);
	log_notice("job %s: re-forming: %s", j->id, j->errmsg);
	for (uint32_t r = 0; r < j->world; r++) {
		if (!j->ranks[r])
			continue;
		sink_error(sink, j->ranks[r], ZC_ERANKLOST, true, j->iter, -1, "job %s: %s", j->id,
			   j->errmsg);
		sink->detach(j->ranks[r]);
	}
}

/* A job over several nodes at its boundary: once this node finished every
 * iteration before it, it re-forms (if it had not yet: a node whose ranks
 * all live) and its executor stops, aborting the collectives of the
 * boundary's iteration that some node may have begun (no node completes
 * one of those: a rank that died sends none of its buckets). */
void reform_boundary(struct job *j)
{
	struct reform *rf = j->rf;
	int timeout = j->core->cfg->rejoin_timeout_ms;

	if (!rf || !rf->nodes || rf->stopping || job_ended(j) || j->iter < rf->cap)
		return;
	if (j->iter > rf->cap) {
		recovery_failed(j);
		job_fail(j, ZC_EINTERNAL, true,
			 "re-forming: this node completed iteration %" PRIu64
			 ", past the boundary %" PRIu64 " another node went back to",
			 j->iter - 1, rf->cap);
		return;
	}
	if (rf->undo && !j->journal) {
		recovery_failed(j);
		job_fail(j, ZC_ERANKDEAD, true,
			 "%s, after some buckets of iteration %" PRIu64 " were stepped in place "
			 "(interleaved) on every node: this node cannot take them back without "
			 "--recovery-journal; restore its checkpoint",
			 rf->why, rf->cap);
		return;
	}
	if (j->state != JOB_REFORMING)
		enter(j,
		      "%s; the job goes back to iteration %" PRIu64 " and waits %d ms "
		      "(--rejoin-timeout) for its ranks to rejoin",
		      rf->why, rf->cap, timeout);
	rf->stopping = true;
	exec_stop_keep(j->exec); /* EXEC_STOPPED: reform_stopped */
}

/* The boundary a job over several nodes goes back to: the lowest said,
 * and whether it was partly stepped (undo), as who said it knows. */
static int set_cap(struct job *j, uint64_t cap, bool undo, const char *why)
{
	struct reform *rf = j->rf;

	if (!rf) {
		if (reform_new(j) < 0)
			return -ENOMEM;
		rf = j->rf;
		rf->nodes = true;
		rf->cap = cap;
		rf->undo = undo;
		rf->died_in = cap;
		snprintf(rf->why, sizeof(rf->why), "%s", why);
	} else if (cap < rf->cap) {
		rf->cap = cap;
		rf->undo = undo;
	} else if (cap == rf->cap)
		rf->undo |= undo;
	return 0;
}

/* reform_begin() of a job over several nodes (host buffers): the boundary
 * is the iteration in flight, or the next one if every bucket of it came
 * from every rank here (every node can finish it then: the others' ranks
 * live). Every other node hears it through the rendezvous. */
static bool begin_nodes(struct job *j, struct member *s, const char *how, uint32_t full,
			uint32_t nb)
{
	struct reform *rf;
	uint64_t cap = j->in_flight && full == nb ? j->iter + 1 : j->iter;
	/* the buckets before the dead rank's first missing one step on every
	 * node: each takes its own back */
	bool undo =
		j->in_flight && full > 0 && full < nb && j->plan->step_mode == ZC_STEP_INTERLEAVED;
	char why[256];

	if (undo && !j->journal) {
		recovery_failed(j);
		job_fail(j, ZC_ERANKDEAD, true,
			 "rank %u (pid %d) %s in iteration %" PRIu64 " after %u of %u buckets "
			 "stepped in place (interleaved) on every node: cannot go back to an "
			 "iteration boundary without --recovery-journal; restore its checkpoint",
			 s->rank, (int)s->pid, how, j->iter, full, nb);
		return true;
	}
	snprintf(why, sizeof(why), "rank %u (pid %d) %s in iteration %" PRIu64, s->rank,
		 (int)s->pid, how, j->iter);
	if (set_cap(j, cap, undo, why) < 0)
		return false;
	rf = j->rf;
	rf->dead_rank = s->rank;
	rf->dead_pid = (int)s->pid;
	rf->died_in = j->iter;
	rdzv_reform(j, s->rank, cap, undo, why);
	/* the ranks here have sent all they will: told now; the executor
	 * finishes what comes before the boundary */
	if (j->state != JOB_REFORMING)
		enter(j,
		      "%s; the job goes back to iteration %" PRIu64 " and waits %d ms "
		      "(--rejoin-timeout) for its ranks to rejoin",
		      why, rf->cap, j->core->cfg->rejoin_timeout_ms);
	reform_boundary(j);
	return true;
}

void reform_remote(struct job *j, uint32_t rank, uint64_t iteration, bool undo, const char *how)
{
	bool first;

	if (job_ended(j))
		return;
	if (!j->rf && (j->state != JOB_ACTIVE || !reformable(j))) {
		recovery_failed(j);
		job_fail(j, ZC_ERANKDEAD, true,
			 "%s; the job cannot re-form on this node now (%s): restore its checkpoint",
			 how,
			 j->core->cfg->rejoin_timeout_ms <= 0 ? "--rejoin-timeout 0"
			 : j->cuda                            ? "CUDA buffers over several nodes"
			 : j->state != JOB_ACTIVE             ? "it is not training"
						  : "a state round or re-plan is under way");
		return;
	}
	if (j->rf && !j->rf->nodes)
		return;
	first = !j->rf;
	if (set_cap(j, iteration, undo, how) < 0) {
		job_fail(j, ZC_ELIMIT, true, "re-forming: out of memory");
		return;
	}
	if (first) {
		j->rf->dead_rank = rank;
		j->rf->dead_pid = -1; /* another node's trainer */
	}
	log_notice("job %s: %s; this node finishes the iterations before %" PRIu64
		   " (it is at %" PRIu64 "), then re-forms",
		   j->id, how, j->rf->cap, j->iter);
	reform_boundary(j);
}

bool reform_begin(struct job *j, struct member *s, const char *how)
{
	uint32_t nb, full = 0;
	struct reform *rf;
	bool partial;

	if (!reformable(j) || (j->rf && !j->rf->nodes))
		return false;
	nb = j->plan->nbuckets;
	for (uint32_t b = 0; b < nb; b++)
		full += j->arrived[b] == j->local_size;
	if (j->rdzv)
		return begin_nodes(j, s, how, full, nb);
	partial =
		j->in_flight && full > 0 && full < nb && j->plan->step_mode == ZC_STEP_INTERLEAVED;
	if (partial && !j->journal) {
		recovery_failed(j);
		job_fail(j, ZC_ERANKDEAD, true,
			 "rank %u (pid %d) %s in iteration %" PRIu64 " after %u of %u buckets "
			 "stepped in place (interleaved): cannot go back to an iteration "
			 "boundary without --recovery-journal; restore its checkpoint",
			 s->rank, (int)s->pid, how, j->iter, full, nb);
		return true;
	}
	/* CUDA buffers: the step would read the reduced gradients, and write
	 * the parameters, in device memory that died with the trainer; the
	 * journal takes back whatever it stepped */
	if (j->cuda && j->in_flight && full == nb && !j->journal) {
		recovery_failed(j);
		job_fail(j, ZC_ERANKDEAD, true,
			 "rank %u (pid %d) %s in iteration %" PRIu64 " once every bucket was in: "
			 "its step needs the trainers' device memory, which died with it (CUDA "
			 "buffers), and there is no --recovery-journal; restore its checkpoint",
			 s->rank, (int)s->pid, how, j->iter);
		return true;
	}
	if (reform_new(j) < 0)
		return false;
	rf = j->rf;
	/* on CUDA buffers the old executor stops at once, and the iteration
	 * in flight goes back, whatever of it stepped */
	rf->undo = partial || (j->cuda && j->in_flight);
	rf->dead_rank = s->rank;
	rf->dead_pid = (int)s->pid;
	rf->died_in = j->iter;
	enter(j,
	      "rank %u (pid %d) %s in iteration %" PRIu64 "; the job waits %d ms "
	      "(--rejoin-timeout) for its ranks to rejoin",
	      s->rank, (int)s->pid, how, j->iter, j->core->cfg->rejoin_timeout_ms);
	if (j->in_flight && full == nb && !j->cuda) {
		rf->stop_after_step = true; /* reform_step_done */
		return true;
	}
	rf->stopping = true;
	exec_stop_keep(j->exec); /* EXEC_STOPPED: reform_stopped */
	return true;
}

void reform_step_done(struct job *j)
{
	struct reform *rf = j->rf;

	if (!rf || rf->stopping || job_ended(j))
		return;
	if (rf->nodes) {
		reform_boundary(j);
		return;
	}
	rf->stopping = true;
	exec_stop_keep(j->exec);
}

bool reform_failure_expected(const struct job *j)
{
	return j->state == JOB_REFORMING && j->rf && j->rf->stopping;
}

/* Every local rank registered again and the old executor is gone: the
 * new buffers replace the old ones, whose parameters stay mapped for the
 * start, and the job starts again. */
static void restart(struct job *j)
{
	struct core *core = j->core;
	struct reform *rf = j->rf;

	core->memory_used -= j->memory; /* charged again as it starts */
	j->memory = 0;
	sharedp_take(j, rf->sharedp);
	for (uint32_t r = 0; r < j->world; r++) {
		if (!rf->plans[r])
			continue;
		if (j->cuda) { /* the old executor closed the old handles */
			cudabufs_free(j->cuda[r]);
			j->cuda[r] = rf->cuda[r];
			rf->cuda[r] = NULL;
		}
		if (!rf->resized_from) { /* else they are in rf->old_* already */
			rf->old_grad[r] = j->grad_map[r];
			rf->old_param[r] = j->param_map[r];
		}
		j->grad_map[r] = rf->grad_map[r];
		j->param_map[r] = rf->param_map[r];
		rf->grad_map[r] = rf->param_map[r] = NULL;
		plan_free(j->plans[r]);
		j->plans[r] = rf->plans[r];
		rf->plans[r] = NULL;
	}
	j->in_flight = false;
	if (rf->undo) /* a step that ended after the death is taken back too */
		j->iter = undo_at(rf);
	memset(j->next_bucket, 0, j->world * sizeof(*j->next_bucket));
	j->snap_iter = UINT64_MAX;
	log_info("job %s: every rank rejoined: starting again at iteration %" PRIu64, j->id,
		 j->iter);
	if (j->rdzv) /* the other nodes' executors meet this one's under a new prefix */
		rdzv_replanned(j);
	rf->old_plan = j->plan; /* the kept state's layout (job_restart frees j->plan) */
	j->plan = NULL;
	job_restart(j);
}

bool reform_stopped(struct job *j)
{
	struct core *core = j->core;
	struct reform *rf = j->rf;
	struct exec_stats es;

	if (!rf || j->state != JOB_REFORMING || !rf->stopping)
		return false;
	exec_stats(j->exec, &es);
	core->stats.reduced_elems += es.reduced_elems;
	core->stats.stepped_elems += es.stepped_elems;
	rf->state = exec_take_state(j->exec);
	rf->params = exec_take_params(j->exec);
	exec_free(j->exec);
	j->exec = NULL;
	if (!rf->state || (j->cuda && !rf->params)) {
		recovery_failed(j);
		job_fail(j, ZC_EINTERNAL, true, "re-forming: the old executor kept no state%s",
			 j->cuda ? " (it could not be copied off the devices)" : "");
		job_maybe_free(j);
		return true;
	}
	/* the kept state stays charged while the job waits */
	j->memory = job_memory_of(j, rf->state);
	core->memory_used += j->memory;
	log_info("job %s: state kept at iteration %" PRIu64 " (rank %u died in iteration %" PRIu64
		 "); %u of %u ranks registered again",
		 j->id, j->iter, rf->dead_rank, rf->died_in, rf->n, j->local_size);
	if (rf->n == j->local_size)
		restart(j);
	return true;
}

void reform_leave(struct job *j, struct member *s, bool occupant)
{
	struct reform *rf = j->rf;
	uint32_t r = s->rank;

	/* a rank that rejoined and registered, then left again: it may come
	 * once more; the old ranks that were told leave with nothing here */
	if (!rf || !occupant || !rf->plans[r])
		return;
	plan_free(rf->plans[r]);
	rf->plans[r] = NULL;
	if (rf->cuda) {
		cudabufs_free(rf->cuda[r]);
		rf->cuda[r] = NULL;
	}
	j->core->mem->unmap(rf->grad_map[r]);
	j->core->mem->unmap(rf->param_map[r]);
	rf->grad_map[r] = rf->param_map[r] = NULL;
	rf->sharedp[r] = (struct sharedp){0};
	rf->n--;
	log_info("job %s: rank %u left again while the job re-forms (%u/%u registered)", j->id, r,
		 rf->n, j->local_size);
}

/* A job's and its re-forming's per-rank arrays for another world size. */
struct rank_arrays {
	struct member **ranks;
	struct plan **plans, **rplans;
	struct mem_map **gm, **pm, **rgm, **rpm;
	struct sharedp *sp, *rsp;
	uint32_t *next;
	bool *joined;
	struct cudabufs **cuda, **rcuda; /* a job of CUDA buffers */
};

static void rank_arrays_free(struct rank_arrays *a)
{
	free(a->ranks);
	free(a->plans);
	free(a->rplans);
	free(a->gm);
	free(a->pm);
	free(a->rgm);
	free(a->rpm);
	free(a->sp);
	free(a->rsp);
	free(a->next);
	free(a->joined);
	free(a->cuda);
	free(a->rcuda);
}

static int rank_arrays_new(struct rank_arrays *a, uint32_t world, bool cuda)
{
	*a = (struct rank_arrays){
		.ranks = calloc(world, sizeof(*a->ranks)),
		.plans = calloc(world, sizeof(*a->plans)),
		.rplans = calloc(world, sizeof(*a->rplans)),
		.gm = calloc(world, sizeof(*a->gm)),
		.pm = calloc(world, sizeof(*a->pm)),
		.rgm = calloc(world, sizeof(*a->rgm)),
		.rpm = calloc(world, sizeof(*a->rpm)),
		.sp = calloc(world, sizeof(*a->sp)),
		.rsp = calloc(world, sizeof(*a->rsp)),
		.next = calloc(world, sizeof(*a->next)),
		.joined = calloc(world, sizeof(*a->joined)),
		.cuda = cuda ? calloc(world, sizeof(*a->cuda)) : NULL,
		.rcuda = cuda ? calloc(world, sizeof(*a->rcuda)) : NULL,
	};
	if (a->ranks && a->plans && a->rplans && a->gm && a->pm && a->rgm && a->rpm && a->sp &&
	    a->rsp && a->next && a->joined && (!cuda || (a->cuda && a->rcuda)))
		return 0;
	rank_arrays_free(a);
	return -ENOMEM;
}

/* Whether j may take another world size: no rank is here (the old
 * group's were detached as it began re-forming, and dropped) and none
 * rejoined; else its size is that of the restarted group's first rank. */
static bool resizable(const struct job *j)
{
	return j->rf && !j->rf->n && !j->rf->resized_from && !j->nconnected;
}

int reform_resize(struct job *j, uint32_t world, char *err, size_t errlen)
{
	struct reform *rf = j->rf;
	struct rank_arrays old, a;

	if (!resizable(j))
		return 1;
	if (rank_arrays_new(&a, world, j->cuda != NULL) < 0) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	log_notice("job %s: its restarted ranks come with world size %u (it ran with %u): the "
		   "kept state is sharded again for them",
		   j->id, world, j->world);
	/* the old group's buffers stay mapped until the start: the old
	 * executor may still be stopping, and its parameters are the job's */
	rf->resized_from = j->world;
	free(rf->old_param); /* empty until the restart */
	free(rf->old_grad);
	rf->old_param = j->param_map;
	rf->old_grad = j->grad_map;
	rf->old_cuda = j->cuda; /* the old executor's bufs until it is gone */
	for (uint32_t k = 0; k < j->world; k++) {
		plan_free(j->plans[k]);
		if (j->kept)
			j->core->mem->unmap(j->kept[k].map);
	}
	free(j->kept);
	j->kept = NULL;
	sem_free(j->sem); /* sized by the old world; made again on use */
	j->sem = NULL;
	old = (struct rank_arrays){.ranks = j->ranks,
				   .plans = j->plans,
				   .rplans = rf->plans,
				   .rgm = rf->grad_map,
				   .rpm = rf->param_map,
				   .sp = j->sharedp,
				   .rsp = rf->sharedp,
				   .next = j->next_bucket,
				   .joined = j->joined,
				   .rcuda = rf->cuda};
	rank_arrays_free(&old);
	j->ranks = a.ranks;
	j->plans = a.plans;
	j->grad_map = a.gm;
	j->param_map = a.pm;
	j->sharedp = a.sp;
	j->next_bucket = a.next;
	j->joined = a.joined;
	j->njoined = 0;
	rf->plans = a.rplans;
	rf->grad_map = a.rgm;
	rf->param_map = a.rpm;
	rf->sharedp = a.rsp;
	j->cuda = a.cuda;
	rf->cuda = a.rcuda;
	j->world = j->local_size = world;
	return 0;
}

bool reform_registered(const struct job *j, uint32_t rank)
{
	return j->rf && j->rf->plans[rank];
}

void reform_register(struct job *j, struct member *s, struct plan *p, const struct mem_desc *gd,
		     const struct mem_desc *pd, struct cudabufs *cb)
{
	struct core *core = j->core;
	struct reform *rf = j->rf;
	uint32_t rank = s->rank;
	uint64_t bytes = plan_buffer_bytes(p);
	char err[320], field[192];
	struct sharedp sp = {0};
	int r;

	if (!cb != !j->cuda || rf->plans[rank]) {
		sink_error(core->sink, s, rf->plans[rank] ? ZC_ESTATE : ZC_ENOTSUP, false,
			   SINK_NO_ITERATION, -1, "job %s re-forms: rank %u %s", j->id, rank,
			   rf->plans[rank] ? "registered already"
			   : cb            ? "registers CUDA buffers, the job ran on host buffers"
					   : "registers host buffers, the job ran on CUDA buffers");
		plan_free(p);
		cudabufs_free(cb);
		return;
	}
	/* the plan the job ran, or (DDP's first buckets, before it rebuilt
	 * them) another layout of its parameters: the state is laid out again
	 * (reform_take); every rejoined rank brings the same one */
	r = 0;
	for (uint32_t k = 0; k < j->world && r == 0; k++)
		if (rf->plans[k] && plan_diff(rf->plans[k], p, field, sizeof(field))) {
			r = ZC_EPLANMISMATCH;
			snprintf(err, sizeof(err), "rank %u's plan differs from rank %u's at %s",
				 rank, k, field);
		}
	if (r == 0 && rf->resized_from && (p->low_precision || j->plan->low_precision)) {
		r = ZC_ENOTSUP;
		snprintf(err, sizeof(err),
			 "bf16/fp16 buckets on another world size (%u ranks, %u before)", j->world,
			 rf->resized_from);
	}
	if (r == 0 && j->rdzv && plan_diff(j->plan, p, field, sizeof(field))) {
		r = ZC_ENOTSUP;
		snprintf(err, sizeof(err),
			 "another layout over several nodes (%s): each node keeps only its own "
			 "shard",
			 field);
	}
	if (r == 0 && plan_diff(j->plan, p, field, sizeof(field)) &&
	    (r = plan_replan_match(j->plan, p, NULL, err, sizeof(err))) == 0 &&
	    (p->low_precision || j->plan->low_precision)) {
		r = ZC_ENOTSUP;
		snprintf(err, sizeof(err), "another layout of bf16/fp16 buckets (%s)", field);
	}
	if (r < 0) {
		sink_error(core->sink, s, r, false, SINK_NO_ITERATION, -1,
			   "job %s re-forms with the parameters it ran (plan %016" PRIx64 "): %s",
			   j->id, j->plan->hash, err);
		plan_free(p);
		return;
	}
	/* CUDA buffers are opened by the next executor, off the loop */
	if (cb)
		rf->cuda[rank] = cb;
	else
		r = sharedp_check_in(j, rf->sharedp, rank, pd, &sp, err, sizeof(err));
	if (r >= 0 && !cb)
		r = core->mem->map(gd, bytes, &rf->grad_map[rank], err, sizeof(err));
	if (r >= 0 && !cb && !sharedp_mapped_in(j, rf->sharedp, rf->param_map, &sp))
		r = core->mem->map(pd, bytes, &rf->param_map[rank], err, sizeof(err));
	if (r < 0) {
		core->mem->unmap(rf->grad_map[rank]);
		rf->grad_map[rank] = NULL;
		sink_error(core->sink, s, r, false, SINK_NO_ITERATION, -1, "rank %u: %s", rank,
			   err);
		plan_free(p);
		return;
	}
	rf->plans[rank] = p;
	rf->sharedp[rank] = sp;
	rf->n++;
	j->progress_ms = now_ms();
	log_info("job %s: rank %u rejoined (pid %d, %u/%u)", j->id, rank, (int)s->pid, rf->n,
		 j->local_size);
	if (rf->n == j->local_size && !j->exec) /* the old executor is gone */
		restart(j);
}

/* What the next executor unmaps once it has read it, off the loop (the
 * pages are freed then): the old buffers, ours until reform_handed(). No
 * list (no memory): they are unmapped here, on the loop, as before. */
static void release_list(struct job *j)
{
	struct reform *rf = j->rf;
	struct mem_map **rel = calloc(2 * (size_t)old_world(j) + 1, sizeof(*rel));
	uint32_t n = 0;

	for (uint32_t r = 0; rel && r < old_world(j); r++) {
		if (rf->old_param[r])
			rel[n++] = rf->old_param[r];
		if (rf->old_grad[r])
			rel[n++] = rf->old_grad[r];
	}
	rf->rec.release = rel;
	rf->rec.nrelease = n;
	rf->rec.release_mem = j->core->mem;
}

int reform_take(struct job *j, struct state **st, const struct exec_recover **ret)
{
	struct reform *rf = j->rf;
	struct state *k = rf->state;
	void *from = NULL;
	char field[192];
	bool same;

	*ret = NULL;
	from = rf->params; /* copied off the devices, or the old host buffers */
	for (uint32_t r = 0; r < old_world(j) && !from; r++)
		if (rf->old_param[r])
			from = j->core->mem->ptr(rf->old_param[r]);
	if (!k || !from || !rf->old_plan) {
		recovery_failed(j);
		job_fail(j, ZC_EINTERNAL, true, "re-forming: no state or parameters kept");
		return 1;
	}
	/* the executor takes back what the journal holds and, for the
	 * rejoined ranks' other layout, lays the state out again (exec.h) */
	same = !plan_diff(rf->old_plan, j->plan, field, sizeof(field));
	if (same && rf->resized_from) { /* the same plan, shards of another size */
		same = false;
		snprintf(field, sizeof(field), "the world size, %u ranks for %u", j->world,
			 rf->resized_from);
	}
	rf->rec = (struct exec_recover){.kept = same ? NULL : k,
					.plan = rf->old_plan,
					.params = from,
					.undo_iter = rf->undo ? undo_at(rf) : UINT64_MAX};
	if (same && (k->nelems != (*st)->nelems || k->npieces != (*st)->npieces ||
		     k->arrays != (*st)->arrays || k->nmaster != (*st)->nmaster)) {
		recovery_failed(j);
		job_fail(j, ZC_EINTERNAL, true, "re-forming: the kept state's layout differs");
		return 1;
	}
	release_list(j);
	if (same) {
		state_free(*st);
		*st = k; /* the executor's now */
		rf->state = NULL;
	} else
		log_info(
			"job %s: the kept state is laid out again for the rejoined ranks' plan (%s "
			"differs)",
			j->id, field);
	*ret = &rf->rec;
	return 0;
}

void reform_handed(struct job *j)
{
	struct reform *rf = j->rf;

	if (!rf || !rf->rec.release)
		return;
	for (uint32_t r = 0; r < old_world(j); r++)
		rf->old_param[r] = rf->old_grad[r] = NULL;
	rf->rec.release = NULL;
	rf->rec.nrelease = 0;
}

uint64_t reform_started(struct job *j)
{
	struct reform *rf = j->rf;

	if (!rf)
		return UINT64_MAX;
	j->core->stats.recoveries++;
	log_notice("job %s: recovered at iteration %" PRIu64 ", %" PRId64
		   " ms after rank %u (pid %d) died in iteration %" PRIu64,
		   j->id, j->iter, now_ms() - rf->since_ms, rf->dead_rank, rf->dead_pid,
		   rf->died_in);
	j->err = 0;
	j->errmsg[0] = 0;
	return j->iter;
}

void reform_check(struct core *core, int64_t now)
{
	struct job *next;

	for (struct job *j = core->jobs; j; j = next) {
		struct reform *rf = j->rf;
		char missing[256];
		size_t at = 0;
		int timeout = core->cfg->rejoin_timeout_ms;

		next = j->next;
		if (j->state != JOB_REFORMING || !rf || now - rf->since_ms < timeout)
			continue;
		missing[0] = 0;
		recovery_failed(j);
		for (uint32_t r = 0; r < j->world && at + 16 < sizeof(missing); r++)
			if (!rf->plans[r] && (!j->node_of || j->node_of[r] == j->topo.node))
				at += (size_t)snprintf(missing + at, sizeof(missing) - at, "%s%u",
						       at ? ", " : "", r);
		job_fail(j, ZC_ERANKDEAD, true,
			 "rank %u (pid %d) died in iteration %" PRIu64
			 " and the job's ranks did not "
			 "rejoin within %d ms (--rejoin-timeout): rank %s missing",
			 rf->dead_rank, rf->dead_pid, rf->died_in, timeout, missing);
		job_maybe_free(j);
	}
}
