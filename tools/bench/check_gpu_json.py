#!/usr/bin/python3
"""check_gpu_json.py: the rule of zerod-bench --gpu's JSON (check_bench.sh,
test 5): every row either ran, with its numbers, or did not, with a reason
that starts "not run" and no number at all. Exits 1 saying what broke it.

    check_gpu_json.py FILE [--ran ROW[:KEY,KEY...] ...]

--ran (the bench-gpu-double test, zerod-bench's GPU code on the CUDA test
double): each ROW named must have run, and each KEY given be a number in it
(not null: a measurement that failed inside a row that ran).
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


def check_ran(j, wants):
    for want in wants:
        name, _, keys = want.partition(":")
        row = j.get(name) or {}
        if not row.get("ran"):
            return f"{name}: did not run ({row.get('why', 'no row')})"
        for k in filter(None, keys.split(",")):
            v = row.get(k)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v != v or v <= 0:
                return f"{name}: {k} is {v!r}, not a positive number"
    return None


if __name__ == "__main__":
    args = sys.argv[1:]
    wants = [args[i + 1] for i, a in enumerate(args) if a == "--ran" and i + 1 < len(args)]
    try:
        j = json.load(open(args[0]))
        err = check(j) or check_ran(j, wants)
    except ValueError as e:
        err = f"not one JSON object: {e}"
    if err:
        print(f"# {err}")
        sys.exit(1)
