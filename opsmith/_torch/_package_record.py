"""What importing a module of ops compiles and builds: the torch side of ``opsmith package``.

Run in a fresh process by the package target (``python -m opsmith._torch._package_record
MODULE``; a process boundary, not an import: targets never import each other). It imports the
module with every NVRTC request and every prebuildable library recorded
(:func:`opsmith._build._prebuilt.record`), builds the C-shim op library (no torch header: it
runs on every torch that has the shim) and prints one JSON document: the requests (pickled,
base64), the libraries (name, source sha256, path) and the ops the module defined (name,
schema). Without a GPU the kernels compile for ``--arch`` (the package compiles every arch it
ships afterwards; the arch is not part of what it records).
"""
from __future__ import annotations

import argparse
import base64
import importlib
import json
import os
import pickle
import sys

__all__ = ["main"]


def main(argv: list[str] | None = None, requests=None) -> int:
    """Record ``MODULE``'s import; ``requests(arch)``, when given, adds NVRTC requests the import
    does not make (opsmith.ops compiles on first use: ``python -m opsmith.ops._package_record``)."""
    p = argparse.ArgumentParser(prog="python -m opsmith._torch._package_record")
    p.add_argument("module")
    p.add_argument("--arch", default="sm_90")
    args = p.parse_args(argv)
    from opsmith._build import _prebuilt
    from opsmith._config import settings
    recorded = _prebuilt.record()
    with settings.override(cuda_arch=settings.cuda_arch or args.arch):
        importlib.import_module(args.module)
        if requests is not None:
            recorded["requests"].extend(requests(args.arch))
    from opsmith._opdesc import all_descriptions
    from opsmith._torch import _cshim
    _cshim.build()
    seen: dict = {}
    for req in recorded["requests"]:
        seen.setdefault(req.portable_key(), req)
    doc = {"requests": [base64.b64encode(pickle.dumps(r)).decode() for r in seen.values()],
           "libraries": {n: {"source_sha256": s, "path": path} for n, (s, path) in recorded["libraries"].items()},
           "ops": [{"name": d.name, "schema": d.schema} for d in all_descriptions()],
           "cwd": os.getcwd()}
    sys.stdout.write("\n" + json.dumps(doc) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
