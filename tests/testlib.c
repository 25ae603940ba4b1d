/* testlib.c — the TAP runner behind testlib.h. */
#include <stdio.h>
#include <string.h>

#include "testlib.h"

int test_failed_;
const char *test_skip_;

int test_main(const struct test_case *cases, size_t n, int argc, char **argv)
{
	size_t run = 0, failed = 0;

	setvbuf(stdout, NULL, _IOLBF, 0);
	for (size_t i = 0; i < n; i++) {
		bool selected = argc < 2;
		for (int a = 1; a < argc; a++)
			if (strcmp(argv[a], cases[i].name) == 0)
				selected = true;
		run += selected;
	}
	printf("1..%zu\n", run);
	run = 0;
	for (size_t i = 0; i < n; i++) {
		bool selected = argc < 2;
		for (int a = 1; a < argc; a++)
			if (strcmp(argv[a], cases[i].name) == 0)
				selected = true;
		if (!selected)
			continue;
		test_failed_ = 0;
		test_skip_ = NULL;
		cases[i].fn();
		run++;
		if (test_skip_)
			printf("ok %zu - %s # SKIP %s\n", run, cases[i].name, test_skip_);
		else if (test_failed_)
			printf("not ok %zu - %s\n", run, cases[i].name);
		else
			printf("ok %zu - %s\n", run, cases[i].name);
		failed += test_failed_ != 0;
	}
	return failed ? 1 : 0;
}
