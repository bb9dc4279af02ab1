# dpkit: `make lab` opens the course, `make test` runs every test. Both set up .venv first.
# GNU make. The course environment is pinned in requirements/course.txt only.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.dpkit-installed
# Only directories that exist, so a new folder (exercises/, benchmarks/) joins lint when it lands.
LINT_PATHS := $(wildcard dpkit tests exercises benchmarks scripts)
PYTEST_ARGS ?=

.DEFAULT_GOAL := help
.PHONY: help venv test lab lint format clean distclean

help:
	@echo "make lab        set up $(VENV) and open the course in JupyterLab"
	@echo "make test       set up $(VENV), run ruff and every test (PYTEST_ARGS='-m \"not slow\"' to filter)"
	@echo "make lint       ruff check and format check"
	@echo "make format     ruff format and autofix"
	@echo "make clean      remove build artefacts and caches (keeps $(VENV))"
	@echo "make distclean  clean, and remove $(VENV)"

venv: $(STAMP)

# torch is pinned exactly in requirements/course.txt; installing it together with `-e .` keeps
# pip from re-resolving torch>=2.4 into a multi-GB CUDA build.
$(STAMP): requirements/course.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --disable-pip-version-check --progress-bar off -r requirements/course.txt -e .
	touch $@

# Jupyter, IPython and matplotlib state goes to a temporary folder, never the user's home.
test: venv
	$(BIN)/ruff check $(LINT_PATHS)
	@state=$$(mktemp -d) && trap 'rm -rf "$$state"' EXIT && \
	export MPLBACKEND=Agg MPLCONFIGDIR="$$state/matplotlib" IPYTHONDIR="$$state/ipython" \
	       JUPYTER_CONFIG_DIR="$$state/jupyter/config" JUPYTER_DATA_DIR="$$state/jupyter/data" \
	       JUPYTER_RUNTIME_DIR="$$state/jupyter/runtime" && \
	echo "$(BIN)/python -m pytest $(PYTEST_ARGS)" && \
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# Jupyter refuses to run as root (containers, CI boxes) unless told it may.
ALLOW_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)

lab: venv
	$(BIN)/jupyter lab $(ALLOW_ROOT) notebooks/

lint: venv
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/ruff format --check $(LINT_PATHS)

format: venv
	$(BIN)/ruff format $(LINT_PATHS)
	$(BIN)/ruff check --fix $(LINT_PATHS)

clean:
	rm -rf build dist .pytest_cache .ruff_cache .hypothesis trace.json timeline.png
	find . -path ./$(VENV) -prune -o -name '*.egg-info' -prune -exec rm -rf {} + \
	       -o -name __pycache__ -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
