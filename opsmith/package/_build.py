"""``opsmith package``: a module of ops (or opsmith.ops) to one wheel that runs with no compile.

Data flow::

    MODULE ──(fresh process: python -m opsmith._torch._package_record MODULE)──► what its import
        compiles (NVRTC requests) and builds (the C-shim op library), and the ops it defines
    requests × archs ──(_build._archs_compile.compile_all: the store, NVRTC in parallel)──► cubins
        for each arch, PTX of the newest
    the package's files + _opsmith/{manifest.json, manifest.sig, kernels/*, lib/*}
        ──(_wheel.write_wheel: sorted, fixed times)──► <dist>-<version>-py3-none-manylinux_2_28_x86_64.whl

On the machine that installs it, :mod:`opsmith._build._prebuilt` finds the package through its
``opsmith.packages`` entry point and serves every compile of those kernels, and the C-shim
library, from the wheel's files.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

from opsmith._errors import OpsmithError, SpecError, ToolchainError
from opsmith._record import Record

__all__ = ["OPS_PACKAGE", "PackageResult", "build_package"]

OPS_PACKAGE = "opsmith_ops_kernels"  # the Python package of ``opsmith package --ops``' wheel
TAG = "py3-none-manylinux_2_28_x86_64"
_SKIP_DIRS = {"__pycache__", "_opsmith", ".git", "build", "dist"}


class PackageResult(Record):
    """What :func:`build_package` made: the wheel, its kernels per arch, its ops and sizes."""

    __slots__ = ("archs", "kernels", "namespaces", "ops", "package", "seconds", "signed", "sizes", "version", "wheel")


def _package_dir(module: str) -> Path:
    """The folder of the top-level package ``module`` (found, not imported)."""
    from importlib import util
    if "." in module or not module.isidentifier():
        raise SpecError(f"opsmith package takes a top-level package name, got {module!r}")
    spec = util.find_spec(module)
    if spec is None:
        raise SpecError(f"no module {module!r} on sys.path (run opsmith package from the folder that holds "
                        f"it, or pip install -e it first)")
    locations = list(spec.submodule_search_locations or ())
    if not locations:
        raise SpecError(f"{module} is a single file ({spec.origin}); opsmith package ships a package: move it "
                        f"to {module}/__init__.py")
    return Path(locations[0])


def _run_json(cmd: list[str], failure: str, *, lines: int, cwd: Path | None = None, env: dict | None = None,
              path_first: str | None = None) -> dict:
    """Run ``cmd`` (a target's command, in a process: targets never import each other), with
    ``path_first`` (default: the current folder, where the user's module lies) first on
    PYTHONPATH; its JSON answer: all of stdout (``export-c --json`` prints it indented), else its
    last line (after what the user's module printed). A failure raises ``failure`` with the last
    ``lines`` lines it printed."""
    env = {**os.environ, **(env or {})}
    env["PYTHONPATH"] = os.pathsep.join([path_first or os.getcwd(), *filter(None, [env.get("PYTHONPATH")])])
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, check=False)
    if r.returncode != 0:
        tail = "\n".join((r.stderr or r.stdout).strip().splitlines()[-lines:])
        raise OpsmithError(f"{failure} (exit {r.returncode}):\n{tail}")
    out = r.stdout.strip()
    try:
        return json.loads(out)
    except ValueError:
        return json.loads(out.splitlines()[-1])


def _record(module: str, arch: str, ops: bool) -> dict:
    """Run the module's import in a fresh process with its compiles recorded (see the module doc)."""
    runner = "opsmith.ops._package_record" if ops else "opsmith._torch._package_record"
    doc = _run_json([sys.executable, "-m", runner, module, "--arch", arch],
                    f"opsmith package: importing {module} failed; fix the error below and run again", lines=15)
    doc["requests"] = [pickle.loads(base64.b64decode(x)) for x in doc["requests"]]
    return doc


def _c_libraries(requests, pkg: str, targets, work: Path) -> dict[str, bytes]:
    """``--with c``: each recorded program exported as a C library (header, source with the code
    inside, manifest, shared library), through the export-c target's command in a process (a
    target never imports another): files under ``c/`` of ``_opsmith``."""
    cubins = [a for a, kind in targets if kind == "cubin"]
    ptx = any(kind == "ptx" for _, kind in targets)
    files: dict[str, bytes] = {}
    for i, req in enumerate(requests):
        prefix = pkg if len(requests) == 1 else f"{pkg}{i}"
        src = Path(req.name)
        if not (src.is_file() and src.read_text(errors="replace") == req.source):
            src = work / f"{prefix}.cu"
            src.write_text(req.source)
        # the source by its name, run beside it: the export's manifest names no build-machine path
        cmd = [sys.executable, "-m", "opsmith", "export-c", src.name, "--prefix", prefix, "-o", str(work / prefix),
               "--arch", ",".join(cubins), "--ptx" if ptx else "--no-ptx", "--library", "shared", "--json"]
        for name in req.name_expressions:
            cmd += ["-k", name]
        for inc in ([req.source_dir] if req.source_dir else []) + list(req.include_paths):
            cmd += ["-I", str(inc)]
        for name, value in req.defines:
            cmd += ["-D", name if value is None else f"{name}={value}"]
        for opt in req.options:
            cmd.append(f"--option={opt}")
        doc = _run_json(cmd, f"opsmith package --with c: exporting {req.name} failed", lines=10, cwd=src.parent,
                        path_first=str(Path(__file__).resolve().parents[2]))  # this opsmith, from another folder
        for path in doc["files"]:
            files[f"c/{Path(path).name}"] = Path(path).read_bytes()
    return files


def _onnxruntime_library(module: str, pkg: str, targets, work: Path) -> dict[str, bytes]:
    """``--with onnxruntime``: the module's ops as an ONNX Runtime custom-op library (the ONNX
    Runtime target's ``_package_build``, in a process): files under ``onnxruntime/``."""
    cubins = [a for a, kind in targets if kind == "cubin"]
    cmd = [sys.executable, "-m", "opsmith.onnx._package_build", module, str(work / "ort")]
    for a in cubins:
        cmd += ["--arch", a]
    arch = {"OPSMITH_CUDA_ARCH": os.environ.get("OPSMITH_CUDA_ARCH") or cubins[0]}  # the import's kernels, no GPU
    doc = _run_json(cmd, f"opsmith package --with onnxruntime: building {module}'s ONNX Runtime library failed",
                    lines=12, env=arch)
    return {f"onnxruntime/{Path(f).name}": Path(f).read_bytes() for f in doc["files"]}


def _python_files(folder: Path, pkg: str) -> dict[str, bytes]:
    files = {}
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.endswith(".egg-info"))
        for n in sorted(names):
            if n.endswith((".pyc", ".pyo", ".so")):
                continue
            path = Path(root) / n
            files[f"{pkg}/{path.relative_to(folder).as_posix()}"] = path.read_bytes()
    return files


def build_package(module: str, *, out_dir: str | os.PathLike = "dist", archs=None, ptx: bool = True,
                  version: str | None = None, sign: str | os.PathLike | None = None,
                  ops: bool = False, with_c: bool = False, with_onnxruntime: bool = False,
                  versioned_namespace: bool = False) -> PackageResult:
    """Build the wheel of ``module``'s ops (or, with ``ops=True``, of opsmith.ops' kernels).

    Parameters
    ----------
    module : str
        A top-level package that defines ops when imported (``opsmith.custom_op`` over
        ``CudaModule`` kernels); its files go into the wheel as they are.
    archs : list of str or str, optional
        Cubins to ship (default: the common GPUs the installed NVRTC supports, sm_75 … sm_120).
    ptx : bool
        Also ship the PTX of the newest arch (newer GPUs JIT it once).
    version : str, optional
        The wheel's version (default: the package's ``__version__`` if it sets one, else 0.0.0).
    sign : path, optional
        A key file (at least 16 bytes): the manifest is signed with HMAC-SHA256.
    with_c : bool
        Also ship each program as a C library (``opsmith export-c``: a header, the source with
        the code inside, ``lib<name>.so``) under ``_opsmith/c/``, for callers without Python.
    with_onnxruntime : bool
        Also ship the module's ops as an ONNX Runtime custom-op library under
        ``_opsmith/onnxruntime/`` (CPU implementations from the module's ``__opsmith_onnx__``).
    versioned_namespace : bool
        Installed, the package's ops register as ``<namespace>_<version>::<name>``
        (``relupkg_1_0_0::relu``, the manifest's ``namespaces``) instead of the names its code
        gives, so that two versions of one package load in one process (one installed, one
        vendored under another module name). Code reaches them through the op objects its
        ``custom_op`` calls return, or ``torch.ops.relupkg_1_0_0``.
    """
    from opsmith._build._archs_compile import compile_all, resolve_archs
    from opsmith._version import __version__
    from opsmith.package import _manifest, _wheel
    t0 = time.perf_counter()
    if ops and versioned_namespace:
        raise SpecError("opsmith package --ops --versioned-namespace: opsmith.ops' ops are opsmith's own "
                        "(torch.ops.opsmith.*) and are not renamed; leave --versioned-namespace out")
    if ops and archs is None:  # the op library's bfloat16 kernels need sm_80 (as its JIT path does)
        from opsmith._build._archs_compile import default_archs
        from opsmith._runtime._launch_gen import arch_number
        archs = [a for a in default_archs() if arch_number(a) >= 80]
    targets = resolve_archs(archs, ptx)
    if ops:
        pkg, files = OPS_PACKAGE, {f"{OPS_PACKAGE}/__init__.py": b'"""opsmith.ops\' kernels, prebuilt."""\n'}
        recorded = _record("opsmith.ops", targets[0][0], ops=True)
    else:
        folder = _package_dir(module)
        pkg, files = module, _python_files(folder, module)
        recorded = _record(module, targets[0][0], ops=False)
    requests = recorded["requests"]
    if not requests:
        raise SpecError(f"importing {module} compiled no CUDA kernel: a package ships the kernels its import "
                        f"compiles (CudaModule / opsmith.cuda_kernel at module level)")
    jobs = [r._replace(arch=a, output=kind) for r in requests for a, kind in targets]
    binaries = compile_all(jobs)
    _one_nvrtc(binaries)
    payload, kernels = _manifest.kernel_entries(requests, targets, binaries)
    libraries = {}
    for name, lib in sorted(recorded["libraries"].items()):
        data = Path(lib["path"]).read_bytes()
        rel = f"lib/{name}.so"
        payload[rel] = data
        libraries[name] = {"file": rel, "sha256": hashlib.sha256(data).hexdigest(),
                           "source_sha256": lib["source_sha256"]}
    c_entries: dict = {}
    ort_entries: dict = {}
    if with_c or with_onnxruntime:
        import tempfile
        if ops and with_onnxruntime:
            raise SpecError("opsmith package --ops --with onnxruntime: opsmith.ops has no ONNX Runtime library; "
                            "leave --with onnxruntime out")
        with tempfile.TemporaryDirectory(prefix="opsmith-package-") as work:
            extra = {**(_c_libraries(requests, pkg, targets, Path(work)) if with_c else {}),
                     **(_onnxruntime_library(module, pkg, targets, Path(work)) if with_onnxruntime else {})}
        for rel, data in extra.items():
            payload[rel] = data
            entries = c_entries if rel.startswith("c/") else ort_entries
            entries[Path(rel).name] = {"file": rel, "sha256": hashlib.sha256(data).hexdigest()}
    version = version or _package_version(files.get(f"{pkg}/__init__.py", b"")) or "0.0.0"
    shipped = [a if kind == "cubin" else a.replace("sm_", "compute_", 1) for a, kind in targets]
    manifest = _manifest.manifest(pkg, version, kernels, libraries, recorded["ops"],
                                  nvrtc_version=binaries[0].nvrtc_version, archs=shipped)
    namespaces = _versioned_namespaces(recorded["ops"], version) if versioned_namespace else {}
    if namespaces:
        manifest["namespaces"] = namespaces
    if c_entries:
        manifest["c"] = c_entries
    if ort_entries:
        manifest["onnxruntime"] = ort_entries
    text = _manifest.dumps(manifest)
    files[f"{pkg}/_opsmith/manifest.json"] = text
    if sign is not None:
        files[f"{pkg}/_opsmith/manifest.sig"] = _manifest.signature(text, sign)
    for rel, data in payload.items():
        files[f"{pkg}/_opsmith/{rel}"] = data
    dist = "opsmith-ops-kernels" if ops else module
    wheel = _wheel.write_wheel(out_dir, name=dist, version=version, files=files, tag=TAG,
                               requires=[f"opsmith>={__version__}"],
                               entry_points={"opsmith.packages": {pkg: pkg}},
                               summary=f"{module}'s ops, prebuilt by opsmith package")
    sizes = _manifest.sizes(kernels, payload, libraries)
    sizes["wheel"] = os.path.getsize(wheel)
    return PackageResult(wheel=wheel, package=pkg, version=version, archs=shipped,
                         kernels=len(kernels), ops=[o["name"] for o in recorded["ops"]], sizes=sizes,
                         signed=sign is not None, namespaces=namespaces, seconds=time.perf_counter() - t0)


def _one_nvrtc(binaries) -> None:
    """Refuse a package whose kernels came from more than one NVRTC: the manifest names one, and
    the drivers a wheel runs on follow from it (NVRTC 13 output needs a CUDA 13 driver)."""
    found = sorted({b.nvrtc_version for b in binaries})
    if len(found) > 1:
        raise ToolchainError(
            f"the package's kernels were compiled by more than one NVRTC ({', '.join(found)}): this process and "
            f"its compile workers loaded different libnvrtc (one preloaded by hand?). Build with one NVRTC on "
            f"the path: a single cuda-bindings and nvidia-cuda-nvrtc install (for CUDA 12.x drivers, NVRTC 12: "
            f"pip install 'cuda-bindings>=12.8,<13' 'nvidia-cuda-nvrtc-cu12>=12.8'), or LD_PRELOAD the "
            f"libnvrtc.so to use, which the workers inherit")


def _versioned_namespaces(ops: list, version: str) -> dict[str, str]:
    """{namespace: namespace_<version>} for the namespaces of ``ops`` (the version's characters
    other than letters and digits become ``_``: 1.0.0 -> relupkg_1_0_0)."""
    import re
    if not ops:
        raise SpecError("opsmith package --versioned-namespace: the module defined no op (opsmith.custom_op) "
                        "whose namespace could carry the version")
    slug = re.sub(r"[^0-9A-Za-z]", "_", version)
    return {ns: f"{ns}_{slug}" for ns in sorted({o["name"].split("::", 1)[0] for o in ops})}


def _package_version(init: bytes) -> str | None:
    import re
    m = re.search(rb"^__version__\s*=\s*['\"]([^'\"]+)['\"]", init, re.MULTILINE)
    return m.group(1).decode() if m else None
