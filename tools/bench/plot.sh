#!/usr/bin/env bash
# Plot iteration time against model size from the table perf_doc.py writes
# (sweep.dat: per size the median and the rounds' min and max of the C
# trainers' comparable figure, DDP + ZeroRedundancyOptimizer and DDP +
# ZerodOptimizer, then the fused reference's and the floor's medians; "NaN"
# where a value is missing), with gnuplot: medians with min–max error bars.
#
#   tools/bench/plot.sh SWEEP.dat OUT.png
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
dat=$1
png=$2

command -v gnuplot >/dev/null || "$top/tools/bench/bench-deps.sh"

gnuplot <<GP
set terminal pngcairo size 900,560 font "sans,11"
set output "$png"
set title "one iteration, net of backward / the gradient fill (2 ranks, Adam, 25 MB buckets)"
set xlabel "parameters (millions, fp32)"
set ylabel "milliseconds per iteration (median, bars: min-max over rounds)"
set logscale xy
set grid xtics ytics mxtics mytics lc rgb "#dddddd"
set key top left
set datafile missing "NaN"
plot "$dat" using 1:5:6:7 with yerrorlines lw 2 pt 7 title "torch 1.13 DDP + ZeroRedundancyOptimizer (gloo)", \
     "$dat" using 1:8:9:10 with yerrorlines lw 2 pt 13 title "DDP + ZerodOptimizer", \
     "$dat" using 1:2:3:4 with yerrorlines lw 2 pt 5 title "zerod C trainers (comparable)", \
     "$dat" using 1:11 with linespoints lw 1 pt 9 title "fused C reference", \
     "$dat" using 1:12 with lines dt 2 lw 1 lc rgb "#888888" title "bytes-moved floor"
GP
