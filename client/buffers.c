/*
 * buffers.c — the plan's buffers as the client holds them: allocating them
 * (memfds, zc_alloc_buffers), taking the caller's (zc_register_buffers: host
 * memfds or CUDA buffers), the pointers into them by bucket, and
 * zc_register_plan(), which attaches the fast path and registers the plan.
 * The memfd exchange itself is bufs.c's, CUDA's devbufs.c's, the shared
 * parameters' share.c's; a re-plan's buffers are replan.c's.
 *
 * Runs on the caller's thread, under the client's mutex except while
 * zerod answers.
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

/* ----------------------------------------------------------- buffers --- */

/* Where zerod's fd socket is for us: beside the socket we reached, where it
 * is mounted for us (a container may see zerod's directory elsewhere), else
 * where zerod says. The token and the peer check keep a wrong socket
 * harmless. "" if zerod offered none. Called with c->mu held. */
void client_fd_socket(zc_client *c, char *path, size_t len)
{
	snprintf(path, len, "%s",
		 !c->conn.fp_path[0]                                        ? ""
		 : c->conn.fp_mine[0] && access(c->conn.fp_mine, F_OK) == 0 ? c->conn.fp_mine
									    : c->conn.fp_path);
}

void client_buf_release(struct host_buf *b)
{
	if (b->base)
		munmap(b->base, b->bytes);
	b->base = NULL;
}

int client_map_buf(int fd, uint64_t offset, uint64_t bytes, struct host_buf *ret)
{
	void *base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)offset);

	if (base == MAP_FAILED)
		return -errno;
	ret->base = base;
	ret->bytes = bytes;
	return 0;
}

/* With c->mu held: the first buffers of this client may come for plan zp
 * (validated and copied into *ret); else the reason, set for the caller. */
static int buffers_claim(zc_client *c, const struct zc_plan *zp, struct plan **ret,
			 const char *fn)
{
	char err[256];
	int r;

	if (c->plan || c->bufs_busy)
		return client_err_set(ZC_ESTATE, "%s: this client has its buffers already", fn);
	if (c->job_error)
		return client_err_set(c->job_error, "%s", c->job_msg);
	r = plan_from_zc(zp, ret, err, sizeof(err));
	if (r < 0)
		return client_err_set(r, "%s", err);
	return 0;
}


/*
 * Pass b's memfds to zerod for zp's buffers and map them here: what
 * zc_register_buffers() and zc_alloc_buffers() both do. fn names the public
 * call in reasons.
 */
static int register_fds(zc_client *c, const struct zc_plan *zp, const struct zc_buffers *b,
			const char *fn)
{
	struct host_buf grad = {0}, param = {0};
	char path[sizeof(c->conn.fp_path)], err[256];
	int fds[2] = {b->grad_fd, b->param_fd};
	uint64_t bytes, serial = 0, token;
	struct plan *p = NULL;
	int r, timeout;

	pthread_mutex_lock(&c->mu);
	r = buffers_claim(c, zp, &p, fn);
	if (r < 0)
		goto out;
	client_fd_socket(c, path, sizeof(path));
	if (!path[0]) {
		r = client_err_set(ZC_ENOTSUP, "%s: zerod offered no fd socket to pass buffers on",
				   fn);
		goto out;
	}
	c->bufs_busy = true;
	token = c->conn.fp_token;
	timeout = c->cfg.connect_timeout_ms;
	pthread_mutex_unlock(&c->mu);

	bytes = plan_buffer_bytes(p);
	r = bufs_send(path, token, fds, fds[0] == fds[1] ? 1 : 2, bytes, b->grad_offset,
		      b->param_offset, timeout, &serial, err, sizeof(err));
	if (r < 0)
		client_err_set(r, "%s: %s", fn, err);
	else if ((r = client_map_buf(fds[0], b->grad_offset, bytes, &grad)) < 0 ||
		 (r = client_map_buf(fds[1], b->param_offset, bytes, &param)) < 0)
		client_err_set(r, "%s: mapping the buffers: %s", fn, zc_strerror(r));

	pthread_mutex_lock(&c->mu);
	c->bufs_busy = false;
	if (r < 0) {
		client_buf_release(&grad);
		client_buf_release(&param);
		goto out;
	}
	c->grad = grad;
	c->param = param;
	c->bufs_serial = serial;
	c->bufs_shared = b->flags & ZC_BUFFERS_SHARED_PARAMS;
	c->plan = p;
	p = NULL;
out:
	plan_free(p);
	client_unlock(c);
	return r;
}

/* p's CUDA buffers b opened (runtime loaded, event rings made) into *ret,
 * with c->mu held on entry and on return but released meanwhile (c is
 * marked busy with buffers). 0, or the code with the reason recorded. */
int client_cuda_bufs_open(zc_client *c, const struct plan *p, const struct zc_buffers *b,
			  struct devbufs **ret, const char *fn)
{
	char err[384];
	int r;

	c->bufs_busy = true;
	pthread_mutex_unlock(&c->mu);
	r = devbufs_open(b->grad_dev, b->param_dev, plan_buffer_bytes(p), p->nbuckets, ret, err,
			 sizeof(err));
	if (r < 0)
		client_err_set(r, "%s: CUDA buffers: %s", fn, err);
	pthread_mutex_lock(&c->mu);
	c->bufs_busy = false;
	return r;
}

/* CUDA buffers: their handles and event rings, sent with the plan. */
static int register_cuda(zc_client *c, const struct zc_plan *zp, const struct zc_buffers *b)
{
	const char *fn = "zc_register_buffers";
	struct devbufs *dev = NULL;
	struct plan *p = NULL;
	int r;

	if (!b->grad_dev || !b->param_dev)
		return client_err_set(-EINVAL, "%s: CUDA buffers: %s is NULL", fn,
				      b->grad_dev ? "param_dev" : "grad_dev");
	pthread_mutex_lock(&c->mu);
	if (c->plan && c->registered && c->dev) {
		pthread_mutex_unlock(&c->mu);
		return replan_cuda(c, zp, b);
	}
	r = buffers_claim(c, zp, &p, fn);
	if (r < 0)
		goto out;
	r = client_cuda_bufs_open(c, p, b, &dev, fn);
	if (r < 0)
		goto out;
	c->dev = dev;
	c->plan = p;
	p = NULL;
out:
	plan_free(p);
	client_unlock(c);
	return r;
}

int zc_register_buffers(zc_client *c, const struct zc_plan *zp, const struct zc_buffers *ub)
{
	struct zc_buffers b;
	int r;

	if ((r = client_check(c, __func__)) < 0)
		return r;
	if (!zp)
		return client_err_set(-EINVAL, "zc_register_buffers: the plan is NULL");
	if ((r = structs_buffers_from_zc(ub, &b)) < 0)
		return r;
	if (b.kind == ZC_BUFFERS_CUDA && b.flags)
		return client_err_set(ZC_ENOTSUP,
				      "zc_register_buffers: flags 0x%x with CUDA buffers: "
				      "ZC_BUFFERS_SHARED_PARAMS is for host buffers",
				      b.flags);
	if (b.kind == ZC_BUFFERS_CUDA)
		return register_cuda(c, zp, &b);
	if (b.kind != ZC_BUFFERS_HOST)
		return client_err_set(
			-EINVAL, "zc_register_buffers: kind %u (ZC_BUFFERS_HOST, _CUDA)", b.kind);
	if (b.grad_fd < 0 || b.param_fd < 0)
		return client_err_set(-EBADF,
				      "zc_register_buffers: grad_fd %d, param_fd %d: not fds",
				      b.grad_fd, b.param_fd);
	if (b.flags & ~ZC_BUFFERS_SHARED_PARAMS)
		return client_err_set(-EINVAL,
				      "zc_register_buffers: flags 0x%x (ZC_BUFFERS_SHARED_PARAMS)",
				      b.flags);
	return register_fds(c, zp, &b, __func__);
}

int zc_plan_buffer_bytes(const struct zc_plan *zp, uint64_t *ret_bytes)
{
	struct plan *p;
	char err[256];
	int r;

	if (!zp || !ret_bytes)
		return client_err_set(-EINVAL, "zc_plan_buffer_bytes: %s is NULL",
				      zp ? "ret_bytes" : "the plan");
	r = plan_from_zc(zp, &p, err, sizeof(err));
	if (r < 0)
		return client_err_set(r, "%s", err);
	*ret_bytes = plan_buffer_bytes(p);
	plan_free(p);
	return 0;
}

int zc_alloc_buffers(zc_client *c, const struct zc_plan *zp)
{
	struct zc_buffers b = ZC_BUFFERS_INIT;
	struct plan *p;
	char err[256];
	uint64_t bytes;
	int fd, r;

	if ((r = client_check(c, __func__)) < 0)
		return r;
	if (!zp)
		return client_err_set(-EINVAL, "zc_alloc_buffers: the plan is NULL");
	pthread_mutex_lock(&c->mu);
	bool replan = c->plan && c->registered;
	bool dev = c->dev != NULL;
	pthread_mutex_unlock(&c->mu);
	if (replan && dev)
		return client_err_set(
			ZC_ESTATE, "zc_alloc_buffers: a client of CUDA buffers re-plans "
				   "with new CUDA buffers: zc_register_buffers(ZC_BUFFERS_CUDA)");
	if (replan)
		return replan_alloc(c, zp, NULL);
	/* the size first; register_fds() reads the plan again under the lock */
	r = plan_from_zc(zp, &p, err, sizeof(err));
	if (r < 0)
		return client_err_set(r, "%s", err);
	bytes = plan_buffer_bytes(p);
	plan_free(p);
	r = bufs_memfd(bytes, &b.param_offset, &fd);
	if (r < 0)
		return client_err_set(r, "zc_alloc_buffers: a memfd of 2 x %" PRIu64 " bytes: %s",
				      bytes, zc_strerror(r));
	b.grad_fd = b.param_fd = fd;
	r = register_fds(c, zp, &b, __func__);
	close(fd); /* the mappings, ours and zerod's, keep the memory */
	return r;
}

/* Without the lock: c->plan and the buffers are set once, by
 * zc_alloc_buffers(), and stay until zc_close(); trainers call this in their
 * inner loops. */
static void *bucket_ptr(zc_client *c, bool grad, uint32_t bucket, const char *fn)
{
	if (client_check(c, fn) < 0)
		return NULL;
	if (!c->plan) {
		client_err_set(ZC_ESTATE, "%s: no buffers yet (zc_alloc_buffers)", fn);
		return NULL;
	}
	if (bucket >= c->plan->nbuckets) {
		client_err_set(ZC_EBUCKET, "%s: bucket %u does not exist: the plan has %u buckets",
			       fn, bucket, c->plan->nbuckets);
		return NULL;
	}
	if (c->dev)
		return (char *)(grad ? devbufs_grad(c->dev) : devbufs_param(c->dev)) +
		       plan_bucket_offset(c->plan, bucket);
	return (char *)(grad ? c->grad.base : c->param.base) + plan_bucket_offset(c->plan, bucket);
}

/* The float views: fp32 buckets only. */
static float *bucket_f32(zc_client *c, bool grad, uint32_t bucket, const char *fn)
{
	void *p = bucket_ptr(c, grad, bucket, fn);

	if (p && c->plan->buckets[bucket].dtype != ZC_DTYPE_F32) {
		client_err_set(ZC_ESTATE, "%s: bucket %u holds %s elements: use %s", fn, bucket,
			       plan_dtype_name(c->plan->buckets[bucket].dtype),
			       grad ? "zc_grad_ptr()" : "zc_param_ptr()");
		return NULL;
	}
	return p;
}

float *zc_grad_buffer(zc_client *c, uint32_t bucket)
{
	return bucket_f32(c, true, bucket, __func__);
}

float *zc_param_buffer(zc_client *c, uint32_t bucket)
{
	return bucket_f32(c, false, bucket, __func__);
}

void *zc_grad_ptr(zc_client *c, uint32_t bucket)
{
	return bucket_ptr(c, true, bucket, __func__);
}

void *zc_param_ptr(zc_client *c, uint32_t bucket)
{
	return bucket_ptr(c, false, bucket, __func__);
}

/*
 * Attach the fast path, if zerod offered one and ZEROD_FASTPATH is not 0;
 * called with c->mu held, before the plan is registered (the daemon takes a
 * ring only then). The lock is released while zerod answers: other calls
 * may run (c->registered keeps a second registration out). Without a ring
 * everything goes over ZeroMQ, as with a daemon that offers none.
 */
static void fastpath_setup(zc_client *c)
{
	const char *env = getenv("ZEROD_FASTPATH");
	uint32_t nbuckets = c->plan->nbuckets;
	uint64_t zsent = c->conn.zsent;
	char path[sizeof(c->conn.fp_path)], err[256];
	struct fpc *fp = NULL;
	int r;

	client_fd_socket(c, path, sizeof(path));
	if (!path[0] || (env && strcmp(env, "0") == 0))
		return;
	pthread_mutex_unlock(&c->mu);
	r = fpc_attach(path, c->conn.fp_token, zsent, nbuckets, c->cfg.connect_timeout_ms, &fp, err,
		       sizeof(err));
	pthread_mutex_lock(&c->mu);
	if (r < 0)
		return;
	if (c->conn.zsent != zsent || c->job_error) {
		/* a ZeroMQ message went out meanwhile (zc_close's Goodbye),
		 * or the job is over: not worth a ring */
		fpc_free(fp);
		return;
	}
	if (epoll_ctl(c->conn.efd, EPOLL_CTL_ADD, fpc_fd(fp),
		      &(struct epoll_event){.events = EPOLLIN, .data.fd = fpc_fd(fp)}) < 0) {
		fpc_free(fp);
		return;
	}
	c->conn.fp = fp;
}

int zc_register_plan(zc_client *c)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__RegisterPlan rp = ZEROD__V1__REGISTER_PLAN__INIT;
	Zerod__V1__FdBuffers fds = ZEROD__V1__FD_BUFFERS__INIT;
	Zerod__V1__CudaBuffers cuda;
	void *cuda_arrays = NULL;
	Zerod__V1__Plan pb;
	int r;

	if ((r = client_check(c, __func__)) < 0)
		return r;
	pthread_mutex_lock(&c->mu);
	if (c->replan.old_plan) {
		client_unlock(c);
		return replan_register(c);
	}
	if (!c->plan || c->registered) {
		client_unlock(c);
		return client_err_set(
			ZC_ESTATE, "zc_register_plan: %s",
			c->registered ? "the plan is registered already"
				      : "no buffers yet (zc_alloc_buffers, zc_register_buffers)");
	}
	r = plan_to_pb(c->plan, &pb);
	if (r >= 0 && c->dev && (r = devbufs_to_pb(c->dev, &cuda, &cuda_arrays)) < 0)
		plan_pb_free(&pb);
	if (r < 0) {
		client_unlock(c);
		return client_err_set(r, NULL);
	}
	c->registered = true;
	c->plan_result = 0;
	fastpath_setup(c);
	fds.serial = c->bufs_serial;
	fds.has_shared_params = fds.shared_params = c->bufs_shared;
	rp.plan = &pb;
	if (c->dev)
		rp.cuda = &cuda;
	else
		rp.fds = &fds;
	env.body_case = ZEROD__V1__ENVELOPE__BODY_REGISTER_PLAN;
	env.register_plan = &rp;
	r = client_send_env(c, &env, NULL);
	plan_pb_free(&pb);
	free(cuda_arrays);
	client_unlock(c);
	if (r < 0)
		return client_err_set(r, "zc_register_plan: sending the plan: %s", zc_strerror(r));
	r = client_wait_for(c, &c->plan_result, NULL, now_ms() + c->cfg.register_timeout_ms);
	if (r == 0)
		return client_err_set(ZC_ETIMEDOUT, "not every rank registered within %d ms",
				      c->cfg.register_timeout_ms);
	if (r < 0) {
		pthread_mutex_lock(&c->mu);
		client_err_set(r, "%s", c->answer_msg);
		client_unlock(c);
		return r;
	}
	return 0;
}
