"""Structured logging: one JSON object per line (or plain text for humans), fields via `extra=`."""

from __future__ import annotations

import logging
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
