"""Client-side fixes applied before a worker starts.

1. aiokafka cannot decode an empty member assignment, which a group coordinator sends to a member the
leader left out of its SyncGroup (a race when static members rejoin during a rebalance; seen with
two workers on the embedded broker). aiokafka's coordination task then dies and the worker keeps
running with partitions nobody consumes. Treating an empty assignment as a failed join makes the
member wait its backoff and join again, which completes the rebalance normally.

2. A broker that answers a fetch with no records at once, instead of holding it for fetch_max_wait_ms
(noida-db, the embedded broker, does), makes aiokafka's fetcher re-fetch in a tight loop: an idle
consumer burned most of a core. After a fetch that brought nothing, the fetcher now waits
EMPTY_FETCH_BACKOFF_S before asking that broker again. Against Apache Kafka an empty answer already
took fetch_max_wait_ms, so the extra wait is noise.
"""

from __future__ import annotations

import asyncio

from aiokafka.consumer import fetcher, group_coordinator

from modpipe import log

_log = log.get(__name__)
_original = group_coordinator.CoordinatorGroupRebalance.perform_group_join
_original_fetch = fetcher.Fetcher._proc_fetch_request
EMPTY_FETCH_BACKOFF_S = 0.01


async def _perform_group_join(self):
    result = await _original(self)
    if result is not None and not result[1]:
        _log.warning("empty assignment from the group coordinator; joining again", extra={"group": self.group_id})
        return None
    return result


async def _proc_fetch_request(self, assignment, node_id, request):
    has_new_data = await _original_fetch(self, assignment, node_id, request)
    if not has_new_data:
        try:
            await asyncio.sleep(EMPTY_FETCH_BACKOFF_S)
        except asyncio.CancelledError:  # closing or reassigned: like the original, end quietly
            return False
    return has_new_data


def install() -> None:
    group_coordinator.CoordinatorGroupRebalance.perform_group_join = _perform_group_join
    fetcher.Fetcher._proc_fetch_request = _proc_fetch_request
