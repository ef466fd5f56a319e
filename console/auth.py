"""Who may use the review console, and from where (no HTTP here: console/server.py applies these).

- `Accounts`: named moderators in one JSON file (mode 0600), passwords as argon2id hashes (argon2-cffi);
  re-read when the file changes, so `modpipe console add-moderator` / `remove-moderator` apply to a running
  console (a removed account's sessions end at its next request).
- `Sessions`: server-side, random ids, an idle and an absolute expiry, a CSRF token each; one per user a
  sign-in proxy names (its cookieless requests share it), and creating one costs O(1).
- `LoginThrottle`: failed sign-ins per key; after a few, every further attempt must wait a delay that
  doubles with each failure. The server keys it by client address and by (client address, account name):
  nobody elsewhere can make an account's owner wait.
- `HostPolicy`: the Host (and Origin) names a request may carry: a page on another name is another site,
  even when DNS rebinding points that name at the console's address.
- `ProxyIdentity`: the user an authenticating reverse proxy names in a header, believed only from its address,
  and the client address the proxy forwards (X-Forwarded-For), believed likewise.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import hmac
import ipaddress
import json
import os
import secrets
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path

import argon2

ROLES = ("viewer", "moderator")
NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-@")
MIN_PASSWORD, MAX_PASSWORD = 10, 1024
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")


class AccountError(ValueError):
    """A refused account operation (bad name, weak password, unknown account, unreadable file)."""


def valid_name(name: str) -> bool:
    return 0 < len(name) <= 64 and set(name) <= NAME_CHARS


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


@dataclasses.dataclass(frozen=True)
class Account:
    name: str
    role: str


class Accounts:
    """The accounts file: {"accounts": {name: {"role", "hash", "created_at"}}}."""

    def __init__(self, path: Path, hasher: argon2.PasswordHasher | None = None):
        self.path = Path(path)
        self.hasher = hasher or argon2.PasswordHasher()  # argon2id, the library's current parameters
        self._lock = threading.Lock()
        self._loaded: tuple[float, int] | None = None  # (mtime, size) of what _entries holds
        self._entries: dict[str, dict] = {}
        self._decoy: str | None = None

    def _read(self) -> dict[str, dict]:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            self._loaded, self._entries = None, {}
            return self._entries
        if self._loaded != (stat.st_mtime, stat.st_size):
            try:
                entries = json.loads(self.path.read_text())["accounts"]
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise AccountError(f"{self.path}: not a console accounts file ({exc})") from exc
            self._loaded, self._entries = (stat.st_mtime, stat.st_size), entries
        return self._entries

    def _write(self, entries: dict[str, dict]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"accounts": entries}, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)  # an existing tmp file keeps its mode through O_CREAT
        os.replace(tmp, self.path)
        self._loaded = None

    def get(self, name: str) -> Account | None:
        with self._lock:
            entry = self._read().get(name)
        return None if entry is None else Account(name, entry["role"])

    def list(self) -> list[Account]:
        with self._lock:
            return [Account(n, e["role"]) for n, e in sorted(self._read().items())]

    def add(self, name: str, password: str, role: str = "moderator") -> Account:
        """Create or replace an account (a new password, a new role)."""
        if not valid_name(name):
            raise AccountError("a name is 1-64 letters, digits or ._-@")
        if role not in ROLES:
            raise AccountError(f"role must be one of {', '.join(ROLES)}")
        if not MIN_PASSWORD <= len(password) <= MAX_PASSWORD:
            raise AccountError(f"a password has {MIN_PASSWORD} to {MAX_PASSWORD} characters")
        with self._lock:
            entries = dict(self._read())
            entries[name] = {"role": role, "hash": self.hasher.hash(password),
                             "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat()}
            self._write(entries)
        return Account(name, role)

    def remove(self, name: str) -> None:
        with self._lock:
            entries = dict(self._read())
            if entries.pop(name, None) is None:
                raise AccountError(f"no account {name!r}")
            self._write(entries)

    def verify(self, name: str, password: str) -> Account | None:
        """The account when the password is its own; None otherwise (an unknown name takes as long)."""
        with self._lock:
            entry = self._read().get(name)
            if entry is None and self._decoy is None:
                self._decoy = self.hasher.hash(secrets.token_urlsafe(16))
        try:
            # An unknown name is checked against a decoy hash: a wrong name costs as long as a wrong password.
            self.hasher.verify(entry["hash"] if entry else self._decoy, password[:MAX_PASSWORD])
        except (argon2.exceptions.VerificationError, argon2.exceptions.InvalidHashError):
            return None
        return Account(name, entry["role"]) if entry else None


@dataclasses.dataclass
class Session:
    sid: str
    user: str
    role: str
    via: str  # "password" or "proxy"
    csrf: str
    created_s: float
    active_s: float  # the last moderator action


class Sessions:
    """In memory: a restart signs everyone out."""

    def __init__(self, idle_s: float, max_s: float, clock: Callable[[], float] = time.time):
        self.idle_s, self.max_s, self.clock = idle_s, max_s, clock
        # oldest first: the sessions past max_s are at the front, so sweeping them never walks the live ones
        self._sessions: collections.OrderedDict[str, Session] = collections.OrderedDict()
        self._by_proxy_user: dict[str, str] = {}  # user -> sid of their proxy session
        self._lock = threading.Lock()

    def _expired(self, s: Session, now: float) -> bool:
        return now - s.active_s > self.idle_s or now - s.created_s > self.max_s

    def _forget(self, sid: str) -> None:
        session = self._sessions.pop(sid, None)
        if session is not None and self._by_proxy_user.get(session.user) == sid:
            del self._by_proxy_user[session.user]

    def _add(self, user: str, role: str, via: str, now: float) -> Session:
        while self._sessions:  # O(1) per session ever created; idle ones in between go at their next get
            oldest = next(iter(self._sessions.values()))
            if now - oldest.created_s <= self.max_s:
                break
            self._forget(oldest.sid)
        session = Session(secrets.token_urlsafe(32), user, role, via, secrets.token_urlsafe(32), now, now)
        self._sessions[session.sid] = session
        return session

    def create(self, user: str, role: str, via: str) -> Session:
        with self._lock:
            return self._add(user, role, via, self.clock())

    def for_proxy_user(self, user: str, role: str) -> tuple[Session, bool]:
        """The live session of the user a sign-in proxy names, made on their first request: (session, new)."""
        now = self.clock()
        with self._lock:
            sid = self._by_proxy_user.get(user)
            session = self._sessions.get(sid) if sid else None
            if session is not None and not self._expired(session, now):
                session.active_s = now
                return session, False
            if sid:
                self._forget(sid)
            session = self._add(user, role, "proxy", now)
            self._by_proxy_user[user] = session.sid
            return session, True

    def get(self, sid: str | None, active: bool = True) -> Session | None:
        """The live session of that id; `active` counts the request as the moderator's action."""
        if not sid:
            return None
        now = self.clock()
        with self._lock:
            session = self._sessions.get(sid)
            if session is None:
                return None
            if self._expired(session, now):
                self._forget(sid)
                return None
            if active:
                session.active_s = now
            return session

    def drop(self, sid: str) -> None:
        with self._lock:
            self._forget(sid)

    def __len__(self) -> int:
        return len(self._sessions)


def csrf_matches(session: Session, given: str | None) -> bool:
    return bool(given) and hmac.compare_digest(session.csrf.encode(), given.encode())


class LoginThrottle:
    """Sign-in attempts per key (a client address, an account name), each counted as a failure until it
    succeeds, so that parallel guesses are counted too.

    `attempt(keys)` -> 0 when the attempt may go ahead (and is counted), else the seconds to wait. The first
    `free` failures of a key cost nothing; each later one doubles the wait (from `base_s`, at most `max_s`).
    A success forgets its keys' failures; a key's failures are forgotten `max_s` after its last one."""

    def __init__(self, free: int = 3, base_s: float = 1.0, max_s: float = 900.0,
                 clock: Callable[[], float] = time.monotonic):
        self.free, self.base_s, self.max_s, self.clock = free, base_s, max_s, clock
        self._failures: dict[str, tuple[int, float]] = {}  # key -> (count, time of the last)
        self._lock = threading.Lock()

    def _delay(self, count: int) -> float:
        return 0.0 if count < self.free else min(self.max_s, self.base_s * 2 ** (count - self.free))

    def attempt(self, keys: list[str]) -> float:
        now = self.clock()
        with self._lock:
            wait = 0.0
            for key in keys:
                count, last = self._failures.get(key, (0, now))
                if now - last > self.max_s:
                    self._failures.pop(key, None)
                else:
                    wait = max(wait, last + self._delay(count) - now)
            if wait > 0:
                return wait
            for key in keys:
                self._failures[key] = (self._failures.get(key, (0, now))[0] + 1, now)
            if len(self._failures) > 100_000:  # a flood of names: forget the older half
                for key, _ in sorted(self._failures.items(), key=lambda kv: kv[1][1])[:50_000]:
                    del self._failures[key]
            return 0.0

    def succeeded(self, keys: list[str]) -> None:
        with self._lock:
            for key in keys:
                self._failures.pop(key, None)


def split_host(host: str) -> tuple[str, str]:
    """'Name:port' -> ('name', 'port'); '[::1]:8088' -> ('[::1]', '8088'); no port -> ('name', '')."""
    host = host.strip().lower()
    if host.startswith("["):
        name, _, rest = host.partition("]")
        return name + "]", rest[1:] if rest.startswith(":") else ""
    name, _, port = host.partition(":") if host.count(":") == 1 else (host, "", "")
    return name, port


class HostPolicy:
    """The names a request may address the console by.

    On a loopback bind: localhost, 127.0.0.1 and [::1] with the bound port. On another bind: the bound address
    with its port (unless it is a wildcard). Always: the configured public names; one given without a port
    matches any port (a proxy in front may speak 443 while the console binds 8088)."""

    def __init__(self, bind_host: str, port: int, public_names: list[str]):
        self.allowed: set[str] = set()
        self.any_port: set[str] = set()
        if is_loopback(bind_host):
            self.allowed |= {f"{name}:{port}" for name in LOOPBACK_NAMES}
        elif bind_host not in ("0.0.0.0", "::", ""):
            self.allowed.add(f"[{bind_host}]:{port}" if ":" in bind_host else f"{bind_host}:{port}")
        for entry in public_names:
            name, entry_port = split_host(entry)
            if entry_port:
                self.allowed.add(f"{name}:{entry_port}")
            elif name:
                self.any_port.add(name)

    def __bool__(self) -> bool:
        return bool(self.allowed or self.any_port)

    def allows_host(self, host: str | None) -> bool:
        if not host:
            return False
        name, port = split_host(host)
        return f"{name}:{port}" in self.allowed or name in self.any_port

    def allows_origin(self, origin: str | None) -> bool:
        """An Origin header (scheme://host[:port]) naming an allowed host; absent or "null" is refused."""
        if not origin or origin == "null":
            return False
        url = urllib.parse.urlsplit(origin)
        return url.scheme in ("http", "https") and self.allows_host(url.netloc)


class ProxyIdentity:
    """The user named in `header` by a reverse proxy at one of `addresses` (networks); nobody otherwise. From
    those addresses, `forwarded_header` (X-Forwarded-For) gives the client's own address."""

    def __init__(self, header: str, addresses: str, role: str = "viewer",
                 forwarded_header: str = "X-Forwarded-For"):
        self.header, self.role, self.forwarded_header = header.strip(), role, forwarded_header.strip()
        try:
            self.networks = [ipaddress.ip_network(a.strip(), strict=False) for a in addresses.split(",") if a.strip()]
        except ValueError as exc:
            raise AccountError(f"MODPIPE_CONSOLE_PROXY_ADDRESSES: {exc}") from exc
        if self.header and not self.networks:
            raise AccountError("MODPIPE_CONSOLE_PROXY_USER_HEADER needs MODPIPE_CONSOLE_PROXY_ADDRESSES: a header "
                               "believed from anywhere lets anyone name themselves")

    def __bool__(self) -> bool:
        return bool(self.header)

    def trusted(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in net for net in self.networks)

    def user(self, address: str, headers) -> str | None:
        """The proxy's user for this request; None when not configured, absent or not from the proxy."""
        if not self.header:
            return None
        name = (headers.get(self.header) or "").strip()
        return name if name and self.trusted(address) else None

    def client(self, address: str, headers) -> str:
        """The client's address: behind a trusted proxy, the last forwarded address that is not one of the
        proxies (a client can prepend anything to X-Forwarded-For, but the proxy appends what it saw)."""
        if not self.forwarded_header or not self.trusted(address):
            return address
        hops = [hop.strip() for value in headers.get_all(self.forwarded_header) for hop in value.split(",")]
        for hop in reversed(hops):
            try:
                ip = ipaddress.ip_address(hop.strip("[]"))
            except ValueError:
                return address  # garbage the proxy passed on: count the proxy itself, never a made-up name
            if not self.trusted(str(ip)):
                return str(ip)
        return address
