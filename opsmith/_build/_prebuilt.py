"""Prebuilt binaries from installed opsmith packages: kernels and libraries with no compile.

A wheel made by ``opsmith package`` holds, beside its Python code, a folder ``_opsmith/`` with
``manifest.json`` (and ``manifest.sig`` when signed): per NVRTC program, its portable key
(:meth:`CompileRequest.portable_key`: what decides the code, without NVRTC's identity or the
machine's paths) and one file per arch (cubins ``sm_80`` ..., PTX ``compute_120``), and the
C-shim op library keyed by its source's hash. Every file's sha256 is in the manifest; the
signature (HMAC-SHA256 with the key of ``OPSMITH_PACKAGE_KEY_FILE``) covers the manifest.

The wheel names its package in the entry-point group ``opsmith.packages``; the first compile of
a process (:func:`lookup`) reads the manifests of every installed package (without importing
them), so an installed package serves its kernels from its first import on, on any machine,
with no NVRTC, no compiler and no cache directory involved. :func:`add` registers a folder by
hand (``opsmith.load_package``). Where no cubin matches the device, the closest older cubin of
the same major arch serves, else the PTX (the driver compiles it, once, and it is logged).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

from opsmith._errors import CacheError, OpsmithError

__all__ = ["FORMAT", "MANIFEST", "Package", "active", "add", "any_binary", "built_library", "library", "lookup",
           "namespace", "packages", "prebuilt_stats", "read_package", "record", "reset"]

log = logging.getLogger("opsmith.package")

FORMAT = 1                 # the manifest format this opsmith reads (and writes)
MANIFEST, SIGNATURE, FOLDER = "manifest.json", "manifest.sig", "_opsmith"
GROUP = "opsmith.packages"
prebuilt_stats = {"kernels": 0, "ptx_jit": 0, "libraries": 0}

_lock = threading.RLock()
_packages: list[Package] = []
_kernels: dict[str, tuple[Package, dict]] = {}  # portable key -> (package, its kernel entry)
_keys: dict[Any, str] = {}                      # request -> portable key (memo)
_read: dict[tuple[str, str], Any] = {}          # (portable key, arch) -> the CudaBinary read
_discovered = False
_said: set = set()
_local_seen: set = set()       # source folders already looked at for a package
_recording: dict | None = None  # while a package is recorded: what this process compiled and built


class Package:
    """One installed package's manifest, read and verified."""

    def __init__(self, folder: Path, manifest: dict, signed: bool) -> None:
        self.folder, self.manifest, self.signed = folder, manifest, signed
        self.name = str(manifest.get("package", folder.parent.name))

    def read(self, entry: dict) -> bytes:
        """A payload file's bytes, checked against the manifest's sha256."""
        path = self.folder / entry["file"]
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise CacheError(f"opsmith package {self.name}: {path} is missing or unreadable ({exc.strerror}); "
                             f"reinstall the package") from None
        if hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise CacheError(f"opsmith package {self.name}: {path} does not match its manifest (modified or "
                             f"corrupt); reinstall the package")
        return data

    def __repr__(self) -> str:
        return f"Package({self.name!r}, {str(self.folder)!r}, signed={self.signed})"


def _verify(folder: Path, text: bytes, key_file: str | None) -> bool:
    """True when the manifest is signed by the key; raises when a key is set and it is not."""
    sig_path = folder / SIGNATURE
    if not key_file:
        return False
    from opsmith._cache._bundle import Signer
    signer = Signer.from_file(key_file)
    try:
        sig = json.loads(sig_path.read_text())
    except (OSError, ValueError):
        sig = None
    if not isinstance(sig, dict) or sig.get("alg") != "hmac-sha256" or not signer.verify(text, sig.get("mac")):
        raise CacheError(f"the opsmith package in {folder.parent} is unsigned or its manifest does not match its "
                         f"signature with the key in {key_file} (tampered, or signed with another key); "
                         f"rebuild it with `opsmith package --sign KEYFILE`, or unset OPSMITH_PACKAGE_KEY_FILE")
    return True


def read_package(folder: str | os.PathLike, key_file: str | None = None) -> Package:
    """The package whose manifest lies in ``folder`` (a package's ``_opsmith``), verified."""
    from opsmith._version import __version__
    folder = Path(folder)
    try:
        text = (folder / MANIFEST).read_bytes()
        manifest = json.loads(text)
    except (OSError, ValueError) as exc:
        raise OpsmithError(f"{folder} holds no readable opsmith package manifest ({exc}); reinstall the package "
                           f"or rebuild it with `opsmith package`") from None
    fmt = manifest.get("format") if isinstance(manifest, dict) else None
    if not isinstance(fmt, int) or fmt > FORMAT:
        raise OpsmithError(f"the opsmith package in {folder.parent} was built by opsmith "
                           f"{manifest.get('opsmith', '?') if isinstance(manifest, dict) else '?'} (package format "
                           f"{fmt}); this is opsmith {__version__}, which reads format {FORMAT}. Upgrade: "
                           f"pip install -U opsmith")
    return Package(folder, manifest, _verify(folder, text, key_file))


def add(folder: str | os.PathLike, key_file: str | None = None) -> Package:
    """Register the package in ``folder``: its kernels and libraries serve compiles from now on."""
    folder = Path(folder)
    with _lock:  # a package registered again (now with a key) replaces its earlier registration
        old = [p for p in _packages if p.folder == folder]
        for p in old:
            _packages.remove(p)
        for k in [k for k, (p, _) in _kernels.items() if p in old]:
            del _kernels[k]
        _read.clear()
    pkg = read_package(folder, key_file)
    with _lock:
        _packages.append(pkg)
        for entry in pkg.manifest.get("kernels", ()):
            _kernels.setdefault(entry["key"], (pkg, entry))
    log.debug("opsmith package %s: %d kernels from %s", pkg.name, len(pkg.manifest.get("kernels", ())), folder)
    return pkg


def _scan() -> list[str]:
    """The ``_opsmith`` folders of the installed packages named in the entry-point group."""
    from importlib import metadata, util
    found = []
    for ep in metadata.entry_points(group=GROUP):
        try:
            spec = util.find_spec(ep.value)
        except (ImportError, ValueError):
            spec = None
        locations = list(spec.submodule_search_locations or ()) if spec else []
        if locations and (Path(locations[0]) / FOLDER / MANIFEST).is_file():
            found.append(str(Path(locations[0]) / FOLDER))
    return sorted(found)


def _installed() -> list[str]:
    """:func:`_scan`, remembered in the machine-local state while no folder of ``sys.path``
    changes (an install or removal changes its folder's time): reading every distribution's
    entry points costs milliseconds that a warm kernel load must not pay."""
    import sys

    from opsmith._cache._open import open_cache
    stamps = []
    for entry in sys.path:
        try:
            stamps.append(f"{entry}\0{os.stat(entry or '.').st_mtime_ns}")
        except OSError:
            continue
    ident = hashlib.sha256("\n".join(stamps).encode()).hexdigest()[:40]
    return open_cache().state.memo("opsmith-packages", ident, _scan, valid=lambda doc: isinstance(doc, list))


def _discover() -> None:
    """Register every installed package named in the entry-point group, once per process."""
    global _discovered
    if _discovered:
        return
    with _lock:
        if _discovered:
            return
        from opsmith._config import settings
        for folder in _installed():
            if any(p.folder == Path(folder) for p in _packages):
                continue
            try:
                add(folder, settings.package_key_file)
            except CacheError:
                raise
            except Exception as exc:  # noqa: BLE001  (a broken package must not stop other compiles)
                _say(("broken", folder), f"the opsmith package in {folder} is not usable ({exc}); its kernels compile")
        _discovered = True


def packages() -> list[Package]:
    """The registered packages (discovering the installed ones first)."""
    _discover()
    return list(_packages)


def _say(what, message: str) -> None:
    if what not in _said:
        _said.add(what)
        log.warning(message)


def _choose(binaries: dict, arch: str, output: str) -> str | None:
    """The arch key of ``binaries`` that serves ``arch``: itself, else an older cubin of the same
    major, else the newest PTX not newer than the device (``None``: nothing runs there)."""
    if output == "ptx":
        want = arch.replace("sm_", "compute_", 1)
        return want if want in binaries else None
    if arch in binaries:
        return arch
    digits = arch[3:].rstrip("af")
    if not digits.isdigit():
        return None
    have = int(digits)
    cubins = [int(a[3:]) for a in binaries if a.startswith("sm_") and a[3:].isdigit()]
    same_major = [c for c in cubins if c // 10 == have // 10 and c <= have]
    if same_major:
        return f"sm_{max(same_major)}"
    ptx = [int(a[8:]) for a in binaries if a.startswith("compute_") and a[8:].isdigit() and int(a[8:]) <= have]
    return f"compute_{max(ptx)}" if ptx else None


def _entry(req) -> tuple[str | None, tuple[Package, dict] | None]:
    """(portable key, (package, kernel entry)) for ``req``: the package beside its source first,
    then the installed ones (read once per process); (None, None) while no package exists."""
    _local(req.source_dir)
    if not _kernels:
        _discover()
    if not _kernels:
        return None, None
    key = _keys.get(req)
    if key is None:
        key = _keys[req] = req.portable_key()
    found = _kernels.get(key)
    if found is None and not _discovered:
        _discover()
        found = _kernels.get(key)
    return key, found


def lookup(req) -> dict | None:
    """The binary for ``req`` from an installed package (code, kind, arch, lowered_names,
    nvrtc_version, key: what :mod:`~opsmith._build._nvrtc` makes a CudaBinary of), or None."""
    if _recording is not None:
        _recording["requests"].append(req)
    key, found = _entry(req)
    if found is None:
        return None
    pkg, entry = found
    chosen = _choose(entry["binaries"], req.arch, req.output)
    if chosen is None:
        _say(("arch", pkg.name, req.arch), f"opsmith package {pkg.name} has no binary that runs on {req.arch} "
             f"(it has {', '.join(sorted(entry['binaries']))}); compiling {entry.get('name', '')} here")
        return None
    hit = _read.get((key, chosen))
    if hit is not None:
        return hit
    b = entry["binaries"][chosen]
    code = pkg.read(b)
    prebuilt_stats["kernels"] += 1
    if b["kind"] == "ptx" and req.output == "cubin":
        prebuilt_stats["ptx_jit"] += 1
        _say(("ptx", pkg.name, req.arch), f"opsmith package {pkg.name} has no cubin for {req.arch}: the driver "
             f"compiles its PTX ({chosen}) once; rebuild the package with --arch {req.arch} to skip that")
    hit = _read[(key, chosen)] = {
        "code": code, "kind": b["kind"], "arch": chosen, "lowered_names": dict(entry.get("lowered_names", {})),
        "nvrtc_version": pkg.manifest.get("nvrtc_version", "?"), "key": f"package:{pkg.name}:{key}"}
    return hit


def _local(source_dir) -> None:
    """Register the package that holds ``source_dir`` (a kernel file's folder inside an
    installed package: ``_opsmith/`` lies at its top), once per folder: a package's own kernels
    are found with a few stats, without reading every distribution's entry points."""
    if not source_dir or source_dir in _local_seen:
        return
    _local_seen.add(source_dir)
    here = Path(source_dir)
    while (here / "__init__.py").is_file():
        folder = here / FOLDER
        if (folder / MANIFEST).is_file():
            if not any(p.folder == folder for p in _packages):
                from opsmith._config import settings
                add(folder, settings.package_key_file)
            return
        here = here.parent


def namespace(ns: str, caller_file: str | None) -> str:
    """The namespace that ops named ``ns::…`` by code in ``caller_file`` register under: the one
    the package holding that file maps ``ns`` to (``opsmith package --versioned-namespace``:
    ``relupkg`` -> ``relupkg_1_0_0``), else ``ns``. The package is found as :func:`_local` finds
    a kernel's (a few stats, once per folder)."""
    if not caller_file:
        return ns
    here = Path(caller_file).parent
    _local(str(here))
    for pkg in list(_packages):
        top = pkg.folder.parent
        if here == top or top in here.parents:
            return str(pkg.manifest.get("namespaces", {}).get(ns, ns))
    return ns


def active() -> bool:
    """True when a package serves this process (registered so far; nothing is discovered)."""
    return bool(_packages)


def any_binary(req):
    """Some binary of ``req`` from a package, whatever its arch (a CPU-only machine reads the
    kernels' lowered names from it), or None."""
    _, found = _entry(req)
    if found is None:
        return None
    arch = sorted((a for a in found[1]["binaries"] if a.startswith("sm_")), key=lambda a: (len(a), a))
    return lookup(req._replace(arch=arch[-1])) if arch else None


def library(name: str, source_sha256: str) -> str | None:
    """The path of a package's prebuilt library ``name`` built from a source of that hash, checked."""
    for discover in (False, True):  # the packages registered so far, then the installed ones
        if discover:
            if _discovered:
                break
            _discover()
        for pkg in _packages:
            entry = pkg.manifest.get("libraries", {}).get(name)
            if entry and entry.get("source_sha256") == source_sha256:
                pkg.read(entry)  # its bytes match the manifest
                prebuilt_stats["libraries"] += 1
                return str(pkg.folder / entry["file"])
    return None


def record() -> dict:
    """Start recording what this process compiles (``requests``: every NVRTC request) and which
    prebuildable libraries it builds (``libraries``: name -> (source sha256, path)); the dict
    returned fills as it goes. ``opsmith package`` runs the user's module under it."""
    global _recording
    _recording = {"requests": [], "libraries": {}}
    return _recording


def built_library(name: str, source_sha256: str, path: str) -> None:
    """Note a library a package may carry (its builder calls this; recorded while recording)."""
    if _recording is not None:
        _recording["libraries"][name] = (source_sha256, path)


def reset() -> None:
    """Forget the registered packages (tests; the next lookup discovers again)."""
    global _discovered
    with _lock:
        _packages.clear()
        _kernels.clear()
        _keys.clear()
        _read.clear()
        _said.clear()
        _local_seen.clear()
        _discovered = False
