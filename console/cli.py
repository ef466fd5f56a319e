"""`modpipe console`: the review console (see console/server.py)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from modpipe import log
from modpipe.settings import Settings

_log = log.get(__name__)


def run_console(settings: Settings, host: str, port: int) -> int:
    from console.follower import Follower, LabelPublisher
    from console.index import DecisionIndex
    from console.server import ConsoleError, serve

    bootstrap = settings.bootstrap()
    index = DecisionIndex(settings.console_max_posts)
    try:
        server = serve(index, LabelPublisher(settings, bootstrap), host=host, port=port,
                       token=settings.console_token, default_moderator=settings.console_moderator)
    except (ConsoleError, OSError) as exc:
        print(f"modpipe console: {exc}", file=sys.stderr)
        return 2
    follower = Follower(settings, bootstrap, index)
    follower.start()
    url = f"http://{host}:{server.server_address[1]}/"
    login = f"{url}login?token=...&moderator=YOUR_ID" if settings.console_token else url
    print(f"console ready: {login} (following {bootstrap}; Ctrl-C stops it)", file=sys.stderr, flush=True)
    _log.info("console ready", extra={"url": url, "bootstrap": bootstrap, "token": bool(settings.console_token)})
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    server.shutdown()
    follower.stop()
    return 0


def _console(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    return run_console(settings, args.host or settings.console_host,
                       args.port if args.port is not None else settings.console_port)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("console", help="the review console in the browser: review queue, spam/ham labels, "
                                       "recent blocks, search, live charts",
                       description="Follows posts, decisions and labels on KAFKA_BOOTSTRAP_SERVERS (else the "
                                   "embedded broker's port) and serves the review console. Binds "
                                   "MODPIPE_CONSOLE_HOST (127.0.0.1); another address needs MODPIPE_CONSOLE_TOKEN.")
    p.add_argument("--host", default=None, help="bind address (default MODPIPE_CONSOLE_HOST)")
    p.add_argument("--port", type=int, default=None, help="port (default MODPIPE_CONSOLE_PORT); 0: any free port")
    p.set_defaults(func=_console)
