# One self-bootstrapping virtual environment; every target runs inside it.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TORCH := torch==2.13.0

.PHONY: all codegen check-codegen lint format test test-all demo bench clean test-torch-versions te-boundary te-conformance review

all: test

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check $(TORCH)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[codegen,test]'
	@touch $(STAMP)

$(VENV): $(STAMP)

codegen: $(STAMP)
	$(PY) -m codegen

check-codegen: $(STAMP)
	$(PY) -m codegen --check

# What this branch's bundle changes break, and for whom (docs/review.md): the working tree
# against its merge base with REVIEW_BASE. REVIEW_ARGS="--format markdown" writes a PR comment,
# REVIEW_ARGS="--fail-on breaking" exits 1 on a breaking change.
REVIEW_BASE ?= origin/main
REVIEW_ARGS ?=
review: $(STAMP)
	$(PY) -m codegen diff --merge-base $(REVIEW_BASE) $(REVIEW_ARGS)

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: $(STAMP)
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

# pytest's exit code 5 ("no tests ran") must fail, never pass silently. The tests run in
# parallel workers, one a core (pytest-xdist; PYTEST_WORKERS=0 runs them in this process):
# each worker compiles into its own Inductor cache (tests/conftest.py) and a distributed
# test picks free ports. The 25 slowest tests are listed at the end.
PYTEST_WORKERS ?= auto
test: check-codegen lint
	@$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist worksteal --durations=25; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "error: pytest collected no tests" >&2; exit 1; fi; exit $$rc

demo: $(STAMP)
	$(PY) -m codegen --check
	$(PY) demo/linear_demo.py
	$(PY) demo/gpt_demo.py
	$(PY) demo/moe_demo.py

# The CPU figures (boundary, import, codegen, compile, step, memory, op overhead, block,
# compile time versus depth)
# -> docs/benchmarks.md + docs/benchmarks/*.png, merging docs/benchmarks_h200.json when
# present (matplotlib comes with the test extra); the H200 part: python -m benchmarks --device cuda.
bench: $(STAMP)
	$(PY) -m benchmarks

# Transformer Engine 2.20.2's own source, read as it ships and never imported: fetch its
# pure-Python wheel into ~/.cache/teops (outside git; TEOPS_CACHE moves it), then write the
# boundary of its four bundles into examples/te_2_20/generated (see docs/te.md).
te-boundary: $(STAMP)
	$(PY) -m codegen.te_wheel
	$(PY) -m codegen --root examples/te_2_20

# Transformer Engine's own tests against this package: the chosen files of
# $(TE_SRC)/tests/pytorch (a TE checkout, read and never copied here) are copied into a
# temporary folder, their TE imports and device rewritten, the tests reaching a TE
# internal skipped, and the results written to docs/te_conformance.md (see there).
# TE_CONFORMANCE_ARGS adds options: --files, --device cuda, --sample K, --workers N,
# -k EXPR, --label NAME, --te-commit SHA (when TE_SRC is not a git work tree).
TE_SRC ?=
TE_CONFORMANCE_ARGS ?=
te-conformance: $(STAMP)
	@test -n "$(TE_SRC)" || { echo "error: make te-conformance TE_SRC=<a TE checkout>" >&2; exit 2; }
	$(PY) -m conformance --te-src "$(TE_SRC)" $(TE_CONFORMANCE_ARGS)

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .ruff_cache

# The op and module tests on other torch releases, each in its own venv under a cache
# dir outside git (created on first use; torch with its CUDA libraries is ~5 GB each).
# Not part of `make test`. TORCH_VERSIONS="2.11.0" make test-torch-versions runs one.
TORCH_VERSIONS ?= 2.11.0 2.14.1
TORCH_VENVS ?= $(HOME)/.cache/teops-venvs
test-torch-versions:
	@set -e; for v in $(TORCH_VERSIONS); do \
	  venv="$(TORCH_VENVS)/torch-$$v"; \
	  if ! $$venv/bin/python -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$$v')" 2>/dev/null; then \
	    $(PYTHON) -m venv $$venv && \
	    $$venv/bin/pip install -q "torch==$$v"; \
	  fi; \
	  $$venv/bin/pip install -q --disable-pip-version-check jinja2 libcst ruff==0.14.0 pytest hypothesis numpy; \
	  echo "== torch $$v =="; \
	  PYTHONPATH=. $$venv/bin/python -m pytest tests/ops tests/modules -q -p no:cacheprovider; \
	done
