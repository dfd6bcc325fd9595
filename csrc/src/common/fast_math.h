// The exp and log approximations of the core, written once for the C++ kernels
// and the CUDA kernels (csrc/cuda/sampling_math.cuh): same constants, same
// operations in the same order, so a CPU draw and a GPU draw agree.
//
// exp: x = n ln2 + r (ln2 split in two so n * kLn2Hi is exact), then Cephes'
// expf polynomial of degree 6 in r: exp(r) ~= 1 + r + r^2 (kP0 r^5 + ... + kP5).
// Relative error about 1 ulp for |r| <= ln2 / 2. log: Cephes' logf on the
// mantissa in [sqrt(1/2), sqrt(2)).
//
// The templates take a float or a GCC vector of floats (the sampler's per-ISA
// loops) and do only arithmetic: the callers keep their own clamps, selects
// and bit casts (intrinsics, vector extensions or CUDA's __float_as_uint).
// They are always inlined, so the caller's target (FMA contraction included)
// compiles them as if written in place. The SIMD intrinsic exp of attention
// and the elementwise ops (simd_avx2.h, simd_avx512.h) uses the constants.
#pragma once

#if defined(__CUDACC__)
#define LLMCORE_HD __host__ __device__ __forceinline__
#else
#define LLMCORE_HD inline __attribute__((always_inline))
#endif

namespace lc::fast_math {

constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;
constexpr float kLn2Lo = -2.12194440e-4f;
constexpr float kP0 = 1.9875691500e-4f;
constexpr float kP1 = 1.3981999507e-3f;
constexpr float kP2 = 8.3334519073e-3f;
constexpr float kP3 = 4.1665795894e-2f;
constexpr float kP4 = 1.6666665459e-1f;
constexpr float kP5 = 5.0000001201e-1f;
// The SIMD exp() of attention and the elementwise ops: 0 below kMin (so -inf
// masks become 0), clamped at kMax.
constexpr float kMin = -87.3f;
constexpr float kMax = 88.3f;
// The sampler's exp_neg (x <= 0): 0 below kNegMin.
constexpr float kNegMin = -87.0f;
// Adding and subtracting 1.5 * 2^23 rounds a float to the nearest integer.
constexpr float kRoundMagic = 12582912.0f;
// log's mantissa fold: m > kSqrt2 is halved (and the exponent incremented).
constexpr float kSqrt2 = 1.41421356f;

// n = round(x log2 e), as a float (|x| well below 2^22).
template <class F>
LLMCORE_HD F exp_round(F x) {
    const F t = x * kLog2e;
    return (t + kRoundMagic) - kRoundMagic;
}

// exp(x - n ln2) for n = exp_round(x): the caller scales by 2^n.
template <class F>
LLMCORE_HD F exp_reduced(F x, F n) {
    F r = x - n * kLn2Hi;
    r = r - n * kLn2Lo;
    F p = F{} + kP0;
    p = p * r + kP1;
    p = p * r + kP2;
    p = p * r + kP3;
    p = p * r + kP4;
    p = p * r + kP5;
    return p * r * r + r + 1.0f;
}

// log(m 2^e) for f = m - 1, m in [sqrt(1/2), sqrt(2)) (the caller splits and
// folds the float's exponent e and mantissa m).
template <class F>
LLMCORE_HD F log_reduced(F f, F e) {
    const F z = f * f;
    F p = F{} + 7.0376836292e-2f;
    p = p * f - 1.1514610310e-1f;
    p = p * f + 1.1676998740e-1f;
    p = p * f - 1.2420140846e-1f;
    p = p * f + 1.4249322787e-1f;
    p = p * f - 1.6668057665e-1f;
    p = p * f + 2.0000714765e-1f;
    p = p * f - 2.4999993993e-1f;
    p = p * f + 3.3333331174e-1f;
    F y = f * z * p;
    y += e * kLn2Lo;
    y += -0.5f * z;
    return f + y + e * kLn2Hi;
}

}  // namespace lc::fast_math

