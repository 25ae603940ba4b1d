/*
 * sbuf.h — a growable text buffer for what zerod renders (metrics, trace
 * events, JSON): append with printf formats; a failed allocation makes the
 * buffer sticky-failed (sbuf.failed) instead of returning at every call.
 * Owned by whoever holds it; not thread-safe.
 */
#ifndef ZEROD_SBUF_H
#define ZEROD_SBUF_H

#include <stdbool.h>
#include <stddef.h>

struct sbuf {
	char *s; /* NUL-terminated, or NULL while empty */
	size_t len, cap;
	bool failed; /* an append did not fit in memory: the text is cut */
};

void sbuf_printf(struct sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sbuf_put(struct sbuf *b, const char *s, size_t len);
/* s as the inside of a JSON string (quotes and control bytes escaped). */
void sbuf_json_str(struct sbuf *b, const char *s);
/* Take the text (the caller frees it; NULL if empty) and empty b. */
char *sbuf_take(struct sbuf *b, size_t *ret_len);
void sbuf_free(struct sbuf *b);

#endif
