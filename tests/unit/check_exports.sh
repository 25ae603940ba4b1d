#!/bin/sh
# libzeroclient exports the zc_ API and nothing else; every function
# zeroclient.h declares is exported; the symbol map names exactly those
# functions (no glob, nothing stale); the soname's major is the header's
# ZC_VERSION_MAJOR. Prints TAP.
lib=$1
header=$2
map=$(dirname "$header")/../libzeroclient.map
echo "1..4"
extra=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBRVW]$/ {print $3}' | grep -v '^zc_[a-z]' | grep -v '^LIBZEROCLIENT')
if [ -z "$extra" ]; then echo "ok 1 - only zc_ symbols exported"; else
    echo "not ok 1 - only zc_ symbols exported"; echo "$extra" | sed 's/^/# leaked: /'; fi
# declarations: a line that starts with a type and names zc_...( (not a typedef)
declared=$(grep -E '^[a-z]' "$header" | grep -v '^typedef' | grep -oE '\bzc_[a-z0-9_]+\(' | tr -d '(' | sort -u)
missing=""
for f in $declared; do
    nm -D --defined-only "$lib" | grep -qw "$f" || missing="$missing $f"
done
if [ -z "$missing" ]; then echo "ok 2 - every declared function is exported"; else
    echo "not ok 2 - every declared function is exported # missing:$missing"; fi
listed=$(grep -oE '^[[:space:]]+zc_[a-z0-9_]+;' "$map" | tr -d ' \t;' | sort -u)
if grep -qE '^[[:space:]]*zc_[a-z0-9_]*\*' "$map"; then
    echo "not ok 3 - the map lists the header's functions by name # it has a glob"
elif [ "$listed" = "$declared" ]; then
    echo "ok 3 - the map lists the header's functions by name"
else
    echo "not ok 3 - the map lists the header's functions by name"
    echo "$listed" > "${TMPDIR:-/tmp}/zc-map.$$"
    echo "$declared" | diff "${TMPDIR:-/tmp}/zc-map.$$" - | sed 's/^/# /'
    rm -f "${TMPDIR:-/tmp}/zc-map.$$"
fi
major=$(sed -n 's/^#define ZC_VERSION_MAJOR[[:space:]]*\([0-9]*\).*/\1/p' "$header")
soname=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
if [ -n "$major" ] && [ "$soname" = "libzeroclient.so.$major" ]; then
    echo "ok 4 - soname $soname has the header's major $major"; else
    echo "not ok 4 - soname '$soname' is not libzeroclient.so.$major (ZC_VERSION_MAJOR)"; fi
