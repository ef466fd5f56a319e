"""modpipe/services/offsets.py: watermarks asked again while a partition has no leader, and only then."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from modpipe.services import offsets


class Answers:
    """A client whose get_watermark_offsets raises the given codes in turn, then answers (3, 9)."""

    def __init__(self, *codes):
        self.codes = list(codes)
        self.calls = 0

    def get_watermark_offsets(self, tp, timeout=None):
        self.calls += 1
        if self.codes:
            raise KafkaException(KafkaError(self.codes.pop(0)))
        return 3, 9


def test_a_missing_leader_is_asked_again(monkeypatch):
    monkeypatch.setattr(offsets, "RETRY_S", 0.001)
    client = Answers(KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError._DESTROY,
                     KafkaError._DESTROY_BROKER)
    assert offsets.watermarks(client, "tp", 5) == (3, 9) and client.calls == 5


def test_other_errors_and_an_unknown_topic_that_must_exist_raise_at_once(monkeypatch):
    monkeypatch.setattr(offsets, "RETRY_S", 0.001)
    for client, kwargs in ((Answers(KafkaError.TOPIC_AUTHORIZATION_FAILED), {}),
                           (Answers(KafkaError.UNKNOWN_TOPIC_OR_PART), {"topic_may_be_new": False})):
        with pytest.raises(KafkaException):
            offsets.watermarks(client, "tp", 5, **kwargs)
        assert client.calls == 1
    new_topic = Answers(KafkaError.UNKNOWN_TOPIC_OR_PART)
    assert offsets.watermarks(new_topic, "tp", 5) == (3, 9)


def test_it_gives_up_at_its_timeout(monkeypatch):
    monkeypatch.setattr(offsets, "RETRY_S", 0.01)
    client = Answers(*[KafkaError.NOT_LEADER_FOR_PARTITION] * 1000)
    with pytest.raises(KafkaException):
        offsets.watermarks(client, "tp", 0.1)
    assert 2 <= client.calls < 100
