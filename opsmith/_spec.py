"""What to build: a canonical, validated description of an extension, made before anything runs."""
from __future__ import annotations

import keyword
import os
import re
from collections.abc import Sequence
from typing import Literal

from opsmith._record import Record
from opsmith._errors import SpecError

__all__ = ["Source", "ExtensionSpec", "CUDA_SUFFIXES", "CXX_SUFFIXES", "C_SUFFIXES", "MODULE_NAME",
           "torch_includes"]

CUDA_SUFFIXES = (".cu", ".cuh")
CXX_SUFFIXES = (".cpp", ".cc", ".cxx", ".c++", ".C")
# C sources: compiled as C by targets that say so (a plain library), as C++ by torch
# extensions (torch's builder hands them to its C++ compiler). Case matters: ".C" is C++.
C_SUFFIXES = (".c",)
# "archive": a static library (``<name>.a``), its objects put together by ``ar``, nothing linked
Kind = Literal["module", "library", "executable", "archive"]
_FILE_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")


def torch_includes(text: bytes) -> tuple[bool, bool]:
    """``(includes torch/extension.h, includes any torch/ or ATen/ header)``: the one scanner.

    A plain scan, not a regex: compiling one costs a warm load about a millisecond.
    """
    extension = anything = False
    for line in text.splitlines():
        body = line.strip()
        if not body.startswith(b"#") or not body[1:].lstrip().startswith(b"include"):
            continue
        if b"<torch/" in body or b'"torch/' in body or b"<ATen/" in body or b'"ATen/' in body:
            anything = True
            if b"torch/extension.h" in body:
                extension = True
                break
    return extension, anything


class Source(Record):
    """One translation unit's source.

    ``path`` is the file compiled (absolute) for sources on disk; inline sources have
    ``path=None`` and are written to ``filename`` in the build directory. ``display`` is how
    errors name it; ``text`` is its bytes, read once; ``lang`` is ``"c++"``, ``"c"`` or
    ``"cuda"`` (from the file's suffix).
    """

    __slots__ = ('display', 'text', 'lang', 'path', 'filename')
    _defaults = {'path': None, 'filename': ''}


    @property
    def includes_torch_extension(self) -> bool:
        """Whether it includes ``torch/extension.h`` (the precompiled header applies)."""
        return torch_includes(self.text)[0]

    @property
    def includes_torch_headers(self) -> bool:
        """Whether it includes any torch or ATen header (slow for nvcc: see the hint)."""
        return torch_includes(self.text)[1]

    @property
    def stem(self) -> str:
        base = os.path.basename(self.path or self.filename)
        stem = os.path.splitext(base)[0]
        return stem + (".cuda" if self.lang == "cuda" else "")


def _flag_list(value, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        raise SpecError(f"{what} must be a list of strings, e.g. [{value!r}], not a string {value!r}")
    try:
        items = list(value)
    except TypeError:
        raise SpecError(f"{what} must be a list of strings, got {type(value).__name__}") from None
    for item in items:
        if not isinstance(item, (str, os.PathLike)):
            raise SpecError(f"{what} must hold strings only, got {item!r} ({type(item).__name__})")
    return tuple(os.fspath(i) for i in items)


def _lenient_flags(value, what: str) -> tuple[str, ...]:
    """Flags as torch takes them: each entry stripped, and split as a shell splits it.

    torch writes every entry unquoted into its ninja command, so ``'-g\n'`` is ``-g`` and
    ``'-O0 -Wall'`` is two flags; a single word is kept exactly as given.
    """
    out: list[str] = []
    for item in _flag_list(value, what):
        item = item.strip()
        if not item:
            continue
        if any(c.isspace() for c in item):
            import shlex
            try:
                out.extend(shlex.split(item))
            except ValueError as exc:
                raise SpecError(f"{what}: cannot split {item!r} into flags ({exc}); pass one flag "
                                f"per list entry") from None
        else:
            out.append(item)
    return tuple(out)


def _lenient_paths(value, what: str) -> tuple[str, ...]:
    """Paths stripped of surrounding whitespace (as torch does), made absolute."""
    return tuple(os.path.abspath(p.strip()) for p in _flag_list(value, what) if p.strip())


def check_name(name, kind: Kind) -> str:
    if not isinstance(name, str) or not name:
        raise SpecError(f"name must be a non-empty string, got {name!r}")
    if kind == "module" and (not name.isidentifier() or keyword.iskeyword(name)):
        raise SpecError(f"name {name!r} is not a valid Python module name: use letters, digits and "
                        f"underscores, not starting with a digit (e.g. {_suggest(name)!r})")
    if not set(name) <= _FILE_NAME_CHARS or name[0] in ".-":
        raise SpecError(f"name {name!r} cannot be a file name: use letters, digits, '_', '-' and '.' "
                        f"(e.g. {_suggest(name)!r})")
    return name


def _suggest(name) -> str:
    s = re.sub(r"\W", "_", str(name)) or "ext"
    return "_" + s if s[0].isdigit() else s


# TORCH_EXTENSION_NAME of JIT builds: one constant, so that every extension shares one
# precompiled torch header; the module is imported under its spec name (see _torch/_extension).
MODULE_NAME = "opsmith_ext"

class ExtensionSpec(Record):
    """Everything that defines an extension build, validated.

    Built by :meth:`from_files` (``load``) or :meth:`from_inline` (``load_inline``).
    ``module_name``: the value of ``TORCH_EXTENSION_NAME`` when it must be the real name
    (setuptools builds, imported by that name); None in JIT builds (a shared constant).
    ``profile``: the build profile (``"torch-extension"``, ``"shared-library"``; see
    ``opsmith._build._profile``).
    """

    __slots__ = ("name", "sources", "kind", "with_cuda", "extra_cflags", "extra_cuda_cflags",
                 "extra_ldflags", "extra_include_paths", "build_directory", "keep_intermediates",
                 "verbose", "module_name", "profile")
    _defaults = {"extra_cflags": (), "extra_cuda_cflags": (), "extra_ldflags": (),
                 "extra_include_paths": (), "build_directory": None, "keep_intermediates": True,
                 "verbose": False, "module_name": None, "profile": "torch-extension"}


    @staticmethod
    def kind_of(is_python_module: bool, is_standalone: bool) -> Kind:
        if is_python_module and is_standalone:
            raise SpecError("`is_python_module` and `is_standalone` are mutually exclusive: pass "
                            "is_python_module=False to build an executable")
        return "executable" if is_standalone else ("module" if is_python_module else "library")

    @classmethod
    def from_files(cls, name, sources, *, kind: Kind, with_cuda=None, **common) -> ExtensionSpec:
        if isinstance(sources, (str, os.PathLike)):
            sources = [sources]
        if sources is None or len(list(sources)) == 0:
            raise SpecError("sources is empty: pass at least one C++ (.cpp) or CUDA (.cu) file")
        srcs = []
        for item in sources:
            if not isinstance(item, (str, os.PathLike)):
                raise SpecError(f"sources must hold file paths, got {item!r}")
            path = os.path.abspath(os.fspath(item))
            if not os.path.isfile(path):
                hint = " (it is a directory)" if os.path.isdir(path) else ""
                raise SpecError(f"source file {os.fspath(item)!r} does not exist{hint} "
                                f"(looked at {path})")
            lang = "cuda" if path.endswith(CUDA_SUFFIXES) else "c" if path.endswith(C_SUFFIXES) else "c++"
            try:
                with open(path, "rb") as f:
                    text = f.read()
            except OSError as exc:
                raise SpecError(f"cannot read source file {path}: {exc.strerror}") from None
            srcs.append(Source(display=os.fspath(item), text=text, lang=lang, path=path))
        stems = [s.stem for s in srcs]
        dup = {s for s in stems if stems.count(s) > 1}
        if dup:
            raise SpecError(f"two sources would produce the same object file ({sorted(dup)}); "
                            f"rename one of them")
        return cls._create(name, srcs, kind, with_cuda, common)

    @classmethod
    def from_inline(cls, name, cpp_sources, cuda_sources=None, functions=None, *, kind: Kind,
                    with_cuda=None, with_pytorch_error_handling=True, no_implicit_headers=False,
                    **common) -> ExtensionSpec:
        cpp = _inline_list(cpp_sources, "cpp_sources")
        cuda = _inline_list(cuda_sources, "cuda_sources")
        if not cpp and not cuda:
            raise SpecError("load_inline needs source code: cpp_sources and cuda_sources are both empty")
        parts = [] if no_implicit_headers else ["#include <torch/extension.h>"]
        for i, text in enumerate(cpp):
            parts.append(f'#line 1 "cpp_sources[{i}]"')
            parts.append(text)
        if functions is not None and any("PYBIND11_MODULE" in t for t in cpp):
            # torch would emit a second module definition and fail to compile; the user's own
            # PYBIND11_MODULE already says what to export.
            import logging
            logging.getLogger("opsmith").warning(
                "load_inline(%r): cpp_sources define PYBIND11_MODULE themselves, so functions= "
                "is not used to generate bindings", name)
        elif functions is not None:
            _check_functions(functions, cpp)
            parts.append('#line 1 "<opsmith: generated bindings>"')
            parts.append(_bindings(functions, with_pytorch_error_handling))
        srcs = [Source(display="main.cpp", text="\n".join(parts).encode(), lang="c++",
                       filename="main.cpp")]
        if cuda:
            cparts = [] if no_implicit_headers else [
                "#include <torch/types.h>", "#include <cuda.h>", "#include <cuda_runtime.h>"]
            for i, text in enumerate(cuda):
                cparts.append(f'#line 1 "cuda_sources[{i}]"')
                cparts.append(text)
            srcs.append(Source(display="cuda.cu", text="\n".join(cparts).encode(), lang="cuda",
                               filename="cuda.cu"))
        return cls._create(name, srcs, kind, with_cuda, common)

    @classmethod
    def _create(cls, name, srcs, kind, with_cuda, common) -> ExtensionSpec:
        check_name(name, kind)
        has_cuda = any(s.lang == "cuda" for s in srcs)
        if with_cuda is None:
            with_cuda = has_cuda
        elif not with_cuda and has_cuda:
            raise SpecError("with_cuda=False but CUDA sources (.cu) were given: drop with_cuda or "
                            "the .cu files")
        return cls(
            name=name, sources=tuple(srcs), kind=kind, with_cuda=bool(with_cuda),
            extra_cflags=_lenient_flags(common.get("extra_cflags"), "extra_cflags"),
            extra_cuda_cflags=_lenient_flags(common.get("extra_cuda_cflags"), "extra_cuda_cflags"),
            extra_ldflags=_lenient_flags(common.get("extra_ldflags"), "extra_ldflags"),
            extra_include_paths=_lenient_paths(common.get("extra_include_paths"), "extra_include_paths"),
            build_directory=(os.path.abspath(os.fspath(common["build_directory"]))
                             if common.get("build_directory") else None),
            keep_intermediates=bool(common.get("keep_intermediates", True)),
            verbose=bool(common.get("verbose", False)),
            module_name=_module_name(common.get("module_name")),
            profile=common.get("profile") or "torch-extension",
        )


def _module_name(value) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.isidentifier() or keyword.iskeyword(value):
        raise SpecError(f"module_name {value!r} is not a valid Python module name (the last part of "
                        f"an extension's dotted name, e.g. 'myrelu')")
    return value


def _inline_list(value, what: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value] if value.strip() else []
    if not isinstance(value, Sequence):
        raise SpecError(f"{what} must be a string or a list of strings, got {type(value).__name__}")
    for v in value:
        if not isinstance(v, str):
            raise SpecError(f"{what} must hold strings, got {type(v).__name__}")
    return [v for v in value if v.strip()]


def _bindings(functions, error_handling: bool) -> str:
    if isinstance(functions, str):
        functions = [functions]
    if isinstance(functions, (list, tuple)):
        functions = {f: f for f in functions}
    if not isinstance(functions, dict):
        raise SpecError(f"functions must be a list of names or a dict name -> docstring, "
                        f"got {type(functions).__name__}")
    lines = ["PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {"]
    for fname, doc in functions.items():
        if not isinstance(fname, str) or not fname.isidentifier():
            raise SpecError(f"functions: {fname!r} is not a C++ function name")
        doc_lit = '"' + str(doc).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
        target = f"torch::wrap_pybind_function({fname})" if error_handling else fname
        lines.append(f'  m.def("{fname}", {target}, {doc_lit});')
    lines.append("}")
    return "\n".join(lines)


def _function_names(functions) -> list:
    if isinstance(functions, str):
        return [functions]
    if isinstance(functions, dict):
        return list(functions)
    if isinstance(functions, (list, tuple)):
        return list(functions)
    return []  # _bindings explains the type error


def _check_functions(functions, cpp: list[str]) -> None:
    """Each name in ``functions`` must appear in ``cpp_sources`` (declared or defined there).

    Checked before compiling: otherwise the error comes from the generated bindings, after a
    full compile. A name that only a macro spells out still appears as a word, so it passes.
    """
    words = set(re.findall(r"[A-Za-z_]\w*", "\n".join(cpp)))
    missing = [f for f in _function_names(functions) if isinstance(f, str) and f not in words]
    if not missing:
        return
    import difflib
    hints = []
    for name in missing:
        close = difflib.get_close_matches(name, sorted(words), n=1, cutoff=0.75)
        if close:
            hints.append(f"did you mean {close[0]!r} for {name!r}?")
    listed = ", ".join(repr(m) for m in missing)
    raise SpecError(
        f"functions= names {listed}, which cpp_sources neither declare nor define. Define "
        f"{'it' if len(missing) == 1 else 'them'} in cpp_sources, or declare {'it' if len(missing) == 1 else 'them'} "
        f"there (e.g. `torch::Tensor {missing[0]}(torch::Tensor x);`) when the definition is in "
        f"cuda_sources." + (" " + " ".join(hints) if hints else ""))
