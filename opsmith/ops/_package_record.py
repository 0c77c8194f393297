"""``opsmith package --ops``: what the op library compiles, recorded as for a module of ops
(:mod:`opsmith._torch._package_record`), with every kernel program of every dtype (the ops
compile on first use, so importing them records nothing). Run as
``python -m opsmith.ops._package_record opsmith.ops``."""
from __future__ import annotations

import sys

__all__ = ["requests"]


def requests(arch: str) -> list:
    """The NVRTC requests of every program of :mod:`opsmith.ops._sources` for ``arch``."""
    from opsmith._build._nvrtc_request import make_request
    from opsmith.ops import _sources
    return [make_request(**job) for job in _sources.jobs(arch)]


if __name__ == "__main__":
    from opsmith._torch._package_record import main
    sys.exit(main(requests=requests))
