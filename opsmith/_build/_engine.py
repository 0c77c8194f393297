"""Building an extension: spec -> translation units -> keys -> (cache or ninja) -> artifact.

The warm path runs no subprocess: each unit's pre-key (source bytes, flags, toolchain) is
resolved to its key through the dependency index, the link key is derived from the unit
keys, and the artifact is read from the store. Only what is missing is compiled: cached
object files are reused, so editing one of several sources recompiles one.
"""
from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path

from opsmith._record import Record
from opsmith._cache import _deps
from opsmith._build import _linkstubs, _prefix
from opsmith._build._profile import profile_for
from opsmith._config import settings
from opsmith._errors import CacheError, CompileError
from opsmith._cache._keys import KeyBuilder
from opsmith._spec import ExtensionSpec, Source
from opsmith._cache._store import Entry
from opsmith._cache._open import Cache, open_cache
from opsmith._cache._tiered import check_must_hit, shared_state
from opsmith._toolchain._cxx import (Compiler, TorchInfo, find_cxx, max_jobs, python_include_dir,
                         search_dirs, torch_info)
from opsmith._version import __version__

__all__ = ["Artifact", "build_spec", "warm_spec"]

log = logging.getLogger("opsmith.build")

# The value of TORCH_EXTENSION_NAME in every build: a constant, so that the user's name is
# not an input of the compiled code and identical sources under two names share one artifact.
# Modules are told apart by their file path (Python caches extension modules by path+name).


class Artifact(Record):
    """A built extension in the cache.

    Attributes
    ----------
    name : str
        The name the user asked for.
    kind : str
        ``"module"`` (a Python extension module), ``"library"`` (a shared library loaded for
        its registrations) or ``"executable"``.
    path : pathlib.Path
        The artifact file, inside its verified cache entry.
    key : str
        The cache key.
    built : bool
        True when this call compiled something, False for a pure cache hit.
    compiled_units : int
        How many translation units this call compiled (0 for a hit).
    seconds : float
        Wall time of this call's build (0 for a hit).
    inputs : tuple of str
        The files this answer rests on (sources, their own headers, the compilers, torch's
        headers): the warm index re-checks their stat stamps.
    steps : tuple of (str, float)
        This call's build steps (``"compile relu.cpp"``, ``"link ..."``) and the wall time of
        each, in seconds; empty for a hit.
    """

    __slots__ = ('name', 'kind', 'path', 'key', 'built', 'compiled_units', 'seconds', 'inputs', 'steps')
    _defaults = {'built': False, 'compiled_units': 0, 'seconds': 0.0, 'inputs': (), 'steps': ()}



class _Unit:
    """One translation unit of a build; ``key`` and ``object_entry`` are filled in as found."""

    __slots__ = ("source", "compiler", "flags", "prekey", "uses_pch", "rule", "key", "object_entry",
                 "deps", "roots", "mapped")

    def __init__(self, source: Source, compiler: str, flags: list[str], prekey: str,
                 uses_pch: bool, rule: str) -> None:
        self.source = source
        self.compiler = compiler
        self.flags = flags            # without the source, -c, -o and depfile options
        self.prekey = prekey
        self.uses_pch = uses_pch
        self.rule = rule              # "cxx" or "nvcc"
        self.key: str | None = None
        self.object_entry: Entry | None = None
        self.deps: list[str] = []     # the user headers the key covers
        self.roots = None             # the sources' root (_prefix.Roots) when paths are mapped
        self.mapped = False           # True: compiled with prefix maps, keyed relative to roots


class _Toolchain:
    """Everything about the machine's tools that a build of ``spec`` needs (resolved lazily)."""

    def __init__(self, cache: Cache, spec: ExtensionSpec) -> None:
        self.cxx: Compiler = find_cxx(cache.state)
        self._torch: TorchInfo | None = None
        self.python_include = python_include_dir()
        self.spec = spec
        self.cache = cache
        self.state = cache.state  # machine-local probes (nvcc's, torch's C++ standard)
        self._nvcc = None

    @property
    def torch(self) -> TorchInfo:
        """torch's headers, libraries and identity (imported only by profiles that use torch)."""
        if self._torch is None:
            self._torch = torch_info(self.state)
        return self._torch

    @property
    def nvcc(self):
        if self._nvcc is None:
            from opsmith._toolchain._nvcc import find_nvcc
            self._nvcc = find_nvcc(self.cxx, self.state)
        return self._nvcc

    def system_dirs(self, cache_root: Path) -> list[str]:
        dirs = [self.python_include, *search_dirs(self.cxx, self.state), os.fspath(cache_root)]
        if self._torch is not None:
            dirs += [*self._torch.include_dirs, self._torch.root]
        if self.spec.with_cuda and self._nvcc is not None:
            dirs.extend(self._nvcc.include_dirs)
        return [os.path.realpath(d) for d in dirs]


def _plan(spec: ExtensionSpec, tc: _Toolchain) -> list[_Unit]:
    prof = profile_for(spec)
    cxx_flags = prof.cxx_flags(spec, tc)
    use_pch = settings.pch and tc.cxx.family in ("gcc", "clang")
    key_parts = prof.key_parts(spec, tc)
    roots = _prefix.source_roots(spec)
    units = []
    for src in spec.sources:
        if src.lang == "cuda":
            compiler, flags, rule, pch = tc.nvcc.path, prof.cuda_flags(spec, tc), "nvcc", False
            fingerprint = tc.nvcc.fingerprint
        else:
            compiler, flags, rule = tc.cxx.path, cxx_flags, "cxx"
            pch = use_pch and prof.uses_pch(src)
            fingerprint = tc.cxx.fingerprint
        # Keys that travel: where the compiler maps the sources' root to a canonical path, the
        # key names the source and the include paths under the root relative to it.
        mapped = (_prefix.nvcc_maps_paths(tc.nvcc, flags) if rule == "nvcc"
                  else _prefix.cxx_maps_paths(tc.cxx))
        origin, key_flags = src.path or src.filename, flags
        if mapped and roots is not None:
            origin = roots.canonical(origin) if src.path else origin
            key_flags = _prefix.map_flags(flags, roots)
        prekey = (KeyBuilder("unit-prekey").str("opsmith", __version__).str("lang", src.lang)
                  .str("origin", origin).bytes("text", src.text)
                  .str("compiler", fingerprint).strs("flags", key_flags).str("profile", prof.name)
                  .strs("profile-parts", key_parts).str("pch", "1" if pch else "0")
                  .str("paths", _prefix.CANONICAL_SRC if mapped else "absolute").hexdigest())
        unit = _Unit(src, compiler, flags, prekey, pch, rule)
        unit.roots, unit.mapped = (roots if mapped else None), bool(mapped)
        units.append(unit)
    return units


def _link_key(spec: ExtensionSpec, tc: _Toolchain, units: list[_Unit], ldflags: list[str]) -> str:
    prof = profile_for(spec)
    kb = (KeyBuilder("link").str("opsmith", __version__).str("kind", spec.kind)
          .strs("units", [u.key or "" for u in units]).strs("ldflags", ldflags)
          .str("compiler", tc.cxx.fingerprint).str("profile", prof.name)
          .strs("profile-parts", prof.key_parts(spec, tc))
          .str("link-stubs", "1" if prof.link_stubs(spec, ldflags) else "0"))
    return kb.hexdigest()


def _artifact_filename(spec: ExtensionSpec) -> str:
    return spec.name if spec.kind == "executable" else f"{spec.name}.so"


def _resolve(cache: Cache, units: list[_Unit]) -> None:
    index = _deps.DepIndex(shared_state(cache))  # a cluster's shared cache shares the index
    for u in units:
        if u.key is None:
            found = index.resolve_with_deps(u.prekey, _dep_root(u))
            if found is not None:
                u.key, u.deps = found


def _dep_root(u: _Unit) -> tuple[str, str] | None:
    """How the dependency index names the headers under ``u``'s sources' root, if it does."""
    return (u.roots.real, _prefix.CANONICAL_SRC) if u.roots is not None else None


def _inputs(spec: ExtensionSpec, tc: _Toolchain, units: list[_Unit]) -> tuple[str, ...]:
    """The files an artifact of ``spec`` rests on, for the warm index's stat check."""
    files = [u.source.path for u in units if u.source.path]
    for u in units:
        files.extend(u.deps)
    files.append(os.path.realpath(tc.cxx.path))
    if spec.with_cuda:
        files.append(os.path.realpath(tc.nvcc.path))
    files.extend(profile_for(spec).inputs(spec, tc))
    return tuple(dict.fromkeys(files))


def build_spec(spec: ExtensionSpec) -> Artifact:
    """Build ``spec`` (or find it in the cache) and return the artifact."""
    cache = open_cache(spec.build_directory)
    tc = _Toolchain(cache, spec)
    prof = profile_for(spec)
    prof.check(spec, tc)  # before anything is looked for: a build that cannot work says so first
    if spec.with_cuda:
        tc.nvcc  # noqa: B018 - resolve nvcc (and its errors) before planning
    units = _plan(spec, tc)
    ldflags = prof.ldflags(spec, tc)

    hit = _lookup(cache, spec, tc, units, ldflags)
    if hit is not None:
        return hit
    lock_key = KeyBuilder("build-lock").strs("units", [u.prekey for u in units]).strs(
        "ldflags", ldflags).str("kind", spec.kind).hexdigest()
    with cache.locks.hold(lock_key), cache.store.build_lease(lock_key):
        from opsmith._cache._faults import point
        point("build:locked")  # the fault suite's pauses (tests/test_faults.py)
        hit = _lookup(cache, spec, tc, units, ldflags)  # another process may have built it
        if hit is not None:
            return hit
        known = all(u.key is not None for u in units)
        check_must_hit(_link_key(spec, tc, units, ldflags) if known else lock_key, f"building {spec.name}",
                       None if known else "no dependency record names its units' keys (never built here)")
        return _build_locked(cache, spec, tc, units, ldflags)


def warm_spec(spec: ExtensionSpec, on_status=None):
    """Build now what every build like ``spec`` shares: the precompiled torch headers (waited
    for, not left to the background) and the link stubs. Returns ``(Pch or None, Compiler)``.
    """
    from opsmith._build import _pch
    from opsmith._errors import ToolchainError
    cache = open_cache(spec.build_directory)
    tc = _Toolchain(cache, spec)
    if not _pch.supported(tc.cxx):
        raise ToolchainError(f"the compiler {tc.cxx.path} ({tc.cxx.family}) cannot build "
                             f"precompiled headers; opsmith uses them with gcc and clang. "
                             f"Set CXX=clang++ or CXX=g++.")
    if spec.with_cuda:
        tc.nvcc  # noqa: B018 - find nvcc (and say so clearly) before building anything
    prof = profile_for(spec)
    if prof.link_stubs(spec, prof.ldflags(spec, tc)):
        _linkstubs.ensure(cache, tc.cxx, tc.torch)
    pch = _pch.ensure_pch(cache, tc.cxx, tc.torch, prof.pch_flags(spec, tc), on_status=on_status, wait=True)
    return pch, tc.cxx


def _lookup(cache: Cache, spec, tc, units, ldflags) -> Artifact | None:
    _resolve(cache, units)
    if any(u.key is None for u in units):
        return None
    link_key = _link_key(spec, tc, units, ldflags)
    entry = cache.store.get(link_key)
    if entry is None:
        return None
    fname = entry.meta.get("file")
    if fname not in entry.manifest["files"]:
        return None
    log.debug("cache hit for %s (%s)", spec.name, link_key)
    return Artifact(spec.name, spec.kind, entry.file(fname), link_key, inputs=_inputs(spec, tc, units))


def _build_locked(cache: Cache, spec: ExtensionSpec, tc: _Toolchain, units: list[_Unit],
                  ldflags: list[str]) -> Artifact:
    # Imported here, not at the top: a warm load (cache hit) needs none of them.
    from opsmith._build import _pch
    from opsmith._build._ninja import Step, run_steps
    from opsmith._build._progress import Progress
    from opsmith._cache._faults import point

    t0 = time.perf_counter()
    for u in units:
        if u.key is not None:
            u.object_entry = cache.store.get(u.key)
    todo = [u for u in units if u.object_entry is None]
    if any(u.rule == "nvcc" for u in todo):
        from opsmith._toolchain._nvcc import hint_torch_headers, includes_torch_headers
        for u in todo:
            if u.rule == "nvcc" and includes_torch_headers(u.source.text):
                hint_torch_headers(u.source.display)
    label = f"{spec.name}-{units[0].prekey[:10]}"
    log_path = cache.workspace.log_path(label)
    build_dir = cache.workspace.build_dir(spec.name)
    progress = Progress(f"building {spec.name}", verbose=spec.verbose)
    try:
        pch = None
        if any(u.uses_pch for u in todo):
            pch = _pch.ensure_pch(cache, tc.cxx, tc.torch, profile_for(spec).pch_flags(spec, tc),
                                  on_status=progress.status,
                                  on_note=progress.note)
        steps, objects = [], []
        for u in units:
            if u.object_entry is not None:
                objects.append(os.fspath(u.object_entry.file("unit.o")))
                continue
            if u.source.path is None:
                src_path = build_dir / u.source.filename
                src_path.write_bytes(u.source.text)
            else:
                src_path = Path(u.source.path)
            obj = build_dir / f"{u.source.stem}.o"
            extra = list(pch.use_flags) if (pch is not None and u.uses_pch) else []
            if u.rule == "cxx" and tc.cxx.family in ("gcc", "clang"):
                # The assembler reads the compiler's output as it comes (0.2 s of a torch
                # unit); not part of any key: it changes how, not what, is compiled.
                extra.insert(0, "-pipe")
            if u.mapped:  # kept out of keys: they name this checkout's paths (see _prefix)
                extra += _prefix.command_flags(u.rule, u.roots, os.fspath(build_dir))
            cmd = (u.compiler, *extra, *u.flags, "-MD", "-MF", f"{obj}.d", "-c", os.fspath(src_path),
                   "-o", os.fspath(obj))
            split = None
            if u.rule == "nvcc" and settings.nvcc_split and includes_torch_headers(u.source.text):
                from opsmith._build._nvcc_split import split_steps  # nvcc's phases as parallel steps
                split = split_steps(cmd, os.fspath(src_path), os.fspath(obj), f"{obj}.d",
                                    build_dir / f"{u.source.stem}.nvcc", f"compile {u.source.display}")
            steps.extend(split or [Step(os.fspath(obj), (os.fspath(src_path),), cmd,
                                        f"compile {u.source.display}", depfile=True)])
            objects.append(os.fspath(obj))
        out = build_dir / _artifact_filename(spec)
        link_flags = (_linkstubs.link_flags(cache, tc.cxx, tc.torch, spec.kind, ldflags)
                      if profile_for(spec).link_stubs(spec, ldflags) else ldflags)
        link_cmd = (tc.cxx.path, *objects, *link_flags, "-o", os.fspath(out))
        steps.append(Step(os.fspath(out), tuple(objects), link_cmd, f"link {out.name}"))
        for st in steps:
            log.info("%s: %s", st.label, " ".join(st.command))
        progress.begin_steps(len(steps) - 1)  # compile steps; the last one links
        point("build:before-compile")
        result = run_steps(build_dir, steps, jobs=max_jobs(), log_path=log_path,
                           on_progress=progress.step, on_line=progress.line)
        progress.close()
        if not result.ok and pch is not None and _pch_rejected(result.output, pch):
            # A damaged or stale precompiled header: drop it and build without one.
            log.warning("the precompiled torch headers were rejected by the compiler; removing "
                        "them and building without (they are rebuilt next time)")
            cache.store.remove(pch.key)
            with settings.override(pch=False):
                return build_spec(spec)
        if not result.ok and link_flags != ldflags and result.failed_step is steps[-1]:
            # A linker that refuses the stubs (an option it lacks): link against the real
            # libraries; ninja re-runs the link step alone (the objects are up to date).
            log.warning("linking against torch's link stubs failed; linking against the real "
                        "libraries instead (OPSMITH_LINK_STUBS=0 skips the stubs):\n%s",
                        result.failed_output[-1000:])
            link_cmd = (tc.cxx.path, *objects, *ldflags, "-o", os.fspath(out))
            log.info("%s: %s", steps[-1].label, " ".join(link_cmd))
            steps[-1] = Step(os.fspath(out), tuple(objects), link_cmd, steps[-1].label)
            result = run_steps(build_dir, steps, jobs=max_jobs(), log_path=log_path)
        if not result.ok:
            raise _failure(spec, result, steps, log_path)
        # Publish each new object under its key (found from the compiler's depfile), then the link.
        index = _deps.DepIndex(shared_state(cache))
        system = tc.system_dirs(cache.root)
        for u in todo:
            obj = build_dir / f"{u.source.stem}.o"
            deps = _deps.parse_depfile((build_dir / f"{u.source.stem}.o.d").read_text(errors="replace"))
            own = {os.path.realpath(u.source.path)} if u.source.path else set()
            snap = _deps.snapshot([d for d in deps[1:] if os.path.realpath(d) not in own], system,
                                  base=os.fspath(build_dir), root=_dep_root(u))
            u.key = index.record(u.prekey, snap)
            u.deps = [_deps.real_path(s[0], _dep_root(u)) for s in snap]
            if spec.keep_intermediates:
                cache.store.put(u.key, {"unit.o": obj}, kind="object", name=u.source.display, move=True)
        point("build:objects-published")
        link_key = _link_key(spec, tc, units, ldflags)
        entry = cache.store.put(link_key, {out.name: out}, kind=spec.kind, name=spec.name, move=True,
                          meta={"file": out.name, "units": [u.source.display for u in units],
                                "seconds": round(time.perf_counter() - t0, 3),
                                "steps": [[label, s] for label, s in result.timings]})
        point("build:published")
        seconds = time.perf_counter() - t0
        log.info("built %s in %.2f s (%d of %d units compiled; %s)", spec.name, seconds, len(todo),
                 len(units), ", ".join(f"{label} {s:.2f} s" for label, s in result.timings))
        return Artifact(spec.name, spec.kind, entry.file(out.name), link_key, True, len(todo), seconds,
                        _inputs(spec, tc, units), result.timings)
    finally:
        progress.close()
        _pch.release_foreground()  # a deferred background PCH build may start now
        shutil.rmtree(build_dir, ignore_errors=True)



def _failure(spec: ExtensionSpec, result, steps, log_path: Path) -> CompileError | CacheError:
    from opsmith._build import _diagnostics

    step = result.failed_step
    output = result.failed_output or result.output
    if _diagnostics.disk_full(output, list(step.command) if step else []) is not None:
        # The disk, not the code: a CacheError that leads with the directory and its free space.
        return CacheError(str(_diagnostics.compile_error(output, command=list(step.command) if step else [],
                                                         sources={}, log_path=os.fspath(log_path))))
    sources = {}
    for s in spec.sources:
        text = s.text.decode(errors="replace")
        if s.path:
            sources[s.path] = text
            sources[s.display] = text
        else:
            # Inline sources carry `#line 1 "cpp_sources[i]"` markers: map each block back.
            for name, block in _split_inline(text):
                sources[name] = block
    if step is not None and step.label.startswith("link"):
        return _diagnostics.link_error(result.failed_output or result.output, command=list(step.command),
                                       log_path=os.fspath(log_path), with_cuda=spec.with_cuda)
    err = _diagnostics.compile_error(result.failed_output or result.output,
                                     command=list(step.command) if step else [],
                                     sources=sources, log_path=os.fspath(log_path),
                                     options=list(spec.extra_cflags), what=f"building {spec.name}")
    if spec.with_cuda:
        from opsmith._toolchain._nvcc import explain_failure
        fix = explain_failure(result.failed_output or result.output)
        if fix:
            err.args = (f"{err.args[0]}\nfix: {fix}",)
    return err


def _pch_rejected(output: str, pch) -> bool:
    """Did the compiler refuse the PCH itself (rather than the user's code)?"""
    low = output.lower()
    return pch.key in output and any(w in low for w in (
        "malformed", "corrupt", "precompiled header", "pch file", "ast file", "invalid pch"))


def _split_inline(text: str):
    name, lines = None, []
    for line in text.splitlines():
        if line.startswith('#line 1 "') and line.endswith('"'):
            if name is not None:
                yield name, "\n".join(lines)
            name, lines = line[len('#line 1 "'):-1], []
        elif name is not None:
            lines.append(line)
    if name is not None:
        yield name, "\n".join(lines)

