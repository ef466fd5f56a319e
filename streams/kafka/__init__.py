"""Transport: the worker's one consumer in the group (`consumer.py`) and the records it hands over
(`records.py`). The transactional producer is `streams/checkpointing/outbox.py`; the order of a commit is
`streams/checkpointing/checkpoint.py`."""
