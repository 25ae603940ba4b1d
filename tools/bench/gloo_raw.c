/*
 * gloo_raw.c — beside the anchor of `zerod-bench --daemons N` (torch's gloo
 * all_reduce, independent of zerod), not the anchor itself, since it goes
 * through code under test: gloo's all-reduce through the daemon's shim
 * (daemon/coll/gloo_shim.h; gloo_shim_iter_ms) between N
 * forked processes on loopback, over the same bytes as the zerod job: every
 * iteration all-reduces each bucket in turn, and is timed from the first
 * bucket's start to the last one's end. The processes meet through a file
 * store in a fresh directory (tests/multinode/filestore.c), as test-gloo's
 * do. Built only where gloo is (meson's have_gloo).
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"
#include "coll/gloo_shim.h"
#include "filestore.h"

struct raw_shared {
	int err[64];
	char msg[200];
	double t[]; /* node 0's samples, ns */
};

static int raw_node(int node, const struct bench_cfg *cfg, uint32_t nodes, const char *dir,
		    struct raw_shared *sh)
{
	struct coll_store store = filestore_new(dir);
	struct gloo_shim_config gc = {.rank = node,
				      .size = (int)nodes,
				      .host = "127.0.0.1",
				      .prefix = "bench-raw",
				      .store = &store,
				      .timeout_ms = 60000};
	struct gloo_shim *s = NULL;
	float *buf = NULL;
	char err[200] = "";
	uint32_t tag = 0;
	int r;

	r = posix_memalign((void **)&buf, 64, cfg->params * sizeof(float)) ? -ENOMEM : 0;
	if (r == 0)
		r = gloo_shim_open(&gc, &s, err, sizeof(err));
	for (int i = 0; r == 0 && i < cfg->warmup + cfg->iters; i++) {
		int64_t t0;

		for (uint64_t x = 0; x < cfg->params; x++)
			buf[x] = 1e-3f * (float)(node + 1);
		t0 = bench_ns();
		for (uint32_t b = 0; r == 0 && b < cfg->nbuckets; b++) {
			uint64_t off = (uint64_t)b * cfg->bucket_numel;
			uint64_t n = cfg->params - off < cfg->bucket_numel ? cfg->params - off
									   : cfg->bucket_numel;
			r = gloo_shim_allreduce_sum(s, tag++, buf + off, n, err, sizeof(err));
		}
		if (r == 0 && i >= cfg->warmup && node == 0)
			sh->t[i - cfg->warmup] = (double)(bench_ns() - t0);
	}
	if (r < 0) {
		sh->err[node] = r;
		snprintf(sh->msg, sizeof(sh->msg), "node %d: %s", node, err);
	}
	gloo_shim_close(s);
	free(buf);
	filestore_free(&store);
	return r < 0;
}

int gloo_raw_allreduce(uint32_t nodes, const struct bench_cfg *cfg, double *ret_ms)
{
	size_t size = sizeof(struct raw_shared) + (size_t)cfg->iters * sizeof(double);
	char dir[64] = "/tmp/zerod-bench-gloo.XXXXXX";
	struct raw_shared *sh;
	pid_t pids[64] = {0};
	int r = 0;

	if (nodes > 64)
		return -EINVAL;
	sh = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED)
		return -errno;
	if (!mkdtemp(dir)) {
		r = -errno;
		goto out;
	}
	signal(SIGPIPE, SIG_IGN);
	fflush(stdout);
	fflush(stderr);
	for (uint32_t k = 0; k < nodes; k++) {
		pids[k] = fork();
		if (pids[k] == 0)
			_exit(raw_node((int)k, cfg, nodes, dir, sh));
		if (pids[k] < 0) {
			r = -errno;
			break;
		}
	}
	for (uint32_t k = 0; k < nodes; k++) {
		int st;

		if (pids[k] > 0 && waitpid(pids[k], &st, 0) == pids[k] &&
		    (!WIFEXITED(st) || WEXITSTATUS(st) != 0) && r == 0)
			r = sh->err[k] ? sh->err[k] : -ECHILD;
	}
	if (r < 0)
		fprintf(stderr, "zerod-bench: raw gloo: %s\n", sh->msg);
	else
		*ret_ms = bench_quantile(sh->t, (size_t)cfg->iters, 0.5) / 1e6;
	bench_rmdir(dir);
out:
	munmap(sh, size);
	return r;
}
