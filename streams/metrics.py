"""Prometheus metrics of one worker (prometheus-client; names: `modpipe_` prefix, base units, `_total`)."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import Counter, Gauge, Histogram

from modpipe import memory

# Up to a minute: a backlog (a burst, a restart) shows as seconds of queueing, not as one +Inf bucket.
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 0.75, 1, 2.5, 5, 10, 15, 20, 30, 60)

POSTS_CONSUMED = Counter("modpipe_posts_consumed_total", "Records read from the posts topic.")
FETCH_STALLS = Counter("modpipe_consumer_fetch_stalls_total",
                       "Assigned partitions found not fetched although they had records (sought again; a second "
                       "stall restarts the worker), by topic.", ["topic"])
POSTS_RESENT = Counter("modpipe_posts_resent_total",
                       "Posts whose id was already decided (a producer's retry, a replay): counted once, not decided again.")
POSTS_CARRIED = Counter("modpipe_posts_carried_total",
                        "Posts still waiting for the text model when their checkpoint committed, kept as state "
                        "(streams/moderation/carried.py) instead of holding the transaction open: each is decided "
                        "later, in the transaction open then.")
POSTS_CHECKED = Counter("modpipe_posts_checked_total",
                        "Posts dated at or below the ids their first table keeps (a backfill, a backdated post, an old "
                        "re-send): sent along their route to the post table to tell new from re-sent, then along it again.")
EVENTS_CONSUMED = Counter("modpipe_events_consumed_total", "Valid side-stream events read, by kind.", ["kind"])
BAN_EVENTS_APPLIED = Counter("modpipe_ban_events_applied_total", "Valid ban records applied from the ban log.")
DECISIONS = Counter("modpipe_decisions_total", "Decisions published, by verdict.", ["verdict"])
SHORTCUTS = Counter("modpipe_shortcuts_total",
                    "Posts decided by a shortcut (a ban) without the text model or the decision model, by reason.",
                    ["reason"])
REDECISIONS = Counter("modpipe_redecisions_total", "Decisions published again (revision + 1), by trigger.",
                      ["reason"])
STATE_WRITES = Counter("modpipe_state_writes_total",
                       "Feature-table states written (one changelog record each; one per key per batch).", ["table"])
STATE_WRITTEN_BYTES = Counter(
    "modpipe_state_written_bytes_total",
    "Bytes of feature-table states written to their changelogs (the records' values): what the broker stores "
    "and replicates for the tables, and what a restore reads back.", ["table"])
STATE_EXPIRED = Counter("modpipe_state_expired_total",
                        "Feature-table keys forgotten after their table's retention (a tombstone each).", ["table"])
TABLE_KEYS = Gauge("modpipe_table_keys", "Keys this worker holds per feature table (its partitions).", ["table"])
TABLE_BYTES = Gauge("modpipe_table_bytes", "Encoded size of the states this worker holds per feature table.",
                    ["table"])
RESTORED_RECORDS = Counter("modpipe_table_restored_records_total",
                           "Changelog records applied to this worker's tables by restores (with RocksDB tables: "
                           "the changelogs' tails beyond what the stores held).")
RESTORE_SECONDS = Gauge("modpipe_table_restore_seconds", "How long the last table restore took.")
DEAD_LETTERS = Counter("modpipe_dead_letters_total", "Records sent to the dead-letter topic, by reason.", ["reason"])
END_TO_END_LATENCY = Histogram(
    "modpipe_end_to_end_latency_seconds",
    "From the post's Kafka timestamp to its decision being produced.", buckets=_LATENCY_BUCKETS)
BATCH_SIZE = Histogram("modpipe_batch_size_posts", "Posts per batch sent to Triton.",
                       buckets=(1, 2, 4, 8, 16, 32, 48, 64, 96, 128))
TRITON_LATENCY = Histogram("modpipe_triton_request_duration_seconds", "Duration of one Triton inference request.",
                           buckets=_LATENCY_BUCKETS)
TEXT_CACHE = Counter("modpipe_text_cache_requests_total",
                     "Texts looked up in the text-probability cache, by result (hit: Triton not asked).", ["result"])
TEXT_CACHE_ENTRIES = Gauge("modpipe_text_cache_entries", "Texts in the text-probability cache.")
LOCAL_HOPS = Counter("modpipe_local_hops_total",
                     "Items applied to a stage partition this worker owns without a Kafka hop, by stage.", ["stage"])
BUNDLE_ITEMS = Histogram("modpipe_bundle_items", "Items per bundle record published to a stage topic.",
                         buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512))
TRITON_ERRORS = Counter("modpipe_triton_errors_total", "Failed Triton requests (each is retried).")
TEXT_MODEL_AVAILABLE = Gauge("modpipe_text_model_available",
                             "1 while Triton answers; 0 once its requests have failed for MODPIPE_TEXT_MODEL_OUTAGE_S.")
DEGRADED_DECISIONS = Counter("modpipe_degraded_decisions_total",
                             "Decisions made without the text model during an outage, by policy (decide, review).",
                             ["policy"])
BATCHES_IN_FLIGHT = Gauge("modpipe_batches_in_flight", "Batches sent to Triton and not yet decided.")
ASSIGNED_PARTITIONS = Gauge("modpipe_assigned_partitions",
                            "Partitions of our input topics this worker owns (assigned, tables restored).", ["topic"])
GROUP_REJOINS = Counter("modpipe_group_rejoins_total",
                        "Times the worker's consumer was replaced because the group left it without an "
                        "assignment for MODPIPE_GROUP_REJOIN_S.")
BAN_LOG_READER_UP = Gauge("modpipe_ban_log_reader_up",
                          "1 while the worker's ban log reader runs; 0 once it failed (the worker stops).")
BAN_LOG_CAUGHT_UP = Gauge("modpipe_ban_log_caught_up",
                          "1 once the ban log was read to its end at start (no post is decided before).")
WORKER_READY = Gauge("modpipe_worker_ready", "1 while /readyz passes: ban log read, paths warm, partitions assigned.")
CHECKPOINT_DURATION = Histogram(
    "modpipe_checkpoint_duration_seconds",
    "One checkpoint: waiting for the rounds in flight, writing the changed states, committing the transaction.",
    buckets=_LATENCY_BUCKETS)
INTERNAL_PURGES = Counter(
    "modpipe_internal_purges_total",
    "Partitions of an internal topic (stage topics, posts.awaiting-text) whose committed records were deleted "
    "(DeleteRecords), by topic and outcome (ok, error): streams/runtime/purge.py.", ["topic", "outcome"])
MEMORY_LIMIT = Gauge("modpipe_memory_limit_bytes",
                     "Memory limit of the worker's cgroup (a pod's limit); +Inf when there is none. Beside the "
                     "process collector's process_resident_memory_bytes: how close the tables are to it.")
MEMORY_BUDGET = Gauge("modpipe_memory_budget_bytes",
                      "Bytes each cache or buffer fed by platform data may hold: its share of "
                      "MODPIPE_WORKER_MEMORY_MB (modpipe/memory.py).", ["use"])
CACHE_BYTES = Gauge("modpipe_cache_bytes", "Bytes charged to the entries of each byte-bounded cache "
                    "(an over-estimate of what they allocate).", ["cache"])
CACHE_ENTRIES = Gauge("modpipe_cache_entries", "Entries in each byte-bounded cache.", ["cache"])
BUFFER_BYTES = Gauge("modpipe_buffer_bytes",
                     "Bytes held by a buffer of platform data: fetched (records waiting for their rounds), "
                     "decision_queue (ready posts waiting for Triton) and next_epoch (records produced while the "
                     "previous checkpoint commits), now; bundles (the last round's stage bundles as they were "
                     "produced).", ["buffer"])
TABLE_STATES = Gauge("modpipe_table_decoded_states",
                     "Decoded table states a worker holds, as the last checkpoint found them: cached (kept between "
                     "checkpoints, an LRU) and batch (used since the previous checkpoint, written by it).",
                     ["table", "held"])
TABLE_STATE_BYTES = Gauge("modpipe_table_decoded_state_bytes",
                          "Estimated bytes of the same (streams/state/table_states.py: from their encoded sizes).",
                          ["table", "held"])
CHECKPOINT_WAITS = Counter("modpipe_checkpoint_waits_total",
                           "Times rounds waited for a checkpoint because what it lets go held more than its share "
                           "of MODPIPE_WORKER_MEMORY_MB: states (decoded table states used since the previous "
                           "checkpoint) or next_epoch (records held back while a checkpoint commits).", ["reason"])
CONSUMER_LAG = Gauge("modpipe_consumer_lag_messages", "Records behind the end of each assigned partition.",
                     ["topic", "partition"])


def init_labels(verdicts, dead_letter_reasons, outage_policy: str | None, tables=()) -> None:
    """Export every known label value at 0 from the start: a dashboard's rate() of a series that was never
    incremented returns nothing rather than 0, and an alert on it cannot tell "none" from "not scraped"."""
    for verdict in verdicts:
        DECISIONS.labels(verdict)
    for reason in (*dead_letter_reasons, "processing_error"):
        DEAD_LETTERS.labels(reason)
    for table in tables:
        STATE_WRITES.labels(table)
        STATE_WRITTEN_BYTES.labels(table)
        STATE_EXPIRED.labels(table)
    if outage_policy is not None:  # None: the text model is off
        TEXT_MODEL_AVAILABLE.set(1)
        if outage_policy != "wait":
            DEGRADED_DECISIONS.labels(outage_policy)


def init_memory(budgets: dict[str, int]) -> None:
    """Export each use's budget, and each registered cache's bytes and entries, read when scraped (by name:
    a cache made later under the same name, such as a new TextScorer's, is the one read)."""
    for use, limit in budgets.items():
        MEMORY_BUDGET.labels(use).set(limit)
    for name in memory.CACHES:
        CACHE_BYTES.labels(name).set_function(lambda name=name: memory.CACHES[name].bytes)
        CACHE_ENTRIES.labels(name).set_function(lambda name=name: len(memory.CACHES[name]))
    for buffer in ("fetched", "decision_queue", "bundles", "next_epoch"):
        BUFFER_BYTES.labels(buffer)


# cgroup v1 writes "no limit" as the largest page-aligned signed 64-bit number
_V1_UNLIMITED = 2**63 - 4096


def cgroup_memory_limit(root: Path = Path("/sys/fs/cgroup")) -> float:
    """The memory limit of this process's cgroup in bytes (cgroup v2 `memory.max`, else v1
    `memory/memory.limit_in_bytes`); +Inf when unlimited or unknown."""
    for path in (root / "memory.max", root / "memory" / "memory.limit_in_bytes"):
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text == "max":
            return float("inf")
        try:
            value = int(text)
        except ValueError:
            continue
        return float("inf") if value >= _V1_UNLIMITED else float(value)
    return float("inf")
