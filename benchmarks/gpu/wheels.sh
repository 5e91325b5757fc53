#!/usr/bin/env bash
# Builds ./.whl (ignored, about 50 MB; a call carries 64 MiB with the repository): the service's
# runtime dependencies as cp312 wheels for a GPU machine whose image has only Python 3.12 with
# CUDA torch. Its torch, numpy and nvidia packages are used as they are, and so are those it has
# in versions that serve (tokenizers, safetensors, uvloop, tiktoken). The test clients are left
# out: the GPU checks (benchmarks/gpu/gpu_check.sh) run the engine's tests and benchmarks. Run from
# the repository root, with the project's .venv.
set -euo pipefail
SKIP="torch numpy matplotlib playwright mypy ruff uv py-spy sympy networkx mpmath pillow fonttools contourpy
kiwisolver cycler pyparsing types-requests types-urllib3 librt ast_serialize mypy_extensions greenlet llm-stream
accelerate hf-xet jcloud jina kubernetes-validate zstandard langsmith langchain-core langchain-openai
langchain-protocol pydantic-ai-slim genai-prices griffe griffecli griffelib openai tokenizers uvloop tiktoken safetensors"
PLAT="--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
--platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux_2_24_x86_64
--platform manylinux_2_31_x86_64 --platform manylinux_2_34_x86_64"
mkdir -p .whl
.venv/bin/pip freeze | grep -v '^#\|^-e' | while read -r req; do
  name=${req%%==*}
  [[ " ${SKIP//$'\n'/ } " == *" $name "* ]] && continue
  .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    $PLAT "$req" -d .whl
done
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: mypy_extensions==1.2.0 -d .whl
.venv/bin/python -m pip wheel -q --no-deps jcloud==0.3 -w .whl  # sdist only on the index; pure Python
# jina 3.34 ships cp311 wheels only, but is pure Python: the same wheel under a cp312 name
tmp=$(mktemp -d)
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: jina==3.34.0 -d "$tmp"
cp "$tmp"/jina-3.34.0-*.whl .whl/jina-3.34.0-cp312-cp312-manylinux_2_17_x86_64.whl
du -sh .whl
