/*
 * cudabufs.h — what a trainer registered as CUDA device buffers
 * (RegisterPlan.cuda): its two buffers as mem.h descriptors of kind
 * MEM_CUDA_IPC and its interprocess event rings, checked and copied from the
 * message on the loop thread. Nothing is opened here: the job's executor
 * opens the handles when the job starts (exec.h: they may block), once per
 * plan.
 */
#ifndef ZEROD_CUDABUFS_H
#define ZEROD_CUDABUFS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "mem/mem.h"
#include "zerod.pb-c.h"

#define CUDABUFS_EVENT_BYTES 64 /* CUDA_IPC_HANDLE_SIZE */
#define CUDABUFS_MAX_RING    16

struct cudabufs {
	struct mem_desc grad, param; /* kind MEM_CUDA_IPC */
	uint32_t ring;               /* events per bucket and direction */
	uint32_t nbuckets;
	/* nbuckets * ring ready events, then as many done events, each
	 * CUDABUFS_EVENT_BYTES: bucket b's slot s at b * ring + s */
	uint8_t *events;
};

struct plan;

/* Check m against plan p (sizes, counts, lengths) and copy it: 0 and
 * *ret, or ZC_EBUFFER / ZC_EPROTO with err saying what is wrong. */
int cudabufs_from_pb(const Zerod__V1__CudaBuffers *m, const struct plan *p, uid_t owner,
		     struct cudabufs **ret, char *err, size_t errlen);

/* Accepts NULL. */
void cudabufs_free(struct cudabufs *cb);

#endif
