#!/usr/bin/env bash
# The bench suite: a few seconds of zerod-bench (small job, few iterations,
# a small memcpy) must run and print one JSON object with every key the
# issue asks for. It asserts nothing about speed.
#
#   check_bench.sh PATH/TO/zerod-bench        (ZEROD_BIN names the daemon)
set -uo pipefail
bench=$1
out=$(mktemp)
err=$(mktemp)
trap 'rm -f "$out" "$err"' EXIT

echo "1..2"
if "$bench" --params 200K --buckets 2 --ranks 2 --optim adam --iters 5 --warmup 1 \
    --handoff-iters 200 --memcpy-size 16M --json >"$out" 2>"$err"; then
    echo "ok 1 - zerod-bench ran"
else
    echo "not ok 1 - zerod-bench failed"
    sed 's/^/# /' "$err"
fi

if python3 - "$out" <<'PY'; then
import json, sys
keys = """zerod_iter_ms torch_iter_ms fused_ref_ms floor_iter_ms handoff_p50_us
handoff_p99_us unix_rtt_us memcpy_gbps triad_gbps daemon_rss_anon_bytes state_bytes
vs_torch vs_fused handoff_vs_unix rss_vs_state params buckets ranks optim shard step""".split()
try:
    j = json.load(open(sys.argv[1]))
except ValueError as e:
    print(f"# not one JSON object: {e}")
    sys.exit(1)
missing = [k for k in keys if k not in j]
if missing:
    print(f"# missing keys: {' '.join(missing)}")
    sys.exit(1)
# Measured without torch: these must be numbers; torch's are null.
bad = [k for k in keys if k not in ("torch_iter_ms", "vs_torch", "optim", "shard", "step")
       and not isinstance(j[k], (int, float))]
if bad or j["torch_iter_ms"] is not None:
    print(f"# not numbers: {' '.join(bad)}; torch_iter_ms = {j['torch_iter_ms']}")
    sys.exit(1)
PY
    echo "ok 2 - one JSON object with every key"
else
    echo "not ok 2 - JSON output"
    sed 's/^/# /' "$out"
fi
