"""The C++ of an ONNX Runtime custom-op library: the templates under ``templates/``, filled from specs.

:func:`generate_source` fills ``templates/ort_library.cpp`` with one ``op_info`` per (op,
provider): the CUDA one launches the kernel on ORT's compute stream, the CPU one calls the
user's function with the kernel's arguments, plus an ``opsmith::cpu_context``
(``templates/cpu_context.h``) when the function takes one. The templates are package data,
read through :mod:`importlib.resources`. Their ``@NAME@`` placeholders: ``VERSION``, ``APIV``
(the API version the ops are stamped with), ``PFV`` (the API version that brought
``KernelContext_ParallelFor``), ``INDEX_ENUM`` (the ``OrtApi`` positions), ``LAUNCH_INCLUDE``
(the headers of the CUDA kernels' launch code), ``CPU_CONTEXT``, ``CPU_SOURCE`` (the user's CPU
functions), ``HAVE_CUDA``, ``LAST_ERROR``, ``BLOCK``, ``OP_CODE``, ``OP_LIST``, ``DOMAIN_LIST``,
``OP_DOMAIN``. One pass fills them (the launch core's ``fill``), so a placeholder-like text in
the user's source stays.

No ORT header is used: the slice of ORT's C ABI called is declared in the template (the
``OrtApi`` table is an array of function pointers whose *order* is the ABI); :data:`ORT_API_INDEX`
holds the index of each entry, counted from ORT's published ``onnxruntime_c_api.h`` and checked
at run time by ``tests/onnx/test_onnx_ort.py`` against each installed ORT. The ops are stamped with
:data:`ORT_API_VERSION` (10, ORT 1.10: the first with ``KernelContext_GetGPUComputeStream``),
so one library loads on every ORT from 1.10 on; ``KernelContext_ParallelFor`` (API 17) is looked
up only where the loaded ORT is 1.17 or newer.
"""
from __future__ import annotations

import json
import re
from importlib import resources
from typing import Mapping, Sequence

from opsmith._errors import SpecError
from opsmith._runtime._launch_gen import fill
from opsmith._version import __version__
from opsmith.onnx._specs import ONNX_DTYPES, OrtOpSpec, validate

__all__ = ["generate_source", "template_text", "fill", "ORT_API_VERSION", "ORT_API_INDEX",
           "PARALLEL_FOR_API_VERSION", "TEMPLATES"]

#: The ORT C API version the library asks for and stamps its ops with (ORT 1.10).
ORT_API_VERSION = 10
#: Index of each OrtApi entry the generated code calls (0-based position in ``struct OrtApi``).
#: Counted from onnxruntime_c_api.h; ORT's own static_asserts pin ReleaseCustomOpDomain at 101
#: (end of version 1) and GetSparseTensorIndices ends version 9 at 191.
ORT_API_INDEX = {
    "CreateStatus": 0,
    "GetErrorCode": 1,
    "GetErrorMessage": 2,
    "CreateCustomOpDomain": 26,
    "CustomOpDomain_Add": 27,
    "AddCustomOpDomain": 28,
    "GetTensorMutableData": 51,
    "GetTensorElementType": 60,
    "GetDimensionsCount": 61,
    "GetDimensions": 62,
    "GetTensorTypeAndShape": 65,
    "KernelContext_GetInputCount": 88,
    "KernelContext_GetOutputCount": 89,
    "KernelContext_GetInput": 90,
    "KernelContext_GetOutput": 91,
    "GetAvailableProviders": 125,
    "ReleaseAvailableProviders": 126,
    "ReleaseStatus": 93,
    "ReleaseTensorTypeAndShapeInfo": 99,
    "KernelContext_GetGPUComputeStream": 193,
    "KernelContext_ParallelFor": 274,  # API 17: called only where the loaded ORT is 1.17 or newer
}
#: The C API version that brought ``KernelContext_ParallelFor`` (ORT 1.17): from it on, CPU
#: functions run on ORT's intra-op thread pool (``opsmith::cpu_context::parallel_for``).
PARALLEL_FOR_API_VERSION = 17
#: The template files (package data of ``opsmith.onnx``).
TEMPLATES = ("ort_library.cpp", "cpu_context.h")
_CUDA_EP = "CUDAExecutionProvider"
_BLOCK = 256  # threads per block of an elementwise launch (the grid covers every item once)


def template_text(name: str) -> str:
    """The text of the template file ``name`` (one of :data:`TEMPLATES`), from the installed package."""
    if name not in TEMPLATES:
        raise SpecError(f"no ONNX Runtime template {name!r}; the templates are {', '.join(TEMPLATES)}")
    return resources.files("opsmith.onnx").joinpath("templates", name).read_text(encoding="utf-8")


def _c_string(s: str) -> str:
    return json.dumps(s)


def _arg(expr: str, ctype: str) -> str:
    """C expression passing binding ``expr`` (in0, out0, n) as a parameter of C type ``ctype``."""
    if expr == "n":
        return f"({ctype})n"
    m = re.fullmatch(r"(in|out)(\d+)", expr)
    if m is None:
        raise SpecError(f"binding {expr!r}: expected in<k>, out<k> or n")
    if m.group(1) == "in":
        return f"({ctype})const_cast<void *>(in[{m.group(2)}])"
    return f"({ctype})out[{m.group(2)}]"


def _param_type(c_param: str) -> str:
    """``"const float *x"`` -> ``"const float *"``; ``"long long n"`` -> ``"long long"``."""
    c_param = c_param.strip()
    if "*" in c_param:
        return c_param[:c_param.rindex("*") + 1]
    return c_param.rsplit(" ", 1)[0]


def _op_code(spec: OrtOpSpec, index: int, provider: str | None, launchers: Mapping[str, str]) -> str:
    tag = f"op{index}_{'cuda' if provider else 'cpu'}"
    qual = f"{spec.domain}.{spec.name}"
    cases = []
    have = []
    for v in spec.variants:
        types = [_param_type(p) for p in v.c_params]
        args = ", ".join(_arg(b, t) for b, t in zip(v.binding, types))
        if provider is None:
            # a generic lambda names the function (a template or overloads); call_cpu passes the
            # cpu_context when the function takes it (std::is_invocable), else the arguments alone
            fwd = "static_cast<decltype(a) &&>(a)..."
            sig = ", ".join(types)
            wrong = (f"opsmith op {qual} ({v.dtype}): the CPU function {spec.cpu} must take ({sig}) or ({sig}, "
                     f"const opsmith::cpu_context &cpu); see docs/onnx.md, 'CPU functions'")
            call = (f"auto fn = [](auto &&...a) -> decltype({spec.cpu}({fwd})) {{ return {spec.cpu}({fwd}); }};\n"
                    f"      static_assert(cpu_callable<decltype(fn){''.join(', ' + t for t in types)}>::value, "
                    f"{_c_string(wrong)});\n"
                    f"      call_cpu(fn, cpu{', ' if args else ''}{args});")
        else:
            fn = launchers[v.kernel]
            sep = ", " if args else ""
            call = (f"if (n > 0) launched({fn}((opsmith_CUstream)gpu_stream(api, ctx, op->qualname), "
                    f"grid_for(n, {int(spec.items_per_thread)}), "
                    f"opsmith_dim3_make({_BLOCK}, 1, 1), 0{sep}{args}), op->qualname);")
        cases.append(f"    case {ONNX_DTYPES[v.dtype]}: {{ {call} return; }}")
        have.append(v.dtype)
    single = ONNX_DTYPES[spec.variants[0].dtype] if len(spec.variants) == 1 else 0
    like = ", ".join(str(x) for x in spec.like)
    context = "" if provider else """
  cpu_call call = {api, op, ctx, parallel_for_entry.load(std::memory_order_relaxed)};
  const opsmith::cpu_context cpu(call.parallel_for ? run_chunks : nullptr, &call);"""
    return f"""
/* {qual} on the {provider or 'CPU'} provider */
static void {tag}_compute(const op_info *op, const osm_api *api, void *ctx, int dtype, const void *const *in,
                          void *const *out, long long n) {{
  (void)api; (void)ctx; (void)in; (void)out; (void)n;{context}
  switch (dtype) {{
{chr(10).join(cases)}
    default: no_dtype(op, dtype, {_c_string(', '.join(have))});
  }}
}}
static const int {tag}_like[] = {{{like}}};
static op_info {tag} = {{
  {{{ORT_API_VERSION}, create_kernel, get_name, get_provider, get_type, n_inputs, get_type, n_outputs, compute,
   destroy_kernel, required, required}},
  {_c_string(qual)}, {_c_string(spec.name)}, {_c_string(provider) if provider else 'nullptr'}, {spec.inputs},
  {spec.outputs}, {single}, {tag}_like, {tag}_compute}};
"""


def generate_source(specs: Sequence[OrtOpSpec], *, cpu_source: str = "", launch_headers: Sequence[str] = (),
                    last_error: str | None = None, launchers: Mapping[str, str] | None = None) -> str:
    """The C++ of the library (see the module doc). ``launchers`` maps each kernel name
    expression to its launch function, declared in ``launch_headers`` (file names the
    library's build finds); ``last_error`` names the function that says why a launch failed."""
    validate(specs)
    launchers = launchers or {}
    codes, names, domains, op_domain = [], [], [], []
    for i, s in enumerate(specs):
        if s.domain not in domains:
            domains.append(s.domain)
        if s.cpu is not None:
            codes.append(_op_code(s, i, None, launchers))
            names.append(f"&op{i}_cpu")
            op_domain.append(domains.index(s.domain))
        if any(v.kernel for v in s.variants):
            cuda_spec = s._replace(variants=tuple(v for v in s.variants if v.kernel))
            codes.append(_op_code(cuda_spec, i, _CUDA_EP, launchers))
            names.append(f"&op{i}_cuda")
            op_domain.append(domains.index(s.domain))
    have_cuda = any(v.kernel for s in specs for v in s.variants)
    if have_cuda and (not launch_headers or not last_error):
        raise SpecError("the library has CUDA kernels: generate_source needs launch_headers= and last_error=")
    index_enum = "enum {\n" + "".join(f"  I_{k} = {v},\n" for k, v in ORT_API_INDEX.items()) + "};"
    pfv = str(PARALLEL_FOR_API_VERSION)
    values = {
        "VERSION": __version__, "APIV": str(ORT_API_VERSION), "PFV": pfv, "INDEX_ENUM": index_enum,
        "CPU_CONTEXT": fill(template_text("cpu_context.h"), {"PFV": pfv}).rstrip("\n"),
        "LAUNCH_INCLUDE": "\n".join(f'#include "{h}"' for h in launch_headers) if have_cuda else "",
        "CPU_SOURCE": cpu_source, "HAVE_CUDA": "1" if have_cuda else "0",
        "LAST_ERROR": last_error if have_cuda else "",
        "BLOCK": str(_BLOCK), "OP_CODE": "".join(codes), "OP_LIST": ", ".join(names),
        "DOMAIN_LIST": ", ".join(_c_string(d) for d in domains),
        "OP_DOMAIN": ", ".join(str(d) for d in op_domain),
    }
    return fill(template_text("ort_library.cpp"), values)
