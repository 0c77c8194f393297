"""The files of an export: the public header (``templates/export_c.h`` around the launch core's API) and the manifest.

The header template is package data, read through :mod:`importlib.resources`; its ``@NAME@``
placeholders are ``PREFIX``, ``VERSION``, ``KERNEL_LIST`` (one comment line per launch function),
``ARCH_LIST`` and ``LAUNCH_API`` (the launch core's header, filled by
:mod:`opsmith._runtime._launch_gen`). The source is the launch core's, unchanged.
"""
from __future__ import annotations

from importlib import resources

from opsmith._errors import SpecError
from opsmith._runtime._launch_gen import fill, image_name
from opsmith._version import __version__

__all__ = ["TEMPLATES", "template_text", "public_header", "manifest", "MANIFEST_FORMAT", "MANIFEST_VERSION"]

#: export-c's template files (``opsmith/export_c/templates/``).
TEMPLATES = ("export_c.h",)
MANIFEST_FORMAT = "opsmith.export-c"
MANIFEST_VERSION = 1


def template_text(name: str) -> str:
    """The text of export-c's template ``name`` (one of :data:`TEMPLATES`), from the installed package."""
    if name not in TEMPLATES:
        raise SpecError(f"no export-c template {name!r}; the templates are {', '.join(TEMPLATES)}")
    return resources.files("opsmith.export_c").joinpath("templates", name).read_text(encoding="utf-8")


def public_header(unit) -> str:
    """``<prefix>.h`` of a :class:`~opsmith._build._launch_unit.LaunchUnit`: what it holds, then its API."""
    names = [image_name(a, kind) for a, kind in unit.targets]
    ptx = any(kind == "ptx" for _a, kind in unit.targets)
    kernel_list = "".join(f" *   {unit.code.launchers[k.name]}: {k.name}\n" for k in unit.kernels)
    return fill(template_text("export_c.h"), {
        "PREFIX": unit.prefix, "VERSION": __version__, "KERNEL_LIST": kernel_list,
        "ARCH_LIST": ", ".join(names) + (" (PTX: compute_*)" if ptx else ""),
        "LAUNCH_API": unit.code.header.rstrip("\n")})


def manifest(unit, header_name: str, source_name: str) -> dict:
    """``<prefix>.json``: the kernels (names, symbol, functions, C parameters, the signature, and
    registers/shared/local bytes per arch read from the cubins), the archs and, per module, each
    image's size and cache key."""
    from opsmith._build._cubin import kernel_resources
    names = [image_name(a, kind) for a, kind in unit.targets]
    resources_of = [[kernel_resources(b.code) if b.kind == "cubin" else {} for b in per_module]
                    for per_module in unit.binaries]
    kernels = []
    for k in unit.kernels:
        sig = k.signature
        res = {}
        for a, (arch, kind) in enumerate(unit.targets):
            found = resources_of[k.module][a].get(sig.symbol) if kind == "cubin" else None
            if found is not None:
                res[arch] = found
        kernels.append({
            "name": k.name, "c_name": k.cname, "symbol": sig.symbol, "module": k.module,
            "launch": unit.code.launchers[k.name], "attributes": unit.code.attributes[k.name],
            "c_params": ", ".join(unit.code.c_params[k.name]), "signature": sig.to_json(), "resources": res})
    return {
        "format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "opsmith": __version__, "prefix": unit.prefix,
        "nvrtc": unit.binaries[0][0].nvrtc_version, "header": header_name, "source": source_name,
        "archs": [{"arch": named, "kind": kind} for named, (_a, kind) in zip(names, unit.targets)],
        "modules": [{"name": name, "images": [
            {"arch": names[a], "kind": kind, "bytes": len(unit.binaries[m][a].code),
             "cache_key": unit.binaries[m][a].key} for a, (_arch, kind) in enumerate(unit.targets)]}
            for m, name in enumerate(unit.modules)],
        "kernels": kernels,
    }
