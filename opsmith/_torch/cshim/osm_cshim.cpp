/* opsmith's C-shim op library: boxed torch kernels that launch NVRTC kernels.

   One library serves every op of a process: OSM_MAX_OPS op slots, each with its own boxed
   kernel (torch's boxed-kernel signature passes no user data, so slot i has its own function
   osm_boxed<i>). It includes no torch and no CUDA header and links against neither: the torch
   shim functions (aoti_torch_*) and the driver entry points arrive as addresses in osm_init,
   resolved by Python (opsmith/_torch/_cshim.py) from the libraries torch loaded and from
   opsmith/_runtime/_driver.py. C++ only for std::runtime_error: torch's stable ABI reports a
   failed check the same way (an exception through the boxed kernel, a RuntimeError in Python).

   Python reads the OSM_MAX_* numbers and the names of OSM_API from this file
   (opsmith/_torch/_cshim_source.py): change them here, and only here. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <array>
#include <stdexcept>
#include <utility>
#include <string>

#define OSM_MAX_OPS 64       /* op slots per process: one boxed kernel each */
#define OSM_MAX_KERNELS 8    /* kernels per op (one per dtype combination) */
#define OSM_MAX_PARAMS 24    /* parameters per kernel */
#define OSM_MAX_DEVICES 16   /* device ordinals a kernel is loaded on */
#define OSM_MAX_TENSORS 16   /* inputs and outputs of one op, each */
#define OSM_MAX_DIM 16

typedef uint64_t SIV;   // torch's StableIValue
typedef void *ATH;      // AtenTensorHandle: an owning at::Tensor*
typedef int32_t ERR;    // AOTITorchError, 0 is success
typedef void (*boxed_fn)(SIV *, uint64_t, uint64_t);

/* The function table osm_init receives, in this order: X(field, symbol, return type, parameters).
   Python resolves each symbol and passes NULL for the CUDA-only ones on CPU ops. */
#define OSM_API(X) \
    X(library_init_impl, aoti_torch_library_init_impl, ERR, (const char *, const char *, const char *, uint32_t, void **)) \
    X(library_impl, aoti_torch_library_impl, ERR, (void *, const char *, boxed_fn)) \
    X(get_data_ptr, aoti_torch_get_data_ptr, ERR, (ATH, void **)) \
    X(get_numel, aoti_torch_get_numel, ERR, (ATH, int64_t *)) \
    X(get_dim, aoti_torch_get_dim, ERR, (ATH, int64_t *)) \
    X(get_sizes, aoti_torch_get_sizes, ERR, (ATH, int64_t **)) \
    X(get_dtype, aoti_torch_get_dtype, ERR, (ATH, int32_t *)) \
    X(get_device_type, aoti_torch_get_device_type, ERR, (ATH, int32_t *)) \
    X(get_device_index, aoti_torch_get_device_index, ERR, (ATH, int32_t *)) \
    X(is_contiguous, aoti_torch_is_contiguous, ERR, (ATH, bool *)) \
    X(empty_strided, aoti_torch_empty_strided, ERR, (int64_t, const int64_t *, const int64_t *, int32_t, int32_t, int32_t, ATH *)) \
    X(copy_, aoti_torch_copy_, ERR, (ATH, ATH, int32_t)) \
    X(delete_tensor, aoti_torch_delete_tensor_object, ERR, (ATH)) \
    X(current_cuda_stream, aoti_torch_get_current_cuda_stream, ERR, (int32_t, void **)) \
    X(cuLaunchKernel, cuLaunchKernel, int, (void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **, void **)) \
    X(cuCtxGetDevice, cuCtxGetDevice, int, (int *)) \
    X(cuCtxPushCurrent, cuCtxPushCurrent_v2, int, (void *)) \
    X(cuCtxPopCurrent, cuCtxPopCurrent_v2, int, (void **))

extern "C" {
struct osm_api {
#define OSM_API_FIELD(field, symbol, ret, params) ret (*field) params;
    OSM_API(OSM_API_FIELD)
#undef OSM_API_FIELD
};
}

#define OSM_API_ONE(field, symbol, ret, params) +1
enum { OSM_API_COUNT = 0 OSM_API(OSM_API_ONE) };
#undef OSM_API_ONE
static_assert(sizeof(osm_api) == OSM_API_COUNT * sizeof(void *), "osm_init copies a table of pointers");

// what a kernel parameter receives: a tensor, the item count, or a scalar argument converted to its C type
enum { P_INPUT = 0, P_OUTPUT = 1, P_COUNT32 = 2, P_COUNT64 = 3, P_INT32 = 4, P_INT64 = 5, P_UINT32 = 6,
       P_F32 = 7, P_F64 = 8, P_BOOL = 9 };
// what an op argument is on the stack (torch's StableIValue: an int as int64, a float as double, a bool in byte 0)
enum { A_TENSOR = 0, A_INT = 1, A_FLOAT = 2, A_BOOL = 3 };

struct osm_op {
    char name[160];
    int used;
    int device_type;                      // c10::DeviceType of the key it serves (1 CUDA; 0 CPU in tests)
    int n_args, n_outs;
    int arg_kind[OSM_MAX_TENSORS];        // A_* per argument
    int like[OSM_MAX_TENSORS];            // output k is like input like[k]
    int32_t odtype[OSM_MAX_TENSORS];      // output k's dtype (-1: like[k]'s, -2 - i: input i's)
    int n_params;
    int pkind[OSM_MAX_PARAMS], pindex[OSM_MAX_PARAMS];
    int n_kernels;
    int32_t kdtype[OSM_MAX_KERNELS][OSM_MAX_PARAMS];  // dtype each tensor parameter takes, -1 any
    int ipt[OSM_MAX_KERNELS];                          // items per thread: grid = n / (block * ipt)
    void *fn[OSM_MAX_KERNELS][OSM_MAX_DEVICES];        // CUfunction per kernel and device
    unsigned block[OSM_MAX_KERNELS][OSM_MAX_DEVICES];
    void *ctx[OSM_MAX_DEVICES];                        // primary contexts
    int (*prepare)(int op, int kernel, int device);    // Python: loads the kernel on a device
    char error[512];                                   // prepare's message when it fails
};

static osm_api api;
static int api_ready = 0;
static osm_op ops[OSM_MAX_OPS];

namespace {

struct Call {
    const osm_op &op;
    ATH in[OSM_MAX_TENSORS] = {};
    ATH tmp[OSM_MAX_TENSORS] = {};
    ATH out[OSM_MAX_TENSORS] = {};
    int n_in = 0, n_out = 0;
    int pushed = 0;
    explicit Call(const osm_op &o) : op(o) {}
    ~Call() {
        void *ignored;
        if (pushed) api.cuCtxPopCurrent(&ignored);
        for (int i = 0; i < n_in; i++) {
            if (in[i] && op.arg_kind[i] == A_TENSOR) api.delete_tensor(in[i]);
            if (tmp[i]) api.delete_tensor(tmp[i]);
        }
        for (int k = 0; k < n_out; k++)
            if (out[k]) api.delete_tensor(out[k]);
    }
    [[noreturn]] void fail(const std::string &what) { throw std::runtime_error(std::string(op.name) + ": " + what); }
    void check(ERR e, const char *what) {
        if (e) fail(std::string("torch shim call ") + what + " failed");
    }
};

const char *dtype_name(int32_t d) {
    switch (d) {
    case 0: return "uint8"; case 1: return "int8"; case 2: return "int16"; case 3: return "int32";
    case 4: return "int64"; case 5: return "float16"; case 6: return "float32"; case 7: return "float64";
    case 11: return "bool"; case 15: return "bfloat16";
    default: return "another dtype";
    }
}

void run(int slot, SIV *stack, uint64_t num_args, uint64_t num_outputs) {
    osm_op &op = ops[slot];
    Call c(op);
    c.n_in = (int)num_args;
    for (int i = 0; i < c.n_in; i++) c.in[i] = (ATH)stack[i];
    if ((int)num_args != op.n_args || (int)num_outputs != op.n_outs) c.fail("stack does not match the schema");

    ATH t[OSM_MAX_TENSORS];
    int32_t dtype[OSM_MAX_TENSORS];
    int32_t dev = 0;
    int first = -1;  // the first tensor argument
    for (int i = 0; i < c.n_in; i++) {
        dtype[i] = -1;
        if (op.arg_kind[i] != A_TENSOR) continue;
        int32_t dt, di;
        c.check(api.get_device_type(c.in[i], &dt), "get_device_type");
        c.check(api.get_device_index(c.in[i], &di), "get_device_index");
        c.check(api.get_dtype(c.in[i], &dtype[i]), "get_dtype");
        if (dt != op.device_type)
            c.fail("input " + std::to_string(i) + " is on another device type than this kernel serves");
        if (first < 0) { dev = di; first = i; }
        else if (di != dev)
            c.fail("inputs are on different devices (input " + std::to_string(first) + " on device " + std::to_string(dev) + ", input " +
                   std::to_string(i) + " on device " + std::to_string(di) + "); move them to one device");
        bool contiguous;
        c.check(api.is_contiguous(c.in[i], &contiguous), "is_contiguous");
        t[i] = c.in[i];
        if (!contiguous) {  // the Python path calls .contiguous(): copy into a contiguous tensor
            int64_t dim, *sizes, strides[OSM_MAX_DIM];
            c.check(api.get_dim(c.in[i], &dim), "get_dim");
            c.check(api.get_sizes(c.in[i], &sizes), "get_sizes");
            if (dim > OSM_MAX_DIM) c.fail("more than 16 dimensions");
            int64_t s = 1;
            for (int64_t d = dim - 1; d >= 0; d--) { strides[d] = s; s *= sizes[d] > 1 ? sizes[d] : 1; }
            c.check(api.empty_strided(dim, sizes, strides, dtype[i], dt, di, &c.tmp[i]), "empty_strided");
            c.check(api.copy_(c.tmp[i], c.in[i], 0), "copy_");
            t[i] = c.tmp[i];
        }
    }
    if (dev < 0) dev = 0;  // a CPU tensor's index is -1 (the CPU key, in tests)
    else if (dev >= OSM_MAX_DEVICES)  // never another device's function and context
        c.fail("cuda:" + std::to_string(dev) + " is beyond the " + std::to_string(OSM_MAX_DEVICES) +
               " devices of the C-shim path; set OPSMITH_TORCH_OP_CSHIM=0 to use the Python implementation");

    // the kernel: the one whose tensor parameters take these dtypes
    int kernel = -1;
    for (int k = 0; k < op.n_kernels && kernel < 0; k++) {
        bool ok = true;
        for (int p = 0; p < op.n_params && ok; p++)
            if (op.pkind[p] == P_INPUT && op.kdtype[k][p] >= 0 && op.kdtype[k][p] != dtype[op.pindex[p]]) ok = false;
        if (ok) kernel = k;
    }
    if (kernel < 0) {
        std::string got;
        for (int i = 0; i < c.n_in; i++)
            if (op.arg_kind[i] == A_TENSOR) got += std::string(got.empty() ? "" : ", ") + dtype_name(dtype[i]);
        c.fail("no kernel takes inputs of dtype " + got + "; pass tensors of the dtype the kernel declares");
    }

    // outputs: contiguous, shape, dtype and device of the input they are like
    for (int k = 0; k < op.n_outs; k++) {
        ATH like = t[op.like[k]];
        int64_t dim, *sizes, strides[OSM_MAX_DIM];
        c.check(api.get_dim(like, &dim), "get_dim");
        c.check(api.get_sizes(like, &sizes), "get_sizes");
        if (dim > OSM_MAX_DIM) c.fail("more than 16 dimensions");
        int64_t s = 1;
        for (int64_t d = dim - 1; d >= 0; d--) { strides[d] = s; s *= sizes[d] > 1 ? sizes[d] : 1; }
        const int32_t od = op.odtype[k];  // a dtype code; -1 like's dtype; -2 - i input i's
        int32_t odt = od >= 0 ? od : (od == -1 ? dtype[op.like[k]] : dtype[-2 - od]);
        c.check(api.empty_strided(dim, sizes, strides, odt, op.device_type, dev, &c.out[k]),
                "empty_strided");
        c.n_out = k + 1;
    }

    int64_t n = 0;
    if (op.n_outs) c.check(api.get_numel(c.out[0], &n), "get_numel");
    if (n > 0) {
        void *fn = op.fn[kernel][dev];
        if (!fn) {
            if (op.prepare(slot, kernel, dev)) c.fail(op.error);
            fn = op.fn[kernel][dev];
            if (!fn) c.fail("the kernel could not be loaded on this device");
        }
        unsigned block = op.block[kernel][dev];
        int64_t per_block = (int64_t)block * op.ipt[kernel];
        int64_t grid = (n + per_block - 1) / per_block;
        if (grid > 0x7fffffffLL) c.fail("too many items for a 1-D grid");
        void *ptrs[OSM_MAX_PARAMS];
        int32_t n32 = (int32_t)n;
        int64_t n64 = n;
        void *params[OSM_MAX_PARAMS];
        union { int32_t i32; int64_t i64; uint32_t u32; float f32; double f64; uint8_t b; } scalar[OSM_MAX_PARAMS];
        for (int p = 0; p < op.n_params; p++) {
            const SIV v = op.pkind[p] >= P_INT32 ? stack[op.pindex[p]] : 0;
            int64_t iv;
            double dv;
            memcpy(&iv, &v, sizeof iv);
            memcpy(&dv, &v, sizeof dv);
            const int ak = op.pkind[p] >= P_INT32 ? op.arg_kind[op.pindex[p]] : A_TENSOR;
            if (ak == A_BOOL) iv = (v & 0xff) != 0;  // a bool is byte 0
            if (ak == A_FLOAT && op.pkind[p] != P_F32 && op.pkind[p] != P_F64)
                c.fail("argument " + std::to_string(op.pindex[p]) + " is a float and the kernel takes an integer");
            if (ak != A_FLOAT) dv = (double)iv;
            auto where = [&]() { return "argument " + std::to_string(op.pindex[p]) + " = " + std::to_string(iv); };
            switch (op.pkind[p]) {
            case P_INT32:
                if (iv < INT32_MIN || iv > INT32_MAX) c.fail(where() + " does not fit the kernel's 32-bit int");
                scalar[p].i32 = (int32_t)iv; params[p] = &scalar[p]; break;
            case P_UINT32:
                if (iv < 0 || iv > (int64_t)UINT32_MAX) c.fail(where() + " does not fit the kernel's unsigned 32-bit int");
                scalar[p].u32 = (uint32_t)iv; params[p] = &scalar[p]; break;
            case P_INT64: scalar[p].i64 = iv; params[p] = &scalar[p]; break;
            case P_F32: scalar[p].f32 = (float)dv; params[p] = &scalar[p]; break;
            case P_F64: scalar[p].f64 = dv; params[p] = &scalar[p]; break;
            case P_BOOL: scalar[p].b = iv != 0; params[p] = &scalar[p]; break;
            case P_INPUT: c.check(api.get_data_ptr(t[op.pindex[p]], &ptrs[p]), "get_data_ptr"); params[p] = &ptrs[p]; break;
            case P_OUTPUT: c.check(api.get_data_ptr(c.out[op.pindex[p]], &ptrs[p]), "get_data_ptr"); params[p] = &ptrs[p]; break;
            case P_COUNT32:
                if (n > 0x7fffffffLL) c.fail(std::to_string(n) + " items do not fit the kernel's 32-bit count");
                params[p] = &n32; break;
            default: params[p] = &n64; break;
            }
        }
        void *stream = 0;
        if (op.device_type == 1) {
            int cur = -1;
            if (api.cuCtxGetDevice(&cur) != 0 || cur != dev) {  // the tensors' device, as the Python path does
                if (api.cuCtxPushCurrent(op.ctx[dev])) c.fail("cuCtxPushCurrent failed");
                c.pushed = 1;
            }
            c.check(api.current_cuda_stream(dev, &stream), "get_current_cuda_stream");  // read at every call
        }
        int r = api.cuLaunchKernel(fn, (unsigned)grid, 1, 1, block, 1, 1, 0, stream, params, 0);
        if (r) c.fail("cuLaunchKernel failed with CUresult " + std::to_string(r));
    }
    for (int k = 0; k < op.n_outs; k++) {
        stack[k] = (SIV)c.out[k];
        c.out[k] = 0;  // handed to torch
    }
}

}  // namespace

/* One boxed kernel per slot: osm_boxed<I> serves slot I (a template parameter, so that the
   table and the slot numbers cannot disagree). */
template <int I> void osm_boxed(SIV *s, uint64_t a, uint64_t o) { run(I, s, a, o); }
template <int... I> constexpr std::array<boxed_fn, sizeof...(I)> boxed_table(std::integer_sequence<int, I...>) {
    return {{&osm_boxed<I>...}};
}
static const std::array<boxed_fn, OSM_MAX_OPS> boxed = boxed_table(std::make_integer_sequence<int, OSM_MAX_OPS>{});

extern "C" {
__attribute__((visibility("default"))) int osm_abi(void) { return 2; }
__attribute__((visibility("default"))) int osm_max_ops(void) { return OSM_MAX_OPS; }

__attribute__((visibility("default"))) int osm_api_count(void) { return OSM_API_COUNT; }

/* The function table: OSM_API_COUNT addresses in the order of OSM_API. */
__attribute__((visibility("default"))) void osm_init(void *const *table) {
    memcpy((void *)&api, table, sizeof(api));
    api_ready = 1;
}

/* Describe op `slot`. arg_kind: n_args; like/odtype: n_outs; pkind/pindex: n_params (pindex: the
   argument or output a parameter takes); kdtype: n_kernels x n_params; ipt: n_kernels. */
__attribute__((visibility("default"))) int osm_describe(int slot, const char *name, int device_type, int n_args,
        const int *arg_kind, int n_outs, const int *like, const int32_t *odtype, int n_params, const int *pkind,
        const int *pindex, int n_kernels, const int32_t *kdtype, const int *ipt, int (*prepare)(int, int, int)) {
    if (slot < 0 || slot >= OSM_MAX_OPS || n_outs > OSM_MAX_TENSORS || n_args > OSM_MAX_TENSORS ||
        n_params > OSM_MAX_PARAMS || n_kernels > OSM_MAX_KERNELS || n_kernels < 1)
        return 1;
    osm_op &op = ops[slot];
    memset(&op, 0, sizeof(op));
    snprintf(op.name, sizeof(op.name), "%s", name);
    op.device_type = device_type;
    op.n_args = n_args;
    op.n_outs = n_outs;
    for (int i = 0; i < n_args; i++) op.arg_kind[i] = arg_kind[i];
    for (int k = 0; k < n_outs; k++) {
        if (like[k] < 0 || like[k] >= n_args || arg_kind[like[k]] != A_TENSOR) return 1;
        if (odtype[k] < -1 && (-2 - odtype[k] >= n_args || arg_kind[-2 - odtype[k]] != A_TENSOR)) return 1;
        op.like[k] = like[k];
        op.odtype[k] = odtype[k];
    }
    op.n_params = n_params;
    for (int p = 0; p < n_params; p++) { op.pkind[p] = pkind[p]; op.pindex[p] = pindex[p]; }
    op.n_kernels = n_kernels;
    for (int k = 0; k < n_kernels; k++) {
        if (ipt[k] < 1) return 1;
        op.ipt[k] = ipt[k];
        for (int p = 0; p < n_params; p++) op.kdtype[k][p] = kdtype[k * n_params + p];
    }
    op.prepare = prepare;
    op.used = 1;
    return 0;
}

/* The kernel's function, block size and the device's primary context (called by prepare). */
__attribute__((visibility("default"))) int osm_set_function(int slot, int kernel, int device, void *fn,
                                                           unsigned block, void *ctx) {
    if (slot < 0 || slot >= OSM_MAX_OPS || kernel < 0 || kernel >= OSM_MAX_KERNELS || device < 0 ||
        device >= OSM_MAX_DEVICES || block == 0)
        return 1;
    ops[slot].block[kernel][device] = block;
    ops[slot].ctx[device] = ctx;
    __atomic_store_n(&ops[slot].fn[kernel][device], fn, __ATOMIC_RELEASE);
    return 0;
}

__attribute__((visibility("default"))) void osm_set_error(int slot, const char *message) {
    if (slot >= 0 && slot < OSM_MAX_OPS) snprintf(ops[slot].error, sizeof(ops[slot].error), "%s", message);
}

/* Register slot's boxed kernel as `ns::opname` for `key` ("CUDA"); returns the torch error code. */
__attribute__((visibility("default"))) int osm_register(int slot, const char *ns, const char *opname,
                                                       const char *key) {
    if (!api_ready || slot < 0 || slot >= OSM_MAX_OPS || !ops[slot].used) return -1;
    void *lib = 0;  // kept for the process's life: torch's registration lasts as long
    ERR e = api.library_init_impl(ns, key, "opsmith_cshim", 0, &lib);
    if (e) return e;
    return api.library_impl(lib, opname, boxed[slot]);
}
}
