"""What a load run measured: decisions collected, consumer lag sampled, and the report computed from them.

- `DecisionCollector`: a background thread on a group-less consumer positioned at the end of
  `decisions` BEFORE anything is produced (`modpipe.loadgen.smoke.end_consumer`), so it sees only this run.
- `LagSampler`: every `interval_s`, the committed offsets of group `settings.app_id` vs the high
  watermarks of `posts` (records produced but not yet processed).
- `summarize`: throughput, end-to-end latency (each post's scheduled send time -> decision seen by a
  read_committed consumer, its transaction committed; see `DecisionCollector`; beside it the same from the
  produce() call, which hides the wait of a producer that fell behind), lag, accuracy vs
  the ground truth (spam = verdict in {review, block}, and separately block only), the verdict x truth
  confusion matrix and per-scenario/actor breakdowns. `format_table` renders it; `plot` draws it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from modpipe.simulation.metrics import binary_metrics, confusion, latency_summary, percentile, round_or_none

from modpipe import log, schema
from modpipe.services.fetching import START_GRACE_S, paced_fetches
from modpipe.services.offsets import watermarks
from modpipe.settings import Settings

_log = log.get(__name__)

FLAGGED = ("review", "block")


# ---------------------------------------------------------------------------------------------- collection

@dataclass
class Decided:
    received: float  # wall time of the first decision
    verdict: str  # of the first decision
    spam_probability: float
    pipeline_latency_ms: float | None
    count: int = 1  # decisions received for the post (revisions and duplicates)
    last_verdict: str = ""
    last_revision: int = 1


class DecisionCollector(threading.Thread):
    """Collects decisions whose post_id starts with `prefix` (this run's ids).

    A decision's time is when this read_committed consumer got it: a decision counts once its transaction
    has committed (its record timestamp is set earlier, inside the transaction). The collector runs on the
    machine it measures, where a consumer that polls the embedded broker without pause spins and takes the
    CPU from the pipeline: it paces its fetches (modpipe/services/fetching.py), pausing its partitions for
    `pause_s` (MODPIPE_FETCH_PAUSE_MS) after each, so a decision may be seen up to that much later."""

    def __init__(self, consumer, prefix: str, clock=time.time, pause_s: float = 0.02):
        super().__init__(name="loadgen-decisions", daemon=True)
        self.consumer = consumer
        self.prefix = prefix
        self.clock = clock
        self.pause_s = pause_s
        self.decided: dict[str, Decided] = {}
        self.invalid = 0
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self.paced_from = time.monotonic() + START_GRACE_S  # see paced_fetches; `settle` waits for it
        # per partition, the offset after the last record polled; until then the end it was assigned at
        self._next: dict[tuple[str, int], int] = {}
        if consumer is not None:
            for tp in consumer.assignment():
                self._next[(tp.topic, tp.partition)] = watermarks(consumer, tp, 10)[1]

    def settle(self) -> None:
        """Until the collector paces its fetches: before that it spins, and a run's first seconds would be
        measured on a machine it loads (its first posts' latency rose to 400-600 ms, measured)."""
        time.sleep(max(0.0, self.paced_from - time.monotonic()))

    def handle(self, raw: bytes, now: float) -> None:
        try:
            d = schema.decode_decision(raw)
        except schema.InvalidMessage:
            self.invalid += 1
            return
        pid = d["post_id"]
        if not pid.startswith(self.prefix):
            return
        revision = d.get("revision") if isinstance(d.get("revision"), int) else 1
        with self._lock:
            seen = self.decided.get(pid)
            if seen is None:
                self.decided[pid] = Decided(now, d["verdict"], float(d.get("spam_probability") or 0.0),
                                            d.get("latency_ms"), 1, d["verdict"], revision)
            else:
                seen.count += 1
                if revision >= seen.last_revision:
                    seen.last_verdict, seen.last_revision = d["verdict"], revision

    def run(self) -> None:
        for messages in paced_fetches(self.consumer, self._halt, self.pause_s, next_offsets=self._next):
            now = self.clock()
            for msg in messages:
                self.handle(msg.value(), now)

    def snapshot(self) -> dict[str, Decided]:
        with self._lock:
            return dict(self.decided)

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(5)
        self.consumer.close()


class LagSampler(threading.Thread):
    """Every `interval_s`: (wall time, lag on `posts`, lag over every partition the group has committed).

    Lag = high watermark - committed offset of group `settings.app_id`. The second figure also covers the
    pipeline's internal topics (where a slow scoring stage shows); it is None when the broker cannot list
    a group's offsets."""

    def __init__(self, settings: Settings, bootstrap: str, interval_s: float = 1.0):
        super().__init__(name="loadgen-lag", daemon=True)
        self.settings, self.bootstrap, self.interval_s = settings, bootstrap, interval_s
        self.samples: list[tuple[float, int, int | None]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, TopicPartition
        from confluent_kafka.admin import AdminClient

        conf = {**self.settings.kafka_client_config(), "bootstrap.servers": self.bootstrap}
        consumer = Consumer({**self.settings.kafka_consumer_config(), "bootstrap.servers": self.bootstrap,
                             "group.id": self.settings.app_id, "enable.auto.commit": False})
        admin = AdminClient(conf)
        topic = self.settings.topic("posts")
        group_ok = True

        def lag_of(tps) -> int:
            lag = 0
            for tp in tps:
                low, high = watermarks(consumer, TopicPartition(tp.topic, tp.partition), 5)
                lag += max(0, high - (tp.offset if tp.offset >= 0 else low))
            return lag

        try:
            meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
            n = len(meta.partitions) if meta and meta.partitions else self.settings.partitions
            tps = [TopicPartition(topic, p) for p in range(n)]
            while not self._halt.is_set():
                try:
                    posts_lag = lag_of(consumer.committed(tps, timeout=5))
                    total = None
                    if group_ok:
                        try:
                            fut = admin.list_consumer_group_offsets(
                                [ConsumerGroupTopicPartitions(self.settings.app_id)], request_timeout=5)
                            parts = fut[self.settings.app_id].result().topic_partitions or []
                            total = lag_of([tp for tp in parts if tp.offset >= 0])
                        except Exception as exc:  # noqa: BLE001 - not every broker lists all of a group's offsets
                            group_ok = False
                            _log.info("group offsets not listable; lag covers posts only",
                                      extra={"error": str(exc)[:200]})
                    self.samples.append((time.time(), posts_lag, total))
                except Exception as exc:  # noqa: BLE001 - a missed sample must not end the run
                    _log.debug("lag sample failed", extra={"error": str(exc)[:200]})
                self._halt.wait(self.interval_s)
        finally:
            consumer.close()

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(15)


def group_rss_mib(pgid: int) -> float:
    """Resident memory of a whole process group (Triton's server and its python-backend stubs, which hold the
    model), from /proc; 0 when the group is gone."""
    total_kib = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid:  # field 5 of /proc/PID/stat: the process group
                continue
            for line in (stat.parent / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total_kib += int(line.split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return round(total_kib / 1024, 1)


class RssSampler(threading.Thread):
    """Every `interval_s`: resident memory of each named process group (name -> pgid, asked anew each time so
    a restarted process is followed). For soak runs: memory must be flat after warm-up."""

    def __init__(self, groups: Callable[[], dict[str, int]], interval_s: float = 5.0):
        super().__init__(name="loadgen-rss", daemon=True)
        self.groups, self.interval_s = groups, interval_s
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                self.samples.append((time.time(), {name: group_rss_mib(pgid) for name, pgid in self.groups().items()}))
            except Exception as exc:  # noqa: BLE001 - a missed sample must not end the run
                _log.debug("rss sample failed", extra={"error": str(exc)[:200]})
            self._halt.wait(self.interval_s)

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(15)


def rss_summary(samples: list[tuple[float, dict[str, float]]], t0: float) -> dict:
    """Per process group: first, after warm-up (the end of the first quarter), peak and last, in MiB, and the
    growth from after warm-up to the end (what a leak shows as), with the samples for the plot."""
    names = sorted({n for _, by in samples for n in by})
    out: dict = {"samples": [[round_or_none(t - t0, 1), by] for t, by in samples]}
    for name in names:
        series = [by[name] for _, by in samples if name in by]
        if not series:
            continue
        warm = series[len(series) // 4]
        out[name] = {"first": series[0], "after_warmup": warm, "peak": max(series), "last": series[-1],
                     "growth_after_warmup": round_or_none(series[-1] - warm, 1)}
    return out


# ---------------------------------------------------------------------------------------------- report

def _group_stats(rows: list[tuple[dict, Decided | None, float | None]]) -> dict:
    decided = [(t, d) for t, d, _ in rows if d is not None]
    lat = [x for _, _, x in rows if x is not None]
    verdicts = {v: sum(d.verdict == v for _, d in decided) for v in schema.VERDICTS}
    return {"posts": len(rows), "decided": len(decided), "verdicts": verdicts,
            "flagged_rate": round_or_none(sum(d.verdict in FLAGGED for _, d in decided) / len(decided), 4) if decided else None,
            "blocked_rate": round_or_none(verdicts["block"] / len(decided), 4) if decided else None,
            "p50_ms": round_or_none(percentile(lat, 50))}


def timeseries(sent_at: dict[str, float], scheduled_at: dict[str, float], decided: dict[str, Decided], t0: float,
               bucket_s: float = 1.0) -> list[dict]:
    """Per bucket (by wall time from t0): posts produced, decisions received, latency p50/p95 of those (from
    each post's scheduled time)."""
    buckets: dict[int, dict] = {}

    def b(t: float) -> dict:
        k = int((t - t0) // bucket_s)
        return buckets.setdefault(k, {"t": k * bucket_s, "produced": 0, "decided": 0, "lat": []})

    for ts in sent_at.values():
        b(ts)["produced"] += 1
    for pid, d in decided.items():
        row = b(d.received)
        row["decided"] += 1
        if pid in scheduled_at:
            row["lat"].append((d.received - scheduled_at[pid]) * 1000)
    out = []
    for k in range(min(buckets, default=0), max(buckets, default=-1) + 1):
        row = b(t0 + k * bucket_s + bucket_s / 2)  # empty seconds show as zeros, not as gaps
        lat = row.pop("lat")
        row["p50_ms"], row["p95_ms"] = round_or_none(percentile(lat, 50)), round_or_none(percentile(lat, 95))
        row["produced_per_s"] = round_or_none(row["produced"] / bucket_s, 2)
        row["decided_per_s"] = round_or_none(row["decided"] / bucket_s, 2)
        out.append(row)
    return out


def summarize(*, sent_at: dict[str, float], scheduled_at: dict[str, float], truth: dict[str, dict],
              decided: dict[str, Decided], produce_started: float, produce_finished: float,
              events_by_kind: dict[str, int] | None = None,
              lag_samples: list[tuple[float, int]] | None = None, config: dict | None = None,
              delivery_errors: int = 0, behind_s_max: float = 0.0,
              rss_samples: list[tuple[float, dict[str, float]]] | None = None) -> dict:
    """The load report (JSON-able). Accuracy counts the FIRST decision of each post. `sent_at`: each post's
    produce() time, `scheduled_at`: when it was due (`ProduceStats`)."""
    mine = {pid: d for pid, d in decided.items() if pid in sent_at}
    latencies = [(d.received - scheduled_at[pid]) * 1000 for pid, d in mine.items()]
    from_produce = [(d.received - sent_at[pid]) * 1000 for pid, d in mine.items()]
    produce_s = max(produce_finished - produce_started, 1e-9)
    if mine:
        first_d = min(d.received for d in mine.values())
        last_d = max(d.received for d in mine.values())
    else:
        first_d = last_d = produce_started
    pairs = [(bool(truth[pid]["is_spam"]), d.verdict) for pid, d in mine.items()]
    spam_truth = [t for t, _ in pairs]
    groups: dict[str, list] = {}
    for pid, t in truth.items():
        d = mine.get(pid)
        lat = (d.received - scheduled_at[pid]) * 1000 if d else None
        keys = [f"actor={t.get('actor')}", f"scenario={t.get('scenario')}"]
        if t.get("actor") == "spammer":
            keys.append(f"spam_text={t.get('text_label')}")  # ham here = stealth campaign
            keys.append(f"campaign={t.get('campaign')}")
        if t.get("dataset"):
            keys.append(f"dataset={t.get('dataset')}")
        for k in keys:
            groups.setdefault(k, []).append((t, d, lat))
    pipeline_lat = [float(d.pipeline_latency_ms) for d in mine.values() if d.pipeline_latency_ms is not None]
    samples = [(t, lag, total) for t, lag, *rest in lag_samples or [] for total in [rest[0] if rest else None]]
    lag_values = [lag for _, lag, _ in samples]
    totals = [total for _, _, total in samples if total is not None]
    return {
        "config": config or {},
        "sent": {"posts": len(sent_at), "events": dict(events_by_kind or {}), "delivery_errors": delivery_errors},
        "decided": len(mine),
        "lost": len(sent_at) - len(mine),
        "extra_decisions": sum(d.count - 1 for d in mine.values()),
        "throughput": {
            "produce_posts_per_s": round_or_none(len(sent_at) / produce_s, 2),
            "produce_events_per_s": round_or_none(sum((events_by_kind or {}).values()) / produce_s, 2),
            "produce_seconds": round_or_none(produce_s, 2),
            "producer_behind_max_s": round_or_none(behind_s_max, 3),
            "decisions_per_s": round_or_none(len(mine) / max(last_d - produce_started, 1e-9), 2) if mine else None,
            "decisions_per_s_steady": round_or_none((len(mine) - 1) / (last_d - first_d), 2)
            if len(mine) > 1 and last_d > first_d else None,
            "drain_seconds": round_or_none(max(0.0, last_d - produce_finished), 2),
        },
        "latency_ms": latency_summary(latencies),
        "latency_from_produce_ms": latency_summary(from_produce),
        "latency_is": "scheduled send time -> first decision seen by a read_committed consumer "
                      "(latency_from_produce_ms: from the produce() call)",
        "pipeline_latency_ms": latency_summary(pipeline_lat),
        "lag": {"max": max(lag_values) if lag_values else None, "last": lag_values[-1] if lag_values else None,
                "group_max": max(totals) if totals else None, "group_last": totals[-1] if totals else None,
                "samples": [[round_or_none(t - produce_started, 2), lag, total] for t, lag, total in samples]},
        "accuracy": {
            "review_or_block": binary_metrics(spam_truth, [v in FLAGGED for _, v in pairs]),
            "block": binary_metrics(spam_truth, [v == "block" for _, v in pairs]),
            "confusion": confusion(pairs),
            "truth": {"spam": sum(spam_truth), "ham": len(spam_truth) - sum(spam_truth)},
        },
        "breakdown": {k: _group_stats(v) for k, v in sorted(groups.items())},
        "timeseries": timeseries(sent_at, scheduled_at, mine, produce_started),
        "rss_mib": rss_summary(rss_samples, produce_started) if rss_samples else None,
    }


def format_table(report: dict) -> str:
    """A human-readable rendering of `summarize`'s report."""
    th, lat, acc = report["throughput"], report["latency_ms"], report["accuracy"]
    produced = report["latency_from_produce_ms"]

    def f(x, unit=""):
        return "-" if x is None else f"{x}{unit}"

    lines = [
        f"scenario {report['config'].get('scenario', '?')}  pattern {report['config'].get('pattern', '?')}  "
        f"target {report['config'].get('rate', '?')}/s",
        f"posts sent {report['sent']['posts']}  decided {report['decided']}  lost {report['lost']}  "
        f"extra decisions {report['extra_decisions']}  side events "
        + ", ".join(f"{k} {v}" for k, v in sorted(report["sent"]["events"].items()) if k != "post"),
        f"throughput  produce {f(th['produce_posts_per_s'])} posts/s ({f(th['produce_events_per_s'])} events/s)  "
        f"decisions {f(th['decisions_per_s'])}/s (steady {f(th['decisions_per_s_steady'])}/s)  "
        f"drain {f(th['drain_seconds'], 's')}",
        f"latency     p50 {f(lat['p50_ms'])}  p95 {f(lat['p95_ms'])}  p99 {f(lat['p99_ms'])}  max {f(lat['max_ms'])} ms"
        f" from each post's scheduled time   (pipeline-internal p50 {f(report['pipeline_latency_ms']['p50_ms'])} ms)",
        f"            p50 {f(produced['p50_ms'])}  p95 {f(produced['p95_ms'])}  p99 {f(produced['p99_ms'])}  "
        f"max {f(produced['max_ms'])} ms from its produce() call   (producer behind its schedule by up to "
        f"{f(th['producer_behind_max_s'], ' s')})",
        f"lag         posts max {f(report['lag']['max'])} last {f(report['lag']['last'])}   all group inputs "
        f"max {f(report['lag']['group_max'])} last {f(report['lag']['group_last'])} records",
        *([("memory MiB  " + "   ".join(f"{n} {v['first']} -> {v['after_warmup']} (warm) -> {v['last']}, peak {v['peak']}"
                                         for n, v in report["rss_mib"].items() if n != "samples"))]
          if report.get("rss_mib") else []),
        "",
        f"{'spam =':<18}{'precision':>10}{'recall':>10}{'f1':>10}{'fpr':>10}{'tp':>7}{'fp':>7}{'fn':>7}{'tn':>7}",
    ]
    for name in ("review_or_block", "block"):
        m = acc[name]
        lines.append(f"{name:<18}{f(m['precision']):>10}{f(m['recall']):>10}{f(m['f1']):>10}"
                     f"{f(m['false_positive_rate']):>10}{m['tp']:>7}{m['fp']:>7}{m['fn']:>7}{m['tn']:>7}")
    corner = "truth / verdict"
    lines += ["", f"{corner:<18}" + "".join(f"{v:>10}" for v in schema.VERDICTS)]
    for t in ("spam", "ham"):
        lines.append(f"{t:<18}" + "".join(f"{acc['confusion'][t][v]:>10}" for v in schema.VERDICTS))
    lines += ["", f"{'group':<34}{'posts':>7}{'decided':>9}{'flagged':>9}{'blocked':>9}{'p50 ms':>9}"]
    for name, g in report["breakdown"].items():
        lines.append(f"{name[:33]:<34}{g['posts']:>7}{g['decided']:>9}{f(g['flagged_rate']):>9}"
                     f"{f(g['blocked_rate']):>9}{f(g['p50_ms']):>9}")
    return "\n".join(lines)


def plot(report: dict, path: str) -> None:
    """Latency (p50/p95 per second) and throughput (produced/decided per second) over time, plus lag."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ts = report["timeseries"]
    t = [r["t"] for r in ts]
    rss = report.get("rss_mib") or {}
    panels = 3 if rss.get("samples") else 2
    fig, axes = plt.subplots(panels, 1, figsize=(10, 3.5 * panels), sharex=True)
    ax1, ax2 = axes[0], axes[1]
    if panels == 3:  # soak runs: memory of each process group over time
        ax4 = axes[2]
        names = sorted({n for _, by in rss["samples"] for n in by})
        for name in names:
            ax4.plot([s[0] for s in rss["samples"] if name in s[1]], [s[1][name] for s in rss["samples"] if name in s[1]],
                     label=name)
        ax4.set_ylabel("resident memory (MiB)")
        ax4.legend(loc="upper left")
        ax4.grid(alpha=0.3)
    ax1.plot(t, [r["p50_ms"] for r in ts], label="p50")
    ax1.plot(t, [r["p95_ms"] for r in ts], label="p95")
    ax1.set_ylabel("latency from schedule (ms)")
    ax1.legend(loc="upper left")
    ax1.grid(alpha=0.3)
    ax2.plot(t, [r["produced_per_s"] for r in ts], label="posts produced/s")
    ax2.plot(t, [r["decided_per_s"] for r in ts], label="decisions/s")
    ax2.set_ylabel("per second")
    axes[-1].set_xlabel("seconds since the first post")
    samples = report["lag"]["samples"]
    if samples:
        ax3 = ax2.twinx()
        ax3.plot([s[0] for s in samples], [s[1] for s in samples], color="grey", ls="--", label="lag on posts")
        if any(s[2] is not None for s in samples):
            ax3.plot([s[0] for s in samples], [s[2] for s in samples], color="black", ls=":",
                     label="lag, all group inputs")
        ax3.set_ylabel("consumer lag (records)")
        ax3.legend(loc="upper right")
    ax2.legend(loc="upper left")
    ax2.grid(alpha=0.3)
    cfg = report.get("config", {})
    fig.suptitle(f"modpipe loadgen: {cfg.get('scenario')} {cfg.get('pattern')} {cfg.get('rate')}/s")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
