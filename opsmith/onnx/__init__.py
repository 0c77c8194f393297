"""opsmith ops in ONNX and ONNX Runtime: the one home of the ONNX Runtime target.

Build an ORT custom-op library from ``opsmith.custom_op`` ops (the CUDA provider launches the
same NVRTC kernels on ORT's compute stream; the CPU provider calls a C++ function you give),
export a model whose nodes are those ops, and run it::

    lib = opsmith.onnx.build_library([relu], cpu_source=opsmith.onnx.RELU_CPU_SOURCE,
                                     cpu={"mylib::relu": "relu_cpu"})
    opsmith.onnx.export(model, (x,), "model.onnx")            # torch.onnx.export, dynamo=True
    sess = opsmith.onnx.inference_session("model.onnx", lib, providers=["CPUExecutionProvider"])

The package reads ops only through their descriptions (:mod:`opsmith._opdesc`), never the
torch target's objects. Inside: ``_specs`` (descriptions -> op specs), ``_generate`` and
``templates/`` (the library's C++), ``_launch`` (the CUDA kernels' launch code), ``_library``
(the build through the engine, the manifest), ``_session``, ``_export`` (torch.onnx),
``_cpu`` (the CPU-function contract), ``_doctor`` (``opsmith doctor``'s rows). See docs/onnx.md.
"""
from __future__ import annotations

import os
from typing import Iterable, Mapping, Sequence

from opsmith._errors import SpecError
from opsmith.onnx._cpu import RELU_CPU_SOURCE, cpu_source_text
from opsmith.onnx._export import export, register_symbolics, translation_table
from opsmith.onnx._library import OrtLibrary
from opsmith.onnx._library import load_manifest as load_library
from opsmith.onnx._session import inference_session, session_options
from opsmith.onnx._specs import ort_specs

__all__ = ["OrtLibrary", "RELU_CPU_SOURCE", "build_library", "export", "inference_session", "load_library",
           "register_symbolics", "session_options", "translation_table"]


def build_library(ops=None, *, cpu_source: str | os.PathLike | None = None, cpu: Mapping[str, str] | None = None,
                  dtypes: Mapping[str, Sequence[str]] | None = None, name: str = "opsmith_ops",
                  archs: Iterable[str] | None = None, out_dir: str | os.PathLike | None = None,
                  items_per_thread: Mapping[str, int] | None = None) -> OrtLibrary:
    """Build an ONNX Runtime custom-op library from opsmith ops.

    Parameters
    ----------
    ops : CustomOp, list of CustomOp or op names, optional
        The ops (default: every ``opsmith.custom_op`` op of this process).
    cpu_source : str or path, optional
        C++ source defining the CPU implementations (a path or the text).
    cpu : dict, optional
        ``{"mylib::relu": "relu_cpu"}``: the function the CPU provider calls, with the same
        arguments as the op's kernel (``relu_cpu(x, y, n)``; a template or overloads serve
        several dtypes). Ops without an entry run on the CUDA provider only.
    dtypes : dict, optional
        Dtypes of ops that have no kernel (default float32).
    name : str
        The library is ``lib<name>.so``.
    archs : list of str, optional
        GPU archs to embed code for (default: as ``opsmith export-c``).
    out_dir : path, optional
        Where to put it (default: under opsmith's cache directory, by content hash).
    items_per_thread : dict, optional
        ``{"mylib::relu": 4}``: items one CUDA thread handles (a kernel with vector loads), so
        the grid is ``ceil(n / (256 * 4))`` blocks, as the torch op's
        ``kernel.config_for(n, items_per_thread=4)``. Default 1.

    Returns
    -------
    OrtLibrary
        ``.path`` is the shared library; pass it to :func:`opsmith.onnx.session_options`.

    Examples
    --------
    >>> lib = opsmith.onnx.build_library([relu], cpu_source=opsmith.onnx.RELU_CPU_SOURCE,
    ...                                  cpu={"mylib::relu": "relu_cpu"})   # doctest: +SKIP
    """
    from opsmith.onnx._library import build_ort_library
    text = cpu_source_text(cpu_source)
    if cpu and not text:
        raise SpecError("cpu= names CPU functions but no cpu_source= defines them; pass the C++ source")
    specs, sources = ort_specs(ops, cpu, dtypes, items_per_thread)
    if not specs:
        raise SpecError("no opsmith op to build an ONNX Runtime library from: register ops with "
                        "opsmith.custom_op first, or pass ops=")
    return build_ort_library(specs, name=name, cuda_sources=sources, cpu_source=text, archs=archs, out_dir=out_dir)
