#!/usr/bin/env bash
# One libFuzzer target for $ZEROD_FUZZ_SECONDS (default 30) from its seed
# corpus, as one TAP case. New inputs go to a scratch corpus, so the
# committed seeds stay as they are; a crash leaves its input in
# $ZEROD_FUZZ_ARTIFACTS (default the build's meson-logs/) and fails the case.
#
#   run.sh TARGET SEED_DIR
set -uo pipefail
target=$1
seeds=$2
name=$(basename "$target")
secs=${ZEROD_FUZZ_SECONDS:-30}
art=${ZEROD_FUZZ_ARTIFACTS:-$(dirname "$target")/../meson-logs/$name-artifacts}
work=$(mktemp -d "/tmp/zerod-$name.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$art"

echo "1..1"
# dispatch runs a daemon in the process: its allocations live until exit
leaks=1
[ "$name" = fuzz-dispatch ] && leaks=0
"$target" -max_total_time="$secs" -timeout=30 -rss_limit_mb=4096 -print_final_stats=1 \
    -detect_leaks=$leaks -artifact_prefix="$art/" "$work" "$seeds" >"$work/log" 2>&1
rc=$?
runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$work/log" | grep -o '[0-9]*$')
cov=$(grep -o 'cov: [0-9]*' "$work/log" | tail -1)
if [ $rc -eq 0 ] && [ -n "$runs" ] && [ "$runs" -gt 0 ]; then
    echo "ok 1 - $name: ${runs} inputs in ${secs} s, ${cov:-cov: ?}, no crash"
else
    echo "not ok 1 - $name: exit $rc after ${runs:-0} inputs (artifacts in $art)"
    tail -n 60 "$work/log" | sed 's/^/# /'
fi
