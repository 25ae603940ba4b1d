/*
 * devbufs.c — a trainer's CUDA buffers (devbufs.h). The CUDA runtime is
 * dlopen'ed at the first use ($ZEROD_CUDART, else libcudart.so.13, else
 * libcudart.so) and reached through the few entry points below, declared
 * here with CUDA's ABI so the library builds without CUDA's headers. The
 * device is named by UUID, and each buffer by the IPC handle of its
 * allocation's base plus its offset (a handle is of an allocation, and
 * caching allocators hand out pieces of larger ones).
 *
 * The event rings: bucket b's ready and done events of iteration t are slot
 * t % ring of b's rings. A record overwrites an event, and a wait waits for
 * the record that came last before it was issued: the trainer records
 * ready[b][t % ring] when b's gradients are written, zerod's reduction
 * waits on it; zerod records done[b][t % ring] after b's last collective,
 * and zc_step_wait_cuda() makes the trainer's stream wait on it. A slot is
 * recorded again ring iterations later, and by then the other side has
 * issued its wait on it: the client hands over iteration t + 1's buckets
 * only after t's step completed, so with a ring of 2 neither side ever
 * finds a slot re-recorded under a wait that has not been issued yet
 * (zc_step_wait_cuda() checks its iteration is still in the ring).
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devbufs.h"
#include "zeroclient.h"

/* CUDA's ABI, as cuda_runtime_api.h / driver_types.h declare it. */
typedef int cuerr;
#define CU_SUCCESS         0
#define CU_HANDLE_BYTES    64
#define CU_EV_NO_TIMING    0x02 /* cudaEventDisableTiming */
#define CU_EV_INTERPROCESS 0x04 /* cudaEventInterprocess */
#define CU_MEM_DEVICE      2    /* cudaMemoryTypeDevice */
#define CU_PROP_BYTES      8192 /* more than any cudaDeviceProp; uuid follows name[256] */
#define CU_PROP_UUID_AT    256

/* cudaPointerAttributes starts with its type and device; it has grown
 * (88 bytes in CUDA 13), so the runtime gets room for any version. */
union cu_ptr_attr {
	struct {
		int type;
		int device;
	} f;
	char room[1024];
};

typedef struct {
	char bytes[CU_HANDLE_BYTES];
} cu_handle; /* cudaIpcMemHandle_t, cudaIpcEventHandle_t */

static struct {
	void *lib;
	char why[256];
	cuerr (*get_device)(int *);
	cuerr (*set_device)(int);
	cuerr (*get_props)(void *, int);
	cuerr (*ptr_attr)(union cu_ptr_attr *, const void *);
	cuerr (*ipc_mem)(cu_handle *, void *);
	cuerr (*ev_create)(void **, unsigned);
	cuerr (*ev_destroy)(void *);
	cuerr (*ev_record)(void *, void *);
	cuerr (*wait_event)(void *, void *, unsigned);
	cuerr (*ipc_event)(cu_handle *, void *);
	cuerr (*entry_point)(const char *, void **, unsigned, unsigned long long, int *);
	const char *(*err_string)(cuerr);
	cuerr (*last_error)(void);
	int (*addr_range)(uintptr_t *, size_t *, uintptr_t); /* cuMemGetAddressRange */
} rt;
static pthread_once_t rt_once = PTHREAD_ONCE_INIT;

static void rt_load(void)
{
	const char *env = getenv("ZEROD_CUDART");
	const char *names[] = {env && *env ? env : "libcudart.so.13", "libcudart.so"};
	void *fn = NULL;
	int q = -1;

	for (unsigned i = 0; i < (env && *env ? 1u : 2u) && !rt.lib; i++)
		rt.lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
	if (!rt.lib) {
		snprintf(rt.why, sizeof(rt.why), "no CUDA runtime: dlopen(%s): %s", names[0],
			 dlerror());
		return;
	}
#define SYM(field, name)                                                                           \
	do {                                                                                       \
		*(void **)&rt.field = dlsym(rt.lib, name);                                         \
		if (!rt.field) {                                                                   \
			snprintf(rt.why, sizeof(rt.why), "the CUDA runtime %s lacks %s", names[0], \
				 name);                                                            \
			return;                                                                    \
		}                                                                                  \
	} while (0)
	SYM(get_device, "cudaGetDevice");
	SYM(set_device, "cudaSetDevice");
	SYM(get_props, "cudaGetDeviceProperties");
	SYM(ptr_attr, "cudaPointerGetAttributes");
	SYM(ipc_mem, "cudaIpcGetMemHandle");
	SYM(ev_create, "cudaEventCreateWithFlags");
	SYM(ev_destroy, "cudaEventDestroy");
	SYM(ev_record, "cudaEventRecord");
	SYM(wait_event, "cudaStreamWaitEvent");
	SYM(ipc_event, "cudaIpcGetEventHandle");
	SYM(entry_point, "cudaGetDriverEntryPointByVersion");
	SYM(err_string, "cudaGetErrorString");
	SYM(last_error, "cudaGetLastError");
#undef SYM
	/* CUDA 12's cuMemGetAddressRange (the _v2 ABI: size_t sizes) */
	if (rt.entry_point("cuMemGetAddressRange", &fn, 12000, 0, &q) != CU_SUCCESS || q != 0 ||
	    !fn) {
		(void)rt.last_error();
		snprintf(rt.why, sizeof(rt.why), "the CUDA driver offers no cuMemGetAddressRange");
		return;
	}
	*(void **)&rt.addr_range = fn;
	rt.why[0] = 0;
}

struct devbufs {
	void *grad, *param;
	uint64_t bytes;
	int dev;
	uint8_t uuid[16];
	cu_handle grad_h, param_h;
	uint64_t grad_off, param_off;
	uint32_t ring, nbuckets;
	void **ready, **done; /* [nbuckets * ring] cudaEvent_t */
	cu_handle *ready_h, *done_h;
};

static int cu_fail(cuerr e, const char *what, char *err, size_t errlen)
{
	snprintf(err, errlen, "%s: %s (CUDA error %d)", what, rt.err_string(e), e);
	(void)rt.last_error();
	return ZC_EINTERNAL;
}

/* The device of p, and the IPC handle and offset of its allocation. */
static int buffer(const char *what, void *p, uint64_t bytes, int *ret_dev, cu_handle *ret_h,
		  uint64_t *ret_off, char *err, size_t errlen)
{
	union cu_ptr_attr a = {0};
	uintptr_t base;
	size_t size;
	cuerr e;

	e = rt.ptr_attr(&a, p);
	if (e != CU_SUCCESS || a.f.type != CU_MEM_DEVICE) {
		(void)rt.last_error();
		snprintf(err, errlen, "the %s (%p) are not CUDA device memory", what, p);
		return -EINVAL;
	}
	if (rt.addr_range(&base, &size, (uintptr_t)p) != 0) {
		snprintf(err, errlen, "the %s (%p): cuMemGetAddressRange failed", what, p);
		return ZC_EINTERNAL;
	}
	if ((uintptr_t)p - base > size || bytes > size - ((uintptr_t)p - base)) {
		snprintf(err, errlen,
			 "the %s: %llu bytes at offset %llu do not fit their %zu-byte allocation",
			 what, (unsigned long long)bytes, (unsigned long long)((uintptr_t)p - base),
			 size);
		return -EINVAL;
	}
	e = rt.ipc_mem(ret_h, (void *)base);
	if (e != CU_SUCCESS) {
		char w[64];

		snprintf(w, sizeof(w), "cudaIpcGetMemHandle of the %s", what);
		return cu_fail(e, w, err, errlen);
	}
	*ret_dev = a.f.device;
	*ret_off = (uintptr_t)p - base;
	return 0;
}

static int events(struct devbufs *d, char *err, size_t errlen)
{
	size_t n = (size_t)d->nbuckets * d->ring;
	cuerr e;

	d->ready = calloc(n ? n : 1, sizeof(*d->ready));
	d->done = calloc(n ? n : 1, sizeof(*d->done));
	d->ready_h = calloc(n ? n : 1, sizeof(*d->ready_h));
	d->done_h = calloc(n ? n : 1, sizeof(*d->done_h));
	if (!d->ready || !d->done || !d->ready_h || !d->done_h) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	for (size_t i = 0; i < 2 * n; i++) {
		void **ev = i < n ? &d->ready[i] : &d->done[i - n];
		cu_handle *h = i < n ? &d->ready_h[i] : &d->done_h[i - n];

		e = rt.ev_create(ev, CU_EV_INTERPROCESS | CU_EV_NO_TIMING);
		if (e != CU_SUCCESS)
			return cu_fail(e, "cudaEventCreateWithFlags(interprocess)", err, errlen);
		e = rt.ipc_event(h, *ev);
		if (e != CU_SUCCESS)
			return cu_fail(e, "cudaIpcGetEventHandle", err, errlen);
	}
	return 0;
}

int devbufs_open(void *grad, void *param, uint64_t bytes, uint32_t nbuckets, struct devbufs **ret,
		 char *err, size_t errlen)
{
	struct devbufs *d;
	int pdev = -1, cur = 0, r;
	char *props;
	cuerr e;

	pthread_once(&rt_once, rt_load);
	if (rt.why[0]) {
		snprintf(err, errlen, "%s", rt.why);
		return ZC_ENOTSUP;
	}
	d = calloc(1, sizeof(*d));
	props = calloc(1, CU_PROP_BYTES);
	if (!d || !props) {
		free(d);
		free(props);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	d->grad = grad;
	d->param = param;
	d->bytes = bytes;
	d->nbuckets = nbuckets;
	d->ring = ZC_CUDA_EVENT_RING;
	r = buffer("gradients", grad, bytes, &d->dev, &d->grad_h, &d->grad_off, err, errlen);
	if (r >= 0)
		r = buffer("parameters", param, bytes, &pdev, &d->param_h, &d->param_off, err,
			   errlen);
	if (r >= 0 && pdev != d->dev) {
		snprintf(err, errlen, "the gradients are on device %d, the parameters on %d",
			 d->dev, pdev);
		r = -EINVAL;
	}
	if (r >= 0 && (e = rt.get_props(props, d->dev)) != CU_SUCCESS)
		r = cu_fail(e, "cudaGetDeviceProperties", err, errlen);
	if (r >= 0) {
		memcpy(d->uuid, props + CU_PROP_UUID_AT, sizeof(d->uuid));
		/* the events belong to the buffers' device */
		if ((e = rt.get_device(&cur)) != CU_SUCCESS ||
		    (e = rt.set_device(d->dev)) != CU_SUCCESS)
			r = cu_fail(e, "cudaSetDevice", err, errlen);
		else {
			r = events(d, err, errlen);
			(void)rt.set_device(cur);
		}
	}
	free(props);
	if (r < 0) {
		devbufs_free(d);
		return r;
	}
	*ret = d;
	return 0;
}

void devbufs_free(struct devbufs *d)
{
	size_t n;

	if (!d)
		return;
	n = (size_t)d->nbuckets * d->ring;
	for (size_t i = 0; i < n; i++) {
		if (d->ready && d->ready[i])
			(void)rt.ev_destroy(d->ready[i]);
		if (d->done && d->done[i])
			(void)rt.ev_destroy(d->done[i]);
	}
	free(d->ready);
	free(d->done);
	free(d->ready_h);
	free(d->done_h);
	free(d);
}

/* The events zc_close() could not destroy: a list of their arrays, so they
 * stay reachable (leak checkers see them kept, not lost). */
struct kept {
	void **ready, **done;
	struct kept *next;
};
static struct kept *kept_events;
static pthread_mutex_t kept_mu = PTHREAD_MUTEX_INITIALIZER;

void devbufs_keep_events(struct devbufs *d)
{
	struct kept *k;

	if (!d)
		return;
	k = calloc(1, sizeof(*k));
	if (!k)
		return; /* d is leaked whole: still never destroyed under zerod */
	k->ready = d->ready;
	k->done = d->done;
	pthread_mutex_lock(&kept_mu);
	k->next = kept_events;
	kept_events = k;
	pthread_mutex_unlock(&kept_mu);
	free(d->ready_h);
	free(d->done_h);
	free(d);
}

void *devbufs_grad(const struct devbufs *d)
{
	return d->grad;
}

void *devbufs_param(const struct devbufs *d)
{
	return d->param;
}

int devbufs_to_pb(const struct devbufs *d, Zerod__V1__CudaBuffers *pb, void **ret_arrays)
{
	size_t n = (size_t)d->nbuckets * d->ring;
	ProtobufCBinaryData *a = calloc(2 * n + 1, sizeof(*a));

	if (!a)
		return -ENOMEM;
	zerod__v1__cuda_buffers__init(pb);
	pb->uuid = (ProtobufCBinaryData){sizeof(d->uuid), (uint8_t *)d->uuid};
	pb->bytes = d->bytes;
	pb->grad_handle = (ProtobufCBinaryData){CU_HANDLE_BYTES, (uint8_t *)d->grad_h.bytes};
	pb->grad_offset = d->grad_off;
	pb->param_handle = (ProtobufCBinaryData){CU_HANDLE_BYTES, (uint8_t *)d->param_h.bytes};
	pb->param_offset = d->param_off;
	pb->ring = d->ring;
	for (size_t i = 0; i < n; i++) {
		a[i] = (ProtobufCBinaryData){CU_HANDLE_BYTES, (uint8_t *)d->ready_h[i].bytes};
		a[n + i] = (ProtobufCBinaryData){CU_HANDLE_BYTES, (uint8_t *)d->done_h[i].bytes};
	}
	pb->n_ready_events = pb->n_done_events = n;
	pb->ready_events = a;
	pb->done_events = a + n;
	*ret_arrays = a;
	return 0;
}

/* Run with the buffers' device current, then the caller's again: an event
 * is of the device it was made on, a record or a wait on it must be issued
 * there, and stream 0 (the legacy default stream) is the current device's. */
static int on_device(const struct devbufs *d, cuerr (*fn)(const struct devbufs *, void *, void *),
		     void *stream, void *arg, const char *what, char *err, size_t errlen)
{
	int cur = 0;
	cuerr e, e2;

	if ((e = rt.get_device(&cur)) != CU_SUCCESS ||
	    (cur != d->dev && (e = rt.set_device(d->dev)) != CU_SUCCESS))
		return cu_fail(e, "cudaSetDevice", err, errlen);
	e = fn(d, stream, arg);
	e2 = cur != d->dev ? rt.set_device(cur) : CU_SUCCESS;
	if (e != CU_SUCCESS)
		return cu_fail(e, what, err, errlen);
	return e2 == CU_SUCCESS ? 0 : cu_fail(e2, "cudaSetDevice (back)", err, errlen);
}

static cuerr record(const struct devbufs *d, void *stream, void *arg)
{
	(void)d;
	return rt.ev_record(arg, stream);
}

struct waits {
	uint64_t t;
};

static cuerr wait_all(const struct devbufs *d, void *stream, void *arg)
{
	const struct waits *w = arg;

	for (uint32_t b = 0; b < d->nbuckets; b++) {
		cuerr e = rt.wait_event(stream, d->done[(size_t)b * d->ring + w->t % d->ring], 0);
		if (e != CU_SUCCESS)
			return e;
	}
	return CU_SUCCESS;
}

int devbufs_record_ready(struct devbufs *d, uint32_t bucket, uint64_t t, void *stream, char *err,
			 size_t errlen)
{
	return on_device(d, record, stream, d->ready[(size_t)bucket * d->ring + t % d->ring],
			 "cudaEventRecord(ready event)", err, errlen);
}

int devbufs_wait_done(struct devbufs *d, uint64_t t, void *stream, char *err, size_t errlen)
{
	struct waits w = {t};

	return on_device(d, wait_all, stream, &w, "cudaStreamWaitEvent(done event)", err, errlen);
}
