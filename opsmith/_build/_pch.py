"""Precompiled torch headers: built once per toolchain and flags, shared by every extension.

Parsing ``torch/extension.h`` is most of a torch extension's compile time (about 20–30 s
on a 2-core machine). A precompiled header removes it: clang's with
``-fpch-instantiate-templates`` (template instantiations done once, in the PCH) is the
fastest; gcc's ``.gch`` works too. The PCH is a store entry like any other: keyed by the
compiler fingerprint, the exact flags, torch's fingerprint and the header text; built under
its own lock; verified when used.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from opsmith._errors import ToolchainError
from opsmith._cache._keys import KeyBuilder
from opsmith._cache._open import Cache
from opsmith._toolchain._cxx import Compiler, TorchInfo

__all__ = ["Pch", "pch_key", "ensure_pch", "pch_flags"]

log = logging.getLogger("opsmith.build")

HEADER_TEXT = "#include <torch/extension.h>\n"
_HEADER = "torch_extension_pch.h"


@dataclasses.dataclass(frozen=True)
class Pch:
    key: str
    use_flags: tuple[str, ...]
    built_seconds: float | None  # None when it came from the cache


def supported(compiler: Compiler) -> bool:
    return compiler.family in ("gcc", "clang")


def pch_key(compiler: Compiler, torch: TorchInfo, flags: list[str]) -> str:
    return (KeyBuilder("pch").str("compiler", compiler.fingerprint).str("torch", torch.fingerprint)
            .strs("flags", flags).str("header", HEADER_TEXT).hexdigest())


def _stable_header(cache: Cache) -> Path:
    """The header the PCH is built from, at a path that never changes (clang records it)."""
    d = cache.workspace.stable_dir("pch-src")
    path = d / _HEADER
    if not path.exists():
        tmp = d / f".{_HEADER}.{os.getpid()}"
        tmp.write_text(HEADER_TEXT)
        try:
            os.link(tmp, path)  # never replace an existing one: clang checks its mtime
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    return path


def pch_flags(compiler: Compiler, entry_dir: Path) -> tuple[str, ...]:
    if compiler.family == "clang":
        return ("-include-pch", os.fspath(entry_dir / "torch.pch"))
    return ("-include", os.fspath(entry_dir / _HEADER), "-Winvalid-pch")


def ensure_pch(cache: Cache, compiler: Compiler, torch: TorchInfo, flags: list[str],
               on_status=None, wait: bool | None = None, on_note=None) -> Pch | None:
    """The PCH for ``flags`` if it is in the store; else build it.

    ``wait`` (default ``settings.pch_wait``): True builds it now and returns it; False starts
    it in a background process and returns None at once, so that the caller compiles this
    build without it — a first build then costs what it costs without a PCH (as torch's)
    rather than the PCH's ~35 s on top. None is also the answer when it cannot be built.
    On a machine with few cores the background build waits until this process's build is
    done (:func:`release_foreground`), so that the two do not share the cores; ``on_note``
    is told that it runs, and that it goes on after this process exits.
    """
    key = pch_key(compiler, torch, flags)
    # Fully verified like every entry (sha256 of ~170 MB: ~0.16 s of a cold build): a flipped
    # bit in a PCH could otherwise compile into a silently wrong binary.
    entry = cache.store.get(key)
    if entry is not None:
        return Pch(key, pch_flags(compiler, entry.path), None)
    if wait is None:
        from opsmith._config import settings
        wait = settings.pch_wait
    if not wait:
        deferred = not _cores_to_spare()
        if _start_background(cache, key, compiler, flags, deferred):
            when = "after this build" if deferred else "in the background"
            text = (f"torch headers will be precompiled {when} (once per toolchain and flags; it goes "
                    f"on after this process exits); this build goes without them")
            (on_note or on_status or (lambda _t: None))(text)
        return None
    with cache.locks.hold(key):
        entry = cache.store.get(key)
        if entry is None:
            if on_status:
                on_status("precompiling torch headers (once per toolchain and flags)")
            entry, seconds = _build(cache, key, compiler, flags)
            if entry is None:
                return None
            return Pch(key, pch_flags(compiler, entry.path), seconds)
    return Pch(key, pch_flags(compiler, entry.path), None)


# A machine with this many cores runs the background PCH build beside a foreground build;
# with fewer, the PCH build waits for the foreground one: on 2 cores the two together made a
# first build twice as slow as torch's (69.6 s against 35.3 s, issue 11).
_CORES_FOR_BOTH = 4
_held_gates: list = []  # filelock.FileLock objects: this process's builds in progress


def _cores_to_spare() -> bool:
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return cores >= _CORES_FOR_BOTH


def release_foreground() -> None:
    """This process's build is done: deferred background PCH builds may start now."""
    while _held_gates:
        try:
            _held_gates.pop().release(force=True)
        except Exception:  # noqa: BLE001 - never fail a build over an optimisation
            pass


def _start_background(cache: Cache, key: str, compiler: Compiler, flags: list[str],
                      deferred: bool = False) -> bool:
    """Start ``python -m opsmith._build._pch`` detached, unless one is building this PCH already.

    ``deferred``: this process holds a gate lock until its build is done
    (:func:`release_foreground`, or its exit); the background build takes the gate first.
    """
    import filelock
    probe = filelock.FileLock(cache.locks.path(key), mode=0o600)
    try:
        probe.acquire(timeout=0)
    except filelock.Timeout:
        return False  # being built by another process (background or not)
    probe.release()
    job = {"root": os.fspath(cache.root), "key": key, "cxx": compiler.path,
           "family": compiler.family, "flags": list(flags)}
    if deferred:
        gate_path = cache.locks.path(f"pch-gate-{os.getpid()}")
        gate = filelock.FileLock(gate_path, mode=0o600)
        try:
            gate.acquire(timeout=0)
        except filelock.Timeout:
            pass  # another thread of this process holds it: the job waits for that build
        else:
            _held_gates.append(gate)
        job["gate"] = gate_path
    log_path = cache.workspace.log_path("pch-" + key[:16])
    # Its own process group (Ctrl-C at the terminal does not reach it), but the caller's session:
    # a new session is a new scheduler autogroup, where the job's low priority counts only
    # inside its own group and the compiler takes a whole core from the caller's threads (the
    # module just built ran up to 110x slower beside it on 2 cores, issue 24). process_group needs
    # Python 3.11; on 3.10 the job leaves the group itself (_background_main).
    group = {"process_group": 0} if sys.version_info >= (3, 11) else {}
    try:
        with open(log_path, "ab") as out:
            subprocess.Popen([sys.executable, "-m", "opsmith._build._pch", json.dumps(job)],
                             stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                             close_fds=True, **group)
    except OSError as exc:
        log.warning("could not start the background build of precompiled torch headers: %s", exc)
        return False
    log.info("building precompiled torch headers in the background (log: %s)", log_path)
    return True


def _background_main(job_text: str) -> int:
    """The detached PCH build: low priority, under the entry's lock, published atomically."""
    from opsmith._cache._open import open_cache
    job = json.loads(job_text)
    _run_idle()
    if job.get("gate"):  # wait until the build that started this one is done
        import filelock
        print("waiting for the foreground build to finish", flush=True)
        with filelock.FileLock(job["gate"], mode=0o600):
            pass
    cache = open_cache(job["root"])
    compiler = _JobCompiler(job["cxx"], job["family"])
    with cache.locks.hold(job["key"]):
        if cache.store.get(job["key"]) is not None:
            return 0
        entry, seconds = _build(cache, job["key"], compiler, job["flags"])
    print(f"precompiled torch headers {'built' if entry else 'FAILED'} in {seconds:.1f} s", flush=True)
    return 0 if entry is not None else 1


def _run_idle() -> None:
    """Make this process (and the compiler it runs) take only CPU time nobody else wants.

    SCHED_IDLE, inherited by the compiler: the caller's threads, even niced ones, preempt it
    at once. Measured on the 2-core machine (2,000 LLTM forward calls beside this compile,
    median of 7 trials, bench/lltm/diag_pch_interference.py): 5.24 s beside a nice-10 job in
    a session of its own (before), 0.208 s beside an idle one in the caller's session, 0.114 s
    alone. Where SCHED_IDLE is missing, nice 19. SIGHUP is ignored: the job outlives the
    terminal as it did in a session of its own.
    """
    import signal
    try:
        os.setpgid(0, 0)  # Python 3.10: not yet in a group of its own (see _start_background)
    except OSError:
        pass
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        try:
            os.nice(19)
        except OSError:
            pass


class _JobCompiler:
    """The two fields of a :class:`Compiler` that building a PCH reads."""

    def __init__(self, path: str, family: str) -> None:
        self.path, self.family = path, family


def _build(cache: Cache, key: str, compiler: Compiler, flags: list[str]):
    header = _stable_header(cache)
    build_dir = cache.workspace.build_dir("pch")
    try:
        if compiler.family == "clang":
            out = build_dir / "torch.pch"
            cmd = [compiler.path, *flags, "-x", "c++-header", os.fspath(header),
                   "-fpch-instantiate-templates", "-o", os.fspath(out)]
            files = {"torch.pch": out}
        else:
            local_header = build_dir / _HEADER
            local_header.write_text(HEADER_TEXT)
            out = build_dir / (_HEADER + ".gch")
            cmd = [compiler.path, *flags, "-x", "c++-header", os.fspath(local_header), "-o", os.fspath(out)]
            files = {_HEADER: local_header, _HEADER + ".gch": out}
        log.info("building precompiled torch headers: %s", shlex.join(cmd))
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
        seconds = time.perf_counter() - t0
        if proc.returncode != 0:
            # Not fatal: the sources compile without it, only slower. The real error, if the
            # flags are wrong, shows when the user's own file is compiled.
            log.warning("precompiled torch headers failed to build; compiling without them.\n%s",
                        proc.stderr[-2000:])
            return None, seconds
        entry = cache.store.put(key, files, kind="pch", name="torch/extension.h", move=True,
                          meta={"compiler": compiler.path, "seconds": round(seconds, 3)})
        return entry, seconds
    except FileNotFoundError as exc:
        raise ToolchainError(f"cannot run the compiler {compiler.path}: {exc}") from None
    finally:
        shutil.rmtree(build_dir, ignore_errors=True)


if __name__ == "__main__":  # python -m opsmith._build._pch JOB: the background build
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    sys.exit(_background_main(sys.argv[1]))
