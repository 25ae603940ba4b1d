#!/usr/bin/env python3
"""The rules between zerod's folders (docs/LAYOUT.md), checked on every
#include "..." of the product's sources: daemon/, client/, common/.

  tools/check-layers.py [SOURCE_ROOT]

A folder of daemon/ includes only itself and the folders below it, in the
order of LAYERS (tools/zlayers.py); folders on one level (coll and optim,
net and mem, edge and ops) never include each other; common/,
client/include/ and the generated protobuf header are below everything;
client/ never includes daemon/, and common/ only itself. An include that
breaks a rule fails the check, named by file and line, unless
tools/layers-known.txt lists it (the debts issue 22 pays off, each with its
reason); an entry there that no longer breaks a rule fails the check too,
so the list only shrinks. Exit 0 when clean, 1 with the offending lines, 2
on a usage error. tools/check-calls.py checks the same rules on the calls
between the built objects.
"""
import os
import re
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from zlayers import read_known, relation  # noqa: E402  LAYERS, lowest first (tools/zlayers.py)

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def where(root, path):
    """(area, folder) of a file: area daemon, client, common, api; folder in daemon/."""
    rel = os.path.relpath(path, root)
    parts = rel.split(os.sep)
    if parts[0] == "daemon":
        return "daemon", parts[1] if len(parts) > 2 else ""
    if parts[:2] == ["client", "include"]:
        return "api", ""
    return parts[0], ""


def resolve(root, src, inc):
    """The file an include names, searched as the build does, or None (generated)."""
    area, _ = where(root, src)
    dirs = [os.path.dirname(src)]
    if area == "daemon":
        dirs.append(os.path.join(root, "daemon"))
    dirs += [os.path.join(root, "common"), os.path.join(root, "client", "include")]
    for d in dirs:
        p = os.path.normpath(os.path.join(d, inc))
        if os.path.isfile(p):
            return p
    return None


def broken(root, src, tgt):
    """Why src may not include tgt, or None."""
    sa, sf = where(root, src)
    ta, tf = where(root, tgt)
    if ta in ("api", "common"):
        return None if sa != "api" or ta == "api" else "the public header includes only itself"
    if sa == "common":
        return "common/ includes only common/ and the public header"
    if sa == "client":
        return None if ta == "client" else "client/ never includes daemon/"
    if sa != "daemon" or ta != "daemon":
        return None
    rel = relation(sf, tf)
    if rel in ("inside", "below"):
        return None
    if rel == "unknown":
        return "daemon/%s or daemon/%s is no folder of LAYERS" % (sf, tf)
    if rel == "level":
        return "%s and %s are on one level and never include each other" % (sf or ".", tf or ".")
    return "%s is above %s" % ("daemon/" + tf if tf else "daemon/ itself", "daemon/" + sf)


def main(argv):
    root = os.path.abspath(argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    if not os.path.isdir(os.path.join(root, "daemon")):
        print("check-layers: %s has no daemon/" % root, file=sys.stderr)
        return 2
    known = read_known(os.path.join(root, "tools", "layers-known.txt"))
    seen_known = set()
    bad = []
    files = 0
    for top in ("daemon", "client", "common"):
        for dp, dn, fn in os.walk(os.path.join(root, top)):
            dn.sort()
            for f in sorted(fn):
                if not f.endswith((".c", ".h", ".cc", ".cu")):
                    continue
                src = os.path.join(dp, f)
                files += 1
                rel = os.path.relpath(src, root)
                for n, line in enumerate(open(src, errors="replace"), 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    tgt = resolve(root, src, m.group(1))
                    if tgt is None:
                        continue
                    why = broken(root, src, tgt)
                    if not why:
                        continue
                    key = (rel, m.group(1))
                    if key in known:
                        seen_known.add(key)
                        continue
                    bad.append("%s:%d: #include \"%s\" (%s): %s" %
                               (rel, n, m.group(1), os.path.relpath(tgt, root), why))
    for key, n in sorted(known.items(), key=lambda kv: kv[1]):
        if key not in seen_known:
            bad.append("tools/layers-known.txt:%d: %s: %s breaks no rule now: remove the entry" %
                       (n, key[0], key[1]))
    for b in bad:
        print(b)
    print("check-layers: %d files, %d known debts, %d new breaks" %
          (files, len(seen_known), len(bad)), file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
