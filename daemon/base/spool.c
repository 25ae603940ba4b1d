/*
 * spool.c — the writer thread behind spool.h. Owns the queue of writes and
 * the thread. Errors are logged by the thread (log_emit only queues), once
 * per run of failures on one target, and counted.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "base/spool.h"

enum op { OP_APPEND, OP_CLOSE, OP_REPLACE };

struct item {
	struct item *next;
	enum op op;
	int fd;
	char *path;
	char *buf;
	size_t len;
};

struct spool {
	pthread_mutex_t mu;
	pthread_cond_t more, idle;
	struct item *head, *tail;
	size_t bytes;
	bool stop, busy;
	uint64_t failures;
	bool failing; /* the last write failed: the next failure is not logged again */
	pthread_t thread;
};

static int write_all(int fd, const char *buf, size_t len)
{
	while (len > 0) {
		ssize_t n = write(fd, buf, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		buf += n;
		len -= (size_t)n;
	}
	return 0;
}

static int replace(const char *path, const char *buf, size_t len)
{
	char tmp[4200];
	int fd, r;

	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
	if (fd < 0)
		return -errno;
	r = write_all(fd, buf, len);
	if (close(fd) < 0 && r == 0)
		r = -errno;
	if (r == 0 && rename(tmp, path) < 0)
		r = -errno;
	if (r < 0)
		unlink(tmp);
	return r;
}

static void run(struct spool *s, struct item *it)
{
	int r = 0;

	switch (it->op) {
	case OP_APPEND:
		r = write_all(it->fd, it->buf, it->len);
		break;
	case OP_CLOSE:
		close(it->fd);
		break;
	case OP_REPLACE:
		r = replace(it->path, it->buf, it->len);
		break;
	}
	pthread_mutex_lock(&s->mu);
	if (r < 0)
		s->failures++;
	if (r < 0 && !s->failing)
		log_warning("cannot write %s: %s (further failures are counted in "
			    "zerod_file_write_failures_total)",
			    it->path ? it->path : "the trace file", strerror(-r));
	s->failing = r < 0;
	pthread_mutex_unlock(&s->mu);
}

static void *writer(void *arg)
{
	struct spool *s = arg;

	pthread_mutex_lock(&s->mu);
	for (;;) {
		struct item *it;
		while (!s->head && !s->stop)
			pthread_cond_wait(&s->more, &s->mu);
		if (!s->head)
			break;
		it = s->head;
		s->head = it->next;
		if (!s->head)
			s->tail = NULL;
		s->bytes -= it->len;
		s->busy = true;
		pthread_mutex_unlock(&s->mu);
		run(s, it);
		free(it->buf);
		free(it->path);
		free(it);
		pthread_mutex_lock(&s->mu);
		s->busy = false;
		if (!s->head)
			pthread_cond_broadcast(&s->idle);
	}
	pthread_cond_broadcast(&s->idle);
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

int spool_new(struct spool **ret)
{
	struct spool *s = calloc(1, sizeof(*s));
	int r;

	if (!s)
		return -ENOMEM;
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->more, NULL);
	pthread_cond_init(&s->idle, NULL);
	r = -pthread_create(&s->thread, NULL, writer, s);
	if (r < 0) {
		free(s);
		return r;
	}
	*ret = s;
	return 0;
}

static void drop_all(struct item *it)
{
	while (it) {
		struct item *next = it->next;
		if (it->op == OP_CLOSE)
			close(it->fd);
		free(it->buf);
		free(it->path);
		free(it);
		it = next;
	}
}

void spool_free(struct spool *s, int timeout_ms)
{
	struct timespec until;
	struct item *left;

	if (!s)
		return;
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += timeout_ms / 1000;
	until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (until.tv_nsec >= 1000000000L) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&s->mu);
	while ((s->head || s->busy) &&
	       pthread_cond_timedwait(&s->idle, &s->mu, &until) != ETIMEDOUT)
		;
	left = s->head; /* what a stuck disk did not take in time */
	s->head = s->tail = NULL;
	s->stop = true;
	pthread_cond_signal(&s->more);
	pthread_mutex_unlock(&s->mu);
	drop_all(left);
	if (s->busy) {
		/* stuck in a write: leave it behind, as the log thread does */
		pthread_detach(s->thread);
		return;
	}
	pthread_join(s->thread, NULL);
	pthread_cond_destroy(&s->more);
	pthread_cond_destroy(&s->idle);
	pthread_mutex_destroy(&s->mu);
	free(s);
}

static int queue(struct spool *s, struct item *it)
{
	pthread_mutex_lock(&s->mu);
	if (it->len && s->bytes + it->len > SPOOL_MAX_BYTES) {
		s->failures++;
		pthread_mutex_unlock(&s->mu);
		free(it->buf);
		free(it->path);
		free(it);
		return -ENOBUFS;
	}
	s->bytes += it->len;
	if (s->tail)
		s->tail->next = it;
	else
		s->head = it;
	s->tail = it;
	pthread_cond_signal(&s->more);
	pthread_mutex_unlock(&s->mu);
	return 0;
}

static struct item *item_new(enum op op, int fd, char *buf, size_t len)
{
	struct item *it = calloc(1, sizeof(*it));

	if (!it) {
		free(buf);
		return NULL;
	}
	*it = (struct item){.op = op, .fd = fd, .buf = buf, .len = len};
	return it;
}

int spool_append(struct spool *s, int fd, char *buf, size_t len)
{
	struct item *it = item_new(OP_APPEND, fd, buf, len);

	return it ? queue(s, it) : -ENOMEM;
}

int spool_close(struct spool *s, int fd)
{
	struct item *it = item_new(OP_CLOSE, fd, NULL, 0);

	if (!it) {
		close(fd); /* at once, then: nothing else is queued after it */
		return -ENOMEM;
	}
	return queue(s, it);
}

int spool_replace(struct spool *s, const char *path, char *buf, size_t len)
{
	struct item *it = item_new(OP_REPLACE, -1, buf, len);

	if (!it)
		return -ENOMEM;
	it->path = strdup(path);
	if (!it->path) {
		free(it->buf);
		free(it);
		return -ENOMEM;
	}
	return queue(s, it);
}

uint64_t spool_failures(struct spool *s)
{
	uint64_t n;

	pthread_mutex_lock(&s->mu);
	n = s->failures;
	pthread_mutex_unlock(&s->mu);
	return n;
}
