"""An ONNX Runtime custom-op library from op specs: generate it, build it through the engine, find it again.

Data flow::

    OrtOpSpec per op (opsmith.onnx._specs: plain data, from op descriptions)
        -> the CUDA kernels' launch code (NVRTC images per arch, embedded; the driver opened
           at run time), one unit per CUDA module
        -> <name>_ort.cpp (opsmith.onnx._generate: templates/ort_library.cpp filled in):
           RegisterCustomOps, one OrtCustomOp per (op, provider), the CUDA one launching on
           ORT's compute stream, the CPU one calling the user's function
        -> lib<name>.so: opsmith.build_shared_library (the shared-library profile: ninja, cached
           objects, progress, diagnostics) with :data:`CXX_FLAGS`, copied beside its manifest
           ``<name>.json`` and its sources into the library's folder

No ORT header is needed and libonnxruntime is not linked (see :mod:`opsmith.onnx._generate`).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Iterable, Sequence

from opsmith._errors import SpecError
from opsmith._record import Record
from opsmith._version import __version__
from opsmith.onnx._generate import ORT_API_VERSION, generate_source
from opsmith.onnx._specs import OrtOpSpec, validate

__all__ = ["OrtLibrary", "build_ort_library", "load_manifest", "CXX_FLAGS", "LDFLAGS", "MANIFEST_FORMAT"]

log = logging.getLogger("opsmith.onnx")

MANIFEST_FORMAT = "opsmith.ort-library"
#: Flags of the library's C++: the generated code and the user's CPU functions, the hot loops of
#: a CPU session. -O3: GCC vectorises a loop whose pointers may alias (behind a run-time overlap
#: check) only from -O3; at -O2 the tutorial ReLU stayed a scalar loop with a data-dependent branch
#: (docs/onnx.md has the figures). No -ffast-math (NaN and -0.0 must come out as ORT's own ops
#: give them) and no -march=native (the library may run on another machine; x86-64's 16-byte
#: SSE2 vectors suffice for memory-bound loops). They are in the engine's keys and in the
#: library's manifest (``cxx_flags``), not in the library: -frecord-gcc-switches also recorded the
#: build's temporary paths, so no two builds of one library gave the same bytes.
CXX_FLAGS = ("-std=c++17", "-O3", "-fPIC", "-fvisibility=hidden", "-Wall")
#: Link flags beyond the profile's ``-shared``: the soname is added per library.
LDFLAGS = ("-Wl,--as-needed", "-ldl", "-lpthread")


class OrtLibrary(Record):
    """A built library: ``path`` (``lib<name>.so``), ``manifest`` (its JSON path) and ``ops``:
    ``{"domain.name": {"providers": [...], "dtypes": [...]}}``."""

    __slots__ = ("path", "manifest", "ops")

    def providers_of(self, node: str) -> list[str]:
        """The providers that implement ``node`` (``"mylib.relu"``); [] when the library lacks it."""
        return list(self.ops.get(node, {}).get("providers", []))


def load_manifest(path: str | os.PathLike) -> OrtLibrary:
    """The :class:`OrtLibrary` of a built ``lib<name>.so`` (its manifest lies beside it)."""
    lib = Path(path)
    manifest = lib.with_name(lib.name[3:-3] + ".json") if lib.name.startswith("lib") else lib.with_suffix(".json")
    try:
        data = json.loads(manifest.read_text())
    except (OSError, ValueError) as exc:
        raise SpecError(f"{lib} has no readable opsmith manifest at {manifest} ({exc}); build it with "
                        f"opsmith.onnx.build_library") from None
    if data.get("format") != MANIFEST_FORMAT:
        raise SpecError(f"{manifest} is not an opsmith ORT library manifest")
    return OrtLibrary(path=lib, manifest=manifest, ops=data["ops"])


def _kernels_by_module(specs: Sequence[OrtOpSpec], cuda_sources: Sequence[dict]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for s in specs:
        for v in s.variants:
            if v.kernel:
                if not 0 <= v.module < len(cuda_sources):
                    raise SpecError(f"op {s.domain}.{s.name}: kernel {v.kernel} names CUDA module {v.module}, "
                                    f"but {len(cuda_sources)} were given")
                names = out.setdefault(v.module, [])
                if v.kernel not in names:
                    names.append(v.kernel)
    return out


def _ops_manifest(specs: Sequence[OrtOpSpec]) -> dict:
    ops = {}
    for s in specs:
        providers = (["CUDAExecutionProvider"] if any(v.kernel for v in s.variants) else []) + \
                    (["CPUExecutionProvider"] if s.cpu else [])
        ops[f"{s.domain}.{s.name}"] = {"providers": providers, "dtypes": [v.dtype for v in s.variants],
                                       "inputs": s.inputs, "outputs": s.outputs}
    return ops


def _write(path: Path, data: str | bytes) -> None:
    """Write ``path`` atomically (a temporary name in the same folder, then ``os.replace``);
    a file that already holds ``data`` is left alone (its stamp stays)."""
    raw = data.encode() if isinstance(data, str) else data
    try:
        if path.read_bytes() == raw:
            return
    except OSError:
        pass
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(raw)
    os.replace(tmp, path)


def build_ort_library(specs: Sequence[OrtOpSpec], *, name: str = "opsmith_ops",
                      cuda_sources: Sequence[dict] = (), cpu_source: str = "",
                      archs: Iterable[str] | None = None, out_dir: str | os.PathLike | None = None) -> OrtLibrary:
    """Generate and build ``lib<name>.so`` (see the module doc); the engine reuses what it built.

    ``cuda_sources`` holds, per CUDA module, what compiles it (``sources`` and optionally
    ``include_paths``, ``defines``, ``headers``, ``options``, ``std``); each variant's
    ``kernel``/``module`` names a kernel of one of them. ``cpu_source`` is C++ defining the CPU
    functions the specs name. ``archs``: the GPU archs to embed code for (default: the common
    ones the installed NVRTC supports, and PTX of the newest). Without ``out_dir`` the library
    goes under opsmith's cache directory (``ort/``), in a folder named by the hash of its sources.
    """
    from opsmith._build._profile_shared import build_shared_library
    from opsmith.onnx._launch import launch_code
    if not re.fullmatch(r"[A-Za-z_]\w*", name):
        raise SpecError(f"library name {name!r} must be an identifier (it names lib<name>.so and C symbols)")
    validate(specs)
    specs = list(specs)
    launch = launch_code(_kernels_by_module(specs, cuda_sources), cuda_sources, name,
                         None if archs is None else list(archs))
    glue = generate_source(specs, cpu_source=cpu_source, launch_headers=list(launch.headers),
                           last_error=launch.last_error, launchers=launch.launchers)
    files = {f"{name}_ort.cpp": glue, **launch.files}
    digest = hashlib.sha256()
    for part in [__version__, *CXX_FLAGS, *(f"{n}\0{t}" for n, t in sorted(files.items()))]:
        digest.update(part.encode() + b"\0")
    if out_dir is None:
        from opsmith._config import settings
        dest = settings.cache_path / "ort" / f"{name}-{digest.hexdigest()[:20]}"
    else:
        dest = Path(out_dir)
    dest.mkdir(parents=True, exist_ok=True)
    for fname, text in files.items():
        _write(dest / fname, text)
    units = [dest / f"{name}_ort.cpp", *(dest / f for f in launch.units)]
    lib = dest / f"lib{name}.so"
    artifact = build_shared_library(name, [os.fspath(u) for u in units], extra_cflags=list(CXX_FLAGS),
                                    extra_ldflags=[f"-Wl,-soname,{lib.name}", *LDFLAGS], with_cuda=False)
    manifest_path = dest / f"{name}.json"
    ops = _ops_manifest(specs)
    try:
        fresh = lib.exists() and json.loads(manifest_path.read_text()).get("key") == artifact.key
    except (OSError, ValueError):
        fresh = False
    if not fresh:
        tmp = lib.with_name(f".{lib.name}.{os.getpid()}.tmp")
        shutil.copyfile(artifact.path, tmp)
        os.replace(tmp, lib)
        manifest = {"format": MANIFEST_FORMAT, "version": 1, "opsmith": __version__, "key": artifact.key,
                    "cxx_flags": list(CXX_FLAGS), "ort_api_version": ORT_API_VERSION, "library": lib.name,
                    "ops": ops}
        _write(manifest_path, json.dumps(manifest, indent=1) + "\n")
        log.info("built %s (%d ops)", lib, len(specs))
    return OrtLibrary(path=lib, manifest=manifest_path, ops=ops)
