"""`opsmith cache path/ls/stats/prune/clear/verify` over the Store interface."""
from __future__ import annotations

import json
import os
import sys
import time

def _cache():
    from opsmith._cache._open import open_cache
    return open_cache()


def _cache_path(args) -> int:
    from opsmith._config import settings
    print(settings.cache_path)
    return 0


def _cache_ls(args) -> int:
    from opsmith._cache._admin import entries, format_age, format_size
    items = entries(_cache())
    now = time.time()
    if args.json:
        print(json.dumps([{"key": e.key, "kind": e.kind, "name": e.name, "size": e.size,
                           "created": e.created, "last_used": e.last_used, "hits": e.hits,
                           "path": os.fspath(e.path)} for e in items], indent=2))
        return 0
    if not items:
        print(f"the cache is empty ({_cache().root})")
        return 0
    rows = [(e.name or "-", e.kind, format_size(e.size), format_age(now - e.created),
             format_age(now - e.last_used), str(e.hits), e.key[:16]) for e in items]
    head = ("NAME", "KIND", "SIZE", "AGE", "LAST USE", "HITS", "KEY")
    print_table(head, rows, right={2, 3, 4, 5})
    return 0


def print_table(head, rows, right=frozenset()) -> None:
    from opsmith.cli._render import use_rich
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
    from opsmith._cache._admin import format_size, stats
    cache = _cache()
    s = stats(cache, os.fspath(cache.root))
    if args.json:
        from opsmith._cache._tiered import tier_stats
        from opsmith.compile_cache._stats import read
        print(json.dumps(s.as_dict() | {"tiers": tier_stats(cache.root)["tiers"],
                                        "compile": read(cache.root)["artifacts"]}, indent=2))
        return 0
    rate = f"{s.hit_rate:.1%}" if s.hit_rate is not None else "-"
    print(f"cache:    {s.root}")
    print(f"entries:  {s.entries}")
    print(f"size:     {format_size(s.bytes)} ({s.bytes} bytes)")
    print(f"hits:     {s.hits} (hit rate {rate}: hits / (hits + builds))")
    for kind, k in s.by_kind.items():
        print(f"  {kind:<10} {k['entries']:>5} entr{'y ' if k['entries'] == 1 else 'ies'}  {format_size(k['bytes']):>10}  {k['hits']:>6} hits")
    pch = s.by_kind.get("pch")
    if pch and s.bytes:
        n = pch["entries"]
        print(f"precompiled headers: {format_size(pch['bytes'])} in {n} entr{'y' if n == 1 else 'ies'} "
              f"({pch['bytes'] / s.bytes:.0%} of the cache): one per compiler and flag set "
              f"(~170 MB with clang, ~750 MB with gcc); prune removes unused ones like any entry")
    _print_tiers(cache.root)
    _print_compile(cache.root)
    return 0


def _print_compile(root) -> None:
    """torch.compile's artifacts through opsmith (kept only when the compile cache was used)."""
    from opsmith.compile_cache._stats import rows
    table = rows(root)
    if not table:
        return
    print("compile:  (torch.compile through opsmith: docs/compile_cache.md)")
    print_table(("  ARTIFACT", "HITS", "MISSES", "PUTS", "WAITED", "COMPILES", "S/WAIT"),
                [(f"  {r[0]}", *r[1:]) for r in table], right={1, 2, 3, 4, 5, 6})


def _print_tiers(root) -> None:
    """The shared-cache counters per tier (kept only when OPSMITH_REMOTE_CACHE was used)."""
    from opsmith._cache._tiered import tier_stats
    doc = tier_stats(root)
    if not doc["tiers"]:
        return
    print(f"tiers:    (shared cache {doc['remote']})")
    rows = []
    for tier, c in sorted(doc["tiers"].items()):
        lookups = c.get("hits", 0) + c.get("misses", 0)
        ms = f"{1000 * c.get('seconds', 0) / lookups:.1f}" if tier == "remote" and lookups else "-"
        rows.append((tier, *(str(int(c.get(k, 0))) for k in ("hits", "misses", "puts", "refused", "errors")), ms))
    print_table(("  TIER", "HITS", "MISSES", "PUTS", "REFUSED", "ERRORS", "MS/LOOKUP"),
                [(f"  {r[0]}", *r[1:]) for r in rows], right={1, 2, 3, 4, 5, 6})


def _report_removal(result, verb: str, dry_run: bool = False) -> None:
    from opsmith._cache._admin import BUSY_SECONDS, format_size
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
    from opsmith._cache._admin import parse_duration, parse_size, prune
    from opsmith._errors import ConfigError
    # A command line that is not understood exits 2 (docs/cli.md), as argparse's own errors do.
    if args.max_size is None and args.older_than is None:
        return _usage_error("prune needs --max-size or --older-than (or both), e.g. --max-size 2G")
    try:
        max_size = parse_size(args.max_size) if args.max_size is not None else None
        older = parse_duration(args.older_than) if args.older_than is not None else None
    except ConfigError as exc:
        return _usage_error(str(exc))
    result = prune(_cache(), max_size=max_size, older_than=older, force=args.force, dry_run=args.dry_run)
    _report_removal(result, "prune", args.dry_run)
    return 0


def _usage_error(text: str) -> int:
    print(f"usage: opsmith cache prune [--max-size SIZE] [--older-than AGE] [--force] [--dry-run]\n"
          f"opsmith cache prune: error: {text}", file=sys.stderr)
    return 2


def _cache_clear(args) -> int:
    from opsmith._cache._admin import clear
    _report_removal(clear(_cache(), force=args.force), "clear")
    return 0


def _cache_verify(args) -> int:
    from opsmith._cache._admin import verify
    checked, bad = verify(_cache(), remove=not args.keep)
    for info, problem in bad:
        action = "kept" if args.keep else "removed"
        print(f"corrupt {info.key[:16]}  {info.kind:<10} {info.name or '-'}: {problem} ({action})")
    print(f"verified {checked} entr{'y' if checked == 1 else 'ies'}: {len(bad)} corrupt"
          + ("" if not bad or args.keep else ", removed (they rebuild on next use)"))
    return 1 if bad and args.keep else 0
