/*
 * gloo.c — collectives for a job spread over several nodes (coll.h): inside
 * a node through the mapped buffers, as coll/host.c does; across nodes over
 * one full mesh among the nodes (coll/mesh.h): gloo's TCP transport
 * (coll/gloo_shim.h), or, when this daemon has TLS keys, the mesh over
 * TLS 1.3 (coll/sealmesh.c) that encrypts and authenticates every byte. Everything
 * below the network calls (the sums, the ranges, the lanes, the metrics) is
 * the same for both.
 *
 * The order of summation, fixed and the same on every node and every run:
 *
 *     avg[x] = (P_0[x] + P_1[x] + ... + P_{N-1}[x]) / world
 *     P_j[x] = g_a[x] + g_b[x] + ...   (node j's ranks a < b < ..., rank order)
 *
 * each sum a left fold in float, then one division (host_sum). With one node
 * that is coll/host.c's and the fused pass's order. It does not depend on
 * gloo: gloo's own all-reduce folds each segment in ring order starting at a
 * rank that depends on the segment's place in the buffer, so its result is
 * the same on every node and every run but no single formula for three or
 * more nodes. Instead a reduction here is built from data movement only:
 *
 *   REDUCE  1. each node sums its local ranks' gradients (rank order) into a
 *              scratch P_me, packed in the order below;
 *           2. alltoallv: node j receives every node's P over block j;
 *           3. node j folds the blocks in node order and divides;
 *           bucket mode (all-reduce): blocks are N equal parts; 4. allgatherv
 *           gives every node the whole average and each node copies the
 *           ranges its ranks own into their owners' gradient buffers.
 *           slice mode (reduce-scatter): block j is the ranges node j's
 *           ranks own, so step 3 writes straight into the owners' buffers.
 *           bucket mode on two nodes: blocks by owner as in slice mode (a
 *           reduce to the owner), no step 4: only the owner uses the
 *           average, and its node gets as many bytes as with equal parts
 *           and the allgatherv while the other gets none, so REDUCE + BCAST
 *           move one all-reduce's bytes, not 1.5 of them (more nodes keep
 *           the all-reduce: an owner would receive N-1 partials).
 *   BCAST   bucket mode: one gloo broadcast per range from its owner's node,
 *           received into the first local rank's parameters and copied into
 *           the other local ranks' (two nodes with ranges of both: all of
 *           them posted at once, bcast_together). slice mode: allgatherv of each node's
 *           owned ranges, then copies into every local rank but the owner.
 *
 * alltoallv + allgatherv move what a ring all-reduce moves (2(N-1)/N of the
 * data per node), and this gloo has no options-style reduce-scatter at all.
 *
 * Requests run to completion on the submitting lane's thread, in windows of
 * at most `window` elements (so the scratch stays bounded: (1 + nnodes)
 * windows per lane at most, grown on first use). Each gloo call gets its
 * own tag: the lane in the low two bits, the number of the call on that lane
 * above. Every node makes the same calls in the same order per lane (zero.c
 * orders the requests; everything here is a function of the ranges), so
 * tags match across nodes and the lanes never see each other's messages.
 *
 * With one local rank and ranges that lie back to back in node order, the
 * rank's own buffer is the network buffer: no packing pass, no copy.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coll/coll.h"
#include "coll/gloo_shim.h"
#include "coll/mesh.h"
#include "coll/sealmesh.h"
#include "coll/netstats.h"
#include "common.h"
#include "base/hostmem.h"
#include "base/pool.h"

#define GLOO_LANES          COLL_MESH_LANES /* zero.h's lanes, in the tag's low bits */
#define GLOO_WINDOW_DEFAULT (2u << 20) /* 8 MiB: as fast as larger ones on loopback */
#define GLOO_TIMEOUT_MS     30000u
#define GLOO_ERR_LEN        256

/* A piece of a request in one window: pos is its place in the packed
 * scratch. */
struct piece {
	uint32_t owner;
	uint32_t node;
	uint64_t off;
	uint64_t n;
	uint64_t pos;
};

struct lane_ctx {
	float *buf; /* scratch */
	size_t cap; /* floats */
	uint32_t calls;
	char err[GLOO_ERR_LEN];
};

struct coll_group {
	uint32_t world, nnodes, node;
	uint32_t *node_of;
	float **grads, **params;
	uint32_t *local; /* this node's ranks, ascending */
	uint32_t nlocal;
	const float **lgrads; /* [nlocal]: their gradient buffers, rank order */
	struct pool *pool;
	const struct coll_mesh_ops *mo; /* gloo's or the mesh over TLS */
	struct coll_mesh *net;          /* NULL with one node */
	uint64_t window;
	struct lane_ctx lanes[GLOO_LANES];
	atomic_bool aborted;
};

/* -------------------------------------------------- local passes --- */

/* One stretch of element work: dst = sum of src[0..nsrc) at soff / div, or
 * a copy of src0 (nsrc == 0). */
struct job {
	float *dst;
	const float *const *src;
	const float *src0;
	uint32_t nsrc;
	uint64_t soff;
	uint64_t n;
	float div;
	bool stream; /* copy with non-temporal stores: a trainer's buffer */
};

struct jobs {
	struct job *v;
	size_t n, cap;
	uint64_t *first; /* chunk index of each job, for the pool */
};

static int jobs_add(struct jobs *js, struct job j)
{
	if (j.n == 0)
		return 0;
	if (js->n == js->cap) {
		size_t cap = js->cap ? 2 * js->cap : 16;
		struct job *v = realloc(js->v, cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		js->v = v;
		js->cap = cap;
	}
	js->v[js->n++] = j;
	return 0;
}

static void jobs_free(struct jobs *js)
{
	free(js->v);
	free(js->first);
	*js = (struct jobs){0};
}

static void job_chunk(void *arg, size_t i)
{
	const struct jobs *js = arg;
	size_t lo = 0, hi = js->n;

	while (hi - lo > 1) { /* the job holding chunk i */
		size_t mid = lo + (hi - lo) / 2;
		if (js->first[mid] <= i)
			lo = mid;
		else
			hi = mid;
	}
	const struct job *j = &js->v[lo];
	uint64_t x = (i - js->first[lo]) * HOST_CHUNK;
	size_t n = (size_t)MIN((uint64_t)HOST_CHUNK, j->n - x);

	if (j->nsrc)
		host_sum(j->dst + x, j->src, j->nsrc, j->soff + x, n, j->div);
	else if (j->stream)
		host_store(j->dst + x, j->src0 + x, n);
	else
		memcpy(j->dst + x, j->src0 + x, n * sizeof(float));
}

/* Run every job on the pool, then forget them. */
static int jobs_run(struct coll_group *g, struct jobs *js)
{
	uint64_t n = 0;
	int r;

	if (js->n == 0)
		return 0;
	free(js->first);
	js->first = malloc(js->n * sizeof(*js->first));
	if (!js->first)
		return -ENOMEM;
	for (size_t k = 0; k < js->n; k++) {
		js->first[k] = n;
		n += (js->v[k].n + HOST_CHUNK - 1) / HOST_CHUNK;
	}
	r = pool_parallel_for(g->pool, n, job_chunk, js);
	js->n = 0;
	return r;
}

/* ------------------------------------------------------- network --- */

static uint32_t lane_tag(struct coll_group *g, struct lane_ctx *ln)
{
	uint32_t lane = (uint32_t)(ln - g->lanes);

	return (ln->calls++ << 2) | lane;
}

static int net_alltoallv(struct coll_group *g, struct lane_ctx *ln, const float *in,
			 const size_t *scnt, float *out, const size_t *rcnt)
{
	if (!g->net) {
		if (scnt[0])
			memcpy(out, in, scnt[0] * sizeof(float));
		return 0;
	}
	return g->mo->alltoallv(g->net, lane_tag(g, ln), in, scnt, out, rcnt, ln->err,
				sizeof(ln->err));
}

static int net_allgatherv(struct coll_group *g, struct lane_ctx *ln, float *buf, const size_t *cnt)
{
	if (!g->net)
		return 0;
	return g->mo->allgatherv(g->net, lane_tag(g, ln), buf, cnt, ln->err, sizeof(ln->err));
}

static int net_broadcast(struct coll_group *g, struct lane_ctx *ln, uint32_t root, float *buf,
			 uint64_t n)
{
	if (!g->net)
		return 0;
	return g->mo->broadcast(g->net, lane_tag(g, ln), root, buf, (size_t)n, ln->err,
				sizeof(ln->err));
}

/* gloo's plain TCP mesh (gloo_shim.h) as a coll_mesh_ops. */
static int gm_open(const struct coll_mesh_config *cfg, struct coll_mesh **ret, char *err,
		   size_t errlen)
{
	struct gloo_shim_config sc = {
		.rank = (int)cfg->node,
		.size = (int)cfg->nnodes,
		.host = cfg->host,
		.iface = cfg->iface,
		.prefix = cfg->prefix,
		.store = cfg->store,
		.timeout_ms = cfg->timeout_ms,
	};

	return gloo_shim_open(&sc, (struct gloo_shim **)ret, err, errlen);
}

static int gm_alltoallv(struct coll_mesh *m, uint32_t tag, const float *in, const size_t *scnt,
			float *out, const size_t *rcnt, char *err, size_t errlen)
{
	return gloo_shim_alltoallv((struct gloo_shim *)m, tag, in, scnt, out, rcnt, err, errlen);
}

static int gm_allgatherv(struct coll_mesh *m, uint32_t tag, float *out, const size_t *cnt,
			 char *err, size_t errlen)
{
	return gloo_shim_allgatherv((struct gloo_shim *)m, tag, out, cnt, err, errlen);
}

static int gm_broadcast(struct coll_mesh *m, uint32_t tag, uint32_t root, float *buf, size_t n,
			char *err, size_t errlen)
{
	return gloo_shim_broadcast((struct gloo_shim *)m, tag, (int)root, buf, n, err, errlen);
}

static int gm_broadcasts(struct coll_mesh *m, const struct coll_mesh_bcast *b, size_t n, char *err,
			 size_t errlen)
{
	struct gloo_shim_bcast *v = malloc((n ? n : 1) * sizeof(*v));
	int r;

	if (!v)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++)
		v[i] = (struct gloo_shim_bcast){
			.tag = b[i].tag, .root = (int)b[i].root, .buf = b[i].buf, .n = b[i].n};
	r = gloo_shim_broadcasts((struct gloo_shim *)m, v, n, err, errlen);
	free(v);
	return r;
}

static void gm_abort(struct coll_mesh *m)
{
	gloo_shim_abort((struct gloo_shim *)m);
}

static void gm_close(struct coll_mesh *m)
{
	gloo_shim_close((struct gloo_shim *)m);
}

static const struct coll_mesh_ops gloo_mesh_ops = {
	.name = "gloo",
	.open = gm_open,
	.alltoallv = gm_alltoallv,
	.allgatherv = gm_allgatherv,
	.broadcast = gm_broadcast,
	.broadcasts = gm_broadcasts,
	.abort = gm_abort,
	.close = gm_close,
};

/* ------------------------------------------------------- windows --- */

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int scratch(struct lane_ctx *ln, size_t need)
{
	if (need <= ln->cap)
		return 0;
	/* no realloc: the old contents are not needed */
	free(ln->buf);
	ln->buf = NULL;
	ln->cap = 0;
	if (posix_memalign((void **)&ln->buf, 64, need * sizeof(float)) != 0) {
		ln->buf = NULL;
		return -ENOMEM;
	}
	ln->cap = need;
	return 0;
}

/* Lay the window's pieces out: in request order (bucket mode, blocks are
 * equal parts of the window) or grouped by their owners' nodes (blocks are
 * each node's ranges). P is reordered; cnt[j] and bnd[j] are block j's size
 * and start. Returns whether the pieces lie back to back in the ranks'
 * buffers in this order (then a rank's own buffer can be the scratch). */
static bool layout(struct coll_group *g, struct piece *P, struct piece *tmp, uint32_t m, uint64_t N,
		   bool by_node, size_t *cnt, uint64_t *bnd)
{
	uint32_t nn = g->nnodes;
	uint64_t pos = 0;
	bool flat = true;

	if (by_node) {
		uint32_t k = 0;
		for (uint32_t j = 0; j < nn; j++)
			for (uint32_t i = 0; i < m; i++)
				if (P[i].node == j)
					tmp[k++] = P[i];
		memcpy(P, tmp, m * sizeof(*P));
	}
	for (uint32_t i = 0; i < m; i++) {
		P[i].pos = pos;
		pos += P[i].n;
		if (i > 0 && P[i - 1].off + P[i - 1].n != P[i].off)
			flat = false;
	}
	if (by_node) {
		memset(bnd, 0, (nn + 1) * sizeof(*bnd));
		for (uint32_t i = 0; i < m; i++)
			bnd[P[i].node + 1] += P[i].n;
		for (uint32_t j = 0; j < nn; j++)
			bnd[j + 1] += bnd[j];
	} else {
		/* equal parts, cut at 64 bytes so the folds stay aligned */
		for (uint32_t j = 0; j <= nn; j++)
			bnd[j] = j == nn ? N : (N * j / nn) & ~(uint64_t)15;
	}
	for (uint32_t j = 0; j < nn; j++)
		cnt[j] = (size_t)(bnd[j + 1] - bnd[j]);
	return flat;
}

static int reduce_window(struct coll_group *g, struct lane_ctx *ln, bool slice, struct piece *P,
			 struct piece *tmp, uint32_t m, uint64_t N)
{
	uint32_t nn = g->nnodes, me = g->node;
	size_t cnt[nn], rcnt[nn];
	uint64_t bnd[nn + 1];
	const float *rb[nn];
	struct jobs js = {0};
	bool direct;
	float *S, *R;
	uint64_t t0;
	int r;

	/* blocks by owner node: slice mode, and bucket mode's reduce to the
	 * owner on two nodes (top of the file) */
	bool by_owner = slice || nn == 2;

	direct = layout(g, P, tmp, m, N, by_owner, cnt, bnd) && g->nlocal == 1;
	uint64_t M = cnt[me];
	for (uint32_t j = 0; j < nn; j++)
		rcnt[j] = (size_t)M;
	r = scratch(ln, (direct ? 0 : N) + nn * M);
	if (r < 0)
		return r;
	S = direct ? g->grads[g->local[0]] + P[0].off : ln->buf;
	R = direct ? ln->buf : ln->buf + N;
	for (uint32_t j = 0; j < nn; j++)
		rb[j] = R + j * M;

	/* 1. this node's partial sums, packed */
	for (uint32_t i = 0; i < m && !direct; i++) {
		r = jobs_add(&js, (struct job){.dst = S + P[i].pos,
					       .src = g->lgrads,
					       .nsrc = g->nlocal,
					       .soff = P[i].off,
					       .n = P[i].n,
					       .div = 1.0f});
		if (r < 0)
			goto out;
	}
	r = jobs_run(g, &js);
	if (r < 0)
		goto out;
	/* 2. block j of every node's partials to node j */
	t0 = mono_ns();
	r = net_alltoallv(g, ln, S, cnt, R, rcnt);
	if (r < 0 || atomic_load(&g->aborted))
		goto out;
	/* 3. fold them in node order */
	if (!by_owner) {
		r = jobs_add(&js, (struct job){.dst = S + bnd[me],
					       .src = rb,
					       .nsrc = nn,
					       .soff = 0,
					       .n = M,
					       .div = (float)g->world});
	} else {
		for (uint32_t i = 0; i < m && r >= 0; i++)
			if (P[i].node == me)
				r = jobs_add(&js,
					     (struct job){.dst = g->grads[P[i].owner] + P[i].off,
							  .src = rb,
							  .nsrc = nn,
							  .soff = P[i].pos - bnd[me],
							  .n = P[i].n,
							  .div = (float)g->world});
	}
	if (r >= 0)
		r = jobs_run(g, &js);
	if (r >= 0 && by_owner && !slice && g->net)
		netstats_allreduce(N * sizeof(float), mono_ns() - t0);
	if (r < 0 || by_owner)
		goto out;
	/* 4. bucket mode: everyone gets the whole average; owners keep theirs */
	r = net_allgatherv(g, ln, S, cnt);
	if (r < 0 || atomic_load(&g->aborted))
		goto out;
	if (g->net)
		netstats_allreduce(N * sizeof(float), mono_ns() - t0);
	for (uint32_t i = 0; i < m && r >= 0; i++) {
		float *dst = g->grads[P[i].owner];
		if (P[i].node != me || dst + P[i].off == S + P[i].pos)
			continue;
		r = jobs_add(&js, (struct job){.dst = dst + P[i].off,
					       .src0 = S + P[i].pos,
					       .n = P[i].n,
					       .stream = true});
	}
	if (r >= 0)
		r = jobs_run(g, &js);
out:
	jobs_free(&js);
	return r;
}

/* slice mode: every node's owned ranges to every node. */
static int gather_window(struct coll_group *g, struct lane_ctx *ln, struct piece *P,
			 struct piece *tmp, uint32_t m, uint64_t N)
{
	uint32_t nn = g->nnodes, me = g->node;
	size_t cnt[nn];
	uint64_t bnd[nn + 1];
	struct jobs js = {0};
	bool direct;
	float *S;
	int r = 0;

	direct = layout(g, P, tmp, m, N, true, cnt, bnd) && g->nlocal == 1;
	if (!direct && (r = scratch(ln, N)) < 0)
		return r;
	S = direct ? g->params[g->local[0]] + P[0].off : ln->buf;
	for (uint32_t i = 0; i < m && !direct && r >= 0; i++)
		if (P[i].node == me)
			r = jobs_add(&js, (struct job){.dst = S + P[i].pos,
						       .src0 = g->params[P[i].owner] + P[i].off,
						       .n = P[i].n});
	if (r >= 0)
		r = jobs_run(g, &js);
	if (r >= 0)
		r = net_allgatherv(g, ln, S, cnt);
	if (r < 0 || direct || atomic_load(&g->aborted))
		goto out;
	for (uint32_t i = 0; i < m && r >= 0; i++)
		for (uint32_t k = 0; k < g->nlocal && r >= 0; k++) {
			uint32_t rk = g->local[k];
			if (rk == P[i].owner)
				continue;
			r = jobs_add(&js, (struct job){.dst = g->params[rk] + P[i].off,
						       .src0 = S + P[i].pos,
						       .n = P[i].n,
						       .stream = true});
		}
	if (r >= 0)
		r = jobs_run(g, &js);
out:
	jobs_free(&js);
	return r;
}

/* Two nodes and ranges of both: every range's broadcast at once
 * (coll_mesh_ops.broadcasts), both directions busy, tags as one after the
 * other would take them. 1 if it ran them, 0 if they go one at a time. */
static int bcast_together(struct coll_group *g, struct lane_ctx *ln, const struct coll_req *req)
{
	struct coll_mesh_bcast *b;
	uint32_t n = 0, roots = 0;
	int r;

	if (!g->net || g->nnodes != 2 || !g->mo->broadcasts)
		return 0;
	for (uint32_t i = 0; i < req->nranges; i++)
		if (req->ranges[i].n)
			roots |= 1u << g->node_of[req->ranges[i].owner];
	if (roots != 3)
		return 0;
	b = malloc(req->nranges * sizeof(*b));
	if (!b)
		return -ENOMEM;
	for (uint32_t i = 0; i < req->nranges; i++) {
		const struct coll_range *rg = &req->ranges[i];
		uint32_t root = g->node_of[rg->owner];
		if (rg->n)
			b[n++] = (struct coll_mesh_bcast){
				.tag = lane_tag(g, ln),
				.root = root,
				.buf = (root == g->node ? g->params[rg->owner]
							: g->params[g->local[0]]) +
				       rg->off,
				.n = rg->n};
	}
	r = g->mo->broadcasts(g->net, b, n, ln->err, sizeof(ln->err));
	free(b);
	return r < 0 ? r : 1;
}

/* bucket mode: one broadcast per range, from its owner's node. */
static int bcast_ranges(struct coll_group *g, struct lane_ctx *ln, const struct coll_req *req)
{
	struct jobs js = {0};
	int r = bcast_together(g, ln, req);
	bool sent = r > 0;

	for (uint32_t i = 0; i < req->nranges && r >= 0; i++) {
		const struct coll_range *rg = &req->ranges[i];
		uint32_t root = g->node_of[rg->owner];
		float *buf =
			(root == g->node ? g->params[rg->owner] : g->params[g->local[0]]) + rg->off;
		if (rg->n == 0)
			continue;
		if (!sent)
			r = net_broadcast(g, ln, root, buf, rg->n);
		if (r < 0 || atomic_load(&g->aborted))
			break;
		for (uint32_t k = 0; k < g->nlocal && r >= 0; k++) {
			float *dst = g->params[g->local[k]] + rg->off;
			if (dst != buf)
				r = jobs_add(&js, (struct job){.dst = dst,
							       .src0 = buf,
							       .n = rg->n,
							       .stream = true});
		}
	}
	if (r >= 0 && !atomic_load(&g->aborted))
		r = jobs_run(g, &js);
	jobs_free(&js);
	return r;
}

/* Cut the request into windows and run each. */
static int run_windows(struct coll_group *g, struct lane_ctx *ln, const struct coll_req *req)
{
	bool slice = req->mode == ZC_SHARD_SLICE;
	struct piece *P = malloc(2 * (req->nranges + 1) * sizeof(*P)), *tmp;
	uint32_t k = 0;
	uint64_t x = 0;
	int r = 0;

	if (!P)
		return -ENOMEM;
	tmp = P + req->nranges + 1;
	while (k < req->nranges && r >= 0) {
		uint32_t m = 0;
		uint64_t N = 0;
		while (k < req->nranges && N < g->window) {
			const struct coll_range *rg = &req->ranges[k];
			uint64_t take = MIN(rg->n - x, g->window - N);
			if (take)
				P[m++] = (struct piece){.owner = rg->owner,
							.node = g->node_of[rg->owner],
							.off = rg->off + x,
							.n = take};
			N += take;
			x += take;
			if (x == rg->n)
				k++, x = 0;
		}
		if (N == 0)
			continue;
		if (atomic_load(&g->aborted))
			r = -ECANCELED;
		else if (req->kind == COLL_REDUCE)
			r = reduce_window(g, ln, slice, P, tmp, m, N);
		else
			r = gather_window(g, ln, P, tmp, m, N);
	}
	free(P);
	return r;
}

/* ----------------------------------------------------------- ops --- */

static void gl_close(struct coll_group *g)
{
	if (!g)
		return;
	if (g->net)
		g->mo->close(g->net);
	for (unsigned l = 0; l < GLOO_LANES; l++)
		free(g->lanes[l].buf);
	free(g->node_of);
	free(g->grads);
	free(g->params);
	free(g->local);
	free(g->lgrads);
	free(g);
}

/* Every rank lives on a node of the job, this node's ranks (and only they)
 * have buffers here, and no node is empty. */
static int check_topology(const struct coll_config *cfg)
{
	const struct coll_net *net = cfg->net;
	uint32_t seen = 0;

	if (!net || net->nnodes == 0 || net->node >= net->nnodes || !net->node_of ||
	    (net->nnodes > 1 && (!net->store || !net->prefix || (!net->host && !net->iface))))
		return -EINVAL;
	bool *has = calloc(net->nnodes, sizeof(*has));
	if (!has)
		return -ENOMEM;
	for (uint32_t r = 0; r < cfg->world; r++) {
		uint32_t j = net->node_of[r];
		bool here = cfg->grads[r] && cfg->params[r];
		if (j >= net->nnodes || here != (j == net->node) ||
		    (!here && (cfg->grads[r] || cfg->params[r]))) {
			free(has);
			return -EINVAL;
		}
		seen += !has[j];
		has[j] = true;
	}
	free(has);
	return seen == net->nnodes ? 0 : -EINVAL;
}

static int gl_open(const struct coll_config *cfg, struct coll_group **ret)
{
	const struct coll_net *net = cfg->net;
	struct coll_group *g;
	int r = check_topology(cfg);

	if (r < 0) {
		if (cfg->err && cfg->errlen)
			snprintf(cfg->err, cfg->errlen, "gloo: bad topology or network settings");
		return r;
	}
	g = calloc(1, sizeof(*g));
	if (!g)
		return -ENOMEM;
	g->world = cfg->world;
	g->nnodes = net->nnodes;
	g->node = net->node;
	g->pool = cfg->pool;
	g->window = net->window ? net->window : GLOO_WINDOW_DEFAULT;
	atomic_init(&g->aborted, false);
	g->node_of = calloc(cfg->world, sizeof(*g->node_of));
	g->grads = calloc(cfg->world, sizeof(*g->grads));
	g->params = calloc(cfg->world, sizeof(*g->params));
	g->local = calloc(cfg->world, sizeof(*g->local));
	g->lgrads = calloc(cfg->world, sizeof(*g->lgrads));
	if (!g->node_of || !g->grads || !g->params || !g->local || !g->lgrads) {
		r = -ENOMEM;
		goto fail;
	}
	for (uint32_t k = 0; k < cfg->world; k++) {
		g->node_of[k] = net->node_of[k];
		g->grads[k] = cfg->grads[k];
		g->params[k] = cfg->params[k];
		if (cfg->grads[k]) {
			g->lgrads[g->nlocal] = cfg->grads[k];
			g->local[g->nlocal++] = k;
		}
	}
	g->mo = net->tls ? &coll_sealmesh_ops : &gloo_mesh_ops;
	if (net->nnodes > 1) {
		struct coll_mesh_config mc = {
			.node = net->node,
			.nnodes = net->nnodes,
			.host = net->host,
			.iface = net->iface,
			.prefix = net->prefix,
			.store = net->store,
			.timeout_ms = (int)(net->timeout_ms ? net->timeout_ms : GLOO_TIMEOUT_MS),
			.tls = net->tls,
			.ktls = net->ktls,
		};
		char scratch[GLOO_ERR_LEN];
		r = g->mo->open(&mc, &g->net, cfg->err ? cfg->err : scratch,
				cfg->err ? cfg->errlen : sizeof(scratch));
		if (r < 0)
			goto fail;
	}
	*ret = g;
	return 0;
fail:
	gl_close(g);
	return r;
}

/* Every node's part, in node order: an allgatherv of equal counts (gloo
 * moves bytes; the parts are doubles, 2 floats each). */
static int gather_parts(struct coll_group *g, struct lane_ctx *ln, const struct coll_req *req)
{
	size_t *cnt = malloc(g->nnodes * sizeof(*cnt));
	int r;

	if (!cnt)
		return -ENOMEM;
	for (uint32_t k = 0; k < g->nnodes; k++)
		cnt[k] = req->gbytes / sizeof(float);
	memcpy((char *)req->gout + (size_t)g->node * req->gbytes, req->gin, req->gbytes);
	r = net_allgatherv(g, ln, req->gout, cnt);
	free(cnt);
	return r;
}

static int gl_submit(struct coll_group *g, struct coll_req *req)
{
	struct lane_ctx *ln;
	int r;

	if (req->lane >= GLOO_LANES)
		return -EINVAL;
	for (uint32_t i = 0; i < req->nranges; i++) {
		if (req->ranges[i].owner >= g->world)
			return -EINVAL;
		/* fp32 only (backend_host_multi.low_precision) */
		if (req->ranges[i].dtype != ZC_DTYPE_F32)
			return ZC_ENOTSUP;
	}
	ln = &g->lanes[req->lane];
	ln->err[0] = '\0';
	if (atomic_load(&g->aborted))
		r = -ECANCELED;
	else if (req->kind == COLL_GATHER)
		r = gather_parts(g, ln, req);
	else if (req->kind == COLL_BCAST && req->mode == ZC_SHARD_BUCKET)
		r = bcast_ranges(g, ln, req);
	else
		r = run_windows(g, ln, req);
	if (atomic_load(&g->aborted))
		r = -ECANCELED;
	if (r < 0 && !ln->err[0])
		snprintf(ln->err, sizeof(ln->err), "%s", zc_strerror(r));
	req->done(req, r);
	return 0;
}

static void gl_abort(struct coll_group *g)
{
	atomic_store(&g->aborted, true);
	if (g->net)
		g->mo->abort(g->net);
}

static const char *gl_last_error(struct coll_group *g, unsigned lane)
{
	return lane < GLOO_LANES ? g->lanes[lane].err : "";
}

const struct coll_ops coll_gloo_ops = {
	.name = "gloo",
	.local_fuse = true,
	.open = gl_open,
	.submit = gl_submit,
	.abort = gl_abort,
	.close = gl_close,
	.last_error = gl_last_error,
};
