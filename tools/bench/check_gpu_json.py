#!/usr/bin/python3
"""check_gpu_json.py: the rule of zerod-bench --gpu's JSON (check_bench.sh,
test 5): every row either ran, with its numbers, or did not, with a reason
that starts "not run" and no number at all. Exits 1 saying what broke it.

    check_gpu_json.py FILE
"""
import json
import sys

ROWS = ("nccl_busbw", "adam_gbps", "handoff_cuda", "ddp_cuda")


def check(j):
    if j.get("schema") != "zerod-bench-gpu/1":
        return "schema is not zerod-bench-gpu/1"
    for name in ROWS:
        row = j.get(name)
        if not isinstance(row, dict) or not isinstance(row.get("ran"), bool):
            return f"{name}: no row with a boolean 'ran'"
        nums = [k for k, v in row.items() if isinstance(v, (int, float))
                and not isinstance(v, bool)]
        if not row["ran"]:
            if not str(row.get("why", "")).startswith("not run"):
                return f"{name}: did not run and does not say why"
            if nums:
                return f"{name}: did not run but prints numbers: {' '.join(nums)}"
        elif not nums:
            return f"{name}: ran but printed no number"
    return None


if __name__ == "__main__":
    try:
        err = check(json.load(open(sys.argv[1])))
    except ValueError as e:
        err = f"not one JSON object: {e}"
    if err:
        print(f"# {err}")
        sys.exit(1)
