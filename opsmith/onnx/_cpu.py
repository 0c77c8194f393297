"""The CPU side of an ONNX Runtime op library: the contract of a CPU function, and a ReLU that keeps it.

A CPU function takes the op's kernel arguments (``const T *x, T *y, long long n``), or those
and a last ``const opsmith::cpu_context &cpu`` whose ``parallel_for`` runs chunks on ORT's
intra-op threads (``templates/cpu_context.h``; docs/onnx.md, "CPU functions"). A function of
neither form is a compile error that names the op, the function and both signatures (a
``static_assert`` in the generated code). The library's C++ is built with
:data:`opsmith.onnx._library.CXX_FLAGS` (-O3, no -ffast-math).
"""
from __future__ import annotations

import os
from pathlib import Path

from opsmith._errors import SpecError

__all__ = ["RELU_CPU_SOURCE", "cpu_source_text"]

#: A C++ CPU ReLU for the tutorial's ``relu_fwd<T>`` kernel (docs/torch_ops.md): the kernel's
#: parameters and the optional ``opsmith::cpu_context`` (docs/onnx.md, "CPU functions"), templated
#: so that one definition serves float and double. It computes what ONNX Runtime's ``Relu`` and
#: ``torch.relu`` give bit for bit: ``x < 0 ? 0 : x``, so NaN stays the same NaN and -0.0 stays
#: -0.0. Chunks of 16 Ki items run on ORT's intra-op threads; the loop has no branch, and the
#: compiler vectorises it (-O3, with a run-time check that x and y do not overlap).
RELU_CPU_SOURCE = r"""
template <typename T> static void relu_cpu_chunk(const T *x, T *y, long long n) {
  for (long long i = 0; i < n; ++i) y[i] = x[i] < T(0) ? T(0) : x[i];
}
template <typename T> static void relu_cpu(const T *x, T *y, long long n, const opsmith::cpu_context &cpu) {
  cpu.parallel_for(n, 1 << 14, [=](long long begin, long long end) { relu_cpu_chunk(x + begin, y + begin, end - begin); });
}
"""


def cpu_source_text(cpu_source: str | os.PathLike | None) -> str:
    """The C++ text of ``cpu_source``: a path (a ``.cpp``/``.cc``/``.h``/``.hpp`` name or a
    path-like) is read, any other string is the source itself; None is no source."""
    if cpu_source is None:
        return ""
    if isinstance(cpu_source, os.PathLike) or (isinstance(cpu_source, str) and "\n" not in cpu_source
                                               and cpu_source.endswith((".cpp", ".cc", ".h", ".hpp"))):
        try:
            return Path(cpu_source).read_text()
        except OSError as exc:
            raise SpecError(f"cannot read the CPU source {cpu_source}: {exc.strerror}") from None
    return str(cpu_source)
