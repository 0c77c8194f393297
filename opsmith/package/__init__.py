"""The package target: ops shipped as one wheel that runs with no compile (``opsmith package``).

Everything it owns lives here: :func:`build_package` (``_build``: records what a module's
import compiles, in a fresh process through the torch target's ``_package_record``, compiles it
for every arch), the manifest and its signature (``_manifest``), the reproducible wheel
(``_wheel``), :func:`load_package` (``_load``) and its command (``_cli``). The machine that
installs a package reads it through the core's :mod:`opsmith._build._prebuilt`. See
docs/packaging.md.
"""
from __future__ import annotations

from opsmith.package._build import PackageResult, build_package
from opsmith.package._load import load_package

__all__ = ["PackageResult", "build_package", "load_package"]
