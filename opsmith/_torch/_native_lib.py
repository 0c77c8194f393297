"""What opsmith's torch C++ libraries (the native Autograd kernels, opsmith.ops' CUDA kernels)
share: whether one is usable here, decided once per process."""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

__all__ = ["usable"]

log = logging.getLogger("opsmith")


def usable(state: dict[str, Any], enabled: bool, load: Callable[[], Any], what: str, fallback: str,
           variable: str) -> bool:
    """True when the library is ``enabled`` and ``load()`` builds and opens it. A failure (no
    compiler, a torch without headers) is logged once, naming ``fallback`` and the ``variable``
    that turns the library off, and remembered in ``state``: the fallback serves from then on."""
    if not enabled or "failed" in state:
        return False
    try:
        load()
        return True
    except Exception as exc:  # noqa: BLE001  (any failure: the fallback serves, said once)
        state["failed"] = exc
        log.warning("opsmith: %s unavailable (%s); %s (set %s=0 to silence this)", what,
                    str(exc).splitlines()[0], fallback, variable)
        return False
