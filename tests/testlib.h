/*
 * testlib.h — a minimal TAP producer for zerod's tests (meson runs them with
 * protocol: 'tap'). CHECK() records a failure and goes on; a test case is a
 * function in a table; main() runs the table. A skip must say why.
 *
 * Every case runs in its own forked process with its own timeout (libuv
 * style): a case that crashes or hangs is reported `not ok` and the next
 * case runs. State one case leaves for a later one must therefore live in
 * memory from test_shared(), or be set up in main() before test_main().
 */
#ifndef ZEROD_TESTLIB_H
#define ZEROD_TESTLIB_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

struct test_case {
	const char *name;
	void (*fn)(void);
	/* nominal milliseconds the case may take, scaled by test_timeout();
	 * 0: TEST_CASE_TIMEOUT_MS */
	int timeout_ms;
};

#define TEST_CASE_TIMEOUT_MS 30000

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

/* ms scaled by $ZEROD_TEST_TIMEOUT_SCALE (default 1), which the valgrind and
 * sanitizer setups raise: every wait for something that should happen uses
 * it. A negative ms (wait forever) is returned as it is. */
int test_timeout(int ms);

/* size bytes of zeroed memory shared by every process forked after the call:
 * where one case leaves state for a later one. Aborts if there is none. */
void *test_shared(size_t size);

/* The status (0..255, or 128+signal) of pid if the runner reaped it: cases
 * run in a child of the runner, so a process the runner started (a zerod
 * from main()) or inherited (a case's child that outlived its case) is not
 * the case's to wait for; the runner reaps it and records the status here.
 * -1 if pid was not reaped by the runner. */
int test_reaped(pid_t pid);

/* Runs every case (or only those named in argv), each in its own process,
 * and prints TAP. The exit status: 0 if every case passed or was skipped. */
int test_main(const struct test_case *cases, size_t n, int argc, char **argv);

#define TEST_MAIN(table)                                                                           \
	int main(int argc, char **argv)                                                            \
	{                                                                                          \
		return test_main(table, sizeof(table) / sizeof(table[0]), argc, argv);             \
	}

#endif
