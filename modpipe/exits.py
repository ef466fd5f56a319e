"""Exit statuses of the commands on signals, as shells report a process killed by one: 128 + the signal's
number, so 130 after Ctrl-C (SIGINT) and 143 after SIGTERM, for every command, including those that stop
gracefully (`worker`, `up`, `console`, `broker`, `triton`). A supervisor or CI script can then tell a stop it
asked for from a success (0) and from a failure (1, 2)."""

from __future__ import annotations

import signal
import threading

EXIT_SIGINT = 128 + signal.SIGINT    # 130
EXIT_SIGTERM = 128 + signal.SIGTERM  # 143


class Terminated(BaseException):
    """SIGTERM, raised in the main thread as KeyboardInterrupt is for SIGINT. A BaseException like it, so
    loops that guard their work with `except Exception` (a supervisor's restart loop) do not swallow it."""


def _raise(signum: int, _frame) -> None:
    raise KeyboardInterrupt if signum == signal.SIGINT else Terminated


def raise_on_signals() -> None:
    """SIGINT raises KeyboardInterrupt and SIGTERM Terminated in the main thread. SIGINT is set too: a process
    started in the background by a non-interactive shell inherits it ignored, and then Ctrl-C sent by a
    supervisor to its process group would be lost."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _raise)
        signal.signal(signal.SIGTERM, _raise)


def status_of(exc: BaseException) -> int:
    """The exit status for a signal's exception (KeyboardInterrupt or Terminated)."""
    return EXIT_SIGTERM if isinstance(exc, Terminated) else EXIT_SIGINT


class StopOnSignal:
    """For commands that stop gracefully: SIGINT and SIGTERM set `event` (a threading.Event or anything with
    `set()`) instead of raising; `status(ok)` is then 128 + the first signal's number, else `ok`."""

    def __init__(self, event) -> None:
        self.event = event
        self.signum: int | None = None

    def __call__(self, signum: int, _frame=None) -> None:
        """For a handler that runs as a callback, not inside the interrupted code (`loop.add_signal_handler`)."""
        if self.signum is None:
            self.signum = signum
        self.event.set()

    def _from_signal(self, signum: int, _frame=None) -> None:
        # A handler installed with signal.signal runs in the main thread between two bytecodes, possibly while
        # that thread holds the event's own lock (inside threading.Event.wait, a plain Lock): `set()` here would
        # wait for itself forever. Another thread sets it once the handler has returned.
        if self.signum is None:
            self.signum = signum
        threading.Thread(target=self.event.set, name="stop-on-signal", daemon=True).start()

    def install(self) -> StopOnSignal:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._from_signal)
        return self

    def status(self, ok: int = 0) -> int:
        return ok if self.signum is None else 128 + self.signum
