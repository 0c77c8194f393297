"""Where the time of the opsmith ReLU node goes on ONNX Runtime's CPU provider (a diagnostic).

One cause at a time, at one size (default 64 MiB of float32): the same one-node library built
with other compiler flags (``CXX_FLAGS`` swapped for the build), the CPU source before this
change (a scalar loop whose ``x > 0 ? x : 0`` became a data-dependent branch at -O2), the same
source on all-positive input (a branch that is always taken: no mispredictions), the current
``opsmith.onnx.RELU_CPU_SOURCE`` on one and on more ORT threads, a function that writes
nothing (the session's own cost: input, output allocation from ORT's arena, hand-over to
numpy), and ORT's ``Relu`` on as many threads. Each row is timed twice: ``run()`` with numpy in
and out (as ``bench_ort.py``) and with the output bound to a preallocated array (I/O binding:
no output allocation), the median of ``--rounds`` rounds of ``--runs`` runs.

    python3 bench/diag_ort_cpu.py                  # on this machine's cores
    python3 bench/diag_ort_cpu.py --threads 16
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

import opsmith.onnx
from opsmith.onnx import _library, _specs

#: The CPU source shipped before (opsmith.onnx.RELU_CPU_SOURCE until this diagnostic was written).
SCALAR = r"""
template <typename T> static void relu_cpu(const T *x, T *y, long long n) {
  for (long long i = 0; i < n; ++i) y[i] = x[i] > T(0) ? x[i] : T(0);
}
"""
NOTHING = r"""template <typename T> static void relu_cpu(const T *, T *, long long) {}"""


def build(source: str, opt: str, root: Path):
    spec = _specs.OrtOpSpec(domain="diag", name="relu", inputs=1, outputs=1, like=(0,), cpu="relu_cpu",
                            variants=(_specs.OrtVariant(dtype="float32", binding=("in0", "out0", "n"),
                                                          c_params=("const float *x", "float *y", "long long n")),))
    flags = _library.CXX_FLAGS
    _library.CXX_FLAGS = tuple(f"-{opt}" if f.startswith("-O") else f for f in flags)
    try:
        return _library.build_ort_library([spec], name="diag", cpu_source=source,
                                          out_dir=root / f"{opt}-{abs(hash(source))}")
    finally:
        _library.CXX_FLAGS = flags


def model(ours: bool) -> bytes:
    node = helper.make_node("relu", ["x"], ["y"], domain="diag") if ours else helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])])
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid("diag", 1)] if ours else [])
    return helper.make_model(graph, opset_imports=opsets, ir_version=9).SerializeToString()


def median_us(f, runs: int, rounds: int) -> float:
    for _ in range(3):
        f()
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(runs):
            f()
        times.append((time.perf_counter() - t) / runs * 1e6)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bytes", type=int, default=64 << 20)
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="ORT intra-op threads of the parallel rows")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="diag-ort-cpu-"))
    t = a.threads
    rows = [  # (what, source or None for ORT's Relu, -O level, threads, all-positive input)
        ("before: scalar source, -O2", SCALAR, "O2", 1, False),
        ("scalar source, -O0", SCALAR, "O0", 1, False),
        ("scalar source, -O2, input >= 0", SCALAR, "O2", 1, True),
        ("scalar source, -O3", SCALAR, "O3", 1, False),
        ("RELU_CPU_SOURCE, -O2", opsmith.onnx.RELU_CPU_SOURCE, "O2", 1, False),
        ("RELU_CPU_SOURCE, -O3", opsmith.onnx.RELU_CPU_SOURCE, "O3", 1, False),
        (f"RELU_CPU_SOURCE, -O3, {t} threads", opsmith.onnx.RELU_CPU_SOURCE, "O3", t, False),
        (f"writes nothing, {t} threads", NOTHING, "O3", t, False),
        ("ORT Relu, 1 thread", None, None, 1, False),
        (f"ORT Relu, {t} threads", None, None, t, False),
    ]
    n = a.bytes // 4
    x = np.random.default_rng(0).standard_normal(n, dtype=np.float32)
    positive = np.abs(x)
    y = np.empty_like(x)
    print(f"ORT {ort.__version__}, {os.cpu_count()} CPUs, {a.bytes >> 20} MiB float32, median of {a.rounds} x "
          f"{a.runs} runs")
    print(f"{'':40s} {'run() us':>11} {'bound out us':>13}")
    for what, source, opt, threads, pos in rows:
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        if source is not None:
            opsmith.onnx.session_options(build(source, opt, root), so)
        sess = ort.InferenceSession(model(source is not None), so, providers=["CPUExecutionProvider"])
        inp = positive if pos else x
        io = sess.io_binding()
        io.bind_cpu_input("x", inp)
        io.bind_output("y", "cpu", 0, np.float32, (n,), y.ctypes.data)
        if source is not NOTHING:
            sess.run_with_iobinding(io)
            if not np.array_equal(y, np.maximum(inp, 0)):
                raise SystemExit(f"{what}: wrong result")
        ran = median_us(lambda: sess.run(None, {"x": inp}), a.runs, a.rounds)
        bound = median_us(lambda: sess.run_with_iobinding(io), a.runs, a.rounds)
        print(f"{what:40s} {ran:11.1f} {bound:13.1f}")


if __name__ == "__main__":
    main()
