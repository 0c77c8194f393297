"""The ``opsmith`` command line."""
from __future__ import annotations

import argparse
import sys

__all__ = ["main"]


def _demo(args) -> int:
    from ._demo import run_demo
    return run_demo(fresh=args.fresh)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="opsmith", description="C++ and CUDA source to PyTorch ops.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="build the tutorial's ReLU op, check it, time cold and warm loads")
    p.add_argument("--fresh", action="store_true", help="use a new empty cache directory")
    p.set_defaults(func=_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from ._errors import OpsmithError
    try:
        return int(args.func(args) or 0)
    except OpsmithError as exc:
        print(f"opsmith: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
