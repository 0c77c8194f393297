"""``opsmith.load_package``: use an opsmith package's prebuilt kernels, checked with a key.

An installed package is found without this call (its ``opsmith.packages`` entry point, read at
the first compile of a process); call it to demand a signature (``key=``), or to use a package
folder that is not installed.
"""
from __future__ import annotations

import os
from pathlib import Path

from opsmith._errors import SpecError

__all__ = ["load_package"]


def load_package(package: str | os.PathLike, *, key: str | os.PathLike | None = None):
    """Register ``package``'s prebuilt kernels and libraries (and verify them with ``key``).

    Parameters
    ----------
    package : str or path
        An installed package's name (``"mykernels"``; it is found, not imported), or the folder
        of a package (the one holding ``_opsmith/``).
    key : path, optional
        The key file the package was signed with (``opsmith package --sign``); a package that
        is unsigned, signed with another key or whose manifest was changed raises
        :class:`~opsmith.CacheError` and serves nothing. Default: ``OPSMITH_PACKAGE_KEY_FILE``.

    Returns
    -------
    The registered package (``.name``, ``.folder``, ``.manifest``, ``.signed``).

    Examples
    --------
    >>> opsmith.load_package("mykernels", key="/etc/opsmith/package.key")  # doctest: +SKIP
    """
    from importlib import util

    from opsmith._build import _prebuilt
    from opsmith._config import settings
    folder = Path(package)
    if not (folder / _prebuilt.FOLDER).is_dir():
        name = os.fspath(package)
        spec = util.find_spec(name) if name.isidentifier() else None
        locations = list(spec.submodule_search_locations or ()) if spec else []
        if not locations or not (Path(locations[0]) / _prebuilt.FOLDER).is_dir():
            raise SpecError(f"{name!r} is neither an installed opsmith package nor a folder holding "
                            f"{_prebuilt.FOLDER}/ (build one with `opsmith package MODULE` and pip install it)")
        folder = Path(locations[0])
    key_file = os.fspath(key) if key is not None else settings.package_key_file
    return _prebuilt.add(folder / _prebuilt.FOLDER, key_file)
