"""`modpipe console`: the review console (see console/server.py) and its moderator accounts."""

from __future__ import annotations

import argparse
import getpass
import sys
import threading

from modpipe import exits, log, output
from modpipe.settings import Settings

_log = log.get(__name__)


def console_config(settings: Settings, host: str, port: int):
    from modpipe.console.server import ConsoleConfig, public_names

    return ConsoleConfig(host=host, port=port, public_names=public_names(settings.console_public_name),
                         tls_cert=settings.console_tls_cert, tls_key=settings.console_tls_key,
                         plaintext_behind_proxy=settings.console_plaintext_behind_proxy == "on",
                         session_idle_s=settings.console_session_idle_s, session_max_s=settings.console_session_max_s,
                         max_connections=settings.console_max_connections,
                         max_connections_per_address=settings.console_max_connections_per_address,
                         request_timeout_s=settings.console_request_timeout_s)


def accounts_of(settings: Settings):
    from modpipe.console.auth import Accounts

    return Accounts(settings.console_file(settings.console_accounts, "accounts.json"))


def run_console(settings: Settings, host: str, port: int) -> int:
    from modpipe.console.audit import AuditLog
    from modpipe.console.auth import AccountError, ProxyIdentity
    from modpipe.console.follower import Follower, LabelPublisher
    from modpipe.console.index import DecisionIndex
    from modpipe.console.server import ConsoleError, serve

    bootstrap = settings.bootstrap()
    index = DecisionIndex(settings.console_max_posts, max_bytes=settings.console_max_bytes)
    accounts = accounts_of(settings)
    try:
        proxy = ProxyIdentity(settings.console_proxy_user_header, settings.console_proxy_addresses,
                              settings.console_proxy_role, settings.console_proxy_forwarded_header)
        if not accounts.list() and not proxy:
            raise ConsoleError(f"no moderator accounts in {accounts.path} and no sign-in proxy: create one with "
                               "`modpipe console add-moderator NAME`")
        config = console_config(settings, host, port)
        config.check()  # before any Kafka client exists: a refused start says why and nothing else
        audit = AuditLog(settings.console_file(settings.console_audit_log, "audit.jsonl"))
        server = serve(index, LabelPublisher(settings, bootstrap), config=config, accounts=accounts, audit=audit,
                       proxy=proxy)
    except (ConsoleError, AccountError, OSError) as exc:
        print(f"modpipe console: {exc}", file=sys.stderr)
        return 2
    follower = Follower(settings, bootstrap, index)
    follower.start()
    print(f"console ready: {server.url} (sign in with an account of {accounts.path}; following {bootstrap}; "
          "Ctrl-C stops it)", file=sys.stderr, flush=True)
    _log.info("console ready", extra={"url": server.url, "bootstrap": bootstrap, "accounts": str(accounts.path),
                                      "audit_log": str(audit.path), "proxy_header": proxy.header or None})
    stop = threading.Event()
    stopped_by = exits.StopOnSignal(stop).install()
    stop.wait()
    server.shutdown()
    follower.stop()
    audit.close()
    return stopped_by.status()


def _console(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    return run_console(settings, args.host or settings.console_host,
                       args.port if args.port is not None else settings.console_port)


def read_password(from_stdin: bool) -> str:
    if from_stdin:
        return sys.stdin.readline().rstrip("\r\n")
    password = getpass.getpass("password: ")
    if getpass.getpass("again: ") != password:
        raise ValueError("the two passwords differ")
    return password


def _accounts_command(command: str, action) -> int:
    """Run `action(accounts)`; a refused operation is one line on stderr and exit status 2."""
    from modpipe.console.auth import AccountError

    try:
        action(accounts_of(Settings.from_env()))
    except (AccountError, ValueError, EOFError) as exc:
        print(f"modpipe console {command}: {exc}", file=sys.stderr)
        return 2
    return 0


def _add(args: argparse.Namespace) -> int:
    def add(accounts):
        account = accounts.add(args.name, read_password(args.password_stdin), args.role)
        print(f"{account.name} ({account.role}) in {accounts.path}")
    return _accounts_command("add-moderator", add)


def _remove(args: argparse.Namespace) -> int:
    def remove(accounts):
        accounts.remove(args.name)
        print(f"{args.name} removed from {accounts.path} (their sessions end at their next request)")
    return _accounts_command("remove-moderator", remove)


def _list(args: argparse.Namespace) -> int:
    def show(accounts):
        rows = [{"name": account.name, "role": account.role} for account in accounts.list()]
        output.emit(rows, args.json, lambda rows: "\n".join(f"{r['name']}\t{r['role']}" for r in rows))
    return _accounts_command("list-moderators", show)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("console", help="the review console in the browser: review queue, spam/ham labels, "
                                       "recent blocks, search, live charts; and its moderator accounts",
                       description="Without a subcommand: follows posts, decisions and labels on "
                                   "KAFKA_BOOTSTRAP_SERVERS (else the embedded broker's port) and serves the review "
                                   "console on MODPIPE_CONSOLE_HOST (127.0.0.1). Moderators sign in with accounts "
                                   "made by `add-moderator`, or through an authenticating proxy "
                                   "(MODPIPE_CONSOLE_PROXY_*). docs/console.md has every setting.")
    p.add_argument("--host", default=None, help="bind address (default MODPIPE_CONSOLE_HOST)")
    p.add_argument("--port", type=int, default=None, help="port (default MODPIPE_CONSOLE_PORT); 0: any free port")
    p.set_defaults(func=_console)
    accounts = p.add_subparsers(dest="console_command", metavar="ACCOUNTS")
    add = accounts.add_parser("add-moderator", help="create an account, or give one a new password and role",
                              description="Stores an argon2id hash of the password in MODPIPE_CONSOLE_ACCOUNTS "
                                          "(mode 0600); a running console sees it at the next sign-in.")
    add.add_argument("name", help="1-64 letters, digits or ._-@; labels carry it as moderator_id")
    add.add_argument("--role", choices=("viewer", "moderator"), default="moderator",
                     help="viewer: reads the queue; moderator: also labels (default)")
    add.add_argument("--password-stdin", action="store_true",
                     help="read the password from the first line of stdin (else asked twice on the terminal)")
    add.set_defaults(func=_add)
    remove = accounts.add_parser("remove-moderator", help="delete an account (its sessions end)")
    remove.add_argument("name")
    remove.set_defaults(func=_remove)
    listing = accounts.add_parser("list-moderators", help="names and roles of the accounts")
    listing.add_argument("--json", action="store_true", help="print a JSON list of {name, role}")
    listing.set_defaults(func=_list)
