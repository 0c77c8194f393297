"""The `opsmith` command line, run through the installed entry point, on real compilers.

Builds here are plain C++ libraries (no torch headers), so each takes well under a second;
only `test_warm_builds_the_precompiled_headers_once` compiles torch's headers (marked slow).
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

OPSMITH = shutil.which("opsmith")
REPO = Path(__file__).resolve().parents[2]

ADD = "int add(int a, int b) { return a + b; }\n"
SUB = "int sub(int a, int b) { return a - b; }\n"
BROKEN = "int add(int a, int b) {\n  return a + b\n}\n"   # line 2: missing ';'


def opsmith(*args: str, env: dict | None = None, cwd=None, timeout: float = 300,
            prelude: str = "") -> subprocess.CompletedProcess:
    """Run the installed `opsmith` (or, with a prelude, the same main under python -c)."""
    if prelude:
        cmd = [sys.executable, "-c", f"{prelude}\nimport sys\nfrom opsmith.cli import main\n"
               f"sys.exit(main({list(args)!r}))"]
    else:
        assert OPSMITH, "the opsmith entry point is not installed (pip install -e .)"
        cmd = [OPSMITH, *args]
    return subprocess.run(cmd, check=False, capture_output=True, text=True, env=env or dict(os.environ), cwd=cwd,
                          timeout=timeout)


def in_pty(cmd: list[str], *, cwd=None, env=None, timeout: float = 120) -> tuple[int, str]:
    """Run ``cmd`` with stdout and stderr on a pseudo-terminal; return (status, what it printed)."""
    master, slave = os.openpty()
    env = dict(env or os.environ, TERM="xterm-256color", COLUMNS="120")
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, cwd=cwd, env=env)
    os.close(slave)
    chunks, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    os.close(master)
    rc = proc.wait(timeout=30)
    return rc, b"".join(chunks).decode(errors="replace")


def _plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text).replace("\r", "")


@pytest.fixture
def srcdir(tmp_path):
    d = tmp_path / "src"
    d.mkdir()
    (d / "add.cpp").write_text(ADD)
    (d / "sub.cpp").write_text(SUB)
    (d / "broken.cpp").write_text(BROKEN)
    return d


# -- basics ------------------------------------------------------------------------------------
def test_version_and_help():
    proc = opsmith("--version")
    assert proc.returncode == 0 and proc.stdout.startswith("opsmith ")
    proc = opsmith("--help")
    for cmd in ("doctor", "cache", "build", "warm", "settings", "demo"):
        assert cmd in proc.stdout


def test_cache_path_follows_the_setting_and_the_option(fresh_cache, tmp_path):
    assert opsmith("cache", "path").stdout.strip() == str(fresh_cache)
    other = tmp_path / "other"
    assert opsmith("--cache-dir", str(other), "cache", "path").stdout.strip() == str(other)


def test_empty_cache_listing(fresh_cache):
    proc = opsmith("cache", "ls")
    assert proc.returncode == 0 and "the cache is empty" in proc.stdout
    stats = json.loads(opsmith("cache", "stats", "--json").stdout)
    assert stats["entries"] == 0 and stats["hit_rate"] is None


# -- build, then the cache commands on what it built ---------------------------------------------
def test_build_then_hit_then_ls_stats(srcdir, fresh_cache):
    proc = opsmith("build", "add.cpp", "sub.cpp", "--library", "--name", "arith", cwd=srcdir)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("built arith (library) in ") and "2 units compiled" in proc.stdout
    assert proc.stderr == ""  # no progress drawing when stderr is not a terminal
    art = json.loads(opsmith("build", "add.cpp", "sub.cpp", "--library", "--name", "arith", "--json",
                             cwd=srcdir).stdout)
    assert art["built"] is False and art["kind"] == "library" and Path(art["path"]).is_file()
    assert Path(art["path"]).is_relative_to(fresh_cache)

    listing = json.loads(opsmith("cache", "ls", "--json").stdout)
    by_kind = {e["kind"]: e for e in listing}
    assert by_kind["library"]["name"] == "arith" and by_kind["library"]["hits"] >= 1
    assert sum(e["kind"] == "object" for e in listing) == 2
    text = opsmith("cache", "ls").stdout.splitlines()
    assert text[0].split() == ["NAME", "KIND", "SIZE", "AGE", "LAST", "USE", "HITS", "KEY"]
    assert any(line.split()[:2] == ["arith", "library"] for line in text[1:])

    stats = json.loads(opsmith("cache", "stats", "--json").stdout)
    # the library, its two objects, and the link stubs for torch's libraries
    assert stats["entries"] == 4 and stats["by_kind"]["library"]["entries"] == 1
    assert stats["by_kind"]["link-stubs"]["entries"] == 1
    assert 0 < stats["hit_rate"] < 1
    assert "hit rate" in opsmith("cache", "stats").stdout


def test_build_flags_reach_the_compiler(srcdir, fresh_cache):
    (srcdir / "flag.cpp").write_text("#ifndef OPSMITH_FLAG\n#error flag missing\n#endif\nint f() { return 1; }\n")
    proc = opsmith("build", "flag.cpp", "--library", "--cflags=-DOPSMITH_FLAG -O1", cwd=srcdir)
    assert proc.returncode == 0, proc.stderr
    proc = opsmith("build", "flag.cpp", "--library", cwd=srcdir)
    assert proc.returncode == 1 and "flag missing" in proc.stderr


def test_prune_keeps_busy_entries_and_force_removes_them(srcdir, fresh_cache):
    # Three entries: the library, its object and the link stubs for torch's libraries.
    assert opsmith("build", "add.cpp", "--library", cwd=srcdir).returncode == 0
    proc = opsmith("cache", "prune", "--max-size", "0")
    assert proc.returncode == 0 and "removed 0 entries" in proc.stdout and "--force" in proc.stdout
    proc = opsmith("cache", "prune", "--max-size", "0", "--dry-run", "--force")
    assert "would remove 3 entries" in proc.stdout
    assert len(json.loads(opsmith("cache", "ls", "--json").stdout)) == 3
    proc = opsmith("cache", "prune", "--max-size", "0", "--force")
    assert "removed 3 entries" in proc.stdout
    assert json.loads(opsmith("cache", "ls", "--json").stdout) == []


def test_prune_older_than_and_clear(srcdir, fresh_cache):
    assert opsmith("build", "add.cpp", "--library", cwd=srcdir).returncode == 0
    old = time.time() - 10 * 86400
    for entry in (fresh_cache / "entries").iterdir():
        for f in entry.iterdir():
            os.utime(f, (old, old))
        man = json.loads((entry / "manifest.json").read_text())
        man["created"] = old
        (entry / "manifest.json").write_text(json.dumps(man))
    proc = opsmith("cache", "prune", "--older-than", "7d")
    assert proc.returncode == 0 and "removed 3 entries" in proc.stdout
    assert opsmith("build", "add.cpp", "--library", cwd=srcdir).returncode == 0
    proc = opsmith("cache", "clear", "--force")
    assert "removed 3 entries" in proc.stdout
    assert json.loads(opsmith("cache", "ls", "--json").stdout) == []


def test_prune_rejects_a_bad_size(fresh_cache):
    proc = opsmith("cache", "prune", "--max-size", "huge")
    assert proc.returncode == 2 and "error: invalid size 'huge'" in proc.stderr  # a usage error, as docs/cli.md says


def test_verify_removes_a_corrupt_entry_and_it_rebuilds(srcdir, fresh_cache):
    art = json.loads(opsmith("build", "add.cpp", "--library", "--json", cwd=srcdir).stdout)
    so = Path(art["path"])
    so.chmod(0o600)
    data = bytearray(so.read_bytes())
    data[len(data) // 2] ^= 0xFF
    so.write_bytes(bytes(data))
    proc = opsmith("cache", "verify", "--keep")
    assert proc.returncode == 1 and "does not match its sha256 (kept)" in proc.stdout
    proc = opsmith("cache", "verify")
    assert proc.returncode == 0 and "verified 3 entries: 1 corrupt, removed" in proc.stdout
    assert not so.parent.exists()
    again = json.loads(opsmith("build", "add.cpp", "--library", "--json", cwd=srcdir).stdout)
    assert again["built"] is True and again["compiled_units"] == 0  # the object was still good


# -- errors ------------------------------------------------------------------------------------
def test_compile_error_rendered_plain_from_the_real_compiler(srcdir, fresh_cache):
    proc = opsmith("build", "broken.cpp", "--library", cwd=srcdir)
    assert proc.returncode == 1 and proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert re.match(r"opsmith: error: \S*broken\.cpp:2:\d+: error: expected ';'", lines[0]), lines[0]
    assert any(line.startswith("> 2 |   return a + b") for line in lines)
    caret = lines[[i for i, ln in enumerate(lines) if ln.startswith("> 2 |")][0] + 1]
    assert caret.strip() == "^"
    log = [ln for ln in lines if ln.startswith("full log: ")]
    assert log and Path(log[0][len("full log: "):]).is_file()
    assert not any(ln.startswith("command: ") for ln in lines)
    assert "(run with -v to see the compiler command)" in lines
    assert "\x1b[" not in proc.stderr and "Traceback" not in proc.stderr

    verbose = opsmith("build", "broken.cpp", "--library", "-v", cwd=srcdir)
    cmd = [ln for ln in verbose.stderr.splitlines() if ln.startswith("command: ")]
    assert cmd and "broken.cpp" in cmd[0] and " -c " in cmd[0]


def test_compile_error_rendered_with_rich_on_a_terminal(srcdir, fresh_cache):
    rc, out = in_pty([OPSMITH, "build", "broken.cpp", "--library"], cwd=srcdir)
    assert rc == 1
    assert "\x1b[" in out  # styled
    plain = _plain(out)
    assert re.search(r"opsmith: CompileError: \S*broken\.cpp:2:\d+: error: expected ';'", plain), plain
    assert "> 2 |   return a + b" in plain and "full log: " in plain


def test_link_error_names_the_missing_symbol(srcdir, fresh_cache):
    (srcdir / "main.cpp").write_text("int add(int, int);\nint main() { return add(1, 2); }\n")
    proc = opsmith("build", "main.cpp", "--executable", cwd=srcdir)
    assert proc.returncode == 1
    assert proc.stderr.startswith("opsmith: error: link failed: undefined symbol")
    assert "add(int, int)" in proc.stderr


def test_missing_source_and_empty_source_list(srcdir, fresh_cache):
    proc = opsmith("build", "nope.cpp", cwd=srcdir)
    assert proc.returncode == 1 and "source file 'nope.cpp' does not exist" in proc.stderr
    proc = opsmith("build", cwd=srcdir)
    assert proc.returncode == 2 and "FILE" in proc.stderr  # argparse: at least one file


def test_build_without_ninja_says_how_to_install_it(srcdir, fresh_cache, tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("clang++", "g++", "c++", "clang", "gcc", "cc", "ld", "as"):
        if shutil.which(tool):
            (bindir / tool).symlink_to(shutil.which(tool))
    env = dict(os.environ, PATH=str(bindir))
    proc = opsmith("build", "add.cpp", "--library", env=env, cwd=srcdir,
                   prelude="import sys; sys.modules['ninja'] = None")
    assert proc.returncode == 1 and "pip install ninja" in proc.stderr and "Traceback" not in proc.stderr


def _mount_tmpfs(path: Path, options: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], check=False,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({(proc.stderr or proc.stdout).strip() or 'not root'})")


def test_build_into_a_full_disk_is_a_readable_error(srcdir, tmp_path):
    mnt = tmp_path / "full"
    _mount_tmpfs(mnt, "size=1m,mode=700")
    try:
        with open(mnt / "filler", "wb") as f, contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        proc = opsmith("--cache-dir", str(mnt / "cache"), "build", "add.cpp", "--library", cwd=srcdir)
        assert proc.returncode == 1, proc.stdout
        assert proc.stderr.startswith("opsmith: error: no space left on the device"), proc.stderr
        assert "opsmith cache prune" in proc.stderr and "Traceback" not in proc.stderr
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False, capture_output=True)


def test_cache_dir_writable_by_others_is_refused_with_the_fix(srcdir, fresh_cache):
    fresh_cache.mkdir()
    fresh_cache.chmod(0o777)
    proc = opsmith("build", "add.cpp", "--library", cwd=srcdir)
    assert proc.returncode == 1 and f"chmod 700 {fresh_cache}" in proc.stderr


# -- progress ----------------------------------------------------------------------------------
# The display starts on a timer thread and redraws a few times a second, so which frames reach
# the terminal depends on how long each step takes: two tiny units build in 0.3 s, before the
# first frame. These tests assert only what does not depend on the machine's speed: the steps a
# build reports (recorded, in order), frames waited for (not slept for), the summary line.
_PHASES = ["compile 1 of 2", "compile 2 of 2", "link", "finishing"]


def _progress_prelude(record: Path) -> str:
    """Show the display from the start, wait for it before the build goes on, record each phase."""
    return (
        "import atexit, json, time\n"
        "import opsmith._build._progress as p\n"
        "p._DELAY = 0.0\n"
        "_init, _set, phases = p.Progress.__init__, p.Progress._set, []\n"
        "def _init_and_wait(self, *a, **k):\n"
        "    _init(self, *a, **k)\n"
        "    deadline = time.monotonic() + 120\n"
        "    while self._live is None and self._thread is not None and self._thread.is_alive():\n"
        "        if time.monotonic() > deadline:\n"
        "            raise RuntimeError('the progress display did not start in 120 s')\n"
        "        time.sleep(0.01)\n"
        "def _record(self, phase, **k):\n"
        "    phases.append(phase)\n"
        "    _set(self, phase, **k)\n"
        "p.Progress.__init__, p.Progress._set = _init_and_wait, _record\n"
        f"atexit.register(lambda: open({str(record)!r}, 'w').write(json.dumps(phases)))\n"
    )


def test_progress_shows_the_steps_on_a_terminal(srcdir, fresh_cache, tmp_path):
    record = tmp_path / "phases.json"
    cmd = [sys.executable, "-c", f"{_progress_prelude(record)}\nimport sys\nfrom opsmith.cli import main\n"
           f"sys.exit(main(['build', 'add.cpp', 'sub.cpp', '--library', '--name', 'arith']))"]
    rc, out = in_pty(cmd, cwd=srcdir)
    assert rc == 0, out
    phases = json.loads(record.read_text())
    # ninja's reports, in order: the phases only move forward, and the link comes after both compiles
    assert phases[0] == "compile 1 of 2" and "link" in phases, phases
    assert [_PHASES.index(ph) for ph in phases] == sorted(_PHASES.index(ph) for ph in phases), phases
    plain = _plain(out)
    assert re.search(r"building arith: [a-z0-9 ]+ \(\d+ s\)", plain), plain  # a frame (the last one, at close)
    assert plain.rstrip().splitlines()[-1].startswith("built arith"), plain


class _FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _wait_for_frame(term: _FakeTerminal, text: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in _plain(term.getvalue()):
        assert time.monotonic() < deadline, f"no frame with {text!r} in {timeout:.0f} s: {term.getvalue()!r}"
        time.sleep(0.01)


def test_progress_draws_each_step_it_is_told_of(monkeypatch):
    from opsmith._build import _progress
    monkeypatch.setattr(_progress, "_DELAY", 0.0)
    term = _FakeTerminal()
    p = _progress.Progress("building relu", stream=term)
    try:
        p.status("precompiling torch headers")  # one long step that reports nothing more:
        _wait_for_frame(term, "building relu: precompiling torch headers")  # the timer draws it
        for report, phase in [(lambda: p.begin_steps(2), "compile 1 of 2"),
                              (lambda: p.step(1, 3, "compile a.cpp"), "compile 2 of 2"),
                              (lambda: p.step(2, 3, "compile b.cpp"), "link")]:
            report()
            assert p.phase == phase
            _wait_for_frame(term, f"building relu: {phase}")
        p.note("precompiled headers building in the background")
        _wait_for_frame(term, "building relu: link (")
        _wait_for_frame(term, "· precompiled headers building in the background")
    finally:
        p.close()


def test_progress_after_a_failed_step_never_says_link():
    from opsmith._build import _progress
    p = _progress.Progress("building relu", stream=io.StringIO())
    p.begin_steps(2)
    p.line("FAILED: a.o")
    p.step(1, 3, "compile a.cpp")
    p.step(2, 3, "compile b.cpp")
    p.close()
    assert p.phase == "a step failed; waiting for the steps still running"


def test_progress_stays_silent_for_short_builds_and_off_a_terminal(monkeypatch):
    from opsmith._build import _progress
    monkeypatch.setattr(_progress, "_DELAY", 3600.0)  # a build that ends before the delay
    quick = _FakeTerminal()
    p = _progress.Progress("building relu", stream=quick)
    p.step(1, 2, "compile a.cpp")
    p.close()
    assert quick.getvalue() == ""  # closed first: the timer thread returns without drawing
    monkeypatch.setattr(_progress, "_DELAY", 0.0)
    silent = io.StringIO()  # not a terminal: no display at all, whatever the delay
    p = _progress.Progress("building relu", stream=silent)
    assert p._thread is None
    p.close()
    assert silent.getvalue() == ""


def test_progress_switched_off_by_setting(monkeypatch):
    from opsmith._build import _progress
    monkeypatch.setattr(_progress, "_DELAY", 0.0)
    monkeypatch.setenv("OPSMITH_PROGRESS", "0")
    term = _FakeTerminal()
    p = _progress.Progress("building relu", stream=term)
    assert p._thread is None  # nothing that could draw was started
    p.close()
    assert term.getvalue() == ""


# -- settings and docs -------------------------------------------------------------------------
def test_settings_command_shows_values_and_sources(monkeypatch):
    env = dict(os.environ, MAX_JOBS="3")
    proc = opsmith("settings", env=env)
    row = [ln.split() for ln in proc.stdout.splitlines() if ln.startswith("max_jobs")][0]
    assert row[:3] == ["max_jobs", "3", "MAX_JOBS"]


def test_docs_settings_page_is_up_to_date():
    from opsmith._config import settings_markdown
    page = REPO / "docs" / "settings.md"
    assert page.read_text() == settings_markdown(), (
        "docs/settings.md is out of date: run `opsmith settings --markdown > docs/settings.md`")
    from opsmith._config import Settings
    for s in Settings.describe():
        assert f"`{s.name}`" in page.read_text()


def test_docs_cli_page_covers_every_command():
    from opsmith.cli import build_parser
    text = (REPO / "docs" / "cli.md").read_text()
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for name, p in sub.choices.items():
        assert f"opsmith {name}" in text, name
        for a in p._actions:
            if a.__class__.__name__ == "_SubParsersAction":
                for child in a.choices:
                    assert f"opsmith {name} {child}" in text, (name, child)


# -- warm (the one test that compiles torch's headers) ----------------------------------------
@pytest.mark.slow
def test_warm_builds_the_precompiled_headers_once(fresh_cache, tmp_path):
    proc = opsmith("warm", timeout=900)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("built precompiled torch headers for ")
    proc = opsmith("warm")
    assert proc.returncode == 0 and "already in the cache" in proc.stdout
    kinds = [e["kind"] for e in json.loads(opsmith("cache", "ls", "--json").stdout)]
    assert sorted(kinds) == ["link-stubs", "pch"]  # what every later build shares
    # a later torch-extension build finds that PCH (no second one is built)
    (tmp_path / "twice.cpp").write_text("#include <torch/extension.h>\n"
                                        "torch::Tensor twice(torch::Tensor x) { return x * 2; }\n"
                                        "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def(\"twice\", &twice); }\n")
    proc = opsmith("build", "twice.cpp", cwd=tmp_path, timeout=900)
    assert proc.returncode == 0, proc.stderr
    kinds = [e["kind"] for e in json.loads(opsmith("cache", "ls", "--json").stdout)]
    assert kinds.count("pch") == 1 and kinds.count("link-stubs") == 1 and "module" in kinds


def test_demo_cpu_part_builds_checks_and_warm_loads_through_the_warm_index(fresh_cache):
    """The README's main job: `opsmith demo` (its CPU part here; CUDA skips without a GPU)."""
    pytest.importorskip("torch")
    from opsmith.cli import _demo
    env = dict(os.environ, OPSMITH_PCH="0")  # no background PCH build competing with other tests
    cold = _demo._child(env, "cold")
    assert cold["ok"] and cold["built"] is True
    warm = _demo._child(env, "warm")
    # The cold run recorded its load_inline call: the warm run is answered by stat stamps.
    assert warm["ok"] and warm["full_lookup"] is False
    proc = opsmith("demo", env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr
    assert "CPU relu: found in the cache" in proc.stdout and "a first build" not in proc.stdout
    assert "matches torch.relu on 1M random floats: yes" in proc.stdout
    # A new user's first command prints the demo's lines and nothing else: no torch warning
    # ("Failed to initialize NumPy" without numpy), no deprecation notice.
    noise = [ln for ln in proc.stderr.splitlines() if re.search(r"warn|deprecat|Failed to initialize", ln, re.I)]
    assert not noise, proc.stderr
