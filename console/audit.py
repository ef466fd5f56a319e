"""The console's audit log: one JSON line per label a moderator gave, appended and fsync'd before the
moderator's click is acknowledged (who, how they signed in, when, which post, its verdict and label before)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import orjson


class AuditLog:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # O_APPEND: every write lands at the end, whoever else has the file open; 0600: it names moderators.
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._lock = threading.Lock()

    def append(self, entry: dict) -> None:
        line = orjson.dumps(entry) + b"\n"
        with self._lock:
            os.write(self._fd, line)
            os.fsync(self._fd)

    def close(self) -> None:
        with self._lock:
            os.close(self._fd)
