#!/usr/bin/env bash
# On the GPU machine, from the repository root (the wheels as benchmarks/gpu_check.sh takes them):
# the matmul probe, then four engine test files three ways: eager steps (-p eager), CUDA graphs as
# the engine captures them, and graphs always at their largest shape (-p fixed).
R=docs/benchmarks/2026-11-gpu-graphs/repro
. docs/benchmarks/2026-11-gpu/cudnn/repro/setup.sh
export PYTHONPATH=$PYTHONPATH:$PWD/$R
T="tests/unit/test_batching.py tests/unit/test_engine.py tests/unit/test_logprobs.py tests/unit/test_speculation.py"
timeout 60 python3 $R/matmul_probe.py > "$OUT/probe.txt" 2>&1; cut -c1-160 "$OUT/probe.txt"
for arm in eager graphs fixed; do
  p=""; [ $arm != graphs ] && p="-p $arm"
  timeout 75 python3 -m pytest -q -p no:cacheprovider $p -rf --tb=line $T > "$OUT/$arm.txt" 2>&1
  echo "== $arm"; grep "^FAILED\|passed\|failed" "$OUT/$arm.txt" | cut -c1-150
done
