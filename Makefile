# Two commands do all set-up on a fresh machine: `make dry-run` and `make test`.
# Both create .venv and install from this repo's files; torch stays on the CPU wheel
# (constraints.txt) so dev and CI never pull a multi-GB CUDA build.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
DRY_RUN_OUT ?= cpr-dry-run
PYTEST_ARGS ?=

.PHONY: install dry-run test lint bench-ingest bench-mine bench-llm bench-encode bench-pool bench-refresh bench-search bench-search-load clean

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt torch==2.13.0
	$(PIP) install -q -c constraints.txt -e '.[dev]'
	touch $@

install: $(VENV)/.installed

dry-run: install
	$(VENV)/bin/cpr dry-run --out $(DRY_RUN_OUT)

test: install
	$(PY) -m pytest $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check cpr_ray tests benchmarks jobs

bench-ingest: install
	$(PY) benchmarks/ingest.py

bench-mine: install
	$(PY) benchmarks/mine.py

bench-llm: install
	$(PY) benchmarks/llm_throughput.py

bench-encode: install
	$(PY) benchmarks/encode.py

bench-pool: install
	$(PY) benchmarks/pool.py

bench-refresh: install
	$(PY) benchmarks/refresh.py

bench-search: install
	$(PY) benchmarks/search.py

bench-search-load: install
	$(PY) benchmarks/search_load.py

clean:
	rm -rf $(DRY_RUN_OUT) .pytest_cache
