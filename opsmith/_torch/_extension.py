"""Drop-in ``load`` / ``load_inline`` for ``torch.utils.cpp_extension``: build, then load.

``load = load_artifact(build(...))``. Same parameters, return values and behaviour as torch's:
a Python module by default; with ``is_python_module=False`` the shared library is loaded
into the process for its ``TORCH_LIBRARY`` registrations and its path returned; with
``is_standalone=True`` an executable is built and its path returned.

``load``/``load_inline`` first ask the warm index (:mod:`opsmith._torch._warm`): an exact repeat of
a call whose files are all unchanged loads its artifact without importing the build modules.
"""
from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import logging
import os
import threading

from opsmith._torch import _warm as _memo
from opsmith._errors import OpsmithError, SpecError

__all__ = ["load", "load_inline", "build", "build_inline", "load_artifact", "Artifact"]

log = logging.getLogger("opsmith")
_loaded: dict[str, object] = {}
_load_lock = threading.Lock()


def build(name, sources, extra_cflags=None, extra_cuda_cflags=None, extra_sycl_cflags=None,
          extra_ldflags=None, extra_include_paths=None, build_directory=None, verbose=False,
          with_cuda=None, with_sycl=None, is_python_module=True, is_standalone=False,
          keep_intermediates=True) -> Artifact:
    """Compile ``sources`` into a cached artifact without loading it.

    Parameters are those of :func:`load`.

    Examples
    --------
    >>> art = opsmith.build("relu_ext", ["relu.cpp"])          # doctest: +SKIP
    >>> art.path.name, art.built                                  # doctest: +SKIP
    ('relu_ext.so', True)
    """
    _refuse_sycl(sources, None, extra_sycl_cflags, with_sycl, "extra_ldflags")
    from opsmith._build._engine import build_spec
    from opsmith._spec import ExtensionSpec
    kind = ExtensionSpec.kind_of(is_python_module, is_standalone)
    spec = ExtensionSpec.from_files(
        name, sources, kind=kind, with_cuda=with_cuda, extra_cflags=extra_cflags,
        extra_cuda_cflags=extra_cuda_cflags, extra_ldflags=extra_ldflags,
        extra_include_paths=extra_include_paths, build_directory=build_directory, verbose=verbose,
        keep_intermediates=keep_intermediates)
    with _verbose(verbose):
        return build_spec(spec)


def build_inline(name, cpp_sources, cuda_sources=None, sycl_sources=None, functions=None,
                 extra_cflags=None, extra_cuda_cflags=None, extra_sycl_cflags=None, extra_ldflags=None,
                 extra_include_paths=None, build_directory=None, verbose=False, with_cuda=None,
                 with_sycl=None, is_python_module=True, with_pytorch_error_handling=True,
                 keep_intermediates=True, use_pch=None, no_implicit_headers=False,
                 is_standalone=False) -> Artifact:
    """Compile source strings into a cached artifact without loading it (see :func:`load_inline`)."""
    _refuse_sycl(None, sycl_sources, extra_sycl_cflags, with_sycl, "functions")
    from opsmith._build._engine import build_spec
    from opsmith._spec import ExtensionSpec
    kind = ExtensionSpec.kind_of(is_python_module, is_standalone)
    spec = ExtensionSpec.from_inline(
        name, cpp_sources, cuda_sources, functions, kind=kind, with_cuda=with_cuda,
        with_pytorch_error_handling=with_pytorch_error_handling,
        no_implicit_headers=no_implicit_headers, extra_cflags=extra_cflags,
        extra_cuda_cflags=extra_cuda_cflags, extra_ldflags=extra_ldflags,
        extra_include_paths=extra_include_paths, build_directory=build_directory, verbose=verbose,
        keep_intermediates=keep_intermediates)
    from opsmith._config import settings
    with _verbose(verbose), (settings.override(pch=bool(use_pch)) if use_pch is not None
                             else contextlib.nullcontext()):
        return build_spec(spec)


def load(name, sources, extra_cflags=None, extra_cuda_cflags=None, extra_sycl_cflags=None,
         extra_ldflags=None, extra_include_paths=None, build_directory=None, verbose=False,
         with_cuda=None, with_sycl=None, is_python_module=True, is_standalone=False,
         keep_intermediates=True):
    """Build (or find in the cache) a C++/CUDA extension and load it, as torch's ``load`` does.

    The parameters are torch's, in torch's order (that of torch 2.8 and later, which added
    the SYCL ones); SYCL itself is not supported and refused.

    Parameters
    ----------
    name : str
        The extension's name (a valid Python identifier for a module).
    sources : str or list of str
        C++ (``.cpp``) and CUDA (``.cu``) files.
    extra_cflags, extra_cuda_cflags, extra_ldflags, extra_include_paths : list of str, optional
        Added to the compiler, nvcc and linker command lines, and the include path. As with
        torch, each entry is stripped of surrounding whitespace and split at inner whitespace
        (``'-O0 -Wall'`` is two flags).
    extra_sycl_cflags, with_sycl : optional
        Accepted for torch's signature; anything but None/empty/False raises ``SpecError``.
    build_directory : str, optional
        A cache root to use instead of ``OPSMITH_CACHE_DIR`` for this call. An executable
        (``is_standalone=True``) is also copied to ``build_directory/name``, where torch puts it.
    verbose : bool
        Log each command through the ``opsmith`` logger (printed to stderr when no logging is set up).
    with_cuda : bool, optional
        None: decided by whether any source is a ``.cu``/``.cuh`` file.
    is_python_module : bool
        True: return the module. False: load the library for its ``TORCH_LIBRARY``
        registrations and return its path.
    is_standalone : bool
        Build an executable and return its path (needs ``is_python_module=False``).
    keep_intermediates : bool
        Keep object files in the cache, so that a later edit of one source recompiles one.

    Returns
    -------
    module, str or pathlib.Path
        As ``torch.utils.cpp_extension.load``.

    Examples
    --------
    >>> import torch, opsmith                                        # doctest: +SKIP
    >>> m = opsmith.load("add_ext", ["add.cpp"])                     # doctest: +SKIP
    >>> m.add(torch.ones(2), torch.ones(2))                          # doctest: +SKIP
    tensor([2., 2.])
    """
    _refuse_sycl(sources, None, extra_sycl_cflags, with_sycl, "extra_ldflags")
    return _load_indexed("load", (
        name, _abs_sources(sources), extra_cflags, extra_cuda_cflags, extra_ldflags,
        _abs_sources(extra_include_paths), build_directory, with_cuda, is_python_module, is_standalone,
        keep_intermediates), name, build_directory, lambda: build(
            name, sources, extra_cflags, extra_cuda_cflags, None, extra_ldflags, extra_include_paths,
            build_directory, verbose, with_cuda, None, is_python_module, is_standalone,
            keep_intermediates))


def load_inline(name, cpp_sources, cuda_sources=None, sycl_sources=None, functions=None,
                extra_cflags=None, extra_cuda_cflags=None, extra_sycl_cflags=None, extra_ldflags=None,
                extra_include_paths=None, build_directory=None, verbose=False, with_cuda=None,
                with_sycl=None, is_python_module=True, with_pytorch_error_handling=True,
                keep_intermediates=True, use_pch=None, no_implicit_headers=False, is_standalone=False):
    """Build and load an extension from source strings, as torch's ``load_inline`` does.

    The parameters are torch's, in torch's order (``sycl_sources`` is the fourth, as in torch
    2.8 and later; SYCL is refused); ``is_standalone`` is opsmith's addition, after them.
    ``cpp_sources`` get ``#include <torch/extension.h>`` prepended; ``functions`` (a list of
    names, or a dict name -> docstring) generates the pybind11 bindings, and each name must
    be defined in ``cpp_sources`` (checked before compiling). Errors point at the line within
    the string you passed (``cpp_sources[0]:3:5: error: ...``). ``use_pch``: None follows
    ``OPSMITH_PCH`` (on by default).

    Examples
    --------
    >>> import torch, opsmith
    >>> src = "torch::Tensor twice(torch::Tensor x) { return x * 2; }"
    >>> m = opsmith.load_inline("twice_ext", src, functions=["twice"])   # doctest: +SKIP
    >>> m.twice(torch.ones(2))                                          # doctest: +SKIP
    tensor([2., 2.])
    """
    _refuse_sycl(None, sycl_sources, extra_sycl_cflags, with_sycl, "functions")
    return _load_indexed("load_inline", (
        name, cpp_sources, cuda_sources, functions, extra_cflags, extra_cuda_cflags, extra_ldflags,
        _abs_sources(extra_include_paths), build_directory, with_cuda, is_python_module,
        with_pytorch_error_handling, keep_intermediates, use_pch, no_implicit_headers, is_standalone),
        name, build_directory, lambda: build_inline(
            name, cpp_sources, cuda_sources, None, functions, extra_cflags, extra_cuda_cflags, None,
            extra_ldflags, extra_include_paths, build_directory, verbose, with_cuda, None,
            is_python_module, with_pytorch_error_handling, keep_intermediates, use_pch,
            no_implicit_headers, is_standalone))


_SYCL_SUFFIXES = (".sycl",)


def _refuse_sycl(sources, sycl_sources, extra_sycl_cflags, with_sycl, moved: str) -> None:
    """torch's SYCL parameters are accepted in its signature; SYCL builds are not supported."""
    files = [sources] if isinstance(sources, (str, os.PathLike)) else (sources or [])
    has_sycl_file = any(isinstance(s, (str, os.PathLike)) and os.fspath(s).endswith(_SYCL_SUFFIXES)
                        for s in files)
    if not (sycl_sources or extra_sycl_cflags or with_sycl or has_sycl_file):
        return
    what = ("sycl_sources" if sycl_sources else "extra_sycl_cflags" if extra_sycl_cflags
            else "with_sycl=True" if with_sycl else "a .sycl source")
    hint = ""
    if not with_sycl and (sycl_sources or extra_sycl_cflags):
        hint = (f" If you passed {moved} positionally (torch before 2.8 had no SYCL parameters), "
                f"pass it by name instead: {moved}=[...].")
    raise SpecError(f"SYCL is not supported by opsmith ({what} given): it builds C++ and CUDA "
                    f"sources only. Use torch.utils.cpp_extension for SYCL extensions.{hint}")


def _load_indexed(kind: str, args: tuple, name: str, build_directory, build_artifact):
    """Load through the warm index: its answer when nothing changed, else build and record."""
    key = _memo.call_key(kind, args)
    hit = _memo.lookup(key, build_directory)
    if hit is None:
        hit = build_artifact()
        _memo.remember(key, hit, _init_names(name), build_directory)
    result = load_artifact(hit)
    if hit.kind == "executable" and build_directory is not None:
        return _place_executable(result, build_directory, name)
    return result


def _place_executable(path: str, build_directory, name: str) -> str:
    """Copy an executable to ``build_directory/name``, where torch's ``load`` puts it.

    A copy, not a link: the cache entry stays untouched (and verifiable), and a later prune
    cannot take the program away. Skipped when the copy there is already this build's.
    """
    import shutil
    dest = os.path.join(os.path.abspath(os.fspath(build_directory)), name)
    src = os.stat(path)
    try:
        st = os.stat(dest)
        if st.st_size == src.st_size and st.st_mtime_ns == src.st_mtime_ns:
            return dest
    except OSError:
        pass
    tmp = f"{dest}.opsmith-{os.getpid()}"
    shutil.copy2(path, tmp)
    os.chmod(tmp, 0o755)
    os.replace(tmp, dest)
    return dest


def _abs_sources(paths):
    """Paths as the build will resolve them (relative ones against today's directory)."""
    if paths is None:
        return None
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    try:
        return tuple(os.path.abspath(os.fspath(p)) for p in paths)
    except TypeError:
        return tuple(paths)  # not paths at all: build() explains the error


def _init_names(name: str) -> tuple[str, ...]:
    from opsmith._spec import MODULE_NAME
    return (MODULE_NAME, name)


def __getattr__(name: str):
    if name == "Artifact":  # imported lazily: the warm path never needs the build modules
        from opsmith._build._engine import Artifact
        return Artifact
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load_artifact(artifact):
    """Load a built artifact (:class:`Artifact`): a module, a library's path, or an executable's path."""
    path = os.fspath(artifact.path)
    if artifact.kind == "executable":
        return path
    with _load_lock:
        if path in _loaded:
            return _loaded[path]
        if artifact.kind == "library":
            import torch
            torch.ops.load_library(path)
            result = path
        else:
            # The module links torch's libraries (libc10, libtorch...), which the loader finds
            # only once torch has loaded them: a warm hit answered before `import torch` (a
            # script that imports opsmith first) would otherwise fail with "libc10.so: cannot
            # open shared object file". torch's own load cannot meet this: it lives in torch.
            import torch  # noqa: F401 - a dict lookup when already imported
            init_names = getattr(artifact, "init_names", None) or _init_names(artifact.name)
            result = _import_module(artifact.name, path, artifact.key, init_names)
        _loaded[path] = result
        return result


def _import_module(name: str, path: str, key: str, init_names: tuple[str, ...]):
    # The init symbol is PyInit_<TORCH_EXTENSION_NAME> (a constant) for sources that use the
    # macro, or PyInit_<name> for sources that spell the module name out, as torch allows.
    for init_name in init_names:
        # CPython calls PyInit_<last dotted component>; pybind11 (3.x) caches initialised
        # modules by the spec's full name, so that name must differ per artifact.
        spec_name = f"_opsmith_{key[:16]}.{init_name}"
        loader = importlib.machinery.ExtensionFileLoader(spec_name, path)
        spec = importlib.util.spec_from_file_location(spec_name, path, loader=loader)
        try:
            module = importlib.util.module_from_spec(spec)
        except ImportError as exc:
            if "PyInit_" in str(exc) or "module export function" in str(exc):
                continue  # not this init name; try the next
            raise OpsmithError(f"cannot load {path}: {exc}. If a library is missing, add its "
                               f"directory to LD_LIBRARY_PATH or link it with -Wl,-rpath.") from None
        loader.exec_module(module)
        module.__name__ = name
        return module
    raise SpecError(
        f"{path} is not a Python extension module: it defines no PyInit_{name}. Add "
        f"`PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {{ ... }}` to a source (or pass functions= "
        f"to load_inline), or pass is_python_module=False for a library of TORCH_LIBRARY ops.")


class _verbose:
    """verbose=True: show the opsmith logger's INFO records on stderr for the call."""

    def __init__(self, on: bool) -> None:
        self.on = on
        self.handler = None

    def __enter__(self):
        from opsmith._config import configure_logging
        configure_logging()
        logger = logging.getLogger("opsmith")
        if self.on and not logger.handlers and not logging.getLogger().handlers:
            self.handler = logging.StreamHandler()
            self.handler.setFormatter(logging.Formatter("opsmith: %(message)s"))
            logger.addHandler(self.handler)
        if self.on:
            self.old_level = logger.level
            logger.setLevel(min(logger.level or logging.WARNING, logging.INFO))
        return self

    def __exit__(self, *exc):
        logger = logging.getLogger("opsmith")
        if self.on:
            logger.setLevel(self.old_level)
        if self.handler is not None:
            logger.removeHandler(self.handler)
        return False


def warm(*, with_cuda: bool = False, extra_cflags=(), verbose: bool = False):
    """Build the precompiled torch headers (and the link stubs) that builds with these flags use;
    returns ``(Pch, Compiler)``.

    The PCH is keyed by the compiler, torch and the exact flags, so ``extra_cflags`` (and
    ``with_cuda``, which adds CUDA's include directories) must match the later builds'.
    """
    from opsmith._build._engine import warm_spec
    from opsmith._config import settings
    from opsmith._errors import ToolchainError
    from opsmith._build._progress import Progress
    from opsmith._spec import ExtensionSpec
    if not settings.pch:
        raise ToolchainError("precompiled headers are switched off (OPSMITH_PCH=0): there is "
                             "nothing to warm. Unset OPSMITH_PCH to use them.")
    spec = ExtensionSpec.from_inline("warm", "// opsmith warm", kind="module", with_cuda=with_cuda,
                                     extra_cflags=list(extra_cflags), verbose=verbose)
    with _verbose(verbose), Progress("warm", verbose=verbose) as progress:
        pch, cxx = warm_spec(spec, on_status=progress.status)
    if pch is None:
        raise ToolchainError(f"the precompiled torch headers could not be built with {cxx.path}; "
                             f"builds still work, only slower. Run with -v to see the compiler's output.")
    return pch, cxx
