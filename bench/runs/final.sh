#!/usr/bin/env bash
# Branch-only: the last check of the merge candidate (realigned many-rows FP8 rows, the norm
# backward's rows of 9-16 tiles in clusters of up to 16 for up to 64 rows) against main: GPU
# tests on the final PTX, then the A/B at the shapes the final rules changed. Bundle as in
# next.sh, into .carry/next/x.tar.xz.
set -u
here=$(pwd)
W=/tmp/finalw; mkdir -p "$W" "$OUT"
mkdir -p /tmp/bfinal && tar xJf "$here/.carry/next/x.tar.xz" -C /tmp/bfinal
B=$(dirname "$(find /tmp/bfinal -name run.sh | head -1)")
DEADLINE=${DEADLINE:-200}
STOP=${STOP:-240}
FP8_SH=16384x4500,4096x5623,4096x4097,4096x4095,4096x3841,4096x3001,16384x2500,16384x100,4096x8183
BWD_SH=1x65544,16x100003,64x100003,65x100003,128x100003,64x73728,256x65537,1024x131072
FP8="--ops gated_fp8 --modes per_call --warmup-ms 10 --rep-ms 40 --layouts split"
BWD="--ops add_rmsnorm --backward-only --modes per_call,graph --warmup-ms 10 --rep-ms 40"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$W/gpu.txt"
step() {
  local name=$1; shift
  if [ $SECONDS -gt "$DEADLINE" ]; then echo "$name skipped (deadline)" >> "$W/steps"; return; fi
  local s=$SECONDS
  timeout $((STOP - SECONDS)) bash -c '"$@"' _ "$@" > "$W/$name.log" 2>&1
  echo "$name rc=$? $((SECONDS - s)) s (at $SECONDS)" >> "$W/steps"
  tar czf "$OUT/final.tgz" -C /tmp finalw
}
gtest() { "$B/tests/"gpu_gated_fp8* --test-threads=1 fp8_per_token_short_rows fp8_realigned_kernels \
  fp8_split_offset_scalar_path fp8_per_token_long_rows; }
ntest() { FERROFUSE_TEST_QUICK=1 "$B/tests/"gpu_norm* --test-threads=1 --exact backward_long_rows_cluster_split_matches_loop_bitwise; }
fp8() { "$B/$1" $FP8 --shapes "$FP8_SH" --json "$W/fp8-$2.json"; }
bwd() { "$B/$1" $BWD --shapes "$BWD_SH" --json "$W/bwd-$2.json"; }
mem() { FERROFUSE_TEST_QUICK=1 compute-sanitizer --tool memcheck --error-exitcode 86 \
  "$B/tests/"gpu_gated_fp8* --test-threads=1 fp8_per_token_short_rows fp8_realigned_kernels; }
export W B FP8 BWD FP8_SH BWD_SH
export -f gtest ntest fp8 bwd mem
step gtest gtest
step ntest ntest
step fp8-main fp8 ferrofuse-bench-baseline main
step fp8-final fp8 ferrofuse-bench final
step bwd-main bwd ferrofuse-bench-baseline main
step bwd-final bwd ferrofuse-bench final
step memcheck mem
cat "$W/steps"
