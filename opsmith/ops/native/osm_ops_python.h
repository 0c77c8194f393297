/* The eager calls of opsmith.ops without Python's generic operator call.

   `OpOverload._op(...)` (what an eager opsmith.ops call ran) converts each argument through the
   schema into a boxed stack and back: about a microsecond that torch's own functions, with
   their generated bindings, do not pay. This module's functions take the arguments of the
   public functions as they are (tensors, a str, an int, a list of ints, a float or None), make
   the typed dispatcher call of the same operator (so autograd, dispatch modes, the CUDA and
   CPU kernels, vmap all run as before) and wrap the result.

   Anything else goes to the function's fallback, the OpOverload builtin, unchanged: a tensor
   subclass or a __torch_function__ mode (they must see the call), an argument of another type,
   and any error (so an error is raised by torch's own conversion, with torch's exception type
   and message, exactly as without this module). The operators are functional, so running a
   failed call again through the fallback has no side effect to repeat.

   Built into the library of osm_ops.cpp (the library links libtorch_python like any torch
   extension); Python gets the module through osm_ops_python (ctypes.PyDLL). */
#pragma once

#include <ATen/PythonTorchFunctionTLS.h>
#include <torch/csrc/autograd/python_variable.h>

#include <Python.h>

#include <optional>
#include <tuple>

namespace fast {

enum Fn { RELU, SILU, GELU, SOFTMAX, LAYER_NORM_Y, RMS_NORM_Y, N_FN };
const char *const names[N_FN] = {"relu", "silu", "gelu", "softmax", "layer_norm_y", "rms_norm_y"};
PyObject *fallback[N_FN];  // the OpOverload builtins (strong references, for the process's life)

struct Refuse {};  // an argument the fast path does not take: the fallback gets the call

template <class Sig>
c10::TypedOperatorHandle<Sig> handle(const char *name) {
    return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

// A plain tensor: torch.Tensor or Parameter (no __torch_function__ of its own), no torch-function mode
const at::Tensor &tensor(PyObject *o) {
    if (!THPVariable_CheckExact(o)) throw Refuse{};
    return THPVariable_Unpack(o);
}

std::optional<at::Tensor> optional_tensor(PyObject *o) {
    if (o == Py_None) return std::nullopt;
    return tensor(o);
}

int64_t integer(PyObject *o) {
    if (!PyLong_CheckExact(o)) throw Refuse{};
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) throw Refuse{};
    return v;
}

double real(PyObject *o) {
    if (PyFloat_CheckExact(o)) return PyFloat_AS_DOUBLE(o);
    return static_cast<double>(integer(o));
}

c10::SmallVector<int64_t, 4> integers(PyObject *o) {
    if (!PyList_CheckExact(o)) throw Refuse{};
    c10::SmallVector<int64_t, 4> v;
    for (Py_ssize_t i = 0, n = PyList_GET_SIZE(o); i < n; i++) v.push_back(integer(PyList_GET_ITEM(o, i)));
    return v;
}

c10::string_view text(PyObject *o) {
    if (!PyUnicode_CheckExact(o)) throw Refuse{};
    Py_ssize_t n = 0;
    const char *s = PyUnicode_AsUTF8AndSize(o, &n);
    if (!s) throw Refuse{};
    return {s, static_cast<size_t>(n)};
}

at::Tensor run(Fn f, PyObject *const *a, Py_ssize_t n) {
    using T = const at::Tensor &;
    using OT = const std::optional<at::Tensor> &;
    switch (f) {
        case RELU:
        case SILU: {
            if (n != 1) throw Refuse{};
            static const auto relu = handle<at::Tensor(T)>("opsmith::relu");
            static const auto silu = handle<at::Tensor(T)>("opsmith::silu");
            return (f == RELU ? relu : silu).call(tensor(a[0]));
        }
        case GELU: {
            if (n != 2) throw Refuse{};
            static const auto op = handle<at::Tensor(T, c10::string_view)>("opsmith::gelu");
            return op.call(tensor(a[0]), text(a[1]));
        }
        case SOFTMAX: {
            if (n != 2) throw Refuse{};
            static const auto op = handle<at::Tensor(T, int64_t)>("opsmith::softmax");
            return op.call(tensor(a[0]), integer(a[1]));
        }
        case LAYER_NORM_Y: {
            if (n != 5) throw Refuse{};
            static const auto op = handle<at::Tensor(T, at::IntArrayRef, OT, OT, double)>("opsmith::layer_norm_y");
            const auto shape = integers(a[1]);
            return op.call(tensor(a[0]), shape, optional_tensor(a[2]), optional_tensor(a[3]), real(a[4]));
        }
        case RMS_NORM_Y: {
            if (n != 4) throw Refuse{};
            static const auto op =
                handle<at::Tensor(T, at::IntArrayRef, OT, std::optional<double>)>("opsmith::rms_norm_y");
            const auto shape = integers(a[1]);
            std::optional<double> eps;
            if (a[3] != Py_None) eps = real(a[3]);
            return op.call(tensor(a[0]), shape, optional_tensor(a[2]), eps);
        }
        default:
            throw Refuse{};
    }
}

template <Fn F>
PyObject *call(PyObject *, PyObject *const *a, Py_ssize_t n) {
    if (at::impl::PythonTorchFunctionTLS::stack_len() == 0) {  // a torch-function mode must see the call
        try {
            return THPVariable_Wrap(run(F, a, n));
        } catch (...) {  // Refuse, or an error: the fallback raises it as torch does (see above)
            PyErr_Clear();
        }
    }
    return PyObject_Vectorcall(fallback[F], a, static_cast<size_t>(n), nullptr);
}

PyMethodDef methods[] = {
    {names[RELU], reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(call<RELU>)), METH_FASTCALL, nullptr},
    {names[SILU], reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(call<SILU>)), METH_FASTCALL, nullptr},
    {names[GELU], reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(call<GELU>)), METH_FASTCALL, nullptr},
    {names[SOFTMAX], reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(call<SOFTMAX>)), METH_FASTCALL,
     nullptr},
    {names[LAYER_NORM_Y], reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(call<LAYER_NORM_Y>)),
     METH_FASTCALL, nullptr},
    {names[RMS_NORM_Y], reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(call<RMS_NORM_Y>)),
     METH_FASTCALL, nullptr},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "opsmith_ops_fast", nullptr, -1, methods,
                      nullptr, nullptr, nullptr, nullptr};

}  // namespace fast

extern "C" {
/* The module of fast eager calls; `fallbacks` maps each function's name to the callable that
   serves what it refuses (the OpOverload builtin). Called once, with the GIL (ctypes.PyDLL). */
__attribute__((visibility("default"))) PyObject *osm_ops_python(PyObject *fallbacks) {
    if (!PyDict_Check(fallbacks)) {
        PyErr_SetString(PyExc_TypeError, "osm_ops_python takes a dict of fallbacks");
        return nullptr;
    }
    for (int f = 0; f < fast::N_FN; f++) {
        PyObject *fb = PyDict_GetItemString(fallbacks, fast::names[f]);  // borrowed
        if (!fb || !PyCallable_Check(fb)) {
            PyErr_Format(PyExc_KeyError, "osm_ops_python: no callable fallback for %s", fast::names[f]);
            return nullptr;
        }
        Py_XSETREF(fast::fallback[f], Py_NewRef(fb));
    }
    return PyModule_Create(&fast::module);
}
}
