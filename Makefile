# Two commands: `make demo` runs the main job on the embedded default, `make test` runs the tests.
# Both create .venv on first use and install Tula into it.
PY      ?= python3
VENV    := .venv
STAMP   := $(VENV)/.installed
TULA    := $(VENV)/bin/tula
OUT     ?= runs/demo

.PHONY: demo test lint bench clean venv docs

venv: $(STAMP)

# pyproject.toml declares ranges; constraints.txt holds the exact versions CI installs
$(STAMP): pyproject.toml constraints.txt
	test -x $(VENV)/bin/python || $(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -c constraints.txt -e '.[test,docs]'
	touch $(STAMP)

demo: $(STAMP)
	rm -rf $(OUT)
	$(TULA) run --example digits --out $(OUT)

# Two at a time (pytest-xdist, a test file per process), then the tests marked `serial` alone:
# those time real work against a prediction or a deadline.  Both parts run; either failing fails.
TEST_PROCESSES ?= 2
test: lint
	$(VENV)/bin/python -m pytest -q -n $(TEST_PROCESSES) --dist loadfile -m "not serial"; parallel=$$?; \
	$(VENV)/bin/python -m pytest -q -m serial; serial=$$?; \
	test $$parallel -eq 0 -a $$serial -eq 0

# The architecture's contracts (import-linter: the layers, no torch in the core), ruff's lint
# and format check, mypy on the package and the benchmark scripts (pyproject's [tool.mypy] files).  A minute or
# two; part of `make test`, so of CI.
lint: $(STAMP)
	cd src && ../$(VENV)/bin/lint-imports ../pyproject.toml
	$(VENV)/bin/ruff check src tests bench examples docs/gen
	$(VENV)/bin/ruff format --check src tests bench examples docs/gen
	$(VENV)/bin/mypy

# The documentation site (mkdocs.yml; the reference pages are generated from the code) into site/,
# strict: a broken link, a missing page or a reference to code that is gone fails it; then its tests
# (tests/test_docs.py: the build again, the runnable blocks of the docs, the pages in Chromium),
# which `make test` runs too.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true $(VENV)/bin/mkdocs build --strict
	$(VENV)/bin/python -m pytest -q tests/test_docs.py

bench: $(STAMP)
	$(VENV)/bin/pip install -q -c constraints.txt -e '.[test,bench]'
	$(VENV)/bin/python bench/perfmodel_accuracy.py
	$(VENV)/bin/python bench/memory_bound.py
	$(VENV)/bin/python bench/large_batch.py
	$(VENV)/bin/python bench/data_path.py
	$(VENV)/bin/python bench/cluster_overhead.py
	$(VENV)/bin/python bench/schedules.py
	$(VENV)/bin/python bench/simulate_accuracy.py
	$(VENV)/bin/python bench/noise_scale_cost.py
	$(VENV)/bin/python bench/service_load.py
	$(VENV)/bin/python bench/estimator_overhead.py
	$(VENV)/bin/python bench/network_model.py
	$(VENV)/bin/python bench/env_launcher.py
	$(VENV)/bin/python bench/precision.py
	$(VENV)/bin/python bench/time_to_accuracy.py
	$(VENV)/bin/python bench/accumulation.py
	$(VENV)/bin/python bench/run_prediction.py
	$(VENV)/bin/python bench/plan_while_training.py
	$(VENV)/bin/python bench/service_cluster.py
	$(VENV)/bin/python bench/transformer_plan.py

clean:
	rm -rf $(VENV) runs site .pytest_cache
