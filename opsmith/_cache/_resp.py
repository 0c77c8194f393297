"""A minimal RESP2 connection for the remote tier's reads (GET, GETEX, EXISTS), and the bounds
on what any server may send back.

Why not redis-py here: importing it costs ~90 ms (its command mixins, parsers and typing
annotations; measured on the 2-core host, idle), which is most of what a process with a cold
local cache spends loading an entry that another machine built (target: <= 50 ms). The reads
on a remote hit are a handful of one-line commands, so they speak RESP over a socket. Writes,
leases and scripts (a build is running; their cost is nothing beside a compile) stay on
redis-py, which handles EVALSHA/NOSCRIPT and the rest.

Only plain URLs are handled: ``redis://[user:password@]host[:port][/db]`` and
``unix:///path`` without a query string. TLS (``rediss://``) and URL options (``?ssl_ca_certs=``,
``?db=``...) go through redis-py for reads too, so their semantics stay redis-py's.

Bounds. The server may be a misconfigured port, a proxy or an attacker, so nothing it says is
trusted further than this: a reply holds at most ``max_reply`` bytes of bulk data
(``OPSMITH_REMOTE_MAX_ENTRY``) plus :data:`OVERHEAD`; lines (statuses, errors, lengths) at most
:data:`MAX_LINE` bytes; integers at most 19 digits; at most :data:`MAX_VALUES` values, nested at
most :data:`MAX_DEPTH` deep; and the reply must start within ``timeout`` seconds and then keep
coming at :data:`MIN_RATE` bytes per second or faster (a slow drip of bytes, each within the
time-out, cannot hold a process). Memory grows only with bytes actually received, never with a
length the server announced. Anything else is a :class:`ProtocolError`: an ``OSError``, so
callers count it as a failure of the remote like a refused connection. Replies read by redis-py
go through ``_resp_guard.BoundedSocket``, which holds them to the same byte count and deadline.
"""
from __future__ import annotations

import socket
import threading
import time
from urllib.parse import unquote, urlsplit

__all__ = [
    "MAX_DEPTH",
    "MAX_LINE",
    "MAX_VALUES",
    "MIN_RATE",
    "OVERHEAD",
    "ProtocolError",
    "RespConnection",
    "RespError",
    "expect_bulk",
    "expect_int",
    "supports",
]

MAX_LINE = 64 * 1024        # a status, error or length line (Redis' own are well under 1 KiB)
MAX_DEPTH = 8               # arrays in arrays (none of our commands returns any nesting)
MAX_VALUES = 1024           # values in one reply, nested ones included
MIN_RATE = 1 << 20          # bytes per second a reply must keep up after its first `timeout` seconds
OVERHEAD = 64 * 1024        # bytes a reply may hold beside its bulk data (headers, small values)
_CHUNK = 64 * 1024
_BULK_RECV = 1 << 20        # the most one recv of bulk data asks for


class RespError(Exception):
    """The server answered a command with an error reply (``-ERR ...``)."""


class ProtocolError(ConnectionError):
    """The server's reply is not one we accept: malformed, over a bound, or of the wrong type."""


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


def expect_bulk(reply, limit: int):
    """``reply`` when it is nil or a bulk string of at most ``limit`` bytes (GET's), else a
    :class:`ProtocolError` (redis-py's reader does not know the limit, only the byte count)."""
    if reply is None:
        return reply
    if isinstance(reply, bytes):
        if len(reply) > limit:
            raise _too_big(len(reply), limit)
        return reply
    raise ProtocolError(f"expected a bulk string or nil, got {type(reply).__name__} {str(reply)[:40]!r}")


def expect_int(reply) -> int:
    """``reply`` when it is an integer (EXISTS'), else a :class:`ProtocolError`."""
    if isinstance(reply, int) and not isinstance(reply, bool):
        return reply
    raise ProtocolError(f"expected an integer, got {type(reply).__name__} {str(reply)[:40]!r}")


def _too_big(n: int, limit: int) -> ProtocolError:
    return ProtocolError(f"the server sent a reply of {n} bytes, over the {limit} allowed "
                         f"(OPSMITH_REMOTE_MAX_ENTRY; raise it on every node if entries are that big)")


class _Deadline:
    """A reply's clock: it must start within ``timeout`` s, then come at MIN_RATE or faster."""

    __slots__ = ("received", "start", "timeout")

    def __init__(self, timeout: float) -> None:
        self.start, self.timeout, self.received = time.monotonic(), timeout, 0

    def left(self) -> float:
        left = self.start + self.timeout + self.received / MIN_RATE - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no complete reply after {time.monotonic() - self.start:.1f} s "
                               f"({self.received} bytes; the time-out is {self.timeout:g} s, "
                               f"then {MIN_RATE >> 20} MiB/s)")
        return left


class _Reader:
    """One reply, read from ``sock`` within the bounds (see the module's docstring).

    Lines are parsed from a small buffer, ``buf[pos:end]``; bulk data is received in pieces of
    at most 1 MiB and joined once, so memory follows the bytes that came, never a length the
    server announced (and a large GET costs what one ``read(n)`` did: measured 3 and 64 MiB).
    """

    def __init__(self, sock: socket.socket, *, timeout: float, max_reply: int) -> None:
        self.sock = sock
        self.max_reply = max_reply
        self.clock = _Deadline(timeout)
        self.buf = bytearray(_CHUNK)
        self.pos = self.end = 0
        self.values = 0

    def _count(self, got: int) -> int:
        if not got:
            raise ConnectionError("the connection closed in the middle of a reply")
        self.clock.received += got
        if self.clock.received > self.max_reply + OVERHEAD:
            raise _too_big(self.clock.received, self.max_reply + OVERHEAD)
        return got

    def _fill(self) -> None:
        """Receive more bytes into ``buf`` (the parser waits for a line or a CRLF)."""
        if len(self.buf) - self.end < _CHUNK // 4:
            have = self.end - self.pos
            grown = bytearray(max(2 * have, _CHUNK))
            grown[:have] = memoryview(self.buf)[self.pos:self.end]
            self.buf, self.pos, self.end = grown, 0, have
        self.sock.settimeout(self.clock.left())
        with memoryview(self.buf) as view:
            self.end += self._count(self.sock.recv_into(view[self.end:]))

    def _line(self) -> bytes:
        while True:
            end = self.buf.find(b"\r\n", self.pos, self.end)
            if end >= 0:
                line = bytes(self.buf[self.pos:end])
                self.pos = end + 2
                return line
            if self.end - self.pos > MAX_LINE:
                raise ProtocolError(f"a reply line longer than {MAX_LINE} bytes: "
                                    f"{bytes(self.buf[self.pos:self.pos + 40])!r}...")
            self._fill()

    def _bulk(self, n: int) -> bytes:
        have = min(self.end - self.pos, n)
        with memoryview(self.buf) as view:
            parts = [bytes(view[self.pos:self.pos + have])]
        self.pos += have
        got = have
        while got < n:  # memory follows the bytes that came, never the length announced
            self.sock.settimeout(self.clock.left())
            part = self.sock.recv(min(n - got, _BULK_RECV))
            got += self._count(len(part))
            parts.append(part)
        while self.end - self.pos < 2:
            self._fill()
        if self.buf[self.pos:self.pos + 2] != b"\r\n":
            raise ProtocolError(f"a bulk string of {n} bytes is not followed by CRLF")
        self.pos += 2
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def reply(self):
        value = self._value(0)
        if self.pos != self.end:
            raise ProtocolError(f"{self.end - self.pos} bytes after the reply: "
                                f"{bytes(self.buf[self.pos:self.pos + 40])!r}")
        if isinstance(value, RespError):
            raise value
        return value

    def _value(self, depth: int):
        self.values += 1
        if self.values > MAX_VALUES:
            raise ProtocolError(f"more than {MAX_VALUES} values in one reply")
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"$":
            n = _integer(rest, line)
            if n == -1:
                return None
            if n < 0:
                raise ProtocolError(f"a negative bulk length: {line[:40]!r}")
            if n > self.max_reply:
                raise _too_big(n, self.max_reply)
            return self._bulk(n)
        if kind == b"+":  # a status (str), never taken for data (bytes)
            return rest.decode(errors="replace")
        if kind == b":":
            return _integer(rest, line)
        if kind == b"-":  # returned, not raised: the rest of an array must still be read
            return RespError(rest.decode(errors="replace"))
        if kind == b"*":
            n = _integer(rest, line)
            if n == -1:
                return None
            if n < 0 or n > MAX_VALUES:
                raise ProtocolError(f"an array of {n} values (at most {MAX_VALUES}): {line[:40]!r}")
            if depth + 1 > MAX_DEPTH:
                raise ProtocolError(f"arrays nested deeper than {MAX_DEPTH}")
            return [self._value(depth + 1) for _ in range(n)]
        raise ProtocolError(f"not a RESP2 reply: {line[:40]!r}")


def _integer(text: bytes, line: bytes) -> int:
    digits = text[1:] if text[:1] == b"-" else text
    if not digits.isdigit() or len(digits) > 19:  # isdigit: ASCII digits only, never "" or "1_0"
        raise ProtocolError(f"not an integer in a reply: {line[:40]!r}")
    return int(text)


class RespConnection:
    """One lazily opened connection; a failure closes it (the next command reconnects).

    Parameters
    ----------
    url : str
        A URL for which :func:`supports` is true.
    connect_timeout, timeout : float
        Seconds for connecting, and for the start of each command's reply.
    max_reply : int
        The most bytes of bulk data one reply may hold (``OPSMITH_REMOTE_MAX_ENTRY``).
    """

    def __init__(self, url: str, *, connect_timeout: float, timeout: float,
                 max_reply: int = 256 << 20) -> None:
        self.url = url
        self.connect_timeout = connect_timeout
        self.timeout = timeout
        self.max_reply = max_reply
        self._sock: socket.socket | None = None
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
        self._sock = sock
        if parts.password is not None:  # redis-py: AUTH [user] password, both URL-unquoted
            user = unquote(parts.username) if parts.username else None
            self._roundtrip(("AUTH", user, unquote(parts.password)) if user else
                            ("AUTH", unquote(parts.password)))
        if db and int(db) != 0:
            self._roundtrip(("SELECT", db))

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
        self._sock = None

    def command(self, *args: str | bytes | int):
        """Send one command, return its reply; RespError on ``-ERR``.

        A bulk string is bytes (None for nil), a status (``+OK``) is str, an integer int, an
        array a list.

        Raises an ``OSError`` (:class:`ProtocolError`, ``TimeoutError``, ``ConnectionError``...)
        when the server does not answer with a reply within the bounds.
        """
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
        self._sock.settimeout(self.timeout)
        self._sock.sendall(b"".join(out))
        return _Reader(self._sock, timeout=self.timeout, max_reply=self.max_reply).reply()
