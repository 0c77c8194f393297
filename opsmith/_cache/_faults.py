"""A test hook: pause at a named point of a build or a publish, so a fault test can kill there.

``point(name)`` is called at a few named places on the cold path (publishing an entry,
building, writing machine-local state). It does nothing unless the setting
``OPSMITH_TEST_FAULT`` names that point: then it writes the process id to a marker file and
sleeps until that file is removed (or 120 s pass), so that a test can ``kill -9`` the
process there, fill the disk under it, or let it go on by deleting the marker.

The value is ``POINT`` or ``POINT@MARKER`` (the marker's path; default
``<cache dir>/fault-POINT.pid``). Points: ``build:locked``, ``build:before-compile``,
``build:objects-published``, ``build:published``, ``put:staged``, ``put:copied``,
``put:manifest``, ``put:replaced``, ``state:<namespace>`` (e.g. ``state:warm``,
``state:deps2``). Never set it outside tests. A warm load never reaches a point, so the
hook costs nothing there; on the cold path it costs one settings read.
"""
from __future__ import annotations

import os
import time

__all__ = ["point"]


def point(name: str) -> None:
    """Pause here when ``OPSMITH_TEST_FAULT`` names ``name`` (see the module docstring)."""
    from opsmith._config import settings
    target = settings.test_fault
    if not target:
        return
    wanted, _, marker = target.partition("@")
    if wanted != name:
        return
    if not marker:
        marker = os.path.join(os.fspath(settings.cache_path), f"fault-{name.replace(':', '-')}.pid")
    tmp = f"{marker}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(str(os.getpid()))
    os.replace(tmp, marker)  # the test sees the whole pid or nothing
    deadline = time.monotonic() + 120.0
    while os.path.exists(marker) and time.monotonic() < deadline:
        time.sleep(0.01)
