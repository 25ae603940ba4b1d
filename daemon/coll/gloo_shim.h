/*
 * gloo_shim.h — the C face of gloo (Debian's libgloo-dev, TCP transport):
 * one full mesh among the nodes of a job, and the few options-style
 * collectives coll/gloo.c is built from. Nothing of C++ crosses it: every
 * exception is caught inside and comes back as a negative code with a
 * message in the caller's buffer.
 *
 * Threads: the collectives may run concurrently from several threads on one
 * mesh as long as every call in flight has its own tag, and every node makes
 * the calls of one tag in the same order. abort() may come from any thread.
 *
 * The process must ignore SIGPIPE (zerod does): gloo writes to its sockets
 * without MSG_NOSIGNAL, and a peer that died would otherwise kill us.
 */
#ifndef ZEROD_GLOO_SHIM_H
#define ZEROD_GLOO_SHIM_H

#include <stddef.h>
#include <stdint.h>

#include "coll/coll.h"

#ifdef __cplusplus
extern "C" {
#endif

struct gloo_shim;

struct gloo_shim_config {
	int rank, size;     /* this node, and the number of nodes (>= 1) */
	const char *host;   /* bind address or name, or NULL and ... */
	const char *iface;  /* ... a network interface */
	const char *prefix; /* store key prefix, fresh for each mesh */
	const struct coll_store *store;
	int timeout_ms; /* connecting, and each collective (> 0) */
};

/* Connect to every other node (blocks until all have joined, or the
 * timeout). 0, -ETIMEDOUT, -EINVAL, -ENOMEM or -EIO, with err filled. */
int gloo_shim_open(const struct gloo_shim_config *cfg, struct gloo_shim **ret, char *err,
		   size_t errlen);

/* Every node sends send_counts[j] floats of in (blocks back to back, node
 * order) to node j and receives recv_counts[j] floats from node j into out
 * (likewise). Each node's count for j must equal j's count from it. */
int gloo_shim_alltoallv(struct gloo_shim *s, uint32_t tag, const float *in,
			const size_t *send_counts, float *out, const size_t *recv_counts, char *err,
			size_t errlen);

/* In place: out holds counts[j] floats of node j's, back to back; this
 * node's block is in place already, the others are received. */
int gloo_shim_allgatherv(struct gloo_shim *s, uint32_t tag, float *out, const size_t *counts,
			 char *err, size_t errlen);

/* buf[0..n) of node root into buf on every other node. */
int gloo_shim_broadcast(struct gloo_shim *s, uint32_t tag, int root, float *buf, size_t n,
			char *err, size_t errlen);

/* One broadcast of gloo_shim_broadcasts(). */
struct gloo_shim_bcast {
	uint32_t tag;
	int root;
	float *buf;
	size_t n;
};

/* Two nodes (-EINVAL otherwise): the n broadcasts at once, b[i] as
 * gloo_shim_broadcast(s, b[i].tag, b[i].root, b[i].buf, b[i].n) would,
 * posted together so that both directions carry data; every node passes
 * the same list. */
int gloo_shim_broadcasts(struct gloo_shim *s, const struct gloo_shim_bcast *b, size_t n, char *err,
			 size_t errlen);

/* gloo's own all-reduce (sum, gloo's order) in place: the yardstick the
 * benchmark holds coll/gloo.c against. */
int gloo_shim_allreduce_sum(struct gloo_shim *s, uint32_t tag, float *buf, size_t n, char *err,
			    size_t errlen);

/* Any thread: every collective in flight, and every later one, fails soon
 * with -ECANCELED. Never waits for them. Idempotent. */
void gloo_shim_abort(struct gloo_shim *s);

/* Accepts NULL. Nothing may be in flight. */
void gloo_shim_close(struct gloo_shim *s);

#ifdef __cplusplus
}
#endif

#endif
