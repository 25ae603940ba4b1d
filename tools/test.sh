#!/usr/bin/env bash
# The whole test suite: install what is missing, build with -Werror, run
# every meson suite (unit, integration), and print one closing line.
#
#   tools/test.sh [meson test args...]     e.g. tools/test.sh --suite unit
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$top/build}

"$top/tools/deps.sh"
BUILD_DIR=$build "$top/tools/build.sh"

status=0
meson test -C "$build" --print-errorlogs "$@" || status=$?

# One line any CI can read: subtests (TAP cases) counted over all suites.
python3 - "$build/meson-logs/testlog.json" <<'PY' || true
import json, re, sys
passed = failed = skipped = 0
for line in open(sys.argv[1]):
    t = json.loads(line)
    out = t.get("stdout") or ""
    ok = len(re.findall(r"^ok \d+.*$", out, re.M))
    sk = len(re.findall(r"^ok \d+ .*# SKIP", out, re.M))
    nok = len(re.findall(r"^not ok \d+", out, re.M))
    if t["result"] not in ("OK", "SKIP", "EXPECTEDFAIL") and nok == 0:
        nok = 1  # crashed or timed out before its cases said so
    passed += ok - sk
    skipped += sk
    failed += nok
print(f"tests: {passed} passed, {failed} failed, {skipped} skipped")
PY
exit $status
