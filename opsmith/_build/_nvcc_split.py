"""nvcc's phases as separate build steps, so that the host and device paths run in parallel.

nvcc runs its phases one after another. For a ``.cu`` that includes torch headers three of
them each cost as much as a whole torch translation unit: ``cudafe++`` (host front end),
``cicc`` (device front end and optimiser) and the host compiler on ``cudafe++``'s output.
The only thing ``cicc`` waits for is the *module id* file, which ``cudafe++`` writes
(``--gen_module_id_file``). opsmith writes that file itself (a name unique to the
translation unit, in nvcc's format), so the two front ends run side by side:

```
host preprocess ──> cudafe++ ──────────────> .cudafe1.cpp ──┐
device preprocess ─> cicc ──> ptxas ──> fatbinary ──────────┴─> host compile ──> object
   (one per arch)     └─ .cudafe1.stub.c (#included by .cudafe1.cpp; #includes .fatbin.c)
```

The commands come from ``nvcc --dryrun`` with the same arguments, replayed with nvcc's own
environment (``PATH``, ``CICC_PATH``, ...) and with nvcc's temporary files moved into a
work directory. Anything in the dry run that is not recognised makes :func:`split_steps`
return None, and the caller runs nvcc as one step.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from opsmith._build._ninja import Step

__all__ = ["Phase", "parse_dryrun", "split_steps", "module_id"]

log = logging.getLogger("opsmith.build")

_TMP = re.compile(r"(?P<dir>[^\s\"'=,]*/)?tmpxft_[0-9a-f]+_[0-9a-f]+-\d+_(?P<rest>[A-Za-z0-9_.+-]+)")
_ASSIGN = re.compile(r"^(?P<name>[A-Za-z_]\w*)=(?P<value>.*)$")
_VAR = re.compile(r"\$(?:\{(\w+)\}|(\w+))")
_HOST_CC = re.compile(r"^(?:.*-)?(?:gcc|g\+\+|c\+\+|cc|clang|clang\+\+)(?:-\d+(?:\.\d+)*)?$")
_FILTER_DEPS = re.compile(r"^-- Filter Dependencies -- > (?P<file>.+)$")
# Options of the phases that name the files a phase writes.
_OUTPUT_OPTS = {
    "cudafe++": ("--gen_c_file_name",),
    "cicc": ("-o", "--gen_c_file_name", "--stub_file_name", "--gen_device_file_name"),
    "ptxas": ("-o",),
    "fatbinary": ("--embedded-fatbin", "--create"),
    "host-pp": ("-o",), "device-pp": ("-o",), "host-cc": ("-o",),
}
# nvcc.profile's flag holders: nvcc has already expanded them into the commands.
_EXPANDED = ("INCLUDES", "SYSTEM_INCLUDES", "LIBRARIES", "CUDAFE_FLAGS", "PTXAS_FLAGS")
_RDC = ("-rdc=true", "--relocatable-device-code=true", "-dc", "--device-c", "-dlink", "--device-link",
        "-rdc", "--relocatable-device-code")


class Phase:
    """One command of nvcc's dry run.

    Attributes
    ----------
    kind : str
        ``host-pp``, ``device-pp``, ``cudafe++``, ``cicc``, ``ptxas``, ``fatbinary`` or
        ``host-cc``.
    argv : list[str]
        The command, tokenised, ``$VAR`` references expanded, output redirections removed.
    """

    __slots__ = ("kind", "argv")

    def __init__(self, kind: str, argv: list[str]) -> None:
        self.kind = kind
        self.argv = argv

    def option(self, name: str) -> str | None:
        """The value of ``name`` (``-o x``, ``--opt x``, ``--opt=x``), or None."""
        for i, tok in enumerate(self.argv):
            if tok == name and i + 1 < len(self.argv):
                return self.argv[i + 1]
            if tok.startswith(name + "="):
                return tok[len(name) + 1:]
        return None

    def outputs(self) -> list[str]:
        return [v for v in (self.option(o) for o in _OUTPUT_OPTS[self.kind]) if v is not None]

    def __repr__(self) -> str:
        return f"Phase({self.kind!r}, {shlex.join(self.argv)[:80]!r}...)"


def parse_dryrun(text: str) -> tuple[dict[str, str], list[Phase], str | None] | None:
    """Parse ``nvcc --dryrun`` output into (environment, phases, depfile), or None.

    None when a line is not one of nvcc 12/13's known phases, when a ``$VAR`` is unknown,
    or when the phases do not have the shape that :func:`split_steps` knows how to run
    (one host preprocessing, one ``cudafe++``, per arch a device preprocessing and a
    ``cicc``, ``ptxas`` runs, one ``fatbinary``, one host compile).

    Examples
    --------
    >>> parse_dryrun("#$ nvlink --arch=sm_90 a.o") is None
    True
    """
    env: dict[str, str] = {}
    phases: list[Phase] = []
    depfile = None
    host_cc = None
    for raw in text.splitlines():
        if not raw.startswith("#$ "):
            continue  # nvcc's own messages (a deprecation warning): not a phase
        line = raw[3:].strip()
        m = _ASSIGN.match(line)
        if m:
            env[m["name"]] = m["value"]
            continue
        m = _FILTER_DEPS.match(line)
        if m:
            depfile = m["file"].strip().strip('"')
            continue
        try:
            argv = shlex.split(line)
        except ValueError:
            return None
        argv = _drop_redirections(argv)
        if argv is None or not argv:
            return None
        expanded = []
        for tok in argv:
            try:
                expanded.append(_VAR.sub(lambda v: env[v[1] or v[2]], tok))
            except KeyError:
                return None
        argv = expanded
        prog = os.path.basename(argv[0])
        if prog == "rm":
            if all(_TMP.fullmatch(a) for a in argv[1:]):
                continue  # nvcc deleting a temporary file
            return None
        if prog in ("cudafe++", "cicc", "ptxas", "fatbinary"):
            kind = prog
        elif _HOST_CC.match(prog):
            if host_cc is not None and argv[0] != host_cc:
                return None
            host_cc = argv[0]
            if "-E" in argv:
                kind = "device-pp" if any(a.startswith("-D__CUDA_ARCH__=") for a in argv) else "host-pp"
            elif "-c" in argv:
                kind = "host-cc"
            else:
                return None
        else:
            return None
        phases.append(Phase(kind, argv))
    if not _known_shape(phases, env):
        return None
    return env, phases, depfile


def _drop_redirections(argv: list[str]) -> list[str] | None:
    """Remove ``> file`` / ``2> file`` (nvcc --threads collects each phase's output so)."""
    out, i = [], 0
    while i < len(argv):
        tok = argv[i]
        if tok in (">", "2>", "1>"):
            i += 2
            continue
        if re.match(r"^[12]?>\S", tok):
            i += 1
            continue
        if "<" in tok or "|" in tok or tok in ("&&", ";", "||"):
            return None
        out.append(tok)
        i += 1
    return out


def _known_shape(phases: list[Phase], env: Mapping[str, str]) -> bool:
    count = {k: sum(p.kind == k for p in phases) for k in _OUTPUT_OPTS}
    if not (count["host-pp"] == count["cudafe++"] == count["fatbinary"] == count["host-cc"] == 1):
        return False
    if count["device-pp"] < 1 or count["device-pp"] != count["cicc"]:
        return False
    cudafe = next(p for p in phases if p.kind == "cudafe++")
    if "--gen_module_id_file" not in cudafe.argv or cudafe.option("--module_id_file_name") is None:
        return False
    if any(a in _RDC or a.startswith(("-rdc=", "--relocatable-device-code=")) for p in phases for a in p.argv):
        return False
    majors = {a.split("=", 1)[1] for p in phases for a in p.argv if a.startswith("-D__CUDACC_VER_MAJOR__=")}
    if not majors or not majors <= {"12", "13"}:
        return False
    return all(p.outputs() for p in phases)


def module_id(source_name: str, salt: bytes) -> str:
    """A module id in nvcc's format, unique to a translation unit (``salt``: its bytes and flags).

    Examples
    --------
    >>> module_id("relu.cu", b"x")
    '_2d711642_7_relu_cu_b7e8c9e2'
    """
    digest = hashlib.sha256(salt).hexdigest()
    base = os.path.basename(source_name)
    return f"_{digest[:8]}_{len(base)}_{re.sub(r'[^A-Za-z0-9]', '_', base)}_{digest[8:16]}"


def _dryrun(command: Sequence[str], env: Mapping[str, str] | None) -> str | None:
    try:
        proc = subprocess.run([*command, "--dryrun"], capture_output=True, text=True, errors="replace",
                              env=dict(env) if env is not None else None, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:
        return None  # nvcc refuses the flags: the plain nvcc step reports it
    return proc.stderr + proc.stdout


def split_steps(command: Sequence[str], source: str, obj: str, depfile: str, work_dir: Path,
                label: str, env: Mapping[str, str] | None = None) -> list[Step] | None:
    """nvcc's phases of ``command`` as build steps that ninja can run in parallel, or None.

    Parameters
    ----------
    command : sequence of str
        The whole nvcc command, as it would run in one step
        (``nvcc <flags> -MD -MF <obj>.d -c <source> -o <obj>``).
    source, obj, depfile : str
        The ``.cu`` file, the object and the depfile named in ``command``.
    work_dir : pathlib.Path
        A directory for the intermediate files, one per translation unit (created here).
    label : str
        Prefix of the steps' labels (``compile relu.cu``).
    env : mapping, optional
        The environment nvcc would run in (default: this process's).

    Returns
    -------
    list of Step or None
        Steps whose last one writes ``obj`` (and ``depfile``, with the meaning of nvcc's
        ``-MD``: the source and every header of the host and device passes), or None when
        the dry run holds anything unrecognised: the caller then runs ``command`` itself.

    Examples
    --------
    >>> steps = split_steps(["nvcc", "-arch=sm_90", "-c", "k.cu", "-o", "k.o"], "k.cu", "k.o",
    ...                     "k.o.d", Path("/tmp/k.nvcc"), "compile k.cu")  # doctest: +SKIP
    """
    text = _dryrun(command, env)
    if text is None:
        return None
    parsed = parse_dryrun(text)
    if parsed is None:
        log.debug("nvcc --dryrun not recognised; running nvcc as one step:\n%s", text)
        return None
    nv_env, phases, dep_target = parsed
    if dep_target is not None and os.path.abspath(dep_target) != os.path.abspath(depfile):
        return None
    try:
        source_bytes = Path(source).read_bytes()
    except OSError:
        return None
    # Every `tmpxft_<pid>_<n>-<k>_<name>` becomes `<work_dir>/<name>`; bare names (the
    # #include names written into the generated sources) stay bare: all lie in work_dir.
    work_dir = Path(os.path.abspath(work_dir))
    renamed: dict[str, str] = {}

    def rename(m: re.Match) -> str:
        new = m["rest"] if m["dir"] is None else os.fspath(work_dir / m["rest"])
        renamed[m[0]] = new
        return new

    for p in phases:
        p.argv = [_TMP.sub(rename, a) for a in p.argv]
    if len(set(renamed.values())) != len(renamed) or any("tmpxft_" in a for p in phases for a in p.argv):
        return None  # two temporary files would share a name
    cudafe = next(p for p in phases if p.kind == "cudafe++")
    host_cc = next(p for p in phases if p.kind == "host-cc")
    fatbin = next(p for p in phases if p.kind == "fatbinary")
    if os.path.abspath(host_cc.option("-o") or "") != os.path.abspath(obj):
        return None
    if cudafe.option("--gen_c_file_name") not in host_cc.argv:
        return None
    # The stub that cudafe++'s output #includes is written by one cicc (the last arch's).
    stub_name = cudafe.option("--stub_file_name")
    stub_cicc = [p for p in phases if p.kind == "cicc"
                 and os.path.basename(p.option("--stub_file_name") or "") == stub_name]
    if stub_name is None or "/" in stub_name or len(stub_cicc) != 1:
        return None
    fatbin_c = fatbin.option("--embedded-fatbin")
    if fatbin_c is None or os.path.basename(fatbin_c) != stub_cicc[0].option("--include_file_name"):
        return None

    # The host compile of a torch-including .cu writes a large object: its assembler reads
    # the compiler's output as it comes (-pipe changes how, not what, is compiled).
    if "-pipe" not in host_cc.argv:
        host_cc.argv.insert(1, "-pipe")
    # The module id that cudafe++ would generate, written here: cicc no longer waits for it.
    mid_path = cudafe.option("--module_id_file_name")
    cudafe.argv.remove("--gen_module_id_file")
    if any(p.option("--module_id_file_name") != mid_path for p in phases if p.kind == "cicc"):
        return None
    salt_argv = [a for a in command if a not in (source, obj, depfile)]
    work_dir.mkdir(parents=True, exist_ok=True)
    mid = module_id(source, b"\0".join([source_bytes, os.path.basename(source).encode(),
                                        *(a.encode() for a in salt_argv)]))
    Path(mid_path).write_text(mid)

    # Depfiles: nvcc's -MD lists the headers of the host and of every device pass.
    dep_parts: list[str] = []
    if dep_target is not None:
        for i, p in enumerate(x for x in phases if x.kind in ("host-pp", "device-pp")):
            part = os.fspath(work_dir / f"deps{i}.d")
            p.argv[1:1] = ["-MD", "-MF", part, "-MQ", obj]
            dep_parts.append(part)

    prefix = ["env", *(f"{k}={v}" for k, v in nv_env.items()
                       if not k.startswith("_") and k not in _EXPANDED)]
    made_by: dict[str, str] = {}  # file -> the primary output of the step that writes it
    steps: list[Step] = []
    short = {"host-pp": "preprocess host", "device-pp": "preprocess device", "cudafe++": "cudafe++",
             "cicc": "cicc", "ptxas": "ptxas", "fatbinary": "fatbinary", "host-cc": "host compile"}
    for p in phases:
        outs = [os.path.abspath(o) for o in p.outputs()]
        primary = obj if p.kind == "host-cc" else outs[0]
        inputs: list[str] = []
        for a in p.argv[1:]:
            for f in re.findall(r"(?:^|[=,])(/[^\s,=\"]+)", a):
                if f in made_by and made_by[f] not in inputs and f not in outs:
                    inputs.append(made_by[f])
        if p.kind == "host-cc":
            # #include'd, so not on its command line: the stub (from cicc) and, through it,
            # fatbinary's output.
            for f in (fatbin_c, stub_cicc[0].option("--stub_file_name")):
                dep = made_by.get(os.path.abspath(f or ""))
                if dep is None:
                    return None
                if dep not in inputs:
                    inputs.append(dep)
            if dep_parts:
                merge = ("sh", "-c", "cat " + shlex.join(dep_parts) + " > " + shlex.quote(depfile))
                pp = [made_by[os.path.abspath(p2.option("-o"))] for p2 in phases
                      if p2.kind in ("host-pp", "device-pp")]
                steps.append(Step(depfile, tuple(pp), merge, f"{label} (depfile)"))
                inputs.append(depfile)
        elif not inputs and p.kind not in ("host-pp", "device-pp"):
            return None  # a phase that reads nothing another phase wrote: not understood
        for o in outs:
            made_by[o] = primary
        arch = p.option("-arch") or ""
        name = f"{label} ({short[p.kind]}{' ' + arch if arch and p.kind in ('cicc', 'ptxas') else ''})"
        steps.append(Step(primary, tuple(inputs) if p.kind not in ("host-pp", "device-pp")
                          else (os.path.abspath(source),), (*prefix, *p.argv), name,
                          depfile=p.kind == "host-cc" and bool(dep_parts)))
    return steps
