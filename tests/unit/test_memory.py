"""modpipe.memory: byte-bounded caches charged a measured size, the worker's budget split, and the caches and
buffers that respect it (parsed links under hostile input, IPs, the text cache, bundles, the decision queue),
with their metrics. Memory is measured with tracemalloc."""

from __future__ import annotations

import asyncio
import gc
import sys
import tracemalloc
from types import SimpleNamespace

import numpy as np
import orjson
import pytest
from modpipe.features.url import parse_url
from modpipe.streams import metrics
from modpipe.streams.checkpointing.outbox import Pending
from modpipe.streams.moderation.bundles import Bundler, decode_bundle
from modpipe.streams.moderation.decisions import DecisionBatcher, Publisher
from modpipe.streams.moderation.scoring import TextCache
from modpipe.streams.moderation.topics import TopicNames
from prometheus_client import REGISTRY

from modpipe import memory, schema
from modpipe.decision.verdict import ThresholdDecider
from modpipe.memory import ENTRY_OVERHEAD, ByteLRU, deep_size
from modpipe.settings import Settings, SettingsError
from tests.unit.test_text_model_outage import ready_post, scorer

EMOJI = [chr(c) for c in range(0x1F600, 0x1F650)]


def emoji_link(i: int, chars: int = 4000) -> str:
    """A distinct, valid link of `chars` characters, its path emoji: ~110 KB once parsed."""
    head = f"https://example{i % 7}.com/{i}/"
    pair = EMOJI[i % len(EMOJI)] + EMOJI[i * 7 % len(EMOJI)]
    return head + pair * ((chars - len(head)) // 2) + EMOJI[0] * ((chars - len(head)) % 2)


@pytest.fixture
def url_cache():
    cache = parse_url.cache
    saved = cache.max_bytes, cache.max_entries
    cache.clear()
    yield cache
    cache.clear()
    cache.resize(*saved)


def traced_growth(fn) -> int:
    """Bytes still allocated after `fn()` that were not before (tracemalloc)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        fn()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


# ------------------------------------------------------------------------------------------------ the size

@pytest.mark.parametrize("make", [lambda i: emoji_link(i), lambda i: f"https://shop{i}.example.co.uk/a/b?q={i}&x=1",
                                  lambda i: f"http://bücher{i}.de/katalog"])
def test_the_charge_covers_what_an_entry_allocates_and_not_much_more(url_cache, make):
    parse_url(make(-1))  # what the first call of a path allocates once (a compiled pattern, a table) is not the entry's
    url_cache.clear()
    url_cache.resize(1 << 40)
    n = 60
    growth = traced_growth(lambda: [parse_url(make(i)) for i in range(n)])  # the links live on as keys
    assert len(url_cache) == n
    charged = url_cache.bytes
    # small entries share what Python interns (short strings, small ints, booleans): over-charged more
    assert growth <= charged <= 3 * growth, (growth / n, charged / n)


@pytest.mark.parametrize("url", ["https://shop1.example.co.uk/a/b?q=1&x=1&utm_source=x", "http://bücher.de/katalog",
                                 "http://[2001:db8::1]:8080/x", "http://0x7f.1/", "https://user@paypa1-secure.com",
                                 "not a url", "https://xn--80ak6aa92e.com/", "https://a.b.c.d.example.org/p/q/r/s"])
def test_a_parsed_link_and_its_brand_match_are_charged_at_least_what_they_hold(url):
    from modpipe.features.brands import _match, brand_match

    info = parse_url(url)
    charged = memory.record_entry_size(url, info)
    assert deep_size(url) + deep_size(info) <= charged <= 2 * (deep_size(url) + deep_size(info))
    if info.valid and not info.is_ip and info.domain:
        key = (info.host_unicode or info.host, info.domain, info.tld or "")
        match = brand_match(info)
        assert _match(*key) is match
        assert deep_size(key) + deep_size(match) <= memory.record_entry_size(key, match)


def test_a_hostile_link_is_charged_about_110_kb():
    info = parse_url(emoji_link(1))
    assert info.valid and info.key.startswith("sha256:")
    assert 100_000 < deep_size(info.raw) + deep_size(info) + ENTRY_OVERHEAD < 150_000


def test_deep_size_counts_contents_once():
    s = "x" * 1000
    assert deep_size((s, s)) == deep_size(()) + 8 * 2 + deep_size(s)  # the tuple's two slots, the string once
    assert deep_size({"a": [s]}) == sys.getsizeof({"a": [s]}) + deep_size("a") + sys.getsizeof([s]) + deep_size(s)
    assert deep_size(3.5) == 24


# ------------------------------------------------------------------------------------------------ the bound

def test_distinct_emoji_links_allocate_no_more_than_the_url_cache_bytes(url_cache):
    url_cache.resize(2 * memory.MIB)
    n = 300  # ~33 MB if they were all kept (tracemalloc slows parsing ~10x: a few hundred here)

    def feed():
        for i in range(n):
            assert parse_url(emoji_link(i)).valid

    growth = traced_growth(feed)
    assert url_cache.bytes <= 2 * memory.MIB and 0 < len(url_cache) < 25
    assert growth <= 2 * memory.MIB + 128 * 1024, growth


def test_thousands_of_distinct_emoji_links_keep_the_charged_bytes_under_the_bound(url_cache):
    url_cache.resize(4 * memory.MIB)
    n = 1500  # ~165 MB if they were all kept
    peak = 0
    for i in range(n):
        assert parse_url(emoji_link(i)).valid
        peak = max(peak, url_cache.bytes)
    assert peak <= 4 * memory.MIB and url_cache.evictions >= n - 40


def test_an_over_long_ip_is_refused_before_the_cache():
    cache = schema._canonical_ip.cache
    before = len(cache)
    for i in range(2000):
        assert schema.canonical_ip(f"{i}" + "9" * 200) is None
    assert len(cache) == before
    fresh = " 10.213.47.199 "  # no other test reads it: its first read adds one entry
    assert fresh.strip() not in cache
    assert schema.canonical_ip(fresh) == "10.213.47.199" and len(cache) == before + 1


# ------------------------------------------------------------------------------------------------ the LRU

def test_least_recently_used_goes_first_when_the_bytes_are_over():
    c = ByteLRU("t", max_bytes=3 * (100 + ENTRY_OVERHEAD), size=lambda k, v: 100)
    for k in "abc":
        c.put(k, k)
    assert c.get("a") == "a"  # used: now the most recent
    c.put("d", "d")
    assert c.keys() == ["c", "a", "d"] and c.get("b") is None and c.evictions == 1
    assert c.bytes == 3 * (100 + ENTRY_OVERHEAD) and (c.hits, c.misses) == (1, 1)


def test_an_entry_larger_than_the_cache_is_not_kept_and_a_replaced_one_is_charged_once():
    c = ByteLRU("t", max_bytes=1000, size=lambda k, v: len(v))
    c.put("big", "x" * 2000)
    assert len(c) == 0 and c.bytes == 0
    c.put("k", "x" * 10)
    c.put("k", "x" * 20)
    assert len(c) == 1 and c.bytes == 20 + ENTRY_OVERHEAD


def test_resizing_evicts_down_to_the_new_bound_and_a_count_limit_also_holds():
    c = ByteLRU("t", max_bytes=10_000, size=lambda k, v: 100, max_entries=5)
    for i in range(8):
        c.put(i, i)
    assert c.keys() == [3, 4, 5, 6, 7]
    c.resize(2 * (100 + ENTRY_OVERHEAD), 5)
    assert c.keys() == [6, 7]


def test_the_budget_splits_the_worker_memory_by_share():
    assert Settings.from_env({}).worker_memory_mb == memory.DEFAULT_WORKER_MEMORY_MB
    with pytest.raises(SettingsError):
        Settings.from_env({"MODPIPE_WORKER_MEMORY_MB": "100"})
    assert set(memory.CACHES) >= {"url_parse", "ip_parse", "ip_normalize", "timestamp_parse", "brand_match",
                                  "journey_step", "partition"}
    assert sum(memory.SHARES.values()) < 0.5  # the rest is the process (~400 MiB) and in-memory tables
    saved = {name: (c.max_bytes, c.max_entries) for name, c in memory.CACHES.items()}
    try:
        budgets = memory.apply_budget(1000)
        assert budgets["url_parse"] == int(memory.SHARES["url_parse"] * 1000 * memory.MIB) == parse_url.cache.max_bytes
    finally:
        for name, (max_bytes, max_entries) in saved.items():
            memory.CACHES[name].resize(max_bytes, max_entries)


def test_the_text_cache_is_bounded_by_bytes_as_well_as_entries():
    c = TextCache("v1", capacity=100_000, max_bytes=50 * (ENTRY_OVERHEAD + 100))
    for i in range(1000):
        c.put(c.key(np.array([i])), 0.5)
    assert 10 < len(c) < 100 and c.bytes <= 50 * (ENTRY_OVERHEAD + 100)
    assert memory.CACHES["text"] is c._items


# ------------------------------------------------------------------------------------------------ metrics

def test_each_cache_exports_its_bytes_entries_and_budget():
    budgets = {use: memory.budget_bytes(use, 2048) for use in memory.SHARES}
    metrics.init_memory(budgets)
    parse_url("https://metrics.example.com/x")
    cache = parse_url.cache
    assert REGISTRY.get_sample_value("modpipe_cache_bytes", {"cache": "url_parse"}) == cache.bytes > 0
    assert REGISTRY.get_sample_value("modpipe_cache_entries", {"cache": "url_parse"}) == len(cache)
    assert REGISTRY.get_sample_value("modpipe_memory_budget_bytes", {"use": "decision_queue"}) == \
        budgets["decision_queue"]
    assert REGISTRY.get_sample_value("modpipe_buffer_bytes", {"buffer": "bundles"}) is not None


# ------------------------------------------------------------------------------------------------ buffers

def test_a_bundler_over_its_bytes_produces_what_it_holds_and_keeps_each_partitions_order():
    produced = []
    b = Bundler(4, max_bytes=20_000, on_full=lambda full: produced.extend(full.records()))
    items = [{"n": i, "text": emoji_link(i, 500)} for i in range(60)]  # ~2 KB each
    for item in items:
        b.add("stage", f"key{item['n'] % 9}", item)
        assert b.bytes <= 20_000
    produced.extend(b.records())
    assert len(produced) > 4  # flushed along the way, not only at the end
    got: dict[int, list[int]] = {}
    for _, partition, value, n in produced:
        decoded = decode_bundle(value)
        assert len(decoded) == n
        got.setdefault(partition, []).extend(item["n"] for item in decoded)
    assert sorted(n for ns in got.values() for n in ns) == list(range(60))  # each item once
    assert all(ns == sorted(ns) for ns in got.values())  # in the order added
    assert REGISTRY.get_sample_value("modpipe_buffer_bytes", {"buffer": "bundles"}) > 0


def test_a_bundler_without_a_producer_only_grows():
    b = Bundler(4, max_bytes=100)
    for i in range(10):
        b.add("stage", "k", {"n": i})
    assert b.items == 10 and b.bytes > 100


class Outbox:
    def __init__(self):
        self.records = []

    def produce(self, topic, value, *, key=None, partition=None, pending=None, **kwargs):
        self.records.append(orjson.loads(value))
        pending.hold()
        pending.release()


def _held_by_one_round(posts):
    """The posts as one round hands them to the batcher: their source released as each is decided."""
    source = Pending(epoch=None)
    for p in posts:
        p.source = source
    source.hold(len(posts))
    source.seal()
    return posts


def test_the_decision_queue_counts_its_bytes_and_says_when_it_is_over():
    s, client = scorer("decide")
    client.down = False
    topics = TopicNames.from_settings(Settings.from_env({}))
    outbox = Outbox()
    publisher = Publisher(outbox, topics, {"text_model": "test-v1", "decider": "thresholds-v1"})
    posts = [ready_post(i) for i in range(20)]
    for p in posts:
        p.post["text"] = emoji_link(0, 2000)  # 8 KB each as Python holds it
    one = deep_size(posts[0].post) + deep_size(posts[0].features) + deep_size(posts[0].ctx)
    batcher = DecisionBatcher(s, ThresholdDecider(), publisher, max_batch=8, max_wait_s=0.0, max_inflight=1,
                              on_error=print, feedback=lambda items, pending: None, max_bytes=10 * one)
    _held_by_one_round(posts)

    async def run():
        batcher.submit(posts)
        assert batcher.queued_bytes >= 20 * one - 20 and batcher.over_budget
        assert REGISTRY.get_sample_value("modpipe_buffer_bytes", {"buffer": "decision_queue"}) == \
            batcher.queued_bytes
        room = asyncio.ensure_future(batcher.room())  # what the runner awaits before its next round
        await asyncio.sleep(0)
        assert not room.done()
        await asyncio.wait_for(room, 5)
        assert not batcher.over_budget
        for _ in range(200):
            await asyncio.sleep(0.02)
            if len([r for r in outbox.records if "verdict" in r]) == 20:
                break
        await batcher.close()

    asyncio.run(run())
    assert batcher.queued_bytes == 0 and not batcher.over_budget
    assert len({r["post_id"] for r in outbox.records if "verdict" in r}) == 20


def test_the_decision_queue_is_full_at_two_rounds_of_batches_for_each_slot_whatever_their_bytes():
    s, client = scorer("decide")
    client.down = False
    publisher = Publisher(Outbox(), TopicNames.from_settings(Settings.from_env({})),
                          {"text_model": "test-v1", "decider": "thresholds-v1"})
    batcher = DecisionBatcher(s, ThresholdDecider(), publisher, max_batch=4, max_wait_s=0.0, max_inflight=1,
                              on_error=print, feedback=lambda items, pending: None, max_bytes=1 << 30)
    posts = _held_by_one_round([ready_post(i) for i in range(8)])

    async def run():
        batcher.submit(posts[:7])
        assert not batcher.full
        batcher.submit(posts[7:])
        assert batcher.full and not batcher.over_budget  # 8 small posts: 2 x 4 x 1
        await asyncio.wait_for(batcher.room(), 5)  # a batch of 4 taken off
        assert not batcher.full and batcher.queued < 8
        await batcher.close(grace_s=5.0)

    asyncio.run(run())
    assert batcher.queued == 0


def test_the_worker_hands_freed_heap_pages_back_at_intervals(monkeypatch):
    from modpipe.streams import worker

    calls = []
    monkeypatch.setattr(worker.ctypes, "CDLL", lambda name: SimpleNamespace(malloc_trim=calls.append))
    monkeypatch.setattr(worker, "TRIM_EVERY_S", 0.01)

    async def run():
        task = asyncio.ensure_future(worker._trim_forever())
        await asyncio.sleep(0.2)
        task.cancel()

    asyncio.run(run())
    assert len(calls) >= 3 and set(calls) == {0}


def test_without_glibc_the_worker_does_not_trim(monkeypatch):
    from modpipe.streams import worker

    def no_libc(name):
        raise OSError(name)

    monkeypatch.setattr(worker.ctypes, "CDLL", no_libc)
    asyncio.run(asyncio.wait_for(worker._trim_forever(), 1))  # returns at once


# ------------------------------------------------------------------------------------------------ the quick size

def test_approx_size_is_deep_size_for_ascii_text_and_floats_and_never_less_for_the_rest():
    value = {"a": "x" * 300, "b": [1.5, "yz" * 40, {"c": b"\x00" * 50, "d": (2.5, "w")}], "e": 7.25}
    assert memory.approx_size(value) == deep_size(value)
    assert memory.approx_size([1.25, "s" * 9]) == deep_size([1.25, "s" * 9])
    assert memory.approx_size("x" * 1000) == deep_size("x" * 1000)
    for other in (["é" * 100, "ā" * 100, "😀" * 100], {"😀" * 9: 1}, [3, 2 ** 40, -(2 ** 62)], [10 ** 30, 10 ** 300],
                  [None, True, False, 0], {"k": {"j": [[], {}, ()]}}, [b"x" * 10, "y"]):
        assert memory.approx_size(other) >= deep_size(other), other
    assert memory.approx_size(["😀" * 100]) == deep_size(["😀" * 100])  # four bytes a character: exact
    assert memory.approx_size([10 ** 300]) == deep_size([10 ** 300])  # beyond 64 bits: measured


def test_approx_size_counts_a_shared_object_each_time_so_never_less_than_deep_size():
    s = "x" * 1000
    assert memory.approx_size((s, s)) == deep_size((s, s)) + deep_size(s)
    assert memory.approx_size({("k", s): [s]}) >= deep_size({("k", s): [s]})  # a tuple key is walked too


def test_approx_size_of_a_queued_post_is_within_a_fifth_of_deep_size():
    from modpipe.features.vector import FEATURE_NAMES

    post = ready_post(3)
    post.post["text"] = emoji_link(1, 3000)
    post.features.update({name: (float(i) if i % 3 else None) for i, name in enumerate(FEATURE_NAMES)})
    post.features["url_domain"] = "example1.com"
    for part in (post.post, post.features, post.ctx):
        assert deep_size(part) <= memory.approx_size(part) <= 1.2 * deep_size(part) + 200


def test_approx_size_hands_other_objects_to_deep_size():
    info = parse_url("https://shop.example.co.uk/a/b?q=1")
    assert memory.approx_size(info) == deep_size(info)
    assert memory.approx_size([info]) >= deep_size(info)


def test_a_cache_hit_moves_the_entry_to_the_recent_end_and_counts_it():
    from modpipe.features import journey

    calls = []

    @memory.cached("journey_step")
    def double(x):
        calls.append(x)
        return x * 2

    try:
        assert [double(1), double(2), double(1)] == [2, 4, 2] and calls == [1, 2]
        assert (double.cache.hits, double.cache.misses) == (1, 2)
        assert double.cache.keys() == [2, 1]
        assert double.cache.get(2) == 4 and double.cache.keys() == [1, 2]
        assert double.cache.get(3, "none") == "none" and double.cache.misses == 3
    finally:
        memory.register(journey._kind_of.cache)  # the real cache of that name back in CACHES


# ------------------------------------------------------------------------------------------------ schema-aware sizes

def _decoded_posts() -> list[dict]:
    """Posts as `decode_post` returns them: ordinary, with a link and its reputation, and hostile (emoji text and
    link, a thousand steps of 64-bit durations, wide step names)."""
    import random

    from modpipe.loadgen.posts import make_post

    rng = random.Random(5)
    raw = [make_post(rng, f"p{i}", text, user_id=f"u{i}") for i, text in
           enumerate(["hi", "WIN a FREE prize now", "é" * 300, "😀" * 2000, "x" * 5000] * 4)]
    raw[1]["url"], raw[1]["url_reputation"] = "https://shop.example.net/a?b=1", {"age_days": 3, "wot_score": 2.5}
    raw[2]["url"] = emoji_link(2, 3000)
    raw[3]["journey"] = [{"step": "type" if i % 2 else "ペースト", "ms": 2 ** 64 - 1 - i} for i in range(1000)]
    raw[4]["journey"] = []
    raw[4]["user"]["email_domain"] = "ÉXAMPLE.org"
    return [schema.decode_post(orjson.dumps(p)) for p in raw]


def test_a_decoded_posts_size_from_its_fields_is_never_less_than_walking_it_and_close_to_it():
    posts = _decoded_posts()
    for post in posts + [orjson.loads(orjson.dumps(p)) for p in posts]:  # and as a stage topic carries it
        walked = memory.approx_size(post)
        assert walked <= schema.post_size(post) <= 1.1 * walked + 200, post["post_id"]


def test_a_post_of_another_shape_is_walked():
    post = _decoded_posts()[0]
    odd = {**post, "extra": "x" * 1000}
    assert schema.post_size(odd) == memory.approx_size(odd)
    missing = dict(post, user=None)
    assert schema.post_size(missing) == memory.approx_size(missing)


def test_a_feature_maps_size_from_its_strings_is_never_less_than_walking_it_and_close_to_it():
    from modpipe.features.state import ban_features
    from modpipe.features.vector import FEATURE_NAMES, assemble, features_size

    for post in _decoded_posts():
        counts = {"user_posts": 2 ** 63, "url_post_count": 3, **ban_features({"domain": None, "ip": post["ip"]},
                                                                             lambda key: False)}
        features = assemble(post, counts)
        assert len(features) == len(FEATURE_NAMES)
        walked = memory.approx_size(features)
        assert walked <= features_size(features) <= 1.25 * walked, post["post_id"]
    small = {"text_probability": 0.5, "url_domain": "x" * 100}
    assert features_size(small) == memory.approx_size(small)  # not `assemble`'s shape: walked


def test_a_partition_entry_is_charged_from_its_keys_length_never_less_than_walking_it():
    from modpipe.streams.moderation.bundles import _entry_size, partition_for

    for key in ("u1", "bench-abcdef-123456", "é" * 50, "😀" * 40, "x" * 300):
        for partitions in (4, 16, 2 ** 40):
            walked = memory.approx_size((key, partitions)) + memory.approx_size(partition_for(key, partitions))
            assert walked <= _entry_size((key, partitions), 3) <= walked + 64
