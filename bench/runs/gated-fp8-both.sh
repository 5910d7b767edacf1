#!/usr/bin/env bash
# Branch-only: the device call that measures this branch. Bundle first:
#   cargo xtask gpu-bundle --only-tests gpu_gated_fp8 --baseline main \
#     --out <tmp>/gpu-bundle --archive .carry/r21/x.tar.xz
# then run `bash bench/runs/gated-fp8-both.sh` on the device with .carry/r21 carried.
# One device call: main against the build (row pairs + realigned many-rows FP8 kernels) on
# per-token shapes, the build without row pairs, the GPU tests of both paths, sanitizers, peers.
# Everything lands in $OUT/r21 as it is written (a cut-off call still returns it).
set -u
here=$(pwd)
W=$OUT/r21; mkdir -p $W
mkdir -p /tmp/b21 && tar xJf "$here/.carry/r21/x.tar.xz" -C /tmp/b21
B=$(dirname "$(find /tmp/b21 -name run.sh | head -1)")
export PATH="$PATH:/usr/local/cuda/bin"
DEADLINE=${DEADLINE:-470}
STOP=${STOP:-575}
ROWS_SH=16384x896,1024x1792,4096x1792,16384x1792,4096x4096,16384x4096,16384x2048
REAL_SH=1024x3001,16384x2500,4096x4095,16384x4095,4096x1001,16384x1001,300x3001,1024x8183,16384x100,200x3001
COMMON="--ops gated_fp8 --modes per_call --warmup-ms 10 --rep-ms 40"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $W/gpu.txt
step() {
  local name=$1; shift
  if [ $SECONDS -gt $DEADLINE ]; then echo "$name skipped (deadline)" >> $W/steps; return; fi
  local s=$SECONDS
  timeout $((STOP - SECONDS)) "$@" > $W/$name.log 2>&1
  echo "$name rc=$? $((SECONDS - s)) s (at $SECONDS)" >> $W/steps
}
bench() { # exe tag [extra]
  local exe=$1 tag=$2; shift 2
  "$B/$exe" $COMMON --layouts split --shapes "$ROWS_SH,$REAL_SH" --json $W/$tag.json "$@" &&
  "$B/$exe" $COMMON --layouts interleaved --shapes 1024x3001,16384x2500,16384x1001 --json $W/$tag-il.json "$@"
}
tests() {
  "$B/tests/"gpu_gated_fp8* --test-threads=1 fp8_per_token_short_rows fp8_realigned_kernels
}
san() { # tool
  FERROFUSE_TEST_QUICK=1 compute-sanitizer --tool $1 --error-exitcode 86 "$B/tests/"gpu_gated_fp8* \
    --test-threads=1 fp8_per_token_short_rows fp8_realigned_kernels
}
peers() {
  "$B/ferrofuse-bench" $COMMON --layouts split --shapes "$ROWS_SH,$REAL_SH" --plan-out $W/plan.json --list > /dev/null
  python3 - $W/plan.json <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
p["configs"] = [c for c in p["configs"] if c["scaling"] == "per_token"]
json.dump(p, open(sys.argv[1], "w"))
PY
  python3 "$B/peers.py" --plan $W/plan.json --json $W/peers.json
}
step main-1 bench ferrofuse-bench-baseline main-1
step new-1 bench ferrofuse-bench new-1
step off-1 bench ferrofuse-bench off-1 --no-row-pairs
step tests tests
step main-2 bench ferrofuse-bench-baseline main-2
step new-2 bench ferrofuse-bench new-2
step memcheck san memcheck
step racecheck san racecheck
step peers peers
step off-2 bench ferrofuse-bench off-2 --no-row-pairs
cat $W/steps
