#!/usr/bin/env bash
# The main job: install what is missing, build, start zerod on a private
# socket, train a small MLP with RANKS trainer processes (default 3) through
# it on the host backend, print the loss per iteration and what the daemon
# did, and stop everything.
#
#   tools/demo.sh [RANKS] [ITERATIONS]
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
ranks=${1:-3}
iters=${2:-40}
build=${BUILD_DIR:-$top/build}

"$top/tools/deps.sh"
BUILD_DIR=$build "$top/tools/build.sh"

run=$(mktemp -d /tmp/zerod-demo.XXXXXX)
daemon_pid=""
cleanup() {
    [ -n "$daemon_pid" ] && kill "$daemon_pid" 2>/dev/null || true
    rm -rf "$run"
}
trap cleanup EXIT

"$build/daemon/zerod" --socket "$run/zerod.sock" 2>"$run/zerod.log" &
daemon_pid=$!
for _ in $(seq 100); do [ -S "$run/zerod.sock" ] && break; sleep 0.05; done
[ -S "$run/zerod.sock" ] || { cat "$run/zerod.log"; echo "zerod did not start" >&2; exit 1; }

echo "== zerod (pid $daemon_pid) on $run/zerod.sock; $ranks trainers, $iters iterations, AdamW =="
pids=()
for ((r = 0; r < ranks; r++)); do
    "$build/tools/zerod-demo-trainer" -s "$run/zerod.sock" -r "$r" -w "$ranks" -i "$iters" \
        >"$run/rank$r.out" 2>"$run/rank$r.err" &
    pids+=($!)
done
status=0
for ((r = 0; r < ranks; r++)); do
    wait "${pids[$r]}" || { status=1; echo "rank $r failed:" >&2; cat "$run/rank$r.err" >&2; }
done
cat "$run/rank0.out"

kill -TERM "$daemon_pid"
wait "$daemon_pid" || status=1
daemon_pid=""
echo "== what zerod did =="
sed -e 's/^<[0-9]>//' "$run/zerod.log" | grep -E 'plan [0-9a-f]+:|ended|served' || true
exit $status
