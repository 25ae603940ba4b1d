/*
 * replan.c — re-planning a registered client: the new plan's buffers (host,
 * shared or CUDA) beside the registered ones, undoing a re-plan zerod
 * refused, and the registration that carries the state from the old
 * layout into the new one.
 *
 * Runs on the caller's thread.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <zmq.h>

#include "abi.h"
#include "bufs.h"
#include "devbufs.h"
#include "common.h"
#include "fastpath.h"
#include "internal.h"
/* zeroclient.h's rounding of bf16/fp16, the daemon's own (header only):
 * zc_set_state() rounds a given master into the parameters */
#include "lowp.h"
#include "plan.h"
#include "wire.h"
#include "zeroclient.h"
#include "client.h"

/* ---------------------------------------------------------- re-planning --- */

static uint32_t ckpt_plan_nsegs(const struct plan *p)
{
	uint32_t n = 0;

	for (uint32_t b = 0; b < p->nbuckets; b++)
		n += p->buckets[b].nsegments;
	return n;
}

/* Each segment's place in plan order: its bucket and index. */
static int seg_index(const struct plan *p, uint32_t **ret_bucket, uint32_t **ret_seg)
{
	uint32_t n = ckpt_plan_nsegs(p), k = 0;
	uint32_t *bk = calloc(n ? n : 1, sizeof(*bk)), *sg = calloc(n ? n : 1, sizeof(*sg));

	if (!bk || !sg) {
		free(bk);
		free(sg);
		return -ENOMEM;
	}
	for (uint32_t b = 0; b < p->nbuckets; b++)
		for (uint32_t s = 0; s < p->buckets[b].nsegments; s++, k++)
			bk[k] = b, sg[k] = s;
	*ret_bucket = bk;
	*ret_seg = sg;
	return 0;
}

/* zc_alloc_buffers() after the plan was registered: the new plan's buffers,
 * each segment's parameters copied from where the registered plan had them.
 * The last step must have landed first (the daemon writes the parameters
 * until then). */
int replan_alloc(zc_client *c, const struct zc_plan *zp, const struct replan_share *sh)
{
	const char *fn = "zc_alloc_buffers";
	struct host_buf grad = {0}, param = {0};
	uint32_t *map = NULL, *nb = NULL, *ns = NULL, *ob = NULL, *os = NULL;
	struct plan *p = NULL;
	uint64_t poff = 0;
	char err[256];
	int fd = -1, pfd = -1, r;

	if ((r = state_wait_steps(c, fn)) < 0)
		return r;
	r = plan_from_zc(zp, &p, err, sizeof(err));
	if (r < 0)
		return client_err_set(r, "%s: %s", fn, err);
	pthread_mutex_lock(&c->mu);
	if (c->replan.old_plan) {
		r = client_err_set(ZC_ESTATE,
				   "%s: a new plan is allocated already: register it first", fn);
		goto out;
	}
	map = calloc(ckpt_plan_nsegs(p) ? ckpt_plan_nsegs(p) : 1, sizeof(*map));
	if (!map || seg_index(p, &nb, &ns) < 0 || seg_index(c->plan, &ob, &os) < 0) {
		r = client_err_set(-ENOMEM, NULL);
		goto out;
	}
	r = plan_replan_match(c->plan, p, map, err, sizeof(err));
	if (r < 0) {
		client_err_set(r, "%s: the new plan %s: %s", fn,
			       r == ZC_EREPLAN ? "changes the parameters" : "cannot be checked",
			       err);
		goto out;
	}
	/* shared: the gradients in a memfd of our own (its parameter half is
	 * never touched, so it takes no pages), the parameters in the job's */
	r = bufs_memfd(plan_buffer_bytes(p), &poff, &fd);
	if (r < 0 || (r = client_map_buf(fd, 0, plan_buffer_bytes(p), &grad)) < 0 ||
	    (r = client_map_buf(sh ? sh->param_fd : fd, sh ? 0 : poff, plan_buffer_bytes(p),
				&param)) < 0) {
		client_err_set(r, "%s: a memfd of 2 x %" PRIu64 " bytes: %s", fn,
			       plan_buffer_bytes(p), zc_strerror(r));
		goto out;
	}
	if (sh && (pfd = fcntl(sh->param_fd, F_DUPFD_CLOEXEC, 0)) < 0) {
		r = client_err_set(-errno, "%s: dup of the shared parameter memfd: %s", fn,
				   strerror(errno));
		goto out;
	}
	/* each segment's parameters, by its bucket's layout (a segment keeps its
	 * dtype: plan_replan_match); a shared buffer's by its creator only */
	for (uint32_t k = 0; k < ckpt_plan_nsegs(p) && (!sh || sh->copy); k++) {
		const struct plan_bucket *nbk = &p->buckets[nb[k]],
					 *obk = &c->plan->buckets[ob[map[k]]];
		const struct zc_segment *n = &nbk->segments[ns[k]], *o = &obk->segments[os[map[k]]];
		unsigned es = plan_dtype_size(nbk->dtype);
		memcpy((char *)param.base + (nbk->base + n->offset) * es,
		       (const char *)c->param.base + (obk->base + o->offset) * es, n->numel * es);
	}
	c->replan.old_plan = c->plan;
	c->replan.old_grad = c->grad;
	c->replan.old_param = c->param;
	c->plan = p;
	c->grad = grad;
	c->param = param;
	c->replan.map = map;
	c->replan.fd = fd; /* passed to zerod by zc_register_plan() */
	c->replan.poff = poff;
	c->replan.pfd = pfd;
	fd = pfd = -1;
	p = NULL;
	map = NULL;
	memset(&grad, 0, sizeof(grad));
	memset(&param, 0, sizeof(param));
out:
	client_unlock(c);
	if (fd >= 0)
		close(fd);
	if (pfd >= 0)
		close(pfd);
	client_buf_release(&grad);
	client_buf_release(&param);
	plan_free(p);
	free(map);
	free(nb);
	free(ns);
	free(ob);
	free(os);
	return r < 0 ? r : 0;
}

/* zc_register_buffers(ZC_BUFFERS_CUDA) after the plan was registered: the
 * new plan's CUDA buffers (new handles and event rings), which the caller
 * filled with every segment's parameters (the library does not copy device
 * memory); the registered ones stay until zc_register_plan() took the new. */
int replan_cuda(zc_client *c, const struct zc_plan *zp, const struct zc_buffers *b)
{
	const char *fn = "zc_register_buffers";
	uint32_t *map = NULL;
	struct devbufs *dev = NULL;
	struct plan *p = NULL;
	char err[384];
	int r;

	if ((r = state_wait_steps(c, fn)) < 0)
		return r;
	r = plan_from_zc(zp, &p, err, sizeof(err));
	if (r < 0)
		return client_err_set(r, "%s: %s", fn, err);
	pthread_mutex_lock(&c->mu);
	if (c->replan.old_plan || c->bufs_busy) {
		r = client_err_set(ZC_ESTATE,
				   "%s: a new plan is allocated already: register it first", fn);
		goto out;
	}
	map = calloc(ckpt_plan_nsegs(p) ? ckpt_plan_nsegs(p) : 1, sizeof(*map));
	if (!map) {
		r = client_err_set(-ENOMEM, NULL);
		goto out;
	}
	r = plan_replan_match(c->plan, p, map, err, sizeof(err));
	if (r < 0) {
		client_err_set(r, "%s: the new plan %s: %s", fn,
			       r == ZC_EREPLAN ? "changes the parameters" : "cannot be checked",
			       err);
		goto out;
	}
	r = client_cuda_bufs_open(c, p, b, &dev, fn);
	if (r < 0)
		goto out;
	c->replan.old_plan = c->plan;
	c->replan.old_dev = c->dev;
	c->plan = p;
	c->dev = dev;
	c->replan.map = map;
	p = NULL;
	map = NULL;
out:
	client_unlock(c);
	plan_free(p);
	free(map);
	return r < 0 ? r : 0;
}

/* A re-plan the job did not take: back to the registered plan and its
 * buffers. Called with c->mu held. */
static void replan_undo(zc_client *c)
{
	client_buf_release(&c->grad);
	client_buf_release(&c->param);
	plan_free(c->plan);
	c->plan = c->replan.old_plan;
	c->grad = c->replan.old_grad;
	c->param = c->replan.old_param;
	c->replan.old_plan = NULL;
	if (c->replan.old_dev) {
		devbufs_free(c->dev);
		c->dev = c->replan.old_dev;
		c->replan.old_dev = NULL;
	}
	memset(&c->replan.old_grad, 0, sizeof(c->replan.old_grad));
	memset(&c->replan.old_param, 0, sizeof(c->replan.old_param));
	free(c->replan.map);
	c->replan.map = NULL;
	if (c->replan.fd >= 0)
		close(c->replan.fd);
	c->replan.fd = -1;
	if (c->replan.pfd >= 0)
		close(c->replan.pfd);
	c->replan.pfd = -1;
	c->plan_result = 1;
}

/* A re-plan's copy of the state: os[nold] under the registered plan (into
 * arena, in the state's layout, plan.h: moments, then masters), ns[nnew]
 * the same pieces under the new one; each plan's segments by bucket and
 * index (seg_index). */
struct replan_copy {
	uint32_t nold, nnew;
	struct zc_segment_state *os, *ns;
	uint32_t *ob, *osg, *nb, *nsg;
	float *arena;
};

static void replan_copy_free(struct replan_copy *cp)
{
	free(cp->os);
	free(cp->ns);
	free(cp->ob);
	free(cp->osg);
	free(cp->nb);
	free(cp->nsg);
	free(cp->arena);
}

/* replan_register()'s first step: the state under the registered plan
 * (c->replan.old_plan) into cp: 0, or the error recorded. */
static int replan_export(zc_client *c, struct replan_copy *cp, const char *fn)
{
	const struct plan *old = c->replan.old_plan, *p = c->plan;
	uint32_t nold = ckpt_plan_nsegs(old), nnew = ckpt_plan_nsegs(p);

	cp->nold = nold;
	cp->nnew = nnew;
	cp->os = calloc(nold ? nold : 1, sizeof(*cp->os));
	cp->ns = calloc(nnew ? nnew : 1, sizeof(*cp->ns));
	/* in the state's layout (plan.h): moments, then masters */
	cp->arena = calloc(4 * old->state_numel + 1, sizeof(float));
	if (!cp->os || !cp->ns || !cp->arena || seg_index(old, &cp->ob, &cp->osg) < 0 ||
	    seg_index(p, &cp->nb, &cp->nsg) < 0)
		return client_err_set(-ENOMEM, "%s: the state's copy: out of memory", fn);
	for (uint32_t k = 0; k < nold; k++) {
		const struct plan_bucket *ob = &old->buckets[cp->ob[k]];
		uint64_t at = ob->sbase + ob->segments[cp->osg[k]].offset;
		uint64_t n = old->state_numel;
		struct zc_segment_state *os = &cp->os[k];

		*os = (struct zc_segment_state)ZC_SEGMENT_STATE_INIT;
		os->bucket = cp->ob[k];
		os->segment = cp->osg[k];
		os->exp_avg = os->momentum_buffer = cp->arena + at;
		os->exp_avg_sq = cp->arena + n + at;
		os->max_exp_avg_sq = cp->arena + 2 * n + at;
		if (ob->dtype != ZC_DTYPE_F32)
			os->master = cp->arena + 3 * n + at; /* moves with its segment */
	}
	return client_get_state(c, old, cp->os, sizeof(*cp->os), nold, fn);
}

/* The new buffers to zerod: CUDA buffers' handles into *cuda (arrays to
 * free in *cuda_arrays), a memfd's over the fd socket (its serial in
 * *serial). 0, or the error recorded and the re-plan undone (*ret_undone). */
static int replan_pass(zc_client *c, Zerod__V1__CudaBuffers *cuda, void **cuda_arrays,
		       uint64_t *serial, bool *ret_undone, const char *fn)
{
	const struct plan *p = c->plan;
	char path[sizeof(c->conn.fp_path)], err[256];
	int r;

	pthread_mutex_lock(&c->mu);
	client_fd_socket(c, path, sizeof(path));
	pthread_mutex_unlock(&c->mu);
	if (c->dev) /* CUDA buffers: their handles go with the plan */
		r = devbufs_to_pb(c->dev, cuda, cuda_arrays);
	else if (path[0] && c->replan.pfd >= 0) /* shared: two memfds */
		r = bufs_send(path, c->conn.fp_token, (const int[]){c->replan.fd, c->replan.pfd}, 2,
			      plan_buffer_bytes(p), 0, 0, c->cfg.connect_timeout_ms, serial, err,
			      sizeof(err));
	else
		r = path[0] ? bufs_send(path, c->conn.fp_token, &c->replan.fd, 1,
					plan_buffer_bytes(p), 0, c->replan.poff,
					c->cfg.connect_timeout_ms, serial, err, sizeof(err))
			    : ZC_ENOTSUP;
	if (r >= 0)
		return 0;
	if (c->dev)
		client_err_set(r, "%s: the new CUDA buffers: %s", fn, zc_strerror(r));
	else
		client_err_set(r, "%s: the new buffers: %s", fn,
			       path[0] ? err : "zerod offered no fd socket to pass them on");
	pthread_mutex_lock(&c->mu);
	replan_undo(c);
	*ret_undone = true;
	client_unlock(c);
	return r;
}

/* Register the new plan (its buffers: cuda, else the memfds of serial) and
 * wait for every rank's: 0, or the error recorded; a refusal the job
 * survives undoes the re-plan (*ret_undone). */
static int replan_send(zc_client *c, Zerod__V1__CudaBuffers *cuda, uint64_t serial,
		       bool *ret_undone, const char *fn)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__RegisterPlan rp = ZEROD__V1__REGISTER_PLAN__INIT;
	Zerod__V1__FdBuffers fds = ZEROD__V1__FD_BUFFERS__INIT;
	Zerod__V1__Plan pb;
	int r;

	r = plan_to_pb(c->plan, &pb);
	if (r < 0)
		return client_err_set(r, NULL);
	fds.serial = serial;
	fds.has_shared_params = fds.shared_params = c->replan.pfd >= 0;
	rp.plan = &pb;
	if (c->dev)
		rp.cuda = cuda;
	else
		rp.fds = &fds;
	env.body_case = ZEROD__V1__ENVELOPE__BODY_REGISTER_PLAN;
	env.register_plan = &rp;
	pthread_mutex_lock(&c->mu);
	c->plan_result = 0;
	r = client_send_env(c, &env, NULL);
	client_unlock(c);
	plan_pb_free(&pb);
	if (r < 0)
		return client_err_set(r, "%s: sending the new plan: %s", fn, zc_strerror(r));
	r = client_wait_for(c, &c->plan_result, NULL, now_ms() + c->cfg.register_timeout_ms);
	if (r == 0)
		return client_err_set(ZC_ETIMEDOUT,
				      "%s: not every rank registered the new plan within %d ms", fn,
				      c->cfg.register_timeout_ms);
	if (r < 0) {
		pthread_mutex_lock(&c->mu);
		client_err_set(r, "%s", c->answer_msg);
		if (!c->job_error) {
			/* refused, the job goes on with the registered plan: so
			 * does this client */
			replan_undo(c);
			*ret_undone = true;
		}
		client_unlock(c);
		return r;
	}
	return 0;
}

/* The job runs on the new plan from here: let the old buffers go (the old
 * plan is the caller's to free). */
static void replan_commit(zc_client *c)
{
	pthread_mutex_lock(&c->mu);
	client_buf_release(&c->replan.old_grad);
	client_buf_release(&c->replan.old_param);
	devbufs_free(c->replan.old_dev); /* zerod closed its handles of them */
	c->replan.old_dev = NULL;
	c->replan.old_plan = NULL;
	if (c->replan.fd >= 0)
		close(c->replan.fd); /* zerod and our mappings keep the memory */
	c->replan.fd = -1;
	c->bufs_shared = c->replan.pfd >= 0;
	if (c->replan.pfd >= 0)
		close(c->replan.pfd);
	c->replan.pfd = -1;
	client_unlock(c);
}

/*
 * zc_register_plan() of a re-plan: export the state under the registered
 * plan, pass the new buffers (their memfd, over <socket>.fd as at the first
 * registration: zerod takes them from a registered session), register the
 * new one (the daemon starts the job again on it), import the state into
 * the new layout, and let the old buffers go. The export costs the state's
 * size in this process for the while.
 */
int replan_register(zc_client *c)
{
	const char *fn = "zc_register_plan";
	Zerod__V1__CudaBuffers cuda;
	void *cuda_arrays = NULL;
	const struct plan *old = c->replan.old_plan;
	struct replan_copy cp = {0};
	uint64_t serial = 0;
	bool undone = false;
	int r;

	r = replan_export(c, &cp, fn);
	if (r >= 0)
		r = replan_pass(c, &cuda, &cuda_arrays, &serial, &undone, fn);
	if (r >= 0)
		r = replan_send(c, &cuda, serial, &undone, fn);
	if (undone)
		old = NULL; /* the registered plan again */
	if (r < 0)
		goto out;
	replan_commit(c);
	for (uint32_t k = 0; k < cp.nnew; k++) {
		cp.ns[k] = cp.os[c->replan.map[k]];
		cp.ns[k].bucket = cp.nb[k];
		cp.ns[k].segment = cp.nsg[k];
	}
	r = client_set_state(c, c->plan, cp.ns, sizeof(*cp.ns), cp.nnew, false, fn);
	plan_free((struct plan *)old);
	old = NULL;
	free(c->replan.map);
	c->replan.map = NULL;
out:
	if (old && !c->replan.old_plan)
		plan_free((struct plan *)old);
	replan_copy_free(&cp);
	free(cuda_arrays);
	return r < 0 ? r : 0;
}
