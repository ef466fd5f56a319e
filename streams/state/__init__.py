"""Feature tables' state on a worker: the tables (`tables.py`: in memory, or on disk in RocksDB, `rocksdb.py`),
their changelogs and restore, and a stage's decoded states between batches (`table_states.py`)."""
