"""Embedded services for local runs and tests: the Kafka-protocol broker and the Triton server."""
