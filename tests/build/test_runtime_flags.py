"""A module opsmith built runs as fast as torch's build of the same source (issue 24, item 5).

Measured on the 2-core machine (bench/bench_runtime.py, the LLTM forward): the code is the
same speed whatever compiles it at -O0 (g++ or clang++, c++17 or c++20, with or without the
precompiled header); what made opsmith's module 20-80x slower right after a first build was
the background build of the precompiled header competing for the cores. These tests pin both
facts without timing anything: the flags that decide the code are torch's, and the
background job runs at idle priority in the caller's scheduling group.
"""
from __future__ import annotations

import json
import os
import sys
import time
import types

import pytest

torch = pytest.importorskip("torch")


def _torch_ext_flags(tmp_path, **spec_args):
    from opsmith._build._plan import Toolchain, plan
    from opsmith._build._profile import profile_for
    from opsmith._cache._open import open_cache
    from opsmith._spec import ExtensionSpec
    src = tmp_path / "ext.cpp"
    src.write_text("#include <torch/extension.h>\nint f() { return 1; }\n")
    spec = ExtensionSpec.from_files("ext", [str(src)], kind="module", **spec_args)
    tc = Toolchain(open_cache(), spec)
    [unit] = plan(spec, tc)
    return unit, profile_for(spec).pch_flags(spec, tc)


def test_a_torch_extension_unit_is_compiled_with_torchs_standard_and_level(tmp_path):
    """The flags that decide the generated code are those of torch's JIT builder: its -std (read
    from the installed torch's cpp_extension.py) and no -O; the precompiled header is built
    with the unit's own flags, so what it instantiates is compiled as the unit would be."""
    from opsmith._toolchain._cxx import torch_std_from_source
    builder = os.path.join(os.path.dirname(torch.__file__), "utils", "cpp_extension.py")
    with open(builder) as f:
        torch_std = torch_std_from_source(f.read())
    unit, pch_flags = _torch_ext_flags(tmp_path)
    stds = [f for f in unit.flags if f.startswith("-std=")]
    assert stds == [f"-std={torch_std}"]
    assert not any(f.startswith("-O") for f in unit.flags)  # torch's JIT: no -O, i.e. -O0
    assert unit.uses_pch and unit.flags[:len(pch_flags)] == pch_flags


def test_an_optimisation_level_reaches_the_unit_and_the_precompiled_header(tmp_path):
    unit, pch_flags = _torch_ext_flags(tmp_path, extra_cflags=["-O2"])
    assert "-O2" in unit.flags and "-O2" in pch_flags


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="no SCHED_IDLE on this platform")
def test_the_background_pch_build_runs_idle_in_the_callers_scheduling_group(tmp_path, fresh_cache):
    """Started for real (python -m opsmith._build._pch), with a stand-in compiler that records how
    it was run: at SCHED_IDLE, in the caller's session (so in its scheduler autogroup, where
    the priority counts against the caller's threads), in a process group of its own (Ctrl-C
    at the terminal does not stop it), deaf to SIGHUP (it outlives the terminal)."""
    from opsmith._build import _pch
    from opsmith._cache._open import open_cache
    record = tmp_path / "how-it-ran.json"
    fake = tmp_path / "fake-clang++"
    fake.write_text(
        f"#!{sys.executable}\n"
        "import json, os, signal\n"
        f"with open({str(record)!r} + '.tmp', 'w') as f:\n"
        "    json.dump({'policy': os.sched_getscheduler(0), 'sid': os.getsid(0), 'pgid': os.getpgrp(),\n"
        "               'hup_ignored': signal.getsignal(signal.SIGHUP) == signal.SIG_IGN}, f)\n"
        f"os.replace({str(record)!r} + '.tmp', {str(record)!r})\n"
        "raise SystemExit(1)\n")
    fake.chmod(0o755)
    compiler = types.SimpleNamespace(path=str(fake), family="clang")
    assert _pch._start_background(open_cache(), "k" * 32, compiler, ["-DX"], deferred=False)
    deadline = time.monotonic() + 120
    while not record.exists():
        assert time.monotonic() < deadline, "the background job never ran its compiler"
        time.sleep(0.1)
    ran = json.loads(record.read_text())
    assert ran["policy"] == os.SCHED_IDLE
    assert ran["sid"] == os.getsid(0)
    assert ran["pgid"] != os.getpgrp()
    assert ran["hup_ignored"] is True
