# `make run` and `make test` do every set-up step: each creates (or reuses) .venv and installs what it
# needs; `make test` first installs the Debian packages the tests drive (scripts/test-deps.sh: as
# root it installs them, otherwise it prints the apt-get command and stops).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test test-deps bench clean images

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/fleetlog serve

test-deps:
	scripts/test-deps.sh

test: test-deps
	$(MAKE) --no-print-directory $(STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python bench/ingest_throughput.py
	$(BIN)/python bench/tail_latency.py
	$(BIN)/python bench/agent_cost.py
	$(BIN)/python bench/gpu_sampling.py
	$(BIN)/python bench/search_latency.py
	$(BIN)/python bench/storage_bytes.py
	$(BIN)/python bench/ready_time.py
	$(BIN)/python bench/flood_memory.py
	$(BIN)/python bench/sql_starvation.py

clean:
	rm -rf $(VENV) var .pytest_cache

# Both images (fleetlog-ingest, fleetlog-agent) with podman or docker; without a registry, from a
# local Debian base (docker/build-images.sh says which settings it reads).
images:
	docker/build-images.sh
