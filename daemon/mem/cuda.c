/*
 * cuda.c — device buffers: CUDA IPC handles of memory a trainer allocated,
 * opened in the daemon once per plan. A descriptor names the allocation's
 * base handle, the buffer's offset into it and the device's UUID (ordinals
 * differ between processes); map() finds the device by UUID, opens the
 * handle there with cudaIpcMemLazyEnablePeerAccess (peer access between the
 * daemon's devices is enabled only if something ever reaches across), checks
 * that offset + bytes lies inside what was mapped, and hands out base +
 * offset. The offset is from the pointer the exporter made the handle of
 * (its cuMemGetAddressRange base), and the opened pointer is that pointer's
 * image here; but cudaMalloc carves small allocations out of larger blocks,
 * and IPC maps the whole block, so here the range around the opened
 * pointer may begin before it and end after the allocation: the buffer is
 * checked against that range, never required to start at its base.
 *
 * Threads: cudaIpcOpenMemHandle can take long (the first call on a device
 * creates the daemon's context there), so map and unmap block
 * (mem_ops.blocking): they run on the job's executor when it starts, never on
 * the loop thread.
 *
 * Nothing outlives a trainer: its allocation is freed by the driver once the
 * trainer is gone and the daemon has closed its handle, so reclaim has
 * nothing to remove.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>

#include "base/cudacheck.h"
#include "mem/mem.h"
#include "zeroclient.h"

_Static_assert(MEM_CUDA_HANDLE_BYTES == CUDA_IPC_HANDLE_SIZE, "mem.h's handle is CUDA's");
_Static_assert(MEM_CUDA_UUID_BYTES == sizeof(cudaUUID_t), "mem.h's UUID is CUDA's");

struct mem_map {
	void *base; /* what cudaIpcOpenMemHandle gave */
	void *ptr;  /* base + offset */
	int dev;
};

/* cuMemGetAddressRange, from the driver through the runtime, so zerod does
 * not link libcuda (it must start on machines without a driver). */
typedef CUresult (*addr_range_fn)(CUdeviceptr *base, size_t *size, CUdeviceptr p);
static addr_range_fn addr_range;
static pthread_once_t addr_range_once = PTHREAD_ONCE_INIT;

static void addr_range_init(void)
{
	enum cudaDriverEntryPointQueryResult q;
	void *fn = NULL;

	if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault,
					     &q) == cudaSuccess &&
	    q == cudaDriverEntryPointSuccess)
		addr_range = (addr_range_fn)fn;
	(void)cudaGetLastError();
}

static const char *uuid_str(const uint8_t u[16], char buf[48])
{
	return mem_uuid_str(u, buf);
}

/* The ordinal of the device with this UUID in this process, or a negative
 * code (-ENODEV: not visible here). */
static int device_by_uuid(const uint8_t uuid[16])
{
	int n;

	CUDA_TRY(cudaGetDeviceCount(&n));
	for (int d = 0; d < n; d++) {
		struct cudaDeviceProp prop;

		CUDA_TRY(cudaGetDeviceProperties(&prop, d));
		if (memcmp(prop.uuid.bytes, uuid, 16) == 0)
			return d;
	}
	return -ENODEV;
}

static void cuda_unmap(struct mem_map *m)
{
	if (!m)
		return;
	(void)cudaSetDevice(m->dev);
	(void)cudaIpcCloseMemHandle(m->base);
	(void)cudaGetLastError();
	free(m);
}

static int cuda_map(const struct mem_desc *desc, uint64_t bytes, struct mem_map **ret, char *err,
		    size_t errlen)
{
	cudaIpcMemHandle_t h;
	struct mem_map *m;
	CUdeviceptr base;
	size_t size;
	char ubuf[48];
	cudaError_t e;
	int dev;

	if (desc->kind != MEM_CUDA_IPC) {
		snprintf(err, errlen, "not a CUDA buffer");
		return ZC_EMAP;
	}
	if (desc->bytes != bytes) {
		snprintf(err, errlen, "client says %llu bytes, the plan needs %llu",
			 (unsigned long long)desc->bytes, (unsigned long long)bytes);
		return ZC_ESIZE;
	}
	if (desc->cuda.offset % sizeof(float)) {
		snprintf(err, errlen, "offset %llu is not float-aligned",
			 (unsigned long long)desc->cuda.offset);
		return ZC_EMAP;
	}
	dev = device_by_uuid(desc->cuda.uuid);
	if (dev < 0) {
		snprintf(err, errlen, "%s: %s", uuid_str(desc->cuda.uuid, ubuf),
			 dev == -ENODEV ? "no such device visible to zerod" : zc_strerror(dev));
		return ZC_EMAP;
	}
	m = calloc(1, sizeof(*m));
	if (!m) {
		snprintf(err, errlen, "out of memory");
		return ZC_EMAP;
	}
	m->dev = dev;
	memcpy(&h, desc->cuda.handle, sizeof(h));
	e = cudaSetDevice(dev);
	if (e == cudaSuccess)
		e = cudaIpcOpenMemHandle(&m->base, h, cudaIpcMemLazyEnablePeerAccess);
	if (e != cudaSuccess) {
		/* the client reads this: name CUDA's reason, not only an errno */
		snprintf(err, errlen, "%s (device %d): cannot open the CUDA IPC handle: %s (%s)",
			 uuid_str(desc->cuda.uuid, ubuf), dev, cudaGetErrorString(e),
			 cudaGetErrorName(e));
		(void)cuda_fail(e, "cudaIpcOpenMemHandle", __FILE__, __LINE__);
		free(m);
		return ZC_EMAP;
	}
	pthread_once(&addr_range_once, addr_range_init);
	if (!addr_range ||
	    addr_range(&base, &size, (CUdeviceptr)(uintptr_t)m->base) != CUDA_SUCCESS) {
		snprintf(err, errlen, "%s: cannot learn the size of the allocation",
			 uuid_str(desc->cuda.uuid, ubuf));
		cuda_unmap(m);
		return ZC_EMAP;
	}
	/* the buffer must lie inside what is mapped here: [base, base + size)
	 * holds the opened pointer, maybe not at its start (a block) */
	uintptr_t at = (uintptr_t)m->base - (uintptr_t)base;
	if ((uintptr_t)m->base < (uintptr_t)base || at > size ||
	    desc->cuda.offset > size - at || bytes > size - at - desc->cuda.offset) {
		snprintf(err, errlen,
			 "%s: %llu bytes at offset %llu do not fit the %zu-byte allocation",
			 uuid_str(desc->cuda.uuid, ubuf), (unsigned long long)bytes,
			 (unsigned long long)desc->cuda.offset, size);
		cuda_unmap(m);
		return ZC_ESIZE;
	}
	m->ptr = (char *)m->base + desc->cuda.offset;
	*ret = m;
	return 0;
}

static void *cuda_ptr(struct mem_map *m)
{
	return m->ptr;
}

static void cuda_reclaim(const char *job, uint32_t rank, pid_t own_pid, uid_t owner)
{
	/* the driver frees a dead trainer's memory itself */
	(void)job;
	(void)rank;
	(void)own_pid;
	(void)owner;
}

const struct mem_ops mem_cuda_ops = {
	.name = "cuda",
	.blocking = true,
	.map = cuda_map,
	.ptr = cuda_ptr,
	.unmap = cuda_unmap,
	.reclaim = cuda_reclaim,
};
