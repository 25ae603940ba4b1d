"""daemon/'s folders by level (docs/LAYOUT.md), the one list that both checks
of the rules between them read: tools/check-layers.py (includes) and
tools/check-calls.py (calls and references between the objects).
"""

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
