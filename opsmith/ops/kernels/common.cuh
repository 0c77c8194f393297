// opsmith.ops: helpers shared by the kernels in this directory.
//
// Element types: float, double, __half, __nv_bfloat16. Arithmetic happens in the
// accumulation type Elem<T>::acc (float for the 16-bit types and float, double for double).
// The kernels compile through NVRTC without CUDA's headers: when <cuda_fp16.h> is not on
// the include path (NVRTC has no default one), the two 16-bit types are declared here as
// 2-byte structs and converted with PTX instructions, which is all these kernels need.
#pragma once

#if __has_include(<cuda_fp16.h>) && __has_include(<cuda_bf16.h>)
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#else
struct __align__(2) __half { unsigned short __x; };
struct __align__(2) __nv_bfloat16 { unsigned short __x; };
#endif

#ifndef OPSMITH_ROW_CHUNKS
// Row kernels that keep the row in registers hold OPSMITH_ROW_CHUNKS vectors of 16 bytes
// per thread and per input (opsmith/ops/_launch.py reads the same number).
#define OPSMITH_ROW_CHUNKS 2
#endif

#ifndef OPSMITH_BWD_REVERSE  // 1: the backwards take their rows last first (bwd_row below); 0: first first
#define OPSMITH_BWD_REVERSE 1
#endif

namespace opsmith {

typedef unsigned long long u64;

// Row r of `rows` (block b of `blocks`) as a backward takes it: last first, so that the rows a forward just left
// in L2 are read before the backward's own traffic evicts them (docs/ops.md, "Backward row order"; H100, bf16
// softmax 4096 x 4096 fwd+bwd 2,519 -> 2,707 GB/s: bench/results/ops-c8-h100-2026-11-27/bwd-order.json).
__device__ __forceinline__ long long bwd_row(long long r, long long rows) {
    return OPSMITH_BWD_REVERSE ? rows - 1 - r : r;
}
__device__ __forceinline__ unsigned bwd_block(unsigned b, unsigned blocks) {
    return OPSMITH_BWD_REVERSE ? blocks - 1 - b : b;
}

// -- element types --------------------------------------------------------------------------
template <class T> struct Elem;

template <> struct Elem<float> {
    typedef float acc;
    static __device__ __forceinline__ float load(float v) { return v; }
    static __device__ __forceinline__ float store(float v) { return v; }
};

template <> struct Elem<double> {
    typedef double acc;
    static __device__ __forceinline__ double load(double v) { return v; }
    static __device__ __forceinline__ double store(double v) { return v; }
};

template <> struct Elem<__half> {
    typedef float acc;
    static constexpr bool is_bf16 = false;
    static __device__ __forceinline__ float load(__half v) {
        unsigned short b = *reinterpret_cast<unsigned short*>(&v);
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(b));
        return f;
    }
    static __device__ __forceinline__ __half store(float v) {
        unsigned short b;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(b) : "f"(v));  // round to nearest even, as torch
        __half h;
        *reinterpret_cast<unsigned short*>(&h) = b;
        return h;
    }
};

template <> struct Elem<__nv_bfloat16> {
    typedef float acc;
    static constexpr bool is_bf16 = true;
    static __device__ __forceinline__ float load(__nv_bfloat16 v) {
        unsigned short b = *reinterpret_cast<unsigned short*>(&v);
        return __uint_as_float(static_cast<unsigned>(b) << 16);  // bf16 is fp32's top half
    }
    static __device__ __forceinline__ __nv_bfloat16 store(float v) {
        unsigned short b;
        asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(v));  // sm_80 and newer
        __nv_bfloat16 h;
        *reinterpret_cast<unsigned short*>(&h) = b;
        return h;
    }
};

// 16 bytes of T: the unit of every global load and store on the fast paths.
template <class T> struct __align__(16) Vec {
    static constexpr int N = 16 / sizeof(T);
    T v[N];
};

// 16 bytes of a row as loaded: N elements of T packed in four 32-bit words (raw_get below)
struct __align__(16) Raw {
    unsigned u[4];
};
// N values of the accumulation type as 16 bytes of T, rounded to T (defined below)
template <class T, class A> __device__ __forceinline__ Raw raw_pack(const A* in);

__device__ __forceinline__ bool aligned16(const void* p) {
    return (reinterpret_cast<u64>(p) & 15u) == 0;
}

// 16 bytes from global to shared memory without passing through registers (cp.async, sm_80+; before: a load and
// a store); cp_async_wait_all waits for this thread's copies (a thread that reads back only what it copied
// itself needs no barrier).
__device__ __forceinline__ void cp_async16(Raw* dst, const Raw* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((unsigned)__cvta_generic_to_shared(dst)),
                 "l"(src) : "memory");
#else
    *dst = *src;
#endif
}
__device__ __forceinline__ void cp_async_wait_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_all;" ::: "memory");
#endif
}

// -- math in the accumulation type ------------------------------------------------------------
__device__ __forceinline__ float m_exp(float x) { return expf(x); }
__device__ __forceinline__ double m_exp(double x) { return exp(x); }
__device__ __forceinline__ float m_exp2(float x) { return exp2f(x); }
__device__ __forceinline__ double m_exp2(double x) { return exp2(x); }
template <class A> __device__ __forceinline__ A log2e() { return A(1.4426950408889634); }
// exp(x) as exp2(x log2 e): a few instructions fewer than expf, which the row kernels measured
// (softmax is bound by its arithmetic at 16-bit widths); relative error about |x| * 1e-7 more.
template <class A> __device__ __forceinline__ A m_expe(A x) { return m_exp2(x * log2e<A>()); }
// exp2 with subnormal results flushed to zero (one MUFU instruction; exp2f adds the scaling
// that keeps them): for softmax's exp(x - max), whose sum is at least 1
__device__ __forceinline__ float m_exp2_ftz(float x) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}
__device__ __forceinline__ double m_exp2_ftz(double x) { return exp2(x); }
__device__ __forceinline__ float m_abs(float x) { return fabsf(x); }
__device__ __forceinline__ double m_abs(double x) { return fabs(x); }
__device__ __forceinline__ float m_erf(float x) { return erff(x); }
__device__ __forceinline__ double m_erf(double x) { return erf(x); }
__device__ __forceinline__ float m_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double m_tanh(double x) { return tanh(x); }
__device__ __forceinline__ float m_rsqrt(float x) { return rsqrtf(x); }
__device__ __forceinline__ double m_rsqrt(double x) { return rsqrt(x); }
__device__ __forceinline__ float m_max(float a, float b) { return fmaxf(a, b); }  // NaN ignored
__device__ __forceinline__ double m_max(double a, double b) { return fmax(a, b); }
__device__ __forceinline__ bool m_isnan(float x) { return x != x; }
__device__ __forceinline__ bool m_isnan(double x) { return x != x; }
// 0 for a finite x, NaN for inf or NaN (x - x; IEEE arithmetic, which NVRTC keeps without
// fast-math flags: inf - inf is NaN).
template <class A> __device__ __forceinline__ A nonfinite(A x) { return x - x; }
template <class A> __device__ __forceinline__ A neg_inf();
template <> __device__ __forceinline__ float neg_inf<float>() { return __int_as_float(0xff800000); }
template <> __device__ __forceinline__ double neg_inf<double>() {
    return __longlong_as_double(0xfff0000000000000ull);
}
template <class A> __device__ __forceinline__ A pos_inf() { return -neg_inf<A>(); }

// -- reductions over the threads of one row ---------------------------------------------------
struct SumOp {
    template <class A> __device__ __forceinline__ A operator()(A a, A b) const { return a + b; }
};
struct MaxOp {
    template <class A> __device__ __forceinline__ A operator()(A a, A b) const { return m_max(a, b); }
};

// Reduce across `width` consecutive lanes (a power of two <= 32). Groups are aligned, so the
// xor partner of a lane is always in its own group and every lane of the warp takes part. The loop
// over a run-time width is a chain of shift, compare, shuffle and branch a step (SASS); U: a whole
// warp's five shuffles unrolled, the loop kept for narrower widths. The forwards of 4 chunks a thread
// and more take it (H200, bench/diag_kernels_ab.py, ab-reduce.txt: layer_norm 1.6-2.6 % faster, softmax
// 2048 x 32768 4.9 %); in the kernels of 32 registers the larger code spilled and ran 3 % slower (bf16
// 65536 x 256). Each step predicated on the width instead (ab-reduce-u.txt) gained less: 0-1.8 %.
template <bool U = false, class A, class Op> __device__ __forceinline__ A warp_allreduce(A v, Op op, int width) {
    if (U && width == 32) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
        return v;
    }
    for (int o = width >> 1; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Reduce across the `tpr` threads of a row (threadIdx.x < tpr), every thread gets the result.
// Above 32 threads a row's warps meet in shared memory (blockDim.y rows a block, each its own
// tpr / 32 slots). Every thread of the block must call this (it synchronises). U: as warp_allreduce.
template <bool U = false, class A, class Op>
__device__ __forceinline__ A row_allreduce(A v, Op op, A identity, int tpr) {
    __shared__ A partial[32];
    v = warp_allreduce<U>(v, op, tpr < 32 ? tpr : 32);
    if (tpr <= 32) return v;
    const int lane = threadIdx.x & 31, warps = tpr >> 5, first = threadIdx.y * warps;
    if (U) {  // this warp's slot and the one this lane reads, before the barriers (after them, their address
              // arithmetic sat between a barrier and the shared-memory store, SASS)
        A* const mine = &partial[first + (threadIdx.x >> 5)];
        const A* const theirs = &partial[first + (lane < warps ? lane : 0)];
        __syncthreads();  // the previous call's readers are done with `partial`
        if (lane == 0) *mine = v;
        __syncthreads();
        v = lane < warps ? *theirs : identity;
    } else {  // the backwards as they were: rms_norm's 8-block cluster backward (bf16 2048 x 32768) ran 3 %
              // slower with the addresses before the barriers
        __syncthreads();
        if (lane == 0) partial[first + (threadIdx.x >> 5)] = v;
        __syncthreads();
        v = lane < warps ? partial[first + lane] : identity;
    }
    return warp_allreduce<true>(v, op, 32);
}

// Two sums over the threads of a row at once (one pair of barriers instead of two), as row_allreduce
template <class A> __device__ __forceinline__ void row_allreduce_sum2(A& a, A& b, int tpr) {
    __shared__ A pa[32], pb[32];
    const int width = tpr < 32 ? tpr : 32;
    for (int o = width >> 1; o > 0; o >>= 1) {
        a += __shfl_xor_sync(0xffffffffu, a, o);
        b += __shfl_xor_sync(0xffffffffu, b, o);
    }
    if (tpr <= 32) return;
    const int lane = threadIdx.x & 31, warps = tpr >> 5, first = threadIdx.y * warps;
    __syncthreads();  // the previous call's readers are done
    if (lane == 0) {
        pa[first + (threadIdx.x >> 5)] = a;
        pb[first + (threadIdx.x >> 5)] = b;
    }
    __syncthreads();
    a = lane < warps ? pa[first + lane] : A(0);
    b = lane < warps ? pb[first + lane] : A(0);
    for (int o = 16; o > 0; o >>= 1) {
        a += __shfl_xor_sync(0xffffffffu, a, o);
        b += __shfl_xor_sync(0xffffffffu, b, o);
    }
}

// -- row access: 16-byte vectors when the row allows, else elements ----------------------------
// Element j .. j+N-1 of a row of n elements into out[0..N) (pad where j+k >= n). `vec`: the
// row's start is 16-byte aligned and n is a multiple of N, so a whole vector is in bounds.
template <class T, class A>
__device__ __forceinline__ void load_vec(const T* row, long long j, long long n, bool vec, A* out, A pad) {
    constexpr int N = Vec<T>::N;
    if (vec && j + N <= n) {
        Vec<T> w = *reinterpret_cast<const Vec<T>*>(row + j);
#pragma unroll
        for (int k = 0; k < N; ++k) out[k] = Elem<T>::load(w.v[k]);
    } else {
#pragma unroll
        for (int k = 0; k < N; ++k) out[k] = (j + k < n) ? Elem<T>::load(row[j + k]) : pad;
    }
}

// N elements from `in` to elements j .. j+N-1 of a row (as load_vec)
template <class T, class A>
__device__ __forceinline__ void store_vec(T* row, long long j, long long n, bool vec, const A* in) {
    constexpr int N = Vec<T>::N;
    if (vec && j + N <= n) {
        *reinterpret_cast<Raw*>(row + j) = raw_pack<T>(in);  // 16-bit T: two elements an instruction
    } else {
#pragma unroll
        for (int k = 0; k < N; ++k)
            if (j + k < n) row[j + k] = Elem<T>::store(in[k]);
    }
}

// Raw: the register-row kernels hold rows as loaded and unpack an element where they use it
// (raw_get): for 16-bit types half the registers of the elements held one a register, which is
// what ptxas made of Vec<T>.
template <class T> __device__ __forceinline__ typename Elem<T>::acc raw_get(const Raw& r, int k);
template <> __device__ __forceinline__ float raw_get<float>(const Raw& r, int k) { return __uint_as_float(r.u[k]); }
template <> __device__ __forceinline__ double raw_get<double>(const Raw& r, int k) {
    return __hiloint2double((int)r.u[2 * k + 1], (int)r.u[2 * k]);
}
template <> __device__ __forceinline__ float raw_get<__nv_bfloat16>(const Raw& r, int k) {
    const unsigned w = r.u[k >> 1];
    return __uint_as_float((k & 1) ? (w & 0xffff0000u) : (w << 16));  // bf16 is fp32's top half
}
template <> __device__ __forceinline__ float raw_get<__half>(const Raw& r, int k) {
    const unsigned short b = (unsigned short)((k & 1) ? r.u[k >> 1] >> 16 : r.u[k >> 1] & 0xffffu);
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(b));
    return f;
}

// element k of a Raw as T, and T into element k (the bits, unconverted)
template <class T> __device__ __forceinline__ T raw_elem(const Raw& r, int k) {
    constexpr int W = sizeof(T) / 4 ? sizeof(T) / 4 : 1, P = 4 / sizeof(T) ? 4 / sizeof(T) : 1;
    T e;
    if (sizeof(T) == 2) {
        const unsigned short b = (unsigned short)(r.u[k / P] >> (16 * (k % P)));
        *reinterpret_cast<unsigned short*>(&e) = b;
    } else {
#pragma unroll
        for (int i = 0; i < W; ++i) reinterpret_cast<unsigned*>(&e)[i] = r.u[k * W + i];
    }
    return e;
}
template <class T> __device__ __forceinline__ void raw_put(Raw& r, int k, T e) {
    constexpr int W = sizeof(T) / 4 ? sizeof(T) / 4 : 1, P = 4 / sizeof(T) ? 4 / sizeof(T) : 1;
    if (sizeof(T) == 2) {
        const unsigned b = *reinterpret_cast<const unsigned short*>(&e), sh = 16 * (k % P);
        r.u[k / P] = (r.u[k / P] & ~(0xffffu << sh)) | (b << sh);
    } else {
#pragma unroll
        for (int i = 0; i < W; ++i) r.u[k * W + i] = reinterpret_cast<const unsigned*>(&e)[i];
    }
}

// Two floats as two 16-bit T in one word (lo in the low half), rounded to nearest even: one
// instruction for both on sm_80+ (cvt.rn.{bf16,f16}x2.f32).
template <class T> __device__ __forceinline__ unsigned pack2(float lo, float hi);
template <> __device__ __forceinline__ unsigned pack2<__nv_bfloat16>(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));  // sm_80+, as Elem's store
    return r;
}
template <> __device__ __forceinline__ unsigned pack2<__half>(float lo, float hi) {
#if __CUDA_ARCH__ >= 800
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#else
    __half a = Elem<__half>::store(lo), b = Elem<__half>::store(hi);
    return (unsigned)*reinterpret_cast<unsigned short*>(&a) | ((unsigned)*reinterpret_cast<unsigned short*>(&b) << 16);
#endif
}

template <class T, class A> __device__ __forceinline__ Raw raw_pack(const A* in) {
    Raw r;
    if constexpr (sizeof(T) == 2) {
#pragma unroll
        for (int i = 0; i < 4; ++i) r.u[i] = pack2<T>(in[2 * i], in[2 * i + 1]);
    } else if constexpr (sizeof(T) == 4) {
#pragma unroll
        for (int i = 0; i < 4; ++i) r.u[i] = __float_as_uint(in[i]);
    } else {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            r.u[2 * i] = (unsigned)__double2loint(in[i]);
            r.u[2 * i + 1] = (unsigned)__double2hiint(in[i]);
        }
    }
    return r;
}

// The long-row kernels read a row more than once. The first read can copy the raw elements
// into shared memory (`cache`, one row per block); later reads take them from there.
// mode 0: global only; 1: global, and fill the cache; 2: from the cache.
template <class T, class A>
__device__ __forceinline__ void load_row(const T* row, T* cache, int mode, long long j, long long n,
                                         bool vec, A* out, A pad) {
    constexpr int N = Vec<T>::N;
    const T* src = mode == 2 ? cache : row;
    if (vec && j + N <= n) {
        Vec<T> w = *reinterpret_cast<const Vec<T>*>(src + j);
        if (mode == 1) *reinterpret_cast<Vec<T>*>(cache + j) = w;
#pragma unroll
        for (int k = 0; k < N; ++k) out[k] = Elem<T>::load(w.v[k]);
    } else {
#pragma unroll
        for (int k = 0; k < N; ++k) {
            if (j + k < n) {
                T e = src[j + k];
                if (mode == 1) cache[j + k] = e;
                out[k] = Elem<T>::load(e);
            } else {
                out[k] = pad;
            }
        }
    }
}

// L2 eviction policies for ld/st ... L2::cache_hint (sm_80+; 0 on older devices, whose callers load plainly):
// norm_l2.cu's two passes, rotary.cuh's tables
__device__ __forceinline__ unsigned long long l2_keep() {
    unsigned long long p = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
#endif
    return p;
}
__device__ __forceinline__ unsigned long long l2_first() {
    unsigned long long p = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
#endif
    return p;
}

}  // namespace opsmith

// Dynamic shared memory of the long-row kernels (one declaration for every element type).
extern __shared__ __align__(16) unsigned char opsmith_dyn_smem[];
