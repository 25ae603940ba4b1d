/*
 * cudadouble.h — the controls of the CUDA runtime + NCCL test double
 * (cudadouble.c). Tests only: the double is never installed and never linked
 * into zerod (tests/meson.build; the no-double-in-zerod test checks it).
 */
#ifndef ZEROD_CUDADOUBLE_H
#define ZEROD_CUDADOUBLE_H

#include <stdbool.h>
#include <stdint.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

struct cudadouble_config {
	int ndevices;              /* 0: cudaGetDeviceCount fails with count_error */
	cudaError_t count_error;   /* 0: cudaErrorInsufficientDriver (35), as without a driver */
	int driver_version;        /* cudaDriverGetVersion (0: no driver installed) */
	int nccl_version;          /* ncclGetVersion; 0: the headers' */
	unsigned inprogress_polls; /* non-blocking NCCL: ncclCommGetAsyncError polls an
				    * init, split, finalize or group of collectives
				    * answers ncclInProgress before it takes effect */
	unsigned jitter_us;        /* each stream task first sleeps up to this long */
	unsigned seed;             /* for the jitter */
	bool shm_cliques;          /* NCCL cliques meet across processes in /dev/shm
				    * (ZEROD_CUDADOUBLE_SHM=1 in a process that never
				    * calls cudadouble_reset()) */
	unsigned pageable_land_us; /* a pageable cudaMemcpy to the device lands this
				    * long after it returns (0: 3 ms) */
};

struct cudadouble_stats {
	unsigned violations; /* misuse the double caught; first_violation says which */
	char first_violation[256];
	unsigned kernels;     /* optimizer launches run */
	unsigned host_funcs;  /* host functions run */
	unsigned collectives; /* collective parts queued on streams */
	unsigned waiting;     /* collective parts now waiting for their peers */
	unsigned live_allocs; /* cudaMalloc'd, not freed */
	unsigned live_streams;
	unsigned live_comms; /* neither destroyed nor aborted */
	unsigned ipc_open;   /* IPC handles opened, not closed */
	/* cudaMalloc/cudaMallocHost and cudaFree/cudaFreeHost calls made while
	 * any stream had work queued (a step running: CUDA's frees wait for the
	 * whole device, and none belongs in a step); first_busy names the
	 * first */
	unsigned mallocs_busy, frees_busy;
	char first_busy[160];
};

/* Start over with cfg: every stream and communicator of the last run must
 * be gone (a violation otherwise); memory and cliques are freed. */
void cudadouble_reset(const struct cudadouble_config *cfg);

void cudadouble_stats(struct cudadouble_stats *ret);

/* The UUID the double gives device dev. */
void cudadouble_uuid(int dev, uint8_t ret[16]);

/* The allocation holding p stays usable here, but IPC handles of it no
 * longer open anywhere (as a handle of memory freed since): its memfd is
 * closed. */
void cudadouble_ipc_revoke(void *p);

/* Every live communicator of job rank `rank` reports err from now on
 * (ncclCommGetAsyncError), as when its peer or network fails; its
 * collectives keep waiting until it is aborted, as NCCL's do. */
void cudadouble_nccl_fail(int rank, ncclResult_t err);

#endif
