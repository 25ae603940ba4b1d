/*
 * backend.h — which backends the daemon offers, decided once at start from
 * --backend auto|host|cuda, and what a backend is (struct backend; the
 * backends themselves: backend.c, backend_cuda.c).
 *
 * Every build has these functions: with the CUDA toolkit they come from
 * backend_cuda.c, without it from backend_nocuda.c, which says so.
 */
#ifndef ZEROD_BACKEND_H
#define ZEROD_BACKEND_H

#include <stdbool.h>
#include <stddef.h>

struct coll_ops;
struct optim_ops;
struct mem_ops;

/* What serves a job's data plane; chosen per job. */
struct backend {
	const char *name;
	const struct coll_ops *coll;
	const struct optim_ops *optim;
	/* the buffers jobs of this backend register: NULL for host jobs,
	 * whose buffers are the core's mem (memfds), mapped at registration; else mapped by
	 * the executor's start (they may block) */
	const struct mem_ops *mem;
	/* serves bf16/fp16 buckets (fp32 masters, zeroclient.h's rounding);
	 * a plan with such buckets on another backend is refused (ZC_ENOTSUP) */
	bool low_precision;
};

extern const struct backend backend_host;
/* A host job over several nodes: gloo across them (coll NULL in a build
 * without gloo: such jobs are refused). */
extern const struct backend backend_host_multi;

/* NCCL collectives, CUDA kernels (backend_cuda.c; builds with CUDA only). */
extern const struct backend backend_cuda;

/* How many CUDA devices this process can use, or a negative code: -ENODEV
 * (no driver, a driver older than the runtime, no visible device),
 * -EOPNOTSUPP (NCCL too old, or a build without CUDA), another -errno.
 * why (len bytes) says what was found either way. Never crashes without a
 * GPU. Any thread; it may take a while (it loads the driver): not on the
 * loop thread once jobs run. */
int cuda_probe(char *why, size_t len);

/* --backend: "host" never uses CUDA; "cuda" requires it (an error without a
 * usable device); "auto" uses CUDA when a device is visible, else host.
 * On success *ret_cuda is the backend for jobs with CUDA buffers, or NULL
 * when this daemon serves host buffers only, and why says what was found
 * (for the start-up log). Else a negative code (cuda_probe's, or -EINVAL
 * for an unknown choice) with why saying why, and *ret_cuda untouched. */
int backend_choose(const char *choice, const struct backend **ret_cuda, char *why, size_t len);

#endif
