"""The streaming path: the worker processes that carry posts from `posts` to `decisions`, exactly once, on
one confluent-kafka consumer and one transactional producer per worker.

The general runtime: `kafka/` (the group consumer and the records it hands over), `state/` (the tables: in
RocksDB or in memory, their changelogs and restore), `checkpointing/` (the checkpoint, the transactional
producer, its transactional id per start) and `runtime/` (the loop, purging the internal topics, probes),
with `metrics.py` and `waiting.py` beside them. The moderation wiring on it: `moderation/` (topics,
handlers, stages, bundles, scoring, decisions, bans, dead letters). `local/` is the local stack behind
`modpipe up`. The runtime never imports `moderation/` or `local/` (tests/unit/test_layering.py);
`moderation/` builds on it, and `worker.py` and `cli.py` put them together.

To follow a post from `posts` to `decisions`, read in this order: `moderation/topics.py` (what flows
where), `moderation/app.py` (a worker's topics, tables and Kafka client settings), `worker.py` (start-up:
ban log, warm-up, probes), `runtime/runner.py` (records become rounds; hand-over at rebalances),
`moderation/agents.py` (each topic's handler and where an item goes next), `moderation/stages.py` (what
each stage does to its tables), `moderation/decisions.py` (Triton batches, the decider, publishing),
`checkpointing/checkpoint.py` (the one place a worker commits: one Kafka transaction),
`checkpointing/outbox.py` (the transactional producer) and `checkpointing/incarnations.py` (its
transactional id per start). Beside them: `kafka/consumer.py` (the group consumer), `state/` (the tables),
`moderation/bundles.py`, `moderation/scoring.py`, `moderation/bans.py`, `runtime/health.py`, `metrics.py`,
and `local/stack.py` (the local stack behind `modpipe up`).
"""
