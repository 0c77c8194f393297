/* layer_norm and rms_norm in C++ (opsmith/ops/_norms.py ported): the register rows (norm.cu, 2 chunks a
   thread or 4), the thread-block clusters (norm_cluster.cu, sm_90+), the long rows (norm_long.cu), the forwards' two
   passes over a row held in L2 (norm_l2.cu) and the backwards of few rows in one launch (norm_small.cu). Part of osm_ops.cpp's
   one translation unit. */
#pragma once

#include <torch/extension.h>

#include <optional>
#include <tuple>

#include "osm_ops_launch.h"
#include "osm_ops_plan.h"

namespace {

// the backward kernel of `first` (the K = 2 one; the K = 8 one follows) for a cluster plan's K
Kernel cluster_kernel(Kernel first, const Plan &p) { return static_cast<Kernel>(first + (p.cluster == 2 ? 0 : 1)); }

// _launch_norm.l2_kernel: norm_l2_plan's kernel of B = 2 (no chunks), 1 (blocks of L2_THREADS) or 3
Kernel l2_kernel(const Plan &l2, Kernel two, Kernel one, Kernel three) {
    return !l2.chunks ? two : l2.bx == K[C_L2_THREADS] ? one : three;
}

// _norms._fwd_plan: the register rows (at whole_warps), else the clusters, else the long rows
Plan fwd_plan(int64_t rows, int64_t cols, int64_t itemsize, const Props &d) {
    const Plan p = row_plan(rows, cols, itemsize, 1, d);
    if (p.strategy != S_LONG) return whole_warps(p, cols, itemsize);
    const Plan cl = norm_cluster_plan(rows, cols, itemsize, d, false);
    return cl.strategy == S_CLUSTER ? cl : p;
}

// _norms._bwd_plan: the 4-chunk rows and the rows at two blocks an SM where every pointer is aligned (`aligned`), the
// persistent register rows (or "split"), else the clusters, else the long rows
Plan bwd_plan(int64_t rows, int64_t cols, int64_t itemsize, const Props &d, int64_t arrays, bool aligned) {
    if (aligned) {
        const Plan c4 = norm_bwd_c4_plan(rows, cols, itemsize, d, arrays);
        if (c4.strategy != S_NONE) return c4;
        const Plan sm = norm_bwd_sm_plan(rows, cols, itemsize, d, arrays);
        if (sm.strategy != S_NONE) return sm;
    }
    const Plan p = norm_bwd_plan(rows, cols, itemsize, d, arrays);
    if (p.strategy != S_LONG) return p;
    const Plan cl = norm_cluster_plan(rows, cols, itemsize, d, true);
    return cl.strategy == S_CLUSTER ? cl : p;
}

// -- layer_norm and rms_norm -----------------------------------------------------------------------------
std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm(const at::Tensor &x_, at::IntArrayRef shape,
                                                          const std::optional<at::Tensor> &weight,
                                                          const std::optional<at::Tensor> &bias, double eps) {
    const char *op = "layer_norm";
    const int dt = dtype_index(x_, op), dev = device_of(x_, op);
    at::Tensor x = x_.contiguous();
    auto [r, c] = rows_cols(x, shape, op);
    at::Tensor y = at::empty(x.sizes(), x.options());
    at::Tensor mean = at::empty({r}, x.options().dtype(stats_dtype(x)));
    at::Tensor rstd = at::empty({r}, mean.options());
    if (r && c) {
        at::Tensor w = param(weight, x, c, op, "weight"), b = param(bias, x, c, op, "bias");
        long long rows = r;
        int cols = cols32(c, op), has_w = given(weight), has_b = given(bias), cache;
        function(LN_FWD, dt, dev);  // the device's properties come with its first kernel
        const Plan p = fwd_plan(r, c, x.element_size(), props[dev]);
        cache = p.cache;
        Eps e = eps_for(dt, eps);
        void *xp = x.data_ptr(), *wp = w.data_ptr(), *bp = b.data_ptr(), *yp = y.data_ptr();
        void *mp = mean.data_ptr(), *rp = rstd.data_ptr();
        void *params[] = {&xp, &wp, &bp, &yp, &mp, &rp, &rows, &cols, &e, &has_w, &has_b, &cache};
        // _launch_norm.layer_norm_kernel: the wide kernel for rows of LN_WIDE_TPR threads or more, 16-byte access
        const bool vec = cols % (16 / x.element_size()) == 0 && aligned16(xp) && aligned16(wp) && aligned16(bp) &&
                         aligned16(yp);
        const Kernel k = p.strategy == S_CLUSTER ? (p.chunks == K[C_ROW_CHUNKS] ? LN_FWD_CL2 : LN_FWD_CL2W)  // K = 2
                         : p.strategy == S_LONG ? LN_FWD_LONG
                         : vec && p.strategy == S_BLOCK && p.bx >= K[C_LN_WIDE_TPR] ? LN_FWD_WIDE : LN_FWD;
        const Plan l2 = norm_l2_plan(r, c, x.element_size(), props[dev], 2);  // rows of 16 KiB or more
        const Plan four = layer_norm_fwd4_plan(r, c, x.element_size(), props[dev]);  // float rows of 4,097-8,192
        const Plan c4 = norm_c4_plan(r, c, x.element_size(), props[dev], 2);  // rows of 2 to 16 KiB: first
        const Plan c8 = norm_c8_plan(r, c, x.element_size(), props[dev]);  // 16 to 32 KiB: one pass
        // _launch.full_rows: the 4-chunk rows that fill their threads' chunks, every pointer aligned
        const bool c4_full = vec && fills_chunks(c4, c, x.element_size(), 4);
        const Plan two = layer_norm_full2_plan(r, c, x.element_size(), props[dev]);  // 16-bit rows of 2 to 4 KiB
        if (two.strategy != S_NONE && vec) launch(LN_FWD_FULL, dt, dev, two, params);
        else if (c4.strategy != S_NONE) launch(c4_full ? LN_FWD_C4F : LN_FWD_C4, dt, dev, c4, params);
        else if (c8.strategy != S_NONE && vec) launch(LN_FWD_C8, dt, dev, c8, params);  // (no cache either)
        else if (l2.strategy != S_NONE && vec)
            launch(l2_kernel(l2, LN_FWD_L2, LN_FWD_L2_ONE, LN_FWD_L2_THREE), dt, dev, l2, params);
        else if (four.strategy != S_NONE) launch(LN_FWD4, dt, dev, four, params);
        else launch(k, dt, dev, resident(k, dt, dev, p), params);
    }
    return {y, mean, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward(
        const at::Tensor &grad, const at::Tensor &x_, at::IntArrayRef shape, const at::Tensor &mean,
        const at::Tensor &rstd, bool want_w, bool want_b, const std::optional<at::Tensor> &weight) {
    const char *op = "layer_norm_backward";
    const int dt = dtype_index(x_, op), dev = device_of(x_, op);
    same_device(grad, x_, op, "grad");
    TORCH_CHECK_VALUE(grad.sizes() == x_.sizes(), "opsmith.ops.", op, ": grad has shape ", grad.sizes(), " and x ",
                x_.sizes(), "; they must match");
    at::Tensor x = x_.contiguous();
    at::Tensor g = grad.contiguous().to(x.scalar_type());
    auto [r, c] = rows_cols(x, shape, op);
    check_stats(mean, x, r, op, "mean");
    check_stats(rstd, x, r, op, "rstd");
    at::Tensor dx = at::empty(x.sizes(), x.options());
    at::Tensor none = x.new_empty({0});
    if (!(r && c)) {
        at::Tensor z = at::zeros(shape, x.options());
        return {dx, want_w ? z : none, want_b ? z.clone() : none.clone()};
    }
    at::Tensor w = param(weight, x, c, op, "weight");
    at::Tensor m = mean.contiguous(), s = rstd.contiguous();
    long long rows = r;
    int cols = cols32(c, op), has_w = given(weight), cache;
    function(LN_BWD, dt, dev);
    void *gp = g.data_ptr(), *xp = x.data_ptr(), *wp = w.data_ptr(), *mp = m.data_ptr(), *rp = s.data_ptr();
    void *dp = dx.data_ptr();
    Plan p = bwd_plan(r, c, x.element_size(), props[dev], 2, aligned16(gp) && aligned16(xp) && aligned16(wp) &&
                      aligned16(dp));
    cache = p.cache;
    at::Tensor dw = none, db = none.clone();
    const Plan sp = norm_bwd_small_plan(r, c, x.element_size(), props[dev]);
    if (sp.strategy != S_NONE) {  // few rows: grad_x and the weight and bias gradients in one launch
        if (want_w) dw = at::empty(shape, x.options());
        if (want_b) db = at::empty(shape, x.options());
        void *dwp = want_w ? dw.data_ptr() : xp, *dbp = want_b ? db.data_ptr() : xp;
        int ww = want_w, wb = want_b, lanes = (int)sp.chunks;
        void *params[] = {&gp, &xp, &wp, &mp, &rp, &dp, &dwp, &dbp, &rows, &cols, &has_w, &ww, &wb, &lanes};
        launch(LN_BWD_SMALL, dt, dev, sp, params);
        return {dx, dw, db};
    }
    if (p.strategy == S_LONG || p.strategy == S_SPLIT) {  // grad_x alone, then the weights (norm_bwd_weight)
        if (p.strategy == S_LONG) {
            void *params[] = {&gp, &xp, &wp, &mp, &rp, &dp, &rows, &cols, &has_w, &cache};
            launch(LN_BWD_LONG, dt, dev, p, params);
        } else {  // "split"; with one row, its weight and bias gradients (elementwise) by the same kernel
            const bool one = rows == 1;
            if (one && want_w) dw = at::empty(shape, x.options());
            if (one && want_b) db = at::empty(shape, x.options());
            int one_w = one && want_w, one_b = one && want_b;
            void *dwp = one_w ? dw.data_ptr() : xp, *dbp = one_b ? db.data_ptr() : xp;
            void *params[] = {&gp, &xp, &wp, &mp, &rp, &dp, &rows, &cols, &has_w, &dwp, &dbp, &one_w, &one_b};
            launch(LN_BWD_DX, dt, dev, p, params);
            if (one) return {dx, dw, db};
        }
        if (want_w || want_b) {
            auto [sw, sb] = weight_grads(g, x, &m, s, rows, cols, want_w, want_b, shape, dt, dev);
            if (want_w) dw = sw;
            if (want_b) db = sb;
        }
        return {dx, dw, db};
    }
    // one row of partial sums a block (a cluster), or with one block (norm.cu's), the gradients themselves
    const Kernel kb = p.strategy == S_CLUSTER ? cluster_kernel(LN_BWD_CL2, p) : p.strategy == S_C4 ? LN_BWD_C4
                      : p.strategy == S_SM ? LN_BWD_SM : LN_BWD;
    p = resident(kb, dt, dev, p);
    int direct = p.strategy != S_CLUSTER && p.gx == 1;
    at::Tensor pw = want_w && !direct ? at::empty({p.gx / p.cluster, (int64_t)cols}, s.options()) : s;
    at::Tensor pb = want_b && !direct ? at::empty({p.gx / p.cluster, (int64_t)cols}, s.options()) : s;
    if (direct && want_w) dw = at::empty(shape, x.options());
    if (direct && want_b) db = at::empty(shape, x.options());
    void *pwp = pw.data_ptr(), *pbp = pb.data_ptr();
    void *dwp = direct && want_w ? dw.data_ptr() : xp, *dbp = direct && want_b ? db.data_ptr() : xp;
    int ww = want_w, wb = want_b;
    void *params[] = {&gp, &xp, &wp, &mp, &rp, &dp, &pwp, &pbp, &rows, &cols, &has_w, &ww, &wb, &dwp, &dbp, &direct};
    launch(kb, dt, dev, p, params);  // (the cluster kernel: 13 of them)
    if (direct) return {dx, dw, db};
    if (want_w || want_b) {
        auto [sw, sb] = col_sums(x, want_w ? &pw : nullptr, want_b ? &pb : nullptr, cols, shape, dt, dev);
        if (want_w) dw = sw;
        if (want_b) db = sb;
    }
    return {dx, dw, db};
}

std::tuple<at::Tensor, at::Tensor> rms_norm(const at::Tensor &x_, at::IntArrayRef shape,
                                            const std::optional<at::Tensor> &weight, std::optional<double> eps) {
    const char *op = "rms_norm";
    const int dt = dtype_index(x_, op), dev = device_of(x_, op);
    at::Tensor x = x_.contiguous();
    auto [r, c] = rows_cols(x, shape, op);
    at::Tensor y = at::empty(x.sizes(), x.options());
    at::Tensor rstd = at::empty({r}, x.options().dtype(stats_dtype(x)));
    if (r && c) {
        at::Tensor w = param(weight, x, c, op, "weight");
        long long rows = r;
        int cols = cols32(c, op), has_w = given(weight), cache;
        function(RMS_FWD, dt, dev);
        const Plan p = fwd_plan(r, c, x.element_size(), props[dev]);
        cache = p.cache;
        Eps e = eps_for(dt, eps.has_value() ? *eps : machine_eps(dt));
        void *xp = x.data_ptr(), *wp = w.data_ptr(), *yp = y.data_ptr(), *rp = rstd.data_ptr();
        void *params[] = {&xp, &wp, &yp, &rp, &rows, &cols, &e, &has_w, &cache};
        const Plan c4 = norm_c4_plan(r, c, x.element_size(), props[dev], 1);  // 16-bit rows of 2 to 16 KiB: first
        if (c4.strategy != S_NONE) {
            const bool full = aligned16(xp) && aligned16(wp) && aligned16(yp) &&
                              fills_chunks(c4, c, x.element_size(), 4);  // _launch.full_rows
            launch(full ? RMS_FWD_C4F : RMS_FWD_C4, dt, dev, c4, params);
            return {y, rstd};
        }
        const Plan c8 = norm_c8_plan(r, c, x.element_size(), props[dev]);  // 16 to 32 KiB: one pass
        if (c8.strategy != S_NONE && aligned16(xp) && aligned16(wp) && aligned16(yp)) {
            launch(RMS_FWD_C8, dt, dev, c8, params);  // (its kernel takes no cache)
            return {y, rstd};
        }
        const Plan l2 = norm_l2_plan(r, c, x.element_size(), props[dev], 1);  // _norms._l2_plan
        if (l2.strategy != S_NONE && aligned16(xp) && aligned16(wp) && aligned16(yp)) {
            launch(l2_kernel(l2, RMS_FWD_L2, RMS_FWD_L2_ONE, RMS_FWD_L2_THREE), dt, dev, l2, params);  // (no cache)
            return {y, rstd};
        }
        const Kernel k = p.strategy == S_CLUSTER ? (p.chunks == K[C_ROW_CHUNKS] ? RMS_FWD_CL2 : RMS_FWD_CL2W)  // K = 2
                         : p.strategy == S_LONG  ? RMS_FWD_LONG
                                                 : RMS_FWD;
        launch(k, dt, dev, resident(k, dt, dev, p), params);
    }
    return {y, rstd};
}

std::tuple<at::Tensor, at::Tensor> rms_norm_backward(const at::Tensor &grad, const at::Tensor &x_,
                                                     at::IntArrayRef shape, const at::Tensor &rstd, bool want_w,
                                                     const std::optional<at::Tensor> &weight) {
    const char *op = "rms_norm_backward";
    const int dt = dtype_index(x_, op), dev = device_of(x_, op);
    same_device(grad, x_, op, "grad");
    TORCH_CHECK_VALUE(grad.sizes() == x_.sizes(), "opsmith.ops.", op, ": grad has shape ", grad.sizes(), " and x ",
                x_.sizes(), "; they must match");
    at::Tensor x = x_.contiguous();
    at::Tensor g = grad.contiguous().to(x.scalar_type());
    auto [r, c] = rows_cols(x, shape, op);
    check_stats(rstd, x, r, op, "rstd");
    at::Tensor dx = at::empty(x.sizes(), x.options());
    if (!(r && c)) return {dx, want_w ? at::zeros(shape, x.options()) : x.new_empty({0})};
    at::Tensor w = param(weight, x, c, op, "weight");
    at::Tensor s = rstd.contiguous();
    long long rows = r;
    int cols = cols32(c, op), has_w = given(weight), cache;
    function(RMS_BWD, dt, dev);
    void *gp = g.data_ptr(), *xp = x.data_ptr(), *wp = w.data_ptr(), *rp = s.data_ptr(), *dp = dx.data_ptr();
    Plan p = bwd_plan(r, c, x.element_size(), props[dev], 1, aligned16(gp) && aligned16(xp) && aligned16(wp) &&
                      aligned16(dp));
    cache = p.cache;
    at::Tensor dw = x.new_empty({0});
    void *resp = xp;  // no gradient of a residual to add (add_rms_norm's, in Python)
    const Plan sp = norm_bwd_small_plan(r, c, x.element_size(), props[dev]);
    if (sp.strategy != S_NONE) {  // few rows: grad_x and the weight gradient in one launch
        if (want_w) dw = at::empty(shape, x.options());
        void *dwp = want_w ? dw.data_ptr() : xp;
        int ww = want_w, has_res = 0, lanes = (int)sp.chunks;
        void *params[] = {&gp, &xp, &wp, &rp, &dp, &dwp, &rows, &cols, &has_w, &ww, &resp, &has_res, &lanes};
        launch(RMS_BWD_SMALL, dt, dev, sp, params);
        return {dx, dw};
    }
    if (p.strategy == S_LONG || p.strategy == S_SPLIT) {  // grad_x alone, then the weight (norm_bwd_weight)
        int has_res = 0, one_w = p.strategy == S_SPLIT && rows == 1 && want_w;  // one row: dw by the same kernel
        if (one_w) dw = at::empty(shape, x.options());
        void *dwp = one_w ? dw.data_ptr() : xp;
        void *long_params[] = {&gp, &xp, &wp, &rp, &dp, &rows, &cols, &has_w, &cache};
        void *dx_params[] = {&gp, &xp, &wp, &rp, &dp, &rows, &cols, &has_w, &resp, &has_res, &dwp, &one_w};
        if (p.strategy == S_LONG) launch(RMS_BWD_LONG, dt, dev, p, long_params);
        else launch(RMS_BWD_DX, dt, dev, p, dx_params);
        if (want_w && !one_w) dw = weight_grads(g, x, nullptr, s, rows, cols, true, false, shape, dt, dev).first;
        return {dx, dw};
    }
    // the weight gradient's partial sums: one row a block (a cluster), or with one block (norm.cu's), the gradient
    const Kernel kb = p.strategy == S_CLUSTER ? cluster_kernel(RMS_BWD_CL2, p) : p.strategy == S_C4 ? RMS_BWD_C4
                      : p.strategy == S_SM ? RMS_BWD_SM : RMS_BWD;
    p = resident(kb, dt, dev, p);
    int direct = p.strategy != S_CLUSTER && p.gx == 1 && want_w;
    at::Tensor pw = want_w && !direct ? at::empty({p.gx / p.cluster, (int64_t)cols}, s.options()) : s;
    if (direct) dw = at::empty(shape, x.options());
    void *pwp = pw.data_ptr(), *dwp = direct ? dw.data_ptr() : xp;
    int ww = want_w, has_res = 0;
    void *params[] = {&gp, &xp, &wp, &rp, &dp, &pwp, &rows, &cols, &has_w, &ww, &resp, &has_res, &dwp, &direct};
    launch(kb, dt, dev, p, params);
    if (want_w && !direct) dw = col_sums(x, &pw, nullptr, cols, shape, dt, dev).first;
    return {dx, dw};
}

}  // namespace
