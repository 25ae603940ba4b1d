/*
 * backend_nocuda.c — backend.h for a zerod built without the CUDA toolkit
 * (-Dcuda=disabled, or no toolkit with NCCL found): host only, and
 * --backend cuda says why not.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "exec/backend.h"

int cuda_probe(char *why, size_t len)
{
	snprintf(why, len,
		 "zerod was built without CUDA (no toolkit with NCCL, or -Dcuda=disabled)");
	return -EOPNOTSUPP;
}

int backend_choose(const char *choice, const struct backend **ret_cuda, char *why, size_t len)
{
	char found[128];
	int r = cuda_probe(found, sizeof(found));

	if (strcmp(choice, "cuda") == 0) {
		snprintf(why, len, "--backend cuda: %s", found);
		return r;
	}
	if (strcmp(choice, "host") != 0 && strcmp(choice, "auto") != 0) {
		snprintf(why, len, "unknown backend \"%s\" (auto, host or cuda)", choice);
		return -EINVAL;
	}
	snprintf(why, len, "host only: %s", found);
	*ret_cuda = NULL;
	return 0;
}
