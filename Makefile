# `make run` and `make test` do every set-up step: each creates (or reuses) .venv and installs what it
# needs; `make run` only the server extra (`.[server]`), `make test` the test extra (the server, the
# lake, and the test tools), after installing the Debian packages the tests drive
# (scripts/test-deps.sh: as root it installs them, otherwise it prints the apt-get command and stops).
# Each extra has its own stamp: one installed does not make the other's install skipped.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
SERVER_STAMP := $(VENV)/.installed-server
TEST_STAMP   := $(VENV)/.installed-test

.PHONY: run test test-deps bench clean images

$(SERVER_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[server]'
	touch $(SERVER_STAMP)

# the test extra holds the server's: its install stands for both
$(TEST_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(TEST_STAMP) $(SERVER_STAMP)

run: $(SERVER_STAMP)
	$(BIN)/fleetlog serve

test-deps:
	scripts/test-deps.sh

test: test-deps
	$(MAKE) --no-print-directory $(TEST_STAMP)
	$(BIN)/python -m pytest -q

bench: $(TEST_STAMP)
	$(BIN)/python bench/ingest_throughput.py
	$(BIN)/python bench/commit_statements.py
	$(BIN)/python bench/tail_latency.py
	$(BIN)/python bench/agent_cost.py
	$(BIN)/python bench/gpu_sampling.py
	$(BIN)/python bench/search_latency.py
	$(BIN)/python bench/storage_bytes.py
	$(BIN)/python bench/ready_time.py
	$(BIN)/python bench/flood_memory.py
	$(BIN)/python bench/sql_starvation.py
	$(BIN)/python bench/search_scale.py
	$(BIN)/python bench/many_streams.py
	$(BIN)/python bench/metrics_flood.py
	$(BIN)/python bench/failure_class.py
	$(BIN)/python bench/page_triage.py
	$(BIN)/python bench/instances_api.py
	$(BIN)/python bench/policy_fast_run.py
	$(BIN)/python bench/fleet_sim.py
	$(BIN)/python bench/vs_victorialogs.py

clean:
	rm -rf $(VENV) var .pytest_cache

# Both images (fleetlog-ingest, fleetlog-agent) with podman or docker; without a registry, from a
# local Debian base (docker/build-images.sh says which settings it reads).
images:
	docker/build-images.sh
