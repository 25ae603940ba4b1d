/*
 * reform.h — a job that lost a trainer goes on from zerod's memory
 * (reform.c): it re-forms, keeping its optimizer state and parameters,
 * while its restarted ranks rejoin. Loop thread only.
 */
#ifndef ZEROD_REFORM_H
#define ZEROD_REFORM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct core;
struct job;
struct member;
struct mem_desc;
struct cudabufs;
struct exec_recover;
struct plan;
struct state;

/* job_leave(): rank s of active job j left otherwise than by Goodbye, as
 * `how` says. True if reform.c took it: j re-forms (its other ranks are
 * told ZC_ERANKLOST and detached), or it cannot go back to an iteration
 * boundary and failed with that reason. False: j does not re-form (no
 * --rejoin-timeout, CUDA buffers without the kept copies (over several
 * nodes), a state round or re-plan under way); the caller fails it as
 * before. A job over several nodes tells the others (rdzv_reform()). */
bool reform_begin(struct job *j, struct member *s, const char *how);
/* rdzv.c: a rank of another node of j died (how says it), and the job
 * goes back to boundary `iteration`: this node finishes the iterations
 * before it, then re-forms too (its ranks told ZC_ERANKLOST), its executor
 * stopped and its state kept; undo: what it stepped of that iteration goes
 * back through its undo journal. Where j cannot re-form here, it fails, and
 * with it every node. */
void reform_remote(struct job *j, uint32_t rank, uint64_t iteration, bool undo, const char *how);
/* sched.c: an iteration of j ended; a job over several nodes that reached
 * its boundary re-forms now. */
void reform_boundary(struct job *j);
/* job_leave() of rank s while j re-forms (s left j->ranks already): a
 * rejoined rank's registration is dropped, so that it can rejoin again. */
void reform_leave(struct job *j, struct member *s, bool occupant);
/* job_join(): a rank of re-forming job j (of this node only) says world
 * size `world` (all on this node), not j's. If no rank is here (the old
 * group's were dropped as it began re-forming) and none rejoined, j takes
 * that size: its ranks' arrays are made again, the old buffers kept
 * mapped until the start, where the kept state is sharded anew
 * (reform_take). 0; 1: j keeps its size, the restarted group's (a rank of
 * it came first); -ENOMEM with the reason in err (j as it was). */
int reform_resize(struct job *j, uint32_t world, char *err, size_t errlen);
/* Whether rank of re-forming job j registered again. */
bool reform_registered(const struct job *j, uint32_t rank);
/* RegisterPlan of a rejoined rank s: plan p (taken over) with buffers gd
 * and pd; cb (taken over) is refused. Once every local rank did and the
 * old executor is gone, the job starts again (job_restart). */
void reform_register(struct job *j, struct member *s, struct plan *p, const struct mem_desc *gd,
		     const struct mem_desc *pd, struct cudabufs *cb);
/* sched.c: the step of the iteration the trainer died in is done (the job
 * waited for it: every bucket had come). */
void reform_step_done(struct job *j);
/* EXEC_STOPPED: true if it was the re-forming job's old executor (its
 * state is kept now), false otherwise. */
bool reform_stopped(struct job *j);
/* EXEC_FAILED while j re-forms: true if it is the old executor's answer
 * to being stopped (nothing to act on). */
bool reform_failure_expected(const struct job *j);
/* job_start() of a re-formed job, *st the new plan's layout: the kept
 * state replaces it (freed) where the plan is the one the job ran, and
 * *ret says what the executor starts from (exec.h's exec_recover, valid
 * until EXEC_STARTED). 0, or 1: nothing to start from (the job failed). */
int reform_take(struct job *j, struct state **st, const struct exec_recover **ret);
/* job_start(): the executor that reform_take() gave its exec_recover to
 * was made; the old buffers listed there are its to unmap now. */
void reform_handed(struct job *j);
/* sched_start() of a re-formed job: the iteration it goes on at, the
 * re-forming done; what it kept (the old buffers, the kept state) is
 * released by reform_free() once the ranks are told. UINT64_MAX: j did
 * not re-form. */
uint64_t reform_started(struct job *j);
/* sched_check_stalls(): re-forming jobs whose ranks did not all rejoin
 * within --rejoin-timeout fail, naming them. */
void reform_check(struct core *core, int64_t now);
/* job_free(): what the re-forming holds. Accepts a job without it. */
void reform_free(struct job *j);

#endif
