# gshare — two commands: `make demo` and `make test`.
# Both create .venv on a fresh clone (pinned deps, torch==2.13.0 CPU build, every extra: Ray
# too, for the multi-node tests) and then run.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The CPU build of torch lies in /opt/wheels on our machines; pip also reads it from pip.conf.
FIND_LINKS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels,)
PYTEST_ARGS ?=
# `make unit` runs the tests on PYTEST_WORKERS processes (pytest-xdist; a module's tests stay on
# one), then those marked `serial` (they measure shares or timings) alone, after them.
PYTEST_WORKERS ?= 2

.PHONY: test demo lint typecheck unit venv clean browser native gpu-bundle gpu-check

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(FIND_LINKS) "torch==2.13.0"
	$(BIN)/python -m pip install -q $(FIND_LINKS) -e ".[torch,dev,cluster]"
	@touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check src tests bench tools
	$(BIN)/ruff format --check src tests bench tools

typecheck: $(STAMP)
	$(BIN)/mypy src/gshare

# The status page's test drives Debian's Chromium (and its chromedriver) with Selenium.
browser:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing chromium and chromium-driver (Debian) for the browser test"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    --no-install-recommends chromium chromium-driver >/dev/null; \
	else echo "chromium/chromedriver missing and cannot install them (not root): the browser test is skipped"; fi

# The GPU frontend's CUDA driver-API interposer (native/): one line; skipped, not failed, without
# a C compiler or the CUDA toolkit's cuda.h (its tests, tests/native, then skip too).
native:
	@$(MAKE) -s --no-print-directory -C native

unit: $(STAMP) browser native
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile -m "not serial" $(PYTEST_ARGS) \
	  || [ $$? = 5 ]  # 5: PYTEST_ARGS chose none of these
	$(BIN)/python -m pytest -m serial $(PYTEST_ARGS) || [ $$? = 5 ]

test: lint typecheck unit

demo: $(STAMP)
	$(BIN)/python -m gshare.demo --duration-s 30
	$(BIN)/gshare experiment run fast-spatial --quick --out demo-results
	$(BIN)/gshare experiment run fast-packing --quick --out demo-results
	$(BIN)/gshare experiment run fast-autoscale --quick --out demo-results

# The GPU kit (docs/gpu/README.md). gpu-bundle, here (PyPI): the wheels the GPU machine lacks, into
# .gpu-bundle/. gpu-check, on the GPU machine with its own python3 and PyTorch (no venv, no
# network): every part under one deadline; GPU_ARGS passes options (--out DIR --parts a,c
# --budget-s 520 --dry-run).
GPU_ARGS ?=
gpu-bundle: $(STAMP)
	PYTHONPATH=src $(BIN)/python -m gshare.gpukit.bundle --dest .gpu-bundle

gpu-check:
	PYTHONPATH=src $(PYTHON) -m gshare.gpukit $(GPU_ARGS)

clean:
	rm -rf $(VENV) demo-results .pytest_cache .mypy_cache .ruff_cache .gpu-kit gpu-results
