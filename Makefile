# Two commands for a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
ARGS ?=

.PHONY: run test lint bench tools image clean

# setup.py and native/: the compiled per-token path (llmsim._speedups), built in place.
$(VENV)/.installed: pyproject.toml setup.py $(wildcard native/*.c native/*.h)
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed pyproject.toml
	$(PIP) install -q -e '.[test]'
	touch $@

$(VENV)/.installed-lint: $(VENV)/.installed pyproject.toml
	$(PIP) install -q -e '.[test,lint]'
	touch $@

$(VENV)/.installed-bench: $(VENV)/.installed-test pyproject.toml
	$(PIP) install -q -e '.[test,bench]'
	touch $@

# Command-line HTTP clients the real-client tests use (curl with HTTP/2, h2load, wrk).
# Best effort: tests that need a missing tool skip themselves.
tools:
	@if ! command -v h2load >/dev/null 2>&1 || ! command -v wrk >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq curl nghttp2-client wrk) >/dev/null 2>&1 \
	      || echo "note: could not install curl/nghttp2-client/wrk; tests that need them will skip"; \
	  else echo "note: h2load/wrk not installed; tests that need them will skip"; fi; \
	fi

run: $(VENV)/.installed
	$(VENV)/bin/llmsim serve $(ARGS)

# The per-token path has compiled twins (llmsim/speedups.py), on by default: the tests
# that drive that path run once more on the pure-Python path (LLMSIM_PURE=1).
PURE_TESTS := tests/engine tests/api/test_seeded_golden.py tests/api/chat/test_stream.py tests/api/test_generation.py \
	tests/protocol/native/test_http2.py tests/protocol/native/test_http1_token_write.py \
	tests/protocol/native/test_fastpath_handlers.py

# Bytecode is written even where the environment says not to (PYTHONDONTWRITEBYTECODE):
# without it every run, and every server subprocess the tests start, compiles everything
# again (about 15 s of the suite here).
test: $(VENV)/.installed-test tools
	PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -q $(ARGS)
	$(if $(ARGS),,PYTHONDONTWRITEBYTECODE= LLMSIM_PURE=1 $(PY) -m pytest -q -p no:cacheprovider $(PURE_TESTS))

# ruff (rules in pyproject.toml), formatting, mypy --strict on llmsim/, and the import
# contracts between the layers (lint-imports reads [tool.importlinter] in pyproject.toml).
lint: $(VENV)/.installed-lint
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

bench: $(VENV)/.installed-bench tools
	$(PY) -m benchmarks $(ARGS)

# The container image (Dockerfile, docs/scaling.md); needs a Docker daemon.
image:
	docker build -t llmsim:dev .

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache llmsim/_speedups.*.so
