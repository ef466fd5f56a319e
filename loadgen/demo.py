"""`modpipe demo` (`make demo`): the whole pipeline on the embedded stack, verdicts visible in minutes."""

from __future__ import annotations

import sys
import time

import orjson
from confluent_kafka import Producer
from modpipe.loadgen.posts import labelled_posts, malformed_records
from modpipe.loadgen.smoke import end_consumer
from modpipe.streams.local.stack import LocalStack, StatusLine

from modpipe import schema
from modpipe.settings import Settings
from modpipe.textmodel.artifacts import resolve_model


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_demo(settings: Settings, posts: int = 300, workers: int = 2, keep_running: bool = False) -> int:
    build = resolve_model(settings)
    quality = build.served.get("profile", "full")
    _say(f"text model: {build.path.name} (profile: {quality}"
         + (", a quick demo-quality build; `make model` builds the full one" if quality == "demo" else "") + ")")
    _say(f"starting broker, Triton and {workers} workers; logs in {settings.state_dir / 'logs'}")
    t0 = time.monotonic()
    with LocalStack(settings, workers=workers) as stack:
        _say(f"stack ready in {time.monotonic() - t0:.1f}s: KAFKA_BOOTSTRAP_SERVERS={stack.bootstrap} "
             f"TRITON_URL={stack.triton_url}")
        consumer = end_consumer(settings, stack.bootstrap, [stack.topics.decisions, stack.topics.dead_letters])
        producer = Producer({**settings.kafka_client_config(), "bootstrap.servers": stack.bootstrap})
        run_id = f"demo-{int(time.time())}"
        labels = {}
        for post, label in labelled_posts(build.heldout(), posts, run_id):
            labels[post["post_id"]] = (label, post["text"])
            producer.produce(stack.topics.posts, key=post["user_id"].encode(), value=schema.dumps(post))
        bad = malformed_records(run_id)[:3]
        for _, raw in bad:
            producer.produce(stack.topics.posts, key=b"demo", value=raw)
        producer.flush(30)
        producer.close()  # before the broker stops: a client left connected logs its disconnection
        _say(f"sent {posts} held-out posts and {len(bad)} malformed records to `{stack.topics.posts}`")

        decided, dead, status, last = {}, [], StatusLine(), time.monotonic()
        deadline = time.monotonic() + 300
        while (len(decided) < posts or len(dead) < len(bad)) and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and not msg.error():
                record = orjson.loads(msg.value())
                if msg.topic() == stack.topics.decisions and record["post_id"] in labels:
                    if not decided:
                        _say(f"first verdict {time.monotonic() - t0:.1f}s after start")
                    decided[record["post_id"]] = record
                elif msg.topic() == stack.topics.dead_letters:
                    dead.append(record)
            if time.monotonic() - last > 2:
                _say(status.render(stack))
                last = time.monotonic()
        consumer.close()
        _say(status.render(stack))

        _say("\nexample decisions (verdict, spam probability, true label, text):")
        examples = {}  # post_id -> record: one of each verdict first, then fill up to six
        for verdict in schema.VERDICTS:
            first = next((r for r in decided.values() if r["verdict"] == verdict), None)
            if first:
                examples[first["post_id"]] = first
        for record in decided.values():
            if len(examples) >= 6:
                break
            examples.setdefault(record["post_id"], record)
        for record in examples.values():
            label, text = labels[record["post_id"]]
            print(f"  {record['verdict']:<6} p={record['spam_probability']:.3f} label={label:<4} "
                  f"{record['latency_ms']:>5} ms  {text[:70]!r}")
        for d in dead[:3]:
            print(f"  dead letter: {d['reason']}: {d['error'][:80]}")
        correct = sum((r["spam_probability"] >= settings.review_threshold) == (labels[pid][0] == "spam")
                      for pid, r in decided.items())
        _say(f"\n{len(decided)}/{posts} posts decided, {len(dead)} dead letters, "
             f"accuracy vs true labels {correct / max(1, len(decided)):.3f}")
        _say("one full decision:\n" + orjson.dumps(next(iter(decided.values())), option=orjson.OPT_INDENT_2).decode()
             if decided else "no decisions")
        if keep_running:
            _say("stack keeps running; Ctrl-C stops it")
            while True:  # until Ctrl-C or SIGTERM: modpipe.cli exits 130 or 143 once the stack has stopped
                time.sleep(2)
                _say(status.render(stack))
    return 0 if len(decided) == posts else 1
