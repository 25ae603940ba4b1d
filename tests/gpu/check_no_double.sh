#!/bin/sh
# check_no_double.sh ZEROD — the CUDA test double (tests/gpu/cudadouble.c)
# stands in for the CUDA runtime and NCCL in tests only: zerod must carry the
# real ones, never the double. TAP.
set -eu
echo "1..2"
if nm "$1" | grep -q 'cudadouble_'; then
	echo "not ok 1 - zerod contains the test double's symbols"
else
	echo "ok 1 - no test double in zerod"
fi
if nm -D --undefined-only "$1" | grep -q ' ncclCommInitRankConfig'; then
	echo "ok 2 - zerod calls the real NCCL (libnccl)"
else
	echo "not ok 2 - zerod does not import ncclCommInitRankConfig from libnccl"
fi
