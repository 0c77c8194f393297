/* A stand-in for libcuda.so.1, for testing exported C libraries without a GPU.
 *
 * It implements the driver calls the generated code makes (through cuGetProcAddress) and
 * records what it was asked: which images were loaded, which functions looked up, and the last
 * launch (its grid, block, shared memory, stream and argument bytes). Devices: FAKE_CUDA_CC,
 * a comma-separated list of compute capabilities, one per device ("8.9,9.0"; default "9.0").
 * A test program reaches the records with dlopen("libcuda.so.1") + dlsym("fake_*").
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXDEV 8
typedef struct { int device; int primary; } fake_ctx;
typedef struct { const unsigned char *image; int ptx; } fake_module;
typedef struct { char symbol[256]; int max_dynamic_shared; } fake_func;

static fake_ctx primaries[MAXDEV], other_ctx;
static int ndev = -1, cc[MAXDEV][2], retained[MAXDEV];
static __thread fake_ctx *current;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int modules_loaded, modules_unloaded, ptx_loaded, releases;
static fake_func funcs[1024];
static int nfuncs;
static int arg_sizes[16], nargs;
static struct { const char *symbol; unsigned grid[3], block[3], shared; void *stream; unsigned char args[16][8]; } last;

static void setup(void) {
    const char *s = getenv("FAKE_CUDA_CC");
    if (ndev >= 0) return;
    ndev = 0;
    if (s == NULL) s = "9.0";
    while (*s && ndev < MAXDEV) {
        cc[ndev][0] = atoi(s);
        s = strchr(s, '.');
        if (s == NULL) break;
        cc[ndev][1] = atoi(++s);
        primaries[ndev].device = ndev;
        primaries[ndev].primary = 1;
        ndev++;
        while (*s && *s != ',') s++;
        if (*s == ',') s++;
    }
}

int cuDriverGetVersion(int *v) { *v = 12080; return 0; }
int cuInit(unsigned flags) { (void)flags; setup(); return 0; }
int cuGetErrorName(int r, const char **s) { *s = r == 1 ? "CUDA_ERROR_INVALID_VALUE" : "CUDA_ERROR_FAKE"; return 0; }
int cuGetErrorString(int r, const char **s) { *s = r == 1 ? "invalid argument" : "fake error"; return 0; }
int cuDeviceGetCount(int *n) { setup(); *n = ndev; return 0; }
int cuDeviceGetAttribute(int *v, int attr, int dev) {
    if (dev < 0 || dev >= ndev) return 101;
    *v = attr == 75 ? cc[dev][0] : attr == 76 ? cc[dev][1] : attr == 97 ? 232448 : 0;
    return 0;
}
int cuDevicePrimaryCtxRetain(void **ctx, int dev) { retained[dev]++; *ctx = &primaries[dev]; return 0; }
int cuDevicePrimaryCtxRelease(int dev) { retained[dev]--; releases++; return 0; }
int cuCtxPushCurrent(void *ctx) { current = (fake_ctx *)ctx; return 0; }
int cuCtxPopCurrent(void **ctx) { if (ctx) *ctx = current; current = NULL; return 0; }
int cuCtxGetCurrent(void **ctx) { *ctx = current; return 0; }
int cuCtxSetCurrent(void *ctx) { current = (fake_ctx *)ctx; return 0; }
int cuCtxGetDevice(int *dev) { if (!current) return 201; *dev = current->device; return 0; }
int cuModuleLoadData(void **mod, const void *image) {
    fake_module *m = (fake_module *)malloc(sizeof *m);
    const unsigned char *p = (const unsigned char *)image;
    if (current == NULL) return 201;
    m->image = p;
    m->ptx = memcmp(p, "\x7f" "ELF", 4) != 0;
    if (m->ptx && strstr((const char *)p, ".version") == NULL) return 200; /* CUDA_ERROR_INVALID_IMAGE */
    pthread_mutex_lock(&mu);
    modules_loaded++;
    ptx_loaded += m->ptx;
    pthread_mutex_unlock(&mu);
    *mod = m;
    return 0;
}
int cuModuleUnload(void *mod) { free(mod); pthread_mutex_lock(&mu); modules_unloaded++; pthread_mutex_unlock(&mu); return 0; }
int cuModuleGetFunction(void **f, void *mod, const char *name) {
    fake_func *fn;
    (void)mod;
    pthread_mutex_lock(&mu);
    fn = &funcs[nfuncs++ % 1024];
    snprintf(fn->symbol, sizeof fn->symbol, "%s", name);
    fn->max_dynamic_shared = 49152;
    pthread_mutex_unlock(&mu);
    *f = fn;
    return 0;
}
int cuFuncGetAttribute(int *v, int attr, void *f) {
    *v = attr == 4 ? 16 : attr == 8 ? ((fake_func *)f)->max_dynamic_shared : 0;
    return 0;
}
int cuFuncSetAttribute(void *f, int attr, int value) { if (attr == 8) ((fake_func *)f)->max_dynamic_shared = value; return 0; }
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned shared, void *stream, void **params, void **extra) {
    int i;
    (void)extra;
    if (gx == 0 || shared > (unsigned)((fake_func *)f)->max_dynamic_shared) return 1;
    last.symbol = ((fake_func *)f)->symbol;
    last.grid[0] = gx; last.grid[1] = gy; last.grid[2] = gz;
    last.block[0] = bx; last.block[1] = by; last.block[2] = bz;
    last.shared = shared;
    last.stream = stream;
    for (i = 0; i < nargs; ++i) memcpy(last.args[i], params[i], (size_t)arg_sizes[i]);
    return 0;
}

typedef struct { const char *name; void *fn; } entry;
#define E(n) {#n, (void *)n}
static const entry table[] = {
    E(cuInit), E(cuGetErrorName), E(cuGetErrorString), E(cuDeviceGetCount), E(cuDeviceGetAttribute),
    E(cuDevicePrimaryCtxRetain), E(cuDevicePrimaryCtxRelease), E(cuCtxPushCurrent), E(cuCtxPopCurrent),
    E(cuCtxGetCurrent), E(cuCtxSetCurrent), E(cuCtxGetDevice), E(cuModuleLoadData), E(cuModuleUnload),
    E(cuModuleGetFunction), E(cuFuncGetAttribute), E(cuFuncSetAttribute), E(cuLaunchKernel),
};
int cuGetProcAddress_v2(const char *name, void **fn, int version, uint64_t flags, int *status) {
    size_t i;
    (void)version; (void)flags;
    for (i = 0; i < sizeof table / sizeof table[0]; ++i)
        if (strcmp(table[i].name, name) == 0) { *fn = table[i].fn; if (status) *status = 1; return 0; }
    *fn = NULL;
    return 500;
}

/* for the test program */
void fake_set_args(int n, const int *sizes) { nargs = n; memcpy(arg_sizes, sizes, sizeof(int) * (size_t)n); }
const char *fake_last_symbol(void) { return last.symbol; }
void fake_last_launch(unsigned *grid, unsigned *block, unsigned *shared, void **stream) {
    memcpy(grid, last.grid, sizeof last.grid); memcpy(block, last.block, sizeof last.block);
    *shared = last.shared; *stream = last.stream;
}
const unsigned char *fake_last_arg(int i) { return last.args[i]; }
void fake_counts(int *loaded, int *unloaded, int *ptx, int *released) {
    *loaded = modules_loaded; *unloaded = modules_unloaded; *ptx = ptx_loaded; *released = releases;
}
void *fake_other_ctx(int dev) { other_ctx.device = dev; other_ctx.primary = 0; return &other_ctx; }
void *fake_current(void) { return current; }
