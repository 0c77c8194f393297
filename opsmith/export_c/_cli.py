"""`opsmith export-c`: CUDA kernels to a C library with the code inside (no Python at run time).

The argparse wiring lives in :mod:`opsmith.cli`, which calls :func:`run` with the parsed arguments.
"""
from __future__ import annotations

import json
import os

__all__ = ["run"]


def run(args) -> int:
    """Export as the command line asks, then print what was written (``--json``: as JSON)."""
    from opsmith.export_c._export import export_c
    archs = [a for item in (args.arch or ()) for a in item.replace(",", " ").split()] or None
    res = export_c(list(args.sources), args.kernel or None, out_dir=args.out, prefix=args.prefix, archs=archs,
                   ptx=args.ptx, library=args.library, cc=args.cc, include_paths=args.include or (),
                   defines=args.define or None, options=args.option or ())
    files = [res.header, res.source, res.manifest, res.static_library, res.shared_library]
    if args.json:
        print(json.dumps({"files": [os.fspath(f) for f in files if f is not None], "kernels": res.kernels,
                          "archs": list(res.archs),
                          "seconds": {k: round(v, 3) for k, v in res.seconds.items()}}, indent=2))
        return 0
    print(f"exported {len(res.kernels)} kernel{'s' * (len(res.kernels) != 1)} for {', '.join(res.archs)} "
          f"in {res.seconds['total']:.1f} s")
    for name, fn in res.kernels.items():
        print(f"  {fn}  ({name})")
    for f in files:
        if f is not None:
            print(f"  wrote {f} ({os.path.getsize(f):,} bytes)")
    return 0
