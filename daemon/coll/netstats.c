/*
 * netstats.c — the daemon-wide counters of netstats.h.
 */
#include <stdatomic.h>

#include "coll/netstats.h"

static _Atomic uint64_t ar_bytes, ar_ns, ar_calls, tls_bytes, tls_ns;

void netstats_allreduce(uint64_t bytes, uint64_t ns)
{
	atomic_fetch_add_explicit(&ar_bytes, bytes, memory_order_relaxed);
	atomic_fetch_add_explicit(&ar_ns, ns, memory_order_relaxed);
	atomic_fetch_add_explicit(&ar_calls, 1, memory_order_relaxed);
}

void netstats_tls(uint64_t bytes, uint64_t cpu_ns)
{
	atomic_fetch_add_explicit(&tls_bytes, bytes, memory_order_relaxed);
	atomic_fetch_add_explicit(&tls_ns, cpu_ns, memory_order_relaxed);
}

void netstats_read(struct netstats *out)
{
	out->allreduce_bytes = atomic_load_explicit(&ar_bytes, memory_order_relaxed);
	out->allreduce_ns = atomic_load_explicit(&ar_ns, memory_order_relaxed);
	out->allreduce_calls = atomic_load_explicit(&ar_calls, memory_order_relaxed);
	out->tls_bytes = atomic_load_explicit(&tls_bytes, memory_order_relaxed);
	out->tls_cpu_ns = atomic_load_explicit(&tls_ns, memory_order_relaxed);
}
