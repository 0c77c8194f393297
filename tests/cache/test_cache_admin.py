"""Cache administration: ls/stats/prune/clear/verify over a real LocalStore (no compiler needed)."""
from __future__ import annotations

import multiprocessing
import os
import time

import pytest

from opsmith import ConfigError
from opsmith._cache import _admin as admin
from opsmith._cache._open import open_cache


def _put(cache, key: str, size: int, *, name: str = "", kind: str = "module", age: float = 0.0,
         hits: int = 0, tmp=None):
    src = tmp / f"{key}.bin"
    src.write_bytes(b"x" * size)
    entry = cache.store.put(key, {"a.so": src}, kind=kind, name=name or key)
    for _ in range(hits):
        cache.store.get(key)
    if age:
        t = time.time() - age
        for p in (entry.path / "uses",):
            if p.exists():
                os.utime(p, (t, t))
        # with no hit yet, the last use is the creation time in the manifest
        import json
        man = json.loads((entry.path / "manifest.json").read_text())
        man["created"] = t
        (entry.path / "manifest.json").write_text(json.dumps(man))
    return entry


@pytest.fixture
def cache(fresh_cache):
    return open_cache()


def test_parse_size_and_duration():
    assert admin.parse_size("2G") == 2 << 30
    assert admin.parse_size("500M") == 500 << 20
    assert admin.parse_size("1.5GiB") == int(1.5 * (1 << 30))
    assert admin.parse_size("4096") == 4096
    assert admin.parse_duration("30d") == 30 * 86400
    assert admin.parse_duration("12h") == 12 * 3600
    assert admin.parse_duration("2") == 2 * 86400
    with pytest.raises(ConfigError, match="invalid size"):
        admin.parse_size("lots")
    with pytest.raises(ConfigError, match="invalid duration"):
        admin.parse_duration("soon")


def test_ls_orders_by_last_use_and_stats_count_hits(cache, tmp_path):
    _put(cache, "k_old", 100, age=3600, tmp=tmp_path)
    _put(cache, "k_new", 200, hits=3, tmp=tmp_path)
    items = admin.entries(cache)
    assert [e.key for e in items] == ["k_new", "k_old"]
    s = admin.stats(cache)
    assert s.entries == 2 and s.bytes == 300 and s.hits == 3
    assert s.hit_rate == pytest.approx(3 / 5)
    assert s.by_kind["module"]["entries"] == 2


def test_prune_max_size_removes_least_recently_used_first(cache, tmp_path):
    _put(cache, "a_oldest", 1000, age=3 * 3600, tmp=tmp_path)
    _put(cache, "b_middle", 1000, age=2 * 3600, tmp=tmp_path)
    _put(cache, "c_newest", 1000, age=3600, tmp=tmp_path)
    result = admin.prune(cache, max_size=2000)
    assert [e.key for e in result.removed] == ["a_oldest"]
    assert result.remaining_bytes == 2000
    assert sorted(e.key for e in cache.store.list()) == ["b_middle", "c_newest"]


def test_prune_older_than(cache, tmp_path):
    _put(cache, "old", 10, age=40 * 86400, tmp=tmp_path)
    _put(cache, "recent", 10, age=86400, tmp=tmp_path)
    result = admin.prune(cache, older_than=admin.parse_duration("30d"))
    assert [e.key for e in result.removed] == ["old"]
    assert [e.key for e in cache.store.list()] == ["recent"]


def test_prune_keeps_entries_used_in_the_last_minute_unless_forced(cache, tmp_path):
    _put(cache, "busy", 1000, hits=1, tmp=tmp_path)   # just used
    result = admin.prune(cache, max_size=0)
    assert not result.removed and [e.key for e in result.skipped_busy] == ["busy"]
    assert [e.key for e in cache.store.list()] == ["busy"]
    result = admin.prune(cache, max_size=0, force=True)
    assert [e.key for e in result.removed] == ["busy"] and not list(cache.store.list())


def test_prune_dry_run_removes_nothing(cache, tmp_path):
    _put(cache, "old", 10, age=7200, tmp=tmp_path)
    result = admin.prune(cache, max_size=0, dry_run=True)
    assert [e.key for e in result.removed] == ["old"]
    assert [e.key for e in cache.store.list()] == ["old"]


def test_prune_needs_a_limit(cache):
    with pytest.raises(ConfigError, match="--max-size or --older-than"):
        admin.prune(cache)


def _hold_lock(root, key, ready, release):
    from opsmith._cache._locks import Locks
    with Locks(root).hold(key):
        ready.set()
        release.wait(10)


def test_prune_waits_for_the_entry_lock_of_another_process(cache, tmp_path):
    """A process holding an entry's lock (building or republishing it) is not raced."""
    _put(cache, "locked", 10, age=7200, tmp=tmp_path)
    ctx = multiprocessing.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_hold_lock, args=(os.fspath(cache.root), "locked", ready, release))
    proc.start()
    try:
        assert ready.wait(30)
        import threading
        done = threading.Event()
        t = threading.Thread(target=lambda: (admin.prune(cache, max_size=0), done.set()))
        t.start()
        assert not done.wait(3.0), "prune removed an entry while another process held its lock"
        assert [e.key for e in cache.store.list()] == ["locked"]
        release.set()
        assert done.wait(30)
        assert not list(cache.store.list())
    finally:
        release.set()
        proc.join(30)


def test_verify_reports_and_removes_corrupt_entries(cache, tmp_path):
    good = _put(cache, "good", 100, tmp=tmp_path)
    bad = _put(cache, "bad", 100, tmp=tmp_path)
    (bad.path / "a.so").write_bytes(b"y" * 100)  # same size, other bytes
    (cache.root / "entries" / "garbage").mkdir()     # an entry with no manifest at all
    checked, problems = admin.verify(cache)
    assert checked == 3
    assert sorted((i.key, p) for i, p in problems) == [
        ("bad", "a.so does not match its sha256"), ("garbage", "manifest unreadable: No such file or directory")]
    assert [e.key for e in cache.store.list()] == ["good"]
    assert good.path.exists()


def test_clear_removes_everything_but_entries_in_use(cache, tmp_path):
    _put(cache, "idle", 10, age=7200, tmp=tmp_path)
    _put(cache, "busy", 10, hits=1, tmp=tmp_path)
    result = admin.clear(cache, force=False)
    assert [e.key for e in result.removed] == ["idle"]
    assert [e.key for e in cache.store.list()] == ["busy"]
    admin.clear(cache)
    assert not list(cache.store.list())


def test_prune_sweeps_idle_lock_files_but_never_a_held_one(cache):
    old = time.time() - 7200
    for key in ("idle", "held"):
        with cache.locks.hold(key):
            pass
        os.utime(cache.locks.path(key), (old, old))
    with cache.locks.hold("fresh"):
        pass
    ctx = multiprocessing.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold_lock, args=(str(cache.root), "held", ready, release))
    holder.start()
    try:
        assert ready.wait(30)
        os.utime(cache.locks.path("held"), (old, old))
        result = admin.prune(cache, older_than=10 * 86400)
        assert result.locks_removed == 1
        locks = sorted(p.name for p in (cache.root / "locks").iterdir())
        assert locks == ["fresh.lock", "held.lock"]
        # clear (forced) removes every lock that nobody holds, however recent
        assert admin.clear(cache).locks_removed == 1
        assert sorted(p.name for p in (cache.root / "locks").iterdir()) == ["held.lock"]
    finally:
        release.set()
        holder.join(30)
    with cache.locks.hold("held"):  # the lock still works after a sweep
        pass
