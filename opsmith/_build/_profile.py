"""Build profiles: what a target needs from the engine (flags, link inputs, key parts, inputs).

The engine (:mod:`._engine`) compiles and links units and knows nothing of its targets; a
profile says what one kind of target needs. ``torch-extension`` (``opsmith._torch._profile``,
the torch target's own) owns torch's flags, ``TORCH_EXTENSION_NAME``, the precompiled torch
headers and the link stubs; ``shared-library`` (:mod:`._profile_shared`, in the core: export-c
and ONNX Runtime libraries use it) builds a C/C++/CUDA library with no torch at all.
:data:`PROFILES` names each profile's class by ``"module:Class"``, imported on first use: a
target's profile lives in the target, and the engine imports no target's module directly.
"""
from __future__ import annotations

from opsmith._errors import SpecError

__all__ = ["Profile", "profile_for", "PROFILES"]

PROFILES = {
    "torch-extension": "opsmith._torch._profile:TorchExtension",
    "shared-library": "opsmith._build._profile_shared:SharedLibrary",
}


class Profile:
    """What a target needs; every method receives the spec and the engine's toolchain ``tc``."""

    name = "?"
    uses_torch = False  # True: the engine resolves torch (its fingerprint is in the keys)
    # True: ``.c`` sources are compiled as C++ (the C++ compiler, cxx_flags, ``-x c++``), as
    # torch's extension builder does; False: by the C compiler with c_flags.
    c_as_cxx = False

    def key_parts(self, spec, tc) -> list[str]:
        """Identities the outputs depend on beyond the compiler and the flags."""
        return []

    def cxx_flags(self, spec, tc) -> list[str]:
        raise NotImplementedError

    def c_flags(self, spec, tc) -> list[str]:
        """Flags of ``.c`` units compiled as C (unless ``c_as_cxx``)."""
        raise NotImplementedError

    def cuda_flags(self, spec, tc) -> list[str]:
        raise NotImplementedError

    def ldflags(self, spec, tc) -> list[str]:
        raise NotImplementedError

    def link_command(self, spec, tc, linker: str, objects, flags, out: str) -> tuple[str, ...]:
        """The step that makes the artifact ``out`` from the objects: the driver ``linker``
        links them with ``flags``; an ``archive`` is ``ar rcs`` of them (nothing is linked)."""
        if spec.kind == "archive":
            return (tc.archiver(), "rcs", out, *objects)
        return (linker, *objects, *flags, "-o", out)

    def uses_pch(self, source) -> bool:
        """Whether this unit is compiled with the profile's precompiled header."""
        return False

    def link_stubs(self, spec, ldflags) -> bool:
        """Whether the link reads stand-ins of the profile's libraries (see :mod:`._linkstubs`)."""
        return False

    def inputs(self, spec, tc) -> list[str]:
        """Files (besides sources, headers and compilers) that a warm load re-checks."""
        return []

    def check(self, spec, tc) -> None:
        """Refuse a build that cannot work, before anything runs."""


_INSTANCES: dict[str, Profile] = {}


def profile_for(spec) -> Profile:
    """The profile of ``spec`` (``spec.profile``, default ``torch-extension``)."""
    name = getattr(spec, "profile", None) or "torch-extension"
    prof = _INSTANCES.get(name)
    if prof is None:
        target = PROFILES.get(name)
        if target is None:
            raise SpecError(f"unknown build profile {name!r}; known: {sorted(PROFILES)}")
        import importlib
        mod, _, cls = target.partition(":")
        prof = _INSTANCES[name] = getattr(importlib.import_module(mod), cls)()
    return prof
