"""`modpipe fuzz`: hostile records into every input topic of a running pipeline, and a check of where each went.

Each record is built from a valid one of its kind (post, report, engagement, label, ban) and then broken
or stretched in one of the ways a hostile or buggy producer would: random bytes, invalid UTF-8, truncated
or deeply nested JSON, wrong types, huge numbers, NaN, lone surrogates, multi-megabyte values, unknown
schema versions, odd URLs (IPv6 hosts, ports, userinfo, punycode, 8 KB paths), odd IPs, timestamps far in
the past and future, journeys of 100,000 steps. Some stay valid (odd but legal: those must be processed).

What the pipeline must do with each, decided by the record's own decoder (`modpipe.schema`): an invalid
record lands in the dead-letter topic with that reason (matched by its topic, partition and offset), a
valid post gets a decision, a valid side event is consumed (the group's lag returns to 0), and the worker
stays up. The report counts what was sent, where it went and what was lost; the worker's memory before
and after is the caller's (see `run_fuzz`'s `rss` hook).

`--emoji-links N` sends N valid posts instead, each with its own ~4,000-character emoji link (~16 KB a post,
~110 KB once parsed): every post must be decided, and the worker's resident memory must stay within its caches'
byte budgets (modpipe/memory.py) instead of growing with the links.
"""

from __future__ import annotations

import functools
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator

import orjson
from confluent_kafka import Producer
from modpipe.loadgen.posts import make_post
from modpipe.loadgen.smoke import end_consumer
from modpipe.streams.moderation.topics import TopicNames

from modpipe import schema
from modpipe.output import progress_bar
from modpipe.settings import Settings

KINDS = ("post", "report", "engagement", "label", "ban")
DECODERS = {"post": schema.decode_post, "report": schema.decode_report, "engagement": schema.decode_engagement,
            "label": schema.decode_label, "ban": schema.decode_ban}
BIG_VALUE_BYTES = 10 * 1024 * 1024  # "10 MB values": a few per run (the producer and broker must allow them)

ODD_URLS = [
    "http://[2001:db8::1]:8080/x", "https://user:pass@evil.example.com/login", "http://xn--80ak6aa92e.com/",
    "http://例え.テスト/パス", "https://a.b.c.d.e.f.g.h.example.co.uk/" + "p/" * 4000, "http://127.0.0.1:99999/",
    "javascript:alert(1)", "http://%00%ff@x/", "https://example.com:0/", "//no-scheme.example/x", "http://",
    "ftp://files.example/a b", "https://EXAMPLE.COM./UPPER/..%2f..%2f", "http://0x7f.1/", "mailto:a@b.c",
]
ODD_IPS = ["999.1.1.1", "::1", "::ffff:10.0.0.1", "fe80::1%eth0", "1.2.3", "", " 10.0.0.1 ", "2001:db8::/32",
           "256.256.256.256", "0.0.0.0", "ff02::1"]
ODD_TIMES = ["0001-01-01T00:00:00Z", "9999-12-31T23:59:59.999Z", "1970-01-01T00:00:00+14:00", "2024-02-30T00:00:00Z",
             "2024-01-01T00:00:00", "2024-01-01 00:00:00Z", "now", "1e10", "2024-13-01T00:00:00Z"]
ODD_VALUES = [None, True, 1e308, -1, 2 ** 63 - 1, -(2 ** 63), "", "x" * 300, [], {}, [1, [2, [3]]], "\u202e\u200b", 0.1]


def valid_record(kind: str, rng: random.Random, i: int, run_id: str) -> dict:
    post_id, user_id = f"{run_id}-p{i}", f"{run_id}-u{rng.randrange(50)}"
    now = schema.rfc3339(schema.now_ms())
    if kind == "post":
        return make_post(rng, post_id, rng.choice(["hi all", "WIN A FREE PRIZE http://x.example/win", "ok"]),
                         user_id=user_id)
    if kind == "report":
        return {"schema_version": 1, "report_id": f"{run_id}-r{i}", "post_id": post_id, "reporter_id": user_id,
                "reported_user_id": f"{run_id}-u1", "url": "https://spam.example/x", "reason": "spam",
                "created_at": now}
    if kind == "engagement":
        return {"schema_version": 1, "engagement_id": f"{run_id}-e{i}", "post_id": post_id,
                "url": "https://ok.example/a", "kind": rng.choice(["share", "comment"]), "user_id": user_id,
                "created_at": now}
    if kind == "label":
        return {"schema_version": 1, "post_id": post_id, "user_id": user_id, "label": rng.choice(["spam", "ham"]),
                "moderator_id": "m1", "created_at": now}
    return {"schema_version": 1, "ban_id": f"{run_id}-b{i}", "kind": "domain",
            "value": f"{run_id}-banned-{i}.example", "action": "ban", "created_at": now}


def _paths(obj, prefix=()) -> Iterator[tuple]:
    """Every (nested) field path of a record."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield (*prefix, k)
            yield from _paths(v, (*prefix, k))


def _set(obj: dict, path: tuple, value) -> None:
    for k in path[:-1]:
        obj = obj[k]
    obj[path[-1]] = value


def hostile(kind: str, rng: random.Random, i: int, run_id: str) -> bytes:
    """One hostile (or odd but legal) record of `kind`."""
    record = valid_record(kind, rng, i, run_id)
    way = rng.randrange(16)
    if way == 0:
        return rng.randbytes(rng.randrange(1, 200))
    if way == 1:
        return schema.dumps(record)[: rng.randrange(1, 40)]  # truncated
    if way == 2:
        return b"\xff\xfe" + schema.dumps(record)  # invalid UTF-8
    if way == 3:
        depth = rng.choice([100, 10_000])
        return b'{"schema_version": 1, "x": ' + b"[" * depth + b"]" * depth + b"}"  # deeply nested
    if way == 4:
        raw = schema.dumps(record)
        return raw.replace(b'"schema_version":1', rng.choice([b'"schema_version":NaN', b'"schema_version":1e999',
                                                              b'"schema_version":99999999999999999999999']))
    if way == 5:
        return schema.dumps(record)[:-1] + b',"x":"\\ud800"}'  # a lone surrogate
    if way == 6:
        record["schema_version"] = rng.choice([0, 2, 99, "1", None, True])
    elif way == 7:
        _set(record, rng.choice(list(_paths(record))), rng.choice(ODD_VALUES))  # wrong type / value
    elif way == 8 and "url" in record:
        record["url"] = rng.choice(ODD_URLS)
    elif way == 9 and kind == "post":
        record["ip"] = rng.choice(ODD_IPS)
    elif way == 9 and kind == "ban":
        record.update(kind="ip", value=rng.choice(ODD_IPS))
    elif way == 10:
        record["created_at"] = rng.choice(ODD_TIMES)
    elif way == 11 and kind == "post":
        record["journey"] = [{"page": "/x", "ts": record["created_at"]}] * 100_000
    elif way == 12:
        return schema.dumps(record) + b" trailing"  # JSON then garbage
    elif way == 13:
        return schema.dumps([record])  # not an object
    elif way == 14 and i % 500 == 0:  # rare: a 10 MB value
        _set(record, rng.choice(list(_paths(record))), "A" * BIG_VALUE_BYTES)
    # else: odd but valid (unicode everywhere)
    elif kind == "post":
        record["text"] = rng.choice(["\u0000nul", "😀" * 2000, "\u202eRTL", "a\u200bb", "ＦＵＬＬＷＩＤＴＨ"])
    return orjson.dumps(record)


def expected(kind: str, raw: bytes, settings: Settings) -> tuple[str, dict | None]:
    """What the pipeline must do with a record, "valid" or "dlq:<reason>" (its own decoder decides), and the
    decoded record when valid."""
    try:
        record = schema.decode_post(raw, settings.max_text_chars) if kind == "post" else DECODERS[kind](raw)
    except schema.InvalidMessage as exc:
        return f"dlq:{exc.reason}", None
    return "valid", record


def run_fuzz(settings: Settings, bootstrap: str, n: int, *, seed: int = 0, timeout_s: float = 300.0,
             progress: bool = True, healthy: Callable[[], bool] = lambda: True) -> dict:
    names = TopicNames.from_settings(settings)
    topic_of = {"post": names.posts, "report": names.reports, "engagement": names.engagements,
                "label": names.labels, "ban": names.bans}
    rng = random.Random(seed)
    run_id = f"fuzz{seed}-{int(time.time())}"
    consumer = end_consumer(settings, bootstrap, [names.decisions, names.dead_letters])
    producer = Producer({**settings.kafka_client_config(), "bootstrap.servers": bootstrap, "linger.ms": 5,
                         "message.max.bytes": BIG_VALUE_BYTES + 1024 * 1024})
    want: dict[tuple[str, int, int], str] = {}  # (topic, partition, offset) -> expected outcome
    posts_wanted: dict[str, tuple] = {}
    refused: Counter = Counter()

    def delivered(kind, outcome, post_id):
        def on_delivery(err, msg):
            if err is not None:
                refused[f"{kind}:{err.name()}"] += 1  # e.g. MSG_SIZE_TOO_LARGE: never reached the pipeline
                return
            key = (msg.topic(), msg.partition(), msg.offset())
            want[key] = outcome
            if post_id is not None:
                posts_wanted[post_id] = key
        return on_delivery

    sent: Counter = Counter()
    for i in progress_bar(range(n), desc="fuzz: produce", unit="rec", enabled=progress):
        kind = KINDS[i % len(KINDS)]
        raw = hostile(kind, rng, i, run_id)
        outcome, record = expected(kind, raw, settings)
        post_id = record["post_id"] if kind == "post" and record is not None else None
        producer.produce(topic_of[kind], value=raw, key=f"{run_id}-{i}".encode(),
                         on_delivery=delivered(kind, outcome, post_id))
        sent[f"{kind}:{outcome}"] += 1
        producer.poll(0)
    producer.flush(60)

    dead: dict[tuple[str, int, int], str] = {}
    decided: set[str] = set()
    wanted_dlq = {k for k, v in want.items() if v.startswith("dlq:")}
    deadline = time.monotonic() + timeout_s
    bar = progress_bar(total=len(wanted_dlq) + len(posts_wanted), desc="fuzz: outcomes", unit="rec", enabled=progress)
    while time.monotonic() < deadline and (not wanted_dlq <= dead.keys() or not posts_wanted.keys() <= decided):
        msg = consumer.poll(0.2)
        if msg is None:
            if not healthy():
                break
            continue
        if msg.error():
            continue
        record = orjson.loads(msg.value())
        if msg.topic() == names.dead_letters:
            src = record["source"]
            key = (src["topic"], src["partition"], src["offset"])
            if key in want:
                dead[key] = record["reason"]
                bar.update(1)
        elif record.get("post_id") in posts_wanted and record["post_id"] not in decided:
            decided.add(record["post_id"])
            bar.update(1)
    bar.close()
    consumer.close()
    wrong_reason = {str(k): (want[k], dead[k]) for k in wanted_dlq & dead.keys() if want[k] != f"dlq:{dead[k]}"}
    valid_dead = {str(k): dead[k] for k in dead.keys() - wanted_dlq}
    return {
        "run_id": run_id, "records": n, "sent": dict(sorted(sent.items())), "refused_by_broker": dict(refused),
        "dead_letters": dict(Counter(dead.values())),
        "dead_letters_expected": len(wanted_dlq), "dead_letters_missing": len(wanted_dlq - dead.keys()),
        "dead_letter_reason_mismatches": len(wrong_reason), "valid_records_dead_lettered": len(valid_dead),
        "valid_posts": len(posts_wanted), "valid_posts_decided": len(decided & posts_wanted.keys()),
        "lost": len(wanted_dlq - dead.keys()) + len(posts_wanted.keys() - decided),
        "examples": {"wrong_reason": dict(list(wrong_reason.items())[:5]), "valid_dead": dict(list(valid_dead.items())[:5])},
    }


EMOJI = [chr(c) for c in range(0x1F600, 0x1F650)]


def emoji_link(rng: random.Random, i: int, chars: int = 4000) -> str:
    head = f"https://links{i % 50}.example.com/{i}/"
    return head + "".join(rng.choice(EMOJI) for _ in range(chars - len(head)))


def run_emoji_links(settings: Settings, bootstrap: str, n: int, *, seed: int = 0, timeout_s: float = 900.0,
                    progress: bool = True, healthy: Callable[[], bool] = lambda: True, link_chars: int = 4000) -> dict:
    """N valid posts with distinct emoji links of `link_chars` characters; how many were decided."""
    names = TopicNames.from_settings(settings)
    rng = random.Random(seed)
    run_id = f"emoji{seed}-{int(time.time())}"
    consumer = end_consumer(settings, bootstrap, [names.decisions, names.dead_letters])
    producer = Producer({**settings.kafka_client_config(), "bootstrap.servers": bootstrap, "linger.ms": 5})
    wanted: set[str] = set()
    for i in progress_bar(range(n), desc="emoji links: produce", unit="post", enabled=progress):
        post = make_post(rng, f"{run_id}-{i}", f"look at this {i}", user_id=f"{run_id}-u{i % 500}")
        post["url"] = emoji_link(rng, i, link_chars)
        schema.decode_post(schema.dumps(post), settings.max_text_chars)  # valid, or this run is wrong
        wanted.add(post["post_id"])
        while True:
            try:
                producer.produce(names.posts, value=schema.dumps(post), key=post["user_id"].encode())
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    producer.flush(60)
    decided: set[str] = set()
    dead = 0
    deadline = time.monotonic() + timeout_s
    bar = progress_bar(total=n, desc="emoji links: decided", unit="post", enabled=progress)
    while time.monotonic() < deadline and not wanted <= decided:
        msg = consumer.poll(0.2)
        if msg is None:
            if not healthy():
                break
            continue
        if msg.error():
            continue
        if msg.topic() == names.dead_letters:
            dead += 1
            continue
        post_id = orjson.loads(msg.value()).get("post_id")
        if post_id in wanted and post_id not in decided:
            decided.add(post_id)
            bar.update(1)
    bar.close()
    consumer.close()
    return {"run_id": run_id, "posts": n, "decided": len(decided), "dead_letters": dead,
            "lost": len(wanted - decided)}


class RssPeak:
    """The largest resident memory of a process and, with `metrics_url`, the largest value of each of its byte
    gauges, sampled every `interval_s` on a thread of its own."""

    def __init__(self, pid: int | None, interval_s: float = 0.5, metrics_url: str | None = None):
        self.pid, self.interval_s, self.peak = pid, interval_s, 0.0
        self.metrics_url = metrics_url
        self.peaks: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.peak = max(self.peak, worker_rss_mib(self.pid) or 0.0)
            if self.metrics_url:
                try:
                    for name, value in memory_metrics(self.metrics_url).items():
                        self.peaks[name] = max(self.peaks.get(name, 0.0), value)
                except OSError:  # a scrape that failed: the next one counts
                    pass

    def __enter__(self) -> RssPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def worker_rss_mib(pid: int | None) -> float | None:
    try:
        for line in open(f"/proc/{pid}/status", encoding="ascii"):
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except (OSError, TypeError):
        pass
    return None


def settled(read: Callable[[], float | None], *, within_mib: float = 2.0, every_s: float = 2.0,
            timeout_s: float = 60.0) -> None:
    """Until three readings in a row are within `within_mib` of each other (or `timeout_s`)."""
    readings: list[float] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        readings = (readings + [read() or 0.0])[-3:]
        if len(readings) == 3 and max(readings) - min(readings) <= within_mib:
            return
        time.sleep(every_s)


def memory_metrics(url: str) -> dict[str, float]:
    """The worker's byte gauges (caches, buffers, tables) as its /metrics endpoint shows them."""
    import urllib.request

    out = {}
    with urllib.request.urlopen(url, timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(("modpipe_cache_bytes", "modpipe_buffer_bytes", "modpipe_table_bytes")):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
    return out


def fuzz(settings: Settings, n: int, *, seed: int = 0, workers: int = 1, timeout_s: float = 300.0,
         progress: bool = True, emoji_links: bool = False, link_chars: int = 4000) -> dict:
    """Against KAFKA_BOOTSTRAP_SERVERS when set, else the embedded stack (started and stopped here), whose
    workers' memory and lag are then reported too. `emoji_links`: `n` valid posts with emoji links instead."""
    run = functools.partial(run_emoji_links, link_chars=link_chars) if emoji_links else run_fuzz
    if settings.bootstrap_servers:
        return run(settings, settings.bootstrap_servers, n, seed=seed, timeout_s=timeout_s, progress=progress)
    from modpipe.streams.local.stack import LocalStack

    with LocalStack(settings, workers=workers) as stack:
        if emoji_links:  # a worker still grows for a few seconds after it turns ready: measure from where it settles
            settled(lambda: worker_rss_mib(stack.workers[0].process.pid))
        before = [worker_rss_mib(w.process.pid) for w in stack.workers]
        with RssPeak(stack.workers[0].process.pid,
                     metrics_url=stack.workers[0].metrics_url if emoji_links else None) as peak:
            report = run(settings, stack.bootstrap, n, seed=seed, timeout_s=timeout_s, progress=progress,
                         healthy=lambda: all(w.process.alive() for w in stack.workers))
        report["first_worker_rss_peak_mib"] = peak.peak
        if emoji_links:
            report["first_worker_memory_metrics"] = memory_metrics(stack.workers[0].metrics_url)
            report["first_worker_memory_metrics_peak"] = peak.peaks
        deadline = time.monotonic() + 60  # valid side events leave no record: the group's lag says they were read
        while (lag := stack.group_lag()) and time.monotonic() < deadline:
            time.sleep(1)
        report.update(workers_alive=all(w.process.alive() for w in stack.workers), lag_after=lag,
                      worker_rss_mib={"before": before, "after": [worker_rss_mib(w.process.pid) for w in stack.workers]})
        return report
