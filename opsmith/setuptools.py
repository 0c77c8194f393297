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

__all__ = ["CppExtension", "CUDAExtension", "BuildExtension"]


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

    def build_extension(self, ext) -> None:
        from opsmith._build._engine import build_spec
        from opsmith._torch._extension import _verbose
        from opsmith._spec import ExtensionSpec

        cxx_args, nvcc_args = _split_args(ext.extra_compile_args)
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
            module_name=module, verbose=bool(os.environ.get("OPSMITH_VERBOSE")))
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
