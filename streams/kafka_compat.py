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

6. faust commits past a record it is still processing. `Consumer._new_offset` returns the end of the first
run of acked offsets unless the lowest acked one is more than one above the committed offset: with
committed offset N (the next record to read) and N+1 acked while N is still in flight, it commits N+2, and a
crash before N's decision loses N. Our rounds finish out of order (several Triton batches in flight, bans
decided without the model), so this happened: `modpipe chaos` lost 7 of 10,000 posts to worker SIGKILLs,
each applied by the post stage and never decided, its input committed. (faust's tolerance of one is
probably meant for a transaction marker at the committed offset.) Now no offset is committed past a record
this worker holds unacked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiokafka.consumer import fetcher, group_coordinator
from faust.transport import consumer as faust_consumer

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


_original_new_offset = faust_consumer.Consumer._new_offset


def _new_offset(self, tp):
    acked = self._acked[tp]
    if acked:
        held = lowest_unacked(self._unacked_messages, tp, self._committed_offset[tp])
        if held is not None and held < min(acked):
            return None  # committing the acked run above it would skip a record still in flight
    return _original_new_offset(self, tp)


def lowest_unacked(messages, tp, committed: int | None) -> int | None:
    """The lowest offset of `tp` that this worker took and has not acked (at or above the committed one)."""
    return min((m.offset for m in list(messages)
                if m.tp == tp and not m.acked and (committed is None or m.offset >= committed)), default=None)


def install() -> None:
    faust_consumer.Consumer._new_offset = _new_offset
    faust_consumer.Consumer._commit_offsets = _commit_offsets
    fetcher.Fetcher.__init__ = _fetcher_init
    group_coordinator.CoordinatorGroupRebalance.perform_group_join = _perform_group_join
    fetcher.Fetcher._proc_fetch_request = _proc_fetch_request
    faust_consumer.Consumer.getmany = _getmany
