/*
 * cluster.h — N real zerods on loopback for the multinode tests
 * (test_nodes.c, test_curve.c, test_sharednodes.c): each on its own socket,
 * with short clocks or zerod's own, optionally with TLS identities, and a
 * rendezvous address on a port picked free for the case, so parallel runs
 * never collide.
 */
#ifndef ZEROD_TEST_CLUSTER_H
#define ZEROD_TEST_CLUSTER_H

#include <stdint.h>

#include "harness.h"
#include "trainer.h"

#define CLUSTER_MAXN 3
#define CLUSTER_MAXW 8 /* ranks of a job, for cluster_results() */

struct cluster {
	struct zd zd[CLUSTER_MAXN];
	const char *socks[CLUSTER_MAXN]; /* zd[k].sock, for train_spec.sockets */
	uint32_t n;
	int port;      /* the rendezvous port, free when started */
	char rdzv[32]; /* "127.0.0.1:port" */
};

/* How to start the daemons: --stall-timeout, --join-timeout and
 * --hello-timeout in ms (before test_timeout() scales them; 0: zerod's
 * default); daemon k with
 * a TLS identity when tls_key[k] is a key file (tls_cert[k] its certificate,
 * tls_peers[k] its peers file), the jobs' PSKs when tls_key or tls_key[k] is
 * NULL. */
struct cluster_opts {
	int stall_ms, join_ms, hello_ms;
	const char *const *tls_key;
	const char *const *tls_cert;
	const char *const *tls_peers;
	const char *rejoin; /* --rejoin-timeout (ms, as given); NULL: zerod's default */
};

/* Start n (<= CLUSTER_MAXN) daemons, each with "--workers 2". 0 or -errno;
 * on failure the daemons started are left running (the case's process
 * exit ends them). */
int cluster_start(struct cluster *cl, uint32_t n, const struct cluster_opts *o);

/* Dump every daemon's log if the case failed, then stop each (one whose pid
 * is gone is skipped) and CHECK its exit: 0 after SIGTERM, or SIGKILL for
 * daemon `killed` (-1: none), which the case killed. */
void cluster_stop(struct cluster *cl, int killed);

/* [CLUSTER_MAXW] results in memory shared with the ranks a case spawns. */
struct train_result *cluster_results(void);

/* The multinode cases' job: `world` ranks of SGD (bucket shard, interleaved
 * step, 4 iterations, seed 7) over the nnodes zerods at socks, through the
 * rendezvous at rdzv; rank r on node node_of[r], named explicitly; its
 * results from cluster_results(). Cases change the fields they test. */
struct train_spec cluster_spec(const char *job, uint32_t world, uint32_t nnodes,
			       const char *rdzv, const char *const *socks,
			       const uint32_t *node_of);

#endif
