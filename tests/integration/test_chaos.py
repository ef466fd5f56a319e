"""Faults (issue #14): `modpipe chaos` on a small scale, and a worker whose broker lost acknowledged writes.

Both run their own embedded broker (the session's is shared by other tests and must not be restarted)."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import time

import orjson
import pytest
from confluent_kafka import Producer

from loadgen.chaos import (
    compare_tables,
    count_decisions,
    input_events,
    offline_tables,
    streaming_tables,
    watermarks,
)
from loadgen.posts import make_post
from modpipe import schema
from modpipe.services.process import free_port
from modpipe.services.readback import read_to_end
from streams.stack import LocalStack

pytestmark = pytest.mark.integration


def test_chaos_kills_workers_triton_and_the_broker_and_nothing_is_lost_or_counted_twice(settings_env, model_build):
    env = {**settings_env, "MODPIPE_MODEL_DIR": str(model_build.path), "MODPIPE_LOG_FORMAT": "json"}
    env.pop("KAFKA_BOOTSTRAP_SERVERS", None)
    env.pop("TRITON_URL", None)
    proc = subprocess.run([sys.executable, "-m", "modpipe", "chaos", "--posts", "500", "--rate", "20", "--workers", "2",
                           "--worker-kills", "2", "--triton-kills", "1", "--broker-restarts", "1", "--seed", "1",
                           "--timeout", "240", "--json"], env=env, capture_output=True, text=True, timeout=600)
    assert proc.stdout.strip(), proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    detail = json.dumps({k: report.get(k) for k in ("decisions", "features", "faults", "restarts")})[:4000]
    faults = [f for f in report["faults"] if "target" in f]
    assert sorted(f["kind"] for f in faults) == ["broker", "triton", "worker", "worker"], detail
    assert all(f["killed"] for f in faults), detail  # each fault hit a live process
    assert report["restarts"].get("broker", 0) >= 1 and report["restarts"].get("triton", 0) >= 1, detail
    assert sum(n for name, n in report["restarts"].items() if name.startswith("worker")) >= 2, detail
    d = report["decisions"]
    assert d["sent"] >= 450 and d["lost"] == 0, detail  # every post the broker holds was decided
    assert d["degraded_not_redecided"] == 0, detail
    f = report["features"]
    assert f["equal"], detail
    assert f["tables"]["post"]["keys"] == d["sent"] and f["tables"]["user"]["keys"] > 20, detail
    assert report["ok"] and proc.returncode == 0, detail


def produce(bootstrap: str, topic: str, posts: list[dict]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for post in posts:
        producer.produce(topic, key=post["user_id"].encode(), value=schema.dumps(post))
    assert producer.flush(30) == 0


def posts_round(name: str, n: int) -> list[dict]:
    import random

    rng = random.Random(name)
    return [make_post(rng, f"{name}-{i}", f"hello number {i} from round {name}", user_id=f"user-{i % 7}")
            for i in range(n)]


def wait_settled(stack: LocalStack, settings, wanted: set[str], timeout: float = 120.0, quiet_s: float = 4.0) -> None:
    """Every wanted post decided and nothing written to any topic for quiet_s."""
    deadline = time.monotonic() + timeout
    last, since = None, time.monotonic()
    topics = [*stack.topics.stages.values(), stack.topics.decisions]
    while time.monotonic() < deadline:
        mark = watermarks(settings, stack.bootstrap, topics)
        if mark != last:
            last, since = mark, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            decided = {orjson.loads(m.value())["post_id"]
                       for m in read_to_end(settings, stack.bootstrap, [stack.topics.decisions])}
            if wanted <= decided:
                return
        assert all(w.process.alive() for w in stack.workers), stack.workers[0].process.tail(40)
        time.sleep(0.5)
    raise AssertionError(f"not settled in {timeout} s")


def test_worker_rebuilds_tables_that_are_ahead_of_a_broker_which_lost_writes(pipeline_settings, model_build):
    """The broker comes back from an older copy of its data (what noida-db does after a SIGKILL, and Apache
    Kafka after an unclean leader election): the worker's RocksDB tables hold updates the changelog lost.
    Without the check faust refuses to start (ConsistencyError) at every restart; with it the stores ahead
    are discarded and rebuilt, the lost posts are sent again, and every table equals features.offline."""
    settings = dataclasses.replace(pipeline_settings, bootstrap_servers="", broker_port=free_port(),
                                   table_store="rocksdb", text_model="off")
    stack = LocalStack(settings, workers=1)
    try:
        stack.start()
        first, second = posts_round("a", 40), posts_round("b", 40)
        produce(stack.bootstrap, stack.topics.posts, first)
        wait_settled(stack, settings, {p["post_id"] for p in first})
        stack.workers[0].process.stop()
        stack.broker.stop()  # a clean stop: its data file is complete
        snapshot = stack.broker.data_dir.parent / "broker-snapshot"
        shutil.copytree(stack.broker.data_dir, snapshot)
        stack.broker.start()
        stack.start_worker(0)
        stack.wait_workers_ready()
        produce(stack.bootstrap, stack.topics.posts, second)
        wait_settled(stack, settings, {p["post_id"] for p in first + second})
        stack.workers[0].process.stop()
        stack.broker.stop()
        shutil.rmtree(stack.broker.data_dir)
        shutil.copytree(snapshot, stack.broker.data_dir)  # the broker forgets the second round
        stack.broker.start()

        stack.start_worker(0)
        stack.wait_workers_ready()  # failed before: ConsistencyError, the worker exited at every start
        log = (settings.state_dir / "logs" / "worker-0.log").read_text()
        assert "ahead of its changelog" in log
        produce(stack.bootstrap, stack.topics.posts, second)  # the platform sends what the broker lost
        wait_settled(stack, settings, {p["post_id"] for p in first + second})
        stack.workers[0].process.stop()
        inputs = {"post": stack.topics.posts}
        held = input_events(settings, stack.bootstrap, inputs)
        decisions = [orjson.loads(m.value()) for m in read_to_end(settings, stack.bootstrap, [stack.topics.decisions])]
        assert count_decisions(decisions, {p["post_id"] for _, p in held})["lost"] == 0
        report = compare_tables(streaming_tables(settings, stack.bootstrap),
                                offline_tables(held, decisions, {p["post_id"]: p for _, p in held}))
        assert report["equal"], report
        assert report["tables"]["user"]["keys"] == 7 and report["tables"]["post"]["keys"] == 80
    finally:
        stack.stop()
