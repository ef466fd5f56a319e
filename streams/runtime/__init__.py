"""The worker's loop and what runs beside it: records from the group consumer become rounds for their
topic's handler and partitions are handed over at rebalances (`runner.py`), the internal topics' committed
records are deleted (`purge.py`), and the worker's HTTP endpoints: metrics and probes (`health.py`). The
handlers and their wiring are handed in (streams/worker.py builds them from streams/moderation/)."""
