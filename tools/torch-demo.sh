#!/usr/bin/env bash
# PyTorch on zerod: install what is missing, build, start zerod on a private
# socket, and train a small MLP (tools/torch-train.py: DDP +
# ZerodOptimizer) with RANKS processes (default 3), printing the loss.
# On the CPU (DDP over gloo, zerod's host backend) unless zerod found a GPU
# (its cuda backend) and the python with torch ($ZEROD_PYTHON, else python3)
# sees one: then on the GPUs (DDP over NCCL, buffers over CUDA IPC), one rank
# per GPU (NCCL refuses two ranks on one), so at most as many ranks as GPUs.
# ZEROD_DEMO_DEVICE=cpu keeps it on the CPU.
#
#   tools/torch-demo.sh [RANKS] [ITERATIONS] [torch-train.py options...]
#   e.g. tools/torch-demo.sh 2 40 --shard slice --step-mode at_end --compare
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
ranks=${1:-3}
iters=${2:-40}
shift $(($# > 2 ? 2 : $#))
build=${BUILD_DIR:-$top/build}

# say what the silent minutes are: a first build takes about two of them
echo "== installing what is missing (tools/deps.sh), then building zerod into $build" \
    "(meson + ninja; a first build takes about 2 minutes, later ones seconds) =="
"$top/tools/deps.sh"
BUILD_DIR=$build "$top/tools/build.sh"

run=$(mktemp -d /tmp/zerod-torch-demo.XXXXXX)
zpid=
cleanup() {
    [ -z "$zpid" ] || kill "$zpid" 2>/dev/null || true
    rm -rf "$run"
}
trap cleanup EXIT
"$build/daemon/zerod" --socket "$run/zerod.sock" 2>"$run/zerod.log" &
zpid=$!
for _ in $(seq 100); do [ -S "$run/zerod.sock" ] && break; sleep 0.05; done
[ -S "$run/zerod.sock" ] || { cat "$run/zerod.log"; echo "zerod did not start" >&2; exit 1; }

py=/usr/bin/python3 # Debian's python3-torch (CPU), which tools/deps.sh installs
device=cpu
if [ "${ZEROD_DEMO_DEVICE:-auto}" != cpu ] && grep -q 'backends: cuda' "$run/zerod.log"; then
    gpy=${ZEROD_PYTHON:-python3}
    ngpu=$("$gpy" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
    if [ "$ngpu" -ge 1 ]; then
        device=cuda py=$gpy
        if [ "$ranks" -gt "$ngpu" ]; then
            echo "== $ngpu GPU(s): $ngpu rank(s), one per GPU (NCCL refuses two ranks on one) =="
            ranks=$ngpu
        fi
    fi
fi

echo "== zerod (pid $zpid) on $run/zerod.sock; $ranks ranks of tools/torch-train.py on" \
    "$device, $iters iterations =="
export ZEROD_SOCKET=$run/zerod.sock
export ZEROD_LIBZEROCLIENT=$build/client/libzeroclient.so.1
export PYTHONPATH=$top/client/python${PYTHONPATH:+:$PYTHONPATH}
export OMP_NUM_THREADS=1
pids=()
for ((r = 0; r < ranks; r++)); do
    "$py" "$top/tools/torch-train.py" --rank "$r" --world "$ranks" --device "$device" \
        --store "$run/store" --iters "$iters" "$@" >"$run/rank$r.out" 2>&1 &
    pids+=($!)
done
status=0
for ((r = 0; r < ranks; r++)); do
    wait "${pids[$r]}" || { status=1; echo "rank $r failed:" >&2; cat "$run/rank$r.out" >&2; }
done
cat "$run/rank0.out"
kill -TERM "$zpid"
wait "$zpid" || status=1
zpid=
echo "== what zerod did =="
sed -e 's/^<[0-9]>//' "$run/zerod.log" | grep -E 'plan [0-9a-f]+:|ended|served' || true
exit $status
