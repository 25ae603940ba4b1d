/*
 * ckview.c — what ckpt.c sees of a client and asks of it (internal.h): the
 * view of a registered plan, the export of the state into a checkpoint's
 * staging (on one node or several), Resume, the checkpoint outcome's report
 * to zerod, and zeroctl's checkpoint request (zc_checkpoint_due).
 *
 * Runs on the caller's thread, under the client's mutex where it reads
 * the client.
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

/* --------------------------------------- checkpoints (client/ckpt.c) --- */

int client_ckpt_view(zc_client *c, const char *fn, struct ckpt_view *ret)
{
	int r;

	if ((r = client_check(c, fn)) < 0)
		return r;
	pthread_mutex_lock(&c->mu);
	if (c->plan_result != 1 || !c->plan) {
		r = client_err_set(ZC_ESTATE, "%s: the plan is not registered", fn);
	} else if (c->replan.old_plan) {
		r = client_err_set(ZC_ESTATE, "%s: a new plan is allocated but not registered yet",
				   fn);
	} else if (c->it.sent_in_iter) {
		r = client_err_set(ZC_ESTATE,
				   "%s: iteration %" PRIu64
				   " is under way (%u buckets handed over): "
				   "call it between iterations",
				   fn, c->it.iter, c->it.sent_in_iter);
	} else {
		*ret = (struct ckpt_view){.plan = c->plan,
					  .job_id = c->job_id,
					  .rank = c->cfg.rank,
					  .world = c->cfg.world_size,
					  .nnodes = c->cfg.nnodes ? c->cfg.nnodes : 1,
					  .one_node = c->cfg.local_size == c->cfg.world_size,
					  .local_rank = c->cfg.local_rank,
					  .iteration = c->it.iter,
					  .timeout_ms = c->cfg.register_timeout_ms,
					  .writer = &c->ckpt.writer};
	}
	client_unlock(c);
	return r;
}

static int own_ranges(zc_client *c, const struct ckpt_stage *stg, struct ckpt_owned *o,
		      const char *fn);

/* StateOk's ranges lie each within one bucket of p's state layout. */
static bool ranges_ok(const struct plan *p, const uint64_t *rg, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		uint32_t b = 0;
		while (b < p->nbuckets && rg[2 * i] >= p->buckets[b].sbase + p->buckets[b].numel)
			b++;
		if (b == p->nbuckets || rg[2 * i] < p->buckets[b].sbase || rg[2 * i + 1] == 0 ||
		    rg[2 * i + 1] > p->buckets[b].sbase + p->buckets[b].numel - rg[2 * i])
			return false;
	}
	return true;
}

/* The parameter at slot of the registered plan's state layout (fp32
 * buckets: the layout is the buffers'). */
static float *params_at(zc_client *c, uint64_t slot)
{
	const struct plan *p = c->plan;
	uint32_t b = 0;

	while (b + 1 < p->nbuckets && slot >= p->buckets[b + 1].sbase)
		b++;
	return zc_param_buffer(c, b) + (slot - p->buckets[b].sbase);
}

int client_ckpt_export(zc_client *c, const struct ckpt_stage *stg, struct zc_segment_state *ss,
		       uint32_t n, struct ckpt_owned *ret_own, const char *fn)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__CheckpointState cs = ZEROD__V1__CHECKPOINT_STATE__INIT;
	Zerod__V1__StateStaging sg = ZEROD__V1__STATE_STAGING__INIT;
	const struct plan *p = c->plan; /* registered: client_ckpt_view() said so */
	char path[sizeof(c->conn.fp_path)], err[256];
	uint64_t token, serial = 0;
	int r, timeout;

	if ((r = state_wait_steps(c, fn)) < 0)
		return r;
	if (stg) {
		pthread_mutex_lock(&c->mu);
		client_fd_socket(c, path, sizeof(path));
		token = c->conn.fp_token;
		timeout = c->cfg.connect_timeout_ms;
		pthread_mutex_unlock(&c->mu);
		if (!path[0])
			return client_err_set(
				ZC_ENOTSUP, "%s: zerod offered no fd socket to pass the staging on",
				fn);
		r = bufs_send_staging(path, token, stg->fd, stg->bytes, timeout, &serial, err,
				      sizeof(err));
		if (r < 0)
			return client_err_set(r, "%s: %s", fn, err);
		sg.shm_name = (char *)"";
		sg.bytes = stg->bytes;
		sg.has_fd_serial = true;
		sg.fd_serial = serial;
		cs.staging = &sg;
	}
	env.body_case = ZEROD__V1__ENVELOPE__BODY_CHECKPOINT_STATE;
	env.checkpoint_state = &cs;
	if ((r = state_send(c, &env, fn)) < 0)
		return r;
	/* the parameters, while zerod copies the state: the step is done, and
	 * nothing writes them until the next iteration's broadcast. Over
	 * several nodes only those of the ranges the last export named (the
	 * same plan: the same ranges), all the first time. */
	bool part = ret_own && c->ckpt.prev && c->ckpt.prev_hash == p->hash;
	if (stg && !c->dev && part)
		for (size_t i = 0; i < c->ckpt.nprev; i++)
			memcpy(stg->base + c->ckpt.prev[2 * i], params_at(c, c->ckpt.prev[2 * i]),
			       c->ckpt.prev[2 * i + 1] * 4);
	else if (stg && !c->dev)
		for (uint32_t b = 0; b < p->nbuckets; b++)
			memcpy(stg->base + p->buckets[b].sbase, zc_param_buffer(c, b),
			       p->buckets[b].numel * sizeof(float));
	if ((r = state_wait(c, fn)) < 0 || !stg)
		return r;
	if (ret_own) {
		pthread_mutex_lock(&c->mu);
		if (!ranges_ok(p, c->ckpt.ranges, c->ckpt.nranges)) {
			pthread_mutex_unlock(&c->mu);
			return own_ranges(c, stg, ret_own, fn); /* it says why */
		}
		bool same = part && c->ckpt.nprev == c->ckpt.nranges &&
			    memcmp(c->ckpt.prev, c->ckpt.ranges,
				   c->ckpt.nranges * 2 * sizeof(uint64_t)) == 0;
		if (!same && c->ckpt.ranges)
			for (size_t i = 0; i < c->ckpt.nranges && part; i++)
				memcpy(stg->base + c->ckpt.ranges[2 * i],
				       params_at(c, c->ckpt.ranges[2 * i]),
				       c->ckpt.ranges[2 * i + 1] * 4);
		free(c->ckpt.prev);
		c->ckpt.prev = NULL;
		c->ckpt.nprev = 0;
		if (c->ckpt.ranges &&
		    (c->ckpt.prev = malloc((c->ckpt.nranges * 2 + 1) * sizeof(uint64_t)))) {
			memcpy(c->ckpt.prev, c->ckpt.ranges,
			       c->ckpt.nranges * 2 * sizeof(uint64_t));
			c->ckpt.nprev = c->ckpt.nranges;
			c->ckpt.prev_hash = p->hash;
		}
		pthread_mutex_unlock(&c->mu);
		return own_ranges(c, stg, ret_own, fn);
	}
	for (uint32_t i = 0; i < n; i++) {
		struct zc_segment_state *s = &ss[i];
		uint64_t at, numel;
		uint32_t w;

		if ((r = seg_where(p, s, &at, &numel, fn, i)) < 0)
			return r;
		memcpy(&w, stg->base + STG_META * p->state_numel + at, sizeof(w));
		s->present = client_meta_present(p, s->bucket, w, &s->step);
		for (unsigned k = 2; k <= client_last_region(p, s->bucket); k++) {
			float **slot = k == 2   ? (p->optimizer == ZC_OPT_SGD ? &s->momentum_buffer
									      : &s->exp_avg)
				       : k == 3 ? &s->exp_avg_sq
				       : k == 4 ? &s->max_exp_avg_sq
						: &s->master;
			*slot = (s->present & client_tensor_bit(p->optimizer, k))
					? stg->base + k * p->state_numel + at
					: NULL;
		}
	}
	return 0;
}

void ckpt_owned_free(struct ckpt_owned *o)
{
	free(o->slot);
	free(o->n);
	free(o->bucket);
	free(o->present);
	free(o->step);
	*o = (struct ckpt_owned){0};
}

/* StateOk's ranges of a checkpoint's export over several nodes, with each
 * range's keys and step read from its step word in stg. */
static int own_ranges(zc_client *c, const struct ckpt_stage *stg, struct ckpt_owned *o,
		      const char *fn)
{
	const struct plan *p = c->plan;
	size_t n;
	uint32_t b = 0;

	pthread_mutex_lock(&c->mu);
	n = c->ckpt.nranges;
	*o = (struct ckpt_owned){
		.count = n, .node = c->ckpt.node, .nnodes = c->ckpt.nnodes, .run = c->ckpt.run};
	o->slot = malloc((n + 1) * sizeof(*o->slot));
	o->n = malloc((n + 1) * sizeof(*o->n));
	o->bucket = malloc((n + 1) * sizeof(*o->bucket));
	o->present = malloc((n + 1) * sizeof(*o->present));
	o->step = malloc((n + 1) * sizeof(*o->step));
	if (o->slot && o->n && o->bucket && o->present && o->step)
		for (size_t i = 0; i < n; i++) {
			o->slot[i] = c->ckpt.ranges[2 * i];
			o->n[i] = c->ckpt.ranges[2 * i + 1];
		}
	free(c->ckpt.ranges);
	c->ckpt.ranges = NULL;
	c->ckpt.nranges = 0;
	pthread_mutex_unlock(&c->mu);
	if (!o->slot || !o->n || !o->bucket || !o->present || !o->step) {
		ckpt_owned_free(o);
		return client_err_set(-ENOMEM, "%s: out of memory", fn);
	}
	if (o->nnodes < 2 || o->node >= o->nnodes || o->nnodes > 4096) {
		ckpt_owned_free(o);
		return client_err_set(ZC_EPROTO, "%s: zerod named no ranges of this node", fn);
	}
	for (size_t i = 0; i < n; i++) {
		uint32_t w;
		while (b < p->nbuckets && o->slot[i] >= p->buckets[b].sbase + p->buckets[b].numel)
			b++;
		if (b == p->nbuckets || o->slot[i] < p->buckets[b].sbase || o->n[i] == 0 ||
		    o->n[i] > p->buckets[b].sbase + p->buckets[b].numel - o->slot[i]) {
			ckpt_owned_free(o);
			return client_err_set(ZC_EPROTO, "%s: zerod named a range out of the plan",
					      fn);
		}
		memcpy(&w, stg->base + STG_META * p->state_numel + o->slot[i], sizeof(w));
		o->bucket[i] = b;
		o->present[i] = client_meta_present(p, b, w, &o->step[i]);
	}
	return 0;
}

int client_ckpt_writer(zc_client *c, const char *fn, struct ckpt_writer ***ret)
{
	int r = client_check(c, fn);

	*ret = r < 0 ? NULL : &c->ckpt.writer;
	return r;
}

int client_resume(zc_client *c, uint64_t iteration, const char *fn)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__Resume rs = ZEROD__V1__RESUME__INIT;
	int r = 0;

	pthread_mutex_lock(&c->mu);
	if (c->it.sent_in_iter || c->it.steps_done < c->it.iter) {
		r = client_err_set(ZC_ESTATE, "%s: iteration %" PRIu64 " is under way", fn,
				   c->it.iter);
		goto out;
	}
	if (iteration == c->it.iter)
		goto out;
	rs.from = c->it.iter;
	rs.iteration = iteration;
	env.body_case = ZEROD__V1__ENVELOPE__BODY_RESUME;
	env.resume = &rs;
	r = client_send_env(c, &env, NULL);
	if (r < 0) {
		client_err_set(r, "%s: sending: %s", fn, zc_strerror(r));
		goto out;
	}
	c->it.iter = iteration;
	c->it.steps_done = iteration;
out:
	client_unlock(c);
	return r;
}

/* CheckpointDone from rep (c->mu held). */
static void send_report_locked(zc_client *c, const struct ckpt_report *rep)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__CheckpointDone cd = ZEROD__V1__CHECKPOINT_DONE__INIT;

	if (!c->conn.sock || c->hello_result != 1)
		return;
	cd.iteration = rep->iteration;
	cd.dir = (char *)rep->dir;
	cd.ok = rep->ok;
	cd.path = rep->ok && rep->path[0] ? (char *)rep->path : NULL;
	cd.error = rep->ok ? NULL : (char *)rep->error;
	env.body_case = ZEROD__V1__ENVELOPE__BODY_CHECKPOINT_DONE;
	env.checkpoint_done = &cd;
	(void)client_send_env(c, &env, NULL);
}

void client_ckpt_report_locked(zc_client *c)
{
	struct ckpt_report *rep;

	if (!ckpt_report_ready(c->ckpt.writer) || !(rep = malloc(sizeof(*rep))))
		return;
	if (ckpt_report_take(c->ckpt.writer, rep))
		send_report_locked(c, rep);
	free(rep);
}

void client_ckpt_report(zc_client *c)
{
	pthread_mutex_lock(&c->mu);
	client_ckpt_report_locked(c);
	pthread_mutex_unlock(&c->mu);
}

void client_ckpt_report_now(zc_client *c, const struct ckpt_report *rep)
{
	pthread_mutex_lock(&c->mu);
	send_report_locked(c, rep);
	pthread_mutex_unlock(&c->mu);
}

int zc_checkpoint_due(zc_client *c, char *dir, size_t len)
{
	int r;

	if ((r = client_check(c, __func__)) < 0)
		return r;
	if (!dir || len == 0)
		return client_err_set(-EINVAL, "zc_checkpoint_due: no room for the directory");
	pthread_mutex_lock(&c->mu);
	client_ckpt_report_locked(c); /* a checkpoint's write that ended */
	if (!c->it.sent_in_iter)
		client_dispatch_locked(c, LOOK_ALL); /* what came before the last step */
	r = 0;
	if (c->ckpt.due_dir && c->ckpt.due_iter < c->it.iter) {
		free(c->ckpt.due_dir); /* a boundary this rank passed without asking */
		c->ckpt.due_dir = NULL;
	}
	if (c->ckpt.due_dir && !c->it.sent_in_iter && c->it.steps_done >= c->it.iter &&
	    c->ckpt.due_iter == c->it.iter) {
		if (strlen(c->ckpt.due_dir) >= len) {
			r = client_err_set(-ERANGE,
					   "zc_checkpoint_due: the directory needs %zu bytes",
					   strlen(c->ckpt.due_dir) + 1);
		} else {
			strcpy(dir, c->ckpt.due_dir);
			free(c->ckpt.due_dir);
			c->ckpt.due_dir = NULL;
			r = 1;
		}
	}
	client_unlock(c);
	return r;
}

void client_keep_share_fd(zc_client *c, int fd)
{
	pthread_mutex_lock(&c->mu);
	if (c->share_fd >= 0)
		close(c->share_fd);
	c->share_fd = fd;
	pthread_mutex_unlock(&c->mu);
}

bool client_registered_host(zc_client *c)
{
	if (!c || client_forked(c->forks))
		return false; /* the caller's next call says why */
	pthread_mutex_lock(&c->mu);
	bool r = c->plan && c->registered && !c->dev;
	pthread_mutex_unlock(&c->mu);
	return r;
}

int client_replan_shared(zc_client *c, const struct zc_plan *zp, int param_fd, bool copy)
{
	struct replan_share sh = {.param_fd = param_fd, .copy = copy};
	int r;

	if ((r = client_check(c, "zc_alloc_buffers_shared")) < 0)
		return r;
	return replan_alloc(c, zp, &sh);
}
