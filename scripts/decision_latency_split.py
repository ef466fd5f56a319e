"""Probe: where each decision's latency goes, from the times in its record and the time a reader sees it.

    .venv/bin/python scripts/decision_latency_split.py [--bootstrap 127.0.0.1:9092] [--seconds 75] [--out FILE]

Reads the decisions topic (MODPIPE_TOPIC_PREFIX, MODPIPE_PARTITIONS) from its end for --seconds with the load
generator's reader (`read_committed`, paced by `fetching.paced_fetches` and MODPIPE_FETCH_PAUSE_MS), while
something else sends posts, e.g.

    .venv/bin/modpipe up --workers 1 &                       # its own empty MODPIPE_STATE_DIR
    .venv/bin/python scripts/decision_latency_split.py &
    KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092 .venv/bin/modpipe loadgen --rate 5 --duration 60

and splits each first decision (revision 1) into: its post record's timestamp (set when the post was produced,
the decision's `received_at`) -> `decided_at` (the worker's fetch, the features, Triton), `decided_at` -> the decision record's timestamp (its produce), that -> seen (the
checkpoint's commit and this reader's own fetch). Prints p50 / p90 / p95 / p99 / max of each part in ms;
--out writes the rows as JSON. The clocks are the same machine's.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from datetime import datetime

from modpipe.loadgen.smoke import end_consumer

from modpipe.services.fetching import paced_fetches
from modpipe.settings import Settings

PARTS = (
    ("post -> decided", lambda r: r["decided"] - r["posted"]),
    ("decided -> produced", lambda r: r["produced"] - r["decided"]),
    ("produced -> seen", lambda r: r["seen"] - r["produced"]),
    ("total", lambda r: r["seen"] - r["posted"]),
)


def epoch_ms(rfc3339: str) -> float:
    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp() * 1000


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", default="127.0.0.1:9092", help="the broker (default: `modpipe up`'s)")
    ap.add_argument("--seconds", type=float, default=75.0, help="how long to read")
    ap.add_argument("--out", help="write every decision's times here (JSON)")
    args = ap.parse_args()
    settings = Settings.from_env()
    # the load generator's reader: read_committed, at the topic's end, configured for paced fetches
    consumer = end_consumer(settings, args.bootstrap, [settings.topic("decisions")], paced=True)
    stop = threading.Event()
    threading.Timer(args.seconds, stop.set).start()
    rows = []
    for messages in paced_fetches(consumer, stop, settings.fetch_pause_ms / 1000):
        seen = time.time() * 1000
        for m in messages:
            d = json.loads(m.value())
            if d.get("revision") == 1:
                rows.append({"post_id": d["post_id"], "posted": epoch_ms(d["received_at"]),
                             "decided": epoch_ms(d["decided_at"]), "produced": m.timestamp()[1], "seen": seen})
    consumer.close()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f)
    if not rows:
        raise SystemExit("no decisions seen: is anything sending posts?")
    print(f"{len(rows)} decisions, ms: " + " ".join(f"{h:>7}" for h in ("p50", "p90", "p95", "p99", "max")))
    for name, part in PARTS:
        values = [part(r) for r in rows]
        print(f"{name:22s} " + " ".join(f"{quantile(values, q):7.1f}" for q in (0.5, 0.9, 0.95, 0.99, 1.0)))


if __name__ == "__main__":
    main()
