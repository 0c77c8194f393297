// opsmith.ops LayerNorm and RMSNorm backwards: the weight (and bias) gradients, and grad_x alone for
// few rows a block.
//
// The "split" plans (_launch_bwd.norm_bwd_plan): *_bwd_dx write grad_x alone, one row a row lane, every
// row at once; the weight and bias gradients then come from norm_bwd_weight (or, sm_90+,
// norm_bwd_weight_cluster) over grad and x again. norm.cu's persistent backwards add those inside
// the kernel, but each of their blocks writes a row of partial sums: with few rows a block that
// costs more than reading the input twice, and their 128 registers a thread (two rows in flight)
// hold an SM to 512 threads, where these kernels' 64 hold it to 1024 (bench/diag_norm_split.py).
// The math is norm.cu's. norm_bwd_weight also serves the long-row backwards (norm_long.cu), and
// norm_col_sum adds up the partial sums of every norm backward that writes them.
#include "norm_dx.cuh"

#ifndef OPSMITH_ROW_THREADS
#define OPSMITH_ROW_THREADS 512
#endif
// blocks of OPSMITH_ROW_THREADS an SM holds at once in these kernels (up to 64 registers a thread)
#ifndef OPSMITH_DX_BLOCKS
#define OPSMITH_DX_BLOCKS 2
#endif

using namespace opsmith;

// A single row's weight (and bias) gradients are its grad_y * xhat (and grad_y) themselves: with `one_w`
// (`one_b`) set by a launch of one row, the kernel writes them into grad_w (grad_b) as it goes, and no
// norm_bwd_weight launch follows (the two launches made a 1 x 64 backward 1.3x eager's time).
template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS, OPSMITH_DX_BLOCKS)
layer_norm_bwd_dx(const T* __restrict__ grad_y, const T* __restrict__ x, const T* __restrict__ w,
                  const A* __restrict__ mean, const A* __restrict__ rstd, T* __restrict__ grad_x, long long rows,
                  int cols, int has_w, T* __restrict__ grad_w, T* __restrict__ grad_b, int one_w, int one_b) {
    layer_norm_dx_rows<T, A>(grad_y, x, w, mean, rstd, grad_x, rows, cols, has_w, grad_w, grad_b, one_w, one_b,
                             bwd_block(blockIdx.x, gridDim.x));
}

// grad_res (add_rms_norm's, has_res): the gradient that reached the new residual, added to grad_x; one_w:
// a launch of one row writes its weight gradient too (as layer_norm_bwd_dx)
template <class T, class A>
__global__ void __launch_bounds__(OPSMITH_ROW_THREADS, OPSMITH_DX_BLOCKS)
rms_norm_bwd_dx(const T* __restrict__ grad_y, const T* __restrict__ x, const T* __restrict__ w,
                const A* __restrict__ rstd, T* __restrict__ grad_x, long long rows, int cols, int has_w,
                const T* __restrict__ grad_res, int has_res, T* __restrict__ grad_w, int one_w) {
    rms_norm_dx_rows<T, A>(grad_y, x, w, rstd, grad_x, rows, cols, has_w, grad_res, has_res, grad_w, one_w,
                           bwd_block(blockIdx.x, gridDim.x));
}

// -- grad_w and grad_b: column sums over the rows ---------------------------------------------------
// Blocks (32, 8): 32 column lanes of a 16-byte vector each (Vec<T>::N columns, W a block), 8 row
// lanes, over a chunk of `rows_per_chunk` rows. dw = sum over the chunk of grad_y * xhat, db = sum of
// grad_y (has_mean = 0, rms_norm: xhat = x * rstd). After the long-row backwards (norm_long.cu) and
// the split ones above.

// this thread's column lanes' sums over rows r0 + threadIdx.y, +8, ... < r1, then the block's row
// lanes' into sw / sb [lane][element k of each column lane's vector: k * 32 + lane]
template <class T, class A, int W>
__device__ __forceinline__ void weight_lane_sums(const T* __restrict__ grad_y, const T* __restrict__ x,
                                                 const A* __restrict__ mean, const A* __restrict__ rstd,
                                                 long long r0, long long r1, long long c0, int cols, int has_mean,
                                                 A (&sw)[8][W], A (&sb)[8][W]) {
    constexpr int N = Vec<T>::N;
    const bool vec = cols % N == 0 && aligned16(grad_y) && aligned16(x);
    A dw[N], db[N];
#pragma unroll
    for (int k = 0; k < N; ++k) dw[k] = db[k] = A(0);
    long long r = r0 + threadIdx.y;
    if (vec && c0 < cols) {  // whole 16-byte vectors: four rows' loads issued before any is used
        for (; r + 24 < r1; r += 32) {
            Raw gr[4], xr[4];
            A mu[4], rs[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                gr[u] = *reinterpret_cast<const Raw*>(grad_y + (r + 8 * u) * cols + c0);
                xr[u] = *reinterpret_cast<const Raw*>(x + (r + 8 * u) * cols + c0);
                mu[u] = has_mean ? mean[r + 8 * u] : A(0);
                rs[u] = rstd[r + 8 * u];
            }
#pragma unroll
            for (int u = 0; u < 4; ++u)
#pragma unroll
                for (int k = 0; k < N; ++k) {
                    const A g = raw_get<T>(gr[u], k);
                    dw[k] += g * ((raw_get<T>(xr[u], k) - mu[u]) * rs[u]);
                    db[k] += g;
                }
        }
    }
    if (c0 < cols) {
        for (; r < r1; r += 8) {  // the rest (and rows that allow no 16-byte access)
            A g[N], v[N];
            load_vec(grad_y + r * cols, c0, cols, vec, g, A(0));
            load_vec(x + r * cols, c0, cols, vec, v, A(0));
            const A mu = has_mean ? mean[r] : A(0), rs = rstd[r];
#pragma unroll
            for (int k = 0; k < N; ++k) {
                dw[k] += g[k] * ((v[k] - mu) * rs);
                db[k] += g[k];
            }
        }
    }
#pragma unroll
    for (int k = 0; k < N; ++k) {  // consecutive lanes, consecutive banks
        sw[threadIdx.y][k * 32 + threadIdx.x] = dw[k];
        sb[threadIdx.y][k * 32 + threadIdx.x] = db[k];
    }
    __syncthreads();
}

// the block's sums of its column i (lane i / N's element i % N) over the row lanes, in lane order
template <class A, int N, int W>
__device__ __forceinline__ void weight_block_sum(const A (&sw)[8][W], const A (&sb)[8][W], int i, A& a, A& b) {
    const int s = (i % N) * 32 + i / N;
    a = b = A(0);
#pragma unroll
    for (int l = 0; l < 8; ++l) {
        a += sw[l][s];
        b += sb[l][s];
    }
}

// blockIdx.x a column block, blockIdx.y a chunk. One chunk: the sums rounded to T into dw_out /
// db_out; else a row of partials a chunk, dw_part[chunk][col] in A, which norm_col_sum adds up.
// (Adding them up here instead, in the last block of each column block to finish, as CUDA's
// threadFenceReduction sample, measured 1-1.5 us slower than norm_col_sum's launch: one block read
// all the chunks; norm_bwd_weight_cluster below adds up eight through distributed shared memory.)
template <class T, class A>
__global__ void __launch_bounds__(256)
norm_bwd_weight(const T* __restrict__ grad_y, const T* __restrict__ x, const A* __restrict__ mean,
                const A* __restrict__ rstd, A* __restrict__ dw_part, A* __restrict__ db_part, T* __restrict__ dw_out,
                T* __restrict__ db_out, long long rows, int cols, int rows_per_chunk, int has_mean, int want_w,
                int want_b) {
    constexpr int N = Vec<T>::N, W = 32 * N;  // columns a block
    __shared__ A sw[8][W], sb[8][W];
    const long long r0 = (long long)blockIdx.y * rows_per_chunk, first = (long long)blockIdx.x * W;
    const long long r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
    weight_lane_sums<T, A, W>(grad_y, x, mean, rstd, r0, r1, first + threadIdx.x * N, cols, has_mean, sw, sb);
    for (int i = threadIdx.y * 32 + threadIdx.x; i < W && first + i < cols; i += 256) {
        const long long col = first + i;
        A a, b;
        weight_block_sum<A, N, W>(sw, sb, i, a, b);
        if (gridDim.y == 1) {
            if (want_w) dw_out[col] = Elem<T>::store(a);
            if (want_b) db_out[col] = Elem<T>::store(b);
        } else {
            if (want_w) dw_part[(long long)blockIdx.y * cols + col] = a;
            if (want_b) db_part[(long long)blockIdx.y * cols + col] = b;
        }
    }
}

__device__ __forceinline__ float ld_cluster(unsigned a, float) {
    float v = 0.f;
#if OPSMITH_HAS_CLUSTERS
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(a) : "memory");
#endif
    return v;
}
__device__ __forceinline__ double ld_cluster(unsigned a, double) {
    double v = 0.0;
#if OPSMITH_HAS_CLUSTERS
    asm volatile("ld.shared::cluster.f64 %0, [%1];" : "=d"(v) : "r"(a) : "memory");
#endif
    return v;
}

// sm_90+: a cluster of OPSMITH_WEIGHT_CLUSTER blocks (blockIdx.x, its rank: a chunk of the rows) a
// column block (blockIdx.y). Each block's sums stay in its shared memory; after the cluster meets,
// block `rank` adds the cluster's sums of its share of the columns in rank order (the same order
// whichever block finishes first) and rounds them to T: no partials in global memory and no
// norm_col_sum launch.
#ifndef OPSMITH_WEIGHT_CLUSTER
#define OPSMITH_WEIGHT_CLUSTER 8
#endif
template <class T, class A>
__global__ void __launch_bounds__(256) OPSMITH_CLUSTER_DIMS(OPSMITH_WEIGHT_CLUSTER)
norm_bwd_weight_cluster(const T* __restrict__ grad_y, const T* __restrict__ x, const A* __restrict__ mean,
                        const A* __restrict__ rstd, T* __restrict__ dw_out, T* __restrict__ db_out, long long rows,
                        int cols, int rows_per_chunk, int has_mean, int want_w, int want_b) {
    constexpr int N = Vec<T>::N, W = 32 * N, K = OPSMITH_WEIGHT_CLUSTER, S = W / K;  // S: columns a rank adds up
    __shared__ A sw[8][W], sb[8][W];
    __shared__ A pw[W], pb[W];  // this block's sums, which the cluster reads
    const long long r0 = (long long)blockIdx.x * rows_per_chunk, first = (long long)blockIdx.y * W;
    const long long r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
    weight_lane_sums<T, A, W>(grad_y, x, mean, rstd, r0, r1, first + threadIdx.x * N, cols, has_mean, sw, sb);
    const int tid = threadIdx.y * 32 + threadIdx.x;
    for (int i = tid; i < W; i += 256) weight_block_sum<A, N, W>(sw, sb, i, pw[i], pb[i]);
    cluster_arrive();
    cluster_wait();
    const unsigned rank = cluster_rank();
    if (tid < S) {
        const int i = (int)rank * S + tid;
        const long long col = first + i;
        if (col < cols) {
            const unsigned aw = smem_u32(&pw[i]), ab = smem_u32(&pb[i]);
            A a = A(0), b = A(0);
#pragma unroll
            for (unsigned k = 0; k < K; ++k) {
                a += ld_cluster(cluster_map(aw, k), A(0));
                b += ld_cluster(cluster_map(ab, k), A(0));
            }
            if (want_w) dw_out[col] = Elem<T>::store(a);
            if (want_b) db_out[col] = Elem<T>::store(b);
        }
    }
    cluster_arrive_relaxed();  // no block leaves while the others read its sums
    cluster_wait();
}

// The persistent backwards' partial sums added up: out[col] = sum of part[r][col] over prows rows,
// rounded to T (blockIdx.y = 1: part2 into out2, layer_norm's bias). Blocks of 32 columns x 32 row
// lanes, four independent sums a thread, then the lanes in shared memory: a fixed order
// (deterministic), and one launch where torch's sum(0) and the cast took two and 12-33 us
// (H200, 528 x 2048 floats, bench/diag_norm_bwd.py).
template <class T, class A>
__global__ void __launch_bounds__(1024)
norm_col_sum(const A* __restrict__ part, const A* __restrict__ part2, T* __restrict__ out, T* __restrict__ out2,
             int prows, int cols) {
    const A* p = blockIdx.y ? part2 : part;
    T* o = blockIdx.y ? out2 : out;
    const int col = blockIdx.x * 32 + threadIdx.x;
    A s0 = A(0), s1 = A(0), s2 = A(0), s3 = A(0);
    if (col < cols) {
        int r = threadIdx.y;
        for (; r + 96 < prows; r += 128) {
            s0 += p[(long long)r * cols + col];
            s1 += p[(long long)(r + 32) * cols + col];
            s2 += p[(long long)(r + 64) * cols + col];
            s3 += p[(long long)(r + 96) * cols + col];
        }
        for (; r < prows; r += 32) s0 += p[(long long)r * cols + col];
    }
    __shared__ A red[32][33];
    red[threadIdx.y][threadIdx.x] = (s0 + s1) + (s2 + s3);
    __syncthreads();
    if (threadIdx.y == 0 && col < cols) {
        A v = A(0);
#pragma unroll
        for (int i = 0; i < 32; ++i) v += red[i][threadIdx.x];
        o[col] = Elem<T>::store(v);
    }
}
