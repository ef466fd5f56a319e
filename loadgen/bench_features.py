"""`modpipe bench features`: posts/s through ingest + feature stages + batching with the text model off,
beside a plain consume-and-produce loop on the same broker in the same run. The ratio is the cost of
our stages (validation, five keyed table stages, decision assembly) over moving bytes through Kafka."""

from __future__ import annotations

import dataclasses
import random
import time
import uuid

from confluent_kafka import Consumer, Producer
from tqdm import tqdm

from loadgen.posts import make_post
from loadgen.smoke import end_consumer
from modpipe import schema
from modpipe.services.broker import EmbeddedBroker
from modpipe.services.process import free_port
from modpipe.settings import Settings
from streams.stack import LocalStack
from streams.topics import ensure_topics

TEXTS = ["see you at lunch", "FREE entry! win cash now, text WIN to 80086", "meeting moved to 3pm",
         "check out my blog https://blog.example.org/post"]


def _posts(n: int, seed: int = 1) -> list[dict]:
    rng = random.Random(seed)
    return [make_post(rng, f"bench-{uuid.uuid4().hex[:6]}-{i}", rng.choice(TEXTS), user_id=f"u{rng.randrange(500)}")
            for i in range(n)]


def _produce(bootstrap: str, topic: str, posts: list[dict]) -> None:
    # keyed by user_id with Kafka's default (Java) partitioner, as a platform's producer would
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "partitioner": "murmur2_random"})
    for post in posts:
        producer.produce(topic, key=post["user_id"].encode(), value=schema.dumps(post))
        producer.poll(0)
    producer.flush(60)


def plain_loop(settings: Settings, bootstrap: str, posts: list[dict]) -> float:
    """posts/s of consume -> decode -> produce, one confluent consumer and producer, no state."""
    src, dst = settings.topic("bench.plain.in"), settings.topic("bench.plain.out")
    _produce(bootstrap, src, posts)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:6]}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": True})
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    consumer.subscribe([src])
    done, started = 0, None
    while done < len(posts):
        for msg in consumer.consume(500, 1.0):
            if msg.error():
                continue
            started = started or time.perf_counter()
            post = schema.decode_post(msg.value())
            producer.produce(dst, key=post["post_id"].encode(), value=msg.value())
            done += 1
        producer.poll(0)
    producer.flush(60)
    elapsed = time.perf_counter() - started
    consumer.close()
    return len(posts) / elapsed


def pipeline(settings: Settings, bootstrap: str, posts: list[dict], workers: int, progress: bool) -> float:
    """posts/s from the first post produced to the last decision received, text model off."""
    with LocalStack(settings, workers=workers) as stack:
        consumer = end_consumer(settings, bootstrap, [stack.topics.decisions])
        wanted = {p["post_id"] for p in posts}
        started = time.perf_counter()
        _produce(bootstrap, stack.topics.posts, posts)
        seen: set[str] = set()
        with tqdm(total=len(posts), desc="decisions", disable=not progress) as bar:
            while seen < wanted and time.perf_counter() - started < 600:
                if not all(w.process.alive() for w in stack.workers):
                    raise RuntimeError(f"a worker died; see {stack.workers[0].process.log_path.parent}")
                msg = consumer.poll(0.2)
                if msg is not None and not msg.error():
                    pid = schema.decode_decision(msg.value())["post_id"]
                    if pid in wanted and pid not in seen:
                        seen.add(pid)
                        bar.update(1)
        elapsed = time.perf_counter() - started
        consumer.close()
    if seen != wanted:
        raise RuntimeError(f"{len(wanted - seen)} posts got no decision")
    return len(posts) / elapsed


def run(settings: Settings, n_posts: int = 2000, workers: int = 1, progress: bool = True) -> dict:
    own_broker = None
    bootstrap = settings.bootstrap_servers
    if not bootstrap:
        # A directory per run: a run killed without cleanup must not block the next one.
        own_broker = EmbeddedBroker(settings.state_dir / f"bench-broker-{uuid.uuid4().hex[:8]}", free_port()).start()
        bootstrap = own_broker.bootstrap
    try:
        settings = dataclasses.replace(settings, bootstrap_servers=bootstrap, text_model="off",
                                       topic_prefix=f"{settings.topic_prefix}bench{uuid.uuid4().hex[:6]}.",
                                       app_id=f"{settings.app_id}-bench-{uuid.uuid4().hex[:6]}")
        ensure_topics(settings, bootstrap)
        posts = _posts(n_posts)
        plain = plain_loop(settings, bootstrap, posts)
        ours = pipeline(settings, bootstrap, posts, workers, progress)
    finally:
        if own_broker:
            own_broker.stop()
            own_broker.wipe()
    return {"posts": n_posts, "workers": workers, "plain_loop_posts_per_s": round(plain, 1),
            "feature_path_posts_per_s": round(ours, 1), "ratio_feature_path_over_plain": round(ours / plain, 4)}
