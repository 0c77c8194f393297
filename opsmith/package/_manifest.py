"""The manifest of an opsmith package: what ``_opsmith/manifest.json`` holds, and its signature.

Read by :mod:`opsmith._build._prebuilt` (which owns the format number); written here::

    {"format": 1, "opsmith": "0.1.0", "package": "mykernels", "version": "1.0.0",
     "nvrtc_version": "13.0", "archs": ["sm_80", "sm_90", "compute_90"],
     "kernels": [{"key": <portable key>, "name": "relu_kernel.cu", "lowered_names": {...},
                  "binaries": {"sm_80": {"file": "kernels/<key>.sm_80.cubin", "kind": "cubin",
                                         "sha256": ..., "size": ...}, ...}}],
     "libraries": {"opsmith_cshim": {"file": "lib/opsmith_cshim.so", "sha256": ...,
                                     "source_sha256": ...}},
     "ops": [{"name": "mylib::relu", "schema": "(Tensor x) -> Tensor"}]}

Only what is the same on every machine goes in (no paths, no times), so the same inputs give
the same bytes.
"""
from __future__ import annotations

import hashlib
import json
import os

__all__ = ["dumps", "kernel_entries", "manifest", "signature", "sizes"]


def kernel_entries(requests, targets, binaries) -> tuple[dict[str, bytes], list[dict]]:
    """(payload files by path under ``_opsmith/``, kernel entries) for ``requests`` compiled for
    ``targets`` ([(arch, kind)]): ``binaries`` in the order requests × targets."""
    payload: dict[str, bytes] = {}
    entries = []
    it = iter(binaries)
    for req in requests:
        key = req.portable_key()
        entry = {"key": key, "name": os.path.basename(req.name), "binaries": {}}
        for _arch, kind in targets:
            b = next(it)
            rel = f"kernels/{key[:24]}.{b.arch}.{'cubin' if kind == 'cubin' else 'ptx'}"
            payload[rel] = b.code
            entry["binaries"][b.arch] = {"file": rel, "kind": b.kind, "sha256": hashlib.sha256(b.code).hexdigest(),
                                         "size": len(b.code)}
            entry["lowered_names"] = dict(sorted(b.lowered_names.items()))
        entries.append(entry)
    entries.sort(key=lambda e: e["key"])
    return payload, entries


def manifest(package: str, version: str, kernels: list, libraries: dict, ops: list, *, nvrtc_version: str,
             archs: list[str]) -> dict:
    from opsmith._build._prebuilt import FORMAT
    from opsmith._version import __version__
    return {"format": FORMAT, "opsmith": __version__, "package": package, "version": version,
            "nvrtc_version": nvrtc_version, "archs": archs, "kernels": kernels, "libraries": libraries,
            "ops": sorted(ops, key=lambda o: o["name"])}


def dumps(doc: dict) -> bytes:
    """The manifest's bytes: sorted keys, no spaces that vary."""
    return (json.dumps(doc, sort_keys=True, indent=1) + "\n").encode()


def signature(text: bytes, key_file: str | os.PathLike) -> bytes:
    """``manifest.sig``: HMAC-SHA256 of the manifest's bytes with the key in ``key_file``."""
    from opsmith._cache._bundle import Signer
    signer = Signer.from_file(key_file)
    return dumps({"alg": "hmac-sha256", "key_id": signer.key_id, "mac": signer.mac(text)})


def sizes(kernels: list, payload: dict[str, bytes], libraries: dict) -> dict:
    """Bytes per arch (cubins and PTX), of the libraries and in all, uncompressed."""
    out: dict = {}
    for entry in kernels:
        for arch, b in entry["binaries"].items():
            out[arch] = out.get(arch, 0) + b["size"]
    for name, lib in libraries.items():
        out[name] = len(payload[lib["file"]])
    out["payload"] = sum(len(v) for v in payload.values())
    return out
