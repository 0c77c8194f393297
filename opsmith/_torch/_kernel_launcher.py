"""A kernel's generated Python launcher: one small function per kernel and thread with the
checks of each parameter unrolled, writing into ctypes slots that a ``void**`` array already
points to, so that a launch costs a few attribute reads and one foreign call.
"""
from __future__ import annotations

import ctypes
import threading
from typing import Any

from opsmith._errors import LaunchError
from opsmith._runtime import _signature as sig
from opsmith._runtime._launch_config import ex_config
from opsmith._torch._kernel_checks import _MISSING, _no_cuda_torch, _stream_handle

__all__ = ["build_launcher", "checked_align"]

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



def build_launcher(self, owner: int):
    """The launch function of kernel ``self`` for thread ``owner``, with its own argument slots.

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
            if checked_align(p) > 1:
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


def checked_align(p: sig.Param) -> int:
    """The address alignment a launch checks for tensor parameter ``p`` (1: none)."""
    # torch aligns every tensor to its element size; only vector types need a check
    if p.align > 1 and (not p.dtypes or p.align > sig.elem_size(p.dtypes[0])):
        return p.align
    return 1


def _no_driver_launch(*_args) -> int:
    raise LaunchError("internal: a launch reached the driver before the kernel was loaded")
