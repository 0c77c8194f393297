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
from opsmith._cache._keys import KeyBuilder
from opsmith._spec import ExtensionSpec
from opsmith._cache._open import Cache, open_cache
from opsmith._cache._tiered import check_must_hit, shared_state
from opsmith._build._plan import (Toolchain, Unit, artifact_filename, dep_root, inputs, link_key, plan,
                                  resolve)
from opsmith._toolchain._cxx import max_jobs

__all__ = ["Artifact", "build_spec", "warm_spec"]

log = logging.getLogger("opsmith.build")
_Toolchain = Toolchain  # the name tests/build/test_nvcc.py imports

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
        its registrations), ``"executable"`` or ``"archive"`` (a static library, ``<name>.a``).
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



def build_spec(spec: ExtensionSpec) -> Artifact:
    """Build ``spec`` (or find it in the cache) and return the artifact."""
    cache = open_cache(spec.build_directory)
    tc = Toolchain(cache, spec)
    prof = profile_for(spec)
    prof.check(spec, tc)  # before anything is looked for: a build that cannot work says so first
    if spec.with_cuda:
        tc.nvcc  # noqa: B018 - resolve nvcc (and its errors) before planning
    units = plan(spec, tc)
    ldflags = prof.ldflags(spec, tc)

    hit = _lookup(cache, spec, tc, units, ldflags)
    if hit is not None:
        return hit
    lock_key = KeyBuilder("build-lock").strs("units", [u.prekey for u in units]).strs(
        "ldflags", ldflags).str("kind", spec.kind).hexdigest()
    known = all(u.key is not None for u in units)
    # must-hit (an installed opsmith package, OPSMITH_MUST_HIT=1): nothing will be built, so there
    # is no build to wait for: the cache as it stands answers, without the lock (a package's
    # import pays no filelock import and no lock file for a library that is not there)
    check_must_hit(link_key(spec, tc, units, ldflags) if known else lock_key, f"building {spec.name}",
                   None if known else "no dependency record names its units' keys (never built here)")
    with cache.locks.hold(lock_key), cache.store.build_lease(lock_key):
        from opsmith._cache._faults import point
        point("build:locked")  # the fault suite's pauses (tests/cache/test_faults.py)
        hit = _lookup(cache, spec, tc, units, ldflags)  # another process may have built it
        if hit is not None:
            return hit
        known = all(u.key is not None for u in units)
        check_must_hit(link_key(spec, tc, units, ldflags) if known else lock_key, f"building {spec.name}",
                       None if known else "no dependency record names its units' keys (never built here)")
        return _build_locked(cache, spec, tc, units, ldflags)


def warm_spec(spec: ExtensionSpec, on_status=None):
    """Build now what every build like ``spec`` shares: the precompiled torch headers (waited
    for, not left to the background) and the link stubs. Returns ``(Pch or None, Compiler)``.
    """
    from opsmith._build import _pch
    from opsmith._errors import ToolchainError
    cache = open_cache(spec.build_directory)
    tc = Toolchain(cache, spec)
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
    resolve(cache, units)
    if any(u.key is None for u in units):
        return None
    key = link_key(spec, tc, units, ldflags)
    entry = cache.store.get(key)
    if entry is None:
        return None
    fname = entry.meta.get("file")
    if fname not in entry.manifest["files"]:
        return None
    log.debug("cache hit for %s (%s)", spec.name, key)
    return Artifact(spec.name, spec.kind, entry.file(fname), key, inputs=inputs(spec, tc, units))


def _build_locked(cache: Cache, spec: ExtensionSpec, tc: Toolchain, units: list[Unit],
                  ldflags: list[str]) -> Artifact:
    # Imported here, not at the top: a warm load (cache hit) needs none of them.
    from opsmith._build import _pch
    from opsmith._build._failure import build_failure, pch_rejected
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
                objects.append(_cached_object(u, spec, build_dir))
                continue
            if u.source.path is None:
                src_path = build_dir / u.source.filename
                src_path.write_bytes(u.source.text)
            else:
                src_path = Path(u.source.path)
            obj = build_dir / f"{u.source.stem}.o"
            extra = list(pch.use_flags) if (pch is not None and u.uses_pch) else []
            if u.rule in ("cxx", "cc") and (tc.cc if u.rule == "cc" else tc.cxx).family in ("gcc", "clang"):
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
        out = build_dir / artifact_filename(spec)
        link_flags = (_linkstubs.link_flags(cache, tc.cxx, tc.torch, spec.kind, ldflags)
                      if profile_for(spec).link_stubs(spec, ldflags) else ldflags)
        linker = tc.linker(units).path
        link_cmd = profile_for(spec).link_command(spec, tc, linker, objects, link_flags, os.fspath(out))
        steps.append(Step(os.fspath(out), tuple(objects), link_cmd, f"link {out.name}"))
        for st in steps:
            log.info("%s: %s", st.label, " ".join(st.command))
        progress.begin_steps(len(steps) - 1)  # compile steps; the last one links
        point("build:before-compile")
        result = run_steps(build_dir, steps, jobs=max_jobs(), log_path=log_path,
                           on_progress=progress.step, on_line=progress.line)
        progress.close()
        if not result.ok and pch is not None and pch_rejected(result.output, pch):
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
            link_cmd = profile_for(spec).link_command(spec, tc, linker, objects, ldflags, os.fspath(out))
            log.info("%s: %s", steps[-1].label, " ".join(link_cmd))
            steps[-1] = Step(os.fspath(out), tuple(objects), link_cmd, steps[-1].label)
            result = run_steps(build_dir, steps, jobs=max_jobs(), log_path=log_path)
        if not result.ok:
            raise build_failure(spec, result, steps, log_path)
        # Publish each new object under its key (found from the compiler's depfile), then the link.
        index = _deps.DepIndex(shared_state(cache))
        system = tc.system_dirs(cache.root)
        for u in todo:
            obj = build_dir / f"{u.source.stem}.o"
            deps = _deps.parse_depfile((build_dir / f"{u.source.stem}.o.d").read_text(errors="replace"))
            own = {os.path.realpath(u.source.path)} if u.source.path else set()
            snap = _deps.snapshot([d for d in deps[1:] if os.path.realpath(d) not in own], system,
                                  base=os.fspath(build_dir), root=dep_root(u))
            u.key = index.record(u.prekey, snap)
            u.deps = [_deps.real_path(s[0], dep_root(u)) for s in snap]
            if spec.keep_intermediates:
                cache.store.put(u.key, {"unit.o": obj}, kind="object", name=u.source.display, move=True)
        point("build:objects-published")
        key = link_key(spec, tc, units, ldflags)
        entry = cache.store.put(key, {out.name: out}, kind=spec.kind, name=spec.name, move=True,
                          meta={"file": out.name, "units": [u.source.display for u in units],
                                "seconds": round(time.perf_counter() - t0, 3),
                                "steps": [[label, s] for label, s in result.timings]})
        point("build:published")
        seconds = time.perf_counter() - t0
        log.info("built %s in %.2f s (%d of %d units compiled; %s)", spec.name, seconds, len(todo),
                 len(units), ", ".join(f"{label} {s:.2f} s" for label, s in result.timings))
        return Artifact(spec.name, spec.kind, entry.file(out.name), key, True, len(todo), seconds,
                        inputs(spec, tc, units), result.timings)
    finally:
        progress.close()
        _pch.release_foreground()  # a deferred background PCH build may start now
        shutil.rmtree(build_dir, ignore_errors=True)


def _cached_object(u: Unit, spec: ExtensionSpec, build_dir: Path) -> str:
    """The object of a unit found in the store, as the link step reads it: from its entry, or,
    for an archive, under the unit's own name in the build folder (``ar`` names each member
    by its file name, and every entry's object is ``unit.o``)."""
    cached = u.object_entry.file("unit.o")
    if spec.kind != "archive":
        return os.fspath(cached)
    obj = build_dir / f"{u.source.stem}.o"
    try:
        os.link(cached, obj)
    except OSError:
        shutil.copyfile(cached, obj)
    return os.fspath(obj)
