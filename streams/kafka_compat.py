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
A busy pipeline (records somewhere on every fetch) never waits; an idle worker wakes up ~10 times a
second instead of 100 (at 10 ms it still spent a quarter of a core, and the broker as much again,
answering empty fetches for its 52 partitions). Against Apache Kafka an empty answer already took
fetch_max_wait_ms, so the extra wait is noise.
"""

from __future__ import annotations

import asyncio

from aiokafka.consumer import fetcher, group_coordinator

from modpipe import log

_log = log.get(__name__)
_original = group_coordinator.CoordinatorGroupRebalance.perform_group_join
_original_fetch = fetcher.Fetcher._proc_fetch_request
EMPTY_FETCH_BACKOFF_S = 0.01
EMPTY_FETCH_BACKOFF_MAX_S = 0.08


async def _perform_group_join(self):
    result = await _original(self)
    if result is not None and not result[1]:
        _log.warning("empty assignment from the group coordinator; joining again", extra={"group": self.group_id})
        return None
    return result


def empty_fetch_backoff(empty_in_a_row: int) -> float:
    """Seconds to wait after the n-th empty fetch in a row (0 after a fetch that brought records)."""
    if empty_in_a_row <= 0:
        return 0.0
    # the exponent is capped: 2 ** n overflows a float after ~1,000 empty fetches (an idle minute), and
    # an exception here ended aiokafka's fetcher routine for good
    return min(EMPTY_FETCH_BACKOFF_S * 2 ** min(empty_in_a_row - 1, 30), EMPTY_FETCH_BACKOFF_MAX_S)


async def _proc_fetch_request(self, assignment, node_id, request):
    has_new_data = await _original_fetch(self, assignment, node_id, request)
    empties = self.__dict__.setdefault("_modpipe_empty_fetches", {})  # node id -> empty fetches in a row
    empties[node_id] = 0 if has_new_data else empties.get(node_id, 0) + 1
    delay = empty_fetch_backoff(empties[node_id])
    if delay:
        try:
            await asyncio.sleep(delay)
        except asyncio.CancelledError:  # closing or reassigned: like the original, end quietly
            return False
    return has_new_data


def install() -> None:
    group_coordinator.CoordinatorGroupRebalance.perform_group_join = _perform_group_join
    fetcher.Fetcher._proc_fetch_request = _proc_fetch_request
