"""Settings: one typed object backed by environment variables, overridable in code.

Every variable opsmith reads is declared here, once; ``docs/settings.md`` documents them
all. Values are read from the environment at each access (cheap), so a test or a user
can change ``os.environ`` at run time; :meth:`Settings.override` scopes changes in code.
"""
from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from opsmith._record import Record
from opsmith._errors import ConfigError

__all__ = ["reset", "on_reset", "Setting", "Settings", "settings", "configure_logging"]


def _to_bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected 1/0, true/false, yes/no or on/off, got {text!r}")


def _to_positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(f"expected a whole number of at least 1, got {text!r}")
    return value


def _to_seconds(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise ValueError(f"expected a number of seconds of at least 0, got {text!r}")
    return value


_BYTE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def _to_bytes(text: str) -> int:
    """``1048576``, ``64K``, ``256M``, ``1G`` (also ``256MiB``, ``256MB``: binary units)."""
    import re
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(?:I?B)?\s*", text.upper())
    if m is None or int(m.group(1)) < 1:
        raise ValueError(f"expected a size such as 268435456, 64K, 256M or 1G, got {text!r}")
    return int(m.group(1)) * _BYTE_UNITS[m.group(2)]


_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _to_log_level(text: str) -> str:
    level = text.strip().upper()
    if level not in _LEVELS:
        raise ValueError(f"expected one of {', '.join(_LEVELS)}")
    return level


def _default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "opsmith")


class Setting(Record):
    """One setting: its name in code, the variables it is read from, its parser and default."""

    __slots__ = ('name', 'env', 'parse', 'default', 'doc')



_SETTINGS: tuple[Setting, ...] = (
    Setting("cache_dir", ("OPSMITH_CACHE_DIR", "TORCH_EXTENSIONS_DIR"), str, _default_cache_dir,
            "Root of the artifact cache. `TORCH_EXTENSIONS_DIR` is honoured when the opsmith "
            "variable is unset. Default: `$XDG_CACHE_HOME/opsmith` or `~/.cache/opsmith`."),
    Setting("cxx", ("OPSMITH_CXX", "CXX"), str, lambda: None,
            "C++ compiler. Default: `clang++` when installed (its precompiled headers are the "
            "fastest), else `c++`, else `g++`."),
    Setting("max_jobs", ("MAX_JOBS",), _to_positive_int, lambda: None,
            "Parallel compile jobs. Default: the CPU cores, capped so that each job has "
            "about 1.5 GiB of available memory."),
    Setting("opt_level", ("OPSMITH_OPT_LEVEL",), str, lambda: "",
            "Optimisation flag added to C++ compiles, e.g. `-O2`. Default: none, as torch's JIT "
            "builder (which means -O0): a drop-in build compiles the same code, and a torch "
            "translation unit compiles in ~3.6 s instead of ~6.8 s with clang's precompiled "
            "headers on 2 cores. A `-O` flag in `extra_cflags` always wins."),
    Setting("pch", ("OPSMITH_PCH",), _to_bool, lambda: True,
            "Use precompiled torch headers for sources that include `torch/extension.h`."),
    Setting("pch_wait", ("OPSMITH_PCH_WAIT",), _to_bool, lambda: False,
            "When the precompiled torch headers are missing: 0 builds them in a background "
            "process (at low priority) and compiles this build without them, so a first build "
            "costs what torch's does; 1 builds them first and waits. `opsmith warm` always waits."),
    Setting("nvcc_split", ("OPSMITH_NVCC_SPLIT",), _to_bool, lambda: True,
            "Run nvcc's phases for a `.cu` that includes torch headers as separate build "
            "steps, so that its host (`cudafe++`) and device (`cicc`) front ends run in "
            "parallel; `0` runs nvcc as one step. Falls back to one step by itself when "
            "`nvcc --dryrun` shows anything it does not know."),
    Setting("link_stubs", ("OPSMITH_LINK_STUBS",), _to_bool, lambda: True,
            "Link extensions against stand-ins of torch's shared libraries that carry only "
            "their names (`SONAME`), so that the linker does not read 400+ MB of symbol tables "
            "(about 0.3 s of every build); the loader binds to the real libraries at import, "
            "as before. `0` links against the real libraries; executables and `-z defs` "
            "links always do."),
    Setting("log_level", ("OPSMITH_LOG_LEVEL",), _to_log_level, lambda: None,
            "Level for the `opsmith` logger (DEBUG, INFO, WARNING, ERROR), printed to stderr "
            "from the first build or compile on (INFO: each command and each step's time). "
            "Unset: the library configures no logging."),
    Setting("progress", ("OPSMITH_PROGRESS",), _to_bool, lambda: True,
            "Show a progress display for long builds when stderr is a terminal."),
    Setting("cuda_with_cpu_torch", ("OPSMITH_CUDA_WITH_CPU_TORCH",), _to_bool, lambda: False,
            "CUDA sources (`.cu`, `cuda_sources`, `CUDAExtension`) against a CPU-only torch: `0` "
            "refuses the build with a `ToolchainError` saying which torch to install (such a module's "
            "kernels cannot run with it: torch has no CUDA runtime to give them); `1` builds anyway, "
            "with a warning. Standalone executables always build."),
    Setting("cuda_home", ("CUDA_HOME", "CUDA_PATH"), str, lambda: None,
            "CUDA toolkit root, for nvcc and headers."),
    Setting("cudacxx", ("CUDACXX",), str, lambda: None,
            "The nvcc to use (path or name); wins over CUDA_HOME and PATH."),
    Setting("cc", ("CC",), str, lambda: None,
            "The C compiler for `.c` sources that are compiled as C (`build_shared_library`; "
            "default: the C++ compiler's C sibling, e.g. `clang` for `clang++`), and the host "
            "compiler nvcc uses (passed as -ccbin), as torch does."),
    Setting("cuda_arch_list", ("TORCH_CUDA_ARCH_LIST",), str, lambda: None,
            "CUDA archs for nvcc builds, as torch parses them (`8.0;9.0`, `9.0+PTX`). "
            "Default: the visible GPUs'."),
    Setting("cuda_arch", ("OPSMITH_CUDA_ARCH",), str, lambda: None,
            "Target arch for NVRTC kernels (`sm_90`). Default: the current device's."),
    Setting("c_launch", ("OPSMITH_C_LAUNCH",), _to_bool, lambda: True,
            "Launch NVRTC kernels through the C fast path (`opsmith._runtime._claunch`, built at install "
            "when a C compiler is present); `0` forces the Python launcher. Read when a kernel "
            "is taken from its module."),
    Setting("torch_op_cshim", ("OPSMITH_TORCH_OP_CSHIM",), _to_bool, lambda: True,
            "Register the CUDA implementation of `opsmith.custom_op` kernel ops as a boxed C kernel "
            "through torch's C shim (torch >= 2.8; ops of tensors in, `Out(like=...)` outputs and the "
            "elementwise launch rule); `0` keeps the generated Python implementation. Read when an op is "
            "registered."),
    Setting("torch_op_native_autograd", ("OPSMITH_TORCH_OP_NATIVE_AUTOGRAD",), _to_bool, lambda: True,
            "Register the Autograd kernel of `opsmith.custom_op` ops whose backward is an op "
            "(`register_autograd(backward_op, save=... or args=...)`, `not_differentiable`) in C++: a "
            "small torch C++ library built once per torch version and cached; `0` keeps the generated "
            "Python Autograd kernel. Read when an op is made differentiable."),
    Setting("ops_native", ("OPSMITH_OPS_NATIVE",), _to_bool, lambda: True,
            "Run the CUDA implementations of `opsmith.ops` (`torch.ops.opsmith.*`) in C++: a small torch "
            "C++ library built once per torch version and cached, no Python on the call; `0` keeps the "
            "Python implementations. Read when the ops are registered (their first use)."),
    Setting("store_backend", ("OPSMITH_STORE_BACKEND",), str, lambda: "local",
            "The artifact-store backend: `local` (entries as directories under the cache "
            "directory) or `module:Class`, a `opsmith._cache._store.Store` subclass constructed "
            "with the cache directory."),
    Setting("verbose", ("OPSMITH_VERBOSE",), _to_bool, lambda: False,
            "`1`: every build prints its commands and step times, as `verbose=True` does "
            "(`setup.py` builds through `opsmith.setuptools` read it)."),
    Setting("remote_cache", ("OPSMITH_REMOTE_CACHE",), str, lambda: None,
            "A shared Redis cache for a cluster: `redis://[user:password@]host:6379/0` or "
            "`rediss://...` (TLS). Lookups go local, then Redis, then build; one process per "
            "cluster builds a missing entry. Entries are loaded only when signed with the key "
            "in `OPSMITH_REMOTE_KEY_FILE` (see docs/cluster_cache.md). Unset: no remote."),
    Setting("remote_key_file", ("OPSMITH_REMOTE_KEY_FILE",), str, lambda: None,
            "A file holding the cluster's shared secret (at least 16 bytes, not readable by "
            "others): remote entries and bundles are signed with it (HMAC-SHA256) and loaded "
            "only when their signature checks. Unset: the remote is not used (read nor written) "
            "unless `OPSMITH_REMOTE_TRUST_UNSIGNED=1`."),
    Setting("remote_trust_unsigned", ("OPSMITH_REMOTE_TRUST_UNSIGNED",), _to_bool, lambda: False,
            "`1` loads unsigned native code from the shared cache and from bundles (anyone who "
            "can write to the Redis server can then run code in your processes), and publishes "
            "unsigned entries when no key file is set. Off by default."),
    Setting("remote_prefix", ("OPSMITH_REMOTE_PREFIX",), str, lambda: "opsmith",
            "Prefix of every Redis key opsmith writes, to share one Redis between clusters."),
    Setting("remote_ttl", ("OPSMITH_REMOTE_TTL",), _to_seconds, lambda: 30 * 86400.0,
            "Seconds a remote entry lives after its last hit (each hit renews it); `0`: no "
            "expiry (rely on Redis' `maxmemory-policy allkeys-lru`)."),
    Setting("remote_connect_timeout", ("OPSMITH_REMOTE_CONNECT_TIMEOUT",), _to_seconds, lambda: 0.2,
            "Seconds to wait for a connection to the Redis server before building locally."),
    Setting("remote_timeout", ("OPSMITH_REMOTE_TIMEOUT",), _to_seconds, lambda: 1.0,
            "Seconds a Redis read or write may take before it counts as a failure; after 3 "
            "failures in a row the remote is skipped for 30 s (circuit breaker)."),
    Setting("remote_lease", ("OPSMITH_REMOTE_LEASE",), _to_seconds, lambda: 20.0,
            "Seconds a build lease lasts in Redis without renewal (the builder renews it every "
            "third of that); a builder that dies is replaced after this long."),
    Setting("remote_max_entry", ("OPSMITH_REMOTE_MAX_ENTRY",), _to_bytes, lambda: 256 << 20,
            "The largest shared-cache entry, in bytes (`64M`, `1G` also work; default 256 MiB), that "
            "opsmith reads from or writes to Redis. A larger reply counts as a failure of the remote "
            "(the process builds locally), as any malformed reply does; a larger build is not "
            "published (a warning says so). It bounds the memory a wrong port, a proxy or a hostile "
            "server can make a process spend. Set the same value on every node."),
    Setting("package_key_file", ("OPSMITH_PACKAGE_KEY_FILE",), str, lambda: None,
            "A file holding the key (at least 16 bytes) that installed opsmith packages must be signed "
            "with (`opsmith package --sign`): a package whose manifest's HMAC-SHA256 does not check is "
            "refused (`CacheError`) instead of loaded. Unset: packages are used unsigned."),
    Setting("must_hit", ("OPSMITH_MUST_HIT",), _to_bool, lambda: False,
            "Production and CI: any compile is an error (`CacheError`) naming the cache key and "
            "why it missed, instead of a build."),
    Setting("compile_cache", ("OPSMITH_COMPILE_CACHE",), _to_bool, lambda: False,
            "`1`: `torch.compile`'s caches (FX graphs, AOTAutograd entries, autotuning results, "
            "inductor's C++ kernels) go through opsmith's cache, and through the shared cache when "
            "`OPSMITH_REMOTE_CACHE` is set, from the first compile on, with no code change (read "
            "when torch is imported, through torch's extension autoload; torch >= 2.5). In code: "
            "`opsmith.compile_cache.enable()`. See docs/compile_cache.md."),
    Setting("compile_cache_wait", ("OPSMITH_COMPILE_CACHE_WAIT",), _to_seconds, lambda: 600.0,
            "Seconds a process that misses a graph waits for another process (on this machine or, "
            "through the shared cache's lease, in the cluster) compiling the same graph, before it "
            "compiles it itself."),
    Setting("test_fault", ("OPSMITH_TEST_FAULT",), str, lambda: None,
            "Tests only (the fault suite): `POINT[@MARKER]` pauses a build at that named point "
            "(`put:manifest`, `build:before-compile`, ...; see `opsmith/_cache/_faults.py`), "
            "writing the process id to MARKER and sleeping until MARKER is removed, so that a "
            "test can kill the process there. Never set it otherwise."),
)
_BY_NAME = {s.name: s for s in _SETTINGS}


class Settings:
    """opsmith's settings, read from the environment at each access.

    Examples
    --------
    >>> import opsmith
    >>> with opsmith.settings.override(opt_level="-O3"):
    ...     opsmith.settings.opt_level
    '-O3'
    """

    def __init__(self) -> None:
        self._local = threading.local()

    def _overrides(self) -> list[dict[str, Any]]:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def __getattr__(self, name: str) -> Any:
        setting = _BY_NAME.get(name)
        if setting is None:
            raise AttributeError(f"opsmith has no setting {name!r}; settings: {sorted(_BY_NAME)}")
        for layer in reversed(self._overrides()):
            if name in layer:
                return layer[name]
        for var in setting.env:
            text = os.environ.get(var)
            if text is not None and text != "":
                try:
                    return setting.parse(text)
                except ValueError as exc:
                    raise ConfigError(f"environment variable {var}={text!r} is invalid: {exc}. "
                                      f"Fix or unset it.") from None
        return setting.default()

    @contextlib.contextmanager
    def override(self, **values: Any) -> Iterator[Settings]:
        """Override settings for the current thread inside a ``with`` block."""
        unknown = set(values) - set(_BY_NAME)
        if unknown:
            raise ConfigError(f"unknown setting(s) {sorted(unknown)}; settings: {sorted(_BY_NAME)}")
        stack = self._overrides()
        stack.append(values)
        try:
            yield self
        finally:
            stack.remove(values)

    @property
    def cache_path(self) -> Path:
        """The cache root as an absolute :class:`~pathlib.Path`."""
        return Path(os.path.abspath(os.path.expanduser(self.cache_dir)))

    @staticmethod
    def describe() -> tuple[Setting, ...]:
        """Every setting with its variables and documentation (used by docs and doctor)."""
        return _SETTINGS

    def __repr__(self) -> str:
        return "Settings(" + ", ".join(f"{s.name}={getattr(self, s.name)!r}" for s in _SETTINGS) + ")"


settings = Settings()


_applied_level: list[str | None] = [None]


def configure_logging() -> None:
    """Apply ``OPSMITH_LOG_LEVEL``: the ``opsmith`` logger at that level, printed to stderr.

    Called where a build or compile begins (not at import). Unset, nothing is configured; an
    application's own logging setup (a root handler) is left to print the records itself.
    """
    level = settings.log_level
    if level is None or _applied_level[0] == level:
        return
    import logging
    logger = logging.getLogger("opsmith")
    logger.setLevel(level)
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("opsmith: %(message)s"))
        logger.addHandler(handler)
    _applied_level[0] = level


def _default_text(setting) -> str:
    """A setting's default as the docs show it: computed with HOME as ``~`` and no XDG vars."""
    saved = {k: os.environ.get(k) for k in ("HOME", "XDG_CACHE_HOME")}
    os.environ["HOME"] = "~"
    os.environ.pop("XDG_CACHE_HOME", None)
    try:
        value = setting.default()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    if isinstance(value, bool):
        value = int(value)
    return "unset" if value is None else f"`{value}`"


def settings_markdown() -> str:
    """docs/settings.md, generated from ``Settings.describe()`` (a test keeps the page current)."""
    lines = ["# Settings", "",
             "Every environment variable opsmith reads. Values are read at each use, so changing "
             "`os.environ` at run time works; `opsmith.settings.override(name=value)` changes them "
             "in code for one thread and block. `opsmith settings` shows the values in effect.", "",
             "<!-- generated by `opsmith settings --markdown > docs/settings.md`; "
             "tests/cli/test_cli.py fails when this page is out of date -->", "",
             "| variable | setting | default | meaning |", "| --- | --- | --- | --- |"]
    for st in Settings.describe():
        variables = "<br>".join(f"`{v}`" for v in st.env)
        doc = " ".join(st.doc.split()).replace("|", "\\|")
        lines.append(f"| {variables} | `{st.name}` | {_default_text(st)} | {doc} |")
    lines += ["", "When several variables are listed, the first one set (and not empty) wins. An invalid "
              "value raises `opsmith.ConfigError` naming the variable; `opsmith doctor` reports it.", ""]
    return "\n".join(lines)


# -- process-wide caches ------------------------------------------------------------------------
_RESETS: list = []


def on_reset(fn):
    """Register ``fn`` (no arguments) to run on :func:`reset`; returns it (usable as a decorator)."""
    _RESETS.append(fn)
    return fn


def reset() -> None:
    """Forget every process-wide cache opsmith keeps: open caches, checked roots, probes, PATH
    look-ups, NVRTC's identity and compiled binaries, torch facts. Each module registers what it
    keeps with :func:`on_reset` when it is imported; tests call this instead of poking names."""
    for fn in list(_RESETS):
        fn()
