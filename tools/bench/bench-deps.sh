#!/usr/bin/env bash
# What the benchmark needs beyond the build (tools/deps.sh): Debian's CPU
# torch for --vs-torch and gnuplot for the plot of docs/PERFORMANCE.md.
# Opt-in: CI and tools/test.sh never need these.
set -euo pipefail

BENCH_PACKAGES=(python3-torch gnuplot-nox)

missing=()
for p in "${BENCH_PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$p")
    fi
done

if [ ${#missing[@]} -gt 0 ]; then
    echo "zerod-bench: installing ${missing[*]}" >&2
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null || { echo "zerod-bench: need root or sudo" >&2; exit 1; }
        sudo="sudo"
    fi
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
