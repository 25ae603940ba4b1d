/*
 * backend_cuda.c — the cuda backend (NCCL collectives, CUDA optimizer
 * kernels over CUDA IPC buffers) and the start-up probe that decides whether
 * this daemon can offer it (backend.h). Built only with the CUDA toolkit;
 * backend_nocuda.c stands in otherwise.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec/backend.h"
#include "coll/coll.h"
#include "base/cudacheck.h"
#include "mem/mem.h"
#include "optim/optim.h"

const struct backend backend_cuda = {
	.name = "cuda",
	.coll = &coll_nccl_ops,
	.optim = &optim_cuda_ops,
	.mem = &mem_cuda_ops,
	/* fp32 masters on the owners' devices, lowp.h's rounding (optim/cuda.c) */
	.low_precision = true,
};

/* NCCL 2.18: non-blocking communicators (2.14) and ncclCommSplit (2.18). */
#define NCCL_NEEDED NCCL_VERSION(2, 18, 0)

int cuda_probe(char *why, size_t len)
{
	const char *visible = getenv("CUDA_VISIBLE_DEVICES");
	int n = 0, drv = 0, rt = 0, nv = 0;
	cudaError_t e;

	(void)cudaRuntimeGetVersion(&rt);
	e = cudaGetDeviceCount(&n);
	if (e == cudaErrorInsufficientDriver) {
		/* 35: no driver at all, or one older than our runtime */
		(void)cudaGetLastError();
		if (cudaDriverGetVersion(&drv) != cudaSuccess || drv == 0)
			snprintf(why, len,
				 "no CUDA driver on this machine (cudaGetDeviceCount: %s)",
				 cudaGetErrorName(e));
		else
			snprintf(why, len,
				 "the CUDA driver (%d.%d) is older than zerod's CUDA runtime "
				 "(%d.%d)",
				 drv / 1000, drv % 1000 / 10, rt / 1000, rt % 1000 / 10);
		return -ENODEV;
	}
	if (e == cudaErrorNoDevice || (e == cudaSuccess && n <= 0)) {
		(void)cudaGetLastError();
		snprintf(why, len, "no CUDA device visible (CUDA_VISIBLE_DEVICES=%s)",
			 visible ? visible : "unset");
		return -ENODEV;
	}
	if (e != cudaSuccess) {
		snprintf(why, len, "cudaGetDeviceCount: %s (%s)", cudaGetErrorString(e),
			 cudaGetErrorName(e));
		return cuda_fail(e, "cudaGetDeviceCount", __FILE__, __LINE__);
	}
	if (ncclGetVersion(&nv) != ncclSuccess || nv < NCCL_NEEDED) {
		snprintf(why, len,
			 "NCCL %d.%d.%d is older than 2.18 (non-blocking communicators, "
			 "ncclCommSplit)",
			 nv / 10000, nv / 100 % 100, nv % 100);
		return -EOPNOTSUPP;
	}
	(void)cudaDriverGetVersion(&drv);
	snprintf(why, len, "%d CUDA device%s, driver %d.%d, runtime %d.%d, NCCL %d.%d.%d", n,
		 n == 1 ? "" : "s", drv / 1000, drv % 1000 / 10, rt / 1000, rt % 1000 / 10,
		 nv / 10000, nv / 100 % 100, nv % 100);
	return n;
}

int backend_choose(const char *choice, const struct backend **ret_cuda, char *why, size_t len)
{
	char found[256];
	int n;

	if (strcmp(choice, "host") == 0) {
		snprintf(why, len, "host only (--backend host)");
		*ret_cuda = NULL;
		return 0;
	}
	if (strcmp(choice, "cuda") != 0 && strcmp(choice, "auto") != 0) {
		snprintf(why, len, "unknown backend \"%s\" (auto, host or cuda)", choice);
		return -EINVAL;
	}
	n = cuda_probe(found, sizeof(found));
	if (n > 0) {
		snprintf(why, len, "cuda and host: %s", found);
		*ret_cuda = &backend_cuda;
		return 0;
	}
	if (strcmp(choice, "cuda") == 0) {
		snprintf(why, len, "--backend cuda: %s", found);
		return n;
	}
	snprintf(why, len, "host only: %s", found);
	*ret_cuda = NULL;
	return 0;
}
