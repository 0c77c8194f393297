// opsmith.ops rotary: the heads path, included by rotary.cuh after its row helpers. The heads of one position share
// their cos/sin row (the leading dim whose table stride is 0: [batch, seq, heads, d] in memory, heads innermost, or
// [batch, heads, seq, d], heads above the positions). The row path loads that table row once per row, so a thread's
// cos and sin are as many bytes from L2 as its x (half tables of the head dim's halves: 2 x half values against
// 2 x half of x). Here a thread takes OPSMITH_ROTARY_HEADS heads of one position and loads their table once: the
// work items are (outer index, group of heads, inner index), blockDim.y consecutive items a block.
#pragma once
// rotary.cuh's row helpers (Unit, load_unit, store_unit, table_offset): rotary.cuh includes this file after them
#include "rotary.cuh"

#ifndef OPSMITH_ROTARY_HEADS
// heads a thread (1: the row path only). opsmith/ops/_rotary.py reads it (ROTARY_HEADS).
#define OPSMITH_ROTARY_HEADS 1
#endif
#ifndef OPSMITH_ROTARY_INFLIGHT
// of those, the heads whose x a thread loads before it rotates any of them
#define OPSMITH_ROTARY_INFLIGHT OPSMITH_ROTARY_HEADS
#endif

namespace {

struct HeadsDim {  // the heads' dim: n heads, `inner` rows apart (1: innermost); n == 0: no such dim
    unsigned n, inner;
};

// The dim whose rows share a table row, as _rotary.heads_items finds it: s3 where its table stride is 0 (heads
// innermost), else s2 where its stride is 0 and s3's is not (the positions inside the heads)
__device__ __forceinline__ HeadsDim heads_dim(long long rows, int has_pos, int s2, int s3, long long c2,
                                              long long c3, long long p2, long long p3) {
    const bool z2 = has_pos ? p2 == 0 : c2 == 0, z3 = has_pos ? p3 == 0 : c3 == 0;
    if (rows > 0xffffffffLL) return {0u, 0u};
    if (s3 > 1 && z3) return {(unsigned)s3, 1u};
    if (s2 > 1 && z2) return {(unsigned)s2, (unsigned)s3};
    return {0u, 0u};
}

// One trip: the table row of the item's position, then the x chunks of its HG heads (all loaded before any is
// computed, in groups of INFLIGHT), rotated and stored. Where the heads are above the positions and the tables are
// OPSMITH_ROTARY_ACROSS_BYTES or more, the items go tile by tile of blockDim.y positions through every group of
// heads in turn (rotate_rows' `across`), so that a table row comes from L2 for all but its first group.
template <class T, int P, int HG, int INFLIGHT, bool FULL, bool IP>
__device__ __forceinline__ void rotate_heads(const T* x, const T* __restrict__ cos_t, const T* __restrict__ sin_t,
                                             const long long* __restrict__ positions, T* y, long long rows, int half,
                                             int interleaved, int sign, int has_pos, int s1, int s2, int s3,
                                             long long c0, long long c1, long long c2, long long c3, long long p0,
                                             long long p1, long long p2, long long p3, HeadsDim hd, unsigned blk,
                                             unsigned nblk) {
    const int d = 2 * half, width = FULL ? 2 * half : half, j = threadIdx.x * P;
    if ((int)threadIdx.x >= half / P) return;  // no barrier below: an idle thread may leave
    const unsigned groups = (hd.n + HG - 1) / HG, tile = blockDim.y;
    const unsigned long long outer = (unsigned long long)rows / ((unsigned long long)hd.n * hd.inner);
    const unsigned long long items = outer * groups * hd.inner;
    const bool across = hd.inner > 1 && hd.inner % tile == 0 &&
                        (long long)hd.inner * width * (long long)(2 * sizeof(T)) >=
                            (long long)OPSMITH_ROTARY_ACROSS_BYTES;
    const unsigned long long step = (unsigned long long)nblk * tile;
    for (unsigned long long l = blk * (unsigned long long)tile + threadIdx.y; l < items; l += step) {
        unsigned o, g, within;
        if (across) {  // (outer, tile of positions, group, position in the tile)
            const unsigned slab = groups * hd.inner, u = (unsigned)l;
            o = u / slab;
            const unsigned rest = u - o * slab, t = rest / tile;
            g = t % groups;
            within = (t / groups) * tile + (rest - t * tile);
        } else {  // (outer, group, inner)
            const unsigned u = (unsigned)l, t = u / hd.inner;
            within = u - t * hd.inner;
            g = t % groups;
            o = t / groups;
        }
        const unsigned h0 = g * HG;
        const long long base = ((long long)o * hd.n + h0) * hd.inner + within;
        const long long coff = table_offset(base, rows, width, has_pos, positions, s1, s2, s3, c0, c1, c2, c3, p0, p1,
                                            p2, p3);
        const Unit<T, P> tab = load_unit<T, P, FULL, IP>(x + base * d, cos_t + coff, sin_t + coff, j, half,
                                                         interleaved);
#pragma unroll
        for (int i0 = 0; i0 < HG; i0 += INFLIGHT) {  // INFLIGHT heads' x loaded before any of them is rotated
            Unit<T, P> u[INFLIGHT];
#pragma unroll
            for (int i = 0; i < INFLIGHT; ++i) {
                const int h = i0 + i;
                if (h == 0) {
                    u[i] = tab;
                } else if (h < HG && h0 + h < hd.n) {  // the same table: only x's chunks
                    const Unit<T, P> v = load_unit<T, P, false, IP, false>(x + (base + (long long)h * hd.inner) * d,
                                                                           cos_t, sin_t, j, half, interleaved);
                    u[i] = tab;
                    u[i].a = v.a;
                    u[i].b = v.b;
                }
            }
#pragma unroll
            for (int i = 0; i < INFLIGHT; ++i) {
                const int h = i0 + i;
                if (h < HG && h0 + h < hd.n)
                    store_unit<T, P, FULL>(y + (base + (long long)h * hd.inner) * d, u[i], j, half, interleaved, sign);
            }
        }
    }
}

}  // namespace
