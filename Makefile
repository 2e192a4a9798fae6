# Two commands do all set-up on a fresh machine: `make dry-run` and `make test`.
# Both create .venv and install from this repo's files, every package at infra/image/cpu.lock's
# version (torch at the one constraints.txt pins).
# Where pip's config offers no local CPU wheel of it, `make install
# TORCH_INDEX=https://download.pytorch.org/whl/cpu` keeps dev off the multi-GB CUDA build.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_INDEX ?=
DRY_RUN_OUT ?= cpr-dry-run
PYTEST_ARGS ?=

.PHONY: install browser dry-run test lint check docs clean

# infra/image/install.sh installs the package, dev extras and the pinned torch into the venv: the
# same script, at the versions of the same lock (infra/image/cpu.lock; `bash infra/image/lock.sh`
# rewrites it from pyproject.toml), that installs the package into the CPU image
# (infra/image/Dockerfile). Here torch comes from pip's configured sources (a local CPU wheel on
# the CI machines) or PyPI.
$(VENV)/.installed: pyproject.toml infra/image/cpu.lock infra/image/install.sh
	$(PYTHON) -m venv $(VENV)
	bash infra/image/install.sh $(PY) --lock cpu$(if $(TORCH_INDEX), --torch-index $(TORCH_INDEX)) \
		-e '.[cpu,dev]'
	touch $@

install: $(VENV)/.installed

dry-run: install
	$(VENV)/bin/cpr dry-run --out $(DRY_RUN_OUT)

# tests/search/test_search_page.py drives the search page in Debian's headless chromium through its
# chromedriver (Selenium is told both paths, so it never downloads a browser); installed once
CHROMEDRIVER := /usr/bin/chromedriver
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

browser:
	@[ -x $(CHROMEDRIVER) ] && [ -x /usr/bin/chromium ] || { $(SUDO) apt-get update -q && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
		--no-install-recommends chromium chromium-driver; }

test: install browser
	$(PY) -m pytest $(PYTEST_ARGS)

LINTED := cpr_ray tests benchmarks jobs

lint: install
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/ruff format --check $(LINTED)

# what CI runs before the tests (.ci/run): lint, then mypy on cpr_ray at the strictness
# pyproject.toml's [tool.mypy] states
check: lint
	$(VENV)/bin/mypy

# the docs site (mkdocs.yml, docs/) into site/: --strict makes a broken link or a stale
# configuration reference (docs/hooks.py) fail the build; NO_MKDOCS_2_WARNING quiets
# mkdocs-material's banner about its successor
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# `make bench-NAME` runs benchmarks/NAME.py (dashes read as underscores): bench-ingest, bench-mine,
# bench-llm, bench-encode, bench-pool, bench-refresh, bench-search, bench-search-load. Not .PHONY:
# make searches no pattern rule for a phony target.
bench-llm: BENCHMARK := llm_throughput
bench-%: install
	$(PY) benchmarks/$(or $(BENCHMARK),$(subst -,_,$*)).py

clean:
	rm -rf $(DRY_RUN_OUT) .pytest_cache site
