"""`opsmith package`: a module's ops (or opsmith.ops' kernels) to one wheel with no compile left.

The argparse wiring lives in :mod:`opsmith.cli`, which calls :func:`run` with the parsed arguments.
"""
from __future__ import annotations

import json
import os

from opsmith._errors import SpecError

__all__ = ["run"]


def run(args) -> int:
    """Build as the command line asks, then print the wheel, its archs and sizes (``--json``: as JSON)."""
    from opsmith.package._build import build_package
    if bool(args.module) == bool(args.ops):
        raise SpecError("opsmith package takes a MODULE (a package that defines ops) or --ops, not both and "
                        "not neither: e.g. `opsmith package mykernels` or `opsmith package --ops`")
    archs = [a for item in (args.arch or ()) for a in item.replace(",", " ").split()] or None
    res = build_package(args.module or "opsmith.ops", out_dir=args.out, archs=archs, ptx=args.ptx,
                        version=args.pkg_version, sign=args.sign, ops=args.ops,
                        with_c="c" in (args.with_ or ()), with_onnxruntime="onnxruntime" in (args.with_ or ()),
                        versioned_namespace=args.versioned_namespace)
    if args.json:
        print(json.dumps({"wheel": os.fspath(res.wheel), "package": res.package, "version": res.version,
                          "archs": res.archs, "kernels": res.kernels, "ops": res.ops, "sizes": res.sizes,
                          "signed": res.signed, "namespaces": res.namespaces,
                          "seconds": round(res.seconds, 3)}, indent=2))
        return 0
    print(f"packaged {res.kernels} kernel program{'s' * (res.kernels != 1)} and {len(res.ops)} op"
          f"{'s' * (len(res.ops) != 1)} for {', '.join(res.archs)} in {res.seconds:.1f} s"
          f"{' (signed)' if res.signed else ''}")
    for arch in res.archs:
        if arch in res.sizes:
            print(f"  {arch:<12} {res.sizes[arch]:>12,} bytes")
    print(f"  wrote {res.wheel} ({res.sizes['wheel']:,} bytes)")
    return 0
