/*
 * test_sharednodes.c — shared parameter buffers (ZC_BUFFERS_SHARED_PARAMS)
 * on a job over several nodes: two real zerod daemons on loopback, each
 * with its own socket, the rendezvous on a port picked free, one trainer
 * rank on each node (tests/integration/trainer.c) registering its own
 * memfds with the flag. Each node refuses its rank with ZC_ENOTSUP naming
 * "several nodes" (each node would need its own shared buffer: not yet),
 * and then a job without the flag over the same two daemons trains to the
 * reference.
 *
 * In the multinode suite: it needs the gloo backend.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cluster.h"
#include "harness.h"
#include "testlib.h"
#include "trainer.h"

#define NODES 2

/* The buffers hook: a memfd of its own per rank (gradients at 0, the
 * parameters a page-rounded offset after), registered with the flag. */
static int shared_buffers(zc_client *c, const struct zc_plan *plan, uint32_t rank)
{
	struct zc_buffers b = ZC_BUFFERS_INIT;
	uint64_t bytes = 0;
	int fd, r;

	(void)rank;
	if ((r = zc_plan_buffer_bytes(plan, &bytes)) < 0)
		return r;
	b.param_offset = (bytes + 4095) / 4096 * 4096;
	fd = memfd_create("test-sharednodes", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0 || ftruncate(fd, (off_t)(b.param_offset + bytes)) < 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) < 0) {
		r = -errno;
		if (fd >= 0)
			close(fd);
		return r;
	}
	b.grad_fd = b.param_fd = fd;
	b.flags = ZC_BUFFERS_SHARED_PARAMS;
	r = zc_register_buffers(c, plan, &b);
	close(fd);
	return r;
}

static const struct train_hooks shared_hooks = {.buffers = shared_buffers};

static int rank_main(void *arg, int idx)
{
	return train_rank(arg, (uint32_t)idx);
}

static void t_several_nodes_refuse_shared_params(void)
{
	static const uint32_t node_of[NODES] = {0, 1};
	const struct cluster_opts defaults = {0};
	struct cluster cl;
	pid_t pids[NODES];
	int st[NODES];

	REQUIRE(cluster_start(&cl, NODES, &defaults) == 0, "cannot start the zerods");

	struct train_spec s = cluster_spec("shared-nodes", NODES, NODES, cl.rdzv, cl.socks, node_of);
	struct train_result *res = s.results;

	s.hooks = &shared_hooks;
	for (int r = 0; r < NODES; r++)
		pids[r] = spawn(rank_main, &s, r);
	for (int r = 0; r < NODES; r++)
		st[r] = wait_child(pids[r], 60000);
	/* Each node refuses its own rank as it registers; a rank that comes
	 * to register only after the other node's refused rank left finds
	 * the job failed by that instead (ZC_ERANKDEAD): at least one is
	 * refused, and none trains. */
	int refused = 0;
	for (int r = 0; r < NODES; r++) {
		bool named = res[r].code == ZC_ENOTSUP && strstr(res[r].msg, "several nodes");

		printf("# rank %d (node %u): %s: %s\n", r, node_of[r],
		       zc_strerror_name(res[r].code), res[r].msg);
		CHECK(st[r] != 0 && res[r].iterations == 0,
		      "rank %d trained with shared parameters over several nodes", r);
		CHECK(named || (res[r].code == ZC_ERANKDEAD && strstr(res[r].msg, "left the job")),
		      "rank %d: %s, neither ZC_ENOTSUP naming several nodes nor the other node's "
		      "rank gone",
		      r, zc_strerror_name(res[r].code));
		refused += named;
	}
	CHECK(refused > 0, "no rank was refused with ZC_ENOTSUP naming several nodes");

	/* the daemons are unharmed: the same job without the flag trains */
	s.job = "own-nodes";
	s.hooks = NULL;
	s.results = cluster_results();
	for (int r = 0; r < NODES; r++)
		pids[r] = spawn(rank_main, &s, r);
	for (int r = 0; r < NODES; r++)
		st[r] = wait_child(pids[r], 60000);
	for (int r = 0; r < NODES; r++)
		CHECK(st[r] == 0 && s.results[r].iterations == s.iters,
		      "rank %d of the job without the flag: exit %d after %d iterations: %s", r,
		      st[r], s.results[r].iterations, s.results[r].msg);

	cluster_stop(&cl, -1);
}

static const struct test_case cases[] = {
	{"several_nodes_refuse_shared_params", t_several_nodes_refuse_shared_params, 90000},
};

TEST_MAIN(cases)
