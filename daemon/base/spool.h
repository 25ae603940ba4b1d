/*
 * spool.h — file writes off the loop thread: the metrics textfile (replaced
 * atomically) and the trace file (appended). One writer thread takes the
 * queued writes in order; the loop only queues, so a slow or full disk costs
 * dropped writes (counted and logged), never a stalled loop.
 */
#ifndef ZEROD_SPOOL_H
#define ZEROD_SPOOL_H

#include <stddef.h>
#include <stdint.h>

/* What may wait in the queue; past it a write is dropped. */
#define SPOOL_MAX_BYTES (64u << 20)

struct spool;

int spool_new(struct spool **ret);
/* Write what is queued (up to timeout_ms), stop the thread, free. NULL ok. */
void spool_free(struct spool *s, int timeout_ms);

/* Append len bytes of buf to fd (a file the caller opened). Takes buf (a
 * malloc'd block) even on failure; -ENOBUFS when the queue is full. */
int spool_append(struct spool *s, int fd, char *buf, size_t len);
/* Close fd after the writes queued before. */
int spool_close(struct spool *s, int fd);
/* Replace the file at path with buf: PATH.tmp, written, then renamed over
 * path, so a reader sees the old file or the new one, whole. Takes buf. */
int spool_replace(struct spool *s, const char *path, char *buf, size_t len);

/* Writes dropped (queue full) or failed, since the start. Any thread. */
uint64_t spool_failures(struct spool *s);

#endif
