"""A bounded wait that a stop can always interrupt.

`asyncio.wait_for` before Python 3.12 returns the inner result when its caller is cancelled in the same pass
of the loop as the inner awaitable finishes, and the cancellation is lost. A worker told to stop while its
rounds were completing had its checkpoint task swallow the stop that way: the task went back to waiting for
the next checkpoint, the stop waited for the task, and the worker was SIGKILLed 20 s later (4 of 10 stops
of a busy worker in tests/integration/test_worker_readiness.py and test_decision_promotion.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable


async def wait_at_most(awaitable: Awaitable, timeout: float) -> bool:
    """Await `awaitable` for up to `timeout` seconds: True when it finished (its exception, if any, is raised),
    False when the time ran out (it is cancelled). A cancellation of the caller always propagates. (On 3.11 a
    task that swallows a CancelledError must call `uncancel()`, or its later waits here raise again; every task
    that waits here lets its CancelledError end it.)"""
    task = asyncio.current_task()
    if not hasattr(task, "cancelling"):  # Python 3.10: no count of cancellation requests to read back
        return await _wait_at_most_by_wait(awaitable, timeout)
    try:
        await asyncio.wait_for(awaitable, max(0.0, timeout))
    except asyncio.TimeoutError:
        return False
    # wait_for returned the inner result although this task was cancelled: the request is still counted
    # (nothing uncancelled it), so honour it here. The asyncio.wait version below cannot lose it either,
    # but it halved `modpipe bench features`' steady rate in the checkpoint loop and the batcher.
    if task.cancelling():
        raise asyncio.CancelledError
    return True


async def _wait_at_most_by_wait(awaitable: Awaitable, timeout: float) -> bool:
    inner = asyncio.ensure_future(awaitable)
    try:
        done, _ = await asyncio.wait({inner}, timeout=max(0.0, timeout))
    except BaseException:
        inner.cancel()
        raise
    if not done:
        inner.cancel()
        return False
    inner.result()
    return True
