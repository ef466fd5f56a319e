"""Shared test setup. Service fixtures live in tests/fixtures/ (one module per real service)."""

import os

import pytest

# Real services only: the Kafka-protocol broker and Triton are started by the project's own code.
pytest_plugins = ["tests.fixtures.triton", "tests.fixtures.kafka"]


@pytest.fixture(scope="session")
def settings_env(tmp_path_factory):
    """Environment for child processes: isolated state dir, shared build cache (the model build is reused)."""
    state = tmp_path_factory.mktemp("state")
    env = dict(os.environ)
    env["MODPIPE_STATE_DIR"] = str(state)
    env.setdefault("MODPIPE_LOG_FORMAT", "json")
    return env
