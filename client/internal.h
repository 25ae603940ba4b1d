/*
 * internal.h — what libzeroclient's files share and nothing outside sees: the
 * calling thread's error reason, and reading the caller's zc_config.
 */
#ifndef ZEROCLIENT_INTERNAL_H
#define ZEROCLIENT_INTERNAL_H

#include "zeroclient.h"

/* Record the reason for code in this thread's zc_error_message() (NULL fmt:
 * zc_strerror(code)) and return code. */
int err_set(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Read a caller's zc_config of any size (zeroclient.h, "ABI") into *out:
 * 0, or -EINVAL / -E2BIG with the reason recorded. */
int config_from_zc(const struct zc_config *src, struct zc_config *out);

/* Read a caller's zc_buffers the same way (for zc_register_buffers). */
int buffers_from_zc(const struct zc_buffers *src, struct zc_buffers *out);

#endif
