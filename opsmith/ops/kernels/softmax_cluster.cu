// opsmith.ops softmax (softmax.cu has the math and the other strategies) for rows too long for one
// block's registers and short enough for a cluster of K = 2 (sm_90+; the forward of 16,385-20,480 16-bit
// columns in K = 4, _launch.softmax_plan): each block holds its slice of the row in its
// registers (CH 16-byte chunks a thread: 2, or 4 for the 16-bit rows up to 32,768), and the blocks
// meet through distributed shared memory (rows.cuh's cluster_reduce) for the row's max and sum
// (forward) or sum(grad_y * y) (backward). Persistent, as norm_cluster.cu's kernels: the clusters the
// SMs hold stride over the rows, loading their next row's slice while they reduce the current one.
// Numerics as softmax_fwd / softmax_bwd: the max subtracted before exp, sums in float (double for
// double), subnormal exps flushed; a NaN, +inf or a row of only -inf give a row of NaN.
#include "rows.cuh"

#ifndef OPSMITH_ROW_THREADS
#define OPSMITH_ROW_THREADS 512
#endif

using namespace opsmith;

// 2 chunks a thread: 2 blocks of 512 threads an SM (64 registers); 4: one of 512 (128), or 3 of 160 (K = 4)
template <int K, int CH, class T>
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS, (CH > 2 ? 1 : 2)) OPSMITH_CLUSTER_DIMS(K)
softmax_fwd_cluster(const T* __restrict__ x, T* __restrict__ y, long long rows, int cols) {
    typedef typename Elem<T>::acc A;
    OPSMITH_SLICE_SETUP
    OPSMITH_CLUSTER_RED(1)
    const bool vec = cols % N == 0 && aligned16(x) && aligned16(y);
    Raw in[1][C];
    {
        const bool a_ = (long long)(blockIdx.x / K) < rows;
        load_chunks<T, 1>({x + (a_ ? (long long)(blockIdx.x / K) : 0) * cols + off}, in, a_ ? n : 0, vec, tpr, t);
    }
    OPSMITH_CL_ROWS(rows) {
        const long long base = row * cols + off;
        Raw nx[1][C];
        {
            const long long r_ = row + groups;
            const bool a_ = r_ < rows;
            load_chunks<T, 1>({x + (a_ ? r_ : 0) * cols + off}, nx, a_ ? n : 0, vec, tpr, t);
        }
        A v[C * N], p[4] = {neg_inf<A>(), neg_inf<A>(), neg_inf<A>(), neg_inf<A>()};
#pragma unroll
        for (int c = 0; c < C; ++c)
#pragma unroll
            for (int k = 0; k < N; ++k) {
                const bool inside = vec ? OPSMITH_J(c) < n : OPSMITH_J(c) + k < n;
                v[c * N + k] = inside ? OPSMITH_E(in[0], c, k) : neg_inf<A>();
                p[k & 3] = m_max(p[k & 3], v[c * N + k]);
            }
        A m[1] = {row_allreduce<true>(m_max(m_max(p[0], p[1]), m_max(p[2], p[3])), MaxOp(), neg_inf<A>(), tpr)};
        cluster_reduce<K>(m, cl_slot_, cl_bar_, cl_round_, MaxOp());
#pragma unroll
        for (int i = 0; i < 4; ++i) p[i] = A(0);
#pragma unroll
        for (int i = 0; i < C * N; ++i) {
            v[i] = m_exp2_ftz((v[i] - m[0]) * log2e<A>());  // padding is -inf: adds 0
            p[i & 3] += v[i];
        }
        A s[1] = {row_allreduce<true>((p[0] + p[1]) + (p[2] + p[3]), SumOp(), A(0), tpr)};
        cluster_sum<K>(s, cl_slot_, cl_bar_, cl_round_);
        const A r = A(1) / s[0];
#pragma unroll
        for (int c = 0; c < C; ++c) {
#pragma unroll
            for (int k = 0; k < N; ++k) v[c * N + k] *= r;
            store_vec(y + base, OPSMITH_J(c), n, vec, v + c * N);
        }
#pragma unroll
        for (int c = 0; c < C; ++c) in[0][c] = nx[0][c];
    }
    cluster_arrive_relaxed();
    cluster_wait();
}

template <int K, int CH, class T>
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS, (CH > 2 ? 1 : 2)) OPSMITH_CLUSTER_DIMS(K)
softmax_bwd_cluster(const T* __restrict__ grad_y, const T* __restrict__ y, T* __restrict__ grad_x, long long rows,
                    int cols) {
    typedef typename Elem<T>::acc A;
    OPSMITH_SLICE_SETUP
    OPSMITH_CLUSTER_RED(1)
    const bool vec = cols % N == 0 && aligned16(grad_y) && aligned16(y) && aligned16(grad_x);
    Raw in[2][C];  // this trip's grad_y and y as loaded (zeros past the slice)
    {
        const bool a_ = (long long)(blockIdx.x / K) < rows;
        const long long b_ = (a_ ? (long long)(blockIdx.x / K) : 0) * cols + off;
        load_chunks<T, 2>({grad_y + b_, y + b_}, in, a_ ? n : 0, vec, tpr, t);
    }
    OPSMITH_CL_ROWS(rows) {
        const long long base = row * cols + off;
        Raw nx[2][C];
        {
            const long long r_ = row + groups;
            const bool a_ = r_ < rows;
            const long long b_ = (a_ ? r_ : 0) * cols + off;
            load_chunks<T, 2>({grad_y + b_, y + b_}, nx, a_ ? n : 0, vec, tpr, t);
        }
        A p[4] = {A(0), A(0), A(0), A(0)};
#pragma unroll
        for (int c = 0; c < C; ++c)
#pragma unroll
            for (int k = 0; k < N; ++k) p[k & 3] += OPSMITH_E(in[0], c, k) * OPSMITH_E(in[1], c, k);
        A d[1] = {row_allreduce((p[0] + p[1]) + (p[2] + p[3]), SumOp(), A(0), tpr)};
        cluster_sum<K>(d, cl_slot_, cl_bar_, cl_round_);
#pragma unroll
        for (int c = 0; c < C; ++c) {
            A o[N];
#pragma unroll
            for (int k = 0; k < N; ++k) o[k] = OPSMITH_E(in[1], c, k) * (OPSMITH_E(in[0], c, k) - d[0]);
            store_vec(grad_x + base, OPSMITH_J(c), n, vec, o);
        }
#pragma unroll
        for (int c = 0; c < C; ++c) {
            in[0][c] = nx[0][c];
            in[1][c] = nx[1][c];
        }
    }
    cluster_arrive_relaxed();
    cluster_wait();
}
