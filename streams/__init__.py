"""The streaming path: the worker processes that carry posts from `posts` to `decisions`, exactly once, on
one confluent-kafka consumer and one transactional producer per worker.

To follow a post from `posts` to `decisions`, read in this order: `topics.py` (what flows where),
`app.py` (a worker's topics, tables and Kafka client settings), `worker.py` (start-up: ban log, warm-up,
probes), `runner.py` (records become rounds; hand-over at rebalances), `agents.py` (each topic's handler
and where an item goes next), `stages.py` (what each stage does to its tables), `decisions.py` (Triton
batches, the decider, publishing), `checkpoint.py` (the one place a worker commits: one Kafka
transaction), `outbox.py` (the transactional producer) and `incarnations.py` (its transactional id per start). Beside them: `kafka/consumer.py` (the group
consumer), `state/` (the tables: in RocksDB or in memory, their changelogs and restore), `bundles.py`,
`scoring.py`, `bans.py`, `health.py`, `metrics.py`, and `stack.py` (the local stack behind `modpipe up`).
"""
