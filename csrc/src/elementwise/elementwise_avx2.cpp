// AVX2 + FMA variants of the elementwise row kernels (selected at run time).
#include "common/isa_target.h"
#include "elementwise/elementwise.h"

#include <cmath>

#if LC_ISA_X86
#include <immintrin.h>

LC_ISA_BEGIN("avx2,fma")

#include "common/simd_avx2.h"

namespace lc::elementwise {
namespace {

using simd::hsum;

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

// silu(g) * u with sigmoid(g) = 1 / (1 + e) for g >= 0 and e / (1 + e) below,
// e = exp(-|g|), so exp never overflows.
inline __m256 silu_mul8(__m256 g, __m256 u) {
    const __m256 absg = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), g);
    const __m256 e = simd::exp(_mm256_sub_ps(_mm256_setzero_ps(), absg));
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

// Keeps a product rounded on its own: the compiler may not fuse it into the add or
// subtract that follows (which -ffp-contract would do under an FMA target), so every
// variant rounds as the scalar kernel and torch's rotate_half do.
template <class T>
inline T rounded(T v) {
    __asm__("" : "+x"(v));
    return v;
}

// As the scalar kernel's products and sums (no fusing), 8 lanes at a time.
void rope_head(float* x1, const float* c, const float* s, int64_t half) {
    float* x2 = x1 + half;
    int64_t i = 0;
    for (; i + 8 <= half; i += 8) {
        const __m256 a = _mm256_loadu_ps(x1 + i), b = _mm256_loadu_ps(x2 + i);
        const __m256 vc = _mm256_loadu_ps(c + i), vs = _mm256_loadu_ps(s + i);
        _mm256_storeu_ps(x1 + i, _mm256_sub_ps(rounded(_mm256_mul_ps(a, vc)),
                                               rounded(_mm256_mul_ps(b, vs))));
        _mm256_storeu_ps(x2 + i, _mm256_add_ps(rounded(_mm256_mul_ps(b, vc)),
                                               rounded(_mm256_mul_ps(a, vs))));
    }
    for (; i < half; ++i) {
        const float a = x1[i], b = x2[i];
        x1[i] = rounded(a * c[i]) - rounded(b * s[i]);
        x2[i] = rounded(b * c[i]) + rounded(a * s[i]);
    }
}

}  // namespace

const Kernels& avx2_kernels() {
    static const Kernels k{rms_row, silu_mul_row, rope_head};
    return k;
}

}  // namespace lc::elementwise

LC_ISA_END()

#else  // not x86: never selected

namespace lc::elementwise {
const Kernels& avx2_kernels() { return scalar_kernels(); }
}  // namespace lc::elementwise

#endif
