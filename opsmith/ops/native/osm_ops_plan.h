/* opsmith.ops' launch plans in C++: the functions of opsmith/ops/_launch.py and _launch_norm.py, ported line for line
   (tests/ops/test_ops_native.py compares both on synthetic A100/H100/B200/T4 devices and random
   shapes). Part of osm_ops.cpp's one translation unit. */
#pragma once

#include <algorithm>
#include <cstdint>

namespace {

// the launch plans' numbers, from opsmith/ops/_launch.py (osm_ops_init), in this order
enum { C_ROW_CHUNKS, C_ROW_THREADS, C_LONG_THREADS, C_EW_THREADS, C_EW_UNROLL, C_STATIC_SMEM, C_ROW_BWD_BLOCKS, C_LN_WIDE_TPR,
       C_WIDE_CHUNKS, C_CLUSTER_MAX, C_CLUSTER_THREADS,
       C_CLUSTER_FWD_BLOCKS, C_NORM_SPLIT_BYTES, C_WEIGHT_LANE_ROWS, C_WEIGHT_CLUSTER, C_WEIGHT_CLUSTER_BYTES,
       C_LN_FWD4_CHUNKS, C_L2_THREADS, C_L2_CHUNKS, C_L2_MIN_ROW_BYTES, C_L2_RMS_THREADS, C_C4_THREADS,
       C_C4_MIN_ROW_BYTES, C_WIDE3_THREADS, C_LOW_BW_SM_GBPS, C_SMALL_BWD_ROWS, C_SMALL_MIN_LANES,
       C_C8_MAX_ROW_BYTES, C_LN_FULL2_MAX_ROW_BYTES, C_L2_ONE_ROW_BYTES, C_L2_ONE_CHUNKS,
       C_LN_FULL2_HIGH_BW_ROWS, C_BWD_C4_CHUNKS, C_BWD_C4_LN_MIN_ROW_BYTES,
       C_L2_ONE_ROW_BYTES_HIGH_BW, C_L2_THREE_THREADS, C_L2_THREE_CHUNKS, C_L2_THREE_MAX_ROW_BYTES,
       C_L2_THREE_MAX_SM_GBPS, C_BWD_SM_THREADS, N_CONSTS };
int64_t K[N_CONSTS];

struct Props {  // what a plan needs of a device (_launch.DeviceProps), and its primary context
    int64_t sm_count, max_threads_per_block, max_threads_per_sm, smem_optin, smem_per_sm, clusters, mem_gbps;
};

// -- launch plans (the functions of opsmith/ops/_launch.py) ---------------------------------------------
enum { S_NONE = -1, S_ELEMENTWISE = 0, S_WARP = 1, S_BLOCK = 2, S_LONG = 3, S_COLUMNS = 4, S_PERSISTENT = 5, S_WIDE = 6,
       S_CLUSTER = 7, S_SPLIT = 8, S_L2 = 9, S_SMALL = 10, S_C4 = 11,
       S_SM = 12 };
struct Plan {
    int strategy;
    int64_t gx, gy;
    int64_t bx, by;
    int64_t smem;
    int cache;
    int64_t per_chunk;  // the weight-gradient plan's rows per chunk
    int64_t cluster = 1;  // blocks a cluster (S_CLUSTER: the kernel's K)
    int64_t chunks = 0;   // S_CLUSTER: 16-byte chunks a thread
};

// _launch.full_rows' width test: rows of `cols` elements fill p's threads at `chunks` 16-byte chunks each (the
// callers add the pointers' alignment and the strategy); such rows take the kernels of the unchecked row alone
bool fills_chunks(const Plan &p, int64_t cols, int64_t itemsize, int64_t chunks) {
    return cols == p.bx * chunks * (16 / itemsize);
}

int64_t cdiv(int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); }
int64_t pow2_at_least(int64_t n) { return n <= 1 ? 1 : int64_t(1) << (64 - __builtin_clzll((uint64_t)(n - 1))); }

Plan elementwise_plan(int64_t n, int64_t itemsize, const Props &p, bool unrolled = false) {
    const int64_t vec = 16 / itemsize;
    const int64_t threads = std::min<int64_t>(K[C_EW_THREADS], p.max_threads_per_block);
    if (unrolled) {
        const int64_t grid = cdiv(n, vec * threads * K[C_EW_UNROLL]);
        if (2 * grid >= p.sm_count * std::max<int64_t>(1, p.max_threads_per_sm / threads))
            return {S_ELEMENTWISE, std::min<int64_t>(grid, 0x7fffffff), 1, threads, 1, 0, 0, 0};
    }
    const int64_t grid = std::min<int64_t>(std::max<int64_t>(1, cdiv(n, vec * threads)), 0x7fffffff);
    return {S_ELEMENTWISE, grid, 1, threads, 1, 0, 0, 0};
}

Plan row_plan(int64_t rows, int64_t cols, int64_t itemsize, int64_t arrays, const Props &p) {
    const int64_t vec = 16 / itemsize;
    const int64_t tpr = pow2_at_least(cdiv(std::max<int64_t>(cols, 1), K[C_ROW_CHUNKS] * vec));
    if (tpr <= 32) {
        int64_t per_block = std::max<int64_t>(1, 128 / tpr);  // four warps a block
        while (per_block > 1 && per_block * tpr > 32 && cdiv(rows, per_block) < 2 * p.sm_count) per_block /= 2;
        return {S_WARP, std::max<int64_t>(1, cdiv(rows, per_block)), 1, tpr, per_block, 0, 0, 0};
    }
    if (tpr <= std::min<int64_t>(K[C_ROW_THREADS], p.max_threads_per_block))
        return {S_BLOCK, std::max<int64_t>(1, rows), 1, tpr, 1, 0, 0, 0};
    const int64_t threads = std::min({K[C_LONG_THREADS], pow2_at_least(p.max_threads_per_block + 1) / 2,
                                      pow2_at_least(cdiv(cols, vec))});
    const int64_t row_bytes = arrays * cdiv(cols * itemsize, 16) * 16;
    const bool cache = row_bytes + K[C_STATIC_SMEM] <= p.smem_optin;
    int64_t per_sm = std::max<int64_t>(1, p.max_threads_per_sm / threads);
    if (cache) per_sm = std::max<int64_t>(1, std::min(per_sm, p.smem_per_sm / (row_bytes + K[C_STATIC_SMEM])));
    const int64_t grid = std::max<int64_t>(1, std::min(rows, per_sm * p.sm_count));
    return {S_LONG, grid, 1, threads, 1, cache ? row_bytes : 0, cache ? 1 : 0, 0};
}

// _launch._cluster: a persistent cluster plan, k blocks a row of `chunks` chunks a thread
// _launch._cluster_per_sm: the blocks of tpr threads an SM holds of a cluster plan (`blocks` of ROW_THREADS' registers)
int64_t cluster_per_sm(int64_t tpr, int64_t blocks, const Props &p) {
    return std::max<int64_t>(1, std::min<int64_t>(K[C_ROW_THREADS] * blocks, p.max_threads_per_sm) / tpr);
}

Plan cluster(int64_t rows, int64_t cols, int64_t itemsize, const Props &p, int64_t k, int64_t chunks, int64_t blocks,
             int64_t most) {
    const int64_t tpr = cdiv(cdiv(cols, chunks * (16 / itemsize) * k), 32) * 32;
    const int64_t groups = std::max<int64_t>(1, std::min(cluster_per_sm(tpr, blocks, p) * p.sm_count / k, most));
    return {S_CLUSTER, groups * k, 1, tpr, 1, 0, 0, 0, k, chunks};
}

Plan softmax_rows(int64_t rows, int64_t cols, int64_t itemsize, int64_t arrays, const Props &p) {  // _softmax_rows
    const Plan q = row_plan(rows, cols, itemsize, arrays, p);
    const int64_t tpr = pow2_at_least(cdiv(cols, K[C_WIDE_CHUNKS] * (16 / itemsize)));
    // the forward of 16-bit register rows of C4_MIN_ROW_BYTES or more: the wide kernel, 4 chunks a thread
    if (arrays == 1 && q.strategy == S_BLOCK && itemsize == 2 && cols % (16 / itemsize) == 0 &&
        cols * itemsize >= K[C_C4_MIN_ROW_BYTES])
        return {S_WIDE, std::max<int64_t>(1, rows), 1, tpr, 1, 0, 0, 0};
    if (q.strategy != S_LONG) return q;
    const int64_t limit = std::min<int64_t>(K[C_ROW_THREADS], p.max_threads_per_block);
    const bool wide = tpr <= std::min<int64_t>(K[C_LONG_THREADS], p.max_threads_per_block);
    // the backward of rows that fill the wide kernel's chunks: one block, no bounds checks (_launch.softmax_plan)
    if (arrays > 1 && wide && cols == tpr * K[C_WIDE_CHUNKS] * (16 / itemsize))
        return {S_WIDE, std::max<int64_t>(1, rows), 1, tpr, 1, 0, 0, 0};
    if (p.clusters && itemsize == 2) {  // softmax_cluster.cu: 2 blocks a row, of 2 chunks a thread or 4
        const int64_t vec = 16 / itemsize;
        const bool fits2 = cdiv(cols, K[C_ROW_CHUNKS] * vec) <= 2 * limit;
        if (fits2 && arrays > 1) return cluster(rows, cols, itemsize, p, 2, K[C_ROW_CHUNKS], K[C_CLUSTER_FWD_BLOCKS], rows);
        if (!fits2 && cdiv(cols, K[C_WIDE_CHUNKS] * vec) <= 2 * limit) {  // the forward: 4 blocks where held (_launch)
            const Plan two = cluster(rows, cols, itemsize, p, 2, K[C_WIDE_CHUNKS], 1, rows);
            const Plan four = cluster(rows, cols, itemsize, p, 4, K[C_WIDE_CHUNKS], 1, rows);
            const int64_t held2 = cluster_per_sm(two.bx, 1, p) * two.bx;  // threads an SM
            const int64_t held4 = cluster_per_sm(four.bx, 1, p) * four.bx;
            return arrays == 1 && 2 * held4 >= 3 * held2 ? four : two;
        }
    }
    if (!wide && itemsize == 4) {  // float rows past WIDE_CHUNKS: twice the chunks a thread (the backward's full rows)
        const int64_t chunks8 = 2 * K[C_WIDE_CHUNKS], tpr8 = pow2_at_least(cdiv(cols, chunks8 * 4));
        const bool fits = tpr8 <= std::min<int64_t>(K[C_LONG_THREADS], p.max_threads_per_block);
        // _launch._staged: the backward stages grad_y in shared memory where the device holds it
        const int64_t staged = chunks8 * tpr8 * 16;
        const bool room = staged + K[C_STATIC_SMEM] <= std::min(p.smem_optin, p.smem_per_sm);
        const int64_t smem = arrays > 1 && room ? staged : 0;
        if (fits && (arrays == 1 || cols == tpr8 * chunks8 * 4))
            return {S_WIDE, std::max<int64_t>(1, rows), 1, tpr8, 1, smem, 0, 0, 1, chunks8};
    }
    if (!wide) return q;
    return {S_WIDE, std::max<int64_t>(1, rows), 1, tpr, 1, 0, 0, 0};
}

// _launch._warps_of: the threads of a row at exactly `chunks` chunks each where that is whole warps, else 0
int64_t warps_of(int64_t cols, int64_t chunks, int64_t itemsize) {
    const int64_t per = chunks * (16 / itemsize), t = cols / per;
    return cols % per == 0 && t % 32 == 0 ? t : 0;
}

// _launch._threads_of: a row's threads at `chunks` chunks each, exactly its whole warps where it is that, else the
// power of two that covers it
int64_t threads_of(int64_t cols, int64_t chunks, int64_t itemsize) {
    const int64_t whole = warps_of(cols, chunks, itemsize);
    return whole ? whole : pow2_at_least(cdiv(cols / (16 / itemsize), chunks));
}

// _launch._whole_warps: register rows ("block" at ROW_CHUNKS, "wide" at WIDE_CHUNKS, a row a block) of 2- and 4-byte
// types at exactly the threads whose chunks they fill, where those are whole warps fewer than the plan's
Plan whole_warps(Plan q, int64_t cols, int64_t itemsize) {
    if ((q.strategy != S_BLOCK && q.strategy != S_WIDE) || q.chunks || q.by != 1 || (itemsize != 2 && itemsize != 4))
        return q;
    const int64_t t = warps_of(cols, K[q.strategy == S_BLOCK ? C_ROW_CHUNKS : C_WIDE_CHUNKS], itemsize);
    if (t && t < q.bx) q.bx = t;
    return q;
}

// _launch.softmax_plan: the backward of 16-bit rows of whole warps at WIDE_CHUNKS (from C4_MIN_ROW_BYTES) "wide" at
// exactly their threads; every other row softmax_rows', at whole_warps
Plan softmax_plan(int64_t rows, int64_t cols, int64_t itemsize, int64_t arrays, const Props &p) {
    const int64_t t4 = warps_of(cols, K[C_WIDE_CHUNKS], itemsize);
    if (arrays > 1 && itemsize == 2 && t4 && cols * itemsize >= K[C_C4_MIN_ROW_BYTES] &&
        t4 <= std::min<int64_t>(K[C_LONG_THREADS], p.max_threads_per_block))
        return {S_WIDE, std::max<int64_t>(1, rows), 1, t4, 1, 0, 0, 0};
    return whole_warps(softmax_rows(rows, cols, itemsize, arrays, p), cols, itemsize);
}

Plan norm_bwd_plan(int64_t rows, int64_t cols, int64_t itemsize, const Props &p, int64_t arrays) {
    const int64_t vec = 16 / itemsize;
    const int64_t tpr = pow2_at_least(cdiv(std::max<int64_t>(cols, 1), K[C_ROW_CHUNKS] * vec));
    const int64_t limit = std::min<int64_t>(K[C_ROW_THREADS], p.max_threads_per_block);
    if (tpr > limit) return row_plan(rows, cols, itemsize, 2, p);
    const int64_t per_block = std::max<int64_t>(1, std::min<int64_t>(limit, 256) / tpr);  // 256: NORM_BWD_BLOCK
    const int64_t one_row = cdiv(rows, per_block);
    // rows of whole warps fewer than tpr: exactly their threads (rows a block and the grid as tpr's)
    const int64_t whole = itemsize == 2 || itemsize == 4 ? warps_of(cols, K[C_ROW_CHUNKS], itemsize) : 0;
    const int64_t exact = whole ? whole : tpr;
    if (per_block > 1 && one_row <= p.sm_count) return {S_PERSISTENT, std::max<int64_t>(1, one_row), 1, exact, per_block, 0, 0, 0};
    const int64_t resident = std::min<int64_t>(K[C_ROW_THREADS] * K[C_ROW_BWD_BLOCKS], p.max_threads_per_sm);
    const int64_t per_sm = std::max<int64_t>(1, resident / (tpr * per_block));
    const int64_t grid = std::max<int64_t>(1, std::min(per_sm * p.sm_count, cdiv(rows, 2 * per_block)));
    if (one_row <= p.sm_count || rows * itemsize < K[C_NORM_SPLIT_BYTES] * arrays * grid)  // see _launch
        return {S_SPLIT, std::max<int64_t>(1, one_row), 1, exact, per_block, 0, 0, 0};
    return {S_PERSISTENT, grid, 1, exact, per_block, 0, 0, 0};
}
Plan norm_cluster_plan(int64_t rows, int64_t cols, int64_t itemsize, const Props &p, bool backward) {
    const Plan none{S_NONE, 0, 0, 0, 0, 0, 0, 0};
    if (!p.clusters) return none;
    const int64_t units = cdiv(std::max<int64_t>(cols, 1), K[C_ROW_CHUNKS] * (16 / itemsize));
    const int64_t limit = std::min<int64_t>(K[C_ROW_THREADS], p.max_threads_per_block);
    if (units <= limit) return none;
    const int64_t vec = 16 / itemsize;
    int64_t k, chunks, blocks;
    if (units <= 2 * limit) {
        k = 2, chunks = K[C_ROW_CHUNKS], blocks = backward ? K[C_ROW_BWD_BLOCKS] : K[C_CLUSTER_FWD_BLOCKS];
    } else if (!backward && itemsize == 2 && cdiv(cols, K[C_WIDE_CHUNKS] * vec) <= 2 * limit) {
        k = 2, chunks = K[C_WIDE_CHUNKS], blocks = 1;
    } else if (backward && units <= K[C_CLUSTER_MAX] * std::min<int64_t>(K[C_CLUSTER_THREADS], limit)) {
        k = K[C_CLUSTER_MAX], chunks = K[C_ROW_CHUNKS], blocks = K[C_ROW_BWD_BLOCKS];
    } else {
        return none;
    }
    return cluster(rows, cols, itemsize, p, k, chunks, blocks, backward ? cdiv(rows, 2) : rows);
}

// _launch_norm.layer_norm_fwd4_plan: float rows past the register strategy that fit a block of 4 chunks a thread
Plan layer_norm_fwd4_plan(int64_t rows, int64_t cols, int64_t itemsize, const Props &p) {
    const Plan none{S_NONE, 0, 0, 0, 0, 0, 0, 0};
    if (itemsize != 4 || cols % (16 / itemsize)) return none;
    const int64_t limit = std::min<int64_t>(K[C_ROW_THREADS], p.max_threads_per_block), vec = 16 / itemsize;
    if (cols <= K[C_ROW_CHUNKS] * vec * limit || cols > K[C_LN_FWD4_CHUNKS] * vec * limit) return none;
    return {S_BLOCK, std::max<int64_t>(1, rows), 1, pow2_at_least(cdiv(cols, K[C_LN_FWD4_CHUNKS] * vec)), 1, 0, 0, 0};
}

// _launch_norm.low_bandwidth_per_sm: DRAM bandwidth known and at most LOW_BW_SM_GBPS an SM (H100: yes; H200: no), where
// the norm forwards' plans of fewer bytes in flight (c4 at 16 KiB rows, c8, layer_norm's full2) win
bool low_bandwidth_per_sm(const Props &p) { return p.mem_gbps > 0 && p.mem_gbps <= K[C_LOW_BW_SM_GBPS] * p.sm_count; }

// _launch_norm.norm_c4_plan: the norm forwards of 4 chunks a thread, rows of C4_MIN_ROW_BYTES to L2_MIN_ROW_BYTES
// (arrays 2: layer_norm, 2- and 4-byte types; 1: rms_norm, 2-byte)
Plan norm_c4_plan(int64_t rows, int64_t cols, int64_t itemsize, const Props &p, int64_t arrays) {
    const Plan none{S_NONE, 0, 0, 0, 0, 0, 0, 0};
    const int64_t vec = 16 / itemsize;
    if (!(itemsize == 2 || (itemsize == 4 && arrays == 2)) || cols % vec) return none;
    // rows of exactly L2_MIN_ROW_BYTES: layer_norm's, and rms_norm's on devices of low DRAM bandwidth an SM
    const int64_t top = arrays == 2 || low_bandwidth_per_sm(p) ? K[C_L2_MIN_ROW_BYTES] : K[C_L2_MIN_ROW_BYTES] - 1;
    if (cols * itemsize < K[C_C4_MIN_ROW_BYTES] || cols * itemsize > top) return none;
    const int64_t tpr = threads_of(cols, 4, itemsize);  // rows of whole warps: exactly their threads
    if (tpr > std::min<int64_t>(K[C_C4_THREADS], p.max_threads_per_block)) return none;
    return {S_BLOCK, std::max<int64_t>(1, rows), 1, tpr, 1, 0, 0, 0};
}

// _launch_bwd.norm_bwd_c4_plan: the norm backwards of BWD_C4_CHUNKS chunks a thread, a row a block, for float rows
// too long for the 2-chunk kernels (layer_norm's past BWD_C4_LN_MIN_ROW_BYTES); the sums and the weight in shared memory
Plan norm_bwd_c4_plan(int64_t rows, int64_t cols, int64_t itemsize, const Props &p, int64_t arrays) {
    const Plan none{S_NONE, 0, 0, 0, 0, 0, 0, 0};
    const int64_t vec = 16 / itemsize;
    const int64_t limit = std::min<int64_t>(K[C_ROW_THREADS], p.max_threads_per_block);
    if (itemsize != 4 || cols % vec || cdiv(cols, K[C_ROW_CHUNKS] * vec) <= limit) return none;
    if (arrays == 2 && cols * itemsize <= K[C_BWD_C4_LN_MIN_ROW_BYTES]) return none;
    const int64_t tpr = pow2_at_least(cdiv(cols / vec, K[C_BWD_C4_CHUNKS]));
    const int64_t smem = (arrays * vec * itemsize + 16) * K[C_BWD_C4_CHUNKS] * K[C_ROW_THREADS];
    if (tpr > limit || smem > p.smem_optin || smem > p.smem_per_sm) return none;
    return {S_C4, std::max<int64_t>(1, std::min<int64_t>(p.sm_count, cdiv(rows, 2))), 1, tpr, 1, smem, 0, 0};
}

// _launch_bwd.norm_bwd_sm_plan: norm_bwd_plan's persistent rows of a row a block at more than ROW_THREADS / 2 and at
// most BWD_SM_THREADS threads (rms_norm's 2- and 4-byte types, layer_norm's 4-byte, whole vectors) at two blocks an
// SM, the sums and the weight in shared memory
Plan norm_bwd_sm_plan(int64_t rows, int64_t cols, int64_t itemsize, const Props &p, int64_t arrays) {
    const Plan none{S_NONE, 0, 0, 0, 0, 0, 0, 0};
    const int64_t vec = 16 / itemsize;
    if ((itemsize != 2 && itemsize != 4) || cols % vec || (itemsize == 2 && arrays == 2)) return none;
    const Plan q = norm_bwd_plan(rows, cols, itemsize, p, arrays);
    if (q.strategy != S_PERSISTENT || q.by != 1 || q.bx <= K[C_ROW_THREADS] / 2 || q.bx > K[C_BWD_SM_THREADS])
        return none;
    const int64_t smem = (arrays * vec * 4 + 16) * K[C_ROW_CHUNKS] * K[C_ROW_THREADS];
    if (2 * (smem + K[C_STATIC_SMEM]) > p.smem_per_sm || smem > p.smem_optin || 2 * q.bx > p.max_threads_per_sm)
        return none;
    return {S_SM, std::max<int64_t>(1, std::min<int64_t>(2 * p.sm_count, cdiv(rows, 2))), 1, q.bx, 1, smem, 0, 0};
}

// _launch_norm.layer_norm_full2_plan: layer_norm's 16-bit rows of C4_MIN_ROW_BYTES to LN_FULL2_MAX_ROW_BYTES that fill
// row_plan's threads at ROW_CHUNKS chunks (the caller adds the alignment), on other devices than those of low bandwidth
// an SM only up to LN_FULL2_HIGH_BW_ROWS rows: layer_norm_fwd_full
Plan layer_norm_full2_plan(int64_t rows, int64_t cols, int64_t itemsize, const Props &p) {
    const Plan none{S_NONE, 0, 0, 0, 0, 0, 0, 0};
    if (itemsize != 2 || cols * itemsize < K[C_C4_MIN_ROW_BYTES] || cols * itemsize > K[C_LN_FULL2_MAX_ROW_BYTES] ||
        (!low_bandwidth_per_sm(p) && rows > K[C_LN_FULL2_HIGH_BW_ROWS]))
        return none;
    const Plan r = row_plan(rows, cols, itemsize, 1, p);
    return (r.strategy == S_WARP || r.strategy == S_BLOCK) && fills_chunks(r, cols, itemsize, K[C_ROW_CHUNKS]) ? r
                                                                                                                : none;
}

// _launch_norm.norm_c8_plan: the norm forwards of 8 chunks a thread, rows past L2_MIN_ROW_BYTES up to C8_MAX_ROW_BYTES
// (2- and 4-byte types, whole vectors), on devices of low bandwidth an SM
Plan norm_c8_plan(int64_t rows, int64_t cols, int64_t itemsize, const Props &p) {
    const Plan none{S_NONE, 0, 0, 0, 0, 0, 0, 0};
    const int64_t vec = 16 / itemsize;
    if ((itemsize != 2 && itemsize != 4) || cols % vec || cols * itemsize <= K[C_L2_MIN_ROW_BYTES] ||
        cols * itemsize > K[C_C8_MAX_ROW_BYTES] || !low_bandwidth_per_sm(p))
        return none;
    const int64_t tpr = threads_of(cols, 8, itemsize);  // rows of whole warps: exactly their threads
    if (tpr > std::min<int64_t>(K[C_C4_THREADS], p.max_threads_per_block)) return none;
    return {S_BLOCK, std::max<int64_t>(1, rows), 1, tpr, 1, 0, 0, 0};
}

// _launch_norm.norm_l2_plan: the norm forwards' two passes over a row held in L2, rows of L2_MIN_ROW_BYTES or more
// (arrays 1: rms_norm, at least L2_RMS_THREADS threads)
Plan norm_l2_plan(int64_t rows, int64_t cols, int64_t itemsize, const Props &p, int64_t arrays) {
    const Plan none{S_NONE, 0, 0, 0, 0, 0, 0, 0};
    const int64_t vec = 16 / itemsize;
    if ((itemsize != 2 && itemsize != 4) || cols % vec || cols * itemsize < K[C_L2_MIN_ROW_BYTES] || rows < 1 ||
        rows > 0x7fffffff)
        return none;
    const int64_t largest = std::min<int64_t>(K[C_L2_THREADS], pow2_at_least(p.max_threads_per_block + 1) / 2);
    int64_t threads = pow2_at_least(cdiv(cols / vec, K[C_L2_CHUNKS]));
    if (arrays == 1) threads = std::max(threads, std::min(K[C_L2_RMS_THREADS], pow2_at_least(cdiv(cols / vec, 2))));
    // rows past L2_ONE_ROW_BYTES (L2_ONE_ROW_BYTES_HIGH_BW where the bandwidth an SM is known and high) in blocks of
    // L2_THREADS: one block an SM (chunks L2_ONE_CHUNKS: the kernels' B = 1, whose registers keep a second out)
    const int64_t bx = std::min(largest, threads);
    const bool high_bw = p.mem_gbps > 0 && !low_bandwidth_per_sm(p);
    const int64_t one_bytes = high_bw ? K[C_L2_ONE_ROW_BYTES_HIGH_BW] : K[C_L2_ONE_ROW_BYTES];
    int64_t chunks = cols * itemsize > one_bytes && bx == K[C_L2_THREADS] ? K[C_L2_ONE_CHUNKS] : 0;
    // rows past L2_MIN_ROW_BYTES up to L2_THREE_MAX_ROW_BYTES of rms_norm, and of float layer_norm, in blocks of
    // L2_THREE_THREADS where the bandwidth an SM is known, high and at most L2_THREE_MAX_SM_GBPS: the kernels' B = 3
    // (chunks L2_THREE_CHUNKS)
    if (high_bw && p.mem_gbps <= K[C_L2_THREE_MAX_SM_GBPS] * p.sm_count && cols * itemsize > K[C_L2_MIN_ROW_BYTES] &&
        cols * itemsize <= K[C_L2_THREE_MAX_ROW_BYTES] && bx == K[C_L2_THREE_THREADS] && (arrays == 1 || itemsize == 4))
        chunks = K[C_L2_THREE_CHUNKS];
    return {S_L2, rows, 1, bx, 1, 0, 0, 0, 1, chunks};
}

// _launch_bwd.norm_bwd_small_plan: the norm backwards of 1 to SMALL_BWD_ROWS rows in one launch (norm_small.cu),
// grad_x blocks then weight blocks of `chunks` column lanes
Plan norm_bwd_small_plan(int64_t rows, int64_t cols, int64_t itemsize, const Props &p) {
    const Plan none{S_NONE, 0, 0, 0, 0, 0, 0, 0};
    const int64_t vec = 16 / itemsize, block = 256;  // 256: NORM_BWD_BLOCK
    const int64_t tpr = pow2_at_least(cdiv(std::max<int64_t>(cols, 1), K[C_ROW_CHUNKS] * vec));
    if (rows < 1 || rows > K[C_SMALL_BWD_ROWS] || tpr > std::min<int64_t>(block, p.max_threads_per_block)) return none;
    const int64_t col_vecs = cdiv(cols, vec);
    int64_t lanes = 32;
    while (lanes > K[C_SMALL_MIN_LANES] && cdiv(rows, block / lanes) > K[C_WEIGHT_LANE_ROWS]) lanes /= 2;
    lanes = std::max(std::min(lanes, pow2_at_least(col_vecs)), cdiv(8, vec));
    const int64_t per_block = block / tpr;
    return {S_SMALL, cdiv(rows, per_block) + cdiv(col_vecs, lanes), 1, tpr, per_block, 0, 0, 0, 1, lanes};
}

Plan col_sum_plan(int64_t cols, int64_t arrays) {
    return {S_COLUMNS, cdiv(cols, 32), arrays, 32, 32, 0, 0, 0};
}

Plan weight_grad_plan(int64_t rows, int64_t cols, int64_t itemsize, const Props &p) {
    const int64_t col_blocks = cdiv(cols, 32 * (16 / itemsize)), lanes = 8, k = K[C_WEIGHT_CLUSTER];
    if (p.clusters && rows > 2 * lanes && 2 * k * col_blocks >= p.sm_count &&
        rows * cols * itemsize <= K[C_WEIGHT_CLUSTER_BYTES])
        return {S_CLUSTER, k, col_blocks, 32, lanes, 0, 0, cdiv(rows, k), k, 0};
    int64_t chunks = std::max(cdiv(rows, K[C_WEIGHT_LANE_ROWS] * lanes),
                              std::min(cdiv(2 * p.sm_count, col_blocks), cdiv(rows, lanes)));
    chunks = rows <= 2 * lanes ? 1 : std::max<int64_t>(1, std::min<int64_t>(chunks, 65535));
    const int64_t per_chunk = cdiv(rows, chunks);
    chunks = cdiv(rows, per_chunk);
    return {S_COLUMNS, col_blocks, chunks, 32, lanes, 0, 0, per_chunk};
}

}  // namespace
