"""Progress for long builds: a live status line on a terminal, nothing otherwise.

Shown only when stderr is a terminal, ``OPSMITH_PROGRESS`` is on, and the build has run for
about a second, so that cache hits, quick builds and scripts stay silent. A background timer
thread starts the display when the second is up even if the build reports nothing new (a
precompiled header takes tens of seconds in one step), and keeps the elapsed time current.
The line names the current step: ``precompiling torch headers``, ``compile 2 of 3``, ``link``
(only once every compile has succeeded: after a failure it says so), and a note that outlives
the phases, such as the precompiled headers building in the background.

``verbose=True`` logs each step through the ``opsmith.build`` logger instead of drawing.
"""
from __future__ import annotations

import logging
import sys
import threading
import time

from opsmith._config import settings
from opsmith._errors import ConfigError

__all__ = ["Progress"]

log = logging.getLogger("opsmith.build")
_DELAY = 1.0        # seconds before anything is drawn
_TICK = 0.2         # seconds between redraws of the elapsed time


class Progress:
    """A build's progress.

    ``status(text)`` names a phase (``precompiling torch headers``); ``begin_steps(n)`` says
    that ``n`` compiles and a link follow; ``step(done, total, text)`` is ninja's report that
    ``done`` of ``total`` steps have finished (the last step is the link). ``close()`` removes
    the line. Safe to use as a context manager.

    Examples
    --------
    >>> p = Progress("building relu")
    >>> p.status("precompiling torch headers"); p.step(1, 2, "compile relu.cpp"); p.close()
    >>> p.phase
    'link'
    """

    def __init__(self, title: str, *, verbose: bool = False, stream=None) -> None:
        self.title = title
        self.verbose = verbose
        self.start = time.perf_counter()
        self.phase = "compiling"  # until told more (begin_steps, status, step)
        self.note_text = ""       # shown after the phase (note())
        self.failed = 0           # steps ninja reported as FAILED
        self._stream = stream if stream is not None else sys.stderr
        self._lock = threading.Lock()
        self._live = None
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            enabled = bool(settings.progress)
        except ConfigError:  # an invalid OPSMITH_PROGRESS must not fail a build
            enabled = False
        if enabled and _is_tty(self._stream):
            self._thread = threading.Thread(target=self._run, name="opsmith-progress", daemon=True)
            self._thread.start()

    # -- what the build reports ---------------------------------------------------------
    def status(self, text: str) -> None:
        self._set(text)

    def begin_steps(self, compiles: int) -> None:
        self._set(f"compile 1 of {compiles}" if compiles else "link")

    def note(self, text: str) -> None:
        """A remark kept on the line whatever the phase (e.g. work going on in the background)."""
        with self._lock:
            self.note_text = text
            if self.verbose:
                log.info("%s: %s", self.title, text)
            if self._live is not None:
                self._live.update(self._text())

    def line(self, text: str) -> None:
        """A line of ninja's output: a ``FAILED:`` step means no link will follow."""
        if text.startswith("FAILED: "):
            self.failed += 1
            self._set("a step failed; waiting for the steps still running", log_it=False)

    def step(self, done: int, total: int, text: str) -> None:
        compiles = total - 1  # ninja's last step is the link (it needs every object)
        if self.failed:  # ninja counts a failed step as finished: no link comes after it
            if self.verbose:
                log.info("%s: [%d/%d] %s", self.title, done, total, text)
            return
        if done < compiles:
            phase = f"compile {done + 1} of {compiles}"
        elif done == compiles:
            phase = "link"
        else:
            phase = "finishing"
        if self.verbose:
            log.info("%s: [%d/%d] %s", self.title, done, total, text)
        self._set(phase, log_it=False)

    def close(self) -> None:
        self._closed.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)
        with self._lock:
            if self._live is not None:
                self._live.stop()
                self._live = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- drawing ------------------------------------------------------------------------
    def _text(self):
        from rich.text import Text  # never markup: a file name may hold brackets
        note = f" · {self.note_text}" if self.note_text else ""
        return Text(f"{self.title}: {self.phase} ({time.perf_counter() - self.start:.0f} s){note}")

    def _set(self, phase: str, *, log_it: bool = True) -> None:
        with self._lock:
            self.phase = phase
            if self.verbose and log_it:
                log.info("%s: %s", self.title, phase)
            if self._live is not None:
                self._live.update(self._text())

    def _run(self) -> None:
        if self._closed.wait(max(0.0, _DELAY - (time.perf_counter() - self.start))):
            return
        from rich.console import Console
        from rich.status import Status
        with self._lock:
            if self._closed.is_set():
                return
            self._live = Status(self._text(), console=Console(file=self._stream))
            self._live.start()
        while not self._closed.wait(_TICK):
            with self._lock:
                if self._live is None:
                    return
                self._live.update(self._text())


def _is_tty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
