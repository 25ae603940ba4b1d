/*
 * job.h — jobs (job.c): joining, plan registration, activation, failure,
 * teardown. Their types are core-t.h's; every call is on the loop thread.
 */
#ifndef ZEROD_JOB_H
#define ZEROD_JOB_H

#include <stdbool.h>
#include <stddef.h>

#include "core/core-t.h"

struct cudabufs;
struct mem_desc;
struct state;

/* Rank s (its pid and uid filled) joins the job h names, made if new:
 * s->job and s->rank set. 0, or a code with why in err (s joins nothing). */
int job_join(struct core *c, struct member *s, const struct join_req *h, char *err, size_t errlen);
/* Rank s registers plan p (taken over) with buffers gd and pd. */
void job_register_plan(struct job *j, struct member *s, struct plan *p, const struct mem_desc *gd,
		       const struct mem_desc *pd);
/* Rank s registers plan p (taken over) with CUDA buffers cb (taken over):
 * checked here, opened by the executor when the job starts. */
void job_register_cuda(struct job *j, struct member *s, struct plan *p, struct cudabufs *cb);
/* Every node of j joined and agreed (rdzv.c): start its executor. */
void job_formed(struct job *j);
/* A re-plan (statex.c): the old executor is gone and j->plans[], the maps,
 * hold the new plan's; drop what came of the old plan and start again. */
void job_restart(struct job *j);
/* The host memory j's state st takes with what a recovery of it needs
 * (the undo journal; on CUDA buffers the copies off the devices): what
 * --max-memory is charged. */
uint64_t job_memory_of(const struct job *j, const struct state *st);
void job_fail(struct job *j, int code, bool loud, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
void job_leave(struct job *j, struct member *s, enum leave_reason why);
/* Rank s asks a job that ended quietly for more (a bucket of the next
 * iteration...): the end was a failure after all. The caller answers s. */
void job_went_on(struct job *j, struct member *s);
/* Another node's end of j, as the rendezvous relays it (rdzv.c): j ends
 * here with code and msg (j->end_remote set meanwhile). A quiet end before
 * iteration iter waits until this node has finished the iteration before it
 * (job_iteration_done); one that finds this node inside iter is an error for
 * its ranks. */
void job_end_remote(struct job *j, int code, bool quiet, uint64_t iter, const char *msg);
/* j finished an iteration or a state round (sched.c, statex.c): another
 * node's quiet end may be due now. */
void job_iteration_done(struct job *j);
void job_maybe_free(struct job *j);
/* Whether rank's RegisterPlan (and its buffers, its ring) is still to come:
 * a job forming, or re-forming after a trainer died (reform.c). */
bool job_awaits_plan(const struct job *j, uint32_t rank);
void job_set_state(struct job *j, enum job_state to);
const char *job_state_name(enum job_state s);
static inline bool job_ended(const struct job *j)
{
	return j->state >= JOB_FAILED;
}
void job_free_all(struct core *c);

#endif
