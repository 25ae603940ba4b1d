/*
 * demo_trainer.c — one rank of the demo job: a two-layer MLP classifier on
 * synthetic data, trained data-parallel through zerod with AdamW.
 *
 * The data: inputs x ~ U(-1, 1)^16, labels from a fixed random "teacher"
 * (argmax of a linear map), so the task is learnable. Every rank draws its
 * own batches (seeded by rank and iteration). Backward produces the output
 * layer's gradients first: that is bucket 0, handed to zerod while the
 * hidden layer's gradients (bucket 1) are still being computed.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zeroclient.h"

#define D 16 /* inputs */
#define H 64 /* hidden units */
#define C 4  /* classes */
#define B 64 /* batch per rank */

static uint64_t rng_next(uint64_t *s)
{
	/* splitmix64 */
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static float rng_uniform(uint64_t *s)
{
	return (float)((rng_next(s) >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

struct model {
	float *w1, *b1; /* [H][D], [H] */
	float *w2, *b2; /* [C][H], [C] */
};

struct grads {
	float *w1, *b1, *w2, *b2;
};

static float teacher[C][D];

static void make_batch(uint64_t seed, float x[B][D], int y[B])
{
	uint64_t s = seed;

	for (int i = 0; i < B; i++) {
		float best = -INFINITY;
		for (int k = 0; k < D; k++)
			x[i][k] = rng_uniform(&s);
		for (int c = 0; c < C; c++) {
			float z = 0;
			for (int k = 0; k < D; k++)
				z += teacher[c][k] * x[i][k];
			if (z > best) {
				best = z;
				y[i] = c;
			}
		}
	}
}

/* Forward + backward on one batch; gradients of the mean cross-entropy. The
 * output layer's gradients are complete before the hidden layer's, and
 * `ready` is called between them, as a DDP hook would be. */
static float train_batch(const struct model *m, struct grads *g, float x[B][D], const int y[B],
			 void (*ready)(void *arg, int bucket), void *arg)
{
	static float h[B][H], p[B][C], dh[B][H];
	float loss = 0;

	for (int i = 0; i < B; i++) {
		float mx = -INFINITY, sum = 0;
		for (int j = 0; j < H; j++) {
			float z = m->b1[j];
			for (int k = 0; k < D; k++)
				z += m->w1[j * D + k] * x[i][k];
			h[i][j] = z > 0 ? z : 0;
		}
		for (int c = 0; c < C; c++) {
			float z = m->b2[c];
			for (int j = 0; j < H; j++)
				z += m->w2[c * H + j] * h[i][j];
			p[i][c] = z;
			mx = fmaxf(mx, z);
		}
		for (int c = 0; c < C; c++)
			sum += p[i][c] = expf(p[i][c] - mx);
		for (int c = 0; c < C; c++)
			p[i][c] /= sum;
		loss -= logf(fmaxf(p[i][y[i]], 1e-12f));
	}
	/* output layer */
	memset(g->w2, 0, sizeof(float) * C * H);
	memset(g->b2, 0, sizeof(float) * C);
	memset(dh, 0, sizeof(dh));
	for (int i = 0; i < B; i++)
		for (int c = 0; c < C; c++) {
			float d = (p[i][c] - (c == y[i])) / B;
			g->b2[c] += d;
			for (int j = 0; j < H; j++) {
				g->w2[c * H + j] += d * h[i][j];
				dh[i][j] += d * m->w2[c * H + j];
			}
		}
	ready(arg, 0);
	/* hidden layer */
	memset(g->w1, 0, sizeof(float) * H * D);
	memset(g->b1, 0, sizeof(float) * H);
	for (int i = 0; i < B; i++)
		for (int j = 0; j < H; j++) {
			float d = h[i][j] > 0 ? dh[i][j] : 0;
			g->b1[j] += d;
			for (int k = 0; k < D; k++)
				g->w1[j * D + k] += d * x[i][k];
		}
	ready(arg, 1);
	return loss / B;
}

struct hook {
	zc_client *c;
	zc_future *f[2];
	int err;
};

static void bucket_ready(void *arg, int bucket)
{
	struct hook *hk = arg;
	int r = zc_bucket_ready(hk->c, (uint32_t)bucket, &hk->f[bucket]);

	if (r < 0 && !hk->err)
		hk->err = r;
}

int main(int argc, char **argv)
{
	struct zc_config cfg = ZC_CONFIG_INIT;
	struct zc_param_group groups[2] = {ZC_PARAM_GROUP_INIT, ZC_PARAM_GROUP_INIT};
	/* every struct says its size (zeroclient.h, "ABI"): a newer libzeroclient
	 * reads this binary's structs as they are */
	const uint32_t ss = sizeof(struct zc_segment), bs = sizeof(struct zc_bucket);
	const struct zc_segment seg0[] = {{.size = ss, .group = 0, .offset = 0, .numel = C * H},
					  {.size = ss, .group = 1, .offset = C * H, .numel = C}};
	const struct zc_segment seg1[] = {{.size = ss, .group = 0, .offset = 0, .numel = H * D},
					  {.size = ss, .group = 1, .offset = H * D, .numel = H}};
	const struct zc_bucket buckets[] = {
		{.size = bs, .nsegments = 2, .numel = C * H + C, .segments = seg0},
		{.size = bs, .nsegments = 2, .numel = H * D + H, .segments = seg1}};
	struct zc_plan plan = {
		.size = sizeof(plan),
		.optimizer = ZC_OPT_ADAMW,
		.shard_mode = ZC_SHARD_BUCKET,
		.step_mode = ZC_STEP_INTERLEAVED,
		.ngroups = 2,
		.groups = groups,
		.nbuckets = 2,
		.buckets = buckets,
	};
	static float x[B][D], ex[B][D];
	static int y[B], ey[B];
	struct model m;
	struct grads g;
	zc_client *c = NULL;
	int iters = 40, opt, r, local_rank = -1, local_size = -1;
	uint64_t s;

	cfg.job_id = "demo";
	while ((opt = getopt(argc, argv, "s:j:r:w:i:m:l:n:")) != -1) {
		switch (opt) {
		case 's':
			cfg.socket = optarg;
			break;
		case 'j':
			cfg.job_id = optarg;
			break;
		case 'r':
			cfg.rank = (uint32_t)atoi(optarg);
			break;
		case 'w':
			cfg.world_size = (uint32_t)atoi(optarg);
			break;
		case 'i':
			iters = atoi(optarg);
			break;
		case 'm':
			plan.shard_mode =
				strcmp(optarg, "slice") == 0 ? ZC_SHARD_SLICE : ZC_SHARD_BUCKET;
			break;
		case 'l':
			local_rank = atoi(optarg);
			break;
		case 'n':
			local_size = atoi(optarg);
			break;
		default:
			fprintf(stderr,
				"usage: zerod-demo-trainer -s SOCKET -r RANK -w WORLD [-j JOB] "
				"[-i ITERS] [-m bucket|slice] [-l LOCAL_RANK -n LOCAL_SIZE]\n"
				"  over several nodes: -l/-n place the rank on its node, and\n"
				"  ZEROD_RDZV, ZEROD_NNODES, ZEROD_JOB_SECRET (ZEROD_NODE_RANK)\n"
				"  name the job's rendezvous\n");
			return 2;
		}
	}
	/* one node unless told: every rank here */
	cfg.local_rank = local_rank >= 0 ? (uint32_t)local_rank : cfg.rank;
	cfg.local_size = local_size > 0 ? (uint32_t)local_size : cfg.world_size;
	groups[0].lr = groups[1].lr = 0.01;
	groups[0].weight_decay = 0.01; /* decay weights, not biases */
	groups[1].weight_decay = 0;

	r = zc_connect(&cfg, &c);
	if (r < 0) {
		fprintf(stderr, "rank %u: connect: %s: %s\n", cfg.rank, zc_strerror_name(r),
			zc_error_message());
		return 1;
	}
	r = zc_alloc_buffers(c, &plan);
	if (r < 0)
		goto fail;
	m = (struct model){.w2 = zc_param_buffer(c, 0),
			   .b2 = zc_param_buffer(c, 0) + C * H,
			   .w1 = zc_param_buffer(c, 1),
			   .b1 = zc_param_buffer(c, 1) + H * D};
	g = (struct grads){.w2 = zc_grad_buffer(c, 0),
			   .b2 = zc_grad_buffer(c, 0) + C * H,
			   .w1 = zc_grad_buffer(c, 1),
			   .b1 = zc_grad_buffer(c, 1) + H * D};
	/* Every rank initialises; zerod keeps rank 0's values for everyone. */
	s = 1000 + cfg.rank;
	for (int i = 0; i < H * D; i++)
		m.w1[i] = rng_uniform(&s) * 0.5f;
	for (int i = 0; i < C * H; i++)
		m.w2[i] = rng_uniform(&s) * 0.25f;
	s = 7;
	for (int c2 = 0; c2 < C; c2++)
		for (int k = 0; k < D; k++)
			teacher[c2][k] = rng_uniform(&s);
	make_batch(999999, ex, ey); /* held-out batch, the same on every rank */

	r = zc_register_plan(c);
	if (r < 0)
		goto fail;
	for (int it = 0; it < iters; it++) {
		struct hook hk = {.c = c};
		zc_future *step = NULL;
		float loss;

		make_batch(((uint64_t)cfg.rank << 32) | (uint64_t)it, x, y);
		loss = train_batch(&m, &g, x, y, bucket_ready, &hk);
		r = hk.err;
		if (r >= 0)
			r = zc_step_future(c, (uint64_t)it, &step);
		if (r >= 0)
			r = zc_future_wait(step, 30000);
		if (r == 0)
			r = ZC_ETIMEDOUT;
		zc_future_free(hk.f[0]);
		zc_future_free(hk.f[1]);
		if (r < 0) {
			fprintf(stderr, "rank %u: iteration %d: %s: %s\n", cfg.rank, it,
				zc_strerror_name(r), zc_future_message(step));
			zc_future_free(step);
			goto fail;
		}
		zc_future_free(step);
		if (cfg.rank == 0)
			printf("iter %3d  loss %.4f\n", it, loss);
	}
	if (cfg.rank == 0) {
		int correct = 0;
		/* held-out accuracy with the final parameters (forward only) */
		for (int i = 0; i < B; i++) {
			int best = 0;
			float bz = -INFINITY;
			for (int c2 = 0; c2 < C; c2++) {
				float z = m.b2[c2];
				for (int j = 0; j < H; j++) {
					float a = m.b1[j];
					for (int k = 0; k < D; k++)
						a += m.w1[j * D + k] * ex[i][k];
					z += m.w2[c2 * H + j] * (a > 0 ? a : 0);
				}
				if (z > bz) {
					bz = z;
					best = c2;
				}
			}
			correct += best == ey[i];
		}
		printf("held-out accuracy %.1f%% (%d/%d)\n", 100.0 * correct / B, correct, B);
	}
	zc_close(c);
	return 0;
fail:
	fprintf(stderr, "rank %u: %s: %s\n", cfg.rank, zc_strerror_name(r), zc_error_message());
	zc_close(c);
	return 1;
}
