"""OpDescription: what an op is, as plain data (JSON round trip, versions, the registry), and the
descriptions ``opsmith.custom_op`` registers (what ``opsmith.onnx`` reads instead of torch objects)."""
from __future__ import annotations

import json

import pytest

from opsmith import _opdesc
from opsmith._errors import SpecError
from opsmith._opdesc import KernelDescription, OpDescription, OutDescription

SIG = {"version": 1, "name": "relu_fwd<float>", "symbol": "_Z8relu_fwdIfEvPKT_PS0_x",
       "params": [{"name": "x", "ctype": "const float*", "kind": "tensor", "dtypes": ["float32"], "align": 4,
                   "range": None},
                  {"name": "n", "ctype": "long long", "kind": "int", "dtypes": [], "align": 1,
                   "range": [-2 ** 63, 2 ** 63 - 1]}]}


def _sample(**changes) -> OpDescription:
    d = OpDescription(
        name="desc::scale", schema="(Tensor x, *, Tensor w) -> (Tensor a, Tensor b)", arg_names=("x", "w"),
        arg_types=("Tensor", "Tensor"), kwarg_only=("w",), return_names=("a", "b"),
        outs=(OutDescription(like=0), OutDescription(like=1, shape_rule=True, dtype="int64", zeros=True)),
        kernels=(KernelDescription("relu_fwd<float>", SIG, {
            "source": "__global__ void k() {}", "include_paths": ["/inc"], "defines": [["N", "4"], ["F", None]],
            "headers": [["h.cuh", "#define X 1"]], "options": ["-lineinfo"], "std": "c++17"}),),
        binding=("arg0", "out0", "n"), launch_rule=True)
    return d._replace(**changes)


def test_round_trip_through_json_text():
    d = _sample()
    text = json.dumps(d.to_json())
    back = OpDescription.from_json(json.loads(text))
    assert back == d
    assert back.to_json() == d.to_json()
    assert back.namespace == "desc" and back.op_name == "scale" and back.returns == 2
    assert back.outs[1].describe() == "like argument 1, shape from a Python function, dtype int64, zeros"
    assert back.outs[0].like_only() and not back.outs[1].like_only()
    plain = _sample(kernels=(), binding=(), launch_rule=False)
    assert OpDescription.from_json(json.loads(json.dumps(plain.to_json()))) == plain


def test_from_json_refuses_another_version_format_or_a_missing_field():
    data = _sample().to_json()
    with pytest.raises(SpecError, match="version 2; this opsmith reads version 1"):
        OpDescription.from_json({**data, "version": 2})
    with pytest.raises(SpecError, match="not an opsmith op description"):
        OpDescription.from_json({**data, "format": "something.else"})
    with pytest.raises(SpecError, match="not an opsmith op description"):
        OpDescription.from_json([data])
    broken = dict(data)
    del broken["outs"]
    with pytest.raises(SpecError, match="incomplete or malformed.*outs"):
        OpDescription.from_json(broken)


@pytest.fixture
def own_registry(monkeypatch):
    """Descriptions registered here stay out of the process-wide registry other tests read."""
    monkeypatch.setattr(_opdesc, "_REGISTRY", dict(_opdesc._REGISTRY))


def test_registry_replaces_a_description_of_the_same_name(own_registry):
    first = _sample(name="desc::reg")
    _opdesc.register(first)
    assert _opdesc.get("desc::reg") is first
    second = _sample(name="desc::reg", launch_rule=False)
    _opdesc.register(second)
    assert _opdesc.get("desc::reg") is second
    assert [d for d in _opdesc.all_descriptions() if d.name == "desc::reg"] == [second]
    with pytest.raises(SpecError, match="no opsmith op 'desc::missing' is registered.*desc::reg"):
        _opdesc.get("desc::missing")
    with pytest.raises(SpecError, match="takes an OpDescription"):
        _opdesc.register(first.to_json())


def test_descriptions_are_hashable_values():
    assert hash(_sample()) == hash(_sample())
    assert len({_sample(), _sample()}) == 1


# -- what the torch target registers -------------------------------------------------------------
RELU_SRC = r"""
template <typename T> __global__ void relu_fwd(const T* x, T* y, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] > T(0) ? x[i] : T(0); }
"""


def test_custom_op_registers_its_description_and_again_on_re_registration():
    torch = pytest.importorskip("torch")
    import opsmith
    mod = opsmith.CudaModule(RELU_SRC, name_expressions=["relu_fwd<float>"], arch="sm_90", defines={"UNUSED": 1})
    kernel = mod.get_kernel("relu_fwd<float>")
    op = opsmith.custom_op("desc::relu", kernel=kernel, cpu=torch.relu)
    d = _opdesc.get("desc::relu")
    assert (d.name, d.schema, d.arg_names, d.arg_types, d.return_names) == (
        "desc::relu", "(Tensor x) -> Tensor", ("x",), ("Tensor",), ("out",))
    assert d.outs == (OutDescription(like=0),) and d.binding == ("arg0", "out0", "n") and not d.launch_rule
    (k,) = d.kernels
    assert k.name == "relu_fwd<float>" and k.signature == kernel.signature.to_json()
    assert k.request["source"] == RELU_SRC and k.request["defines"] == [["UNUSED", "1"]]
    assert k.request["std"] == "c++17"
    assert OpDescription.from_json(json.loads(json.dumps(d.to_json()))) == d
    # a re-run of the same definition (a notebook cell) registers the description again
    _opdesc.register(d._replace(launch_rule=True))
    assert opsmith.custom_op("desc::relu", kernel=kernel, cpu=torch.relu) is op
    assert _opdesc.get("desc::relu") == d


def test_custom_op_describes_output_specs_and_launch_rules():
    torch = pytest.importorskip("torch")
    import opsmith
    from opsmith import Out
    opsmith.custom_op("desc::outs", schema="(Tensor x, Tensor idx, *, int k) -> (Tensor, Tensor, Tensor)",
                      out=[Out(like="idx"), Out(shape=lambda x, idx, k: (k,), dtype="int64", zeros=True),
                           Out(dtype="idx")],
                      cpu=lambda x, idx, k: (idx, torch.zeros(k, dtype=torch.int64), x.to(idx.dtype)))
    d = _opdesc.get("desc::outs")
    assert d.kwarg_only == ("k",) and d.arg_types == ("Tensor", "Tensor", "int")
    assert d.outs == (OutDescription(like=1), OutDescription(like=0, shape_rule=True, dtype="int64", zeros=True),
                      OutDescription(like=0, dtype_like=1))
    assert d.kernels == () and d.binding == ()
    mod = opsmith.CudaModule(RELU_SRC, name_expressions=["relu_fwd<float>"], arch="sm_90")
    opsmith.custom_op("desc::ruled", kernel=mod.get_kernel("relu_fwd<float>"),
                      launch=lambda x, y: ((x.numel() + 255) // 256, 256))
    assert _opdesc.get("desc::ruled").launch_rule
