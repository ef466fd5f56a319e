"""`modpipe bench` (no target): the end-to-end comparison, three paths in one run.

On the same machine, in one run, on the same texts (posts of a seeded `modpipe.simulation.simulator` simulation built
from the served build's held-out split):

1. **pipeline**: modpipe end to end (broker -> ingest -> feature stages -> batching -> Triton ->
   decisions) on a local stack of N worker processes, the text cache off so that every text is
   computed, as the ceiling computes it. Saturation: every post is produced up front and decisions/s
   are measured over the steady part (the first and last 10% of decisions left out: pipeline fill and
   drain). Then the end-to-end latency (produce() call -> decision published, the decision record's
   timestamp; see `DecisionLog`) at a low fixed rate (`low_rate`, 5 posts/s) and at `load` x the
   saturation rate (Poisson or constant arrivals), on the same texts with fresh ids. Last, the workers
   restart with the text cache on and the saturation pass runs again: what campaigns' repeated texts
   save (hit ratio and posts/s).
2. **seed**: the approach modpipe replaces: one synchronous gRPC request per post to the same Triton
   server, inputs padded to 128 tokens, batch 1, tokenization in the loop (the workers are stopped
   first, so the seed has the machine the pipeline had).
3. **ceiling**: in-process ONNX Runtime on the same model file with Triton's thread settings, per-batch
   padding, tokenization in the loop, the best of a few batch sizes (Triton stopped first).

The ratios `pipeline/seed` and `pipeline/ceiling` are checked against the targets of the issue. The
report also says where the pipeline's CPU went (per process group, from /proc) and how busy the
machine was with other work in each phase: the numbers of a shared machine mean little without it.

Modules: `metering` (CPU from /proc, Triton's statistics, the machine), `ceilings` (the seed and the
in-process ONNX Runtime ceiling), `pipeline` (the pipeline's passes), `runs` (one run of all three),
`report` (targets, ratios, markdown). `transport` and `transport_report` are `modpipe bench transport`
(the delivery options for exactly-once output), apart from this comparison.
"""
