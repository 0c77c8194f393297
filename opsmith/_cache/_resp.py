"""A minimal RESP2 connection for the remote tier's reads (GET, GETEX, EXISTS).

Why not redis-py here: importing it costs ~90 ms (its command mixins, parsers and typing
annotations; measured on the 2-core host, idle), which is most of what a process with a cold
local cache spends loading an entry that another machine built (target: <= 50 ms). The reads
on a remote hit are a handful of one-line commands, so they speak RESP over a socket. Writes,
leases and scripts (a build is running; their cost is nothing beside a compile) stay on
redis-py, which handles EVALSHA/NOSCRIPT and the rest.

Only plain URLs are handled: ``redis://[user:password@]host[:port][/db]`` and
``unix:///path`` without a query string. TLS (``rediss://``) and URL options (``?ssl_ca_certs=``,
``?db=``...) go through redis-py for reads too, so their semantics stay redis-py's.
"""
from __future__ import annotations

import socket
import threading
from urllib.parse import unquote, urlsplit

__all__ = ["RespConnection", "RespError", "supports"]


class RespError(Exception):
    """The server answered a command with an error reply (``-ERR ...``)."""


def supports(url: str) -> bool:
    """True when ``url`` is one this module connects to (else redis-py does)."""
    try:
        parts = urlsplit(url)
        if parts.query or parts.fragment:
            return False
        if parts.scheme == "unix":
            return bool(parts.path)
        if parts.scheme != "redis":
            return False
        parts.port  # noqa: B018 - raises ValueError on a malformed port
        db = parts.path.lstrip("/")
        return db == "" or db.isdigit()
    except ValueError:
        return False


class RespConnection:
    """One lazily opened connection; a failure closes it (the next command reconnects).

    Parameters
    ----------
    url : str
        A URL for which :func:`supports` is true.
    connect_timeout, timeout : float
        Seconds for connecting, and for each command's reply.
    """

    def __init__(self, url: str, *, connect_timeout: float, timeout: float) -> None:
        self.url = url
        self.connect_timeout = connect_timeout
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._file = None
        self._lock = threading.Lock()

    def _connect(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme == "unix":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.connect_timeout)
            try:
                sock.connect(unquote(parts.path))
            except OSError:
                sock.close()
                raise
            db = ""
        else:
            sock = socket.create_connection((parts.hostname or "localhost", parts.port or 6379),
                                            timeout=self.connect_timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            db = parts.path.lstrip("/")
        sock.settimeout(self.timeout)
        self._sock, self._file = sock, sock.makefile("rb")
        if parts.password is not None:  # redis-py: AUTH [user] password, both URL-unquoted
            user = unquote(parts.username) if parts.username else None
            self._roundtrip(("AUTH", user, unquote(parts.password)) if user else
                            ("AUTH", unquote(parts.password)))
        if db and int(db) != 0:
            self._roundtrip(("SELECT", db))

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._file.close()
                self._sock.close()
            except OSError:
                pass
        self._sock = self._file = None

    def command(self, *args: str | bytes | int):
        """Send one command, return its reply (bytes, int, None, list); RespError on ``-ERR``."""
        with self._lock:
            connecting = self._sock is None
            try:
                if connecting:
                    self._connect()
                return self._roundtrip(args)
            except RespError:
                if connecting:  # AUTH or SELECT refused: not a usable connection
                    self.close()
                raise  # else the connection is still in sync: an error reply is a whole reply
            except BaseException:
                self.close()  # half a reply may be unread: never reuse the connection
                raise

    def _roundtrip(self, args):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            b = a if isinstance(a, bytes) else str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(b), b))
        self._sock.sendall(b"".join(out))
        return self._read()

    def _read(self):
        line = self._file.readline()
        if not line.endswith(b"\r\n"):
            raise ConnectionError("the connection closed in the middle of a reply")
        kind, rest = line[:1], line[1:-2]
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = self._file.read(n + 2)
            if len(data) != n + 2:
                raise ConnectionError("the connection closed in the middle of a reply")
            return data[:-2]
        if kind == b"+":
            return rest
        if kind == b":":
            return int(rest)
        if kind == b"-":
            raise RespError(rest.decode(errors="replace"))
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self._read() for _ in range(n)]
        raise ConnectionError(f"not a RESP2 reply: {line[:40]!r}")
