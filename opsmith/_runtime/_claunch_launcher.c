/* opsmith._runtime._claunch: the Launcher type (see _claunch.h).
 *
 * A Launcher is built per kernel (and per launching thread) from its parameters'
 * descriptions and holds the Python launcher as its fallback. Python then tells it the
 * cuLaunchKernelEx address (set_launch), the kernel's CUfunction per device (set_function)
 * and each LaunchConfig once it was validated on a device (set_config; forget_configs when
 * the Python side forgets its own). A call is claunch_vectorcall (_claunch.c).
 */
#include "_claunch.h"
#include <structmember.h>

/* -- construction and lifetime ----------------------------------------------------------- */

static int launcher_clear(PyObject *op);

static PyObject *
launcher_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"name", "params", "fallback", "tensor_type", "getdev", "rawstream",
                             "capacity", NULL};
    PyObject *name, *params, *fallback, *tensor_type, *getdev, *rawstream, *seq;
    int capacity = 64;
    Py_ssize_t n, i;
    Launcher *self;

    if (!PyArg_ParseTupleAndKeywords(args, kwds, "UOOOOO|i:Launcher", kwlist, &name, &params,
                                     &fallback, &tensor_type, &getdev, &rawstream, &capacity))
        return NULL;
    if (!PyCallable_Check(fallback) || !PyCallable_Check(getdev) || !PyCallable_Check(rawstream)) {
        PyErr_SetString(PyExc_TypeError, "fallback, getdev and rawstream must be callables");
        return NULL;
    }
    if (!PyType_Check(tensor_type)) {
        PyErr_SetString(PyExc_TypeError, "tensor_type must be a type (torch.Tensor)");
        return NULL;
    }
    if (capacity < 1 || capacity > 4096) {
        PyErr_SetString(PyExc_ValueError, "capacity must be in [1, 4096]");
        return NULL;
    }
    seq = PySequence_Tuple(params);
    if (seq == NULL)
        return NULL;
    n = PyTuple_GET_SIZE(seq);
    if (n > MAX_PARAMS) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "%zd parameters; the C launcher takes at most %d", n, MAX_PARAMS);
        return NULL;
    }
    self = (Launcher *)type->tp_alloc(type, 0);
    if (self == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    self->vectorcall = claunch_vectorcall;
    self->name = Py_NewRef(name);
    self->fallback = Py_NewRef(fallback);
    self->tensor_type = Py_NewRef(tensor_type);
    self->getdev = Py_NewRef(getdev);
    self->rawstream = Py_NewRef(rawstream);
    self->capacity = capacity;
    self->nparams = (int)n;
    self->params = PyMem_Calloc(n ? (size_t)n : 1, sizeof(ParamSpec));
    if (self->params == NULL) {
        Py_DECREF(seq);
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    for (i = 0; i < n; i++) {
        if (claunch_parse_param(PyTuple_GET_ITEM(seq, i), &self->params[i], i)) {
            Py_DECREF(seq);
            Py_DECREF(self);
            return NULL;
        }
        if (self->params[i].kind == K_TENSOR)
            self->has_tensor = 1;
    }
    Py_DECREF(seq);
    return (PyObject *)self;
}

static int
launcher_traverse(PyObject *op, visitproc visit, void *arg)
{
    Launcher *self = (Launcher *)op;
    int i, k;
    Py_VISIT(Py_TYPE(op));
    Py_VISIT(self->name);
    Py_VISIT(self->fallback);
    Py_VISIT(self->tensor_type);
    Py_VISIT(self->getdev);
    Py_VISIT(self->rawstream);
    if (self->params != NULL)
        for (i = 0; i < self->nparams; i++)
            for (k = 0; k < self->params[i].ndtypes; k++)
                Py_VISIT(self->params[i].dtypes[k]);
    for (i = 0; i <= MAX_DEVICE; i++)
        if (self->devices[i] != NULL)
            for (k = 0; k < self->devices[i]->nconfigs; k++)
                Py_VISIT(self->devices[i]->configs[k].config);
    return 0;
}

static void
clear_configs(DeviceEntry *e)
{
    /* forget first, then release: a release runs no code that could see a half-cleared table */
    int k, n = e->nconfigs;
    PyObject *old[64];
    while (n > 0) {
        int m = n > 64 ? 64 : n;
        for (k = 0; k < m; k++)
            old[k] = e->configs[n - m + k].config;
        n -= m;
        e->nconfigs = n;
        for (k = 0; k < m; k++)
            Py_DECREF(old[k]);
    }
}

static int
launcher_clear(PyObject *op)
{
    Launcher *self = (Launcher *)op;
    int i, k;
    Py_CLEAR(self->name);
    Py_CLEAR(self->fallback);
    Py_CLEAR(self->tensor_type);
    Py_CLEAR(self->getdev);
    Py_CLEAR(self->rawstream);
    self->launch = NULL;
    if (self->params != NULL)
        for (i = 0; i < self->nparams; i++) {
            int nd = self->params[i].ndtypes;
            self->params[i].ndtypes = 0;
            for (k = 0; k < nd; k++)
                Py_CLEAR(self->params[i].dtypes[k]);
        }
    for (i = 0; i <= MAX_DEVICE; i++)
        if (self->devices[i] != NULL)
            clear_configs(self->devices[i]);
    return 0;
}

static void
launcher_dealloc(PyObject *op)
{
    Launcher *self = (Launcher *)op;
    PyTypeObject *tp = Py_TYPE(op);
    int i;
    PyObject_GC_UnTrack(op);
    launcher_clear(op);
    PyMem_Free(self->params);
    self->params = NULL;
    for (i = 0; i <= MAX_DEVICE; i++) {
        PyMem_Free(self->devices[i]);
        self->devices[i] = NULL;
    }
    tp->tp_free(op);
}

/* -- what Python tells the launcher ------------------------------------------------------ */

static DeviceEntry *
device_entry(Launcher *self, PyObject *dev_obj)
{
    long dev = PyLong_AsLong(dev_obj);
    if (dev == -1 && PyErr_Occurred())
        return NULL;
    if (dev < -1 || dev >= MAX_DEVICE) {
        PyErr_Format(PyExc_ValueError, "device %ld outside [-1, %d)", dev, MAX_DEVICE);
        return NULL;
    }
    if (self->devices[dev + 1] == NULL) {
        DeviceEntry *e = PyMem_Calloc(1, sizeof(DeviceEntry) + (size_t)(self->capacity - 1) * sizeof(ConfigSlot));
        if (e == NULL)
            return (DeviceEntry *)PyErr_NoMemory();
        self->devices[dev + 1] = e;
    }
    return self->devices[dev + 1];
}

static PyObject *
launcher_set_launch(PyObject *op, PyObject *address)
{
    Launcher *self = (Launcher *)op;
    void *p = PyLong_AsVoidPtr(address);
    if (p == NULL && PyErr_Occurred())
        return NULL;
    self->launch = (launch_ex_fn)(uintptr_t)p;
    Py_RETURN_NONE;
}

static PyObject *
launcher_set_function(PyObject *op, PyObject *const *args, Py_ssize_t nargs)
{
    DeviceEntry *e;
    void *fn;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "set_function(device, cufunction_address)");
        return NULL;
    }
    fn = PyLong_AsVoidPtr(args[1]);
    if (fn == NULL && PyErr_Occurred())
        return NULL;
    e = device_entry((Launcher *)op, args[0]);
    if (e == NULL)
        return NULL;
    e->fn = fn;
    Py_RETURN_NONE;
}

static PyObject *
launcher_set_config(PyObject *op, PyObject *const *args, Py_ssize_t nargs)
{
    Launcher *self = (Launcher *)op;
    unsigned int dims[7];
    PyObject *tuple, *config;
    DeviceEntry *e;
    int k;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "set_config(device, config)");
        return NULL;
    }
    config = args[1];
    tuple = PyObject_GetAttr(config, claunch_str_dims);
    if (tuple == NULL)
        return NULL;
    if (!PyTuple_Check(tuple) || PyTuple_GET_SIZE(tuple) != 7) {
        Py_DECREF(tuple);
        PyErr_SetString(PyExc_TypeError, "config._dims must be a tuple of 7 ints");
        return NULL;
    }
    for (k = 0; k < 7; k++) {
        unsigned long v = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(tuple, k));
        if (v == (unsigned long)-1 && PyErr_Occurred()) {
            Py_DECREF(tuple);
            return NULL;
        }
        if (v > 0xFFFFFFFFUL) {
            Py_DECREF(tuple);
            PyErr_SetString(PyExc_OverflowError, "a launch dimension does not fit 32 bits");
            return NULL;
        }
        dims[k] = (unsigned int)v;
    }
    Py_DECREF(tuple);
    e = device_entry(self, args[0]);
    if (e == NULL)
        return NULL;
    for (k = 0; k < e->nconfigs; k++)
        if (e->configs[k].config == config)
            Py_RETURN_NONE;
    if (e->nconfigs >= self->capacity)  /* as the Python side forgets its validated configs */
        clear_configs(e);
    e->configs[e->nconfigs].config = Py_NewRef(config);
    memcpy(e->configs[e->nconfigs].dims, dims, sizeof dims);
    e->nconfigs++;
    Py_RETURN_NONE;
}

static PyObject *
launcher_forget(PyObject *op, PyObject *dev_obj)
{
    DeviceEntry *e = device_entry((Launcher *)op, dev_obj);
    if (e == NULL)
        return NULL;
    clear_configs(e);
    Py_RETURN_NONE;
}

static PyObject *
launcher_configs(PyObject *op, PyObject *dev_obj)
{
    DeviceEntry *e = device_entry((Launcher *)op, dev_obj);
    PyObject *out;
    int k;
    if (e == NULL)
        return NULL;
    out = PyTuple_New(e->nconfigs);
    if (out == NULL)
        return NULL;
    for (k = 0; k < e->nconfigs; k++)
        PyTuple_SET_ITEM(out, k, Py_NewRef(e->configs[k].config));
    return out;
}

static PyObject *
launcher_repr(PyObject *op)
{
    Launcher *self = (Launcher *)op;
    return PyUnicode_FromFormat("<opsmith C launcher for %S>", self->name ? self->name : Py_None);
}

static PyObject *
launcher_get_doc(PyObject *op, void *closure)
{
    Launcher *self = (Launcher *)op;
    (void)closure;
    if (self->fallback == NULL)
        Py_RETURN_NONE;
    return PyObject_GetAttrString(self->fallback, "__doc__");
}

static PyMethodDef launcher_methods[] = {
    {"set_launch", launcher_set_launch, METH_O,
     "set_launch(address): the cuLaunchKernelEx function pointer (0: none yet)."},
    {"set_function", (PyCFunction)(void (*)(void))launcher_set_function, METH_FASTCALL,
     "set_function(device, address): the kernel's CUfunction on device."},
    {"set_config", (PyCFunction)(void (*)(void))launcher_set_config, METH_FASTCALL,
     "set_config(device, config): config was validated for this kernel on device."},
    {"configs", launcher_configs, METH_O,
     "configs(device): the configs known as validated on device (a tuple)."},
    {"forget_configs", launcher_forget, METH_O,
     "forget_configs(device): drop the configs validated on device."},
    {NULL, NULL, 0, NULL}
};

static PyMemberDef launcher_members[] = {
    {"fallback", T_OBJECT, offsetof(Launcher, fallback), READONLY,
     "The Python launcher: every call the C path does not take goes there."},
    {"fallbacks", T_ULONGLONG, offsetof(Launcher, fallbacks), READONLY,
     "How many calls went to the Python launcher."},
    {"name", T_OBJECT, offsetof(Launcher, name), READONLY, "The kernel's name."},
    {NULL, 0, 0, 0, NULL}
};

static PyGetSetDef launcher_getset[] = {
    {"__doc__", launcher_get_doc, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL}
};

PyTypeObject claunch_LauncherType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "opsmith._runtime._claunch.Launcher",
    .tp_basicsize = sizeof(Launcher),
    .tp_dealloc = launcher_dealloc,
    .tp_vectorcall_offset = offsetof(Launcher, vectorcall),
    .tp_repr = launcher_repr,
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "Launcher(name, params, fallback, tensor_type, getdev, rawstream, capacity=64)\n\n"
              "A kernel's checked launch in C (fast path only); every other call goes to fallback.",
    .tp_traverse = launcher_traverse,
    .tp_clear = launcher_clear,
    .tp_methods = launcher_methods,
    .tp_members = launcher_members,
    .tp_getset = launcher_getset,
    .tp_new = launcher_new,
};
