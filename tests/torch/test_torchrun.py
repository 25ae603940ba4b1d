#!/usr/bin/python3
"""A real torchrun --max_restarts 2 run (Debian's torch 1.13) against a real
zerod, in which a worker is SIGKILLed twice: torchrun restarts the worker
group each time, the restarted ranks rejoin the job zerod kept (same
TORCHELASTIC_RUN_ID, the job id ZerodOptimizer takes under torchrun), and
the run's final parameters, moments and step counts equal bit for bit an
uninterrupted run's; nothing is read from disk (issue 23 §1, §4). Twice:
own buffers with interleaved steps, and shared parameters with at_end."""
import os
import shutil
import subprocess
import sys
import tempfile

import harness  # noqa: F401  (the import path, torch or a skip)
import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def torchrun(run, sock, out, kills, opts):
    env = dict(os.environ)
    env["ZEROD_SOCKET"] = sock
    env.setdefault("ZEROD_LIBZEROCLIENT", harness.libzeroclient())
    env["PYTHONPATH"] = os.path.join(harness.TOP, "client", "python") + (
        ":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    # torchrun's own code with the options Debian's torch 1.13 needs under
    # Python 3.11 (README; harness.py): --redirects and --tee given, or it
    # fails before any worker starts; the monitor polls every 5 s unless told
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc_per_node", "2", "--max_restarts", "2", "--monitor_interval", "0.2",
           "--redirects", "1", "--tee", "1", "--log_dir", os.path.join(run, "logs-" + kills + opts),
           os.path.join(HERE, "recovery_worker.py"), out, kills, opts]
    p = subprocess.run(cmd, env=env, cwd=run, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=240)
    return p.returncode, p.stdout.decode(errors="replace")


CASES = [
    # (name, ZerodOptimizer's options for recovery_worker.py)
    ("torchrun-max-restarts-killed-twice-equals-uninterrupted", "-"),
    ("torchrun-shared-params-at-end-killed-twice-equals-uninterrupted", "shared,at_end"),
]


def one_case(run, sock, opts):
    """The uninterrupted run and the run with two deaths: (ok, why)."""
    ok, why = True, []
    ref = os.path.join(run, "ref" + opts + ".pt")
    rc, log = torchrun(run, sock, ref, "-", opts)
    if rc != 0:
        ok = False
        why.append(f"the uninterrupted run exited {rc}:\n{log}")
    got = os.path.join(run, "got" + opts + ".pt")
    # rank 1 at iteration 4 of the first round, rank 0 at iteration 9 of
    # the second: two restarts, the most --max_restarts 2 allows
    rc, log = torchrun(run, sock, got, "0:1:4,1:0:9", opts)
    if rc != 0:
        ok = False
        why.append(f"the run with two deaths exited {rc}:\n{log}")
    if ok:
        resumed = open(got + ".resumed").read().split()
        a, b = torch.load(ref), torch.load(got)
        same = len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))
        print(f"# {opts}: resumed (restart, iteration): {resumed}")
        if not same:
            ok = False
            worst = max(float((x - y).abs().max()) for x, y in zip(a, b))
            why.append(f"final parameters and moments differ from the uninterrupted run by "
                       f"{worst}")
        if resumed != ["2", "9"]:
            ok = False
            why.append(f"rank 0 finished in restart {resumed[0:1]} resumed at "
                       f"{resumed[1:2]}, want restart 2 at iteration 9")
        if open(ref + ".state.json").read() != open(got + ".state.json").read():
            ok = False
            why.append("the optimizer's step counts differ")
    return ok, why


def main():
    print(f"1..{len(CASES)}")
    run = tempfile.mkdtemp(prefix="zd-torchrun-", dir="/tmp")
    zd, sock = harness.start_zerod(run)
    results = []
    try:
        for name, opts in CASES:
            results.append((name,) + one_case(run, sock, opts))
    finally:
        zd.terminate()
        zd.wait(timeout=20)
        zlog = open(os.path.join(run, "zerod.log")).read()
        shutil.rmtree(run, ignore_errors=True)
    failed = 0
    for k, (name, ok, why) in enumerate(results):
        if ok and zlog.count("recovered at iteration") < 2 * (k + 1):
            ok = False
            why.append("zerod's log names fewer recoveries than the runs made")
        for w in why:
            for line in w.splitlines()[-60:]:
                print("# " + line)
        print(("ok" if ok else "not ok") + f" {k + 1} - {name}")
        failed += not ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
