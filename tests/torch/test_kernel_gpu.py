"""NVRTC kernels on a real GPU: results against torch, streams, bad launches, attributes.

Inputs are random (never zeros) and outputs are poisoned before each launch, so that an
element the kernel failed to write cannot pass.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import opsmith
from opsmith import LaunchConfig, LaunchError

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
POISON = float("nan")

RELU = r"""
extern "C" __global__ void relu(const float* __restrict__ x, float* __restrict__ y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { float v = x[i]; y[i] = v > 0.f ? v : 0.f; }
}
"""

ADD = r"""
extern "C" __global__ void add(const float* a, const float* b, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}
"""

TEMPLATED = r"""
template <typename T>
__global__ void axpy(const T* x, T* y, T a, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""

REDUCE = r"""
// One partial sum per block through dynamic shared memory (tree reduction).
extern "C" __global__ void block_sum(const float* __restrict__ x, float* __restrict__ partial, int n) {
    extern __shared__ float s[];
    int tid = threadIdx.x;
    int i = blockIdx.x * blockDim.x * 2 + tid;
    float v = 0.f;
    if (i < n) v += x[i];
    if (i + blockDim.x < n) v += x[i + blockDim.x];
    s[tid] = v;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
        if (tid < stride) s[tid] += s[tid + stride];
        __syncthreads();
    }
    if (tid == 0) partial[blockIdx.x] = s[0];
}
"""


def _poisoned_like(x):
    return torch.full_like(x, POISON)


@pytest.mark.parametrize("n", [1, 255, 256, 1000, 1 << 20, (1 << 20) + 7])
def test_relu_matches_torch(n):
    k = opsmith.cuda_kernel(RELU, "relu")
    x = torch.randn(n, device="cuda")
    y = _poisoned_like(x)
    k((-(-n // 256),), (256,), (x, y, n))
    torch.cuda.synchronize()
    assert torch.equal(y, torch.relu(x))


@pytest.mark.parametrize("n", [1, 3, 4, 4097, (1 << 20) + 3])
def test_vectorised_relu_example(n):
    k = opsmith.cuda_kernel(ROOT / "examples" / "relu_kernel.cu", "relu_f32x4")
    x = torch.randn(n + 1, device="cuda")
    for xs in (x[:n], x[1:]):  # aligned and misaligned (scalar path) views
        y = _poisoned_like(xs)
        k.launch_n(-(-n // 4), xs, y, n)
        torch.cuda.synchronize()
        assert torch.equal(y, torch.relu(xs))


def test_vector_add_with_launch_config():
    k = opsmith.cuda_kernel(ADD, "add")
    n = 12345
    a, b = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    out = _poisoned_like(a)
    k.launch(LaunchConfig(grid=-(-n // 128), block=128), a, b, out, n)
    torch.cuda.synchronize()
    torch.testing.assert_close(out, a + b, rtol=0, atol=0)


@pytest.mark.parametrize("ctype,dtype", [("float", torch.float32), ("double", torch.float64),
                                         ("int", torch.int32)])
def test_templated_kernel(ctype, dtype):
    mod = opsmith.CudaModule(TEMPLATED, name_expressions=[f"axpy<{ctype}>"])
    k = mod.get_kernel(f"axpy<{ctype}>")
    n = 5000
    if dtype.is_floating_point:
        x, y0, a = torch.randn(n, device="cuda", dtype=dtype), torch.randn(n, device="cuda", dtype=dtype), 1.75
    else:
        x = torch.randint(-1000, 1000, (n,), device="cuda", dtype=dtype)
        y0 = torch.randint(-1000, 1000, (n,), device="cuda", dtype=dtype)
        a = 3
    y = y0.clone()
    k.launch_n(n, x, y, a, n)
    torch.cuda.synchronize()
    torch.testing.assert_close(y, a * x + y0)
    with pytest.raises(LaunchError, match="argument 0 'x'"):
        k.launch_n(n, x.to(torch.float16), y, a, n)


@pytest.mark.parametrize("n,block", [(1, 32), (1000, 128), (1 << 20, 256), ((1 << 20) + 17, 512)])
def test_shared_memory_block_reduction(n, block):
    k = opsmith.cuda_kernel(REDUCE, "block_sum")
    x = torch.randn(n, device="cuda")
    blocks = -(-n // (2 * block))
    partial = torch.full((blocks,), POISON, device="cuda")
    k(blocks, block, (x, partial, n), shared_mem=block * 4)
    torch.cuda.synchronize()
    assert not torch.isnan(partial).any()
    ref = x.double().sum()
    assert abs(partial.double().sum() - ref) <= 1e-4 * x.double().abs().sum() + 1e-5


def test_launch_goes_on_torch_current_stream():
    k = opsmith.cuda_kernel(RELU, "relu")
    n = 1 << 16
    x = torch.full((n,), -1.0, device="cuda")
    y = _poisoned_like(x)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)  # keep the side stream busy for tens of ms
        x.fill_(2.5)                    # ordered after the sleep on the side stream
        k.launch_n(n, x, y, n)          # must run after fill_, on the same stream
    side.synchronize()
    assert torch.equal(y, torch.full_like(x, 2.5))
    # an explicit stream argument wins over the current stream
    y2 = _poisoned_like(x)
    with torch.cuda.stream(side):
        torch.cuda._sleep(1000)
    k.launch_n(n, x, y2, n, stream=side)
    side.synchronize()
    assert torch.equal(y2, torch.full_like(x, 2.5))


def test_bad_launches_are_rejected_and_the_process_survives():
    src = RELU + r"""
extern "C" __global__ void __launch_bounds__(128) small_block(float* y) { y[threadIdx.x] = 1.f; }
"""
    mod = opsmith.CudaModule(src)
    k, small = mod.get_kernel("relu"), mod.get_kernel("small_block")
    x = torch.randn(64, device="cuda")
    y = torch.empty_like(x)
    cases = [
        (lambda: k(1, 64, (x.half(), y, 64)), "argument 0 'x'.*float16"),
        (lambda: k(1, 64, (x, y.cpu(), 64)), "argument 1 'y'.*cpu"),
        (lambda: k(1, 64, (x, y, 64, 1)), "takes 3 argument"),
        (lambda: k(1, 64, (x, y[::2], 32)), "non-contiguous"),
        (lambda: k(1, 64, (x, y.data_ptr(), 64)), "data_ptr"),
        (lambda: k(1, 64, (x, y, 2 ** 64)), "argument 2 'n'"),
        (lambda: k(1, 2048, (x, y, 64)), "1024"),
        (lambda: k((2 ** 31, 1, 1), 64, (x, y, 64)), "grid"),
        (lambda: k(1, 64, (x, y, 64), shared_mem=10 ** 7), "shared memory"),
        (lambda: small(1, 256, (y,)), "at most 128"),
        (lambda: k.launch((1, 64), x, y, 64), "LaunchConfig"),
    ]
    for call, pattern in cases:
        with pytest.raises(LaunchError, match=pattern):
            call()
    if torch.cuda.device_count() > 1:
        with pytest.raises(LaunchError, match="same device"):
            k(1, 64, (x, torch.empty(64, device="cuda:1"), 64))
    yy = _poisoned_like(x)
    k(1, 64, (x, yy, 64))  # the context is healthy after all of the above
    torch.cuda.synchronize()
    assert torch.equal(yy, torch.relu(x))


def test_large_dynamic_shared_memory_is_opted_in():
    k = opsmith.cuda_kernel(REDUCE, "block_sum")
    n, block = 4096, 256
    x = torch.randn(n, device="cuda")
    partial = _poisoned_like(torch.empty(n // (2 * block), device="cuda"))
    k(n // (2 * block), block, (x, partial, n), shared_mem=64 * 1024)  # above the 48 KiB default
    torch.cuda.synchronize()
    assert abs(partial.double().sum() - x.double().sum()) < 1e-3 * x.abs().sum().item()


def test_attributes_occupancy_and_spill_warning():
    k = opsmith.cuda_kernel(REDUCE, "block_sum")
    a = k.attributes
    assert a.registers > 0 and a.max_threads_per_block >= 256 and not a.spills
    assert k.occupancy(256, 256 * 4) >= 1
    cfg = k.config_for(10 ** 6)
    assert cfg.block[0] % 32 == 0 and cfg.grid[0] * cfg.block[0] >= 10 ** 6
    spiller = r"""
extern "C" __global__ void spill(float* y, const int* idx, int n) {
    float buf[256];
    for (int j = 0; j < 256; ++j) buf[j] = y[j] * j;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = buf[idx[i] & 255];
}
"""
    s = opsmith.cuda_kernel(spiller, "spill")
    with pytest.warns(ResourceWarning, match="local memory"):
        attrs = s.attributes
    assert attrs.local_bytes > 0 and attrs.spills


def test_two_threads_launching_one_kernel_do_not_mix_arguments():
    import threading
    k = opsmith.cuda_kernel(ADD, "add")
    n = 4096
    errors = []

    def work(seed):
        try:
            g = torch.Generator(device="cuda").manual_seed(seed)
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):
                for _ in range(200):
                    a = torch.randn(n, device="cuda", generator=g)
                    b = torch.randn(n, device="cuda", generator=g)
                    out = torch.full_like(a, POISON)
                    k(-(-n // 256), 256, (a, b, out, n))
                    if not torch.equal(out, a + b):
                        errors.append(seed)
                        return
            s.synchronize()
        except Exception as exc:  # reported below
            errors.append(repr(exc))
    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_multi_gpu_launch_uses_the_tensors_device():
    if torch.cuda.device_count() < 2:
        pytest.skip("one GPU: cross-device launch needs two")
    k = opsmith.cuda_kernel(RELU, "relu")
    x = torch.randn(1000, device="cuda:1")
    y = _poisoned_like(x)
    assert torch.cuda.current_device() == 0
    k.launch_n(1000, x, y, 1000)
    torch.cuda.synchronize(1)
    assert torch.equal(y, torch.relu(x)) and torch.cuda.current_device() == 0


def test_context_is_created_only_at_first_launch_and_warm_load_skips_nvrtc(tmp_path):
    script = textwrap.dedent(f"""
        import sys, time, torch
        import opsmith
        from opsmith._build import _nvrtc
        import ctypes
        src = {RELU!r}
        cu = ctypes.CDLL("libcuda.so.1")
        cu.cuInit(0)
        flags, active = ctypes.c_uint(), ctypes.c_int()
        k = opsmith.cuda_kernel(src, "relu")
        cu.cuDevicePrimaryCtxGetState(torch.cuda.current_device(), ctypes.byref(flags), ctypes.byref(active))
        active_before = active.value
        x = torch.randn(10, device="cuda"); y = torch.empty_like(x)
        k.launch_n(10, x, y, 10); torch.cuda.synchronize()
        assert torch.equal(y, torch.relu(x))
        # torch itself may map libnvrtc, so ask whether opsmith loaded or imported NVRTC
        loaded = _nvrtc.nvrtc_stats["library_loads"] + ("cuda.bindings.nvrtc" in sys.modules)
        print("RESULT", int(active_before), _nvrtc.nvrtc_stats["compiles"], int(loaded > 0))
    """)
    env = dict(os.environ, OPSMITH_CACHE_DIR=str(tmp_path / "cache"))
    runs = []
    for _ in range(2):
        p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
        assert p.returncode == 0, p.stderr[-3000:]
        runs.append(next(line for line in p.stdout.splitlines() if line.startswith("RESULT")).split()[1:])
    assert runs[0] == ["0", "1", "1"]  # no context before the first launch; compiled once
    assert runs[1] == ["0", "0", "0"]  # warm: no NVRTC call, NVRTC not even imported


def test_ptx_output_loads_through_the_driver_jit():
    # NVRTC here must be no newer than the driver (see docs/cuda_kernels.md); cubin is the default
    k = opsmith.cuda_kernel(RELU, "relu", output="ptx")
    assert k.module.binary.kind == "ptx"
    x = torch.randn(3000, device="cuda")
    y = _poisoned_like(x)
    k.launch_n(3000, x, y, 3000)
    torch.cuda.synchronize()
    assert torch.equal(y, torch.relu(x))


def test_wrong_arch_cubin_is_explained(monkeypatch):
    major, _ = torch.cuda.get_device_capability()
    other = "sm_80" if major >= 9 else "sm_90"
    k = opsmith.cuda_kernel(RELU, "relu", arch=other)
    x = torch.randn(10, device="cuda")
    if major >= 9 and other == "sm_80":
        # an sm_80 cubin does not run on sm_90: the error names both archs and the fix
        with pytest.raises(LaunchError, match=r"compiled for sm_80 but cuda:\d is sm_\d+"):
            k.launch_n(10, x, torch.empty_like(x), 10)


def test_active_clusters_counts_a_cluster_kernel_and_says_0_without_cluster_dims():
    """Kernel.active_clusters: cuOccupancyMaxActiveClusters for a kernel whose __cluster_dims__ are compiled in
    (at least one cluster, at most the device's blocks over the cluster size), 0 for a kernel without them (the
    driver asks for a cluster size), asked once a config."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("thread-block clusters need sm_90+")
    mod = opsmith.CudaModule(r"""
extern "C" __global__ void __cluster_dims__(2, 1, 1) two(float* y) { y[threadIdx.x] = 1.f; }
extern "C" __global__ void plain(float* y) { y[threadIdx.x] = 1.f; }
""")
    cfg = LaunchConfig((2,), (128,))
    two = mod.get_kernel("two")
    n = two.active_clusters(cfg)
    props = torch.cuda.get_device_properties(0)
    assert 1 <= n <= props.multi_processor_count * props.max_threads_per_multi_processor // (2 * 128)
    assert two.active_clusters(LaunchConfig((2,), (128,))) == n
    assert mod.get_kernel("plain").active_clusters(cfg) == 0


def test_config_for_and_occupancy_before_any_cuda_work_in_a_fresh_process(tmp_path):
    """The occupancy API needs a current context: config_for() as a process's first CUDA call
    (found by the op-overhead benchmark: CUDA_ERROR_INVALID_CONTEXT)."""
    code = (
        "import opsmith\n"
        "mod = opsmith.CudaModule('extern \"C\" __global__ void k(float* y, int n) "
        "{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = 1.f; }')\n"
        "k = mod.get_kernel('k')\n"
        "cfg = k.config_for(1)\n"
        "print(cfg.block[0] >= 32, k.occupancy(128) >= 1)\n")
    env = dict(os.environ, OPSMITH_CACHE_DIR=str(tmp_path / "c"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True"]
