#!/usr/bin/python3
"""check.py — the ops suite's checks of what zerod and zeroctl write.

  check.py json SCHEMA FILE   FILE (zeroctl -o json) is valid against SCHEMA
  check.py metrics FILE       FILE is Prometheus text exposition zerod's way:
                              promtool check metrics (if installed), Python's
                              prometheus_client parser, and our own rules
  check.py trace FILE         FILE is a Chrome trace (traceEvents) Perfetto
                              opens; prints the count of events by name

Exit 0 if the check passed; else 1, with every reason on stderr.
"""
import json
import re
import shutil
import subprocess
import sys


def fail(msgs):
    for m in msgs:
        print(m, file=sys.stderr)
    return 1 if msgs else 0


def check_json(schema_path, path):
    import jsonschema

    schema = json.load(open(schema_path))
    doc = json.load(open(path))
    jsonschema.Draft202012Validator.check_schema(schema)
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(doc), key=str)
    return fail([f"{path}: {'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors])


def check_metrics(path):
    text = open(path).read()
    errs = []
    promtool = shutil.which("promtool")
    if promtool:
        p = subprocess.run([promtool, "check", "metrics"], input=text, text=True,
                           capture_output=True)
        if p.returncode != 0 or p.stdout.strip() or p.stderr.strip():
            errs.append(f"promtool check metrics: {p.returncode}: {p.stdout}{p.stderr}")
        print("promtool check metrics: " + ("ok" if not errs else "FAILED"))
    else:
        print("promtool: not installed (Debian's prometheus package); the other parsers run")
    from prometheus_client.parser import text_string_to_metric_families

    families = {f.name: f for f in text_string_to_metric_families(text)}
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    helps = set(re.findall(r"^# HELP (\S+) ", text, re.M))
    for name, kind in types.items():
        if not name.startswith("zerod_"):
            errs.append(f"{name}: not prefixed zerod_")
        if name not in helps:
            errs.append(f"{name}: no HELP")
        if kind == "counter" and not name.endswith("_total"):
            errs.append(f"{name}: a counter whose name does not end in _total")
        if kind != "counter" and name.endswith("_total"):
            errs.append(f"{name}: a {kind} named like a counter")
        if re.search(r"_(ms|milliseconds|us|kb|mb|kib|mib)(_|$)", name):
            errs.append(f"{name}: not in base units")
    for line in text.splitlines():
        if line and not line.startswith("#"):
            sample = line.split("{")[0].split(" ")[0]
            base = re.sub(r"_(bucket|sum|count)$", "", sample)
            if sample not in types and base not in types:
                errs.append(f"{sample}: a sample without # TYPE")
    for want in ("zerod_build_info", "zerod_iteration_seconds", "zerod_handoff_seconds",
                 "zerod_errors", "zerod_state_bytes", "zerod_reduced_bytes"):
        if want not in families:
            errs.append(f"{want}: missing")
    for name, kind in types.items():
        if kind != "histogram":
            continue
        buckets = [float(v) for v in re.findall(
            rf'^{name}_bucket{{le="[^"]+"}} (\S+)$', text, re.M)]
        count = re.search(rf"^{name}_count (\S+)$", text, re.M)
        if not buckets or buckets != sorted(buckets):
            errs.append(f"{name}: buckets not cumulative: {buckets}")
        if not count or float(count.group(1)) != buckets[-1]:
            errs.append(f"{name}: +Inf bucket differs from _count")
    print(f"{len(families)} metric families")
    return fail(errs)


def check_trace(path):
    doc = json.load(open(path))
    errs = []
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        return fail([f"{path}: no traceEvents list"])
    counts = {}
    for i, e in enumerate(events):
        for k in ("name", "ph", "pid", "tid"):
            if k not in e:
                errs.append(f"event {i}: no {k}: {e}")
        ph = e.get("ph")
        if ph not in ("X", "i", "M"):
            errs.append(f"event {i}: phase {ph!r}")
        if ph in ("X", "i") and not (isinstance(e.get("ts"), (int, float)) and e["ts"] >= 0):
            errs.append(f"event {i}: ts {e.get('ts')!r}")
        if ph == "X" and not (isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0):
            errs.append(f"event {i}: dur {e.get('dur')!r}")
        if ph in ("X", "i") and "iteration" not in e.get("args", {}):
            errs.append(f"event {i}: no args.iteration")
        counts[e.get("name")] = counts.get(e.get("name"), 0) + 1
    print(" ".join(f"{k}={v}" for k, v in sorted(counts.items(), key=lambda kv: str(kv[0]))))
    return fail(errs)


def main(argv):
    if len(argv) == 4 and argv[1] == "json":
        return check_json(argv[2], argv[3])
    if len(argv) == 3 and argv[1] == "metrics":
        return check_metrics(argv[2])
    if len(argv) == 3 and argv[1] == "trace":
        return check_trace(argv[2])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
