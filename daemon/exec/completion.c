/*
 * completion.c — the completion queue (see completion.h).
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "exec/completion.h"

struct completion_queue {
	pthread_mutex_t mu;
	struct exec_done *head, *tail;
	int efd;
};

int completion_queue_new(struct completion_queue **ret)
{
	struct completion_queue *q = calloc(1, sizeof(*q));

	if (!q)
		return -ENOMEM;
	q->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (q->efd < 0) {
		int r = -errno;
		free(q);
		return r;
	}
	pthread_mutex_init(&q->mu, NULL);
	*ret = q;
	return 0;
}

void completion_queue_free(struct completion_queue *q)
{
	if (!q)
		return;
	for (struct exec_done *d = q->head; d;) {
		struct exec_done *next = d->next;
		free(d);
		d = next;
	}
	close(q->efd);
	pthread_mutex_destroy(&q->mu);
	free(q);
}

int completion_queue_fd(struct completion_queue *q)
{
	return q->efd;
}

void completion_queue_post(struct completion_queue *q, struct exec_done *d)
{
	uint64_t one = 1;
	bool was_empty;

	d->next = NULL;
	pthread_mutex_lock(&q->mu);
	was_empty = !q->head;
	if (q->tail)
		q->tail->next = d;
	else
		q->head = d;
	q->tail = d;
	pthread_mutex_unlock(&q->mu);
	/* A list that was not empty has a wake-up pending already (take()
	 * empties it after reading the eventfd). EAGAIN only if the counter is
	 * saturated: the loop wakes anyway. */
	if (was_empty)
		(void)!write(q->efd, &one, sizeof(one));
}

struct exec_done *completion_queue_take(struct completion_queue *q)
{
	struct exec_done *d;
	uint64_t cnt;

	(void)!read(q->efd, &cnt, sizeof(cnt));
	pthread_mutex_lock(&q->mu);
	d = q->head;
	q->head = q->tail = NULL;
	pthread_mutex_unlock(&q->mu);
	return d;
}
