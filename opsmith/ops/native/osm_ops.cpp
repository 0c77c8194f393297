/* opsmith.ops' CUDA implementations in C++: the operators torch.ops.opsmith.* with no Python on
   the call path.

   One small torch C++ library per torch version (built once through the torch-extension
   profile and cached; see opsmith/ops/_native.py). It registers, for the CUDA key, the twelve
   operators whose schemas opsmith/ops/_register.py defines; each checks its arguments, makes
   its inputs contiguous, allocates its outputs with torch's allocator, picks the launch from
   the shape and the device (the plans of opsmith/ops/_launch.py, ported: a CPU test compares
   both on synthetic devices) and launches the NVRTC kernel of opsmith/ops/kernels on the
   current stream. No CUDA header: the driver's cuLaunchKernel and context functions and
   torch's current-stream function arrive as addresses in osm_ops_init, and Python compiles and
   loads each kernel the first time a (kernel, dtype, device) is used (the prepare callback),
   handing back its CUfunction and the device's properties.

   The kernel table (OSM_OPS_KERNELS) names each kernel by its file and template in
   opsmith/ops/_sources.py's FILES; the dtype order is _sources.DTYPES'. */
#include <torch/extension.h>

#include <torch/library.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <string>

#include "osm_ops_launch.h"
#include "osm_ops_composite.h"
#include "osm_ops_norm.h"
#include "osm_ops_plan.h"
#include "osm_ops_python.h"

namespace {

// -- elementwise -----------------------------------------------------------------------------------------
at::Tensor ew_fwd(Kernel k, const at::Tensor &x_, const char *op) {
    const int dt = dtype_index(x_, op), dev = device_of(x_, op);
    at::Tensor x = x_.contiguous();
    at::Tensor y = at::empty(x.sizes(), x.options());
    long long n = x.numel();
    if (n) {
        function(k, dt, dev);  // the device's properties come with its first kernel
        const Plan p = elementwise_plan(n, x.element_size(), props[dev], k == GELU_ERF_FWD);  // _launch.ew_unrolled
        void *xp = x.data_ptr(), *yp = y.data_ptr();
        void *params[] = {&xp, &yp, &n};
        launch(k, dt, dev, p, params);
    }
    return y;
}

at::Tensor ew_bwd(Kernel k, const at::Tensor &grad, const at::Tensor &x_, const char *op) {
    const int dt = dtype_index(x_, op), dev = device_of(x_, op);
    same_device(grad, x_, op, "grad");
    TORCH_CHECK_VALUE(grad.sizes() == x_.sizes(), "opsmith.ops.", op, ": grad has shape ", grad.sizes(), " and x ",
                x_.sizes(), "; they must match");
    at::Tensor x = x_.contiguous();
    at::Tensor g = grad.contiguous().to(x.scalar_type());
    at::Tensor dx = at::empty(x.sizes(), x.options());
    long long n = x.numel();
    if (n) {
        function(k, dt, dev);
        const Plan p = elementwise_plan(n, x.element_size(), props[dev]);
        void *gp = g.data_ptr(), *xp = x.data_ptr(), *dp = dx.data_ptr();
        void *params[] = {&gp, &xp, &dp, &n};
        launch(k, dt, dev, p, params);
    }
    return dx;
}

at::Tensor relu(const at::Tensor &x) { return ew_fwd(RELU_FWD, x, "relu"); }
at::Tensor relu_backward(const at::Tensor &g, const at::Tensor &x) { return ew_bwd(RELU_BWD, g, x, "relu_backward"); }
at::Tensor silu(const at::Tensor &x) { return ew_fwd(SILU_FWD, x, "silu"); }
at::Tensor silu_backward(const at::Tensor &g, const at::Tensor &x) { return ew_bwd(SILU_BWD, g, x, "silu_backward"); }

bool gelu_tanh(c10::string_view approximate) {
    if (approximate == "none") return false;
    if (approximate == "tanh") return true;
    TORCH_CHECK_VALUE(false, "opsmith.ops.gelu: approximate must be 'none' or 'tanh', got '", std::string(approximate), "'");
    return false;
}
at::Tensor gelu(const at::Tensor &x, c10::string_view approximate) {
    return ew_fwd(gelu_tanh(approximate) ? GELU_TANH_FWD : GELU_ERF_FWD, x, "gelu");
}
at::Tensor gelu_backward(const at::Tensor &g, const at::Tensor &x, c10::string_view approximate) {
    return ew_bwd(gelu_tanh(approximate) ? GELU_TANH_BWD : GELU_ERF_BWD, g, x, "gelu_backward");
}

// -- softmax ---------------------------------------------------------------------------------------------
// The kernel of softmax's forward of plan p (_launch.softmax_fwd_kernel): softmax_fwd_wide3 for the wide rows of more
// than C4_THREADS up to WIDE3_THREADS threads (_launch.softmax_fwd_wide3), 2- and 4-byte types; the rows that fill their
// threads' chunks, x and y 16-byte aligned (_launch.full_rows), the kernel of the unchecked row alone
// (softmax_fwd_wide's up to C4_THREADS threads a row)
int softmax_fwd_kernel(const Plan &p, int64_t c, int64_t isz, bool aligned) {
    const bool wide_full = aligned && fills_chunks(p, c, isz, K[C_WIDE_CHUNKS]);
    const bool wide3 = p.strategy == S_WIDE && !p.chunks && (isz == 2 || isz == 4) && p.bx > K[C_C4_THREADS] &&
                       p.bx <= K[C_WIDE3_THREADS];
    const bool reg_full = aligned && fills_chunks(p, c, isz, K[C_ROW_CHUNKS]);
    return p.strategy == S_LONG      ? SOFTMAX_FWD_LONG
           : wide3                   ? (wide_full ? SOFTMAX_FWD_WIDE3F : SOFTMAX_FWD_WIDE3)
           : p.strategy == S_WIDE    ? (p.chunks == 2 * K[C_WIDE_CHUNKS]          ? SOFTMAX_FWD_WIDE8
                                        : wide_full && p.bx <= K[C_C4_THREADS] ? SOFTMAX_FWD_WIDEF
                                                                               : SOFTMAX_FWD_WIDE)
           : p.strategy == S_CLUSTER ? (p.chunks == K[C_ROW_CHUNKS] ? SOFTMAX_FWD_CL2
                                        : p.cluster == 4            ? SOFTMAX_FWD_CL4W
                                                                    : SOFTMAX_FWD_CL2W)
           : reg_full                ? SOFTMAX_FWD_FULL
                                     : SOFTMAX_FWD;
}

at::Tensor softmax_last(const at::Tensor &x_) {
    const int dt = dtype_index(x_, "softmax"), dev = device_of(x_, "softmax");
    at::Tensor x = x_.contiguous();
    at::Tensor y = at::empty(x.sizes(), x.options());
    if (x.numel()) {
        const int64_t c = x.dim() ? x.size(-1) : 1;
        long long rows = x.numel() / c;
        int cols = cols32(c, "softmax");
        function(SOFTMAX_FWD, dt, dev);
        const Plan p = softmax_plan(rows, c, x.element_size(), 1, props[dev]);
        void *xp = x.data_ptr(), *yp = y.data_ptr();
        int cache = p.cache;
        void *params[] = {&xp, &yp, &rows, &cols, &cache};
        const int k = softmax_fwd_kernel(p, c, x.element_size(), aligned16(xp) && aligned16(yp));
        launch(k, dt, dev, resident(k, dt, dev, p), params);  // (_functional._resident: cluster plans only)
    }
    return y;
}

at::Tensor softmax_backward_last(const at::Tensor &grad, const at::Tensor &y_) {
    const int dt = dtype_index(y_, "softmax_backward"), dev = device_of(y_, "softmax_backward");
    same_device(grad, y_, "softmax_backward", "grad");
    TORCH_CHECK_VALUE(grad.sizes() == y_.sizes(), "opsmith.ops.softmax_backward: grad has shape ", grad.sizes(), " and y ",
                y_.sizes(), "; they must match");
    at::Tensor y = y_.contiguous();
    at::Tensor g = grad.contiguous().to(y.scalar_type());
    at::Tensor dx = at::empty(y.sizes(), y.options());
    if (y.numel()) {
        const int64_t c = y.dim() ? y.size(-1) : 1;
        long long rows = y.numel() / c;
        int cols = cols32(c, "softmax_backward");
        function(SOFTMAX_BWD, dt, dev);
        const Plan p = softmax_plan(rows, c, y.element_size(), 2, props[dev]);
        void *gp = g.data_ptr(), *yp = y.data_ptr(), *dp = dx.data_ptr();
        int cache = p.cache;
        void *params[] = {&gp, &yp, &dp, &rows, &cols, &cache};
        const int k = p.strategy == S_LONG      ? SOFTMAX_BWD_LONG
                      : p.strategy == S_WIDE    ? (p.chunks == 2 * K[C_WIDE_CHUNKS]
                                                          ? (p.smem ? SOFTMAX_BWD_WIDE8S : SOFTMAX_BWD_WIDE8)
                                                          : SOFTMAX_BWD_WIDE)
                      : p.strategy == S_CLUSTER ? (p.chunks == K[C_ROW_CHUNKS] ? SOFTMAX_BWD_CL2 : SOFTMAX_BWD_CL2W)
                                                : SOFTMAX_BWD;
        launch(k, dt, dev, resident(k, dt, dev, p), params);
    }
    return dx;
}

int64_t softmax_dim(const at::Tensor &x, int64_t dim) {
    const int64_t nd = std::max<int64_t>(x.dim(), 1);
    TORCH_CHECK_VALUE(-nd <= dim && dim < nd, "opsmith.ops.softmax: dim ", dim, " is out of range for a ", x.dim(),
                "-d tensor");
    return ((dim % nd) + nd) % nd;
}

at::Tensor softmax(const at::Tensor &x, int64_t dim) {
    const int64_t d = softmax_dim(x, dim);
    if (x.dim() == 0 || d == x.dim() - 1) return softmax_last(x);
    return softmax_last(x.movedim(d, -1)).movedim(-1, d).contiguous();
}

at::Tensor softmax_backward(const at::Tensor &grad, const at::Tensor &y, int64_t dim) {
    const int64_t d = softmax_dim(y, dim);
    if (y.dim() == 0 || d == y.dim() - 1) return softmax_backward_last(grad, y);
    return softmax_backward_last(grad.movedim(d, -1), y.movedim(d, -1)).movedim(-1, d).contiguous();
}

std::unique_ptr<torch::Library> registration, composite;  // the kernels, for the process's life

}  // namespace

extern "C" {
__attribute__((visibility("default"))) int osm_ops_abi(void) { return 8; }
__attribute__((visibility("default"))) int osm_ops_kernel_count(void) { return N_KERNELS; }
__attribute__((visibility("default"))) const char *osm_ops_kernel_file(int k) {
    return k >= 0 && k < N_KERNELS ? kernel_file[k] : nullptr;
}
__attribute__((visibility("default"))) const char *osm_ops_kernel_template(int k) {
    return k >= 0 && k < N_KERNELS ? kernel_template[k] : nullptr;
}
__attribute__((visibility("default"))) int osm_ops_max_devices(void) { return MAX_DEVICES; }

/* fns: cuLaunchKernel, cuCtxGetDevice, cuCtxPushCurrent_v2, cuCtxPopCurrent_v2,
   aoti_torch_get_current_cuda_stream, cuOccupancyMaxActiveClusters (null where the driver lacks it);
   consts: N_CONSTS numbers (see the enum); prep: Python's loader. */
__attribute__((visibility("default"))) int osm_ops_init(void *const *f, const int64_t *consts, int n_consts,
                                                       int (*prep)(int, int, int)) {
    if (n_consts != N_CONSTS) return 1;
    for (int i = 0; i < N_CONSTS; i++) {
        if (consts[i] < 1) return 1;
        K[i] = consts[i];
    }
    api.launch = (decltype(api.launch))f[0];
    api.ctx_get_device = (decltype(api.ctx_get_device))f[1];
    api.ctx_push = (decltype(api.ctx_push))f[2];
    api.ctx_pop = (decltype(api.ctx_pop))f[3];
    api.current_stream = (decltype(api.current_stream))f[4];
    api.active_clusters = (decltype(api.active_clusters))f[5];
    prepare = prep;
    ready = true;
    return 0;
}

/* A device's properties and primary context (prepare calls this before its first function). */
__attribute__((visibility("default"))) int osm_ops_set_device(int dev, const int64_t *p, void *context) {
    if (dev < 0 || dev >= MAX_DEVICES) return 1;
    props[dev] = {p[0], p[1], p[2], p[3], p[4], p[5], p[6]};
    ctx[dev] = context;
    return 0;
}

__attribute__((visibility("default"))) int osm_ops_set_function(int k, int dt, int dev, void *fn) {
    if (k < 0 || k >= N_KERNELS || dt < 0 || dt >= N_DTYPES || dev < 0 || dev >= MAX_DEVICES || !fn) return 1;
    fns[k][dt][dev].store(fn, std::memory_order_release);
    return 0;
}

__attribute__((visibility("default"))) void osm_ops_set_error(const char *message) {
    snprintf(prepare_error, sizeof(prepare_error), "%s", message);
}

/* A plan, for tests: which 0 elementwise (rows = n, cols = 1: unrolled), 1 row, 2 weight gradients, 3 norm backward, 4 softmax, 5 and 6
   the norms' clusters (forward, backward), 7 layer_norm_fwd4, 8 the norms' l2 forwards, 9 their forwards of 4 chunks a thread, 10 their backwards of few rows, 11 their
   forwards of 8 chunks a thread, 12 layer_norm's full rows of 2 chunks, 13 the float backwards of 4 chunks, 14 the norm forwards by
   their rows' strategy (osm_ops_norm.h's fwd_plan), 15 the norm backwards at two blocks an SM. props: the seven numbers of
   osm_ops_set_device. out: strategy, gx, gy, bx, by, smem, cache, per_chunk, cluster, chunks. */
__attribute__((visibility("default"))) int osm_ops_plan(int which, int64_t rows, int64_t cols, int64_t itemsize,
                                                       int64_t arrays, const int64_t *p, int64_t *out) {
    const Props d{p[0], p[1], p[2], p[3], p[4], p[5], p[6]};
    if (itemsize < 1 || itemsize > 16) return 1;
    const Plan q = which == 0 ? elementwise_plan(rows, itemsize, d, cols == 1)
                 : which == 1 ? row_plan(rows, cols, itemsize, arrays, d)
                 : which == 2 ? weight_grad_plan(rows, cols, itemsize, d)
                 : which == 3 ? norm_bwd_plan(rows, cols, itemsize, d, arrays)
                 : which == 4 ? softmax_plan(rows, cols, itemsize, arrays, d)
                 : which == 7 ? layer_norm_fwd4_plan(rows, cols, itemsize, d)
                 : which == 8 ? norm_l2_plan(rows, cols, itemsize, d, arrays)
                 : which == 9 ? norm_c4_plan(rows, cols, itemsize, d, arrays)
                 : which == 10 ? norm_bwd_small_plan(rows, cols, itemsize, d)
                 : which == 11 ? norm_c8_plan(rows, cols, itemsize, d)
                 : which == 12 ? layer_norm_full2_plan(rows, cols, itemsize, d)
                 : which == 13 ? norm_bwd_c4_plan(rows, cols, itemsize, d, arrays)
                 : which == 14 ? fwd_plan(rows, cols, itemsize, d)
                 : which == 15 ? norm_bwd_sm_plan(rows, cols, itemsize, d, arrays)
                              : norm_cluster_plan(rows, cols, itemsize, d, which == 6);
    const int64_t v[] = {q.strategy, q.gx, q.gy, q.bx, q.by, q.smem, q.cache, q.per_chunk, q.cluster, q.chunks};
    for (int i = 0; i < 10; i++) out[i] = v[i];
    return 0;
}

/* The kernel id (osm_ops_kernel_template's) of softmax's forward of rows x cols of itemsize bytes, x and y 16-byte
   aligned or not, on a device of props p (the seven numbers of osm_ops_set_device), for tests; -1 for a bad itemsize. */
__attribute__((visibility("default"))) int osm_ops_softmax_fwd_kernel(int64_t rows, int64_t cols, int64_t itemsize,
                                                                     int aligned, const int64_t *p) {
    if (itemsize < 1 || itemsize > 16) return -1;
    const Props d{p[0], p[1], p[2], p[3], p[4], p[5], p[6]};
    return softmax_fwd_kernel(softmax_plan(rows, cols, itemsize, 1, d), cols, itemsize, aligned != 0);
}

/* Register the CUDA kernels of the opsmith namespace's twelve operators and the composite
   layer_norm_y / rms_norm_y (all defined by Python first); errors go to `err`. Once per process. */
__attribute__((visibility("default"))) int osm_ops_register(char *err, int err_len) {
    try {
        if (registration) return 0;
        auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "opsmith",
                                                    std::make_optional(c10::DispatchKey::CUDA), __FILE__, __LINE__);
        lib->impl("relu", TORCH_FN(relu));
        lib->impl("relu_backward", TORCH_FN(relu_backward));
        lib->impl("silu", TORCH_FN(silu));
        lib->impl("silu_backward", TORCH_FN(silu_backward));
        lib->impl("gelu", TORCH_FN(gelu));
        lib->impl("gelu_backward", TORCH_FN(gelu_backward));
        lib->impl("softmax", TORCH_FN(softmax));
        lib->impl("softmax_backward", TORCH_FN(softmax_backward));
        lib->impl("layer_norm", TORCH_FN(layer_norm));
        lib->impl("layer_norm_backward", TORCH_FN(layer_norm_backward));
        lib->impl("rms_norm", TORCH_FN(rms_norm));
        lib->impl("rms_norm_backward", TORCH_FN(rms_norm_backward));
        auto first = std::make_unique<torch::Library>(
            torch::Library::IMPL, "opsmith", std::make_optional(c10::DispatchKey::CompositeImplicitAutograd), __FILE__,
            __LINE__);
        first->impl("layer_norm_y", TORCH_FN(layer_norm_y));
        first->impl("rms_norm_y", TORCH_FN(rms_norm_y));
        registration = std::move(lib);
        composite = std::move(first);
        return 0;
    } catch (const std::exception &e) {
        snprintf(err, err_len, "%s", e.what());
        return 1;
    }
}
}
