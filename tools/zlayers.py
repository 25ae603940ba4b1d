"""daemon/'s folders by level (docs/LAYOUT.md), the one list that both checks
of the rules between them read: tools/check-layers.py (includes) and
tools/check-calls.py (calls and references between the objects).
"""

import os

# daemon/'s folders, lowest first; one tuple is one level
LAYERS = [("base",), ("net", "mem"), ("coll", "optim"), ("plan",), ("exec",), ("core",),
          ("edge", "ops"), ("",)]  # "": daemon/ itself (main.c, daemon.c): the wiring
LEVEL = {f: i for i, level in enumerate(LAYERS) for f in level}


def relation(sf, tf):
    """How folder tf stands to folder sf, which uses it: "inside" (one
    folder), "below" (allowed), "level" (one level: refused), "above"
    (refused) or "unknown" (one of them is no folder of LAYERS)."""
    if sf == tf:
        return "inside"
    if sf not in LEVEL or tf not in LEVEL:
        return "unknown"
    if LEVEL[tf] < LEVEL[sf]:
        return "below"
    return "level" if LEVEL[tf] == LEVEL[sf] else "above"


def read_known(path):
    """The debts a known list tolerates ("file: what" a line, "#" comments):
    {(file, what): line number}; {} when the file does not exist."""
    known = {}
    if os.path.exists(path):
        with open(path) as f:
            for n, line in enumerate(f, 1):
                line = line.split("#", 1)[0].strip()
                if line:
                    file, _, what = line.partition(":")
                    known[(file.strip(), what.strip())] = n
    return known
