/* log.c — one line per record on stderr, "<level>message". */
#include <stdarg.h>
#include <stdio.h>

#include "log.h"

int log_max_level = 6;

void log_emit(int level, const char *fmt, ...)
{
	char line[1024];
	va_list ap;

	if (level > log_max_level)
		return;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	/* one write per line so lines of several threads do not interleave */
	fprintf(stderr, "<%d>%s\n", level, line);
}
