# Two entry points for a newcomer: `make demo` and `make test` (see README.md).
# Both create .venv, install torch first (the CPU build when none is installed, so that a bare
# `torch` requirement never pulls a multi-GB CUDA build), then the project.

PYTHON ?= python3
# `make test` starts about a hundred fresh Python processes (the commands it runs, each recording's
# launcher and ranks, Dask's workers) beside its own workers. Where the environment sets
# PYTHONDONTWRITEBYTECODE (some container images do), each of them compiles fsdpviz from its source
# again (importing the analysis, the what-if model and the report: 1.1 CPU-seconds against 0.7 with
# bytecode; docs/testing.md). Every target here, the benchmarks and `make demo` included, keeps bytecode
# in the checkout's __pycache__ folders (ignored by git) instead; the variable given on make's command
# line is unset as well.
unexport PYTHONDONTWRITEBYTECODE
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
TORCH_VERSION ?= 2.13.0
DEMO_DIR ?= demo-run
# Older torch releases `make test-torch` records on (tests/integration/test_older_torch.py), each in
# a virtual environment of its own: the oldest fsdpviz supports on CPU (FSDP2 trains with gloo from
# 2.7) and one between. They are the registry's CUDA builds (a few GB each, kept in pip's cache),
# which train on the CPU as well; `make test` does not need them.
OLD_TORCH_VERSIONS ?= 2.7.1 2.11.0
OLD_TORCH_VENVS := $(foreach v,$(OLD_TORCH_VERSIONS),.venv-torch$(v))

.PHONY: demo test test-lifecycle test-recordings recordings test-torch test-clients test-fuzz test-fast setup setup-dev setup-old-torch lint clean bench bench-load bench-scale bench-record bench-report bench-post-record bench-summary

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

$(VENV)/.torch: | $(PY)
	@$(PY) -c "import torch" 2>/dev/null || $(PIP) install --quiet torch==$(TORCH_VERSION)
	@touch $@

$(VENV)/.installed: pyproject.toml $(VENV)/.torch
	$(PIP) install --quiet -e .
	@touch $@

# DeepSpeed compiles a C++ op (its CPU shared-memory collectives: about a minute on 2 cores) the first
# time a process group starts on the CPU, and again whenever the environment's paths change. It is
# built here, once, into the environment's own folder (TORCH_EXTENSIONS_DIR, exported to every target
# below), so that no test job waits on the compiler and two environments never rebuild each other's.
export TORCH_EXTENSIONS_DIR := $(abspath $(VENV))/torch-extensions

$(VENV)/.installed-dev: pyproject.toml $(VENV)/.installed
	$(PIP) install --quiet -e ".[dev,deepspeed]"
	DS_ACCELERATOR=cpu $(PY) -c "from deepspeed.accelerator import get_accelerator; \
		get_accelerator().create_op_builder('ShareMemCommBuilder').load()" > /dev/null
	@touch $@

setup: $(VENV)/.installed
setup-dev: $(VENV)/.installed-dev

.venv-torch%/.installed: pyproject.toml
	$(PYTHON) -m venv .venv-torch$*
	.venv-torch$*/bin/python -m pip install --quiet --upgrade pip
	.venv-torch$*/bin/python -m pip install --quiet torch==$*
	.venv-torch$*/bin/python -m pip install --quiet -e .
	@touch $@

setup-old-torch: $(foreach v,$(OLD_TORCH_VENVS),$(v)/.installed)

# Record the bundled example (FSDP2, 2 ranks on CPU with gloo) into $(DEMO_DIR)/ and summarise it.
demo: setup
	OMP_NUM_THREADS=1 $(PY) -m fsdpviz record --out $(DEMO_DIR) --force -- \
		$(PY) -m torch.distributed.run --standalone --nproc_per_node 2 examples/train.py --framework fsdp2

# pytest-xdist workers for the suite: one per core and one more, since a worker often waits on a
# job's processes or on a recording another worker makes (`make test PYTEST_WORKERS=0` runs it in one
# process); a file's tests run in one worker (--dist loadfile), so that its module-scoped fixtures are
# made once.
# More pytest options for `make test`, e.g. PYTEST_ARGS="--durations=30" or PYTEST_ARGS="-k summary".
PYTEST_ARGS ?=
PYTEST_WORKERS ?= $(shell $(PYTHON) -c "import os; print(len(os.sched_getaffinity(0)) + 1 if hasattr(os, 'sched_getaffinity') else (os.cpu_count() or 1) + 1)")

# ruff first (a second), then the suite in parallel (docs/testing.md) while mypy checks the types
# beside it (half a minute without its cache, mostly reading torch's annotations, on cores the suite
# leaves idle while its workers wait on jobs); both must pass, mypy's findings are printed after the
# suite's. The torch-version matrix, the real clients of other stacks and the fuzzers' full budget are
# targets of their own, which CI (.ci/run) runs after this one.
test: setup-dev
	$(PY) -m ruff check fsdpviz tests benchmarks
	@types_out=$$(mktemp); $(PY) -m mypy > $$types_out 2>&1 & types=$$!; \
	trap 'kill $$types 2>/dev/null; rm -f $$types_out; exit 130' INT TERM; \
	FSDPVIZ_TEST_RECORDINGS=committed \
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile -m "not clients and not lifecycle and not example_script and not roundtrip" $(PYTEST_ARGS); \
	tests=$$?; wait $$types; typed=$$?; echo "mypy:"; cat $$types_out; rm -f $$types_out; \
	test $$tests -eq 0 && test $$typed -eq 0

# The tests that analyse recordings committed in tests/recorded/ (marker `recorded`), on recordings
# made now instead (tests/helpers/committed.py), and the wrap-policy example script end to end: what
# the recorder makes today, run by CI after `make test`.
test-recordings: setup-dev
	FSDPVIZ_TEST_RECORDINGS=fresh $(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile -m "recorded or example_script or roundtrip"

# Record the committed recordings again (after a change to the recorder, the example trainer or a
# test's configuration) and run their tests on them; commit tests/recorded/ afterwards.
recordings: setup-dev
	FSDPVIZ_TEST_RECORDINGS=update $(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile -m recorded

# The recorder's process lifecycle under faults (signals to a rank or to fsdpviz, a killed rank, an
# exception, a disk filling up under the training, two nodes into one folder, a script without an
# optimizer): real jobs that each wait for their fault, run by CI after `make test`.
test-lifecycle: setup-dev
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile -m lifecycle

# Programs written for other stacks (HF Trainer, accelerate, Lightning Fabric, torchtitan, ...),
# each recorded unchanged and run bare once (tests/integration/test_real_clients.py).
test-clients: setup-dev
	$(PY) -m pytest -q -p no:xdist -m clients

# The suite's recordings on every older torch release fsdpviz supports (OLD_TORCH_VERSIONS).
# With OLD_TORCH_KEEP=0 (CI, .ci/run) the releases are taken one at a time: each environment is made
# without keeping its downloads in pip's cache and removed after its tests, so that the disk holds one
# CUDA build at a time (about 5.5 GB installed, 2.5 GB of wheels while it installs) instead of every
# release and its wheels (17 GB for two).
OLD_TORCH_KEEP ?= 1
ifeq ($(OLD_TORCH_KEEP),0)
test-torch: setup-dev
	@set -e; for v in $(OLD_TORCH_VERSIONS); do \
		echo "test-torch: torch $$v"; \
		PIP_NO_CACHE_DIR=1 $(MAKE) --no-print-directory test-torch OLD_TORCH_KEEP=1 OLD_TORCH_VERSIONS=$$v; \
		rm -rf .venv-torch$$v; \
	done
else
test-torch: setup-dev setup-old-torch
	FSDPVIZ_OLD_TORCH_VENVS="$(OLD_TORCH_VENVS)" FSDPVIZ_REQUIRE_OLD_TORCH=1 \
		$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile tests/integration/test_older_torch.py
endif

# The property-based fuzzers with their full example budget (`make test` runs a fixed smaller one).
test-fuzz: setup-dev
	FSDPVIZ_FUZZ_BUDGET=full $(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile -m fuzz

test-fast: setup-dev
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile -m "not slow and not browser"

# Benchmarks (minutes each; results and the machine they ran on go in docs/performance.md).
bench-load: setup-dev
	$(PY) benchmarks/bench_load.py

bench-scale: setup-dev
	$(PY) benchmarks/bench_scale.py

bench-record: setup-dev
	$(PY) benchmarks/bench_record_overhead.py

bench-report: setup-dev
	$(PY) benchmarks/bench_report.py

bench-post-record: setup-dev
	$(PY) benchmarks/bench_post_record.py

# One summary split into its stages (imports, read, structure, figures, replay, each priced action,
# rendering) for the bundled samples, a shared H100 recording and a 35 MB trace; then the command cold
# and warm (~3 min).
bench-summary: setup-dev
	$(PY) benchmarks/bench_summary_stages.py

bench: bench-load bench-scale bench-record bench-report bench-post-record bench-summary

# ruff on everything; mypy on the package (its settings are in pyproject.toml).
lint: setup-dev
	$(PY) -m ruff check fsdpviz tests benchmarks
	$(PY) -m mypy

clean:
	rm -rf $(VENV) $(OLD_TORCH_VENVS) .pytest_cache $(DEMO_DIR)
