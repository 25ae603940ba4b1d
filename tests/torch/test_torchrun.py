#!/usr/bin/python3
"""A real torchrun --max_restarts 2 run (Debian's torch 1.13) against a real
zerod, in which a worker is SIGKILLed twice: torchrun restarts the worker
group each time, the restarted ranks rejoin the job zerod kept (same
TORCHELASTIC_RUN_ID, the job id ZerodOptimizer takes under torchrun), and
the run's final parameters equal bit for bit an uninterrupted run's; nothing
is read from disk (issue 23 §1, §4)."""
import os
import shutil
import subprocess
import sys
import tempfile

import harness  # noqa: F401  (the import path, torch or a skip)
import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def torchrun(run, sock, out, kills):
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
           "--redirects", "1", "--tee", "1", "--log_dir", os.path.join(run, "logs-" + kills),
           os.path.join(HERE, "recovery_worker.py"), out, kills]
    p = subprocess.run(cmd, env=env, cwd=run, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=240)
    return p.returncode, p.stdout.decode(errors="replace")


def main():
    print("1..1")
    run = tempfile.mkdtemp(prefix="zd-torchrun-", dir="/tmp")
    zd, sock = harness.start_zerod(run)
    ok, why = True, []
    try:
        ref = os.path.join(run, "ref.pt")
        rc, log = torchrun(run, sock, ref, "-")
        if rc != 0:
            ok = False
            why.append(f"the uninterrupted run exited {rc}:\n{log}")
        got = os.path.join(run, "got.pt")
        # rank 1 at iteration 4 of the first round, rank 0 at iteration 9 of
        # the second: two restarts, the most --max_restarts 2 allows
        rc, log = torchrun(run, sock, got, "0:1:4,1:0:9")
        if rc != 0:
            ok = False
            why.append(f"the run with two deaths exited {rc}:\n{log}")
        if ok:
            resumed = open(got + ".resumed").read().split()
            a, b = torch.load(ref), torch.load(got)
            same = all(torch.equal(x, y) for x, y in zip(a, b))
            print(f"# resumed (restart, iteration): {resumed}")
            if not same:
                ok = False
                worst = max(float((x - y).abs().max()) for x, y in zip(a, b))
                why.append(f"final parameters differ from the uninterrupted run by {worst}")
            if resumed != ["2", "9"]:
                ok = False
                why.append(f"rank 0 finished in restart {resumed[0:1]} resumed at "
                           f"{resumed[1:2]}, want restart 2 at iteration 9")
            if open(ref + ".state.json").read() != open(got + ".state.json").read():
                ok = False
                why.append("the optimizer's step counts differ")
    finally:
        zd.terminate()
        zd.wait(timeout=20)
        zlog = open(os.path.join(run, "zerod.log")).read()
        shutil.rmtree(run, ignore_errors=True)
    if "recovered at iteration" not in zlog and ok:
        ok = False
        why.append("zerod's log names no recovery")
    for w in why:
        for line in w.splitlines()[-60:]:
            print("# " + line)
    print(("ok" if ok else "not ok") + " 1 - torchrun-max-restarts-killed-twice-equals-uninterrupted")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
