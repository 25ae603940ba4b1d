#!/usr/bin/env bash
# The include rules between folders (tools/check-layers.py, docs/LAYOUT.md):
# the source tree passes, and a copy of it with one planted break of each
# kind fails, naming the file and the line.
#   check_layers.sh SOURCE_ROOT
set -uo pipefail
src=${1:?usage: check_layers.sh SOURCE_ROOT}
check=$src/tools/check-layers.py
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
notok() { n=$((n + 1)); echo "not ok $n - $1"; sed 's/^/# /' "$tmp/out"; }

if python3 "$check" "$src" >"$tmp/out" 2>&1; then ok "the tree keeps the rules"; else notok "the tree keeps the rules"; fi

# plant FILE LINE EXPECT DESCRIPTION: a fresh copy with LINE appended to FILE
plant() {
    rm -rf "$tmp/t"
    mkdir -p "$tmp/t"
    cp -r "$src/daemon" "$src/client" "$src/common" "$src/tools" "$tmp/t/"
    printf '%s\n' "$2" >>"$tmp/t/$1"
    local line
    line=$(wc -l <"$tmp/t/$1")
    if python3 "$check" "$tmp/t" >"$tmp/out" 2>&1; then
        notok "$4: passed"
    elif grep -q "^$1:$line: .*$3" "$tmp/out"; then
        ok "$4: refused at $1:$line"
    else
        notok "$4: refused, but not naming $1:$line ($3)"
    fi
}
plant daemon/plan/zero.c '#include "ops/ops.h"' "daemon/ops is above daemon/plan" \
    "a pure layer including the operator's side"
plant daemon/core/sched.c '#include "edge/fastpath.h"' "daemon/edge is above daemon/core" \
    "the core including the edge"
plant daemon/coll/host.c '#include "optim/optim.h"' "on one level" \
    "coll including optim"
plant client/client.c '#include "../daemon/base/log.h"' "client/ never includes daemon/" \
    "the client library including the daemon"

# an entry of the known list that no longer breaks a rule is refused too
rm -rf "$tmp/t"
mkdir -p "$tmp/t"
cp -r "$src/daemon" "$src/client" "$src/common" "$src/tools" "$tmp/t/"
echo "daemon/plan/zero.c: daemon.h" >>"$tmp/t/tools/layers-known.txt"
if ! python3 "$check" "$tmp/t" >"$tmp/out" 2>&1 &&
    grep -q "^tools/layers-known.txt:[0-9]*: daemon/plan/zero.c: daemon.h breaks no rule now" "$tmp/out"; then
    ok "a stale entry of the known debts is refused"
else
    notok "a stale entry of the known debts is refused"
fi
echo "1..$n"
