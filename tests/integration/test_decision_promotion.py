"""A promoted decision model is served by a running worker within seconds, without a restart; a shadow model
is scored beside the serving one and never changes a verdict (issue #15)."""

from __future__ import annotations

import random
import shutil
import time

import numpy as np
import orjson
import pytest
from confluent_kafka import Producer
from modpipe.loadgen.posts import make_post
from modpipe.loadgen.smoke import end_consumer

from modpipe import schema
from modpipe.decision.model import DECISION_FEATURES, DecisionModel
from modpipe.decision.store import resolve_decision_model
from modpipe.settings import Settings

pytestmark = pytest.mark.integration


def always_spam_model(path):
    """A model with the serving feature list that calls everything spam (all its training rows are spam)."""
    import lightgbm as lgb

    rng = np.random.default_rng(0)
    x = rng.random((200, len(DECISION_FEATURES)))
    booster = lgb.train({"objective": "binary", "verbose": -1, "num_leaves": 4, "min_data_in_leaf": 5},
                        lgb.Dataset(x, label=np.ones(200), feature_name=list(DECISION_FEATURES)), num_boost_round=3)
    model = DecisionModel(booster, list(DECISION_FEATURES), DecisionModel.version_of(booster), {"note": "test"})
    return model.save(path), model.version


@pytest.fixture
def models(tmp_path, model_build):
    serving_a = tmp_path / "a"
    shutil.copytree(resolve_decision_model(Settings.from_env(), model_build.version), serving_a)
    b, b_version = always_spam_model(tmp_path / "b")
    link = tmp_path / "serving"
    link.symlink_to("a")
    return link, DecisionModel.load(serving_a).version, b, b_version


def ham_posts(model_build, prefix, n):
    rng = random.Random(prefix)
    hams = [t["text"] for t in model_build.heldout() if str(t["label"]) in ("0", "ham")][:n]
    return [make_post(rng, f"{prefix}-{i}", text, user_id=f"{prefix}-u{i}") for i, text in enumerate(hams)]


def decide(stack, settings, posts, timeout=120):
    consumer = end_consumer(settings, stack.bootstrap, [stack.topics.decisions])
    producer = Producer({"bootstrap.servers": stack.bootstrap})
    for post in posts:
        producer.produce(stack.topics.posts, key=post["user_id"].encode(), value=schema.dumps(post))
    assert producer.flush(30) == 0
    wanted, got = {p["post_id"] for p in posts}, {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not wanted <= got.keys():
        msg = consumer.poll(0.2)
        if msg is not None and not msg.error():
            d = orjson.loads(msg.value())
            if d["post_id"] in wanted:
                got[d["post_id"]] = d
    consumer.close()
    assert wanted <= got.keys(), f"{len(wanted - got.keys())} posts undecided"
    return got


def test_a_promoted_model_is_served_within_seconds_without_a_restart(local_stack, pipeline_settings, model_build,
                                                                     models):
    link, a_version, b, b_version = models
    stack = local_stack(workers=1, modpipe_decision_model=str(link), modpipe_decision_model_watch_s="0.5")
    pid = stack.workers[0].process.pid
    before = decide(stack, pipeline_settings, ham_posts(model_build, "before", 10))
    assert {d["model_versions"]["decider"] for d in before.values()} == {a_version}
    assert sum(d["verdict"] == "allow" for d in before.values()) >= 8  # held-out ham: the real model allows it

    tmp = link.parent / "serving.tmp"
    tmp.symlink_to(b.name)
    tmp.replace(link)  # the promotion: an atomic move of the pointer
    promoted_at = time.monotonic()
    time.sleep(1.5)
    after = decide(stack, pipeline_settings, ham_posts(model_build, "after", 10))
    assert {d["model_versions"]["decider"] for d in after.values()} == {b_version}
    assert {d["verdict"] for d in after.values()} == {"block"}  # the new model decides
    assert stack.workers[0].process.pid == pid and stack.workers[0].process.alive()  # no restart
    assert time.monotonic() - promoted_at < 60
    samples = stack.scrape()
    assert samples.get("modpipe_decision_model_reloads_total{result=loaded}") == 1


def test_a_shadow_model_never_changes_a_verdict(local_stack, pipeline_settings, model_build, models):
    link, a_version, b, b_version = models
    stack = local_stack(workers=1, modpipe_decision_model=str(link), modpipe_shadow_decision_model=str(b))
    decided = decide(stack, pipeline_settings, ham_posts(model_build, "shadowed", 10))
    assert {d["model_versions"]["decider"] for d in decided.values()} == {a_version}
    allowed = sum(d["verdict"] == "allow" for d in decided.values())
    assert allowed >= 8 and not any(d["verdict"] == "block" for d in decided.values())
    samples = stack.scrape()
    assert samples.get("modpipe_shadow_decisions_total") == 10
    assert samples.get("modpipe_shadow_disagreements_total{serving=allow,shadow=block}") == allowed
    log = (pipeline_settings.state_dir / "logs" / "worker-0.log").read_text()
    assert "shadow decision model disagrees" in log and "shadowed-" in log


def test_decision_train_labels_reads_the_topics_and_writes_a_candidate_only_if_not_worse(
        pipeline_settings, model_build, tmp_path, settings_env):
    """Moderators label a campaign the simulation never had (9,999-friend accounts with harmless texts) as
    spam; `decision train --labels` joins labels and decisions from the topics, trains, and writes the
    candidate because it beats the serving model on the newest labels."""
    import json
    import subprocess
    import sys

    from modpipe.decision.store import decision_root

    real_root = decision_root(Settings.from_env())
    cache = tmp_path / "cache"
    (cache / "decision").mkdir(parents=True)
    for cached in real_root.glob("text-probabilities.*.json"):  # the simulation's texts, scored once already
        shutil.copy(cached, cache / "decision" / cached.name)
    producer = Producer({"bootstrap.servers": pipeline_settings.bootstrap_servers})
    rng = random.Random(2)
    for i in range(400):
        if i % 2:
            features, spam = {"text_probability": rng.uniform(0.05, 0.3), "user_friends": 9_999}, True
        else:
            p = rng.random()
            features, spam = {"text_probability": p, "user_friends": rng.randint(0, 500)}, p > 0.5
        t = 1_795_400_000_000 + i * 1_000
        producer.produce(pipeline_settings.topic("decisions"), key=f"p{i}".encode(), value=orjson.dumps(
            {"post_id": f"p{i}", "user_id": f"u{i}", "verdict": "allow", "revision": 1,
             "decided_at": schema.rfc3339(t), "features": features}))
        producer.produce(pipeline_settings.topic("labels"), key=f"p{i}".encode(), value=schema.dumps(
            {"schema_version": 1, "post_id": f"p{i}", "user_id": f"u{i}", "label": "spam" if spam else "ham",
             "moderator_id": "m1", "created_at": schema.rfc3339(t + 500)}))
    assert producer.flush(30) == 0
    env = {**settings_env, "KAFKA_BOOTSTRAP_SERVERS": pipeline_settings.bootstrap_servers,
           "MODPIPE_TOPIC_PREFIX": pipeline_settings.topic_prefix, "MODPIPE_CACHE_DIR": str(cache),
           "MODPIPE_MODEL_DIR": str(model_build.path),
           "MODPIPE_DECISION_MODEL": str(resolve_decision_model(Settings.from_env(), model_build.version))}
    proc = subprocess.run([sys.executable, "-m", "modpipe", "decision", "train", "--labels", "--profile", "demo",
                           "--json"], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["labels"] == 400 and report["held_out_labels"] == 100 and report["not_worse"]
    assert report["candidate"]["f1"] > report["serving"]["f1"]
    written = DecisionModel.load(report["written"])
    assert written.version == report["candidate"]["version"] and written.meta["trained_on"] == "labels+simulation"


def test_export_labels_writes_the_labelled_texts_from_the_topics(pipeline_settings, settings_env, tmp_path):
    import json
    import subprocess
    import sys

    rng = random.Random(4)
    posts = [make_post(rng, f"exp-{i}", f"text number {i} <b>as is</b>", user_id=f"eu{i}") for i in range(5)]
    producer = Producer({"bootstrap.servers": pipeline_settings.bootstrap_servers})
    for i, post in enumerate(posts):
        producer.produce(pipeline_settings.topic("posts"), key=post["user_id"].encode(), value=schema.dumps(post))
        if i < 3:
            producer.produce(pipeline_settings.topic("labels"), key=post["post_id"].encode(), value=schema.dumps(
                {"schema_version": 1, "post_id": post["post_id"], "user_id": post["user_id"],
                 "label": "spam" if i % 2 else "ham", "moderator_id": "m2", "created_at": schema.rfc3339(1_795_400_000_000 + i)}))
    producer.produce(pipeline_settings.topic("labels"), key=b"bad", value=b"{not json")  # skipped, not fatal
    assert producer.flush(30) == 0
    out = tmp_path / "labelled.jsonl"
    env = {**settings_env, "KAFKA_BOOTSTRAP_SERVERS": pipeline_settings.bootstrap_servers,
           "MODPIPE_TOPIC_PREFIX": pipeline_settings.topic_prefix}
    proc = subprocess.run([sys.executable, "-m", "modpipe", "decision", "export-labels", str(out)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["post_id"], r["label"], r["text"]) for r in rows] == [
        (p["post_id"], "spam" if i % 2 else "ham", p["text"]) for i, p in enumerate(posts[:3])]
    assert all(r["moderator_id"] == "m2" for r in rows)
