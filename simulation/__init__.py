"""Synthetic platform traffic with ground truth, and the metrics that score verdicts against it.

Pure (no Kafka, no clock, no I/O): decision training learns from it and the load generator replays it, so it
sits below both."""
