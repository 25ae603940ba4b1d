#!/bin/sh
# Where zerod puts its socket: --socket, else $ZEROD_SOCKET, else
# $RUNTIME_DIRECTORY/zerod.sock (the first of several); none: exit 2 with a
# message. Every socket is mode 0660 and gone after SIGTERM. Prints TAP.
# zerod runs under $ZEROD_WRAPPER (valgrind) when that is set, and its waits
# scale with $ZEROD_TEST_TIMEOUT_SCALE, as in the harness.
zerod=$1
wrap=${ZEROD_WRAPPER:-}
scale=${ZEROD_TEST_TIMEOUT_SCALE:-1}
scale=${scale%%.*}
tries=$((200 * ${scale:-1}))
dir=$(mktemp -d /tmp/zerod-path.XXXXXX)
trap 'rm -rf "$dir"' EXIT
n=0
fail=0

ok() { n=$((n + 1)); echo "ok $n - $1"; }
notok() { n=$((n + 1)); fail=1; echo "not ok $n - $1"; }

# run_case NAME EXPECTED_SOCKET ENV... -- ARGS...
serve() {
    name=$1; want=$2; shift 2
    env -u ZEROD_SOCKET -u RUNTIME_DIRECTORY "$@" 2>"$dir/log" &
    pid=$!
    i=0
    while [ ! -S "$want" ] && [ $i -lt $tries ]; do sleep 0.02; i=$((i + 1)); done
    if [ -S "$want" ] && [ "$(stat -c %a "$want")" = 660 ]; then
        kill -TERM $pid; wait $pid; st=$?
        if [ $st -eq 0 ] && [ ! -e "$want" ]; then ok "$name"; else
            notok "$name (exit $st, socket left: $(ls "$want" 2>/dev/null))"; fi
    else
        kill -KILL $pid 2>/dev/null; wait $pid 2>/dev/null
        notok "$name (no socket at $want with mode 0660)"; sed 's/^/# /' "$dir/log"
    fi
}

echo "1..5"
mkdir -p "$dir/a" "$dir/b" "$dir/rt1" "$dir/rt2"
serve "--socket wins over the environment" "$dir/a/s.sock" \
    ZEROD_SOCKET="$dir/b/s.sock" RUNTIME_DIRECTORY="$dir/rt1" $wrap "$zerod" --socket "$dir/a/s.sock"
serve "ZEROD_SOCKET wins over RUNTIME_DIRECTORY" "$dir/b/s.sock" \
    ZEROD_SOCKET="$dir/b/s.sock" RUNTIME_DIRECTORY="$dir/rt1" $wrap "$zerod"
serve "RUNTIME_DIRECTORY/zerod.sock" "$dir/rt1/zerod.sock" \
    RUNTIME_DIRECTORY="$dir/rt1" $wrap "$zerod"
serve "the first of several RUNTIME_DIRECTORY entries" "$dir/rt2/zerod.sock" \
    RUNTIME_DIRECTORY="$dir/rt2:$dir/rt1" $wrap "$zerod"
env -u ZEROD_SOCKET -u RUNTIME_DIRECTORY $wrap "$zerod" 2>"$dir/log"
st=$?
if [ $st -eq 2 ] && grep -q "no socket path" "$dir/log"; then ok "no path: exit 2, says why"; else
    notok "no path: exit $st"; sed 's/^/# /' "$dir/log"; fi
exit $fail
