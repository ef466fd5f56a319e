"""Committing: the checkpoint (`checkpoint.py`: the one place a worker commits, one Kafka transaction per
epoch of rounds), the transactional producer every output goes through (`outbox.py`), and the transactional
id of each start of a worker (`incarnations.py`)."""
