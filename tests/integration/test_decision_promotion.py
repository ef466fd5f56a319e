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

from loadgen.posts import make_post
from loadgen.smoke import end_consumer
from modpipe import schema
from modpipe.decision.model import DECISION_FEATURES, DecisionModel
from modpipe.decision.train import resolve_decision_model
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
