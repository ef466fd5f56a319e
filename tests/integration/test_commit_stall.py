"""Commit stalls (issue #24): an input partition whose committed offset has no record to fetch, on the real
broker and worker.

A platform that produces posts transactionally leaves a commit marker after each transaction: the worker
processes records 0..k-1 and commits k, the marker, which no consumer is ever given. After a restart the
consumer starts at k and is given k+1 first. Retention or DeleteRecords can likewise remove the records at and
after the committed offset while no worker runs: the consumer is then reset to the log start, above it. In both
cases processing must go on, the commits must pass the offsets that have no record, and nothing may be decided
twice (faust's commits stalled there and its rewinds published the partition's decisions again and again)."""

from __future__ import annotations

import random
import time
import uuid
from collections import Counter

import orjson
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from modpipe.loadgen.chaos import count_decisions, read_all
from modpipe.loadgen.posts import make_post

from modpipe import schema
from modpipe.services.group_lag import uncommitted_input
from tests.fixtures.waiting import wait_for

pytestmark = pytest.mark.integration

QUIET_AFTER_S = 5.0  # after the last decision: long enough for a stalled partition to be read again


def posts_round(name: str, n: int) -> list[dict]:
    rng = random.Random(name)
    return [make_post(rng, f"{name}-{i}", f"hello number {i} from round {name}", user_id=f"user-{i % 11}")
            for i in range(n)]


def produce_transactionally(bootstrap: str, topic: str, posts: list[dict], transactions: int = 2) -> None:
    """What a platform that writes its posts in transactions does: each commit leaves a marker in every
    partition the transaction wrote to."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"platform-{uuid.uuid4().hex[:8]}"})
    producer.init_transactions(30)
    size = -(-len(posts) // transactions)
    for start in range(0, len(posts), size):
        producer.begin_transaction()
        for post in posts[start:start + size]:
            producer.produce(topic, key=post["user_id"].encode(), value=schema.dumps(post))
        producer.commit_transaction(30)
    assert producer.flush(30) == 0


def produce_plainly(bootstrap: str, topic: str, posts: list[dict], **where) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    for post in posts:
        producer.produce(topic, key=post["user_id"].encode(), value=schema.dumps(post), **where)
    assert producer.flush(30) == 0


def decisions(settings, bootstrap: str, topic: str) -> list[dict]:
    """Every decision a read_committed reader gets from the topic."""
    return [orjson.loads(m.value()) for m in read_all(settings, bootstrap, [topic])]


def offsets(settings, bootstrap: str, topic: str) -> dict[int, tuple[int, int, int]]:
    """partition -> (the group's committed offset, log start, end offset) of `topic`."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": settings.app_id, "enable.auto.commit": False,
                         "isolation.level": "read_uncommitted"})  # the end offset, past the last marker
    try:
        tps = [TopicPartition(topic, p) for p in range(settings.partitions)]
        out = {}
        for tp in consumer.committed(tps, timeout=10):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, tp.partition), timeout=10)
            out[tp.partition] = (tp.offset, low, high)
        return out
    finally:
        consumer.close()


def wait_decided(stack, settings, wanted: set[str], timeout: float = 60.0) -> None:
    def done() -> bool:
        assert all(w.process.alive() for w in stack.workers), stack.workers[0].process.tail(40)
        return wanted <= {d["post_id"] for d in decisions(settings, stack.bootstrap, stack.topics.decisions)}
    wait_for(done, timeout, f"every one of {len(wanted)} posts decided", interval=1.0)


def settle_and_check(stack, settings, sent: set[str], marker_last: bool) -> dict:
    """Every post decided once (read_committed), and the posts partitions committed to their end: nothing a
    read_committed reader would still get past the committed offsets, which are the end offsets, or one short
    of them when the partition ends with a transaction's commit marker (`marker_last`). Checked again after
    QUIET_AFTER_S, time for a stalled partition to be read and decided again."""
    wait_decided(stack, settings, sent)
    posts = stack.topics.posts
    wait_for(lambda: uncommitted_input(settings, stack.bootstrap, [posts]) == 0, 30,
             "the posts partitions committed to their end", interval=1.0)
    time.sleep(QUIET_AFTER_S)
    marks = offsets(settings, stack.bootstrap, posts)
    uncommitted = uncommitted_input(settings, stack.bootstrap, [posts])
    made = decisions(settings, stack.bootstrap, stack.topics.decisions)
    counts = count_decisions(made, sent)
    partition_of = {orjson.loads(m.value())["post_id"]: m.partition() for m in read_all(settings, stack.bootstrap, [posts])}
    per_key = Counter((d["post_id"], d.get("revision")) for d in made)
    duplicated = Counter(partition_of.get(pid) for (pid, _), n in per_key.items() for _ in range(n - 1))
    log = (settings.state_dir / "logs" / "worker-0.log").read_text(errors="replace")
    report = {"decided": counts["decided"], "sent": counts["sent"], "lost": counts["lost"],
              "duplicate_decisions": counts["duplicate_decisions"],
              "posts_with_duplicates": counts["posts_with_duplicates"],
              "duplicates per posts partition": dict(duplicated), "uncommitted posts records": uncommitted,
              "posts partition: (committed, log start, end)": marks,
              "consumer warnings": log.count('"msg":"consumer error"'), "worker failures": log.count('"failed":true')}
    print("commit-stall report:", report)
    assert counts["lost"] == 0 and counts["unexpected"] == 0, report
    assert counts["duplicate_decisions"] == 0, report
    assert uncommitted == 0, report
    slack = 1 if marker_last else 0
    assert all(high - slack <= committed <= high for committed, _, high in marks.values() if high > 0), report
    assert report["worker failures"] == 0, report
    return report


def test_transaction_markers_do_not_stall_the_commits(local_stack, pipeline_settings):
    settings = pipeline_settings
    stack = local_stack(workers=1, modpipe_text_model="off")
    first, second = posts_round("txn-a", 40), posts_round("txn-b", 40)
    produce_transactionally(stack.bootstrap, stack.topics.posts, first)
    wait_decided(stack, settings, {p["post_id"] for p in first})
    stack.workers[0].process.stop()  # commits what it processed
    # what this test is about: committed offsets that point at a commit marker (the last offset of the log)
    marks = offsets(settings, stack.bootstrap, stack.topics.posts)
    at_marker = [p for p, (committed, _, high) in marks.items() if high > 0 and committed == high - 1]
    assert at_marker, marks
    stack.start_worker(0)
    stack.wait_workers_ready()
    produce_transactionally(stack.bootstrap, stack.topics.posts, second)
    settle_and_check(stack, settings, {p["post_id"] for p in first + second}, marker_last=True)


def test_records_deleted_past_the_committed_offset_do_not_stall_the_commits(local_stack, pipeline_settings):
    settings = pipeline_settings
    stack = local_stack(workers=1, modpipe_text_model="off")
    first, gone, third = posts_round("del-a", 40), posts_round("del-b", 6), posts_round("del-c", 40)
    produce_plainly(stack.bootstrap, stack.topics.posts, first)
    wait_decided(stack, settings, {p["post_id"] for p in first})
    stack.workers[0].process.stop()  # commits what it processed
    # while no worker runs, records after the committed offset of partition 0 are removed (DeleteRecords,
    # what retention does to old segments): the log now starts above the group's committed offset
    produce_plainly(stack.bootstrap, stack.topics.posts, gone, partition=0)
    (committed, _, high), = [m for p, m in offsets(settings, stack.bootstrap, stack.topics.posts).items() if p == 0]
    assert 0 < committed == high - len(gone), (committed, high)
    admin = AdminClient({"bootstrap.servers": stack.bootstrap})
    for future in admin.delete_records([TopicPartition(stack.topics.posts, 0, high)], request_timeout=30).values():
        assert future.result().low_watermark == high
    stack.start_worker(0)
    stack.wait_workers_ready()
    produce_plainly(stack.bootstrap, stack.topics.posts, third)
    report = settle_and_check(stack, settings, {p["post_id"] for p in first + third}, marker_last=False)
    assert report["posts partition: (committed, log start, end)"][0][1] == high  # the deleted records stay gone
