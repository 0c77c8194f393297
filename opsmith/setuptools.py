"""Ahead-of-time builds with setuptools: drop-in ``CppExtension``, ``CUDAExtension``, ``BuildExtension``.

Change the import in a ``setup.py`` written for ``torch.utils.cpp_extension`` and nothing
else::

    from setuptools import setup
    from opsmith.setuptools import CUDAExtension, BuildExtension

    setup(name="myrelu",
          ext_modules=[CUDAExtension("myrelu", ["relu.cpp", "relu_kernel.cu"])],
          cmdclass={"build_ext": BuildExtension})

``python setup.py build_ext --inplace`` and ``pip install --no-build-isolation .`` then compile
through opsmith's engine: object files cached by content (a rebuild after touching nothing,
or in a fresh checkout, compiles nothing), precompiled torch headers for the C++ sources,
CUDA and C++ units in parallel through ninja, and only the needed archs. The finished
module is copied where setuptools expects it. ``TORCH_EXTENSION_NAME`` is the extension's
own name (its last dotted part), as with torch.
"""
from __future__ import annotations

import os
import shutil
import time

from setuptools import Extension
from setuptools.command.build_ext import build_ext

__all__ = ["CppExtension", "CUDAExtension", "BuildExtension", "SyclExtension", "CUDA_HOME",
           "load", "load_inline", "get_default_build_root", "include_paths", "library_paths"]

# The rest of torch.utils.cpp_extension's public names (its __all__ and its public globals:
# ROCM_HOME, IS_HIP_EXTENSION, TORCH_LIB_PATH, COMMON_NVCC_FLAGS, is_ninja_available, ...)
# resolve to torch's own values through the module __getattr__ below, so that a setup.py
# written for torch imports unchanged. Ours where the value is about opsmith's builder:
_OURS = frozenset({"CUDA_HOME", "load", "load_inline", "get_default_build_root", "SyclExtension"})


def CppExtension(name: str, sources, *args, **kwargs) -> Extension:
    """A C++ extension module, as ``torch.utils.cpp_extension.CppExtension``.

    Parameters
    ----------
    name : str
        The module's full dotted name (``"myrelu"``, ``"pkg._C"``).
    sources : list of str
        C++ sources, relative to the directory of ``setup.py``.
    **kwargs
        As :class:`setuptools.Extension`; ``extra_compile_args`` may be a list or a dict
        ``{"cxx": [...], "nvcc": [...]}``.

    Examples
    --------
    >>> from opsmith.setuptools import CppExtension
    >>> CppExtension("add_ext", ["add.cpp"]).name
    'add_ext'
    """
    kwargs.setdefault("language", "c++")
    ext = Extension(name, list(sources), *args, **kwargs)
    ext._opsmith_cuda = None  # decided by the sources (.cu -> CUDA), as load() does
    return ext


def CUDAExtension(name: str, sources, *args, **kwargs) -> Extension:
    """A C++/CUDA extension module, as ``torch.utils.cpp_extension.CUDAExtension``.

    ``.cu``/``.cuh`` sources are compiled by nvcc (found from ``CUDA_HOME``, ``CUDACXX``,
    ``PATH`` or the ``nvidia-cuda-nvcc`` wheel) for ``TORCH_CUDA_ARCH_LIST`` or the visible
    GPUs; the module links the CUDA runtime and torch's CUDA libraries.

    Examples
    --------
    >>> from opsmith.setuptools import CUDAExtension
    >>> CUDAExtension("myrelu", ["relu.cpp", "relu_kernel.cu"]).sources
    ['relu.cpp', 'relu_kernel.cu']
    """
    kwargs.setdefault("language", "c++")
    ext = Extension(name, list(sources), *args, **kwargs)
    ext._opsmith_cuda = True
    return ext


def SyclExtension(name: str, sources, *args, **kwargs):
    """Refused: opsmith builds C++ and CUDA sources, not SYCL."""
    from opsmith._errors import SpecError
    raise SpecError(f"SyclExtension({name!r}): SYCL is not supported by opsmith, which builds C++ and "
                    f"CUDA sources. Import SyclExtension and BuildExtension from "
                    f"torch.utils.cpp_extension for this extension.")


def get_default_build_root() -> str:
    """Where builds go: opsmith's cache root (``OPSMITH_CACHE_DIR``), torch's ``TORCH_EXTENSIONS_DIR`` role."""
    from opsmith._config import settings
    return str(settings.cache_path)


def _cuda_home() -> str | None:
    """The CUDA toolkit root opsmith's builds use, or None when there is no nvcc (as torch's)."""
    from opsmith._config import settings
    from opsmith._errors import OpsmithError
    if settings.cuda_home:
        return settings.cuda_home
    try:
        from opsmith._toolchain._cxx import find_cxx
        from opsmith._toolchain._nvcc import find_nvcc
        return find_nvcc(find_cxx()).home  # no cache: a setup.py that only reads CUDA_HOME writes nothing
    except OpsmithError:
        return None


def __getattr__(name: str):
    if name == "CUDA_HOME":
        value = _cuda_home()
        globals()["CUDA_HOME"] = value  # found once, as torch's is
        return value
    if name in ("load", "load_inline"):
        from opsmith._torch import _extension
        return getattr(_extension, name)
    if name.startswith("_"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import torch.utils.cpp_extension as torch_ext
    try:
        return getattr(torch_ext, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r} (nor has "
                             f"torch.utils.cpp_extension {getattr(torch_ext, '__version__', '')})") from None


def _split_args(value) -> tuple[list[str], list[str]]:
    if value is None:
        return [], []
    if isinstance(value, dict):
        return list(value.get("cxx", [])), list(value.get("nvcc", []))
    return list(value), []


class BuildExtension(build_ext):
    """``build_ext`` that compiles through opsmith (cached, parallel, precompiled headers).

    Accepts torch's options (``BuildExtension.with_options(use_ninja=...)``) and ignores
    those that do not apply: opsmith always builds through ninja.
    """

    @classmethod
    def with_options(cls, **options):
        """Torch's ``BuildExtension.with_options``: accepted for compatibility, options ignored."""
        return cls

    def __init__(self, *args, **kwargs) -> None:
        kwargs.pop("use_ninja", None)
        kwargs.pop("no_python_abi_suffix", None)
        super().__init__(*args, **kwargs)

    def _python_cflags(self) -> list[str]:
        """Python's own compile flags for C++ sources (``-DNDEBUG -g -fwrapv -O3 -Wall`` from
        sysconfig), as torch's BuildExtension keeps them: an ahead-of-time build is optimised
        with asserts off. The user's ``extra_compile_args`` come after and win (``-O0``)."""
        compiler_so = getattr(self.compiler, "compiler_so", None)
        if isinstance(compiler_so, (list, tuple)) and len(compiler_so) > 1:
            flags = list(compiler_so[1:])
        else:
            import shlex
            import sysconfig
            flags = shlex.split(sysconfig.get_config_var("CFLAGS") or "")
        # -fPIC is opsmith's own; LTO objects would need the same compiler at the link, and the
        # cached objects are shared across builds: neither is taken.
        return [f for f in flags if f != "-fPIC" and not f.startswith(("-flto", "-ffat-lto", "-fno-fat-lto"))]

    def build_extension(self, ext) -> None:
        from opsmith._build._engine import build_spec
        from opsmith._torch._extension import _verbose
        from opsmith._spec import ExtensionSpec

        cxx_args, nvcc_args = _split_args(ext.extra_compile_args)
        cxx_args = self._python_cflags() + cxx_args
        macros = [f"-D{k}" if v is None else f"-D{k}={v}" for k, v in (ext.define_macros or [])]
        macros += [f"-U{k}" for k in (ext.undef_macros or [])]
        ldflags = [f"-L{d}" for d in (ext.library_dirs or [])]
        ldflags += [f"-Wl,-rpath,{d}" for d in (ext.runtime_library_dirs or [])]
        ldflags += [f"-l{lib}" for lib in (ext.libraries or [])]
        ldflags += list(ext.extra_objects or []) + list(ext.extra_link_args or [])
        module = ext.name.rsplit(".", 1)[-1]
        with_cuda = getattr(ext, "_opsmith_cuda", None)
        if with_cuda is None and any(str(s).endswith((".cu", ".cuh")) for s in ext.sources):
            with_cuda = True
        spec = ExtensionSpec.from_files(
            module, [os.path.abspath(s) for s in ext.sources], kind="module", with_cuda=with_cuda,
            extra_cflags=macros + cxx_args, extra_cuda_cflags=macros + nvcc_args, extra_ldflags=ldflags,
            extra_include_paths=[os.path.abspath(d) for d in (ext.include_dirs or [])],
            module_name=module, verbose=_settings().verbose)
        t0 = time.perf_counter()
        with _verbose(spec.verbose):
            art = build_spec(spec)
        dest = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
        tmp = f"{dest}.opsmith-{os.getpid()}"
        shutil.copyfile(art.path, tmp)  # a copy: the cache may be pruned, the install must stay
        os.chmod(tmp, 0o755)
        os.replace(tmp, dest)
        what = (f"compiled {art.compiled_units} unit(s) in {time.perf_counter() - t0:.1f} s" if art.built
                else "from the opsmith cache, nothing compiled")
        self.announce(f"opsmith: {ext.name} -> {dest} ({what})", level=2)
        print(f"opsmith: built {ext.name} ({what})")


def _settings():
    from opsmith._config import settings
    return settings
