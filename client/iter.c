/*
 * iter.c — the iteration and its futures: handing buckets over (BucketReady,
 * their checks and masks, the CUDA variants), the step's futures and info,
 * the hyper-parameters and gradient scale the iteration runs with, and
 * polling, waiting on and freeing a future.
 *
 * Runs on the caller's thread, under the client's mutex; a wait sleeps
 * without it (client.c's wait_for).
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

/* --------------------------------------------------------- iteration --- */

static struct zc_future *future_new(zc_client *c, enum future_kind kind, uint64_t it,
				    uint32_t bucket)
{
	struct zc_future *f = calloc(1, sizeof(*f));

	if (!f)
		return NULL;
	f->forks = c->forks;
	f->kind = kind;
	f->iteration = it;
	f->bucket = bucket;
	future_link(c, f);
	if (c->job_error)
		future_settle(f, c->job_error, c->job_msg);
	return f;
}

/* The daemon's ordering rules, checked before sending: a bucket it would
 * refuse is refused here, so the client's iteration never drifts from the
 * daemon's. A StepDone in transit is read first. Called with c->mu held. */
static int bucket_check(zc_client *c, uint32_t bucket)
{
	if (c->replan.old_plan)
		return client_err_set(ZC_ESTATE, "a new plan is allocated but not registered yet "
						 "(zc_register_plan)");
	if (bucket >= c->plan->nbuckets)
		return client_err_set(ZC_EBUCKET,
				      "bucket %u does not exist: the plan has %u buckets", bucket,
				      c->plan->nbuckets);
	if (bucket < c->it.sent_in_iter)
		return client_err_set(ZC_EDUPBUCKET, "bucket %u twice in iteration %" PRIu64,
				      bucket, c->it.iter);
	if (bucket > c->it.sent_in_iter)
		return client_err_set(
			ZC_EORDER,
			"bucket %u handed over, but bucket %u comes first (buckets go 0, "
			"1, 2, ... every iteration)",
			bucket, c->it.sent_in_iter);
	if (bucket == 0 && c->it.steps_done < c->it.iter) {
		client_take_ring(c, c->conn.zrecv);
		if (c->it.steps_done < c->it.iter)
			client_dispatch_locked(c, LOOK_ALL);
		if (c->job_error)
			return client_err_set(c->job_error, "%s", c->job_msg);
		if (c->it.steps_done < c->it.iter)
			return client_err_set(
				ZC_EEARLY,
				"bucket 0 of iteration %" PRIu64 " while iteration %" PRIu64
				" is still in flight: wait for its step before the next "
				"backward",
				c->it.iter, c->it.iter - 1);
	}
	return 0;
}

/* A segment mask that zc_bucket_ready_ex() may send: nwords 0, or exactly the
 * bucket's words with no bit past its segments. Called with c->mu held. */
static int mask_check(zc_client *c, uint32_t bucket, const uint64_t *unused, uint32_t nwords)
{
	uint32_t nseg, want;

	if (nwords == 0)
		return 0;
	nseg = c->plan->buckets[bucket].nsegments;
	want = (nseg + 63) / 64;
	if (!unused)
		return client_err_set(ZC_ESEGMASK,
				      "zc_bucket_ready_ex: unused is NULL with nwords %u", nwords);
	if (nwords != want)
		return client_err_set(
			ZC_ESEGMASK,
			"zc_bucket_ready_ex: bucket %u has %u segments: the mask takes %u "
			"words, got %u",
			bucket, nseg, want, nwords);
	if (nseg % 64 && unused[want - 1] >> (nseg % 64))
		return client_err_set(
			ZC_ESEGMASK,
			"zc_bucket_ready_ex: bucket %u has %u segments, but bits at or past "
			"%u are set (word %u: 0x%016" PRIx64 ")",
			bucket, nseg, nseg, want - 1, unused[want - 1]);
	return 0;
}

/* zc_bucket_ready(_ex): a mask with a bit set goes over ZeroMQ (see
 * zeroclient.h); the ring's 16-byte slot has no room for it, and ring.h's
 * MARKs keep the two channels in one order. */
static int bucket_ready(zc_client *c, uint32_t bucket, const uint64_t *unused, uint32_t nwords,
			zc_future **ret_future)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__BucketReady br = ZEROD__V1__BUCKET_READY__INIT;
	struct zc_future *f = NULL;
	bool masked = false;
	int r;

	pthread_mutex_lock(&c->mu);
	if (ckpt_report_ready(c->ckpt.writer))
		client_ckpt_report_locked(c); /* a checkpoint's write ended */
	if (c->job_error) {
		r = client_err_set(c->job_error, "%s", c->job_msg);
		goto out;
	}
	if (c->plan_result != 1) {
		r = client_err_set(ZC_ESTATE, "zc_bucket_ready: the plan is not registered");
		goto out;
	}
	r = bucket_check(c, bucket);
	if (r >= 0)
		r = mask_check(c, bucket, unused, nwords);
	if (r < 0)
		goto out;
	for (uint32_t w = 0; w < nwords; w++)
		masked = masked || unused[w];
	if (ret_future) {
		f = future_new(c, FUTURE_BUCKET, c->it.iter, bucket);
		if (!f) {
			r = client_err_set(-ENOMEM, NULL);
			goto out;
		}
	}
	if (c->conn.fp && !c->conn.fp_closed && !masked) {
		r = fpc_push_ready(c->conn.fp, c->conn.zsent, c->it.iter, bucket);
		if (r == -EAGAIN)
			client_err_set(
				r, "the fast-path ring is full: zerod has not taken the buckets "
				   "handed over");
		else if (r < 0)
			client_err_set(r, "the fast-path ring is corrupt");
	} else {
		br.iteration = c->it.iter;
		br.bucket = bucket;
		if (masked) {
			br.n_unused = nwords;
			br.unused = (uint64_t *)unused;
		}
		env.body_case = ZEROD__V1__ENVELOPE__BODY_BUCKET_READY;
		env.bucket_ready = &br;
		r = client_send_env(c, &env, f ? &f->request : NULL);
		if (r < 0)
			client_err_set(r, "zc_bucket_ready: sending: %s", zc_strerror(r));
	}
	if (r < 0) {
		if (f) {
			future_unlink(f);
			free(f);
		}
		goto out;
	}
	c->it.sent_in_iter++;
	if (bucket == c->plan->nbuckets - 1) {
		c->it.iter++;
		c->it.sent_in_iter = 0;
	}
	if (ret_future)
		*ret_future = f;
out:
	client_unlock(c);
	return r;
}

int zc_bucket_ready(zc_client *c, uint32_t bucket, zc_future **ret_future)
{
	int r;

	if ((r = client_check(c, __func__)) < 0)
		return r;
	return bucket_ready(c, bucket, NULL, 0, ret_future);
}

int zc_bucket_ready_cuda(zc_client *c, uint32_t bucket, void *stream, zc_future **ret_future)
{
	char err[384];
	uint64_t t;
	int r;

	if ((r = client_check(c, __func__)) < 0)
		return r;
	pthread_mutex_lock(&c->mu);
	if (!c->dev || !c->registered) {
		r = client_err_set(
			ZC_ESTATE, "zc_bucket_ready_cuda: %s",
			!c->dev ? "not CUDA buffers (zc_register_buffers, ZC_BUFFERS_CUDA)"
				: "the plan is not registered (zc_register_plan)");
		client_unlock(c);
		return r;
	}
	if (bucket >= c->plan->nbuckets) {
		r = client_err_set(ZC_EBUCKET, "bucket %u does not exist: the plan has %u buckets",
				   bucket, c->plan->nbuckets);
		client_unlock(c);
		return r;
	}
	t = c->it.iter;
	client_unlock(c);
	/* recorded before the bucket is sent: zerod's wait must find it */
	r = devbufs_record_ready(c->dev, bucket, t, stream, err, sizeof(err));
	if (r < 0)
		return client_err_set(r, "zc_bucket_ready_cuda: bucket %u: %s", bucket, err);
	return bucket_ready(c, bucket, NULL, 0, ret_future);
}

int zc_step_wait_cuda(zc_future *f, void *stream)
{
	zc_client *c;
	char err[384];
	int r;

	if ((r = future_check(f, __func__)) < 0)
		return r;
	c = f->c;
	if (!c)
		return client_err_set(ZC_ESTATE, "zc_step_wait_cuda: the client is closed");
	pthread_mutex_lock(&c->mu);
	if (f->kind != FUTURE_STEP)
		r = client_err_set(ZC_ESTATE, "zc_step_wait_cuda: not a step future");
	else if (f->state < 0)
		r = client_err_set(f->state, "%s", f->msg);
	else if (f->state == 0)
		r = client_err_set(ZC_ESTATE,
				   "zc_step_wait_cuda: iteration %" PRIu64 " has not completed",
				   f->iteration);
	else if (!c->dev)
		r = client_err_set(ZC_ESTATE, "zc_step_wait_cuda: not CUDA buffers");
	else if (c->it.iter >= f->iteration + ZC_CUDA_EVENT_RING)
		r = client_err_set(ZC_ESTATE,
				   "zc_step_wait_cuda: iteration %" PRIu64
				   "'s events were reused by "
				   "iteration %" PRIu64 " (a ring of %d)",
				   f->iteration, c->it.iter, ZC_CUDA_EVENT_RING);
	if (r >= 0 && (r = devbufs_wait_done(c->dev, f->iteration, stream, err, sizeof(err))) < 0)
		client_err_set(r, "zc_step_wait_cuda: %s", err);
	client_unlock(c);
	return r;
}

int zc_bucket_ready_ex(zc_client *c, const struct zc_ready *rd, zc_future **ret_future)
{
	static const struct zc_ready defaults = ZC_READY_INIT;
	struct zc_ready in = defaults;
	uint32_t size;
	char why[256];
	int r;

	if ((r = client_check(c, __func__)) < 0)
		return r;
	if (!rd)
		return client_err_set(-EINVAL, "zc_bucket_ready_ex: r is NULL");
	size = abi_size(rd);
	r = abi_check(rd, size, sizeof(in));
	if (r < 0) {
		abi_reason(r, size, "ready", "ready", why, sizeof(why));
		return client_err_set(r, "zc_bucket_ready_ex: %s", why);
	}
	ABI_TAKE(&in, rd, size, bucket);
	ABI_TAKE(&in, rd, size, nwords);
	ABI_TAKE(&in, rd, size, reserved);
	ABI_TAKE(&in, rd, size, unused);
	if (in.reserved)
		return client_err_set(-EINVAL, "zc_bucket_ready_ex: reserved is %u, must be 0",
				      in.reserved);
	return bucket_ready(c, in.bucket, in.unused, in.nwords, ret_future);
}

int zc_set_grad_scale(zc_client *c, double inv_scale)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__SetGradScale gs = ZEROD__V1__SET_GRAD_SCALE__INIT;
	int r;

	if ((r = client_check(c, __func__)) < 0)
		return r;
	if (!isfinite(inv_scale) || inv_scale <= 0)
		return client_err_set(
			-EINVAL, "zc_set_grad_scale: inv_scale must be finite and > 0 (got %g)",
			inv_scale);
	pthread_mutex_lock(&c->mu);
	if (c->plan_result != 1) {
		r = client_err_set(ZC_ESTATE, "zc_set_grad_scale: the plan is not registered");
		goto out;
	}
	if (c->plan->step_mode != ZC_STEP_AT_END) {
		r = client_err_set(ZC_ESTATE,
				   "zc_set_grad_scale: needs step_mode at_end (every bucket "
				   "reduced before any step)");
		goto out;
	}
	gs.iteration = c->it.iter;
	gs.inv_scale = inv_scale;
	env.body_case = ZEROD__V1__ENVELOPE__BODY_SET_GRAD_SCALE;
	env.set_grad_scale = &gs;
	r = client_send_env(c, &env, NULL);
	if (r < 0)
		client_err_set(r, "zc_set_grad_scale: sending: %s", zc_strerror(r));
out:
	client_unlock(c);
	return r;
}

int zc_step_info(zc_future *f, struct zc_step_info *out)
{
	struct zc_step_info info = ZC_STEP_INFO_INIT;
	uint32_t size;
	int r;

	if ((r = future_check(f, __func__)) < 0)
		return r;
	if (!out)
		return client_err_set(-EINVAL, "zc_step_info: out is NULL");
	size = abi_size(out);
	if (size < offsetof(struct zc_step_info, iteration) || size > ZC_STRUCT_MAX_SIZE)
		return client_err_set(-EINVAL, "zc_step_info: out->size %u out of range", size);
	if (f->c)
		pthread_mutex_lock(&f->c->mu);
	if (f->kind != FUTURE_STEP)
		r = client_err_set(ZC_ESTATE, "zc_step_info: not a step future");
	else if (f->state < 0)
		r = client_err_set(f->state, "%s", f->msg);
	else if (f->state == 0)
		r = client_err_set(ZC_ESTATE,
				   "zc_step_info: iteration %" PRIu64 " has not completed",
				   f->iteration);
	info.found_inf = f->found_inf;
	info.iteration = f->iteration;
	info.grad_norm = f->grad_norm;
	if (f->c)
		client_unlock(f->c);
	if (r < 0)
		return r;
	/* the caller's bytes past what we know are zeroed, as the init does */
	memset((char *)out + sizeof(uint32_t), 0, size - sizeof(uint32_t));
	memcpy((char *)out + sizeof(uint32_t), (char *)&info + sizeof(uint32_t),
	       MIN((size_t)size, sizeof(info)) - sizeof(uint32_t));
	return 0;
}

int zc_step_future(zc_client *c, uint64_t iteration, zc_future **ret_future)
{
	struct zc_future *f;
	int r;

	if ((r = client_check(c, __func__)) < 0)
		return r;
	if (!ret_future)
		return client_err_set(-EINVAL, "zc_step_future: ret_future is NULL");
	pthread_mutex_lock(&c->mu);
	if (iteration > c->it.iter) {
		/* it could only wait for buckets nobody has handed over yet */
		r = client_err_set(ZC_ESTATE,
				   "iteration %" PRIu64
				   " has not begun: this rank's next bucket belongs "
				   "to iteration %" PRIu64,
				   iteration, c->it.iter);
		client_unlock(c);
		return r;
	}
	/* a StepDone that came is read: with a ring, it came there (ZeroMQ is
	 * read by the poll or the wait, where its system calls are due) */
	if (c->conn.fp)
		client_take_ring(c, c->conn.zrecv);
	else
		client_dispatch_locked(c, LOOK_ALL);
	f = future_new(c, FUTURE_STEP, iteration, 0);
	if (f && iteration < c->it.steps_done) {
		/* a step that landed is done, though the job ended after it (the
		 * daemon tells the others at once when a rank leaves) */
		f->state = 1;
		f->msg[0] = 0;
		client_step_info_of(c, iteration, f);
	}
	client_unlock(c);
	if (!f)
		return client_err_set(-ENOMEM, NULL);
	*ret_future = f;
	return 0;
}

uint64_t zc_iteration(zc_client *c)
{
	uint64_t it;

	if (client_check(c, __func__) < 0)
		return ZC_NO_ITERATION;
	pthread_mutex_lock(&c->mu);
	it = c->it.iter;
	client_unlock(c);
	return it;
}

int zc_recovered(zc_client *c, uint64_t *iteration)
{
	int r = client_check(c, __func__);

	if (iteration)
		*iteration = 0;
	if (r < 0)
		return r;
	pthread_mutex_lock(&c->mu);
	if (c->plan_result != 1)
		r = client_err_set(ZC_ESTATE, "zc_recovered: the plan is not registered");
	else if (c->recovered) {
		r = 1;
		if (iteration)
			*iteration = c->recovered_iter;
	}
	client_unlock(c);
	return r;
}

int zc_set_hyper(zc_client *c, uint32_t group, const struct zc_param_group *hp)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__SetHyper sh = ZEROD__V1__SET_HYPER__INIT;
	Zerod__V1__ParamGroup pg;
	struct zc_param_group g;
	char err[192];
	int r;

	if ((r = client_check(c, __func__)) < 0)
		return r;
	if (!hp)
		return client_err_set(-EINVAL, "zc_set_hyper: hp is NULL");
	r = plan_group_from_zc(hp, "hp", &g, err, sizeof(err));
	if (r < 0)
		return client_err_set(r, "zc_set_hyper: %s", err);
	pthread_mutex_lock(&c->mu);
	if (c->plan_result != 1) {
		r = client_err_set(ZC_ESTATE, "zc_set_hyper: the plan is not registered");
		goto out;
	}
	if (group >= c->plan->ngroups) {
		r = client_err_set(ZC_EHYPER,
				   "zc_set_hyper: group %u does not exist: the plan has %u", group,
				   c->plan->ngroups);
		goto out;
	}
	if (plan_group_check(c->plan->optimizer, &g, err, sizeof(err)) < 0 ||
	    plan_clip_check(c->plan, &g, err, sizeof(err)) < 0) {
		r = client_err_set(ZC_EHYPER, "zc_set_hyper: group %u: %s", group, err);
		goto out;
	}
	/* the daemon sized the optimizer state from the plan's groups */
	if (plan_state_arrays(c->plan->optimizer, &g, 1) &
	    ~plan_state_arrays(c->plan->optimizer, c->plan->groups, c->plan->ngroups)) {
		r = client_err_set(
			ZC_EHYPER,
			"zc_set_hyper: group %u: %s needs optimizer state this job does not "
			"keep: declare it in the plan's groups",
			group, c->plan->optimizer == ZC_OPT_SGD ? "momentum" : "amsgrad");
		goto out;
	}
	plan_group_to_pb(&g, &pg);
	/* the next iteration this rank has not started */
	sh.iteration = c->it.sent_in_iter ? c->it.iter + 1 : c->it.iter;
	sh.group = group;
	sh.values = &pg;
	env.body_case = ZEROD__V1__ENVELOPE__BODY_SET_HYPER;
	env.set_hyper = &sh;
	r = client_send_env(c, &env, NULL);
	if (r < 0)
		client_err_set(r, "zc_set_hyper: sending: %s", zc_strerror(r));
out:
	client_unlock(c);
	return r;
}

int zc_params_changed(zc_client *c)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__ParamsChanged pc = ZEROD__V1__PARAMS_CHANGED__INIT;
	int r;

	if ((r = client_check(c, __func__)) < 0)
		return r;
	pthread_mutex_lock(&c->mu);
	if (c->plan_result != 1) {
		r = client_err_set(ZC_ESTATE, "zc_params_changed: the plan is not registered");
		goto out;
	}
	if (c->it.sent_in_iter) {
		r = client_err_set(ZC_ESTATE,
				   "zc_params_changed: iteration %" PRIu64
				   " is under way (%u buckets "
				   "handed over): call it between iterations",
				   c->it.iter, c->it.sent_in_iter);
		goto out;
	}
	if (c->it.steps_done < c->it.iter) {
		client_take_ring(c, c->conn.zrecv);
		if (c->it.steps_done < c->it.iter)
			client_dispatch_locked(c, LOOK_ALL);
		if (c->job_error) {
			r = client_err_set(c->job_error, "%s", c->job_msg);
			goto out;
		}
		if (c->it.steps_done < c->it.iter) {
			r = client_err_set(ZC_ESTATE,
					   "zc_params_changed: the step of iteration %" PRIu64
					   " has not completed: wait for it first",
					   c->it.iter - 1);
			goto out;
		}
	}
	pc.iteration = c->it.iter;
	env.body_case = ZEROD__V1__ENVELOPE__BODY_PARAMS_CHANGED;
	env.params_changed = &pc;
	r = client_send_env(c, &env, NULL);
	if (r < 0)
		client_err_set(r, "zc_params_changed: sending: %s", zc_strerror(r));
out:
	client_unlock(c);
	return r;
}

int zc_last_error(zc_client *c)
{
	int r;

	if ((r = client_check(c, __func__)) < 0)
		return r;
	pthread_mutex_lock(&c->mu);
	if (c->job_error) {
		r = client_err_set(c->job_error, "%s", c->job_msg);
	} else if (c->async_error) {
		r = client_err_set(c->async_error, "%s", c->async_msg);
		c->async_error = 0; /* told: the next one is newer */
	}
	client_unlock(c);
	return r;
}

/* ----------------------------------------------------------- futures --- */

/* A future's result as a call returns it: a failure's reason for the thread. */
static int future_result(zc_future *f, int st)
{
	return st < 0 ? client_err_set(st, "%s", f->msg[0] ? f->msg : zc_strerror(st)) : st;
}

int zc_future_poll(zc_future *f)
{
	zc_client *c;
	int st;

	if ((st = future_check(f, __func__)) < 0)
		return st;
	c = f->c;
	if (!c)
		return future_result(f, f->state);
	pthread_mutex_lock(&c->mu);
	client_take_ring(c, c->conn.zrecv);
	if (f->state == 0)
		client_dispatch_locked(c, LOOK_ALL);
	/* the reason now: f's callback, run by the unlock, may free f */
	st = future_result(f, f->state);
	client_unlock(c);
	return st;
}

int zc_future_wait(zc_future *f, int timeout_ms)
{
	zc_client *c;
	bool free_it;
	int r;

	if ((r = future_check(f, __func__)) < 0)
		return r;
	c = f->c;
	if (!c)
		return future_result(f, f->state);
	/* f stays while it is waited on, though a callback the wait runs frees it */
	pthread_mutex_lock(&c->mu);
	f->waiters++;
	pthread_mutex_unlock(&c->mu);
	r = client_wait_for(c, &f->state, f->msg, timeout_ms < 0 ? -1 : now_ms() + timeout_ms);
	pthread_mutex_lock(&c->mu);
	f->waiters--;
	free_it = f->free_after && !f->waiters && f->cb_state != CB_RUNNING;
	pthread_mutex_unlock(&c->mu);
	if (free_it)
		free(f);
	return r;
}

int zc_future_then(zc_future *f, zc_future_cb *fn, void *arg)
{
	zc_client *c;
	int r;

	if ((r = future_check(f, __func__)) < 0)
		return r;
	if (!fn)
		return client_err_set(-EINVAL, "zc_future_then: fn is NULL");
	c = f->c;
	if (c)
		pthread_mutex_lock(&c->mu);
	if (f->cb_state != CB_NONE) {
		if (c)
			client_unlock(c);
		return client_err_set(ZC_ESTATE,
				      "zc_future_then: the future has a callback already");
	}
	f->cb = fn;
	f->cb_arg = arg;
	f->cb_state = CB_SET;
	if (c) {
		if (f->state != 0)
			cb_enqueue(c, f);
		client_unlock(c); /* runs it now if it is due */
		return 0;
	}
	/* its client is closed, so it is settled: run it here */
	f->cb_state = CB_RUNNING;
	fn(f, f->state, arg);
	f->cb_state = CB_DONE;
	if (f->free_after)
		free(f);
	return 0;
}

const char *zc_future_message(zc_future *f)
{
	return f ? f->msg : "";
}

void zc_future_free(zc_future *f)
{
	zc_client *c;
	bool running;

	/* a child's copy of a parent's future: nothing of it is the child's */
	if (!f || client_forked(f->forks))
		return;
	/* the client whose lock guards it: its own, or (once closed) the one
	 * running its callback in zc_close() */
	c = f->c ? f->c : f->q;
	if (c)
		pthread_mutex_lock(&c->mu);
	if (f->cb_state == CB_QUEUED)
		cb_dequeue(f->q, f); /* cancelled */
	future_unlink(f);
	f->c = NULL;
	running = f->cb_state == CB_RUNNING || f->waiters;
	if (running)
		f->free_after = true; /* its callback's runner or its last waiter frees it */
	if (c)
		pthread_mutex_unlock(&c->mu);
	if (!running)
		free(f);
}
