/*
 * cudacheck.c — the CUDA and NCCL error conversions behind cudacheck.h.
 */
#include <errno.h>

#include "base/cudacheck.h"
#include "base/log.h"

int cuda_errno(cudaError_t e)
{
	switch (e) {
	case cudaSuccess:
		return 0;
	case cudaErrorMemoryAllocation:
		return -ENOMEM;
	case cudaErrorInsufficientDriver:
	case cudaErrorNoDevice:
	case cudaErrorInvalidDevice:
	case cudaErrorDevicesUnavailable:
		return -ENODEV;
	case cudaErrorIllegalAddress:
	case cudaErrorInvalidDevicePointer:
		return -EFAULT;
	case cudaErrorInvalidValue:
		return -EINVAL;
	case cudaErrorInvalidResourceHandle:
		return -EBADF;
	default:
		return -EIO;
	}
}

int nccl_errno(ncclResult_t e)
{
	switch (e) {
	case ncclSuccess:
		return 0;
	case ncclInvalidArgument:
	case ncclInvalidUsage:
		return -EINVAL;
	case ncclRemoteError:
		return -ECONNRESET;
	case ncclInProgress:
		return -EINPROGRESS;
	default:
		return -EIO;
	}
}

int cuda_fail(cudaError_t e, const char *call, const char *file, int line)
{
	/* the runtime keeps the last error per thread; a later, unrelated
	 * cudaGetLastError() must not report this one again */
	(void)cudaGetLastError();
	log_debug("%s:%d: %s: %s (%s)", file, line, call, cudaGetErrorString(e),
		  cudaGetErrorName(e));
	return cuda_errno(e);
}

int nccl_fail(ncclResult_t e, const char *call, const char *file, int line)
{
	log_debug("%s:%d: %s: %s (%s)", file, line, call, ncclGetErrorString(e),
		  ncclGetLastError(NULL));
	return nccl_errno(e);
}
