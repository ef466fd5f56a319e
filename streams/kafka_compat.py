"""Client-side fixes applied before a worker starts.

1. aiokafka cannot decode an empty member assignment, which a group coordinator sends to a member the
leader left out of its SyncGroup (a race when static members rejoin during a rebalance; seen with
two workers on the embedded broker). aiokafka's coordination task then dies and the worker keeps
running with partitions nobody consumes. Treating an empty assignment as a failed join makes the
member wait its backoff and join again, which completes the rebalance normally.

2. A broker that answers a fetch with no records at once, instead of holding it for fetch_max_wait_ms
(noida-db, the embedded broker, does), makes aiokafka's fetcher re-fetch in a tight loop: an idle
consumer burned most of a core. After a fetch that brought nothing, the fetcher now waits before
asking that broker again: EMPTY_FETCH_BACKOFF_S after the first empty answer, doubling with each
further one up to EMPTY_FETCH_BACKOFF_MAX_S, and back to nothing as soon as a fetch brings records.
A busy pipeline (records somewhere on every fetch) never waits; an idle worker looks ~40 times a second
(an empty fetch of its ~36 partitions costs ~1.3 ms of its CPU: 0.09 cores idle at the 25 ms cap, 0.17
at 10 ms). While posts wait for the text model (`set_backlog_check`), the cap is 100 ms: fetching faster
would not decide them sooner. Against Apache Kafka an empty answer already took fetch_max_wait_ms, so
the extra wait is noise.

3. faust's consumer hands each fetched batch to the streams one record at a time, yielding to the event
loop after every record. `fetch_in_delivery()` tells whether it is in the middle of such a batch, and
`on_fetch_delivered` hooks run when it has handed over the whole batch: `take.take_ready` ends a round
there, so that a round is what one fetch brought (no timer, whatever the load).

4. aiokafka sends no fetch to a broker while records it fetched from that broker wait to be consumed,
for up to `prefetch_backoff` (0.1 s) after they arrived. faust keeps the changelog partitions of its
own active tables assigned but never consumes them once recovered, so every changelog record this
worker wrote was fetched and then held the next fetch for every other partition of that broker for
100 ms: a post's hops through the stage topics took ~100 ms each at low load. The backoff is
PREFETCH_BACKOFF_S instead (records of partitions being consumed are drained long before).

5. faust records a commit that failed as done: `Consumer._commit_offsets` updates its committed offsets
whatever the broker answered, so after a commit refused during a rebalance (UnknownMemberId,
IllegalGeneration: "already rebalanced") a partition that receives nothing more is never committed again,
and the next restart replays it from far behind. In `modpipe chaos` (5 worker kills, a broker restart, 2,000
posts) 1,581 posts were decided more than once, 5,354 duplicate decisions. A failed commit is undone here,
so the next commit round sends it again.

6. faust commits past records it never processed. `Consumer._new_offset` commits the first run of acked
offsets unless the lowest is more than one above the committed offset, and with no committed offset (a
partition nothing has committed yet) it does not look at all. So with N committed, N+1 acked and N still
at Triton it commits N+2 (`modpipe chaos` lost 7 of 10,000 posts to worker SIGKILLs that way); and a
record that faust dropped during a rebalance (fetched while the flow was stopped, then not fetched again
because the consumer had read past it) was committed over as soon as the records after it were acked.
Now a commit covers only offsets this worker acked, one after the other from the committed offset (or,
with none, from the partition's beginning, where the assignment's seek put it), except holes in the log itself
(transaction markers, compaction), which are told apart as offsets that fetching skipped.
A record that holds the commits back although it is neither acked nor being processed was dropped: after
REWIND_AFTER_S the partition is sought back to it, and it and the records after it are processed again
(the states ignore what they already counted; their decisions are published again).

7. After a rebalance faust seeks each assigned partition back to its committed offset, so that records it
fetched under the old assignment (and drops unprocessed: their generation is stale) are fetched again.
aiokafka's `seek_to_committed` skips a partition whose committed offset is missing or 0, leaving the
fetch position after the dropped records: they were never processed. It hit the first records of a
partition, which nothing had committed yet: `modpipe chaos` lost the reports and shares sent while the
broker restarted (and a moderator label later) on partitions that no worker had committed. Such a
partition is now sought to its beginning (the `earliest` reset the app asks for), so its records are
processed again (at-least-once). Only topics that agents consume and commit are sought: faust positions
the changelog partitions itself.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from aiokafka.consumer import fetcher, group_coordinator
from faust.transport import consumer as faust_consumer
from faust.transport.consumer import ensure_TP
from faust.transport.drivers import aiokafka as faust_aiokafka

from modpipe import log

_log = log.get(__name__)
_original = group_coordinator.CoordinatorGroupRebalance.perform_group_join
_original_fetch = fetcher.Fetcher._proc_fetch_request
_original_getmany = faust_consumer.Consumer.getmany
_delivering = False
_fetch_delivered_hooks: list[Callable[[], None]] = []
PREFETCH_BACKOFF_S = 0.005
EMPTY_FETCH_BACKOFF_S = 0.002
EMPTY_FETCH_BACKOFF_MAX_S = 0.025
# While the worker has a backlog that fetching faster cannot shorten (posts queued for the text model),
# an empty fetch costs ~1.3 ms of worker CPU for nothing: the cap is longer then.
EMPTY_FETCH_BACKOFF_BACKLOG_MAX_S = 0.1


def _no_backlog() -> bool:
    return False


_has_backlog: Callable[[], bool] = _no_backlog


def set_backlog_check(check: Callable[[], bool]) -> None:
    """`check()` is True while the worker has more work queued than fetching could add to (see above)."""
    global _has_backlog
    _has_backlog = check


async def _perform_group_join(self):
    result = await _original(self)
    if result is not None and not result[1]:
        _log.warning("empty assignment from the group coordinator; joining again", extra={"group": self.group_id})
        return None
    return result


def empty_fetch_backoff(empty_in_a_row: int, backlog: bool = False) -> float:
    """Seconds to wait after the n-th empty fetch in a row (0 after a fetch that brought records)."""
    if empty_in_a_row <= 0:
        return 0.0
    cap = EMPTY_FETCH_BACKOFF_BACKLOG_MAX_S if backlog else EMPTY_FETCH_BACKOFF_MAX_S
    # the exponent is capped: 2 ** n overflows a float after ~1,000 empty fetches (an idle minute), and
    # an exception here ended aiokafka's fetcher routine for good
    return min(EMPTY_FETCH_BACKOFF_S * 2 ** min(empty_in_a_row - 1, 30), cap)


async def _proc_fetch_request(self, assignment, node_id, request):
    has_new_data = await _original_fetch(self, assignment, node_id, request)
    empties = self.__dict__.setdefault("_modpipe_empty_fetches", {})  # node id -> empty fetches in a row
    empties[node_id] = 0 if has_new_data else empties.get(node_id, 0) + 1
    delay = empty_fetch_backoff(empties[node_id], _has_backlog())
    if delay:
        try:
            await asyncio.sleep(delay)
        except asyncio.CancelledError:  # closing or reassigned: like the original, end quietly
            return False
    return has_new_data


def fetch_in_delivery() -> bool:
    """True while faust's consumer is handing a fetched batch to the streams, record by record."""
    return _delivering


def on_fetch_delivered(hook: Callable[[], None]) -> Callable[[], None]:
    """Run `hook` each time faust's consumer has handed over a whole fetched batch; returns its remover."""
    _fetch_delivered_hooks.append(hook)
    return lambda: _fetch_delivered_hooks.remove(hook) if hook in _fetch_delivered_hooks else None


async def _getmany(self, timeout: float):
    global _delivering
    try:
        async for item in _original_getmany(self, timeout):
            _delivering = True
            yield item
    finally:
        was_delivering, _delivering = _delivering, False
        if was_delivering:
            for hook in list(_fetch_delivered_hooks):
                hook()


_original_fetcher_init = fetcher.Fetcher.__init__


def _fetcher_init(self, *args, **kwargs):
    _original_fetcher_init(self, *args, **kwargs)
    self._prefetch_backoff = PREFETCH_BACKOFF_S


_original_commit_offsets = faust_consumer.Consumer._commit_offsets


async def _commit_offsets(self, offsets, start_new_transaction: bool = True) -> bool:
    before = {tp: self._committed_offset.get(tp) for tp in offsets}
    did_commit = await _original_commit_offsets(self, offsets, start_new_transaction)
    if not did_commit:
        undo_failed_commit(self._committed_offset, offsets, before)
    return did_commit


def undo_failed_commit(committed: dict, offsets: dict, before: dict) -> None:
    """Put back what a commit that did not happen overwrote (unless something newer was committed since)."""
    for tp, offset in offsets.items():
        if committed.get(tp) == offset:
            committed[tp] = before.get(tp)


REWIND_AFTER_S = 5.0  # a record unacked and not in flight this long while later ones are acked was dropped


class FetchedOffsets:
    """What the consumer fetched of one partition: the holes in the log it skipped (offsets it never saw
    while going forward), and where commits start when nothing is committed (the partition's beginning,
    where the assignment's seek put it)."""

    __slots__ = ("floor", "last", "holes", "blocked")

    def __init__(self):
        self.floor: int | None = None
        self.last: int | None = None
        self.holes: list[tuple[int, int]] = []  # [start, end) ranges the log does not have
        self.blocked: tuple[int, float] | None = None  # (offset holding the commits back, since)

    def fetched(self, offset: int) -> None:
        if self.last is not None and offset > self.last + 1:
            self.holes.append((self.last + 1, offset))
        if self.last is None or offset > self.last:
            self.last = offset

    def sought(self, floor: int | None = None) -> None:
        """The position moved: what comes next starts a new run (the holes stay: they are the log's)."""
        self.last = None
        self.floor = floor

    def prune(self, below: int) -> None:
        self.holes = [(a, b) for a, b in self.holes if b > below]


_fetched: dict = {}  # TP -> FetchedOffsets


def committable(start: int, acked: set[int], holes: list[tuple[int, int]]) -> int:
    """The offset to commit: from `start`, past every offset acked or in a hole, up to the first that is neither."""
    offset = start
    while True:
        if offset in acked:
            offset += 1
            continue
        end = next((b for a, b in holes if a <= offset < b), None)
        if end is None:
            return offset
        offset = end


def _new_offset(self, tp):
    acked = self._acked[tp]
    if not acked:
        return None
    track = _fetched.get(tp)
    start = self._committed_offset[tp]
    if start is None:  # nothing committed: from the beginning, where the assignment's seek put the partition
        start = track.floor if track is not None else None
        if start is None:
            return None
    done = set(acked)
    end = committable(start, done, track.holes if track is not None else [])
    acked[:] = sorted(o for o in done if o > end)
    self._acked_index[tp].difference_update(o for o in done if o < end)
    if track is not None:
        track.prune(end)
        _watch_blocked(self, tp, track, end, bool(acked))
    if self._gap.get(tp):
        self._gap[tp].chop(0, end)
    return end if end > start else None


def _watch_blocked(consumer, tp, track: FetchedOffsets, offset: int, later_acked: bool) -> None:
    """Rewind to `offset` when it has held the commits back for REWIND_AFTER_S without being in flight."""
    if not later_acked or in_flight(consumer._unacked_messages, tp, offset):
        track.blocked = None
        return
    now = time.monotonic()
    if track.blocked is None or track.blocked[0] != offset:
        track.blocked = (offset, now)
        return
    if now - track.blocked[1] < REWIND_AFTER_S:
        return
    track.blocked = None
    _log.warning("a record was dropped without being processed; reading the partition again from it",
                 extra={"topic": tp.topic, "partition": tp.partition, "offset": offset})
    asyncio.ensure_future(_rewind(consumer, tp, offset))


async def _rewind(consumer, tp, offset: int) -> None:
    try:
        await consumer.seek(tp, offset)
    except Exception as exc:  # noqa: BLE001 - e.g. the partition was revoked meanwhile: its new owner reads it
        _log.info("rewind not done", extra={"topic": tp.topic, "partition": tp.partition, "error": str(exc)})


_original_filter_committable = faust_consumer.Consumer._filter_committable_offsets


def _filter_committable_offsets(self, tps):
    """Only partitions assigned now: a round that was in flight when its partition was revoked acks it
    afterwards, and that offset is the new owner's to commit (and to process again)."""
    assigned = self.assignment()
    for tp in [tp for tp in self._acked if tp not in assigned]:
        self._acked.pop(tp, None)
        self._acked_index.pop(tp, None)
    return _original_filter_committable(self, [tp for tp in tps if tp in assigned])


def in_flight(messages, tp, offset: int) -> bool:
    """Whether this worker holds the record at `offset` of `tp`, taken and not acked."""
    return any(m.tp == tp and m.offset == offset and not m.acked for m in list(messages))


_original_to_message = faust_aiokafka.Consumer._to_message


def _to_message(self, tp, record):
    message = _original_to_message(self, tp, record)
    track = _fetched.get(message.tp)
    if track is None:
        track = _fetched[message.tp] = FetchedOffsets()
    track.fetched(message.offset)
    return message


async def _seek_to_committed(self):
    return await self.call_thread(_seek_consumer_to_committed, self._ensure_consumer(), self.app)


async def _seek_consumer_to_committed(consumer, app):
    committed = await consumer.seek_to_committed()
    uncommitted = without_commit(committed, app.topics.acks_enabled_for)
    floors = {}
    if uncommitted:
        _log.info("no committed offset: reading from the beginning", extra={
            "partitions": sorted(f"{tp.topic}:{tp.partition}" for tp in uncommitted)})
        await consumer.seek_to_beginning(*uncommitted)
        floors = await consumer.beginning_offsets(uncommitted)
    for tp in committed:
        key = ensure_TP(tp)
        track = _fetched.get(key)
        if track is None:
            track = _fetched[key] = FetchedOffsets()
        track.sought(floors.get(tp))
    return committed


def without_commit(committed: dict, consumed: Callable[[str], bool]) -> list:
    """Partitions of consumed (committing) topics that aiokafka's seek_to_committed left where they were: no
    committed offset, or 0."""
    return [tp for tp, offset in committed.items() if not offset and consumed(tp.topic)]


# The versions whose private symbols the fixes above (and take.py, table_states.py, outbox.py, agents.py) were
# read and tested against. Another version may rename or change them silently: the worker refuses to start.
CHECKED_AGAINST = {"faust-streaming": "0.15.3", "aiokafka": "0.14.0"}


class UncheckedVersion(RuntimeError):
    """faust-streaming or aiokafka is not the version the patches were checked against."""


def check_versions(installed: Callable[[str], str] | None = None) -> None:
    if installed is None:
        from importlib.metadata import version as installed
    wrong = {name: installed(name) for name, wanted in CHECKED_AGAINST.items() if installed(name) != wanted}
    if wrong:
        raise UncheckedVersion(
            f"installed {wrong}, but streams/kafka_compat.py was checked against {CHECKED_AGAINST}: install those "
            "(pip install -c constraints.txt) or re-check every private symbol the module header lists")


def install() -> None:
    check_versions()
    faust_consumer.Consumer._new_offset = _new_offset
    faust_consumer.Consumer._commit_offsets = _commit_offsets
    fetcher.Fetcher.__init__ = _fetcher_init
    group_coordinator.CoordinatorGroupRebalance.perform_group_join = _perform_group_join
    fetcher.Fetcher._proc_fetch_request = _proc_fetch_request
    faust_consumer.Consumer.getmany = _getmany
    faust_aiokafka.AIOKafkaConsumerThread.seek_to_committed = _seek_to_committed
    faust_aiokafka.Consumer._to_message = _to_message
    faust_consumer.Consumer._filter_committable_offsets = _filter_committable_offsets
