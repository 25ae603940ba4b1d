#!/usr/bin/env bash
# bench-gpu-double: zerod-bench --gpu built on the CUDA test double
# (zerod-bench-double, two double devices, zerod-double as the daemon): the
# rows that need a device must run, each with every number, the busbw
# through zerod (one --gpu-trainer process per device) among them; the CUDA
# DDP row needs a torch with CUDA and says why it did not run. The double's
# numbers mean nothing; what is checked is that the measuring code runs.
#
#   check_bench_double.sh PATH/TO/zerod-bench-double PATH/TO/check_gpu_json.py
set -uo pipefail
bench=$1 check=$2
out=$(mktemp)
err=$(mktemp)
trap 'rm -f "$out" "$err"' EXIT

echo "1..3"
if "$bench" --gpu --params 1M --iters 3 --warmup 1 --handoff-iters 30 --json >"$out" 2>"$err"; then
    echo "ok 1 - zerod-bench-double --gpu ran"
else
    echo "not ok 1 - zerod-bench-double --gpu failed"
    sed 's/^/# /' "$err"
fi
if python3 "$check" "$out" \
    --ran nccl_busbw:nccl_direct_ms,nccl_direct_busbw,zerod_ms,zerod_busbw,zerod_vs_nccl \
    --ran adam_gbps:adam_iter_ms,adam_gbps,d2d_gbps,adam_vs_d2d \
    --ran handoff_cuda:handoff_cuda_p50_us,handoff_cuda_p99_us; then
    echo "ok 2 - the NCCL, Adam and handoff rows ran on two double devices, every number in them"
else
    echo "not ok 2 - the GPU rows on the double"
    sed 's/^/# /' "$out" "$err"
fi
# the double says where the code broke CUDA's or NCCL's rules (in this
# process and in the trainers it started, whose stderr is this one's)
if grep -q "cudadouble: violation" "$err"; then
    echo "not ok 3 - the double saw CUDA or NCCL misused"
    grep "cudadouble: violation" "$err" | sed 's/^/# /'
else
    echo "ok 3 - no CUDA or NCCL rule broken"
fi
