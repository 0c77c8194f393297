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


def test_a_tests_leftover_background_pch_build_is_stopped_with_its_group(tmp_path):
    """conftest's teardown stops the detached PCH builds (and their compiler) started into the test's own
    cache, and no other process: a stand-in job (its command line as the real one's) with a child in its
    process group, beside one for another cache."""
    import os
    from pathlib import Path

    from conftest import stop_background_pch
    if not Path("/proc").is_dir():
        pytest.skip("the teardown finds the builds through /proc (Linux)")
    mine, other = tmp_path / "mine", tmp_path / "other"
    script = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); time.sleep(120)"
    jobs = {root: subprocess.Popen([sys.executable, "-c", script, "opsmith._build._pch", json.dumps({"root": str(root)})],
                                   process_group=0) for root in (mine, other)}
    try:
        time.sleep(0.5)  # the stand-in started its child
        assert stop_background_pch(mine) == [jobs[mine].pid]
        assert jobs[mine].wait(timeout=30) != 0
        deadline = time.time() + 30
        while _live_in_group(jobs[mine].pid):  # the whole group goes, the child too
            assert time.time() < deadline, _live_in_group(jobs[mine].pid)
            time.sleep(0.1)
        assert jobs[other].poll() is None and _live_in_group(jobs[other].pid)
    finally:
        for p in jobs.values():
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()


def test_a_leftover_build_in_a_cache_inside_the_tests_folder_is_stopped_and_a_neighbours_is_not(tmp_path):
    """The teardowns pass a folder (the test's tmp_path, a module's fixtures' base): a build into a cache inside it
    stops; one into a folder whose name only begins the same (pytest's test_x1 and test_x10) does not."""
    import os
    from pathlib import Path

    from conftest import stop_background_pch
    if not Path("/proc").is_dir():
        pytest.skip("the teardown finds the builds through /proc (Linux)")
    inside, neighbour = tmp_path / "test_x1" / "cache", tmp_path / "test_x10" / "cache"
    jobs = {root: subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "opsmith._build._pch",
                                    json.dumps({"root": str(root)})], process_group=0) for root in (inside, neighbour)}
    try:
        assert stop_background_pch(tmp_path / "test_x1") == [jobs[inside].pid]
        assert jobs[inside].wait(timeout=30) != 0 and jobs[neighbour].poll() is None
    finally:
        for p in jobs.values():
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()


def _live_in_group(pgid: int) -> list[int]:
    """The processes of group ``pgid`` that are not zombies (a killed child waits there for its reaper)."""
    from pathlib import Path
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                out.append(int(d.name))
    return out
