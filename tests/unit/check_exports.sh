#!/bin/sh
# libzeroclient exports the zc_ API and nothing else (symbol map), and every
# function zeroclient.h declares is exported. Prints TAP.
lib=$1
header=$2
echo "1..2"
extra=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBRVW]$/ {print $3}' | grep -v '^zc_[a-z]' | grep -v '^LIBZEROCLIENT')
if [ -z "$extra" ]; then echo "ok 1 - only zc_ symbols exported"; else
    echo "not ok 1 - only zc_ symbols exported"; echo "$extra" | sed 's/^/# leaked: /'; fi
missing=""
for f in $(grep -oE '\bzc_[a-z_]+\(' "$header" | tr -d '(' | sort -u); do
    nm -D --defined-only "$lib" | grep -qw "$f" || missing="$missing $f"
done
if [ -z "$missing" ]; then echo "ok 2 - every declared function is exported"; else
    echo "not ok 2 - every declared function is exported # missing:$missing"; fi
