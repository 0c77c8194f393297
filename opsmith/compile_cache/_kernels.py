"""inductor's C++ kernels (CPU) through opsmith's store.

A cached FX graph holds the *source* of its C++ kernels; loading it on a machine whose
inductor cache is empty compiles them again (seconds each). inductor compiles every one in
``_worker_compile_cpp(lock_path, builders)``, skipping a builder whose output file exists;
its output path is named by torch's hash of the source and the command line. Here that
function is wrapped: a kernel whose binary is in opsmith's store is written to that path
(atomically) and not compiled; one that is not is compiled by inductor as before and its
binary published.

The key is everything the binary depends on: each builder's command line, with every file
it names replaced by the sha256 of its contents (the sources inductor wrote, the prefix
header) and the outputs of earlier builders by their position; the compiler's ``-v``
output; torch's version; and, when the command says ``-march=native``, this CPU's model and
flags (a binary built for one CPU may not run on another).

Precompiled headers (``.gch``/``.pch``, built before each kernel, ~100 MB, machine-local by
opsmith's rule) are deferred: built only when a kernel of this process actually compiles.
A kernel whose binary comes from the store never needs one (``-include`` falls back to the
header itself when the precompiled one is absent, so a skipped one never breaks a compile).
inductor's probes of the CPU's vector ISAs (each compiles a small library, then loads it in a
child process) take their library from the store the same way; the loading, which is what
tests this CPU, still runs here.
"""
from __future__ import annotations

import functools
import logging
import os
import shlex
import subprocess
import threading
import uuid

from opsmith._cache._keys import KeyBuilder, file_sha256
from opsmith.compile_cache._torch_private import torch_identity

__all__ = ["KernelCache", "binary_key"]

log = logging.getLogger("opsmith.compile_cache")

_PCH_SUFFIXES = (".gch", ".pch")


@functools.cache
def _compiler_identity(compiler: str) -> str:
    """The compiler's resolved path and ``-v`` output (memoised per process)."""
    import shutil
    path = shutil.which(compiler) or compiler
    try:
        out = subprocess.run([path, "-v"], capture_output=True, text=True, timeout=60,
                             env=dict(os.environ, LC_ALL="C"))
        text = out.stdout + out.stderr
    except (OSError, subprocess.SubprocessError) as exc:
        text = f"unavailable: {exc}"
    return f"{os.path.realpath(path)}\n{text}"


@functools.cache
def _cpu_identity() -> str:
    """This CPU's model and feature flags (what ``-march=native`` compiles for)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            lines = f.read().split("\n\n", 1)[0].splitlines()
        keep = [ln for ln in lines if ln.split(":", 1)[0].strip() in ("vendor_id", "model name", "flags", "Features", "CPU part")]
        return "\n".join(keep)
    except OSError:
        import platform
        return f"{platform.machine()} {platform.processor()}"


def binary_key(builders) -> str:
    """opsmith's key for the binary that ``builders`` (inductor's, in order) produce."""
    version, git = torch_identity()
    kb = KeyBuilder("inductor-cpp-binary-v1").str("torch", version).str("torch-git", git)
    targets = {b.get_target_file_path(): f"<output {i}>" for i, b in enumerate(builders)}
    native = False
    for i, b in enumerate(builders):
        args = shlex.split(b.get_command_line())
        if args:
            kb.str("compiler", _compiler_identity(args[0]))
        words = []
        for a in args[1:]:
            if a in targets:
                words.append(targets[a])
            elif os.path.isabs(a) and os.path.isfile(a):
                words.append(f"<file sha256={file_sha256(a)}>")
            else:
                words.append(a)
                native = native or a == "-march=native"
        kb.strs(f"command {i}", words)
    if native:
        kb.str("cpu", _cpu_identity())
    return kb.hexdigest()


class KernelCache:
    """The wrapper of ``_worker_compile_cpp`` for one :class:`~._backend.CompileCache`."""

    def __init__(self, owner) -> None:
        self.owner = owner
        self._pending: dict[str, tuple] = {}   # header path -> (original, lock, builders)
        self._mutex = threading.Lock()

    def compile(self, original, lock_path, cpp_builders) -> None:
        builders = list(cpp_builders)
        target = builders[-1].get_target_file_path()
        if os.path.exists(target):
            return original(lock_path, builders)
        if target.endswith(_PCH_SUFFIXES):
            header = target[:-4]
            with self._mutex:
                self._pending.setdefault(header, (original, lock_path, builders))
            return None
        counters = self.owner.counters
        key = binary_key(builders)
        entry = self.owner.cache.store.get(key)
        if entry is not None:
            _install(entry.file("binary"), target)
            counters.add("cpp-kernel", "hits")
            return None
        counters.add("cpp-kernel", "misses")
        from opsmith._cache._tiered import check_must_hit
        check_must_hit(key, f"torch.compile would compile inductor's C++ kernel {os.path.basename(target)}")
        self._build_pending_headers(builders)
        original(lock_path, builders)
        counters.add("cpp-kernel", "compiles")
        if os.path.exists(target):
            version, _ = torch_identity()
            self.owner.cache.store.put(key, {"binary": target}, kind="torch-compile",
                                       name=f"cpp-kernel {os.path.basename(target)[:24]}",
                                       meta={"artifact": "cpp-kernel", "torch": version,
                                             "inductor_name": os.path.basename(target)})
            counters.add("cpp-kernel", "puts")
        return None

    def build_probe(self, original_build, builder) -> None:
        """A build inside inductor's ISA probe: its library from the store when there (the
        probe then loads it on this machine, as always), else built and published."""
        target = builder.get_target_file_path()
        key = binary_key([builder])
        entry = self.owner.cache.store.get(key)
        if entry is not None:
            _install(entry.file("binary"), target)
            self.owner.counters.add("isa-probe", "hits")
            return
        self.owner.counters.add("isa-probe", "misses")
        original_build(builder)
        self.owner.counters.add("isa-probe", "compiles")
        if os.path.exists(target):
            version, _ = torch_identity()
            self.owner.cache.store.put(key, {"binary": target}, kind="torch-compile",
                                       name=f"isa-probe {os.path.basename(target)[:24]}",
                                       meta={"artifact": "isa-probe", "torch": version})
            self.owner.counters.add("isa-probe", "puts")
        return

    def _build_pending_headers(self, builders) -> None:
        """Build the deferred precompiled headers that these builders' commands include."""
        words = set()
        for b in builders:
            words.update(shlex.split(b.get_command_line()))
        with self._mutex:
            due = [(h, job) for h, job in self._pending.items() if h in words]
            for h, _ in due:
                del self._pending[h]
        for _, (original, lock_path, pch_builders) in due:
            original(lock_path, pch_builders)


def _install(src, target: str) -> None:
    """Copy a cached binary to inductor's path for it: a temporary name, then rename."""
    import shutil
    os.makedirs(os.path.dirname(target), exist_ok=True)
    tmp = os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        shutil.copyfile(src, tmp)
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
