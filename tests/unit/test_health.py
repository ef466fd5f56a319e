"""The worker's probes (streams/runtime/health.py) and a ban log reader that fails (streams/moderation/bans.py), without a broker."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from modpipe.streams import metrics
from modpipe.streams.moderation import bans as bans_module
from modpipe.streams.runtime import health

from modpipe.services.process import free_port
from modpipe.settings import Settings


def _get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_readiness_needs_every_check_and_liveness_only_its_own():
    state = {"bans": False, "warm": True, "alive": True}
    probes = health.Health()
    probes.live_checks["reader"] = lambda: state["alive"]
    probes.ready_checks.update({"bans": lambda: state["bans"], "warm": lambda: state["warm"],
                                "broken": lambda: (1 / 0) if state["bans"] is None else True})
    port = free_port()
    server = health.serve("127.0.0.1", port, probes)
    try:
        code, body = _get(port, "/readyz")
        assert code == 503 and json.loads(body) == {"ok": False, "checks": {"reader": True, "bans": False,
                                                                            "warm": True, "broken": True}}
        assert metrics.WORKER_READY._value.get() == 0
        assert _get(port, "/livez")[0] == 200
        state["bans"] = True
        assert _get(port, "/readyz")[0] == 200 and metrics.WORKER_READY._value.get() == 1
        state["alive"] = False  # a dead reader fails both
        assert _get(port, "/livez")[0] == 503 and _get(port, "/readyz")[0] == 503
        state["bans"] = None  # a check that raises fails instead of breaking the probe
        code, body = _get(port, "/readyz")
        assert code == 503 and json.loads(body)["checks"]["broken"] is False
        code, body = _get(port, "/metrics")
        assert code == 200 and b"modpipe_worker_ready" in body
        assert _get(port, "/nope")[0] == 404
    finally:
        server.shutdown()


class _BrokenConsumer:
    """Stands in for a consumer whose broker cannot be reached: the reader's failure path, not Kafka."""

    def __init__(self, conf):
        pass

    def list_topics(self, topic, timeout):
        raise RuntimeError("metadata request timed out")

    def close(self):
        pass


def test_a_reader_that_fails_is_never_silent(monkeypatch, tmp_path):
    monkeypatch.setattr(bans_module, "Consumer", _BrokenConsumer)
    failures = []
    registry = bans_module.BanRegistry(Settings.from_env(state_dir=tmp_path), "127.0.0.1:1", "bans",
                                       on_failure=failures.append)
    assert registry.alive()
    registry.start()
    with pytest.raises(bans_module.BanLogUnavailable, match="metadata request timed out"):
        registry.wait_caught_up(10, progress_every_s=0.05)
    assert not registry.alive() and not registry.is_caught_up
    assert [str(e) for e in failures] == ["metadata request timed out"]
    assert metrics.BAN_LOG_READER_UP._value.get() == 0


def test_waiting_for_the_ban_log_times_out(monkeypatch, tmp_path):
    registry = bans_module.BanRegistry(Settings.from_env(state_dir=tmp_path), "127.0.0.1:1", "bans")
    with pytest.raises(bans_module.BanLogUnavailable, match="not read to its end within 0 s"):
        registry.wait_caught_up(0.2, progress_every_s=0.05)


def test_the_warm_up_post_is_a_valid_post():
    import orjson
    from modpipe.streams.worker import WARM_UP_POST

    from modpipe import schema

    assert schema.decode_post(orjson.dumps(WARM_UP_POST))["post_id"] == "modpipe-warm-up"


def test_the_warm_up_pays_the_feature_paths_one_off_costs_before_any_post():
    """The first non-ASCII text builds the fingerprint's class of format characters (~0.1 s) and the first link
    loads the suffix list: the warm-up does both, so that no post of the worker's first second waits for them."""
    import types

    from modpipe.features import text
    from modpipe.streams.worker import WARM_UP_POST, warm_up

    from modpipe.decision.verdict import ThresholdDecider

    assert not WARM_UP_POST["text"].isascii() and WARM_UP_POST["url"]
    text._format_chars.cache_clear()
    decided = []

    class Decider(ThresholdDecider):
        def decide_many(self, features_list):
            decided.extend(features_list)
            return super().decide_many(features_list)

    assert warm_up(types.SimpleNamespace(disabled=True), Decider(), timeout_s=1.0)
    assert text._format_chars.cache_info().currsize == 1
    assert decided and decided[0]["url_present"] is True
