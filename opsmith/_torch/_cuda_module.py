"""NVRTC-compiled CUDA modules for torch tensors: :class:`CudaModule` and :func:`cuda_kernel`.

``CudaModule(source)`` compiles with NVRTC (or takes the cubin from the store) and reads every
``__global__`` declaration; ``module.get_kernel("name")`` gives a :class:`~opsmith.Kernel`.
A device of a new arch gets its own cubin on first use (compiled here, never in the runtime).
"""
from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from opsmith._build._nvrtc import CudaBinary, compile_request, make_request, normalize_arch
from opsmith._errors import LaunchError, SpecError, ToolchainError
from opsmith._runtime import _signature as sig
from opsmith._torch._kernel import Kernel

__all__ = ["CudaModule", "cuda_kernel"]


class CudaModule:
    """CUDA C++ compiled by NVRTC (cached), from which kernels are taken by name.

    Parameters
    ----------
    source : str, path-like or CudaBinary
        CUDA C++ text, a ``.cu`` file (its directory becomes an include path), or the result
        of :func:`opsmith.compile_cuda`.
    name_expressions : iterable of str
        Template instantiations to compile and look up, e.g. ``["scale<float>"]``. Plain
        C++ (not ``extern "C"``) kernels are added automatically.
    include_paths, defines, headers, options, std
        As for :func:`opsmith.compile_cuda`; C++17 by default.
    arch : str, optional
        Target such as ``"sm_90"``. Default: ``OPSMITH_CUDA_ARCH``, else each device's own
        arch (a device of another arch gets its own cubin).
    output : {"cubin", "ptx"}
        ``"cubin"`` (default) loads without JIT. PTX needs a driver at least as new as NVRTC.

    Examples
    --------
    >>> import torch, opsmith                                        # doctest: +SKIP
    >>> mod = opsmith.CudaModule('''
    ... extern "C" __global__ void relu(const float* x, float* y, long long n) {
    ...     long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    ...     if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
    ... }''')                                                        # doctest: +SKIP
    >>> x = torch.randn(1000, device="cuda"); y = torch.empty_like(x)  # doctest: +SKIP
    >>> mod.get_kernel("relu").launch_n(x.numel(), x, y, x.numel())  # doctest: +SKIP
    """

    def __init__(self, source: str | os.PathLike | CudaBinary, *, name_expressions: Iterable[str] = (),
                 include_paths: Iterable[str | os.PathLike] = (),
                 defines: Mapping[str, Any] | Iterable[str] | None = None,
                 headers: Mapping[str, str] | None = None, options: Iterable[str] = (),
                 std: str | None = "c++17", arch: str | None = None, output: str = "cubin",
                 name: str | None = None) -> None:
        self._lock = threading.Lock()
        self._binaries: dict[str, CudaBinary] = {}
        self._modules: dict[int, Any] = {}
        self._kernels: dict[str, Kernel] = {}
        if isinstance(source, CudaBinary):
            self._request = None
            self._fixed_arch: str | None = source.arch
            self._binaries[source.arch] = source
            text = source.source
            self._name = source.name
            self._decls = sig.parse_kernels(text)
        else:
            from opsmith._config import settings
            fixed = arch or settings.cuda_arch
            self._fixed_arch = normalize_arch(fixed) if fixed else None
            probe = make_request(source, arch=self._fixed_arch or "sm_90", output=output, std=std,
                                 options=options, include_paths=include_paths, defines=defines,
                                 headers=headers, name_expressions=name_expressions, name=name)
            text = probe.source
            self._decls = _parsed_kernels(text)
            auto = [d.name for d in self._decls.values() if not d.extern_c and not d.template_params]
            self._request = probe._replace(
                name_expressions=tuple(dict.fromkeys([*probe.name_expressions, *auto])))
            self._name = probe.name
            self._first_binary()  # compile now: errors come early

    def _first_binary(self) -> None:
        if self._fixed_arch:
            self.binary_for(self._fixed_arch)
            return
        from opsmith._build._nvrtc import prebuilt
        pre = prebuilt(self._request, any_arch=True)
        if pre is not None:  # an installed package's binary gives the names; the device's comes at first use
            self._binaries[pre.arch] = pre  # (asking the device's arch here would initialise CUDA: 100+ ms)
            return
        self.binary_for(_current_arch())

    # -- build ----------------------------------------------------------------------------
    def binary_for(self, arch: str) -> CudaBinary:
        """The compiled code for ``arch`` (compiled or read from the store on first use)."""
        binary = self._binaries.get(arch)
        if binary is None:
            if self._request is None:
                raise LaunchError(f"{self._name} was loaded from a binary for {next(iter(self._binaries))}; "
                                  f"it has no source to compile for {arch}")
            binary = compile_request(self._request._replace(arch=arch))
            self._binaries[arch] = binary
        return binary

    @property
    def binary(self) -> CudaBinary:
        """The binary compiled first (for the fixed arch or the current device's)."""
        return next(iter(self._binaries.values()))

    @property
    def kernel_names(self) -> list[str]:
        """The ``__global__`` functions declared in the source."""
        return sorted(self._decls)

    # -- load -----------------------------------------------------------------------------
    def _module_on(self, device: int):
        module = self._modules.get(device)
        if module is None:
            from opsmith._runtime import _driver
            with self._lock:
                module = self._modules.get(device)
                if module is None:
                    arch = self._fixed_arch or _driver.device_arch(device)
                    b = self.binary_for(arch)
                    module = _driver.load_module(b.code, device, kind=b.kind, arch=b.arch,
                                                 nvrtc_version=b.nvrtc_version, name=self._name)
                    self._modules[device] = module
        return module

    def get_kernel(self, name: str, *, signature: str | None = None) -> Kernel:
        """The kernel ``name`` (a plain name or a name expression such as ``"scale<float>"``).

        Parameters
        ----------
        signature : str, optional
            The parameter list, e.g. ``"const float* x, int n"``, when it cannot be read
            from the source (a declaration made by a macro).
        """
        key = f"{name}|{signature}"
        kernel = self._kernels.get(key)
        if kernel is None:
            kernel = self._kernels[key] = self._make_kernel(name, signature)
        return kernel

    __getitem__ = get_kernel

    def _make_kernel(self, name: str, signature: str | None) -> Kernel:
        base, targs = sig.split_name_expression(name)
        lowered_names = self.binary.lowered_names
        decl = self._decls.get(base)
        if name in lowered_names:
            symbol = lowered_names[name]
        elif decl is not None and decl.extern_c and not targs:
            symbol = name
        elif decl is not None and decl.template_params:
            known = [e for e in lowered_names if sig.split_name_expression(e)[0] == base]
            raise SpecError(
                f"kernel {name!r} was not instantiated in {self._name}: list it in name_expressions= "
                f"when creating the module, e.g. name_expressions={[*known, name if targs else base + '<float>']!r}")
        elif decl is None and signature is not None:
            symbol = name  # declared by a macro: trust the user's extern "C" name
        else:
            raise SpecError(f"no kernel {name!r} in {self._name}; its __global__ functions are "
                            f"{self.kernel_names}")
        if signature is not None:
            ksig = sig.KernelSignature.parse(name, signature, symbol)
        elif decl is None:  # compiled (a name expression), but declared where opsmith does not read
            raise SpecError(
                f"kernel {name!r} is compiled in {self._name}, but its __global__ declaration is not in that "
                f"source text (an #included file?), where opsmith reads a kernel's parameters: declare it in "
                f"the source, or pass signature= with its parameter list, e.g. signature='const float* x, int n'")
        else:
            ksig = sig.KernelSignature.from_decl(name, decl, symbol)
        for p in ksig.unsupported():
            raise SpecError(
                f"kernel {name!r}: {p.describe()} has a type opsmith cannot pass from Python "
                f"(supported: pointers to numbers, which take tensors, and numbers). Pass a "
                f"signature= with a supported type, or change the kernel.")
        return Kernel(self, ksig)

    def __repr__(self) -> str:
        return f"CudaModule({self._name!r}, kernels={self.kernel_names})"


def _parsed_kernels(text: str) -> dict[str, sig.KernelDecl]:
    """``sig.parse_kernels(text)``, remembered in the machine-local state by the text's hash.

    Parsing compiles a dozen regular expressions (~0.5 ms on the GPU machine): a warm load
    reads the earlier parse instead.
    """
    import hashlib

    from opsmith._cache._open import open_cache
    from opsmith._version import __version__
    state = open_cache().state
    ident = hashlib.sha256(f"{__version__}\0{text}".encode()).hexdigest()[:40]
    def decls_of(doc: list) -> dict[str, sig.KernelDecl]:
        return {d[0]: sig.KernelDecl(d[0], d[1], tuple(d[2]), bool(d[3]), int(d[4])) for d in doc}

    def parse() -> list:
        return [[d.name, d.params_text, list(d.template_params), d.extern_c, d.line]
                for d in sig.parse_kernels(text).values()]
    return decls_of(state.memo("kernel-decls", ident, parse, valid=lambda d: decls_of(d) is not None))


def _current_arch() -> str:
    """The arch of torch's current CUDA device (no context is created)."""
    try:
        import torch
    except ImportError:
        raise ToolchainError("the target arch comes from torch's current CUDA device, and torch "
                             "is not importable; pass arch='sm_90' (or set OPSMITH_CUDA_ARCH)") from None
    if not torch.cuda.is_available():
        raise ToolchainError("no CUDA device to take the target arch from (torch.cuda.is_available() "
                             "is False); pass arch='sm_90' or set OPSMITH_CUDA_ARCH to compile "
                             "without a GPU")
    from opsmith._runtime import _driver
    return _driver.device_arch(torch.cuda.current_device())


def cuda_kernel(source: str | os.PathLike, name: str, **kwargs: Any) -> Kernel:
    """Compile ``source`` and return its kernel ``name``: ``CudaModule(source, ...).get_kernel(name)``.

    A name expression (``"scale<float>"``) is added to ``name_expressions`` for you.

    Examples
    --------
    >>> relu = opsmith.cuda_kernel(src, "relu")          # doctest: +SKIP
    >>> relu.launch_n(n, x, y, n)                        # doctest: +SKIP
    """
    signature = kwargs.pop("signature", None)
    if "<" in name:
        kwargs["name_expressions"] = [*kwargs.get("name_expressions", ()), name]
    return CudaModule(source, **kwargs).get_kernel(name, signature=signature)
