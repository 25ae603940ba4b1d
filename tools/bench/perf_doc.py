#!/usr/bin/python3
"""perf_doc.py: write docs/PERFORMANCE.md, the plot's table and a summary
from the zerod-bench JSON files that tools/bench/perf-doc.sh left in
docs/perf/NAME/round-K.json (one per configuration and round).

    perf_doc.py DOCS/PERF DOCS/PERFORMANCE.md

Every figure is published as median [min–max] over the rounds; a ratio is
taken per round (both sides measured in the same run) and then summarised
the same way, never divided from two medians.
"""
import glob
import json
import os
import statistics
import sys


def load_rounds(d):
    """{config: [round JSON, ...]} sorted by round."""
    out = {}
    for p in sorted(glob.glob(os.path.join(d, "*", "round-*.json"))):
        with open(p) as f:
            j = json.load(f)
        out.setdefault(os.path.basename(os.path.dirname(p)), []).append(j)
    for v in out.values():
        v.sort(key=lambda j: j.get("round", 0))
    return out


def values(runs, key):
    return [j[key] for j in runs if isinstance(j.get(key), (int, float))
            and not isinstance(j.get(key), bool)]


def spread(runs, key):
    v = values(runs, key)
    if not v:
        return None
    return {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)}


def cell(runs, key, fmt="{:.1f}", unit=""):
    s = spread(runs, key)
    if s is None:
        return "–"
    f = lambda x: fmt.format(x)
    if s["n"] == 1:
        return f"{f(s['median'])}{unit} (1 round)"
    return f"{f(s['median'])}{unit} [{f(s['min'])}–{f(s['max'])}]"


def loads(runs):
    """Each round's 1-minute load average at its start (→ at its end)."""
    out = []
    for j in runs:
        a = j.get("loadavg_start_1_5_15", [j.get("loadavg")])[0]
        b = j.get("loadavg_end_1_5_15", [j.get("loadavg_end")])[0]
        out.append(f"{a:.1f}→{b:.1f}" if a is not None and b is not None else "?")
    return ", ".join(out)


def busy(runs):
    return sum(1 for j in runs if (j.get("loadavg_start_1_5_15") or [0])[0] > 1.0)


def machines(all_runs):
    m = sorted({(j.get("machine") or {}).get("cpu", "?") + f", {(j.get('machine') or {}).get('cpus', '?')} CPUs, "
                f"{(j.get('machine') or {}).get('mem_gib', '?')} GiB" for runs in all_runs.values()
                for j in runs})
    return "; ".join(m)


def commits(all_runs):
    c = sorted({j.get("commit", "?") + (" (uncommitted changes)" if j.get("dirty") else "")
                for runs in all_runs.values() for j in runs})
    days = sorted({j.get("date", "?") for runs in all_runs.values() for j in runs})
    return ", ".join(f"`{x}`" for x in c), ", ".join(days)


def ratio_runs(runs, num, den):
    """Per-round ratios num/den as pseudo-runs (key 'r')."""
    out = []
    for j in runs:
        a, b = j.get(num), j.get(den)
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b:
            out.append({"r": a / b})
    return out


def recovery_section(runs, runs2, h):
    """Issue 23 §3: a trainer's death through zerod's memory against the
    disk, from `zerod-bench --recovery=1` once per round (its *_median keys
    are that round's values), on one zerod (runs) and over two (runs2)."""
    hp = h[0]["params"] / 1e6
    head = (f"## A trainer's death: recovery from zerod's memory against the disk\n\n"
            f"{hp:g}M parameters, 4 buckets, 2 ranks, Adam (shard bucket, step interleaved):\n"
            f"`zerod-bench --recovery=1 --params {h[0]['params']} --buckets 4 --ranks 2 --optim "
            f"adam --json`, once per round (`tools/bench/recovery.c`), on one zerod and, with "
            f"`--daemons 2`, over two zerods on loopback (one rank each; the job re-forms on "
            f"both). A rank (the last) is SIGKILLed in "
            f"the middle of iteration 12 (half its buckets handed over), the bench ends the "
            f"others and starts the group again at once, as torchrun's agent does. Memory: "
            f"zerod with `--rejoin-timeout` and `--recovery-journal`, the new ranks rejoin the "
            f"job id and go on from zerod's state. Disk: `--rejoin-timeout 0`, "
            f"`zc_checkpoint()` every 5 iterations (waited for until durable), the new "
            f"ranks form the job again (over two zerods asking again while the failed job's "
            f"record is still stopping) and `zc_restore()`. Times are from the SIGKILL: to the "
            f"new group's first completed iteration, of that the restart of the processes "
            f"alone (the old ones reaped, the new ones forked and connected), which neither "
            f"path can shorten, and to the completion of the iteration the death cut short "
            f"(the disk path computes the lost ones again first). \"disk / memory\" is per "
            f"round.\n\n")
    if not runs and not runs2:
        return head + "Not measured in this run.\n"

    def col(rs, f):
        return f(rs) if rs else "not measured"

    def lost(rs, key):
        return ", ".join(map(str, sorted({j.get(key) for j in rs})))

    rows = []
    for what, fm, fd in (
            ("first iteration done after the death, ms",
             lambda r: cell(r, 'memory_recover_ms_median'),
             lambda r: cell(r, 'disk_recover_ms_median')),
            ("of it, beyond the processes' restart, ms",
             lambda r: cell(r, 'memory_beyond_start_ms_median'), lambda r: "–"),
            ("back at the iteration cut short, ms",
             lambda r: cell(r, 'memory_back_ms_median'),
             lambda r: cell(r, 'disk_back_ms_median')),
            ("iterations lost", lambda r: lost(r, "memory_lost_iterations"),
             lambda r: lost(r, "disk_lost_iterations")),
            ("checkpoint bytes read", lambda r: "0",
             lambda r: f"{cell(r, 'disk_checkpoint_bytes', '{:.0f}')} (the checkpoint's size)"),
            ("an iteration with the undo journal over one without (before the death)",
             lambda r: cell(r, 'journal_over_plain_median', '{:.2f}', '×'),
             lambda r: "(without)"),
            ("load (each round)", loads, lambda r: "")):
        rows.append(f"| {what} | {col(runs, fm)} | {col(runs, fd)} | {col(runs2, fm)} | "
                    f"{col(runs2, fd)} |")
    met = []
    for name, rs in (("one zerod", runs), ("two zerods", runs2)):
        beyond = spread(rs, "memory_beyond_start_ms_median") if rs else None
        ratio = spread(rs, "disk_over_memory_median") if rs else None
        if beyond:
            met.append(f"{name}: recovery beyond the restart {beyond['median']:.0f} ms against "
                       f"the target of under 2000 ms: "
                       f"{'met' if beyond['median'] < 2000 else 'not met'}")
        if ratio:
            met.append(f"{name}: disk / memory {ratio['median']:.1f}× [{ratio['min']:.1f}–"
                       f"{ratio['max']:.1f}] against at least 10×: "
                       f"{'met' if ratio['median'] >= 10 else 'not met'} on the median, "
                       f"{sum(1 for v in values(rs, 'disk_over_memory_median') if v >= 10)} "
                       f"of {ratio['n']} rounds")
    return (head + "| | memory, one zerod | disk, one zerod | memory, two zerods | "
            "disk, two zerods |\n|---|---|---|---|---|\n" + "\n".join(rows) +
            "\n\n" + "; ".join(met) + ". The disk path here is at its fastest: its "
            "checkpoint was written a few seconds before on the same machine, so the restore "
            "reads it from the page cache; a restore from storage (another node, a reboot) "
            "reads the checkpoint's bytes from the device. Both paths also make and register "
            "new buffers (2 × 4 bytes per parameter a rank) before their first iteration. "
            "The journal's row is the cost of "
            "`--recovery-journal` in this bench, where an iteration is the hand-over and the "
            "step alone (no forward or backward): the journal copies the state and parameters "
            "a bucket's step overwrites, about as many bytes again as the step moves. "
            "`--replicas` (a node's zerod lost) is not built yet, so its cost and its "
            "recovery are not measured.\n")


# Issue 24's targets for the encrypted job: (key, limit where the JSON has
# none, what it is); each a ratio of the same run that must be at least it.
TLS_TARGETS = (
    ("tls_vs_plain_net", 0.7, "the cross-node all-reduce busbw over plain gloo's"),
    ("tls_bytes_vs_openssl", 0.5,
     "the bytes each daemon encrypts per second over `openssl speed`'s AES-256-GCM on "
     "one core (within 2×)"),
    ("tls_seal_cpu_vs_openssl", 0.5,
     "the bytes the TLS mesh seals and opens per second of its threads' CPU time over "
     "`openssl speed`'s AES-256-GCM on one core (within 2×)"),
)


def tls_section(R, nodes):
    """Issue 24: the job over TLS 1.3 between the daemons against the same
    job plain, and the encrypted bytes per second against `openssl speed`
    on one core, from `zerod-bench --daemons 2 --tls` (each round's ratios
    taken inside its run)."""
    head = ("### TLS 1.3 between daemons\n\n"
            "The same runs (`--tls`): after the plain job, the same job on daemons that "
            "hold one TLS identity (`zeroctl keygen`, its fingerprint in `--tls-peers`; a "
            "zerod trusts its own certificate), so the tensors between them cross TLS 1.3 "
            "(`--tls-ktls=no`: OpenSSL encrypts); with several rounds inside a run they "
            "alternate with the plain job. \"All-reduce busbw\" is the daemons' own, from "
            "their metrics (`tls_busbw_net`: what each daemon encrypts and sends per second "
            "of its all-reduce), against `openssl speed -elapsed -evp aes-256-gcm` over "
            "16 KiB blocks on one core in the same run (`openssl_aes256gcm_MBps`; TLS 1.3's "
            "first suite is AES-256-GCM). Targets (issue 24): the encrypted all-reduce "
            "busbw ≥ 0.7× plain gloo's, and the encrypted bytes per second within 2× of "
            "openssl's one-core figure (≥ 0.5×), by wall time and by the mesh's own "
            "CPU time (`tls_seal_cpu_GBps`: what it sealed and opened per second of its "
            "threads' CPU, from the daemons' zerod_tls_mesh_* metrics). Each round's "
            "ratio with ✓ (met) or ✗.\n\n")
    runs_all = [j for k in nodes for j in R[k] if "tls_iter_ms" in j]
    if not runs_all:
        return head + "Not measured in this run.\n"

    def per_round(runs, key, limit):
        out = []
        for j in runs:
            v = j.get(key)
            out.append("–" if not isinstance(v, (int, float)) else
                       f"{v:.2f} {'✓' if v >= limit else '✗'}")
        return ", ".join(out)

    def ktls(runs):
        act = sorted({str(j.get("ktls_active")).lower().replace("none", "unknown")
                      for j in runs})
        kern = {bool(j.get("ktls_kernel")) for j in runs}
        if kern == {False}:
            return "not active: the kernel has no tls module (`--tls-ktls=yes` not run)"
        return (f"`--tls-ktls=yes`: {cell(runs, 'tls_ktls_iter_ms')} ms, all-reduce "
                f"{cell(runs, 'tls_ktls_vs_plain_net', '{:.2f}', '×')} plain's; active: "
                f"{', '.join(act)}")

    rows = []
    for k in nodes:
        r = [j for j in R[k] if "tls_iter_ms" in j]
        if not r:
            continue
        lim = {key: r[0].get(key + "_target", d) for key, d, _ in TLS_TARGETS}
        rows.append(
            f"| {r[0]['step']} | {cell(r, 'zerod_iter_ms')} / {cell(r, 'tls_iter_ms')} | "
            f"{cell(r, 'busbw_net', '{:.3f}')} / {cell(r, 'tls_busbw_net', '{:.3f}')} | "
            f"{cell(r, 'tls_vs_plain_net', '{:.2f}', '×')} "
            f"(≥ {lim['tls_vs_plain_net']}: {per_round(r, 'tls_vs_plain_net', lim['tls_vs_plain_net'])}) | "
            f"{cell(r, 'openssl_aes256gcm_MBps', '{:.0f}')} | "
            f"{cell(r, 'tls_bytes_vs_openssl', '{:.2f}', '×')} "
            f"(≥ {lim['tls_bytes_vs_openssl']}: {per_round(r, 'tls_bytes_vs_openssl', lim['tls_bytes_vs_openssl'])}) | "
            f"{cell(r, 'tls_seal_cpu_GBps', '{:.2f}')} GB/s: "
            f"{cell(r, 'tls_seal_cpu_vs_openssl', '{:.2f}', '×')} "
            f"(≥ {lim['tls_seal_cpu_vs_openssl']}: {per_round(r, 'tls_seal_cpu_vs_openssl', lim['tls_seal_cpu_vs_openssl'])}) | "
            f"{ktls(r)} | {loads(r)} |")
    ident = sorted({j.get("tls_identity", "?") for j in runs_all})
    return (head +
            "| step | ms per iteration, plain / TLS | all-reduce busbw GB/s, plain / TLS | "
            "TLS / plain all-reduce (each round) | openssl AES-256-GCM MB/s, one core | "
            "encrypted bytes/s / openssl's (each round) | "
            "sealed and opened per CPU second, over openssl's (each round) | kernel TLS | "
            "load (each round) |\n"
            "|---|---|---|---|---|---|---|---|---|\n" + "\n".join(rows) +
            f"\n\nThe identity: {'; '.join(ident)}. On loopback both daemons encrypt and "
            "decrypt on this machine's cores, which the trainers and the step share.\n")


def main():
    d, doc = sys.argv[1], sys.argv[2]
    R = load_rounds(d)
    if "headline" not in R:
        sys.exit("perf_doc.py: no headline runs in " + d)
    h = R["headline"]
    nr = len(h)
    sizes = sorted((k for k in R if k.startswith("size-")), key=lambda k: R[k][0]["params"])
    modes = [f"mode-{a}-{b}" for a in ("bucket", "slice") for b in ("interleaved", "at_end")
             if f"mode-{a}-{b}" in R]
    nodes = [f"daemons-2-{b}" for b in ("interleaved", "at_end") if f"daemons-2-{b}" in R]

    summary = {name: {k: spread(runs, k) for k in sorted({k for j in runs for k in j})
                      if spread(runs, k) is not None}
               for name, runs in R.items()}
    with open(os.path.join(d, "summary.json"), "w") as f:
        json.dump({"rounds": {k: len(v) for k, v in R.items()}, "summary": summary}, f,
                  indent=1)
        f.write("\n")

    def med(runs, k):
        s = spread(runs, k)
        return "NaN" if s is None else f"{s['median']:.3f}"

    def mm(runs, k):
        s = spread(runs, k)
        return "NaN NaN" if s is None else f"{s['min']:.3f} {s['max']:.3f}"

    with open(os.path.join(d, "sweep.dat"), "w") as f:
        f.write("# params_M  zerod_cmp med min max  zero med min max  ddp_zerod med min max"
                "  fused_ref med  floor med\n")
        for k in sizes:
            r = R[k]
            f.write(f"{r[0]['params'] / 1e6:g} "
                    f"{med(r, 'zerod_comparable_ms')} {mm(r, 'zerod_comparable_ms')} "
                    f"{med(r, 'torch_iter_ms')} {mm(r, 'torch_iter_ms')} "
                    f"{med(r, 'torch_zerod_iter_ms')} {mm(r, 'torch_zerod_iter_ms')} "
                    f"{med(r, 'fused_ref_ms')} {med(r, 'floor_iter_ms')}\n")

    best = sorted({j.get("torch_plain_best") or "?" for j in h})
    plain_names = {
        "torch_plain_iter_ms": "DDP + `torch.optim.Adam()` (default)",
        "torch_plain_foreach_iter_ms": "DDP + `Adam(foreach=True)`",
        "torch_plain_gabv_iter_ms": "DDP(`gradient_as_bucket_view=True`) + `Adam()`",
        "torch_plain_gabv_foreach_iter_ms":
            "DDP(`gradient_as_bucket_view=True`) + `Adam(foreach=True)`",
    }
    plain_rows = "\n".join(
        f"| {name} (`{k}`) | {cell(h, k)} ms | "
        f"{cell(ratio_runs(h, k, 'torch_zerod_iter_ms'), 'r', '{:.2f}', '×')} |"
        for k, name in plain_names.items())
    hp = h[0]["params"] / 1e6

    def c(k, fmt="{:.1f}", unit=""):
        return cell(h, k, fmt, unit)

    def rr(num, den, fmt="{:.2f}"):
        return cell(ratio_runs(h, num, den), "r", fmt, "×")

    sweep_rows = "\n".join(
        f"| {R[k][0]['params'] / 1e6:g}M | {R[k][0]['buckets']} | "
        f"{cell(R[k], 'torch_zerod_iter_ms')} | {cell(R[k], 'zerod_comparable_ms')} | "
        f"{cell(R[k], 'zerod_iter_ms')} | {cell(R[k], 'torch_iter_ms')} | "
        f"{cell(R[k], 'fused_ref_ms')} | {cell(R[k], 'floor_iter_ms')} | "
        f"{cell(ratio_runs(R[k], 'torch_iter_ms', 'torch_zerod_iter_ms'), 'r', '{:.2f}', '×')} | "
        f"{loads(R[k])} |" for k in sizes)
    mode_rows = "\n".join(
        f"| {R[k][0]['shard']} | {R[k][0]['step']} | {cell(R[k], 'zerod_comparable_ms')} | "
        f"{cell(R[k], 'zerod_iter_ms')} | {cell(R[k], 'fused_ref_ms')} | "
        f"{cell(R[k], 'vs_fused', '{:.2f}', '×')} | "
        f"{cell(R[k], 'rss_vs_state', '{:.2f}', '×')} | {loads(R[k])} |" for k in modes)
    node_rows = "\n".join(
        f"| {R[k][0]['step']} | {cell(R[k], 'zerod_iter_ms')} | {cell(R[k], 'gloo_iter_ms')} | "
        f"{cell(R[k], 'gloo_shim_iter_ms')} | "
        f"{cell(ratio_runs(R[k], 'zerod_iter_ms', 'gloo_iter_ms'), 'r', '{:.2f}', '×')} | "
        f"{cell(R[k], 'step_bucket_ref_ms')} / {cell(R[k], 'step_all_ref_ms')} | "
        f"{cell(R[k], 'vs_gloo_plus_step', '{:.2f}', '×')} (≤ {R[k][0].get('vs_gloo_plus_step_target', '?')}) | "
        f"{cell(R[k], 'busbw_zerod', '{:.3f}')} | {cell(R[k], 'busbw_net', '{:.3f}')} | "
        f"{cell(R[k], 'busbw_gloo', '{:.3f}')} | {cell(R[k], 'tls_iter_ms')} | "
        f"{loads(R[k])} |" for k in nodes)
    tls_text = tls_section(R, nodes)

    def target_ge(runs, key, limit, what):
        """The same for a ratio that must be at least limit."""
        s = spread(runs, key)
        if s is None:
            return f"| {what} | – | ≥ {limit}× | not measured |"
        return (f"| {what} | {cell(runs, key, '{:.2f}', '×')} | ≥ {limit}× | "
                f"{'met' if s['median'] >= limit else 'not met'} "
                f"(the median; {sum(1 for v in values(runs, key) if v >= limit)} of {s['n']} rounds) |")

    def target(runs, key, limit, what):
        """A row of the targets table: the median over the rounds of a
        per-round ratio against its limit (met: the median is within it)."""
        s = spread(runs, key)
        if s is None:
            return f"| {what} | – | ≤ {limit}× | not measured |"
        return (f"| {what} | {cell(runs, key, '{:.2f}', '×')} | ≤ {limit}× | "
                f"{'met' if s['median'] <= limit else 'not met'} "
                f"(the median; {sum(1 for v in values(runs, key) if v <= limit)} of {s['n']} rounds) |")

    target_rows = "\n".join([
        target(h, "torch_zerod_vs_c_comparable", 1.2,
               "§2 DDP + ZerodOptimizer over the C trainers' comparable figure, own buffers"),
        target(h, "torch_zerod_shared_vs_c_comparable", 1.2,
               "§2 the same with shared parameters (`shared_params=True` against the C "
               "trainers' shared job)"),
    ] + [target(R[k], "vs_gloo_plus_step", R[k][0].get("vs_gloo_plus_step_target"),
                f"§3 two daemons, {R[k][0]['step']}: zerod's iteration over gloo's all-reduce "
                f"+ {'every bucket' if R[k][0]['step'] == 'at_end' else 'one bucket'}'s step")
         for k in nodes] + [
        target_ge(R[k], key, R[k][0].get(key + "_target", dflt),
                  f"issue 24, TLS 1.3 between two daemons, {R[k][0]['step']}: {what}")
        for k in nodes for key, dflt, what in TLS_TARGETS
        if any(key in j for j in R[k])])
    rec_text = recovery_section(R.get("recovery"), R.get("recovery-daemons-2"), h)
    phase_rows, phase_text = "", ""
    if "phases" in R:
        ph = R["phases"]
        for kind, what in (("no_sync", "DDP under `no_sync()` (no communication, no step)"),
                           ("plain_adam", "DDP + `torch.optim.Adam()`"),
                           ("zerod", "DDP + `ZerodOptimizer`"),
                           ("zerod_shared", "DDP + `ZerodOptimizer(shared_params=True)`")):
            rs = [j.get(kind) or {} for j in ph]
            phase_rows += (f"| {what} | " + " | ".join(cell(rs, k, "{:.1f}") for k in
                           ("zero_grad", "forward", "backward", "step", "total",
                            "zerod_cpu_ms")) + " |\n")
        phase_text = f"""
### Where DDP + ZerodOptimizer's iteration goes

`tools/bench/torch_phases.py --params {ph[0].get('params', 0)}` ({len(ph)} rounds, one run
each; the same model and DDP as above, the kinds alternating iteration by
iteration): rank 0's phases, median ms, and the CPU time zerod spent per
iteration of each kind (utime + stime of the daemon from `/proc`, over the
run's iterations). ZerodOptimizer's step is done by the time backward
returns (interleaved: each bucket is reduced, stepped and written back while
backward goes on); what it adds to backward is zerod's work running on the
same 2 cores as the two ranks' autograd threads: at best zerod's CPU time
over 2 cores, the rest the last bucket's step after backward ends and the
cores' contention.

| kind | zero_grad | forward | backward | step | total | zerod CPU ms |
|---|---|---|---|---|---|---|
{phase_rows}
Load of each round: {loads(ph)}.
"""
    gpu_rows = ""
    if "gpu" in R:
        g = R["gpu"]
        for row in ("nccl_busbw", "adam_gbps", "handoff_cuda", "ddp_cuda"):
            rs = [j.get(row) or {} for j in g]
            if any(x.get("ran") for x in rs):
                keys = [k for k in rs[0] if k not in ("ran", "why")]
                val = "; ".join(f"`{k}` {cell(rs, k, '{:.3f}')}" for k in keys)
            else:
                val = sorted({x.get("why", "not run") for x in rs})[0]
            gpu_rows += f"| {row} | {val} |\n"
    all_loads = [(j.get("loadavg_start_1_5_15") or [0])[0] for runs in R.values() for j in runs]
    nbusy = sum(1 for x in all_loads if x > 1.0)
    cm, days = commits(R)
    mach = machines(R)

    text = f"""# zerod performance

Every number here comes from `tools/bench/zerod-bench` (what it measures is
described at the end), run by one command that rewrites this file and its plot:

```sh
tools/bench/perf-doc.sh           # installs python3-torch and gnuplot, builds, runs, writes this page
QUICK=1 tools/bench/perf-doc.sh   # the same pipeline in minutes (2 rounds, small jobs) into /tmp
```

**Rounds, not runs.** Every configuration below ran {nr} times, in
alternating rounds (round 1 of every configuration, then round 2 of every
one, ...); inside one run the systems are measured back to back (the floors,
zerod's C trainers, then torch's anchor, whose kinds alternate iteration by
iteration). Every figure is the median over the rounds with the fastest and
slowest round in brackets, `median [min–max]`; every ratio is taken inside
each round (both sides measured in the same run) and then summarised the
same way. The JSON of every run is in [`docs/perf/`](perf/)`NAME/round-K.json`
(with the commit, the machine, the round, and the load average at its start
and end), their spreads in [`perf/summary.json`](perf/summary.json), the
plot's table in `docs/perf/sweep.dat`.

Measured at commit {cm} on {days}, on {mach}.

**The targets in this run** (issues 24 and 25; each ratio taken inside its round, both
sides measured in that run; the rows below give where each comes from):

| target | median [min–max] over the rounds | limit | |
|---|---|---|---|
{target_rows}

**Load.** Each table gives the 1-minute load average of each round at its
start → end; {nbusy} of the {len(all_loads)} runs began above 1.0. That
average is the last minute's, and the runs follow one another: it counts
the run just before (which keeps both cores busy) as much as any
neighbour, and perf-doc.sh waits only `QUIET_WAIT_S` seconds for it to fall
under `QUIET_LOAD`. The machine is shared (2 cores), and a neighbour's
build halves every bandwidth; the ratios inside a round hold better than
absolute times across rounds.

## The headline: the PyTorch path, {hp:g}M parameters, 2 ranks, 4 buckets, Adam

What a PyTorch user gets: the same model (a stack of bias-free `Linear`
layers, one per bucket), DDP with 25 MB buckets over gloo on 2 processes,
the same Adam, each system's synced iteration minus the same `no_sync()`
iteration (forward and backward, no communication, no step), the slowest
rank's, all kinds interleaved iteration by iteration in one anchor run
(`tools/bench/torch_anchor.py`, Debian's torch 1.13 on the CPU):

```sh
build/tools/bench/zerod-bench --params {h[0]['params']} --buckets 4 --ranks 2 --optim adam --torch-zerod --torch-plain --shared-params --json
```

| system | ms per iteration | its time over DDP + ZerodOptimizer's |
|---|---|---|
| **DDP + `ZerodOptimizer`** (`torch_zerod_iter_ms`) | **{c('torch_zerod_iter_ms')} ms** | 1 |
| DDP + `ZerodOptimizer(shared_params=True)` (`torch_zerod_shared_iter_ms`) | {c('torch_zerod_shared_iter_ms')} ms | {rr('torch_zerod_shared_iter_ms', 'torch_zerod_iter_ms')} |
{plain_rows}
| DDP + `ZeroRedundancyOptimizer(Adam)` (`torch_iter_ms`) | {c('torch_iter_ms')} ms | {rr('torch_iter_ms', 'torch_zerod_iter_ms')} |

The best of the plain optimizers (`torch_plain_best_ms`): {c('torch_plain_best_ms')} ms,
{', '.join(f'`{b}`' for b in best)} (the fastest in each round:
{', '.join(j.get('torch_plain_best') or '?' for j in h)}); it takes
{rr('torch_plain_best_ms', 'torch_zerod_iter_ms')} DDP + ZerodOptimizer's time, and DDP + ZeRO
{rr('torch_iter_ms', 'torch_zerod_iter_ms')} (above 1: ZerodOptimizer is faster).
`ZerodOptimizer`'s parameters differ from ZeRO's by at most
{c('torch_zerod_max_diff', '{:.2g}')} after the run (they train the same model on the same data),
with shared parameters by {c('torch_zerod_shared_max_diff', '{:.2g}')}.

{phase_text}
### zerod's C trainers, counted the same way

The C trainers (`jobs.c`, the public libzeroclient API only) in the same run.
**The comparable figure** (`zerod_comparable_ms`) is accounted as torch's:
each rank fills a bucket's gradients and hands it over at once, so the
daemon's work overlaps the fill on the same cores, timed from the first
fill to the step done (`zerod_overlap_ms`), minus the fill alone
(`zerod_fill_ms`, the same fill with no hand-over). The hand-over figure
(`zerod_iter_ms`, published as the headline before) fills first, meets at a
barrier and times only hand-over → step done, with both cores to the daemon.

| measure | ms per iteration | ratio |
|---|---|---|
| **C trainers, comparable** (`zerod_comparable_ms`) | **{c('zerod_comparable_ms')} ms** | DDP + ZeRO takes {rr('torch_iter_ms', 'zerod_comparable_ms')} this (`vs_torch_comparable`); DDP + ZerodOptimizer {rr('torch_zerod_iter_ms', 'zerod_comparable_ms')} (`torch_zerod_vs_c_comparable`; issue 25's target ≤ 1.2×) |
| fill overlapped with the hand-over (`zerod_overlap_ms`) | {c('zerod_overlap_ms')} ms | |
| fill alone (`zerod_fill_ms`) | {c('zerod_fill_ms')} ms | |
| zerod's CPU time per iteration, overlapped / hand-over (`zerod_overlap_cpu_ms`, `zerod_cpu_ms`) | {c('zerod_overlap_cpu_ms')} / {c('zerod_cpu_ms')} ms | over the machine's 2 cores: {cell([{'h': j['zerod_overlap_cpu_ms'] / 2} for j in h if isinstance(j.get('zerod_overlap_cpu_ms'), (int, float))], 'h')} ms |
| C trainers, hand-over only (`zerod_iter_ms`; fastest iteration `zerod_iter_min_ms`) | {c('zerod_iter_ms')} ms ({c('zerod_iter_min_ms')}) | comparable / hand-over {rr('zerod_comparable_ms', 'zerod_iter_ms')}; DDP + ZeRO takes {rr('torch_iter_ms', 'zerod_iter_ms')} this (`vs_torch`; issue 5's target ≥ 8×) |
| shared parameters, comparable (`zerod_shared_comparable_ms`) | {c('zerod_shared_comparable_ms')} ms | DDP + ZeRO takes {rr('torch_iter_ms', 'zerod_shared_comparable_ms')} this; DDP + `ZerodOptimizer(shared_params=True)` {rr('torch_zerod_shared_iter_ms', 'zerod_shared_comparable_ms')} (`torch_zerod_shared_vs_c_comparable`; target ≤ 1.2×) |
| shared parameters, hand-over only (`zerod_shared_iter_ms`) | {c('zerod_shared_iter_ms')} ms | {rr('zerod_shared_iter_ms', 'zerod_iter_ms')} the time of own buffers |

### Anchors, fixed before measuring

| anchor | value | zerod against it | target |
|---|---|---|---|
| tiny-bucket handoff p50 / p99 (`handoff_p50_us`, `handoff_p99_us`) | {c('handoff_p50_us', '{:.0f}')} / {c('handoff_p99_us', '{:.0f}')} µs | | |
| AF_UNIX 64 B round trip on one CPU (`unix_rtt_same_cpu_us`) | {c('unix_rtt_same_cpu_us')} µs | handoff p50 {rr('handoff_p50_us', 'unix_rtt_same_cpu_us')} (`handoff_vs_unix_same_cpu`) | ≤ 3× (set against this one) |
| AF_UNIX 64 B round trip across two CPUs (`unix_rtt_us`) | {c('unix_rtt_us')} µs | handoff p50 {rr('handoff_p50_us', 'unix_rtt_us')} (`handoff_vs_unix`) | |
| bytes-moved floor, no write-allocate: {h[0]['floor_bytes'] / 1e6:.0f} MB over non-temporal triad (`floor_nt_iter_ms`) | {c('floor_nt_iter_ms')} ms | hand-over {rr('zerod_iter_ms', 'floor_nt_iter_ms')} | |
| bytes-moved floor, write-allocate for every written buffer: {h[0]['floor_wa_bytes'] / 1e6:.0f} MB over 4/3 × triad (`floor_wa_iter_ms`) | {c('floor_wa_iter_ms')} ms | hand-over {rr('zerod_iter_ms', 'floor_wa_iter_ms')} | |
| the floor: the lower of the two (`floor_iter_ms`) | {c('floor_iter_ms')} ms | hand-over {rr('zerod_iter_ms', 'floor_iter_ms')}, comparable {rr('zerod_comparable_ms', 'floor_iter_ms')} | ≥ 1 (a floor) |
| fused C pass, a reference, not a bound (`fused_ref_ms`) | {c('fused_ref_ms')} ms | hand-over {rr('zerod_iter_ms', 'fused_ref_ms')} (`vs_fused`) | ≤ 1.15× (issue 5) |
| daemon RssAnon with the job active (`daemon_rss_anon_bytes`) over the state it must hold (`state_bytes`) | {cell([{'mb': j['daemon_rss_anon_bytes'] / 1e6} for j in h], 'mb', '{:.0f}')} MB / {h[0]['state_bytes'] / 1e6:.0f} MB | {c('rss_vs_state', '{:.3f}', '×')} | ≤ 1.05× |
| memcpy, 1 thread / STREAM triad / triad with non-temporal stores, {h[0]['threads']} threads | {c('memcpy_gbps')} / {c('triad_gbps')} / {c('triad_nt_gbps')} GB/s | | |

Load of each round: {loads(h)}.

The caches are emptied before every timed region (`cold`; rank 0 streams
over 4× the last-level cache, {h[0].get('llc_bytes', 0) / 2**20:.0f} MiB
here, between the fill and the barrier), triad's arrays are each at least
twice the last-level cache, and the fused pass and both triads start each
pass with the caches emptied, so no figure here is a cache's. The fused
pass (`fused_ref_ms`) is what a straightforward plain-C pass over the same
bytes takes; it is a reference, not a bound: a pass that moves fewer bytes
or uses other stores can beat it. The floor counts every byte the way its
bandwidth is counted (see the end).

## Iteration time against model size

2 ranks, Adam, buckets of 25 MB (`--bucket-size 25M`, as DDP's
`bucket_cap_mb=25`), each configuration {len(R[sizes[0]]) if sizes else 0} rounds of
`zerod-bench --params N --bucket-size 25M --ranks 2 --optim adam --torch-zerod --json`.
The plot shows the medians with the rounds' min–max as error bars.

![iteration time against model size](perf-iter-vs-size.png)

| params | buckets | DDP + ZerodOptimizer ms | C comparable ms | C hand-over ms | DDP + ZeRO ms | fused reference ms | floor ms | ZeRO / ZerodOptimizer | load (each round) |
|---|---|---|---|---|---|---|---|---|---|
{sweep_rows}

## Shard and step modes

{hp:g}M parameters, 4 buckets, 2 ranks, Adam, no torch:
`zerod-bench --params {h[0]['params']} --buckets 4 --ranks 2 --optim adam --shard S --step T --json`.

| shard | step | comparable ms | hand-over ms | fused reference ms | hand-over / fused | RssAnon / state | load (each round) |
|---|---|---|---|---|---|---|---|
{mode_rows}

## Several nodes: two daemons on loopback against gloo

{hp:g}M parameters, 4 buckets, 2 ranks (one per daemon), Adam, shard bucket:
`zerod-bench --daemons 2 --params {h[0]['params']} --buckets 4 --ranks 2 --optim adam --step T --tls --json`.
The anchor is independent of zerod: torch.distributed's `all_reduce` over
its gloo backend between two processes, the same four buckets one after the
other (`gloo_iter_ms`, `torch_anchor.py --allreduce-only`); gloo through
zerod's own shim (`gloo_shim_iter_ms`, `gloo_raw.c`) is beside it, not the
anchor. "zerod / gloo" is the whole iteration over the all-reduce alone, per
round. The step alone (`step_bucket_ref_ms` / `step_all_ref_ms`) is measured
in the same run without zerod: the fused reference of one rank over one
bucket and over every bucket, with warm caches (its fastest). "zerod /
(gloo + step)" is the target's ratio: the iteration over gloo's all-reduce
plus the step the mode cannot hide behind the wire, one bucket's
interleaved (the last bucket's step follows every all-reduce), every
bucket's at_end. Busbw in GB/s (algbw × 2(n−1)/n); "busbw all-reduce" is the daemons'
own cross-node all-reduce from their metrics; "TLS ms" the same job on
daemons with one TLS identity (TLS 1.3 between daemons, below).

| step | zerod ms | gloo (torch) ms | gloo via zerod's shim ms | zerod / gloo | step alone ms, one bucket / all | zerod / (gloo + step) | busbw whole iteration | busbw all-reduce | busbw gloo | TLS ms | load (each round) |
|---|---|---|---|---|---|---|---|---|---|---|---|
{node_rows}

Both "nodes" share this machine's 2 cores; on separate machines the two
daemons would not compete for them.

{tls_text}
{rec_text}
## GPU rows

`zerod-bench --gpu` (`tools/bench/gpu.c`): NCCL all-reduce busbw across the
visible devices against the same through zerod (as nccl-tests computes
busbw), the Adam kernel's GB/s through a world-1 `zerod --backend cuda` job
against device-to-device copy bandwidth (targets when run: busbw ≥ 95% of
direct NCCL, Adam ≥ 80% of copy bandwidth), the handoff with CUDA IPC events,
and DDP + ZerodOptimizer against DDP + ZeroRedundancyOptimizer
(overlap_with_ddp=True) on CUDA at world 1 (`--python` naming a torch with
CUDA; Debian's is not). Without a device they say why they did not run,
never a number. Both busbw figures need 2 devices or more (one rank's busbw
is 0 by nccl-tests' formula): through zerod it is a `zerod --backend cuda`
job of one trainer process per device, one bucket, shard slice
(reduce-scatter, step, all-gather), SGD without momentum, the slowest
rank's iteration (`zerod_busbw`, `zerod_vs_nccl`).

| row | result |
|---|---|
{gpu_rows}
## What zerod-bench measures

One run, in this order: the floors, then a real `zerod` (`--zerod PATH`,
`$ZEROD_BIN`, else the build's) on a socket in a fresh temporary directory
with `--ranks` real trainer processes that use only the public libzeroclient
API, then with `--vs-torch` (or `--torch-zerod`, `--torch-plain`) the torch
anchor. `--json` prints one object; without it, a table with the same values.

- **The job** (`--params` fp32 elements, K/M/G decimal, in `--buckets` equal
  buckets or buckets of `--bucket-size` bytes; `--optim sgd|adam|adamw` with
  torch's defaults, lr 1e-3; `--shard`, `--step`). Each iteration runs two
  kinds, one after the other on the same daemon. *Hand-over*: every rank
  fills its gradients (timed: `zerod_fill_ms`), the ranks meet at a barrier,
  and each times its first `zc_bucket_ready()` to its step future done
  (`zerod_iter_ms`). *Overlapped* (`--no-overlap` leaves it out): the ranks
  meet, then each fills bucket b and hands it over at once, bucket after
  bucket, timed from the first fill to the step done (`zerod_overlap_ms`).
  An iteration's time is its slowest rank's; each value is the median over
  `--iters` iterations after `--warmup` (default 20 after 3), and
  `zerod_comparable_ms` = median(overlapped) − median(fill alone), as
  torch's figure is median(synced) − median(`no_sync`).
- **Cold caches** (default; `--warm` turns it off): before each fill and
  each timed region, rank 0 of the job reads and writes every line of a
  buffer 4× the last-level cache (at least 64 MiB; `llc_bytes` from sysfs),
  untimed, while the others wait at a barrier.
- **torch** (`tools/bench/torch_anchor.py` through `/usr/bin/python3`,
  Debian's `python3-torch` 1.13, CPU): `--ranks` processes over gloo on
  loopback, `DistributedDataParallel(bucket_cap_mb=25)` over bias-free
  `Linear` layers, one per zerod bucket, batch 1. Kinds, interleaved
  iteration by iteration: `no_sync()` (forward and backward only), DDP +
  `ZeroRedundancyOptimizer` (`overlap_with_ddp=False`: its overlapped hooks
  refuse every backend but NCCL/HCCL), with `--torch-zerod` DDP + the real
  `zerod.torch.ZerodOptimizer` on a zerod of its own, with `--torch-plain`
  DDP + plain `torch.optim` (default; `foreach=True`; DDP with
  `gradient_as_bucket_view=True` and either), each on its own copy of the
  model with the same initial values. Each figure is median(its synced) −
  median(`no_sync`), the slowest rank's.
- **Floors** (`floors.c`). `floor_nt_iter_ms`: every input read once and
  every output written once, `floor_bytes` = 4 N (2R + 1 + 2S) (R gradient
  buffers and the master parameters read, S state floats per element read
  and written, R parameter buffers written), over STREAM triad with
  non-temporal stores (`triad_nt_gbps`, 3 arrays; no write-allocate there
  either). `floor_wa_iter_ms`: write-allocate counted for every buffer that is
  only written (the R−1 other parameter buffers are read first),
  `floor_wa_bytes` = 4 N (3R + 2S), over plain triad counted with its
  write-allocate, 4/3 × `triad_gbps`. `floor_iter_ms` is the lower; with
  shared parameters nothing is only written and both count
  `floor_shared_bytes` = 4 N (R + 2 + 2S). Triads are the best pass of at
  least 8 and 1 s; memcpy the best of 6 and 0.3 s.
- **`fused_ref_ms`**: a plain-C pass over the same bytes on `--threads`
  threads: per chunk of 8192 elements, sum the ranks' gradients into a
  scratch, divide by R, step the optimizer with torch's arithmetic on rank
  0's parameters, copy them into every other rank's; `-O3`, the daemon's SIMD
  clones, plain stores. A reference, not a bound.
- **Handoff**: a second job with one bucket of 16 elements, `zc_bucket_ready()`
  → step future done over `--handoff-iters` (2000), p50 and p99 of all ranks'
  samples; against the AF_UNIX 64-byte round trip to a forked echo process,
  10000 times, pinned across two CPUs (`unix_rtt_us`) and on one
  (`unix_rtt_same_cpu_us`): both published, both ratios.
- **Memory**: `RssAnon` of `/proc/<zerod>/status` while every rank of the
  main job is connected; `state_bytes`: Adam/AdamW 2 floats per element (3
  with amsgrad), SGD 1 with momentum, else 0 (both jobs' with `--shared-params`).
- **`--daemons N`**: the job over N daemons on loopback, ranks spread over
  them; then torch's gloo `all_reduce` of the same buckets between N
  processes (`gloo_iter_ms`) and gloo through zerod's shim
  (`gloo_shim_iter_ms`); `busbw_*` = bytes / time × 2(n−1)/n; `algbw_net`:
  the daemons' own all-reduce from their metrics; with `--tls` the job again
  on daemons with one TLS identity, TLS 1.3 between them, in alternating
  rounds with the plain one (`tls_iter_ms`, `tls_algbw_net`; `tls_ktls_*`
  with `--tls-ktls=yes` where the kernel has kTLS, `ktls_active`), and
  `openssl speed`'s AES-256-GCM on one core (`openssl_aes256gcm_MBps`,
  `tls_bytes_vs_openssl`), and what the TLS mesh sealed and opened per
  second of its calls' CPU time, the slowest daemon's, from their metrics
  (`tls_seal_cpu_GBps`, `tls_seal_cpu_vs_openssl`); the step alone, without zerod,
  the fused reference of one rank over one bucket and over all of them
  (`step_bucket_ref_ms`, `step_all_ref_ms`, warm caches), and
  `vs_gloo_plus_step`, the iteration over `gloo_iter_ms` plus the step the
  mode cannot hide.
- **`--torch-zerod --shared-params`**: the anchor runs a third copy of the
  model under DDP + `ZerodOptimizer(shared_params=True)` in the same
  interleaved rounds (`torch_zerod_shared_iter_ms`), against the C trainers'
  shared job (`torch_zerod_shared_vs_c_comparable`).
- **`--gpu`**: the GPU rows above, schema `zerod-bench-gpu/1`, each
  `{{"ran": false, "why": ...}}` where it could not run.

The `bench` suite (`meson test -C build --suite bench`) runs a few-second
zerod-bench and checks that it printed every key and that the GPU rows print
no number where they did not run; it asserts nothing about speed.
"""
    with open(doc, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
