"""Structured logging: one JSON object per line (or plain text for humans), fields via `extra=`."""

from __future__ import annotations

import asyncio
import faulthandler
import logging
import signal
import sys
import time

import orjson

_RESERVED = set(vars(logging.makeLogRecord({})).keys()) | {"message", "asctime"}
KAFKA_CLIENT_LOGGER = "librdkafka"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _RESERVED and not key.startswith("_"):
                doc[key] = value
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(doc, default=str).decode()


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        extras = " ".join(f"{k}={v}" for k, v in vars(record).items() if k not in _RESERVED and not k.startswith("_"))
        line = f"{time.strftime('%H:%M:%S', time.localtime(record.created))} {record.levelname:<7} {record.name}: " \
               f"{record.getMessage()}" + (f" [{extras}]" if extras else "")
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure(level: str = "INFO", fmt: str = "json", stream=sys.stderr) -> None:
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # librdkafka's INFO includes `FAIL ... Disconnected` when a broker closes a connection, as one does when it
    # stops cleanly: keep its warnings unless we are debugging.
    logging.getLogger(KAFKA_CLIENT_LOGGER).setLevel(root.level if root.level <= logging.DEBUG else logging.WARNING)


def get(name: str) -> logging.Logger:
    return logging.getLogger(name)


def kafka_client_logger() -> logging.Logger:
    """The logger confluent-kafka clients get (`"logger"` in their config): librdkafka's lines become records
    of this logger, formatted like every other, instead of raw `%6|...|FAIL|...` lines on stderr."""
    return logging.getLogger(KAFKA_CLIENT_LOGGER)


# `kill -USR1 <pid>` asks a running process where it is: the way to see a worker that hangs without an error.
STACK_DUMP_SIGNAL = signal.SIGUSR1


def dump_stacks_on_signal(stream=sys.stderr) -> None:
    """On STACK_DUMP_SIGNAL write every thread's Python stack to `stream`, as plain text (Python's faulthandler):
    it writes from the signal handler itself, so it also shows a thread, the event loop's included, that is
    stuck in a call that never returns to Python (a librdkafka call, a lock)."""
    faulthandler.register(STACK_DUMP_SIGNAL, file=stream, all_threads=True)


def dump_tasks_on_signal(loop: asyncio.AbstractEventLoop, stream=sys.stderr) -> None:
    """The same signal also logs, while `loop` runs, every asyncio task and the chain of awaits it is
    suspended in (thread stacks show only the loop's select for those). faulthandler is registered again
    after the loop's handler so that it chains to it: both dumps come from one signal."""
    faulthandler.unregister(STACK_DUMP_SIGNAL)
    loop.add_signal_handler(STACK_DUMP_SIGNAL, log_tasks)
    faulthandler.register(STACK_DUMP_SIGNAL, file=stream, all_threads=True, chain=True)


def stop_dumping_tasks(loop: asyncio.AbstractEventLoop, stream=sys.stderr) -> None:
    """Before `loop` closes: removing its handler (closing the loop does) leaves the signal's default action,
    which ends the process; faulthandler alone answers it from here on."""
    faulthandler.unregister(STACK_DUMP_SIGNAL)
    loop.remove_signal_handler(STACK_DUMP_SIGNAL)
    faulthandler.register(STACK_DUMP_SIGNAL, file=stream, all_threads=True)


def await_chain(coro) -> list[str]:
    """Where a coroutine waits: `file:line in function` for it and each coroutine it awaits, innermost last
    (the innermost one's line is the `await` of a future: an executor call, a lock, a sleep)."""
    chain: list[str] = []
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is None:  # a future's iterator: its awaiting line is already in the chain
            break
        chain.append(f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return chain


def log_tasks() -> None:
    tasks = [{"task": t.get_name(), "awaiting": await_chain(t.get_coro())} for t in asyncio.all_tasks()]
    get(__name__).warning("stack dump: asyncio tasks", extra={"tasks": tasks})
