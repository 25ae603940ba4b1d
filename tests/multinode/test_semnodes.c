/*
 * test_semnodes.c — torch's semantics over two real zerods on loopback (one
 * rank each, so the documented summation order is the single-node one and
 * semtrain.c's reference holds): a segment is skipped only if the ranks of
 * every node mark it (the masks meet in the executor's gather), the global
 * gradient norm and per-group norms cover both nodes' shards, a non-finite
 * gradient on one node skips the step on both, and nodes that disagree on
 * the grad scale fail the job, named.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"
#include "semtrain.h"
#include "testlib.h"

#define NN 2

struct cluster {
	struct zd zd[NN];
	const char *socks[NN];
	char rdzv[32];
};

static int rank_main(void *arg, int idx)
{
	return sem_rank(arg, (uint32_t)idx);
}

static const uint32_t node_of[2] = {0, 1};

static void run(struct sem_spec *s)
{
	struct cluster cl;
	char stall[16];
	const char *const args[] = {"--stall-timeout", stall, "--workers", "2", NULL};
	pid_t pids[2];
	int port;

	memset(&cl, 0, sizeof(cl));
	snprintf(stall, sizeof(stall), "%d", test_timeout(8000));
	for (int k = 0; k < NN; k++) {
		REQUIRE(zd_start(&cl.zd[k], args) == 0, "zerod %d did not start", k);
		cl.socks[k] = cl.zd[k].sock;
	}
	port = zd_free_port();
	REQUIRE(port > 0, "no free port");
	snprintf(cl.rdzv, sizeof(cl.rdzv), "127.0.0.1:%d", port);
	s->rdzv = cl.rdzv;
	s->nnodes = NN;
	s->sockets = cl.socks;
	s->node_of = node_of;
	for (uint32_t r = 0; r < 2; r++)
		pids[r] = spawn(rank_main, s, (int)r);
	for (uint32_t r = 0; r < 2; r++) {
		int st = wait_child(pids[r], 90000);
		CHECK(st == 0, "%s rank %u exited with %d", s->job, r, st);
	}
	for (int k = 0; k < NN; k++) {
		if (test_failed_) {
			printf("# ---- daemon %d ----\n", k);
			zd_dump_log(&cl.zd[k]);
		}
		int st = zd_stop(&cl.zd[k], 10000);
		CHECK(st == 0, "daemon %d exited with %d after SIGTERM", k, st);
	}
}

/* Masks (some segments unused on one node only, some on both), a global
 * clip and a grad scale: bucket mode, at_end. */
static void t_masks_clip_scale_bucket_at_end(void)
{
	struct sem_spec s;

	sem_spec_init(&s, "nodes-mcs", 2);
	s.opt = ZC_OPT_ADAM;
	s.masks = true;
	s.scale = true;
	s.max_grad_norm = 5.0;
	s.tolerance = 1e-6;
	run(&s);
}

/* Masks in interleaved mode: each bucket's step waits for both nodes' word. */
static void t_masks_slice_interleaved(void)
{
	struct sem_spec s;

	sem_spec_init(&s, "nodes-msi", 2);
	s.opt = ZC_OPT_SGD;
	s.shard = ZC_SHARD_SLICE;
	s.step = ZC_STEP_INTERLEAVED;
	s.hp[0].momentum = 0.9;
	s.masks = true;
	run(&s);
}

/* Per-group clipping over both nodes' shards, and +inf on node 1 at
 * iteration 2: neither node steps it. */
static void t_group_clip_found_inf_slice_at_end(void)
{
	struct sem_spec s;

	sem_spec_init(&s, "nodes-gci", 2);
	s.opt = ZC_OPT_ADAMW;
	s.shard = ZC_SHARD_SLICE;
	s.scale = true;
	s.inf_rank = 1;
	s.inf_iter = 2;
	s.hp[0].max_grad_norm = 3.0;
	s.hp[1].max_grad_norm = 100.0;
	s.tolerance = 1e-6;
	run(&s);
}

static void t_nodes_disagree_on_the_scale(void)
{
	struct sem_spec s;

	sem_spec_init(&s, "nodes-scale", 2);
	s.scale = true;
	s.scale_odd_rank = 1;
	s.expect_code = ZC_EHYPER;
	s.expect_msg = "the nodes disagree on the grad scale";
	run(&s);
}

#define C(name)                                                                                    \
	{                                                                                          \
#name, t_##name, 120000                                                            \
	}
static const struct test_case cases[] = {
	C(masks_clip_scale_bucket_at_end),
	C(masks_slice_interleaved),
	C(group_clip_found_inf_slice_at_end),
	C(nodes_disagree_on_the_scale),
};

int main(int argc, char **argv)
{
	signal(SIGPIPE, SIG_IGN);
	return test_main(cases, sizeof(cases) / sizeof(cases[0]), argc, argv);
}
