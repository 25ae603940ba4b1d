#!/usr/bin/env bash
# Build zerod and its tests with sanitizers and run the suites under them.
#
#   tools/sanitize.sh asan [meson test args...]   AddressSanitizer + UBSan, in build-asan/
#   tools/sanitize.sh tsan [meson test args...]   ThreadSanitizer, in build-tsan/
#
# The build directory is $BUILD_DIR-KIND (default build-KIND), configured
# once with -Db_sanitize; its default test setup (tests/meson.build) sets
# ASAN/UBSAN/TSAN_OPTIONS and ZEROD_TEST_TIMEOUT_SCALE. Every zerod the tests
# start is the sanitized one, and a sanitizer report fails the test.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
kind=${1:-}
case $kind in
asan) sanitize=address,undefined ;;
tsan) sanitize=thread ;;
*)
    echo "usage: $0 asan|tsan [meson test args...]" >&2
    exit 2
    ;;
esac
shift
build=${BUILD_DIR:-$top/build}-$kind

"$top/tools/deps.sh"
if [ ! -f "$build/build.ninja" ]; then
    meson setup "$build" "$top" -Dwerror=true -Db_sanitize=$sanitize \
        >"$top/.meson-setup-$kind.log" 2>&1 || {
        cat "$top/.meson-setup-$kind.log" >&2
        exit 1
    }
    rm -f "$top/.meson-setup-$kind.log"
fi
ninja -C "$build" >/dev/null || ninja -C "$build"

run=()
if [ "$kind" = tsan ]; then
    # ThreadSanitizer's shadow memory wants a fixed address space layout; the
    # tests and every zerod they start inherit it.
    run=(setarch "$(uname -m)" -R)
fi
exec "${run[@]}" meson test -C "$build" --print-errorlogs "$@"
