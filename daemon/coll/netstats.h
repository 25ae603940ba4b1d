/*
 * netstats.h — what the cross-node collectives moved and how long they took,
 * over every job of this daemon since it started. The gloo backend adds to
 * it, the TLS mesh its crypto; metrics.c reports it (zerod_net_allreduce_*,
 * zerod_tls_mesh_*), so a benchmark can set
 * the daemon's own all-reduce bandwidth beside gloo's (zerod-bench
 * --daemons). Lock-free: relaxed atomic adds from the lane threads.
 */
#ifndef ZEROD_NETSTATS_H
#define ZEROD_NETSTATS_H

#include <stdint.h>

struct netstats {
	/* Bucket-mode reductions across nodes, counted from the first byte
	 * sent to the average in hand on every node: the exchange, the fold
	 * and the gather (coll/gloo.c's REDUCE steps 2-4); the local sums
	 * before and the copies into the owners' buffers after are not. */
	uint64_t allreduce_bytes; /* the all-reduced data, once (not per node) */
	uint64_t allreduce_ns;
	uint64_t allreduce_calls;
	/* The TLS mesh's calls (coll/sealmesh.c): the bytes they sealed and
	 * opened, and the CPU time of the threads that ran them, from the
	 * call's start to its end (OpenSSL's records and the sockets' system
	 * calls; not the time waiting in poll) */
	uint64_t tls_bytes;
	uint64_t tls_cpu_ns;
};

void netstats_allreduce(uint64_t bytes, uint64_t ns);
void netstats_tls(uint64_t bytes, uint64_t cpu_ns);
void netstats_read(struct netstats *out);

#endif
