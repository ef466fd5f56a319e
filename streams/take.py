"""`take_ready`: faust's `Stream.take_events` with a flush rule for streaming at low latency.

`take_events(n, within)` yields when n events are buffered or `within` seconds have passed since the
loop last woke: at low load every hop then waits `within` for companions that do not come. faust's
consumer hands a fetched batch to the streams one record at a time (it awaits each record's delivery,
~100 us of its own machinery per record), so "nothing queued right now" is true between any two
records of a burst and cannot end a round either. `take_ready` ends a round when the consumer has
handed over the whole fetched batch and nothing is left queued for this stream (`kafka_compat`
watches the consumer), or at `max_` events; `max_delay_s` is only a safety net. A round is then what
one fetch brought: one record when traffic is light, whole bursts when it is heavy, with no timer.
Acks are as in `take_events`: each event is acked after the body that handled it.

It follows faust-streaming 0.15.3's `take_events` (pinned); only the flush rule differs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from mode.utils.futures import notify

from modpipe import log
from streams import kafka_compat

_log = log.get(__name__)

MAX_DELAY_S = 0.02  # safety net: a round's first event never waits longer than this
MAX_REMEMBERED = 100_000  # stale records processed whose re-fetched copy has not come (yet)


async def take_ready(stream, max_: int, max_delay_s: float = MAX_DELAY_S) -> AsyncIterator[list]:
    buffer: list = []
    buffer_full = asyncio.Event()
    buffer_consumed = asyncio.Event()
    buffer_consuming: asyncio.Future | None = None
    channel = stream.channel
    channel_it = aiter(channel)
    enable_acks = stream.enable_acks
    loop = asyncio.get_running_loop()
    timer: asyncio.TimerHandle | None = None
    # A record fetched before a rebalance and processed because its partition stayed ours: faust fetches it
    # again after the rebalance (it seeks to the committed offset). That copy is not processed a second time;
    # it is acked once the original is (when what the original produced is delivered), so its offset is
    # committed only then.
    processed_stale: dict[tuple, object] = {}  # (tp, offset) -> the stale event processed in its place

    def flush_if_complete() -> None:
        if buffer and channel.empty() and not kafka_compat.fetch_in_delivery():
            buffer_full.set()

    def flush_now() -> None:
        nonlocal timer
        timer = None
        if buffer:
            buffer_full.set()

    async def add_to_buffer(value):
        nonlocal buffer_consuming, timer
        if buffer_consuming is not None:
            try:
                await buffer_consuming
            finally:
                buffer_consuming = None
        event = stream.current_event
        if event is None:
            raise RuntimeError("take_ready found no current event")
        buffer.append(event)
        if len(buffer) >= max_:
            buffer_full.set()
            buffer_consumed.clear()
            await stream.wait(buffer_consumed)
            return value
        if timer is None:
            timer = loop.call_later(max_delay_s, flush_now)
        flush_if_complete()
        return value

    remove_hook = kafka_compat.on_fetch_delivered(flush_if_complete)
    stream.enable_acks = False  # acked below, after the body
    stream.add_processor(add_to_buffer)
    stream._enable_passive(channel_it)
    try:
        while not stream.should_stop:
            # A plain event wait: mode's wait_for_stopped made tasks for every round. Stopping cancels
            # the agent's task, which ends this wait.
            await buffer_full.wait()
            if not buffer:
                buffer_full.clear()
                continue
            buffer_consuming = loop.create_future()
            if timer is not None:
                timer.cancel()
                timer = None
            # Records buffered before a rebalance, of partitions this worker no longer has, are not ours to
            # process (their new owner reads them again from its committed offset): acked unprocessed, as
            # faust's own stream iterator does. A record of a partition that stayed ours is processed:
            # acking it unprocessed would let its offset be committed before faust's re-fetched copy is
            # decided, and a crash in between would lose it.
            generation = stream.app.consumer_generation_id
            assigned = stream.app.consumer.assignment()
            events, stale = [], []
            for e in buffer:
                key = (e.message.tp, e.message.offset)
                if e.message.generation_id == generation:
                    original = processed_stale.pop(key, None)
                    if original is None:
                        events.append(e)
                    else:
                        asyncio.ensure_future(_ack_copy_after(stream, e, original))
                elif e.message.tp in assigned:
                    processed_stale[key] = e
                    events.append(e)
                else:
                    stale.append(e)
            while len(processed_stale) > MAX_REMEMBERED:  # copies that never came (nothing was re-fetched)
                processed_stale.pop(next(iter(processed_stale)))
            if stale:
                _log.info("records of partitions given up during a rebalance left to their new owner",
                          extra={"records": len(stale), "partitions": sorted({str(e.message.tp) for e in stale})})
            for event in stale:
                await stream.ack(event)
            if not events:
                buffer.clear()
                notify(buffer_consuming)
                buffer_full.clear()
                buffer_consumed.set()
                continue
            try:
                yield events
            finally:
                buffer.clear()
                for event in events:
                    await stream.ack(event)
                notify(buffer_consuming)
                buffer_full.clear()
                buffer_consumed.set()
    finally:
        remove_hook()
        stream.enable_acks = enable_acks
        stream._processors.remove(add_to_buffer)


async def _ack_copy_after(stream, copy, original, poll_s: float = 0.05) -> None:
    """Ack a re-fetched copy once its original is acked (what it produced is delivered). A worker that stops
    or crashes first never acks it: the record is then processed again after the restart."""
    while not original.message.acked:
        await asyncio.sleep(poll_s)
    await stream.ack(copy)
