"""An ONNX Runtime custom-op library from opsmith op descriptions: generate the C++ and build it.

Data flow::

    OrtOpSpec per op (plain data: domain, name, inputs, outputs "like input k",
    per dtype: the kernel's C parameters, how each is bound, the CPU function)
        -> export_c (the CUDA kernels: cubins embedded, driver opened at run time)
        -> <name>_ort.cpp (this module): RegisterCustomOps, one OrtCustomOp per
           (op, provider), the CUDA one launching on ORT's compute stream
        -> lib<name>.so (system C and C++ compilers), cached by content

No ORT header is needed and libonnxruntime is not linked: the slice of ORT's C ABI used
here is declared in the generated code (the ``OrtApi`` table is an array of function
pointers whose *order* is the ABI; :data:`ORT_API_INDEX` holds the index of each entry we
call, counted from ORT's published ``onnxruntime_c_api.h`` and checked at run time by
``tests/test_onnx_ort.py`` against each installed ORT). The API comes from the
``OrtApiBase*`` that ORT passes to ``RegisterCustomOps``.

The ops are stamped with :data:`ORT_API_VERSION` (10, ORT 1.10: the first with
``KernelContext_GetGPUComputeStream``), the oldest API that has everything used, so one
library loads on every ORT from 1.10 on (ORT reads an ``OrtCustomOp`` only up to the
fields its ``version`` promises).

This module imports no torch: the torch side (:mod:`opsmith._torch._onnx`) turns
``opsmith.custom_op`` ops into :class:`OrtOpSpec` values.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Iterable, Sequence

from opsmith._build._run import run_tool
from opsmith._errors import SpecError, ToolchainError
from opsmith._record import Record
from opsmith._version import __version__

__all__ = ["OrtOpSpec", "OrtVariant", "OrtLibrary", "build_ort_library", "generate_source",
           "ORT_API_VERSION", "ORT_API_INDEX", "ONNX_DTYPES", "load_manifest"]

log = logging.getLogger("opsmith.onnx")

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
}
#: torch dtype name -> ONNXTensorElementDataType value.
ONNX_DTYPES = {"float32": 1, "uint8": 2, "int8": 3, "uint16": 4, "int16": 5, "int32": 6, "int64": 7,
               "bool": 9, "float16": 10, "float64": 11, "uint32": 12, "uint64": 13, "bfloat16": 16}
MANIFEST_FORMAT = "opsmith.ort-library"
_CUDA_EP = "CUDAExecutionProvider"
_BLOCK = 256  # threads per block of an elementwise launch (the grid covers every item once)


class OrtVariant(Record):
    """One dtype of an op: ``dtype`` (``"float32"``), ``c_params`` (the kernel's C parameters,
    ``["const float *x", "float *y", "long long n"]``), ``binding`` (what each receives:
    ``"in0"``, ``"out0"``, ``"n"``), ``kernel`` (the name expression to export, ``"relu<float>"``,
    or None: no CUDA implementation) and ``module`` (index into the library's CUDA sources)."""

    __slots__ = ("dtype", "c_params", "binding", "kernel", "module")
    _defaults = {"kernel": None, "module": 0}


class OrtOpSpec(Record):
    """One op of the library: ``domain`` and ``name`` (the node's domain and op_type),
    ``inputs`` and ``outputs`` (counts), ``like`` (per output, the input whose shape and
    dtype it takes), ``variants`` (one :class:`OrtVariant` per dtype), ``cpu`` (the C++
    function the CPU provider calls with the same arguments as the kernel, or None) and
    ``items_per_thread`` (how many items one CUDA thread handles: the grid covers
    ``ceil(n / (256 * items_per_thread))`` blocks of 256, as ``Kernel.config_for`` does)."""

    __slots__ = ("domain", "name", "inputs", "outputs", "like", "variants", "cpu", "items_per_thread")
    _defaults = {"cpu": None, "items_per_thread": 1}


class OrtLibrary(Record):
    """A built library: ``path`` (``lib<name>.so``), ``manifest`` (its JSON path) and ``ops``:
    ``{"domain.name": {"providers": [...], "dtypes": [...]}}``."""

    __slots__ = ("path", "manifest", "ops")

    def providers_of(self, node: str) -> list[str]:
        """The providers that implement ``node`` (``"mylib.relu"``); [] when the library lacks it."""
        return list(self.ops.get(node, {}).get("providers", []))


def load_manifest(path: str | os.PathLike) -> OrtLibrary:
    """The :class:`OrtLibrary` of a built ``lib<name>.so`` (its manifest lies beside it)."""
    lib = Path(path)
    manifest = lib.with_name(lib.name[3:-3] + ".json") if lib.name.startswith("lib") else lib.with_suffix(".json")
    try:
        data = json.loads(manifest.read_text())
    except (OSError, ValueError) as exc:
        raise SpecError(f"{lib} has no readable opsmith manifest at {manifest} ({exc}); build it with "
                        f"opsmith.onnx.build_library") from None
    if data.get("format") != MANIFEST_FORMAT:
        raise SpecError(f"{manifest} is not an opsmith ORT library manifest")
    return OrtLibrary(path=lib, manifest=manifest, ops=data["ops"])


# -- the C++ ------------------------------------------------------------------------------------
_PRELUDE = r"""/* Generated by opsmith @VERSION@: an ONNX Runtime custom-op library; do not edit.
 *
 * No ONNX Runtime header is used and libonnxruntime is not linked: the few ORT types and the
 * positions of the OrtApi entries called here are declared below, after onnxruntime_c_api.h
 * (the OrtApi struct is a table of function pointers; its order is the ABI). ORT passes the
 * table's base to RegisterCustomOps. Ops are stamped with API version @APIV@, the oldest
 * that has every entry used, so one library loads on every ORT from that version on.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <stdexcept>
#include <string>
@EXPORT_INCLUDE@
/* ---- the CPU implementations (opsmith.onnx.build_library(cpu_source=...)) ---- */
@CPU_SOURCE@
/* ---- end of the CPU implementations ---- */

namespace osm_ort {

typedef struct osm_status osm_status;  /* OrtStatus */
typedef void osm_api;                  /* OrtApi: used only as a table of entries */

/* OrtApiBase */
struct osm_api_base {
  const osm_api *(*GetApi)(uint32_t version);
  const char *(*GetVersionString)(void);
};

/* OrtCustomOp, as far as version @APIV@ reaches (ORT reads no field a version does not promise) */
struct osm_custom_op {
  uint32_t version;
  void *(*CreateKernel)(const osm_custom_op *op, const osm_api *api, const void *info);
  const char *(*GetName)(const osm_custom_op *op);
  const char *(*GetExecutionProviderType)(const osm_custom_op *op);
  int (*GetInputType)(const osm_custom_op *op, size_t index);
  size_t (*GetInputTypeCount)(const osm_custom_op *op);
  int (*GetOutputType)(const osm_custom_op *op, size_t index);
  size_t (*GetOutputTypeCount)(const osm_custom_op *op);
  void (*KernelCompute)(void *kernel, void *context);
  void (*KernelDestroy)(void *kernel);
  int (*GetInputCharacteristic)(const osm_custom_op *op, size_t index);  /* since 8; 0: required */
  int (*GetOutputCharacteristic)(const osm_custom_op *op, size_t index);
};

/* OrtApi entry positions */
@INDEX_ENUM@

template <typename F>
static inline F entry(const osm_api *api, int index) {
  return reinterpret_cast<F>(reinterpret_cast<void *const *>(api)[index]);
}

static osm_status *make_status(const osm_api *api, int code, const char *msg) {
  return entry<osm_status *(*)(int, const char *)>(api, I_CreateStatus)(code, msg);
}

/* A failed ORT call inside a kernel becomes a C++ exception, which ORT's executor turns into
 * a failed Run with this text (the version-@APIV@ KernelCompute returns nothing). */
static void check(const osm_api *api, osm_status *st, const char *op, const char *what) {
  if (st == nullptr) return;
  std::string msg = std::string("opsmith op ") + op + ": " + what + " failed: " +
                    entry<const char *(*)(const osm_status *)>(api, I_GetErrorMessage)(st);
  entry<void (*)(osm_status *)>(api, I_ReleaseStatus)(st);
  throw std::runtime_error(msg);
}

struct op_info {
  osm_custom_op base;  /* first: ORT's pointer to the op is a pointer to this */
  const char *qualname;
  const char *name;
  const char *provider;  /* nullptr: the CPU provider */
  int n_in, n_out;
  int type;              /* the ONNX element type of every input and output; 0: any (dispatch) */
  const int *like;       /* per output: the input it takes shape and dtype from */
  void (*compute)(const op_info *op, const osm_api *api, void *ctx, int dtype, const void *const *in,
                  void *const *out, long long n);
};

struct kernel_state {
  const osm_api *api;
  const op_info *op;
};

static void *create_kernel(const osm_custom_op *op, const osm_api *api, const void *) {
  return new kernel_state{api, reinterpret_cast<const op_info *>(op)};
}
static const char *get_name(const osm_custom_op *op) { return reinterpret_cast<const op_info *>(op)->name; }
static const char *get_provider(const osm_custom_op *op) { return reinterpret_cast<const op_info *>(op)->provider; }
static int get_type(const osm_custom_op *op, size_t) { return reinterpret_cast<const op_info *>(op)->type; }
static size_t n_inputs(const osm_custom_op *op) { return (size_t)reinterpret_cast<const op_info *>(op)->n_in; }
static size_t n_outputs(const osm_custom_op *op) { return (size_t)reinterpret_cast<const op_info *>(op)->n_out; }
static int required(const osm_custom_op *, size_t) { return 0; }
static void destroy_kernel(void *k) { delete reinterpret_cast<kernel_state *>(k); }

enum { MAX_RANK = 16, MAX_IO = 16 };

static void compute(void *k, void *ctx) {
  const kernel_state *ks = reinterpret_cast<const kernel_state *>(k);
  const osm_api *api = ks->api;
  const op_info *op = ks->op;
  const void *in_values[MAX_IO];
  const void *in_data[MAX_IO];
  void *out_data[MAX_IO];
  int64_t dims[MAX_IO][MAX_RANK];
  size_t rank[MAX_IO];
  int dtype = 0;
  for (int i = 0; i < op->n_in; ++i) {
    check(api, entry<osm_status *(*)(const void *, size_t, const void **)>(api, I_KernelContext_GetInput)(
                   ctx, (size_t)i, &in_values[i]), op->qualname, "KernelContext_GetInput");
    void *info = nullptr;
    check(api, entry<osm_status *(*)(const void *, void **)>(api, I_GetTensorTypeAndShape)(in_values[i], &info),
          op->qualname, "GetTensorTypeAndShape");
    int et = 0;
    osm_status *st = entry<osm_status *(*)(const void *, int *)>(api, I_GetTensorElementType)(info, &et);
    if (st == nullptr) st = entry<osm_status *(*)(const void *, size_t *)>(api, I_GetDimensionsCount)(info, &rank[i]);
    if (st == nullptr && rank[i] > MAX_RANK) {
      entry<void (*)(void *)>(api, I_ReleaseTensorTypeAndShapeInfo)(info);
      throw std::runtime_error(std::string("opsmith op ") + op->qualname + ": inputs of rank above 16 are not supported");
    }
    if (st == nullptr) st = entry<osm_status *(*)(const void *, int64_t *, size_t)>(api, I_GetDimensions)(info, dims[i], rank[i]);
    entry<void (*)(void *)>(api, I_ReleaseTensorTypeAndShapeInfo)(info);
    check(api, st, op->qualname, "reading an input's type and shape");
    if (i == 0) dtype = et;
    void *p = nullptr;
    check(api, entry<osm_status *(*)(void *, void **)>(api, I_GetTensorMutableData)(const_cast<void *>(in_values[i]), &p),
          op->qualname, "GetTensorMutableData");
    in_data[i] = p;
  }
  long long n = 0;
  for (int o = 0; o < op->n_out; ++o) {
    int src = op->like[o];
    void *value = nullptr;
    check(api, entry<osm_status *(*)(void *, size_t, const int64_t *, size_t, void **)>(api, I_KernelContext_GetOutput)(
                   ctx, (size_t)o, dims[src], rank[src], &value), op->qualname, "KernelContext_GetOutput");
    check(api, entry<osm_status *(*)(void *, void **)>(api, I_GetTensorMutableData)(value, &out_data[o]),
          op->qualname, "GetTensorMutableData");
    if (o == 0) {
      n = 1;
      for (size_t d = 0; d < rank[src]; ++d) n *= (long long)dims[src][d];
    }
  }
  op->compute(op, api, ctx, dtype, in_data, out_data, n);
}

[[noreturn]] static void no_dtype(const op_info *op, int dtype, const char *have) {
  throw std::runtime_error(std::string("opsmith op ") + op->qualname + " (" + (op->provider ? op->provider : "CPUExecutionProvider") +
                           "): no implementation for ONNX element type " + std::to_string(dtype) + "; it has " + have);
}

#if @HAVE_CUDA@
static void *gpu_stream(const osm_api *api, void *ctx, const char *op) {
  void *stream = nullptr;
  check(api, entry<osm_status *(*)(const void *, void **)>(api, I_KernelContext_GetGPUComputeStream)(ctx, &stream),
        op, "KernelContext_GetGPUComputeStream");
  return stream;
}
static void launched(opsmith_CUresult r, const char *op) {
  if (r != 0) throw std::runtime_error(std::string("opsmith op ") + op + " (CUDAExecutionProvider): " + @LAST_ERROR@());
}
static opsmith_dim3 grid_for(long long n, long long items_per_thread) {
  long long per_block = @BLOCK@ * items_per_thread;
  return opsmith_dim3_make((unsigned)((n + per_block - 1) / per_block), 1, 1);
}
#endif

@OP_CODE@

static op_info *const ops[] = {@OP_LIST@};
static const char *const domains[] = {@DOMAIN_LIST@};
static const int op_domain[] = {@OP_DOMAIN@};

}  // namespace osm_ort

extern "C" __attribute__((visibility("default"))) osm_ort::osm_status *RegisterCustomOps(
    void *options, const osm_ort::osm_api_base *base) {
  using namespace osm_ort;
  const osm_api *api = base->GetApi(@APIV@);
  if (api == nullptr) {  /* an ORT older than the stamp: report it through the version-1 table */
    const osm_api *v1 = base->GetApi(1);
    std::string msg = std::string("this opsmith op library needs ONNX Runtime with C API version @APIV@ (ORT 1.@APIV@) "
                                  "or newer; the loaded ORT is ") + base->GetVersionString() + ": upgrade onnxruntime";
    return v1 ? make_status(v1, 1, msg.c_str()) : nullptr;
  }
  /* Kernels only for the providers this ORT build has: ORT 1.15's CPU-only build crashes on a
   * custom op registered for the CUDA provider beside a CPU op of the same name. */
  bool have_cuda = false;
  {
    char **names = nullptr;
    int count = 0;
    osm_status *st = entry<osm_status *(*)(char ***, int *)>(api, I_GetAvailableProviders)(&names, &count);
    if (st) return st;
    for (int i = 0; i < count; ++i) have_cuda = have_cuda || strcmp(names[i], "CUDAExecutionProvider") == 0;
    st = entry<osm_status *(*)(char **, int)>(api, I_ReleaseAvailableProviders)(names, count);
    if (st) return st;
  }
  for (size_t d = 0; d < sizeof(domains) / sizeof(domains[0]); ++d) {
    void *domain = nullptr;
    osm_status *st = entry<osm_status *(*)(const char *, void **)>(api, I_CreateCustomOpDomain)(domains[d], &domain);
    if (st) return st;
    for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); ++i) {
      if ((size_t)op_domain[i] != d || (ops[i]->provider != nullptr && !have_cuda)) continue;
      st = entry<osm_status *(*)(void *, const osm_custom_op *)>(api, I_CustomOpDomain_Add)(domain, &ops[i]->base);
      if (st) return st;
    }
    /* the domain lives as long as the process: sessions made from these options use it */
    st = entry<osm_status *(*)(void *, void *)>(api, I_AddCustomOpDomain)(options, domain);
    if (st) return st;
  }
  return nullptr;
}
"""


def _c_string(s: str) -> str:
    return json.dumps(s)


def _ident(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", s)


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


def _op_code(spec: OrtOpSpec, index: int, provider: str | None, launchers: dict[str, str]) -> str:
    tag = f"op{index}_{'cuda' if provider else 'cpu'}"
    qual = f"{spec.domain}.{spec.name}"
    cases = []
    have = []
    for v in spec.variants:
        types = [_param_type(p) for p in v.c_params]
        args = ", ".join(_arg(b, t) for b, t in zip(v.binding, types))
        if provider is None:
            call = f"{spec.cpu}({args});"
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
    return f"""
/* {qual} on the {provider or 'CPU'} provider */
static void {tag}_compute(const op_info *op, const osm_api *api, void *ctx, int dtype, const void *const *in,
                          void *const *out, long long n) {{
  (void)api; (void)ctx; (void)in; (void)out; (void)n;
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


def _validate(specs: Sequence[OrtOpSpec]) -> None:
    seen = set()
    for s in specs:
        qual = f"{s.domain}.{s.name}"
        if qual in seen:
            raise SpecError(f"op {qual} is listed twice; give each op once")
        seen.add(qual)
        if not re.fullmatch(r"[A-Za-z_][\w.]*", s.domain) or not re.fullmatch(r"[A-Za-z_]\w*", s.name):
            raise SpecError(f"op {qual}: domain and name must be identifiers")
        if not 1 <= s.inputs <= 16 or not 1 <= s.outputs <= 16:
            raise SpecError(f"op {qual}: an ORT op from opsmith takes 1 to 16 tensor inputs and outputs")
        if len(s.like) != s.outputs or any(not 0 <= k < s.inputs for k in s.like):
            raise SpecError(f"op {qual}: every output must be 'like' one of the {s.inputs} inputs")
        if not s.variants:
            raise SpecError(f"op {qual}: no dtype to implement")
        for v in s.variants:
            if v.dtype not in ONNX_DTYPES:
                raise SpecError(f"op {qual}: dtype {v.dtype} has no ONNX element type")
            if len(v.binding) != len(v.c_params):
                raise SpecError(f"op {qual}: {len(v.c_params)} kernel parameters but {len(v.binding)} bindings")
        if s.cpu is None and not any(v.kernel for v in s.variants):
            raise SpecError(f"op {qual} has neither a CUDA kernel nor a CPU function: give it one "
                            f"(cpu={{'{s.domain}::{s.name}': 'my_cpu_fn'}} with cpu_source=...)")


def generate_source(specs: Sequence[OrtOpSpec], *, cpu_source: str = "", export_header: str | None = None,
                    export_prefix: str | None = None, launchers: dict[str, str] | None = None) -> str:
    """The C++ of the library (see the module doc). ``launchers`` maps each kernel name
    expression to its exported launch function; ``export_header`` is the export's header file name."""
    _validate(specs)
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
    index_enum = "enum {\n" + "".join(f"  I_{k} = {v},\n" for k, v in ORT_API_INDEX.items()) + "};"
    subst = {
        "@VERSION@": __version__, "@APIV@": str(ORT_API_VERSION), "@INDEX_ENUM@": index_enum,
        "@EXPORT_INCLUDE@": f'#include "{export_header}"' if have_cuda else "",
        "@CPU_SOURCE@": cpu_source, "@HAVE_CUDA@": "1" if have_cuda else "0",
        "@LAST_ERROR@": f"opsmith_{export_prefix}_last_error" if have_cuda else "",
        "@BLOCK@": str(_BLOCK), "@OP_CODE@": "".join(codes), "@OP_LIST@": ", ".join(names),
        "@DOMAIN_LIST@": ", ".join(_c_string(d) for d in domains),
        "@OP_DOMAIN@": ", ".join(str(d) for d in op_domain),
    }
    text = _PRELUDE
    for k, v in subst.items():
        text = text.replace(k, v)
    return text


# -- the build ------------------------------------------------------------------------------------
def _compiler(names: Sequence[str], given: str | None, what: str) -> str:
    found = shutil.which(given) if given else next((shutil.which(c) for c in names if shutil.which(c)), None)
    if not found:
        raise ToolchainError(f"no {what} ({given or ', '.join(names)}) on PATH to build the ONNX Runtime op "
                             f"library: install one (apt-get install g++) or pass {'cxx' if 'C++' in what else 'cc'}=")
    return found


def _run(cmd: list[str], source) -> None:
    run_tool(cmd, source, "the ONNX Runtime op library")


def build_ort_library(specs: Sequence[OrtOpSpec], *, name: str = "opsmith_ops",
                      cuda_sources: Sequence[dict] = (), cpu_source: str = "",
                      archs: Iterable[str] | None = None, out_dir: str | os.PathLike | None = None,
                      cxx: str | None = None, cc: str | None = None) -> OrtLibrary:
    """Generate and build ``lib<name>.so`` (see the module doc); reused when built before.

    ``cuda_sources`` holds, per CUDA module, the keyword arguments of :func:`opsmith.export_c`
    (``sources`` and optionally ``include_paths``, ``defines``, ``headers``, ``options``,
    ``std``); each variant's ``kernel``/``module`` names the kernel to export from one of them.
    ``cpu_source`` is C++ defining the CPU functions the specs name. ``archs`` as for
    ``export_c``. Without ``out_dir`` the library goes under opsmith's cache directory, in a
    folder named by the hash of everything that decides it.
    """
    from opsmith._build._export_c import export_c
    if not re.fullmatch(r"[A-Za-z_]\w*", name):
        raise SpecError(f"library name {name!r} must be an identifier (it names lib<name>.so and C symbols)")
    _validate(specs)
    specs = list(specs)
    kernels_by_module: dict[int, list[str]] = {}
    for s in specs:
        for v in s.variants:
            if v.kernel:
                if not 0 <= v.module < len(cuda_sources):
                    raise SpecError(f"op {s.domain}.{s.name}: kernel {v.kernel} names CUDA module {v.module}, "
                                    f"but {len(cuda_sources)} were given")
                kernels_by_module.setdefault(v.module, [])
                if v.kernel not in kernels_by_module[v.module]:
                    kernels_by_module[v.module].append(v.kernel)
    cxx_path = _compiler(("c++", "g++", "clang++"), cxx, "C++ compiler")
    cc_path = _compiler(("cc", "gcc", "clang"), cc, "C compiler")
    archs = None if archs is None else list(archs)

    with tempfile.TemporaryDirectory(prefix="opsmith-ort-") as tmp:
        work = Path(tmp)
        launchers: dict[str, str] = {}
        c_files: list[Path] = []
        headers: list[str] = []
        prefixes: list[str] = []
        for m, kernels in sorted(kernels_by_module.items()):
            prefix = f"{name}_k{m}"
            res = export_c(**{"out_dir": work, "prefix": prefix, "archs": archs, **cuda_sources[m],
                              "kernels": [f"{_ident(k)}={k}" for k in kernels]})
            for k in kernels:
                launchers[k] = res.kernels[k]
            c_files.append(Path(res.source))
            headers.append(Path(res.header).name)
            prefixes.append(prefix)
        # one include line per export; the last error of the first export names a failure
        glue = generate_source(specs, cpu_source=cpu_source, export_header=headers[0] if headers else None,
                               export_prefix=prefixes[0] if prefixes else None, launchers=launchers)
        if len(headers) > 1:
            glue = glue.replace(f'#include "{headers[0]}"', "\n".join(f'#include "{h}"' for h in headers))
        digest = hashlib.sha256()
        for part in [__version__, glue, cxx_path, cc_path, *(p.read_text() for p in c_files)]:
            digest.update(part.encode() + b"\0")
        key = digest.hexdigest()[:20]
        if out_dir is None:
            from opsmith._config import settings
            dest = settings.cache_path / "ort" / f"{name}-{key}"
        else:
            dest = Path(out_dir)
        lib = dest / f"lib{name}.so"
        manifest_path = dest / f"{name}.json"
        ops_manifest = {}
        for s in specs:
            providers = (["CUDAExecutionProvider"] if any(v.kernel for v in s.variants) else []) + \
                        (["CPUExecutionProvider"] if s.cpu else [])
            ops_manifest[f"{s.domain}.{s.name}"] = {"providers": providers,
                                                    "dtypes": [v.dtype for v in s.variants],
                                                    "inputs": s.inputs, "outputs": s.outputs}
        if lib.exists() and manifest_path.exists():
            try:
                if json.loads(manifest_path.read_text()).get("key") == key:
                    return OrtLibrary(path=lib, manifest=manifest_path, ops=ops_manifest)
            except ValueError:
                pass
        glue_path = work / f"{name}_ort.cpp"
        glue_path.write_text(glue)
        objects = []
        for c in c_files:
            obj = c.with_suffix(".o")
            _run([cc_path, "-std=c99", "-O2", "-fPIC", "-fvisibility=hidden", "-c", str(c), "-o", str(obj)], c)
            objects.append(str(obj))
        glue_obj = work / f"{name}_ort.o"
        _run([cxx_path, "-std=c++17", "-O2", "-fPIC", "-fvisibility=hidden", "-Wall", "-I", str(work), "-c",
              str(glue_path), "-o", str(glue_obj)], glue_path)
        built = work / lib.name
        _run([cxx_path, "-shared", "-o", str(built), str(glue_obj), *objects, f"-Wl,-soname,{lib.name}",
              "-Wl,--as-needed", "-ldl", "-lpthread"], glue_path)
        manifest = {"format": MANIFEST_FORMAT, "version": 1, "opsmith": __version__, "key": key,
                    "ort_api_version": ORT_API_VERSION, "library": lib.name, "ops": ops_manifest}
        (work / manifest_path.name).write_text(json.dumps(manifest, indent=1) + "\n")
        dest.mkdir(parents=True, exist_ok=True)
        for f in [built, work / manifest_path.name, glue_path, *(work / h for h in headers), *c_files]:
            tmp_dest = dest / f".{f.name}.{os.getpid()}.tmp"
            shutil.copyfile(f, tmp_dest)
            os.replace(tmp_dest, dest / f.name)
    log.info("built %s (%d ops)", lib, len(specs))
    return OrtLibrary(path=lib, manifest=manifest_path, ops=ops_manifest)
