/*
 * mesh.h — the network under coll/gloo.c: one full mesh among the nodes of a
 * job and the three data movements gloo.c builds its collectives from. Two
 * implementations, chosen per job by gloo.c: gloo's TCP transport in plain
 * text (coll/gloo_shim.h), and coll/sealmesh.c, every connection TLS 1.3
 * with both daemons' certificates (net/tls.h), when this daemon has keys.
 *
 * Threads: the calls may run concurrently from several threads on one mesh
 * as long as every call in flight has its own tag, whose low two bits are
 * its lane (COLL_MESH_LANES), and every node makes the calls of one lane in
 * the same order. abort() may come from any thread.
 */
#ifndef ZEROD_COLL_MESH_H
#define ZEROD_COLL_MESH_H

#include <stddef.h>
#include <stdint.h>

#include "coll/coll.h"

#define COLL_MESH_LANES 4u /* zero.h's lanes, in a tag's two low bits */

struct tls_ident;

struct coll_mesh_config {
	uint32_t node, nnodes; /* this node, and the number of nodes (>= 2) */
	const char *host;      /* bind address or name, or NULL and ... */
	const char *iface;     /* ... a network interface */
	const char *prefix;    /* store key prefix, fresh for each mesh */
	const struct coll_store *store;
	int timeout_ms;               /* connecting, and each call (> 0) */
	const struct tls_ident *tls;  /* sealmesh: this daemon's TLS identity (net/tls.h) */
	bool ktls;                    /* sealmesh: ask for kernel TLS */
};

struct coll_mesh;

/* One broadcast of a batch (coll_mesh_ops.broadcasts): buf[0..n) of node
 * root into buf on every other node. */
struct coll_mesh_bcast {
	uint32_t tag;
	uint32_t root;
	float *buf;
	size_t n;
};

struct coll_mesh_ops {
	const char *name;
	/* Connect to every other node; blocks until all have joined or the
	 * timeout (never on the loop thread). 0, or -ETIMEDOUT / -EINVAL /
	 * -ENOMEM / -EIO / ZC_ECONNECT with why in err. cfg is copied. */
	int (*open)(const struct coll_mesh_config *cfg, struct coll_mesh **ret, char *err,
		    size_t errlen);
	/* Every node sends send_counts[j] floats of in (blocks back to back,
	 * node order) to node j and receives recv_counts[j] floats from node
	 * j into out (likewise). Each node's count for j equals j's count
	 * from it. 0 or a negative code with why in err. */
	int (*alltoallv)(struct coll_mesh *m, uint32_t tag, const float *in,
			 const size_t *send_counts, float *out, const size_t *recv_counts,
			 char *err, size_t errlen);
	/* In place: out holds counts[j] floats of node j's, back to back; this
	 * node's block is there already, the others are received. */
	int (*allgatherv)(struct coll_mesh *m, uint32_t tag, float *out, const size_t *counts,
			  char *err, size_t errlen);
	/* buf[0..n) of node root into buf on every other node. */
	int (*broadcast)(struct coll_mesh *m, uint32_t tag, uint32_t root, float *buf, size_t n,
			 char *err, size_t errlen);
	/* Optional (NULL: one broadcast after the other): the n broadcasts of
	 * b at once, each as broadcast() would (b[i].tag its own), so that
	 * ranges of different roots cross the mesh together, both directions
	 * of a link busy. Every node passes the same list. */
	int (*broadcasts)(struct coll_mesh *m, const struct coll_mesh_bcast *b, size_t n, char *err,
			  size_t errlen);
	/* Any thread: every call in flight, and every later one, fails soon
	 * with -ECANCELED. Never waits for them. Idempotent. */
	void (*abort)(struct coll_mesh *m);
	/* Accepts NULL. Nothing may be in flight. */
	void (*close)(struct coll_mesh *m);
};

#endif
