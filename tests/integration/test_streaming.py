"""The streaming path on the real broker and the real Triton, with workers as real processes."""

from __future__ import annotations

import random
import shutil
import subprocess
import time
import urllib.request

import jsonschema
import orjson
import pytest
from confluent_kafka import Producer
from modpipe.loadgen.posts import make_post
from modpipe.loadgen.smoke import end_consumer, run_smoke
from modpipe.streams.moderation.topics import TopicConfigError, TopicNames, ensure_topics

from modpipe import schema
from tests.fixtures.kafka import supervised

pytestmark = pytest.mark.integration


def produce_posts(settings, n: int, run_id: str, texts) -> dict[str, dict]:
    rng = random.Random(3)
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers, "linger.ms": 5})
    posts = {}
    for i in range(n):
        item = texts[i % len(texts)]
        post = make_post(rng, f"{run_id}-{i}", item["text"], user_id=f"user-{i % 37}")
        posts[post["post_id"]] = post
        producer.produce(settings.topic("posts"), key=post["user_id"].encode(), value=schema.dumps(post))
    assert producer.flush(30) == 0
    return posts


def collect_decisions(consumer, wanted: set[str], timeout_s: float, healthy=lambda: True) -> dict[str, list]:
    got: dict[str, list] = {}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not wanted <= got.keys():
        msg = consumer.poll(0.2)
        if msg is None or msg.error():
            continue
        record = orjson.loads(msg.value())
        if record.get("post_id") in wanted:
            got.setdefault(record["post_id"], []).append((msg, record))
    return got


def test_every_valid_post_gets_exactly_one_correct_decision(local_stack, pipeline_settings, model_build):
    stack = local_stack(workers=1)
    consumer = end_consumer(pipeline_settings, stack.bootstrap, [stack.topics.decisions])
    posts = produce_posts(pipeline_settings, 150, "exact", model_build.heldout())
    got = collect_decisions(consumer, set(posts), 120)
    consumer.close()
    assert set(got) == set(posts), f"{len(set(posts) - set(got))} posts without a decision"
    validate = jsonschema.Draft202012Validator(schema.json_schema("decision")).validate
    for post_id, decisions in got.items():
        assert len(decisions) == 1, f"{post_id} decided {len(decisions)} times"
        msg, d = decisions[0]
        validate(d)
        assert msg.key() == post_id.encode()
        assert d["user_id"] == posts[post_id]["user_id"]
        p = d["spam_probability"]
        expected = "block" if p >= pipeline_settings.block_threshold else (
            "review" if p >= pipeline_settings.review_threshold else "allow")
        assert d["verdict"] == expected
        assert 0 <= d["text_probability"] <= 1
        assert d["model_versions"]["text_model"] == model_build.version
        assert d["model_versions"]["decider"].startswith("lgbm-")  # the LightGBM engine decides by default
        assert d["features"]["text_probability"] == pytest.approx(d["text_probability"])
        reasons = d["reasons"]
        if d["verdict"] == "allow":  # MODPIPE_REASONS=flagged, the default: only what moderators read is explained
            assert reasons == []
        else:
            if reasons and reasons[0]["contribution"] is None:  # the text floor decided (docs/decision-engine.md)
                assert reasons[0]["feature"] == "text_probability" and d["verdict"] == "review"
                reasons = reasons[1:]
            sizes = [abs(r["contribution"]) for r in reasons]
            assert sizes and sizes == sorted(sizes, reverse=True) and all(r["description"] for r in d["reasons"])
        assert d["revision"] == 1 and d["short_circuit"] is None and 0 <= d["latency_ms"] < 120_000
    metrics = stack.scrape()
    assert metrics["modpipe_posts_consumed_total"] >= 150
    assert sum(v for k, v in metrics.items() if k.startswith("modpipe_decisions_total")) >= 150
    assert metrics["modpipe_batch_size_posts_count"] >= 1
    assert metrics["modpipe_batch_size_posts_sum"] / metrics["modpipe_batch_size_posts_count"] > 1, \
        "posts were not batched"
    assert metrics["modpipe_triton_request_duration_seconds_count"] >= 1
    # Prometheus's own linter on what a worker really serves (naming, units, help, types).
    exposition = urllib.request.urlopen(stack.workers[0].metrics_url, timeout=5).read()
    lint = subprocess.run([shutil.which("promtool") or "promtool", "check", "metrics"], input=exposition,
                          capture_output=True, timeout=60)
    assert lint.returncode == 0, (lint.stdout + lint.stderr).decode()


def test_smoke_malformed_records_land_in_dead_letters_and_worker_keeps_running(local_stack, pipeline_settings):
    stack = local_stack(workers=1)
    first = run_smoke(pipeline_settings, stack.bootstrap, 60, timeout_s=120, progress=False)
    assert first["lost"] == 0 and first["duplicates"] == 0
    assert first["dlq"] == first["dlq_expected"] == 8 and first["dlq_reasons_match"]
    # The bad input did not stop anything: a second round is decided by the same worker.
    second = run_smoke(pipeline_settings, stack.bootstrap, 30, timeout_s=120, progress=False)
    assert second["lost"] == 0 and all(w.process.alive() for w in stack.workers)
    reasons = {k for k, v in stack.scrape().items() if k.startswith("modpipe_dead_letters_total{") and v > 0}
    assert len(reasons) == 8


def test_two_workers_split_partitions_and_decide_everything(local_stack, pipeline_settings):
    stack = local_stack(workers=2)
    posts_key = f"modpipe_assigned_partitions{{topic={pipeline_settings.topic('posts')}}}"
    with supervised(stack) as restarts:
        deadline = time.monotonic() + 90
        while True:  # the group may still be settling its last rebalance
            per_worker = [stack.scrape_worker(w).get(posts_key, 0) for w in stack.workers]
            split = all(n >= 1 for n in per_worker) and sum(per_worker) == pipeline_settings.partitions
            if split or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert split, (per_worker, restarts)
        result = run_smoke(pipeline_settings, stack.bootstrap, 200, timeout_s=120, progress=False)
    assert result["lost"] == 0 and result["duplicates"] == 0, \
        (result["lost"], result["duplicates"], restarts)


def last_assignment(worker) -> dict[str, list[int]] | None:
    """topic -> partitions of a worker's last assignment, from its log ("partitions assigned")."""
    for line in reversed(worker.process.log_path.read_text(errors="replace").splitlines()):
        if line.startswith("{") and '"partitions assigned"' in line:
            record = orjson.loads(line)
            if record["msg"] == "partitions assigned":
                return record["topic_partitions"]
    return None


def test_three_workers_are_co_partitioned_under_the_classic_protocol(local_stack, pipeline_settings):
    """The group protocol is `classic` with range assignment (streams/moderation/app.py): each worker is given the same
    partition numbers of every input topic (posts, the stages, reports, ...), so a stage's tables live with the
    partitions that feed them, and the workers' numbers split the partitions between them."""
    stack = local_stack(workers=3)
    inputs = stack.topics.inputs()
    wanted = len(inputs) * pipeline_settings.partitions

    def settled():
        if stack.assigned_partitions() != wanted:
            return None
        got = [last_assignment(w) for w in stack.workers]
        return got if all(g is not None for g in got) and sum(len(p) for g in got for p in g.values()) == wanted \
            else None

    deadline = time.monotonic() + 90
    assignments = settled()
    while assignments is None and time.monotonic() < deadline:
        time.sleep(1)
        assignments = settled()
    assert assignments is not None, [last_assignment(w) for w in stack.workers]
    numbers = []
    for topics in assignments:
        if not topics:
            continue
        assert set(topics) == set(inputs), topics  # a worker with partitions has them in every input topic
        same = {tuple(p) for p in topics.values()}
        assert len(same) == 1, topics  # ... with the same numbers in each
        numbers.append(same.pop())
    flat = sorted(p for ns in numbers for p in ns)
    assert flat == list(range(pipeline_settings.partitions)), assignments  # split, each partition once


def test_worker_killed_mid_stream_loses_nothing(local_stack, pipeline_settings, model_build):
    """SIGKILL mid-stream: the restarted worker (same transactional.id) aborts what its predecessor left open
    and processes again from the committed offsets; a read_committed reader sees each post decided once."""
    stack = local_stack(workers=1)
    consumer = end_consumer(pipeline_settings, stack.bootstrap, [stack.topics.decisions])
    # posts keep arriving while the worker runs, so the kill lands mid-stream however fast it is
    texts = model_build.heldout()
    posts = produce_posts(pipeline_settings, 300, "kill-a", texts)
    early: dict[str, list] = {}
    deadline = time.monotonic() + 120
    while len(early) < 50 and time.monotonic() < deadline:
        early.update(collect_decisions(consumer, set(posts) - early.keys(), 0.2))
    assert early, "no decision before the kill"
    posts.update(produce_posts(pipeline_settings, 500, "kill-b", texts))
    stack.workers[0].process.kill()  # SIGKILL: no chance to commit or flush
    killed_at = len(early)
    assert killed_at < len(posts), "the worker finished before it could be killed; send more posts"
    stack.start_worker(0)
    rest = collect_decisions(consumer, set(posts) - early.keys(), 300)
    # whatever the restarted worker decided again would arrive now: read a little longer
    again = collect_decisions(consumer, set(posts), 3)
    consumer.close()
    decided = set(early) | set(rest)
    assert decided == set(posts), f"lost {len(set(posts) - decided)} posts after SIGKILL at {killed_at} decisions"
    seen: dict[tuple, int] = {}
    for got in (early, rest, again):
        for post_id, decisions in got.items():
            for _, d in decisions:
                seen[post_id, d["revision"]] = seen.get((post_id, d["revision"]), 0) + 1
    twice = {k: n for k, n in seen.items() if n > 1}
    assert not twice, f"{len(twice)} decisions seen more than once by a read_committed reader, e.g. {list(twice)[:3]}"


def test_independent_client_kcat_round_trip(local_stack, pipeline_settings):
    kcat = shutil.which("kcat") or shutil.which("kafkacat")
    assert kcat, "kcat is not installed; `make setup` installs it (apt package kcat)"
    stack = local_stack(workers=1)
    post = make_post(random.Random(9), "kcat-post-1", "WINNER!! Claim your free prize now, call 0800 123 456")
    subprocess.run([kcat, "-P", "-b", stack.bootstrap, "-t", stack.topics.posts, "-k", post["user_id"]],
                   input=schema.dumps(post), check=True, timeout=30)
    deadline = time.monotonic() + 60
    found = None
    while found is None and time.monotonic() < deadline:
        out = subprocess.run([kcat, "-C", "-b", stack.bootstrap, "-t", stack.topics.decisions, "-o", "beginning",
                              "-e", "-q", "-f", "%k\t%s\n"], capture_output=True, timeout=30, check=True).stdout
        for line in out.decode().splitlines():
            key, _, value = line.partition("\t")
            if key == "kcat-post-1":
                found = orjson.loads(value)
        time.sleep(0.5)
    assert found is not None, "kcat never saw the decision"
    assert found["verdict"] in schema.VERDICTS and found["user_id"] == post["user_id"]


def test_topics_are_idempotent_and_refuse_wrong_partition_count(pipeline_settings, bootstrap):
    created = ensure_topics(pipeline_settings, bootstrap)
    assert sorted(created) == sorted(TopicNames.from_settings(pipeline_settings).all())
    assert ensure_topics(pipeline_settings, bootstrap) == []
    wrong = pipeline_settings.__class__(**{**pipeline_settings.__dict__, "partitions": 3})
    with pytest.raises(TopicConfigError, match="wrong partition count"):
        ensure_topics(wrong, bootstrap)


def test_a_worker_asked_for_its_stacks_writes_them_and_keeps_deciding(local_stack, pipeline_settings):
    """`kill -USR1` on a running worker (docs/operations.md): its log gets every thread's stack (the group
    consumer's poll thread among them) and its asyncio tasks' awaits (the runner's rounds and checkpoints),
    and the worker goes on deciding."""
    from modpipe import log

    stack = local_stack(workers=1)
    worker = stack.workers[0].process
    before = worker.log_path.read_text(errors="replace")
    worker.signal(log.STACK_DUMP_SIGNAL)
    deadline = time.monotonic() + 20
    tasks = None
    while time.monotonic() < deadline and tasks is None:
        time.sleep(0.2)
        for line in worker.log_path.read_text(errors="replace")[len(before):].splitlines():
            if line.startswith("{") and orjson.loads(line)["msg"] == "stack dump: asyncio tasks":
                tasks = {t["task"]: t["awaiting"] for t in orjson.loads(line)["tasks"]}
    dump = worker.log_path.read_text(errors="replace")[len(before):]
    # what the worker was doing when no task dump came: stopping (a USR1 after its loop closed dumps threads
    # only), dead, or with its loop blocked (the thread dump's main thread shows where)
    assert tasks is not None, {"alive": worker.alive(), "stopping": '"worker stopping"' in dump,
                               "thread_dumps": dump.count("most recent call first"), "log": dump[-3000:]}
    assert {"rounds", "checkpoints"} <= tasks.keys(), tasks
    assert any("streams/runtime/runner.py" in frame for frame in tasks["rounds"]), tasks["rounds"]
    assert "most recent call first" in dump and "streams/kafka/consumer.py" in dump, dump[-3000:]
    assert worker.alive()
    result = run_smoke(pipeline_settings, stack.bootstrap, 50, timeout_s=120, progress=False)
    assert result["lost"] == 0 and result["duplicates"] == 0
