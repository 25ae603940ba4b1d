#!/usr/bin/env bash
# Configure (once) and build zerod into $BUILD_DIR (default: build/).
# Warnings are errors, as in CI. ZEROD_MESON_ARGS: more meson options for
# that first configuration (tools/variants.sh hides the CUDA toolkit so).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$top/build}

if [ ! -f "$build/build.ninja" ]; then
    # shellcheck disable=SC2086 # the options are words
    meson setup "$build" "$top" -Dwerror=true ${ZEROD_MESON_ARGS:-} >"$top/.meson-setup.log" 2>&1 || {
        cat "$top/.meson-setup.log" >&2
        exit 1
    }
    rm -f "$top/.meson-setup.log"
fi
ninja -C "$build" >/dev/null || ninja -C "$build"
