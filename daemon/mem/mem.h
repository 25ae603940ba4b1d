/*
 * mem.h — the buffer backend interface: how the daemon gets at a trainer's
 * gradient and parameter buffers. mem/shm.c maps POSIX shared memory (host);
 * mem/cuda.c will open CUDA IPC handles.
 */
#ifndef ZEROD_MEM_H
#define ZEROD_MEM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* What a client sent to describe one buffer. */
struct mem_desc {
	const char *shm_name; /* host: POSIX shm object name, "/..." */
	uint64_t bytes;       /* what the client claims the buffer holds */
	uid_t owner;          /* the client's uid: the object must be its own */
};

struct mem_map;

struct mem_ops {
	const char *name;
	/* Map the buffer desc describes; it must hold exactly `bytes` (the
	 * plan's size): otherwise ZC_ESIZE, and ZC_EMAP if it cannot be opened;
	 * err says why. Called on the loop thread: only quick syscalls. The
	 * name is unlinked once mapped, so nothing outlives the job. */
	int (*map)(const struct mem_desc *desc, uint64_t bytes, struct mem_map **ret, char *err,
		   size_t errlen);
	/* Base address of the mapping; valid until unmap. */
	void *(*ptr)(struct mem_map *m);
	/* Release the mapping. Accepts NULL. No worker may still use it. */
	void (*unmap)(struct mem_map *m);
	/* The trainer of rank `rank` of job `job` (pid `own_pid` as it knows
	 * itself, uid `owner`) has exited: remove buffers it created and never
	 * had mapped, so a trainer that dies before registering leaks nothing.
	 * Loop thread: only quick syscalls. */
	void (*reclaim)(const char *job, uint32_t rank, pid_t own_pid, uid_t owner);
};

extern const struct mem_ops mem_shm_ops;

#endif
