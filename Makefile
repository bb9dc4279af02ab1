# dpkit: `make lab` opens the course, `make test` runs every test. Both set up .venv first.
# GNU make. The course environment is pinned in requirements/course.txt only, the tools that
# test it in requirements/test.txt.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.dpkit-installed
# Only directories that exist, so a new folder (exercises/, benchmarks/) joins lint when it lands.
LINT_PATHS := $(wildcard dpkit tests exercises benchmarks scripts)
PYTEST_ARGS ?=
# Two pytest workers (pytest-xdist), a test file each at a time so that a file's shared
# fixtures (one JupyterLab server for the browser tests) stay in one process: most tests
# wait on subprocesses, kernels and a browser, so two workers take about 0.6x the time of
# one on 2 cores (217 s against 348 s here). PYTEST_PARALLEL= runs them in one process.
# Files go out in collection order, the browser tests' (100-140 s, a third of a worker's
# share) first: xdist's default, most tests first, handed them out halfway and left one
# worker idle for the last 27 s.
PYTEST_PARALLEL ?= -n 2 --dist loadfile --no-loadscope-reorder
# The 15 slowest tests, at the end of every run: CI time stays visible (issue 32).
PYTEST_REPORT ?= --durations=15
NOTEBOOKS := $(sort $(wildcard notebooks/*.ipynb))
# Strict nbval: every stored output must match a fresh run, except cells tagged
# nbval-ignore-output (widgets, timings); notebooks/sanitize.cfg masks figure sizes and times.
NBVAL_ARGS ?= --nbval --nbval-current-env --nbval-sanitize-with notebooks/sanitize.cfg \
              --nbval-cell-timeout=300 -p no:cacheprovider

.DEFAULT_GOAL := help
.PHONY: help venv test-tools test test-guide check-notebooks grade image handout site notebooks lab lint format clean distclean mutation

help:
	@echo "make lab        set up $(VENV) and open the course in JupyterLab"
	@echo "make test-tools install the test tools (requirements/test.txt) into $(VENV)"
	@echo "make test       set up $(VENV), run ruff, every test, and nbval over notebooks/ (PYTEST_ARGS='-m \"not slow\"' to filter)"
	@echo "make test-guide the instructor's guide followed in a clone of the last commit, then its whole make test (10-20 min)"
	@echo "make check-notebooks  nbval over notebooks/ alone"
	@echo "make grade      grade every exercise (dpkit grade --all)"
	@echo "make image      build the grading container image dpkit-course (podman or docker)"
	@echo "make handout OUT=DIR  a student's copy: no solutions, no instructor tests, no history (REPOSITORY=https://github.com/OWNER/NAME: its Colab cell and links)"
	@echo "make site       the course as static HTML pages in build/site (OUT=DIR; REPOSITORY=https://github.com/OWNER/NAME for Colab and Binder links)"
	@echo "make notebooks  re-execute every notebook top to bottom in a fresh kernel and store its outputs"
	@echo "make lint       ruff check and format check"
	@echo "make format     ruff format and autofix"
	@echo "make mutation   mutation testing of the core with mutmut, not in make test (hours; FILES=dpkit/comm.py for some)"
	@echo "make clean      remove build artefacts and caches (keeps $(VENV))"
	@echo "make distclean  clean, and remove $(VENV)"

venv: $(STAMP)

# torch is pinned exactly in requirements/course.txt and installed first, by pip: pip follows
# the machine's own settings (a wheel on disk, a constraints file), and a looser spec or another
# installer can pull a multi-GB CUDA build. On Linux without an NVIDIA GPU (no nvidia-smi),
# it comes from PyTorch's CPU wheel index where that can be reached: PyPI's Linux wheel is the
# CUDA build, several GB of NVIDIA libraries a laptop cannot use.
# Everything else goes through uv, installed into the venv first (2 s): the course's hundred
# packages take it 3-5 s where pip takes 33 s (on our 2-core machines, cold caches both), most
# of CI's install. torch, already there, satisfies the pin. Where uv cannot be installed, or an
# install with it fails (no network for it, say), pip does that install, as before.
# No bytecode at install (pip's --no-compile, uv's default): pip would compile all of the
# environment's 11,000 modules, one after another (30 s here); Python writes a module's bytecode
# the first time it is imported instead (make test imports about 4,600 of them: 13 s, spread
# over its processes). That needs PYTHONDONTWRITEBYTECODE unset where it is set (as on our CI
# machines): without bytecode on disk, every Python the tests start would compile torch again.
PIP_INSTALL := $(BIN)/python -m pip install --no-compile --disable-pip-version-check --progress-bar off
UV_PIN := uv==0.13.8
# $(call INSTALL,ARGS): uv where the venv has it, else (or if uv fails) pip
INSTALL = if [ -x $(BIN)/uv ] && $(BIN)/uv pip install --python $(BIN)/python $(1); then :; \
	  else echo "== pip installs $(1)"; $(PIP_INSTALL) $(1); fi
unexport PYTHONDONTWRITEBYTECODE
TORCH_PIN := $(shell grep -E '^torch==' requirements/course.txt)
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
$(STAMP): requirements/course.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@if [ "$$(uname -s)" = Linux ] && ! command -v nvidia-smi >/dev/null 2>&1; then \
	  if $(BIN)/python -c "import urllib.request as u; u.urlopen('$(TORCH_CPU_INDEX)/torch/', timeout=10)" \
	       >/dev/null 2>&1; then \
	    echo "== no NVIDIA GPU: $(TORCH_PIN) from PyTorch's CPU wheel index ($(TORCH_CPU_INDEX))"; \
	    $(PIP_INSTALL) --index-url $(TORCH_CPU_INDEX) "$(TORCH_PIN)" \
	      || echo "== that failed: $(TORCH_PIN) as pip finds it"; \
	  else \
	    echo "== no NVIDIA GPU, but PyTorch's CPU index cannot be reached: $(TORCH_PIN) as pip finds it"; \
	  fi; \
	fi
	$(PIP_INSTALL) "$(TORCH_PIN)"
	$(PIP_INSTALL) "$(UV_PIN)" || echo "== uv could not be installed: pip installs the rest (slower)"
	$(call INSTALL,-r requirements/course.txt -e .)
	touch $@

# The tools that test the course (requirements/test.txt), beside the course environment.
# Without rfc3987-syntax: jupyter-events pulls it in for jsonschema's optional "iri" format
# check, which builds its grammars when jsonschema is imported: 1.1-1.6 s of CPU in every
# process that loads nbformat, and nbval's plugin loads it in every pytest process, the
# graders' and the nested runs' too (0.25 s without). Nothing the tests run validates IRIs,
# jsonschema skips the format without the package, and `pip check` stays clean.
TEST_STAMP := $(VENV)/.dpkit-test-tools-installed
$(TEST_STAMP): requirements/test.txt $(STAMP)
	$(call INSTALL,-r requirements/test.txt -c requirements/course.txt)
	$(BIN)/python -m pip uninstall --yes --quiet --disable-pip-version-check rfc3987-syntax
	touch $@

test-tools: $(TEST_STAMP)

# Jupyter, IPython and matplotlib state goes to a temporary folder, never the user's home.
JUPYTER_STATE = export MPLBACKEND=Agg MPLCONFIGDIR="$$state/matplotlib" IPYTHONDIR="$$state/ipython" \
	       JUPYTER_CONFIG_DIR="$$state/jupyter/config" JUPYTER_DATA_DIR="$$state/jupyter/data" \
	       JUPYTER_RUNTIME_DIR="$$state/jupyter/runtime"

# The tests, then nbval over the stored notebooks; both run, and the first failure's exit code
# is the target's. nbval runs the notebooks under dpkit's placement check (CPU lanes apart from
# plain CPU memory, as lanes on a GPU), so a notebook that forgets .to(home) fails here as it
# would on Colab; the explorer, viz and demo tests do the same (tests/conftest.py). The measuring
# notebooks (03, 05-08) run while two processes keep two cores busy, and every verdict they print
# is checked against its own numbers (notebooks/conftest.py); DPKIT_NOTEBOOKS_UNDER_LOAD=0 runs
# them quiet.
DPKIT_NOTEBOOKS_UNDER_LOAD ?= 1
# nbval's kernels read DPKIT_CHECK_PLACEMENT through an IPython config in the run's IPYTHONDIR
# (import dpkit never turns the check on by itself).
KERNEL_PLACEMENT_CHECK = $(BIN)/python -m dpkit.placement_check "$$IPYTHONDIR" >/dev/null
NBVAL_PATHS ?= notebooks/
NBVAL = DPKIT_CHECK_PLACEMENT=1 DPKIT_NOTEBOOKS_UNDER_LOAD=$(DPKIT_NOTEBOOKS_UNDER_LOAD) \
	$(BIN)/python -m pytest $(PYTEST_PARALLEL) $(NBVAL_ARGS) $(NBVAL_PATHS)
test: venv test-tools
	$(BIN)/ruff check $(LINT_PATHS) notebooks
	@state=$$(mktemp -d) && trap 'rm -rf "$$state"' EXIT && $(JUPYTER_STATE) || exit 1; \
	echo "$(BIN)/python -m pytest $(PYTEST_PARALLEL) $(PYTEST_REPORT) $(PYTEST_ARGS)"; \
	$(BIN)/python -m pytest $(PYTEST_PARALLEL) $(PYTEST_REPORT) $(PYTEST_ARGS); status=$$?; \
	if [ -n "$(NOTEBOOKS)" ]; then \
	  $(KERNEL_PLACEMENT_CHECK); echo "$(NBVAL)"; $(NBVAL); nbval=$$?; \
	  [ $$status -ne 0 ] || status=$$nbval; \
	fi; \
	exit $$status

# docs/instructors.md followed to the end in a clone of the last commit: a notebook and an
# exercise added and committed as it says, then the whole make test there must pass
# (tests/test_guide_end_to_end.py, skipped without DPKIT_SLOW=1). As long as make test and one
# notebook's run, so it is in neither make test nor CI. GUIDE_LOG=FILE keeps the clone's output.
GUIDE_LOG ?=
test-guide: venv test-tools
	DPKIT_SLOW=1 $(if $(GUIDE_LOG),DPKIT_GUIDE_LOG="$(abspath $(GUIDE_LOG))") \
	  $(BIN)/python -m pytest -p no:cacheprovider -s -rA tests/test_guide_end_to_end.py

# nbval alone: what a student's hand-out runs in its CI (make handout), the course unchanged.
check-notebooks: venv test-tools
	@state=$$(mktemp -d) && trap 'rm -rf "$$state"' EXIT && $(JUPYTER_STATE) || exit 1; \
	$(KERNEL_PLACEMENT_CHECK); echo "$(NBVAL)"; $(NBVAL)

# Grade every exercise in exercises/ (a student's own check; exit 1 until every task passes);
# TASKS="1 2" grades some.
TASKS ?=
grade: venv
	$(BIN)/dpkit grade --all $(if $(TASKS),--tasks $(TASKS))

# The grading image (Containerfile): the pinned CPU course environment, tagged dpkit-course, the
# name the guide's `podman run` line uses. podman where it is installed, else docker.
CONTAINER ?= $(shell command -v podman 2>/dev/null || command -v docker 2>/dev/null)
image:
	@test -n "$(CONTAINER)" || { echo "make image needs podman or docker"; exit 2; }
	$(CONTAINER) build -t dpkit-course -f Containerfile .

# A student's copy of the course (docs/instructors.md, "Hand out and grade a class"): no
# solutions, no instructor tests, no history; its own README, CI and Classroom autograding.
handout: venv
	@test -n "$(OUT)" || { echo "make handout OUT=DIR: the folder for the hand-out"; exit 2; }
	$(BIN)/python scripts/handout.py "$(OUT)" $(if $(REPOSITORY),--repository "$(REPOSITORY)")

# The course as static HTML pages with their stored outputs (scripts/course_site.py), into OUT
# (build/site); REPOSITORY=https://github.com/OWNER/NAME adds Colab and Binder links to it.
site: venv
	$(BIN)/python scripts/course_site.py "$(or $(OUT),build/site)" $(if $(REPOSITORY),--repository "$(REPOSITORY)")

# Re-execute every notebook top to bottom, each in a fresh kernel, and store the outputs in place;
# then stamp each code cell with a hash of the source it ran (tests/test_notebooks.py checks it).
notebooks: venv test-tools
	@if [ -z "$(NOTEBOOKS)" ]; then echo "no notebooks in notebooks/"; exit 0; fi; \
	state=$$(mktemp -d) && trap 'rm -rf "$$state"' EXIT && $(JUPYTER_STATE) && \
	echo "$(BIN)/jupyter nbconvert --to notebook --execute --inplace $(NOTEBOOKS)" && \
	$(BIN)/jupyter nbconvert --to notebook --execute --inplace \
	    --ExecutePreprocessor.timeout=300 --log-level=WARN $(NOTEBOOKS) && \
	$(BIN)/python tests/test_notebooks.py --stamp $(NOTEBOOKS)

# Jupyter refuses to run as root (containers, CI boxes) unless told it may.
ALLOW_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)

lab: venv
	$(BIN)/jupyter lab $(ALLOW_ROOT) --ServerApp.root_dir=. notebooks/00_start_here.ipynb

# Mutation testing of the core (benchmarks/mutation.py): results in benchmarks/results/mutation.*,
# caches in build/mutation/ (a rerun tests only what changed). FILES="dpkit/comm.py ..." runs
# some core files; MUTATION_ARGS passes more options (--fresh, --skip-tests GLOB, --report-only,
# --sample N: N mutants per file drawn at random, with the kill rate's 95 % interval;
# --recheck-timeouts: mutants stopped at the time limit tested again, one at a time).
MUTATION_STAMP := $(VENV)/.dpkit-mutation-installed
FILES ?=
MUTATION_ARGS ?=

$(MUTATION_STAMP): requirements/mutation.txt $(TEST_STAMP)
	$(call INSTALL,-r requirements/mutation.txt -c requirements/course.txt -c requirements/test.txt)
	touch $@

mutation: venv $(MUTATION_STAMP)
	$(BIN)/python -m benchmarks.mutation $(if $(FILES),--files $(FILES)) $(MUTATION_ARGS)

lint: venv test-tools
	$(BIN)/ruff check $(LINT_PATHS) notebooks
	$(BIN)/ruff format --check $(LINT_PATHS)

format: venv test-tools
	$(BIN)/ruff format $(LINT_PATHS)
	$(BIN)/ruff check --fix $(LINT_PATHS)

clean:
	rm -rf build dist .pytest_cache .ruff_cache .hypothesis trace.json timeline.png
	find . -path ./$(VENV) -prune -o -name '*.egg-info' -prune -exec rm -rf {} + \
	       -o -name __pycache__ -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
