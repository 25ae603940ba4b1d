#!/usr/bin/env bash
# Regenerate docs/PERFORMANCE.md with one command: install what the benchmark
# needs (python3-torch, gnuplot), build, run zerod-bench (the headline job, a
# sweep over model sizes and the four shard/step modes), keep every JSON in
# docs/perf/, and write the document and its plot from them.
#
#   tools/bench/perf-doc.sh            (about 6 minutes on a quiet 2-core machine)
#   ONLY='daemons-*' tools/bench/perf-doc.sh   only those runs again
#
# Each run first waits (at most QUIET_WAIT_S seconds, default 300) for the
# 1-minute load average to drop under QUIET_LOAD (default 0.7): the machine is
# shared, and a neighbour's build halves every bandwidth. Every JSON records
# the load average it started at.
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-$top/build}
out=$top/docs/perf
sizes=${SIZES:-"1M 2.5M 5M 10M 25M 50M"}
quiet_load=${QUIET_LOAD:-0.7}
quiet_wait=${QUIET_WAIT_S:-300}

"$top/tools/deps.sh"
"$top/tools/bench/bench-deps.sh"
BUILD_DIR=$build "$top/tools/build.sh"
bench=$build/tools/bench/zerod-bench
mkdir -p "$out"

wait_quiet() {
    local waited=0
    while awk -v max="$quiet_load" '{ exit !($1 > max) }' /proc/loadavg &&
        [ "$waited" -lt "$quiet_wait" ]; do
        sleep 5
        waited=$((waited + 5))
    done
}

commit=$(git -C "$top" rev-parse --short HEAD 2>/dev/null || echo '?')
today=$(date -u +%F)

# run NAME ARGS...: one zerod-bench --json run into $out/NAME.json, with the
# commit and the day it was measured at. With ONLY set (a shell pattern,
# e.g. ONLY='daemons-*'), only the runs it matches run again; the others'
# JSON stay as they are.
run() {
    local name=$1
    shift
    # shellcheck disable=SC2053
    if [ -n "${ONLY:-}" ] && [[ $name != $ONLY ]]; then
        return
    fi
    wait_quiet
    echo "perf-doc: zerod-bench $* --json > docs/perf/$name.json" >&2
    "$bench" "$@" --json >"$out/$name.json.tmp"
    python3 - "$out/$name.json.tmp" "$commit" "$today" <<'PY'
import json, sys
p, commit, day = sys.argv[1:]
j = json.load(open(p))
j["commit"], j["date"] = commit, day
open(p, "w").write(json.dumps(j, indent=2) + "\n")
PY
    mv "$out/$name.json.tmp" "$out/$name.json"
}

[ -n "${ONLY:-}" ] || rm -f "$out"/*.json
run headline --params 25M --buckets 4 --ranks 2 --optim adam --vs-torch --shared-params
for s in $sizes; do
    run "size-$s" --params "$s" --bucket-size 25M --ranks 2 --optim adam --vs-torch
done
for shard in bucket slice; do
    for step in interleaved at_end; do
        run "mode-$shard-$step" --params 25M --buckets 4 --ranks 2 --optim adam \
            --shard "$shard" --step "$step"
    done
done
for step in interleaved at_end; do
    run "daemons-2-$step" --daemons 2 --params 25M --buckets 4 --ranks 2 --optim adam \
        --step "$step" --curve
done

/usr/bin/python3 "$top/tools/bench/perf_doc.py" "$out" "$top/docs/PERFORMANCE.md"
"$top/tools/bench/plot.sh" "$out/sweep.dat" "$top/docs/perf-iter-vs-size.png"
echo "perf-doc: wrote docs/PERFORMANCE.md, docs/perf-iter-vs-size.png and docs/perf/" >&2
