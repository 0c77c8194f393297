"""The shared cache against a broken or hostile server: a fake Redis on a loopback port answers
garbage, truncated replies, wrong reply types, huge lengths and counts, deep nesting, silence,
a slow drip, an endless stream, or closes mid-reply. Every read (the RESP reader,
opsmith._cache._resp) and every write (redis-py) must fail open: RemoteDown, counted, in bounded
time and memory; a build goes on locally."""
from __future__ import annotations

import logging
import socket
import threading
import time
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opsmith._cache._redis import RedisRemote, RemoteDown

try:
    import redis  # noqa: F401
    _REDIS_PY = None
except ImportError as exc:
    _REDIS_PY = f"the redis package is not installed ({exc}); pip install 'opsmith[test]'"
needs_redis_py = pytest.mark.skipif(_REDIS_PY is not None, reason=str(_REDIS_PY))

HUGE = 99999999999
MIB = 1 << 20


# -- the fake server ----------------------------------------------------------------------------
def _commands(buf: bytearray):
    """Complete commands (lists of bytes) at the front of ``buf``, removed from it.

    Clients send arrays of bulk strings; anything else is not expected from them."""
    out = []
    while True:
        pos, cmd = 0, []
        end = buf.find(b"\r\n", pos)
        if end < 0 or buf[:1] != b"*":
            return out
        n, pos = int(buf[1:end]), end + 2
        for _ in range(n):
            end = buf.find(b"\r\n", pos)
            if end < 0:
                return out
            size = int(buf[pos + 1:end])
            if len(buf) < end + 2 + size + 2:
                return out
            cmd.append(bytes(buf[end + 2:end + 2 + size]))
            pos = end + 2 + size + 2
        if len(cmd) < n:
            return out
        del buf[:pos]
        out.append(cmd)


class FakeRedis:
    """A TCP server on a loopback port playing a broken Redis.

    ``answer(conn, command)`` runs for every command but redis-py's handshake (``CLIENT
    SETINFO``, answered ``+OK``); it sends what it likes and returns True to close the
    connection. ``answered`` counts the commands it was given.
    """

    def __init__(self) -> None:
        self._srv = socket.create_server(("127.0.0.1", 0))
        self.port = self._srv.getsockname()[1]
        self.answer = lambda conn, cmd: None
        self.answered = 0
        self.stop = threading.Event()
        self._conns: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def reply(self, data: bytes, *, close: bool = True) -> None:
        """Answer every command with ``data``, then close the connection (or keep it)."""
        def answer(conn, cmd):
            conn.sendall(data)
            return close
        self.answer = answer

    def _accept(self) -> None:
        self._srv.settimeout(0.05)  # closing a listening socket does not wake accept(): poll
        while not self.stop.is_set():
            try:
                conn, _ = self._srv.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(None)
            self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buf = bytearray()
        try:
            while not self.stop.is_set():
                data = conn.recv(65536)
                if not data:
                    return
                buf += data
                for cmd in _commands(buf):
                    if cmd[0].upper() == b"CLIENT":
                        conn.sendall(b"+OK\r\n")
                        continue
                    self.answered += 1
                    if self.answer(conn, cmd):
                        return
        except OSError:
            pass  # the client went away: what a fail-open client does
        finally:
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self._thread.join(5)
        self._srv.close()
        for c in self._conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()


@pytest.fixture
def fake():
    srv = FakeRedis()
    yield srv
    srv.close()


def _remote(srv: FakeRedis, **kw) -> RedisRemote:
    kw.setdefault("timeout", 2.0)
    kw.setdefault("connect_timeout", 2.0)
    return RedisRemote(srv.url, prefix="t", **kw)


def _stream(header: bytes):
    """An answer: ``header``, then bytes as fast as the socket takes them, until the client leaves."""
    chunk = b"x\r\n" * 21845

    def answer(conn, cmd):
        conn.sendall(header)
        while True:  # sendall raises once the client has closed the connection
            conn.sendall(chunk)
    return answer


# -- reads: the RESP reader -----------------------------------------------------------------------
@pytest.mark.parametrize("reply", [
    b"$%d\r\n" % HUGE,                        # a bulk length no one could allocate
    b"$%d\r\nabc" % (64 * MIB),               # over the entry limit, then closed
    b"*%d\r\n" % HUGE,                        # an array count no one could allocate
    b"*1\r\n" * 100000 + b":1\r\n",           # nested 100,000 deep
    b"*3000\r\n" + b":1\r\n" * 3000,          # more values than a reply of ours can hold
], ids=["bulk", "bulk-over-limit", "array", "nested", "many-values"])
def test_huge_lengths_counts_and_nesting_fail_open_in_bounded_memory(fake, reply):
    fake.reply(reply)
    remote = _remote(fake, max_entry=MIB)
    tracemalloc.start()
    try:
        with pytest.raises(RemoteDown):
            remote.get_bundle("k")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * MIB, peak


@pytest.mark.parametrize("reply", [
    b"$abc\r\n", b"$-5\r\n", b"$ 5\r\nhello\r\n", b"$5\r\nhelloXY", b"$5\r\nhello", b":12a\r\n",
    b":1_0\r\n", b": 1\r\n", b":\r\n", b"?what\r\n", b"_\r\n", b"%1\r\n+a\r\n+b\r\n", b"\r\n",
    b"+OK", b"", b"\x00" * 100, b"+" + b"x" * (200 * 1024) + b"\r\n",
], ids=lambda r: repr(r[:20]))
def test_malformed_and_truncated_replies_fail_open(fake, reply):
    fake.reply(reply)
    with pytest.raises(RemoteDown):
        _remote(fake).get_bundle("k")


@pytest.mark.parametrize("call", ["get_bundle", "get_record", "has_bundle"])
@pytest.mark.parametrize("reply", [b":1\r\n", b"+OK\r\n", b"*1\r\n$1\r\nx\r\n", b"-ERR no\r\n",
                                   b"$1\r\nx\r\n"])
def test_wrong_reply_types_fail_open(fake, call, reply):
    right = {"get_bundle": (b"$1\r\nx\r\n",), "get_record": (b"$1\r\nx\r\n",), "has_bundle": (b":1\r\n",)}
    fake.reply(reply, close=False)
    remote = _remote(fake)
    fn = {"get_bundle": lambda: remote.get_bundle("k"), "get_record": lambda: remote.get_record("deps", "x"),
          "has_bundle": lambda: remote.has_bundle("k")}[call]
    if reply in right[call]:
        assert fn() in (b"x", True)
    else:
        with pytest.raises(RemoteDown):
            fn()


def test_a_silent_server_costs_one_timeout(fake):
    fake.answer = lambda conn, cmd: None  # accepts, reads, never answers
    remote = _remote(fake, timeout=0.3)
    t0 = time.monotonic()
    with pytest.raises(RemoteDown, match="time"):
        remote.get_bundle("k")
    assert time.monotonic() - t0 < 5.0


def test_a_slow_drip_is_bounded_by_the_timeout_not_by_the_length(fake):
    """One byte every 50 ms of a 200-byte value: each byte comes within the timeout, the reply
    never does (10 s); the read gives up after about the timeout."""
    def drip(conn, cmd):
        conn.sendall(b"$200\r\n")
        for _ in range(400):
            time.sleep(0.05)
            conn.sendall(b"x")
    fake.answer = drip
    remote = _remote(fake, timeout=0.3)
    t0 = time.monotonic()
    with pytest.raises(RemoteDown):
        remote.get_bundle("k")
    assert time.monotonic() - t0 < 3.0


def test_an_endless_stream_stops_at_the_entry_limit(fake):
    fake.answer = _stream(b"$%d\r\n" % HUGE)
    remote = _remote(fake, max_entry=MIB, timeout=5.0)
    tracemalloc.start()
    try:
        with pytest.raises(RemoteDown, match="OPSMITH_REMOTE_MAX_ENTRY"):
            remote.get_bundle("k")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * MIB, peak


def test_a_close_mid_reply_fails_open_and_the_next_read_reconnects(fake):
    fake.reply(b"$10\r\nabc")
    remote = _remote(fake)
    with pytest.raises(RemoteDown, match="closed"):
        remote.get_bundle("k")
    fake.reply(b"$3\r\nabc\r\n", close=False)
    assert remote.get_bundle("k") == b"abc"
    assert remote.get_bundle("k") == b"abc"  # the same connection, still in sync


def test_protocol_errors_open_the_breaker(fake, caplog):
    fake.reply(b"$%d\r\n" % HUGE)
    remote = _remote(fake)
    with caplog.at_level(logging.DEBUG, logger="opsmith.cache"):
        for _ in range(3):
            with pytest.raises(RemoteDown):
                remote.get_bundle("k")
        seen = fake.answered
        with pytest.raises(RemoteDown, match="circuit breaker"):
            remote.get_bundle("k")
    assert fake.answered == seen  # the open breaker did not even ask
    assert "OPSMITH_REMOTE_MAX_ENTRY" in caplog.text


# -- hypothesis: any reply ----------------------------------------------------------------------
_line = st.text(st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)), max_size=20)
_leaf = st.one_of(
    st.binary(max_size=40).map(lambda b: ("bulk", b)), st.just(("nil", None)),
    st.integers(-2**63, 2**63 - 1).map(lambda i: ("int", i)), _line.map(lambda s: ("simple", s)),
    _line.map(lambda s: ("error", s)))
_value = st.recursive(_leaf, lambda kids: st.lists(kids, max_size=4).map(lambda xs: ("array", xs)),
                      max_leaves=12)


def _encode(v) -> bytes:
    kind, x = v
    if kind == "bulk":
        return b"$%d\r\n%s\r\n" % (len(x), x)
    if kind == "nil":
        return b"$-1\r\n"
    if kind == "int":
        return b":%d\r\n" % x
    if kind in ("simple", "error"):
        return (b"+" if kind == "simple" else b"-") + x.encode() + b"\r\n"
    return b"*%d\r\n" % len(x) + b"".join(_encode(e) for e in x)


def _damage(data: bytes, how: str, at: int) -> bytes:
    if how == "truncate":
        return data[:at % (len(data) + 1)]
    if how == "flip":
        i = at % len(data)
        return data[:i] + bytes([data[i] ^ (1 + at % 255)]) + data[i + 1:]
    if how == "huge":  # the first length or count becomes huge
        i = next((j for j, c in enumerate(data) if c in b"$*"), None)
        if i is None:
            return data
        end = data.index(b"\r\n", i)
        return data[:i + 1] + str(HUGE + at).encode() + data[end:]
    return data


_replies = st.one_of(
    st.binary(max_size=300),
    st.tuples(_value, st.sampled_from(["whole", "truncate", "flip", "huge"]), st.integers(0, 10**6)))

_fuzz = settings(max_examples=300, deadline=None, database=None,
                 suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@_fuzz
@given(reply=_replies)
def test_any_reply_to_a_read_is_a_value_or_remote_down(fake, reply):
    if isinstance(reply, tuple):
        value, how, at = reply
        data = _damage(_encode(value), how, at)
    else:
        value, how, data = None, "garbage", reply
    fake.reply(data)
    remote = _remote(fake, max_entry=MIB)
    try:
        got = remote.get_bundle("k")
    except RemoteDown:
        assert how != "whole" or value[0] not in ("bulk", "nil"), value
        return
    assert got is None or isinstance(got, bytes)
    if how == "whole":
        assert value[0] in ("bulk", "nil") and got == value[1]


# -- writes: redis-py ------------------------------------------------------------------------------
@needs_redis_py
@pytest.mark.parametrize("reply", [
    b":12a\r\n", b"$abc\r\n", b"*1\r\n" * 5000 + b":1\r\n", b"?what\r\n", b"$%d\r\n" % HUGE, b"",
    b"$10\r\nabc", b"*%d\r\n" % HUGE,  # hiredis, where installed, would allocate that list
], ids=lambda r: repr(r[:16]))
def test_garbage_replies_to_writes_fail_open(fake, reply):
    fake.reply(reply)
    remote = _remote(fake, timeout=0.5)
    with pytest.raises(RemoteDown):
        remote.put_bundle("k", b"value")
    with pytest.raises(RemoteDown):
        remote.put_record("deps", "x", b"value")


@needs_redis_py
def test_an_endless_stream_to_a_write_stops_at_the_entry_limit(fake):
    fake.answer = _stream(b"$%d\r\n" % HUGE)
    remote = _remote(fake, max_entry=MIB, timeout=5.0)
    tracemalloc.start()
    try:
        with pytest.raises(RemoteDown):
            remote.put_bundle("k", b"value")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * MIB, peak


@needs_redis_py
def test_a_slow_drip_to_a_write_is_bounded_by_the_timeout(fake):
    def drip(conn, cmd):
        conn.sendall(b"$200\r\n")
        for _ in range(400):
            time.sleep(0.05)
            conn.sendall(b"x")
    fake.answer = drip
    remote = _remote(fake, timeout=0.3)
    t0 = time.monotonic()
    with pytest.raises(RemoteDown):
        remote.put_bundle("k", b"value")
    assert time.monotonic() - t0 < 3.0


@needs_redis_py
@pytest.mark.parametrize("reply", [b":5\r\n", b"*1\r\n:5\r\n", b"*2\r\n$1\r\nx\r\n:1\r\n", b"$1\r\nx\r\n"])
def test_a_malformed_lease_reply_means_no_lease(fake, reply):
    fake.reply(reply, close=False)
    remote = _remote(fake)
    with pytest.raises(RemoteDown):
        remote.try_acquire("k")
    with remote.lease("k") as token:
        assert token is None  # fail open: build locally, without a lease


@needs_redis_py
@_fuzz
@given(reply=_replies)
def test_any_reply_to_a_write_is_an_answer_or_remote_down(fake, reply):
    data = _damage(_encode(reply[0]), reply[1], reply[2]) if isinstance(reply, tuple) else reply
    fake.reply(data)
    remote = _remote(fake, max_entry=MIB)
    try:
        assert remote.put_bundle("k", b"value") is True
    except RemoteDown:
        pass


# -- a build against a broken port ----------------------------------------------------------------
def test_a_build_against_a_broken_port_warns_counts_and_builds_locally(fake, tmp_path, monkeypatch, caplog):
    import opsmith
    from opsmith._cache._open import open_cache
    from opsmith._cache._tiered import tier_stats
    fake.reply(b"$%d\r\n" % HUGE, close=False)
    monkeypatch.setenv("OPSMITH_REMOTE_CACHE", fake.url)
    monkeypatch.setenv("OPSMITH_REMOTE_TRUST_UNSIGNED", "1")
    monkeypatch.setenv("OPSMITH_REMOTE_TIMEOUT", "0.5")
    src = tmp_path / "answer.c"
    src.write_text("int answer(void) { return 42; }\n")
    with caplog.at_level(logging.WARNING, logger="opsmith.cache"):
        art = opsmith.build_shared_library("answer", [str(src)])
    import ctypes
    assert ctypes.CDLL(str(art.path)).answer() == 42
    assert "did not answer" in caplog.text and "building locally" in caplog.text
    store = open_cache().store
    store.flush_stats()
    remote = tier_stats(store.root)["tiers"]["remote"]
    assert remote["errors"] >= 1 and remote["hits"] == 0
