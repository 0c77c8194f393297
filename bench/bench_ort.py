"""ORT session with the opsmith ReLU node against the same session using ORT's built-in Relu.

Each model is a single node (opsmith: ``mylib.relu`` from the library opsmith builds; anchor:
ONNX ``Relu``). Sizes: 4 KiB (per-node overhead) and 1 GiB on the GPU, 64 MiB on the CPU (kernel
time), float32. On the GPU inputs and outputs are bound to CUDA tensors (I/O binding: no
copies); on the CPU numpy arrays (ORT reads the input in place and hands its output over without
a copy), the opsmith node running ``opsmith.onnx.RELU_CPU_SOURCE`` on ORT's intra-op threads
(``--threads``, default ORT's own choice: one per physical core) like ORT's ``Relu``. Each
output is checked bitwise against ``torch.relu`` and against the other session's. Rounds
alternate ours and the anchor; each round times ``--runs`` session runs; the median round is
reported, with the ratio ours / anchor.

    python3 bench/bench_ort.py --device cuda --json out.json
    python3 bench/bench_ort.py --device cpu --sizes 4096,67108864
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import opsmith
import opsmith.onnx

SRC = r"""
template <typename T> __global__ void relu_fwd(const T* x, T* y, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] > T(0) ? x[i] : T(0); }

// Four items per thread with one 16-byte load and store where aligned (the grid covers
// ceil(n / (256 * 4)) blocks: items_per_thread=4 in the library, as config_for(n, items_per_thread=4)).
template <typename T> __global__ void relu_vec4(const T* x, T* y, long long n) {
  long long i = 4 * (blockIdx.x * (long long)blockDim.x + threadIdx.x);
  if (i + 3 < n && (((unsigned long long)(x + i) | (unsigned long long)(y + i)) & 15) == 0) {
    float4 v = *reinterpret_cast<const float4*>(x + i);
    v.x = v.x > 0.f ? v.x : 0.f; v.y = v.y > 0.f ? v.y : 0.f;
    v.z = v.z > 0.f ? v.z : 0.f; v.w = v.w > 0.f ? v.w : 0.f;
    *reinterpret_cast<float4*>(y + i) = v;
  } else {
    for (long long k = i; k < n && k < i + 4; ++k) y[k] = x[k] > T(0) ? x[k] : T(0);
  }
}
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--sizes", default=None, help="bytes per tensor, comma separated (default 4 KiB and 1 GiB "
                                                  "on the GPU, 4 KiB and 64 MiB on the CPU)")
    ap.add_argument("--threads", type=int, default=0,
                    help="intra_op_num_threads of both sessions (default 0: ORT's choice, one per physical core)")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--runs", type=int, default=0, help="runs per round (default: by size)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--kernel", choices=["vec4", "scalar"], default="vec4",
                    help="the opsmith node's kernel: four items per thread with 16-byte loads (default), "
                         "or the tutorial's one item per thread")
    a = ap.parse_args()
    import onnxruntime as ort
    cuda = a.device == "cuda"
    sizes = a.sizes or (f"{4 << 10},{1 << 30}" if cuda else f"{4 << 10},{64 << 20}")
    arch = "sm_%d%d" % torch.cuda.get_device_capability() if cuda else "sm_90"
    kname = "relu_vec4<float>" if a.kernel == "vec4" else "relu_fwd<float>"
    ipt = 4 if a.kernel == "vec4" else 1
    mod = opsmith.CudaModule(SRC, name_expressions=[kname], arch=None if cuda else "sm_90")
    kernel = mod.get_kernel(kname)
    relu = opsmith.custom_op("benchort::relu", kernel=kernel,
                             launch=None if ipt == 1 else (lambda x, y: kernel.config_for(max(x.numel(), 1),
                                                                                          items_per_thread=ipt)))
    tmp = Path(tempfile.mkdtemp(prefix="bench-ort-"))
    lib = opsmith.onnx.build_library([relu], cpu_source=opsmith.onnx.RELU_CPU_SOURCE,
                                     cpu={"benchort::relu": "relu_cpu"}, archs=[arch], out_dir=tmp / "lib",
                                     items_per_thread={"benchort::relu": ipt})

    class Ours(torch.nn.Module):
        def forward(self, x):
            return relu(x)

    class Anchor(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x)

    dyn = ({0: torch.export.Dim("n", min=2)},)
    opsmith.onnx.export(Ours(), (torch.randn(64),), tmp / "ours.onnx", dynamic_shapes=dyn)
    opsmith.onnx.export(Anchor(), (torch.randn(64),), tmp / "anchor.onnx", dynamic_shapes=dyn)
    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if cuda else ["CPUExecutionProvider"]
    def options():
        so = ort.SessionOptions()
        so.intra_op_num_threads = a.threads
        return so

    sessions = {"opsmith": opsmith.onnx.inference_session(tmp / "ours.onnx", lib, providers=providers,
                                                          options=options()),
                "ort_relu": opsmith.onnx.inference_session(tmp / "anchor.onnx", lib, providers=providers,
                                                           options=options())}
    results = []
    for nbytes in (int(s) for s in sizes.split(",")):
        n = nbytes // 4
        runs = a.runs or (2000 if nbytes <= 1 << 20 else 20)
        dev = "cuda" if cuda else "cpu"
        x = torch.randn(n, device=dev)
        y = torch.empty_like(x)
        call = {}
        for name, sess in sessions.items():
            if cuda:
                io = sess.io_binding()
                io.bind_input(sess.get_inputs()[0].name, "cuda", 0, np.float32, (n,), x.data_ptr())
                io.bind_output(sess.get_outputs()[0].name, "cuda", 0, np.float32, (n,), y.data_ptr())
                call[name] = (lambda s=sess, b=io: s.run_with_iobinding(b))
            else:
                feed = {sess.get_inputs()[0].name: x.numpy()}
                call[name] = (lambda s=sess, f=feed: s.run(None, f))
        expect = torch.relu(x)
        outs = {}
        for name, f in call.items():  # warm up, and check each gives torch.relu's result bitwise
            for _ in range(3):
                out = f()
            if cuda:
                torch.cuda.synchronize()
                got = y.clone()
            else:
                got = torch.from_numpy(out[0])
            if not torch.equal(got.view(torch.int32), expect.view(torch.int32)):
                raise SystemExit(f"{name}: the ORT session's output differs from torch.relu at {nbytes} bytes")
            outs[name] = got
            if cuda:
                y.fill_(-1.0)
        if not torch.equal(outs["opsmith"].view(torch.int32), outs["ort_relu"].view(torch.int32)):
            raise SystemExit(f"the opsmith node's output differs from ORT's Relu at {nbytes} bytes")
        del outs
        times = {k: [] for k in call}
        for _ in range(a.rounds):
            for name, f in call.items():
                if cuda:
                    torch.cuda.synchronize()
                t = time.perf_counter()
                for _ in range(runs):
                    f()
                if cuda:
                    torch.cuda.synchronize()
                times[name].append((time.perf_counter() - t) / runs * 1e6)
        med = {k: statistics.median(v) for k, v in times.items()}
        row = {"device": a.device, "kernel": a.kernel, "bytes": nbytes, "runs": runs, "rounds": a.rounds,
               "opsmith_us": med["opsmith"], "ort_relu_us": med["ort_relu"],
               "ratio": med["opsmith"] / med["ort_relu"], "diff_us": med["opsmith"] - med["ort_relu"],
               "all_us": times}
        results.append(row)
        del x, y
    info = {"onnxruntime": ort.__version__, "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name() if cuda else None, "cpus": os.cpu_count(),
            "intra_op_num_threads": a.threads, "rows": results}
    if a.json:
        Path(a.json).write_text(json.dumps(info, indent=1))
    where = (f" ({info['gpu']}), opsmith kernel: {a.kernel}" if cuda else
             f" ({info['cpus']} CPUs, intra_op_num_threads={a.threads or 'ORT default'}), opsmith: "
             f"RELU_CPU_SOURCE")
    print(f"ORT {ort.__version__} on {a.device}{where}")
    print(f"{'size':>10} {'opsmith us':>12} {'ORT Relu us':>12} {'ratio':>7} {'diff us':>9}")
    for r in results:
        size = f"{r['bytes'] >> 10} KiB" if r["bytes"] < 1 << 20 else f"{r['bytes'] >> 20} MiB"
        print(f"{size:>10} {r['opsmith_us']:12.2f} {r['ort_relu_us']:12.2f} {r['ratio']:7.3f} {r['diff_us']:9.2f}")


if __name__ == "__main__":
    main()
