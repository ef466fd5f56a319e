"""modpipe/services/apache_kafka.py's pure parts: where Kafka places a coordinator, what a node's
server.properties say, and what a cluster id looks like. The cluster itself runs in the integration tests."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from modpipe.services.apache_kafka import (
    coordinator_partition,
    java_string_hash,
    node_properties,
    random_cluster_id,
)


@pytest.mark.parametrize(("text", "expected"), [
    ("", 0), ("a", 97), ("hello", 99162322), ("modpipe", 1227282352),
    ("polygenelubricants", -2147483648),  # Integer.MIN_VALUE: Kafka's Utils.abs maps it to 0
    ("é€", 233 * 31 + 8364),  # UTF-16 code units
    ("😀", 1772899),  # a surrogate pair counts as two units (values from jshell)
])
def test_java_string_hash_is_javas(text, expected):
    assert java_string_hash(text) == expected


def test_coordinator_partition_is_kafkas_abs_hash_modulo():
    assert coordinator_partition("polygenelubricants", 10) == 0
    assert coordinator_partition("hello", 50) == 99162322 % 50
    assert coordinator_partition("modpipe", 10) == 1227282352 % 10
    assert {coordinator_partition(f"modpipe-worker-{i}-1", 10) for i in range(200)} == set(range(10))


def test_one_node_keeps_every_internal_topic_at_replication_one(tmp_path: Path):
    props = node_properties(1, [(1, 9092, 9093)], tmp_path)
    assert props["controller.quorum.voters"] == "1@127.0.0.1:9093"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093"
    assert props["process.roles"] == "broker,controller"
    for key in ("default.replication.factor", "offsets.topic.replication.factor",
                "transaction.state.log.replication.factor", "min.insync.replicas", "transaction.state.log.min.isr"):
        assert props[key] == "1", key


def test_three_nodes_replicate_three_times_and_need_two_in_sync(tmp_path: Path):
    nodes = [(1, 9092, 9192), (2, 9094, 9194), (3, 9096, 9196)]
    props = node_properties(2, nodes, tmp_path / "n2", extra={"log.retention.ms": "1000"})
    assert props["node.id"] == "2" and props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:9094"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:9192,2@127.0.0.1:9194,3@127.0.0.1:9196"
    assert props["default.replication.factor"] == props["offsets.topic.replication.factor"] == "3"
    assert props["min.insync.replicas"] == props["transaction.state.log.min.isr"] == "2"
    assert props["unclean.leader.election.enable"] == "false"
    assert props["log.retention.ms"] == "1000"


def test_a_cluster_id_is_16_random_bytes_in_base64url():
    ids = {random_cluster_id() for _ in range(200)}
    assert len(ids) == 200
    for cid in ids:
        assert len(cid) == 22 and not cid.startswith("-")
        assert len(base64.urlsafe_b64decode(cid + "==")) == 16


def test_the_embedded_brokers_clients_get_its_tuning_and_kafkas_the_defaults():
    from modpipe.services.broker import EMBEDDED_BROKER_TUNING, tuned_for
    from modpipe.settings import Settings

    defaults = Settings.from_env({})
    assert tuned_for(defaults, "kafka") is defaults
    assert (defaults.fetch_pause_ms, defaults.fetch_idle_pause_ms, defaults.group_rejoin_s) == (0, 0, 0)
    assert (defaults.freeze_guard, defaults.abort_on_brokers_down) == ("off", "off")
    embedded = tuned_for(defaults, "embedded")
    assert {k: getattr(embedded, k) for k in EMBEDDED_BROKER_TUNING} == EMBEDDED_BROKER_TUNING
    # a value set by hand is kept
    mine = tuned_for(Settings.from_env({"MODPIPE_FETCH_PAUSE_MS": "5"}), "embedded")
    assert mine.fetch_pause_ms == 5 and mine.freeze_guard == "on"


def test_benchmarks_take_one_or_both_brokers():
    from modpipe.loadgen.cli import broker_kinds

    from modpipe.settings import Settings

    assert broker_kinds(Settings.from_env({}), None) == ["kafka"]
    assert broker_kinds(Settings.from_env({"MODPIPE_BROKER": "embedded"}), None) == ["embedded"]
    assert broker_kinds(Settings.from_env({}), "kafka,embedded") == ["kafka", "embedded"]
    assert broker_kinds(Settings.from_env({"KAFKA_BOOTSTRAP_SERVERS": "k:9092"}), "kafka,embedded") == ["external"]
    with pytest.raises(SystemExit):
        broker_kinds(Settings.from_env({}), "redpanda")
