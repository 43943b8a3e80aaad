# Two commands do all the set-up: `make demo` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.spanflow-installed

.PHONY: demo test install clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

# torch is pinned to the local CPU build only when no torch is importable,
# so a machine that already has a CUDA build keeps it.
$(STAMP): $(BIN)/python pyproject.toml
	@$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q "torch==2.13.0"
	$(BIN)/pip install -q -e ".[test,plot]"
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/spanflow demo --out demo_out

test: $(STAMP)
	$(BIN)/python -m pytest -q tests

clean:
	rm -rf $(VENV) demo_out
