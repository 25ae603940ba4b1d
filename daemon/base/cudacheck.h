/*
 * cudacheck.h — where CUDA runtime and NCCL errors become zerod's: every call
 * into either library goes through one of these macros, which turn the
 * foreign code into a negative errno once (cuda_errno, nccl_errno), leave a
 * debug-level breadcrumb naming the call, its file and line, and leave the
 * function: *_TRY returns the code, *_GOTO stores it in r and jumps to a
 * cleanup label (forward only).
 *
 * Non-blocking NCCL communicators answer ncclInProgress for calls that
 * complete later; the NCCL macros let it through, and the caller polls
 * ncclCommGetAsyncError (coll/nccl.c).
 *
 * Only the CUDA backend's files include this (they are built only where the
 * toolkit is).
 */
#ifndef ZEROD_CUDACHECK_H
#define ZEROD_CUDACHECK_H

#include <cuda_runtime_api.h>
#include <nccl.h>

/* -ENOMEM, -ENODEV (no driver, no or bad device), -EFAULT (illegal address:
 * a buffer vanished), -EINVAL, -EBADF (stale IPC handle), else -EIO. */
int cuda_errno(cudaError_t e);
/* -EINVAL (invalid argument or usage), -ECONNRESET (a peer failed), else -EIO. */
int nccl_errno(ncclResult_t e);

/* Log the breadcrumb, clear CUDA's sticky last error, return the errno. */
int cuda_fail(cudaError_t e, const char *call, const char *file, int line);
int nccl_fail(ncclResult_t e, const char *call, const char *file, int line);

#define CUDA_TRY(call)                                                                             \
	do {                                                                                       \
		cudaError_t cuda_e_ = (call);                                                      \
		if (cuda_e_ != cudaSuccess)                                                        \
			return cuda_fail(cuda_e_, #call, __FILE__, __LINE__);                      \
	} while (0)

#define CUDA_GOTO(call, r, label)                                                                  \
	do {                                                                                       \
		cudaError_t cuda_e_ = (call);                                                      \
		if (cuda_e_ != cudaSuccess) {                                                      \
			(r) = cuda_fail(cuda_e_, #call, __FILE__, __LINE__);                       \
			goto label;                                                                \
		}                                                                                  \
	} while (0)

#define NCCL_TRY(call)                                                                             \
	do {                                                                                       \
		ncclResult_t nccl_e_ = (call);                                                     \
		if (nccl_e_ != ncclSuccess && nccl_e_ != ncclInProgress)                           \
			return nccl_fail(nccl_e_, #call, __FILE__, __LINE__);                      \
	} while (0)

#define NCCL_GOTO(call, r, label)                                                                  \
	do {                                                                                       \
		ncclResult_t nccl_e_ = (call);                                                     \
		if (nccl_e_ != ncclSuccess && nccl_e_ != ncclInProgress) {                         \
			(r) = nccl_fail(nccl_e_, #call, __FILE__, __LINE__);                       \
			goto label;                                                                \
		}                                                                                  \
	} while (0)

#endif
