#!/usr/bin/env python3
"""The size rules of zerod's product code (issue 22), checked on the
sources: no function over 100 lines, no file over 1,200 lines unless its
opening comment says why, in words containing "over 1,200 lines".

  tools/check-size.py [SOURCE_ROOT]

The product is daemon/, client/, common/ and tools/zeroctl/ (the tests,
benchmarks and demos are not). A function is a body opened by "{" alone at
the start of a line after its signature and closed by "}" at the start of a
line (the kernel style STYLE.md asks for); its length is the lines between
them. Each break is printed as FILE:LINE: what. Exit 0 when clean, 1 with
the breaks, 2 on a usage error.
"""
import os
import re
import sys

PRODUCT = ("daemon", "client", "common", os.path.join("tools", "zeroctl"))
SOURCE = re.compile(r"\.(c|cc|cu|h)$")
MAX_FUNCTION = 100
MAX_FILE = 1200
WHY = "over 1,200 lines"


def opening_comment(lines):
    """The first comment of a file, as one string ('' if it opens with none)."""
    text = []
    for line in lines:
        text.append(line)
        if "*/" in line:
            break
    joined = " ".join(l.strip(" */") for l in text)
    return joined if lines and lines[0].startswith("/*") else ""


def check_file(rel, lines):
    breaks = []
    if len(lines) > MAX_FILE and WHY not in opening_comment(lines):
        breaks.append("%s:1: %d lines (at most %d unless the opening comment says why, "
                      "\"%s: ...\")" % (rel, len(lines), MAX_FILE, WHY))
    start = None
    for i, line in enumerate(lines):
        if line.startswith("{") and i > 0 and lines[i - 1].rstrip().endswith(")"):
            start = i
        elif line.startswith("}") and start is not None:
            n = i - start - 1
            if n > MAX_FUNCTION:
                name = re.findall(r"(\w+)\s*\(", " ".join(lines[max(0, start - 3):start]))
                breaks.append("%s:%d: function %s is %d lines (at most %d)"
                              % (rel, start, name[0] if name else "?", n, MAX_FUNCTION))
            start = None
    return breaks


def main(argv):
    root = os.path.abspath(argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    if not os.path.isdir(os.path.join(root, "daemon")):
        print("check-size: %s has no daemon/" % root, file=sys.stderr)
        return 2
    breaks, nfiles = [], 0
    for top in PRODUCT:
        for dirpath, _, names in os.walk(os.path.join(root, top)):
            for name in sorted(names):
                if not SOURCE.search(name):
                    continue
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8", errors="replace") as f:
                    lines = f.read().split("\n")
                if lines and lines[-1] == "":
                    lines.pop()
                nfiles += 1
                breaks += check_file(os.path.relpath(path, root), lines)
    for b in breaks:
        print(b)
    print("check-size: %d files, %d breaks" % (nfiles, len(breaks)), file=sys.stderr)
    return 1 if breaks else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
