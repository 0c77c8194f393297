/* opsmith._runtime._claunch: a kernel's parameters, described and packed (see _claunch.h).
 *
 * Python describes each parameter once, when a Launcher is built (Kernel._c_launcher reads
 * the KernelSignature): ('tensor', dtypes, align), ('int', size, lo, hi), ('float', size) or
 * ('bool', 1). Per call, the fast path packs each int or float into its 8-byte slot exactly as
 * ctypes' c_intN/c_uintN/c_float/c_double would, or refuses it (the Python launcher then
 * raises the LaunchError naming the argument).
 */
#include "_claunch.h"

/* -- packing, per call --------------------------------------------------------------------- */

int
claunch_pack_int(const ParamSpec *p, PyObject *v, uint64_t *slot)
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

int
claunch_pack_float(const ParamSpec *p, PyObject *v, uint64_t *slot)
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

/* -- descriptions, once per Launcher ------------------------------------------------------ */

int
claunch_parse_param(PyObject *desc, ParamSpec *p, Py_ssize_t index)
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
