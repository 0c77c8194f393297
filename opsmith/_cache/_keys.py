"""Cache keys: typed, length-prefixed hashing so that different inputs cannot collide."""
from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable

__all__ = ["KeyBuilder", "file_sha256", "bytes_sha256", "KEY_LENGTH"]

KEY_LENGTH = 32  # hex characters (128 bits) in a cache key


def bytes_sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: str | os.PathLike) -> str:
    """The sha256 of a file's bytes, read in large chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


class KeyBuilder:
    """Accumulates typed fields into a key.

    Each field is written as ``tag``, a type letter, its length and its bytes, so that
    ``("ab", "c")`` and ``("a", "bc")`` hash differently, and a string never equals bytes.

    Examples
    --------
    >>> k = KeyBuilder("example").str("name", "relu").strs("flags", ["-O2"])
    >>> len(k.hexdigest())
    32
    """

    def __init__(self, domain: str) -> None:
        self._h = hashlib.sha256()
        self.str("domain", domain)

    def _field(self, tag: str, kind: bytes, data: bytes) -> KeyBuilder:
        t = tag.encode()
        self._h.update(b"%d:%s%s%d:" % (len(t), t, kind, len(data)))
        self._h.update(data)
        return self

    def str(self, tag: str, value: str | None) -> KeyBuilder:
        if value is None:
            return self._field(tag, b"N", b"")
        return self._field(tag, b"S", value.encode("utf-8", "surrogateescape"))

    def bytes(self, tag: str, value: bytes) -> KeyBuilder:
        return self._field(tag, b"B", value)

    def strs(self, tag: str, values: Iterable[str]) -> KeyBuilder:
        values = list(values)
        self._field(tag, b"L", str(len(values)).encode())
        for v in values:
            self.str(tag, v)
        return self

    def mapping(self, tag: str, values: dict[str, str]) -> KeyBuilder:
        items = sorted(values.items())
        self._field(tag, b"M", str(len(items)).encode())
        for k, v in items:
            self.str(tag + ".k", k).str(tag + ".v", v)
        return self

    def hexdigest(self) -> str:
        return self._h.hexdigest()[:KEY_LENGTH]
