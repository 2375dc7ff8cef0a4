# Entry points for people and CI: make run, make test, make lint, make bench, make proto.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test test-all lint format proto bench system-deps clean

# The modules setup.py compiles with mypyc (pyproject.toml: [tool.burstctl] compiled).
COMPILED := $(shell $(PYTHON) package_layout.py 2>/dev/null)

# Install (or update) the package and its dev/test extras when pyproject.toml changes, and
# rebuild the native parts (setup.py) when one of their sources does: the LD_PRELOAD
# library's C sources and header, the compiled modules' Python sources.
$(STAMP): pyproject.toml setup.py package_layout.py $(wildcard preload_shim/*.c preload_shim/*.h) \
  $(COMPILED)
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
	  || { echo "burstctl needs Python >= 3.11 (found $$($(PYTHON) --version))"; exit 1; }
	@command -v gcc >/dev/null 2>&1 && test -e /usr/include/stdio.h \
	  || { echo "burstctl's build compiles the LD_PRELOAD library: it needs gcc and the libc" \
	       "headers (sudo apt-get install -y gcc libc6-dev, or make system-deps as root)"; exit 1; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $@

system-deps:
	@bash deploy/system-deps.sh

run: $(STAMP)
	$(VENV)/bin/burstctl controller $(ARGS)

# The suite CI runs: every test but the long sweeps (marker `sweep`), hypothesis at its `ci`
# profile (tests/conftest.py), in WORKERS processes (pytest-xdist, a file per worker at a time);
# then the tests that measure rates or times over a window (marker `serial`), alone. A phase
# that PYTEST_ARGS leaves without a test (pytest's exit status 5) is no failure.
WORKERS ?= 3
test: system-deps $(STAMP)
	$(PY) -m pytest -m "not sweep and not serial" -n $(WORKERS) --dist loadfile $(PYTEST_ARGS) \
	  || [ $$? -eq 5 ]
	$(PY) -m pytest -m "serial and not sweep" -p no:xdist $(PYTEST_ARGS) || [ $$? -eq 5 ]

# Everything: the long sweeps too, hypothesis at its `thorough` profile.
test-all: system-deps $(STAMP)
	HYPOTHESIS_PROFILE=thorough $(PY) -m pytest -m "not serial" -n $(WORKERS) --dist loadfile \
	  $(PYTEST_ARGS) || [ $$? -eq 5 ]
	HYPOTHESIS_PROFILE=thorough $(PY) -m pytest -m serial -p no:xdist $(PYTEST_ARGS) \
	  || [ $$? -eq 5 ]

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(PY) tests/layering.py

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

proto: $(STAMP)
	$(PY) proto/generate.py

bench: $(STAMP)
	$(PY) bench/sweeps.py
	$(PY) bench/decision_latency.py
	$(PY) bench/grpc_ingest_ceiling.py
	$(PY) bench/controller_events.py
	$(PY) bench/sim_speed.py
	$(PY) bench/persched_speed.py
	$(PY) bench/dpsac_speed.py --drain
	$(PY) bench/split_speed.py
	$(PY) bench/replica_sync.py
	$(PY) bench/scale.py --replicas 2 --sessions 1000
	$(PY) bench/fairness.py
	$(PY) bench/fuse_throughput.py
	$(PY) bench/preload_throughput.py
	$(PY) bench/mount_sessions.py
	$(PY) bench/bb_large.py
	$(PY) bench/bb_large.py --files 1024
	$(PY) bench/bb_large.py --shim exec
	$(PY) bench/bb_large.py --shim exec --files 1024
	$(PY) bench/metadata.py
	$(PY) bench/mpi_workloads.py
	$(PY) bench/darshan_replay.py

clean:
	find . -path ./$(VENV) -prune -o -name '*.so' -print -delete
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .mypy_cache
