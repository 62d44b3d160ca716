# Everything installs into a local virtual environment (.venv) with the pins of
# constraints.txt, so a CPU machine takes the CPU build of torch.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_ARGS ?=

.PHONY: install demo test test-slow bench docs clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test,docs]'
	# SecretFlow's spu for the rr22 PSI (docs/alignment.md): --no-deps, because its metadata asks for jax and
	# numpy<2, which the two extension modules vfltorch loads (spu/libpsi.so, spu/libspu.so) do not need.
	# No wheel for this platform or Python (>= 3.12): --psi falls back to ecdh.
	$(PY) -m pip install --quiet --no-deps -c constraints.txt spu==0.9.5 || \
		echo "spu 0.9.5 not installed: --party-files alignment falls back to ECDH-PSI (slower)"
	touch $(STAMP)

install: $(STAMP)

# The main job on the bundled default dataset: FDSKL, breast_cancer, 3 parties.
demo: $(STAMP)
	$(VENV)/bin/vfl fdskl --dataset breast_cancer --parties 3 $(DEMO_ARGS)

test: $(STAMP)
	$(PY) -m pytest

test-slow: $(STAMP)
	$(PY) -m pytest -m slow

# The user guide and API reference (mkdocs.yml) into site/, warnings as errors; tests/test_docs.py runs the same build.
docs: $(STAMP)
	$(PY) -m mkdocs build --strict --quiet

bench: $(STAMP)
	$(PY) -m benchmarks.comm_topologies

clean:
	rm -rf $(VENV) build site *.egg-info .pytest_cache
