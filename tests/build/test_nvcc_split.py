"""nvcc's phases as separate ninja steps (opsmith/_nvcc_split.py): the dry-run parser on a
recorded dry run, a small .cu built through the split steps against plain nvcc (symbols,
device code, depfile), a compile error at the user's line, the wiring in the build, and a
torch-including .cu on a GPU.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from opsmith._build import _nvcc_split
from opsmith._build._nvcc_split import parse_dryrun, split_steps

# `nvcc -std=c++17 -MD -MF /b/k.o.d -c /b/k.cu -o /b/k.o -arch=sm_90 --dryrun` (nvcc 13.0)
DRYRUN = r'''#$ _NVVM_BRANCH_=nvvm
#$ _HERE_=/usr/local/cuda-13.0/bin
#$ TOP=/usr/local/cuda-13.0/bin/..
#$ CICC_PATH=/usr/local/cuda-13.0/bin/../nvvm/bin
#$ NVVMIR_LIBRARY_DIR=/usr/local/cuda-13.0/bin/../nvvm/libdevice
#$ LD_LIBRARY_PATH=/usr/local/cuda-13.0/bin/../lib:
#$ PATH=/usr/local/cuda-13.0/bin/../nvvm/bin:/usr/local/cuda-13.0/bin:/usr/bin:/bin
#$ INCLUDES="-I/usr/local/cuda-13.0/bin/../targets/x86_64-linux/include"  
#$ CUDAFE_FLAGS=
#$ gcc -std=c++17 -D__CUDA_ARCH__=900 -D__CUDA_ARCH_LIST__=900 -E -x c++  -DCUDA_DOUBLE_MATH_FUNCTIONS -D__CUDACC__ -D__NVCC__  "-I/usr/local/cuda-13.0/bin/../targets/x86_64-linux/include"   -D__CUDACC_VER_MAJOR__=13 -D__CUDACC_VER_MINOR__=0 -include "cuda_runtime.h" -m64 "/b/k.cu" -o "/tmp/tmpxft_0000664e_00000000-7_k.cpp1.ii" 
#$ gcc -std=c++17 -D__CUDA_ARCH_LIST__=900 -E -x c++ -D__CUDACC__ -D__NVCC__  "-I/usr/local/cuda-13.0/bin/../targets/x86_64-linux/include"   -D__CUDACC_VER_MAJOR__=13 -D__CUDACC_VER_MINOR__=0 -include "cuda_runtime.h" -m64 "/b/k.cu" -o "/tmp/tmpxft_0000664e_00000000-5_k.cpp4.ii" 
#$ -- Filter Dependencies -- > /b/k.o.d
#$ cudafe++ --c++17 --static-host-stub --device-hidden-visibility --gnu_version=120200 --display_error_number --orig_src_file_name "/b/k.cu" --orig_src_path_name "/b/k.cu" --allow_managed  --m64 --parse_templates --gen_c_file_name "/tmp/tmpxft_0000664e_00000000-6_k.cudafe1.cpp" --stub_file_name "tmpxft_0000664e_00000000-6_k.cudafe1.stub.c" --gen_module_id_file --module_id_file_name "/tmp/tmpxft_0000664e_00000000-4_k.module_id" "/tmp/tmpxft_0000664e_00000000-5_k.cpp4.ii" 
#$ "$CICC_PATH/cicc" --c++17 --static-host-stub --device-hidden-visibility --gnu_version=120200 --display_error_number --orig_src_file_name "/b/k.cu" --orig_src_path_name "/b/k.cu" --allow_managed   -arch compute_90 -m64 --no-version-ident -ftz=0 -prec_div=1 -prec_sqrt=1 -fmad=1 --include_file_name "tmpxft_0000664e_00000000-3_k.fatbin.c" -tused --module_id_file_name "/tmp/tmpxft_0000664e_00000000-4_k.module_id" --gen_c_file_name "/tmp/tmpxft_0000664e_00000000-6_k.cudafe1.c" --stub_file_name "/tmp/tmpxft_0000664e_00000000-6_k.cudafe1.stub.c" --gen_device_file_name "/tmp/tmpxft_0000664e_00000000-6_k.cudafe1.gpu"  "/tmp/tmpxft_0000664e_00000000-7_k.cpp1.ii" -o "/tmp/tmpxft_0000664e_00000000-6_k.ptx"
#$ ptxas -arch=sm_90 -m64  "/tmp/tmpxft_0000664e_00000000-6_k.ptx"  -o "/tmp/tmpxft_0000664e_00000000-8_k.sm_90.cubin" 
#$ fatbinary -64 --cicc-cmdline="-ftz=0 -prec_div=1 -prec_sqrt=1 -fmad=1 " "--image3=kind=elf,sm=90,file=/tmp/tmpxft_0000664e_00000000-8_k.sm_90.cubin" "--image3=kind=ptx,sm=90,file=/tmp/tmpxft_0000664e_00000000-6_k.ptx" --embedded-fatbin="/tmp/tmpxft_0000664e_00000000-3_k.fatbin.c" 
#$ rm /tmp/tmpxft_0000664e_00000000-3_k.fatbin
#$ gcc -std=c++17 -D__CUDA_ARCH__=900 -D__CUDA_ARCH_LIST__=900 -c -x c++  -DCUDA_DOUBLE_MATH_FUNCTIONS -Wno-psabi "-I/usr/local/cuda-13.0/bin/../targets/x86_64-linux/include"   -m64 "/tmp/tmpxft_0000664e_00000000-6_k.cudafe1.cpp" -o "/b/k.o" 
'''

KERNEL = r"""#include <cuda_runtime.h>
namespace { __device__ int bias; __global__ void hidden(float* x) { x[0] += bias; } }
__device__ float scale;
__global__ void twice(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * 2.f + scale;
}
void launch_twice(float* x, int n) { twice<<<(n + 255) / 256, 256>>>(x, n); hidden<<<1, 1>>>(x); }
"""


def _nvcc_or_skip() -> str:
    from opsmith._errors import ToolchainError
    from opsmith._toolchain._nvcc import locate_nvcc
    try:
        return locate_nvcc()[0]
    except ToolchainError as exc:
        pytest.skip(f"no nvcc here ({str(exc)[:80]}...): pip install nvidia-cuda-nvcc nvidia-cuda-cccl")


# --- the dry-run parser --------------------------------------------------------------------

def test_recorded_dryrun_parses_into_the_known_phases():
    env, phases, depfile = parse_dryrun(DRYRUN)
    assert [p.kind for p in phases] == ["device-pp", "host-pp", "cudafe++", "cicc", "ptxas",
                                       "fatbinary", "host-cc"]
    assert depfile == "/b/k.o.d"
    assert env["CICC_PATH"] == "/usr/local/cuda-13.0/bin/../nvvm/bin"
    cicc = phases[3]
    assert cicc.argv[0] == "/usr/local/cuda-13.0/bin/../nvvm/bin/cicc"  # $CICC_PATH expanded
    assert cicc.option("--stub_file_name").endswith("k.cudafe1.stub.c")
    assert phases[4].option("-arch") == "sm_90"


@pytest.mark.parametrize("change", [
    lambda t: t + "#$ nvlink --arch=sm_90 /tmp/tmpxft_0000664e_00000000-9_k.o\n",   # unknown phase
    lambda t: t.replace("--gen_module_id_file ", ""),                                 # no module id
    lambda t: t.replace("-D__CUDACC_VER_MAJOR__=13", "-D__CUDACC_VER_MAJOR__=11"),    # old nvcc
    lambda t: t.replace("--static-host-stub", "--static-host-stub --device-c"),        # -rdc
    lambda t: t.replace('"$CICC_PATH/cicc"', '"$NOWHERE/cicc"'),                       # unknown $VAR
    lambda t: t.replace("#$ cudafe++", "#$ cudafe"),                                  # old front end
    lambda t: t.replace("#$ ptxas", "#$ ptxas -arch=sm_90 x | tee y\n#$ ptxas"),       # a pipe
])
def test_anything_unrecognised_gives_none(change):
    assert parse_dryrun(change(DRYRUN)) is None


def test_module_id_has_nvccs_shape_and_depends_on_the_unit():
    a = _nvcc_split.module_id("/x/relu.cu", b"one")
    assert re.fullmatch(r"_[0-9a-f]{8}_7_relu_cu_[0-9a-f]{8}", a)
    assert a != _nvcc_split.module_id("/x/relu.cu", b"two")


# --- against plain nvcc --------------------------------------------------------------------

def _symbols(obj: Path, mid: str) -> list[str]:
    """``nm`` rows (kind, name) with the module id, and the lengths it changes, normalised."""
    out = subprocess.run(["nm", os.fspath(obj)], capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.splitlines():
        row = line[17:] if line[:1] in "0123456789abcdef" else line.strip()
        row = re.sub(r"_GLOBAL__sub_I_\S+", "_GLOBAL__sub_I_", row.replace(mid, "MID"))
        rows.append(re.sub(r"\d+(?=[A-Za-z_])", "#", row))
    return sorted(rows)


def _split_build(tmp_path: Path, src: Path, flags: list[str]):
    from opsmith._build._ninja import run_steps
    nvcc = _nvcc_or_skip()
    out = tmp_path / "split"
    out.mkdir(exist_ok=True)
    obj = out / (src.stem + ".o")
    cmd = [nvcc, *flags, "-MD", "-MF", f"{obj}.d", "-c", os.fspath(src), "-o", os.fspath(obj)]
    steps = split_steps(cmd, os.fspath(src), os.fspath(obj), f"{obj}.d", out / "work", "compile k.cu")
    assert steps is not None and steps[-1].output == os.fspath(obj)
    result = run_steps(out, steps, jobs=2, log_path=out / "log")
    return obj, steps, result


def _module_id_of_nvcc_object(obj: Path) -> str:
    """The module id nvcc chose, read from an anonymous namespace's mangled name."""
    data = obj.read_bytes()
    m = re.search(rb"N(\d+)(_GLOBAL__N_)", data)
    assert m, "no anonymous namespace in nvcc's object"
    return data[m.end(1):m.end(1) + int(m[1])][len(b"_GLOBAL__N_"):].decode()


def test_split_object_matches_plain_nvcc(tmp_path):
    nvcc = _nvcc_or_skip()
    src = tmp_path / "k.cu"
    src.write_text('#ifdef __CUDA_ARCH__\n#include "dev_only.h"\n#endif\n' + KERNEL)
    (tmp_path / "dev_only.h").write_text("#define DEV_ONLY 1\n")
    flags = ["-std=c++17", "-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90,code=sm_90",
             "-gencode=arch=compute_90,code=compute_90", "--threads", "2", "-Xcompiler", "-fPIC"]
    obj, steps, result = _split_build(tmp_path, src, flags)
    assert result.ok, result.output
    kinds = " ".join(s.label for s in steps)
    assert "cudafe++" in kinds and "cicc compute_80" in kinds and "cicc compute_90" in kinds
    # cudafe++ and cicc do not wait for each other
    by_out = {s.output: s for s in steps}
    cudafe = next(s for s in steps if "cudafe++" in s.label)
    cicc = [s for s in steps if "(cicc" in s.label]
    assert all(by_out[i].label.endswith("preprocess device)") for c in cicc for i in c.inputs)
    assert [by_out[i].label for i in cudafe.inputs] == ["compile k.cu (preprocess host)"]

    ref = tmp_path / "ref.o"
    subprocess.run([nvcc, *flags, "-MD", "-MF", f"{ref}.d", "-c", os.fspath(src), "-o", os.fspath(ref)],
                   check=True, capture_output=True)
    ours_mid = (tmp_path / "split" / "work" / "k.module_id").read_text()
    assert _symbols(obj, ours_mid) == _symbols(ref, _module_id_of_nvcc_object(ref))

    # the depfile means what nvcc's means: the object, the source, host and device headers
    from opsmith._cache._deps import parse_depfile
    ours = parse_depfile(Path(f"{obj}.d").read_text())
    theirs = parse_depfile(Path(f"{ref}.d").read_text())
    assert Path(f"{obj}.d").read_text().startswith(f"{obj}:")
    assert {os.path.realpath(p) for p in ours} == {os.path.realpath(os.path.join(os.getcwd(), p))
                                                   for p in theirs}
    assert any(p.endswith("dev_only.h") for p in ours)

    cuobjdump = shutil.which("cuobjdump")
    if cuobjdump:
        listing = [subprocess.run([cuobjdump, "-lelf", "-lptx", os.fspath(o)], capture_output=True,
                                  text=True).stdout.replace(o.stem, "X") for o in (obj, ref)]
        assert listing[0] == listing[1] and "sm_80" in listing[0]


def test_compile_error_is_reported_at_the_users_line(tmp_path):
    from opsmith._build import _diagnostics
    src = tmp_path / "bad.cu"
    src.write_text(KERNEL.replace("x[i] * 2.f", "undefined_thing(x[i])"))
    _obj, _steps, result = _split_build(tmp_path, src, ["-std=c++17", "-arch=sm_90"])
    assert not result.ok
    err = _diagnostics.compile_error(result.failed_output or result.output,
                                     command=list(result.failed_step.command), sources={os.fspath(src): src.read_text()},
                                     log_path=os.fspath(tmp_path / "log"), options=[], what="building bad")
    assert err.line == 6 and err.source.endswith("bad.cu"), str(err)
    assert "undefined_thing" in str(err).splitlines()[0]


def test_the_build_uses_the_split_for_torch_including_cu(tmp_path, monkeypatch):
    """Through opsmith.build: steps split (a small .cu stands in for a torch one), errors mapped."""
    pytest.importorskip("torch")
    _nvcc_or_skip()
    import opsmith
    from opsmith._toolchain import _archs
    from opsmith._toolchain import _nvcc
    from opsmith._errors import CompileError
    monkeypatch.setattr(_archs, "visible_gpu_archs", lambda store=None: [])
    monkeypatch.setattr(_nvcc, "includes_torch_headers", lambda text: True)
    made = []
    real = _nvcc_split.split_steps
    monkeypatch.setattr(_nvcc_split, "split_steps", lambda *a, **k: made.append(real(*a, **k)) or made[-1])
    src = tmp_path / "prog.cu"
    src.write_text(KERNEL + '#include <cstdio>\nint main() { std::printf("ok\\n"); return 0; }\n')
    art = opsmith.build("prog", [str(src)], is_standalone=True, is_python_module=False)
    assert made and made[-1] is not None and art.built
    assert subprocess.run([os.fspath(art.path)], capture_output=True, text=True).stdout == "ok\n"

    bad = tmp_path / "bad.cu"
    bad.write_text(KERNEL.replace("x[i] * 2.f", "undefined_thing(x[i])") + "int main() { return 0; }\n")
    with pytest.raises(CompileError) as ei:
        opsmith.build("bad", [str(bad)], is_standalone=True, is_python_module=False)
    assert ei.value.line == 6 and str(ei.value).splitlines()[0].startswith(f"{bad}:6"), str(ei.value)

    made.clear()
    monkeypatch.setenv("OPSMITH_NVCC_SPLIT", "0")
    src.write_text(src.read_text() + "// again\n")
    assert opsmith.build("prog", [str(src)], is_standalone=True, is_python_module=False).built
    assert made == []


# --- on a GPU ------------------------------------------------------------------------------

RELU_CU = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>
__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { float v = x[i]; y[i] = v > 0.f ? v : 0.f; }
}
torch::Tensor relu(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.is_contiguous() && x.scalar_type() == torch::kFloat);
    auto y = torch::full_like(x, std::numeric_limits<float>::quiet_NaN());
    long n = x.numel();
    relu_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""


@pytest.mark.gpu
def test_torch_including_cu_built_split_matches_torch(monkeypatch):
    torch = pytest.importorskip("torch")
    import uuid
    import opsmith
    made = []
    real = _nvcc_split.split_steps
    monkeypatch.setattr(_nvcc_split, "split_steps", lambda *a, **k: made.append(real(*a, **k)) or made[-1])
    ext = opsmith.load_inline("split_relu", cpp_sources="torch::Tensor relu(torch::Tensor x);",
                              cuda_sources=RELU_CU + f"// {uuid.uuid4().hex}\n", functions=["relu"])
    assert made and made[-1] is not None, "the torch-including .cu was not built through split steps"
    for n in (1, 255, 256, 257, 100_003):
        x = torch.randn(n, device="cuda")
        y = ext.relu(x)
        torch.cuda.synchronize()
        assert torch.equal(y, torch.relu(x)), f"wrong result for n={n}"
