"""A worker says it is ready only once it has read the ban log to its end and warmed its paths, and a post
that was waiting before it started is decided with every ban written before it (real broker, Triton, worker)."""

from __future__ import annotations

import json
import random
import time
import urllib.request

import orjson
import pytest
from confluent_kafka import Producer
from modpipe.loadgen.posts import make_post
from modpipe.loadgen.smoke import end_consumer
from modpipe.streams.moderation.topics import ensure_topics

from modpipe import schema

pytestmark = pytest.mark.integration

BANS = 3000


def _ban(i: int, domain: str) -> bytes:
    return schema.dumps({"schema_version": 1, "ban_id": f"b-{i}", "kind": "domain", "value": domain,
                         "action": "ban", "created_at": schema.rfc3339(schema.now_ms())})


def test_no_post_is_decided_before_the_ban_log_is_read(local_stack, pipeline_settings):
    s = pipeline_settings
    ensure_topics(s, s.bootstrap_servers)
    # The platform's ban writer is transactional: the log ends with a commit marker, not a record.
    producer = Producer({"bootstrap.servers": s.bootstrap_servers, "transactional.id": f"bans-{s.app_id}"})
    producer.init_transactions(10)
    producer.begin_transaction()
    for i in range(BANS):
        domain = f"filler-{i}.test" if i < BANS - 1 else "banned-before-start.test"
        producer.produce(s.topic("bans"), key=domain.encode(), value=_ban(i, domain))
    post = make_post(random.Random(7), "ready-1", "see you at the station at six", user_id="ready-user")
    post["url"] = "https://login.banned-before-start.test/p/1"
    post.pop("url_reputation", None)
    producer.produce(s.topic("posts"), key=post["user_id"].encode(), value=schema.dumps(post))
    producer.commit_transaction(30)
    decisions = end_consumer(s, s.bootstrap_servers, [s.topic("decisions")])

    stack = local_stack(workers=1)  # returns once every worker's /readyz passes
    port = stack.workers[0].metrics_port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp:
        ready = json.loads(resp.read())
    assert ready == {"ok": True, "checks": {"ban_log_reader": True, "consumer": True, "ban_log_read": True, "text_model_warm": True,
                                            "partitions_assigned": True}}
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/livez", timeout=5) as resp:
        assert resp.status == 200
    scraped = stack.scrape()
    assert scraped["modpipe_ban_log_caught_up"] == 1 and scraped["modpipe_worker_ready"] == 1
    assert scraped["modpipe_ban_events_applied_total"] >= BANS

    deadline, got = time.monotonic() + 90, []
    while time.monotonic() < deadline and not got:
        msg = decisions.poll(0.2)
        if msg is not None and not msg.error():
            record = orjson.loads(msg.value())
            if record["post_id"] == post["post_id"]:
                got.append(record)
    decisions.close()
    assert got, "the post was never decided"
    assert got[0]["verdict"] == "block" and got[0]["short_circuit"] == "domain_banned", got[0]
