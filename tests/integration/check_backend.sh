#!/bin/sh
# zerod --backend: "cuda" without a usable GPU refuses to start and says why,
# "auto" and "host" serve on the host backend, anything else is refused.
# On a machine with a GPU the "cuda" cases skip, saying so. Prints TAP.
zerod=$1
wrap=${ZEROD_WRAPPER:-}
dir=$(mktemp -d /tmp/zerod-backend.XXXXXX)
trap 'rm -rf "$dir"' EXIT
n=0
fail=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
notok() { n=$((n + 1)); fail=1; echo "not ok $n - $1"; }

# refuses NAME ARGS...: exits non-zero at once, with a message, no socket left
refuses() {
    name=$1; want=$2; shift 2
    if timeout 60 $wrap "$zerod" --socket "$dir/z.sock" "$@" 2>"$dir/log"; then
        notok "$name: zerod started"
    elif grep -q -e "$want" "$dir/log" && [ ! -e "$dir/z.sock" ]; then
        ok "$name"
    else
        notok "$name: no '$want' in: $(cat "$dir/log")"
    fi
}

# serves NAME ARGS...: starts, logs the host backend, stops on SIGTERM
serves() {
    name=$1; shift
    $wrap "$zerod" --socket "$dir/z.sock" -v "$@" 2>"$dir/log" &
    pid=$!
    i=0
    while [ ! -S "$dir/z.sock" ] && [ $i -lt 3000 ]; do sleep 0.02; i=$((i + 1)); done
    kill -TERM $pid 2>/dev/null; wait $pid; st=$?
    if [ $st -eq 0 ] && grep -q "(backends: [a-z, ]*host;" "$dir/log"; then ok "$name"; else
        notok "$name (exit $st): $(cat "$dir/log")"; fi
}

echo "1..4"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    n=$((n + 1)); echo "ok $n - cuda_without_gpu_refused # SKIP a GPU is visible here"
else
    refuses "cuda_without_gpu_refused" "--backend cuda: " --backend cuda
fi
refuses "unknown_backend_refused" 'unknown backend "tpu"' --backend tpu
serves "host_serves" --backend host
# with a GPU, auto serves cuda and host both: host is in the list either way
serves "auto_serves" --backend auto
exit $fail
