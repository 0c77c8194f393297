// opsmith.ops LayerNorm and RMSNorm over the last dimension (rows of `cols` elements).
//
//   layer_norm: y = (x - mean) * rstd * w + b,  rstd = 1 / sqrt(var + eps)  (biased variance)
//   rms_norm:   y = x * rstd * w,               rstd = 1 / sqrt(mean(x^2) + eps)
// The forward saves mean and rstd per row (in the accumulation type) for the backward:
//   layer_norm: grad_x = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)),  gw = grad_y * w,
//               xhat = (x - mean) * rstd
//   rms_norm:   grad_x = rstd * (gw - x * rstd^2 * mean(gw * x))  (+ grad_res, add_rms_norm's: has_res)
// grad_w and grad_b are column sums over the rows. The register-row backwards (*_bwd) are
// persistent: their blocks stride over the rows, read grad and x once, add each row's terms into
// per-thread sums and write one row of partial sums a block (part[gridDim.x][cols]), which
// norm_col_sum (norm_split.cu) adds up; after the long-row backwards, norm_bwd_weight's partials.
//
// The strategies are softmax.cu's: the row in registers (*_fwd, *_bwd here; tpr threads per
// row, tpr <= 32 is one warp per row), or one block per long row (*_long, in norm_long.cu) with
// the row copied into shared memory on the first pass when the launch gave room (`cache` = 1).
// The variance is the mean of squared deviations from the mean (two passes over the row), not
// E[x^2] - E[x]^2 (it cancels catastrophically for rows with a large mean); a pairwise merge of each
// thread's (count, mean, squared deviations) ran 13-31 % slower on an H100 (the merges' divisions).
// The shifted-data form, E[d^2] - E[d]^2 with d = x - x[0] in one reduction, was 0.5-6 % faster on
// 16-bit rows (H200) but lost fp16's tolerance on rows whose first element lies far out (its sums
// of d^2 carry the outlier's size; tests/ops/test_ops_gpu.py's hard rows): not kept.
// `has_w` / `has_b` = 0: no weight / bias (the pointer is then any tensor and is not read). An inf
// or NaN in a row makes it NaN, as torch on CUDA: layer_norm by itself (inf - inf), rms_norm by
// rms_inf_rows (mean(x^2) = inf alone would give rstd = 0 and outputs of 0).
#include "norm_fwd.cuh"
#include "norm_bwd.cuh"

using namespace opsmith;

// The register-row forwards' rows are norm_fwd.cuh's, the persistent backwards' rows norm_bwd.cuh's (they keep a
// thread's chunks of grad, x and the weight as loaded, in T: rows.cuh's OPSMITH_J / OPSMITH_E, room for the sums).

// The forwards of 4 chunks a thread, one row a block of at most OPSMITH_C4_THREADS (layer_norm_fwd_c4,
// rms_norm_fwd_c4; _launch_norm.norm_c4_plan: rows of 2 KiB to 16 KiB in whole 16-byte vectors, 16-bit
// types, and float for layer_norm): half the threads a row of the 2-chunk kernels, so fewer meet in
// each reduction, at up to 85 registers (3 blocks an SM, no spills). H200, kernels alone
// (bench/results/ops-fwd-c4-h200-2026-11-26/): bf16 layer_norm 65536 x 1024 3,208 -> 3,838 GB/s,
// 16384 x 2048 3,008 -> 3,493; rms_norm 16384 x 4096 3,914 -> 4,063; float rms_norm ran as fast either way.
#define OPSMITH_C4_THREADS 256

template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS, (RowBlocks<T, 2, 2>::value))
layer_norm_fwd(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b, T* __restrict__ y,
               A* __restrict__ mean, A* __restrict__ rstd, long long rows, int cols, A eps, int has_w,
               int has_b) {
    layer_norm_fwd_any<0>(x, w, b, y, mean, rstd, rows, cols, eps, has_w, has_b);
}

// layer_norm_fwd for rows of 256+ threads with 16-byte access (picked by _launch_norm.layer_norm_kernel
// and osm_ops.cpp): w and b read after the reductions, 3 blocks of 512 threads an SM. H200
// (bench/results/ops-fwd-h200-2026-11-26/fwd-layer-norm-variants.json): bf16 8192 x 8192 2,531 ->
// 2,967 GB/s, fp32 16384 x 4096 2,846 -> 3,614; slower on narrower rows and on the element path (it
// spills there), which layer_norm_fwd keeps. Correct for any row. Since layer_norm_fwd_c4 (2 to 16 KiB
// rows) and the L2 rows (16 KiB and more), which both measured faster, the 2- and 4-byte rows of 256+
// threads in whole vectors take those: this kernel serves float64's.
template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS, (RowBlocks<T, 3, 3>::value))
layer_norm_fwd_wide(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b, T* __restrict__ y,
                    A* __restrict__ mean, A* __restrict__ rstd, long long rows, int cols, A eps, int has_w,
                    int has_b) {
    layer_norm_fwd_any<1>(x, w, b, y, mean, rstd, rows, cols, eps, has_w, has_b);
}

// layer_norm_fwd with 4 chunks a thread (twice the row of one block): fp32 rows of 4,097-8,192 in
// whole vectors (_launch_norm.layer_norm_fwd4_plan), which 2-block clusters served with two cluster
// reductions a row. H200, fp32 8192 x 8192: 2,800 -> 3,909 GB/s (bench/diag_ln_fwd4.py); 16-bit rows
// ran slower this way (bf16 4096 x 16384: 1,948 GB/s against 2,573) and keep the clusters.
template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_C4_THREADS, (RowBlocks<T, 3, 3>::value))
layer_norm_fwd_c4(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b, T* __restrict__ y,
                  A* __restrict__ mean, A* __restrict__ rstd, long long rows, int cols, A eps, int has_w, int has_b) {
    layer_norm_fwd_any<1, T, A, 4>(x, w, b, y, mean, rstd, rows, cols, eps, has_w, has_b);
}

// layer_norm_fwd_c4's rows that fill their threads' chunks, every pointer 16-byte aligned (the caller's test:
// _launch.full_rows): the unchecked row alone. H100, L2 flushed (bench/diag_full_rows.py): bf16 1.00-1.02x. w and b
// are read a chunk at a time in the output loop (LATE = 2: 56 registers where reading them all after the reductions
// holds 80; one H100 run, ln_full4w: 4096 x 4096 1.016x, 2048 x 8192 1.006x, 16384 x 4096 0.995x).
template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_C4_THREADS, (RowBlocks<T, 3, 3>::value))
layer_norm_fwd_c4_full(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b, T* __restrict__ y,
                       A* __restrict__ mean, A* __restrict__ rstd, long long rows, int cols, A eps, int has_w,
                       int has_b) {
    layer_norm_fwd_row<ROW_FULL, 2, T, A, 4>(x, w, b, y, mean, rstd, rows, cols, eps, has_w, has_b);
}

// layer_norm_fwd's 16-bit rows of 2 to 4 KiB that fill its 2 chunks a thread, every pointer 16-byte aligned
// (_launch_norm.layer_norm_full2_plan, where norm_c4_plan would give them layer_norm_fwd_c4_full): the unchecked row
// alone, w and b read with x, 56 registers (80 at 4 chunks). H100, L2 flushed (bench/diag_full_rows.py, ln_full2
// against the op's c4 kernel, two runs): bf16 2048 x 2048 1.09-1.12x, 2048 x 1024 1.04x, 65536 x 1024 1.01x,
// 16384 x 2048 1.00x, 512 x 1024 0.98x (a 6 us call); from 4 KiB it ran 0.82-0.94x.
template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS, (RowBlocks<T, 2, 2>::value))
layer_norm_fwd_full(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b, T* __restrict__ y,
                    A* __restrict__ mean, A* __restrict__ rstd, long long rows, int cols, A eps, int has_w,
                    int has_b) {
    layer_norm_fwd_row<ROW_FULL, 0, T, A>(x, w, b, y, mean, rstd, rows, cols, eps, has_w, has_b);
}

// The forwards of 8 chunks a thread, one row a block of at most OPSMITH_C4_THREADS, 2 blocks an SM (128
// registers; layer_norm's 16-bit rows spill 152 bytes): rows of 16 to 32 KiB in whole 16-byte vectors of 2- and
// 4-byte types (_launch_norm.norm_c8_plan) in one pass, where the L2 rows (norm_l2.cu) read them twice. H100,
// kernels alone (bench/results/ops-small-bwd-h100-2026-11-27/long1.json), GB/s L2 rows -> these: bf16 rms_norm
// 4096 x 16384 2,869 -> 3,052 (Liger-Kernel 3,046), layer_norm 2,800 -> 2,873; float 8192 x 8192 rms_norm
// 2,889 -> 3,039, layer_norm 2,866 -> 3,014. At 64 KiB (512 threads of 8 chunks) they gained 0.6-2.3 % for
// rms_norm and lost 10 % for bf16 layer_norm (it spills 488 bytes): those rows keep the L2 rows.
template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_C4_THREADS, 2)
layer_norm_fwd_c8(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b, T* __restrict__ y,
                  A* __restrict__ mean, A* __restrict__ rstd, long long rows, int cols, A eps, int has_w, int has_b) {
    layer_norm_fwd_any<1, T, A, 8>(x, w, b, y, mean, rstd, rows, cols, eps, has_w, has_b);
}

template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS, (RowBlocks<T, 2, 2>::value))
layer_norm_fwd4(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b, T* __restrict__ y,
                A* __restrict__ mean, A* __restrict__ rstd, long long rows, int cols, A eps, int has_w, int has_b) {
    layer_norm_fwd_any<0, T, A, 4>(x, w, b, y, mean, rstd, rows, cols, eps, has_w, has_b);
}

template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS, OPSMITH_ROW_BWD_BLOCKS)
layer_norm_bwd(const T* __restrict__ grad_y, const T* __restrict__ x, const T* __restrict__ w,
               const A* __restrict__ mean, const A* __restrict__ rstd, T* __restrict__ grad_x,
               A* __restrict__ dw_part, A* __restrict__ db_part, long long rows, int cols, int has_w, int want_w,
               int want_b, T* __restrict__ grad_w, T* __restrict__ grad_b, int direct) {
    layer_norm_bwd_rows<T, A, false>(grad_y, x, w, mean, rstd, grad_x, dw_part, db_part, rows, cols, has_w, want_w,
                                     want_b, grad_w, grad_b, direct, nullptr);
}

template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS, OPSMITH_ROW_BWD_BLOCKS)
layer_norm_bwd_res(const T* __restrict__ grad_y, const T* __restrict__ x, const T* __restrict__ w,
                   const A* __restrict__ mean, const A* __restrict__ rstd, T* __restrict__ grad_x,
                   A* __restrict__ dw_part, A* __restrict__ db_part, long long rows, int cols, int has_w, int want_w,
                   int want_b, T* __restrict__ grad_w, T* __restrict__ grad_b, int direct,
                   const T* __restrict__ grad_res) {
    layer_norm_bwd_rows<T, A, true>(grad_y, x, w, mean, rstd, grad_x, dw_part, db_part, rows, cols, has_w, want_w,
                                    want_b, grad_w, grad_b, direct, grad_res);
}


template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS, (RowBlocks<T, 3, 3>::value))
rms_norm_fwd(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, A* __restrict__ rstd,
             long long rows, int cols, A eps, int has_w) {
    rms_norm_fwd_any(x, w, y, rstd, rows, cols, eps, has_w);
}

template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_C4_THREADS, (RowBlocks<T, 3, 3>::value))
rms_norm_fwd_c4(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, A* __restrict__ rstd,
                long long rows, int cols, A eps, int has_w) {
    rms_norm_fwd_any<T, A, 4>(x, w, y, rstd, rows, cols, eps, has_w);
}

// rms_norm_fwd_c4's full rows, as layer_norm_fwd_c4_full's: bf16 1.00-1.04x (bench/diag_full_rows.py). At 4 blocks of
// 256 an SM (63 registers, no spills, where 3 give 72) it read 1.00-1.012x in one run and 0.996-1.012x in the next
// (bench/results/ops-c4-bounds-h100-2026-11-27/, rms_full4b): the noise, so the bounds stay
template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_C4_THREADS, (RowBlocks<T, 3, 3>::value))
rms_norm_fwd_c4_full(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, A* __restrict__ rstd,
                     long long rows, int cols, A eps, int has_w) {
    rms_norm_fwd_row<ROW_FULL, T, A, 4>(x, w, y, rstd, rows, cols, eps, has_w);
}

template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_C4_THREADS, 2)
rms_norm_fwd_c8(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, A* __restrict__ rstd,
                long long rows, int cols, A eps, int has_w) {
    rms_norm_fwd_any<T, A, 8>(x, w, y, rstd, rows, cols, eps, has_w);
}

template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS, OPSMITH_ROW_BWD_BLOCKS)
rms_norm_bwd(const T* __restrict__ grad_y, const T* __restrict__ x, const T* __restrict__ w,
             const A* __restrict__ rstd, T* __restrict__ grad_x, A* __restrict__ dw_part, long long rows, int cols,
             int has_w, int want_w, const T* __restrict__ grad_res, int has_res, T* __restrict__ grad_w, int direct) {
    rms_norm_bwd_rows<T, A>(grad_y, x, w, rstd, grad_x, dw_part, rows, cols, has_w, want_w, grad_res, has_res,
                            grad_w, direct);
}

// The 2-chunk persistent backwards with their weight-gradient sums and the weight in shared memory (as the 4-chunk
// ones hold them) at 96 registers a thread (ptxas, sm_90, no spills), so that two blocks of up to
// OPSMITH_BWD_SM_THREADS fit an SM where the kernels above (114-126 registers, bf16) hold one: rows of 288-320
// threads (_launch_bwd.norm_bwd_sm_plan), a row a block; layer_norm's for float rows only (16-bit: 0.96x).
template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_BWD_SM_THREADS, 2)
layer_norm_bwd_sm(const T* __restrict__ grad_y, const T* __restrict__ x, const T* __restrict__ w,
                  const A* __restrict__ mean, const A* __restrict__ rstd, T* __restrict__ grad_x,
                  A* __restrict__ dw_part, A* __restrict__ db_part, long long rows, int cols, int has_w, int want_w,
                  int want_b, T* __restrict__ grad_w, T* __restrict__ grad_b, int direct) {
    layer_norm_bwd_rows<T, A, false, OPSMITH_ROW_CHUNKS, true>(grad_y, x, w, mean, rstd, grad_x, dw_part, db_part,
                                                              rows, cols, has_w, want_w, want_b, grad_w, grad_b,
                                                              direct, nullptr);
}

template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_BWD_SM_THREADS, 2)
layer_norm_bwd_sm_res(const T* __restrict__ grad_y, const T* __restrict__ x, const T* __restrict__ w,
                      const A* __restrict__ mean, const A* __restrict__ rstd, T* __restrict__ grad_x,
                      A* __restrict__ dw_part, A* __restrict__ db_part, long long rows, int cols, int has_w,
                      int want_w, int want_b, T* __restrict__ grad_w, T* __restrict__ grad_b, int direct,
                      const T* __restrict__ grad_res) {
    layer_norm_bwd_rows<T, A, true, OPSMITH_ROW_CHUNKS, true>(grad_y, x, w, mean, rstd, grad_x, dw_part, db_part,
                                                             rows, cols, has_w, want_w, want_b, grad_w, grad_b,
                                                             direct, grad_res);
}

template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_BWD_SM_THREADS, 2)
rms_norm_bwd_sm(const T* __restrict__ grad_y, const T* __restrict__ x, const T* __restrict__ w,
                const A* __restrict__ rstd, T* __restrict__ grad_x, A* __restrict__ dw_part, long long rows, int cols,
                int has_w, int want_w, const T* __restrict__ grad_res, int has_res, T* __restrict__ grad_w,
                int direct) {
    rms_norm_bwd_rows<T, A, OPSMITH_ROW_CHUNKS, true>(grad_y, x, w, rstd, grad_x, dw_part, rows, cols, has_w, want_w,
                                                      grad_res, has_res, grad_w, direct);
}

// The backwards of 4 chunks a thread (_launch_bwd.norm_bwd_c4_plan): a row a block of up to OPSMITH_ROW_THREADS,
// rows twice as long as the 2-chunk kernels' (float 4,097-8,192 columns), which otherwise take two blocks of a
// cluster (norm_cluster.cu) and meet in distributed shared memory each row; one block an SM, the next row's
// grad and x in flight (twice the cluster blocks' bytes an SM).
template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS, 1)
rms_norm_bwd_c4(const T* __restrict__ grad_y, const T* __restrict__ x, const T* __restrict__ w,
                const A* __restrict__ rstd, T* __restrict__ grad_x, A* __restrict__ dw_part, long long rows, int cols,
                int has_w, int want_w, const T* __restrict__ grad_res, int has_res, T* __restrict__ grad_w,
                int direct) {
    rms_norm_bwd_rows<T, A, 4>(grad_y, x, w, rstd, grad_x, dw_part, rows, cols, has_w, want_w, grad_res, has_res,
                               grad_w, direct);
}

template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS, 1)
layer_norm_bwd_c4(const T* __restrict__ grad_y, const T* __restrict__ x, const T* __restrict__ w,
                  const A* __restrict__ mean, const A* __restrict__ rstd, T* __restrict__ grad_x,
                  A* __restrict__ dw_part, A* __restrict__ db_part, long long rows, int cols, int has_w, int want_w,
                  int want_b, T* __restrict__ grad_w, T* __restrict__ grad_b, int direct) {
    layer_norm_bwd_rows<T, A, false, 4>(grad_y, x, w, mean, rstd, grad_x, dw_part, db_part, rows, cols, has_w,
                                        want_w, want_b, grad_w, grad_b, direct, nullptr);
}

template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS, 1)
layer_norm_bwd_c4_res(const T* __restrict__ grad_y, const T* __restrict__ x, const T* __restrict__ w,
                      const A* __restrict__ mean, const A* __restrict__ rstd, T* __restrict__ grad_x,
                      A* __restrict__ dw_part, A* __restrict__ db_part, long long rows, int cols, int has_w,
                      int want_w, int want_b, T* __restrict__ grad_w, T* __restrict__ grad_b, int direct,
                      const T* __restrict__ grad_res) {
    layer_norm_bwd_rows<T, A, true, 4>(grad_y, x, w, mean, rstd, grad_x, dw_part, db_part, rows, cols, has_w,
                                       want_w, want_b, grad_w, grad_b, direct, grad_res);
}
