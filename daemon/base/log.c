/*
 * log.c — one line per record on stderr, "<level>message". Owns the line
 * queue, its writer thread and the per-uid rate of client-caused lines.
 *
 * Why a thread: journald or a pipe can stop reading, and a write() to a full
 * pipe blocks; the loop thread must never block, so it only queues. The queue
 * is bounded (LOG_QUEUE_LINES): when it is full a line is dropped and counted,
 * and the writer says how many once it has room again.
 *
 * Why escaping: a client names things (shm names, job ids) that end up in
 * lines; a newline in one would start a forged line that journald files at
 * whatever "<N>" follows it. Every control byte is written as \xNN.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "base/log.h"

#define LOG_LINE_MAX 1024
#define CAUSE_SLOTS  16

int log_max_level = 6;

static struct {
	pthread_mutex_t mu;
	pthread_cond_t more; /* a line was queued, or stop */
	pthread_cond_t done; /* the writer finished */
	char line[LOG_QUEUE_LINES][LOG_LINE_MAX];
	unsigned head, count;
	uint64_t dropped, unreported;
	bool running, stop, finished, abandoned;
	pthread_t thread;
} q = {
	.mu = PTHREAD_MUTEX_INITIALIZER,
	.more = PTHREAD_COND_INITIALIZER,
	.done = PTHREAD_COND_INITIALIZER,
};

/* The client whose message the loop handles now (loop thread only). */
static _Thread_local bool have_cause;
static _Thread_local uid_t cause;

/* Token buckets of client-caused lines, per uid; touched by the loop thread
 * only (the only thread that has a cause). */
static struct cause_slot {
	uid_t uid;
	bool used;
	double tokens;
	int64_t last_ms;
	uint64_t dropped;
} slots[CAUSE_SLOTS];

static void write_all(const char *buf, size_t len)
{
	while (len > 0) {
		ssize_t n = write(STDERR_FILENO, buf, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return; /* EPIPE, EBADF: nobody to tell */
		buf += n;
		len -= (size_t)n;
	}
}

static void *writer(void *arg)
{
	char buf[LOG_LINE_MAX + 1], note[128];

	(void)arg;
	pthread_mutex_lock(&q.mu);
	for (;;) {
		uint64_t lost;
		size_t len;

		while (q.count == 0 && !q.stop)
			pthread_cond_wait(&q.more, &q.mu);
		if (q.count == 0)
			break;
		len = strlen(q.line[q.head]);
		memcpy(buf, q.line[q.head], len);
		q.head = (q.head + 1) % LOG_QUEUE_LINES;
		q.count--;
		lost = q.unreported;
		q.unreported = 0;
		pthread_mutex_unlock(&q.mu);
		buf[len++] = '\n';
		write_all(buf, len);
		if (lost) {
			int n = snprintf(note, sizeof(note),
					 "<4>zerod: %llu log lines dropped: stderr was not read "
					 "fast enough\n",
					 (unsigned long long)lost);
			write_all(note, (size_t)n);
		}
		pthread_mutex_lock(&q.mu);
	}
	q.finished = true;
	pthread_cond_broadcast(&q.done);
	pthread_mutex_unlock(&q.mu);
	return NULL;
}

int log_start(void)
{
	int r;

	pthread_mutex_lock(&q.mu);
	q.stop = q.finished = false;
	r = -pthread_create(&q.thread, NULL, writer, NULL);
	q.running = r == 0;
	pthread_mutex_unlock(&q.mu);
	return r;
}

void log_stop(int timeout_ms)
{
	struct timespec until;
	bool finished;

	pthread_mutex_lock(&q.mu);
	if (!q.running) {
		pthread_mutex_unlock(&q.mu);
		return;
	}
	q.stop = true;
	pthread_cond_signal(&q.more);
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += timeout_ms / 1000;
	until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (until.tv_nsec >= 1000000000L) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000L;
	}
	while (!q.finished)
		if (pthread_cond_timedwait(&q.done, &q.mu, &until) == ETIMEDOUT)
			break;
	finished = q.finished;
	q.running = false;
	/* a writer stuck on a stderr nobody reads stays stuck: later lines
	 * are dropped rather than written (and stuck) here */
	q.abandoned = !finished;
	pthread_mutex_unlock(&q.mu);
	if (finished)
		pthread_join(q.thread, NULL);
	else
		pthread_detach(q.thread);
}

uint64_t log_dropped_total(void)
{
	uint64_t n;

	pthread_mutex_lock(&q.mu);
	n = q.dropped;
	pthread_mutex_unlock(&q.mu);
	return n;
}

void log_set_cause(uid_t uid)
{
	have_cause = true;
	cause = uid;
}

void log_clear_cause(void)
{
	have_cause = false;
}

static struct cause_slot *cause_slot(uid_t uid, int64_t now)
{
	struct cause_slot *oldest = &slots[0];

	for (int i = 0; i < CAUSE_SLOTS; i++) {
		if (slots[i].used && slots[i].uid == uid)
			return &slots[i];
		if (!slots[i].used || slots[i].last_ms < oldest->last_ms)
			oldest = &slots[i];
	}
	*oldest = (struct cause_slot){
		.uid = uid, .used = true, .tokens = LOG_CAUSE_BURST, .last_ms = now};
	return oldest;
}

/* May a line caused by uid be written now? *ret_dropped: lines of that uid
 * dropped since its last written line (to be said first). */
static bool cause_allows(uid_t uid, uint64_t *ret_dropped)
{
	int64_t now = now_ms();
	struct cause_slot *c = cause_slot(uid, now);

	c->tokens += (double)(now - c->last_ms) * LOG_CAUSE_PER_SECOND / 1000.0;
	if (c->tokens > LOG_CAUSE_BURST)
		c->tokens = LOG_CAUSE_BURST;
	c->last_ms = now;
	if (c->tokens < 1) {
		c->dropped++;
		return false;
	}
	c->tokens -= 1;
	*ret_dropped = c->dropped;
	c->dropped = 0;
	return true;
}

/* "<level>" and msg with every control byte as \xNN, into out (NUL-ended). */
static void format_line(char out[LOG_LINE_MAX], int level, const char *msg)
{
	static const char hex[] = "0123456789abcdef";
	size_t at = (size_t)snprintf(out, LOG_LINE_MAX, "<%d>", level);

	for (const unsigned char *p = (const unsigned char *)msg; *p && at + 5 < LOG_LINE_MAX;
	     p++) {
		if (*p < 0x20 || *p == 0x7f) {
			out[at++] = '\\';
			out[at++] = 'x';
			out[at++] = hex[*p >> 4];
			out[at++] = hex[*p & 15];
		} else {
			out[at++] = (char)*p;
		}
	}
	out[at] = 0;
}

static void emit_line(int level, const char *msg)
{
	char direct[LOG_LINE_MAX + 1];

	pthread_mutex_lock(&q.mu);
	if (q.running) {
		if (q.count == LOG_QUEUE_LINES) {
			q.dropped++;
			q.unreported++;
		} else {
			format_line(q.line[(q.head + q.count) % LOG_QUEUE_LINES], level, msg);
			q.count++;
			pthread_cond_signal(&q.more);
		}
		pthread_mutex_unlock(&q.mu);
		return;
	}
	if (q.abandoned) {
		q.dropped++;
		pthread_mutex_unlock(&q.mu);
		return;
	}
	pthread_mutex_unlock(&q.mu);
	/* before the thread starts (start-up errors) and after it stopped */
	format_line(direct, level, msg);
	strcat(direct, "\n");
	write_all(direct, strlen(direct));
}

void log_emit(int level, const char *fmt, ...)
{
	char msg[LOG_LINE_MAX];
	uint64_t lost = 0;
	va_list ap;

	if (level > log_max_level)
		return;
	if (have_cause && !cause_allows(cause, &lost))
		return;
	if (lost) {
		snprintf(msg, sizeof(msg),
			 "uid %u: %llu lines its clients caused were not logged (over %d a second)",
			 (unsigned)cause, (unsigned long long)lost, LOG_CAUSE_PER_SECOND);
		emit_line(4, msg);
	}
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	emit_line(level, msg);
}
