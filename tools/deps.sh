#!/usr/bin/env bash
# Install what building and testing zerod needs, from Debian's packages, only
# where it is missing. Sourced or run by tools/demo.sh and tools/test.sh.
set -euo pipefail

ZEROD_PACKAGES=(
    gcc pkg-config meson ninja-build cmake
    libzmq3-dev libprotobuf-c-dev protobuf-c-compiler libsodium-dev libssl-dev openssl
    g++ libgloo-dev
    python3
    # operating zerod: sd_notify and socket activation, the config file
    libsystemd-dev libinih-dev
    # the ops suite: systemd-analyze, systemd-socket-activate, the JSON
    # schema of zeroctl -o json, a second parser of the metrics
    systemd python3-jsonschema python3-prometheus-client
    # the torch suite and tools/torch-demo.sh: DDP + ZerodOptimizer on CPU
    python3-torch
    # the coverage-guided fuzzers (tools/fuzz.sh): clang with libFuzzer's runtime
    clang libclang-rt-14-dev
)

# promtool (Debian's prometheus package) checks the metrics exposition. Its
# package starts a Prometheus server once installed, unless policy-rc.d
# forbids starting services (containers, CI): only there is it installed;
# elsewhere the ops suite says so and uses its other parsers.
if [ -x /usr/sbin/policy-rc.d ] && { /usr/sbin/policy-rc.d prometheus start >/dev/null 2>&1; [ $? -eq 101 ]; }; then
    ZEROD_PACKAGES+=(prometheus)
fi

# nvcc needs a host C++ compiler; meson builds the CUDA backend wherever
# the toolkit is (meson.build)
if [ -x /usr/local/cuda/bin/nvcc ]; then
    ZEROD_PACKAGES+=(g++)
fi

missing=()
for p in "${ZEROD_PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$p")
    fi
done

if [ ${#missing[@]} -gt 0 ]; then
    echo "zerod: installing ${missing[*]}" >&2
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null || { echo "zerod: need root or sudo to install ${missing[*]}" >&2; exit 1; }
        sudo="sudo"
    fi
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
