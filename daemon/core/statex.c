/*
 * statex.c — optimizer state export and import for a running job
 * (GetState / SetState, zc_get_state() / zc_set_state()): a round between
 * iterations that every local rank of the job joins. Each rank hands over a
 * staging (exec.h: exec_state_regions() regions of the plan's state_numel
 * floats): a memfd it passed over <socket>.fd just before (fdbufs.c,
 * FDSTAGE), or from an older client a named shm; once every local rank is
 * in, the executor copies the state in or out (exec_state) and each rank
 * gets StateOk.
 *
 * A checkpoint's export (CheckpointState, zc_checkpoint()) is such a round
 * in which only the ranks passing a staging get the state of the pieces
 * this node owns (over several nodes: no other node's, and StateOk names
 * them), the step word at each piece's first element only; a memfd staging is kept
 * mapped in j->sxk while the next round passes the same file, so after the
 * first checkpoint nothing is mapped, faulted in or unmapped on its way.
 *
 * A request that cannot be served (a wrong staging size, a bad segment, a
 * list that differs from another rank's) spoils its round: the round still
 * waits for every local rank, then every one of them hears the error and
 * nothing is applied. So no rank is left waiting, and the job goes on with
 * its previous state.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common.h"
#include "coll/coll.h"
#include "mem/cudabufs.h"
#include "base/config.h"
#include "core/job.h"
#include "core/rdzv.h"
#include "core/sched.h"
#include "core/statex.h"
#include "exec/exec.h"
#include "core/sink.h"
#include "base/log.h"
#include "mem/mem.h"
#include "core/sharedp.h"

struct statex {
	bool set;
	bool ckpt;      /* a checkpoint's export (statex_ckpt_request) */
	bool kept_used; /* a rank's staging of this round is j->sxk's */
	bool queued;    /* the executor has it */
	uint32_t narrived;
	bool *arrived;        /* [world] */
	struct mem_map **stg; /* [world] */
	float **base;         /* [world] */
	int err;              /* the round is spoilt: every rank hears this */
	char errmsg[256];
	/* set: the first rank's list, and the segments by flat index */
	uint32_t first_rank;
	size_t nlist;
	struct exec_seg_state *list_in; /* [nlist], with bucket/segment below */
	uint32_t *list_at;              /* [nlist]: flat segment index */
	struct exec_seg_state *segs;    /* [nsegs] */
	uint32_t *seg_first;            /* [nbuckets] */
};

void statex_free(struct job *j)
{
	struct statex *x = j->sx;

	if (!x)
		return;
	for (uint32_t r = 0; r < j->world; r++)
		if (x->stg)
			j->core->mem->unmap(x->stg[r]);
	free(x->arrived);
	free(x->stg);
	free(x->base);
	free(x->list_in);
	free(x->list_at);
	free(x->segs);
	free(x->seg_first);
	free(x);
	j->sx = NULL;
}

/* A checkpoint's staging kept mapped: the memfd's file, and the bytes it
 * was mapped for (a re-plan may change them). */
struct statex_kept {
	struct mem_map *map;
	dev_t dev;
	ino_t ino;
	uid_t owner; /* the uid mem->map checked the file against */
	uint64_t bytes;
};

void statex_kept_free(struct job *j)
{
	if (!j->sxk)
		return;
	j->core->mem->unmap(j->sxk->map);
	free(j->sxk);
	j->sxk = NULL;
}

/* The kept mapping of md's memfd for `want` bytes, mapped now if it is
 * another file (or size) than the kept one: its base, or NULL with err. */
static float *kept_map(struct job *j, const struct mem_desc *md, uint64_t want, int *ret_code,
		       char *err, size_t errlen)
{
	struct statex_kept *k = j->sxk;
	struct mem_map *m = NULL;
	struct stat st;
	int r;

	if (fstat(md->fd, &st) < 0) {
		snprintf(err, errlen, "fstat: %s", strerror(errno));
		*ret_code = ZC_EBUFFER;
		return NULL;
	}
	if (k && k->dev == st.st_dev && k->ino == st.st_ino && k->owner == md->owner &&
	    k->bytes == want)
		return j->core->mem->ptr(k->map);
	if ((r = j->core->mem->map(md, want, &m, err, errlen)) < 0) {
		*ret_code = r;
		return NULL;
	}
	if (!k && !(k = calloc(1, sizeof(*k)))) {
		j->core->mem->unmap(m);
		snprintf(err, errlen, "out of memory");
		*ret_code = ZC_ELIMIT;
		return NULL;
	}
	/* no round uses the old one: one round at a time, this one is not
	 * queued yet, and no other rank of it has the kept one (kept_used) */
	j->core->mem->unmap(k->map);
	*k = (struct statex_kept){
		.map = m, .dev = st.st_dev, .ino = st.st_ino, .owner = md->owner, .bytes = want};
	j->sxk = k;
	return j->core->mem->ptr(m);
}

static int round_new(struct job *j, bool set)
{
	const struct plan *p = j->plan;
	struct statex *x = calloc(1, sizeof(*x));
	uint32_t nsegs = 0;

	if (!x)
		return -ENOMEM;
	j->sx = x;
	x->set = set;
	x->arrived = calloc(j->world, sizeof(*x->arrived));
	x->stg = calloc(j->world, sizeof(*x->stg));
	x->base = calloc(j->world, sizeof(*x->base));
	x->seg_first = calloc(p->nbuckets, sizeof(*x->seg_first));
	if (!x->arrived || !x->stg || !x->base || !x->seg_first)
		return -ENOMEM;
	for (uint32_t b = 0; b < p->nbuckets; b++) {
		x->seg_first[b] = nsegs;
		nsegs += p->buckets[b].nsegments;
	}
	x->segs = calloc(nsegs, sizeof(*x->segs));
	return x->segs ? 0 : -ENOMEM;
}

static void spoil(struct statex *x, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void spoil(struct statex *x, int code, const char *fmt, ...)
{
	va_list ap;

	if (x->err)
		return; /* the first reason stands */
	x->err = code;
	va_start(ap, fmt);
	vsnprintf(x->errmsg, sizeof(x->errmsg), fmt, ap);
	va_end(ap);
}

/* This rank's list: checked, and compared with the first rank's. */
static void take_list(struct job *j, struct statex *x, uint32_t rank,
		      Zerod__V1__SegmentState *const *list, size_t n)
{
	const struct plan *p = j->plan;
	bool first = x->list_in == NULL && !x->err;
	char err[256];

	if (!first && !x->err && n != x->nlist) {
		spoil(x, ZC_ESTATEINVAL,
		      "rank %u gives the state of %zu segments, rank %u of %zu: every rank must "
		      "give the same",
		      rank, n, x->first_rank, x->nlist);
		return;
	}
	if (first) {
		x->first_rank = rank;
		x->nlist = n;
		x->list_in = calloc(n ? n : 1, sizeof(*x->list_in));
		x->list_at = calloc(n ? n : 1, sizeof(*x->list_at));
		if (!x->list_in || !x->list_at) {
			spoil(x, ZC_ELIMIT, "out of memory");
			return;
		}
	}
	for (size_t i = 0; i < n && !x->err; i++) {
		const Zerod__V1__SegmentState *m = list[i];
		uint32_t at;

		if (plan_state_check(p, m->bucket, m->segment, m->present, m->step, err,
				     sizeof(err)) < 0) {
			spoil(x, ZC_ESTATEINVAL, "rank %u: %s", rank, err);
			return;
		}
		at = x->seg_first[m->bucket] + m->segment;
		if (first) {
			if (x->segs[at].given) {
				spoil(x, ZC_ESTATEINVAL,
				      "rank %u: buckets[%u].segments[%u] is given twice", rank,
				      m->bucket, m->segment);
				return;
			}
			x->segs[at] = (struct exec_seg_state){
				.given = true,
				.present = m->present,
				.step = (m->present & ZC_STATE_STEP) ? (uint64_t)m->step : 0,
			};
			x->list_in[i] = x->segs[at];
			x->list_at[i] = at;
		} else if (x->list_at[i] != at || x->list_in[i].present != m->present ||
			   ((m->present & ZC_STATE_STEP) &&
			    x->list_in[i].step != (uint64_t)m->step)) {
			spoil(x, ZC_ESTATEINVAL,
			      "rank %u's state of buckets[%u].segments[%u] (segments[%zu] of its "
			      "list) differs from rank %u's: every rank must give the same",
			      rank, m->bucket, m->segment, i, x->first_rank);
		}
	}
}

/* Every local rank is in: serve the round, or tell each rank why not. */
static void round_complete(struct job *j)
{
	struct statex *x = j->sx;
	struct exec_state_req rq;
	int r;

	if (!x->err) {
		rq = (struct exec_state_req){
			.set = x->set,
			.sparse_meta = x->ckpt,
			.staging = x->base,
			.segs = x->segs,
			.seg_first = x->seg_first,
		};
		r = exec_state(j->exec, &rq);
		if (r >= 0) {
			x->queued = true;
			j->progress_ms = now_ms();
			return;
		}
		spoil(x, ZC_ELIMIT, "cannot queue the state %s: %s", x->set ? "import" : "export",
		      zc_strerror(r));
	}
	for (uint32_t k = 0; k < j->world; k++)
		if (x->arrived[k] && j->ranks[k])
			sink_error(j->core->sink, j->ranks[k], x->err, false, SINK_NO_ITERATION, -1,
				   "job %s: %s", j->id, x->errmsg);
	log_info("job %s: state %s refused: %s", j->id, x->set ? "import" : "export", x->errmsg);
	statex_free(j);
}

/* stg NULL: a checkpoint's export without staging for this rank. */
static void request(struct job *j, struct member *s, uint32_t rank, bool set, bool ckpt,
		    const Zerod__V1__StateStaging *stg, Zerod__V1__SegmentState *const *list,
		    size_t n)
{
	const struct core *core = j->core;
	const char *what = set ? "import" : "export";
	struct statex *x;
	char err[256];
	int r;

	if (job_ended(j)) {
		sink_error(core->sink, s, ZC_EJOBFAILED, true, SINK_NO_ITERATION, -1,
			   "job %s failed: %s: %s", j->id, zc_strerror_name(j->err), j->errmsg);
		return;
	}
	if (j->state != JOB_ACTIVE || j->in_flight || (j->sx && j->sx->queued) ||
	    (j->sx && j->sx->arrived[rank]) || j->rp) {
		sink_error(core->sink, s, ZC_ESTATE, false, SINK_NO_ITERATION, -1,
			   "job %s: the optimizer state can be %sed only between iterations, once "
			   "per call of every rank (%s)",
			   j->id, what,
			   j->state != JOB_ACTIVE ? "the job is not running"
			   : j->in_flight         ? "an iteration is in flight"
			   : j->rp                ? "the job is re-planning"
						  : "this rank's request is being served");
		return;
	}
	if (!j->sx && (r = round_new(j, set)) < 0) {
		statex_free(j);
		sink_error(core->sink, s, ZC_ELIMIT, false, SINK_NO_ITERATION, -1, "out of memory");
		return;
	}
	x = j->sx;
	if (x->narrived == 0)
		x->ckpt = ckpt;
	x->arrived[rank] = true;
	x->narrived++;
	if (x->set != set || x->ckpt != ckpt)
		spoil(x, ZC_ESTATE, "rank %u asked to %s the state while others %s it", rank,
		      ckpt ? "export (for a checkpoint)" : what,
		      x->set    ? "import"
		      : x->ckpt ? "export it for a checkpoint"
				: "export");
	if (!x->err && stg) {
		uint64_t want = (uint64_t)exec_state_regions(j->plan) * j->plan->state_numel *
				sizeof(float);
		struct mem_desc md = {
			.shm_name = stg->shm_name, .bytes = stg->bytes, .owner = s->uid};

		r = stg->has_fd_serial
			    ? core->sink->fd_staging(s, stg->fd_serial, &md, err, sizeof(err))
			    : 0;
		/* one kept staging per job: a second rank's (no client sends
		 * one) is mapped for this round only */
		if (r >= 0 && ckpt && stg->has_fd_serial && !x->kept_used) {
			x->base[rank] = kept_map(j, &md, want, &r, err, sizeof(err));
			x->kept_used = x->base[rank] != NULL;
		} else if (r >= 0) {
			r = core->mem->map(&md, want, &x->stg[rank], err, sizeof(err));
			if (r >= 0)
				x->base[rank] = core->mem->ptr(x->stg[rank]);
		}
		if (r < 0 || !x->base[rank])
			spoil(x, r < 0 ? r : ZC_EBUFFER, "rank %u: state staging: %s", rank, err);
	}
	if (stg && stg->has_fd_serial)
		core->sink->fd_release(s); /* mapped, or refused: the mapping keeps the memory */
	if (set && !x->err)
		take_list(j, x, rank, list, n);
	if (x->narrived == j->local_size)
		round_complete(j);
}

void statex_request(struct job *j, struct member *s, uint32_t rank, bool set,
		    const Zerod__V1__StateStaging *stg, Zerod__V1__SegmentState *const *list,
		    size_t n)
{
	request(j, s, rank, set, false, stg, list, n);
}

void statex_ckpt_request(struct job *j, struct member *s, uint32_t rank,
			 const Zerod__V1__StateStaging *stg)
{
	request(j, s, rank, false, true, stg, NULL, 0);
}

bool statex_busy(const struct job *j)
{
	return j->sx && j->sx->queued;
}

/* StateOk.run: FNV-1a of the store prefix of the job's current executor,
 * which the rendezvous draws at random at forming and derives alike on
 * every node at each re-plan. */
static uint64_t run_tag(struct job *j)
{
	const struct coll_net *net = j->rdzv ? rdzv_net(j) : NULL;
	uint64_t h = 0xcbf29ce484222325ull;

	for (const char *p = net && net->prefix ? net->prefix : ""; *p; p++)
		h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
	return h;
}

void statex_done(struct job *j)
{
	struct statex *x = j->sx;
	uint64_t *ranges = NULL;
	size_t nranges = 0;

	if (!x)
		return;
	/* a checkpoint's export over several nodes: its stager learns which
	 * ranges it got (its node's: maybe none), and the node's index */
	bool nodes = x->ckpt && j->local_size != j->world;
	int rr = nodes ? exec_owned_ranges(j->exec, &ranges, &nranges) : 0;
	struct sink_ranges rg = {.ranges = ranges,
				 .n = nranges,
				 .node = j->topo.node,
				 .nnodes = j->topo.nnodes,
				 .run = nodes ? run_tag(j) : 0};
	for (uint32_t k = 0; k < j->world; k++) {
		if (!x->arrived[k] || !j->ranks[k])
			continue;
		if (nodes && x->base[k] && rr < 0)
			sink_error(j->core->sink, j->ranks[k], ZC_ELIMIT, false, SINK_NO_ITERATION,
				   -1, "job %s: the checkpoint's ranges: out of memory", j->id);
		else
			j->core->sink->state_ok(j->ranks[k], nodes && x->base[k] ? &rg : NULL);
	}
	free(ranges);
	log_info("job %s: optimizer state %sed", j->id, x->set ? "import" : "export");
	statex_free(j);
	if (j->rdzv)
		job_iteration_done(j); /* another node may have ended after the round */
}

/* ---------------------------------------------------------- re-planning --- */

/*
 * A re-plan (DDP rebuilt its buckets): between iterations every local rank
 * registers a new plan over the same parameters, with new buffers. Once all
 * did, the executor stops (its state goes with it: the clients exported it
 * first and import it into the new layout after PlanOk, zeroclient.h), the
 * new buffers replace the old ones and the job starts again on the new plan
 * (job_restart: REGISTERING, then ACTIVE and PlanOk, as at the first start).
 * Iterations go on counting, and the hyperparameters in force stay. A job
 * of CUDA buffers does the same with new IPC handles and event rings: the
 * stopping executor closes the old handles and communicators and frees the
 * device state on its lanes, the next one opens the new handles and
 * communicators there and lays out the state for the new plan; the state
 * itself moves through the clients' export and import, which copy between
 * the staging and the devices with optim_ops.state_io on the executor.
 */
struct replan {
	uint32_t n;
	bool stopping;
	struct plan **plans;       /* [world] */
	struct mem_map **grad_map; /* [world] */
	struct mem_map **param_map;
	struct cudabufs **cuda; /* [world]: a job of CUDA buffers, opened by its next executor */
	struct sharedp *sharedp; /* [world]: the new parameter buffers' sharing (sharedp.c) */
};

void statex_replan_free(struct job *j)
{
	struct replan *rp = j->rp;

	if (!rp)
		return;
	for (uint32_t r = 0; r < j->world; r++) {
		if (rp->plans)
			plan_free(rp->plans[r]);
		if (rp->grad_map)
			j->core->mem->unmap(rp->grad_map[r]);
		if (rp->param_map)
			j->core->mem->unmap(rp->param_map[r]);
		if (rp->cuda)
			cudabufs_free(rp->cuda[r]);
	}
	free(rp->plans);
	free(rp->grad_map);
	free(rp->param_map);
	free(rp->cuda);
	free(rp->sharedp);
	free(rp);
	j->rp = NULL;
}

/* statex_replan's checks of rank s's new plan p that refuse it to the rank
 * alone (the job goes on): true when refused, the rank told. */
static bool replan_refused(struct job *j, struct member *s, const struct plan *p,
			   const struct cudabufs *cb)
{
	struct core *core = j->core;
	uint32_t rank = s->rank;
	struct replan *rp = j->rp;
	char err[256];
	int r;

	if (j->in_flight || j->sx || (rp && (rp->stopping || rp->plans[rank]))) {
		sink_error(core->sink, s, ZC_ESTATE, false, SINK_NO_ITERATION, -1,
			   "job %s: rank %u: a new plan is taken only between iterations, once "
			   "per rank (%s)",
			   j->id, rank,
			   j->in_flight ? "an iteration is in flight"
			   : j->sx      ? "a state export or import is in progress"
					: "this rank's new plan is registered already");
		return true;
	}
	if (!cb != !j->cuda) {
		sink_error(core->sink, s, ZC_ENOTSUP, false, SINK_NO_ITERATION, -1,
			   "job %s: rank %u: a new plan with %s buffers, the job runs on %s "
			   "buffers: a re-plan keeps their kind",
			   j->id, rank, cb ? "CUDA" : "host", j->cuda ? "CUDA" : "host");
		return true;
	}
	r = plan_replan_match(j->plan, p, NULL, err, sizeof(err));
	if (r < 0) {
		sink_error(core->sink, s, r, false, SINK_NO_ITERATION, -1,
			   "job %s: rank %u: the new plan %s: %s", j->id, rank,
			   r == ZC_EREPLAN ? "changes the parameters" : "cannot be checked", err);
		return true;
	}
	return false;
}

/* The job's first new plan: where the ranks' new plans and buffers wait
 * (j->rp). 0 or -ENOMEM (j->rp may be half built: statex_replan_free takes it). */
static int replan_new(struct job *j)
{
	struct replan *rp = calloc(1, sizeof(*rp));

	if (!rp)
		return -ENOMEM;
	j->rp = rp;
	rp->plans = calloc(j->world, sizeof(*rp->plans));
	rp->grad_map = calloc(j->world, sizeof(*rp->grad_map));
	rp->param_map = calloc(j->world, sizeof(*rp->param_map));
	rp->cuda = calloc(j->world, sizeof(*rp->cuda));
	rp->sharedp = calloc(j->world, sizeof(*rp->sharedp));
	if (!rp->plans || !rp->grad_map || !rp->param_map || !rp->cuda || !rp->sharedp)
		return -ENOMEM;
	return 0;
}

void statex_replan(struct job *j, struct member *s, struct plan *p, const struct mem_desc *gd,
		   const struct mem_desc *pd, struct cudabufs *cb)
{
	struct core *core = j->core;
	uint32_t rank = s->rank;
	struct replan *rp = j->rp;
	char err[256], field[192];
	uint64_t bytes = plan_buffer_bytes(p);
	int r;

	if (replan_refused(j, s, p, cb)) {
		plan_free(p);
		cudabufs_free(cb);
		return;
	}
	if (!rp && replan_new(j) < 0) {
		plan_free(p);
		cudabufs_free(cb);
		job_fail(j, ZC_ELIMIT, true, "re-plan: out of memory");
		return;
	}
	rp = j->rp;
	for (uint32_t k = 0; k < j->world; k++) {
		if (!rp->plans[k])
			continue;
		if (plan_diff(rp->plans[k], p, field, sizeof(field))) {
			plan_free(p);
			cudabufs_free(cb);
			job_fail(j, ZC_EPLANMISMATCH, true,
				 "new plan of rank %u differs from rank %u's at %s", rank, k,
				 field);
			return;
		}
		break;
	}
	/* the job cannot go on with half its ranks on new buffers: a buffer
	 * that cannot be mapped, or one shared otherwise than the other local
	 * ranks' new ones (sharedp.c), ends it. A shared one is mapped once,
	 * as at the start. CUDA buffers are opened by the next executor, off
	 * the loop (exec/start.c, open_buffers), as at the start. */
	struct sharedp sp = {0};
	r = 0;
	if (cb)
		rp->cuda[rank] = cb;
	else
		r = sharedp_check_in(j, rp->sharedp, rank, pd, &sp, err, sizeof(err));
	if (r >= 0 && !cb)
		r = core->mem->map(gd, bytes, &rp->grad_map[rank], err, sizeof(err));
	if (r >= 0 && !cb && !sharedp_mapped_in(j, rp->sharedp, rp->param_map, &sp))
		r = core->mem->map(pd, bytes, &rp->param_map[rank], err, sizeof(err));
	if (r < 0) {
		plan_free(p);
		job_fail(j, r, true, "rank %u: the new plan's buffers: %s", rank, err);
		return;
	}
	rp->plans[rank] = p;
	if (!cb)
		rp->sharedp[rank] = sp;
	j->progress_ms = now_ms();
	log_info("job %s: rank %u registered new plan %016" PRIx64 " (%u/%u)", j->id, rank, p->hash,
		 rp->n + 1, j->local_size);
	if (++rp->n < j->local_size)
		return;
	rp->stopping = true;
	exec_stop(j->exec); /* EXEC_STOPPED: statex_replan_stopped() */
}

bool statex_replan_stopped(struct job *j)
{
	struct core *core = j->core;
	struct replan *rp = j->rp;
	struct exec_stats es;

	if (!rp || !rp->stopping || job_ended(j) || j->nconnected == 0)
		return false;
	exec_stats(j->exec, &es);
	core->stats.reduced_elems += es.reduced_elems;
	core->stats.stepped_elems += es.stepped_elems;
	exec_free(j->exec);
	j->exec = NULL;
	sharedp_take(j, rp->sharedp); /* shared as the new buffers are */
	for (uint32_t r = 0; r < j->world; r++) {
		if (!rp->plans[r])
			continue;
		core->mem->unmap(j->grad_map[r]);
		core->mem->unmap(j->param_map[r]);
		j->grad_map[r] = rp->grad_map[r];
		j->param_map[r] = rp->param_map[r];
		rp->grad_map[r] = rp->param_map[r] = NULL;
		plan_free(j->plans[r]);
		j->plans[r] = rp->plans[r];
		rp->plans[r] = NULL;
		if (j->cuda) { /* the old executor closed the old handles */
			cudabufs_free(j->cuda[r]);
			j->cuda[r] = rp->cuda[r];
			rp->cuda[r] = NULL;
		}
	}
	statex_replan_free(j);
	log_info("job %s: re-planned", j->id);
	if (j->rdzv)
		rdzv_replanned(j); /* gloo opens again, under fresh keys */
	job_restart(j);
	return true;
}
