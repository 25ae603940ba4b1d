"""The torch suite's harness: every case starts its own zerod on a private
socket and its own rank processes (gloo over loopback, a file store), with a
timeout; the case file prints TAP.

A case file defines CASES = {name: dict(world=..., env={...}, ...)} and
rank_main(case, cfg, rank, world) -> dict (rank 0's dict is reported);
it ends with harness.main(CASES, rank_main). A case whose rank raises
Skip(reason) is reported as skipped (never as passed).
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(TOP, "client", "python"))

SKIP_EXIT = 77
RTOL, ATOL = 1e-5, 1e-6


class Skip(Exception):
    pass


try:
    import torch  # noqa: F401  (the case files import it too)
except ImportError as e:
    print(f"1..0 # SKIP no torch for {sys.executable} ({e}): tools/deps.sh installs "
          "python3-torch")
    sys.exit(0)


def zerod_bin():
    return os.environ.get("ZEROD_BIN") or os.path.join(TOP, "build", "daemon", "zerod")


def libzeroclient():
    return os.environ.get("ZEROD_LIBZEROCLIENT") or os.path.join(TOP, "build", "client",
                                                                "libzeroclient.so.1")


def start_zerod(run, double=False):
    """zerod, or (double) zerod-double --backend cuda: the daemon linked
    with the CUDA test double ($ZEROD_DOUBLE_BIN, tests/gpu/cudadouble.c)."""
    sock = os.path.join(run, "zerod.sock")
    log = open(os.path.join(run, "zerod.log"), "w")
    cmd = [os.environ["ZEROD_DOUBLE_BIN"], "--backend", "cuda"] if double else [zerod_bin()]
    p = subprocess.Popen(cmd + ["--socket", sock], stdout=log, stderr=log)
    for _ in range(400):
        if os.path.exists(sock) or p.poll() is not None:
            break
        time.sleep(0.025)
    if not os.path.exists(sock):
        p.kill()
        raise RuntimeError("zerod did not start: " + open(log.name).read())
    return p, sock


def missing(part):
    """Why the library cannot do part (zerod._lib.PARTS), or None."""
    os.environ.setdefault("ZEROD_LIBZEROCLIENT", libzeroclient())
    from zerod import _lib
    try:
        _lib.Lib.get().require(part)
    except NotImplementedError as e:
        return str(e)
    return None


def run_case(script, name, cfg, timeout):
    """(status, result dict or reason): status 'ok', 'fail', 'skip'."""
    why = missing(cfg["needs"]) if cfg.get("needs") else None
    if not why and cfg.get("double") and not (os.environ.get("ZEROD_DOUBLE_BIN") and
                                              os.environ.get("ZEROD_CUDADOUBLE")):
        why = "no CUDA test double ($ZEROD_DOUBLE_BIN, $ZEROD_CUDADOUBLE: a build with CUDA)"
    if why:
        return "skip", why
    run = tempfile.mkdtemp(prefix="zerod-torch-")
    zerod = None
    procs = []
    try:
        zerod, sock = start_zerod(run, bool(cfg.get("double")))
        env = dict(os.environ, ZEROD_SOCKET=sock, OMP_NUM_THREADS="1", ZEROD_TORCH_RUN=run,
                   ZEROD_LIBZEROCLIENT=libzeroclient(),
                   PYTHONPATH=os.path.join(TOP, "client", "python"))
        env.update(cfg.get("env", {}))
        if cfg.get("double"):  # libzeroclient's CUDA runtime is the double too
            env["ZEROD_CUDART"] = os.environ["ZEROD_CUDADOUBLE"]
        world = cfg.get("world", 2)
        if cfg.get("torchrun"):
            # torchrun's own code (torch.distributed.run, what /usr/bin/torchrun
            # runs) with the options Debian's torch 1.13 needs under Python
            # 3.11 (README; --monitor_interval only spares its 5 s polls): one
            # launcher, its output as rank 0's
            cmds = [[sys.executable, "-m", "torch.distributed.run", "--standalone",
                     "--nproc_per_node", str(world), "--redirects", "1", "--tee", "1",
                     "--log_dir", os.path.join(run, "logs"), "--monitor_interval", "0.2",
                     script, "--torchrun",
                     "--case", name, "--dir", run]]
        else:
            cmds = [[sys.executable, script, "--rank", str(r), "--world", str(world),
                     "--case", name, "--dir", run] for r in range(world)]
        for r, cmd in enumerate(cmds):
            out = open(os.path.join(run, f"rank{r}.out"), "w")
            procs.append(subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                          start_new_session=True))
        deadline = time.monotonic() + timeout
        codes = []
        for p in procs:
            try:
                codes.append(p.wait(timeout=max(1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                codes.append("timeout")
        outs = [open(os.path.join(run, f"rank{r}.out")).read() for r in range(len(procs))]
        if all(c == SKIP_EXIT for c in codes):
            return "skip", outs[0].strip().splitlines()[-1] if outs[0].strip() else "skipped"
        if any(c != 0 for c in codes):
            tail = "\n".join(f"--- rank {r} (exit {c}):\n{o[-3000:]}" for r, (c, o)
                             in enumerate(zip(codes, outs)))
            zl = open(os.path.join(run, "zerod.log")).read()[-2000:]
            return "fail", tail + "\n--- zerod:\n" + zl
        res = os.path.join(run, "result0.json")
        return "ok", json.load(open(res)) if os.path.exists(res) else {}
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        if zerod is not None:
            zerod.terminate()
            try:
                zerod.wait(timeout=10)
            except subprocess.TimeoutExpired:
                zerod.kill()
                zerod.wait()
        shutil.rmtree(run, ignore_errors=True)


def main(cases, rank_main, timeout=120):
    script = os.path.abspath(sys.argv[0])
    if "--rank" in sys.argv or "--torchrun" in sys.argv:
        a = sys.argv
        name, run = a[a.index("--case") + 1], a[a.index("--dir") + 1]
        import torch.distributed as dist
        if "--torchrun" in a:  # RANK, WORLD_SIZE, MASTER_ADDR... from torchrun
            rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
            dist.init_process_group("gloo")
        else:
            rank, world = int(a[a.index("--rank") + 1]), int(a[a.index("--world") + 1])
            dist.init_process_group("gloo", init_method="file://" + os.path.join(run, "store"),
                                    rank=rank, world_size=world)
        try:
            res = rank_main(name, cases[name], rank, world)
        except Skip as e:
            print(f"{e}", flush=True)
            os._exit(SKIP_EXIT)
        except NotImplementedError as e:
            print(f"{e}", flush=True)
            os._exit(SKIP_EXIT)
        except BaseException:
            traceback.print_exc()
            sys.stdout.flush()
            os._exit(1)
        if rank == 0:
            json.dump(res or {}, open(os.path.join(run, "result0.json"), "w"))
        sys.stdout.flush()
        os._exit(0)  # no teardown of gloo and zerod's client in an order that hangs
    only = os.environ.get("TEST_CASES")
    names = [n for n in cases if not only or n in only.split(",")]
    print(f"1..{len(names)}", flush=True)
    failed = 0
    for i, name in enumerate(names, 1):
        t0 = time.monotonic()
        status, res = run_case(script, name, cases[name], cases[name].get("timeout", timeout))
        dt = time.monotonic() - t0
        if status == "ok":
            print(f"ok {i} - {name} ({dt:.1f} s) {json.dumps(res)}", flush=True)
        elif status == "skip":
            print(f"ok {i} - {name} # SKIP {res}", flush=True)
        else:
            failed += 1
            print(f"not ok {i} - {name} ({dt:.1f} s)", flush=True)
            print("\n".join("# " + line for line in res.splitlines()), flush=True)
    sys.exit(1 if failed else 0)
