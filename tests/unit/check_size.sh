#!/usr/bin/env bash
# The size rules of the product code (tools/check-size.py): the source tree
# passes, and a copy with a planted function of 101 lines, or a file of
# 1,201 lines whose opening comment does not say why, fails naming it.
#   check_size.sh SOURCE_ROOT
set -uo pipefail
src=${1:?usage: check_size.sh SOURCE_ROOT}
check=$src/tools/check-size.py
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
notok() { n=$((n + 1)); echo "not ok $n - $1"; sed 's/^/# /' "$tmp/out"; }

if python3 "$check" "$src" >"$tmp/out" 2>&1; then ok "the tree keeps the rules"; else notok "the tree keeps the rules"; fi

fresh() {
    rm -rf "$tmp/t"
    mkdir -p "$tmp/t/tools"
    cp -r "$src/daemon" "$src/client" "$src/common" "$tmp/t/"
    cp -r "$src/tools/zeroctl" "$tmp/t/tools/"
}
# body N: a function of N lines appended to daemon/plan/zero.c
body() {
    printf 'int planted_fn(void);\nint planted_fn(void)\n{\n'
    for ((i = 0; i < $1; i++)); do printf '\t(void)0;\n'; done
    printf '\treturn 0;\n}\n'
}
fresh
start=$(($(wc -l <"$tmp/t/daemon/plan/zero.c") + 2)) # its signature
body 99 >>"$tmp/t/daemon/plan/zero.c" # 100 lines with its return
if python3 "$check" "$tmp/t" >"$tmp/out" 2>&1; then ok "a function of 100 lines passes"; else notok "a function of 100 lines passes"; fi
fresh
body 100 >>"$tmp/t/daemon/plan/zero.c"
if ! python3 "$check" "$tmp/t" >"$tmp/out" 2>&1 &&
    grep -q "^daemon/plan/zero.c:$start: function planted_fn is 101 lines" "$tmp/out"; then
    ok "a function of 101 lines is refused at daemon/plan/zero.c:$start"
else
    notok "a function of 101 lines is refused at daemon/plan/zero.c:$start"
fi

# a file of 1,201 lines: refused, unless its opening comment says why
fresh
f=$tmp/t/client/planted.c
{ echo "/* planted.c — a long file */"; for ((i = 1; i < 1201; i++)); do echo "/* line $i */"; done; } >"$f"
if ! python3 "$check" "$tmp/t" >"$tmp/out" 2>&1 && grep -q "^client/planted.c:1: 1201 lines" "$tmp/out"; then
    ok "a file of 1,201 lines is refused"
else
    notok "a file of 1,201 lines is refused"
fi
sed -i '1s|.*|/* planted.c — a long file: over 1,200 lines, because ... */|' "$f"
if python3 "$check" "$tmp/t" >"$tmp/out" 2>&1; then ok "one whose opening comment says why passes"; else notok "one whose opening comment says why passes"; fi
echo "1..$n"
