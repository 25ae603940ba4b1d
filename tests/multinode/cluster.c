/*
 * cluster.c — starting and stopping the zerods of a multinode case
 * (cluster.h); the cases own what they run on them.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "cluster.h"
#include "testlib.h"

int cluster_start(struct cluster *cl, uint32_t n, const struct cluster_opts *o)
{
	char stall[16], join[16], hello[16];

	snprintf(stall, sizeof(stall), "%d", test_timeout(o->stall_ms));
	snprintf(join, sizeof(join), "%d", test_timeout(o->join_ms));
	snprintf(hello, sizeof(hello), "%d", test_timeout(o->hello_ms));
	memset(cl, 0, sizeof(*cl));
	cl->n = n;
	for (uint32_t k = 0; k < n; k++) {
		const char *args[24] = {"--workers", "2"};
		int a = 2, r;

		if (o->stall_ms) {
			args[a++] = "--stall-timeout";
			args[a++] = stall;
		}
		if (o->join_ms) {
			args[a++] = "--join-timeout";
			args[a++] = join;
		}
		if (o->hello_ms) {
			args[a++] = "--hello-timeout";
			args[a++] = hello;
		}
		if (o->tls_key && o->tls_key[k]) {
			args[a++] = "--tls-key";
			args[a++] = o->tls_key[k];
			args[a++] = "--tls-cert";
			args[a++] = o->tls_cert[k];
			args[a++] = "--tls-peers";
			args[a++] = o->tls_peers[k];
		}
		if (o->rejoin) {
			args[a++] = "--rejoin-timeout";
			args[a++] = o->rejoin;
		}
		args[a] = NULL;
		r = zd_start(&cl->zd[k], args);
		if (r < 0)
			return r;
		cl->socks[k] = cl->zd[k].sock;
	}
	cl->port = zd_free_port();
	snprintf(cl->rdzv, sizeof(cl->rdzv), "127.0.0.1:%d", cl->port);
	return cl->port > 0 ? 0 : -EADDRINUSE;
}

void cluster_stop(struct cluster *cl, int killed)
{
	if (test_failed_)
		for (uint32_t k = 0; k < cl->n; k++) {
			printf("# ---- daemon %u ----\n", k);
			zd_dump_log(&cl->zd[k]);
		}
	for (uint32_t k = 0; k < cl->n; k++) {
		int st;
		if (cl->zd[k].pid <= 0)
			continue;
		st = zd_stop(&cl->zd[k], 10000);
		if ((int)k == killed)
			CHECK(st == 128 + SIGKILL, "daemon %u: exit %d, not SIGKILL", k, st);
		else
			CHECK(st == 0, "daemon %u exited with %d after SIGTERM", k, st);
	}
}

struct train_result *cluster_results(void)
{
	return test_shared(CLUSTER_MAXW * sizeof(struct train_result));
}

struct train_spec cluster_spec(const char *job, uint32_t world, uint32_t nnodes,
			       const char *rdzv, const char *const *socks,
			       const uint32_t *node_of)
{
	return (struct train_spec){
		.job = job,
		.world = world,
		.optimizer = ZC_OPT_SGD,
		.shard_mode = ZC_SHARD_BUCKET,
		.step_mode = ZC_STEP_INTERLEAVED,
		.iters = 4,
		.seed = 7,
		.hyper_iter = -1,
		.rdzv = rdzv,
		.nnodes = nnodes,
		.secret = "correct horse battery staple",
		.node_of = node_of,
		.explicit_nodes = true,
		.sockets = socks,
		.plan_variant_node = -1,
		.die_rank = -1,
		.die_iter = -1,
		.results = cluster_results(),
	};
}
