"""The one settings object. Every knob is an environment variable with a documented default.

`SETTINGS_SPEC` is the single source of truth: `Settings.from_env()` reads it, `modpipe config`
prints it, and docs/configuration.md is generated from it (`make docs`; a unit test fails when they differ).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path

from modpipe import log

RECEIVE_MESSAGE_MAX_BYTES = 1_000_000_000  # every client's; why: Settings.kafka_client_config


@dataclasses.dataclass(frozen=True)
class Spec:
    env: str
    default: str
    help: str
    kind: type = str


def _xdg(var: str, fallback: str) -> str:
    return os.path.join(os.environ.get(var) or os.path.expanduser(fallback), "modpipe")


SETTINGS_SPEC: dict[str, Spec] = {
    # -- paths
    "state_dir": Spec("MODPIPE_STATE_DIR", _xdg("XDG_STATE_HOME", "~/.local/state"),
                      "Runtime state: embedded broker data, Triton model repository, logs."),
    "cache_dir": Spec("MODPIPE_CACHE_DIR", _xdg("XDG_CACHE_HOME", "~/.cache"),
                      "Build cache: downloaded corpora and model builds keyed by a hash of code, config and data."),
    "model_dir": Spec("MODPIPE_MODEL_DIR", "",
                      "Served text-model build (model.onnx, tokenizer, card). Empty: the newest build in the cache."),
    "model_profile": Spec("MODPIPE_MODEL_PROFILE", "full",
                          "Build profile: `full` (the served CPU recipe), `gpu` (512 tokens, needs a GPU) or `demo` (minutes, for `make demo`)."),
    "debian_mirror": Spec("MODPIPE_DEBIAN_MIRROR", "http://deb.debian.org/debian",
                          "Debian mirror the out-of-domain e-mail corpora are fetched from once (source packages' files, "
                          "checked against their pinned sha256; `modpipe model eval --ood`)."),
    "corpora_dir": Spec("MODPIPE_CORPORA_DIR", "",
                        "Local copy of the platform corpora (modpipe/textmodel/platforms.py names each file by "
                        "repository, commit, path and sha256). Empty: `../shared/corpora` relative to the "
                        "repository's root; a file found in neither is downloaded once from its pinned commit into "
                        "MODPIPE_CACHE_DIR/corpora and checked."),
    # -- Kafka
    "bootstrap_servers": Spec("KAFKA_BOOTSTRAP_SERVERS", "",
                              "Kafka bootstrap servers. Empty: start a local broker (MODPIPE_BROKER)."),
    "broker": Spec("MODPIPE_BROKER", "kafka",
                   "The local broker `modpipe up`, `demo`, `broker`, `chaos`, the benchmarks and the tests start when "
                   "KAFKA_BOOTSTRAP_SERVERS is empty: `kafka` (Apache Kafka, its jars fetched once from Maven "
                   "Central; needs a JDK >= 17 and Maven) or `embedded` (noida-db, a Kafka-protocol broker inside a "
                   "PyPI wheel, for a machine without a JVM; docs/operations.md says what it lacks)."),
    "kafka_version": Spec("MODPIPE_KAFKA_VERSION", "4.1.1",
                          "Apache Kafka version the local broker runs (org.apache.kafka:kafka_2.13 on Maven Central; "
                          "cached per version under MODPIPE_CACHE_DIR/apache-kafka)."),
    "kafka_nodes": Spec("MODPIPE_KAFKA_NODES", "1",
                        "Nodes of the local Apache Kafka cluster (each a broker and a KRaft controller). 1: internal "
                        "topics at replication 1; 3: replication 3 and min.insync.replicas 2, so one node can die.",
                        int),
    "kafka_heap_mb": Spec("MODPIPE_KAFKA_HEAP_MB", "512", "Java heap of each local Apache Kafka node (-Xmx).", int),
    "security_protocol": Spec("KAFKA_SECURITY_PROTOCOL", "PLAINTEXT",
                              "PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL."),
    "sasl_mechanism": Spec("KAFKA_SASL_MECHANISM", "", "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 when SASL is used."),
    "sasl_username": Spec("KAFKA_SASL_USERNAME", "", "SASL user name."),
    "sasl_password": Spec("KAFKA_SASL_PASSWORD", "", "SASL password."),
    "ssl_cafile": Spec("KAFKA_SSL_CAFILE", "", "CA bundle for TLS to the brokers."),
    "broker_port": Spec("MODPIPE_BROKER_PORT", "9092",
                        "Client port of the local broker (of its first node; the others take free ports).", int),
    "topic_prefix": Spec("MODPIPE_TOPIC_PREFIX", "", "Prefix for every topic name (e.g. `prod.`)."),
    "partitions": Spec("MODPIPE_PARTITIONS", "4", "Partitions of each topic created by `modpipe topics`.", int),
    "replication": Spec("MODPIPE_REPLICATION", "0",
                        "Replication factor of created topics. 0: as many copies as the cluster has brokers, up to 3.",
                        int),
    "app_id": Spec("MODPIPE_APP_ID", "modpipe", "Application id: the consumer group id and the prefix of the tables' changelog topics."),
    # -- Triton
    "triton_url": Spec("TRITON_URL", "",
                       "Triton gRPC endpoint host:port. Empty: start the embedded Triton (nvidia-pytriton's binary)."),
    "triton_http_port": Spec("TRITON_HTTP_PORT", "8000", "HTTP port of the embedded Triton.", int),
    "triton_grpc_port": Spec("TRITON_GRPC_PORT", "8001", "gRPC port of the embedded Triton.", int),
    "triton_metrics_port": Spec("TRITON_METRICS_PORT", "8002", "Metrics port of the embedded Triton.", int),
    "triton_repo_src": Spec("MODPIPE_TRITON_REPO_SRC", "",
                            "Templates of the Triton model repository (configs, python-backend code). Empty: the ones "
                            "installed with modpipe (`modpipe.triton_models`, the repository's triton_models/)."),
    "triton_model": Spec("MODPIPE_TRITON_MODEL", "spam_text", "Name of the text model in Triton."),
    "triton_variant": Spec("MODPIPE_TRITON_VARIANT", "cpu",
                           "spam_text variant the embedded Triton serves: `cpu` (ONNX Runtime) or `cuda` (PyTorch, "
                           "fp16 on a GPU; on a machine without one it runs on the CPU in fp32)."),
    "text_path": Spec("MODPIPE_TEXT_PATH", "triton",
                      "Where a post's text is tokenized and read by the lexical stack: `triton` (the worker sends "
                      "the raw text to spam_text_ensemble, which does both; the worker keeps only the text cache) "
                      "or `worker` (the worker tokenizes, calls MODPIPE_TRITON_MODEL and applies the stack itself). "
                      "A MODPIPE_MAX_SEQ_LEN shorter than the build's window needs `worker`."),
    "text_model": Spec("MODPIPE_TEXT_MODEL", "on",
                       "`on`, or `off` to decide without the text model (no Triton; text_probability null): "
                       "for benchmarks of the feature path."),
    "triton_timeout_s": Spec("MODPIPE_TRITON_TIMEOUT_S", "30",
                             "Timeout of one Triton request (it is retried; its posts are carried across "
                             "checkpoints meanwhile, MODPIPE_CHECKPOINT_MODEL_WAIT_MS).", float),
    "text_model_outage_s": Spec("MODPIPE_TEXT_MODEL_OUTAGE_S", "30",
                                "Seconds of failed Triton requests in a row after which the text model counts as "
                                "out and MODPIPE_TEXT_MODEL_OUTAGE_POLICY applies.", float),
    "text_model_outage_policy": Spec("MODPIPE_TEXT_MODEL_OUTAGE_POLICY", "decide",
                                     "During a text-model outage: `decide` (the decision model without "
                                     "text_probability, marked `degraded`, decided again with revision + 1 when "
                                     "Triton is back), `review` (those posts to the review band, also decided "
                                     "again) or `wait` (decide nothing until Triton answers)."),
    # -- batching and verdicts
    "max_batch": Spec("MODPIPE_MAX_BATCH", "64", "Most posts per Triton request.", int),
    "max_wait_ms": Spec("MODPIPE_MAX_WAIT_MS", "5",
                        "Longest a batch waits to fill when another is already at Triton (a batch that finds "
                        "Triton idle is sent at once).", float),
    "max_inflight": Spec("MODPIPE_MAX_INFLIGHT", "2", "Batches in flight to Triton per worker.", int),
    "shutdown_grace_s": Spec("MODPIPE_SHUTDOWN_GRACE_S", "5",
                             "On SIGTERM, how long batches at Triton may finish before they are cancelled (their "
                             "posts stay uncommitted and are decided after the restart).", float),
    "ban_log_timeout_s": Spec("MODPIPE_BAN_LOG_TIMEOUT_S", "120",
                              "At start, how long a worker may take to read the ban log to its end before it "
                              "gives up and exits (it decides no post before).", float),
    "warm_up_timeout_s": Spec("MODPIPE_WARM_UP_TIMEOUT_S", "30",
                              "At start, how long the first text-model request (the warm-up) may take; after "
                              "it the worker starts anyway and turns ready once Triton answers.", float),
    "text_cache_size": Spec("MODPIPE_TEXT_CACHE_SIZE", "100000",
                            "Texts whose spam probability is kept (LRU) so that a repeated text skips Triton; 0: off.",
                            int),
    "max_seq_len": Spec("MODPIPE_MAX_SEQ_LEN", "0",
                        "Tokens kept per text (longer texts are truncated). 0: the served build's own `max_seq_len` "
                        "(128 for full, 512 for gpu), which Triton's tokenizer also uses; a value above it is "
                        "capped to it.", int),
    "max_text_chars": Spec("MODPIPE_MAX_TEXT_CHARS", "10000", "Longest accepted post text.", int),
    "review_threshold": Spec("MODPIPE_REVIEW_THRESHOLD", "0.5", "spam_probability at or above which a post is reviewed.",
                             float),
    "block_threshold": Spec("MODPIPE_BLOCK_THRESHOLD", "0.9", "spam_probability at or above which a post is blocked.",
                            float),
    # -- decision engine
    "decider": Spec("MODPIPE_DECIDER", "lightgbm",
                    "`lightgbm` (the decision model over every signal) or `text-only` (the text probability alone "
                    "through the two thresholds). Bans short-circuit either."),
    "decision_model": Spec("MODPIPE_DECISION_MODEL", "",
                           "Decision model directory (model.txt + model.json). Empty: the model trained for the "
                           "served text model in $MODPIPE_CACHE_DIR/decision, else the newest one there."),
    "decision_model_watch_s": Spec("MODPIPE_DECISION_MODEL_WATCH_S", "5",
                                   "How often a worker looks at its decision model's pointer (seconds); a "
                                   "promoted model is served without a restart. 0: never.", float),
    "shadow_decision_model": Spec("MODPIPE_SHADOW_DECISION_MODEL", "",
                                  "A candidate decision model scored beside the serving one on every post; "
                                  "disagreements are counted and logged, the serving verdict is published. "
                                  "Empty: none."),
    "text_floor": Spec("MODPIPE_TEXT_FLOOR", "",
                       "Text probability at or above which the decision engine sends a post at least to review, "
                       "whatever the other signals say. Empty: the floor the decision model was trained with "
                       "(its model.json `policy.text_floor`); `off`: none; or a probability in [0, 1]."),
    "reasons": Spec("MODPIPE_REASONS", "flagged",
                    "Which decisions carry their reasons (the decision model's TreeSHAP contributions, ~30x the "
                    "cost of its prediction): `flagged` (review and block, what moderators read; an allow carries "
                    "none), or `all`."),
    "redecide_reports": Spec("MODPIPE_REDECIDE_REPORTS", "3",
                             "Reports on a post that trigger a re-decision (a new decision, revision + 1); 0: never.",
                             int),
    # -- worker runtime
    "local_hops": Spec("MODPIPE_LOCAL_HOPS", "on",
                       "`on`: an item whose next stage partition this worker owns is applied at once, without "
                       "the Kafka hop; `off`: every stage hop goes through its stage topic."),
    "commit_interval_ms": Spec("MODPIPE_COMMIT_INTERVAL_MS", "10",
                               "Shortest time between two checkpoints while rounds are in flight. A checkpoint "
                               "commits the outputs of the rounds since the previous one (one changelog record per "
                               "changed key among them) with their input offsets as one Kafka transaction, while the "
                               "next rounds go on; it starts as soon as the previous one is done and this long has "
                               "passed since it started, or at once when every round since is complete "
                               "(streams/checkpointing/checkpoint.py). Longer: fewer, larger transactions and later decisions "
                               "under load.", float),
    "checkpoint_model_wait_ms": Spec("MODPIPE_CHECKPOINT_MODEL_WAIT_MS", "2000",
                                     "Longest a checkpoint waits for its posts' decisions (Triton). A post still "
                                     "waiting then is written as state into the checkpoint's transaction and decided "
                                     "in a later one (streams/moderation/carried.py): no Kafka transaction is held "
                                     "open across a Triton wait. Shorter: more posts carried (two changelog records "
                                     "each) when Triton is slow.", float),
    "transaction_timeout_ms": Spec("MODPIPE_TRANSACTION_TIMEOUT_MS", "20000",
                                   "transaction.timeout.ms of the worker's producer: how long a transaction left "
                                   "open by a worker that died or froze (and was not restarted) holds every "
                                   "read_committed reader of its partitions before the broker aborts it (plus up "
                                   "to the broker's transaction.abort.timed.out.transaction.cleanup.interval.ms, "
                                   "10 s by default: at most 30 s in all with the defaults). A "
                                   "checkpoint's transaction is open for MODPIPE_COMMIT_INTERVAL_MS, "
                                   "MODPIPE_CHECKPOINT_MODEL_WAIT_MS and its own requests; at least twice those "
                                   "two, at most the broker's transaction.max.timeout.ms (900000 by default).",
                                   float),
    "purge_interval_ms": Spec("MODPIPE_PURGE_INTERVAL_MS", "30000",
                              "How often a worker deletes the records of the internal topics (the stage topics and "
                              "posts.awaiting-text) that its checkpoints have committed (DeleteRecords, as Kafka "
                              "Streams purges its repartition topics; streams/runtime/purge.py). Only this group reads them "
                              "and never again before its committed offset; the platform's topics and the "
                              "changelogs are never touched. `0`: never (they stay for the topics' retention).",
                              float),
    "fetch_pause_ms": Spec("MODPIPE_FETCH_PAUSE_MS", "0",
                           "After a fetch that brought records, a consumer that reads continuously (the worker, "
                           "the load generator's and the benchmark's decision readers) pauses its partitions this "
                           "long before the next fetch. `0`: never, right for Apache Kafka, which holds an empty "
                           "fetch for fetch.wait.max.ms. The embedded broker answers an empty fetch at once, and a "
                           "consumer that never paused kept librdkafka fetching in a tight loop under load "
                           "(modpipe/services/fetching.py): whatever starts it gives its clients 20 "
                           "(modpipe/services/broker.py, EMBEDDED_BROKER_TUNING).", float),
    "fetch_idle_pause_ms": Spec("MODPIPE_FETCH_IDLE_PAUSE_MS", "0",
                                "A worker's consumer whose fetch brought nothing pauses its partitions before the "
                                "next, 2 ms doubling up to this long while they stay idle. `0`: never, right for "
                                "Apache Kafka's long-polled fetches. The embedded broker answers an empty fetch at "
                                "once and an idle consumer that never paused kept librdkafka fetching in a tight "
                                "loop (streams/kafka/consumer.py): whatever starts it gives its workers 25.",
                                float),
    "fetch_stall_s": Spec("MODPIPE_FETCH_STALL_S", "15",
                          "A worker's assigned partition that has records past what its consumer delivered and has "
                          "delivered nothing for this long is sought back to where it stopped, with librdkafka's "
                          "view of it in the log and modpipe_consumer_fetch_stalls_total; stalled again, the worker "
                          "restarts with a new consumer (streams/kafka/stalls.py). `0`: not watched.", float),
    "abort_on_brokers_down": Spec("MODPIPE_ABORT_ON_BROKERS_DOWN", "off",
                                  "`on`: a worker whose producer loses every broker with a transaction open aborts it "
                                  "and stops (its restart processes the input again): the embedded broker forgets "
                                  "transactions when it restarts, and whatever starts it sets this. `off`: the "
                                  "transaction goes on once a broker is back, as Apache Kafka keeps it "
                                  "(streams/checkpointing/outbox.py)."),
    "freeze_guard": Spec("MODPIPE_FREEZE_GUARD", "off",
                         "`on`: a worker whose process stood still longer than its group session (a SIGSTOP, a VM "
                         "pause) aborts its checkpoint and stops (streams/checkpointing/checkpoint.py, step 4). `off`: Apache "
                         "Kafka fences such a worker itself: librdkafka finds its session expired and drops the "
                         "partitions, and the broker refuses the offsets of an older group generation (KIP-447; "
                         "tests/integration/test_zombie.py). The embedded broker checks no generation: whatever "
                         "starts it sets `on`."),
    "static_membership": Spec("MODPIPE_STATIC_MEMBERSHIP", "on",
                              "`on`: a worker's group.instance.id is <app id>-<worker name>, so a restarted worker "
                              "takes its partitions back without a rebalance; `off`: dynamic membership."),
    "group_rejoin_s": Spec("MODPIPE_GROUP_REJOIN_S", "0",
                           "A worker the group has not answered (no assignment, not even an empty one) for this "
                           "long after it joined or gave its partitions up closes its consumer and joins again "
                           "with a new one. `0`: never, only a warning every 30 s: Apache Kafka answers every join, "
                           "holding it while another member finishes a rebalance callback (a revocation's commit), and "
                           "a rejoin then restarts the rebalance. The embedded broker has left joins unanswered: "
                           "whatever starts it gives its workers 20.", float),
    "producer_linger_ms": Spec("MODPIPE_PRODUCER_LINGER_MS", "1",
                               "librdkafka linger.ms of the worker's producer (decisions, stage bundles, dead "
                               "letters): each round is already one record per partition.", float),
    "worker_name": Spec("MODPIPE_WORKER_NAME", "",
                        "Stable, unique name of a worker (e.g. the StatefulSet pod name): its consumer-group "
                        "static member id and the stem of its transactional ids (one per start). Empty: host-pid."),
    "workers": Spec("MODPIPE_WORKERS", "1", "Workers started by `modpipe up`.", int),
    "metrics_host": Spec("MODPIPE_METRICS_HOST", "127.0.0.1", "Address of each worker's Prometheus endpoint."),
    "metrics_port": Spec("MODPIPE_METRICS_PORT", "9464",
                         "Prometheus port of a worker; `modpipe up` gives worker i port + i.", int),
    "state_cache_keys": Spec("MODPIPE_STATE_CACHE_KEYS", "20000",
                             "Decoded states a worker keeps per feature table between checkpoints at most (user, "
                             "url, domain, ip): a hot key is decoded once, not once per checkpoint. Their bytes are "
                             "bounded too: a fifth each of MODPIPE_WORKER_MEMORY_MB's state_cache share (8 %).", int),
    "post_state_cache_keys": Spec("MODPIPE_POST_STATE_CACHE_KEYS", "2000",
                                  "The same for the post table, whose states hold a decision snapshot (~9 KB "
                                  "each) and are hot only for the minutes after the post: 20,000 of them grew a "
                                  "worker by ~120 MiB in the soak run.", int),
    "worker_memory_mb": Spec("MODPIPE_WORKER_MEMORY_MB", "2048",
                             "Memory a worker has (its pod's limit: set both together). Every cache and buffer fed "
                             "by platform data is bounded in bytes by a fixed share of it, 45 % in all (the decoded "
                             "table states of the open checkpoint 10 %, RocksDB's cache of the tables 8 %, decoded "
                             "states kept between checkpoints 8 %, decision queue 3 %, librdkafka's producer queue "
                             "3 %, records held back while a checkpoint commits 3 %, parsed links 2 %, fetched records 2 %, stage bundles 2 %, text cache 1 %, ...: "
                             "modpipe/memory.py, docs/features.md); the rest is the process (~400 MiB) and the tables "
                             "with MODPIPE_STATE_BACKEND=memory.", int),
    "state_backend": Spec("MODPIPE_STATE_BACKEND", "rocksdb",
                          "Where a worker keeps its feature tables: `rocksdb` (on disk under MODPIPE_STATE_DIR/tables, "
                          "a bounded cache in memory; a restart reads only the changelogs' tails) or `memory` (every "
                          "state in memory, restored from the whole changelog). docs/features.md, Table state."),
    "post_retention_s": Spec("MODPIPE_POST_RETENTION_S", "21600",
                             "How long the post table keeps a post not written since (its reports, labels and "
                             "decision snapshot; a later report or ban cannot decide it again). Memory per worker "
                             "~ posts/s it owns x this x 2 KB (docs/features.md, Retention); 0: for ever.", float),
    "feature_retention_s": Spec("MODPIPE_FEATURE_RETENTION_S", "259200",
                                "How long the user, url, domain and ip tables keep a key not written since (its "
                                "counts start again from zero after). 0: for ever.", float),
    # -- review console (`modpipe console`)
    "console_host": Spec("MODPIPE_CONSOLE_HOST", "127.0.0.1",
                         "Address the review console binds. Anything but loopback needs TLS "
                         "(MODPIPE_CONSOLE_TLS_CERT/KEY) or MODPIPE_CONSOLE_PLAINTEXT_BEHIND_PROXY=on."),
    "console_port": Spec("MODPIPE_CONSOLE_PORT", "8088", "Port of the review console.", int),
    "console_public_name": Spec("MODPIPE_CONSOLE_PUBLIC_NAME", "",
                                "Comma-separated names (host or host:port) browsers reach the console by; a "
                                "request whose Host (or a write whose Origin) is neither one of them nor the bind "
                                "(on loopback: localhost, 127.0.0.1, [::1] with the port) is refused."),
    "console_accounts": Spec("MODPIPE_CONSOLE_ACCOUNTS", "",
                             "Moderator accounts file (argon2id hashes, mode 0600) written by `modpipe console "
                             "add-moderator`. Empty: MODPIPE_STATE_DIR/console/accounts.json."),
    "console_audit_log": Spec("MODPIPE_CONSOLE_AUDIT_LOG", "",
                              "Append-only JSONL audit log, one line per label (who, when, post, verdict before). "
                              "Empty: MODPIPE_STATE_DIR/console/audit.jsonl."),
    "console_session_idle_s": Spec("MODPIPE_CONSOLE_SESSION_IDLE_S", "1800",
                                   "A session ends after this long without a moderator's action (seconds; the "
                                   "page's background refresh does not count).", float),
    "console_session_max_s": Spec("MODPIPE_CONSOLE_SESSION_MAX_S", "43200",
                                  "A session ends this long after sign-in whatever happens (seconds).", float),
    "console_tls_cert": Spec("MODPIPE_CONSOLE_TLS_CERT", "",
                             "PEM certificate (chain) the console serves HTTPS with; needs MODPIPE_CONSOLE_TLS_KEY."),
    "console_tls_key": Spec("MODPIPE_CONSOLE_TLS_KEY", "", "PEM private key of MODPIPE_CONSOLE_TLS_CERT."),
    "console_plaintext_behind_proxy": Spec("MODPIPE_CONSOLE_PLAINTEXT_BEHIND_PROXY", "off",
                                           "`on`: a non-loopback bind may speak plain HTTP because a TLS-terminating "
                                           "proxy is in front (cookies are still marked Secure)."),
    "console_proxy_user_header": Spec("MODPIPE_CONSOLE_PROXY_USER_HEADER", "",
                                      "Header an authenticating reverse proxy puts the signed-in user in (e.g. "
                                      "X-Forwarded-User); honoured only from MODPIPE_CONSOLE_PROXY_ADDRESSES."),
    "console_proxy_addresses": Spec("MODPIPE_CONSOLE_PROXY_ADDRESSES", "",
                                    "Comma-separated addresses or CIDR networks of that proxy."),
    "console_proxy_role": Spec("MODPIPE_CONSOLE_PROXY_ROLE", "viewer",
                               "Role of a proxy-signed-in user without an account: `viewer` (reads the queue) or "
                               "`moderator` (also labels). An account of the same name gives its own role."),
    "console_lookback_s": Spec("MODPIPE_CONSOLE_LOOKBACK_S", "86400",
                               "How far back the console reads posts, decisions and labels when it starts (seconds).",
                               float),
    "console_max_posts": Spec("MODPIPE_CONSOLE_MAX_POSTS", "50000",
                              "Posts the console keeps in memory (oldest forgotten first).", int),
    "console_max_bytes": Spec("MODPIPE_CONSOLE_MAX_BYTES", "268435456",
                              "Bytes of posts the console keeps in memory: their records' encoded size plus 1 KiB "
                              "per post (oldest forgotten first; whichever of this and MAX_POSTS is reached first).",
                              int),
    "console_max_connections": Spec("MODPIPE_CONSOLE_MAX_CONNECTIONS", "1000",
                                    "Connections the console holds at once; a request beyond them is answered 503.",
                                    int),
    "console_max_connections_per_address": Spec("MODPIPE_CONSOLE_MAX_CONNECTIONS_PER_ADDRESS", "256",
                                                "Connections one client address may hold at once (beyond: closed at "
                                                "once; the proxies of MODPIPE_CONSOLE_PROXY_ADDRESSES are not "
                                                "capped). 0: no cap.", int),
    "console_request_timeout_s": Spec("MODPIPE_CONSOLE_REQUEST_TIMEOUT_S", "10",
                                      "A request's head and body must arrive within this long of its connection "
                                      "(or of the previous answer on it), else the connection is closed (seconds).",
                                      float),
    "console_proxy_forwarded_header": Spec("MODPIPE_CONSOLE_PROXY_FORWARDED_HEADER", "X-Forwarded-For",
                                           "Header in which MODPIPE_CONSOLE_PROXY_ADDRESSES forward the client's "
                                           "address (the last hop not a proxy counts); sign-ins are throttled by it. "
                                           "Empty: the proxy's own address."),
    "log_level": Spec("MODPIPE_LOG_LEVEL", "INFO", "DEBUG, INFO, WARNING or ERROR."),
    "log_format": Spec("MODPIPE_LOG_FORMAT", "json", "`json` (one object per line) or `text`."),
}


@dataclasses.dataclass(frozen=True)
class Settings:
    state_dir: Path
    cache_dir: Path
    model_dir: str
    debian_mirror: str
    corpora_dir: str
    model_profile: str
    bootstrap_servers: str
    broker: str
    kafka_version: str
    kafka_nodes: int
    kafka_heap_mb: int
    security_protocol: str
    sasl_mechanism: str
    sasl_username: str
    sasl_password: str
    ssl_cafile: str
    broker_port: int
    topic_prefix: str
    partitions: int
    replication: int
    app_id: str
    triton_url: str
    triton_http_port: int
    triton_grpc_port: int
    triton_metrics_port: int
    triton_repo_src: str
    triton_model: str
    triton_variant: str
    text_model: str
    triton_timeout_s: float
    text_model_outage_s: float
    text_model_outage_policy: str
    max_batch: int
    max_wait_ms: float
    max_inflight: int
    shutdown_grace_s: float
    ban_log_timeout_s: float
    warm_up_timeout_s: float
    text_cache_size: int
    text_path: str
    max_seq_len: int
    max_text_chars: int
    review_threshold: float
    block_threshold: float
    decider: str
    decision_model: str
    decision_model_watch_s: float
    shadow_decision_model: str
    text_floor: str
    reasons: str
    redecide_reports: int
    local_hops: str
    commit_interval_ms: float
    checkpoint_model_wait_ms: float
    transaction_timeout_ms: float
    purge_interval_ms: float
    fetch_pause_ms: float
    fetch_idle_pause_ms: float
    fetch_stall_s: float
    group_rejoin_s: float
    abort_on_brokers_down: str
    freeze_guard: str
    static_membership: str
    producer_linger_ms: float
    worker_name: str
    workers: int
    metrics_host: str
    metrics_port: int
    state_cache_keys: int
    post_state_cache_keys: int
    worker_memory_mb: int
    state_backend: str
    post_retention_s: float
    feature_retention_s: float
    console_host: str
    console_port: int
    console_public_name: str
    console_accounts: str
    console_audit_log: str
    console_session_idle_s: float
    console_session_max_s: float
    console_tls_cert: str
    console_tls_key: str
    console_plaintext_behind_proxy: str
    console_proxy_user_header: str
    console_proxy_addresses: str
    console_proxy_role: str
    console_lookback_s: float
    console_max_posts: int
    console_max_bytes: int
    console_max_connections: int
    console_max_connections_per_address: int
    console_request_timeout_s: float
    console_proxy_forwarded_header: str
    log_level: str
    log_format: str

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides) -> Settings:
        env = os.environ if env is None else env
        values = {}
        for name, spec in SETTINGS_SPEC.items():
            raw = env.get(spec.env, spec.default)
            try:
                value = spec.kind(raw)
            except ValueError as exc:
                raise SettingsError(f"{spec.env}={raw!r} is not a valid {spec.kind.__name__}") from exc
            values[name] = value
        values.update(overrides)
        values["state_dir"] = Path(values["state_dir"]).expanduser()
        values["cache_dir"] = Path(values["cache_dir"]).expanduser()
        settings = cls(**values)
        settings.validate()
        return settings

    def validate(self) -> None:
        if self.freeze_guard not in ("on", "off"):
            raise SettingsError("MODPIPE_FREEZE_GUARD must be `on` or `off`")
        if self.abort_on_brokers_down not in ("on", "off"):
            raise SettingsError("MODPIPE_ABORT_ON_BROKERS_DOWN must be `on` or `off`")
        if self.broker not in ("kafka", "embedded"):
            raise SettingsError("MODPIPE_BROKER must be `kafka` (Apache Kafka) or `embedded` (noida-db)")
        if self.kafka_nodes < 1:
            raise SettingsError("MODPIPE_KAFKA_NODES must be >= 1")
        if self.replication < 0:
            raise SettingsError("MODPIPE_REPLICATION must be >= 0 (0: the cluster's brokers, up to 3)")
        if not 0 <= self.review_threshold <= self.block_threshold <= 1:
            raise SettingsError("need 0 <= MODPIPE_REVIEW_THRESHOLD <= MODPIPE_BLOCK_THRESHOLD <= 1")
        if self.max_batch < 1 or self.max_inflight < 1 or self.partitions < 1:
            raise SettingsError("MODPIPE_MAX_BATCH, MODPIPE_MAX_INFLIGHT and MODPIPE_PARTITIONS must be >= 1")
        if self.console_max_posts < 1 or self.console_lookback_s < 0:
            raise SettingsError("MODPIPE_CONSOLE_MAX_POSTS must be >= 1 and MODPIPE_CONSOLE_LOOKBACK_S >= 0")
        if not 0 < self.console_session_idle_s <= self.console_session_max_s:
            raise SettingsError("need 0 < MODPIPE_CONSOLE_SESSION_IDLE_S <= MODPIPE_CONSOLE_SESSION_MAX_S")
        if self.console_plaintext_behind_proxy not in ("on", "off"):
            raise SettingsError("MODPIPE_CONSOLE_PLAINTEXT_BEHIND_PROXY must be `on` or `off`")
        if self.console_proxy_role not in ("viewer", "moderator"):
            raise SettingsError("MODPIPE_CONSOLE_PROXY_ROLE must be `viewer` or `moderator`")
        if self.state_cache_keys < 1 or self.post_state_cache_keys < 1:
            raise SettingsError("MODPIPE_STATE_CACHE_KEYS and MODPIPE_POST_STATE_CACHE_KEYS must be >= 1")
        if self.worker_memory_mb < 256:
            raise SettingsError("MODPIPE_WORKER_MEMORY_MB must be >= 256")
        if self.state_backend not in ("rocksdb", "memory"):
            raise SettingsError("MODPIPE_STATE_BACKEND must be `rocksdb` or `memory`")
        if self.post_retention_s < 0 or self.feature_retention_s < 0:
            raise SettingsError("MODPIPE_POST_RETENTION_S and MODPIPE_FEATURE_RETENTION_S must be >= 0 (0: for ever)")
        if self.static_membership not in ("on", "off"):
            raise SettingsError("MODPIPE_STATIC_MEMBERSHIP must be `on` or `off`")
        if self.commit_interval_ms <= 0:
            raise SettingsError("MODPIPE_COMMIT_INTERVAL_MS must be > 0")
        if self.checkpoint_model_wait_ms < 0:
            raise SettingsError("MODPIPE_CHECKPOINT_MODEL_WAIT_MS must be >= 0")
        if not 2 * (self.commit_interval_ms + self.checkpoint_model_wait_ms) <= self.transaction_timeout_ms <= 900_000:
            raise SettingsError("MODPIPE_TRANSACTION_TIMEOUT_MS must be at least twice MODPIPE_COMMIT_INTERVAL_MS + "
                                "MODPIPE_CHECKPOINT_MODEL_WAIT_MS (a checkpoint's transaction must commit within it) "
                                "and at most 900000 (Apache Kafka's transaction.max.timeout.ms default)")
        if self.purge_interval_ms < 0:
            raise SettingsError("MODPIPE_PURGE_INTERVAL_MS must be >= 0 (0: never)")
        if self.fetch_pause_ms < 0:
            raise SettingsError("MODPIPE_FETCH_PAUSE_MS must be >= 0")
        if self.fetch_idle_pause_ms < 0:
            raise SettingsError("MODPIPE_FETCH_IDLE_PAUSE_MS must be >= 0")
        if self.fetch_stall_s < 0:
            raise SettingsError("MODPIPE_FETCH_STALL_S must be >= 0 (0: not watched)")
        if self.group_rejoin_s < 0:
            raise SettingsError("MODPIPE_GROUP_REJOIN_S must be >= 0 (0: never)")
        if self.text_model not in ("on", "off"):
            raise SettingsError("MODPIPE_TEXT_MODEL must be `on` or `off`")
        if self.local_hops not in ("on", "off"):
            raise SettingsError("MODPIPE_LOCAL_HOPS must be `on` or `off`")
        if self.decider not in ("lightgbm", "text-only"):
            raise SettingsError("MODPIPE_DECIDER must be `lightgbm` or `text-only`")
        if self.text_floor not in ("", "off"):
            try:
                floor = float(self.text_floor)
            except ValueError:
                floor = -1.0
            if not 0 <= floor <= 1:
                raise SettingsError("MODPIPE_TEXT_FLOOR must be empty (the decision model's own), `off` or a "
                                    "probability in [0, 1]")
        if self.reasons not in ("all", "flagged"):
            raise SettingsError("MODPIPE_REASONS must be `all` or `flagged`")
        if self.redecide_reports < 0:
            raise SettingsError("MODPIPE_REDECIDE_REPORTS must be >= 0")
        if self.triton_variant not in ("cpu", "cuda"):
            raise SettingsError("MODPIPE_TRITON_VARIANT must be `cpu` or `cuda` (tensorrt runs in NVIDIA's Triton "
                                "container: `modpipe triton export --variant tensorrt`)")
        if self.text_model_outage_policy not in ("decide", "review", "wait"):
            raise SettingsError("MODPIPE_TEXT_MODEL_OUTAGE_POLICY must be `decide`, `review` or `wait`")
        if self.text_model_outage_s < 0:
            raise SettingsError("MODPIPE_TEXT_MODEL_OUTAGE_S must be >= 0")
        if self.text_path not in ("triton", "worker"):
            raise SettingsError("MODPIPE_TEXT_PATH must be `triton` or `worker`")
        if self.max_seq_len < 0:
            raise SettingsError("MODPIPE_MAX_SEQ_LEN must be >= 0 (0: the build's own)")
        if self.model_profile not in ("full", "gpu", "demo"):
            raise SettingsError("MODPIPE_MODEL_PROFILE must be `full`, `gpu` or `demo`")

    def console_file(self, configured: str, name: str) -> Path:
        """A console file setting, else its default place under MODPIPE_STATE_DIR/console."""
        return Path(configured).expanduser() if configured else self.state_dir / "console" / name

    def replication_for(self, brokers: int) -> int:
        """Replication factor of a topic created on a cluster of `brokers` brokers (MODPIPE_REPLICATION)."""
        return self.replication or max(1, min(3, brokers))

    def topic(self, name: str) -> str:
        """Physical topic name for a logical one (`posts` -> `<prefix>posts`)."""
        return f"{self.topic_prefix}{name}"

    def bootstrap(self) -> str:
        """KAFKA_BOOTSTRAP_SERVERS, else the embedded broker's address (started by `modpipe broker` or `up`)."""
        return self.bootstrap_servers or f"127.0.0.1:{self.broker_port}"

    def kafka_client_config(self) -> dict:
        """librdkafka settings shared by every confluent-kafka client we create. Its log lines go to the
        `librdkafka` logger (structured, served when the client polls) instead of raw `%N|...` lines on stderr.

        `receive.message.max.bytes`: the embedded broker (noida-db) answers a fetch with every record it
        chose, past fetch.max.bytes (a table restore got 101.7 MB after a broker restart); past librdkafka's
        100 MB default the client rejects the response and retries the same fetch for ever (docs/faults.md).
        Apache Kafka keeps responses within fetch.max.bytes (50 MB), so there the limit is never reached."""
        conf = {"bootstrap.servers": self.bootstrap_servers, "security.protocol": self.security_protocol,
                "logger": log.kafka_client_logger(), "receive.message.max.bytes": RECEIVE_MESSAGE_MAX_BYTES}
        if self.sasl_mechanism:
            conf.update({"sasl.mechanism": self.sasl_mechanism, "sasl.username": self.sasl_username,
                         "sasl.password": self.sasl_password})
        if self.ssl_cafile:
            conf["ssl.ca.location"] = self.ssl_cafile
        return conf

    def kafka_consumer_config(self) -> dict:
        """`kafka_client_config()` for a consumer that reads the pipeline's outputs, `read_committed`. The
        workers write their outputs (stage bundles, decisions, dead letters, changelogs) in Kafka transactions:
        a `read_uncommitted` reader would also see the records of transactions that were
        aborted, by a worker that crashed or was fenced, and then the same records again when the input is
        processed a second time: duplicates, and outputs that never happened."""
        return {**self.kafka_client_config(), "isolation.level": "read_committed"}

    def to_env(self) -> dict[str, str]:
        """Environment that reproduces these settings in a child process."""
        return {spec.env: str(getattr(self, name)) for name, spec in SETTINGS_SPEC.items()}


class SettingsError(ValueError):
    """A setting has a value we cannot use."""
