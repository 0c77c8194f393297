/* opsmith._runtime._claunch: the checked kernel launch, fast path only, in C.
 *
 * A Launcher is built per kernel from a compact description of its signature and holds
 * the pure-Python launcher as its fallback. A call checks exactly what the Python launcher
 * checks on its fast path (argument count, exact torch.Tensor, dtype identity, contiguity,
 * alignment, one device equal to torch's current one, exact int/float/bool in range, a
 * LaunchConfig already validated on that device), packs the values into a buffer on the C
 * stack and calls cuLaunchKernelEx. Anything else -- a failed check, a subclass, a keyword
 * other than stream=None, an unknown device, an exception from a torch call, a non-zero
 * CUresult (nothing was enqueued) -- calls the Python launcher with the original arguments
 * and returns its result: it raises the LaunchError naming the argument, or takes the slow
 * path (first validation, context push). No CUDA or torch headers; no link against libcuda:
 * the cuLaunchKernelEx pointer, the CUfunction per device and the torch callables come
 * from Python (and tests inject fakes).
 *
 * This file: the call (claunch_vectorcall) and the module. The types are in _claunch.h, the
 * parameters' descriptions and packing in _claunch_pack.c, the Launcher type in
 * _claunch_launcher.c; setup.py builds the four into one extension.
 */
#include "_claunch.h"

/* A no-op with cuLaunchKernelEx's signature: a fair fake driver for benchmarks. */
OPSMITH_EXPORT int opsmith_claunch_noop(const CULaunchConfig *c, void *f, void **p, void **e)
{
    (void)c; (void)f; (void)p; (void)e;
    return 0;
}

PyObject *claunch_str_dtype, *claunch_str_is_contiguous, *claunch_str_data_ptr, *claunch_str_get_device,
    *claunch_str_stream, *claunch_str_dims;

/* -- the call ----------------------------------------------------------------------------- */

static PyObject *
fall_back(Launcher *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    PyObject *exc = PyErr_Occurred();
    if (exc != NULL) {
        /* KeyboardInterrupt and friends are not a failed check: let them through */
        if (!PyErr_ExceptionMatches(PyExc_Exception))
            return NULL;
        PyErr_Clear();
    }
    self->fallbacks++;
    return PyObject_Vectorcall(self->fallback, args, PyVectorcall_NARGS(nargsf), kwnames);
}

/* A method call with no arguments; NULL on error. */
static inline PyObject *
call0(PyObject *obj, PyObject *name)
{
    return PyObject_VectorcallMethod(name, &obj, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

/* An exact int that fits a C long long; 0 on success. */
static inline int
exact_ll(PyObject *v, long long *out)
{
    int overflow;
    if (v == NULL || !PyLong_CheckExact(v))
        return -1;
    *out = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow || (*out == -1 && PyErr_Occurred()))
        return -1;
    return 0;
}

PyObject *
claunch_vectorcall(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Launcher *self = (Launcher *)op;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    uint64_t values[MAX_PARAMS + 1];
    void *pointers[MAX_PARAMS + 1];
    PyObject *config, *r;
    long long dev = 0, d;
    unsigned long long stream;
    const DeviceEntry *entry;
    const unsigned int *dims = NULL;
    CULaunchConfig cfg;
    launch_ex_fn launch;
    int i, k, have_dev = 0, result;

    if (nargs != self->nparams + 1)
        goto fallback;
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0) {  /* only stream=None */
        PyObject *kw = PyTuple_GET_ITEM(kwnames, 0);
        if (PyTuple_GET_SIZE(kwnames) != 1 || args[nargs] != Py_None)
            goto fallback;
        if (kw != claunch_str_stream && PyUnicode_Compare(kw, claunch_str_stream) != 0)
            goto fallback;
    }
    config = args[0];
    for (i = 0; i < self->nparams; i++) {
        const ParamSpec *p = &self->params[i];
        PyObject *a = args[i + 1];
        pointers[i] = &values[i];
        values[i] = 0;
        switch (p->kind) {
        case K_TENSOR: {
            unsigned long long ptr;
            if (Py_TYPE(a) != (PyTypeObject *)self->tensor_type)
                goto fallback;
            if (p->ndtypes) {
                PyObject *dt = PyObject_GetAttr(a, claunch_str_dtype);
                if (dt == NULL)
                    goto fallback;
                for (k = 0; k < p->ndtypes && p->dtypes[k] != dt; k++)
                    ;
                Py_DECREF(dt);
                if (k == p->ndtypes)
                    goto fallback;
            }
            r = call0(a, claunch_str_is_contiguous);
            if (r == NULL)
                goto fallback;
            Py_DECREF(r);  /* True and False are immortal singletons */
            if (r != Py_True)
                goto fallback;
            r = call0(a, claunch_str_data_ptr);
            if (r == NULL)
                goto fallback;
            if (!PyLong_CheckExact(r)) {
                Py_DECREF(r);
                goto fallback;
            }
            ptr = PyLong_AsUnsignedLongLong(r);
            Py_DECREF(r);
            if (ptr == (unsigned long long)-1 && PyErr_Occurred())
                goto fallback;
            if (ptr & p->align_mask)
                goto fallback;
            r = call0(a, claunch_str_get_device);
            k = exact_ll(r, &d);
            Py_XDECREF(r);
            if (k)
                goto fallback;
            if (!have_dev) {
                dev = d;
                have_dev = 1;
            } else if (d != dev) {
                goto fallback;
            }
            values[i] = (uint64_t)ptr;
            break;
        }
        case K_INT:
            if (claunch_pack_int(p, a, &values[i]))
                goto fallback;
            break;
        case K_FLOAT:
            if (claunch_pack_float(p, a, &values[i]))
                goto fallback;
            break;
        default: {  /* K_BOOL: ctypes' c_bool, one byte */
            uint8_t b;
            if (a == Py_True)
                b = 1;
            else if (a == Py_False)
                b = 0;
            else
                goto fallback;
            memcpy(&values[i], &b, 1);
            break;
        }
        }
    }
    /* the tensors' device must be torch's current one (else the slow path pushes a context) */
    r = PyObject_CallNoArgs(self->getdev);
    k = exact_ll(r, &d);
    Py_XDECREF(r);
    if (k)
        goto fallback;
    if (!have_dev)
        dev = d;
    else if (d != dev)
        goto fallback;
    if (dev < -1 || dev >= MAX_DEVICE)
        goto fallback;
    r = PyLong_FromLongLong(dev);
    if (r == NULL)
        goto fallback;
    {
        PyObject *sargs[2] = {NULL, r};
        PyObject *s = PyObject_Vectorcall(self->rawstream, sargs + 1,
                                          1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        Py_DECREF(r);
        if (s == NULL)
            goto fallback;
        if (!PyLong_CheckExact(s)) {
            Py_DECREF(s);
            goto fallback;
        }
        stream = PyLong_AsUnsignedLongLong(s);
        Py_DECREF(s);
        if (stream == (unsigned long long)-1 && PyErr_Occurred())
            goto fallback;
    }
    /* No Python code runs from here to the launch: the tables cannot change under us. */
    entry = self->devices[dev + 1];
    launch = self->launch;
    if (entry == NULL || entry->fn == NULL || launch == NULL)
        goto fallback;
    for (k = 0; k < entry->nconfigs; k++) {
        if (entry->configs[k].config == config) {
            dims = entry->configs[k].dims;
            break;
        }
    }
    if (dims == NULL)
        goto fallback;
    cfg.gridDimX = dims[0]; cfg.gridDimY = dims[1]; cfg.gridDimZ = dims[2];
    cfg.blockDimX = dims[3]; cfg.blockDimY = dims[4]; cfg.blockDimZ = dims[5];
    cfg.sharedMemBytes = dims[6];
    cfg.hStream = (void *)(uintptr_t)stream;
    cfg.attrs = NULL;
    cfg.numAttrs = 0;
    {
        void *fn = entry->fn;
        /* as ctypes did: the launch can block when the driver's queue is full */
        Py_BEGIN_ALLOW_THREADS
        result = launch(&cfg, fn, pointers, NULL);
        Py_END_ALLOW_THREADS
    }
    if (result != 0)  /* nothing was enqueued: Python retries and explains (or pushes a context) */
        goto fallback;
    Py_RETURN_NONE;
fallback:
    return fall_back(self, args, nargsf, kwnames);
}

/* -- the module -------------------------------------------------------------------------- */

static PyObject *
noop_address(PyObject *mod, PyObject *unused)
{
    (void)mod; (void)unused;
    return PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)opsmith_claunch_noop);
}

static PyMethodDef module_methods[] = {
    {"noop_address", noop_address, METH_NOARGS,
     "The address of a C no-op with cuLaunchKernelEx's signature (returns 0): a fake driver "
     "for tests and benchmarks."},
    {NULL, NULL, 0, NULL}
};

static struct PyModuleDef claunch_module = {
    PyModuleDef_HEAD_INIT, "opsmith._runtime._claunch",
    "The C fast path of Kernel.launch (see docs/cuda_kernels.md).", -1, module_methods,
    NULL, NULL, NULL, NULL
};

PyMODINIT_FUNC
PyInit__claunch(void)
{
    PyObject *m;
    if (!(claunch_str_dtype = PyUnicode_InternFromString("dtype")) ||
        !(claunch_str_is_contiguous = PyUnicode_InternFromString("is_contiguous")) ||
        !(claunch_str_data_ptr = PyUnicode_InternFromString("data_ptr")) ||
        !(claunch_str_get_device = PyUnicode_InternFromString("get_device")) ||
        !(claunch_str_stream = PyUnicode_InternFromString("stream")) ||
        !(claunch_str_dims = PyUnicode_InternFromString("_dims")))
        return NULL;
    if (PyType_Ready(&claunch_LauncherType) < 0)
        return NULL;
    m = PyModule_Create(&claunch_module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&claunch_LauncherType);
    if (PyModule_AddObject(m, "Launcher", (PyObject *)&claunch_LauncherType) < 0) {
        Py_DECREF(&claunch_LauncherType);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "MAX_PARAMS", MAX_PARAMS) < 0 ||
        PyModule_AddIntConstant(m, "MAX_DEVICE", MAX_DEVICE) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
