/* The launch core's driver part (opsmith/_runtime/launch/osm_driver.h): libcuda.so.1 opened once
 * (dlopen + cuGetProcAddress, pthread_once), the entry points the core calls, error texts and
 * this thread's last error. Every name is static: it becomes part of one library's source
 * (opsmith._runtime._launch_gen writes it into <prefix>.c in place of its #include). */
#ifndef OSM_DRIVER_H_
#define OSM_DRIVER_H_
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include "@HEADER@"

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#if defined(__GNUC__)
#define OSM_TLS __thread
#define OSM_ALIGNED __attribute__((aligned(64)))
#define OSM_PRINTF __attribute__((format(printf, 2, 3)))
#define OSM_LOAD(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define OSM_STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#else
#define OSM_TLS
#define OSM_ALIGNED
#define OSM_PRINTF
#define OSM_LOAD(p) (*(volatile int *)(p))
#define OSM_STORE(p, v) (*(volatile int *)(p) = (v))
#endif

/* cuda.h's values */
#define OSM_SUCCESS 0
#define OSM_ERROR_INVALID_VALUE 1
#define OSM_ERROR_NOT_INITIALIZED 3
#define OSM_ERROR_INVALID_DEVICE 101
#define OSM_ERROR_INVALID_CONTEXT 201
#define OSM_ERROR_NO_BINARY_FOR_GPU 209
#define OSM_ERROR_NOT_FOUND 500
#define OSM_DEV_CC_MAJOR 75
#define OSM_DEV_CC_MINOR 76
#define OSM_DEV_SHARED_OPTIN 97
#define OSM_FUNC_MAX_THREADS 0
#define OSM_FUNC_SHARED 1
#define OSM_FUNC_CONST 2
#define OSM_FUNC_LOCAL 3
#define OSM_FUNC_REGS 4
#define OSM_FUNC_PTX_VERSION 5
#define OSM_FUNC_BINARY_VERSION 6
#define OSM_FUNC_MAX_DYNAMIC_SHARED 8
#define OSM_DEFAULT_SHARED_LIMIT 49152

/* ---- errors ----------------------------------------------------------------------------- */
static OSM_TLS char osm_last[1024];
static OSM_TLS char osm_errbuf[512];

static const char *osm_error_text(opsmith_CUresult r);

static opsmith_CUresult osm_fail(opsmith_CUresult r, const char *fmt, ...) OSM_PRINTF;
static opsmith_CUresult osm_fail(opsmith_CUresult r, const char *fmt, ...) {
    char what[640];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    snprintf(osm_last, sizeof osm_last, "opsmith_@PREFIX@: %s: %s", what, osm_error_text(r));
    return r;
}

/* ---- the driver, opened once ------------------------------------------------------------ */
typedef opsmith_CUresult (*osm_pfn_GetProcAddress_v2)(const char *, void **, int, uint64_t, int *);
typedef opsmith_CUresult (*osm_pfn_GetProcAddress)(const char *, void **, int, uint64_t);
typedef opsmith_CUresult (*osm_pfn_DriverGetVersion)(int *);

static struct {
    opsmith_CUresult status;
    char message[512];
    int version;
    osm_pfn_GetProcAddress_v2 getProcV2;
    osm_pfn_GetProcAddress getProc;
    opsmith_CUresult (*Init)(unsigned);
    opsmith_CUresult (*GetErrorName)(opsmith_CUresult, const char **);
    opsmith_CUresult (*GetErrorString)(opsmith_CUresult, const char **);
    opsmith_CUresult (*DeviceGetCount)(int *);
    opsmith_CUresult (*DeviceGetAttribute)(int *, int, int);
    opsmith_CUresult (*DevicePrimaryCtxRetain)(void **, int);
    opsmith_CUresult (*DevicePrimaryCtxRelease)(int);
    opsmith_CUresult (*CtxPushCurrent)(void *);
    opsmith_CUresult (*CtxPopCurrent)(void **);
    opsmith_CUresult (*CtxGetCurrent)(void **);
    opsmith_CUresult (*CtxSetCurrent)(void *);
    opsmith_CUresult (*CtxGetDevice)(int *);
    opsmith_CUresult (*ModuleLoadData)(void **, const void *);
    opsmith_CUresult (*ModuleUnload)(void *);
    opsmith_CUresult (*ModuleGetFunction)(void **, void *, const char *);
    opsmith_CUresult (*FuncGetAttribute)(int *, int, void *);
    opsmith_CUresult (*FuncSetAttribute)(void *, int, int);
    opsmith_CUresult (*LaunchKernel)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                     unsigned, void *, void **, void **);
} osm_drv;
static pthread_once_t osm_drv_once = PTHREAD_ONCE_INIT;
static int osm_drv_ready; /* 1 once the driver is open and cuInit succeeded */

static opsmith_CUresult osm_proc(const char *name, void **fn) {
    opsmith_CUresult r;
    int found = 0;
    int version = osm_drv.version < 12000 ? osm_drv.version : 12000;
    *fn = NULL;
    if (osm_drv.getProcV2 != NULL) {
        r = osm_drv.getProcV2(name, fn, version, 0, &found);
    } else {
        r = osm_drv.getProc(name, fn, version, 0);
    }
    if (r == OSM_SUCCESS && *fn == NULL) r = OSM_ERROR_NOT_FOUND;
    return r;
}

/* Function pointers from void* without the cast ISO C forbids. */
#define OSM_SYM(dst, src) memcpy(&(dst), &(src), sizeof(dst))
#define OSM_GET(field, cname)                                                                        \
    do {                                                                                             \
        void *p_;                                                                                    \
        if (osm_proc(cname, &p_) != OSM_SUCCESS) {                                                   \
            snprintf(osm_drv.message, sizeof osm_drv.message,                                        \
                     "the CUDA driver (CUDA %d.%d) has no %s: update the NVIDIA driver",             \
                     osm_drv.version / 1000, osm_drv.version % 1000 / 10, cname);                    \
            osm_drv.status = OSM_ERROR_NOT_FOUND;                                                    \
            return;                                                                                  \
        }                                                                                            \
        OSM_SYM(osm_drv.field, p_);                                                                  \
    } while (0)

static void osm_drv_open(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    void *sym;
    osm_pfn_DriverGetVersion get_version;
    opsmith_CUresult r;
    if (lib == NULL) {
        const char *why = dlerror();
        snprintf(osm_drv.message, sizeof osm_drv.message,
                 "the NVIDIA driver library libcuda.so.1 could not be opened (%s): install the NVIDIA "
                 "driver, or in a container run with the GPU exposed (docker --gpus all)",
                 why ? why : "not found");
        osm_drv.status = OSM_ERROR_NOT_INITIALIZED;
        return;
    }
    sym = dlsym(lib, "cuDriverGetVersion");
    OSM_SYM(get_version, sym);
    if (sym == NULL || get_version(&osm_drv.version) != OSM_SUCCESS) {
        snprintf(osm_drv.message, sizeof osm_drv.message, "libcuda.so.1 has no usable cuDriverGetVersion");
        osm_drv.status = OSM_ERROR_NOT_INITIALIZED;
        return;
    }
    sym = dlsym(lib, "cuGetProcAddress_v2");
    OSM_SYM(osm_drv.getProcV2, sym);
    sym = dlsym(lib, "cuGetProcAddress");
    OSM_SYM(osm_drv.getProc, sym);
    if (osm_drv.getProcV2 == NULL && osm_drv.getProc == NULL) {
        snprintf(osm_drv.message, sizeof osm_drv.message,
                 "the NVIDIA driver (CUDA %d.%d) is older than CUDA 11.3 (no cuGetProcAddress): update it",
                 osm_drv.version / 1000, osm_drv.version % 1000 / 10);
        osm_drv.status = OSM_ERROR_NOT_INITIALIZED;
        return;
    }
    OSM_GET(Init, "cuInit");
    OSM_GET(GetErrorName, "cuGetErrorName");
    OSM_GET(GetErrorString, "cuGetErrorString");
    OSM_GET(DeviceGetCount, "cuDeviceGetCount");
    OSM_GET(DeviceGetAttribute, "cuDeviceGetAttribute");
    OSM_GET(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    OSM_GET(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease");
    OSM_GET(CtxPushCurrent, "cuCtxPushCurrent");
    OSM_GET(CtxPopCurrent, "cuCtxPopCurrent");
    OSM_GET(CtxGetCurrent, "cuCtxGetCurrent");
    OSM_GET(CtxSetCurrent, "cuCtxSetCurrent");
    OSM_GET(CtxGetDevice, "cuCtxGetDevice");
    OSM_GET(ModuleLoadData, "cuModuleLoadData");
    OSM_GET(ModuleUnload, "cuModuleUnload");
    OSM_GET(ModuleGetFunction, "cuModuleGetFunction");
    OSM_GET(FuncGetAttribute, "cuFuncGetAttribute");
    OSM_GET(FuncSetAttribute, "cuFuncSetAttribute");
    OSM_GET(LaunchKernel, "cuLaunchKernel");
    r = osm_drv.Init(0);
    if (r != OSM_SUCCESS) {
        const char *name = NULL;
        osm_drv.GetErrorName(r, &name);
        snprintf(osm_drv.message, sizeof osm_drv.message, "cuInit failed (%s): is a GPU visible "
                 "(CUDA_VISIBLE_DEVICES, nvidia-smi)?", name ? name : "?");
        osm_drv.status = r;
        return;
    }
    OSM_STORE(&osm_drv_ready, 1);
}

static opsmith_CUresult osm_driver(void) {
    if (OSM_LOAD(&osm_drv_ready)) return OSM_SUCCESS;
    pthread_once(&osm_drv_once, osm_drv_open);
    if (osm_drv.status != OSM_SUCCESS) return osm_fail(osm_drv.status, "%s", osm_drv.message);
    return OSM_SUCCESS;
}

static const char *osm_error_text(opsmith_CUresult r) {
    const char *name = NULL, *text = NULL;
    if (r == OSM_SUCCESS) return "CUDA_SUCCESS: no error";
    if (OSM_LOAD(&osm_drv_ready)) {
        osm_drv.GetErrorName(r, &name);
        osm_drv.GetErrorString(r, &text);
    }
    if (name == NULL) {
        switch (r) {
        case OSM_ERROR_INVALID_VALUE: name = "CUDA_ERROR_INVALID_VALUE"; break;
        case OSM_ERROR_NOT_INITIALIZED: name = "CUDA_ERROR_NOT_INITIALIZED"; break;
        case OSM_ERROR_INVALID_DEVICE: name = "CUDA_ERROR_INVALID_DEVICE"; break;
        case OSM_ERROR_INVALID_CONTEXT: name = "CUDA_ERROR_INVALID_CONTEXT"; break;
        case OSM_ERROR_NO_BINARY_FOR_GPU: name = "CUDA_ERROR_NO_BINARY_FOR_GPU"; break;
        case OSM_ERROR_NOT_FOUND: name = "CUDA_ERROR_NOT_FOUND"; break;
        default: name = "CUDA error"; break;
        }
    }
    snprintf(osm_errbuf, sizeof osm_errbuf, "%s (%d): %s", name, r,
             text ? text : "the CUDA driver is not loaded to describe it");
    return osm_errbuf;
}

#endif /* OSM_DRIVER_H_ */
