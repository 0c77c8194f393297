/* opsmith._runtime._claunch: the types and declarations its C files share.
 *
 * One Python extension, four files by concept:
 *   _claunch.h           this header: limits, the driver's launch config, ParamSpec, Launcher
 *   _claunch.c           the vectorcall fast path, the fallback, the module and its init
 *   _claunch_pack.c      parameter descriptions (parse_param) and packing values (pack_int/float)
 *   _claunch_launcher.c  the Launcher type: construction, GC, what Python tells it, its methods
 * Names shared between the files carry the claunch_ prefix and hidden visibility: the .so
 * exports PyInit__claunch and opsmith_claunch_noop only, as when it was one file.
 */
#ifndef OPSMITH_CLAUNCH_H
#define OPSMITH_CLAUNCH_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if defined(__GNUC__)
#define OPSMITH_EXPORT __attribute__((visibility("default")))
#define CLAUNCH_INTERNAL __attribute__((visibility("hidden")))
#else
#define OPSMITH_EXPORT
#define CLAUNCH_INTERNAL
#endif

#define MAX_PARAMS 128    /* kernels with more parameters use the Python launcher */
#define MAX_DEVICE 64     /* devices -1 (tests: CPU tensors) .. MAX_DEVICE - 1 */
#define MAX_DTYPES 8

/* CUlaunchConfig (cuda.h), laid out as _CULaunchConfig in _launch_config.py */
typedef struct {
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    void *hStream;
    void *attrs;
    unsigned int numAttrs;
} CULaunchConfig;

typedef int (*launch_ex_fn)(const CULaunchConfig *, void *, void **, void **);

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

/* _claunch.c: attribute and method names, interned once by the module's init */
CLAUNCH_INTERNAL extern PyObject *claunch_str_dtype, *claunch_str_is_contiguous, *claunch_str_data_ptr,
    *claunch_str_get_device, *claunch_str_stream, *claunch_str_dims;

/* _claunch.c: a call of a Launcher (the fast path, else its fallback) */
CLAUNCH_INTERNAL PyObject *claunch_vectorcall(PyObject *op, PyObject *const *args, size_t nargsf,
                                              PyObject *kwnames);

/* _claunch_pack.c: 0 on success; -1 when the value is not taken (no exception is left set
   by a failed type or range check; one from a conversion may be, the caller clears it) */
CLAUNCH_INTERNAL int claunch_pack_int(const ParamSpec *p, PyObject *v, uint64_t *slot);
CLAUNCH_INTERNAL int claunch_pack_float(const ParamSpec *p, PyObject *v, uint64_t *slot);

/* _claunch_pack.c: one parameter's description (a tuple from Python) into p; -1 with a
   ValueError naming parameter index when it is malformed */
CLAUNCH_INTERNAL int claunch_parse_param(PyObject *desc, ParamSpec *p, Py_ssize_t index);

/* _claunch_launcher.c: the Launcher type */
CLAUNCH_INTERNAL extern PyTypeObject claunch_LauncherType;

#endif /* OPSMITH_CLAUNCH_H */
