"""opsmith package end to end on CPU: the tutorial's ReLU package (examples/package_relu) built
into a reproducible wheel, pip-installed, imported in a fresh process with no compiler on PATH
and NVRTC unimportable (zero compiles: schemas, CPU implementation, autograd, fake kernel,
opcheck), signed and tampered; opsmith.ops' kernels as a package; the arch choice; errors."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("cuda.bindings.nvrtc")

from opsmith._build import _prebuilt
from opsmith._errors import CacheError, OpsmithError, SpecError
from opsmith.package import _wheel, load_package

ROOT = Path(__file__).resolve().parents[2]
CHECK = Path(__file__).with_name("installed_check.py")


def _opsmith(args, cwd, env=None, check=True):
    r = subprocess.run([sys.executable, "-m", "opsmith", *args], cwd=cwd, capture_output=True, text=True,
                       env={**os.environ, **(env or {})}, timeout=900, check=False)
    if check:
        assert r.returncode == 0, r.stdout + r.stderr
    return r


@pytest.fixture(scope="module")
def built(relu_package):
    """The ReLU package (tests/conftest.py's, sm_80 and sm_90) built again from its cache into another folder,
    signed with a new key, and the signed one again from an empty cache."""
    tmp = relu_package["tmp"]
    key = tmp / "package.key"
    key.write_bytes(os.urandom(32).hex().encode())
    key.chmod(0o600)
    src, env = relu_package["src"], relu_package["env"]
    again = json.loads(_opsmith(["package", "relupkg", "-o", str(tmp / "b"), "--arch", "sm_80,sm_90", "--json"],
                                src, env).stdout)
    full = ["package", "relupkg", "--arch", "sm_90", "--sign", str(key), "--with", "c", "--with", "onnxruntime",
            "--json"]
    signed = json.loads(_opsmith([*full, "-o", str(tmp / "s")], src, env).stdout)
    # the same again from an empty cache into another folder: every library rebuilt elsewhere
    signed_again = json.loads(_opsmith([*full, "-o", str(tmp / "s2")], src,
                                       {"OPSMITH_CACHE_DIR": str(tmp / "cache2")}).stdout)
    return {"tmp": tmp, "out": relu_package["out"], "again": again, "signed": signed, "signed_again": signed_again,
            "key": key}


def _no_compiler_env(tmp: Path) -> dict:
    """PATH an empty folder (no cc, c++, g++, clang, nvcc; python runs by its own path, which a
    venv's needs), a fresh cache, no fixed arch."""
    bin_dir = tmp / "nobin"
    bin_dir.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("OPSMITH_CUDA_ARCH", "CC", "CXX", "CUDA_HOME")}
    env.update(PATH=str(bin_dir), OPSMITH_CACHE_DIR=str(tmp / "fresh-cache"))
    return env


def _install(wheel: str, site: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site),
                    wheel], check=True, capture_output=True, timeout=300)


def test_the_wheel_is_reproducible_and_holds_the_kernels_for_each_arch(built):
    out = built["out"]
    assert Path(out["wheel"]).name == "relupkg-1.0.0-py3-none-manylinux_2_28_x86_64.whl"
    assert Path(out["wheel"]).read_bytes() == Path(built["again"]["wheel"]).read_bytes()
    assert out["archs"] == ["sm_80", "sm_90", "compute_90"] and out["kernels"] == 1
    assert out["ops"] == ["relupkg::relu_backward", "relupkg::relu"] or sorted(out["ops"]) == [
        "relupkg::relu", "relupkg::relu_backward"]
    files = _wheel.read_wheel(out["wheel"])  # every RECORD hash checks
    manifest = json.loads(files["relupkg/_opsmith/manifest.json"])
    assert set(manifest["kernels"][0]["binaries"]) == {"sm_80", "sm_90", "compute_90"}
    assert "relupkg/_opsmith/lib/opsmith_cshim.so" in files and "relupkg/relu_common.cuh" in files
    assert files["relupkg/_opsmith/kernels/" + manifest["kernels"][0]["binaries"]["sm_90"]["file"].split("/")[-1]][:4] \
        == b"\x7fELF"


def test_a_wheel_with_c_and_onnxruntime_is_reproducible(built):
    """Built twice, from two caches into two folders: the same bytes (the C and ONNX Runtime
    libraries record no build path)."""
    a, b = Path(built["signed"]["wheel"]), Path(built["signed_again"]["wheel"])
    assert a.parent != b.parent and a.read_bytes() == b.read_bytes()


def test_with_c_ships_the_export_c_library(built):
    files = _wheel.read_wheel(built["signed"]["wheel"])
    manifest = json.loads(files["relupkg/_opsmith/manifest.json"])
    assert sorted(manifest["c"]) == ["librelupkg.so", "relupkg.c", "relupkg.h", "relupkg.json"]
    header = files["relupkg/_opsmith/c/relupkg.h"].decode()
    assert "opsmith_relupkg_relu_fwd_launch" in header and "opsmith_relupkg_relu_bwd_launch" in header
    export = json.loads(files["relupkg/_opsmith/c/relupkg.json"])
    assert export["modules"][0]["name"] == "relu_kernel.cu"  # no build-machine path in the wheel
    assert files["relupkg/_opsmith/c/librelupkg.so"][:4] == b"\x7fELF"


def test_with_onnxruntime_ships_a_library_ort_runs(built, tmp_path):
    """The wheel's ONNX Runtime library (CPU functions from relupkg's __opsmith_onnx__; the kernel
    file's own header resolved) in a real ONNX Runtime session: ReLU bit for bit."""
    np = pytest.importorskip("numpy")
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    import opsmith.onnx
    pkg = _unpacked(built["signed"]["wheel"], tmp_path / "w")
    manifest = json.loads((pkg / "_opsmith" / "manifest.json").read_text())
    assert sorted(manifest["onnxruntime"]) == ["librelupkg.so", "relupkg.json"]
    ort_manifest = json.loads((pkg / "_opsmith" / "onnxruntime" / "relupkg.json").read_text())
    assert ort_manifest["ops"]["relupkg.relu"]["providers"] == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    from onnx import helper
    node = helper.make_node("relu", ["x"], ["y"], domain="relupkg")
    graph = helper.make_graph([node], "one", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n"])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("relupkg", 1)],
                              ir_version=9).SerializeToString()
    sess = opsmith.onnx.inference_session(model, str(pkg / "_opsmith" / "onnxruntime" / "librelupkg.so"))
    x = np.random.default_rng(0).standard_normal(100_003).astype(np.float32)
    assert np.array_equal(sess.run(None, {"x": x})[0], np.maximum(x, 0))


def test_installed_package_runs_with_zero_compiles(built, tmp_path):
    site = tmp_path / "site"
    _install(built["out"]["wheel"], site)
    env = _no_compiler_env(tmp_path)
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT)])
    r = subprocess.run([sys.executable, str(CHECK), "relupkg", "--block-nvrtc"], cwd=tmp_path,
                       capture_output=True, text=True, env=env, timeout=300, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["nvrtc"] == {"compiles": 0, "library_loads": 0}, got
    assert got["prebuilt"]["kernels"] >= 1 and got["packages"] == ["relupkg"]
    assert got["ops"] == {"relupkg::relu": "relu(Tensor x) -> Tensor",
                          "relupkg::relu_backward": "relu_backward(Tensor grad, Tensor x) -> Tensor"}
    assert got["cpu_ok"] and got["fake_ok"] and got.get("opcheck", "passed") == "passed"
    assert got["module"].startswith(str(site))
    assert "no C++ compiler" not in r.stderr  # nothing tried to build (the native libraries: cache only)


def _unpacked(wheel: str, dest: Path) -> Path:
    for name, data in _wheel.read_wheel(wheel).items():
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        (dest / name).write_bytes(data)
    return dest / "relupkg"


def test_signature_and_tampering(built, tmp_path):
    _prebuilt.reset()
    try:
        pkg = _unpacked(built["signed"]["wheel"], tmp_path / "signed")
        assert load_package(pkg, key=built["key"]).signed
        other = tmp_path / "other.key"
        other.write_bytes(b"another-key-of-enough-bytes-0123456789")
        other.chmod(0o600)
        with pytest.raises(CacheError, match="does not match its signature"):
            load_package(pkg, key=other)
        plain = _unpacked(built["out"]["wheel"], tmp_path / "plain")
        with pytest.raises(CacheError, match="unsigned"):
            load_package(plain, key=built["key"])  # a key demands a signature
        manifest = pkg / "_opsmith" / "manifest.json"
        manifest.write_bytes(manifest.read_bytes().replace(b'"1.0.0"', b'"1.0.1"'))
        with pytest.raises(CacheError, match="tampered"):
            load_package(pkg, key=built["key"])
        # a payload file changed under an unsigned manifest: refused when read
        p = load_package(plain)
        entry = p.manifest["kernels"][0]["binaries"]["sm_90"]
        cubin = plain / "_opsmith" / entry["file"]
        data = bytearray(cubin.read_bytes())
        data[100] ^= 0xFF
        cubin.write_bytes(bytes(data))
        with pytest.raises(CacheError, match="does not match its manifest"):
            p.read(entry)
    finally:
        _prebuilt.reset()


def test_a_package_from_a_newer_opsmith_says_upgrade(tmp_path):
    folder = tmp_path / "pkg" / "_opsmith"
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({"format": _prebuilt.FORMAT + 1, "opsmith": "9.0"}))
    with pytest.raises(OpsmithError, match=r"built by opsmith 9\.0.*pip install -U opsmith"):
        load_package(tmp_path / "pkg")
    with pytest.raises(SpecError, match="neither an installed opsmith package"):
        load_package(tmp_path / "nowhere")


@pytest.mark.parametrize("arch, have, want", [
    ("sm_90", ["sm_80", "sm_90", "compute_90"], "sm_90"),
    ("sm_86", ["sm_80", "sm_90", "compute_90"], "sm_80"),       # an older cubin of the same major
    ("sm_89", ["sm_75", "sm_86", "compute_86"], "sm_86"),
    ("sm_100", ["sm_80", "sm_90", "compute_90"], "compute_90"),  # a newer GPU: the PTX
    ("sm_75", ["sm_80", "sm_90", "compute_90"], None),           # older than everything
    ("sm_90a", ["sm_80", "sm_90", "compute_90"], "sm_90"),
])
def test_arch_choice(arch, have, want):
    assert _prebuilt._choose({a: {} for a in have}, arch, "cubin") == want


def test_opsmith_ops_kernels_as_a_package(ops_package, tmp_path):
    """The op library's programs for one arch (a file and a dtype each; tests/conftest.py's wheel); installed, each
    of its CudaModules loads its names from the package with NVRTC unimportable."""
    out = ops_package
    from opsmith.ops import _sources
    programs = len(_sources.FILES) * len(_sources.DTYPES)
    assert Path(out["wheel"]).name.startswith("opsmith_ops_kernels-") and out["kernels"] == programs
    site = tmp_path / "site"
    _install(out["wheel"], site)
    script = (f"import sys; sys.path.insert(0, {str(site)!r}); exec(open({str(CHECK)!r}).read().split('def main')[0]);"
              "sys.meta_path.insert(0, _NoNvrtc());"
              "from opsmith.ops import _sources; from opsmith._torch._cuda_module import CudaModule;"
              "from opsmith._build import _nvrtc, _prebuilt;"
              "mods = [CudaModule(_sources.KERNEL_DIR / f, name_expressions=_sources.kernel_names(f, d), arch='sm_90',"
              " name=f'opsmith/ops/kernels/{f}') for f in _sources.FILES for d in _sources.DTYPES];"
              "print(len(mods), _nvrtc.nvrtc_stats['compiles'], _prebuilt.prebuilt_stats['kernels'])")
    env = _no_compiler_env(tmp_path)
    env["PYTHONPATH"] = str(ROOT)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                       timeout=300, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.split()[:2] == [str(programs), "0"], r.stdout


def test_errors_name_the_fix(tmp_path):
    (tmp_path / "single.py").write_text("x = 1\n")
    (tmp_path / "nokernels").mkdir()
    (tmp_path / "nokernels" / "__init__.py").write_text("import opsmith\n")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "__init__.py").write_text("raise RuntimeError('boom in user code')\n")
    env = {"OPSMITH_CACHE_DIR": str(tmp_path / "cache")}
    cases = {"missing_mod": "no module 'missing_mod' on sys.path", "single": "is a single file",
             "nokernels": "compiled no CUDA kernel", "broken": "boom in user code"}
    for module, text in cases.items():
        r = _opsmith(["package", module, "--arch", "sm_90"], tmp_path, env, check=False)
        assert r.returncode != 0 and text in r.stderr, (module, r.stderr[-2000:])
    r = _opsmith(["package"], tmp_path, env, check=False)
    assert r.returncode != 0 and "a MODULE" in r.stderr


_TWO_VERSIONS = r'''
import importlib.abc, importlib.util, json, sys


class NoNvrtc(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "cuda.bindings.nvrtc" or name.startswith("nvidia.cuda_nvrtc"):
            raise ImportError(name + " is blocked: this process plays a machine without NVRTC")


sys.meta_path.insert(0, NoNvrtc())
site1, site2 = sys.argv[1], sys.argv[2]
sys.path.insert(0, site1)
import torch
import relupkg as v1  # version 1, installed
# version 2, vendored under another module name (as a library that bundles its own copy would)
spec = importlib.util.spec_from_file_location("vendored_relupkg", site2 + "/relupkg/__init__.py",
                                              submodule_search_locations=[site2 + "/relupkg"])
v2 = importlib.util.module_from_spec(spec)
sys.modules["vendored_relupkg"] = v2
spec.loader.exec_module(v2)
from opsmith._build import _nvrtc
out = {"versions": [v1.__version__, v2.__version__], "names": [], "ok": []}
for mod in (v1, v2):
    x = torch.randn(1000, requires_grad=True)
    y = mod.relu(x)
    y.square().sum().backward()
    out["names"].append(str(mod.relu.default._schema).split("(")[0])
    out["ok"].append(bool(torch.equal(y, x.clamp_min(0)) and torch.equal(x.grad, 2 * x.clamp_min(0) * (x > 0))))
out["torch_ops"] = [hasattr(torch.ops.relupkg_1_0_0, "relu"), hasattr(torch.ops.relupkg_2_0_0, "relu_backward"),
                    hasattr(torch.ops.relupkg, "relu")]
out["nvrtc"] = dict(_nvrtc.nvrtc_stats)
print(json.dumps(out))
'''


def test_two_versions_of_a_package_in_one_process(tmp_path):
    """opsmith package --versioned-namespace: version 1.0.0 installed and 2.0.0 vendored under
    another module name load side by side (relupkg_1_0_0::relu, relupkg_2_0_0::relu), with zero
    compiles; without the option the second version's ops are refused with a message naming it."""
    import re
    env = {"OPSMITH_CACHE_DIR": str(tmp_path / "cache")}
    sites = {}
    for version, flag in (("1.0.0", True), ("2.0.0", True), ("3.0.0", False)):
        src = tmp_path / f"src-{version}"
        shutil.copytree(ROOT / "examples" / "package_relu", src)
        init = src / "relupkg" / "__init__.py"
        init.write_text(re.sub(r'__version__ = "[^"]+"', f'__version__ = "{version}"', init.read_text()))
        args = ["package", "relupkg", "-o", str(tmp_path / f"w-{version}"), "--arch", "sm_90", "--no-ptx", "--json"]
        out = json.loads(_opsmith([*args, *(["--versioned-namespace"] if flag else [])], src, env).stdout)
        ns = f"relupkg_{version.replace('.', '_')}"
        assert out["namespaces"] == ({"relupkg": ns} if flag else {})
        manifest = json.loads(_wheel.read_wheel(out["wheel"])["relupkg/_opsmith/manifest.json"])
        assert manifest.get("namespaces") == ({"relupkg": ns} if flag else None)
        sites[version] = tmp_path / f"site-{version}"
        _install(out["wheel"], sites[version])
    script = tmp_path / "two.py"
    script.write_text(_TWO_VERSIONS)
    env = _no_compiler_env(tmp_path)
    env["PYTHONPATH"] = str(ROOT)
    r = subprocess.run([sys.executable, str(script), str(sites["1.0.0"]), str(sites["2.0.0"])], cwd=tmp_path,
                       capture_output=True, text=True, env=env, timeout=300, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["versions"] == ["1.0.0", "2.0.0"]
    assert got["names"] == ["relupkg_1_0_0::relu", "relupkg_2_0_0::relu"] and got["ok"] == [True, True]
    assert got["torch_ops"] == [True, True, False]
    assert got["nvrtc"]["compiles"] == 0, got
    # two unversioned builds (3.0.0 installed, 3.0.0 vendored): refused, and the message says what to do
    r = subprocess.run([sys.executable, str(script), str(sites["3.0.0"]), str(sites["3.0.0"])], cwd=tmp_path,
                       capture_output=True, text=True, env=env, timeout=300, check=False)
    assert r.returncode != 0 and "already registered" in r.stderr and "--versioned-namespace" in r.stderr, r.stderr


def test_versioned_namespace_needs_ops_of_the_module(tmp_path):
    r = _opsmith(["package", "--ops", "--versioned-namespace"], tmp_path, {"OPSMITH_CACHE_DIR": str(tmp_path / "c")},
                 check=False)
    assert r.returncode != 0 and "leave --versioned-namespace out" in r.stderr


def test_kernels_from_two_nvrtcs_are_refused(tmp_path, monkeypatch):
    """A process whose compile workers load another libnvrtc than its own (one preloaded by hand)
    would ship a wheel whose manifest names one NVRTC and whose cubins came from two: refused,
    with the fix."""
    from opsmith._build import _archs_compile
    from opsmith._errors import ToolchainError
    from opsmith.package import build_package
    real = _archs_compile.compile_all

    def two_nvrtcs(jobs, *a, **k):
        out = list(real(jobs, *a, **k))
        return [out[0]._replace(nvrtc_version="12.9"), *out[1:]] if out[0].nvrtc_version != "12.9" else \
            [out[0]._replace(nvrtc_version="13.5"), *out[1:]]
    monkeypatch.setattr(_archs_compile, "compile_all", two_nvrtcs)
    monkeypatch.setenv("OPSMITH_CACHE_DIR", str(tmp_path / "cache"))
    shutil.copytree(ROOT / "examples" / "package_relu", tmp_path / "src")
    monkeypatch.chdir(tmp_path / "src")  # where `opsmith package relupkg` runs (its import is recorded there)
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    with pytest.raises(ToolchainError, match=r"more than one NVRTC .*nvidia-cuda-nvrtc-cu12"):
        build_package("relupkg", out_dir=tmp_path / "dist", archs=["sm_80", "sm_90"])
    assert not (tmp_path / "dist").exists() or not list((tmp_path / "dist").iterdir())
