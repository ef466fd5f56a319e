"""Everything a worker publishes goes through one transactional librdkafka producer: stage bundles,
decisions, dead letters and changelog records, and with them the input offsets they came from.

Records are produced into the open transaction as the wiring makes them; `commit()` (called by the
checkpoint, streams/checkpointing/checkpoint.py) adds the input offsets and commits them all at once, then opens the next
transaction. A reader with `isolation.level=read_committed` sees a checkpoint's outputs only once its input
offsets are committed, and never those of a transaction that was aborted (a worker that died, or was fenced).

Fencing: each start of a worker has a transactional.id of its own, `<app id>-<worker name>-<n>`, and fences the
one before (streams/checkpointing/incarnations.py says how, and why not one id per worker); on Apache Kafka the offsets
carry the consumer group's generation (KIP-447), so a worker that lost its partitions in a rebalance cannot
commit for them either (streams/checkpointing/checkpoint.py says what the embedded broker checks).

On the embedded broker (MODPIPE_ABORT_ON_BROKERS_DOWN=on, set by whatever starts it) a transactional producer
never outlives the broker connection: once started, when it loses every broker, its transaction is doomed (`TransactionDoomed`): its queued records are purged at once, no more are taken, and
the worker stops; its restart is a new incarnation. Why: a broker that restarts without the transaction
coordinator's state (the embedded noida-db keeps none across a restart; Apache Kafka before KIP-890 has the
same race with a late retry) takes the old producer's later records into a transaction that nobody can end:
its own `abort_transaction` finds no partitions to mark when they were added before the restart, fencing by
the next incarnation does not reach it (the broker no longer knows the id), and the partition's last stable
offset stays behind it, so every read_committed reader of that partition stops there (measured: 139 of 500
posts undecided after one broker restart). Apache Kafka keeps a transaction's state across a restart, and
since KIP-890 (3.8, server side) a late record cannot join a transaction that has ended: there the worker
rides out a moment without brokers (a pod network blip) and the transaction goes on, or the coordinator aborts
it past transaction.timeout.ms and the commit says so.

`Pending` counts what a round (or a Triton batch) still waits for: its records' delivery reports and the
holds it takes; the checkpoint waits until every round of its epoch is complete.

Epochs: the rounds between two checkpoints form an epoch, and the open transaction belongs to the oldest
epoch not yet committed (`head_epoch`). While a checkpoint waits for its epoch's last Triton answers, rounds of
the next epoch already run: what they produce (a `Pending` tagged with a later epoch) waits here, in order,
and goes into the next transaction as soon as `advance()` opens it. So a round never waits for a checkpoint,
and each transaction still holds exactly the outputs of the rounds whose offsets it commits. Delivery reports arrive on a librdkafka
thread (`poll`); the thread hands them to the event loop in one call per poll.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from collections.abc import Callable

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition
from modpipe.streams import metrics

from modpipe import log, memory
from modpipe.settings import Settings

_log = log.get(__name__)
TXN_RETRY_S = 0.25  # between two tries of a transaction request librdkafka calls retriable


class DeliveryFailed(RuntimeError):
    """A record could not be delivered within librdkafka's retries (message.timeout.ms)."""


class TransactionDoomed(DeliveryFailed):
    """The open transaction cannot be committed any more; the worker must stop and its input be processed
    again."""


class Pending:
    """What a round or a batch still waits for. Every produce under this group and every explicit `hold()`
    must be matched by a delivery or a `release()`; `seal()` releases the creator's own hold once it has
    produced everything it will. `on_done` runs when nothing is left; `on_error` on a failed delivery."""

    __slots__ = ("holds", "on_error", "on_done", "epoch", "what")

    def __init__(self, on_error: Callable[[Exception], None] | None = None,
                 on_done: Callable[[], None] | None = None, epoch: int | None = None, what: str = ""):
        self.holds = 1
        self.on_error = on_error
        self.on_done = on_done
        self.epoch = epoch  # the checkpoint epoch its records belong to (None: the open transaction's)
        self.what = what  # what it is (a round of a topic, the checkpoint's writes): said when a checkpoint waits long

    def hold(self, n: int = 1) -> None:
        self.holds += n

    def release(self, error: Exception | None = None) -> None:
        if error is not None:
            if self.on_error is not None:
                self.on_error(error)
            return  # never done: the worker stops and its input is processed again after the restart
        self.holds -= 1
        if self.holds == 0 and self.on_done is not None:
            self.on_done()

    def seal(self) -> None:
        self.release()


class Outbox:
    """One confluent-kafka producer for a worker's outputs, with delivery tracked per `Pending` group;
    transactional when given a `transactional_id`."""

    def __init__(self, settings: Settings, bootstrap: str, *, linger_ms: float, transactional_id: str | None = None,
                 transaction_timeout_ms: int = 60_000):
        self.transactional = transactional_id is not None
        self.abort_on_brokers_down = settings.abort_on_brokers_down == "on"
        self.transactional_id = transactional_id
        extra = {"transactional.id": transactional_id, "transaction.timeout.ms": transaction_timeout_ms} \
            if self.transactional else {}
        self.producer = Producer({**extra,
            **settings.kafka_client_config(), "bootstrap.servers": bootstrap,
            "linger.ms": linger_ms, "acks": "all",
            # One record per destination partition per round is already a batch; keep librdkafka's
            # own queue deep enough for a burst of decisions.
            "queue.buffering.max.messages": 1_000_000, "compression.type": "none",
            # and bounded in bytes by its share of the worker's memory (librdkafka's default is 1 GiB); a
            # full queue makes `produce` wait for deliveries. Never under 32 MiB: a bundle record must fit.
            "queue.buffering.max.kbytes": max(32 * 1024, memory.budget_bytes("producer_queue",
                                                                             settings.worker_memory_mb) // 1024),
            # Retried batches keep their order within a partition: without it an older changelog state or
            # decision revision could land after a newer one and win.
            "enable.idempotence": True,
            "error_cb": self._on_client_error,
        })
        # called on the event loop when the producer fails for good (a fatal librdkafka error: e.g. a broker
        # that lost acknowledged records breaks the idempotent sequence); the worker must restart
        self.on_fatal: Callable[[Exception], None] | None = None
        self._closed_around_a_request = False  # the close gave up waiting for a transaction request (`hung`)
        # called on the event loop after each batch of delivery reports (persist changelog offsets)
        self.after_delivery: list[Callable[[], None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reports: collections.deque = collections.deque()  # (pending, error) from librdkafka
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # transactional API calls (commit, abort) never overlap: librdkafka refuses a second one (_CONFLICT)
        self._txn_lock = threading.Lock()
        self._started = False  # init_transactions done: from here on a lost broker dooms the transaction
        self.doomed: str | None = None  # why the open transaction can no longer commit
        self._no_commits = threading.Event()  # set when the worker stops: nothing more may commit
        self.head_epoch = 0  # the epoch whose records go into the open transaction
        self._later: list[tuple[str, dict, Pending]] = []  # records of the next epoch, in produce order
        self.later_bytes = 0
        # looked up once: set for every record held back (`labels()` takes a lock and builds its key)
        self._next_epoch_bytes = metrics.BUFFER_BYTES.labels("next_epoch")

    def start(self, loop: asyncio.AbstractEventLoop, timeout: float = 60.0) -> Outbox:
        """Blocking when transactional: `init_transactions` fences an earlier producer with our id (aborting
        what it left open) and the first transaction opens."""
        self._loop = loop
        if self.transactional:
            self.producer.init_transactions(timeout)
            self.producer.begin_transaction()
            self._started = True
        self._thread = threading.Thread(target=self._poll_forever, name="outbox-delivery", daemon=True)
        self._thread.start()
        return self

    def produce(self, topic: str, value: bytes, *, key: bytes | None = None, partition: int | None = None,
                pending: Pending | None = None, headers: list | None = None,
                on_delivered: Callable[[int], None] | None = None) -> None:
        """Queue one record. `pending` is held until it is delivered; `on_delivered(offset)` runs on the event
        loop after a successful delivery."""
        if self.doomed is not None:  # never into a transaction that cannot commit (see the module docstring)
            if pending is not None:
                pending.hold()
                pending.release(TransactionDoomed(self.doomed))
            return
        if pending is not None:
            pending.hold()
        callback = self._callback(pending, on_delivered)
        kwargs = {"key": key, "value": value, "on_delivery": callback}
        if partition is not None:
            kwargs["partition"] = partition
        if headers:
            kwargs["headers"] = headers
        epoch = None if pending is None else pending.epoch
        if epoch is not None and epoch != self.head_epoch:
            if epoch != self.head_epoch + 1:  # a bug: these records would land outside their transaction
                pending.release(RuntimeError(f"a record of epoch {epoch} produced while epoch {self.head_epoch} "
                                             "is the open transaction's"))
                return
            # held until the next transaction opens: an exact-size copy (an orjson result keeps its whole buffer,
            # modpipe.schema.dumps_kept)
            kwargs["value"] = None if value is None else bytes(memoryview(value))
            if key is not None:
                kwargs["key"] = bytes(memoryview(key))
            self._later.append((topic, kwargs, pending))
            self.later_bytes += len(value or b"") + len(key or b"")
            self._next_epoch_bytes.set(self.later_bytes)
            return
        self._produce(topic, kwargs)

    def advance(self) -> None:
        """The head epoch was committed and the next transaction is open: the next epoch's records go into it
        (on the event loop, like `produce`)."""
        self.head_epoch += 1
        later, self._later = self._later, []
        self.later_bytes = 0
        self._next_epoch_bytes.set(0)
        for topic, kwargs, pending in later:
            if self.doomed is not None:
                pending.release(TransactionDoomed(self.doomed))
                continue
            self._produce(topic, kwargs)

    def _produce(self, topic: str, kwargs: dict) -> None:
        while True:
            try:
                self.producer.produce(topic, **kwargs)
                break
            except BufferError:  # librdkafka's queue is full: wait for deliveries (back-pressure)
                self.producer.poll(0.05)
                self._hand_over()
        if self.doomed is not None:  # doomed between the check above and the queueing: `doom` sets the reason
            self.producer.purge(in_queue=True, in_flight=True)  # before it purges, so one of the two purges gets it

    def _on_client_error(self, error) -> None:  # librdkafka thread
        if error.fatal():
            _log.error("producer failed for good; the worker stops", extra={"error": str(error)})
            self._fail(DeliveryFailed(str(error)))
        elif (self._started and self.abort_on_brokers_down and error.code() == KafkaError._ALL_BROKERS_DOWN
              and self.doomed is None):
            self.doom("every broker went away with a transaction open")
        # other errors are transient (a broker down, a timeout): librdkafka retries, and logs them itself

    def doom(self, reason: str) -> None:
        """The open transaction can no longer commit (see the module docstring): drop what is queued, take
        nothing more, and stop the worker. Thread-safe."""
        self.doomed = reason
        self.producer.purge(in_queue=True, in_flight=True)
        _log.error("transaction doomed; its records are dropped and the worker stops", extra={"reason": reason})
        self._fail(TransactionDoomed(reason))

    def _fail(self, exc: Exception) -> None:
        if self.on_fatal is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(self.on_fatal, exc)

    def stop_committing(self) -> None:
        """From now on `commit` raises: a worker that is stopping after a failure commits nothing, even a
        checkpoint already under way (it is checked right before each of the commit's requests)."""
        self._no_commits.set()

    def _callback(self, pending: Pending | None, on_delivered: Callable[[int], None] | None):
        reports = self._reports

        def on_delivery(err, msg) -> None:  # librdkafka thread
            reports.append((pending, err, on_delivered, None if err is not None else msg.offset()))
        return on_delivery

    def _poll_forever(self) -> None:
        while not self._stop.is_set():
            self.producer.poll(0.05)
            self._hand_over()

    def _hand_over(self) -> None:
        if not self._reports:
            return
        batch = []
        reports = self._reports
        while reports:
            batch.append(reports.popleft())
        self._loop.call_soon_threadsafe(self._on_reports, batch)

    def _on_reports(self, batch: list) -> None:  # event loop thread
        for pending, err, on_delivered, offset in batch:
            if err is None and on_delivered is not None:
                on_delivered(offset)
            if pending is None:
                if err is not None:
                    _log.error("record not delivered", extra={"error": str(err)})
                continue
            pending.release(DeliveryFailed(str(err)) if err is not None else None)
        for hook in self.after_delivery:
            hook()

    def commit(self, offsets: dict, group_metadata, timeout: float = 60.0,
               guard: Callable[[], None] | None = None, metadata: dict | None = None) -> None:
        """Blocking (call it off the loop): the open transaction's records and the input `offsets`
        ({(topic, partition): next offset}) committed at once, each with its offset-commit `metadata`
        ({(topic, partition): string}, where given); the next transaction opens. `guard` runs before each of
        the two requests and stops the commit by raising."""
        def check() -> None:
            if self.doomed is not None:
                raise TransactionDoomed(self.doomed)
            if self._no_commits.is_set():
                raise DeliveryFailed("the worker is stopping: nothing more is committed")
            if guard is not None:
                guard()

        deadline = time.monotonic() + timeout
        with self._txn_lock:
            if offsets:
                check()
                metadata = metadata or {}
                tps = [TopicPartition(topic, partition, offset, metadata[(topic, partition)])
                       if (topic, partition) in metadata else TopicPartition(topic, partition, offset)
                       for (topic, partition), offset in offsets.items()]
                self._retried(lambda: self.producer.send_offsets_to_transaction(
                    tps, group_metadata, max(1.0, deadline - time.monotonic())), deadline, check)
            check()
            self._retried(lambda: self.producer.commit_transaction(max(1.0, deadline - time.monotonic())),
                          deadline, check)
            self.producer.begin_transaction()

    @staticmethod
    def _retried(request: Callable[[], None], deadline: float, check: Callable[[], None]) -> None:
        """A transaction request, asked again while librdkafka calls its error retriable (a coordinator that
        moved with a killed node: NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS), as its documentation allows;
        any other error (one that needs an abort, a fenced producer) is raised at once."""
        while True:
            try:
                return request()
            except KafkaException as exc:
                err = exc.args[0]
                if not err.retriable() or err.txn_requires_abort() or time.monotonic() + TXN_RETRY_S > deadline:
                    raise
                _log.warning("transaction request failed; asking again", extra={"error": str(err)[:300]})
                time.sleep(TXN_RETRY_S)
                check()

    def abort(self, timeout: float = 30.0) -> None:
        """Blocking: drop the open transaction's records (a read_committed reader never sees them)."""
        with self._txn_lock:
            self.producer.abort_transaction(timeout)

    async def drain(self, timeout: float) -> int:
        """Wait (off the event loop) until every queued record is delivered or `timeout` passed; returns the
        records left."""
        left = await asyncio.get_running_loop().run_in_executor(None, self.producer.flush, timeout)
        if left:
            _log.warning("records still undelivered after a drain", extra={"records": left})
        return left

    def close(self, timeout: float = 10.0) -> int:
        """Deliver what is queued (up to `timeout`); returns the records left undelivered (-1: unknown). A
        transactional outbox aborts its open transaction (after the last checkpoint it holds nothing), after a
        commit still under way has returned; what cannot be aborted is purged, never delivered later."""
        self._no_commits.set()
        left = -1
        try:
            left = self._abort_at_close(timeout) if self.transactional else self.producer.flush(timeout)
            if left:
                _log.warning("outbox closed with undelivered records (their input is processed again)",
                             extra={"records": left})
        except KafkaException as exc:  # pragma: no cover - closing anyway
            _log.warning("outbox flush failed at close", extra={"error": str(exc)})
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)
        return left

    def hung(self) -> bool:
        """A transaction request is still blocked in librdkafka after the close gave up waiting for it."""
        return self._closed_around_a_request and self._txn_lock.locked()

    def _abort_at_close(self, timeout: float) -> int:
        if not self._txn_lock.acquire(timeout=timeout):  # a commit still blocked in librdkafka
            self._closed_around_a_request = True
            self.producer.purge(in_queue=True, in_flight=True)
            _log.error("transaction left open at close: a commit was still under way; its records are dropped")
            return len(self.producer)
        try:
            self.producer.abort_transaction(timeout)
        except KafkaException as exc:
            # e.g. every broker still away: what is queued must not reach a broker later (module docstring)
            self.producer.purge(in_queue=True, in_flight=True)
            _log.error("could not abort the open transaction at close; its records are dropped",
                       extra={"error": str(exc)[:300]})
            return len(self.producer)
        finally:
            self._txn_lock.release()
        return self.producer.flush(timeout)
