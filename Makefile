# Two commands on a fresh machine with only python3 and make:
#   make demo   set everything up and run the demo
#   make test   set everything up and run ruff, mypy, lint-imports, pytest (and the docs build)
# While editing:
#   make check  the edit loop: lint, types, import layers and the fast tests, under three
#               minutes (pytest -m "not slow"; the slow tests start processes, build wheels)
#   make wheels one wheel per distribution into dist/, to install elsewhere (docs/install.md)
PYTHON ?= python3
UV_VERSION ?= 0.13.8
export UV_PYTHON_DOWNLOADS := never
export UV_PROJECT_ENVIRONMENT := $(CURDIR)/.venv

UV_ON_PATH := $(shell command -v uv 2>/dev/null)
ifeq ($(UV_ON_PATH),)
UV := $(CURDIR)/.tools/bin/uv
UV_DEP := $(UV)
else
UV := $(UV_ON_PATH)
UV_DEP :=
endif
RUN := $(UV) run --no-sync

.PHONY: setup demo test check lint typecheck pytest pytest-fast docs wheels bench bench-full bench-quality fuzz archive-soak clean

# uv is bootstrapped into a project-local virtual environment when it is not on PATH.
$(CURDIR)/.tools/bin/uv:
	$(PYTHON) -m venv $(CURDIR)/.tools
	$(CURDIR)/.tools/bin/python -m pip install --quiet "uv==$(UV_VERSION)"

# Bytecode compiled at install: every import (and every process the tests start) reads it,
# even where PYTHONDONTWRITEBYTECODE is set; a sync with nothing new checks it in a second.
setup: $(UV_DEP)
	$(UV) sync --all-packages --all-extras --locked --compile-bytecode --python $(PYTHON)

demo: setup
	rm -f out/demo-archive.sqlite3 out/demo-archive.sqlite3-wal out/demo-archive.sqlite3-shm
	NORMANDY_ARCHIVE_PATH=out/demo-archive.sqlite3 $(RUN) normandy demo --plot out/demo.png

# Every distribution's wheel (the core and each plugins/* one) into $(DIST), for
# `pip install --find-links dist ...` in any environment (docs/install.md). Wheels of an
# earlier build are removed first: two versions of one distribution would conflict.
DIST ?= dist
wheels: $(UV_DEP)
	rm -f $(DIST)/*.whl
	$(UV) build --all-packages --wheel -o $(DIST)

lint: setup
	$(RUN) ruff check .
	$(RUN) ruff format --check .
	$(RUN) lint-imports

typecheck: setup
	$(RUN) mypy

pytest: setup
	HYPOTHESIS_PROFILE=ci $(RUN) pytest -q

docs: setup
	$(RUN) python scripts/gen_hooks_doc.py --check
	$(RUN) mkdocs build --strict --site-dir site

# The docs build runs whether or not pytest passed, so a failing test cannot hide a broken
# docs build (make stops at the first failed prerequisite); the target fails if either did.
test: lint typecheck
	@status=0; $(MAKE) --no-print-directory pytest || status=$$?; \
	$(MAKE) --no-print-directory docs || status=$$?; exit $$status

# The tests marked slow (they start processes, build or install wheels, start PostgreSQL,
# kill processes) run in `make test` only. The fast ones run on two workers (pytest-xdist):
# each test has its own temporary paths, each worker its own archive and vocabulary cache
# (conftest.py; one named in NORMANDY_ARCHIVE_PATH or NORMANDY_CACHE_DIR is shared, and both
# take concurrent processes). The edit loop imports the same tests every time, so it keeps
# their bytecode (PYTHONDONTWRITEBYTECODE emptied).
pytest-fast: setup
	HYPOTHESIS_PROFILE=ci PYTHONDONTWRITEBYTECODE= $(RUN) pytest -q -n 2 --dist worksteal -m "not slow"

check: lint typecheck pytest-fast

# Benchmarks need the peers (the optional `bench` group); `make setup` removes them again.
bench: $(UV_DEP)
	$(UV) sync --all-packages --all-extras --locked --group bench --python $(PYTHON)
	$(RUN) python -m benchmarks --quick

bench-full: $(UV_DEP)
	$(UV) sync --all-packages --all-extras --locked --group bench --python $(PYTHON)
	$(RUN) python -m benchmarks --full --out benchmarks/RESULTS.md

# The quality benchmark of issue 16 (facts available at need time, billed cost; no network).
bench-quality: $(UV_DEP)
	$(UV) sync --all-packages --all-extras --locked --group bench --python $(PYTHON)
	$(RUN) python -m benchmarks.quality --plot docs/img/quality.png

# The fuzz campaign of issue 12: make fuzz SEED=7 DURATION=1800 (findings in out/).
SEED ?= 1
DURATION ?= 60
fuzz: setup
	$(RUN) python scripts/fuzz.py --seed $(SEED) --duration $(DURATION) --out out/fuzz-findings-$(SEED).jsonl

# The archive's crash campaign (issue 14): agents killed mid-compaction, then every
# committed compaction checked recallable: make archive-soak SEED=3 DURATION=1800.
archive-soak: setup
	$(RUN) python scripts/archive_soak.py --seed $(SEED) --duration $(DURATION)

clean:
	rm -rf .venv .tools .pytest_cache .mypy_cache .ruff_cache .import_linter_cache .hypothesis site
