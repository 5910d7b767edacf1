#!/usr/bin/env bash
# Branch-only: the one device call that measures this branch (exp/next-run: the gated FP8 row
# pairs and realigned many-rows kernels, the norm backward's rows of 9-16 tiles in clusters of
# 16) against main. Bundle first, here:
#   cargo xtask gpu-bundle --only-tests gpu_gated_fp8,gpu_norm --baseline main \
#     --out <tmp>/gpu-bundle --archive .carry/next/x.tar.xz
# then on the device, with .carry/next carried: bash bench/runs/next.sh
# Steps in order of need, each skipped past DEADLINE seconds; every file lands in $OUT/next as
# it is written (a call cut off still returns what it has).
set -u
here=$(pwd)
W=/tmp/nextw; mkdir -p "$W" "$OUT"  # packed into $OUT/next.tgz after each step (8 files come back)
mkdir -p /tmp/bnext && tar xJf "$here/.carry/next/x.tar.xz" -C /tmp/bnext
B=$(dirname "$(find /tmp/bnext -name run.sh | head -1)")
DEADLINE=${DEADLINE:-370}
STOP=${STOP:-465}
ROWS_SH=16384x896,1024x1792,4096x1792,16384x1792,4096x4096,16384x4096,16384x2048
REAL_SH=1024x3001,16384x2500,4096x4095,16384x4095,4096x1001,16384x1001,300x3001,1024x8183,16384x100,4096x5623,4096x5625,4096x6137,4096x7001,16384x4500,4096x8183
BWD_SH=1x65544,1x131072,16x100003,16x131072,64x100003,64x73728,128x100003,129x100003,256x65537,256x73728,512x131072,1024x131072,2048x65537,2048x73728
FP8="--ops gated_fp8 --modes per_call --warmup-ms 10 --rep-ms 40"
BWD="--ops add_rmsnorm --backward-only --modes per_call,graph --warmup-ms 10 --rep-ms 40"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$W/gpu.txt"
step() {
  local name=$1; shift
  if [ $SECONDS -gt "$DEADLINE" ]; then echo "$name skipped (deadline)" >> "$W/steps"; return; fi
  local s=$SECONDS
  timeout $((STOP - SECONDS)) bash -c '"$@"' _ "$@" > "$W/$name.log" 2>&1
  echo "$name rc=$? $((SECONDS - s)) s (at $SECONDS)" >> "$W/steps"
  tar czf "$OUT/next.tgz" -C /tmp nextw
}
fp8() { # exe tag [switches]
  local exe=$1 tag=$2; shift 2
  "$B/$exe" $FP8 --layouts split --shapes "$ROWS_SH,$REAL_SH" --json "$W/fp8-$tag.json" "$@"
}
bwd() { # exe tag [switches]
  local exe=$1 tag=$2; shift 2
  "$B/$exe" $BWD --shapes "$BWD_SH" --json "$W/bwd-$tag.json" "$@"
}
gtest() { "$B/tests/"gpu_gated_fp8* --test-threads=1 fp8_per_token_short_rows fp8_realigned_kernels; }
ntest() { "$B/tests/"gpu_norm* --test-threads=1 --exact backward_long_rows_cluster_split_matches_loop_bitwise; }
ntest_quick() { FERROFUSE_TEST_QUICK=1 ntest; }
san() { # tool [extra]
  local tool=$1; shift
  FERROFUSE_TEST_QUICK=1 compute-sanitizer --tool "$tool" --error-exitcode 86 "$@" \
    "$B/tests/"gpu_gated_fp8* --test-threads=1 fp8_per_token_short_rows fp8_realigned_kernels
  FERROFUSE_TEST_QUICK=1 compute-sanitizer --tool "$tool" --error-exitcode 86 "$@" \
    "$B/tests/"gpu_norm* --test-threads=1 --exact backward_long_rows_cluster_split_matches_loop_bitwise
}
peers() {
  "$B/ferrofuse-bench" $FP8 --layouts split --shapes "$ROWS_SH,$REAL_SH" --plan-out "$W/plan-fp8.json" --list > /dev/null
  "$B/ferrofuse-bench" $BWD --shapes "$BWD_SH" --plan-out "$W/plan-bwd.json" --list > /dev/null
  python3 - "$W/plan-fp8.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
p["configs"] = [c for c in p["configs"] if c.get("scaling") == "per_token"]
json.dump(p, open(sys.argv[1], "w"))
PY
  python3 "$B/peers.py" --plan "$W/plan-bwd.json" --json "$W/peers-bwd.json"
  python3 "$B/peers.py" --plan "$W/plan-fp8.json" --json "$W/peers-fp8.json"
}
export W B FP8 BWD ROWS_SH REAL_SH BWD_SH
export -f fp8 bwd gtest ntest ntest_quick san peers
step fp8-main-1 fp8 ferrofuse-bench-baseline main-1
step fp8-new-1 fp8 ferrofuse-bench new-1
step fp8-nopairs-1 fp8 ferrofuse-bench nopairs-1 --no-row-pairs
step bwd-main-1 bwd ferrofuse-bench-baseline main-1
step bwd-new-1 bwd ferrofuse-bench new-1
step bwd-nowide-1 bwd ferrofuse-bench nowide-1 --no-wide-clusters
step gtest gtest
step ntest-quick ntest_quick
step fp8-main-2 fp8 ferrofuse-bench-baseline main-2
step fp8-new-2 fp8 ferrofuse-bench new-2
step bwd-main-2 bwd ferrofuse-bench-baseline main-2
step bwd-new-2 bwd ferrofuse-bench new-2
step memcheck san memcheck
step racecheck san racecheck --racecheck-memcpy-async no
step ntest ntest
step bwd-sm80-main bwd ferrofuse-bench-baseline sm80-main --module sm_80
step bwd-sm80-new bwd ferrofuse-bench sm80-new --module sm_80
step fp8-nopairs-2 fp8 ferrofuse-bench nopairs-2 --no-row-pairs
step bwd-nowide-2 bwd ferrofuse-bench nowide-2 --no-wide-clusters
cat "$W/steps"
