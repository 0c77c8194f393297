/* The kernel table, the functions Python hands over and the launch of opsmith.ops' C++
   implementations (osm_ops.cpp; one translation unit). */
#pragma once

#include <torch/extension.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "osm_ops_plan.h"

// every kernel of _sources.NATIVE_FILES (add_rms_norm's are listed, not launched: Python launches them)
#define OSM_OPS_KERNELS(X)                                                   \
    X(RELU_FWD, "elementwise.cu", "relu_fwd<{T}>")                            \
    X(RELU_BWD, "elementwise.cu", "relu_bwd<{T}>")                            \
    X(GELU_ERF_FWD, "elementwise.cu", "gelu_erf_fwd<{T}>")                    \
    X(GELU_ERF_BWD, "elementwise.cu", "gelu_erf_bwd<{T}>")                    \
    X(GELU_TANH_FWD, "elementwise.cu", "gelu_tanh_fwd<{T}>")                  \
    X(GELU_TANH_BWD, "elementwise.cu", "gelu_tanh_bwd<{T}>")                  \
    X(SILU_FWD, "elementwise.cu", "silu_fwd<{T}>")                            \
    X(SILU_BWD, "elementwise.cu", "silu_bwd<{T}>")                            \
    X(SOFTMAX_FWD, "softmax.cu", "softmax_fwd<{T}>")                          \
    X(SOFTMAX_FWD_FULL, "softmax.cu", "softmax_fwd_full<{T}>")                \
    X(SOFTMAX_FWD_LONG, "softmax.cu", "softmax_fwd_long<{T}>")                \
    X(SOFTMAX_FWD_WIDE, "softmax.cu", "softmax_fwd_wide<{T}, 4>")             \
    X(SOFTMAX_FWD_WIDEF, "softmax.cu", "softmax_fwd_wide_full<{T}>")          \
    X(SOFTMAX_FWD_WIDE3, "softmax.cu", "softmax_fwd_wide3<{T}>")              \
    X(SOFTMAX_FWD_WIDE3F, "softmax.cu", "softmax_fwd_wide3_full<{T}>")        \
    X(SOFTMAX_BWD, "softmax.cu", "softmax_bwd<{T}>")                          \
    X(SOFTMAX_BWD_LONG, "softmax.cu", "softmax_bwd_long<{T}>")                \
    X(SOFTMAX_BWD_WIDE, "softmax.cu", "softmax_bwd_wide<{T}, 4>")             \
    X(SOFTMAX_FWD_WIDE8, "softmax.cu", "softmax_fwd_wide<{T}, 8>")            \
    X(SOFTMAX_BWD_WIDE8, "softmax.cu", "softmax_bwd_wide<{T}, 8>")            \
    X(SOFTMAX_BWD_WIDE8S, "softmax.cu", "softmax_bwd_wide_sm<{T}, 8>")        \
    X(SOFTMAX_FWD_CL2, "softmax_cluster.cu", "softmax_fwd_cluster<2, 2, {T}>") \
    X(SOFTMAX_FWD_CL2W, "softmax_cluster.cu", "softmax_fwd_cluster<2, 4, {T}>") \
    X(SOFTMAX_FWD_CL4W, "softmax_cluster.cu", "softmax_fwd_cluster<4, 4, {T}>") \
    X(SOFTMAX_BWD_CL2, "softmax_cluster.cu", "softmax_bwd_cluster<2, 2, {T}>") \
    X(SOFTMAX_BWD_CL2W, "softmax_cluster.cu", "softmax_bwd_cluster<2, 4, {T}>") \
    X(LN_FWD, "norm.cu", "layer_norm_fwd<{T}, {A}>")                          \
    X(LN_FWD_LONG, "norm_long.cu", "layer_norm_fwd_long<{T}, {A}>")           \
    X(LN_FWD_WIDE, "norm.cu", "layer_norm_fwd_wide<{T}, {A}>")                \
    X(LN_FWD4, "norm.cu", "layer_norm_fwd4<{T}, {A}>")                        \
    X(LN_FWD_C4, "norm.cu", "layer_norm_fwd_c4<{T}, {A}>")                    \
    X(LN_FWD_C4F, "norm.cu", "layer_norm_fwd_c4_full<{T}, {A}>")              \
    X(LN_FWD_FULL, "norm.cu", "layer_norm_fwd_full<{T}, {A}>")                \
    X(LN_FWD_C8, "norm.cu", "layer_norm_fwd_c8<{T}, {A}>")                    \
    X(LN_BWD, "norm.cu", "layer_norm_bwd<{T}, {A}>")                          \
    X(LN_BWD_RES, "norm.cu", "layer_norm_bwd_res<{T}, {A}>")                  \
    X(LN_BWD_C4, "norm.cu", "layer_norm_bwd_c4<{T}, {A}>")                    \
    X(LN_BWD_C4_RES, "norm.cu", "layer_norm_bwd_c4_res<{T}, {A}>")            \
    X(LN_BWD_SM, "norm.cu", "layer_norm_bwd_sm<{T}, {A}>")                    \
    X(LN_BWD_SM_RES, "norm.cu", "layer_norm_bwd_sm_res<{T}, {A}>")            \
    X(LN_BWD_LONG, "norm_long.cu", "layer_norm_bwd_long<{T}, {A}>")           \
    X(LN_BWD_LONG_RES, "norm_long.cu", "layer_norm_bwd_long_res<{T}, {A}>")   \
    X(RMS_FWD, "norm.cu", "rms_norm_fwd<{T}, {A}>")                           \
    X(RMS_FWD_C4, "norm.cu", "rms_norm_fwd_c4<{T}, {A}>")                     \
    X(RMS_FWD_C4F, "norm.cu", "rms_norm_fwd_c4_full<{T}, {A}>")               \
    X(RMS_FWD_C8, "norm.cu", "rms_norm_fwd_c8<{T}, {A}>")                     \
    X(RMS_FWD_LONG, "norm_long.cu", "rms_norm_fwd_long<{T}, {A}>")            \
    X(RMS_BWD, "norm.cu", "rms_norm_bwd<{T}, {A}>")                           \
    X(RMS_BWD_C4, "norm.cu", "rms_norm_bwd_c4<{T}, {A}>")                     \
    X(RMS_BWD_SM, "norm.cu", "rms_norm_bwd_sm<{T}, {A}>")                     \
    X(RMS_BWD_LONG, "norm_long.cu", "rms_norm_bwd_long<{T}, {A}>")            \
    X(NORM_BWD_WEIGHT, "norm_split.cu", "norm_bwd_weight<{T}, {A}>")         \
    X(NORM_BWD_WEIGHT_CL, "norm_split.cu", "norm_bwd_weight_cluster<{T}, {A}>") \
    X(NORM_COL_SUM, "norm_split.cu", "norm_col_sum<{T}, {A}>")              \
    X(LN_FWD_CL2, "norm_cluster.cu", "layer_norm_fwd_cluster<2, 2, {T}, {A}>") \
    X(LN_FWD_CL2W, "norm_cluster.cu", "layer_norm_fwd_cluster<2, 4, {T}, {A}>") \
    X(LN_BWD_CL2, "norm_cluster.cu", "layer_norm_bwd_cluster<2, {T}, {A}>") \
    X(LN_BWD_CL8, "norm_cluster.cu", "layer_norm_bwd_cluster<8, {T}, {A}>") \
    X(LN_BWD_CL2_RES, "norm_cluster.cu", "layer_norm_bwd_cluster_res<2, {T}, {A}>") \
    X(LN_BWD_CL8_RES, "norm_cluster.cu", "layer_norm_bwd_cluster_res<8, {T}, {A}>") \
    X(RMS_FWD_CL2, "norm_cluster.cu", "rms_norm_fwd_cluster<2, 2, {T}, {A}>") \
    X(RMS_FWD_CL2W, "norm_cluster.cu", "rms_norm_fwd_cluster<2, 4, {T}, {A}>") \
    X(ADD_RMS_FWD_CL2, "norm_cluster.cu", "add_rms_norm_fwd_cluster<2, 2, {T}, {A}>") \
    X(ADD_RMS_FWD_CL2W, "norm_cluster.cu", "add_rms_norm_fwd_cluster<2, 4, {T}, {A}>") \
    X(RMS_BWD_CL2, "norm_cluster.cu", "rms_norm_bwd_cluster<2, {T}, {A}>")  \
    X(RMS_BWD_CL8, "norm_cluster.cu", "rms_norm_bwd_cluster<8, {T}, {A}>")  \
    X(LN_BWD_DX, "norm_split.cu", "layer_norm_bwd_dx<{T}, {A}>")              \
    X(RMS_BWD_DX, "norm_split.cu", "rms_norm_bwd_dx<{T}, {A}>")              \
    X(LN_BWD_SMALL, "norm_small.cu", "layer_norm_bwd_small<{T}, {A}>")        \
    X(RMS_BWD_SMALL, "norm_small.cu", "rms_norm_bwd_small<{T}, {A}>")         \
    X(LN_FWD_L2, "norm_l2.cu", "layer_norm_fwd_l2<2, {T}, {A}>")              \
    X(LN_FWD_L2_ONE, "norm_l2.cu", "layer_norm_fwd_l2<1, {T}, {A}>")          \
    X(RMS_FWD_L2, "norm_l2.cu", "rms_norm_fwd_l2<2, {T}, {A}>")               \
    X(RMS_FWD_L2_ONE, "norm_l2.cu", "rms_norm_fwd_l2<1, {T}, {A}>")           \
    X(LN_FWD_L2_THREE, "norm_l2.cu", "layer_norm_fwd_l2<3, {T}, {A}>")        \
    X(RMS_FWD_L2_THREE, "norm_l2.cu", "rms_norm_fwd_l2<3, {T}, {A}>")         \
    X(ADD_RMS_FWD_L2, "norm_l2.cu", "add_rms_norm_fwd_l2<2, {T}, {A}>")       \
    X(ADD_RMS_FWD_L2_ONE, "norm_l2.cu", "add_rms_norm_fwd_l2<1, {T}, {A}>")   \
    X(ADD_LN_FWD_L2, "norm_l2.cu", "add_layer_norm_fwd_l2<2, {T}, {A}>")      \
    X(ADD_LN_FWD_L2_ONE, "norm_l2.cu", "add_layer_norm_fwd_l2<1, {T}, {A}>")

namespace {

#define OSM_ID(id, file, tmpl) id,
enum Kernel { OSM_OPS_KERNELS(OSM_ID) N_KERNELS };
#undef OSM_ID
#define OSM_FILE(id, file, tmpl) file,
const char *const kernel_file[] = {OSM_OPS_KERNELS(OSM_FILE)};
#undef OSM_FILE
#define OSM_TMPL(id, file, tmpl) tmpl,
const char *const kernel_template[] = {OSM_OPS_KERNELS(OSM_TMPL)};
#undef OSM_TMPL

constexpr int N_DTYPES = 4;      // float32, float16, bfloat16, float64 (_sources.DTYPES' order)
constexpr int MAX_DEVICES = 64;

struct Api {
    int (*launch)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **, void **);
    int (*ctx_get_device)(int *);
    int (*ctx_push)(void *);
    int (*ctx_pop)(void **);
    int32_t (*current_stream)(int32_t, void **);
    int (*active_clusters)(int *, void *, const void *);  // cuOccupancyMaxActiveClusters (null: not in the driver)
};
Api api;
bool ready = false;
Props props[MAX_DEVICES];
void *ctx[MAX_DEVICES];
std::atomic<void *> fns[N_KERNELS][N_DTYPES][MAX_DEVICES];
int (*prepare)(int kernel, int dtype, int device) = nullptr;  // Python: load, then osm_ops_set_function
std::mutex prepare_mutex;
char prepare_error[512];

// -- helpers ---------------------------------------------------------------------------------------------
std::string dtype_text(at::ScalarType t) {
    switch (t) {
    case at::kFloat: return "torch.float32";
    case at::kDouble: return "torch.float64";
    case at::kHalf: return "torch.float16";
    case at::kBFloat16: return "torch.bfloat16";
    case at::kInt: return "torch.int32";
    case at::kLong: return "torch.int64";
    case at::kShort: return "torch.int16";
    case at::kChar: return "torch.int8";
    case at::kByte: return "torch.uint8";
    case at::kBool: return "torch.bool";
    default: return std::string("torch.") + c10::toString(t);
    }
}

int dtype_index(const at::Tensor &x, const char *op) {
    switch (x.scalar_type()) {
    case at::kFloat: return 0;
    case at::kHalf: return 1;
    case at::kBFloat16: return 2;
    case at::kDouble: return 3;
    default:
        TORCH_CHECK_VALUE(false, "opsmith.ops.", op, ": CUDA tensors of dtype ", dtype_text(x.scalar_type()),
                    " are not supported; use float32, float16, bfloat16 or float64 (x.float() converts)");
    }
    return -1;
}

int device_of(const at::Tensor &x, const char *op) {
    TORCH_CHECK_VALUE(x.is_cuda(), "opsmith.ops.", op, ": expected a CUDA tensor, got one on ", x.device());
    const int dev = x.get_device();
    TORCH_CHECK_VALUE(dev >= 0 && dev < MAX_DEVICES, "opsmith.ops.", op, ": cuda:", dev, " is beyond the ", MAX_DEVICES,
                " devices of opsmith's native ops; set OPSMITH_OPS_NATIVE=0 to use the Python implementations");
    return dev;
}

void same_device(const at::Tensor &t, const at::Tensor &x, const char *op, const char *what) {
    TORCH_CHECK_VALUE(t.device() == x.device(), "opsmith.ops.", op, ": ", what, " is on ", t.device(), " and x on ",
                x.device(), "; move them to one device");
}

// The CUfunction of (kernel, dtype) on dev; the first use asks Python to compile and load it.
void *function(int k, int dt, int dev) {
    void *fn = fns[k][dt][dev].load(std::memory_order_acquire);
    if (fn) return fn;
    std::lock_guard<std::mutex> lock(prepare_mutex);
    fn = fns[k][dt][dev].load(std::memory_order_acquire);
    if (fn) return fn;
    TORCH_CHECK(ready && prepare, "opsmith.ops: the native library was not initialised (osm_ops_init)");
    prepare_error[0] = 0;
    const int r = prepare(k, dt, dev);
    fn = fns[k][dt][dev].load(std::memory_order_acquire);
    TORCH_CHECK(r == 0 && fn, "opsmith.ops: loading kernel ", kernel_template[k], " of ", kernel_file[k],
                " on cuda:", dev, " failed: ", prepare_error[0] ? prepare_error : "no function was set");
    return fn;
}

struct CtxGuard {  // the tensors' device current, as the Python path does
    bool pushed = false;
    explicit CtxGuard(int dev) {
        int cur = -1;
        if (api.ctx_get_device(&cur) != 0 || cur != dev) {
            TORCH_CHECK(ctx[dev] && api.ctx_push(ctx[dev]) == 0, "opsmith.ops: cuCtxPushCurrent failed on cuda:", dev);
            pushed = true;
        }
    }
    ~CtxGuard() {
        void *ignored;
        if (pushed) api.ctx_pop(&ignored);
    }
};

void launch(int k, int dt, int dev, const Plan &p, void **params) {
    void *fn = function(k, dt, dev);
    TORCH_CHECK(p.gx <= 0x7fffffff && p.gy <= 65535, "opsmith.ops: ", kernel_template[k], ": grid (", p.gx, ", ",
                p.gy, ") is beyond the device's limits");
    CtxGuard guard(dev);
    void *stream = nullptr;
    TORCH_CHECK(api.current_stream(dev, &stream) == 0, "opsmith.ops: torch's current CUDA stream is unavailable");
    const int r = api.launch(fn, (unsigned)p.gx, (unsigned)p.gy, 1, (unsigned)p.bx, (unsigned)p.by, 1,
                             (unsigned)p.smem, stream, params, nullptr);
    TORCH_CHECK(r == 0, "opsmith.ops: cuLaunchKernel(", kernel_template[k], ") failed with CUresult ", r);
}

// CUlaunchConfig (cuda.h), for cuOccupancyMaxActiveClusters
struct ExConfig {
    unsigned gx, gy, gz, bx, by, bz, smem;
    void *stream, *attrs;
    unsigned n_attrs;
};
std::mutex held_mutex;
std::map<std::array<int64_t, 5>, int> held_clusters;  // (kernel, dtype, device, block, smem) -> clusters held at once

// _functional._resident: a persistent cluster plan of kernel k with no more clusters than the device holds at once (the
// driver's count, asked once a kernel, dtype, device and block): the clusters past it ran after the others
Plan resident(int k, int dt, int dev, Plan p) {
    if (p.strategy != S_CLUSTER || !api.active_clusters) return p;
    const std::array<int64_t, 5> key{k, dt, dev, p.bx, p.smem};
    int n = -1;
    {
        std::lock_guard<std::mutex> lock(held_mutex);
        const auto it = held_clusters.find(key);
        if (it != held_clusters.end()) n = it->second;
    }
    if (n < 0) {
        void *fn = function(k, dt, dev);
        CtxGuard guard(dev);
        const ExConfig cfg{(unsigned)p.gx, (unsigned)p.gy, 1, (unsigned)p.bx, (unsigned)p.by, 1, (unsigned)p.smem,
                           nullptr, nullptr, 0};
        if (api.active_clusters(&n, fn, &cfg) != 0) n = 0;
        std::lock_guard<std::mutex> lock(held_mutex);
        held_clusters[key] = n;
    }
    if (n > 0 && n < p.gx / p.cluster) p.gx = n * p.cluster;
    return p;
}

// the pointer allows 16-byte vector access (the kernels' aligned16)
bool aligned16(const void *p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// a kernel's `int cols` and the stats' dtype
int32_t cols32(int64_t cols, const char *op) {
    TORCH_CHECK_VALUE(cols <= std::numeric_limits<int32_t>::max(), "opsmith.ops.", op, ": rows of ", cols,
                " elements are longer than the kernels take (2**31 - 1)");
    return (int32_t)cols;
}

at::ScalarType stats_dtype(const at::Tensor &x) { return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat; }

// -- the norms' arguments -----------------------------------------------------------------------------
std::pair<int64_t, int64_t> rows_cols(const at::Tensor &x, at::IntArrayRef shape, const char *op) {
    const int64_t nd = (int64_t)shape.size();
    bool ok = nd <= x.dim();
    for (int64_t i = 0; ok && i < nd; i++) ok = x.size(x.dim() - nd + i) == shape[i];
    TORCH_CHECK_VALUE(ok, "opsmith.ops.", op, ": normalized_shape ", shape, " must be the last dims of the input, whose "
                "shape is ", x.sizes());
    int64_t cols = 1;
    for (int64_t s : shape) cols *= s;
    return {cols ? x.numel() / cols : 0, cols};
}

// weight, bias: the dtype and device of x, `cols` elements; made contiguous
at::Tensor param(const std::optional<at::Tensor> &t, const at::Tensor &x, int64_t cols, const char *op,
                 const char *what) {
    if (!t.has_value() || !t->defined()) return x;
    same_device(*t, x, op, what);
    TORCH_CHECK_VALUE(t->scalar_type() == x.scalar_type(), "opsmith.ops.", op, ": ", what, " has dtype ",
                dtype_text(t->scalar_type()), " and x ", dtype_text(x.scalar_type()), "; convert it with .to(x.dtype)");
    TORCH_CHECK_VALUE(t->numel() == cols, "opsmith.ops.", op, ": ", what, " has ", t->numel(), " elements; normalized_shape "
                "has ", cols);
    return t->contiguous();
}

bool given(const std::optional<at::Tensor> &t) { return t.has_value() && t->defined(); }

union Eps {  // the kernels' A eps: float, or double for float64
    float f;
    double d;
};
Eps eps_for(int dt, double eps) {
    Eps e;
    if (dt == 3) e.d = eps; else e.f = (float)eps;
    return e;
}

void check_stats(const at::Tensor &s, const at::Tensor &x, int64_t rows, const char *op, const char *what) {
    same_device(s, x, op, what);
    TORCH_CHECK_VALUE(s.scalar_type() == stats_dtype(x) && s.numel() == rows, "opsmith.ops.", op, ": ", what, " must hold ",
                rows, " values of ", dtype_text(stats_dtype(x)), " (the forward's); got ", s.numel(), " of ",
                dtype_text(s.scalar_type()));
}

double machine_eps(int dt) {
    switch (dt) {
    case 0: return std::numeric_limits<float>::epsilon();
    case 1: return 0.0009765625;  // float16: 2**-10
    case 2: return 0.0078125;     // bfloat16: 2**-7
    default: return std::numeric_limits<double>::epsilon();
    }
}

// The weight (and bias) gradients from rows of partial sums (pw, pb; nullptr where not wanted), added
// up by norm_col_sum in one launch and rounded to x's dtype, shaped `shape`: (grad_w, grad_b), an
// undefined tensor where not wanted
std::pair<at::Tensor, at::Tensor> col_sums(const at::Tensor &x, const at::Tensor *pw, const at::Tensor *pb, int cols,
                                           at::IntArrayRef shape, int dt, int dev) {
    at::Tensor dw, db;
    if (pw) dw = at::empty(shape, x.options());
    if (pb) db = at::empty(shape, x.options());
    const at::Tensor &first = pw ? *pw : *pb, &second = pb ? *pb : first;
    at::Tensor &o1 = pw ? dw : db, &o2 = pb ? db : o1;
    const Plan p = col_sum_plan(cols, pw && pb ? 2 : 1);
    void *ap = first.data_ptr(), *bp = second.data_ptr(), *op = o1.data_ptr(), *op2 = o2.data_ptr();
    int prows = (int)first.size(0);
    void *params[] = {&ap, &bp, &op, &op2, &prows, &cols};
    launch(NORM_COL_SUM, dt, dev, p, params);
    return {dw, db};
}

// The weight and bias gradients after the long-row and "split" norm backwards (_norms._weight_grads):
// norm_bwd_weight, in one chunk straight to the gradients, else partial sums per chunk of rows and col_sums
std::pair<at::Tensor, at::Tensor> weight_grads(const at::Tensor &g, const at::Tensor &x, const at::Tensor *mean,
                                               const at::Tensor &rstd, long long rows, int cols, bool want_w,
                                               bool want_b, at::IntArrayRef shape, int dt, int dev) {
    function(NORM_BWD_WEIGHT, dt, dev);
    const Plan p = weight_grad_plan(rows, cols, x.element_size(), props[dev]);
    at::Tensor dw = want_w ? at::empty(shape, x.options()) : at::Tensor();
    at::Tensor db = want_b ? at::empty(shape, x.options()) : at::Tensor();
    int per_chunk = (int)p.per_chunk, has_mean = mean != nullptr, ww = want_w, wb = want_b;
    void *gp = g.data_ptr(), *xp = x.data_ptr(), *mp = (mean ? *mean : rstd).data_ptr(), *rp = rstd.data_ptr();
    void *dwp = want_w ? dw.data_ptr() : xp, *dbp = want_b ? db.data_ptr() : xp;
    if (p.strategy == S_CLUSTER) {  // sm_90+: a cluster of chunks adds its sums up itself
        void *params[] = {&gp, &xp, &mp, &rp, &dwp, &dbp, &rows, &cols, &per_chunk, &has_mean, &ww, &wb};
        launch(NORM_BWD_WEIGHT_CL, dt, dev, p, params);
        return {dw, db};
    }
    const bool one = p.gy == 1;
    at::Tensor pw = want_w && !one ? at::empty({p.gy, (int64_t)cols}, rstd.options()) : rstd;
    at::Tensor pb = want_b && !one ? at::empty({p.gy, (int64_t)cols}, rstd.options()) : rstd;
    void *pwp = pw.data_ptr(), *pbp = pb.data_ptr();
    void *params[] = {&gp, &xp, &mp, &rp, &pwp, &pbp, &dwp, &dbp, &rows, &cols, &per_chunk, &has_mean, &ww, &wb};
    launch(NORM_BWD_WEIGHT, dt, dev, p, params);
    if (one) return {dw, db};
    return col_sums(x, want_w ? &pw : nullptr, want_b ? &pb : nullptr, cols, shape, dt, dev);
}

}  // namespace
