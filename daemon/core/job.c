/*
 * job.c — jobs on this daemon: a job id, W ranks, its plan and its executor.
 * Jobs are isolated from one another: each has its own buffers, state and
 * executor thread, and a failure ends only that job.
 *
 * Life (one table, job_set_state): FORMING (ranks say Hello and register the
 * plan; every plan is compared with the others and every buffer mapped and
 * size-checked; a job over several nodes then waits for every node to join
 * the rendezvous, rdzv.h) -> REGISTERING (all registered: the executor opens the
 * job's backends and copies rank 0's parameters) -> ACTIVE (iterations,
 * sched.c); from any of them -> FAILED (a named error: the remaining ranks
 * are told and detached; or a quiet end, a rank that left between
 * iterations: the others stay until they leave too, and only one that asks
 * for more is told, which makes the end a failure, job_went_on) -> DRAINING
 * (no rank left, the executor still stopping) -> freed. Another node's end,
 * relayed by the rendezvous (rdzv.c), ends the job here the same way; a
 * quiet one waits for this node to finish the iteration it came before
 * (job_end_remote, job_iteration_done).
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "mem/cudabufs.h"
#include "base/config.h"
#include "core/hooks.h"
#include "core/job.h"
#include "core/rdzv.h"
#include "core/reform.h"
#include "core/sched.h"
#include "core/statex.h"
#include "exec/exec.h"
#include "core/sink.h"
#include "exec/backend.h"
#include "core/devmem.h"
#include "base/log.h"
#include "core/semantics.h"
#include "core/sharedp.h"
#include "mem/mem.h"

/* Job ids are per uid: another user's Hello never finds (nor learns of, nor
 * squats) a job, it names one of its own. A failed job whose ranks have all
 * left and that waits only for its executor to stop (DRAINING) no longer
 * holds its id: the next run forms beside it while it drains (one over
 * several nodes keeps it, since the rendezvous knows jobs by id). */
static struct job *job_find(struct core *core, const char *id, uid_t uid)
{
	for (struct job *j = core->jobs; j; j = j->next) {
		if (j->state == JOB_DRAINING && j->nconnected == 0 && !j->rdzv)
			continue;
		if (j->uid == uid && strcmp(j->id, id) == 0)
			return j;
	}
	return NULL;
}

static struct job *job_new(struct core *core, const char *id, uid_t uid, uint32_t world)
{
	struct job *j = calloc(1, sizeof(*j));

	if (!j)
		return NULL;
	j->core = core;
	snprintf(j->id, sizeof(j->id), "%s", id);
	j->uid = uid;
	j->world = world;
	j->snap_iter = UINT64_MAX;
	j->ranks = calloc(world, sizeof(*j->ranks));
	j->plans = calloc(world, sizeof(*j->plans));
	j->grad_map = calloc(world, sizeof(*j->grad_map));
	j->param_map = calloc(world, sizeof(*j->param_map));
	j->sharedp = calloc(world, sizeof(*j->sharedp));
	j->next_bucket = calloc(world, sizeof(*j->next_bucket));
	j->joined = calloc(world, sizeof(*j->joined));
	if (!j->ranks || !j->plans || !j->grad_map || !j->param_map || !j->sharedp ||
	    !j->next_bucket || !j->joined) {
		free(j->ranks);
		free(j->plans);
		free(j->grad_map);
		free(j->param_map);
		free(j->sharedp);
		free(j->next_bucket);
		free(j->joined);
		free(j);
		return NULL;
	}
	j->next = core->jobs;
	core->jobs = j;
	core->njobs++;
	core->stats.jobs++;
	return j;
}

static void job_free(struct job *j)
{
	struct core *core = j->core;
	struct exec_stats es = {0};
	char ranks[48];

	CORE_HOOK(core, job_free, j);
	for (struct job **pp = &core->jobs; *pp; pp = &(*pp)->next)
		if (*pp == j) {
			*pp = j->next;
			break;
		}
	core->njobs--;
	core->memory_used -= j->memory; /* 0 once EXEC_STOPPED came */
	free(j->devmem);
	if (j->exec) {
		exec_stats(j->exec, &es);
		exec_free(j->exec);
	}
	rdzv_job_free(j); /* after the executor: it used the rendezvous' store */
	statex_free(j);   /* after the executor: it may have used the staging */
	statex_kept_free(j);
	statex_replan_free(j);
	reform_free(j);
	for (uint32_t r = 0; j->kept && r < j->world; r++)
		core->mem->unmap(j->kept[r].map);
	free(j->kept);
	zero_program_clear(&j->prog);
	free(j->node_of);
	core->stats.reduced_elems += es.reduced_elems;
	core->stats.stepped_elems += es.stepped_elems;
	core->stats.jobs_failed += j->state >= JOB_FAILED && !j->quiet_end;
	/* the ranks that joined here: "2 of 3 ranks" when one never came */
	snprintf(ranks, sizeof(ranks), j->njoined == j->world ? "%u ranks" : "%u of %u ranks",
		 j->njoined, j->world);
	log_info("job %s: ended (%s%s%s): %s, %" PRIu64 " iterations, %" PRIu64
		 " buckets, %.1f MB reduced, %" PRIu64 " elements stepped",
		 j->id, j->quiet_end ? "ok" : zc_strerror_name(j->err), j->quiet_end ? "" : ": ",
		 j->quiet_end ? "" : j->errmsg, ranks, j->iterations_done, j->buckets_done,
		 (double)es.reduced_elems * sizeof(float) / 1e6, es.stepped_elems);
	for (uint32_t r = 0; r < j->world; r++) {
		core->mem->unmap(j->grad_map[r]);
		core->mem->unmap(j->param_map[r]);
		plan_free(j->plans[r]);
		if (j->cuda)
			cudabufs_free(j->cuda[r]);
	}
	free(j->cuda);
	while (j->changes) {
		struct hyper_change *c = j->changes;
		j->changes = c->next;
		free(c);
	}
	shard_map_free(j->shard);
	plan_free(j->plan);
	free(j->ranks);
	free(j->plans);
	free(j->grad_map);
	free(j->param_map);
	free(j->sharedp);
	free(j->next_bucket);
	free(j->joined);
	free(j->arrived);
	free(j->groups);
	sem_free(j->sem);
	free(j);
}

const char *job_state_name(enum job_state s)
{
	static const char *const names[] = {
		[JOB_FORMING] = "forming", [JOB_REGISTERING] = "registering",
		[JOB_ACTIVE] = "active",   [JOB_REFORMING] = "re-forming",
		[JOB_FAILED] = "failed",   [JOB_DRAINING] = "draining",
	};
	return s <= JOB_DRAINING ? names[s] : "?";
}

void job_set_state(struct job *j, enum job_state to)
{
	/* allowed[from] has bit `to` set */
	static const unsigned allowed[] = {
		[JOB_FORMING] = 1u << JOB_REGISTERING | 1u << JOB_FAILED,
		[JOB_REGISTERING] = 1u << JOB_ACTIVE | 1u << JOB_FAILED,
		[JOB_ACTIVE] = 1u << JOB_FAILED | 1u << JOB_REGISTERING /* a re-plan */
			       | 1u << JOB_REFORMING,
		[JOB_REFORMING] = 1u << JOB_REGISTERING | 1u << JOB_FAILED,
		[JOB_FAILED] = 1u << JOB_DRAINING,
		[JOB_DRAINING] = 0,
	};

	assert(allowed[j->state] & (1u << to));
	log_debug("job %s: %s -> %s", j->id, job_state_name(j->state), job_state_name(to));
	j->state = to;
}

void job_maybe_free(struct job *j)
{
	/* a job re-forming keeps its state with no rank connected */
	if (j->nconnected > 0 || j->state == JOB_REFORMING)
		return;
	if (!j->exec_running) {
		job_free(j);
		return;
	}
	if (j->state == JOB_FAILED)
		job_set_state(j, JOB_DRAINING);
}

bool job_awaits_plan(const struct job *j, uint32_t rank)
{
	if (j->state == JOB_REFORMING)
		return !reform_registered(j, rank);
	return j->state == JOB_FORMING && !j->plans[rank] && !j->grad_map[rank];
}

void job_free_all(struct core *core)
{
	while (core->jobs) {
		struct job *j = core->jobs;
		for (uint32_t r = 0; r < j->world; r++)
			j->ranks[r] = NULL;
		j->nconnected = 0;
		job_free(j);
	}
}

void job_fail(struct job *j, int code, bool loud, const char *fmt, ...)
{
	va_list ap;

	if (job_ended(j))
		return;
	va_start(ap, fmt);
	vsnprintf(j->errmsg, sizeof(j->errmsg), fmt, ap);
	va_end(ap);
	j->err = code;
	job_set_state(j, JOB_FAILED);
	j->quiet_end = !loud;
	if (loud)
		log_notice("job %s: failed: %s: %s", j->id, zc_strerror_name(code), j->errmsg);
	else
		log_info("job %s: ends: %s", j->id, j->errmsg);
	/* After a failure its ranks are told now and its sessions end at once:
	 * a failed job holds no session, no slot and, once its executor
	 * stopped, no memory. After a quiet end nobody waits on anything: the
	 * other ranks are told nothing (most are leaving too, and their
	 * Goodbye needs its session); one that goes on is told then. */
	for (uint32_t r = 0; r < j->world && loud; r++) {
		if (!j->ranks[r])
			continue;
		sink_error(j->core->sink, j->ranks[r], code, true, j->iter, -1, "job %s: %s", j->id,
			   j->errmsg);
		j->core->sink->detach(j->ranks[r]);
	}
	if (j->rdzv)
		rdzv_job_failed(j); /* the other nodes are told */
	if (j->exec && j->exec_running)
		exec_stop(j->exec);
}

void job_went_on(struct job *j, struct member *s)
{
	if (!j->quiet_end)
		return;
	/* the rank that left did not leave after the job's last iteration:
	 * its end (a Ctrl-C, a crash between iterations) is the job's failure */
	j->quiet_end = false;
	log_notice("job %s: failed: %s: %s, and rank %u went on", j->id, zc_strerror_name(j->err),
		   j->errmsg, s->rank);
}

void job_end_remote(struct job *j, int code, bool quiet, uint64_t iter, const char *msg)
{
	if (job_ended(j))
		return;
	/* a state round already in this node's executor is answered first:
	 * the node that ended served it (its collectives are done) */
	if (quiet && j->state == JOB_ACTIVE && (j->iter < iter || statex_busy(j))) {
		j->end_pending = true;
		j->end_iter = iter;
		j->end_code = code;
		snprintf(j->end_msg, sizeof(j->end_msg), "%s", msg);
		return;
	}
	j->end_remote = true;
	if (quiet && !(j->state == JOB_ACTIVE && j->in_flight))
		job_fail(j, code, false, "%s", msg);
	else
		job_fail(j, code, true, "%s", msg);
	j->end_remote = false;
}

void job_iteration_done(struct job *j)
{
	if (j->end_pending && !job_ended(j) && j->iter >= j->end_iter && !statex_busy(j)) {
		j->end_pending = false;
		job_end_remote(j, j->end_code, true, j->end_iter, j->end_msg);
	}
}

/* A job that ended keeps its id until its ranks have left. Ranks whose
 * processes have exited leave after a grace (a Goodbye they sent may still
 * be queued); a new rank of the same id need not wait for it: they leave now.
 * True if any left (j may then be freed). */
static bool job_drop_exited(struct job *j)
{
	const struct sink_ops *sink = j->core->sink;
	struct member **gone = calloc(j->world, sizeof(*gone));
	uint32_t n = 0;

	if (!gone)
		return false;
	for (uint32_t r = 0; r < j->world; r++)
		if (j->ranks[r] && sink->gone(j->ranks[r]))
			gone[n++] = j->ranks[r];
	for (uint32_t k = 0; k < n; k++)
		sink->drop(gone[k], LEAVE_EXITED); /* the last one may free j */
	free(gone);
	return n > 0;
}

/* job_join's first step: the request alone. *spp: the rendezvous, NULL
 * where the job is on this node only. */
static int join_check(const struct join_req *h, const struct rdzv_spec **spp, char *err,
		      size_t errlen)
{
	const struct rdzv_spec *sp = *spp;

	if (!job_id_valid(h->job_id)) {
		snprintf(err, errlen, "job id must be 1..%d characters of [A-Za-z0-9._-]",
			 ZEROD_JOB_ID_MAX);
		return ZC_EPROTO;
	}
	if (h->world == 0 || h->world > ZEROD_MAX_WORLD || h->rank >= h->world) {
		snprintf(err, errlen, "rank %u of world %u: need 0 <= rank < world <= %u", h->rank,
			 h->world, ZEROD_MAX_WORLD);
		return ZC_ERANK;
	}
	if (h->local_size == 0 || h->local_rank >= h->local_size || h->local_size > h->world) {
		snprintf(err, errlen, "local rank %u of local size %u (world %u) is not valid",
			 h->local_rank, h->local_size, h->world);
		return ZC_ERANK;
	}
	if (sp && sp->nnodes == 1 && h->local_size == h->world)
		*spp = sp = NULL; /* a rendezvous of one node: nothing to meet */
	if (h->local_size != h->world && !sp) {
		snprintf(err, errlen,
			 "job %s spans several nodes (%u of %u ranks here) but names no rendezvous "
			 "(ZEROD_RDZV, ZEROD_NNODES, ZEROD_JOB_SECRET)",
			 h->job_id, h->local_size, h->world);
		return ZC_ENOTSUP;
	}
	if (sp && (sp->nnodes < 2 || sp->nnodes > h->world || h->local_size == h->world ||
		   (sp->has_node_rank && sp->node_rank >= sp->nnodes))) {
		snprintf(err, errlen,
			 "job %s: %u of %u ranks on this node, %u nodes%s: not a job over several "
			 "nodes",
			 h->job_id, h->local_size, h->world, sp->nnodes,
			 sp->has_node_rank && sp->node_rank >= sp->nnodes
				 ? ", node rank out of range"
				 : "");
		return ZC_EWORLD;
	}
	if (sp && !backend_host_multi.coll) {
		snprintf(err, errlen,
			 "job %s spans several nodes: this zerod was built without gloo "
			 "(libgloo-dev)",
			 h->job_id);
		return ZC_ENOTSUP;
	}
	return 0;
}

/* job_join's check of rank h->rank against the job j it names, still
 * forming. */
static int join_existing(struct job *j, const struct join_req *h, const struct rdzv_spec *sp,
			 char *err, size_t errlen)
{
	int r;

	/* a restarted group of another size: the re-forming job takes it
	 * (reform.c), on one node, all its ranks here */
	if ((j->world != h->world || j->local_size != h->local_size) && j->state == JOB_REFORMING &&
	    !sp && !j->rdzv && h->local_size == h->world &&
	    (r = reform_resize(j, h->world, err, errlen)) < 0)
		return r;
	if (j->world != h->world) {
		snprintf(err, errlen, "job %s has world size %u, rank %u says %u", j->id, j->world,
			 h->rank, h->world);
		return ZC_EWORLD;
	}
	if (j->local_size != h->local_size) {
		snprintf(err, errlen, "job %s has %u ranks on this node, rank %u says %u", j->id,
			 j->local_size, h->rank, h->local_size);
		return ZC_EWORLD;
	}
	r = rdzv_check_spec(j, h->rank, sp, err, errlen);
	if (r < 0)
		return r;
	if (j->ranks[h->rank]) {
		snprintf(err, errlen, "job %s: rank %u is already connected (pid %d)", j->id,
			 h->rank, (int)j->ranks[h->rank]->pid);
		return ZC_EDUPRANK;
	}
	if (j->state != JOB_FORMING && j->state != JOB_REFORMING) {
		snprintf(err, errlen, "job %s is already running", j->id);
		return ZC_ESTATE;
	}
	return 0;
}

int job_join(struct core *core, struct member *s, const struct join_req *h, char *err,
	     size_t errlen)
{
	const struct rdzv_spec *sp = h->rdzv;
	struct job *j;
	int r;

	r = join_check(h, &sp, err, errlen);
	if (r < 0)
		return r;
	j = job_find(core, h->job_id, s->uid);
	if (j && job_ended(j) && job_drop_exited(j))
		j = job_find(core, h->job_id, s->uid); /* it may be gone: a fresh one forms */
	/* a restarted rank may come before its predecessor's exit was seen:
	 * the predecessor leaves now (the job re-forms, reform.c) */
	if (j && !job_ended(j) && h->rank < j->world && j->ranks[h->rank] &&
	    core->sink->gone(j->ranks[h->rank]) && job_drop_exited(j))
		j = job_find(core, h->job_id, s->uid);
	/* the same before the group takes another size: the old ranks gone */
	if (j && j->state == JOB_REFORMING && j->world != h->world && j->nconnected &&
	    job_drop_exited(j))
		j = job_find(core, h->job_id, s->uid);
	if (j && job_ended(j)) {
		snprintf(err, errlen, "job %s %s earlier (%s%s%s); %s", j->id,
			 j->quiet_end ? "ended" : "failed",
			 j->quiet_end ? "" : zc_strerror_name(j->err), j->quiet_end ? "" : ": ",
			 j->errmsg,
			 j->nconnected ? "wait for its ranks to leave"
				       : "its ranks left, its nodes are still stopping it");
		return ZC_EJOBFAILED;
	}
	if (j && (r = join_existing(j, h, sp, err, errlen)) < 0)
		return r;
	if (!j) {
		if (core->njobs >= core->cfg->max_jobs) {
			snprintf(err, errlen, "zerod already serves %u jobs (--max-jobs)",
				 core->njobs);
			return ZC_ELIMIT;
		}
		j = job_new(core, h->job_id, s->uid, h->world);
		if (!j) {
			snprintf(err, errlen, "out of memory");
			return -ENOMEM;
		}
		log_info("job %s: new, world %u, uid %u", j->id, j->world, (unsigned)j->uid);
		j->local_size = h->local_size;
		if (sp && (r = rdzv_job_new(j, sp, err, errlen)) < 0) {
			job_free(j);
			return r;
		}
	}
	j->ranks[h->rank] = s;
	j->nconnected++;
	if (!j->joined[h->rank]) {
		j->joined[h->rank] = true;
		j->njoined++;
	}
	j->progress_ms = now_ms();
	s->job = j;
	s->rank = h->rank; /* job.h: the caller's member learns its rank here */
	log_info("job %s: rank %u joined (pid %d, %u/%u)", j->id, h->rank, (int)s->pid,
		 j->nconnected, j->local_size);
	/* a re-forming job's rendezvous formed already: its restarted ranks
	 * meet the other nodes' under a new prefix (reform.c) */
	if (j->rdzv && j->nconnected == j->local_size && j->state != JOB_REFORMING)
		rdzv_local_joined(j);
	return 0;
}

/* A bf16/fp16 plan on a backend that would not round as zeroclient.h says:
 * refused by name rather than computed wrong. */
static int refuse_low_precision(struct job *j)
{
	uint32_t b = 0;

	while (j->plan->buckets[b].dtype == ZC_DTYPE_F32)
		b++;
	job_fail(j, ZC_ENOTSUP, true,
		 "bucket %u is %s: the %s backend steps fp32 buckets only (bf16/fp16 need "
		 "every rank of the job on one node)",
		 b, plan_dtype_name(j->plan->buckets[b].dtype), j->be->name);
	return 0;
}

/* NCCL moves a CUDA job's tensors between nodes in plain text: with TLS
 * keys configured such a job is refused unless the operator allowed it. */
static bool refuse_plain_nccl(struct job *j)
{
	const struct coll_net *net = j->rdzv ? rdzv_net(j) : NULL;

	if (!net || net->nnodes < 2 || !net->tls || j->core->cfg->tls_allow_plain_nccl)
		return false;
	job_fail(j, ZC_ENOTSUP, true,
		 "a CUDA job over %u nodes: NCCL's transport between nodes is not encrypted, and "
		 "this zerod has TLS keys; run it on host buffers (the mesh over TLS), or allow "
		 "it with --tls-allow-plain-nccl (zerod.conf: tls-allow-plain-nccl = yes)",
		 net->nnodes);
	return true;
}

/* job_start's first step: the local ranks' mapped buffers into grads and
 * params, and the plan every local rank registered. */
static void start_buffers(struct job *j, float **grads, float **params)
{
	struct core *core = j->core;

	for (uint32_t k = 0; k < j->world; k++) {
		if (!j->grad_map[k])
			continue; /* a rank of another node */
		grads[k] = core->mem->ptr(j->grad_map[k]);
		params[k] = j->param_map[k] ? core->mem->ptr(j->param_map[k]) : NULL;
	}
	sharedp_alias(j, params); /* the ranks of a shared buffer: its one mapping */
	/* every local rank registered this plan (rank 0 may be on another node) */
	for (uint32_t k = 0; k < j->world && !j->plan; k++) {
		j->plan = j->plans[k];
		j->plans[k] = NULL;
	}
}

/* job_start's second step: the backend, this node's place among the job's,
 * the shard, the program and the state's layout (*ret_st). 1: refused (the
 * job failed), 0 or -errno. */
static int start_layout(struct job *j, uint32_t *node, uint32_t *nnodes, struct state **ret_st)
{
	struct core *core = j->core;
	struct zero_caps caps;
	int r;

	/* shm buffers: the host backend, with gloo across nodes; CUDA
	 * buffers: the cuda backend (register_plan checked it is offered) */
	j->be = j->cuda ? core->cuda : j->rdzv ? &backend_host_multi : &backend_host;
	if (j->rdzv)
		rdzv_topology(j, j->node_of, node, nnodes);
	if (j->plan->low_precision && !j->be->low_precision) {
		refuse_low_precision(j);
		return 1;
	}
	j->topo = (struct zero_topo){
		.world = j->world, .nnodes = *nnodes, .node = *node, .node_of = j->node_of};
	caps = (struct zero_caps){.local_fuse = j->be->coll->local_fuse};
	r = shard_assign(j->plan, j->world, &j->shard);
	if (r < 0)
		return r;
	r = zero_program(j->plan, &j->topo, &caps, &j->prog);
	if (r < 0)
		return r;
	j->state_arrays = plan_state_arrays(j->plan->optimizer, j->plan->groups, j->plan->ngroups);
	return state_layout(j->plan, j->shard, &j->topo, j->state_arrays, ret_st);
}

/* What a recovery needs of j beyond its state (reform.c), decided before
 * it is charged: on CUDA buffers, a job that can re-form keeps a copy of
 * its fp32 parameters on the devices, and with --recovery-journal the
 * journal's copy of its state; on host buffers the journal is for step
 * mode interleaved. */
static void start_recovery_kind(struct job *j)
{
	const struct daemon_config *cfg = j->core->cfg;
	bool reforms = cfg->rejoin_timeout_ms > 0;

	/* over several nodes only host buffers re-form */
	j->keep_params = j->cuda && reforms && !j->rdzv;
	j->journal = cfg->recovery_journal && reforms &&
		     (j->cuda ? !j->rdzv : j->plan->step_mode == ZC_STEP_INTERLEAVED);
}

/* The host memory j may hold beyond the state st, what it is into *what:
 * the host journal (a copy of the arena and of every owned parameter), or
 * on CUDA buffers what the old executor copies off the devices when a
 * trainer dies (exec_take_params: the whole buffer's image; and the
 * journal). */
static uint64_t recovery_bytes(const struct job *j, const struct state *st, const char **what)
{
	uint64_t journal = j->journal ? state_bytes(st) + st->nelems * sizeof(uint32_t) : 0;

	*what = "";
	if (j->keep_params) {
		*what = " and what a recovery copies off the devices";
		return plan_buffer_bytes(j->plan) + journal;
	}
	if (j->journal)
		*what = " and its undo journal (--recovery-journal)";
	return journal;
}

uint64_t job_memory_of(const struct job *j, const struct state *st)
{
	const char *what;

	return state_bytes(st) + recovery_bytes(j, st, &what);
}

/* job_start's third step: charge state st (and what a recovery of it
 * needs) against --max-memory and --max-user-memory, a CUDA job's device
 * memory against its devices, and refuse plain NCCL between nodes where
 * TLS keys are. 1: refused (the job failed, nothing charged), 0: charged,
 * or -errno. */
static int start_admit(struct job *j, const struct state *st)
{
	struct core *core = j->core;
	const char *what;
	int r;

	start_recovery_kind(j);
	j->memory = state_bytes(st) + recovery_bytes(j, st, &what);
	if (j->memory > core->cfg->max_memory - core->memory_used) {
		char need[16], left[16], max[16];

		job_fail(j, ZC_ELIMIT, true,
			 "the job needs %s for optimizer state%s, zerod has %s of its "
			 "--max-memory %s left",
			 fmt_bytes(need, j->memory), what,
			 fmt_bytes(left, core->cfg->max_memory - core->memory_used),
			 fmt_bytes(max, core->cfg->max_memory));
		j->memory = 0;
		return 1;
	}
	if (core->cfg->max_user_memory) {
		uint64_t mine = 0;
		char need[16], held[16], max[16];

		for (struct job *o = core->jobs; o; o = o->next)
			if (o != j && o->uid == j->uid)
				mine += o->memory;
		if (j->memory > core->cfg->max_user_memory ||
		    mine > core->cfg->max_user_memory - j->memory) {
			job_fail(j, ZC_ELIMIT, true,
				 "the job needs %s for optimizer state%s, the other jobs of user "
				 "%u hold %s of their --max-user-memory %s",
				 fmt_bytes(need, j->memory), what, (unsigned)j->uid,
				 fmt_bytes(held, mine), fmt_bytes(max, core->cfg->max_user_memory));
			j->memory = 0;
			return 1;
		}
	}
	free(j->devmem); /* a re-plan's start: charged again */
	j->devmem = NULL;
	j->ndevmem = 0;
	if (j->cuda) {
		char why[256];

		r = devmem_of(st, j->cuda, j->keep_params, j->journal, &j->devmem, &j->ndevmem);
		if (r < 0)
			return r;
		if (devmem_check(core, j, why, sizeof(why)) < 0) {
			job_fail(j, ZC_ELIMIT, true, "%s", why);
			j->memory = 0;
			return 1;
		}
	}
	if (j->cuda && refuse_plain_nccl(j)) {
		j->memory = 0;
		return 1;
	}
	core->memory_used += j->memory;
	return 0;
}

/* job_start's last step: the executor, given the state *st (NULL after,
 * even on failure), and the job registering. */
static int start_exec(struct job *j, float **grads, float **params, struct state **st,
		      const struct exec_recover *recover, uint32_t node, uint32_t nnodes)
{
	struct core *core = j->core;
	struct exec_config ec = {
		.tag = j,
		.plan = j->plan,
		.shard = j->shard,
		.prog = &j->prog,
		.state = *st,
		.world = j->world,
		.grads = grads,
		.params = params,
		.coll = j->be->coll,
		.net = j->rdzv ? rdzv_net(j) : NULL,
		.optim = j->be->optim,
		.pool = core->pool,
		.cq = core->cq,
		.mem = j->cuda ? j->be->mem : NULL,
		.bufs = j->cuda,
		.stall_timeout_ms = core->cfg->stall_timeout_ms,
		.recover = recover,
		.journal = j->journal,
		.keep_params = j->cuda && j->keep_params,
	};
	int r;

	*st = NULL; /* the executor's now */
	r = exec_new(&ec, &j->exec);
	if (r < 0)
		return r;
	j->exec_running = true;
	job_set_state(j, JOB_REGISTERING);
	log_info("job %s: plan %016" PRIx64 ": %s, shard %s (%u units), step %s, %u buckets, "
		 "%" PRIu64 " elements, backend %s, node %u of %u, %u ops per iteration, "
		 "%" PRIu64 " bytes of state here%s",
		 j->id, j->plan->hash, plan_optimizer_name(j->plan->optimizer),
		 plan_shard_name(j->plan->shard_mode), j->shard->nunits,
		 plan_step_name(j->plan->step_mode), j->plan->nbuckets, j->plan->total_numel,
		 j->be->name, node, nnodes, j->prog.nops, j->memory,
		 nnodes < 2 ? ""
		 : j->cuda  ? ", tensors between nodes over NCCL (not encrypted)"
		 : rdzv_net(j)->tls
			 ? (rdzv_net(j)->ktls
				    ? ", tensors between nodes over TLS 1.3 (kernel TLS asked for)"
				    : ", tensors between nodes over TLS 1.3")
			 : ", tensors between nodes over gloo (not encrypted)");
	return 0;
}

/* Every rank registered: pick the backend, lay out the shard and the state,
 * charge the state against --max-memory and start the executor. */
static void job_start(struct job *j)
{
	float **grads = calloc(j->world, sizeof(*grads));
	float **params = calloc(j->world, sizeof(*params));
	struct state *st = NULL;
	const struct exec_recover *recover = NULL;
	uint32_t node = 0, nnodes = 1;
	int r;

	j->node_of = calloc(j->world, sizeof(*j->node_of));
	if (!grads || !params || !j->node_of) {
		r = -ENOMEM;
		goto out;
	}
	start_buffers(j, grads, params);
	r = start_layout(j, &node, &nnodes, &st);
	if (r == 0 && j->rf) /* a re-formed job: its state as it was kept */
		r = reform_take(j, &st, &recover);
	if (r == 0)
		r = start_admit(j, st);
	if (r == 0)
		r = start_exec(j, grads, params, &st, recover, node, nnodes);
	if (r == 0 && j->rf)
		reform_handed(j); /* the old buffers are the executor's to unmap */
out:
	state_free(st);
	/* the executor copied the arrays */
	free(grads);
	free(params);
	if (r < 0)
		job_fail(j, r == -ENOMEM ? ZC_ELIMIT : ZC_EINTERNAL, true,
			 "cannot start the job: %s", zc_strerror(r));
}

/* The grad buffer gd names for rank: the mapping kept for its retry when
 * gd names it again (grad_keep), else a new one. */
static int grad_map(struct job *j, uint32_t rank, const struct mem_desc *gd, uint64_t bytes,
		    struct mem_map **ret, char *err, size_t errlen)
{
	struct kept_grad *k = j->kept ? &j->kept[rank] : NULL;
	struct mem_map *kept = k ? k->map : NULL;

	if (k)
		k->map = NULL;
	if (kept && gd->shm_name && strcmp(gd->shm_name, k->name) == 0 && gd->bytes == bytes &&
	    k->bytes == bytes) {
		*ret = kept;
		return 0;
	}
	j->core->mem->unmap(kept);
	return j->core->mem->map(gd, bytes, ret, err, errlen);
}

/* Keep m, rank's grad buffer of a RegisterPlan refused for its param
 * buffer: a named buffer's name is gone once mapped, so the rank's retry
 * names a buffer only this mapping still holds. m NULL: drop what is kept. */
static void grad_keep(struct job *j, uint32_t rank, struct mem_map *m, const char *name,
		      uint64_t bytes)
{
	struct kept_grad *k;

	if (m && !j->kept)
		j->kept = calloc(j->world, sizeof(*j->kept));
	if (!j->kept) {
		j->core->mem->unmap(m);
		return;
	}
	k = &j->kept[rank];
	j->core->mem->unmap(k->map);
	k->map = NULL;
	if (!m || !name || strlen(name) >= sizeof(k->name)) {
		j->core->mem->unmap(m);
		return;
	}
	strcpy(k->name, name);
	k->bytes = bytes;
	k->map = m;
}

/* Whether rank s's buffers may join j: CUDA buffers need a daemon that
 * offers the cuda backend, and a job's ranks all register one kind. */
static int buffers_kind_ok(struct job *j, struct member *s, bool cuda, char *err, size_t errlen)
{
	if (cuda && !j->core->cuda) {
		snprintf(err, errlen,
			 "rank %u: CUDA buffers, but this zerod serves host buffers only (%s)",
			 s->rank, j->core->backend_why);
		return ZC_ENOTSUP;
	}
	for (uint32_t k = 0; k < j->world; k++)
		if (k != s->rank && j->plans[k] && (j->cuda && j->cuda[k]) != cuda) {
			snprintf(
				err, errlen,
				"rank %u: %s buffers, rank %u registered %s buffers: a job's ranks "
				"use one kind",
				s->rank, cuda ? "CUDA" : "host", k, cuda ? "host" : "CUDA");
			return ZC_ENOTSUP;
		}
	return 0;
}

static void register_plan(struct job *j, struct member *s, struct plan *p,
			  const struct mem_desc *gd, const struct mem_desc *pd,
			  struct cudabufs *cb);

void job_register_plan(struct job *j, struct member *s, struct plan *p, const struct mem_desc *gd,
		       const struct mem_desc *pd)
{
	register_plan(j, s, p, gd, pd, NULL);
}

void job_register_cuda(struct job *j, struct member *s, struct plan *p, struct cudabufs *cb)
{
	register_plan(j, s, p, NULL, NULL, cb);
}

static void register_plan(struct job *j, struct member *s, struct plan *p,
			  const struct mem_desc *gd, const struct mem_desc *pd, struct cudabufs *cb)
{
	struct core *core = j->core;
	char err[384], field[192];
	struct sharedp sp = {0};
	int r;

	if (job_ended(j)) {
		sink_error(core->sink, s, ZC_EJOBFAILED, true, SINK_NO_ITERATION, -1,
			   "job %s failed: %s", j->id, j->errmsg);
		plan_free(p);
		cudabufs_free(cb);
		return;
	}
	if (j->state == JOB_ACTIVE) {
		statex_replan(j, s, p, gd, pd, cb); /* between iterations: a new layout */
		return;
	}
	if (j->state == JOB_REFORMING) {
		reform_register(j, s, p, gd, pd, cb); /* a restarted rank rejoins */
		return;
	}
	if (j->state != JOB_FORMING || j->plans[s->rank] || j->grad_map[s->rank]) {
		sink_error(core->sink, s, ZC_ENOTSUP, false, SINK_NO_ITERATION, -1,
			   "job %s: rank %u already registered a plan; changing the plan of a "
			   "running job is not supported",
			   j->id, s->rank);
		plan_free(p);
		cudabufs_free(cb);
		return;
	}
	for (uint32_t k = 0; k < j->world; k++) {
		if (k == s->rank || !j->plans[k])
			continue;
		if (plan_diff(j->plans[k], p, field, sizeof(field))) {
			/* The job cannot start: every rank, the waiting ones too,
			 * learns which rank and which field. */
			plan_free(p);
			cudabufs_free(cb);
			job_fail(
				j, ZC_EPLANMISMATCH, true,
				"plan of rank %u differs from rank %u's at %s (rank %u vs rank %u)",
				s->rank, k, field, k, s->rank);
			return;
		}
		break; /* the registered plans agree with each other already */
	}
	r = buffers_kind_ok(j, s, cb != NULL, err, sizeof(err));
	if (r >= 0)
		r = sharedp_check(j, s->rank, pd, &sp, err, sizeof(err));
	if (r < 0) {
		sink_error(core->sink, s, r, false, SINK_NO_ITERATION, -1, "%s", err);
		plan_free(p);
		cudabufs_free(cb);
		return;
	}
	if (cb) {
		/* opened by the executor when the job starts: opening may block */
		if (!j->cuda && !(j->cuda = calloc(j->world, sizeof(*j->cuda)))) {
			sink_error(core->sink, s, -ENOMEM, false, SINK_NO_ITERATION, -1,
				   "rank %u: out of memory", s->rank);
			plan_free(p);
			cudabufs_free(cb);
			return;
		}
		j->cuda[s->rank] = cb;
		r = 0;
		goto registered;
	}
	r = grad_map(j, s->rank, gd, plan_buffer_bytes(p), &j->grad_map[s->rank], err, sizeof(err));
	/* a shared parameter buffer is mapped once, by its first rank */
	if (r >= 0 && !sharedp_mapped(j, &sp)) {
		r = core->mem->map(pd, plan_buffer_bytes(p), &j->param_map[s->rank], err,
				   sizeof(err));
		if (r < 0) {
			/* its name is gone: kept, so that a retry can name it again */
			grad_keep(j, s->rank, j->grad_map[s->rank], gd->shm_name, gd->bytes);
			j->grad_map[s->rank] = NULL;
		}
	}
	if (r < 0) {
		sink_error(core->sink, s, r, false, SINK_NO_ITERATION, -1, "rank %u: %s", s->rank,
			   err);
		plan_free(p);
		return;
	}
registered:
	sharedp_commit(j, s->rank, &sp);
	j->plans[s->rank] = p;
	j->nregistered++;
	j->progress_ms = now_ms();
	log_info("job %s: rank %u registered plan %016" PRIx64 " (%u/%u)", j->id, s->rank, p->hash,
		 j->nregistered, j->local_size);
	if (j->nregistered < j->local_size)
		return;
	if (j->rdzv)
		rdzv_local_ready(j); /* the job forms once every node joined */
	else
		job_start(j);
}

void job_formed(struct job *j)
{
	job_start(j);
}

void job_restart(struct job *j)
{
	shard_map_free(j->shard);
	j->shard = NULL;
	zero_program_clear(&j->prog);
	free(j->node_of);
	j->node_of = NULL;
	plan_free(j->plan);
	j->plan = NULL;
	free(j->arrived);
	j->arrived = NULL;
	sem_free(j->sem); /* sized by the old plan's segments; made again on use */
	j->sem = NULL;
	job_start(j); /* j->plans[] hold the new plan */
}

void job_leave(struct job *j, struct member *s, enum leave_reason why)
{
	char who[256];
	/* A rank that gives up on a job that waits for others (its own
	 * register timeout): the job's end reason names them too. */
	bool waited = !job_ended(j) && j->state == JOB_FORMING && j->plans[s->rank] &&
		      sched_describe_wait(j, who, sizeof(who)) > 0;
	bool occupant = j->ranks[s->rank] == s;

	if (occupant) {
		j->ranks[s->rank] = NULL;
		j->nconnected--;
		grad_keep(j, s->rank, NULL, NULL, 0); /* what it kept for a retry */
	}
	if (j->state == JOB_REFORMING) {
		reform_leave(j, s, occupant);
		job_maybe_free(j);
		return;
	}
	/* Between iterations a rank that leaves ends the job quietly: the
	 * others are not waiting on anything. Otherwise they are told now. A
	 * trainer that dies, a job of this node's host buffers, re-forms
	 * instead (reform.c) while --rejoin-timeout lets it. */
	if (!job_ended(j)) {
		/* nobody waits on anything: no bucket in flight, no state round */
		bool idle = j->state == JOB_ACTIVE && !j->in_flight && !statex_busy(j);
		const char *how = why == LEAVE_GOODBYE ? "left the job"
				  : why == LEAVE_UNREACHABLE
					  ? "cannot be sent to (gone, or not reading)"
				  : why == LEAVE_CLOSED    ? "closed its connection"
				  : j->state != JOB_ACTIVE ? "exited before the job started"
				  : idle                   ? "exited between iterations"
							   : "died during an iteration";
		if (why != LEAVE_GOODBYE && j->state == JOB_ACTIVE && reform_begin(j, s, how)) {
			job_maybe_free(j);
			return;
		}
		job_fail(j, ZC_ERANKDEAD, !idle, "rank %u (pid %d) %s%s%s", s->rank, (int)s->pid,
			 how, waited ? "; the job waited for " : "", waited ? who : "");
	}
	job_maybe_free(j);
}
