# Two commands do all the set-up: `make demo` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.spanflow-installed

.PHONY: demo test install clean

# A python whose own site-packages hold torch (a CUDA build, say) lends it to the venv, which
# then sees that python's packages too; otherwise the venv is isolated.
$(BIN)/python:
	@if $(PY) -c "import torch" 2>/dev/null; then $(PY) -m venv --system-site-packages $(VENV); \
	else $(PY) -m venv $(VENV); fi

# torch is pinned only when no torch is importable, so a machine that already has a
# CUDA build keeps it. TORCH_PIP_ARGS picks the build, e.g. PyTorch's CPU index.
TORCH_PIP_ARGS ?=
$(STAMP): $(BIN)/python pyproject.toml
	@$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q $(TORCH_PIP_ARGS) "torch==2.13.0"
	$(BIN)/pip install -q -e ".[test,plot]"
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/spanflow demo --out demo_out

test: $(STAMP)
	$(BIN)/python -m pytest -q tests

clean:
	rm -rf $(VENV) demo_out
