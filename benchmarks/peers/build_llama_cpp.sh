#!/usr/bin/env bash
# make llama-cpp: llama.cpp's server and llama-quantize, built once from the llama.cpp that
# llama-cpp-python 0.3.36 vendors (a pinned source from PyPI, sha256-checked), into
# benchmarks/.llama.cpp/, with its shared libraries where that package's Python bindings look for
# them (src/llama_cpp/lib). About 10 minutes on 2 cores. `python -m benchmarks` uses the server as
# the `llama-cpp` system, llama-quantize to make its Q4_0 GGUF, and `python -m benchmarks quality`
# the bindings to read llama.cpp's logits. With --source, it only unpacks the source (its converter,
# convert_hf_to_gguf.py, makes the sized models' GGUF files: benchmarks/harness/sized_models.py).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=benchmarks/.llama.cpp
SDIST=llama_cpp_python-0.3.36.tar.gz
SHA256=${LLAMA_CPP_SHA256:-832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e}
# what the bindings (diskcache) and the converter (sentencepiece) import and .venv lacks, beside them
# rather than in the pinned .venv
[ -d "$OUT/deps/diskcache" ] && [ -d "$OUT/deps/sentencepiece" ] || .venv/bin/python -m pip install -q \
  --disable-pip-version-check --no-deps --target "$OUT/deps" diskcache==5.6.3 sentencepiece==0.2.1
[ "${1:-}" != "--source" ] && [ -x "$OUT/llama-server" ] && [ -x "$OUT/llama-quantize" ] \
  && [ -d "$OUT/src/llama_cpp/lib" ] && { echo "$OUT/llama-server and llama-quantize are built"; exit 0; }
if [ ! -f "$OUT/src/vendor/llama.cpp/convert_hf_to_gguf.py" ]; then
  mkdir -p "$OUT/src"
  .venv/bin/python -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
    llama-cpp-python==0.3.36 -d "$OUT"
  if [ -n "$SHA256" ]; then echo "$SHA256  $OUT/$SDIST" | sha256sum -c -; fi
  tar -xzf "$OUT/$SDIST" -C "$OUT/src" --strip-components=1
fi
[ "${1:-}" = "--source" ] && { echo "the pinned source is in $OUT/src/vendor/llama.cpp"; exit 0; }
cmake -S "$OUT/src/vendor/llama.cpp" -B "$OUT/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
  -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON >/dev/null
cmake --build "$OUT/build" --target llama-server llama-quantize -j "$(nproc)" >/dev/null
cp "$OUT/build/bin/llama-server" "$OUT/build/bin/llama-quantize" "$OUT/"
find "$OUT/build" -name '*.so*' -exec cp -P {} "$OUT/" \;
mkdir -p "$OUT/src/llama_cpp/lib"
find "$OUT/build" -name '*.so*' -exec cp -P {} "$OUT/src/llama_cpp/lib/" \;
echo "built $OUT/llama-server and $OUT/llama-quantize"
