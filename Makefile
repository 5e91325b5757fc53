# Quick start: `make serve` and `make test`. Both set up .venv when it is missing.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
DEFAULT_MODEL := models/tiny-gpt2
export LLM_MODEL ?= $(DEFAULT_MODEL)
export LLM_GRPC_PORT ?= 12345
export LLM_HTTP_PORT ?= 12346
export JINA_LOG_LEVEL ?= INFO
# torch's CPU wheel from a local folder when the machine has one (pip's find-links)
FIND_LINKS := $(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null)
UV_FLAGS := $(if $(FIND_LINKS),--find-links $(FIND_LINKS),)

.PHONY: setup serve test lint model bench bench-quick bench-engine clean

$(VENV)/.installed: requirements.txt constraints.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check uv==0.13.9
	$(VENV)/bin/uv pip install --python $(PY) $(UV_FLAGS) -r requirements.txt -c constraints.txt
	$(VENV)/bin/uv pip install --python $(PY) --no-deps -e .
	touch $@

setup: $(VENV)/.installed

$(DEFAULT_MODEL)/config.json: | $(VENV)/.installed
	$(PY) -m executors.engine.toy_models $(DEFAULT_MODEL) --style gpt2

model: $(DEFAULT_MODEL)/config.json

serve: setup $(if $(filter $(DEFAULT_MODEL),$(LLM_MODEL)),model)
	$(VENV)/bin/jina flow --uses flows/llm.yml

test: setup lint
	$(PY) -m pytest -q

lint: setup
	$(VENV)/bin/ruff check --select F,E9 --exclude .venv .

bench: setup
	$(PY) -m benchmarks $(BENCH_ARGS)

bench-quick: setup
	$(PY) -m benchmarks --quick

bench-engine: setup
	$(PY) -m benchmarks.engine_bench

clean:
	rm -rf $(VENV) models
