"""CUDA kernels for torch tensors: :class:`CudaModule`, :class:`Kernel`, :class:`LaunchConfig`.

``CudaModule(source)`` compiles with NVRTC (or takes the cubin from the store) and reads
every ``__global__`` declaration; ``module.get_kernel("name")`` gives a :class:`Kernel`
whose launches are checked against that signature before any driver call, then go to
``cuLaunchKernel`` once, on torch's current stream of the tensors' device.

The launch path is generated per kernel (one small Python function with the checks for
each parameter unrolled) and writes into ctypes slots that a ``void**`` array already
points to, so that a launch costs a few attribute reads and one foreign call. When the
optional C extension ``opsmith._runtime._claunch`` is built, ``kernel.launch`` is a C object that does
the same checks on the fast path and hands every other call to that Python launcher. The CUDA
context is touched only at the first launch on a device, which loads the module there.
"""
from __future__ import annotations

import ctypes
import operator
import threading
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from opsmith._runtime import _signature as sig
from opsmith._errors import LaunchError, ToolchainError
from opsmith._runtime._launch_config import KernelAttributes, LaunchConfig, ex_config

if TYPE_CHECKING:  # pragma: no cover
    from opsmith._torch._cuda_module import CudaModule

__all__ = ["Kernel"]

_MISSING = type("_Missing", (), {"__repr__": lambda self: "<missing>"})()
_ACCEPTED_SHARED_CONFIGS = 64  # configs remembered as validated, per kernel and device


class _DeviceState:
    """A kernel loaded on one device: its function handle and the limits checked at launch."""

    __slots__ = ("fn", "fnp", "ok", "attrs", "smem_limit", "smem_set", "block_for")

    def __init__(self, fn: int, attrs: KernelAttributes, smem_limit: int) -> None:
        self.fn = fn
        self.fnp = ctypes.c_void_p(fn)  # pre-converted: a ctypes call without argtypes
        self.ok: dict[int, LaunchConfig] = {}
        self.attrs = attrs
        self.smem_limit = smem_limit  # the device's opt-in maximum of shared memory per block
        self.smem_set = attrs.max_dynamic_shared_bytes
        self.block_for: dict[int, int] = {}


_TEMPLATE = '''
def launch(config, {params}*extra, stream=None):
    if get_ident() != owner:
        return other_thread(config, ({names}) + extra, stream)
    if {count_bad}:
        fail_count(({names}) + extra)
{body}
    st = states.get(dev)
    if st is None or st.ok.get(id(config)) is not config or dev != getdev():
        return slow(config, dev, stream, params)
    s = rawstream(dev) if stream is None else stream_handle(stream, dev)
    c = config._ex.get(s)
    if c is None:
        c = ex_config(config, s)
    r = launch_ex(c, st.fnp, params, None)
    if r:
        failed(r, config, dev, stream, params)
'''


class Kernel:
    """One kernel of a :class:`CudaModule`, with its signature, ready to launch.

    Attributes
    ----------
    name : str
        The name or name expression it was taken by.
    symbol : str
        The symbol in the cubin (the lowered name for C++ kernels).
    signature : KernelSignature
        The parsed signature (name, symbol, parameters): the one description that the
        checks, the C launcher, torch schemas and exported C headers are generated from.
    params : list of Param
        ``signature.params``, one entry per parameter.

    Examples
    --------
    >>> k = mod.get_kernel("relu")                                       # doctest: +SKIP
    >>> k((blocks,), (256,), (x, y, n))          # CuPy-style           # doctest: +SKIP
    >>> k.launch(opsmith.LaunchConfig(blocks, 256), x, y, n)            # doctest: +SKIP
    >>> k.launch_n(n, x, y, n)                   # block size by occupancy  # doctest: +SKIP
    """

    def __init__(self, module: CudaModule, signature: sig.KernelSignature) -> None:
        self.module = module
        self.signature = signature
        self.name = signature.name
        self.symbol = signature.symbol
        self.params = list(signature.params)  # read by the generated checks and the C launcher
        self._states: dict[int, _DeviceState] = {}
        self._configs: dict[tuple, LaunchConfig] = {}
        self._lock = threading.Lock()
        self._local = threading.local()
        self._namespaces: list[dict[str, Any]] = []
        self._py_launch = self._build_launcher(threading.get_ident())
        # the C fast path (opsmith._runtime._claunch) when built and enabled; it falls back to _py_launch
        self._claunch = self._c_launcher()
        self.launch = self._claunch if self._claunch is not None else self._py_launch

    def _c_launcher(self, fallback=None, getdev=None, rawstream=None):
        """A C launcher (``opsmith._runtime._claunch.Launcher``) in front of ``fallback``, or None.

        None when the extension is not built, ``OPSMITH_C_LAUNCH=0``, or a parameter is of a
        kind it does not pack. ``getdev``/``rawstream`` default to torch's; tests pass fakes.
        """
        c = _claunch_module()
        if c is None or len(self.params) > c.MAX_PARAMS:
            return None
        import torch
        desc: list[tuple] = []
        for p in self.params:
            if p.kind == "tensor":
                desc.append(("tensor", tuple(getattr(torch, d) for d in p.dtypes), _checked_align(p)))
            elif p.kind == "int":
                desc.append(("int", ctypes.sizeof(p.ctypes_type), *p.range))  # type: ignore[misc]
            elif p.kind in ("float", "bool"):
                desc.append((p.kind, ctypes.sizeof(p.ctypes_type)))
            else:
                return None
        return c.Launcher(
            self.name, desc, fallback if fallback is not None else self._py_launch, torch.Tensor,
            getdev if getdev is not None else getattr(torch._C, "_cuda_getDevice", _no_cuda_torch),
            rawstream if rawstream is not None else getattr(torch._C, "_cuda_getCurrentRawStream", _no_cuda_torch),
            _ACCEPTED_SHARED_CONFIGS)

    # -- the generated fast path ------------------------------------------------------------
    def _build_launcher(self, owner: int):
        """The launch function for thread ``owner``, with its own argument slots.

        Each thread packs into its own slots, so that two threads launching one kernel at
        once cannot mix their arguments.
        """
        import torch

        from opsmith._runtime import _driver
        slots = [p.ctypes_type() for p in self.params]
        array = (ctypes.c_void_p * max(1, len(slots)))(*[ctypes.addressof(x) for x in slots])
        params = ctypes.c_void_p(ctypes.addressof(array))
        params._keep = (array, slots)
        ns: dict[str, Any] = {
            "owner": owner, "get_ident": threading.get_ident, "other_thread": self._other_thread,
            "ex_config": ex_config,
            # libcuda's once a launch has loaded the driver (set for every thread's launcher)
            "launch_ex": _driver._launch_ex if _driver._launch_ex is not None else _no_driver_launch,
            "Tensor": torch.Tensor, "states": self._states,
            "getdev": getattr(torch._C, "_cuda_getDevice", _no_cuda_torch),
            "rawstream": getattr(torch._C, "_cuda_getCurrentRawStream", _no_cuda_torch),
            "stream_handle": _stream_handle,
            "params": params, "slow": self._launch_slow,
            "failed": self._launch_failed, "fail": self._fail_arg, "fail_count": self._fail_count,
            "fail_device": self._fail_device, "as_int": self._as_int, "as_float": self._as_float,
            "as_bool": self._as_bool,
        }
        self._namespaces.append(ns)
        body: list[str] = []
        tensors: list[int] = []
        for p in self.params:
            i, a = p.index, f"a{p.index}"
            ns[f"S{i}"] = slots[i]
            if p.kind == "tensor":
                tensors.append(i)
                body.append(f"    if type({a}) is not Tensor and not isinstance({a}, Tensor): fail({i}, {a})")
                if len(p.dtypes) == 1:
                    ns[f"D{i}"] = getattr(torch, p.dtypes[0])
                    body.append(f"    if {a}.dtype is not D{i}: fail({i}, {a})")
                elif p.dtypes:
                    ns[f"D{i}"] = tuple(getattr(torch, d) for d in p.dtypes)
                    body.append(f"    if {a}.dtype not in D{i}: fail({i}, {a})")
                body.append(f"    if not {a}.is_contiguous(): fail({i}, {a})")
                if _checked_align(p) > 1:
                    body.append(f"    p = {a}.data_ptr()")
                    body.append(f"    if p & {p.align - 1}: fail({i}, {a})")
                    body.append(f"    S{i}.value = p")
                else:
                    body.append(f"    S{i}.value = {a}.data_ptr()")
            elif p.kind == "int":
                lo, hi = p.range  # type: ignore[misc]
                body.append(f"    if type({a}) is not int: {a} = as_int({i}, {a})")
                body.append(f"    if not {lo} <= {a} <= {hi}: fail({i}, {a})")
                body.append(f"    S{i}.value = {a}")
            elif p.kind == "float":
                body.append(f"    if type({a}) is not float: {a} = as_float({i}, {a})")
                body.append(f"    S{i}.value = {a}")
            elif p.kind == "bool":
                body.append(f"    if {a} is not True and {a} is not False: {a} = as_bool({i}, {a})")
                body.append(f"    S{i}.value = {a}")
        # the device comes last, so that every other check runs (and is testable) without a GPU
        if tensors:
            body.append(f"    dev = a{tensors[0]}.get_device()")
            body.append(f"    if dev < 0: fail_device({tensors[0]}, a{tensors[0]}, dev)")
            for i in tensors[1:]:
                body.append(f"    if a{i}.get_device() != dev: fail_device({i}, a{i}, dev)")
        else:
            body.append("    dev = getdev()")
        n = len(self.params)
        ns["MISSING"] = _MISSING
        code = _TEMPLATE.format(
            params="".join(f"a{i}=MISSING, " for i in range(n)),
            names="".join(f"a{i}, " for i in range(n)),
            count_bad=f"a{n - 1} is MISSING or extra" if n else "extra",
            body="\n".join(body))
        exec(compile(code, f"<opsmith launcher {self.name}>", "exec"), ns)
        launch = ns["launch"]
        launch.__doc__ = (f"Launch {self.name}({', '.join(p.ctype for p in self.params)}) with a "
                          f"LaunchConfig on torch's current stream of the tensors' device.")
        return launch

    def __call__(self, grid, block, args: Sequence[Any] = (), *, shared_mem: int = 0, stream=None):
        """CuPy-style launch: ``kernel(grid, block, (x, y, n), shared_mem=0)``."""
        key = (grid, block, shared_mem)
        try:
            config = self._configs.get(key)
        except TypeError:  # unhashable (lists): build it each time
            config = None
        if config is None:
            config = LaunchConfig(grid, block, shared_mem)
            if len(self._configs) < 1024:
                try:
                    self._configs[key] = config
                except TypeError:
                    pass
        if not isinstance(args, (tuple, list)):
            raise LaunchError(f"{self.name}: args must be a tuple of the kernel's arguments, got "
                              f"{type(args).__name__}; write kernel(grid, block, (x, y, n))")
        return self.launch(config, *args, stream=stream)

    # -- the launch helper ---------------------------------------------------------------------
    def config_for(self, n: int, *, block: int | None = None, shared_mem: int = 0,
                   items_per_thread: int = 1, device: int | None = None) -> LaunchConfig:
        """A 1-D config covering ``n`` items: block size from the occupancy API, grid from ``n``.

        ``items_per_thread`` is how many items one thread handles (4 for a float4 kernel).
        """
        n = operator.index(n)
        if n < 1:
            raise LaunchError(f"{self.name}: config_for needs n >= 1 items, got {n}")
        if block is None:
            dev = _current_device() if device is None else device
            st = self._state(dev)
            block = st.block_for.get(shared_mem)
            if block is None:
                from opsmith._runtime import _driver
                with _driver.pushed_context(dev):  # the occupancy API needs a current context
                    block = st.block_for[shared_mem] = _driver.occupancy_block_size(st.fn, shared_mem)
        per_block = block * items_per_thread
        return LaunchConfig(((n + per_block - 1) // per_block,), (block,), shared_mem)

    def launch_n(self, n: int, *args, items_per_thread: int = 1, shared_mem: int = 0, stream=None):
        """Launch over ``n`` items with :meth:`config_for`'s config; ``n == 0`` launches nothing."""
        if n == 0:
            return None
        dev = next((a.get_device() for a in args if _is_tensor(a)), None)
        key = ("n", n, items_per_thread, shared_mem, dev)
        config = self._configs.get(key)
        if config is None:
            config = self.config_for(n, shared_mem=shared_mem, items_per_thread=items_per_thread,
                                     device=dev if dev is not None and dev >= 0 else None)
            if len(self._configs) < 1024:
                self._configs[key] = config
        return self.launch(config, *args, stream=stream)

    # -- attributes ------------------------------------------------------------------------------
    @property
    def attributes(self) -> KernelAttributes:
        """Registers, shared and local memory, max threads per block (on the current device).

        Loads the module on the device if needed; warns once when the kernel spills.
        """
        return self._state(_current_device()).attrs

    def occupancy(self, block_size: int, shared_mem: int = 0) -> int:
        """Resident blocks per multiprocessor at ``block_size`` threads and ``shared_mem`` bytes."""
        from opsmith._runtime import _driver
        dev = _current_device()
        st = self._state(dev)
        with _driver.pushed_context(dev):
            return _driver.occupancy_active_blocks(st.fn, block_size, shared_mem)

    # -- slow path: first launch on a device, a new config, another device, errors ----------------
    def _state(self, dev: int) -> _DeviceState:
        st = self._states.get(dev)
        if st is not None:
            return st
        from opsmith._runtime import _driver
        with self._lock:
            st = self._states.get(dev)
            if st is not None:
                return st
            module = self.module._module_on(dev)
            fn = _driver.get_function(module, self.symbol, self.name)

            def attr(name: str) -> int:
                return _driver.func_attribute(fn, name)
            attrs = KernelAttributes(
                registers=attr("NUM_REGS"), static_shared_bytes=attr("SHARED_SIZE_BYTES"),
                max_dynamic_shared_bytes=attr("MAX_DYNAMIC_SHARED_SIZE_BYTES"),
                local_bytes=attr("LOCAL_SIZE_BYTES"), const_bytes=attr("CONST_SIZE_BYTES"),
                max_threads_per_block=attr("MAX_THREADS_PER_BLOCK"),
                ptx_version=attr("PTX_VERSION"), binary_version=attr("BINARY_VERSION"))
            if attrs.spills:
                warnings.warn(
                    f"CUDA kernel {self.name} uses {attrs.local_bytes} bytes of local memory per "
                    f"thread (register spills or a stack array; {attrs.registers} registers): local "
                    f"memory is slow. Reduce live values, index arrays with constants, or raise the "
                    f"register limit (__launch_bounds__, -maxrregcount).", ResourceWarning, stacklevel=3)
            smem_limit = _driver.device_attribute(dev, "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN")
            st = self._states[dev] = _DeviceState(fn, attrs, smem_limit)
            if self._claunch is not None and 0 <= dev < _claunch_state[0].MAX_DEVICE:
                self._claunch.set_function(dev, fn)
            return st

    def _validate(self, config: Any, st: _DeviceState, dev: int) -> None:
        if not isinstance(config, LaunchConfig):
            raise LaunchError(f"{self.name}: the first argument of launch() must be a LaunchConfig, "
                              f"got {type(config).__name__}; write kernel.launch(LaunchConfig(grid, "
                              f"block), *args) or kernel(grid, block, args)")
        a = st.attrs
        if config.threads > a.max_threads_per_block:
            raise LaunchError(
                f"{self.name}: block {config.block} has {config.threads} threads but this kernel "
                f"can run at most {a.max_threads_per_block} per block ({a.registers} registers per "
                f"thread, or __launch_bounds__); use a smaller block or kernel.config_for(n)")
        total = config.shared_mem + a.static_shared_bytes
        if total > st.smem_limit:
            raise LaunchError(
                f"{self.name}: {config.shared_mem} bytes of dynamic shared memory plus "
                f"{a.static_shared_bytes} static exceed the {st.smem_limit} bytes a block can have "
                f"on cuda:{dev}")
        if config.shared_mem > st.smem_set:  # above 48 KiB needs an explicit opt-in
            from opsmith._runtime import _driver
            _driver.func_set_attribute(st.fn, "MAX_DYNAMIC_SHARED_SIZE_BYTES",
                                       st.smem_limit - a.static_shared_bytes)
            st.smem_set = st.smem_limit - a.static_shared_bytes
        full = len(st.ok) >= _ACCEPTED_SHARED_CONFIGS
        if full:
            st.ok.clear()
        st.ok[id(config)] = config
        c = self._claunch
        if c is not None and 0 <= dev < _claunch_state[0].MAX_DEVICE:  # the C launcher's copy
            if full:
                c.forget_configs(dev)
            c.set_config(dev, config)

    def _launch_slow(self, config, dev: int, stream, params) -> None:
        import torch
        from opsmith._runtime import _driver
        st = self._state(dev)
        self._validate(config, st, dev)
        launch_ex = _driver.launch_ex()
        for ns in self._namespaces:
            ns["launch_ex"] = launch_ex
        if self._claunch is not None:
            self._claunch.set_launch(ctypes.cast(launch_ex, ctypes.c_void_p).value or 0)
        s = torch._C._cuda_getCurrentRawStream(dev) if stream is None else _stream_handle(stream, dev)
        c = config._ex.get(s) or ex_config(config, s)
        r = _driver.CUDA_ERROR_INVALID_CONTEXT
        if dev == torch._C._cuda_getDevice():
            r = launch_ex(c, st.fnp, params, None)
        if r == _driver.CUDA_ERROR_INVALID_CONTEXT:  # another device, or a thread with no context yet
            with _driver.pushed_context(dev):
                r = launch_ex(c, st.fnp, params, None)
        if r:
            self._raise_launch(r, config, dev)

    def _launch_failed(self, r: int, config, dev: int, stream, params) -> None:
        from opsmith._runtime import _driver
        if r == _driver.CUDA_ERROR_INVALID_CONTEXT:
            return self._launch_slow(config, dev, stream, params)
        self._raise_launch(r, config, dev)

    def _other_thread(self, config, args, stream):
        """A launch from a thread other than the kernel's first: that thread's own launcher."""
        args = [a for a in args if a is not _MISSING]
        launch = getattr(self._local, "launch", None)
        if launch is None:
            with self._lock:
                launch = self._local.launch = self._build_launcher(threading.get_ident())
        return launch(config, *args, stream=stream)

    def _raise_launch(self, r: int, config, dev: int):
        from opsmith._runtime import _driver
        raise LaunchError(f"cuLaunchKernelEx({self.name}, grid={config.grid}, block={config.block}, "
                          f"shared_mem={config.shared_mem}) on cuda:{dev} failed: "
                          f"{_driver.error_name(r)}")

    # -- error messages (only on failure) --------------------------------------------------------
    def _where(self, p: sig.Param) -> str:
        return f"{self.name}: {p.describe()} expects {p.expects()}"

    def _fail_count(self, args) -> None:
        args = [a for a in args if a is not _MISSING]
        decl = ", ".join(p.ctype for p in self.params)
        raise LaunchError(f"{self.name}({decl}) takes {len(self.params)} argument(s), got "
                          f"{len(args)}: {', '.join(_show(a) for a in args) or 'none'}")

    def _fail_arg(self, i: int, a: Any) -> None:
        p = self.params[i]
        if p.kind == "tensor":
            if not _is_tensor(a):
                got = _show(a)
                hint = " (pass the tensor itself, not its data_ptr())" if isinstance(a, int) else ""
                raise LaunchError(f"{self._where(p)}; got {got}{hint}")
            if p.dtypes and str(a.dtype).replace("torch.", "") not in p.dtypes:
                raise LaunchError(f"{self._where(p)}; got a {a.dtype} tensor")
            if not a.is_contiguous():
                raise LaunchError(f"{self._where(p)}; got a non-contiguous tensor (shape "
                                  f"{tuple(a.shape)}, strides {a.stride()}): call .contiguous() first")
            if a.data_ptr() % p.align == 0 and a.get_device() < 0:
                raise LaunchError(f"{self._where(p)}; got a tensor on {a.device} (move it with .cuda())")
            raise LaunchError(f"{self._where(p)}; got a tensor whose data pointer {a.data_ptr():#x} is "
                              f"not {p.align}-byte aligned (a view at an offset?): pass an aligned "
                              f"tensor, e.g. .clone()")
        if p.kind in ("int", "bool"):
            raise LaunchError(f"{self._where(p)}; got {_show(a)}, which does not fit {p.ctype}")
        raise LaunchError(f"{self._where(p)}; got {_show(a)}")

    def _fail_device(self, i: int, a: Any, dev: int) -> None:
        p = self.params[i]
        if dev < 0:
            raise LaunchError(f"{self._where(p)}; got a tensor on {a.device} (move it with .cuda())")
        raise LaunchError(f"{self._where(p)} on the same device as the first tensor argument "
                          f"(cuda:{dev}); got a tensor on {a.device}")

    def _as_int(self, i: int, a: Any) -> int:
        p = self.params[i]
        if isinstance(a, (float, complex)) or _is_tensor(a):
            raise LaunchError(f"{self._where(p)}; got {_show(a)}")
        try:
            return operator.index(a)
        except TypeError:
            raise LaunchError(f"{self._where(p)}; got {_show(a)}") from None

    def _as_bool(self, i: int, a: Any) -> int:
        v = self._as_int(i, a)
        if v not in (0, 1):
            self._fail_arg(i, a)
        return v

    def _as_float(self, i: int, a: Any) -> float:
        p = self.params[i]
        if isinstance(a, (int, float)) and not isinstance(a, bool):
            return float(a)
        if _is_tensor(a) or isinstance(a, (str, bytes, complex, bool)):
            raise LaunchError(f"{self._where(p)}; got {_show(a)}")
        try:
            return float(a)
        except (TypeError, ValueError):
            raise LaunchError(f"{self._where(p)}; got {_show(a)}") from None

    def __repr__(self) -> str:
        return f"Kernel({self.name}({', '.join(p.ctype for p in self.params)}))"


def _checked_align(p: sig.Param) -> int:
    """The address alignment a launch checks for tensor parameter ``p`` (1: none)."""
    # torch aligns every tensor to its element size; only vector types need a check
    if p.align > 1 and (not p.dtypes or p.align > sig.elem_size(p.dtypes[0])):
        return p.align
    return 1


_claunch_state: list[Any] = []  # [module or None] once looked for


def _claunch_module():
    """``opsmith._runtime._claunch`` when built and ``OPSMITH_C_LAUNCH`` is on, else None."""
    from opsmith._config import settings
    if not settings.c_launch:
        return None
    if not _claunch_state:
        try:
            from opsmith._runtime import _claunch
        except ImportError:  # not built (no compiler at install): the Python launcher does it all
            _claunch = None
        _claunch_state.append(_claunch)
    return _claunch_state[0]


def _show(a: Any) -> str:
    if _is_tensor(a):
        return f"a {a.dtype} tensor on {a.device}"
    text = repr(a)
    return f"{type(a).__name__} {text[:60]}"


def _is_tensor(a: Any) -> bool:
    import sys
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(a, torch.Tensor)


def _stream_handle(stream: Any, dev: int) -> int:
    """A raw CUstream from a torch.cuda.Stream (checked against the device) or an int."""
    handle = getattr(stream, "cuda_stream", None)
    if handle is not None:
        sdev = getattr(stream, "device_index", dev)
        if sdev != dev:
            raise LaunchError(f"the stream is on cuda:{sdev} but the tensors are on cuda:{dev}")
        return handle
    if isinstance(stream, int) and not isinstance(stream, bool):
        return stream
    raise LaunchError(f"stream must be a torch.cuda.Stream or a raw CUstream int, got {type(stream).__name__}")


def _current_device() -> int:
    import torch
    if not hasattr(torch._C, "_cuda_getDevice"):  # torch.cuda would raise a bare AssertionError
        _no_cuda_torch()
    try:
        return torch.cuda.current_device()
    except (AssertionError, RuntimeError) as exc:  # no driver, no device
        raise ToolchainError(f"torch cannot use a CUDA device here ({exc}): kernels compile without "
                             f"a GPU, but launching and kernel.attributes need an NVIDIA GPU, its "
                             f"driver and a CUDA build of torch (check nvidia-smi).") from None


def _no_cuda_torch(*_args) -> int:
    raise ToolchainError("this torch has no CUDA support (a CPU-only build): kernels compile here but "
                      "cannot run. Install a CUDA build of torch on a machine with an NVIDIA GPU.")


def _no_driver_launch(*_args) -> int:
    raise LaunchError("internal: a launch reached the driver before the kernel was loaded")
