"""Bundles: one cache entry as one immutable byte string, signed, and files of many bundles.

An entry bundle is ``MAGIC``, a 4-byte header length, a JSON header and the entry's files
concatenated in name order::

    header = {"format": 1, "key": <key>, "manifest": {"kind", "name", "meta", "created",
              "files": {name: {"sha256", "size"}}}, "signature": {"alg", "key_id", "mac"} | null}

It is written to a shared backend as one value (one Redis ``SET``, one ``os.replace``), so a
reader sees all of it or nothing. :func:`unpack` checks, in order: the framing, that the
bundle names the key it was stored under, the signature, then every file's size and sha256.

Signing: HMAC-SHA256, with the cluster's shared secret, over the key and the manifest (which
holds each file's sha256). Binding the key makes a bundle copied or replayed under another
key (two keys' files swapped, an older entry written over a newer key) fail its signature
check. Policy (docs/cluster_cache.md): with a key, only bundles signed by it are loaded; an
unsigned or differently signed bundle is refused. Without a key nothing from a shared
backend is loaded, unless the user opts in to unsigned native code in so many words
(``OPSMITH_REMOTE_TRUST_UNSIGNED=1``); the file hashes are checked either way.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import stat
import struct
import uuid
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from opsmith._errors import CacheError, ConfigError

__all__ = ["Signer", "Refused", "Unpacked", "pack", "pack_entry", "unpack", "sign_record",
           "check_record", "signer_from_settings", "write_bundle_file", "read_bundle_file"]

log = logging.getLogger("opsmith.cache")

MAGIC = b"OPSMITH-ENTRY\x001\n"
FILE_MAGIC = b"OPSMITH-BUNDLE\x001\n"
_FORMAT = 1
_MAX_HEADER = 16 << 20
_MIN_SECRET = 16


class Refused(Exception):
    """A bundle that must not be loaded; ``reason`` says why, ``signature`` if its signature failed."""

    def __init__(self, reason: str, *, signature: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.signature = signature


class Signer:
    """HMAC-SHA256 with a shared secret read from a key file.

    Examples
    --------
    >>> s = Signer(b"0123456789abcdef-secret")
    >>> s.verify(b"message", s.mac(b"message"))
    True
    """

    def __init__(self, secret: bytes, source: str = "<memory>") -> None:
        if len(secret) < _MIN_SECRET:
            raise ConfigError(f"the signing key in {source} has {len(secret)} bytes; use at least "
                              f"{_MIN_SECRET} random bytes, e.g. `head -c 32 /dev/urandom | base64 > FILE`.")
        self._secret = secret
        self.source = source
        self.key_id = hashlib.sha256(b"opsmith-key-id\0" + secret).hexdigest()[:16]

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> Signer:
        """The key in ``path`` (trailing whitespace dropped); refused if others can write the file."""
        path = os.path.expanduser(os.fspath(path))
        try:
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())
                secret = f.read().rstrip(b" \t\r\n")
        except OSError as exc:
            raise ConfigError(f"cannot read the signing key file {path} (OPSMITH_REMOTE_KEY_FILE): "
                              f"{exc.strerror}. Point it at a readable file.") from None
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise ConfigError(f"the signing key file {path} is writable by other users (mode "
                              f"{stat.S_IMODE(st.st_mode):o}); they could sign code you run. "
                              f"Run: chmod 600 {path}")
        return cls(secret, path)

    def mac(self, message: bytes) -> str:
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()

    def verify(self, message: bytes, mac: object) -> bool:
        return isinstance(mac, str) and hmac.compare_digest(self.mac(message), mac)

    def __repr__(self) -> str:
        return f"Signer(key_id={self.key_id!r}, source={self.source!r})"


def signer_from_settings() -> Signer | None:
    """The :class:`Signer` named by ``OPSMITH_REMOTE_KEY_FILE``, or None when it is unset."""
    from opsmith._config import settings
    path = settings.remote_key_file
    return Signer.from_file(path) if path else None


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _signed_message(key: str, manifest: Mapping[str, Any]) -> bytes:
    return b"opsmith-entry-v1\0" + _canonical({"key": key, "manifest": manifest})


def _portable_manifest(manifest: Mapping[str, Any]) -> dict[str, Any]:
    files = {n: {"sha256": i["sha256"], "size": int(i["size"])} for n, i in manifest["files"].items()}
    return {"kind": manifest.get("kind", ""), "name": manifest.get("name", ""),
            "meta": dict(manifest.get("meta") or {}), "created": manifest.get("created", 0.0),
            "files": files}


def pack(key: str, manifest: Mapping[str, Any], files: Mapping[str, bytes],
         signer: Signer | None) -> bytes:
    """One bundle of ``files`` (name -> bytes) under ``key``; signed when ``signer`` is given."""
    manifest = _portable_manifest(manifest)
    if set(files) != set(manifest["files"]):
        raise CacheError(f"bundle for {key}: the files {sorted(files)} do not match the manifest")
    sig = None
    if signer is not None:
        sig = {"alg": "hmac-sha256", "key_id": signer.key_id, "mac": signer.mac(_signed_message(key, manifest))}
    header = _canonical({"format": _FORMAT, "key": key, "manifest": manifest, "signature": sig})
    parts = [MAGIC, struct.pack(">I", len(header)), header]
    parts.extend(files[name] for name in sorted(files))
    return b"".join(parts)


def pack_entry(entry, signer: Signer | None) -> bytes:
    """The bundle of a verified store :class:`~opsmith._cache._store.Entry`."""
    files = {name: entry.file(name).read_bytes() for name in entry.manifest["files"]}
    return pack(entry.key, entry.manifest, files, signer)


class Unpacked:
    """A bundle that passed every check: its key, manifest and files (name -> bytes)."""

    __slots__ = ("key", "manifest", "files", "signed")

    def __init__(self, key: str, manifest: dict[str, Any], files: dict[str, bytes], signed: bool) -> None:
        self.key, self.manifest, self.files, self.signed = key, manifest, files, signed

    def write_files(self, directory: Path) -> dict[str, Path]:
        """Write the files into ``directory`` (for a store's ``put(move=True)``)."""
        out = {}
        for name, data in self.files.items():
            path = directory / name
            path.write_bytes(data)
            out[name] = path
        return out


def unpack(data: bytes, key: str | None, *, signer: Signer | None, trust_unsigned: bool) -> Unpacked:
    """Check a bundle and return its contents, or raise :class:`Refused` saying why.

    ``key`` is the key it was stored under (None: take the bundle's own, for bundle files,
    whose signature binds it). Without a ``signer`` an unsigned bundle is accepted only
    when ``trust_unsigned``; with one, only a bundle signed by that very key is.
    """
    view = memoryview(data)
    if len(view) < len(MAGIC) + 4 or bytes(view[:len(MAGIC)]) != MAGIC:
        raise Refused("not an opsmith entry bundle (bad magic)")
    (hlen,) = struct.unpack(">I", view[len(MAGIC):len(MAGIC) + 4])
    start = len(MAGIC) + 4
    if hlen > _MAX_HEADER or start + hlen > len(view):
        raise Refused("truncated bundle header")
    try:
        header = json.loads(bytes(view[start:start + hlen]))
        manifest = header["manifest"]
        own_key = header["key"]
        listing = manifest["files"]
        sizes = [(n, int(listing[n]["size"]), str(listing[n]["sha256"])) for n in sorted(listing)]
    except (ValueError, KeyError, TypeError):
        raise Refused("unreadable bundle header") from None
    if header.get("format") != _FORMAT:
        raise Refused(f"bundle format {header.get('format')!r}, this opsmith reads {_FORMAT}")
    if key is not None and own_key != key:
        raise Refused(f"the bundle stored under {key} is the entry of {own_key} (moved, swapped or "
                      f"replayed)", signature=True)
    key = own_key
    sig = header.get("signature")
    if signer is not None:
        if not isinstance(sig, dict):
            raise Refused("unsigned entry (a key is configured: only entries signed with it are loaded)",
                          signature=True)
        if sig.get("key_id") != signer.key_id:
            raise Refused(f"signed with another key (key id {sig.get('key_id')!r}, ours is "
                          f"{signer.key_id!r})", signature=True)
        if sig.get("alg") != "hmac-sha256" or not signer.verify(_signed_message(key, manifest), sig.get("mac")):
            raise Refused("wrong signature (HMAC-SHA256 over the key and manifest does not match)",
                          signature=True)
    elif not trust_unsigned:
        raise Refused("no signing key is configured (OPSMITH_REMOTE_KEY_FILE), so shared entries "
                      "cannot be verified; set the key file, or OPSMITH_REMOTE_TRUST_UNSIGNED=1 to "
                      "load unsigned native code", signature=True)
    pos = start + hlen
    if pos + sum(s for _, s, _ in sizes) != len(view):
        raise Refused("the files' sizes do not add up to the bundle's length (truncated or padded)")
    files = {}
    for name, size, sha in sizes:
        if "/" in name or name.startswith(".") or not name:
            raise Refused(f"invalid file name {name!r} in bundle")
        chunk = bytes(view[pos:pos + size])
        pos += size
        if hashlib.sha256(chunk).hexdigest() != sha:
            raise Refused(f"{name} does not match its sha256")
        files[name] = chunk
    return Unpacked(key, manifest, files, isinstance(sig, dict) and signer is not None)


# -- records (small JSON documents that travel with entries, e.g. the dependency index) --------
def sign_record(namespace: str, ident: str, value: Any, signer: Signer | None) -> bytes:
    body = {"ns": namespace, "id": ident, "value": value}
    sig = signer.mac(b"opsmith-record-v1\0" + _canonical(body)) if signer is not None else None
    return _canonical({**body, "key_id": signer.key_id if signer else None, "mac": sig})


def check_record(raw: bytes, namespace: str, ident: str, *, signer: Signer | None,
                 trust_unsigned: bool) -> Any:
    """The value of a record written by :func:`sign_record`; raises :class:`Refused`."""
    try:
        doc = json.loads(raw)
        body = {"ns": doc["ns"], "id": doc["id"], "value": doc["value"]}
    except (ValueError, KeyError, TypeError):
        raise Refused("unreadable record") from None
    if (body["ns"], body["id"]) != (namespace, ident):
        raise Refused(f"record {namespace}/{ident} holds {body['ns']}/{body['id']}", signature=True)
    if signer is not None:
        if doc.get("key_id") != signer.key_id or not signer.verify(
                b"opsmith-record-v1\0" + _canonical(body), doc.get("mac")):
            raise Refused(f"record {namespace}/{ident}: missing or wrong signature", signature=True)
    elif not trust_unsigned:
        raise Refused("no signing key is configured", signature=True)
    return body["value"]


# -- bundle files (export / import) ------------------------------------------------------------
def write_bundle_file(path: str | os.PathLike, bundles: Iterable[bytes]) -> int:
    """Write entry bundles to ``path`` atomically (temp file, then rename); returns how many."""
    path = Path(os.path.abspath(os.fspath(path)))
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    count = 0
    digest = hashlib.sha256()
    try:
        with open(tmp, "wb") as f:
            f.write(FILE_MAGIC)
            for b in bundles:
                head = struct.pack(">Q", len(b))
                f.write(head)
                f.write(b)
                digest.update(head)
                digest.update(b)
                count += 1
            f.write(struct.pack(">Q", 0))
            f.write(digest.digest())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        raise CacheError(f"cannot write the bundle {path}: {exc.strerror}. Choose a writable "
                         f"path with room.") from None
    finally:
        if tmp.exists():
            tmp.unlink()
    return count


def read_bundle_file(path: str | os.PathLike) -> Iterator[bytes]:
    """The entry bundles in a file written by :func:`write_bundle_file` (framing checked)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise CacheError(f"cannot read the bundle {path}: {exc.strerror}") from None
    if not data.startswith(FILE_MAGIC):
        raise CacheError(f"{path} is not an opsmith bundle (made by `opsmith cache export`)")
    pos, digest, out = len(FILE_MAGIC), hashlib.sha256(), []
    while True:
        if pos + 8 > len(data):
            raise CacheError(f"the bundle {path} is truncated; export it again")
        (n,) = struct.unpack(">Q", data[pos:pos + 8])
        if n == 0:
            if data[pos + 8:] != digest.digest():
                raise CacheError(f"the bundle {path} is damaged (its checksum does not match); "
                                 f"export it again")
            break
        if pos + 8 + n > len(data):
            raise CacheError(f"the bundle {path} is truncated; export it again")
        digest.update(data[pos:pos + 8 + n])
        out.append(data[pos + 8:pos + 8 + n])
        pos += 8 + n
    return iter(out)
