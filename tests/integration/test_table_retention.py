"""Table retention on the real broker: a worker forgets post states past MODPIPE_POST_RETENTION_S with a tombstone
in a committed transaction (also while no input arrives), a restarted worker does not bring them back, and a
restored key keeps the age of its changelog record."""

from __future__ import annotations

import signal
import time

import pytest
from confluent_kafka import Producer
from modpipe.loadgen.chaos import streaming_tables
from modpipe.loadgen.smoke import end_consumer
from modpipe.streams.state import tables as tables_module
from modpipe.streams.state.tables import Table, encode_key, encode_value, restore

from tests.fixtures.kafka import create_topics, start_broker
from tests.integration.test_streaming import collect_decisions, produce_posts

pytestmark = pytest.mark.integration


def wait_for(condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value or time.monotonic() > deadline:
            assert value, f"not within {timeout_s:.0f} s: {what}"
            return value
        time.sleep(0.5)


def test_post_states_past_their_retention_are_tombstoned_and_stay_gone_after_a_restart(local_stack, pipeline_settings,
                                                                                       model_build):
    stack = local_stack(workers=1, modpipe_post_retention_s=3)
    settings, bootstrap = pipeline_settings, stack.bootstrap
    consumer = end_consumer(settings, bootstrap, [stack.topics.decisions])
    posts = produce_posts(settings, 40, "ret", model_build.heldout())
    got = collect_decisions(consumer, set(posts), 120)
    assert set(got) == set(posts), f"{len(set(posts) - set(got))} posts undecided"
    users = {p["user_id"] for p in posts.values()}
    assert set(posts) <= streaming_tables(settings, bootstrap)["post"].keys()  # each post's state was committed

    # No more input: the worker checkpoints on its own to write the tombstones.
    tables = wait_for(lambda: (t := streaming_tables(settings, bootstrap)) and not set(posts) & t["post"].keys() and t,
                      60, "the post states tombstoned in the changelog")
    assert users <= tables["user"].keys()  # the user table's retention (3 days by default) keeps its keys
    metrics = wait_for(lambda: (m := stack.scrape()).get("modpipe_table_keys{table=post}") == 0 and m, 30,
                       "the worker's post table empty")
    assert metrics["modpipe_state_expired_total{table=post}"] >= len(posts)
    assert metrics["modpipe_state_expired_total{table=user}"] == 0
    user_keys = metrics["modpipe_table_keys{table=user}"]
    assert user_keys >= 1 and metrics["modpipe_table_bytes{table=user}"] > 0

    # A restart restores what the changelogs hold: the users, not the forgotten posts.
    stack.workers[0].process.kill()
    stack.start_worker(0)
    stack.wait_workers_ready(120)
    metrics = wait_for(lambda: (m := stack.scrape()).get("modpipe_table_keys{table=user}") == user_keys and m, 30,
                       f"{user_keys} user keys restored")
    assert metrics["modpipe_table_keys{table=post}"] == 0
    later = produce_posts(settings, 10, "ret-later", model_build.heldout())
    got = collect_decisions(consumer, set(later), 120)
    consumer.close()
    assert set(got) == set(later) and all(len(d) == 1 for d in got.values())


def test_a_restored_key_is_as_old_as_its_changelog_record(bootstrap, pipeline_settings):
    """The broker keeps the producer's timestamp of each changelog record; `restore` dates each key by its last
    one, so a restart does not make old keys young."""
    topic = f"{pipeline_settings.app_id}-features-post-changelog"
    create_topics(bootstrap, [topic])
    now_ms = int(time.time() * 1000)
    producer = Producer({"bootstrap.servers": bootstrap})
    for key, age_s in (("old", 30), ("young", 2), ("renewed", 40), ("renewed", 1)):
        producer.produce(topic, encode_value({"k": key}), key=encode_key(key), partition=0,
                         timestamp=now_ms - age_s * 1000)
    assert producer.flush(30) == 0
    post = Table("post", topic, retention_ms=10_000)
    assert restore([post], [0], pipeline_settings, bootstrap) == 4
    assert list(post.decoded()[0]) == ["old", "young", "renewed"]
    assert post.expired() == [(0, "old")]
    assert post.keys() == 2



def test_a_restore_that_cannot_reach_the_end_says_where_it_stands_and_gives_up(pipeline_settings, tmp_path,
                                                                               monkeypatch, caplog):
    """A broker that stops answering (SIGSTOP) keeps a changelog restore from reaching its end offsets: the
    restore logs where it stands at each interval instead of hanging silently, and fails after its timeout (the
    worker then stops and its restart tries again); once the broker answers, the same restore completes."""
    monkeypatch.setattr(tables_module, "RESTORE_PROGRESS_S", 0.5)
    broker = start_broker(tmp_path)
    try:
        topic = f"{pipeline_settings.app_id}-features-user-changelog"
        create_topics(broker.bootstrap, [topic])
        producer = Producer({"bootstrap.servers": broker.bootstrap})
        producer.produce(topic, encode_value({"k": "v"}), key=encode_key("u1"), partition=0)
        assert producer.flush(30) == 0
        broker.signal(signal.SIGSTOP)
        user = Table("user", topic)
        with caplog.at_level("WARNING", logger="modpipe.streams.state.tables"), \
                pytest.raises(TimeoutError, match="not read to their end"):
            restore([user], [0], pipeline_settings, broker.bootstrap, timeout_s=2.5)
        reports = [r for r in caplog.records if r.getMessage() == "changelog restore still reading"]
        assert len(reports) >= 3 and {r.partitions_left for r in reports} == {1}
        assert reports[-1].behind[0]["topic"] == topic and reports[-1].behind[0]["partition"] == 0
        broker.signal(signal.SIGCONT)
        assert restore([user], [0], pipeline_settings, broker.bootstrap, timeout_s=60.0) == 1
        assert user.decoded() == {0: {"u1": {"k": "v"}}}
    finally:
        broker.signal(signal.SIGCONT)
        broker.stop()
