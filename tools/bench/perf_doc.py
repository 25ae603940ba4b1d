#!/usr/bin/python3
"""perf_doc.py: write docs/PERFORMANCE.md and the plot's table from the
zerod-bench JSON files that tools/bench/perf-doc.sh left in docs/perf/.

    perf_doc.py DOCS/PERF DOCS/PERFORMANCE.md
"""
import datetime
import glob
import json
import os
import subprocess
import sys


def load(d, name):
    with open(os.path.join(d, name + ".json")) as f:
        return json.load(f)


def num(v, fmt="{:.1f}"):
    return "–" if v is None else fmt.format(v)


def load_cell(j):
    """The run's load average; over 1 on 2 cores a neighbour was busy."""
    v = j["loadavg"]
    return "–" if v is None else f"{v:.2f}" + (" busy" if v > 1.0 else "")


def machine():
    model = "?"
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    mem = open("/proc/meminfo").readline().split()[1]
    return f"{model}, {os.cpu_count()} CPUs, {int(mem) / 2**20:.0f} GiB"


def commit(top):
    try:
        return subprocess.run(["git", "-C", top, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def measured(h, sizes, modes, nodes, top):
    """Where the runs were measured: "the headline ... at commit X on D"."""
    groups = [("the headline, the sweep and the modes", [h] + sizes + modes),
              ("the several-nodes runs", nodes)]
    out = []
    for what, js in groups:
        at = sorted({(j.get("commit") or commit(top), j.get("date") or "?") for j in js})
        if at:
            out.append(what + " at " + ", ".join(f"commit `{c}` on {d}" for c, d in at))
    return "; ".join(out)


def shared_rows(h):
    """The headline's rows for --shared-params (none in a run without it)."""
    if h.get("zerod_shared_iter_ms") is None:
        return ""
    return (
        f"| zerod iteration, the ranks sharing one parameter buffer (`zerod_shared_iter_ms`; "
        f"fastest `zerod_shared_iter_min_ms`) | {h['zerod_shared_iter_ms']:.1f} ms "
        f"({h['zerod_shared_iter_min_ms']:.1f}) | {num(h['vs_torch_shared'], '{:.2f}')}× faster "
        f"than torch (`vs_torch_shared`); {h['shared_vs_own']:.2f}× the time of own buffers "
        f"(`shared_vs_own`) | ≥ 8× |\n"
        f"| its bytes-moved floor (`floor_shared_iter_ms`) | {h['floor_shared_iter_ms']:.1f} ms | "
        f"zerod {h['vs_floor_shared']:.2f}× (`vs_floor_shared`) | |\n")


def main():
    d, doc = sys.argv[1], sys.argv[2]
    top = os.path.dirname(os.path.dirname(os.path.abspath(doc)))
    h = load(d, "headline")
    sizes = sorted((load(d, os.path.basename(p)[:-5]) for p in glob.glob(d + "/size-*.json")),
                   key=lambda j: j["params"])
    modes = [load(d, f"mode-{a}-{b}") for a in ("bucket", "slice")
             for b in ("interleaved", "at_end")]

    with open(os.path.join(d, "sweep.dat"), "w") as f:
        f.write("# params_M zerod_ms torch_ms fused_ms floor_ms\n")
        for j in sizes:
            t = j["torch_iter_ms"]
            f.write(f"{j['params'] / 1e6:g} {j['zerod_iter_ms']} "
                    f"{'NaN' if t is None else t} {j['fused_ref_ms']} {j['floor_iter_ms']}\n")

    sweep_rows = "\n".join(
        f"| {j['params'] / 1e6:g}M | {j['buckets']} | {num(j['zerod_iter_ms'])} | "
        f"{num(j['torch_iter_ms'])} | {num(j['fused_ref_ms'])} | {num(j['floor_iter_ms'])} | "
        f"{num(j['vs_torch'], '{:.2f}×')} | {num(j['vs_fused'], '{:.2f}×')} | "
        f"{load_cell(j)} |" for j in sizes)
    mode_rows = "\n".join(
        f"| {j['shard']} | {j['step']} | {num(j['zerod_iter_ms'])} | "
        f"{num(j['fused_ref_ms'])} | {num(j['vs_fused'], '{:.2f}×')} | "
        f"{j['daemon_rss_anon_bytes'] / 1e6:.0f} MB | {num(j['rss_vs_state'], '{:.2f}×')} | "
        f"{load_cell(j)} |" for j in modes)
    nodes = [load(d, f"daemons-2-{b}") for b in ("interleaved", "at_end")
             if os.path.exists(os.path.join(d, f"daemons-2-{b}.json"))]
    node_rows = "\n".join(
        f"| {j['step']} | {num(j['zerod_iter_ms'])} | {num(j['gloo_iter_ms'])} | "
        f"{num(j['busbw_zerod'], '{:.3f}')} | {num(j['busbw_net'], '{:.3f}')} | "
        f"{num(j['busbw_gloo'], '{:.3f}')} | {num(j['vs_gloo'], '{:.2f}')} | "
        f"{num(j['vs_gloo_net'], '{:.2f}')} | {load_cell(j)} |" for j in nodes)
    sealed = [j for j in nodes if j.get("curve_iter_ms") is not None]
    sealed_rows = "\n".join(
        f"| {j['step']} | {num(j['zerod_iter_ms'])} | {num(j['curve_iter_ms'])} | "
        f"{num(j['curve_vs_plain'], '{:.2f}')} | {num(j['curve_vs_plain_net'], '{:.2f}')} | "
        f"{load_cell(j)} |" for j in sealed)
    sealed_text = f"""
### With CURVE keys: the sealed mesh against gloo

The same runs (`--curve`) run the job a second time on daemons started with
CURVE keys (a key pair made in a temporary directory, as `zeroctl keygen`
makes it), whose tensors cross the sealed mesh (`daemon/coll/sealmesh.c`)
instead of gloo. "sealed / plain" is the plain run's time over the sealed
run's (a speed: 1 would be as fast); "all-reduce" compares the daemons' own
cross-node all-reduce bandwidths (`curve_algbw_net` / `algbw_net`).

| step | plain ms | sealed ms | sealed / plain whole iteration | sealed / plain all-reduce | load |
|---|---|---|---|---|---|
{sealed_rows}

The price is the sealing: every byte a node sends is sealed once and every
byte it receives opened once, on the lane's thread, with AES-256-GCM where
both CPUs have AES-NI, else `crypto_secretstream_xchacha20poly1305`. Here
both "nodes" seal on the same 2 cores; on separate machines they would not
share them, and a real network is slower than loopback, so the sealing's
share of the time would be smaller.
""" if sealed else ""
    mb = 1e6
    text = f"""# zerod performance

Every number here comes from `tools/bench/zerod-bench` (what it measures is
described at the end), run by one command that rewrites this file:

```sh
tools/bench/perf-doc.sh     # installs python3-torch and gnuplot, builds, runs, writes this page
```

The raw JSON of every run is in [`docs/perf/`](perf/), one file per run; the
plot's table is `docs/perf/sweep.dat`. Each JSON records the commit and the
day it was measured at: {measured(h, sizes, modes, nodes, top)}, on {machine()}: the data plane of issue 5
(one fused pass per chunk, no master copy of fp32 parameters, the compact
state, the fast-path handoff; `docs/DATAPLANE.md`).

The machine is shared and has 2 cores: a neighbour's build halves every
bandwidth. `perf-doc.sh` waits for a quiet machine before each run and each
JSON records the load average it began at (`loadavg`, the tables' "load";
"busy" marks runs that began above 1, whose numbers a neighbour bent: rerun
them when the machine is quiet); compare the ratios
inside one run, which zerod-bench measures back to back, rather than absolute
times across runs.

## The headline job: 25M parameters, 2 ranks, 4 buckets of 25 MB, Adam

```sh
build/tools/bench/zerod-bench --params 25M --buckets 4 --ranks 2 --optim adam --vs-torch --shared-params --json
```

| measure | value | ratio | issue 5's target |
|---|---|---|---|
| zerod iteration (`zerod_iter_ms`; fastest `zerod_iter_min_ms`) | {h['zerod_iter_ms']:.1f} ms ({h['zerod_iter_min_ms']:.1f}) | | |
| torch DDP + ZeroRedundancyOptimizer(Adam), gloo (`torch_iter_ms`) | {num(h['torch_iter_ms'])} ms | zerod {num(h['vs_torch'], '{:.2f}')}× faster (`vs_torch`) | ≥ 8× |
| plain-C fused pass (`fused_ref_ms`; fastest pass `fused_ref_min_ms`) | {h['fused_ref_ms']:.1f} ms ({h['fused_ref_min_ms']:.1f}) | zerod {h['vs_fused']:.2f}× slower (`vs_fused`) | ≤ 1.15× |
| bytes-moved floor (`floor_iter_ms`) | {h['floor_iter_ms']:.1f} ms | zerod {h['vs_floor']:.2f}× (`vs_floor`) | |
{shared_rows(h)}| tiny-bucket handoff p50 / p99 (`handoff_p50_us`, `handoff_p99_us`) | {h['handoff_p50_us']:.0f} / {h['handoff_p99_us']:.0f} µs | p50 = {h['handoff_vs_unix']:.2f}× the AF_UNIX round trip (`handoff_vs_unix`) | ≤ 3× |
| AF_UNIX 64 B round trip, across / on one CPU (`unix_rtt_us`, `unix_rtt_same_cpu_us`) | {h['unix_rtt_us']:.1f} / {h['unix_rtt_same_cpu_us']:.1f} µs | | |
| daemon RssAnon with the job active (`daemon_rss_anon_bytes`) | {h['daemon_rss_anon_bytes'] / mb:.0f} MB | {h['rss_vs_state']:.2f}× the optimizer state (`rss_vs_state`) | ≤ 1.05× |
| optimizer state the daemon must hold (`state_bytes`) | {h['state_bytes'] / mb:.0f} MB | | |
| memcpy, 1 thread (`memcpy_gbps`) | {h['memcpy_gbps']:.1f} GB/s | | |
| STREAM triad, {h['threads']} threads (`triad_gbps`) | {h['triad_gbps']:.1f} GB/s | | |

torch's synced iteration took {num(h['torch_synced_ms'])} ms and the same
iteration under `no_sync()` {num(h['torch_compute_ms'])} ms; their difference is
`torch_iter_ms`. The whole JSON is [`perf/headline.json`](perf/headline.json).

## Iteration time against model size

2 ranks, Adam, buckets of 25 MB (`--bucket-size 25M`, as DDP's
`bucket_cap_mb=25`), each point one run of
`zerod-bench --params N --bucket-size 25M --ranks 2 --optim adam --vs-torch --json`.

![iteration time against model size](perf-iter-vs-size.png)

| params | buckets | zerod ms | torch ms | fused ms | floor ms | zerod vs torch | zerod vs fused | load |
|---|---|---|---|---|---|---|---|---|
{sweep_rows}

## Shard and step modes

25M parameters, 4 buckets, 2 ranks, Adam, no torch:
`zerod-bench --params 25M --buckets 4 --ranks 2 --optim adam --shard S --step T --json`.

| shard | step | zerod ms | fused ms | zerod vs fused | RssAnon | vs state | load |
|---|---|---|---|---|---|---|---|
{mode_rows}

## Several nodes: two daemons on loopback against raw gloo

25M parameters, 4 buckets, 2 ranks (one per daemon), Adam, shard bucket:
`zerod-bench --daemons 2 --params 25M --buckets 4 --ranks 2 --optim adam --step T --json`.
Busbw in GB/s (nccl-tests' formula, algbw × 2(n−1)/n). "whole iteration"
counts the local reduce, the optimizer step and the write-back as all-reduce
time; "all-reduce" is the daemons' own cross-node all-reduce
(`zerod_net_allreduce_*` in their metrics: exchange, fold and gather), the
slowest daemon's; "gloo" is gloo's own all-reduce of the same buckets
between two processes, alone on the machine, in the same run.

| step | zerod ms | gloo ms | busbw whole iteration | busbw all-reduce | busbw gloo | whole / gloo | all-reduce / gloo | load |
|---|---|---|---|---|---|---|---|---|
{node_rows}

Both "nodes" share this machine's 2 cores. In `interleaved` mode each
bucket's optimizer step and write-back overlap the next bucket's all-reduce,
so the all-reduce shares the CPUs with them (and with the other "node"); in
`at_end` mode it runs alone, as gloo's does, and that row is the fair
comparison of the all-reduce itself. On separate machines the two daemons
would not compete for the same cores.
{sealed_text}
## What zerod-bench measures

One run, in this order: the floors, then a real `zerod` (`--zerod PATH`,
`$ZEROD_BIN`, else the build's) on a socket in a fresh temporary directory
with `--ranks` real trainer processes that use only the public libzeroclient
API, then with `--vs-torch` the torch anchor. `--json` prints one object;
without it, a table with the same values.

- **`zerod_iter_ms`**: the job the flags describe: `--params` fp32 elements
  (K/M/G are decimal) in `--buckets` equal buckets or buckets of
  `--bucket-size` bytes, one parameter group, `--optim sgd|adam|adamw`
  (torch's defaults, lr 1e-3; SGD with momentum 0.9, AdamW with weight decay
  0.01), `--shard`, `--step`. Each iteration, every rank writes its gradients
  (outside the timed region), the ranks meet at a barrier, and each times from
  its first `zc_bucket_ready()` to its step future done (all buckets handed
  over back to back, `zc_step_future` + `zc_future_wait`). An iteration's time
  is its slowest rank's; the value is the median over `--iters` iterations
  after `--warmup` (default 20 after 3). So it is the daemon's work alone,
  net of the trainers' gradient fill: handoff, reduction, optimizer step and
  write-back into every rank's parameters.
- **`torch_iter_ms`**: `tools/bench/torch_anchor.py` through
  `/usr/bin/python3` (Debian's `python3-torch` 1.13, CPU): `--ranks` processes
  over gloo on loopback, `DistributedDataParallel(bucket_cap_mb=25)` over a
  stack of bias-free `Linear` layers, one per zerod bucket, with the same
  parameter count, batch 1, and `ZeroRedundancyOptimizer` wrapping the same
  optimizer and hyperparameters. ZeRO runs as a plain step after backward
  (`overlap_with_ddp=False`): the overlapped mode's DDP hooks
  (`hook_with_zero_step[_interleaved]`) refuse every backend but NCCL/HCCL.
  Backward compute is subtracted: each iteration is also run under
  `no_sync()` (forward and backward, no communication, no step), interleaved
  with the synced ones, and `torch_iter_ms` = median(synced) −
  median(`no_sync`), each time the slowest rank's. What is left is DDP's
  all-reduce that backward did not hide plus the ZeRO step and its
  broadcasts. Debian's torch uses the reference BLAS, so compute is large, but
  it is subtracted.
- **`torch_zerod_iter_ms`** (`--torch-zerod`): the real
  `zerod.torch.ZerodOptimizer` in the same anchor run, on a zerod of its own:
  a second copy of the model (the same values, input, buckets, optimizer) under
  DDP with its comm hook, its synced iterations (zero_grad, forward,
  backward handing the buckets over, `opt.step()` waiting for zerod's step)
  interleaved with the other two kinds, minus the same `no_sync` median. So it
  holds what the Python package adds (the hook and its one copy per bucket,
  ctypes, the pump thread) besides zerod's own work.
  `torch_zerod_max_diff` is the largest difference between its parameters and
  ZeRO's after the run (they train the same model on the same data).
- **`fused_ref_ms`**: a plain-C pass over the same bytes, threaded over
  `--threads` (default: every CPU) as the daemon's worker pool would be: per
  chunk of 8192 elements (which stays in L2), sum the ranks' gradients in rank
  order into a scratch, divide by R, step the optimizer with torch's
  arithmetic (`daemon/optim/optim.h`) on rank 0's parameters as the master,
  and copy the result into every other rank's parameter buffer. Built `-O3`
  with the same SIMD clones as the daemon's kernels; plain stores. Median of
  `--iters` passes after `--warmup` (and the fastest, `fused_ref_min_ms`:
  with 2 threads on 2 shared cores, one busy neighbour can double a pass, so
  when `loadavg` is high compare the fastest with `zerod_iter_min_ms`).
- **`floor_iter_ms`**: the bytes an iteration must move at the least, every
  input read once and every output written once — R gradient buffers and the
  master parameters read, S floats of optimizer state per element read and
  written, R parameter buffers written: `floor_bytes` = 4 N (2R + 1 + 2S) —
  divided by the memory bandwidth triad shows. STREAM counts triad as 3
  arrays, but the machine also reads the destination before writing it
  (write-allocate), so the bandwidth it moved is 4/3 of `triad_gbps`:
  `floor_iter_ms` = `floor_bytes` / (4/3 × `triad_gbps`). Triad runs over as
  many bytes as one iteration moves, so both see the same level of the
  memory hierarchy (this CPU reports a 260 MiB L3, of which a VM gets some:
  small jobs run partly from cache).
- **`zerod_shared_iter_ms`** (`--shared-params`): a second job of the same
  plan on the same daemon, beside the first, whose ranks all register one
  parameter memfd the bench made before forking them
  (`ZC_BUFFERS_SHARED_PARAMS`; `docs/DATAPLANE.md`, "Shared parameters"), each
  its own gradient memfd. The two jobs take turns, one iteration each (the
  other job's ranks sleep at the barrier meanwhile), so a neighbour's burst
  bends both alike and `shared_vs_own` compares them on the same machine.
  The pass then writes every parameter once: `floor_shared_bytes` =
  4 N (R + 2 + 2S), `floor_shared_iter_ms` at the same bandwidth as
  `floor_iter_ms`. With it the daemon holds both jobs' state, and
  `state_bytes` counts both.
- **`memcpy_gbps`**: bytes copied per second by one thread's `memcpy` of
  `--memcpy-size` (256M), best of at least 6 copies and 0.3 s.
  **`triad_gbps`**: STREAM triad `a = b + 3c` on `--threads` threads, counted
  as STREAM does (3 arrays), best of at least 8 passes and 1 s.
- **`handoff_p50_us`, `handoff_p99_us`**: a second job on the same daemon with
  one bucket of 16 elements; each rank times `zc_bucket_ready()` → its step
  future done over `--handoff-iters` (2000) iterations, the ranks meeting at a
  barrier before each; p50 and p99 of all ranks' samples together. It goes
  through the client's only path today, ZeroMQ.
- **`unix_rtt_us`**: the median round trip of a 64-byte message over an
  AF_UNIX socketpair to a forked echo process, 10000 times, the two pinned to
  two different CPUs. On this VM the same ping-pong on one CPU
  (`unix_rtt_same_cpu_us`) was {h['unix_rtt_us'] / h['unix_rtt_same_cpu_us']:.0f}× cheaper in the headline run, because waking an idle vCPU
  costs tens of µs, and unpinned it lands on either at random. The handoff
  crosses CPUs (trainers and the daemon's threads run on both), so
  `handoff_vs_unix` divides by the cross-CPU figure; against the one-CPU
  figure the headline's handoff p50 is
  {h['handoff_p50_us'] / h['unix_rtt_same_cpu_us']:.0f}×. (Issue 5's "12.5×" was
  against a ~13 µs round trip, which on this VM is neither.)
- **`daemon_rss_anon_bytes`**: `RssAnon` of `/proc/<zerod>/status` (private
  memory; the mapped shared buffers are `RssShmem` and not counted) read while
  every rank of the main job is still connected, after its iterations.
  **`state_bytes`**: the optimizer state the daemon must hold for N elements:
  Adam/AdamW 2 floats (3 with amsgrad), SGD 1 with momentum ≠ 0, else 0.
- **`--daemons N`** (`schema` `zerod-bench-daemons/1`): the same job over N
  daemons on loopback, ranks spread over them, then gloo's own all-reduce of
  the same buckets between N processes. `zerod_iter_ms`: the slowest rank's
  first `zc_bucket_ready` to its step done (median); `gloo_iter_ms`: every
  bucket through `gloo::allreduce` (median); `algbw_*` = gradient bytes /
  time, `busbw_*` = algbw × 2(n−1)/n; `algbw_net`: the daemons' own
  cross-node all-reduces, bytes over the time their gloo backend spent in
  them (metrics `zerod_net_allreduce_bytes_total` /
  `zerod_net_allreduce_seconds_total`, read with `zeroctl metrics` after the
  run), the slowest daemon's; `vs_gloo` = busbw_zerod / busbw_gloo,
  `vs_gloo_net` = busbw_net / busbw_gloo. With `--curve` also
  `curve_iter_ms` (the same job on daemons with CURVE keys: the sealed
  mesh), `curve_algbw_net` (their own all-reduce), `curve_vs_plain` =
  `zerod_iter_ms` / `curve_iter_ms` and `curve_vs_plain_net` =
  `curve_algbw_net` / `algbw_net`.
- Ratios: `vs_torch` = torch / zerod (how many times faster zerod is),
  `vs_torch_zerod` = torch / `torch_zerod_iter_ms`, `torch_zerod_vs_c` =
  `torch_zerod_iter_ms` / `zerod_iter_ms` (the Python package's cost, as a
  factor of the C trainers' iteration),
  `vs_fused` = zerod / fused, `vs_floor` = zerod / floor,
  `vs_torch_shared` = torch / `zerod_shared_iter_ms`, `vs_floor_shared` =
  `zerod_shared_iter_ms` / `floor_shared_iter_ms`, `shared_vs_own` =
  `zerod_shared_iter_ms` / `zerod_iter_ms`,
  `handoff_vs_unix` = handoff p50 / `unix_rtt_us`,
  `rss_vs_state` = RssAnon / state; `null` where a side is missing.

The `bench` suite (`meson test -C build --suite bench`, part of
`tools/test.sh`) runs a few-second zerod-bench and checks only that it printed
every key; it asserts nothing about speed.
"""
    with open(doc, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
