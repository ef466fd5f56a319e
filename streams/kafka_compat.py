"""A client-side fix applied before a worker starts.

aiokafka cannot decode an empty member assignment, which a group coordinator sends to a member the
leader left out of its SyncGroup (a race when static members rejoin during a rebalance; seen with
two workers on the embedded broker). aiokafka's coordination task then dies and the worker keeps
running with partitions nobody consumes. Treating an empty assignment as a failed join makes the
member wait its backoff and join again, which completes the rebalance normally.
"""

from __future__ import annotations

from aiokafka.consumer import group_coordinator

from modpipe import log

_log = log.get(__name__)
_original = group_coordinator.CoordinatorGroupRebalance.perform_group_join


async def _perform_group_join(self):
    result = await _original(self)
    if result is not None and not result[1]:
        _log.warning("empty assignment from the group coordinator; joining again", extra={"group": self.group_id})
        return None
    return result


def install() -> None:
    group_coordinator.CoordinatorGroupRebalance.perform_group_join = _perform_group_join
