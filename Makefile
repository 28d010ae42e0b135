# Two entry points: `make demo` (the main job) and `make test` (the CPU suite).
# Both create .venv inside the checkout on first use and install what they need.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# The CPU build of torch is taken from the local package store; a machine with GPUs takes the CUDA build.
TORCH_SPEC ?= torch==2.13.0
TRITON_SPEC ?= triton==3.6.0
CONFIG ?= configs/cpu-demo.toml

.PHONY: demo test test-gpu bench env clean

# What the demo needs: torch, triton and graphshard itself (the first run's install stays short).
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)" "$(TRITON_SPEC)"
	$(PY) -m pip install -q -e .
	touch $@

# The tests and the sweep add pytest, hypothesis and matplotlib.
$(VENV)/.installed-test: $(VENV)/.installed
	$(PY) -m pip install -q -e ".[test,plot]"
	touch $@

env: $(VENV)/.installed-test

# The quick first run; a longer one: `make demo STEPS=100` or `make demo CONFIG=configs/cpu-demo-long.toml`.
TP ?=
STEPS ?=
demo: $(VENV)/.installed
	$(PY) -m graphshard demo --config $(CONFIG) $(if $(TP),--tp $(TP)) $(if $(STEPS),--steps $(STEPS))

# The CPU suite runs its kernels under the Triton interpreter, in JOBS worker processes
# (pytest-xdist; JOBS=0 runs in one process); tests/gpu needs compiled kernels.
JOBS ?= 2
test: env
	TRITON_INTERPRET=1 $(PY) -m pytest -q -n $(JOBS) tests --ignore=tests/gpu

test-gpu: env
	$(PY) -m pytest -q tests/gpu

bench: env
	$(PY) -m graphshard bench --config $(CONFIG)

clean:
	rm -rf $(VENV)
