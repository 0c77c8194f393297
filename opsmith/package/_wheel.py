"""Wheels: write a reproducible, standard wheel from in-memory files, and read one back verified.

The format is the binary distribution format (PEP 427): the files, then one
``{dist}-{version}.dist-info`` folder with ``METADATA``, ``WHEEL``, ``entry_points.txt`` and
``RECORD`` (the sha256 and size of every other file). Same inputs, same bytes: entries are sorted,
stamped with one fixed time and fixed permissions, and compressed at a fixed level.
"""
from __future__ import annotations

import base64
import csv
import hashlib
import io
import itertools
import os
import pathlib
import re
import tempfile
import time
import zipfile
import zlib
from collections.abc import Iterable, Mapping, Sequence

from opsmith._errors import ConfigError, OpsmithError, SpecError

__all__ = ["read_wheel", "wheel_name", "write_wheel"]

_NAME = re.compile(r"^([A-Z0-9]|[A-Z0-9][A-Z0-9._-]*[A-Z0-9])$", re.IGNORECASE)  # PEP 508
# PEP 440 in normalised form only, so that one version has exactly one file name
_VERSION = re.compile(r"^(\d+!)?\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?(\+[a-z0-9]+(\.[a-z0-9]+)*)?$")
_TAG_PART = re.compile(r"^[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*$")
_ZIP_EPOCH, _ZIP_LAST = 315532800, 4354819198  # 1980-01-01 00:00:00 and 2107-12-31 23:59:58 UTC
_LEVEL = 6


def _dist(name: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise SpecError(f"wheel name {name!r} is not a valid distribution name: use letters, digits and "
                        "'.', '_', '-' inside, starting and ending with a letter or digit (e.g. 'my-kernels')")
    return re.sub(r"[-_.]+", "_", name).lower()


def _check_version(version: str) -> str:
    if not isinstance(version, str) or not _VERSION.match(version):
        raise SpecError(f"wheel version {version!r} is not a normalised PEP 440 version: write it like "
                        "'1.2.0', '1.2.0rc1', '1.2.0.post1', '1.2.0.dev3' or '1.2.0+cu128'")
    return version


def _expand_tag(tag: str) -> list[str]:
    parts = tag.split("-") if isinstance(tag, str) else []
    if len(parts) != 3 or not all(_TAG_PART.match(p) for p in parts):
        raise SpecError(f"wheel tag {tag!r} is not 'python-abi-platform': write three parts joined by '-', "
                        "e.g. 'py3-none-manylinux_2_28_x86_64' or 'cp311-cp311-linux_x86_64'")
    return ["-".join(t) for t in itertools.product(*(p.split(".") for p in parts))]


def wheel_name(name: str, version: str, tag: str) -> str:
    """The file name of a wheel: ``{dist}-{version}-{tag}.whl``, ``dist`` normalised.

    Examples
    --------
    >>> wheel_name("My.Kernels", "1.0", "py3-none-any")
    'my_kernels-1.0-py3-none-any.whl'
    """
    _expand_tag(tag)
    return f"{_dist(name)}-{_check_version(version)}-{tag}.whl"


def _archive_path(path: str, dist_info: str) -> str:
    if not isinstance(path, str) or "\\" in path or path.startswith("/") or re.match(r"^[A-Za-z]:", path):
        raise SpecError(f"archive path {path!r} must be a relative posix path like 'mykernels/__init__.py'")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts or not parts or path.endswith("/"):
        raise SpecError(f"archive path {path!r} must name a file inside the wheel, without '..': "
                        "write it relative to the wheel's root, like 'mykernels/ops.py'")
    if parts[0].lower().endswith(".dist-info"):
        raise SpecError(f"archive path {path!r} lies in a .dist-info folder, which the wheel writes itself "
                        f"({dist_info}/): put your files elsewhere and pass requires/entry_points instead")
    return "/".join(parts)


def _line(what: str, value: str) -> str:
    if not isinstance(value, str) or "\n" in value or "\r" in value:
        raise SpecError(f"{what} {value!r} must be a one-line string")
    return value


def _entry_points(entry_points: Mapping[str, Mapping[str, str]]) -> bytes:
    out = []
    for group in sorted(entry_points):
        if not _line("entry point group", group).strip() or "]" in group:
            raise SpecError(f"entry point group {group!r} must be a non-empty name without ']'")
        names = entry_points[group]
        bad = [k for k in names if not _line("entry point name", k).strip() or "=" in k]
        if bad:
            raise SpecError(f"entry point name {bad[0]!r} in [{group}] must be a non-empty name without '='")
        out += [f"[{group}]", *(f"{k} = {_line('entry point value', names[k])}" for k in sorted(names)), ""]
    return "\n".join(out).encode()


def _date_time() -> tuple[int, ...]:
    text = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    try:
        epoch = int(text) if text else _ZIP_EPOCH
    except ValueError:
        raise ConfigError(f"SOURCE_DATE_EPOCH={text!r} is not an integer: set it to seconds since 1970 "
                          "(e.g. `git log -1 --format=%ct`) or unset it") from None
    return time.gmtime(min(max(epoch, _ZIP_EPOCH), _ZIP_LAST))[:6]


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def write_wheel(out_dir, *, name: str, version: str, files: Mapping[str, bytes],
                tag: str = "py3-none-manylinux_2_28_x86_64", requires: Sequence[str] = (),
                entry_points: Mapping[str, Mapping[str, str]] | None = None, summary: str = "",
                executable: Iterable[str] = ()) -> pathlib.Path:
    """Write a wheel of ``files`` into ``out_dir`` (created if needed) and return its path.

    Parameters
    ----------
    out_dir : str or os.PathLike
        The folder that receives ``{dist}-{version}-{tag}.whl`` (written atomically).
    name, version : str
        The distribution name (PEP 508) and its normalised PEP 440 version.
    files : mapping of str to bytes
        Archive path (posix, relative, e.g. ``"mykernels/__init__.py"``) to contents.
    tag : str
        ``python-abi-platform``; dotted parts (``py2.py3``) expand to one ``Tag:`` line each.
    requires : sequence of str
        One ``Requires-Dist`` line each, e.g. ``"torch>=2.4"``.
    entry_points : mapping of group to mapping of name to value, optional
        Written as ``entry_points.txt``, e.g. ``{"console_scripts": {"k": "mykernels:main"}}``.
    summary : str
        The one-line ``Summary`` of ``METADATA``.
    executable : iterable of str
        Archive paths stored with mode 0o755 (``.so`` files always are); others get 0o644.

    Examples
    --------
    >>> write_wheel("dist", name="mykernels", version="1.0", files={"mykernels/__init__.py": b""},
    ...             tag="py3-none-any")  # doctest: +SKIP
    PosixPath('dist/mykernels-1.0-py3-none-any.whl')
    """
    from .._version import __version__

    dist, tags = _dist(name), _expand_tag(tag)
    dist_info = f"{dist}-{_check_version(version)}.dist-info"
    contents: dict[str, bytes] = {}
    given: dict[str, str] = {}
    for path, data in files.items():
        norm = _archive_path(path, dist_info)
        if norm in given:
            raise SpecError(f"archive paths {given[norm]!r} and {path!r} both name {norm!r}: keep one of them")
        given[norm] = path
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise SpecError(f"files[{path!r}] is {type(data).__name__}, not bytes: pass bytes (text.encode())")
        contents[norm] = bytes(data)
    execs = {_archive_path(p, dist_info) for p in ([executable] if isinstance(executable, str) else executable)}
    if execs - contents.keys():
        raise SpecError(f"executable paths {sorted(execs - contents.keys())} are not in files: name files it holds")
    requires = [requires] if isinstance(requires, str) else requires
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}", f"Summary: {_line('summary', summary)}",
            *(f"Requires-Dist: {_line('requirement', r)}" for r in requires)]
    wheel = ["Wheel-Version: 1.0", f"Generator: opsmith {__version__}", "Root-Is-Purelib: false",
             *(f"Tag: {t}" for t in tags)]
    meta_files = {f"{dist_info}/METADATA": ("\n".join(meta) + "\n").encode(),
                  f"{dist_info}/WHEEL": ("\n".join(wheel) + "\n").encode()}
    if entry_points is not None:
        meta_files[f"{dist_info}/entry_points.txt"] = _entry_points(entry_points)
    entries = sorted(contents.items()) + sorted(meta_files.items())
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    writer.writerows([(p, _record_hash(d), len(d)) for p, d in entries] + [(f"{dist_info}/RECORD", "", "")])
    entries.append((f"{dist_info}/RECORD", record.getvalue().encode()))

    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    target = out / wheel_name(name, version, tag)
    stamp = _date_time()
    fd, tmp = tempfile.mkstemp(dir=out, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh, zipfile.ZipFile(fh, "w") as zf:
            for path, data in entries:
                info = zipfile.ZipInfo(path, stamp)
                info.create_system = 3  # unix, whatever the host: the mode bits below are read from here
                mode = 0o755 if path in execs or path.endswith(".so") else 0o644
                info.external_attr = (0o100000 | mode) << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                zf.writestr(info, data, compresslevel=_LEVEL)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise
    return target


def _corrupt(path, member: str, what: str) -> OpsmithError:
    return OpsmithError(f"wheel {os.fspath(path)} is corrupt or was modified: {member} {what}; rebuild it")


def read_wheel(path) -> dict[str, bytes]:
    """Open a wheel, check every file against its ``RECORD``, and return the files outside ``.dist-info``.

    Raises :class:`~opsmith._errors.OpsmithError` naming the file when a hash or size differs, a
    listed file is missing, or a file is not listed.

    Examples
    --------
    >>> read_wheel("dist/mykernels-1.0-py3-none-any.whl")  # doctest: +SKIP
    {'mykernels/__init__.py': b''}
    """
    try:
        with zipfile.ZipFile(path) as zf:
            names = [i.filename for i in zf.infolist() if not i.is_dir()]
            records = [n for n in names if re.fullmatch(r"[^/]+\.dist-info/RECORD", n)]
            if len(records) != 1:
                raise _corrupt(path, "RECORD", f"found {len(records)} .dist-info/RECORD files, expected one")
            data = {}
            for n in names:
                try:
                    data[n] = zf.read(n)
                except (zipfile.BadZipFile, zlib.error) as e:
                    raise _corrupt(path, n, f"cannot be read ({e})") from None
    except (zipfile.BadZipFile, OSError) as e:
        raise OpsmithError(f"cannot open wheel {os.fspath(path)} ({e}): rebuild it") from None
    dist_info = records[0].rsplit("/", 1)[0]
    listed = set()
    rows = csv.reader(io.StringIO(data[records[0]].decode("utf-8", "replace")))
    for member, digest, size, *_ in (r + ["", ""] for r in rows if r):
        listed.add(member)
        if member == records[0]:
            continue
        if member not in data:
            raise _corrupt(path, member, "is listed in RECORD but missing from the archive")
        if digest != _record_hash(data[member]) or size != str(len(data[member])):  # sha256, as written
            raise _corrupt(path, member, "does not match its RECORD hash and size")
    unlisted = sorted(set(names) - listed - {f"{dist_info}/RECORD.jws", f"{dist_info}/RECORD.p7s"})
    if unlisted:
        raise _corrupt(path, unlisted[0], "is not listed in RECORD")
    return {n: d for n, d in data.items() if not n.split("/", 1)[0].endswith(".dist-info")}
