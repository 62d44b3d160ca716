# Everything installs into a local virtual environment (.venv) with the pins of
# constraints.txt, so a CPU machine takes the CPU build of torch.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_ARGS ?=

.PHONY: install demo test test-slow bench clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# The main job on the bundled default dataset: FDSKL, breast_cancer, 3 parties.
demo: $(STAMP)
	$(VENV)/bin/vfl fdskl --dataset breast_cancer --parties 3 $(DEMO_ARGS)

test: $(STAMP)
	$(PY) -m pytest

test-slow: $(STAMP)
	$(PY) -m pytest -m slow

bench: $(STAMP)
	$(PY) -m benchmarks.comm_topologies

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
