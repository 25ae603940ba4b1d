#!/usr/bin/env bash
# Regenerate docs/PERFORMANCE.md with one command: install what the benchmark
# needs (python3-torch, gnuplot), build, run zerod-bench in alternating
# rounds (every configuration once per round, round after round: the
# headline, a sweep over model sizes, the four shard/step modes, two daemons
# on loopback, plain and over TLS 1.3 with openssl speed beside them, the GPU
# rows, a trainer's death), keep every run's JSON in docs/perf/NAME/, and
# write the document (each figure as median [min–max] over the rounds) and
# its plot from them.
#
#   tools/bench/perf-doc.sh                  5 rounds (about 30 minutes on 2 cores)
#   ROUNDS=7 tools/bench/perf-doc.sh         more rounds
#   QUICK=1 tools/bench/perf-doc.sh          the pipeline in a few minutes: 2 rounds,
#                                            small jobs, into $OUT (default
#                                            /tmp/zerod-perf-quick), docs/ untouched
#   ONLY='daemons-*' tools/bench/perf-doc.sh only those configurations again
#
# The systems inside one run are measured back to back (zerod-bench: the
# floors, zerod, then torch's anchor, whose kinds alternate iteration by
# iteration), and the rounds alternate the configurations, so a neighbour's
# burst falls on one round of everything rather than on one system. Each run
# first waits (at most QUIET_WAIT_S seconds, default 20) for the 1-minute load
# average to drop under QUIET_LOAD (default 0.7); the machine is shared, so it
# may not, and every run's JSON records the load average it began and ended
# at, the commit, the machine and the round.
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-$top/build}
quick=${QUICK:-}
if [ -n "$quick" ]; then
    out=${OUT:-/tmp/zerod-perf-quick}
    doc=${DOC:-$out/PERFORMANCE.md}
    png=${PNG:-$out/perf-iter-vs-size.png}
    rounds=${ROUNDS:-2}
    sizes=${SIZES:-"1M 5M"}
    head_params=${HEAD_PARAMS:-5M}
    short=(--iters 6 --warmup 2 --handoff-iters 300 --memcpy-size 64M)
    phases_short=(--iters 6 --warmup 2)
else
    out=${OUT:-$top/docs/perf}
    doc=${DOC:-$top/docs/PERFORMANCE.md}
    png=${PNG:-$top/docs/perf-iter-vs-size.png}
    rounds=${ROUNDS:-5}
    sizes=${SIZES:-"1M 2.5M 5M 10M 25M 50M"}
    head_params=${HEAD_PARAMS:-25M}
    short=()
    phases_short=()
fi
quiet_load=${QUIET_LOAD:-0.7}
quiet_wait=${QUIET_WAIT_S:-20}

if [ -z "${SKIP_DEPS:-}" ]; then
    "$top/tools/deps.sh"
    "$top/tools/bench/bench-deps.sh"
fi
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
dirty=$(git -C "$top" status --porcelain --untracked-files=no 2>/dev/null | grep -qv '^.. docs/' && echo true || echo false)

# run NAME ROUND ARGS...: one zerod-bench --json run into $out/NAME/round-ROUND.json,
# with the commit, the machine, the round and the load around it.
run() {
    local name=$1 round=$2
    shift 2
    # shellcheck disable=SC2053
    if [ -n "${ONLY:-}" ] && [[ $name != $ONLY ]]; then
        return
    fi
    mkdir -p "$out/$name"
    wait_quiet
    local f=$out/$name/round-$round.json
    echo "perf-doc: round $round/$rounds: zerod-bench $* --json > $f" >&2
    local load0 t0
    load0=$(cut -d' ' -f1-3 /proc/loadavg)
    t0=$(date -u +%FT%TZ)
    if ! "$bench" "$@" --json >"$f.tmp"; then
        echo "perf-doc: $name round $round failed; its JSON is not kept" >&2
        rm -f "$f.tmp"
        return
    fi
    stamp "$f" "$t0" "$load0" "$round" "$name" "$*"
}

# phases ROUND: tools/bench/torch_phases.py (where DDP + ZerodOptimizer's
# iteration goes, and zerod's CPU per iteration) into $out/phases/.
phases() {
    local round=$1 name=phases
    # shellcheck disable=SC2053
    if [ -n "${ONLY:-}" ] && [[ $name != $ONLY ]]; then
        return
    fi
    mkdir -p "$out/$name"
    wait_quiet
    local f=$out/$name/round-$round.json load0 t0
    echo "perf-doc: round $round/$rounds: torch_phases.py > $f" >&2
    load0=$(cut -d' ' -f1-3 /proc/loadavg)
    t0=$(date -u +%FT%TZ)
    if ! /usr/bin/python3 "$top/tools/bench/torch_phases.py" --zerod "$build/daemon/zerod" \
        --libzeroclient "$build/client/libzeroclient.so.1" --params "$(params_n "$head_params")" \
        "${phases_short[@]}" | tail -n 1 >"$f.tmp"; then
        echo "perf-doc: phases round $round failed; its JSON is not kept" >&2
        rm -f "$f.tmp"
        return
    fi
    stamp "$f" "$t0" "$load0" "$round" "$name" "torch_phases.py"
}

# 25M -> 25000000 (zerod-bench's decimal K/M/G, for the Python scripts)
params_n() {
    /usr/bin/python3 -c 'import sys; s = sys.argv[1]; m = {"K": 1e3, "M": 1e6, "G": 1e9}
print(int(float(s[:-1]) * m[s[-1]]) if s[-1] in m else int(s))' "$1"
}

# stamp FILE START LOAD ROUND NAME ARGS: FILE.tmp with the commit, the machine,
# the round and the load around it, moved to FILE.
stamp() {
    local f=$1 t0=$2 load0=$3 round=$4 name=$5 args=$6
    /usr/bin/python3 - "$f.tmp" "$commit" "$dirty" "$t0" "$load0" "$round" "$name" "$args" <<'PY'
import json, os, sys
p, commit, dirty, t0, load0, rnd, name, args = sys.argv[1:]
j = json.load(open(p))
model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
              if l.startswith("model name")), "?")
mem = int(open("/proc/meminfo").readline().split()[1])
j.update({
    "config": name, "round": int(rnd), "args": args,
    "commit": commit, "dirty": dirty == "true",
    "started": t0, "date": t0[:10],
    "loadavg_start_1_5_15": [float(x) for x in load0.split()],
    "loadavg_end_1_5_15": [float(x) for x in open("/proc/loadavg").read().split()[:3]],
    "machine": {"cpu": model, "cpus": os.cpu_count(), "mem_gib": round(mem / 2**20, 1),
                "kernel": os.uname().release},
})
open(p, "w").write(json.dumps(j, indent=2) + "\n")
PY
    mv "$f.tmp" "$f"
}

if [ -z "${ONLY:-}" ]; then
    rm -rf "$out"/*/ "$out"/*.json
else
    for d in "$out"/*/; do
        # shellcheck disable=SC2053
        [ -d "$d" ] && [[ $(basename "$d") == $ONLY ]] && rm -rf "$d"
    done
fi
for ((r = 1; r <= rounds; r++)); do
    run headline "$r" --params "$head_params" --buckets 4 --ranks 2 --optim adam \
        --torch-zerod --torch-plain --shared-params "${short[@]}"
    phases "$r"
    for s in $sizes; do
        run "size-$s" "$r" --params "$s" --bucket-size 25M --ranks 2 --optim adam \
            --torch-zerod "${short[@]}"
    done
    for shard in bucket slice; do
        for step in interleaved at_end; do
            run "mode-$shard-$step" "$r" --params "$head_params" --buckets 4 --ranks 2 \
                --optim adam --shard "$shard" --step "$step" "${short[@]}"
        done
    done
    for step in interleaved at_end; do
        run "daemons-2-$step" "$r" --daemons 2 --params "$head_params" --buckets 4 --ranks 2 \
            --optim adam --step "$step" --tls "${short[@]:0:4}"
    done
    run gpu "$r" --gpu --params "$head_params"
    run recovery "$r" --recovery=1 --params "$head_params" --buckets 4 --ranks 2 --optim adam
    run recovery-daemons-2 "$r" --recovery=1 --daemons 2 --params "$head_params" --buckets 4 \
        --ranks 2 --optim adam
done

/usr/bin/python3 "$top/tools/bench/perf_doc.py" "$out" "$doc"
"$top/tools/bench/plot.sh" "$out/sweep.dat" "$png"
echo "perf-doc: wrote $doc, $png and $out/" >&2
