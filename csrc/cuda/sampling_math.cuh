// Device-side arithmetic of the sampler, mirroring the CPU sampler
// (csrc/src/sampling/sampling_kernels_impl.h) so that draws and logprobs agree:
// sanitizing, the polynomial exp/log of the dense race (one source for both:
// csrc/src/common/fast_math.h), order-preserving keys and block-wide reductions.
#pragma once

#include <cfloat>
#include <cstdint>

#include "common/fast_math.h"

namespace lc::cuda::samp {

constexpr int kThreads = 1024;  // one block per row
constexpr int kWarps = kThreads / 32;

// NaN -> -inf (masked), +inf -> FLT_MAX: no later subtraction or exp makes a NaN.
__device__ __forceinline__ float sanitize(float v) {
    v = v != v ? -INFINITY : v;
    return v > FLT_MAX ? FLT_MAX : v;
}

// exp(x) for x <= 0 (x may be -inf): the CPU sampler's Cephes-style polynomial
// (common/fast_math.h).
__device__ __forceinline__ float exp_neg(float x) {
    namespace fm = lc::fast_math;
    const float xc = x < fm::kNegMin ? fm::kNegMin : x;
    const float n = fm::exp_round(xc);
    const float p = fm::exp_reduced(xc, n);
    const float scale = __uint_as_float(uint32_t(int32_t(n) + 127) << 23);
    return x < fm::kNegMin ? 0.0f : p * scale;
}

// log(u) for u in (0, 1]: the CPU sampler's Cephes logf (common/fast_math.h).
__device__ __forceinline__ float log_pos(float u) {
    const uint32_t b = __float_as_uint(u);
    float e = float(int32_t(b >> 23) - 127);
    float m = __uint_as_float((b & 0x007fffffu) | 0x3f800000u);  // [1, 2)
    const bool big = m > lc::fast_math::kSqrt2;
    m = big ? m * 0.5f : m;
    e = big ? e + 1.0f : e;
    return lc::fast_math::log_reduced(m - 1.0f, e);
}

// Order-preserving key: a > b (as floats) <=> key(a) > key(b). -0 is folded
// into +0 because the CPU compares values, for which they are equal.
__device__ __forceinline__ uint32_t order_key(float v) {
    if (v == 0.0f) v = 0.0f;
    const uint32_t b = __float_as_uint(v);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float key_value(uint32_t k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// "Better" order of the sampler (higher value, then lower token id) as one
// integer: larger is better. Never 0 for a token id < 2^31.
__device__ __forceinline__ uint64_t rank_key(uint32_t value_key, int32_t token) {
    return (uint64_t(value_key) << 32) | uint64_t(~uint32_t(token));
}
__device__ __forceinline__ int32_t rank_token(uint64_t k) { return int32_t(~uint32_t(k)); }

struct Max {
    template <class T>
    __device__ __forceinline__ T operator()(T a, T b) const {
        return a > b ? a : b;
    }
};
struct Min {
    template <class T>
    __device__ __forceinline__ T operator()(T a, T b) const {
        return a < b ? a : b;
    }
};
struct Sum {
    template <class T>
    __device__ __forceinline__ T operator()(T a, T b) const {
        return a + b;
    }
};

// Every thread of the block gets op over all threads' v. `sm` holds kWarps
// values of T; the trailing barrier lets the caller reuse it at once.
template <class T, class Op>
__device__ __forceinline__ T block_reduce(T v, Op op, T* sm) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (lane == 0) sm[warp] = v;
    __syncthreads();
    T r = sm[0];
    for (int w = 1; w < kWarps; ++w) r = op(r, sm[w]);
    __syncthreads();
    return r;
}

}  // namespace lc::cuda::samp
