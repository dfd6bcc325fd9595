// AVX2 + FMA variants of the elementwise row kernels (selected at run time).
#include "elementwise.h"

#include <cmath>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif

namespace lc::elementwise {
namespace {

inline float hsum(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    return _mm_cvtss_f32(_mm_add_ss(a, _mm_movehdup_ps(a)));
}

void rms_row(const float* x, float* res, const float* w, float eps, int64_t n, float* out) {
    const int64_t n8 = n & ~int64_t(7);
    const float* src = x;
    if (res) {
        for (int64_t i = 0; i < n8; i += 8)
            _mm256_storeu_ps(res + i, _mm256_add_ps(_mm256_loadu_ps(res + i), _mm256_loadu_ps(x + i)));
        for (int64_t i = n8; i < n; ++i) res[i] += x[i];
        src = res;
    }
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256 v0 = _mm256_loadu_ps(src + i), v1 = _mm256_loadu_ps(src + i + 8);
        a0 = _mm256_fmadd_ps(v0, v0, a0);
        a1 = _mm256_fmadd_ps(v1, v1, a1);
    }
    float ss = hsum(_mm256_add_ps(a0, a1));
    for (; i < n; ++i) ss += src[i] * src[i];
    const float inv = 1.0f / std::sqrt(ss / float(n) + eps);
    const __m256 vinv = _mm256_set1_ps(inv);
    for (i = 0; i < n8; i += 8)
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(w + i),
                                                _mm256_mul_ps(_mm256_loadu_ps(src + i), vinv)));
    for (; i < n; ++i) out[i] = w[i] * (src[i] * inv);
}

// exp(x) for x <= 0: x = n ln2 + r, Cephes degree-6 polynomial (relative error
// ~1e-7); exp(x < -87) = 0.
inline __m256 exp_neg(__m256 x) {
    const __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_LT_OQ);
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(tiny, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

// silu(g) * u with sigmoid(g) = 1 / (1 + e) for g >= 0 and e / (1 + e) below,
// e = exp(-|g|), so exp never overflows.
inline __m256 silu_mul8(__m256 g, __m256 u) {
    const __m256 absg = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), g);
    const __m256 e = exp_neg(_mm256_sub_ps(_mm256_setzero_ps(), absg));
    const __m256 num = _mm256_blendv_ps(_mm256_set1_ps(1.0f), e,
                                        _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_LT_OQ));
    const __m256 sig = _mm256_div_ps(num, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
    return _mm256_mul_ps(_mm256_mul_ps(g, sig), u);
}

void silu_mul_row(const float* g, const float* u, int64_t n, float* out) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, silu_mul8(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i)));
    if (i < n) {
        alignas(32) float gb[8] = {}, ub[8] = {}, ob[8];
        for (int64_t j = i; j < n; ++j) gb[j - i] = g[j], ub[j - i] = u[j];
        _mm256_store_ps(ob, silu_mul8(_mm256_load_ps(gb), _mm256_load_ps(ub)));
        for (int64_t j = i; j < n; ++j) out[j] = ob[j - i];
    }
}

}  // namespace

const Kernels& avx2_kernels() {
    static const Kernels k{rms_row, silu_mul_row};
    return k;
}

}  // namespace lc::elementwise

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#else  // not x86: never selected

namespace lc::elementwise {
const Kernels& avx2_kernels() { return scalar_kernels(); }
}  // namespace lc::elementwise

#endif
