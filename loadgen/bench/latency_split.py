"""Where each decision's latency goes, from the times in its record and the time a reader sees it.

Reads the decisions topic (MODPIPE_TOPIC_PREFIX) from its end for --seconds with the load generator's reader
(`read_committed`, paced by `fetching.paced_fetches` and MODPIPE_FETCH_PAUSE_MS), while something else sends
posts, e.g.

    modpipe up --workers 1 &                                  # its own empty MODPIPE_STATE_DIR
    modpipe bench latency-split --seconds 75 &
    KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092 modpipe loadgen --rate 5 --duration 60

and splits each first decision (revision 1) into: its post record's timestamp (set when the post was produced,
the decision's `received_at`) -> `decided_at` (the worker's fetch, the features, Triton), `decided_at` -> the
decision record's timestamp (its produce), that -> seen (the checkpoint's commit and this reader's own fetch).
p50 / p90 / p95 / p99 / max of each part in ms; the clocks are the same machine's.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime

import orjson
from modpipe.loadgen.smoke import end_consumer

from modpipe.services.fetching import paced_fetches
from modpipe.settings import Settings

PARTS = (
    ("post -> decided", lambda r: r["decided"] - r["posted"]),
    ("decided -> produced", lambda r: r["produced"] - r["decided"]),
    ("produced -> seen", lambda r: r["seen"] - r["produced"]),
    ("total", lambda r: r["seen"] - r["posted"]),
)
QUANTILES = (("p50", 0.5), ("p90", 0.9), ("p95", 0.95), ("p99", 0.99), ("max", 1.0))


def epoch_ms(rfc3339: str) -> float:
    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp() * 1000


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def row(decision: dict, produced_ms: float, seen_ms: float) -> dict | None:
    """One first decision's times (ms since the epoch), or None for a later revision."""
    if decision.get("revision") != 1:
        return None
    return {"post_id": decision["post_id"], "posted": epoch_ms(decision["received_at"]),
            "decided": epoch_ms(decision["decided_at"]), "produced": produced_ms, "seen": seen_ms}


def summarise(rows: list[dict]) -> dict:
    """Each part's quantiles in ms, over the rows."""
    return {"decisions": len(rows),
            "parts": {name: {label: round(quantile([part(r) for r in rows], q), 1) for label, q in QUANTILES}
                      for name, part in PARTS}}


def read(settings: Settings, bootstrap: str, seconds: float) -> list[dict]:
    # the load generator's reader: read_committed, at the topic's end, configured for paced fetches
    consumer = end_consumer(settings, bootstrap, [settings.topic("decisions")], paced=True)
    stop = threading.Event()
    timer = threading.Timer(seconds, stop.set)
    timer.start()
    rows = []
    try:
        for messages in paced_fetches(consumer, stop, settings.fetch_pause_ms / 1000):
            seen = time.time() * 1000
            for m in messages:
                r = row(orjson.loads(m.value()), m.timestamp()[1], seen)
                if r is not None:
                    rows.append(r)
    finally:
        timer.cancel()
        consumer.close()
    return rows


def format_text(report: dict) -> str:
    lines = [f"{report['decisions']} decisions, ms: " + " ".join(f"{label:>7}" for label, _ in QUANTILES)]
    for name, values in report["parts"].items():
        lines.append(f"{name:22s} " + " ".join(f"{values[label]:7.1f}" for label, _ in QUANTILES))
    return "\n".join(lines)
