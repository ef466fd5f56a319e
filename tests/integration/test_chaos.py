"""Faults (issue #14): `modpipe chaos` on a small scale. It runs a local stack of its own (the session's broker
is shared by other tests and must not be killed): three Apache Kafka nodes (replication 3,
min.insync.replicas 2), whose leader of the `posts` partitions and a worker's transaction coordinator are
SIGKILLed mid-stream beside two workers and Triton; a post the traffic producer writes twice (librdkafka's
idempotent producer re-sends its in-flight records after an epoch bump) is decided once."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from modpipe.settings import Settings
from tests.fixtures.waiting import wait_for

pytestmark = pytest.mark.integration


EMBEDDED = Settings.from_env().broker == "embedded"


def test_chaos_kills_workers_triton_and_brokers_and_nothing_is_lost_or_counted_twice(settings_env, model_build):
    env = {**settings_env, "MODPIPE_MODEL_DIR": str(model_build.path), "MODPIPE_LOG_FORMAT": "json"}
    env.pop("KAFKA_BOOTSTRAP_SERVERS", None)
    env.pop("TRITON_URL", None)
    # Apache Kafka: three nodes, replication 3, the node leading the most `posts` partitions and a worker's
    # transaction coordinator SIGKILLed
    brokers = ["--broker-restarts", "1"] if EMBEDDED else ["--brokers", "3", "--broker-restarts", "0",
                                                          "--leader-kills", "1", "--txn-coordinator-kills", "1"]
    proc = subprocess.run([sys.executable, "-m", "modpipe", "chaos", "--posts", "500", "--rate", "20", "--workers", "2",
                           "--worker-kills", "2", "--triton-kills", "1", *brokers, "--seed", "1",
                           "--timeout", "240", "--json"], env=env, capture_output=True, text=True, timeout=600)
    assert proc.stdout.strip(), proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    detail = json.dumps({k: report.get(k) for k in ("decisions", "features", "faults", "restarts", "lag_after",
                                                    "waited_for_open_transactions", "waited_for_group_lag",
                                                    "held_back_by_open_transactions",
                                                    "timing")})[:6000]
    faults = [f for f in report["faults"] if "target" in f]
    broker_kinds = ["broker"] if EMBEDDED else ["leader", "txn-coordinator"]
    assert sorted(f["kind"] for f in faults) == sorted([*broker_kinds, "triton", "worker", "worker"]), detail
    assert all(f["killed"] for f in faults), detail  # each fault hit a live process
    node_restarts = sum(n for name, n in report["restarts"].items() if name == "broker" or name.startswith("kafka-"))
    assert node_restarts >= len(broker_kinds) and report["restarts"].get("triton", 0) >= 1, detail
    assert sum(n for name, n in report["restarts"].items() if name.startswith("worker")) >= 2, detail
    d = report["decisions"]
    assert d["sent"] >= 450 and d["lost"] == 0, detail  # every post the broker holds was decided
    # Exactly once, as a read_committed reader (the platform) sees the decisions: no post_id and revision twice,
    # so no verdict changed by a replay either. What the killed workers had not committed was aborted: an
    # at-least-once reader would have seen it (a figure, not a target: it depends on where the kills land).
    assert d["duplicate_decisions"] == 0 and d["duplicates_with_another_verdict"] == 0, detail
    assert d["aborted_decisions"] >= 0 and d["at_least_once_duplicates"] >= 0, detail
    assert d["degraded_not_redecided"] == 0, detail
    f = report["features"]
    assert f["equal"], detail
    assert f["tables"]["post"]["keys"] == d["sent"] and f["tables"]["user"]["keys"] > 20, detail
    assert report["lag_after"] == 0, detail  # every input record the broker holds committed by the group
    assert report["ok"] and proc.returncode == 0, detail


def test_a_transaction_left_open_is_reported_as_holding_readers_back(bootstrap, tmp_path):
    """What a chaos run that did not settle reports (`held_back_by_open_transactions`): a partition whose
    last stable offset a transaction still open holds behind its high watermark, and nothing once it ends."""
    import uuid

    from confluent_kafka import Producer
    from modpipe.loadgen.chaos import held_back

    from modpipe.settings import Settings
    from tests.fixtures.kafka import create_topics

    settings = Settings.from_env(state_dir=tmp_path, bootstrap_servers=bootstrap)
    topic = f"held-back-{uuid.uuid4().hex[:8]}"
    create_topics(bootstrap, [topic], partitions=settings.partitions)
    plain = Producer({"bootstrap.servers": bootstrap})
    plain.produce(topic, b"committed", partition=0)
    assert plain.flush(30) == 0
    txn = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"held-back-{uuid.uuid4().hex[:8]}"})
    txn.init_transactions(30)
    txn.begin_transaction()
    for value in (b"open-1", b"open-2"):
        txn.produce(topic, value, partition=1)
    assert txn.flush(30) == 0
    assert held_back(settings, bootstrap, [topic]) == {f"{topic}:1": [0, 2]}
    txn.commit_transaction(30)
    # commit_transaction returns once the coordinator has the commit; the markers reach the partition's leader
    # after that (WriteTxnMarkers), and only then does the last stable offset move
    wait_for(lambda: held_back(settings, bootstrap, [topic]) == {}, 30, "no partition held back after the commit",
             interval=0.1)
