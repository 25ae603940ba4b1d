/*
 * log.h — daemon logging to stderr with sd-daemon level prefixes ("<3>"...),
 * which journald turns into priorities. Library code (libzeroclient) never
 * logs; only the daemon does.
 */
#ifndef ZEROD_LOG_H
#define ZEROD_LOG_H

#include <stdio.h>

extern int log_max_level; /* 7 debug ... 3 err */

void log_emit(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_err(...)     log_emit(3, __VA_ARGS__)
#define log_warning(...) log_emit(4, __VA_ARGS__)
#define log_notice(...)  log_emit(5, __VA_ARGS__)
#define log_info(...)    log_emit(6, __VA_ARGS__)
#define log_debug(...)   log_emit(7, __VA_ARGS__)

#endif
