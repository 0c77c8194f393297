"""redis-py's connections held to the bounds of :mod:`opsmith._cache._resp`.

Writes, leases and scripts (and every read on TLS or URL-option connections) go through
redis-py; its parser trusts announced lengths, so its socket is wrapped to count what arrives
and when, with the same byte allowance and deadline as the RESP reader's.
"""
from __future__ import annotations

from urllib.parse import urlsplit

from opsmith._cache._resp import OVERHEAD, _Deadline, _too_big

__all__ = ["BoundedSocket", "guarded_connection_class"]


class BoundedSocket:
    """A connected socket for redis-py whose replies keep this module's bounds.

    Every ``sendall`` (a command) starts a reply's allowance: at most ``max_reply`` +
    :data:`~opsmith._cache._resp.OVERHEAD` bytes received, starting within ``timeout`` s and then at ``MIN_RATE``
    or faster. Past it, ``recv`` raises ``ConnectionError`` or ``TimeoutError``, which redis-py
    turns into its own errors and a closed connection. redis-py's parser trusts announced
    lengths and counts no further than the bytes that arrive, so this bounds its memory.
    Everything else is the wrapped socket's.
    """

    def __init__(self, sock, *, max_reply: int, timeout: float) -> None:
        self._sock = sock
        self._max = max_reply + OVERHEAD
        self._timeout = timeout
        self._user_timeout = sock.gettimeout()
        self._clock = _Deadline(timeout)

    def __getattr__(self, name: str):
        return getattr(self._sock, name)

    def settimeout(self, value) -> None:
        self._user_timeout = value
        self._sock.settimeout(value)

    def gettimeout(self):
        return self._user_timeout

    def sendall(self, data, *args):
        self._clock = _Deadline(self._timeout)
        self._sock.settimeout(self._user_timeout)
        return self._sock.sendall(data, *args)

    def _before(self) -> None:
        if self._user_timeout == 0:
            return  # a non-blocking look (redis-py's can_read): no wait to bound
        left = self._clock.left()
        self._sock.settimeout(left if self._user_timeout is None else min(left, self._user_timeout))

    def _count(self, n: int) -> None:
        self._clock.received += n
        if self._clock.received > self._max:
            raise _too_big(self._clock.received, self._max)

    def recv(self, n: int, *args) -> bytes:
        self._before()
        data = self._sock.recv(n, *args)
        self._count(len(data))
        return data

    def recv_into(self, buffer, n: int = 0, *args) -> int:
        self._before()
        got = self._sock.recv_into(buffer, n, *args)
        self._count(got)
        return got


def guarded_connection_class(url: str, *, max_reply: int):
    """The redis-py connection class for ``url``'s scheme, held to this module's bounds.

    Passed to ``redis.Redis.from_url(url, connection_class=...)``, which otherwise picks the
    class from the scheme. Its socket is a :class:`BoundedSocket` (redis-py's ``_connect()``
    returns the connected, for ``rediss://`` TLS-wrapped, socket that every command uses), and
    its parser redis-py's pure-Python RESP2 one even where hiredis is installed: hiredis
    allocates a list for any array count announced (``*4000000000`` is a MemoryError).
    """
    import redis.connection as rc
    scheme = urlsplit(url).scheme
    base = {"rediss": rc.SSLConnection, "unix": rc.UnixDomainSocketConnection}.get(scheme, rc.Connection)
    python_parser = getattr(rc, "_RESP2Parser", None)  # redis-py >= 5

    class Guarded(base):
        def __init__(self, *args, **kwargs):
            if python_parser is not None:
                kwargs["parser_class"] = python_parser
            super().__init__(*args, **kwargs)

        def _connect(self):
            return BoundedSocket(super()._connect(), max_reply=max_reply, timeout=self.socket_timeout or 1.0)

    Guarded.__name__ = Guarded.__qualname__ = f"Guarded{base.__name__}"
    return Guarded
