#!/usr/bin/env python3
"""The rules between daemon/'s folders (docs/LAYOUT.md), checked on what the
built objects call and reference: the companion of tools/check-layers.py,
which checks the includes.

  tools/check-calls.py [--list | --graph] BUILD_DIR [SOURCE_ROOT]

It reads every object meson built from daemon/'s sources in BUILD_DIR
(daemon/<target>.p/<path with / as _>.o: libzerod's, the kernels', the
gloo shim's, the CUDA backend's or its stand-in's, main.c's), takes with
nm the globals each defines and the symbols each leaves undefined, and
joins the two into the graph "folder A references a global of folder B".
A folder references only itself and the folders strictly below it, in the
order of LAYERS (tools/zlayers.py); folders on one level never reference
each other; so the graph between folders has no cycle, and each cycle
there is printed ("cycle: core -> edge -> core").

A reference that breaks a rule fails the check, as
  daemon/core/job.c: session_drop (daemon/edge/session.c): edge is above core
unless tools/calls-known.txt lists it ("file: symbol", the debts issue 22
pays off); an entry there that no longer breaks a rule fails the check
too, so the list only shrinks. An entry whose file was not built here (no
gloo, no CUDA), or which names a symbol its file still references but no
object here defines, is left unjudged.

  --list   every break of today, known or not, in calls-known.txt's form
  --graph  the folder graph: each edge with its count of references

Exit 0 when clean, 1 on breaks, 2 on a usage error (no object found).
"""
import os
import subprocess
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from zlayers import LEVEL, read_known, relation  # noqa: E402  LAYERS, lowest first (tools/zlayers.py)

# nm's kinds: a global an object defines (weak ones rank below strong)
STRONG = set("TDBRGSCiu")
WEAK = set("VW")


def usage(msg):
    print("check-calls: " + msg, file=sys.stderr)
    return 2


def sources(root):
    """{meson's object stem: source path under daemon/}, from the tree."""
    out = {}
    top = os.path.join(root, "daemon")
    for dp, dn, fn in os.walk(top):
        dn.sort()
        for f in sorted(fn):
            rel = os.path.relpath(os.path.join(dp, f), top)
            out[rel.replace(os.sep, "_")] = rel.replace(os.sep, "/")
    return out


def objects(build, srcmap):
    """[(source path under daemon/, object path)] of the daemon's objects.
    A stem the tree does not have (a file planted, or a tree that moved on)
    is read by its first word when that is a folder of LAYERS."""
    out = []
    top = os.path.join(build, "daemon")
    if not os.path.isdir(top):
        return out
    for d in sorted(os.listdir(top)):
        tdir = os.path.join(top, d)
        if not d.endswith(".p") or not os.path.isdir(tdir):
            continue
        for f in sorted(os.listdir(tdir)):
            if not f.endswith(".o"):
                continue
            stem = f[:-2]
            if stem.startswith(("_", ".._", "meson-generated_")):
                continue  # from outside daemon/, or generated
            src = srcmap.get(stem)
            if src is None:
                head, _, rest = stem.partition("_")
                src = head + "/" + rest if rest and head in LEVEL else stem
            out.append((src, os.path.join(tdir, f)))
    return out


def nm(paths):
    """{object path: (defined {symbol: strong}, undefined set)}, one nm for all."""
    out = {p: ({}, set()) for p in paths}
    try:
        text = subprocess.run(["nm", "-P", "-A"] + paths, check=True, capture_output=True,
                              text=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise SystemExit(usage("nm: %s" % e))
    for line in text.splitlines():
        path, _, rest = line.partition(": ")
        w = rest.split()
        if path not in out or len(w) < 2:
            continue
        (defined, undefined), (sym, kind) = out[path], w[:2]
        if kind == "U":
            undefined.add(sym)
        elif kind in STRONG or kind in WEAK:
            defined[sym] = defined.get(sym, False) or kind in STRONG
    return out


def folder(src):
    """daemon/'s folder of a source path under daemon/; "" for daemon/ itself."""
    return src.split("/", 1)[0] if "/" in src else ""


def name(f):
    return f if f else "daemon/ itself"


def why(sf, tf):
    """Why folder sf may not reference folder tf, or None."""
    rel = relation(sf, tf)
    if rel in ("inside", "below"):
        return None
    if rel == "unknown":
        return "daemon/%s or daemon/%s is no folder of LAYERS" % (sf, tf)
    if rel == "level":
        return "%s and %s are on one level and never reference each other" % (name(sf), name(tf))
    return "%s is above %s" % (name(tf), name(sf))


def demangle(names):
    """{mangled: readable} for the C++ names among names (c++filt)."""
    cxx = sorted(n for n in names if n.startswith("_Z"))
    if not cxx:
        return {}
    try:
        out = subprocess.run(["c++filt"], input="\n".join(cxx) + "\n", check=True,
                             capture_output=True, text=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return {}
    return dict(zip(cxx, out)) if len(out) == len(cxx) else {}


def cycles(edges):
    """One cycle through each edge that does not go strictly down: the edge
    a -> b and a shortest path b -> ... -> a back, as lists of folders."""
    succ = {}
    for a, b in edges:
        succ.setdefault(a, set()).add(b)
    found = set()
    out = []
    for a, b in sorted(edges):
        if relation(a, b) == "below":
            continue
        prev, todo = {b: None}, [b]
        while todo and a not in prev:
            nxt = []
            for u in todo:
                for v in sorted(succ.get(u, ())):
                    if v not in prev:
                        prev[v] = u
                        nxt.append(v)
            todo = nxt
        if a not in prev:
            continue
        path, u = [], a
        while u is not None:
            path.append(u)
            u = prev[u]
        ring = [a] + path[::-1][:-1]  # a, b, ..., (before a)
        i = ring.index(min(ring))  # one spelling per cycle
        key = tuple(ring[i:] + ring[:i])
        if key not in found:
            found.add(key)
            out.append(list(key) + [key[0]])
    return out


def main(argv):
    args = [a for a in argv[1:] if not a.startswith("--")]
    opts = [a for a in argv[1:] if a.startswith("--")]
    if not args or len(args) > 2 or any(o not in ("--list", "--graph") for o in opts) or \
            len(opts) > 1:
        return usage("usage: check-calls.py [--list | --graph] BUILD_DIR [SOURCE_ROOT]")
    build = os.path.abspath(args[0])
    root = os.path.abspath(args[1] if len(args) > 1 else
                           os.path.join(os.path.dirname(__file__), ".."))
    if not os.path.isdir(os.path.join(root, "daemon")):
        return usage("%s has no daemon/" % root)
    objs = objects(build, sources(root))
    if not objs:
        return usage("no object of daemon/'s sources under %s/daemon/*.p/: "
                     "not a build directory, or not built yet" % build)

    # who defines what; a strong definition hides the weak ones
    defs, refs, built = {}, {}, set()
    syms = nm([path for _, path in objs])
    for src, path in objs:
        d, u = syms[path]
        built.add(src)
        refs.setdefault(src, set()).update(u)
        for sym, strong in d.items():
            defs.setdefault(sym, {}).setdefault(src, False)
            defs[sym][src] = defs[sym][src] or strong
    for sym, by in defs.items():
        if any(by.values()):
            defs[sym] = {s: True for s, strong in by.items() if strong}

    graph = {}  # (folder, folder): set of (file, symbol)
    breaks = {}  # (file, symbol): (defining file, why)
    for src in sorted(refs):
        sf = folder(src)
        for sym in sorted(refs[src]):
            by = defs.get(sym)
            if not by:
                continue  # from outside daemon/: libc, zmq, common/, ...
            if any(folder(t) == sf for t in by):
                continue
            for tgt in sorted(by):
                tf = folder(tgt)
                graph.setdefault((sf, tf), set()).add((src, sym))
                w = why(sf, tf)
                if w and (src, sym) not in breaks:
                    breaks[(src, sym)] = (tgt, w)
    pretty = demangle(set(defs).union(*refs.values()))

    def show(sym):
        return pretty.get(sym, sym)

    if opts == ["--graph"]:
        key = lambda e: (-LEVEL.get(e[0], -1), e[0], LEVEL.get(e[1], -1), e[1])
        for a, b in sorted(graph, key=key):
            refs_ab = graph[(a, b)]
            files = len({f for f, _ in refs_ab})
            print("%-14s -> %-14s %4d references from %d files%s" %
                  (name(a), name(b), len(refs_ab), files,
                   "" if relation(a, b) == "below" else "  (break)"))
        for c in cycles(graph):
            print("cycle: " + " -> ".join(name(f) for f in c))
        return 0
    if opts == ["--list"]:
        last = None
        for (src, sym), (tgt, w) in sorted(
                breaks.items(), key=lambda kv: (folder(kv[0][0]), folder(kv[1][0]), kv[0])):
            pair = (folder(src), folder(tgt))
            if pair != last:
                print("%s# %s -> %s: %s" % ("" if last is None else "\n", name(pair[0]),
                                            name(pair[1]), w))
                last = pair
            print("daemon/%s: %s" % (src, show(sym)))
        return 0

    known = read_known(os.path.join(root, "tools", "calls-known.txt"))
    bad = []
    seen_known = set()
    for (src, sym), (tgt, w) in sorted(breaks.items()):
        key = ("daemon/" + src, show(sym))
        if key in known:
            seen_known.add(key)
            continue
        bad.append("daemon/%s: %s (daemon/%s): %s" % (src, show(sym), tgt, w))
    unjudged = 0
    for key, n in sorted(known.items(), key=lambda kv: kv[1]):
        if key in seen_known:
            continue
        f = key[0][len("daemon/"):] if key[0].startswith("daemon/") else None
        if f not in built or any(show(u) == key[1] and u not in defs for u in refs[f]):
            unjudged += 1  # not built here, or what it calls is not built here
            continue
        bad.append("tools/calls-known.txt:%d: %s: %s breaks no rule now: remove the entry" %
                   (n, key[0], key[1]))
    for b in bad:
        print(b)
    rings = cycles(graph)
    for c in rings:
        debts = all(("daemon/" + f, show(sym)) in seen_known
                    for a, b in zip(c, c[1:]) if relation(a, b) != "below"
                    for f, sym in graph[(a, b)])
        print("cycle: " + " -> ".join(name(f) for f in c) +
              (" (through known debts only)" if debts else ""))
    print("check-calls: %d objects, %d references between folders, %d known debts "
          "(%d unjudged here), %d cycles, %d new breaks" %
          (len(objs), sum(len(v) for v in graph.values()), len(seen_known), unjudged,
           len(rings), len(bad)), file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
