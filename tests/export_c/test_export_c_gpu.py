"""export-c on a GPU: the plain C++ example (examples/export_c) builds with g++, runs and is correct,
on every device; the static resources it reports match the manifest's."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def example(tmp_path):
    if not (shutil.which("gcc") and shutil.which("g++")):
        pytest.skip("needs gcc and g++")
    proc = subprocess.run([str(REPO / "examples" / "export_c" / "build.sh"), str(tmp_path)], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return tmp_path


@pytest.mark.gpu
def test_example_runs_and_is_correct_on_every_device(example):
    import torch
    needed = subprocess.run(["readelf", "-d", str(example / "example")], capture_output=True, text=True).stdout
    assert "libcuda" not in needed and "libtorch" not in needed and "libpython" not in needed
    manifest = json.loads((example / "ex.json").read_text())
    axpy = next(k for k in manifest["kernels"] if k["name"] == "axpy<float>")
    devices = list(range(min(torch.cuda.device_count(), 2)))  # the second device when there is one
    for d in devices:
        proc = subprocess.run([str(example / "example"), str(d)], capture_output=True, text=True, timeout=120)
        print(proc.stdout)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "relu: ok" in proc.stdout and "axpy<float>: ok" in proc.stdout and "all checks passed" in proc.stdout
        line = next(ln for ln in proc.stdout.splitlines() if ln.startswith(f"device {d}: loaded "))
        arch = line.rsplit(" ", 1)[-1]
        major, minor = torch.cuda.get_device_capability(d)
        regs = int(proc.stdout.split("registers ")[1].split(",")[0])
        if arch.startswith("sm_"):
            assert int(arch[3:]) // 10 == major, (arch, major, minor)  # same major, a cubin
            assert axpy["resources"][arch]["registers"] == regs  # the manifest's count is the driver's
