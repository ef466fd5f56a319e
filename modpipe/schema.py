"""Every message modpipe reads or writes, in one place: decoding with validation, and encoding.

Messages are JSON (orjson) objects carrying `schema_version`. Decoders never trust input: any
problem raises `InvalidMessage(reason, detail)`, where `reason` is a short stable code used as the
dead-letter reason and the `reason` label of `modpipe_dead_letters_total`. JSON Schema files for
each message live in `modpipe/schemas/` and a test keeps them in agreement with these decoders.
"""

from __future__ import annotations

import base64
import ipaddress
import math
import sys
import time
from datetime import datetime
from typing import Any

import orjson

from modpipe import memory

SCHEMA_VERSION = 1
SUPPORTED_VERSIONS = frozenset({1})
VERDICTS = ("allow", "review", "block")
MAX_ID_CHARS = 256
MAX_URL_CHARS = 4096
MAX_JOURNEY_STEPS = 1000
DEAD_LETTER_RAW_CAP = 64 * 1024  # bytes of the original record kept in a dead letter


class InvalidMessage(ValueError):
    """Input that cannot be processed. `reason` is a stable code; `detail` says what exactly is wrong."""

    REASONS = ("invalid_utf8", "bad_json", "not_an_object", "missing_field", "wrong_type", "invalid_value",
               "text_too_long", "unknown_schema_version")

    def __init__(self, reason: str, detail: str):
        assert reason in self.REASONS, reason
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj)


def dumps_kept(obj: Any) -> bytes:
    """`dumps` for bytes held beyond the call (a table's staged write, a record waiting for its transaction):
    orjson's result keeps its whole write buffer (tracemalloc, orjson 3.13: 4 KB for a 10-byte key, 32 KB for a
    3 KB state, 519 KB for 40 KB), an exact-size copy only its length."""
    return bytes(memoryview(orjson.dumps(obj)))


def now_ms() -> int:
    return int(time.time() * 1000)


_SECOND_TEXTS: dict[int, str] = {}  # epoch second -> its text: a decision's two times fall in few seconds


def rfc3339(ms: int | float) -> str:
    """Epoch milliseconds -> RFC 3339 UTC with millisecond precision."""
    seconds, millis = divmod(int(ms), 1000)
    text = _SECOND_TEXTS.get(seconds)
    if text is None:
        if len(_SECOND_TEXTS) >= 4096:
            _SECOND_TEXTS.clear()
        text = _SECOND_TEXTS[seconds] = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
    return f"{text}.{millis:03d}Z"


def epoch_ms(timestamp: str) -> int:
    """RFC 3339 (as `rfc3339` writes it, or with an offset) -> epoch milliseconds."""
    return int(datetime.fromisoformat(str(timestamp).replace("Z", "+00:00")).timestamp() * 1000)


# ---------------------------------------------------------------------------------------------- decoding helpers

def _load_object(raw: bytes | str) -> dict:
    try:
        obj = orjson.loads(raw)  # checks the UTF-8 of all of it too: one pass over a valid record
    except orjson.JSONDecodeError as exc:
        if isinstance(raw, bytes | bytearray | memoryview):  # which of the two it was
            try:
                bytes(raw).decode("utf-8")
            except UnicodeDecodeError as bad:
                raise InvalidMessage("invalid_utf8", f"not valid UTF-8 at byte {bad.start}") from None
        raise InvalidMessage("bad_json", str(exc)) from None
    if not isinstance(obj, dict):
        raise InvalidMessage("not_an_object", f"expected a JSON object, got {type(obj).__name__}")
    version = obj.get("schema_version")
    if version is None:
        raise InvalidMessage("missing_field", "schema_version")
    # type first: `version in SUPPORTED_VERSIONS` raises TypeError for a list or an object (found by fuzzing)
    if isinstance(version, bool) or not isinstance(version, int) or version not in SUPPORTED_VERSIONS:
        raise InvalidMessage("unknown_schema_version", f"schema_version {version!r} is not one of "
                             f"{sorted(SUPPORTED_VERSIONS)}")
    return obj


def _field(obj: dict, name: str, kind: type | tuple, *, where: str = "", optional: bool = False) -> Any:
    value = obj.get(name)
    if value is None:
        if optional:
            return None
        raise InvalidMessage("missing_field", f"{where}{name}")
    if type(value) is kind:  # the common case, decided at once (a bool is never an int here: exact type)
        return value
    # bool is an int in Python; a boolean is never a valid count or id.
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise InvalidMessage("wrong_type", f"{where}{name} must be {_kind_name(kind)}, got boolean")
    if not isinstance(value, kind):
        raise InvalidMessage("wrong_type", f"{where}{name} must be {_kind_name(kind)}, got {type(value).__name__}")
    return value


def _kind_name(kind) -> str:
    names = {str: "a string", int: "an integer", float: "a number", bool: "a boolean", dict: "an object",
             list: "an array"}
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _ident(obj: dict, name: str, where: str = "") -> str:
    value = _field(obj, name, str, where=where)
    if not value or len(value) > MAX_ID_CHARS:
        raise InvalidMessage("invalid_value", f"{where}{name} must be 1..{MAX_ID_CHARS} characters")
    return value


def _timestamp(obj: dict, name: str, where: str = "", optional: bool = False) -> str | None:
    value = _field(obj, name, str, where=where, optional=optional)
    if value is None:
        return None
    normalised, problem = _normalised_timestamp(value) if len(value) <= MAX_CACHED_CHARS else (None, "not")
    if problem == "not":
        raise InvalidMessage("invalid_value", f"{where}{name} is not an RFC 3339 timestamp: {value[:40]!r}")
    if problem == "zone":
        raise InvalidMessage("invalid_value", f"{where}{name} has no time zone: {value[:40]!r}")
    return normalised


# Accounts, IPs and clocks repeat across posts: parsing results are cached, for short strings only (a
# hostile 10 MB "timestamp" is refused without being kept).
MAX_CACHED_CHARS = 64


@memory.cached("timestamp_parse")
def _normalised_timestamp(value: str) -> tuple[str | None, str | None]:
    """(RFC 3339 UTC with milliseconds, None), or (None, "not" | "zone") when it is not one / has no zone."""
    try:
        parsed = datetime.fromisoformat(value.replace("z", "Z"))
    except ValueError:
        return None, "not"
    if parsed.tzinfo is None:
        return None, "zone"
    return rfc3339(parsed.timestamp() * 1000), None


def canonical_ip(value: str) -> str | None:
    """The canonical text of an IP address, None when `value` is not one."""
    # checked before the cache: an over-long string is refused without being kept as a key
    return None if len(value) > MAX_CACHED_CHARS else _canonical_ip(value)


@memory.cached("ip_parse")
def _canonical_ip(value: str) -> str | None:
    try:
        return str(ipaddress.ip_address(value.strip()))
    except ValueError:
        return None


def _count(obj: dict, name: str, where: str = "") -> int:
    value = _field(obj, name, int, where=where)
    if value < 0:
        raise InvalidMessage("invalid_value", f"{where}{name} must be >= 0")
    return value


def _number(obj: dict, name: str, where: str = "") -> float | None:
    value = _field(obj, name, (int, float), where=where, optional=True)
    if value is not None and not math.isfinite(value):
        raise InvalidMessage("invalid_value", f"{where}{name} must be finite")
    return None if value is None else float(value)


def _url(obj: dict, name: str = "url") -> str | None:
    value = _field(obj, name, str, optional=True)
    if value is not None:
        value = value.strip()
        if len(value) > MAX_URL_CHARS:
            raise InvalidMessage("invalid_value", f"{name} longer than {MAX_URL_CHARS} characters")
    return value or None


def _choice(obj: dict, name: str, choices: tuple[str, ...]) -> str:
    value = _field(obj, name, str)
    if value not in choices:
        raise InvalidMessage("invalid_value", f"{name} must be one of {list(choices)}, got {value[:40]!r}")
    return value


# ---------------------------------------------------------------------------------------------- messages

def decode_post(raw: bytes | str, max_text_chars: int = 10_000) -> dict:
    """A post as the platform publishes it to `posts`, validated and normalised."""
    obj = _load_object(raw)
    text = _field(obj, "text", str)
    if len(text) > max_text_chars:
        raise InvalidMessage("text_too_long", f"text has {len(text)} characters, the limit is {max_text_chars}")
    raw_ip = _field(obj, "ip", str)
    ip = canonical_ip(raw_ip)
    if ip is None:
        raise InvalidMessage("invalid_value", f"ip is not an IP address: {raw_ip[:40]!r}")
    user = _field(obj, "user", dict)
    journey = _field(obj, "journey", list)
    if len(journey) > MAX_JOURNEY_STEPS:
        raise InvalidMessage("invalid_value", f"journey has more than {MAX_JOURNEY_STEPS} steps")
    steps = []
    for i, step in enumerate(journey):
        if type(step) is dict:  # the common case without building the error path (`where`) of each step
            name, ms = step.get("step"), step.get("ms")
            if type(name) is str and type(ms) is int and ms >= 0:
                steps.append({"step": name, "ms": ms})
                continue
        where = f"journey[{i}]."
        if not isinstance(step, dict):
            raise InvalidMessage("wrong_type", f"journey[{i}] must be an object")
        steps.append({"step": _field(step, "step", str, where=where), "ms": _count(step, "ms", where)})
    reputation = _field(obj, "url_reputation", dict, optional=True)
    return {
        "schema_version": SCHEMA_VERSION,
        "post_id": _ident(obj, "post_id"),
        "user_id": _ident(obj, "user_id"),
        "created_at": _timestamp(obj, "created_at"),
        "text": text,
        "url": _url(obj),
        "ip": ip,
        "user": {
            "created_at": _timestamp(user, "created_at", "user."),
            "email_domain": _field(user, "email_domain", str, where="user.").strip().lower(),
            "friends": _count(user, "friends", "user."),
            "followers": _count(user, "followers", "user."),
            "verified": _field(user, "verified", bool, where="user."),
        },
        "journey": steps,
        "url_reputation": None if reputation is None else {
            "age_days": _number(reputation, "age_days", "url_reputation."),
            "wot_score": _number(reputation, "wot_score", "url_reputation."),
            "google_risk": _number(reputation, "google_risk", "url_reputation."),
        },
    }


_POST_KEYS = ("schema_version", "post_id", "user_id", "created_at", "text", "url", "ip", "user", "journey",
              "url_reputation")
_USER_KEYS = ("created_at", "email_domain", "friends", "followers", "verified")
_REPUTATION_KEYS = ("age_days", "wot_score", "google_risk")
_S = memory.SCALAR_BOUND
# the field names (charged as if each post owned them, as `memory.approx_size` does) and the scalar fields
_POST_FIXED = sum(map(memory.str_size, _POST_KEYS + _USER_KEYS)) + 4 * _S  # schema_version, friends, followers, verified
_STEP_FIXED = memory.str_size("step") + memory.str_size("ms") + _S
_REPUTATION_FIXED = sum(map(memory.str_size, _REPUTATION_KEYS)) + 3 * _S


def post_size(post: dict) -> int:
    """At least `memory.approx_size(post)` of a post as `decode_post` returns it (or its JSON round trip through a
    stage topic), from its fields' lengths: the shape is known, so only its strings are measured (a few us less
    than walking it, on every queued post). Anything of another shape is walked."""
    try:
        if len(post) != len(_POST_KEYS):
            return memory.approx_size(post)
        user, journey, reputation, url = post["user"], post["journey"], post["url_reputation"], post["url"]
        size = (memory.str_size(post["text"])  # alone: one wide character elsewhere must not make it four times
                + memory.strs_size([post["post_id"], post["user_id"], post["created_at"], post["ip"],
                                    user["created_at"], user["email_domain"]])
                + _POST_FIXED + sys.getsizeof(post) + sys.getsizeof(user)
                + (_S if url is None else memory.str_size(url))
                + (_S if reputation is None else _REPUTATION_FIXED + sys.getsizeof(reputation))
                + sys.getsizeof(journey))
        if journey:
            size += (sum(map(sys.getsizeof, journey)) + len(journey) * _STEP_FIXED
                     + memory.strs_size([step["step"] for step in journey]))
        return size
    except (KeyError, TypeError, AttributeError):  # not a decoded post
        return memory.approx_size(post)


def decode_report(raw: bytes | str) -> dict:
    """A user's complaint about a post, published to `reports`."""
    obj = _load_object(raw)
    return {
        "schema_version": SCHEMA_VERSION,
        "report_id": _ident(obj, "report_id"),
        "post_id": _ident(obj, "post_id"),
        "reporter_id": _ident(obj, "reporter_id"),
        "reported_user_id": _ident(obj, "reported_user_id"),
        "url": _url(obj),
        "reason": _field(obj, "reason", str),
        "created_at": _timestamp(obj, "created_at"),
    }


def decode_engagement(raw: bytes | str) -> dict:
    """A share or comment on a post, published to `engagements`."""
    obj = _load_object(raw)
    return {
        "schema_version": SCHEMA_VERSION,
        "engagement_id": _ident(obj, "engagement_id"),
        "post_id": _ident(obj, "post_id"),
        "url": _url(obj),
        "kind": _choice(obj, "kind", ("share", "comment")),
        "user_id": _ident(obj, "user_id"),
        "created_at": _timestamp(obj, "created_at"),
    }


def decode_label(raw: bytes | str) -> dict:
    """A moderator's final label on a post, published to `labels`."""
    obj = _load_object(raw)
    return {
        "schema_version": SCHEMA_VERSION,
        "post_id": _ident(obj, "post_id"),
        "user_id": _ident(obj, "user_id"),
        "label": _choice(obj, "label", ("spam", "ham")),
        "moderator_id": _ident(obj, "moderator_id"),
        "created_at": _timestamp(obj, "created_at"),
    }


def decode_ban(raw: bytes | str) -> dict:
    """Ban or unban a domain or an IP address, published to `bans`."""
    obj = _load_object(raw)
    kind = _choice(obj, "kind", ("domain", "ip"))
    value = _field(obj, "value", str).strip().lower()
    if kind == "ip":
        try:
            value = str(ipaddress.ip_address(value))
        except ValueError:
            raise InvalidMessage("invalid_value", f"value is not an IP address: {value[:40]!r}") from None
    elif not value or len(value) > 253:
        raise InvalidMessage("invalid_value", "value must be a domain name of 1..253 characters")
    return {
        "schema_version": SCHEMA_VERSION,
        "ban_id": _ident(obj, "ban_id"),
        "kind": kind,
        "value": value,
        "action": _choice(obj, "action", ("ban", "unban")),
        "created_at": _timestamp(obj, "created_at"),
    }


def decision(*, post: dict, verdict: str, spam_probability: float, text_probability: float | None,
             reasons: list[dict], features: dict, short_circuit: str | None, model_versions: dict,
             received_at_ms: int, decided_at_ms: int, revision: int = 1, degraded: bool = False) -> dict:
    """The verdict on one post, published to `decisions` keyed by post_id. `degraded`: decided without the
    text model during an outage (a later revision decides it with the text model)."""
    if verdict not in VERDICTS:
        raise ValueError(f"verdict must be one of {VERDICTS}")
    return {
        "schema_version": SCHEMA_VERSION,
        "post_id": post["post_id"],
        "user_id": post["user_id"],
        "verdict": verdict,
        "spam_probability": round(float(spam_probability), 6),
        "text_probability": None if text_probability is None else round(float(text_probability), 6),
        "reasons": reasons,
        "features": features,
        "short_circuit": short_circuit,
        "model_versions": model_versions,
        "revision": revision,
        "degraded": bool(degraded),
        "received_at": rfc3339(received_at_ms),
        "decided_at": rfc3339(decided_at_ms),
        "latency_ms": max(0, decided_at_ms - received_at_ms),
    }


def decode_decision(raw: bytes | str) -> dict:
    """Decisions are ours; decoding them (for smoke checks and the UI) only checks the envelope."""
    obj = _load_object(raw)
    _ident(obj, "post_id")
    _choice(obj, "verdict", VERDICTS)
    return obj


def dead_letter(*, topic: str, partition: int, offset: int, key: bytes | None, raw: bytes | None,
                error: InvalidMessage | Exception, at_ms: int | None = None) -> dict:
    """What could not be processed, with where it came from and why; the raw bytes are kept (capped)."""
    raw = raw or b""
    reason = error.reason if isinstance(error, InvalidMessage) else "processing_error"
    return {
        "schema_version": SCHEMA_VERSION,
        "source": {"topic": topic, "partition": partition, "offset": offset},
        "key": None if key is None else base64.b64encode(key[:1024]).decode(),
        "raw": base64.b64encode(raw[:DEAD_LETTER_RAW_CAP]).decode(),
        "raw_truncated": len(raw) > DEAD_LETTER_RAW_CAP,
        "raw_size": len(raw),
        "reason": reason,
        "error": str(error)[:2000],
        "at": rfc3339(at_ms if at_ms is not None else now_ms()),
    }


def json_schema(name: str) -> dict:
    """The JSON Schema (draft 2020-12) of a message: post, report, decision, dead_letter."""
    from importlib.resources import files

    return orjson.loads(files("modpipe.schemas").joinpath(f"{name}.v{SCHEMA_VERSION}.json").read_bytes())
