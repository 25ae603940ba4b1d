#!/usr/bin/env bash
# The build variants a user's machine may give, each built from scratch and
# checked with the unit and integration suites (no sanitizers: the main
# build's runs cover those):
#
#   nocuda  the README's first command (tools/demo.sh, a short run) on a
#           machine without the CUDA toolkit: meson's default cuda=auto with
#           the toolkit hidden (-Dcudatoolkit=/nonexistent), which configures
#           what -Dcuda=disabled does; then its unit and integration suites
#   nogloo  -Dgloo=disabled: one node only, no C++ in zerod
#
#   tools/variants.sh [nocuda|nogloo ...]      default: both
#
# Build directories: $BUILD_DIR-nocuda and $BUILD_DIR-nogloo. Each variant
# leaves its meson testlog there, and a TAP line per check of its own in
# $BUILD_DIR-VARIANT.tap, for tools/test.sh's closing count.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
base=${BUILD_DIR:-$top/build}
variants=("$@")
[ ${#variants[@]} -gt 0 ] || variants=(nocuda nogloo)

status=0
for v in "${variants[@]}"; do
    build=$base-$v
    tap=$build.tap
    case $v in
    nocuda) args="-Dcudatoolkit=/nonexistent" ;;
    nogloo) args="-Dgloo=disabled" ;;
    *) echo "variants: no variant $v (nocuda, nogloo)" >&2; exit 2 ;;
    esac
    # from scratch, as on a fresh clone: a stale configuration would hide
    # what a new machine meets
    rm -rf "$build" "$tap"
    n=0
    check() { # check DESCRIPTION RC
        n=$((n + 1))
        if [ "$2" = 0 ]; then echo "ok $n - $v: $1"; else echo "not ok $n - $v: $1"; status=1; fi >>"$tap"
    }
    echo "== build variant $v ($args)"
    if [ "$v" = nocuda ]; then
        # the README's first command, as a user without the toolkit runs it
        rc=0
        BUILD_DIR=$build ZEROD_MESON_ARGS=$args "$top/tools/demo.sh" 2 3 >"$build.demo.log" 2>&1 || rc=$?
        tail -n 12 "$build.demo.log"
        check "tools/demo.sh builds and trains without the CUDA toolkit" $rc
        rc=0
        grep -qE 'CUDA toolkit \+ NCCL *: not found' "$build/meson-logs/meson-log.txt" || rc=1
        check "meson configured it without the CUDA backend" $rc
    else
        rc=0
        BUILD_DIR=$build ZEROD_MESON_ARGS=$args "$top/tools/build.sh" || rc=$?
        check "builds with $args" $rc
        rc=0
        grep -q 'one node only: built without gloo' "$build/meson-logs/meson-log.txt" || rc=1
        check "meson configured it without gloo" $rc
    fi
    [ -f "$build/build.ninja" ] || continue
    rm -f "$build/meson-logs/testlog.json"
    meson test -C "$build" --print-errorlogs --suite unit --suite integration || status=1
done
exit $status
