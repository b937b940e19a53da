# The two commands a new user needs: `make run` and `make test`.
# Both create .venv on first use (uv when it is on the PATH, else venv + pip).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
HOME_DIR ?= .dunning
UV := $(shell command -v uv 2>/dev/null)

.PHONY: run test test-fast lint setup bench bench-check clean ui docs docs-serve

# Each install phase prints one line; pip's whole output goes to INSTALL_LOG, kept (and its tail shown) only when the
# phase fails. `make run` installs what running needs; `make test`, `make lint` and `make setup` add the `test` extra
# (pytest, hypothesis, moto, mypy, ruff, ...), `make docs` the `docs` extra.
INSTALL_LOG := $(CURDIR)/install.log
define phase
	@printf '%s ... ' $(1); \
	if $(2) >$(INSTALL_LOG) 2>&1; then echo done; rm -f $(INSTALL_LOG); \
	else echo "failed; the full log is in $(INSTALL_LOG):"; tail -n 15 $(INSTALL_LOG); exit 1; fi
endef

$(BIN)/dunning: pyproject.toml
ifdef UV
	$(call phase,"creating $(VENV) (uv)",$(UV) venv --python $(PYTHON) $(VENV))
	$(call phase,"installing dunning-pipeline and what running needs",$(UV) pip install --python $(BIN)/python -e .)
else
	$(call phase,"creating $(VENV)",$(PYTHON) -m venv $(VENV))
	$(call phase,"upgrading pip",$(BIN)/pip install --upgrade pip)
	$(call phase,"installing dunning-pipeline and what running needs",$(BIN)/pip install -e .)
endif
	@touch $(BIN)/dunning

# the test tools on top of the same .venv
$(VENV)/.test-installed: pyproject.toml $(BIN)/dunning
ifdef UV
	$(call phase,"installing the test tools (extra: test)",$(UV) pip install --python $(BIN)/python -e '.[test]')
else
	$(call phase,"installing the test tools (extra: test)",$(BIN)/pip install -e '.[test]')
endif
	@touch $@

setup: $(VENV)/.test-installed

# the docs extra on top of the same .venv (MkDocs, Material)
$(VENV)/.docs-installed: pyproject.toml $(BIN)/dunning
ifdef UV
	$(call phase,"installing the docs tools (extra: docs)",$(UV) pip install --python $(BIN)/python -e '.[docs]')
else
	$(call phase,"installing the docs tools (extra: docs)",$(BIN)/pip install -e '.[docs]')
endif
	@touch $@

# Material for MkDocs and gen-files print a notice about MkDocs 2.0 on every build; it is not about this site
MKDOCS := NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true $(BIN)/mkdocs

# the docs site into site/; --strict: a broken link or anchor, or a page missing from the nav, fails the build
docs: $(VENV)/.docs-installed
	$(BIN)/python docs/gen_reference.py
	$(MKDOCS) build --strict

# the same site at http://127.0.0.1:8000 (this machine only), rebuilt on every change
docs-serve: $(VENV)/.docs-installed
	$(BIN)/python docs/gen_reference.py
	$(MKDOCS) serve --dev-addr 127.0.0.1:8000

run: $(BIN)/dunning
	$(BIN)/python -m dunning.demo --out $(HOME_DIR)/demo/snapshot.csv
	$(BIN)/dunning --home $(HOME_DIR) run --snapshot $(HOME_DIR)/demo/snapshot.csv

# the whole suite on every core (each test has its own home); `make test-fast` is the dev loop. Work stealing:
# a worker that runs out of tests takes queued ones from a busy worker, so the slowest tests don't form a tail
# (measured: 233 s with the default load scheduling, 202 s with worksteal).
# Three workers per two cores: many tests wait on fsyncs, sockets and child processes, which a worker more than
# the cores fills, while each worker beyond that pays its imports again and makes every test slower by sharing the
# cores' caches (measured on 2 cores, 2026-12-07, one run each: 2 workers 297 s with 76 s of the cores idle and
# 479 CPU-s, 3 workers 268 s and 485 CPU-s, 4 workers 282 s and 515 CPU-s).
WORKERS ?= $(shell echo $$(( $$(nproc 2>/dev/null || echo 2) * 3 / 2 )))

# Test homes go on a RAM disk when the machine has one: the suite writes thousands of small DuckDB and SQLite
# files, each commit an fsync (measured on 2 cores: 132 s on /dev/shm, 154-168 s on the disk). One directory per
# checkout, since pytest empties it when a session starts; removed after a passing run, kept after a failure.
SHM_TMP := $(shell [ -d /dev/shm ] && [ -w /dev/shm ] && echo /dev/shm/dunning-tests-$$(printf %s "$(CURDIR)" | cksum | cut -d' ' -f1))
TEST_TMP ?= $(SHM_TMP)
PYTEST_ARGS := -q -n $(WORKERS) --dist worksteal $(if $(TEST_TMP),--basetemp=$(TEST_TMP))

# Bytecode is written even where the environment says PYTHONDONTWRITEBYTECODE: every xdist worker imports the whole
# suite, and without the cache each one compiles the project and rewrites the test modules' asserts again (about
# 4.5 CPU-s of a worker's 9 s start; measured with `pytest --collect-only`). The caches are `__pycache__/`
# (git-ignored); pytest keeps its rewritten test modules apart from plain bytecode.
PYTEST := PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest

# The suite counts its own work as it runs (tests/timing.py: Dagster runs, in-process commands, processes started
# through subprocess) and, once it passes, holds the counts to bench/suite_budget.toml: over budget fails `make
# test` in the change that added the work, whatever the machine's hour (docs/development.md, "The suite's budget").
# The counts go to SUITE_TIMES (DUNNING_TEST_TIMES when set), kept for `python -m bench.suite_costs FILE`;
# `make test SUITE_TIMES=` counts nothing and checks no budget.
SUITE_TIMES ?= $(or $(DUNNING_TEST_TIMES),$(CURDIR)/.suite-times.tsv)

test: setup
	$(if $(SUITE_TIMES),@rm -f "$(SUITE_TIMES)")
	DUNNING_TEST_TIMES="$(SUITE_TIMES)" $(PYTEST) $(PYTEST_ARGS)
	$(if $(TEST_TMP),rm -rf $(TEST_TMP))
	$(if $(SUITE_TIMES),@$(BIN)/python -m bench.suite_costs "$(SUITE_TIMES)" --brief --calibrate --budget bench/suite_budget.toml)

# the dev loop on one worker per core: its tests are short and CPU-bound, and each extra worker pays the suite's
# imports again (measured on 2 cores: about 7 CPU-s a worker, half of what 756 fast tests cost)
FAST_WORKERS ?= $(shell nproc 2>/dev/null || echo 2)
FAST_ARGS := -q -n $(FAST_WORKERS) --dist worksteal $(if $(TEST_TMP),--basetemp=$(TEST_TMP)) -m "not slow"

test-fast: setup
	$(PYTEST) $(FAST_ARGS)
	$(if $(TEST_TMP),rm -rf $(TEST_TMP))

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy dunning
	$(BIN)/lint-imports

TIERS ?= 100k,1m
REPEAT ?= 3

WORKER_TIERS ?= 1m

# the single-worker tiers, then several workers on one PostgreSQL ledger (a throwaway local cluster)
bench: setup
	$(BIN)/python -m bench.run --tiers $(TIERS) --repeat $(REPEAT)
	$(BIN)/python -m bench.workers --tiers $(WORKER_TIERS) --repeat $(REPEAT)

# the 1M tiers against bench/budgets.toml, one row per step (about 10 min on 2 cores; TIERS=10m adds the 10M dry
# run); appends its table to bench/RESULTS.md and fails when a budget is missed. CHECK_ARGS: --record writes the
# figures to bench/recorded.json (the "last recorded" column), --no-fail only reports.
CHECK_ARGS ?=
bench-check: setup
	$(BIN)/python -m bench.check --repeat $(REPEAT) --tiers $(TIERS) $(CHECK_ARGS)

# the Dagster UI (webserver and daemon) on a home: `make ui` for the demo's .dunning, `make ui HOME_DIR=path` for
# another (the path `dunning run` printed); open http://127.0.0.1:3000
ui: $(BIN)/dunning
	@test -d "$(HOME_DIR)" || { echo "make ui: no home at $(HOME_DIR): run \`make run\` first, or pass HOME_DIR=path (an existing home; only --home or DUNNING_HOME creates one)"; exit 2; }
	umask 077 && $(BIN)/python -c "import sys, pathlib, pipelines.instance as i; i.get_instance(pathlib.Path(sys.argv[1]))" "$(abspath $(HOME_DIR))"
	umask 077 && DAGSTER_HOME=$(abspath $(HOME_DIR))/dagster DUNNING_HOME=$(abspath $(HOME_DIR)) $(BIN)/dagster dev -w workspace.yaml

clean:
	rm -rf $(VENV) $(HOME_DIR) $(TEST_TMP) site
