"""Kernels and extension functions as real torch operators: :func:`custom_op` and :class:`CustomOp`.

``custom_op("ns::name", kernel=k)`` defines ``torch.ops.ns.name`` through
``torch.library.Library(ns, "FRAGMENT")`` and registers, all generated once at registration:

- a CUDA implementation: one small Python function with the op's own parameter names that
  makes tensor inputs contiguous, allocates the outputs from their :class:`~opsmith.Out`
  specs (``torch.empty_like`` where it can), and calls the kernel's launcher
  (``kernel.launch``, the C launcher when built) with a launch config cached per item count
  and device. The launcher reads torch's *current* stream of the tensors' device at every
  call, so that a launch inside ``torch.cuda.graph`` is captured;
- a fake kernel from the same output specs (for ``FakeTensorMode``, ``torch.compile``,
  ``torch.export``);
- on :meth:`CustomOp.register_autograd`, an Autograd kernel: calls that need no gradient go
  straight to the device implementation (one Python call, no redispatch), calls that do go
  through a generated ``torch.autograd.Function``. torch's own ``register_autograd`` costs a
  second dispatch and a dataclass per call, gradient or not.

``@torch.library.custom_op`` is not used: its Python wrapper costs about 3x a plain
``Library.impl`` kernel per call.
"""
from __future__ import annotations

import sys
import threading
from typing import Any, Callable, Sequence

from opsmith._build import _prebuilt
from opsmith._opdesc import register as register_description
from opsmith._errors import OpsmithError, SpecError
from opsmith._torch import _opschema
from opsmith._torch._op_args import (_config_of, _first_dtype, _kernel_list, _new_config, _out_list, _split_name,
                                     describe_op)
from opsmith._torch._op_autograd import install_autograd, install_refusal
from opsmith._torch._elementwise import Elementwise
from opsmith._torch._outspec import Out, alloc_lines, fingerprint

__all__ = ["custom_op", "CustomOp", "Out"]

_OPS: dict[str, "CustomOp"] = {}
_lock = threading.RLock()


def custom_op(name: str, schema: str | Callable[..., Any] | None = None, *, kernel=None,
              cuda: Callable[..., Any] | None = None, cpu: Callable[..., Any] | None = None,
              out: Out | Sequence[Out] | None = None, launch: Callable[..., Any] | None = None,
              args: Sequence[str] | None = None, tags: Sequence[Any] = ()) -> "CustomOp":
    """Define ``torch.ops.<ns>.<name>`` from an opsmith kernel or from functions.

    Parameters
    ----------
    name : str
        ``"namespace::name"``; the op is ``torch.ops.namespace.name``.
    schema : str or callable, optional
        ``"(Tensor x, float alpha) -> Tensor"``, or a Python function whose annotations
        give it (``torch.library.infer_schema``). Default: derived from the kernel's C
        signature (``const T*`` inputs, other pointers outputs, a trailing count ``n``
        excluded), else from ``cpu``/``cuda`` (annotations, or a pybind11 docstring).
    kernel : Kernel or sequence of Kernel, optional
        The CUDA implementation: an opsmith NVRTC kernel, or several (one per dtype; the
        dtype of the first tensor input picks the kernel whose first pointer takes it).
    cuda, cpu : callable, optional
        Implementations for CUDA and CPU tensors: Python functions or extension functions
        (``opsmith.load_inline(...).fn``) that take the op's arguments and return its outputs.
    out : Out or sequence of Out, optional
        How each output is allocated (and faked): default ``Out()``, like the first tensor input.
    launch : callable or Elementwise, optional
        ``launch(*args, *outputs)`` returns the launch config: a :class:`~opsmith.LaunchConfig`,
        ``(grid, block)`` or ``(grid, block, shared_mem)``, or None to launch nothing. Or an
        :class:`~opsmith.Elementwise` rule (items per thread), which the C-shim path runs too.
        Default: elementwise, ``kernel.config_for(n)`` over ``n = outputs[0].numel()``.
    args : sequence of str, optional
        What the kernel receives, in order: names of the op's arguments, of its outputs
        (``"out"``, ``"out0"``, ... or the kernel's output names) and ``"n"`` (the item
        count). Default: a kernel parameter takes the op argument or output of its own name,
        else tensors take the tensor inputs then the outputs in order, numbers the scalar
        arguments in order, and a remaining integer the item count.
    tags : sequence of torch.Tag
        Passed to ``Library.define``.

    Returns
    -------
    CustomOp
        Callable like the op; ``.default`` is the ``OpOverload`` (the cheapest call),
        ``.register_fake``, ``.register_autograd``, ``.register_kernel``, ``.register_cpu``.

    Registering the same op again with the same definition (a re-run script or notebook
    cell) returns the op already registered; a different definition under a taken name
    raises :class:`~opsmith.OpsmithError`. In a package built with ``opsmith package
    --versioned-namespace``, ``relupkg::relu`` registers as ``relupkg_1_0_0::relu``.

    Examples
    --------
    >>> relu = opsmith.custom_op("mylib::relu", kernel=mod.get_kernel("relu"),
    ...                          cpu=torch.relu)                           # doctest: +SKIP
    >>> relu_bwd = opsmith.custom_op("mylib::relu_bwd", kernel=mod.get_kernel("relu_bwd"),
    ...                              cpu=lambda g, x: g * (x > 0))         # doctest: +SKIP
    >>> relu.register_autograd(relu_bwd, save=("x",))                     # doctest: +SKIP
    >>> y = torch.ops.mylib.relu(x)                                       # doctest: +SKIP
    """
    ns, opname = _split_name(name)
    ns = _prebuilt.namespace(ns, sys._getframe(1).f_globals.get("__file__"))  # --versioned-namespace
    qualname = f"{ns}::{opname}"
    kernels = _kernel_list(kernel, qualname)
    if kernels and cuda is not None:
        raise SpecError(f"{qualname}: give kernel= or cuda=, not both (both would implement CUDA)")
    kernel_outputs: list[str] = []
    if schema is None:
        if kernels:
            text, kernel_outputs = _opschema.schema_from_kernel(kernels[0].signature)
        else:
            text = next((s for s in (_opschema.schema_from_function(f) for f in (cpu, cuda) if f is not None)
                         if s is not None), None)
            if text is None:
                raise SpecError(f"{qualname}: no schema given and none can be derived (no kernel, and the "
                                f"functions carry no type annotations or pybind11 signature); pass "
                                f"schema='(Tensor x) -> Tensor'")
    elif callable(schema):
        text = _opschema.schema_from_function(schema)
        if text is None:
            raise SpecError(f"{qualname}: schema={schema!r} has no type annotations to derive a schema "
                            f"from; annotate it (def f(x: torch.Tensor) -> torch.Tensor) or pass text")
    else:
        text = schema
    parsed = _opschema.parse_schema(qualname, text)
    outs = _out_list(out, parsed, qualname)
    fp = fingerprint((parsed.text, kernels, cuda, cpu, outs, launch, args, [str(t) for t in tags]))
    with _lock:
        existing = _OPS.get(qualname)
        if existing is not None:
            if existing._fingerprint == fp:
                register_description(describe_op(existing))  # the same definition: the same description
                return existing
            what = "its schema" if existing.schema.text != parsed.text else "its implementation"
            raise OpsmithError(
                f"torch op {qualname} is already registered in this process with a different definition "
                f"({what} differs: registered {existing.schema.text}, now {parsed.text}). torch cannot "
                f"replace an op's definition in a running process: give the new op another name (e.g. "
                f"'{ns}::{opname}_v2') or restart Python (in a notebook: restart the kernel). Two versions of "
                f"one opsmith package in a process: build both with `opsmith package --versioned-namespace`")
        op = CustomOp(qualname, parsed, outs, fp, tags)
        if kernels:
            op._set_kernels(kernels, kernel_outputs, launch, args)
        elif launch is not None or args is not None:
            raise SpecError(f"{qualname}: launch= and args= describe a kernel launch; they need kernel=")
        if cuda is not None:
            op.register_kernel("cuda", cuda)
        if cpu is not None:
            op.register_kernel("cpu", cpu)
        _OPS[qualname] = op
        register_description(describe_op(op))  # what the other targets (opsmith.onnx) read
        return op


class CustomOp:
    """An op defined by :func:`custom_op`: call it like the op, register more on it.

    Attributes
    ----------
    name : str
        ``"namespace::name"``.
    schema : OpSchema
        The parsed schema (``schema.text`` is ``"(Tensor x) -> Tensor"``).
    default : torch._ops.OpOverload
        ``torch.ops.namespace.name.default``: calling it skips this object's ``__call__``.
    outs : list of Out
        The output specs the implementation allocates and the fake kernel fakes.
    """

    def __init__(self, qualname: str, schema, outs: list[Out], fp, tags) -> None:
        import torch
        self.name = qualname
        self.schema = schema
        self.outs = outs
        self._fingerprint = fp
        self._slots: dict[str, Any] = {}
        ns, opname = qualname.split("::")
        self._lib = torch.library.Library(ns, "FRAGMENT")
        try:
            self._lib.define(f"{opname}{schema.text}", tags=tuple(tags))
        except RuntimeError as exc:
            self._lib._destroy()
            if "already" in str(exc) or "multiple times" in str(exc):
                raise OpsmithError(
                    f"torch op {qualname} is already defined outside opsmith (a TORCH_LIBRARY block, "
                    f"torch.library.define or @custom_op): choose another name or namespace for this op") from None
            raise SpecError(f"torch refused the schema of {qualname} ({schema.text}): "
                            f"{str(exc).splitlines()[0]}") from None
        self.default = getattr(getattr(torch.ops, ns), opname).default
        # raw dispatch key sets of a plain call -> the device implementation (the autograd shortcut)
        self._fast: dict[int, Callable[..., Any]] = {}
        self.autograd: str | None = None  # "native" (C++ Autograd kernel), "python", or None
        self._fake = self._generate(alloc_only=True)
        torch.library.register_fake(qualname, _trampoline(self), lib=self._lib)

    def __call__(self, *args, **kwargs):
        return self.default(*args, **kwargs)

    def __repr__(self) -> str:
        return f"CustomOp({self.name}{self.schema.text})"

    # -- registration ------------------------------------------------------------------------
    def _claim(self, slot: str, value: Any) -> bool:
        """True when ``slot`` is free; False when it holds the same definition (a re-run)."""
        fp = fingerprint(value)
        held = self._slots.get(slot)
        if held is None:
            self._slots[slot] = fp
            return True
        if held == fp:
            return False
        raise OpsmithError(
            f"{self.name} already has a different {slot} registered; torch keeps one per op in a "
            f"process: register the new one on an op of another name (e.g. '{self.name}_v2'), or "
            f"restart Python (in a notebook: restart the kernel)")

    def register_kernel(self, device_type: str, fn: Callable[..., Any]) -> "CustomOp":
        """Use ``fn`` (a Python or extension function) for tensors on ``device_type``
        (``"cpu"`` or ``"cuda"``): it takes the op's arguments and returns its outputs."""
        import torch
        key = {"cpu": "CPU", "cuda": "CUDA"}.get(str(device_type).lower())
        if key is None:
            raise SpecError(f"{self.name}: register_kernel takes 'cpu' or 'cuda', got {device_type!r}")
        if not callable(fn):
            raise SpecError(f"{self.name}: the {device_type} implementation must be callable, got {fn!r}")
        if self._claim(key, fn):
            self._lib.impl(self.name.split("::")[1], fn, key)
            ks = torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, key)).add(
                getattr(torch._C.DispatchKey, "Autograd" + key))
            if hasattr(ks, "raw_repr"):  # torch < 2.5: no key to look it up by, no fast path
                self._fast[ks.raw_repr()] = fn
        return self

    def register_cpu(self, fn: Callable[..., Any]) -> "CustomOp":
        """``register_kernel("cpu", fn)``."""
        return self.register_kernel("cpu", fn)

    def register_fake(self, fn: Callable[..., Any]) -> "CustomOp":
        """Use ``fn`` as the fake kernel instead of the one generated from the output specs."""
        if self._claim("fake kernel", fn):
            self._fake = fn
        return self

    def register_autograd(self, backward: Callable[..., Any], setup_context: Callable[..., Any] | None = None,
                          *, save: Sequence[str] | None = None, args: Sequence[str] | None = None,
                          grads_for: Sequence[str] | None = None) -> "CustomOp":
        """Make the op differentiable.

        torch's form: ``setup_context(ctx, inputs, output)`` saves what the backward needs and
        ``backward(ctx, *grads)`` returns one gradient per input (None where none).

        opsmith's short form, for a backward that is itself an op (then the Autograd kernel is
        native C++, no Python per call) or a function: ``save=("x", ...)`` names inputs or
        outputs to keep, and ``backward(*grads, *saved)`` returns the gradient of the first
        input, or a tuple, one per input. ``args=`` instead lists every argument the backward
        takes, in order: ``"grad"``/``"grad0"``, ``"grad1"``... (output gradients), argument
        and output names (``"out0"``... or the schema's return names), and
        ``"needs_grad(<argument>)"`` (a bool). ``grads_for=`` names the arguments the
        backward's results are gradients of (default: the op's arguments in order).

        Examples
        --------
        >>> relu.register_autograd(relu_backward, save=("x",))          # doctest: +SKIP
        >>> rms.register_autograd(rms_backward, args=("grad0", "x", "rstd", "needs_grad(weight)", "weight"),
        ...                       grads_for=("x", "weight"))           # doctest: +SKIP
        """
        if setup_context is not None and (save is not None or args is not None or grads_for is not None):
            raise SpecError(f"{self.name}: register_autograd takes setup_context= or the short form "
                            f"(save=/args=/grads_for=), not both")
        if save is not None and args is not None:
            raise SpecError(f"{self.name}: register_autograd takes save= or args=, not both (args= lists "
                            f"everything the backward receives, the output gradients included)")
        tup = (lambda v: tuple(v) if v is not None else None)
        if not self._claim("autograd formula", (backward, setup_context, tup(save), tup(args), tup(grads_for))):
            return self
        install_autograd(self, backward, setup_context, tup(save), tup(args), tup(grads_for))
        return self

    def not_differentiable(self, message: str) -> "CustomOp":
        """Register an Autograd kernel that refuses a gradient: a backward through the op raises
        ``NotImplementedError(message)`` (a backward op whose own derivative is not written)."""
        if self._claim("autograd formula", ("refuse", message)):
            install_refusal(self, message)
        return self

    # -- generated code ----------------------------------------------------------------------------
    def _params(self, ns: dict[str, Any]) -> str:
        """The generated functions' parameter list: the schema's names and defaults."""
        import torch
        fs = torch._C.parse_schema(f"f{self.schema.text}")
        parts, star = [], False
        for i, a in enumerate(fs.arguments):
            if a.kwarg_only and not star:
                parts.append("*")
                star = True
            if a.has_default_value():  # `Tensor? w` without `=None` is still a required argument
                ns[f"_D{i}"] = a.default_value
                parts.append(f"{a.name}=_D{i}")
            else:
                parts.append(a.name)
        return ", ".join(parts)

    def _generate(self, *, alloc_only: bool, body: Sequence[str] = (), ns: dict[str, Any] | None = None):
        import torch
        s = self.schema
        ns = {} if ns is None else ns
        ns.update(_empty_like=torch.empty_like, _zeros_like=torch.zeros_like, _empty=torch.empty,
                  _zeros=torch.zeros, _CONTIGUOUS=torch.contiguous_format)
        params = self._params(ns)
        lines = [f"def f({params}):"]
        if not alloc_only:
            lines += [f"    {a} = {a}.contiguous()" for a, t in zip(s.arg_names, s.arg_types) if t == "Tensor"]
        lines += alloc_lines(self.outs, s.arg_names, s.arg_types, lambda i: s.arg_names[i], ns, fake=alloc_only)
        lines += list(body)
        outs = ", ".join(f"_o{k}" for k in range(len(self.outs)))
        lines.append(f"    return {outs}" if s.single else f"    return ({outs},)")
        code = "\n".join(lines)
        exec(compile(code, f"<opsmith op {self.name}{' fake' if alloc_only else ''}>", "exec"), ns)
        fn = ns["f"]
        fn.__qualname__ = fn.__name__ = self.name.replace("::", "_") + ("_fake" if alloc_only else "_cuda")
        fn._opsmith_source = code
        return fn

    def _set_kernels(self, kernels, kernel_outputs: list[str], launch, args) -> None:
        s = self.schema
        out_names = {n: k for k, n in enumerate(s.return_names)}
        out_names.update({f"out{k}": k for k in range(s.returns)})
        out_names.update({n: k for k, n in enumerate(kernel_outputs)})
        binding = _opschema.bind_kernel(kernels[0].signature, s, out_names, args, self.name)
        for k in kernels[1:]:
            other = _opschema.bind_kernel(k.signature, s, out_names, args, self.name)
            if other != binding:
                raise SpecError(f"{self.name}: kernels {kernels[0].name} and {k.name} take different "
                                f"arguments ({binding} vs {other}); one op's kernels must take the same ones")
        ns: dict[str, Any] = {"_new_config": _new_config, "_config_of": _config_of, "_RULE": launch,
                              "_no_kernel": self._no_kernel}
        elementwise = launch is None or isinstance(launch, Elementwise)
        rule = launch or Elementwise()
        entries = [(k.launch, {}, k, rule.items_for(k) if elementwise else 1) for k in kernels]
        call = ", ".join(binding)
        first_tensor = next(a for a, t in zip(s.arg_names, s.arg_types) if t == "Tensor")
        body = ["    _n = _o0.numel()"]
        if len(entries) == 1:
            ns["_K"] = entries[0]
            body.append("    _launch, _cfgs, _kern, _ipt = _K")
        else:
            by_dtype: dict[Any, tuple] = {}
            for e in entries:
                by_dtype.setdefault(_first_dtype(e[2]), e)
            ns["_KS"] = by_dtype
            self._dtypes = list(by_dtype)
            body.append(f"    _e = _KS.get({first_tensor}.dtype)")
            body.append(f"    if _e is None: _no_kernel({first_tensor})")
            body.append("    _launch, _cfgs, _kern, _ipt = _e")
        if elementwise:
            body += ["    if _n:",
                     f"        _dev = {first_tensor}.get_device()",
                     "        _c = _cfgs.get(_n * 256 + _dev)",
                     "        if _c is None: _c = _new_config(_kern, _cfgs, _n, _dev, _ipt)",
                     f"        _launch(_c, {call})"]
        else:
            rule_args = ", ".join([*s.arg_names, *(f"_o{k}" for k in range(s.returns))])
            body += [f"    _c = _config_of(_kern, _cfgs, _RULE({rule_args}))",
                     "    if _c is not None:",
                     f"        _launch(_c, {call})"]
        self._kernels = kernels
        self._binding, self._launch_rule = binding, launch  # described by _op_args.describe_op
        fn = self._generate(alloc_only=False, body=body, ns=ns)
        self._python_cuda = fn
        self.cshim = self._register_cshim(kernels, binding, launch)
        if not self.cshim:
            self.register_kernel("cuda", fn)

    def _register_cshim(self, kernels, binding: list[str], launch) -> bool:
        """Register the CUDA implementation as the C-shim boxed kernel when torch and the op allow."""
        import logging

        from opsmith._config import settings
        from opsmith._torch import _cshim
        if not settings.torch_op_cshim:
            return False
        why = _cshim.why_not(self, kernels, binding, launch)
        if why is not None:
            logging.getLogger(__name__).debug("%s: Python CUDA implementation (%s)", self.name, why)
            return False
        if not self._claim("CUDA", ("cshim", kernels, binding)):
            return True
        _cshim.register(self, kernels, binding)
        return True

    def _no_kernel(self, t) -> None:
        from opsmith._errors import LaunchError
        raise LaunchError(f"{self.name}: no kernel for {t.dtype} inputs; this op has kernels for "
                          f"{', '.join(str(d) for d in self._dtypes)}")


def _trampoline(op: CustomOp):
    def fake(*args, **kwargs):
        return op._fake(*args, **kwargs)
    return fake
