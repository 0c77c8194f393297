"""An ONNX Runtime custom-op library from opsmith op descriptions: build it, find it again.

Data flow::

    OrtOpSpec per op (opsmith._build._ort_source: plain data, and the C++ it becomes)
        -> export_c (the CUDA kernels: cubins embedded, driver opened at run time)
        -> <name>_ort.cpp (generate_source): RegisterCustomOps, one OrtCustomOp per
           (op, provider), the CUDA one launching on ORT's compute stream, the CPU one calling
           the user's function (on ORT's intra-op threads through opsmith::cpu_context)
        -> lib<name>.so (system C and C++ compilers, :data:`CXX_FLAGS`), cached by content

No ORT header is needed and libonnxruntime is not linked (see :mod:`opsmith._build._ort_source`).
This module imports no torch: the torch side (:mod:`opsmith._torch._onnx`) turns
``opsmith.custom_op`` ops into :class:`OrtOpSpec` values.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Iterable, Sequence

from opsmith._build._ort_source import (ONNX_DTYPES, ORT_API_INDEX, ORT_API_VERSION, OrtOpSpec, OrtVariant,
                                        _ident, _validate, generate_source)
from opsmith._build._run import run_tool
from opsmith._errors import SpecError, ToolchainError
from opsmith._record import Record
from opsmith._version import __version__

__all__ = ["OrtOpSpec", "OrtVariant", "OrtLibrary", "build_ort_library", "generate_source",
           "ORT_API_VERSION", "ORT_API_INDEX", "ONNX_DTYPES", "CXX_FLAGS", "C_FLAGS", "load_manifest"]

log = logging.getLogger("opsmith.onnx")

MANIFEST_FORMAT = "opsmith.ort-library"
#: Flags of the library's C++: the generated code and the user's CPU functions, the hot loops of
#: a CPU session. -O3: GCC vectorises a loop whose pointers may alias (behind a run-time overlap
#: check) only from -O3; at -O2 the tutorial ReLU stayed a scalar loop with a data-dependent branch
#: (docs/onnx.md has the figures). No -ffast-math (NaN and -0.0 must come out as ORT's own ops
#: give them) and no -march=native (the library may run on another machine; x86-64's 16-byte
#: SSE2 vectors suffice for memory-bound loops). -frecord-gcc-switches keeps the command line in
#: the library: ``readelf -p .GCC.command.line lib<name>.so``.
CXX_FLAGS = ("-std=c++17", "-O3", "-fPIC", "-fvisibility=hidden", "-Wall", "-frecord-gcc-switches")
#: Flags of the export-c launchers (C99 host code that calls the CUDA driver).
C_FLAGS = ("-std=c99", "-O2", "-fPIC", "-fvisibility=hidden")


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


# -- the build ------------------------------------------------------------------------------------
def _compiler(names: Sequence[str], given: str | None, what: str) -> str:
    found = shutil.which(given) if given else next((shutil.which(c) for c in names if shutil.which(c)), None)
    if not found:
        raise ToolchainError(f"no {what} ({given or ', '.join(names)}) on PATH to build the ONNX Runtime op "
                             f"library: install one (apt-get install g++) or pass {'cxx' if 'C++' in what else 'cc'}=")
    return found


def _run(cmd: list[str], source) -> None:
    run_tool(cmd, source, "the ONNX Runtime op library")


def build_ort_library(specs: Sequence[OrtOpSpec], *, name: str = "opsmith_ops",
                      cuda_sources: Sequence[dict] = (), cpu_source: str = "",
                      archs: Iterable[str] | None = None, out_dir: str | os.PathLike | None = None,
                      cxx: str | None = None, cc: str | None = None) -> OrtLibrary:
    """Generate and build ``lib<name>.so`` (see the module doc); reused when built before.

    ``cuda_sources`` holds, per CUDA module, the keyword arguments of :func:`opsmith.export_c`
    (``sources`` and optionally ``include_paths``, ``defines``, ``headers``, ``options``,
    ``std``); each variant's ``kernel``/``module`` names the kernel to export from one of them.
    ``cpu_source`` is C++ defining the CPU functions the specs name. ``archs`` as for
    ``export_c``. Without ``out_dir`` the library goes under opsmith's cache directory, in a
    folder named by the hash of everything that decides it.
    """
    from opsmith._build._export_c import export_c
    if not re.fullmatch(r"[A-Za-z_]\w*", name):
        raise SpecError(f"library name {name!r} must be an identifier (it names lib<name>.so and C symbols)")
    _validate(specs)
    specs = list(specs)
    kernels_by_module: dict[int, list[str]] = {}
    for s in specs:
        for v in s.variants:
            if v.kernel:
                if not 0 <= v.module < len(cuda_sources):
                    raise SpecError(f"op {s.domain}.{s.name}: kernel {v.kernel} names CUDA module {v.module}, "
                                    f"but {len(cuda_sources)} were given")
                kernels_by_module.setdefault(v.module, [])
                if v.kernel not in kernels_by_module[v.module]:
                    kernels_by_module[v.module].append(v.kernel)
    cxx_path = _compiler(("c++", "g++", "clang++"), cxx, "C++ compiler")
    cc_path = _compiler(("cc", "gcc", "clang"), cc, "C compiler")
    archs = None if archs is None else list(archs)

    with tempfile.TemporaryDirectory(prefix="opsmith-ort-") as tmp:
        work = Path(tmp)
        launchers: dict[str, str] = {}
        c_files: list[Path] = []
        headers: list[str] = []
        prefixes: list[str] = []
        for m, kernels in sorted(kernels_by_module.items()):
            prefix = f"{name}_k{m}"
            res = export_c(**{"out_dir": work, "prefix": prefix, "archs": archs, **cuda_sources[m],
                              "kernels": [f"{_ident(k)}={k}" for k in kernels]})
            for k in kernels:
                launchers[k] = res.kernels[k]
            c_files.append(Path(res.source))
            headers.append(Path(res.header).name)
            prefixes.append(prefix)
        # one include line per export; the last error of the first export names a failure
        glue = generate_source(specs, cpu_source=cpu_source, export_header=headers[0] if headers else None,
                               export_prefix=prefixes[0] if prefixes else None, launchers=launchers)
        if len(headers) > 1:
            glue = glue.replace(f'#include "{headers[0]}"', "\n".join(f'#include "{h}"' for h in headers))
        digest = hashlib.sha256()
        for part in [__version__, glue, cxx_path, cc_path, *CXX_FLAGS, "|", *C_FLAGS,
                     *(p.read_text() for p in c_files)]:
            digest.update(part.encode() + b"\0")
        key = digest.hexdigest()[:20]
        if out_dir is None:
            from opsmith._config import settings
            dest = settings.cache_path / "ort" / f"{name}-{key}"
        else:
            dest = Path(out_dir)
        lib = dest / f"lib{name}.so"
        manifest_path = dest / f"{name}.json"
        ops_manifest = {}
        for s in specs:
            providers = (["CUDAExecutionProvider"] if any(v.kernel for v in s.variants) else []) + \
                        (["CPUExecutionProvider"] if s.cpu else [])
            ops_manifest[f"{s.domain}.{s.name}"] = {"providers": providers,
                                                    "dtypes": [v.dtype for v in s.variants],
                                                    "inputs": s.inputs, "outputs": s.outputs}
        if lib.exists() and manifest_path.exists():
            try:
                if json.loads(manifest_path.read_text()).get("key") == key:
                    return OrtLibrary(path=lib, manifest=manifest_path, ops=ops_manifest)
            except ValueError:
                pass
        glue_path = work / f"{name}_ort.cpp"
        glue_path.write_text(glue)
        objects = []
        for c in c_files:
            obj = c.with_suffix(".o")
            _run([cc_path, *C_FLAGS, "-c", str(c), "-o", str(obj)], c)
            objects.append(str(obj))
        glue_obj = work / f"{name}_ort.o"
        _run([cxx_path, *CXX_FLAGS, "-I", str(work), "-c",
              str(glue_path), "-o", str(glue_obj)], glue_path)
        built = work / lib.name
        _run([cxx_path, "-shared", "-o", str(built), str(glue_obj), *objects, f"-Wl,-soname,{lib.name}",
              "-Wl,--as-needed", "-ldl", "-lpthread"], glue_path)
        manifest = {"format": MANIFEST_FORMAT, "version": 1, "opsmith": __version__, "key": key,
                    "cxx_flags": list(CXX_FLAGS),
                    "ort_api_version": ORT_API_VERSION, "library": lib.name, "ops": ops_manifest}
        (work / manifest_path.name).write_text(json.dumps(manifest, indent=1) + "\n")
        dest.mkdir(parents=True, exist_ok=True)
        for f in [built, work / manifest_path.name, glue_path, *(work / h for h in headers), *c_files]:
            tmp_dest = dest / f".{f.name}.{os.getpid()}.tmp"
            shutil.copyfile(f, tmp_dest)
            os.replace(tmp_dest, dest / f.name)
    log.info("built %s (%d ops)", lib, len(specs))
    return OrtLibrary(path=lib, manifest=manifest_path, ops=ops_manifest)
