/*
 * devbufs.h — CUDA device buffers for libzeroclient (internal; devbufs.c):
 * the CUDA runtime loaded at run time, the IPC handles of a trainer's two
 * buffers, and the interprocess event rings of its buckets. The library
 * never links the CUDA runtime, so trainers without CUDA load it.
 */
#ifndef ZEROCLIENT_DEVBUFS_H
#define ZEROCLIENT_DEVBUFS_H

#include <stddef.h>
#include <stdint.h>

#include "zerod.pb-c.h"

struct devbufs;

/* Load the runtime if needed, find the device of grad and param (the same
 * one), the IPC handles of their allocations with the offsets, and create
 * nbuckets * ring ready and done events there. 0 and *ret, or ZC_ENOTSUP (no
 * CUDA runtime), -EINVAL (not device memory, two devices, too small), or
 * ZC_EINTERNAL (a CUDA call failed), with err saying why. */
int devbufs_open(void *grad, void *param, uint64_t bytes, uint32_t nbuckets, struct devbufs **ret,
		 char *err, size_t errlen);

/* Destroy the events. Accepts NULL. Only once zerod has released them
 * (it closed its imports: a re-plan it took or refused), or never sent. */
void devbufs_free(struct devbufs *d);

/* Free d but keep its events for the rest of the process: zerod may still
 * wait on or record them (a job being torn down after a Goodbye, which
 * nothing answers), and using an imported event after its exporter
 * destroyed it is undefined. The driver frees them when the process exits.
 * Accepts NULL. */
void devbufs_keep_events(struct devbufs *d);

void *devbufs_grad(const struct devbufs *d);
void *devbufs_param(const struct devbufs *d);

/* RegisterPlan.cuda: *pb points into d (valid while d lives) and into
 * *ret_arrays, which the caller frees. 0 or -ENOMEM. */
int devbufs_to_pb(const struct devbufs *d, Zerod__V1__CudaBuffers *pb, void **ret_arrays);

/* Record bucket's ready event of iteration t on stream / make stream wait on
 * every bucket's done event of iteration t. 0, or ZC_EINTERNAL with err. */
int devbufs_record_ready(struct devbufs *d, uint32_t bucket, uint64_t t, void *stream, char *err,
			 size_t errlen);
int devbufs_wait_done(struct devbufs *d, uint64_t t, void *stream, char *err, size_t errlen);

#endif
