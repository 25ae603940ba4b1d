/*
 * mem.h — the buffer backend interface: how the daemon gets at a trainer's
 * gradient and parameter buffers. mem/shm.c maps host memory: a memfd the
 * trainer passed (MEM_FD), or a named POSIX shm object (MEM_SHM, older
 * clients); mem/cuda.c opens CUDA IPC handles (builds with CUDA only).
 */
#ifndef ZEROD_MEM_H
#define ZEROD_MEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

enum mem_kind {
	MEM_SHM = 0, /* the default, so a descriptor that names no kind is shm */
	MEM_CUDA_IPC,
	MEM_FD, /* a memfd passed with SCM_RIGHTS (daemon/edge/fdbufs.c) */
};

#define MEM_CUDA_HANDLE_BYTES 64 /* CUDA_IPC_HANDLE_SIZE */
#define MEM_CUDA_UUID_BYTES   16

/* What a client sent to describe one buffer. */
struct mem_desc {
	enum mem_kind kind;
	const char *shm_name; /* MEM_SHM: POSIX shm object name, "/..." */
	uint64_t bytes;       /* what the client claims the buffer holds */
	uid_t owner;          /* the client's uid: the object must be its own */
	/* MEM_FD: the buffer is `bytes` from `offset` into the file of fd
	 * (the caller's: map neither takes nor closes it). */
	int fd;
	uint64_t offset;
	/* MEM_FD parameters: registered with ZC_BUFFERS_SHARED_PARAMS (sharedp.h) */
	bool shared;
	/* MEM_CUDA_IPC: device memory the trainer allocated. The handle is
	 * of the allocation's base (cudaIpcGetMemHandle of what
	 * cuMemGetAddressRange gives), the buffer starts offset bytes into it;
	 * the device is named by UUID because ordinals differ between
	 * processes (CUDA_VISIBLE_DEVICES). */
	struct {
		uint8_t handle[MEM_CUDA_HANDLE_BYTES];
		uint64_t offset;
		uint8_t uuid[MEM_CUDA_UUID_BYTES];
	} cuda;
};

struct mem_map;

struct mem_ops {
	const char *name;
	/* Map the buffer desc describes; it must hold exactly `bytes` (the
	 * plan's size): otherwise ZC_ESIZE, and ZC_EMAP if it cannot be opened
	 * or is of another kind; err says why. shm: on the loop thread (only
	 * quick syscalls, nothing faulted in); the name is unlinked once
	 * mapped, so nothing outlives the job. MEM_FD: every refusal is
	 * ZC_EBUFFER (not a memfd, not sealed against shrinking, another
	 * user's, too small for `bytes` from the offset). cuda: blocks (see
	 * `blocking`). */
	int (*map)(const struct mem_desc *desc, uint64_t bytes, struct mem_map **ret, char *err,
		   size_t errlen);
	/* map and unmap may block for milliseconds or more (opening a CUDA IPC
	 * handle can create a context): call them off the loop thread. */
	bool blocking;
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
extern const struct mem_ops mem_cuda_ops; /* builds with CUDA only */

/* A device UUID as nvidia-smi -L names it: "GPU-xxxxxxxx-xxxx-xxxx-xxxx-
 * xxxxxxxxxxxx". */
static inline const char *mem_uuid_str(const uint8_t u[MEM_CUDA_UUID_BYTES], char buf[48])
{
	snprintf(buf, 48,
		 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0],
		 u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13],
		 u[14], u[15]);
	return buf;
}

#endif
