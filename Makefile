# Every target creates or reuses .venv and installs what it needs.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test bench clean images

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/fleetlog serve

test: $(STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python bench/ingest_throughput.py
	$(BIN)/python bench/tail_latency.py
	$(BIN)/python bench/agent_cost.py
	$(BIN)/python bench/gpu_sampling.py

clean:
	rm -rf $(VENV) var .pytest_cache

# Both images (fleetlog-ingest, fleetlog-agent) with podman or docker; without a registry, from a
# local Debian base (docker/build-images.sh says which settings it reads).
images:
	docker/build-images.sh
