// opsmith.ops rotary position embedding (rotary.cu's kernels out of place, rotary_ip.cu's in place): each pair (a, b) of a row's first 2*half elements is
// rotated by the angle of its row's position and its pair index j:
//   a' = a cos - b sin,  b' = b cos + a sin   (sign = -1: the inverse rotation, the backward)
// neox layout: pairs (j, j + half); gptj (interleaved): pairs (2j, 2j + 1). Elements from
// 2*half to d are copied.
// Full tables (rotary_full, neox only): cos/sin rows hold 2*half values, as transformers builds them
// (cat(freqs, freqs)); a's angles are the first half, b's the second, so that
//   a' = a cos1 - b sin1,  b' = b cos2 + a sin2   (the inverse: its transpose,
//   a = a' cos1 + b' sin2,  b = b' cos2 - a' sin1), exact whatever the two halves hold.
//
// x is rows x d (rows: the leading dims, at most 4, sizes s0..s3 right-aligned and padded with
// 1). cos/sin hold `half` values per row of their own: without positions their row of x's row
// (i0..i3) starts at sum(i_k * c_k) (0 strides broadcast); with positions, at
// positions[sum(i_k * p_k)] * width of a [max_position, width] table (width: half, or 2*half
// for full tables).
//
// Launch: blockDim.x threads share a row, blockDim.y rows a block, grid-stride over row groups;
// where a row is one chunk a thread, OPSMITH_ROTARY_ROWS rows a trip, loaded together.
// A row's position (the 4 divisions) is found once per row, not per element. Each thread
// rotates P pairs a trip: P = 16 bytes of T when `vec` (half and d multiples of P, every
// pointer 16-byte aligned): neox reads one vector of a, one of b, one of cos and one of sin;
// interleaved two vectors of x; else P = 1, element by element.
//
// Kernels: rotary<T> (half tables) and rotary_full<T> (full ones), both (x, cos, sin, positions,
//          y, rows, d, half, interleaved, sign, has_pos, s0, s1, s2, s3, c0, c1, c2, c3, p0, p1, p2, p3);
//          rotary_qk<T> and rotary_qk_full<T>: two tensors (q and k) with one table in one launch,
//          the grid's two rows or its even and odd blocks (OPSMITH_ROTARY_QK_BODY): (x, x2, cos, sin, positions, y, y2,
//          rows, rows2, d, half, interleaved, sign, has_pos, then x's s0..s3, c0..c3, p0..p3 and
//          x2's t0..t3, e0..e3, f0..f3); in rotary_ip.cu, rotary_ip<T>, rotary_ip_full<T>, rotary_qk_ip<T> and
//          rotary_qk_ip_full<T>: the same without y (y2), x written in place,
// T in {float, double, __half, __nv_bfloat16}; math in float (double for double).
#pragma once
#include "common.cuh"

#ifndef OPSMITH_EW_THREADS
#define OPSMITH_EW_THREADS 256
#endif
// the kernel's launch bounds: OPSMITH_ROTARY_BLOCKS, where defined, the minimum blocks an SM must
// hold (bench/diag_rotary.py's bN variants); without it ptxas picks (80 registers for bf16)
#ifdef OPSMITH_ROTARY_BLOCKS
#define OPSMITH_ROTARY_BOUNDS __launch_bounds__(OPSMITH_EW_THREADS, OPSMITH_ROTARY_BLOCKS)
#else
#define OPSMITH_ROTARY_BOUNDS __launch_bounds__(OPSMITH_EW_THREADS)
#endif
#ifndef OPSMITH_ROTARY_ROWS
// rows a thread loads per trip where a row is one chunk a thread (opsmith/ops/_rotary.py reads it).
// Measured on an H200 with bench/diag_rotary.py, [1, 8-32 heads, 4096-65536, 128] bf16: first
// (bench/results/ops-bwd-h200-2026-11-26/rotary.json) 1,140-1,250 GB/s one row a trip (the chunk
// loop), 2,620-3,130 at 2 rows, 1,570-1,710 at 4 (150 registers a thread: one block an SM); since
// the outputs are packed two 16-bit elements an instruction (st_vals, raw_pack;
// bench/results/ops-fwd-h200-2026-11-26/rotary.json) one row a trip is the fastest: 2,859-3,567
// against 2,605-3,152 at 2 rows. A cap of 64 registers (--blocks 4) spilled: 1,960-2,639.
#define OPSMITH_ROTARY_ROWS 1
#endif
#ifndef OPSMITH_ROTARY_ROWS_HALF
// float16's rows a trip with half tables (its 2 rows hold 64 registers, bf16's 80). H100, rotary_qk on
// [1, heads, seq, 128] with cos/sin [seq, 64] (bench/results/ops-l2-weights-h100-2026-11-27/rot2.json), GB/s at
// 1 -> 2 rows: float16
// 16384x4096 2,613 -> 2,750, 4096x16384 2,732 -> 2,866, 2048x32768 2,757 -> 2,881, 8192x8192 2,730 -> 2,851; bf16
// 2,924 -> 2,672 and float32 2,975 -> 2,942 at 4096x16384 (both keep 1)
#define OPSMITH_ROTARY_ROWS_HALF 2
#endif

#ifndef OPSMITH_ROTARY_FASTPOS
// 1: a table that follows the positions alone (no positions tensor, the other leading dims broadcast: [seq, half]
// beside [batch, heads, seq, d]) finds a row's cos/sin with one modulo, not table_offset's divisions (0: the
// divisions; bench/diag_rotary.py's m0). H100, rotary_qk forward against the divisions
// (bench/results/ops-rotary-h100-2026-12-06-s5/): float32 2048x2048 1.01x, bf16 1.014x, larger shapes 0.998-1.007x
#define OPSMITH_ROTARY_FASTPOS 1
#endif

#ifndef OPSMITH_ROTARY_ACROSS_BYTES
// the tables' bytes (cos and sin of a head's positions) from which rotate_rows takes the positions of every head
// in turn (see there)
#define OPSMITH_ROTARY_ACROSS_BYTES (8ll << 20)
#endif

using namespace opsmith;

namespace {

template <class T, int P>
struct Pack {  // P consecutive elements: one 16-byte vector, or one element
    T v[P];
};

template <class T, int P>
__device__ __forceinline__ Pack<T, P> ld(const T* p) {
    constexpr int N = Vec<T>::N;
    if constexpr (P % N == 0) {  // P / N 16-byte vectors
        Pack<T, P> r;
#pragma unroll
        for (int i = 0; i < P / N; ++i) {
            const Vec<T> w = *reinterpret_cast<const Vec<T>*>(p + i * N);
#pragma unroll
            for (int k = 0; k < N; ++k) r.v[i * N + k] = w.v[k];
        }
        return r;
    } else {
        Pack<T, P> r;
#pragma unroll
        for (int k = 0; k < P; ++k) r.v[k] = p[k];
        return r;
    }
}

#ifndef OPSMITH_ROTARY_TABLE_HINT
// 1: float's cos/sin read under L2 evict_last (as torch.compile's kernel reads them; bench/diag_rotary.py's h1). Off:
// H100, float32 forward + backward against compile, one run (docs/ops.md, "rotary's lean kernel"): on 0.923-1.065x, off
// 0.952-1.057x, 8192x8192 0.923x on against 1.034x off; diag_rotary_lean.cu's kernel with the hint (lean1) 1.009-1.104x
// in the same run, hence rotary.cu's rotary_lean
#define OPSMITH_ROTARY_TABLE_HINT 0
#endif
#if OPSMITH_ROTARY_TABLE_HINT && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define OPSMITH_ROTARY_KEEP 1
#else
#define OPSMITH_ROTARY_KEEP 0
#endif

// ld's vectors through the non-coherent (read-only) path, ld.global.nc: for the in-place kernels' x, which the
// out-of-place kernels' __restrict__ x gets from the compiler (sound: a thread reads each element of x once, before
// it writes it, and no thread reads an element another one writes); KEEP: the tables, under L2 evict_last
template <class T, int P, bool KEEP = false>
__device__ __forceinline__ Pack<T, P> ld_nc(const T* p, unsigned long long pol = 0) {
    constexpr int N = Vec<T>::N;
    if constexpr (P % N == 0 && (!KEEP || OPSMITH_ROTARY_KEEP)) {
        Pack<T, P> r;
#pragma unroll
        for (int i = 0; i < P / N; ++i) {
            Vec<T> w;
            unsigned* u = reinterpret_cast<unsigned*>(&w);
            if constexpr (KEEP)
                asm("ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                    : "=r"(u[0]), "=r"(u[1]), "=r"(u[2]), "=r"(u[3]) : "l"(p + i * N), "l"(pol));
            else
                asm("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
                    : "=r"(u[0]), "=r"(u[1]), "=r"(u[2]), "=r"(u[3]) : "l"(p + i * N));
#pragma unroll
            for (int k = 0; k < N; ++k) r.v[i * N + k] = w.v[k];
        }
        return r;
    } else {
        return ld<T, P>(p);
    }
}

template <class T, int P>
__device__ __forceinline__ void st(T* p, const Pack<T, P>& r) {
    constexpr int N = Vec<T>::N;
    if constexpr (P % N == 0) {
#pragma unroll
        for (int i = 0; i < P / N; ++i) {
            Vec<T> w;
#pragma unroll
            for (int k = 0; k < N; ++k) w.v[k] = r.v[i * N + k];
            *reinterpret_cast<Vec<T>*>(p + i * N) = w;
        }
    } else {
#pragma unroll
        for (int k = 0; k < P; ++k) p[k] = r.v[k];
    }
}

// The cos/sin offset of row r (its index along each leading dim, innermost s3, then its cos/sin
// row); the caller merged the dims it could, so most rows need one or two 32-bit divisions.
__device__ __forceinline__ long long table_offset(long long r, long long rows, int width, int has_pos,
                                                  const long long* __restrict__ positions, int s1, int s2, int s3,
                                                  long long c0, long long c1, long long c2, long long c3,
                                                  long long p0, long long p1, long long p2, long long p3) {
    long long i0, i1, i2, i3;
#if OPSMITH_ROTARY_FASTPOS
    if (!has_pos && c0 == 0 && c1 == 0 && c2 == 0 && rows <= 0xffffffffLL)  // the table follows s3 alone: one modulo
        return (long long)((unsigned)r % (unsigned)s3) * c3;
#endif
    if (rows <= 0xffffffffLL) {
        unsigned int rest = (unsigned int)r;
        i3 = s3 == 1 ? 0 : rest % (unsigned)s3;
        rest = s3 == 1 ? rest : rest / (unsigned)s3;
        i2 = s2 == 1 ? 0 : rest % (unsigned)s2;
        rest = s2 == 1 ? rest : rest / (unsigned)s2;
        i1 = s1 == 1 ? 0 : rest % (unsigned)s1;
        i0 = s1 == 1 ? rest : rest / (unsigned)s1;
    } else {
        unsigned long long rest = (unsigned long long)r;
        i3 = (long long)(rest % (unsigned)s3);
        rest /= (unsigned)s3;
        i2 = (long long)(rest % (unsigned)s2);
        rest /= (unsigned)s2;
        i1 = (long long)(rest % (unsigned)s1);
        i0 = (long long)(rest / (unsigned)s1);
    }
    return has_pos ? positions[i0 * p0 + i1 * p1 + i2 * p2 + i3 * p3] * width : i0 * c0 + i1 * c1 + i2 * c2 + i3 * c3;
}

// One unit of work: P pairs of one row, as loaded (a, b: the pairs' two halves; cos, sin; c2,
// s2: b's, with full tables)
template <class T, int P>
struct Unit {
    Pack<T, P> c, s, a, b, c2, s2;
};

template <class T, int P, bool FULL, bool NC = false>
__device__ __forceinline__ Unit<T, P> load_unit(const T* xr, const T* __restrict__ cs,
                                                 const T* __restrict__ sn, int j, int half, int interleaved) {
    auto ldx = [](const T* p) { return NC ? ld_nc<T, P>(p) : ld<T, P>(p); };  // x: NC in place (ld_nc)
    Unit<T, P> u;
    // the tables under L2 evict_last, float's alone: the 2-byte types keep their registers (bf16's rotary<T> spilled)
    // and lead compile without it; the policy made here (hoisted out of the row loop, it costs registers)
    unsigned long long keep = 0;
#if OPSMITH_ROTARY_KEEP
    if constexpr (sizeof(T) == 4) keep = l2_keep();
#endif
    auto ldt = [keep](const T* p) { return sizeof(T) == 4 ? ld_nc<T, P, true>(p, keep) : ld<T, P>(p); };
    u.c = ldt(cs + j);
    u.s = ldt(sn + j);
    if constexpr (FULL) {
        u.c2 = ldt(cs + half + j);
        u.s2 = ldt(sn + half + j);
    }
    if (interleaved) {  // 2P elements: pairs (2k, 2k + 1)
        const Pack<T, P> lo = ldx(xr + 2 * j), hi = ldx(xr + 2 * j + P);
#pragma unroll
        for (int k = 0; k < P; ++k) {
            u.a.v[k] = 2 * k < P ? lo.v[2 * k] : hi.v[2 * k - P];
            u.b.v[k] = 2 * k + 1 < P ? lo.v[2 * k + 1] : hi.v[2 * k + 1 - P];
        }
    } else {
        u.a = ldx(xr + j);
        u.b = ldx(xr + half + j);
    }
    return u;
}

// P values of the accumulation type to p, rounded to T: 16-byte stores packed by raw_pack (two
// 16-bit elements an instruction) when P is whole vectors, else one element at a time
template <class T, int P, class A>
__device__ __forceinline__ void st_vals(T* p, const A* v) {
    constexpr int N = Vec<T>::N;
    if constexpr (P % N == 0) {
#pragma unroll
        for (int i = 0; i < P / N; ++i) *reinterpret_cast<Raw*>(p + i * N) = raw_pack<T>(v + i * N);
    } else {
#pragma unroll
        for (int k = 0; k < P; ++k) p[k] = Elem<T>::store(v[k]);
    }
}

template <class T, int P, bool FULL>
__device__ __forceinline__ void store_unit(T* yr, const Unit<T, P>& u, int j, int half, int interleaved,
                                           int sign) {
    typedef typename Elem<T>::acc A;
    A ra[P], rb[P];
#pragma unroll
    for (int k = 0; k < P; ++k) {
        const A c1 = Elem<T>::load(u.c.v[k]), s1 = Elem<T>::load(u.s.v[k]);
        A c2 = c1, sa = A(sign) * s1, sb = sa;
        if constexpr (FULL) {  // forward: a' = a c1 - b s1, b' = b c2 + a s2; inverse: a c1 + b s2, b c2 - a s1
            const A s2 = Elem<T>::load(u.s2.v[k]);
            c2 = Elem<T>::load(u.c2.v[k]);
            sa = sign > 0 ? s1 : -s2;
            sb = sign > 0 ? s2 : -s1;
        }
        const A av = Elem<T>::load(u.a.v[k]), bv = Elem<T>::load(u.b.v[k]);
        ra[k] = av * c1 - bv * sa;
        rb[k] = bv * c2 + av * sb;
    }
    if (interleaved) {
        A lo[P], hi[P];
#pragma unroll
        for (int k = 0; k < P; ++k) {
            if (2 * k < P) lo[2 * k] = ra[k]; else hi[2 * k - P] = ra[k];
            if (2 * k + 1 < P) lo[2 * k + 1] = rb[k]; else hi[2 * k + 1 - P] = rb[k];
        }
        st_vals<T, P>(yr + 2 * j, lo);
        st_vals<T, P>(yr + 2 * j + P, hi);
    } else {
        st_vals<T, P>(yr + j, ra);
        st_vals<T, P>(yr + half + j, rb);
    }
}

// Rows grid-stride; a thread's chunks of a row stride by blockDim.x. Where a row is one chunk a
// thread (chunks <= blockDim.x, no copied tail: head dims of 64-256), each trip takes R rows
// (rstep apart) and loads all of them before it computes, so that R units are in flight.
template <class T, int P, int R, bool FULL, bool IP>
__device__ __forceinline__ void rotate_rows(const T* x, const T* __restrict__ cos_t,
                                            const T* __restrict__ sin_t, const long long* __restrict__ positions,
                                            T* y, long long rows, int d, int half, int interleaved,
                                            int sign, int has_pos, int s1, int s2, int s3, long long c0,
                                            long long c1, long long c2, long long c3, long long p0, long long p1,
                                            long long p2, long long p3, unsigned blk, unsigned nblk) {
    const int chunks = half / P, tail = (d - 2 * half) / P, width = FULL ? 2 * half : half;
    const long long rstep = (long long)nblk * blockDim.y;
    long long r = blk * (long long)blockDim.y + threadIdx.y;
    // The order of the rows: where the heads (s2) share the table's rows (stride 0), the positions (s3) do not,
    // and the tables of the s3 positions hold OPSMITH_ROTARY_ACROSS_BYTES or more, the blocks at work together
    // take one tile of blockDim.y positions of every head in turn, instead of every position of one head, so that
    // a tile's cos/sin come from L2 for all but its first head. Row by row, a head's pass over q and k moves more
    // than L2 keeps between two reads of a table row. On an H100 (bench/results/ops-rotary-h100-2026-11-27/,
    // [1, heads, positions, 128] bf16, half tables): 8-16 MiB tables 2,430-2,455 -> 2,780-2,883 GB/s; at 4 MiB
    // and less the rows in order ran 1-5 % faster (their tables stay in L2 anyway, and the tiles cost DRAM
    // locality), hence the threshold.
    const unsigned tile = blockDim.y;
    const bool across = s2 > 1 && s3 % tile == 0 && rows <= 0xffffffffLL &&
                        (long long)s3 * width * (long long)(2 * sizeof(T)) >= (long long)OPSMITH_ROTARY_ACROSS_BYTES &&
                        (has_pos ? (p2 == 0 && p3 != 0) : (c2 == 0 && c3 != 0));
    auto order = [&](long long l) -> long long {
        if (!across) return l;
        const unsigned slab = (unsigned)s2 * (unsigned)s3, u = (unsigned)l;
        const unsigned o = u / slab, rest = u - o * slab, t = rest / tile, within = rest - t * tile;
        const unsigned head = t % (unsigned)s2, pt = t / (unsigned)s2;
        return (long long)o * slab + (long long)head * s3 + (long long)pt * tile + within;
    };
    if (R > 1 && tail == 0 && chunks <= (int)blockDim.x) {
        const int j = threadIdx.x * P;
        const bool on = (int)threadIdx.x < chunks;
        for (; r < rows; r += R * rstep) {
            Unit<T, P> u[R];
            long long pr[R];
#pragma unroll
            for (int i = 0; i < R; ++i) {
                const long long ri = r + i * rstep;
                pr[i] = ri < rows ? order(ri) : ri;
                if (on && ri < rows) {
                    const long long coff = table_offset(pr[i], rows, width, has_pos, positions, s1, s2, s3, c0, c1,
                                                        c2, c3, p0, p1, p2, p3);
                    u[i] = load_unit<T, P, FULL, IP>(x + pr[i] * d, cos_t + coff, sin_t + coff, j, half,
                                                     interleaved);
                }
            }
#pragma unroll
            for (int i = 0; i < R; ++i) {
                if (on && r + i * rstep < rows) store_unit<T, P, FULL>(y + pr[i] * d, u[i], j, half, interleaved, sign);
            }
        }
        return;
    }
    for (; r < rows; r += rstep) {
        const long long pr = order(r);
        const long long coff = table_offset(pr, rows, width, has_pos, positions, s1, s2, s3, c0, c1, c2, c3, p0,
                                            p1, p2, p3);
        const T* xr = x + pr * d;
        T* yr = y + pr * d;
        for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
            const Unit<T, P> u = load_unit<T, P, FULL, IP>(xr, cos_t + coff, sin_t + coff, c * P, half, interleaved);
            store_unit<T, P, FULL>(yr, u, c * P, half, interleaved, sign);
        }
        if constexpr (!IP) {  // the dims beyond the rotary ones (in place: left where they are)
            for (int c = threadIdx.x; c < tail; c += blockDim.x)
                st<T, P>(yr + 2 * half + c * P, ld<T, P>(xr + 2 * half + c * P));
        }
    }
}

}  // namespace

// The vector path's rows a trip for T with half tables (full tables: OPSMITH_ROTARY_ROWS; float16's at 2 rows took
// 88-116 registers)
template <class T> struct RotaryRows { static constexpr int R = OPSMITH_ROTARY_ROWS; };
template <> struct RotaryRows<__half> { static constexpr int R = OPSMITH_ROTARY_ROWS_HALF; };

// The kernels' body: the vector path where `vec`, else one pair at a time
template <bool FULL, bool IP, class T>
__device__ __forceinline__ void rotary_any(const T* x, const T* __restrict__ cos_t,
                                           const T* __restrict__ sin_t, const long long* __restrict__ positions,
                                           T* y, long long rows, int d, int half, int interleaved,
                                           int sign, int has_pos, int s1, int s2, int s3, long long c0, long long c1,
                                           long long c2, long long c3, long long p0, long long p1, long long p2,
                                           long long p3, unsigned blk, unsigned nblk) {
    constexpr int N = Vec<T>::N;
    const bool vec = half % N == 0 && d % N == 0 && aligned16(x) && aligned16(y) && aligned16(cos_t) &&
                     aligned16(sin_t) && (has_pos || (c0 % N == 0 && c1 % N == 0 && c2 % N == 0 && c3 % N == 0));
    if (vec)
        rotate_rows<T, N, FULL ? OPSMITH_ROTARY_ROWS : RotaryRows<T>::R, FULL, IP>(
            x, cos_t, sin_t, positions, y, rows, d, half, interleaved, sign, has_pos, s1, s2, s3, c0, c1, c2, c3, p0,
            p1, p2, p3, blk, nblk);
    else
        rotate_rows<T, 1, 1, FULL, IP>(x, cos_t, sin_t, positions, y, rows, d, half, interleaved, sign, has_pos, s1, s2,
                                   s3, c0, c1, c2, c3, p0, p1, p2, p3, blk, nblk);
}

// q and k in one launch, as compiled attention code rotates them: one launch instead of two, one tail. The grid says
// how the blocks split (opsmith/ops/_rotary.py's plan_qk): where the tables of the positions hold
// OPSMITH_ROTARY_ACROSS_BYTES or more ([1, heads, seq, d] with seq rows of angles, read once a head), one row of 2n
// blocks, q's and k's alternating (even blocks q, odd blocks k, each tensor's rows grid-strided over its n), so that k
// finds in L2 the cos/sin rows q just read; below it, two rows of n (gridDim.y 2: q's blocks, then k's), one stream
// of rows at a time. H100, rotary_qk against alternating blocks (bench/results/ops-rotary-h100-2026-12-06-s5/):
// float32 forward + backward 2048x2048 1.024x, 4096x4096 1.011x; bf16 forwards 2048x2048 to 8192x3072 1.010-1.020x;
// on the 8 MiB tables of 16384x4096 alternating stays ahead by 1 %. Deciding it in the kernel instead took float32's
// registers from 40 to 36 (7 blocks an SM, not 6), which ran 2048x32768 at 0.94x compile against 0.99x. The
// tensor's arguments are picked before the body, which is rotary's (one copy of it, the same registers).
#define OPSMITH_ROTARY_QK_BODY(FULL, IP, Y, Y2)                                                           \
    const bool halves_ = gridDim.y > 1;                                                                   \
    const bool second = halves_ ? blockIdx.y : (blockIdx.x & 1u);                                         \
    rotary_any<FULL, IP>(second ? x2 : x, cos_t, sin_t, positions, second ? Y2 : Y, second ? rows2 : rows, d, \
                     half, interleaved, sign, has_pos, second ? t1 : s1, second ? t2 : s2, second ? t3 : s3, \
                     second ? e0 : c0, second ? e1 : c1, second ? e2 : c2, second ? e3 : c3, second ? f0 : p0, \
                     second ? f1 : p1, second ? f2 : p2, second ? f3 : p3, halves_ ? blockIdx.x : blockIdx.x >> 1, \
                     halves_ ? gridDim.x : gridDim.x >> 1)
