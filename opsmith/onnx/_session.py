"""ONNX Runtime sessions with an opsmith op library, and the provider check.

:func:`session_options` registers a library (``lib<name>.so`` built by
``opsmith.onnx.build_library``) on ``onnxruntime.SessionOptions``. :func:`inference_session`
also checks, before ORT does, that every node of the model in one of the library's domains has
an implementation for at least one of the providers asked for, and says which providers have
one (ORT's own answer is ``NOT_IMPLEMENTED: Could not find an implementation for relu(1) node``).
"""
from __future__ import annotations

import os
import re
from typing import Any, Sequence

from opsmith._errors import OpsmithError, SpecError

__all__ = ["session_options", "inference_session", "check_providers", "ORT_EXTRA"]

ORT_EXTRA = "pip install 'opsmith[onnx]'"


def _ort():
    try:
        import onnxruntime
    except ImportError:
        raise OpsmithError(f"onnxruntime is not installed: {ORT_EXTRA} (or pip install onnxruntime-gpu for the "
                           f"CUDA provider)") from None
    return onnxruntime


def _library(library):
    from opsmith.onnx._library import OrtLibrary, load_manifest
    if isinstance(library, OrtLibrary):
        return library
    if isinstance(library, (str, os.PathLike)):
        return load_manifest(library)
    raise SpecError(f"library must be what opsmith.onnx.build_library returned or the path of its .so, "
                    f"got {library!r}")


def session_options(library, options=None):
    """``onnxruntime.SessionOptions`` with the opsmith op library registered.

    Parameters
    ----------
    library : OrtLibrary or path
        What :func:`opsmith.onnx.build_library` returned, or its ``.so``.
    options : onnxruntime.SessionOptions, optional
        Register on these instead of new ones (and return them).

    Examples
    --------
    >>> so = opsmith.onnx.session_options(lib)                               # doctest: +SKIP
    >>> sess = onnxruntime.InferenceSession("model.onnx", so, providers=["CPUExecutionProvider"])  # doctest: +SKIP
    """
    ort = _ort()
    lib = _library(library)
    so = options if options is not None else ort.SessionOptions()
    try:
        so.register_custom_ops_library(str(lib.path))
    except Exception as exc:  # ORT raises its own Fail/RuntimeError types
        raise OpsmithError(f"ONNX Runtime {ort.__version__} did not load {lib.path}: {exc}. Rebuild it with "
                           f"opsmith.onnx.build_library, and run `opsmith doctor` (ONNX Runtime rows)") from None
    return so


def _provider_names(providers) -> list[str]:
    names = []
    for p in providers:
        names.append(p[0] if isinstance(p, (tuple, list)) else str(p))
    return names


def _model_nodes(model) -> list[tuple[str, str, str]] | None:
    """(domain, op_type, node name) of every node, subgraphs included; None without the onnx package."""
    try:
        import onnx
    except ImportError:
        return None
    if isinstance(model, (bytes, bytearray)):
        proto = onnx.load_from_string(bytes(model))
    elif isinstance(model, (str, os.PathLike)):
        proto = onnx.load(os.fspath(model), load_external_data=False)
    else:
        proto = model
    out = []

    def walk(graph):
        for n in graph.node:
            out.append((n.domain, n.op_type, n.name))
            for a in n.attribute:
                if a.g is not None and len(a.g.node):
                    walk(a.g)
                for g in a.graphs:
                    walk(g)
    walk(proto.graph)
    for f in proto.functions:
        for n in f.node:
            out.append((n.domain, n.op_type, n.name))
    return out


def check_providers(model, library, providers: Sequence[Any]) -> None:
    """Raise :class:`~opsmith.OpsmithError` when a node of ``model`` in one of ``library``'s
    domains has no implementation for any of ``providers`` (names or ``(name, options)``)."""
    lib = _library(library)
    nodes = _model_nodes(model)
    if nodes is None:
        return
    asked = _provider_names(providers)
    domains = {k.rsplit(".", 1)[0] for k in lib.ops}
    for domain, op_type, node_name in nodes:
        if domain not in domains:
            continue
        key = f"{domain}.{op_type}"
        have = lib.providers_of(key)
        if not have:
            raise OpsmithError(
                f"model node {node_name or key} is op {key}, which the library {lib.path.name} does not have "
                f"(it has {', '.join(sorted(lib.ops))}): rebuild the library with that op "
                f"(opsmith.onnx.build_library([...]))")
        if not set(have) & set(asked):
            fix = (f"add {have[0]!r} to providers=" if "CUDAExecutionProvider" in have else
                   "rebuild the library with a CUDA kernel for it")
            if "CPUExecutionProvider" not in have:
                fix += (f", or give it a CPU implementation: opsmith.onnx.build_library(..., cpu_source=..., "
                        f"cpu={{'{domain}::{op_type}': 'my_cpu_fn'}}) so that a session without a working CUDA "
                        f"provider still runs")
            raise OpsmithError(
                f"op {key} (node {node_name or key}) has no implementation for the providers asked for "
                f"({', '.join(asked) or 'none'}); {lib.path.name} implements it for {', '.join(have)}. Fix: {fix}")


def inference_session(model, library, providers: Sequence[Any] | None = None, options=None, **kwargs):
    """``onnxruntime.InferenceSession`` of ``model`` (a path, bytes or ModelProto) with the
    library registered, after :func:`check_providers`.

    ``providers`` defaults to ``["CPUExecutionProvider"]``. When the CUDA provider is asked
    for but could not be loaded (ORT then falls back to the CPU with a warning), a node that
    only has a CUDA implementation fails here with the missing provider named.
    """
    ort = _ort()
    lib = _library(library)
    providers = list(providers) if providers is not None else ["CPUExecutionProvider"]
    check_providers(model, lib, providers)
    so = session_options(lib, options)
    if not isinstance(model, (str, os.PathLike, bytes, bytearray)):
        model = model.SerializeToString()
    elif isinstance(model, os.PathLike):
        model = os.fspath(model)
    try:
        sess = ort.InferenceSession(model, sess_options=so, providers=providers, **kwargs)
    except Exception as exc:
        text = str(exc)
        m = re.search(r"Could not find an implementation for (\w+)\((\d+)\) node with name '([^']*)'", text)
        if m is None:  # no kernel of the op for any provider of this build: ORT knows no such op
            m = re.search(r"[\w.]+:(\w+)\((-?\d+)\)() is not a registered function/op", text)
        if m is None:
            raise
        loaded = [p for p in _provider_names(providers) if p in ort.get_available_providers()]
        have = [(k, v["providers"]) for k, v in lib.ops.items() if k.rsplit(".", 1)[-1] == m.group(1)]
        detail = "; ".join(f"{k} has {', '.join(v)}" for k, v in have) or "it is not in this library"
        raise OpsmithError(
            f"ONNX Runtime found no implementation of op {m.group(1)} (node {m.group(3)!r}) for the providers "
            f"asked for ({', '.join(_provider_names(providers))}; usable here: {', '.join(loaded) or 'none'}): "
            f"{detail}. A provider asked for may have failed to load (run `opsmith doctor`); give the op a CPU "
            f"implementation so that the session still runs") from None
    return sess
