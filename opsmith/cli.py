"""The ``opsmith`` command line: ``doctor``, ``cache``, ``build``, ``warm`` and ``demo``.

Exit status: 0 on success; 1 when an opsmith error stopped the command (shown as
``opsmith: error: ...``) or when ``doctor`` found a problem that blocks builds; 2 for a
command line argparse rejects.
"""
from __future__ import annotations

import argparse
import errno
import json
import os
import shlex
import sys
import time

__all__ = ["build_parser", "main"]


# -- doctor -----------------------------------------------------------------------------------
def _doctor(args) -> int:
    from . import _doctor
    rows = _doctor.run_checks()
    if args.json:
        print(_doctor.to_json(rows))
    else:
        _doctor.render(rows, sys.stdout)
    return _doctor.exit_code(rows)


# -- cache ------------------------------------------------------------------------------------
def _store():
    from ._store import open_store
    return open_store()


def _cache_path(args) -> int:
    from ._config import settings
    print(settings.cache_path)
    return 0


def _cache_ls(args) -> int:
    from ._cache_admin import entries, format_age, format_size
    items = entries(_store())
    now = time.time()
    if args.json:
        print(json.dumps([{"key": e.key, "kind": e.kind, "name": e.name, "size": e.size,
                           "created": e.created, "last_used": e.last_used, "hits": e.hits,
                           "path": os.fspath(e.path)} for e in items], indent=2))
        return 0
    if not items:
        print(f"the cache is empty ({_store().root})")
        return 0
    rows = [(e.name or "-", e.kind, format_size(e.size), format_age(now - e.created),
             format_age(now - e.last_used), str(e.hits), e.key[:16]) for e in items]
    head = ("NAME", "KIND", "SIZE", "AGE", "LAST USE", "HITS", "KEY")
    _print_table(head, rows, right={2, 3, 4, 5})
    return 0


def _print_table(head, rows, right=frozenset()) -> None:
    from ._render import use_rich
    if use_rich(sys.stdout):
        from rich.console import Console
        from rich.table import Table
        table = Table(box=None, header_style="bold")
        for i, h in enumerate(head):
            table.add_column(h, justify="right" if i in right else "left", no_wrap=True)
        for r in rows:
            table.add_row(*r)
        Console().print(table)
        return
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    for r in (head, *rows):
        print("  ".join(str(x).rjust(w) if i in right else str(x).ljust(w)
                        for i, (x, w) in enumerate(zip(r, widths))).rstrip())


def _cache_stats(args) -> int:
    from ._cache_admin import format_size, stats
    store = _store()
    s = stats(store, os.fspath(store.root))
    if args.json:
        print(json.dumps(s.as_dict(), indent=2))
        return 0
    rate = f"{s.hit_rate:.1%}" if s.hit_rate is not None else "-"
    print(f"cache:    {s.root}")
    print(f"entries:  {s.entries}")
    print(f"size:     {format_size(s.bytes)} ({s.bytes} bytes)")
    print(f"hits:     {s.hits} (hit rate {rate}: hits / (hits + builds))")
    for kind, k in s.by_kind.items():
        print(f"  {kind:<10} {k['entries']:>5} entr{'y ' if k['entries'] == 1 else 'ies'}  {format_size(k['bytes']):>10}  {k['hits']:>6} hits")
    return 0


def _report_removal(result, verb: str, dry_run: bool = False) -> None:
    from ._cache_admin import BUSY_SECONDS, format_size
    for e in result.removed:
        print(f"{'would remove' if dry_run else 'removed'} {e.key[:16]}  {e.kind:<10} {e.name or '-':<24} "
              f"{format_size(e.size)}")
    n = len(result.removed)
    locks = f" (and {result.locks_removed} idle lock file{'' if result.locks_removed == 1 else 's'})" \
        if result.locks_removed else ""
    print(f"{verb}: {'would remove' if dry_run else 'removed'} {n} entr{'y' if n == 1 else 'ies'}{locks}, "
          f"{format_size(result.freed)}; {format_size(result.remaining_bytes)} remain")
    if result.skipped_busy:
        k = len(result.skipped_busy)
        print(f"kept {k} entr{'y' if k == 1 else 'ies'} used in the last {BUSY_SECONDS:.0f} s "
              f"(another process may be loading {'it' if k == 1 else 'them'}); --force removes "
              f"{'it' if k == 1 else 'them'} too")


def _cache_prune(args) -> int:
    from ._cache_admin import parse_duration, parse_size, prune
    max_size = parse_size(args.max_size) if args.max_size is not None else None
    older = parse_duration(args.older_than) if args.older_than is not None else None
    result = prune(_store(), max_size=max_size, older_than=older, force=args.force, dry_run=args.dry_run)
    _report_removal(result, "prune", args.dry_run)
    return 0


def _cache_clear(args) -> int:
    from ._cache_admin import clear
    _report_removal(clear(_store(), force=args.force), "clear")
    return 0


def _cache_verify(args) -> int:
    from ._cache_admin import verify
    checked, bad = verify(_store(), remove=not args.keep)
    for info, problem in bad:
        action = "kept" if args.keep else "removed"
        print(f"corrupt {info.key[:16]}  {info.kind:<10} {info.name or '-'}: {problem} ({action})")
    print(f"verified {checked} entr{'y' if checked == 1 else 'ies'}: {len(bad)} corrupt"
          + ("" if not bad or args.keep else ", removed (they rebuild on next use)"))
    return 1 if bad and args.keep else 0


# -- build / warm -----------------------------------------------------------------------------
def _split(values) -> list[str]:
    out: list[str] = []
    for v in values or ():
        out.extend(shlex.split(v))
    return out


def _build(args) -> int:
    from ._extension import build
    name = args.name or os.path.splitext(os.path.basename(args.files[0]))[0].replace("-", "_")
    art = build(name, list(args.files), extra_cflags=_split(args.cflags),
                extra_cuda_cflags=_split(args.cuda_cflags), extra_ldflags=_split(args.ldflags),
                extra_include_paths=args.include or None, verbose=args.verbose, with_cuda=args.cuda,
                is_python_module=args.kind == "module", is_standalone=args.kind == "executable")
    if args.json:
        print(json.dumps({"name": art.name, "kind": art.kind, "path": os.fspath(art.path), "key": art.key,
                          "built": art.built, "compiled_units": art.compiled_units,
                          "seconds": round(art.seconds, 3)}, indent=2))
    elif art.built:
        print(f"built {art.name} ({art.kind}) in {art.seconds:.1f} s, {art.compiled_units} "
              f"unit{'s' * (art.compiled_units != 1)} compiled: {art.path}")
    else:
        print(f"{art.name} ({art.kind}) is already in the cache: {art.path}")
    return 0


def warm(*, with_cuda: bool = False, extra_cflags=(), verbose: bool = False):
    """Build the precompiled torch headers (and the link stubs) that builds with these flags use;
    returns ``(Pch, Compiler)``.

    The PCH is keyed by the compiler, torch and the exact flags, so ``extra_cflags`` (and
    ``with_cuda``, which adds CUDA's include directories) must match the later builds'.
    """
    from ._build import warm_spec
    from ._config import settings
    from ._errors import ToolchainError
    from ._extension import _verbose
    from ._progress import Progress
    from ._spec import ExtensionSpec
    if not settings.pch:
        raise ToolchainError("precompiled headers are switched off (OPSMITH_PCH=0): there is "
                             "nothing to warm. Unset OPSMITH_PCH to use them.")
    spec = ExtensionSpec.from_inline("warm", "// opsmith warm", kind="module", with_cuda=with_cuda,
                                     extra_cflags=list(extra_cflags), verbose=verbose)
    with _verbose(verbose), Progress("warm", verbose=verbose) as progress:
        pch, cxx = warm_spec(spec, on_status=progress.status)
    if pch is None:
        raise ToolchainError(f"the precompiled torch headers could not be built with {cxx.path}; "
                             f"builds still work, only slower. Run with -v to see the compiler's output.")
    return pch, cxx


def _warm(args) -> int:
    pch, cxx = warm(with_cuda=args.cuda, extra_cflags=_split(args.cflags), verbose=args.verbose)
    what = f"precompiled torch headers for {cxx.family} {cxx.version}"
    if pch.built_seconds is None:
        print(f"{what} are already in the cache ({pch.key[:16]})")
    else:
        print(f"built {what} in {pch.built_seconds:.1f} s ({pch.key[:16]})")
    return 0


# -- settings ---------------------------------------------------------------------------------
def _default_text(setting) -> str:
    """A setting's default as the docs show it: computed with HOME as ``~`` and no XDG vars."""
    saved = {k: os.environ.get(k) for k in ("HOME", "XDG_CACHE_HOME")}
    os.environ["HOME"] = "~"
    os.environ.pop("XDG_CACHE_HOME", None)
    try:
        value = setting.default()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    if isinstance(value, bool):
        value = int(value)
    return "unset" if value is None else f"`{value}`"


def settings_markdown() -> str:
    """docs/settings.md, generated from ``Settings.describe()`` (a test keeps the page current)."""
    from ._config import Settings
    lines = ["# Settings", "",
             "Every environment variable opsmith reads. Values are read at each use, so changing "
             "`os.environ` at run time works; `opsmith.settings.override(name=value)` changes them "
             "in code for one thread and block. `opsmith settings` shows the values in effect.", "",
             "<!-- generated by `opsmith settings --markdown > docs/settings.md`; "
             "tests/test_cli.py fails when this page is out of date -->", "",
             "| variable | setting | default | meaning |", "| --- | --- | --- | --- |"]
    for st in Settings.describe():
        variables = "<br>".join(f"`{v}`" for v in st.env)
        doc = " ".join(st.doc.split()).replace("|", "\\|")
        lines.append(f"| {variables} | `{st.name}` | {_default_text(st)} | {doc} |")
    lines += ["", "When several variables are listed, the first one set (and not empty) wins. An invalid "
              "value raises `opsmith.ConfigError` naming the variable; `opsmith doctor` reports it.", ""]
    return "\n".join(lines)


def _settings(args) -> int:
    from ._config import settings
    from ._errors import ConfigError
    if args.markdown:
        sys.stdout.write(settings_markdown())
        return 0
    rows = []
    for st in settings.describe():
        source = next((v for v in st.env if os.environ.get(v)), None)
        try:
            value = getattr(settings, st.name)
            shown = "unset" if value is None else str(value)
        except ConfigError:
            shown = f"INVALID: {os.environ.get(source or '', '')!r}"
        rows.append((st.name, shown, source or "default", " ".join(st.env)))
    _print_table(("SETTING", "VALUE", "FROM", "VARIABLES"), rows)
    return 0


def _demo(args) -> int:
    from ._demo import run_demo
    return run_demo(fresh=args.fresh)


# -- parser -----------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    from ._version import __version__
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
    p.set_defaults(func=_doctor)

    cache = sub.add_parser("cache", help="list, count, prune, clear or verify the cache")
    csub = cache.add_subparsers(dest="cache_command", required=True, metavar="ACTION")
    c = csub.add_parser("ls", help="every entry: name, kind, size, age, last use, hits")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=_cache_ls)
    c = csub.add_parser("stats", help="entries, bytes and hit rate")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=_cache_stats)
    c = csub.add_parser("prune", help="remove least recently used entries",
                        description="Remove least recently used entries until the cache fits --max-size, "
                        "and entries unused for --older-than. Safe while other processes use the cache: "
                        "entries used in the last 60 s are kept unless --force.")
    c.add_argument("--max-size", metavar="SIZE", help="keep at most this much, e.g. 2G, 500M")
    c.add_argument("--older-than", metavar="AGE", help="remove entries unused for this long, e.g. 30d, 12h")
    c.add_argument("--force", action="store_true", help="also remove entries used in the last 60 s")
    c.add_argument("--dry-run", action="store_true", help="say what would be removed, remove nothing")
    c.set_defaults(func=_cache_prune)
    c = csub.add_parser("clear", help="remove every entry")
    c.add_argument("--force", action="store_true", help="also remove entries used in the last 60 s")
    c.set_defaults(func=_cache_clear)
    c = csub.add_parser("verify", help="re-hash every entry; remove corrupt ones")
    c.add_argument("--keep", action="store_true", help="report corrupt entries without removing them "
                   "(exit status 1 if any)")
    c.set_defaults(func=_cache_verify)
    c = csub.add_parser("path", help="print the cache directory")
    c.set_defaults(func=_cache_path)

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
    p.set_defaults(func=_build)

    p = sub.add_parser("warm", help="build the precompiled torch headers ahead of time",
                       description="Build the precompiled torch headers (the slowest part of a first "
                       "build) into the cache, for container images and CI.")
    p.add_argument("--cuda", action="store_true", help="for builds with CUDA sources (adds CUDA's headers)")
    p.add_argument("--cflags", action="append", metavar="FLAGS",
                   help="the extra_cflags your builds use (the headers are keyed by them)")
    p.add_argument("-v", "--verbose", action="store_true", help="log the compiler command")
    p.set_defaults(func=_warm)

    p = sub.add_parser("settings", help="every setting: its value, and the variable it comes from")
    p.add_argument("--markdown", action="store_true", help="print docs/settings.md")
    p.set_defaults(func=_settings)

    p = sub.add_parser("demo", help="build the tutorial's ReLU op, check it, time cold and warm loads")
    p.add_argument("--fresh", action="store_true", help="use a new empty cache directory")
    p.set_defaults(func=_demo)
    return parser


_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS)


def _disk_error(exc: OSError):
    """A full disk or a permission error met outside the store's own checks, said readably."""
    from ._config import settings
    from ._errors import CacheError
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
    from ._errors import OpsmithError
    from ._render import render_error
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
