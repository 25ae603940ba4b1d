#!/usr/bin/env bash
# The coverage-guided fuzzers (libFuzzer, clang): build them in
# $BUILD_DIR-fuzz (default build-fuzz) with ASan + UBSan and run each target
# for SECONDS from its seed corpus (tests/fuzz/corpus/<target>):
#
#   tools/fuzz.sh               30 s per target (what tools/test.sh runs)
#   tools/fuzz.sh 3600          an hour each, by hand
#   tools/fuzz.sh 600 dispatch  one target
#
# Targets: envelope (a trainer's message: decode, plan checks, round trips),
# rdzv (a peer daemon's rendezvous frames), dispatch (a real zerod in the
# process, fed whole trainer connections over its ZeroMQ socket). A crash's
# input is kept in the build's meson-logs/fuzz-<target>-artifacts/.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
secs=${1:-30}
only=${2:-}
build=${BUILD_DIR:-$top/build}-fuzz

"$top/tools/deps.sh"
if [ ! -f "$build/build.ninja" ]; then
    CC=clang CXX=clang++ meson setup "$build" "$top" -Dfuzzers=true -Dcuda=disabled \
        -Dgloo=disabled -Db_sanitize=address,undefined -Db_lundef=false \
        -Dc_args=-fsanitize=fuzzer-no-link -Dcpp_args=-fsanitize=fuzzer-no-link \
        >"$top/.meson-setup-fuzz.log" 2>&1 || {
        cat "$top/.meson-setup-fuzz.log" >&2
        exit 1
    }
    rm -f "$top/.meson-setup-fuzz.log"
fi
ninja -C "$build" >/dev/null || ninja -C "$build"
args=(--suite libfuzzer)
[ -n "$only" ] && args=("libfuzzer-$only")
ZEROD_FUZZ_SECONDS=$secs meson test -C "$build" --print-errorlogs "${args[@]}"
