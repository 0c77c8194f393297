"""`opsmith cache export FILE` and `opsmith cache import FILE`: signed bundles of cache entries.

For container images and air-gapped clusters: build once in CI, export, ship the file, and
import it on every node, which then loads with zero compiles. Entries are signed with the
key in OPSMITH_REMOTE_KEY_FILE and every one is checked on import (signature, then each
file's sha256); a bundle with any refused entry installs nothing.
"""
from __future__ import annotations

import fnmatch
import os


def _signer_and_trust():
    from opsmith._cache._bundle import signer_from_settings
    from opsmith._config import settings
    return signer_from_settings(), settings.remote_trust_unsigned


def _export(args) -> int:
    from opsmith._cache._admin import format_size
    from opsmith._cache._bundle import pack_entry, write_bundle_file
    from opsmith._cache._open import open_cache
    from opsmith._errors import CacheError
    signer, trust = _signer_and_trust()
    if signer is None and not trust:
        raise CacheError("exporting needs a signing key: set OPSMITH_REMOTE_KEY_FILE to the key "
                         "file the importing machines also have (or OPSMITH_REMOTE_TRUST_UNSIGNED=1 "
                         "to export unsigned entries, which importers must opt in to load).")
    store = open_cache().store
    chosen, skipped = [], 0
    for info in store.list():
        if info.kind == "corrupt":
            skipped += 1
            continue
        if args.kind and info.kind not in args.kind:
            continue
        if args.name and not any(fnmatch.fnmatchcase(info.name or "", pat) for pat in args.name):
            continue
        if args.key and not any(info.key.startswith(k) for k in args.key):
            continue
        chosen.append(info.key)
    sizes = []

    def bundles():
        for key in chosen:
            entry = store.get(key, record_use=False)
            if entry is None:  # corrupt (get removed it) or removed meanwhile
                continue
            data = pack_entry(entry, signer)
            sizes.append(len(data))
            yield data

    count = write_bundle_file(args.file, bundles())
    how = f"signed (key id {signer.key_id})" if signer else "UNSIGNED"
    print(f"exported {count} entr{'y' if count == 1 else 'ies'} ({format_size(sum(sizes))}, {how}) "
          f"to {os.path.abspath(args.file)}" + (f"; skipped {skipped} corrupt" if skipped else ""))
    return 0


def _import(args) -> int:
    import tempfile
    from pathlib import Path
    from opsmith._cache._bundle import Refused, read_bundle_file, unpack
    from opsmith._cache._open import open_cache
    signer, trust = _signer_and_trust()
    checked, refused = [], []
    for i, data in enumerate(read_bundle_file(args.file)):
        try:
            checked.append(unpack(data, None, signer=signer, trust_unsigned=trust))
        except Refused as exc:
            refused.append((i, exc.reason))
    if refused:
        for i, reason in refused:
            print(f"refused entry {i + 1}: {reason}")
        print(f"imported nothing: {len(refused)} of {len(refused) + len(checked)} entries of "
              f"{args.file} failed verification (was it signed with the key in OPSMITH_REMOTE_KEY_FILE?)")
        return 1
    cache = open_cache()
    added = present = 0
    for b in checked:
        if cache.store.get(b.key, record_use=False) is not None:
            present += 1
            continue
        with tempfile.TemporaryDirectory(prefix="import-") as tmp:
            files = b.write_files(Path(tmp))
            m = b.manifest
            cache.store.put(b.key, files, kind=m.get("kind", ""), name=m.get("name", ""),
                            meta=m.get("meta") or {}, move=True)
        added += 1
    how = "signed" if signer else "unsigned (OPSMITH_REMOTE_TRUST_UNSIGNED=1)"
    print(f"imported {added} entr{'y' if added == 1 else 'ies'} ({how}) into {cache.root}"
          + (f"; {present} already present" if present else ""))
    return 0
