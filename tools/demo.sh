#!/usr/bin/env bash
# The main job: install what is missing, build, start zerod on a private
# socket, train a small MLP with RANKS trainer processes (default 3) through
# it on the host backend, print the loss per iteration and what the daemon
# did, and stop everything.
#
#   tools/demo.sh [--nodes 2] [RANKS] [ITERATIONS]
#   tools/demo.sh --torch [RANKS] [ITERATIONS] [torch-train.py options]
#
# --torch: the same with PyTorch instead of the C trainer: DDP over gloo and
# zerod.torch.ZerodOptimizer (tools/torch-demo.sh, tools/torch-train.py).
# --nodes 2: two zerods, each on its own socket, as two nodes on loopback;
# the first half of the ranks on node 0, whose zerod serves the rendezvous
# on a free port, the rest on node 1 (gloo between the two).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
if [ "${1:-}" = "--torch" ]; then
    shift
    exec "$top/tools/torch-demo.sh" "$@"
fi
nodes=1
if [ "${1:-}" = "--nodes" ]; then
    nodes=${2:?--nodes needs a number}
    shift 2
fi
[ "$nodes" = 1 ] || [ "$nodes" = 2 ] || { echo "demo: --nodes 1 or 2" >&2; exit 2; }
ranks=${1:-3}
iters=${2:-40}
build=${BUILD_DIR:-$top/build}
[ "$ranks" -ge "$nodes" ] || { echo "demo: fewer ranks than nodes" >&2; exit 2; }

# say what the silent minutes are: a first build takes about two of them
echo "== installing what is missing (tools/deps.sh), then building zerod into $build" \
    "(meson + ninja; a first build takes about 2 minutes, later ones seconds) =="
"$top/tools/deps.sh"
BUILD_DIR=$build "$top/tools/build.sh"

run=$(mktemp -d /tmp/zerod-demo.XXXXXX)
daemon_pids=()
cleanup() {
    for p in "${daemon_pids[@]}"; do kill "$p" 2>/dev/null || true; done
    rm -rf "$run"
}
trap cleanup EXIT

for ((n = 0; n < nodes; n++)); do
    "$build/daemon/zerod" --socket "$run/zerod$n.sock" 2>"$run/zerod$n.log" &
    daemon_pids+=($!)
done
for ((n = 0; n < nodes; n++)); do
    for _ in $(seq 100); do [ -S "$run/zerod$n.sock" ] && break; sleep 0.05; done
    [ -S "$run/zerod$n.sock" ] || { cat "$run/zerod$n.log"; echo "zerod did not start" >&2; exit 1; }
done

# rank r runs on node r / per_node; ranks of a node are numbered from 0 there
per_node=$(((ranks + nodes - 1) / nodes))
if [ "$nodes" = 2 ]; then
    # a TCP port nobody listens on, and a secret for this run only
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    export ZEROD_RDZV=127.0.0.1:$port ZEROD_NNODES=2
    ZEROD_JOB_SECRET=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
    export ZEROD_JOB_SECRET
    echo "== 2 zerods (pids ${daemon_pids[*]}), rendezvous on $ZEROD_RDZV; $ranks trainers" \
        "($per_node on node 0), $iters iterations, AdamW =="
else
    echo "== zerod (pid ${daemon_pids[0]}) on $run/zerod0.sock; $ranks trainers, $iters iterations, AdamW =="
fi
pids=()
for ((r = 0; r < ranks; r++)); do
    n=$((r / per_node))
    here=$((n + 1 < nodes ? per_node : ranks - n * per_node))
    "$build/tools/zerod-demo-trainer" -s "$run/zerod$n.sock" -r "$r" -w "$ranks" -i "$iters" \
        -l $((r - n * per_node)) -n "$here" >"$run/rank$r.out" 2>"$run/rank$r.err" &
    pids+=($!)
done
status=0
for ((r = 0; r < ranks; r++)); do
    wait "${pids[$r]}" || { status=1; echo "rank $r failed:" >&2; cat "$run/rank$r.err" >&2; }
done
cat "$run/rank0.out"

for ((n = 0; n < nodes; n++)); do
    kill -TERM "${daemon_pids[$n]}"
    wait "${daemon_pids[$n]}" || status=1
done
daemon_pids=()
for ((n = 0; n < nodes; n++)); do
    [ "$nodes" = 1 ] && echo "== what zerod did ==" || echo "== what the zerod of node $n did =="
    sed -e 's/^<[0-9]>//' "$run/zerod$n.log" |
        grep -E 'plan [0-9a-f]+:|formed|rendezvous|ended|served' || true
done
exit $status
