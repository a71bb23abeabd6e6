# `make run` and `make test` work on a fresh machine: each creates .venv and installs what it needs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU build of torch on this machine's disk; an unpinned torch would download a CUDA build.
TORCH := torch==2.13.0

.PHONY: run test lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml setup.py
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.installed-dev: $(BIN)/python pyproject.toml setup.py
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -e ".[engine,dashboard,serve,bench,dev]"
	touch $@ $(VENV)/.installed

run: $(VENV)/.installed
	$(BIN)/kvlab sim

# mypy and import-linter find modules by name, and the editable install's folder mapping
# (policies/ is kvlab.policies) hides them from them: they check a plain install of the package in
# build/typecheck, mypy keeping its cache in .mypy_cache (a first run takes a minute or two, later
# ones seconds); import-linter checks the layer contracts of pyproject.toml.
lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	rm -rf build/lib build/typecheck
	$(BIN)/pip install --quiet --no-deps --no-build-isolation --target build/typecheck .
	cd build/typecheck && ../../$(BIN)/mypy --cache-dir ../../.mypy_cache -p kvlab
	cd build/typecheck && ../../$(BIN)/lint-imports ../../pyproject.toml

test: lint
	$(BIN)/python -m pytest -q

bench: $(VENV)/.installed-dev
	$(BIN)/python benchmarks/policies_bench.py
	$(BIN)/python benchmarks/sim_bench.py

clean:
	rm -rf $(VENV) build *.egg-info
