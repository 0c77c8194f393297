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
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

#if defined(__GNUC__)
#define OPSMITH_EXPORT __attribute__((visibility("default")))
#else
#define OPSMITH_EXPORT
#endif

#define MAX_PARAMS 128    /* kernels with more parameters use the Python launcher */
#define MAX_DEVICE 64     /* devices -1 (tests: CPU tensors) .. MAX_DEVICE - 1 */
#define MAX_DTYPES 8

/* CUlaunchConfig (cuda.h), laid out as _CULaunchConfig in _kernel.py */
typedef struct {
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    void *hStream;
    void *attrs;
    unsigned int numAttrs;
} CULaunchConfig;

typedef int (*launch_ex_fn)(const CULaunchConfig *, void *, void **, void **);

/* A no-op with cuLaunchKernelEx's signature: a fair fake driver for benchmarks. */
OPSMITH_EXPORT int opsmith_claunch_noop(const CULaunchConfig *c, void *f, void **p, void **e)
{
    (void)c; (void)f; (void)p; (void)e;
    return 0;
}

enum { K_TENSOR, K_INT, K_FLOAT, K_BOOL };

typedef struct {
    int kind;
    int size;                      /* bytes packed (int, float, bool) */
    int is_unsigned;               /* int: hi above INT64_MAX */
    int ndtypes;                   /* tensor: 0 means any dtype */
    PyObject *dtypes[MAX_DTYPES];  /* strong references, compared by identity */
    uint64_t align_mask;           /* tensor: data_ptr() & mask must be 0 */
    long long lo;                  /* int range, lo as signed */
    unsigned long long hi;         /* int range, hi as unsigned */
} ParamSpec;

typedef struct {
    PyObject *config;              /* strong reference */
    unsigned int dims[7];          /* grid xyz, block xyz, shared memory */
} ConfigSlot;

typedef struct {
    void *fn;                      /* CUfunction, NULL until loaded */
    int nconfigs;
    ConfigSlot configs[1];         /* capacity entries (allocated with the device) */
} DeviceEntry;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *name;
    PyObject *fallback;
    PyObject *tensor_type;
    PyObject *getdev;
    PyObject *rawstream;
    launch_ex_fn launch;
    int nparams;
    int capacity;
    int has_tensor;
    ParamSpec *params;
    DeviceEntry *devices[MAX_DEVICE + 1];  /* index dev + 1 */
    unsigned long long fallbacks;
} Launcher;

static PyObject *str_dtype, *str_is_contiguous, *str_data_ptr, *str_get_device, *str_stream, *str_dims;

/* ---------------------------------------------------------------------------------------- */

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

static int
pack_int(const ParamSpec *p, PyObject *v, uint64_t *slot)
{
    int overflow;
    long long s;
    unsigned long long u;
    if (!PyLong_CheckExact(v))
        return -1;
    s = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow < 0 || (s == -1 && PyErr_Occurred()))
        return -1;
    if (overflow > 0) {                /* above INT64_MAX: only an unsigned 64-bit type takes it */
        if (!p->is_unsigned)
            return -1;
        u = PyLong_AsUnsignedLongLong(v);
        if (u == (unsigned long long)-1 && PyErr_Occurred())
            return -1;
        if (u > p->hi)
            return -1;
    } else {
        if (s < p->lo)
            return -1;
        if (s >= 0 && (unsigned long long)s > p->hi)
            return -1;
        u = (unsigned long long)s;
    }
    switch (p->size) {                 /* the low bytes, as ctypes' c_intN/c_uintN store them */
    case 1: { uint8_t x = (uint8_t)u; memcpy(slot, &x, 1); break; }
    case 2: { uint16_t x = (uint16_t)u; memcpy(slot, &x, 2); break; }
    case 4: { uint32_t x = (uint32_t)u; memcpy(slot, &x, 4); break; }
    default: { uint64_t x = (uint64_t)u; memcpy(slot, &x, 8); break; }
    }
    return 0;
}

static int
pack_float(const ParamSpec *p, PyObject *v, uint64_t *slot)
{
    double d;
    if (PyFloat_CheckExact(v)) {
        d = PyFloat_AS_DOUBLE(v);
    } else if (PyLong_CheckExact(v)) {  /* the Python launcher takes float(int) too */
        d = PyLong_AsDouble(v);
        if (d == -1.0 && PyErr_Occurred())
            return -1;
    } else {
        return -1;
    }
    if (p->size == 4) {
        float f = (float)d;            /* as ctypes' c_float.value = d */
        memcpy(slot, &f, 4);
    } else {
        memcpy(slot, &d, 8);
    }
    return 0;
}

static PyObject *
launcher_vectorcall(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames)
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
        if (kw != str_stream && PyUnicode_Compare(kw, str_stream) != 0)
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
                PyObject *dt = PyObject_GetAttr(a, str_dtype);
                if (dt == NULL)
                    goto fallback;
                for (k = 0; k < p->ndtypes && p->dtypes[k] != dt; k++)
                    ;
                Py_DECREF(dt);
                if (k == p->ndtypes)
                    goto fallback;
            }
            r = call0(a, str_is_contiguous);
            if (r == NULL)
                goto fallback;
            Py_DECREF(r);  /* True and False are immortal singletons */
            if (r != Py_True)
                goto fallback;
            r = call0(a, str_data_ptr);
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
            r = call0(a, str_get_device);
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
            if (pack_int(p, a, &values[i]))
                goto fallback;
            break;
        case K_FLOAT:
            if (pack_float(p, a, &values[i]))
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

/* -- construction ------------------------------------------------------------------------ */

static int
parse_param(PyObject *desc, ParamSpec *p, Py_ssize_t index)
{
    const char *kind;
    PyObject *kind_obj;
    if (!PyTuple_Check(desc) || PyTuple_GET_SIZE(desc) < 2) {
        PyErr_Format(PyExc_ValueError, "parameter %zd: expected a tuple (kind, ...)", index);
        return -1;
    }
    kind_obj = PyTuple_GET_ITEM(desc, 0);
    kind = PyUnicode_Check(kind_obj) ? PyUnicode_AsUTF8(kind_obj) : NULL;
    if (kind == NULL) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "parameter %zd: the kind must be a str", index);
        return -1;
    }
    if (strcmp(kind, "tensor") == 0) {
        PyObject *dtypes = PyTuple_GET_ITEM(desc, 1);
        unsigned long long align;
        Py_ssize_t j;
        if (PyTuple_GET_SIZE(desc) != 3 || !PyTuple_Check(dtypes) || PyTuple_GET_SIZE(dtypes) > MAX_DTYPES) {
            PyErr_Format(PyExc_ValueError, "parameter %zd: expected ('tensor', (dtype, ...), align) "
                         "with at most %d dtypes", index, MAX_DTYPES);
            return -1;
        }
        align = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(desc, 2));
        if (PyErr_Occurred())
            return -1;
        if (align == 0 || (align & (align - 1))) {
            PyErr_Format(PyExc_ValueError, "parameter %zd: alignment %llu is not a power of two", index, align);
            return -1;
        }
        p->kind = K_TENSOR;
        p->align_mask = align - 1;
        p->ndtypes = (int)PyTuple_GET_SIZE(dtypes);
        for (j = 0; j < p->ndtypes; j++) {
            p->dtypes[j] = Py_NewRef(PyTuple_GET_ITEM(dtypes, j));
        }
        return 0;
    }
    if (strcmp(kind, "int") == 0) {
        long size;
        int overflow;
        PyObject *lo, *hi;
        if (PyTuple_GET_SIZE(desc) != 4) {
            PyErr_Format(PyExc_ValueError, "parameter %zd: expected ('int', size, lo, hi)", index);
            return -1;
        }
        size = PyLong_AsLong(PyTuple_GET_ITEM(desc, 1));
        if (size == -1 && PyErr_Occurred())
            return -1;
        lo = PyTuple_GET_ITEM(desc, 2);
        hi = PyTuple_GET_ITEM(desc, 3);
        p->kind = K_INT;
        p->size = (int)size;
        p->lo = PyLong_AsLongLongAndOverflow(lo, &overflow);
        if (PyErr_Occurred())
            return -1;
        if (overflow || p->lo > 0) {
            PyErr_Format(PyExc_ValueError, "parameter %zd: int range must start in [-2**63, 0]", index);
            return -1;
        }
        p->hi = PyLong_AsUnsignedLongLong(hi);
        if (PyErr_Occurred())
            return -1;
        p->is_unsigned = p->hi > (unsigned long long)INT64_MAX;
        if (size != 1 && size != 2 && size != 4 && size != 8) {
            PyErr_Format(PyExc_ValueError, "parameter %zd: int size %ld is not 1, 2, 4 or 8", index, size);
            return -1;
        }
        return 0;
    }
    if (strcmp(kind, "float") == 0 || strcmp(kind, "bool") == 0) {
        long size;
        if (PyTuple_GET_SIZE(desc) != 2) {
            PyErr_Format(PyExc_ValueError, "parameter %zd: expected (%s, size)", index, kind);
            return -1;
        }
        size = PyLong_AsLong(PyTuple_GET_ITEM(desc, 1));
        if (size == -1 && PyErr_Occurred())
            return -1;
        p->kind = kind[0] == 'f' ? K_FLOAT : K_BOOL;
        p->size = (int)size;
        if (p->kind == K_FLOAT ? (size != 4 && size != 8) : size != 1) {
            PyErr_Format(PyExc_ValueError, "parameter %zd: %s of %ld bytes is not supported", index, kind, size);
            return -1;
        }
        return 0;
    }
    PyErr_Format(PyExc_ValueError, "parameter %zd: unknown kind %R", index, kind_obj);
    return -1;
}

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
    self->vectorcall = launcher_vectorcall;
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
        if (parse_param(PyTuple_GET_ITEM(seq, i), &self->params[i], i)) {
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
    tuple = PyObject_GetAttr(config, str_dims);
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

static PyTypeObject LauncherType = {
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
    if (!(str_dtype = PyUnicode_InternFromString("dtype")) ||
        !(str_is_contiguous = PyUnicode_InternFromString("is_contiguous")) ||
        !(str_data_ptr = PyUnicode_InternFromString("data_ptr")) ||
        !(str_get_device = PyUnicode_InternFromString("get_device")) ||
        !(str_stream = PyUnicode_InternFromString("stream")) ||
        !(str_dims = PyUnicode_InternFromString("_dims")))
        return NULL;
    if (PyType_Ready(&LauncherType) < 0)
        return NULL;
    m = PyModule_Create(&claunch_module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&LauncherType);
    if (PyModule_AddObject(m, "Launcher", (PyObject *)&LauncherType) < 0) {
        Py_DECREF(&LauncherType);
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
