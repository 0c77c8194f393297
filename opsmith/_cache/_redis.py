"""The Redis tier of the cluster cache: bundles by key, small records, and build leases.

Keys (``P`` is ``OPSMITH_REMOTE_PREFIX``; the ``{key}`` hash tag keeps an entry, its lease
and its fence on one Redis Cluster slot)::

    P:{<key>}:entry    the entry's bundle (opsmith._cache._bundle), written by one SET
    P:{<key>}:lease    "<token>|<host>|<pid>": the process building <key> (SET NX PX, renewed)
    P:{<key>}:fence    the last lease token handed out (INCR): a publish under an older
                       token is refused, so a builder whose lease expired (a paused VM, a
                       long GC) cannot write over the one that took over
    P:rec:<ns>:<id>    a signed record (the dependency index)

Reads on the hit path (GET, GETEX, EXISTS) speak RESP over a socket (opsmith._cache._resp):
importing redis-py costs ~90 ms, more than the whole remote hit is allowed. Writes, leases and
scripts use redis-py. TLS and URLs with options use redis-py for everything.

Fail open, fast: every call has a connect time-out (200 ms) and a read time-out (1 s), no
retries; a failure raises :class:`RemoteDown`, which the tiered store turns into a local
build. A reply that is malformed, of the wrong type or over the bounds of
:mod:`opsmith._cache._resp` (``OPSMITH_REMOTE_MAX_ENTRY``, a deadline, nesting) is a failure
too, on reads and on writes (redis-py's sockets are :class:`~opsmith._cache._resp_guard.BoundedSocket`).
Three failures in a row open a circuit breaker for 30 s (no call is even tried); the first
failure in a process logs one warning, later ones only at debug level.
"""
from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

from opsmith._cache._resp import ProtocolError, expect_bulk, expect_int
from opsmith._config import on_reset
from opsmith._errors import ConfigError

__all__ = ["RedisRemote", "RemoteDown", "remote_from_settings", "redact"]

log = logging.getLogger("opsmith.cache")

_BREAKER_FAILURES = 3
_BREAKER_SECONDS = 30.0
_warned = [False]
on_reset(lambda: _warned.__setitem__(0, False))

# Take the lease if free: the token is the next fence value (atomic with the SET NX).
_ACQUIRE = """
local cur = redis.call('GET', KEYS[1])
if cur then return {0, cur} end
local t = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], t .. '|' .. ARGV[1], 'PX', ARGV[2])
return {t, ''}
"""
# Renew or release only a lease that is still ours.
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
# Publish under a fencing token: refused when a newer lease was handed out since.
_PUBLISH = """
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
if cur > tonumber(ARGV[1]) then return 0 end
if tonumber(ARGV[3]) > 0 then redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
else redis.call('SET', KEYS[2], ARGV[2]) end
return 1
"""


class RemoteDown(Exception):
    """The remote tier did not answer properly (or its circuit breaker is open): build locally."""


def _acquired(reply) -> tuple[int, bytes]:
    """The lease script's reply: ``[token, holder]``."""
    if (isinstance(reply, list) and len(reply) == 2 and isinstance(reply[0], int)
            and isinstance(reply[1], bytes)):
        return reply[0], reply[1]
    raise ProtocolError(f"expected [token, holder] from the lease script, got {str(reply)[:60]!r}")


def redact(url: str) -> str:
    """``url`` without its password (for messages and logs)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit(parts._replace(netloc=user + netloc))


class RedisRemote:
    """A Redis server holding bundles, records and build leases.

    Parameters
    ----------
    url : str
        ``redis://[user:password@]host[:port][/db]`` or ``rediss://`` for TLS.
    prefix : str
        Prefix of every key.
    ttl : float
        Seconds an entry lives after its last hit; 0 for no expiry.
    connect_timeout, timeout : float
        Seconds for a connection, and for one command.
    lease_seconds : float
        Lifetime of a build lease without renewal.
    max_entry : int
        The most bytes one reply may carry (``OPSMITH_REMOTE_MAX_ENTRY``); a larger reply is a
        failure, and the tiered store does not publish a larger entry.
    """

    def __init__(self, url: str, *, prefix: str = "opsmith", ttl: float = 0.0,
                 connect_timeout: float = 0.2, timeout: float = 1.0, lease_seconds: float = 20.0,
                 max_entry: int = 256 << 20) -> None:
        scheme = urlsplit(url).scheme
        if scheme not in ("redis", "rediss", "unix"):
            raise ConfigError(f"OPSMITH_REMOTE_CACHE={redact(url)!r} is not a Redis URL; write "
                              f"redis://host:6379/0 or rediss://user:password@host:6380/0")
        self.url = url
        self.prefix = prefix
        self.ttl_ms = int(ttl * 1000)
        self.connect_timeout = connect_timeout
        self.timeout = timeout
        self.lease_ms = max(int(lease_seconds * 1000), 200)
        self.max_entry = max_entry
        self.host = socket.gethostname()
        self._client = None
        self._reader = None
        from opsmith._cache import _resp
        if _resp.supports(url):
            self._reader = _resp.RespConnection(url, connect_timeout=connect_timeout, timeout=timeout,
                                                max_reply=max_entry)
        self._scripts: dict[str, object] = {}
        self._failures = 0
        self._open_until = 0.0
        self._mutex = threading.Lock()

    def __repr__(self) -> str:
        return f"RedisRemote({redact(self.url)!r}, prefix={self.prefix!r})"

    def _bulk(self, reply):
        return expect_bulk(reply, self.max_entry)

    @property
    def where(self) -> str:
        return redact(self.url)

    # -- connection and breaker -----------------------------------------------------------
    def _redis(self):
        if self._client is None:
            with self._mutex:
                if self._client is None:
                    import redis  # imported on the first remote lookup, never on a local hit
                    from redis.backoff import NoBackoff
                    from redis.retry import Retry
                    from opsmith._cache._resp_guard import guarded_connection_class
                    # RESP2 (redis-py 8 asks for RESP3: more reply types to trust, and a HELLO
                    # whose garbage reply its handshake does not survive); bounded sockets
                    self._client = redis.Redis.from_url(
                        self.url, socket_connect_timeout=self.connect_timeout,
                        socket_timeout=self.timeout, retry=Retry(NoBackoff(), 0),
                        retry_on_timeout=False, health_check_interval=0, protocol=2,
                        connection_class=guarded_connection_class(self.url, max_reply=self.max_entry))
        return self._client

    def _read(self, op: str, fast, slow, check):
        """A read: ``check(fast(resp_connection))`` where the URL allows it, else
        ``check(slow(client))``; ``check`` refuses a reply of the wrong type."""
        if self._reader is None:
            return self._call(op, lambda r: check(slow(r)))
        from opsmith._cache._resp import RespError
        self._check_breaker()
        try:
            result = check(fast(self._reader))
        except (OSError, RespError) as exc:  # refused, reset, time-out, -ERR, garbage: "not now"
            self._fail(op, exc)
            raise RemoteDown(f"{op}: {exc}") from None
        self._failures = 0
        return result

    def _check_breaker(self) -> None:
        if self._open_until > time.monotonic():
            raise RemoteDown(f"the circuit breaker is open after {self._failures} failures")

    def _call(self, op: str, fn):
        """Run ``fn(client)``; any failure counts towards the breaker and raises RemoteDown."""
        self._check_breaker()
        try:
            client = self._redis()
        except ImportError as exc:
            self._fail(op, RuntimeError(f"the redis package is not importable ({exc}); "
                                        f"pip install 'opsmith[remote]'"))
            raise RemoteDown(str(exc)) from None
        try:
            result = fn(client)
        except Exception as exc:  # redis errors, OSError, time-outs: all mean "not now"
            import redis
            # ValueError, RecursionError: redis-py's parser on a malformed or deeply nested reply
            if not isinstance(exc, (redis.RedisError, OSError, ValueError, RecursionError)):
                raise
            self._fail(op, exc)
            raise RemoteDown(f"{op}: {exc}") from None
        self._failures = 0
        return result

    def _fail(self, op: str, exc: Exception) -> None:
        self._failures += 1
        if self._failures >= _BREAKER_FAILURES:
            self._open_until = time.monotonic() + _BREAKER_SECONDS
        if not _warned[0]:
            _warned[0] = True
            log.warning("the shared cache %s did not answer (%s: %s); building locally (this "
                        "process warns once; `opsmith cache stats` counts the errors)",
                        self.where, op, exc)
        else:
            log.debug("shared cache %s: %s failed: %s", self.where, op, exc)

    def reset_breaker(self) -> None:
        self._failures, self._open_until = 0, 0.0

    def _script(self, name: str, text: str):
        s = self._scripts.get(name)
        if s is None:
            s = self._scripts[name] = self._redis().register_script(text)
        return s

    def _k(self, key: str, what: str) -> str:
        return f"{self.prefix}:{{{key}}}:{what}"

    # -- bundles ----------------------------------------------------------------------------
    def get_bundle(self, key: str) -> bytes | None:
        """The bundle stored for ``key`` (its TTL renewed), or None."""
        name = self._k(key, "entry")
        if self.ttl_ms > 0:
            return self._read("get", lambda c: c.command("GETEX", name, "PX", self.ttl_ms),
                              lambda r: r.getex(name, px=self.ttl_ms), self._bulk)
        return self._read("get", lambda c: c.command("GET", name), lambda r: r.get(name), self._bulk)

    def has_bundle(self, key: str) -> bool:
        name = self._k(key, "entry")
        return bool(self._read("exists", lambda c: c.command("EXISTS", name), lambda r: r.exists(name), expect_int))

    def put_bundle(self, key: str, data: bytes, token: int | None = None,
                   lease_key: str | None = None) -> bool:
        """Store ``data`` for ``key``; False when ``token`` (of the lease on ``lease_key``,
        default ``key``) was fenced off by a newer lease."""
        name = self._k(key, "entry")
        px = self.ttl_ms if self.ttl_ms > 0 else None
        if token is None:
            self._call("put", lambda r: r.set(name, data, px=px))
            return True
        fence = self._k(lease_key or key, "fence")
        publish = self._script("publish", _PUBLISH)

        def put(r):
            import redis
            try:
                return publish(keys=[fence, name], args=[token, data, self.ttl_ms])
            except redis.ResponseError as exc:
                if "CROSSSLOT" not in str(exc):
                    raise
            # Redis Cluster, lease and entry on two slots: check, then set (a publish racing
            # a take-over in between writes the same content-addressed bytes).
            if int(r.get(fence) or 0) > token:
                return 0
            r.set(name, data, px=px)
            return 1
        return bool(self._call("put", put))

    def delete_bundle(self, key: str) -> None:
        self._call("delete", lambda r: r.delete(self._k(key, "entry")))

    # -- records ----------------------------------------------------------------------------
    def get_record(self, namespace: str, ident: str) -> bytes | None:
        name = f"{self.prefix}:rec:{namespace}:{ident}"
        return self._read("get record", lambda c: c.command("GET", name), lambda r: r.get(name), self._bulk)

    def put_record(self, namespace: str, ident: str, raw: bytes) -> None:
        px = self.ttl_ms if self.ttl_ms > 0 else None
        self._call("put record", lambda r: r.set(f"{self.prefix}:rec:{namespace}:{ident}", raw, px=px))

    # -- leases -----------------------------------------------------------------------------
    def try_acquire(self, key: str) -> tuple[int, str]:
        """``(token, "")`` when the lease on ``key`` is now ours, else ``(0, holder)``."""
        acquire = self._script("acquire", _ACQUIRE)
        me = f"{self.host}|{os.getpid()}"
        token, holder = self._call("lease", lambda r: _acquired(acquire(
            keys=[self._k(key, "lease"), self._k(key, "fence")], args=[me, self.lease_ms])))
        return token, holder.decode(errors="replace")

    def _lease_value(self, token: int) -> str:
        return f"{token}|{self.host}|{os.getpid()}"

    def renew(self, key: str, token: int) -> bool:
        renew = self._script("renew", _RENEW)
        return bool(self._call("renew lease", lambda r: renew(
            keys=[self._k(key, "lease")], args=[self._lease_value(token), self.lease_ms])))

    def release(self, key: str, token: int) -> None:
        release = self._script("release", _RELEASE)
        self._call("release lease", lambda r: release(keys=[self._k(key, "lease")],
                                                      args=[self._lease_value(token)]))

    @contextlib.contextmanager
    def lease(self, key: str, *, ready=None, poll: float = 0.05,
              wait: float | None = None) -> Iterator[int | None]:
        """Hold the build lease on ``key`` while the block runs; yields its fencing token.

        While another process holds it, wait: log progress, and stop waiting when
        ``ready()`` says the result appeared (yields None: look again, it is there) or the
        lease is released or expires (then it is ours). Yields None at once when the remote
        does not answer, and after ``wait`` seconds when given (a holder that is alive but
        stuck): the caller builds locally, as without a remote.
        """
        start = time.monotonic()
        next_log = start + 2.0
        token = 0
        while True:
            try:
                done = ready is not None and ready()
                if not done:
                    token, holder = self.try_acquire(key)
            except RemoteDown:
                done = True
            if done:
                break
            if token:
                break
            now = time.monotonic()
            if wait is not None and now - start >= wait:
                log.warning("gave up waiting for the build of %s on host %s after %.0f s; building "
                            "here too", key[:16], holder.split("|")[1] if holder.count("|") > 1 else holder,
                            now - start)
                break
            if now >= next_log:
                parts = holder.split("|")
                host = parts[1] if len(parts) > 2 else holder
                log.warning("waiting for a build of %s on host %s, %.0f s", key[:16], host, now - start)
                next_log = now + 10.0
            time.sleep(poll)
            poll = min(poll * 1.5, 0.5)
        if not token:  # the result appeared, or the remote went away: no lease to hold
            yield None
            return
        stop = threading.Event()
        renewer = threading.Thread(target=self._renew_loop, args=(key, token, stop),
                                   name=f"opsmith-lease-{key[:8]}", daemon=True)
        renewer.start()
        try:
            yield token
        finally:
            stop.set()
            renewer.join()
            with contextlib.suppress(RemoteDown):
                self.release(key, token)

    def _renew_loop(self, key: str, token: int, stop: threading.Event) -> None:
        while not stop.wait(self.lease_ms / 3000.0):
            try:
                if not self.renew(key, token):
                    log.warning("the build lease on %s expired and another process took it; "
                                "this build's result will not be published remotely", key[:16])
                    return
            except RemoteDown:
                pass  # keep trying: the breaker may close again while the build runs


def remote_from_settings() -> RedisRemote | None:
    """The remote named by ``OPSMITH_REMOTE_CACHE`` (None when unset)."""
    from opsmith._config import settings
    url = settings.remote_cache
    if not url:
        return None
    return RedisRemote(url, prefix=settings.remote_prefix, ttl=settings.remote_ttl,
                       connect_timeout=settings.remote_connect_timeout,
                       timeout=settings.remote_timeout, lease_seconds=settings.remote_lease,
                       max_entry=settings.remote_max_entry)
