"""Header dependencies: reading compiler depfiles, and the index that turns a pre-key into a key.

A translation unit's final key covers its headers' bytes, which are known only after the
compiler ran (from its ``-MD`` depfile). So each unit has a *pre-key* (its source bytes,
flags and toolchain) and the store keeps, under that pre-key, the header sets seen so far,
each with the key it produced. A lookup re-checks a recorded header set against the files
now on disk (by size and mtime first, by sha256 when those moved) and yields that key.

Headers inside the toolchain (torch's, Python's, the compiler's own and the CUDA toolkit's)
are covered by those tools' fingerprints rather than hashed one by one: torch/extension.h
alone pulls in over a thousand files, and re-checking them would cost a warm load its budget.
"""
from __future__ import annotations

import os
from collections.abc import Iterable

from opsmith._cache._stamps import stamp_of
from opsmith._cache._keys import KeyBuilder, file_sha256

__all__ = ["parse_depfile", "DepIndex", "snapshot", "key_for", "real_path"]

_MAX_VARIANTS = 8


def parse_depfile(text: str) -> list[str]:
    """The prerequisites in a Makefile-syntax depfile (``-MD``), unescaped, targets dropped."""
    text = text.replace("\\\r\n", " ").replace("\\\n", " ")
    deps: list[str] = []
    for rule in text.splitlines():
        if ":" not in rule:
            continue
        # The target ends at the first ': ' that is not escaped (paths may hold 'C:' on Windows).
        idx = _target_end(rule)
        if idx < 0:
            continue
        tokens, cur, i, body = [], [], 0, rule[idx + 1:]
        while i < len(body):
            c = body[i]
            if c == "\\" and i + 1 < len(body) and body[i + 1] in " #\\":
                cur.append(body[i + 1])
                i += 2
                continue
            if c == "$" and i + 1 < len(body) and body[i + 1] == "$":
                cur.append("$")
                i += 2
                continue
            if c.isspace():
                if cur:
                    tokens.append("".join(cur))
                    cur = []
            else:
                cur.append(c)
            i += 1
        if cur:
            tokens.append("".join(cur))
        deps.extend(tokens)
    seen, out = set(), []
    for d in deps:
        if d not in seen:
            seen.add(d)
            out.append(d)
    return out


def _target_end(rule: str) -> int:
    i = 0
    while True:
        i = rule.find(":", i)
        if i < 0:
            return -1
        if i + 1 >= len(rule) or rule[i + 1] in " \t":
            return i
        i += 1


class DepIndex:
    """Pre-key -> [(header set, key)] records kept in the machine-local state."""

    def __init__(self, state, namespace: str = "deps2") -> None:
        self.state = state
        self.namespace = namespace

    def resolve(self, prekey: str) -> str | None:
        found = self.resolve_with_deps(prekey)
        return None if found is None else found[0]

    def resolve_with_deps(self, prekey: str, root: tuple[str, str] | None = None
                          ) -> tuple[str, list[str]] | None:
        """The key of the recorded header set that matches the disk, and those headers' paths.

        ``root`` is ``(real root, canonical root)`` for a unit whose key names the headers under
        its sources' root canonically (see :func:`snapshot`): they are checked under ``real root``.
        """
        rec = self.state.get(self.namespace, prekey)
        if not isinstance(rec, dict):
            return None
        for variant in reversed(rec.get("variants", [])):
            try:
                deps = [[real_path(dep[0], root), *dep[1:]] for dep in variant["deps"]]
                if all(_dep_matches(*dep) for dep in deps):
                    return variant["key"], [dep[0] for dep in deps]
            except (TypeError, ValueError, KeyError, IndexError):
                continue
        return None

    def record(self, prekey: str, deps: list[list]) -> str:
        """Record a header set for ``prekey``; returns the key it yields."""
        key = key_for(prekey, deps)
        rec = self.state.get(self.namespace, prekey)
        variants = rec.get("variants", []) if isinstance(rec, dict) else []
        variants = [v for v in variants if v.get("key") != key]
        variants.append({"deps": deps, "key": key})
        self.state.put(self.namespace, prekey, {"variants": variants[-_MAX_VARIANTS:]})
        return key


def key_for(prekey: str, deps: list[list]) -> str:
    """The unit key: the pre-key and each header's path (as recorded: canonical under the
    sources' root, absolute elsewhere) and sha256."""
    kb = KeyBuilder("unit").str("prekey", prekey)
    for path, sha, *_stamp in sorted(deps):
        kb.str("dep", path).str("sha", sha)
    return kb.hexdigest()


def snapshot(paths: Iterable[str], exclude_roots: Iterable[str], base: str = ".",
             root: tuple[str, str] | None = None) -> list[list]:
    """``[path, sha256, *stamp]`` for each user header (toolchain headers excluded).

    Relative paths in ``paths`` are relative to ``base`` (the directory the compiler ran in).
    With ``root`` = ``(real root, canonical root)``, a header under the real root is recorded
    (and keyed) by its canonical path, so that checkouts at two paths share the record; one
    outside it by its absolute path. Either way its bytes are keyed by their sha256.
    """
    roots = tuple(r.rstrip("/") + "/" for r in exclude_roots if r)
    out = []
    for p in paths:
        ap = os.path.realpath(os.path.join(base, p))
        if ap.startswith(roots):
            continue
        try:
            st = os.stat(ap)
            out.append([_canonical(ap, root), file_sha256(ap), *stamp_of(st)])
        except OSError:
            continue  # a header that vanished: the compiler saw it, the next lookup will miss
    return out


def _canonical(path: str, root: tuple[str, str] | None) -> str:
    if root is not None and path.startswith(root[0].rstrip("/") + "/"):
        return root[1] + path[len(root[0].rstrip("/")):]
    return path


def real_path(path: str, root: tuple[str, str] | None) -> str:
    """A recorded header path on this disk: a canonical one under the real root."""
    if root is not None and path.startswith(root[1] + "/"):
        return root[0].rstrip("/") + path[len(root[1]):]
    return path


def _dep_matches(path: str, sha: str, *recorded: int) -> bool:
    """True when ``path`` still holds the bytes recorded (``sha``).

    The full stamp (size, mtime, ctime, inode) unchanged means unchanged; a same-size file
    with any other stamp (a fresh checkout, a copy, or an edit that restored the mtime,
    which moves ctime) is compared by its bytes.
    """
    try:
        st = os.stat(path)
    except OSError:
        return False
    if len(recorded) != 4 or st.st_size != recorded[0]:
        return False
    if stamp_of(st) == list(recorded):
        return True
    try:
        return file_sha256(path) == sha
    except OSError:
        return False
