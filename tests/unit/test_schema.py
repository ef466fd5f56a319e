"""Message decoding: every kind of bad input gets its own reason; the JSON Schemas agree with the decoders."""

import base64
import random

import jsonschema
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from modpipe.loadgen.posts import make_post, malformed_records

from modpipe import schema
from modpipe.decision.verdict import ThresholdDecider


def valid_post(**changes):
    post = make_post(random.Random(1), "p-1", "hello world", user_id="u-1", now_ms=1_700_000_000_000)
    post.update(changes)
    return post


def validator(name):
    return jsonschema.Draft202012Validator(schema.json_schema(name), format_checker=jsonschema.FormatChecker())


def test_valid_post_is_normalised():
    raw = valid_post(ip=" 2001:DB8::1 ", created_at="2026-11-22T05:00:00+02:00")
    raw["user"]["email_domain"] = " Gmail.COM "
    post = schema.decode_post(orjson.dumps(raw))
    assert post["created_at"] == "2026-11-22T03:00:00.000Z"
    assert post["ip"] == "2001:db8::1"
    assert post["user"]["email_domain"] == "gmail.com"
    assert validator("post").is_valid(post)


@pytest.mark.parametrize("reason,raw", malformed_records("run-x"))
def test_each_malformed_record_has_its_reason(reason, raw):
    with pytest.raises(schema.InvalidMessage) as info:
        schema.decode_post(raw)
    assert info.value.reason == reason
    assert info.value.detail


@pytest.mark.parametrize("changes,reason", [
    ({"friends": -1}, "invalid_value"),
    ({"verified": "yes"}, "wrong_type"),
    ({"friends": True}, "wrong_type"),
])
def test_user_field_errors(changes, reason):
    raw = valid_post()
    raw["user"].update(changes)
    with pytest.raises(schema.InvalidMessage) as info:
        schema.decode_post(orjson.dumps(raw))
    assert info.value.reason == reason


@pytest.mark.parametrize("changes,reason", [
    ({"ip": "999.1.1.1"}, "invalid_value"),
    ({"created_at": "2026-11-22T03:00:00"}, "invalid_value"),  # no time zone
    ({"journey": [{"step": "type"}]}, "missing_field"),
    ({"journey": "typed"}, "wrong_type"),
    ({"post_id": ""}, "invalid_value"),
    ({"schema_version": True}, "unknown_schema_version"),
    ({"url_reputation": {"wot_score": "high"}}, "wrong_type"),
])
def test_post_field_errors(changes, reason):
    with pytest.raises(schema.InvalidMessage) as info:
        schema.decode_post(orjson.dumps(valid_post(**changes)))
    assert info.value.reason == reason


def test_text_limit_is_configurable():
    raw = orjson.dumps(valid_post(text="x" * 50))
    assert schema.decode_post(raw, max_text_chars=50)["text"] == "x" * 50
    with pytest.raises(schema.InvalidMessage, match="text_too_long"):
        schema.decode_post(raw, max_text_chars=49)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_crash_the_decoder(raw):
    try:
        schema.decode_post(raw)
    except schema.InvalidMessage as exc:
        assert exc.reason in schema.InvalidMessage.REASONS


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.sampled_from(["post_id", "user_id", "text", "ip", "user", "journey", "created_at"]),
                       st.one_of(st.none(), st.integers(-2**63, 2**63 - 1), st.text(max_size=20), st.booleans(),
                                 st.lists(st.integers(-2**63, 2**63 - 1), max_size=2)), max_size=7))
def test_decoder_accepts_only_what_the_json_schema_accepts(fields):
    raw = {**valid_post(), **fields}
    try:
        post = schema.decode_post(orjson.dumps(raw))
    except schema.InvalidMessage:
        return
    assert validator("post").is_valid(post)


def test_decision_and_dead_letter_match_their_schemas():
    post = schema.decode_post(orjson.dumps(valid_post()))
    # The reasons as a real decider writes them, so the schema is checked against what is published.
    reasons = ThresholdDecider().decide_many([{"text_probability": 0.7}])[0].reasons
    record = schema.decision(post=post, verdict="review", spam_probability=0.7, text_probability=0.7,
                             reasons=reasons,
                             features={"text_probability": 0.7}, short_circuit=None,
                             model_versions={"text_model": "abc"}, received_at_ms=1000, decided_at_ms=1012)
    validator("decision").validate(record)
    assert record["latency_ms"] == 12
    raw = b"\xff" * (schema.DEAD_LETTER_RAW_CAP + 10)
    error = schema.InvalidMessage("invalid_utf8", "byte 0")
    dl = schema.dead_letter(topic="posts", partition=2, offset=9, key=b"k", raw=raw, error=error)
    validator("dead_letter").validate(dl)
    assert dl["reason"] == "invalid_utf8" and dl["raw_truncated"] and dl["raw_size"] == len(raw)
    assert base64.b64decode(dl["raw"]) == raw[:schema.DEAD_LETTER_RAW_CAP]


def test_decision_rejects_unknown_verdict():
    with pytest.raises(ValueError):
        schema.decision(post={"post_id": "p", "user_id": "u"}, verdict="maybe", spam_probability=0.1,
                        text_probability=0.1, reasons=[], features={}, short_circuit=None, model_versions={},
                        received_at_ms=0, decided_at_ms=0)


def test_report_decoding():
    raw = {"schema_version": 1, "report_id": "r1", "post_id": "p1", "reporter_id": "u2", "reported_user_id": "u1",
           "reason": "spam", "created_at": "2026-11-22T03:00:00Z"}
    report = schema.decode_report(orjson.dumps(raw))
    assert validator("report").is_valid(report) and report["url"] is None
    with pytest.raises(schema.InvalidMessage, match="missing_field"):
        schema.decode_report(orjson.dumps({k: v for k, v in raw.items() if k != "reporter_id"}))


JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**63 - 1), st.floats(allow_nan=False), st.text(max_size=30)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=8)


def _valid_of(kind: str) -> dict:
    from modpipe.loadgen.fuzz import valid_record

    return valid_record(kind, random.Random(0), 0, "prop")


@pytest.mark.parametrize("kind", ["post", "report", "engagement", "label", "ban"])
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_any_json_value_in_any_field_is_decoded_or_refused_with_a_reason(kind, data):
    """The decoders' contract, for every input topic: a record is returned valid or refused with
    InvalidMessage and a known reason, whatever JSON sits in whichever field (schema_version included:
    fuzzing found `{"schema_version": {}}` raising TypeError)."""
    from modpipe.loadgen.fuzz import DECODERS

    record = _valid_of(kind)
    field = data.draw(st.sampled_from([*record, "schema_version", "unexpected"]))
    record[field] = data.draw(JSON_VALUES)
    try:
        DECODERS[kind](orjson.dumps(record))
    except schema.InvalidMessage as exc:
        assert exc.reason in schema.InvalidMessage.REASONS


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.sampled_from([bytes, bytearray, memoryview]))
def test_a_record_that_is_not_utf8_is_refused_as_such_whatever_else_is_wrong(raw, kind):
    raw = b'{"schema_version": 1, "text": "' + raw  # often broken JSON as well: the UTF-8 reason wins
    try:
        raw.decode("utf-8")
        utf8 = True
    except UnicodeDecodeError:
        utf8 = False
    with pytest.raises(schema.InvalidMessage) as info:
        schema.decode_post(kind(raw))
    assert (info.value.reason == "invalid_utf8") == (not utf8)


def test_a_valid_post_decodes_from_any_bytes_like_value_and_its_steps_are_checked():
    raw = orjson.dumps(valid_post())
    assert schema.decode_post(bytearray(raw)) == schema.decode_post(memoryview(raw)) == schema.decode_post(raw)
    for journey, reason in (([{"step": "type", "ms": -1}], "invalid_value"), ([{"step": 3, "ms": 1}], "wrong_type"),
                            ([{"step": "type", "ms": True}], "wrong_type"), (["type"], "wrong_type")):
        with pytest.raises(schema.InvalidMessage) as info:
            schema.decode_post(orjson.dumps(valid_post(journey=journey)))
        assert info.value.reason == reason and "journey[0]" in info.value.detail


def test_rfc3339_writes_every_millisecond_as_strftime_does_through_its_cache_of_seconds():
    import time

    start = 1_764_400_000_000
    for ms in [start + 137 * i for i in range(10_000)] + [0, 999, 1000, 86_399_999, 253_402_300_799_999]:
        seconds, millis = divmod(ms, 1000)
        assert schema.rfc3339(ms) == time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"
    assert len(schema._SECOND_TEXTS) <= 4096
