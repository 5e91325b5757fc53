#!/usr/bin/env bash
# On the GPU machine: test files (default: the engine-level ones) on CUDA; the engine picks
# cuda + bf16 by itself there. Files that need the trained model or the openai package are left
# out of the carried wheels. Writes $OUT/gpu.txt and $OUT/tests.txt. Run from the repository root.
set -uo pipefail
. docs/benchmarks/2026-11-gpu/cudnn/repro/setup.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
python3 -c 'import torch, transformers, sys; print(sys.version, torch.__version__, transformers.__version__)' | tee -a "$OUT/gpu.txt"
files=("$@")
[ ${#files[@]} -gt 0 ] || files=(tests/test_engine.py tests/test_batching.py tests/test_engine_process.py
                                 tests/test_sampling_options.py)
timeout "${TESTS_S:-420}" python3 -m pytest -q -p no:cacheprovider --timeout 120 -rfE --tb=short \
  --show-capture=no "${files[@]}" > "$OUT/tests.txt" 2>&1
tail -40 "$OUT/tests.txt"
