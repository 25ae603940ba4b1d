/*
 * pool.c — worker threads that take chunks of parallel_for batches. A batch
 * lives on its caller's stack; workers claim indices with an atomic counter
 * and the last one to finish wakes the caller.
 *
 * Chunks touch trainers' shared memory, which a broken or hostile trainer can
 * truncate under us: the next access raises SIGBUS. Every chunk runs under a
 * guard (sigsetjmp) that turns that fault into a failed batch, so the job
 * fails with a named error and the daemon and its other jobs go on.
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

#include "base/pool.h"

struct batch {
	void (*fn)(void *ctx, size_t i);
	void *ctx;
	size_t n;
	atomic_size_t next;
	atomic_bool faulted;
	size_t done;    /* under pool.mu */
	unsigned users; /* workers holding a pointer to this batch, under pool.mu */
	struct batch *qnext;
};

struct pool {
	pthread_mutex_t mu;
	pthread_cond_t work; /* workers: a batch was queued or stop */
	pthread_cond_t done; /* callers: some batch finished */
	struct batch *head, *tail;
	bool stop;
	unsigned nthreads;
	pthread_t *threads;
};

static _Thread_local sigjmp_buf *fault_jmp;

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
	(void)si, (void)uc;
	if (fault_jmp)
		siglongjmp(*fault_jmp, 1);
	/* not inside a chunk: a real bug, die as we would have */
	signal(sig, SIG_DFL);
	raise(sig);
}

int pool_catch_faults(void)
{
	struct sigaction sa = {.sa_sigaction = on_sigbus, .sa_flags = SA_SIGINFO | SA_NODEFER};

	sigemptyset(&sa.sa_mask);
	return sigaction(SIGBUS, &sa, NULL) < 0 ? -errno : 0;
}

/* fn(ctx, i), or false if it touched memory that is gone. SA_NODEFER keeps
 * SIGBUS unblocked after the jump, so the mask need not be saved. */
static bool run_guarded(void (*fn)(void *ctx, size_t i), void *ctx, size_t i)
{
	sigjmp_buf jb;

	if (sigsetjmp(jb, 0)) {
		fault_jmp = NULL;
		return false;
	}
	fault_jmp = &jb;
	fn(ctx, i);
	fault_jmp = NULL;
	return true;
}

/* Claim and run indices of b until none are left; returns how many ran. */
static size_t batch_drain(struct batch *b)
{
	size_t ran = 0, i;

	while ((i = atomic_fetch_add(&b->next, 1)) < b->n) {
		if (!run_guarded(b->fn, b->ctx, i))
			atomic_store(&b->faulted, true);
		ran++;
	}
	return ran;
}

static void batch_unqueue_locked(struct pool *p, struct batch *b)
{
	struct batch **pp = &p->head, *prev = NULL;

	for (; *pp; prev = *pp, pp = &(*pp)->qnext)
		if (*pp == b) {
			*pp = b->qnext;
			if (p->tail == b)
				p->tail = prev;
			return;
		}
}

static void *worker(void *arg)
{
	struct pool *p = arg;

	pthread_mutex_lock(&p->mu);
	for (;;) {
		struct batch *b = p->head;
		size_t ran;

		while (b && atomic_load(&b->next) >= b->n)
			b = b->qnext;
		if (!b) {
			if (p->stop)
				break;
			pthread_cond_wait(&p->work, &p->mu);
			continue;
		}
		b->users++;
		pthread_mutex_unlock(&p->mu);
		ran = batch_drain(b);
		pthread_mutex_lock(&p->mu);
		b->done += ran;
		/* the caller's stack frame holds b: it may return once we let go */
		if (--b->users == 0 && b->done == b->n)
			pthread_cond_broadcast(&p->done);
	}
	pthread_mutex_unlock(&p->mu);
	return NULL;
}

int pool_new(unsigned nthreads, struct pool **ret)
{
	struct pool *p;

	if (nthreads == 0) {
		long n = sysconf(_SC_NPROCESSORS_ONLN);
		nthreads = n > 0 ? (unsigned)n : 1;
	}
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->work, NULL);
	pthread_cond_init(&p->done, NULL);
	p->threads = calloc(nthreads, sizeof(*p->threads));
	if (!p->threads) {
		pool_free(p);
		return -ENOMEM;
	}
	for (unsigned i = 0; i < nthreads; i++) {
		int r = pthread_create(&p->threads[i], NULL, worker, p);
		if (r) {
			pool_free(p);
			return -r;
		}
		p->nthreads++;
	}
	*ret = p;
	return 0;
}

void pool_free(struct pool *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&p->mu);
	p->stop = true;
	pthread_cond_broadcast(&p->work);
	pthread_mutex_unlock(&p->mu);
	for (unsigned i = 0; i < p->nthreads; i++)
		pthread_join(p->threads[i], NULL);
	free(p->threads);
	pthread_cond_destroy(&p->work);
	pthread_cond_destroy(&p->done);
	pthread_mutex_destroy(&p->mu);
	free(p);
}

unsigned pool_threads(const struct pool *p)
{
	return p->nthreads;
}

int pool_parallel_for(struct pool *p, size_t n, void (*fn)(void *ctx, size_t i), void *ctx)
{
	struct batch b = {.fn = fn, .ctx = ctx, .n = n};
	size_t ran;

	if (n == 0)
		return 0;
	if (n == 1)
		return run_guarded(fn, ctx, 0) ? 0 : -EFAULT;
	atomic_init(&b.next, 0);
	atomic_init(&b.faulted, false);
	pthread_mutex_lock(&p->mu);
	if (p->tail)
		p->tail->qnext = &b;
	else
		p->head = &b;
	p->tail = &b;
	pthread_cond_broadcast(&p->work);
	pthread_mutex_unlock(&p->mu);

	ran = batch_drain(&b);

	pthread_mutex_lock(&p->mu);
	b.done += ran;
	batch_unqueue_locked(p, &b);
	while (b.done < b.n || b.users > 0)
		pthread_cond_wait(&p->done, &p->mu);
	pthread_mutex_unlock(&p->mu);
	return atomic_load(&b.faulted) ? -EFAULT : 0;
}
