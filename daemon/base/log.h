/*
 * log.h — daemon logging to stderr with sd-daemon level prefixes ("<3>"...),
 * which journald turns into priorities. Library code (libzeroclient) never
 * logs; only the daemon does.
 *
 * Nothing a client does can flood the log or stall the daemon through it:
 * control characters are escaped (no forged lines), lines a client causes are
 * rate-limited per uid, and once log_start() ran a writer thread does the
 * writing, so a stderr nobody reads costs dropped lines, never a blocked loop.
 */
#ifndef ZEROD_LOG_H
#define ZEROD_LOG_H

#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

extern int log_max_level; /* 7 debug ... 3 err */

/* Lines kept for the writer thread; past that, lines are dropped and counted. */
#define LOG_QUEUE_LINES 256
/* Lines a client's uid may cause: a burst, then so many a second. */
#define LOG_CAUSE_BURST      100
#define LOG_CAUSE_PER_SECOND 20

/* Start the writer thread: from then on log_emit() never blocks. Before it
 * (and after log_stop()) lines are written directly. 0 or -errno. */
int log_start(void);
/* Write what is queued, waiting up to timeout_ms for a slow reader, and stop
 * the thread (it is left behind if stderr never drains). */
void log_stop(int timeout_ms);
/* Lines dropped because the queue was full, since the start. */
uint64_t log_dropped_total(void);

/* Until log_clear_cause(), lines this thread emits were caused by a client of
 * that uid and count against its rate. Loop thread only. */
void log_set_cause(uid_t uid);
void log_clear_cause(void);

void log_emit(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_err(...)     log_emit(3, __VA_ARGS__)
#define log_warning(...) log_emit(4, __VA_ARGS__)
#define log_notice(...)  log_emit(5, __VA_ARGS__)
#define log_info(...)    log_emit(6, __VA_ARGS__)
#define log_debug(...)   log_emit(7, __VA_ARGS__)

#endif
