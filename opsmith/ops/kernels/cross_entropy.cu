// opsmith.ops cross-entropy over a vocabulary: logits [rows, V] (any float type), target [rows]
// (int64 class indices, `ignore_index` rows left out), per valid row
//   lse  = log(sum_j exp(x_j))
//   loss = (1 - eps) * (lse - x_target) + eps * (lse - mean_j x_j) + z * lse^2
// (eps: label smoothing, torch's definition; z: the z-loss coefficient, PaLM's lse^2 term),
// and 0 for an ignored row. The reduction (none, sum, mean over the valid rows) follows.
// The gradient of row r is
//   d loss / d x_j = scale_r * ((1 + 2 z lse) * softmax_j - eps / V - (1 - eps) * [j == target])
// with scale_r the upstream gradient (grad[r] for none, grad for sum, grad / n_valid for mean).
//
// Three kernels, math in float (double for double):
//  * cross_entropy_fwd: one read of the logits. A block of blockDim.x threads takes a work unit
//    (a row, or a chunk of `chunk` elements of it when rows are too few to fill the device) and
//    keeps per thread an online (max, sum of exp(x - max)) and the sum of x (for smoothing),
//    OPSMITH_CE_UNROLL 16-byte vectors in flight per thread, then merges them across the block.
//    A whole-row unit writes the row's lse and loss; a chunk writes its (max, sum, sum x) to
//    `part` for cross_entropy_finish. Rows need no alignment: each unit starts with single
//    elements up to a 16-byte boundary, then vectors, then the tail. Ignored rows are not read.
//  * cross_entropy_finish: one block. Merges the chunks of each row (when there are any), then
//    writes the per-row losses in T (none) or their sum / mean (a fixed-order sum: the same
//    result every run), and the number of valid rows (`count`, for the backward's mean).
//  * cross_entropy_bwd: one read of the logits and one write of the gradient, from the lse the
//    forward saved: softmax_j = exp(x_j - lse). No reduction, so a unit is a chunk of a row.
//    Ignored rows get zeros.
// A target outside [0, V) that is not ignore_index stops the kernel with a device-side
// assertion, as torch's own CUDA cross-entropy does (the CUDA context is unusable afterwards).
// inf and NaN: a NaN logit, a +inf logit or a row of only -inf makes the row's loss NaN.
//
// Kernels: cross_entropy_{fwd,finish,bwd}<T, A>, T in {float, double, __half, __nv_bfloat16},
// A the accumulation type (float; double for double).
#include "common.cuh"

// Threads a block of bwd and of fwd at most (opsmith/ops/_cross_entropy.py holds the same numbers),
// and the blocks an SM should hold: the register budget (fwd 64, bwd 40 a thread: 1024 and 1536
// threads an SM, OPSMITH_CE_UNROLL 16-byte loads in flight each). The forward's smaller blocks (128 x 8, not
// 256 x 4) ran 1.00-1.03x faster on an H100 (_cross_entropy.plan).
#ifndef OPSMITH_CE_THREADS
#define OPSMITH_CE_THREADS 256
#endif
#ifndef OPSMITH_CE_FWD_THREADS
#define OPSMITH_CE_FWD_THREADS 128
#endif
#ifndef OPSMITH_CE_FWD_BLOCKS
#define OPSMITH_CE_FWD_BLOCKS 8
#endif
#ifndef OPSMITH_CE_BWD_BLOCKS
#define OPSMITH_CE_BWD_BLOCKS 6
#endif
#ifndef OPSMITH_CE_UNROLL
#define OPSMITH_CE_UNROLL 4  // 16-byte vectors in flight per thread per trip
#endif
#ifndef OPSMITH_CE_FINISH_THREADS
#define OPSMITH_CE_FINISH_THREADS 1024
#endif

namespace opsmith {

__device__ __forceinline__ float m_log2(float x) { return log2f(x); }
__device__ __forceinline__ double m_log2(double x) { return log2(x); }
template <class A> __device__ __forceinline__ A ln2() { return A(0.6931471805599453); }

// A row (or chunk) of n elements at p, cut for 16-byte access: `head` single elements up to
// the first 16-byte boundary, `nvec` whole vectors from there, then single elements to n.
struct Cut {
    long long head, nvec, tail;  // tail: the index of the first element after the vectors
};

template <class T> __device__ __forceinline__ Cut cut16(const T* p, long long n) {
    constexpr int N = Vec<T>::N;
    long long head = (long long)(((16u - (unsigned)(reinterpret_cast<u64>(p) & 15u)) & 15u) / sizeof(T));
    if (head > n) head = n;
    const long long nvec = (n - head) / N;
    return {head, nvec, head + nvec * N};
}

// The online softmax statistics of the elements one thread has seen: max m, s = sum exp(x - m),
// sx = sum x (kept where SX: label smoothing needs it; else it stays 0, one add an element less). Elements arrive
// in groups (a trip's vectors): one rescale per group at most.
template <class A, bool SX = true> struct Online {
    A m, s, sx;
    __device__ __forceinline__ void start() { m = neg_inf<A>(); s = A(0); sx = A(0); }

    // Before a group is added, with g its max: m becomes max(m, g), s rescaled to it.
    __device__ __forceinline__ void raise(A g) {
        if (g > m) {  // false for a NaN g (m_max ignores NaN): NaN elements add NaN below
            // while m is -inf, s is 0 or NaN (a NaN seen): s * 0 keeps the NaN
            s = m == neg_inf<A>() ? s * A(0) : s * m_exp2((m - g) * log2e<A>());
            m = g;
        }
    }
    // An element of the group, after raise(), while m > -inf. exp(x - m) as exp2((x - m) log2 e):
    // x - m first, so that the largest terms (x near m) are nearly exact.
    __device__ __forceinline__ void add(A x) {
        s += m_exp2((x - m) * log2e<A>());
        if (SX) sx += x;
    }
    // An element while m is -inf: then every element so far is -inf or NaN. -inf adds 0
    // (exp(-inf - -inf) would be NaN), NaN adds NaN.
    __device__ __forceinline__ void add_at_neg_inf(A x) {
        s += x == neg_inf<A>() ? A(0) : x;
        if (SX) sx += x;
    }
    __device__ __forceinline__ void one(A x) {
        raise(x);
        if (m == neg_inf<A>()) add_at_neg_inf(x);
        else add(x);
    }
    // (m, s) of two parts as one; sx adds.
    __device__ __forceinline__ void merge(A m2, A s2, A sx2) {
        const A mm = m_max(m, m2);
        const A a = m == neg_inf<A>() ? s * A(0) : s * m_exp2((m - mm) * log2e<A>());  // 0, or a NaN kept
        const A b = m2 == neg_inf<A>() ? s2 * A(0) : s2 * m_exp2((m2 - mm) * log2e<A>());
        m = mm;
        s = a + b;
        sx += sx2;
    }
};

// One vector into a thread's statistics: its max, at most one rescale, then the exps.
// (Each element is converted twice rather than held: fewer registers, more blocks an SM.)
template <class T, class A, bool SX>
__device__ __forceinline__ void add_vec(Online<A, SX>& o, const Vec<T>& w) {
    constexpr int N = Vec<T>::N;
    A g = Elem<T>::load(w.v[0]);
#pragma unroll
    for (int k = 1; k < N; ++k) g = m_max(g, Elem<T>::load(w.v[k]));
    o.raise(g);
    if (o.m != neg_inf<A>()) {
#pragma unroll
        for (int k = 0; k < N; ++k) o.add(Elem<T>::load(w.v[k]));
    } else {
#pragma unroll
        for (int k = 0; k < N; ++k) o.add_at_neg_inf(Elem<T>::load(w.v[k]));
    }
}

// Every thread's statistics of elements [0, n) of p (the block's threads share them out).
template <class T, class A, bool SX>
__device__ __forceinline__ void scan(const T* __restrict__ p, long long n, Online<A, SX>& o) {
    constexpr int U = OPSMITH_CE_UNROLL;
    const int t = threadIdx.x, nt = blockDim.x;
    const Cut c = cut16(p, n);
    if (t < c.head) o.one(Elem<T>::load(p[t]));
    const Vec<T>* q = reinterpret_cast<const Vec<T>*>(p + c.head) + t;
    const Vec<T>* end = reinterpret_cast<const Vec<T>*>(p + c.head) + c.nvec;
    for (; q + (U - 1) * nt < end; q += U * nt) {  // whole trips: U vectors in flight
        Vec<T> w[U];
#pragma unroll
        for (int u = 0; u < U; ++u) w[u] = q[u * nt];
#pragma unroll
        for (int u = 0; u < U; ++u) add_vec<T, A, SX>(o, w[u]);
    }
    if (q < end) {  // the last trip, fewer than U vectors for this thread: still all loads first
        Vec<T> w[U];
#pragma unroll
        for (int u = 0; u < U; ++u)
            if (q + u * nt < end) w[u] = q[u * nt];
#pragma unroll
        for (int u = 0; u < U; ++u)
            if (q + u * nt < end) add_vec<T, A, SX>(o, w[u]);
    }
    const long long j = c.tail + t;
    if (j < n) o.one(Elem<T>::load(p[j]));  // fewer than N elements: one each for the first threads
}

// The block's statistics, in thread 0. Every thread of the block calls it.
template <class A, bool SX> __device__ __forceinline__ void block_merge(Online<A, SX>& o) {
    __shared__ A pm[32], ps[32], px[32];
    for (int d = 16; d > 0; d >>= 1)
        o.merge(__shfl_xor_sync(0xffffffffu, o.m, d), __shfl_xor_sync(0xffffffffu, o.s, d),
                __shfl_xor_sync(0xffffffffu, o.sx, d));
    const int warps = blockDim.x >> 5;
    if (warps == 1) return;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();  // the previous unit's readers are done with pm/ps/px
    if (lane == 0) { pm[warp] = o.m; ps[warp] = o.s; px[warp] = o.sx; }
    __syncthreads();
    if (warp == 0) {
        o.m = lane < warps ? pm[lane] : neg_inf<A>();
        o.s = lane < warps ? ps[lane] : A(0);
        o.sx = lane < warps ? px[lane] : A(0);
        for (int d = 16; d > 0; d >>= 1)
            o.merge(__shfl_xor_sync(0xffffffffu, o.m, d), __shfl_xor_sync(0xffffffffu, o.s, d),
                    __shfl_xor_sync(0xffffffffu, o.sx, d));
    }
}

// A valid row's loss (and its lse) from its statistics and its target's logit.
template <class A, bool SX>
__device__ __forceinline__ A row_loss(const Online<A, SX>& o, A x_target, long long V, A smoothing, A z_loss, A& lse) {
    lse = o.m + m_log2(o.s) * ln2<A>();  // a row of -inf: -inf + log(0) = -inf, and the loss NaN below
    A loss = lse - x_target;
    if (smoothing != A(0)) loss = (A(1) - smoothing) * loss + smoothing * (lse - o.sx / A(V));
    if (z_loss != A(0)) loss += z_loss * lse * lse;
    return loss;
}

__device__ __forceinline__ void check_target(long long t, long long V) {
    if (t < 0 || t >= V)
        __assertfail("opsmith.ops.cross_entropy: target in [0, V) or ignore_index", "cross_entropy.cu", __LINE__,
                     "cross_entropy", sizeof(char));
}

// d loss / d x for one logit x of a valid row, before the target's -c: a * softmax - b.
template <class A> __device__ __forceinline__ A grad_of(A x, A lse, A a, A b) {
    return a * m_exp2((x - lse) * log2e<A>()) - b;
}

// The gradient of one vector of logits; `off` is the index of its first element minus the
// target's (the target is element -off when 0 <= -off < N).
template <class T, class A>
__device__ __forceinline__ Vec<T> grad_vec(const Vec<T>& x, long long off, A lse, A a, A b, A c) {
    constexpr int N = Vec<T>::N;
    Vec<T> o;
#pragma unroll
    for (int k = 0; k < N; ++k) {
        const A d = grad_of(Elem<T>::load(x.v[k]), lse, a, b);
        o.v[k] = Elem<T>::store(off + k == 0 ? d - c : d);
    }
    return o;
}

}  // namespace opsmith

using namespace opsmith;

// Units are (row, chunk) pairs, `chunk` elements of a row each (chunk >= V: a unit is a row). SX: the rows' sums are
// kept (label smoothing); the caller takes <T, A, false> without smoothing, one add an element less.
template <class T, class A, bool SX>
__global__ void __launch_bounds__(OPSMITH_CE_FWD_THREADS, OPSMITH_CE_FWD_BLOCKS)
cross_entropy_fwd(const T* __restrict__ logits, const long long* __restrict__ target, A* __restrict__ part,
                  A* __restrict__ lse, A* __restrict__ loss, long long rows, long long V, long long chunk,
                  long long ignore_index, A smoothing, A z_loss) {
    const long long per_row = (V + chunk - 1) / chunk;
    for (long long unit = blockIdx.x; unit < rows * per_row; unit += gridDim.x) {
        const long long row = unit / per_row, lo = (unit - row * per_row) * chunk;
        const long long n = V - lo < chunk ? V - lo : chunk;
        const T* xr = logits + row * V;
        const long long t = target[row];
        const bool valid = t != ignore_index;
        A x_target = A(0);
        if (valid && threadIdx.x == 0) {
            check_target(t, V);
            if (per_row == 1) x_target = Elem<T>::load(xr[t]);  // issued now, used after the scan
        }
        Online<A, SX> o;
        o.start();
        if (valid) scan(xr + lo, n, o);  // uniform across the block
        block_merge(o);
        if (threadIdx.x == 0) {
            if (per_row == 1) {
                A l = A(0), r = A(0);
                if (valid) r = row_loss(o, x_target, V, smoothing, z_loss, l);
                lse[row] = l;
                loss[row] = r;
            } else {
                part[3 * unit] = o.m;
                part[3 * unit + 1] = o.s;
                part[3 * unit + 2] = o.sx;
            }
        }
    }
}

// mode: 0 none (out[rows] in T), 1 sum, 2 mean (out[0]). One block.
template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_CE_FINISH_THREADS)
cross_entropy_finish(const T* __restrict__ logits, const long long* __restrict__ target, const A* __restrict__ part,
                     A* __restrict__ lse, const A* __restrict__ loss, T* __restrict__ out, A* __restrict__ count,
                     long long rows, long long V, long long chunk, long long ignore_index, A smoothing, A z_loss,
                     int mode) {
    const long long per_row = (V + chunk - 1) / chunk;
    A sum = A(0);
    long long valid_rows = 0;
    if (per_row == 1) {  // the forward wrote each row's loss
#pragma unroll 8
        for (long long row = threadIdx.x; row < rows; row += blockDim.x) {
            const A r = loss[row];
            if (mode == 0) out[row] = Elem<T>::store(r);
            sum += r;
            valid_rows += target[row] != ignore_index ? 1 : 0;
        }
    } else {  // the forward wrote each chunk's statistics: merge them
        for (long long row = threadIdx.x; row < rows; row += blockDim.x) {
            const long long t = target[row];
            A l = A(0), r = A(0);
            if (t != ignore_index) {
                // the forward checked the target; never read out of bounds all the same. Loaded before the merges,
                // whose loads go 8 chunks at a time (H100, the op: 1 x 262144, 64 chunks, 22.2 -> 21.0 us; no change
                // at 8 x 128256, 32 chunks, or with fewer: bench/results/ops-ce-limits-h100-2026-11-27/ce_finish.json)
                const A xt = (t >= 0 && t < V) ? Elem<T>::load(logits[row * V + t]) : nonfinite(neg_inf<A>());
                Online<A> o;
                o.start();
                for (long long k = 0; k < per_row; k += 8) {
                    A q[8][3];
#pragma unroll
                    for (int u = 0; u < 8; ++u)
                        if (k + u < per_row)
                            for (int i = 0; i < 3; ++i) q[u][i] = part[3 * (row * per_row + k + u) + i];
#pragma unroll
                    for (int u = 0; u < 8; ++u)
                        if (k + u < per_row) o.merge(q[u][0], q[u][1], q[u][2]);
                }
                r = row_loss(o, xt, V, smoothing, z_loss, l);
                ++valid_rows;
            }
            lse[row] = l;
            if (mode == 0) out[row] = Elem<T>::store(r);
            sum += r;
        }
    }
    const int nt = blockDim.x;
    sum = row_allreduce(sum, SumOp(), A(0), nt);  // a fixed tree: the same sum every run
    valid_rows = row_allreduce(valid_rows, SumOp(), 0ll, nt);
    if (threadIdx.x == 0) {
        count[0] = A(valid_rows);
        if (mode == 1) out[0] = Elem<T>::store(sum);
        if (mode == 2) out[0] = Elem<T>::store(sum / A(valid_rows));  // no valid row: 0 / 0, NaN as torch
    }
}

// grad_loss: the upstream gradient (T; per row for mode 0, one value else); count: the valid
// rows (mode 2). Units are (row, chunk) pairs as in the forward.
template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_CE_THREADS, OPSMITH_CE_BWD_BLOCKS)
cross_entropy_bwd(const T* __restrict__ logits, const long long* __restrict__ target, const A* __restrict__ lse,
                  const T* __restrict__ grad_loss, const A* __restrict__ count, T* __restrict__ grad, long long rows,
                  long long V, long long chunk, long long ignore_index, A smoothing, A z_loss, int mode) {
    constexpr int N = Vec<T>::N, U = OPSMITH_CE_UNROLL;
    const int t = threadIdx.x, nt = blockDim.x;
    const long long per_row = (V + chunk - 1) / chunk;
    for (long long unit = blockIdx.x; unit < rows * per_row; unit += gridDim.x) {
        const long long row = unit / per_row, lo = (unit - row * per_row) * chunk;
        const long long n = V - lo < chunk ? V - lo : chunk;
        const T* xr = logits + row * V + lo;
        T* gr = grad + row * V + lo;
        const Cut cg = cut16(gr, n);
        Vec<T>* gv = reinterpret_cast<Vec<T>*>(gr + cg.head);
        // the row's values all at once (one latency, not one after the other); lse and the
        // gradient are there for an ignored row too
        const long long target_row = target[row];
        const A l = lse[row];
        const A g = Elem<T>::load(grad_loss[mode == 0 ? row : 0]);
        const A n_valid = mode == 2 ? count[0] : A(1);
        if (target_row == ignore_index) {  // zeros, the logits unread
            const T zero = Elem<T>::store(A(0));
            Vec<T> z;
#pragma unroll
            for (int k = 0; k < N; ++k) z.v[k] = zero;
            if (t < cg.head) gr[t] = zero;
            for (long long v = t; v < cg.nvec; v += nt) gv[v] = z;
            if (cg.tail + t < n) gr[cg.tail + t] = zero;
            continue;
        }
        const A scale = mode == 2 ? g / n_valid : g;
        const A a = z_loss != A(0) ? scale * (A(1) + A(2) * z_loss * l) : scale;  // times softmax_j
        const A b = scale * smoothing / A(V);                                       // at every j
        const A c = scale * (A(1) - smoothing);                                     // at the target
        const long long tj = target_row - lo;  // the target's index in this unit (maybe outside it)
        if (((reinterpret_cast<u64>(xr) ^ reinterpret_cast<u64>(gr)) & 15u) != 0) {
            // logits and grad differ in 16-byte alignment (a view with an offset): single elements
            for (long long j = t; j < n; j += nt) {
                const A d = grad_of(Elem<T>::load(xr[j]), l, a, b);
                gr[j] = Elem<T>::store(j == tj ? d - c : d);
            }
            continue;
        }
        if (t < cg.head) {
            const A d = grad_of(Elem<T>::load(xr[t]), l, a, b);
            gr[t] = Elem<T>::store(t == tj ? d - c : d);
        }
        const Vec<T>* xv = reinterpret_cast<const Vec<T>*>(xr + cg.head);
        const long long tv = tj - cg.head;  // the target's index counted from the first vector
        long long v = t;
        for (; v + (U - 1) * nt < cg.nvec; v += U * nt) {  // whole trips: U vectors in flight
            Vec<T> w[U];
#pragma unroll
            for (int u = 0; u < U; ++u) w[u] = xv[v + u * nt];
#pragma unroll
            for (int u = 0; u < U; ++u) gv[v + u * nt] = grad_vec<T, A>(w[u], (v + u * nt) * N - tv, l, a, b, c);
        }
        if (v < cg.nvec) {  // the last trip, fewer than U vectors for this thread
            Vec<T> w[U];
#pragma unroll
            for (int u = 0; u < U; ++u)
                if (v + u * nt < cg.nvec) w[u] = xv[v + u * nt];
#pragma unroll
            for (int u = 0; u < U; ++u)
                if (v + u * nt < cg.nvec) gv[v + u * nt] = grad_vec<T, A>(w[u], (v + u * nt) * N - tv, l, a, b, c);
        }
        const long long j = cg.tail + t;
        if (j < n) {
            const A d = grad_of(Elem<T>::load(xr[j]), l, a, b);
            gr[j] = Elem<T>::store(j == tj ? d - c : d);
        }
    }
}
