#!/usr/bin/env bash
# Configure (once) and build zerod into $BUILD_DIR (default: build/).
# Warnings are errors, as in CI.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$top/build}

if [ ! -f "$build/build.ninja" ]; then
    meson setup "$build" "$top" -Dwerror=true >"$top/.meson-setup.log" 2>&1 || {
        cat "$top/.meson-setup.log" >&2
        exit 1
    }
    rm -f "$top/.meson-setup.log"
fi
ninja -C "$build" >/dev/null || ninja -C "$build"
