#!/usr/bin/env bash
# The checks for a lent GPU machine, from the repository root, in one call: the engine's tests on
# CUDA (make test-gpu), decode steps from CUDA graphs against eager ones (python -m
# benchmarks cuda-graphs), and the served benchmark. Each part under its own time limit; output
# under $OUT. The machine's image has CUDA torch for Python 3.12: the service's other packages
# travel as cp312 wheels in ./.whl (benchmarks/gpu/wheels.sh makes them).
set -uo pipefail
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
. benchmarks/gpu/setup.sh
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c 'import sys, torch, transformers; print(sys.version.split()[0], torch.__version__, transformers.__version__)'
  date -u; } | tee "$OUT/gpu.txt"  # no commit: the machine's copy may carry older git metadata
part() {  # part NAME SECONDS COMMAND...: one part's output to $OUT/NAME.txt, its end to the terminal
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
  echo "== $name: exit $? in $((SECONDS - t0)) s"; tail -n "${TAIL:-14}" "$OUT/$name.txt"
}
tests=$(awk '/^GPU_TESTS :=/{f=1} f{print} f&&!/\\$/{exit}' Makefile | sed 's/^GPU_TESTS :=//; s/\\//g')
part tests "${TESTS_S:-200}" python3 -m pytest -q -p no:cacheprovider -rfE --tb=short $tests  # make test-gpu's
part ab "${AB_S:-260}" python3 -m benchmarks cuda-graphs --arms eager,graphs,graphs-no-spec --out "$OUT/ab"
part served "$(( ${DEADLINE_S:-540} - SECONDS > 30 ? ${DEADLINE_S:-540} - SECONDS : 30 ))" \
  python3 -m benchmarks --models gpt2-small,llama-1b --systems raw-engine,this --concurrency 1,16,64 \
  --num-requests 32 --time-limit 6 --out "$OUT/served"
# what comes back from a lent machine is at most 8 files: the servers' logs as one, no chart
[ -d "$OUT/served/logs" ] && tar czf "$OUT/served-logs.tgz" -C "$OUT/served" logs && rm -rf "$OUT/served/logs"
rm -f "$OUT/served/results.png"
