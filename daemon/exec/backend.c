/*
 * backend.c — the backends a job can be served by, each a set of ops tables
 * (backend.h's struct backend). A job picks its backend when it starts, from the kind of
 * buffers its ranks registered: shm buffers mean host; over several nodes,
 * host with gloo between them.
 */
#include "coll/coll.h"
#include "exec/backend.h"
#include "optim/optim.h"

const struct backend backend_host = {
	.name = "host",
	.coll = &coll_host_ops,
	.optim = &optim_cpu_ops,
	.low_precision = true,
};

const struct backend backend_host_multi = {
	.name = "host+gloo",
#ifdef ZEROD_HAVE_GLOO
	.coll = &coll_gloo_ops,
#endif
	.optim = &optim_cpu_ops,
};
