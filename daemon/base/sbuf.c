/* sbuf.c — see sbuf.h. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/sbuf.h"

static bool grow(struct sbuf *b, size_t more)
{
	size_t cap = b->cap ? b->cap : 256;
	char *t;

	if (b->failed)
		return false;
	while (cap < b->len + more + 1)
		cap *= 2;
	if (cap == b->cap)
		return true;
	t = realloc(b->s, cap);
	if (!t) {
		b->failed = true;
		return false;
	}
	b->s = t;
	b->cap = cap;
	return true;
}

void sbuf_put(struct sbuf *b, const char *s, size_t len)
{
	if (!grow(b, len))
		return;
	memcpy(b->s + b->len, s, len);
	b->len += len;
	b->s[b->len] = 0;
}

void sbuf_printf(struct sbuf *b, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	if (n < 0 || !grow(b, (size_t)n))
		return;
	va_start(ap, fmt);
	vsnprintf(b->s + b->len, (size_t)n + 1, fmt, ap);
	va_end(ap);
	b->len += (size_t)n;
}

void sbuf_json_str(struct sbuf *b, const char *s)
{
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if (*p == '"' || *p == '\\')
			sbuf_printf(b, "\\%c", *p);
		else if (*p < 0x20 || *p == 0x7f)
			sbuf_printf(b, "\\u%04x", *p);
		else
			sbuf_put(b, (const char *)p, 1);
	}
}

char *sbuf_take(struct sbuf *b, size_t *ret_len)
{
	char *s = b->s;

	if (ret_len)
		*ret_len = b->len;
	*b = (struct sbuf){0};
	return s;
}

void sbuf_free(struct sbuf *b)
{
	free(b->s);
	*b = (struct sbuf){0};
}
