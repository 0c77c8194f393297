"""The ``opsmith`` command line: ``doctor``, ``cache``, ``build``, ``warm`` and ``demo``.

Exit status: 0 on success; 1 when an opsmith error stopped the command (shown as
``opsmith: error: ...``) or when ``doctor`` found a problem that blocks builds; 2 for a
command line argparse rejects.
"""
from __future__ import annotations

import argparse
import errno
import os
import sys

__all__ = ["build_parser", "main"]


def _command(module: str, name: str):
    """The function ``name`` of a command module, imported when run: ``opsmith.cli.<module>``, or
    a target's own command module named in full (``"opsmith.export_c._cli"``)."""
    def run(args):
        import importlib
        return getattr(importlib.import_module(module if "." in module else f"opsmith.cli.{module}"), name)(args)
    return run


# -- parser -----------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    from opsmith._version import __version__
    parser = argparse.ArgumentParser(
        prog="opsmith", description="C++ and CUDA source to PyTorch ops: check the machine, "
        "build ahead of time, look after the cache.")
    parser.add_argument("--version", action="version", version=f"opsmith {__version__}")
    parser.add_argument("--cache-dir", metavar="DIR",
                        help="use this cache directory (default: OPSMITH_CACHE_DIR, else ~/.cache/opsmith)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("doctor", help="check compilers, torch, CUDA, GPUs and the cache; say how to fix problems",
                       description="One table of everything opsmith needs and what was found. Exit status "
                       "1 when something blocks builds.")
    p.add_argument("--json", action="store_true", help="print the checks as JSON")
    p.set_defaults(func=_command("_cmd_doctor", "run"))

    cache = sub.add_parser("cache", help="list, count, prune, clear or verify the cache")
    csub = cache.add_subparsers(dest="cache_command", required=True, metavar="ACTION")
    c = csub.add_parser("ls", help="every entry: name, kind, size, age, last use, hits")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=_command("_cmd_cache", "_cache_ls"))
    c = csub.add_parser("stats", help="entries, bytes and hit rate")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=_command("_cmd_cache", "_cache_stats"))
    c = csub.add_parser("prune", help="remove least recently used entries",
                        description="Remove least recently used entries until the cache fits --max-size, "
                        "and entries unused for --older-than. Safe while other processes use the cache: "
                        "entries used in the last 60 s are kept unless --force.")
    c.add_argument("--max-size", metavar="SIZE", help="keep at most this much, e.g. 2G, 500M")
    c.add_argument("--older-than", metavar="AGE", help="remove entries unused for this long, e.g. 30d, 12h")
    c.add_argument("--force", action="store_true", help="also remove entries used in the last 60 s")
    c.add_argument("--dry-run", action="store_true", help="say what would be removed, remove nothing")
    c.set_defaults(func=_command("_cmd_cache", "_cache_prune"))
    c = csub.add_parser("clear", help="remove every entry")
    c.add_argument("--force", action="store_true", help="also remove entries used in the last 60 s")
    c.set_defaults(func=_command("_cmd_cache", "_cache_clear"))
    c = csub.add_parser("verify", help="re-hash every entry; remove corrupt ones")
    c.add_argument("--keep", action="store_true", help="report corrupt entries without removing them "
                   "(exit status 1 if any)")
    c.set_defaults(func=_command("_cmd_cache", "_cache_verify"))
    c = csub.add_parser("path", help="print the cache directory")
    c.set_defaults(func=_command("_cmd_cache", "_cache_path"))
    c = csub.add_parser("export", help="write entries to one signed bundle file (for images and "
                        "air-gapped clusters)", description="Write the chosen entries (default: all) "
                        "to FILE, each signed with the key in OPSMITH_REMOTE_KEY_FILE. `opsmith cache "
                        "import FILE` on another machine checks and installs them.")
    c.add_argument("file", metavar="FILE")
    c.add_argument("--kind", action="append", metavar="KIND",
                   help="only entries of this kind (module, library, cubin, ptx, object, ...)")
    c.add_argument("--name", action="append", metavar="GLOB", help="only entries whose name matches")
    c.add_argument("--key", action="append", metavar="PREFIX", help="only entries whose key starts so")
    c.set_defaults(func=_command("_cmd_bundle", "_export"))
    c = csub.add_parser("import", help="check and install the entries of a bundle file",
                        description="Verify every entry of FILE (signature with OPSMITH_REMOTE_KEY_FILE, "
                        "then each file's sha256) and install them into the cache; any refused "
                        "entry installs nothing (exit status 1).")
    c.add_argument("file", metavar="FILE")
    c.set_defaults(func=_command("_cmd_bundle", "_import"))

    p = sub.add_parser("build", help="build C++/CUDA sources into the cache ahead of time",
                       description="Build sources as opsmith.load would, into the cache, without loading "
                       "them: for container images and CI. A later load() with the same sources and "
                       "flags is a cache hit.")
    p.add_argument("files", nargs="+", metavar="FILE", help="C++ (.cpp) and CUDA (.cu) sources")
    p.add_argument("--name", help="the extension's name (default: the first file's stem)")
    p.add_argument("--cflags", action="append", metavar="FLAGS",
                   help="extra compiler flags, as one shell-quoted string: --cflags='-O3 -DNDEBUG'")
    p.add_argument("--cuda-cflags", action="append", metavar="FLAGS", help="extra nvcc flags")
    p.add_argument("--ldflags", action="append", metavar="FLAGS", help="extra linker flags")
    p.add_argument("-I", "--include", action="append", metavar="DIR", help="extra include directory")
    kind = p.add_mutually_exclusive_group()
    kind.add_argument("--library", dest="kind", action="store_const", const="library",
                      help="a library of TORCH_LIBRARY ops (load's is_python_module=False)")
    kind.add_argument("--executable", dest="kind", action="store_const", const="executable",
                      help="an executable (load's is_standalone=True)")
    p.set_defaults(kind="module")
    p.add_argument("--cuda", action=argparse.BooleanOptionalAction, default=None,
                   help="build with CUDA (default: when a source is .cu)")
    p.add_argument("--json", action="store_true", help="print the artifact as JSON")
    p.add_argument("-v", "--verbose", action="store_true", help="log every command")
    p.set_defaults(func=_command("_cmd_build", "_build"))

    p = sub.add_parser("warm", help="build the precompiled torch headers ahead of time",
                       description="Build the precompiled torch headers (the slowest part of a first "
                       "build) into the cache, for container images and CI.")
    p.add_argument("--cuda", action="store_true", help="for builds with CUDA sources (adds CUDA's headers)")
    p.add_argument("--cflags", action="append", metavar="FLAGS",
                   help="the extra_cflags your builds use (the headers are keyed by them)")
    p.add_argument("-v", "--verbose", action="store_true", help="log the compiler command")
    p.add_argument("--ops", action="store_true",
                   help="instead: compile the opsmith.ops kernels (every op, dtype and direction, all at once) and "
                   "build the torch C++ libraries they run on")
    p.add_argument("--arch", action="append", metavar="ARCH",
                   help="with --ops: target arch, e.g. sm_90 (repeatable; default OPSMITH_CUDA_ARCH, else this GPU's)")
    p.set_defaults(func=_command("_cmd_build", "_warm"))

    p = sub.add_parser("export-c", help="export CUDA kernels as a C library: header, source with the code "
                       "inside, manifest", description="Compile kernels with NVRTC for several archs and write "
                       "<prefix>.h (one typed launch function per kernel), <prefix>.c (the code embedded; no "
                       "libcuda, torch or Python at link time) and <prefix>.json (the manifest). See "
                       "docs/export_c.md.")
    p.add_argument("sources", nargs="+", metavar="SOURCE", help="CUDA sources (.cu)")
    p.add_argument("-k", "--kernel", action="append", metavar="NAME",
                   help="a kernel or name expression ('scale<float>', or 'scale_f=scale<float>' to name "
                   "the C function); repeat; default: every kernel that is not a template")
    p.add_argument("-o", "--out", default=".", metavar="DIR", help="output directory (default: .)")
    p.add_argument("--prefix", help="C prefix: opsmith_<prefix>_<kernel>_launch (default: the first file's stem)")
    p.add_argument("--arch", action="append", metavar="ARCH",
                   help="sm_80, sm_90, ...; repeat or comma-separate (default: the common archs NVRTC supports)")
    p.add_argument("--ptx", action=argparse.BooleanOptionalAction, default=True,
                   help="also embed PTX of the newest arch for newer GPUs (default: on)")
    p.add_argument("--library", choices=("static", "shared", "both"),
                   help="also build lib<prefix>.a / lib<prefix>.so (opsmith's build engine: cached)")
    p.add_argument("--cc", metavar="CC",
                   help="the C compiler for --library (default: CC, else the C++ compiler's C sibling)")
    p.add_argument("-I", "--include", action="append", metavar="DIR", help="include directory for NVRTC")
    p.add_argument("-D", "--define", action="append", metavar="NAME=VALUE", help="macro for NVRTC")
    p.add_argument("--option", action="append", metavar="OPT", help="extra NVRTC option, e.g. --option=-lineinfo")
    p.add_argument("--json", action="store_true", help="print the files, kernels and times as JSON")
    p.set_defaults(func=_command("opsmith.export_c._cli", "run"))

    p = sub.add_parser("package", help="build a wheel of a module's ops that runs with no compile",
                       description="Import MODULE (a package that defines ops) in a fresh process, compile every "
                       "kernel it compiles for each arch (cubins, PTX of the newest), take the C-shim op library, "
                       "and write one reproducible wheel: pip install it on a machine with no compiler and no "
                       "NVRTC and the ops load with zero compiles. See docs/packaging.md.")
    p.add_argument("module", nargs="?", metavar="MODULE", help="a top-level package that defines ops on import")
    p.add_argument("--ops", action="store_true", help="instead: a wheel of opsmith.ops' kernels (opsmith-ops-kernels)")
    p.add_argument("-o", "--out", default="dist", metavar="DIR", help="output directory (default: dist)")
    p.add_argument("--arch", action="append", metavar="ARCH",
                   help="sm_80, sm_90, ...; repeat or comma-separate (default: sm_75 ... sm_120, those NVRTC supports)")
    p.add_argument("--ptx", action=argparse.BooleanOptionalAction, default=True,
                   help="also ship PTX of the newest arch for newer GPUs (default: on)")
    p.add_argument("--version", dest="pkg_version", metavar="VERSION",
                   help="the wheel's version (default: the package's __version__, else 0.0.0)")
    p.add_argument("--sign", metavar="KEYFILE", help="sign the manifest with this key (HMAC-SHA256)")
    p.add_argument("--with", dest="with_", action="append", choices=("c", "onnxruntime"),
                   help="c: also ship each kernel program as a C library (opsmith export-c: header, source, "
                   "lib<name>.so) under _opsmith/c/; onnxruntime: the module's ops as an ONNX Runtime custom-op "
                   "library under _opsmith/onnxruntime/ (CPU functions from the module's __opsmith_onnx__)")
    p.add_argument("--versioned-namespace", action="store_true",
                   help="register the installed package's ops as <namespace>_<version>::name (relupkg_1_0_0::relu) "
                   "so that two versions of the package can be loaded in one process; call them through the "
                   "module's op objects (relupkg.relu) or torch.ops.relupkg_1_0_0")
    p.add_argument("--json", action="store_true", help="print the wheel, archs, ops and sizes as JSON")
    p.set_defaults(func=_command("opsmith.package._cli", "run"))

    p = sub.add_parser("settings", help="every setting: its value, and the variable it comes from")
    p.add_argument("--markdown", action="store_true", help="print docs/settings.md")
    p.set_defaults(func=_command("_cmd_settings", "_settings"))

    p = sub.add_parser("demo", help="build the tutorial's ReLU op, check it, time cold and warm loads")
    p.add_argument("--fresh", action="store_true", help="use a new empty cache directory")
    p.set_defaults(func=_command("_cmd_demo", "_demo"))
    return parser


_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS)


def _disk_error(exc: OSError):
    """A full disk or a permission error met outside the store's own checks, said readably."""
    from opsmith._config import settings
    from opsmith._errors import CacheError
    where = f" ({exc.filename})" if exc.filename else ""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return CacheError(f"no space left on the device{where}: {exc.strerror}. Free space with "
                          f"`opsmith cache prune --max-size 2G`, or set OPSMITH_CACHE_DIR to a disk with room "
                          f"(now {settings.cache_path}).")
    return CacheError(f"permission denied{where}: {exc.strerror}. Fix the permissions, or set "
                      f"OPSMITH_CACHE_DIR to a directory you can write (now {settings.cache_path}); "
                      f"`opsmith doctor` checks it.")


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.cache_dir:
        os.environ["OPSMITH_CACHE_DIR"] = os.path.abspath(os.path.expanduser(args.cache_dir))
    from opsmith._errors import OpsmithError
    from opsmith.cli._render import render_error
    try:
        return int(args.func(args) or 0)
    except OpsmithError as exc:
        render_error(exc, sys.stderr, verbose=bool(getattr(args, "verbose", False)))
        return 1
    except OSError as exc:
        if exc.errno not in _DISK_ERRNOS:
            raise
        render_error(_disk_error(exc), sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("opsmith: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
