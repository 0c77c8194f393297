"""`opsmith demo`."""
from __future__ import annotations


def _demo(args) -> int:
    from opsmith.cli._demo import run_demo
    return run_demo(fresh=args.fresh)
