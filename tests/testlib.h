/*
 * testlib.h — a minimal TAP producer for zerod's tests (meson runs them with
 * protocol: 'tap'). CHECK() records a failure and goes on; a test case is a
 * function in a table; main() runs the table. A skip must say why.
 */
#ifndef ZEROD_TESTLIB_H
#define ZEROD_TESTLIB_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct test_case {
	const char *name;
	void (*fn)(void);
};

extern int test_failed_;       /* failures in the current case */
extern const char *test_skip_; /* non-NULL: the current case is skipped, with this reason */

#define CHECK(cond, ...)                                                                           \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			test_failed_++;                                                            \
			printf("# %s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond);          \
			printf(__VA_ARGS__);                                                       \
			printf("\n");                                                              \
			fflush(stdout);                                                            \
		}                                                                                  \
	} while (0)

/* CHECK that returns from the case on failure (later steps depend on it). */
#define REQUIRE(cond, ...)                                                                         \
	do {                                                                                       \
		int before_ = test_failed_;                                                        \
		CHECK(cond, __VA_ARGS__);                                                          \
		if (test_failed_ != before_)                                                       \
			return;                                                                    \
	} while (0)

#define SKIP(reason)                                                                               \
	do {                                                                                       \
		test_skip_ = (reason);                                                             \
		return;                                                                            \
	} while (0)

static inline void test_note(const char *fmt, ...)
{
	va_list ap;
	printf("# ");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
}

/* Runs every case (or only those named in argv) and prints TAP. */
int test_main(const struct test_case *cases, size_t n, int argc, char **argv);

#define TEST_MAIN(table)                                                                           \
	int main(int argc, char **argv)                                                            \
	{                                                                                          \
		return test_main(table, sizeof(table) / sizeof(table[0]), argc, argv);             \
	}

#endif
