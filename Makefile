# Two commands do all set-up on a fresh machine: `make dry-run` and `make test`.
# Both create .venv and install from this repo's files; torch stays on the CPU wheel
# (constraints.txt) so dev and CI never pull a multi-GB CUDA build.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
DRY_RUN_OUT ?= cpr-dry-run
PYTEST_ARGS ?=

.PHONY: install browser dry-run test lint bench-ingest bench-mine bench-llm bench-encode bench-pool bench-refresh bench-search bench-search-load clean

# uv resolves and installs in seconds what pip takes two minutes for; it does not read pip's
# config, so the machine's wheel folders and indexes are passed from it (a local torch CPU
# wheel among them). It compiles the bytecode as pip does: with PYTHONDONTWRITEBYTECODE set (as
# here) every Ray worker would otherwise parse torch and ray from source, and a test run takes
# 1.6 times as long. Should uv fail, pip installs the same set.
PIP_SOURCES := $(foreach l,$(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null),--find-links $(l)) \
	$(foreach u,$(shell $(PYTHON) -m pip config get global.extra-index-url 2>/dev/null),--extra-index-url $(u))

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip uv
	$(VENV)/bin/uv pip install --python $(PY) -q -c constraints.txt $(PIP_SOURCES) \
		--index-strategy unsafe-best-match --compile-bytecode torch==2.13.0 -e '.[dev]' \
		|| $(PIP) install -q -c constraints.txt torch==2.13.0 -e '.[dev]'
	touch $@

install: $(VENV)/.installed

dry-run: install
	$(VENV)/bin/cpr dry-run --out $(DRY_RUN_OUT)

# tests/test_search_page.py drives the search page in Debian's headless chromium through its
# chromedriver (Selenium is told both paths, so it never downloads a browser); installed once
CHROMEDRIVER := /usr/bin/chromedriver
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

browser:
	@[ -x $(CHROMEDRIVER) ] && [ -x /usr/bin/chromium ] || { $(SUDO) apt-get update -q && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
		--no-install-recommends chromium chromium-driver; }

test: install browser
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
