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
from typing import Any

from opsmith._runtime import _signature as sig
from opsmith._errors import LaunchError
from opsmith._runtime._launch_config import KernelAttributes, LaunchConfig, ex_config
from opsmith._torch._kernel_launcher import build_launcher, checked_align
from opsmith._torch._kernel_checks import (_MISSING, ArgChecks, _current_device, _is_tensor, _no_cuda_torch, _stream_handle)


__all__ = ["Kernel"]

_ACCEPTED_SHARED_CONFIGS = 64  # configs remembered as validated, per kernel and device


class _DeviceState:
    """A kernel loaded on one device: its function handle and the limits checked at launch."""

    __slots__ = ("fn", "fnp", "ok", "attrs", "smem_limit", "smem_set", "block_for", "clusters")

    def __init__(self, fn: int, attrs: KernelAttributes, smem_limit: int) -> None:
        self.fn = fn
        self.fnp = ctypes.c_void_p(fn)  # pre-converted: a ctypes call without argtypes
        self.ok: dict[int, LaunchConfig] = {}
        self.attrs = attrs
        self.smem_limit = smem_limit  # the device's opt-in maximum of shared memory per block
        self.smem_set = attrs.max_dynamic_shared_bytes
        self.block_for: dict[int, int] = {}
        self.clusters: dict[tuple, int] = {}  # active_clusters' answers by launch dimensions

    def opt_in_shared(self) -> None:
        """Let the kernel take all the dynamic shared memory a block can have on its device
        (above 48 KiB needs an explicit opt-in: ``cuFuncSetAttribute``)."""
        room = self.smem_limit - self.attrs.static_shared_bytes
        if self.smem_set < room:
            from opsmith._runtime import _driver
            _driver.func_set_attribute(self.fn, "MAX_DYNAMIC_SHARED_SIZE_BYTES", room)
            self.smem_set = room


class Kernel(ArgChecks):
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

    def __init__(self, module: Any, signature: sig.KernelSignature) -> None:  # module: its CudaModule
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
                desc.append(("tensor", tuple(getattr(torch, d) for d in p.dtypes), checked_align(p)))
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

    def _build_launcher(self, owner: int):
        """The generated Python launch function for thread ``owner`` (see ``_kernel_launcher``)."""
        return build_launcher(self, owner)

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

    def active_clusters(self, config: LaunchConfig) -> int:
        """The clusters of this kernel (of its ``__cluster_dims__``) the current device holds at once, launched
        at ``config``: ``cuOccupancyMaxActiveClusters``, asked once a config. A persistent grid of more runs
        its last clusters after the others. 0 where the driver cannot say (before CUDA 12, or no cluster size
        compiled in)."""
        from opsmith._runtime import _driver
        dev = _current_device()
        st = self._state(dev)
        n = st.clusters.get(config._dims)
        if n is None:
            with _driver.pushed_context(dev):
                n = st.clusters[config._dims] = _driver.occupancy_active_clusters(st.fn, config._dims)
        return n

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
            st.opt_in_shared()
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

    def __repr__(self) -> str:
        return f"Kernel({self.name}({', '.join(p.ctype for p in self.params)}))"


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
