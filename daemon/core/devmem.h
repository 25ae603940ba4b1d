/*
 * devmem.h — the optimizer state a CUDA job keeps on each GPU (optim/cuda.c
 * allocates it on the owner ranks' devices), counted per device by UUID so
 * --max-device-memory bounds what all jobs together hold on one GPU. Loop
 * thread (job.c, when a job starts).
 */
#ifndef ZEROD_DEVMEM_H
#define ZEROD_DEVMEM_H

#include <stddef.h>
#include <stdint.h>

#include "mem/mem.h"

struct cudabufs;
struct core;
struct job;
struct state;

struct devmem_use {
	uint8_t uuid[MEM_CUDA_UUID_BYTES];
	uint64_t bytes;
};

/* The bytes state s places on each device: each piece on its owner rank's
 * (bufs[owner]'s UUID), as optim/cuda.c lays it out (state_bytes() is their
 * sum), with keep a copy of each fp32 piece's parameters too (optim.h's
 * keep_params), with journal all of it twice (its undo mirror). *ret
 * (malloc'core, NULL when none) and *ret_n entries; 0 or -ENOMEM. */
int devmem_of(const struct state *s, struct cudabufs *const *bufs, bool keep, bool journal,
	      struct devmem_use **ret, uint32_t *ret_n);

/* Whether j's j->devmem fits under --max-device-memory beside what the other
 * jobs hold on the same devices: 0, or ZC_ELIMIT with why naming the device,
 * what the job needs there and what is left. */
int devmem_check(const struct core *core, const struct job *j, char *why, size_t len);

#endif
