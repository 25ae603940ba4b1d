/*
 * pool.h — the CPU worker pool. Executor threads (never the loop thread)
 * split work into chunks and run them here; the caller helps and returns when
 * every chunk is done. Several jobs share one pool.
 */
#ifndef ZEROD_POOL_H
#define ZEROD_POOL_H

#include <errno.h>
#include <stddef.h>

struct pool;

/* nthreads workers (0: one per online CPU). */
int pool_new(unsigned nthreads, struct pool **ret);
/* Stops and joins the workers. Accepts NULL. No parallel_for may be running. */
void pool_free(struct pool *p);
unsigned pool_threads(const struct pool *p);

/* Run fn(ctx, i) for every i in [0, n), on the workers and the calling
 * thread; blocks until all have returned. Thread-safe. Returns 0, or -EFAULT
 * if some fn hit memory that vanished (SIGBUS: a trainer shrank its shared
 * buffer); the other indices still ran. */
int pool_parallel_for(struct pool *p, size_t n, void (*fn)(void *ctx, size_t i), void *ctx);

/* Install the SIGBUS handler behind the guard (once per process, before
 * any batch). */
int pool_catch_faults(void);

#endif
