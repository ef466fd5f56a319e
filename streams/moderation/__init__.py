"""The moderation wiring on the runtime: the topics (`topics.py`) and a worker's topics, tables and Kafka
client settings (`app.py`); each input topic's handler (`agents.py`); the feature stages (`stages.py`) and
the bundles that carry items between them (`bundles.py`); the text model's scores (`scoring.py`), Triton
batches, the decider and publishing (`decisions.py`); the ban log every worker reads (`bans.py`) and the
dead letters (`dead_letters.py`)."""
