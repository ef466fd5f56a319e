"""The pipeline's passes on a running local stack: saturation (every post produced up front), latency at a
fixed offered rate, and the saturation pass again with the text cache on. Decisions are read back from the
decisions topic (`DecisionLog`)."""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

from modpipe.loadgen.bench.metering import CpuMeter, stats_delta, triton_quiet, triton_stats
from modpipe.loadgen.bench.profiling import WorkerProfiler
from modpipe.loadgen.bench.report import load_offered
from modpipe.loadgen.traffic import ProduceStats, arrival_times, make_producer, produce_events
from modpipe.simulation.metrics import latency_summary, percentile
from modpipe.simulation.simulator import Event

from modpipe import schema
from modpipe.services.fetching import PACED_CONSUMER_CONFIG, START_GRACE_S, paced_fetches
from modpipe.settings import Settings

TEXT_CACHE_ON = 100_000  # MODPIPE_TEXT_CACHE_SIZE of the last pass (the pipeline's default)
STEADY_TRIM = 0.1  # fraction of decisions left out at each end of the saturation pass


class BenchError(RuntimeError):
    """The benchmark could not measure (a post got no decision, a worker died)."""

def saturation_rates(produce_started: float, received: Sequence[float], trim: float = STEADY_TRIM) -> dict:
    """Decisions/s of a pass where every post was produced at `produce_started`.

    `overall`: all decisions over first produce -> last decision (includes fill and drain).
    `steady`: decisions completed in (t_a, t_b] / (t_b - t_a), t_a and t_b the receive times of the
    decisions at `trim` and `1 - trim` of the run: an interval count, so decisions arriving in batches do
    not bias it. None when the window is empty (a tiny run decided in one or two batches)."""
    r = sorted(received)
    n = len(r)
    if not n:
        return {"overall": None, "steady": None, "steady_window_s": None, "steady_decisions": 0}
    overall = n / max(r[-1] - produce_started, 1e-9)
    t_a = r[min(n - 1, int(n * trim))]
    t_b = r[max(0, math.ceil(n * (1 - trim)) - 1)]
    count = sum(1 for x in r if t_a < x <= t_b)
    steady = count / (t_b - t_a) if count and t_b > t_a else None
    return {"overall": round(overall, 2), "steady": None if steady is None else round(steady, 2),
            "steady_window_s": round(t_b - t_a, 3), "steady_decisions": count}

class DecisionLog:
    """This run's decisions, read from the decisions topic only once they are all there.

    The embedded broker (noida-db) answers an empty fetch at once instead of waiting `fetch.wait.max.ms`,
    so a consumer left assigned to an idle topic spins: about half a core in the client and a third in
    the broker (measured). A live collector would take that from the pipeline it measures. Instead,
    completion is watched through the high watermarks (a few ListOffsets requests per second) and the
    records are fetched in one go at the end; a decision's time is its record timestamp, set by the
    worker's producer when it publishes the decision (a consumer on this machine sees it milliseconds
    later)."""

    def __init__(self, settings: Settings, bootstrap: str, topic: str, prefix: str):
        from confluent_kafka import Consumer, TopicPartition

        self._tp = TopicPartition
        self.topic, self.prefix = topic, prefix
        self.consumer = Consumer({**settings.kafka_consumer_config(), "bootstrap.servers": bootstrap,
                                  "group.id": f"modpipe-bench-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False})
        meta = self.consumer.list_topics(topic, timeout=10).topics[topic]
        self.partitions = sorted(meta.partitions)
        self.read_to = self.highs()  # everything before this run is skipped
        self.decided: dict[str, float] = {}  # post_id -> wall time (s) of its first decision
        # post_id -> (the post's own timestamp, the verdict's time), as the decision record says
        self.worker_times: dict[str, tuple[float, float]] = {}
        self.records = 0

    def highs(self) -> dict[int, int]:
        return {p: self.consumer.get_watermark_offsets(self._tp(self.topic, p), timeout=10)[1] for p in self.partitions}

    def _read(self, highs: dict[int, int]) -> None:
        todo = {p: h for p, h in highs.items() if h > self.read_to[p]}
        if not todo:
            return
        self.consumer.assign([self._tp(self.topic, p, self.read_to[p]) for p in todo])
        deadline = time.monotonic() + 60
        try:
            while todo and time.monotonic() < deadline:
                for msg in self.consumer.consume(1000, 0.5):
                    if msg.error():
                        continue
                    self.records += 1
                    try:
                        record = schema.decode_decision(msg.value())
                    except schema.InvalidMessage:
                        continue
                    pid = record["post_id"]
                    if pid.startswith(self.prefix) and pid not in self.decided:
                        _, ts_ms = msg.timestamp()
                        self.decided[pid] = ts_ms / 1000.0
                        self.worker_times[pid] = (schema.epoch_ms(record["received_at"]) / 1000, schema.epoch_ms(record["decided_at"]) / 1000)
                # by position: the last offset of a transaction is its commit marker, never delivered
                for tp in self.consumer.position([self._tp(self.topic, p) for p in todo]):
                    if tp.offset >= 0:
                        self.read_to[tp.partition] = tp.offset
                    if tp.offset >= todo[tp.partition]:
                        del todo[tp.partition]
        finally:
            self.consumer.unassign()

    def wait(self, wanted: set[str], timeout_s: float, healthy: Callable[[], bool], bar=None) -> dict[str, float]:
        """{post_id: decision time} for every post of `wanted`; BenchError when some stay undecided."""
        deadline = time.monotonic() + timeout_s
        shown = 0
        while True:
            missing = len(wanted) - sum(1 for pid in wanted if pid in self.decided)
            highs = self.highs()
            new = sum(h - self.read_to[p] for p, h in highs.items())
            if bar is not None:
                now = min(len(wanted), len(wanted) - missing + new)
                bar.update(now - shown)
                shown = now
            if new >= missing or time.monotonic() >= deadline:
                self._read(highs)
                if all(pid in self.decided for pid in wanted):
                    return {pid: self.decided[pid] for pid in wanted}
                if time.monotonic() >= deadline:
                    got = sum(1 for pid in wanted if pid in self.decided)
                    raise BenchError(f"{len(wanted) - got} of {len(wanted)} posts got no decision in {timeout_s:.0f} s")
            if not healthy():
                raise BenchError("a worker exited during the benchmark; see its log")
            time.sleep(0.25)  # decision times come from the records: polling less often only ends later

    def close(self) -> None:
        self.consumer.close()

class VisibleTimes:
    """When each decision of this run becomes visible to a live read_committed reader (the platform's
    view: a decision counts once its transaction has committed). A thread reads the decisions topic from
    its current end, during the latency passes only. It paces its fetches like the workers do
    (modpipe/services/fetching.py: a reader that never paused spun on the embedded broker, 0.49 cores in
    the client and 0.35 in the broker, taken from the pipeline it measures), so a decision is seen up to
    MODPIPE_FETCH_PAUSE_MS after it became visible; what the reader costs shows in the bench client's and
    the broker's CPU of those passes."""

    def __init__(self, settings: Settings, bootstrap: str, topic: str, prefix: str):
        import threading

        from confluent_kafka import Consumer, TopicPartition

        self.prefix = prefix
        self.pause_s = settings.fetch_pause_ms / 1000
        self.seen: dict[str, float] = {}
        self._stop = threading.Event()
        self.consumer = Consumer({**settings.kafka_consumer_config(), "bootstrap.servers": bootstrap,
                                  "group.id": f"modpipe-bench-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
                                  **PACED_CONSUMER_CONFIG})
        parts = sorted(self.consumer.list_topics(topic, timeout=10).topics[topic].partitions)
        ends = {p: self.consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
        self._next = {(topic, p): end for p, end in ends.items()}
        self.consumer.assign([TopicPartition(topic, p, end) for p, end in ends.items()])
        self._thread = threading.Thread(target=self._run, name="visible-times", daemon=True)
        self._thread.start()
        # its fetches are paced only after the grace period (see paced_fetches): a pass starts after it
        self.paced_from = time.monotonic() + START_GRACE_S

    def settle(self) -> None:
        time.sleep(max(0.0, self.paced_from - time.monotonic()))

    def _run(self) -> None:
        for messages in paced_fetches(self.consumer, self._stop, self.pause_s, next_offsets=self._next):
            now = time.time()
            for msg in messages:
                try:
                    pid = schema.decode_decision(msg.value())["post_id"]
                except schema.InvalidMessage:
                    continue
                if pid.startswith(self.prefix):
                    self.seen.setdefault(pid, now)

    def wait(self, wanted: set[str], timeout_s: float) -> dict[str, float]:
        deadline = time.monotonic() + timeout_s
        while not wanted <= self.seen.keys() and time.monotonic() < deadline:
            time.sleep(0.05)
        return {pid: self.seen[pid] for pid in wanted if pid in self.seen}

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.consumer.close()


def _produce(settings: Settings, producer, events: list[Event], bar=None) -> ProduceStats:
    stats = produce_events(producer, settings, events, stats=ProduceStats(), progress=bar)
    if producer.flush(60) != 0 or stats.delivery_errors:
        raise BenchError("not every post was delivered to the broker")
    return stats

def _worker_metrics(before: dict[str, float], after: dict[str, float]) -> dict:
    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    batches = delta("modpipe_batch_size_posts_count")
    requests = delta("modpipe_triton_request_duration_seconds_count")
    hits, misses = delta("modpipe_text_cache_requests_total{result=hit}"), delta(
        "modpipe_text_cache_requests_total{result=miss}")
    checkpoints = delta("modpipe_checkpoint_duration_seconds_count")
    return {"batches": int(batches),
            "avg_batch": round(delta("modpipe_batch_size_posts_sum") / batches, 2) if batches else None,
            "triton_request_mean_ms": round(1000 * delta("modpipe_triton_request_duration_seconds_sum") / requests, 1)
            if requests else None,
            "text_cache_hit_ratio": round(hits / (hits + misses), 3) if hits + misses else None,
            # each checkpoint is a transaction: how many a pass committed and how long one held the rounds up
            "checkpoints": int(checkpoints),
            "checkpoint_mean_ms": round(1000 * delta("modpipe_checkpoint_duration_seconds_sum") / checkpoints, 1)
            if checkpoints else None,
            "local_hops": int(sum(after.get(k, 0.0) - before.get(k, 0.0) for k in after
                                  if k.startswith("modpipe_local_hops_total"))),
            "state_written_bytes": state_written_bytes(before, after)}


def per_table(before: dict[str, float], after: dict[str, float], counter: str) -> dict[str, int]:
    """A `{table=...}` counter's growth per feature table between two scrapes."""
    prefix = counter + "{table="
    return {k[len(prefix):-1]: int(v - before.get(k, 0.0)) for k, v in sorted(after.items()) if k.startswith(prefix)}


def state_written_bytes(before: dict[str, float], after: dict[str, float]) -> dict[str, int]:
    """Changelog bytes written per feature table between two scrapes (`modpipe_state_written_bytes_total`)."""
    return per_table(before, after, "modpipe_state_written_bytes_total")

def _stack_groups(stack) -> dict[str, int]:
    groups = {w.name: w.process.pid for w in stack.workers if w.process.pid}
    if stack.triton is not None and stack.triton.pid:
        groups["triton"] = stack.triton.pid
    if stack.broker is not None:  # every node of the local broker counts as "broker"
        for name, proc in stack.broker.processes().items():
            if proc is not None and proc.pid:
                groups["broker" if len(stack.broker.processes()) == 1 else name] = proc.pid
    return groups

def _where_time_goes(cpu: dict, n_posts: int, worker_names: Sequence[str]) -> dict:
    """CPU milliseconds per post by component (workers summed)."""
    cpu_s = dict(cpu["cpu_s"])
    per = {"workers": sum(cpu_s.pop(name, 0.0) for name in worker_names)}
    per.update(cpu_s)
    return {k: round(1000 * v / n_posts, 3) for k, v in per.items()}

def saturation_pass(settings: Settings, stack, producer, events: list[Event], *, timeout_s: float,
                    decisions: DecisionLog, progress: bool, healthy: Callable[[], bool], label: str,
                    profile_dir: Path | None = None) -> dict:
    """Every post produced up front; decisions/s over the steady part and where the CPU went (with
    `profile_dir`, also where each worker's event loop went: py-spy, loadgen/bench/profiling.py)."""
    from modpipe.output import progress_bar

    groups = _stack_groups(stack)
    metrics0, triton0 = stack.scrape(), triton_stats(stack.triton_url, settings.triton_model)
    profiler = None
    if profile_dir is not None:
        profiler = WorkerProfiler({w.name: w.process.pid for w in stack.workers if w.process.pid},
                                  profile_dir).start()
    cpu = CpuMeter(groups)
    t0 = time.perf_counter()
    try:
        stats = _produce(settings, producer, [ev._replace(offset_s=0.0) for ev in events])
        with progress_bar(total=len(events), desc=label, unit="post", enabled=progress) as bar:
            decided = decisions.wait(set(stats.sent_at), timeout_s, healthy, bar)
    except BaseException:
        if profiler is not None:  # no py-spy left attached to a worker when the pass fails
            profiler.stop()
        raise
    wall = time.perf_counter() - t0
    cpu_sat = cpu.stop()
    profile = profiler.stop() if profiler is not None else None
    rates = saturation_rates(stats.started, list(decided.values()))
    sat_latency = [(t - stats.sent_at[pid]) * 1000 for pid, t in decided.items()]
    return {
        "posts": len(events), "wall_s": round(wall, 2), "posts_per_s": rates["steady"] or rates["overall"],
        "posts_per_s_steady": rates["steady"], "posts_per_s_overall": rates["overall"],
        "steady_window_s": rates["steady_window_s"], "rate_used": "steady" if rates["steady"] else "overall",
        "time_to_last_decision_s": round(max(decided.values()) - stats.started, 2),
        "queueing_latency_p50_ms": round(percentile(sat_latency, 50), 1),
        "workers": _worker_metrics(metrics0, stack.scrape()),
        "triton": stats_delta(triton0, triton_stats(stack.triton_url, settings.triton_model), wall),
        "cpu": cpu_sat,
        "cpu_ms_per_post": _where_time_goes(cpu_sat, len(events), [w.name for w in stack.workers]),
        **({"profile": profile} if profile is not None else {}),
    }

def where_the_tail_sits(sent_at: dict[str, float], seen: dict[str, float], started: float,
                        published: dict[str, float] | None = None,
                        worker_times: dict[str, tuple[float, float]] | None = None,
                        share: float = 0.01, gap_s: float = 1.0) -> dict:
    """When the slowest `share` of a pass's posts were produced (s into the pass) and in how many episodes
    (slow posts produced more than `gap_s` apart start a new one): a p99 made of one episode is a stall, of
    many it is the queue's bursts. Also the most posts produced within any 1 s, beside the mean rate, and,
    given the decisions' times, where the slowest and all posts waited (medians, ms): until the worker had
    its verdict (fetch, feature stages, Triton), until the decision was produced, and until a read_committed
    reader saw it (the checkpoint's commit and the reader's fetch)."""
    ranked = sorted(seen, key=lambda pid: seen[pid] - sent_at[pid])
    slowest = ranked[len(ranked) - max(1, math.ceil(len(ranked) * share)):] if ranked else []
    slow = sorted(sent_at[pid] - started for pid in slowest)
    episodes = 1 + sum(1 for a, b in zip(slow, slow[1:], strict=False) if b - a > gap_s) if slow else 0
    times = sorted(sent_at.values())
    busiest, lo = 0, 0
    for hi, t in enumerate(times):
        while t - times[lo] >= 1.0:
            lo += 1
        busiest = max(busiest, hi - lo + 1)
    span = times[-1] - times[0] if len(times) > 1 else 0.0
    out = {"pass_started_at": schema.rfc3339(started * 1000), "slowest_posts": len(slow),
           "produced_at_s": [round(t, 1) for t in slow], "episodes": episodes, "busiest_second_posts": busiest,
           "mean_posts_per_s": round((len(times) - 1) / span, 1) if span > 0 else None}
    if published and worker_times:
        def parts(pids: list[str]) -> dict:
            pids = [pid for pid in pids if pid in published and pid in worker_times]
            marks = {"to_decided_ms": lambda p: worker_times[p][1] - sent_at[p],
                     "to_published_ms": lambda p: published[p] - worker_times[p][1],
                     "to_visible_ms": lambda p: seen[p] - published[p]}
            return {k: round(1000 * percentile([f(p) for p in pids], 50), 1) if pids else None
                    for k, f in marks.items()}
        out["slowest_waited"], out["all_waited"] = parts(slowest), parts(ranked)
    return out


def latency_pass(settings: Settings, stack, producer, events: list[Event], rate: float, *, arrivals: str,
                 seed: int, timeout_s: float, decisions: DecisionLog, progress: bool,
                 healthy: Callable[[], bool], label: str) -> dict:
    """Posts arriving at `rate` per second: end-to-end latency, each post's scheduled send time -> decision
    visible to a read_committed reader (and, for comparison, -> decision record published inside its
    transaction); `from_produce`: the same from the produce() call, which leaves out the time a post
    waited for a producer that fell behind its schedule. The tail is ranked from the produce() call: it
    says where the pipeline, not the producer, was slow."""
    from modpipe.output import progress_bar

    times = list(arrival_times(arrivals, rate, count=len(events), seed=seed))
    events = [ev._replace(offset_s=t) for ev, t in zip(events, times, strict=True)]
    visible = VisibleTimes(settings, stack.bootstrap, decisions.topic, decisions.prefix)
    try:
        visible.settle()
        metrics0, triton0 = stack.scrape(), triton_stats(stack.triton_url, settings.triton_model)
        cpu = CpuMeter(_stack_groups(stack))
        with progress_bar(total=len(events), desc=label, unit="post", enabled=progress) as bar:
            stats = _produce(settings, producer, events, bar)
        decided = decisions.wait(set(stats.sent_at), timeout_s, healthy)
        seen = visible.wait(set(stats.sent_at), 30)
        cpu_lat = cpu.stop()
    finally:
        visible.close()
    if len(seen) != len(decided):
        raise BenchError(f"{len(decided) - len(seen)} decisions were never seen by a live read_committed reader")
    published = latency_summary([(t - stats.scheduled_at[pid]) * 1000 for pid, t in decided.items()])
    lat = latency_summary([(t - stats.scheduled_at[pid]) * 1000 for pid, t in seen.items()])
    from_produce = latency_summary([(t - stats.sent_at[pid]) * 1000 for pid, t in seen.items()])
    last = max(seen.values())
    return {
        "arrivals": arrivals, "posts": len(events), "offered_posts_per_s": round(rate, 2),
        "produced_posts_per_s": round(len(events) / max(stats.finished - stats.started, 1e-9), 2),
        "decided_posts_per_s": round(len(events) / max(last - stats.started, 1e-9), 2),
        "drain_s": round(max(0.0, last - stats.finished), 2),
        **{k: lat[k] for k in ("p50_ms", "p95_ms", "p99_ms", "max_ms", "mean_ms")},
        "latency_is": "scheduled send time -> decision seen by a live read_committed reader (its transaction "
                      "committed); from_produce: from the produce() call",
        "from_produce": {k: from_produce[k] for k in ("p50_ms", "p95_ms", "p99_ms", "max_ms", "mean_ms")},
        "producer_behind_max_s": round(stats.behind_s_max, 3),
        "published": {k: published[k] for k in ("p50_ms", "p99_ms")},
        "tail": where_the_tail_sits(stats.sent_at, seen, stats.started, decided, decisions.worker_times),
        "workers": _worker_metrics(metrics0, stack.scrape()),
        # where a post's wait at Triton went: its queue (behind the other batch in flight) against compute
        "triton": stats_delta(triton0, triton_stats(stack.triton_url, settings.triton_model), cpu_lat["wall_s"]),
        "cpu": cpu_lat,
    }

def release_consumed(settings: Settings, bootstrap: str, posts_topic: str, decisions_read: dict[str, dict[int, int]],
                     data_dir: Path) -> float:
    """Delete (DeleteRecords) what the passes so far left behind on the bench's own broker: the posts the
    group has committed and the decisions the bench has read (`decisions_read`: topic -> partition -> next
    offset). The embedded broker rewrites all it holds to one file while anything changes, so its CPU grows
    with what it holds (docs/benchmarks.md, "What the embedded broker holds"), and a latency pass would pay
    for the saturation passes before it; an Apache Kafka broker appends instead. The changelogs, the tables'
    state, stay. Returns the broker's data size in MB afterwards."""
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient

    conf = {**settings.kafka_client_config(), "bootstrap.servers": bootstrap}
    group = Consumer({**settings.kafka_consumer_config(), "bootstrap.servers": bootstrap, "group.id": settings.app_id,
                      "enable.auto.commit": False})
    try:
        parts = [TopicPartition(posts_topic, p) for p in range(settings.partitions)]
        gone = [tp for tp in group.committed(parts, timeout=10) if tp.offset > 0]
    finally:
        group.close()
    gone += [TopicPartition(topic, p, off) for topic, read in decisions_read.items() for p, off in read.items() if off > 0]
    if gone:
        admin = AdminClient(conf)  # held while its futures resolve: a collected client fails them all
        for future in admin.delete_records(gone, request_timeout=30).values():
            future.result(30)
    time.sleep(1.0)  # the broker rewrites its file within a second of a change
    return round(sum(f.stat().st_size for f in data_dir.rglob("*") if f.is_file()) / 1e6, 1)


def pipeline_passes(settings: Settings, stack, warmup: list[Event], saturation: list[Event],
                    latency_events: list[Event], low_events: list[Event], cached_events: list[Event], *,
                    load: float, low_rate: float, arrivals: str, seed: int, timeout_s: float,
                    decisions: DecisionLog, progress: bool, idle_s: float = 3.0,
                    load_rate: float | None = None, profile_dir: Path | None = None,
                    keep_records: bool = False) -> dict:
    """The pipeline's passes (see the module docstring). The stack's workers run with the text cache off;
    they are restarted with it on for the last pass. Before each pass the records the earlier ones left are
    deleted (`release_consumed`), unless `keep_records`."""

    def release() -> float | None:  # an external broker's records are not the bench's to delete
        if keep_records or stack.broker is None:
            return None
        return release_consumed(settings, stack.bootstrap, stack.topics.posts, {decisions.topic: decisions.read_to},
                                stack.broker.data_dir)

    def healthy() -> bool:
        return all(w.process.alive() for w in stack.workers)

    common = {"timeout_s": timeout_s, "decisions": decisions, "progress": progress, "healthy": healthy}
    producer = make_producer(settings, stack.bootstrap)
    # warm-up: first Triton connection, table stores, consumer fetch sessions; not measured
    stats = _produce(settings, producer, [ev._replace(offset_s=0.0) for ev in warmup])
    decisions.wait(set(stats.sent_at), timeout_s, healthy)

    # what the stack burns with nothing to do (on noida-db, idle consumers poll empty fetches)
    cpu = CpuMeter(_stack_groups(stack))
    time.sleep(idle_s)
    idle = cpu.stop()
    idle_cores = {k: round(v / idle["wall_s"], 2) for k, v in idle["cpu_s"].items()}

    held = release()
    sat = saturation_pass(settings, stack, producer, saturation, label="pipeline saturation", profile_dir=profile_dir,
                          **common)
    sat["idle_cores"], sat["broker_data_mb"] = idle_cores, held
    held = release()
    low = latency_pass(settings, stack, producer, low_events, low_rate, arrivals=arrivals, seed=seed,
                       label=f"pipeline at {low_rate:g} posts/s", **common)
    low["broker_data_mb"] = held
    offered, share = load_offered(sat["posts_per_s"], load, load_rate)
    held = release()
    lat = latency_pass(settings, stack, producer, latency_events, offered, arrivals=arrivals, seed=seed,
                       label=f"pipeline at {offered:g} posts/s ({share:.0%})", **common)
    lat["load"], lat["broker_data_mb"] = share, held

    # the same saturation pass with the text cache on (fresh workers, an empty cache)
    for w in stack.workers:
        w.stop()
    stack.extra_env["MODPIPE_TEXT_CACHE_SIZE"] = str(TEXT_CACHE_ON)
    for i in range(len(stack.workers)):
        stack.start_worker(i)
    stack.wait_workers_ready()
    stats = _produce(settings, producer, [ev._replace(offset_s=0.0) for ev in warmup[: max(1, len(warmup) // 4)]])
    decisions.wait(set(stats.sent_at), timeout_s, healthy)
    # The pass starts from a quiet stack: wait until Triton has computed nothing for a while (restarted
    # workers' first requests, the warm-up posts) before the pass begins.
    held = release()
    triton_quiet(stack.triton_url, settings.triton_model, quiet_s=max(2.0, 2 * idle_s), timeout_s=timeout_s)
    cached = saturation_pass(settings, stack, producer, cached_events, label="pipeline saturation, text cache on",
                             **common)
    cached["broker_data_mb"] = held
    return {"posts_per_s": sat["posts_per_s"], "saturation": sat, "low_rate": low, "latency": lat,
            "saturation_text_cache": cached}
