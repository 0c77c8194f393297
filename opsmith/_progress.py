"""Progress for long builds: a live line on a terminal, nothing otherwise.

Shown only when stderr is a terminal and the build has run for about a second, so that
cache hits and scripts stay silent. ``verbose=True`` logs each step through the ``opsmith``
logger instead (configured by the caller or by ``OPSMITH_LOG_LEVEL``).
"""
from __future__ import annotations

import logging
import sys
import time

from ._config import settings

__all__ = ["Progress"]

log = logging.getLogger("opsmith.build")
_DELAY = 1.0


class Progress:
    """A build's progress: ``status(text)`` for a phase, ``step(done, total, text)`` for ninja steps."""

    def __init__(self, title: str, *, verbose: bool = False) -> None:
        self.title = title
        self.verbose = verbose
        self.start = time.perf_counter()
        self._live = None
        self._last = ""
        self._enabled = bool(settings.progress) and _stderr_is_tty()

    def _render(self, text: str) -> None:
        self._last = text
        if self.verbose:
            log.info("%s: %s", self.title, text)
        if not self._enabled or time.perf_counter() - self.start < _DELAY and self._live is None:
            return
        if self._live is None:
            from rich.console import Console
            from rich.status import Status
            self._live = Status(text, console=Console(stderr=True))
            self._live.start()
        self._live.update(f"[bold]{self.title}[/bold]: {text}")

    def status(self, text: str) -> None:
        self._render(text)

    def step(self, done: int, total: int, text: str) -> None:
        self._render(f"[{done}/{total}] {text}")

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None


def _stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False
