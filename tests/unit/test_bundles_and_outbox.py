"""streams.bundles (placing items, one record per partition) and streams.outbox.Pending (acks only after
delivery), without a broker."""

from __future__ import annotations

import orjson
import pytest

from streams import bundles
from streams.bundles import Bundler, decode_bundle, partition_for
from streams.outbox import Pending


def test_partition_for_is_stable_and_in_range():
    assert partition_for("user-1", 4) == partition_for("user-1", 4)
    assert {partition_for(f"user-{i}", 4) for i in range(200)} == {0, 1, 2, 3}


def test_a_bundle_holds_items_of_one_partition_and_keeps_their_order():
    b = Bundler(4)
    keys = [f"k{i}" for i in range(40)]
    for i, key in enumerate(keys):
        b.add("features.user", key, {"i": i, "key": key})
    records = list(b.records())
    assert not b and b.items == 0  # emptied
    assert len(records) == len({partition_for(k, 4) for k in keys})
    seen = []
    for topic, partition, value, n in records:
        items = decode_bundle(value)
        assert topic == "features.user" and len(items) == n
        assert all(partition_for(item["key"], 4) == partition for item in items)
        assert [item["i"] for item in items] == sorted(item["i"] for item in items)
        seen += [item["i"] for item in items]
    assert sorted(seen) == list(range(40))


def test_a_large_destination_is_split_into_several_records(monkeypatch):
    monkeypatch.setattr(bundles, "MAX_BUNDLE_BYTES", 1000)
    b = Bundler(1)
    for i in range(50):
        b.add("t", "k", {"i": i, "pad": "x" * 100})
    records = list(b.records())
    assert len(records) > 1 and all(len(value) <= 1000 + 200 for _, _, value, _ in records)
    assert [item["i"] for *_, value, _ in [(r[0], r[1], r[2], r[3]) for r in records]
            for item in decode_bundle(value)] == list(range(50))


def test_decode_bundle_refuses_other_records():
    assert decode_bundle(orjson.dumps({"items": [{"a": 1}]})) == [{"a": 1}]
    for bad in (b"[]", b'{"x": 1}', b'{"items": 3}'):
        with pytest.raises(ValueError):
            decode_bundle(bad)
    with pytest.raises(orjson.JSONDecodeError):
        decode_bundle(b"not json")


class Message:
    def __init__(self):
        self.refcount = 1
        self.acked = False
        self.tp, self.offset = ("t", 0), 0

    def incref(self, n=1):
        self.refcount += n


class FakeEvent:
    def __init__(self):
        self.message = Message()

    def ack(self):  # faust: decref, and the last reference marks the offset committable
        self.message.refcount -= 1
        if self.message.refcount == 0:
            self.message.acked = True
            return True
        return False


class FakeStream:
    def _on_stream_event_out(self, *args):
        pass

    def _on_message_out(self, *args):
        pass


def test_pending_acks_its_events_only_after_every_hold_is_released():
    events = [FakeEvent(), FakeEvent()]
    done = []
    p = Pending(FakeStream(), events, on_done=lambda: done.append(1))
    p.hold(2)  # two records produced
    p.seal()
    for e in events:
        e.ack()  # the stream's own ack after the round's body: our reference keeps them unacked
    p.release()
    assert not any(e.message.acked for e in events) and not done
    p.release()
    assert all(e.message.acked for e in events) and done == [1]


def test_a_failed_delivery_never_acks_and_reports_the_error():
    errors = []
    events = [FakeEvent()]
    p = Pending(FakeStream(), events, on_error=errors.append)
    events[0].ack()
    p.hold()
    p.seal()
    p.release(RuntimeError("broker gone"))
    assert not events[0].message.acked and len(errors) == 1
