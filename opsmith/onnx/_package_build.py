"""``opsmith package --with onnxruntime``: the ONNX Runtime library of a module's ops.

Run in a fresh process by the package target (``python -m opsmith.onnx._package_build MODULE
OUT_DIR [--arch ...]``; a process, not an import: targets never import each other). It imports
MODULE (its ops register their descriptions), builds the custom-op library of every op the
module defined (:func:`opsmith.onnx.build_library`) into OUT_DIR, and prints one JSON line: the
files written. A module gives its ops CPU implementations for ONNX Runtime with a module-level

    __opsmith_onnx__ = {"cpu_source": "<C++ text or a path beside the module>",
                        "cpu": {"mylib::relu": "relu_cpu"}}

(docs/onnx.md's CPU-function contract); without it the ops run on the CUDA provider only.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m opsmith.onnx._package_build")
    p.add_argument("module")
    p.add_argument("out_dir")
    p.add_argument("--arch", action="append", default=None)
    args = p.parse_args(argv)
    from opsmith import _opdesc
    from opsmith.onnx import build_library
    before = {d.name for d in _opdesc.all_descriptions()}
    mod = importlib.import_module(args.module)
    ops = [d.name for d in _opdesc.all_descriptions() if d.name not in before]
    spec = dict(getattr(mod, "__opsmith_onnx__", {}) or {})
    cpu_source = spec.get("cpu_source")
    if isinstance(cpu_source, str) and "\n" not in cpu_source and mod.__file__:
        beside = Path(mod.__file__).parent / cpu_source
        cpu_source = str(beside) if beside.is_file() else cpu_source
    lib = build_library(ops, cpu_source=cpu_source, cpu=spec.get("cpu"), name=args.module, archs=args.arch,
                        out_dir=args.out_dir)
    sys.stdout.write("\n" + json.dumps({"files": [str(lib.path), str(lib.manifest)], "ops": lib.ops}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
