/*
 * cudabufs.c — RegisterPlan.cuda checked at the edge and copied
 * (cudabufs.h). Every length is the one CUDA's handles have and every count
 * the plan's, so what the executor later opens is bounded by the plan.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mem/cudabufs.h"
#include "plan.h"
#include "zeroclient.h"

static int desc_from(struct mem_desc *d, const ProtobufCBinaryData *h, uint64_t offset,
		     uint64_t bytes, const ProtobufCBinaryData *uuid, uid_t owner, const char *what,
		     char *err, size_t errlen)
{
	if (h->len != MEM_CUDA_HANDLE_BYTES) {
		snprintf(err, errlen, "%s: an IPC handle of %zu bytes (CUDA's have %d)", what,
			 h->len, MEM_CUDA_HANDLE_BYTES);
		return ZC_EPROTO;
	}
	*d = (struct mem_desc){.kind = MEM_CUDA_IPC, .bytes = bytes, .owner = owner, .fd = -1};
	memcpy(d->cuda.handle, h->data, MEM_CUDA_HANDLE_BYTES);
	memcpy(d->cuda.uuid, uuid->data, MEM_CUDA_UUID_BYTES);
	d->cuda.offset = offset;
	return 0;
}

int cudabufs_from_pb(const Zerod__V1__CudaBuffers *m, const struct plan *p, uid_t owner,
		     struct cudabufs **ret, char *err, size_t errlen)
{
	uint64_t nev = (uint64_t)p->nbuckets * m->ring;
	struct cudabufs *cb;
	int r;

	if (m->uuid.len != MEM_CUDA_UUID_BYTES) {
		snprintf(err, errlen, "a device UUID of %zu bytes (CUDA's have %d)", m->uuid.len,
			 MEM_CUDA_UUID_BYTES);
		return ZC_EPROTO;
	}
	if (m->bytes != plan_buffer_bytes(p)) {
		snprintf(err, errlen, "CUDA buffers of %" PRIu64 " bytes, the plan needs %" PRIu64,
			 m->bytes, plan_buffer_bytes(p));
		return ZC_ESIZE;
	}
	if (m->ring < 1 || m->ring > CUDABUFS_MAX_RING) {
		snprintf(err, errlen, "an event ring of %u (1..%u)", m->ring, CUDABUFS_MAX_RING);
		return ZC_EPROTO;
	}
	if (m->n_ready_events != nev || m->n_done_events != nev) {
		snprintf(err, errlen,
			 "%zu ready and %zu done events; %u buckets x ring %u need %" PRIu64
			 " of each",
			 m->n_ready_events, m->n_done_events, p->nbuckets, m->ring, nev);
		return ZC_EPROTO;
	}
	for (uint64_t k = 0; k < 2 * nev; k++) {
		const ProtobufCBinaryData *h =
			k < nev ? &m->ready_events[k] : &m->done_events[k - nev];
		if (h->len != CUDABUFS_EVENT_BYTES) {
			snprintf(err, errlen, "%s event %" PRIu64 ": %zu bytes (CUDA's have %d)",
				 k < nev ? "ready" : "done", k % nev, h->len, CUDABUFS_EVENT_BYTES);
			return ZC_EPROTO;
		}
	}
	cb = calloc(1, sizeof(*cb));
	if (!cb || !(cb->events = malloc(2 * nev * CUDABUFS_EVENT_BYTES))) {
		free(cb);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	cb->ring = m->ring;
	cb->nbuckets = p->nbuckets;
	for (uint64_t k = 0; k < 2 * nev; k++)
		memcpy(cb->events + k * CUDABUFS_EVENT_BYTES,
		       (k < nev ? m->ready_events[k] : m->done_events[k - nev]).data,
		       CUDABUFS_EVENT_BYTES);
	r = desc_from(&cb->grad, &m->grad_handle, m->grad_offset, m->bytes, &m->uuid, owner,
		      "gradients", err, errlen);
	if (r >= 0)
		r = desc_from(&cb->param, &m->param_handle, m->param_offset, m->bytes, &m->uuid,
			      owner, "parameters", err, errlen);
	if (r < 0) {
		cudabufs_free(cb);
		return r;
	}
	*ret = cb;
	return 0;
}

void cudabufs_free(struct cudabufs *cb)
{
	if (!cb)
		return;
	free(cb->events);
	free(cb);
}
