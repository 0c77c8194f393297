#ifndef @GUARD@
#define @GUARD@
/* The launch API of @PREFIX@: the driver types (one definition shared by every opsmith
 * library in a program), then this library's functions, all named opsmith_@PREFIX@_*. */

#include <stddef.h>
#include <stdint.h>
#ifndef __cplusplus
#include <stdbool.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

#ifndef OPSMITH_EXPORT_TYPES_V1
#define OPSMITH_EXPORT_TYPES_V1
/** A CUresult (cuda.h's values): 0 is success. */
typedef int opsmith_CUresult;
/** cuda.h's CUstream and the runtime's cudaStream_t (the same type); NULL is the legacy default stream. */
typedef struct CUstream_st *opsmith_CUstream;
/** Grid and block sizes. */
typedef struct opsmith_dim3 {
    unsigned x, y, z;
} opsmith_dim3;
/** The static resources of a kernel on a device (cuFuncGetAttribute). */
typedef struct opsmith_kernel_attributes {
    int num_regs;                      /* registers per thread */
    int shared_size_bytes;             /* static __shared__ bytes per block */
    int const_size_bytes;              /* user __constant__ bytes */
    int local_size_bytes;              /* local memory bytes per thread */
    int max_threads_per_block;         /* the most threads a block of this kernel can have */
    int max_dynamic_shared_size_bytes; /* the most dynamic shared memory a launch may ask for */
    int binary_version;                /* the code's arch, e.g. 90 */
    int ptx_version;                   /* the PTX version the code came from, e.g. 90 */
} opsmith_kernel_attributes;
static inline opsmith_dim3 opsmith_dim3_make(unsigned x, unsigned y, unsigned z) {
    opsmith_dim3 d;
    d.x = x;
    d.y = y;
    d.z = z;
    return d;
}
#endif

#if defined(__GNUC__)
#define @UPPER@_API __attribute__((visibility("default")))
#else
#define @UPPER@_API
#endif

#define @UPPER@_NUM_KERNELS @NUM_KERNELS@

/** Load every kernel on `device` (its primary context), once; thread-safe. Launches load on first use. */
@UPPER@_API opsmith_CUresult opsmith_@PREFIX@_load(int device);
/** Unload from every device and release the primary contexts. Not while launches are running. */
@UPPER@_API opsmith_CUresult opsmith_@PREFIX@_unload(void);
/** "CUDA_ERROR_NAME: description" of a CUresult. */
@UPPER@_API const char *opsmith_@PREFIX@_error_string(opsmith_CUresult result);
/** What the last failed call of this library on this thread did, and why it failed ("" if none). */
@UPPER@_API const char *opsmith_@PREFIX@_last_error(void);
/** The code loaded on `device` ("sm_90", "compute_120" for PTX), or NULL when not loaded. */
@UPPER@_API const char *opsmith_@PREFIX@_loaded_arch(int device);
/** A driver entry point by name ("cuMemAlloc"), for callers without cuda.h or libcuda at link time. */
@UPPER@_API opsmith_CUresult opsmith_@PREFIX@_get_proc(const char *name, void **fn);
/* @BEGIN_KERNEL@ */

/* @DISPLAY@ (@SYMBOL@) */
@UPPER@_API opsmith_CUresult opsmith_@PREFIX@_@CNAME@_launch(opsmith_CUstream stream, opsmith_dim3 grid, opsmith_dim3 block, unsigned shared_mem@PARAMS@);
@UPPER@_API opsmith_CUresult opsmith_@PREFIX@_@CNAME@_attributes(int device, opsmith_kernel_attributes *out);
/* @END_KERNEL@ */

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* @GUARD@ */
