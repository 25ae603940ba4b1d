#!/usr/bin/env bash
# Plot iteration time against model size for zerod, torch and the fused C
# reference (and the bytes-moved floor) with gnuplot, from the table that
# perf_doc.py writes (columns: params_M zerod_ms torch_ms fused_ms floor_ms;
# "NaN" where a value is missing).
#
#   tools/bench/plot.sh SWEEP.dat OUT.png
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
dat=$1
png=$2

command -v gnuplot >/dev/null || "$top/tools/bench/bench-deps.sh"

gnuplot <<EOF
set terminal pngcairo size 900,560 font "sans,11"
set output "$png"
set title "one iteration, net of the trainers' work (2 ranks, Adam, 25 MB buckets)"
set xlabel "parameters (millions, fp32)"
set ylabel "milliseconds per iteration (median)"
set logscale xy
set grid xtics ytics mxtics mytics lc rgb "#dddddd"
set key top left
set datafile missing "NaN"
plot "$dat" using 1:3 with linespoints lw 2 pt 7 title "torch 1.13 DDP + ZeroRedundancyOptimizer (gloo)", \
     "$dat" using 1:2 with linespoints lw 2 pt 5 title "zerod", \
     "$dat" using 1:4 with linespoints lw 2 pt 9 title "fused C reference", \
     "$dat" using 1:5 with lines dt 2 lw 1 lc rgb "#888888" title "bytes-moved floor (triad)"
EOF
