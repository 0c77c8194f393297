"""A first build with no precompiled torch headers yet: it goes without them while a detached,
low-priority process builds them; the next build uses them. Real compiler, real torch headers."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

import opsmith

SRC = "torch::Tensor twice(torch::Tensor x) { return x * 2; }"


def _entries(cache):
    out = subprocess.run([sys.executable, "-m", "opsmith", "cache", "ls", "--json"], capture_output=True,
                         text=True, check=True).stdout
    return [e["kind"] for e in json.loads(out)]


def _uses_pch(command: str) -> bool:
    return "-include-pch " in command or "torch_extension_pch.h " in command  # clang / gcc


@pytest.mark.slow
def test_first_build_does_not_wait_for_the_pch(fresh_cache, monkeypatch, caplog):
    import logging

    import torch
    monkeypatch.delenv("OPSMITH_PCH_WAIT", raising=False)
    with caplog.at_level(logging.INFO, logger="opsmith"):
        art = opsmith.build_inline("twice_first", SRC, functions=["twice"])
    assert art.built
    first = [r.getMessage() for r in caplog.records if r.getMessage().startswith("compile ")]
    assert first and not any(_uses_pch(line) for line in first), first
    caplog.clear()
    logs = list((fresh_cache / "logs").glob("pch-*.log"))
    assert logs, "no background build of the precompiled headers was started"
    m = opsmith.load_artifact(art)
    assert torch.equal(m.twice(torch.arange(3)), torch.arange(3) * 2)

    deadline = time.time() + 600
    while "pch" not in _entries(fresh_cache):
        assert time.time() < deadline, logs[0].read_text()[-3000:]
        time.sleep(2)
    assert "built" in logs[0].read_text()

    # The next torch build finds the PCH and compiles with it; no second background build.
    with caplog.at_level(logging.INFO, logger="opsmith"):
        art2 = opsmith.build_inline("twice_second", SRC + "\n// another source", functions=["twice"])
    assert art2.built
    compile_lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("compile ")]
    assert compile_lines and all(_uses_pch(line) for line in compile_lines), compile_lines
    assert _entries(fresh_cache).count("pch") == 1
    assert len(list((fresh_cache / "logs").glob("pch-*.log"))) == 1
