#!/usr/bin/env bash
# Two builds of zerod against each other, the way a change is judged: the
# same zerod-bench job run in alternating rounds (A B A B ...), so that the
# machine's load falls on both alike, and each figure printed with its
# median, min and max over the rounds. Every round's JSON is kept.
#
#   tools/bench/ab.sh BUILD_A BUILD_B [ROUNDS] [zerod-bench args...]
#
# BUILD_A, BUILD_B: meson build directories (each its own zerod and
# zerod-bench, e.g. one of the commit before a change in a git worktree).
# ROUNDS: 6 by default. The JSON lines go to $OUT (default ab.jsonl).
set -euo pipefail
a=${1:?usage: ab.sh BUILD_A BUILD_B [ROUNDS] [zerod-bench args...]}
b=${2:?usage: ab.sh BUILD_A BUILD_B [ROUNDS] [zerod-bench args...]}
rounds=${3:-6}
shift $(($# < 3 ? $# : 3))
out=${OUT:-ab.jsonl}
: >"$out"
for ((r = 1; r <= rounds; r++)); do
    for side in A B; do
        d=$a
        [ $side = B ] && d=$b
        json=$(ZEROD_BIN=$d/daemon/zerod "$d/tools/bench/zerod-bench" --json "$@" | tr -d '\n')
        printf '{"side":"%s","round":%d,"build":"%s","bench":%s}\n' "$side" "$r" "$d" "$json" >>"$out"
        echo "round $r $side done" >&2
    done
done
python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
keys = ["zerod_comparable_ms", "zerod_iter_ms", "zerod_iter_min_ms", "zerod_fill_ms",
        "handoff_p50_us", "handoff_p99_us", "rss_vs_state"]
print("%-18s %-28s %-28s %s" % ("", "A median [min..max]", "B median [min..max]", "B/A"))
for k in keys:
    v = {s: [r["bench"][k] for r in rows if r["side"] == s and r["bench"].get(k) is not None]
         for s in "AB"}
    if not v["A"] or not v["B"]:
        continue
    m = {s: statistics.median(v[s]) for s in "AB"}
    print("%-18s %-28s %-28s %.3f" % (k, "%.3f [%.3f..%.3f]" % (m["A"], min(v["A"]), max(v["A"])),
                                     "%.3f [%.3f..%.3f]" % (m["B"], min(v["B"]), max(v["B"])),
                                     m["B"] / m["A"] if m["A"] else float("nan")))
PY
