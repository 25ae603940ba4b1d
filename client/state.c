/*
 * state.c — zc_get_state() and zc_set_state(): a state round with zerod
 * (GetState / SetState over a staging memfd, docs/STATE.md) between
 * iterations, the tensors' checks, and the masters' narrowing into the
 * parameters.
 *
 * Runs on the caller's thread; one round at a time per client.
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

/* ------------------------------------------------------ optimizer state --- */

/* The caller's zc_segment_state array: read with its first element's size
 * as the stride (zeroclient.h, "ABI"; this struct came in version 1.0, so
 * no caller's is smaller). */
static int segs_check(const void *segs, uint32_t n, const char *fn, size_t *ret_stride)
{
	uint32_t size;
	int r;

	if (n == 0) {
		*ret_stride = sizeof(struct zc_segment_state);
		return 0;
	}
	if (!segs)
		return client_err_set(-EINVAL, "%s: segs is NULL", fn);
	size = abi_size(segs);
	for (uint32_t i = 0; i < n; i++) {
		const char *s = (const char *)segs + (size_t)i * size;
		if (size < sizeof(struct zc_segment_state) || abi_size(s) != size)
			return client_err_set(-EINVAL,
					      "%s: segs[%u].size is %u: not initialised "
					      "(zc_segment_state_init), or not the size of segs[0]",
					      fn, i, abi_size(s));
		if ((r = abi_check(s, size, sizeof(struct zc_segment_state))) < 0)
			return client_err_set(
				r,
				"%s: segs[%u]: a struct of %u bytes this library does not "
				"know",
				fn, i, size);
	}
	*ret_stride = size;
	return 0;
}

/* Between iterations: wait for the step future of the last iteration this
 * rank handed over. */
int state_wait_steps(zc_client *c, const char *fn)
{
	zc_future *f = NULL;
	uint64_t last;
	int r;

	pthread_mutex_lock(&c->mu);
	r = !c->registered || c->plan_result != 1 ? -1 : c->it.sent_in_iter ? -2 : 0;
	last = c->it.iter;
	client_unlock(c);
	if (r == -1)
		return client_err_set(ZC_ESTATE, "%s: the plan is not registered", fn);
	if (r == -2)
		return client_err_set(ZC_ESTATE,
				      "%s: iteration %" PRIu64 " is half handed over: call it "
				      "between iterations",
				      fn, last);
	if (last == 0)
		return 0;
	r = zc_step_future(c, last - 1, &f);
	if (r >= 0) {
		r = zc_future_wait(f, c->cfg.register_timeout_ms);
		if (r == 0)
			r = client_err_set(ZC_ETIMEDOUT,
					   "%s: the step of iteration %" PRIu64
					   " did not complete within %d ms",
					   fn, last - 1, c->cfg.register_timeout_ms);
	}
	zc_future_free(f);
	return r < 0 ? r : 0;
}

static uint64_t state_bytes_of(const struct plan *p)
{
	return (uint64_t)(p->low_precision ? 6 : 5) * p->state_numel * sizeof(float);
}

/* A state round's staging: a memfd of the plan's state size, mapped here and
 * passed to zerod over its fd socket (FDSTAGE) just before the request that
 * names it by *ret_serial. No name, so nothing is left behind. */
static int staging_new(zc_client *c, const struct plan *p, struct host_buf *ret,
		       uint64_t *ret_serial, const char *fn)
{
	char path[sizeof(c->conn.fp_path)], err[256];
	uint64_t bytes = state_bytes_of(p), token;
	int fd, r, timeout;

	pthread_mutex_lock(&c->mu);
	client_fd_socket(c, path, sizeof(path));
	token = c->conn.fp_token;
	timeout = c->cfg.connect_timeout_ms;
	pthread_mutex_unlock(&c->mu);
	if (!path[0])
		return client_err_set(ZC_ENOTSUP,
				      "%s: zerod offered no fd socket to pass the staging on", fn);
	r = bufs_staging(bytes, &fd);
	if (r < 0)
		return client_err_set(r, "%s: a staging memfd of %" PRIu64 " bytes: %s", fn, bytes,
				      zc_strerror(r));
	r = client_map_buf(fd, 0, bytes, ret);
	if (r < 0) {
		close(fd);
		return client_err_set(r, "%s: mapping the staging: %s", fn, zc_strerror(r));
	}
	r = bufs_send_staging(path, token, fd, bytes, timeout, ret_serial, err, sizeof(err));
	close(fd); /* the mappings, ours and zerod's, keep the memory */
	if (r < 0) {
		client_buf_release(ret);
		return client_err_set(r, "%s: %s", fn, err);
	}
	return 0;
}

/* Send a state round's request env: 0, or the error recorded; state_wait()
 * then waits for the round to be served. */
int state_send(zc_client *c, Zerod__V1__Envelope *env, const char *fn)
{
	uint64_t id = 0;
	int r;

	pthread_mutex_lock(&c->mu);
	if (c->round.pending) {
		client_unlock(c);
		return client_err_set(ZC_ESTATE, "%s: another state call of this client is waiting",
				      fn);
	}
	if (c->job_error) {
		r = c->job_error;
		client_err_set(r, "%s", c->job_msg);
		client_unlock(c);
		return r;
	}
	r = client_send_env(c, env, &id);
	if (r >= 0) {
		c->round.pending = true;
		c->round.request = id;
		c->round.result = 0;
		c->round.msg[0] = 0;
	}
	client_unlock(c);
	if (r < 0)
		return client_err_set(r, "%s: sending the request: %s", fn, zc_strerror(r));
	return 0;
}

int state_wait(zc_client *c, const char *fn)
{
	int r = client_wait_for(c, &c->round.result, c->round.msg,
				now_ms() + c->cfg.register_timeout_ms);

	pthread_mutex_lock(&c->mu);
	c->round.pending = false;
	client_unlock(c);
	if (r == 0)
		return client_err_set(ZC_ETIMEDOUT,
				      "%s: not every rank of this node called within %d ms", fn,
				      c->cfg.register_timeout_ms);
	return r < 0 ? r : 0;
}

/* Send the request (GetState when ss is NULL) naming stg (zerod's serial),
 * and wait for the round to be served. */
static int state_round(zc_client *c, Zerod__V1__SetState *ss, const struct host_buf *stg,
		       uint64_t serial, const char *fn)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__GetState gs = ZEROD__V1__GET_STATE__INIT;
	Zerod__V1__StateStaging sg = ZEROD__V1__STATE_STAGING__INIT;
	int r;

	sg.shm_name = (char *)"";
	sg.bytes = stg->bytes;
	sg.has_fd_serial = true;
	sg.fd_serial = serial;
	if (ss) {
		ss->staging = &sg;
		env.body_case = ZEROD__V1__ENVELOPE__BODY_SET_STATE;
		env.set_state = ss;
	} else {
		gs.staging = &sg;
		env.body_case = ZEROD__V1__ENVELOPE__BODY_GET_STATE;
		env.get_state = &gs;
	}
	if ((r = state_send(c, &env, fn)) < 0)
		return r;
	return state_wait(c, fn);
}

int seg_where(const struct plan *p, const struct zc_segment_state *s, uint64_t *ret_at,
	      uint64_t *ret_numel, const char *fn, uint32_t i)
{
	if (s->bucket >= p->nbuckets)
		return client_err_set(ZC_EBUCKET,
				      "%s: segs[%u].bucket: %u, the plan has %u buckets", fn, i,
				      s->bucket, p->nbuckets);
	if (s->segment >= p->buckets[s->bucket].nsegments)
		return client_err_set(ZC_EBUCKET,
				      "%s: segs[%u].segment: %u, bucket %u has %u segments", fn, i,
				      s->segment, s->bucket, p->buckets[s->bucket].nsegments);
	/* the state's layout (plan.h): each element an fp32 slot */
	*ret_at = p->buckets[s->bucket].sbase + p->buckets[s->bucket].segments[s->segment].offset;
	*ret_numel = p->buckets[s->bucket].segments[s->segment].numel;
	return 0;
}

/* The tensors of one segment state, in staging region order (2..5). */
static float *seg_tensor(const struct zc_segment_state *s, enum zc_optimizer opt, unsigned k)
{
	if (k == 2)
		return opt == ZC_OPT_SGD ? s->momentum_buffer : s->exp_avg;
	return k == 3 ? s->exp_avg_sq : k == 4 ? s->max_exp_avg_sq : s->master;
}

uint32_t client_tensor_bit(enum zc_optimizer opt, unsigned k)
{
	if (k == 2)
		return opt == ZC_OPT_SGD ? ZC_STATE_MOMENTUM_BUFFER : ZC_STATE_EXP_AVG;
	return k == 3 ? ZC_STATE_EXP_AVG_SQ : k == 4 ? ZC_STATE_MAX_EXP_AVG_SQ : ZC_STATE_MASTER;
}

/* The staging regions a plan's segment state may use: 2..4, and 5 (the
 * master) in a bf16/fp16 bucket. */
unsigned client_last_region(const struct plan *p, uint32_t bucket)
{
	return p->buckets[bucket].dtype == ZC_DTYPE_F32 ? 4 : STG_MASTER;
}

static const char *tensor_name(uint32_t bit)
{
	switch (bit) {
	case ZC_STATE_MOMENTUM_BUFFER:
		return "momentum_buffer";
	case ZC_STATE_EXP_AVG:
		return "exp_avg";
	case ZC_STATE_EXP_AVG_SQ:
		return "exp_avg_sq";
	case ZC_STATE_MAX_EXP_AVG_SQ:
		return "max_exp_avg_sq";
	case ZC_STATE_MASTER:
		return "master";
	}
	return "?";
}

/* The keys present in a segment of bucket b whose step word (staging
 * region 1, docs/STATE.md) is w, and its step. */
uint32_t client_meta_present(const struct plan *p, uint32_t b, uint32_t w, double *ret_step)
{
	uint32_t present = 0;

	*ret_step = 0;
	if (p->optimizer == ZC_OPT_SGD) {
		if (w & (1u << 31))
			present = ZC_STATE_MOMENTUM_BUFFER;
	} else if (w & PLAN_STATE_MAX_STEP) {
		present = ZC_STATE_STEP | ZC_STATE_EXP_AVG | ZC_STATE_EXP_AVG_SQ;
		if (w & (1u << 30))
			present |= ZC_STATE_MAX_EXP_AVG_SQ;
		*ret_step = (double)(w & PLAN_STATE_MAX_STEP);
	}
	if (p->buckets[b].dtype != ZC_DTYPE_F32)
		present |= ZC_STATE_MASTER; /* it always has one */
	return present;
}

/* Export into the plan p's staging, then read segs out of it. Called for the
 * registered plan, which stays until zc_close() or a re-plan (neither runs
 * beside a state call: zc_close() must not race, a re-plan is this thread's). */
int client_get_state(zc_client *c, const struct plan *p, struct zc_segment_state *segs,
		     size_t stride, uint32_t n, const char *fn)
{
	struct host_buf stg = {0};
	uint64_t total = p->state_numel, serial = 0;
	int r;

	for (uint32_t i = 0; i < n; i++) {
		struct zc_segment_state *s = (void *)((char *)segs + (size_t)i * stride);
		uint64_t at, numel;
		if ((r = seg_where(p, s, &at, &numel, fn, i)) < 0)
			return r;
	}
	r = staging_new(c, p, &stg, &serial, fn);
	if (r < 0)
		return r;
	r = state_round(c, NULL, &stg, serial, fn);
	for (uint32_t i = 0; i < n && r >= 0; i++) {
		struct zc_segment_state *s = (void *)((char *)segs + (size_t)i * stride);
		uint64_t at, numel;
		uint32_t w, present;
		double step;

		(void)seg_where(p, s, &at, &numel, fn, i);
		memcpy(&w, stg.base + STG_META * total + at, sizeof(w));
		present = client_meta_present(p, s->bucket, w, &step);
		for (unsigned k = 2; k <= client_last_region(p, s->bucket); k++) {
			float *dst = seg_tensor(s, p->optimizer, k);
			if (dst && (present & client_tensor_bit(p->optimizer, k)))
				memcpy(dst, stg.base + k * total + at, numel * sizeof(float));
		}
		s->present = present;
		s->step = step;
	}
	client_buf_release(&stg);
	return r;
}

int zc_get_state(zc_client *c, struct zc_segment_state *segs, uint32_t n)
{
	size_t stride;
	int r;

	if ((r = client_check(c, __func__)) < 0)
		return r;
	if ((r = segs_check(segs, n, __func__, &stride)) < 0)
		return r;
	if ((r = state_wait_steps(c, __func__)) < 0)
		return r;
	if (c->replan.old_plan)
		return client_err_set(
			ZC_ESTATE, "%s: a new plan is allocated but not registered yet", __func__);
	return client_get_state(c, c->plan, segs, stride, n, __func__);
}

/* Every value finite, the second moments not negative. */
static int tensor_check(const float *t, uint64_t numel, uint32_t bit, const char *fn, uint32_t i,
			const struct zc_segment_state *s)
{
	for (uint64_t x = 0; x < numel; x++)
		if (!isfinite(t[x]) ||
		    (t[x] < 0 && (bit == ZC_STATE_EXP_AVG_SQ || bit == ZC_STATE_MAX_EXP_AVG_SQ)))
			return client_err_set(
				ZC_ESTATEINVAL,
				"%s: segs[%u]: buckets[%u].segments[%u].%s[%" PRIu64 "]: %g (%s)",
				fn, i, s->bucket, s->segment, tensor_name(bit), x, t[x],
				isfinite(t[x]) ? "a second moment is never negative"
					       : "not finite");
	return 0;
}

/* A master given to zc_set_state() sets this rank's parameters of its
 * segment to it, rounded to the bucket's dtype (as apex's fp16 optimizer
 * loads its masters into the model): every rank passing the same master
 * then holds the same parameters, and the daemon's step finds them equal to
 * the narrowed master (zc_params_changed()'s check). */
static void narrow_masters(zc_client *c, const struct plan *p, const void *segs, size_t stride,
			   uint32_t n)
{
	if (c->dev)
		return; /* CUDA buffers: the daemon stored them (exec/xfer.c's xfer_import) */
	for (uint32_t i = 0; i < n; i++) {
		const struct zc_segment_state *s = (const void *)((const char *)segs + i * stride);
		const struct plan_bucket *bk = &p->buckets[s->bucket];
		const struct zc_segment *sg = &bk->segments[s->segment];
		uint16_t *dst =
			(uint16_t *)((char *)c->param.base + plan_bucket_offset(p, s->bucket)) +
			sg->offset;

		if (!(s->present & ZC_STATE_MASTER))
			continue;
		for (uint64_t x = 0; x < sg->numel; x++)
			dst[x] = bk->dtype == ZC_DTYPE_BF16 ? lowp_f32_to_bf16(s->master[x])
							    : lowp_f32_to_f16(s->master[x]);
	}
}

/* check_values: the caller's tensors (not the daemon's own, moved by a
 * re-plan: they go back as they came, whatever they hold, and the
 * parameters, copied already, are left as they are). */
int client_set_state(zc_client *c, const struct plan *p, const struct zc_segment_state *segs,
		     size_t stride, uint32_t n, bool check_values, const char *fn)
{
	Zerod__V1__SetState ss = ZEROD__V1__SET_STATE__INIT;
	Zerod__V1__SegmentState *items = NULL, **ptrs = NULL;
	struct host_buf stg = {0};
	uint64_t total = p->state_numel, serial = 0;
	uint8_t *seen = NULL;
	uint64_t nsegs = 0, *first = calloc(p->nbuckets, sizeof(*first));
	char err[256];
	int r = 0;

	for (uint32_t b = 0; b < p->nbuckets && first; b++) {
		first[b] = nsegs;
		nsegs += p->buckets[b].nsegments;
	}
	seen = calloc(nsegs ? nsegs : 1, 1);
	items = calloc(n ? n : 1, sizeof(*items));
	ptrs = calloc(n ? n : 1, sizeof(*ptrs));
	if (!first || !seen || !items || !ptrs) {
		r = client_err_set(-ENOMEM, NULL);
		goto out;
	}
	/* everything is checked before anything is sent */
	for (uint32_t i = 0; i < n; i++) {
		const struct zc_segment_state *s = (const void *)((const char *)segs + i * stride);
		uint64_t at, numel, flat;

		if ((r = seg_where(p, s, &at, &numel, fn, i)) < 0) {
			snprintf(err, sizeof(err), "%s", zc_error_message());
			r = client_err_set(ZC_ESTATEINVAL, "%s", err);
			goto out;
		}
		if (plan_state_check(p, s->bucket, s->segment, s->present, s->step, err,
				     sizeof(err)) < 0) {
			r = client_err_set(ZC_ESTATEINVAL, "%s: segs[%u]: %s", fn, i, err);
			goto out;
		}
		flat = first[s->bucket] + s->segment;
		if (seen[flat]++) {
			r = client_err_set(ZC_ESTATEINVAL,
					   "%s: segs[%u]: buckets[%u].segments[%u] given twice", fn,
					   i, s->bucket, s->segment);
			goto out;
		}
		for (unsigned k = 2; k <= client_last_region(p, s->bucket); k++) {
			uint32_t bit = client_tensor_bit(p->optimizer, k);
			const float *t = seg_tensor(s, p->optimizer, k);
			if (!(s->present & bit))
				continue;
			if (!t) {
				r = client_err_set(
					ZC_ESTATEINVAL,
					"%s: segs[%u]: buckets[%u].segments[%u].%s: present but "
					"NULL",
					fn, i, s->bucket, s->segment, tensor_name(bit));
				goto out;
			}
			if (check_values && (r = tensor_check(t, numel, bit, fn, i, s)) < 0)
				goto out;
		}
		zerod__v1__segment_state__init(&items[i]);
		items[i].bucket = s->bucket;
		items[i].segment = s->segment;
		items[i].present = s->present;
		items[i].step = s->present & ZC_STATE_STEP ? s->step : 0;
		ptrs[i] = &items[i];
	}
	r = staging_new(c, p, &stg, &serial, fn);
	if (r < 0)
		goto out;
	for (uint32_t i = 0; i < n; i++) {
		const struct zc_segment_state *s = (const void *)((const char *)segs + i * stride);
		uint64_t at, numel;

		(void)seg_where(p, s, &at, &numel, fn, i);
		for (unsigned k = 2; k <= client_last_region(p, s->bucket); k++)
			if (s->present & client_tensor_bit(p->optimizer, k))
				memcpy(stg.base + k * total + at, seg_tensor(s, p->optimizer, k),
				       numel * sizeof(float));
	}
	ss.segments = ptrs;
	ss.n_segments = n;
	r = state_round(c, &ss, &stg, serial, fn);
	if (r >= 0 && check_values)
		narrow_masters(c, p, segs, stride, n);
out:
	client_buf_release(&stg);
	free(first);
	free(seen);
	free(items);
	free(ptrs);
	return r;
}

int zc_set_state(zc_client *c, const struct zc_segment_state *segs, uint32_t n)
{
	size_t stride;
	int r;

	if ((r = client_check(c, __func__)) < 0)
		return r;
	if ((r = segs_check(segs, n, __func__, &stride)) < 0)
		return r;
	if ((r = state_wait_steps(c, __func__)) < 0)
		return r;
	if (c->replan.old_plan)
		return client_err_set(
			ZC_ESTATE, "%s: a new plan is allocated but not registered yet", __func__);
	return client_set_state(c, c->plan, segs, stride, n, true, __func__);
}
