#!/usr/bin/env bash
# The whole test suite: install what is missing, build with -Werror, run
# every meson suite (unit, integration, multinode, fuzz, ops, reliability, torch),
# then the C suites once more built with AddressSanitizer + UBSan
# (tools/sanitize.sh asan; torch's python cannot load an instrumented library),
# then the libFuzzer targets for a short while (tools/fuzz.sh), then the build
# variants a user's machine may give (tools/variants.sh: no CUDA toolkit,
# through the README's first command; no gloo), and print one closing line
# that counts every run. Fails if any run fails.
#
#   tools/test.sh [meson test args...]     e.g. tools/test.sh --suite unit
#   ZEROD_TEST_ASAN=0 tools/test.sh        without the sanitizer run
#   ZEROD_TEST_LIBFUZZER=0 tools/test.sh   without the libFuzzer run
#   ZEROD_TEST_VARIANTS=0 tools/test.sh    without the build variants
#                                          (both run only when no meson test
#                                          args are given)
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$top/build}

"$top/tools/deps.sh"
BUILD_DIR=$build "$top/tools/build.sh"

logs=("$build/meson-logs/testlog.json")
status=0
meson test -C "$build" --print-errorlogs "$@" || status=$?

if [ "${ZEROD_TEST_ASAN:-1}" != 0 ]; then
    echo "== the same suites under AddressSanitizer + UBSan (${build}-asan)"
    args=("$@")
    [ $# -gt 0 ] || args=(--suite unit --suite integration --suite multinode --suite fuzz --suite ops
                            --suite reliability)
    rm -f "$build-asan/meson-logs/testlog.json"
    BUILD_DIR=$build "$top/tools/sanitize.sh" asan "${args[@]}" || status=$?
    logs+=("$build-asan/meson-logs/testlog.json")
fi

if [ $# -eq 0 ] && [ "${ZEROD_TEST_LIBFUZZER:-1}" != 0 ]; then
    echo "== the coverage-guided fuzzers, ${ZEROD_FUZZ_SECONDS:-20} s each (${build}-fuzz)"
    rm -f "$build-fuzz/meson-logs/testlog.json"
    BUILD_DIR=$build "$top/tools/fuzz.sh" "${ZEROD_FUZZ_SECONDS:-20}" || status=$?
    logs+=("$build-fuzz/meson-logs/testlog.json")
fi

if [ $# -eq 0 ] && [ "${ZEROD_TEST_VARIANTS:-1}" != 0 ]; then
    echo "== the build variants: no CUDA toolkit (${build}-nocuda), no gloo (${build}-nogloo)"
    BUILD_DIR=$build "$top/tools/variants.sh" || status=$?
    for v in nocuda nogloo; do
        logs+=("$build-$v.tap" "$build-$v/meson-logs/testlog.json")
    done
fi

# One line any CI can read: subtests (TAP cases) counted over all suites and runs.
python3 - "${logs[@]}" <<'PY' || true
import json, os, re, sys
passed = failed = skipped = 0
for path in sys.argv[1:]:
    if not os.path.exists(path):
        failed += 1  # that run did not get as far as its tests
        continue
    if path.endswith(".tap"):  # a script's own checks (tools/variants.sh)
        out = open(path).read()
        passed += len(re.findall(r"^ok \d+", out, re.M))
        failed += len(re.findall(r"^not ok \d+", out, re.M))
        continue
    for line in open(path):
        if not line.strip():
            continue
        t = json.loads(line)
        out = t.get("stdout") or ""
        ok = len(re.findall(r"^ok \d+.*$", out, re.M))
        sk = len(re.findall(r"^ok \d+ .*# SKIP", out, re.M))
        nok = len(re.findall(r"^not ok \d+", out, re.M))
        if t["result"] not in ("OK", "SKIP", "EXPECTEDFAIL") and nok == 0:
            nok = 1  # crashed or timed out before its cases said so
        passed += ok - sk
        skipped += sk
        failed += nok
print(f"tests: {passed} passed, {failed} failed, {skipped} skipped")
PY
exit $status
