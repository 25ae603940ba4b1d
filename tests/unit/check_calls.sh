#!/usr/bin/env bash
# The call rules between folders (tools/check-calls.py, docs/LAYOUT.md) on
# the objects of a build: the build passes, and a copy of its objects with
# one planted object of each kind of break fails, naming the file and the
# symbol; a stale entry of the known debts fails too.
#   check_calls.sh BUILD_ROOT SOURCE_ROOT
set -uo pipefail
build=${1:?usage: check_calls.sh BUILD_ROOT SOURCE_ROOT}
src=${2:?usage: check_calls.sh BUILD_ROOT SOURCE_ROOT}
check=$src/tools/check-calls.py
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
notok() { n=$((n + 1)); echo "not ok $n - $1"; sed 's/^/# /' "$tmp/out"; }

if python3 "$check" "$build" "$src" >"$tmp/out" 2>&1; then
    ok "the build keeps the rules"
else
    notok "the build keeps the rules"
fi
# not blind: the edge calls the core's job_* by name, in every build
if python3 "$check" --graph "$build" "$src" >"$tmp/out" 2>&1 &&
    grep -qE '^edge +-> core +[1-9][0-9]* references' "$tmp/out"; then
    ok "the graph has the edge's calls into the core"
else
    notok "the graph has the edge's calls into the core"
fi

# a fresh copy of the build's objects and of the tree's daemon/ and tools/
fresh() {
    rm -rf "$tmp/b" "$tmp/s"
    mkdir -p "$tmp/b/daemon" "$tmp/s"
    cp -r "$build/daemon/"*.p "$tmp/b/daemon/"
    cp -r "$src/daemon" "$src/tools" "$tmp/s/"
}

# plant STEM CODE EXPECT DESCRIPTION: an object named as if built from
# daemon/STEM (its / as _) into libzerod's objects, compiled from CODE
plant() {
    fresh
    local obj=$tmp/b/daemon/libzerod.a.p/${1//\//_}.o
    if ! printf '%s\n' "$2" | ${CC:-cc} -c -x c - -o "$obj" 2>"$tmp/out"; then
        notok "$4: the planted object did not compile"
        return
    fi
    if python3 "$check" "$tmp/b" "$tmp/s" >"$tmp/out" 2>&1; then
        notok "$4: passed"
    elif grep -F "daemon/$1: $3" "$tmp/out" | grep -q "^daemon/$1: "; then
        ok "$4: refused at daemon/$1"
    else
        notok "$4: refused, but not naming daemon/$1: $3"
    fi
}
plant plan/planted.c 'void job_fail(void); void planted(void) { job_fail(); }' \
    "job_fail (daemon/core/job.c): core is above plan" "a pure layer calling the core"
if grep -qE '^cycle: .*plan' "$tmp/out"; then
    ok "the cycle through plan is printed"
else
    notok "the cycle through plan is printed"
fi
plant coll/planted.c 'extern char optim_cpu_ops[]; void *planted(void) { return optim_cpu_ops; }' \
    "optim_cpu_ops (daemon/optim/cpu.c): coll and optim are on one level" \
    "coll referencing optim's table"
plant base/planted.c 'void daemon_run(void); void planted(void) { daemon_run(); }' \
    "daemon_run (daemon/daemon.c): daemon/ itself is above base" \
    "the lowest layer calling the wiring on top"

# an entry of the known list that no longer breaks a rule is refused: a
# call that is allowed, and one of a symbol that is gone
fresh
printf '%s\n' "daemon/core/sched.c: job_fail" "daemon/core/job.c: session_long_gone" \
    >>"$tmp/s/tools/calls-known.txt"
python3 "$check" "$tmp/b" "$tmp/s" >"$tmp/out" 2>&1
rc=$?
for e in "daemon/core/sched.c: job_fail" "daemon/core/job.c: session_long_gone"; do
    if [ $rc = 1 ] && grep -q "^tools/calls-known.txt:[0-9]*: $e breaks no rule now" "$tmp/out"
    then
        ok "a stale entry of the known debts is refused: $e"
    else
        notok "a stale entry of the known debts is refused: $e"
    fi
done

# a build without gloo or CUDA (their objects gone) is judged on what it
# has; an entry for a file it did not build is left unjudged
fresh
rm -rf "$tmp/b/daemon/"libzerogloo.a.p "$tmp/b/daemon/"libzerocuda*.a.p \
    "$tmp/b/daemon/libzerod.a.p/"coll_gloo.c.o "$tmp/b/daemon/libzerod.a.p/"coll_sealmesh.c.o
echo "daemon/coll/gloo.c: job_fail" >>"$tmp/s/tools/calls-known.txt"
if python3 "$check" "$tmp/b" "$tmp/s" >"$tmp/out" 2>&1 &&
    grep -q "known debts ([1-9][0-9]* unjudged here)" "$tmp/out"; then
    ok "a build without gloo and CUDA passes, the absent files' entries unjudged"
else
    notok "a build without gloo and CUDA passes, the absent files' entries unjudged"
fi

# no objects is a usage error, never a pass
mkdir -p "$tmp/empty"
python3 "$check" "$tmp/empty" "$src" >"$tmp/out" 2>&1
rc=$?
if [ $rc = 2 ] && grep -q "no object" "$tmp/out"; then
    ok "a directory with no objects is refused (exit 2)"
else
    notok "a directory with no objects is refused (exit 2, got $rc)"
fi
echo "1..$n"
