// AVX-512F variants of the elementwise row kernels (selected at run time): the
// AVX2 file's loops on 16 lanes, the tail of a row done under a mask rather than
// through a scalar or buffered loop.
#include "common/isa_target.h"
#include "elementwise/elementwise.h"

#include <cmath>

#if LC_ISA_X86
#include <immintrin.h>

LC_ISA_BEGIN("avx512f,avx2,fma")

#include "common/simd_avx512.h"

namespace lc::elementwise {
namespace {

using simd512::head;

void rms_row(const float* x, float* res, const float* w, float eps, int64_t n, float* out) {
    const int64_t n16 = n & ~int64_t(15);
    const __mmask16 tail = head(n - n16);
    const float* src = x;
    if (res) {
        for (int64_t i = 0; i < n16; i += 16)
            _mm512_storeu_ps(res + i, _mm512_add_ps(_mm512_loadu_ps(res + i), _mm512_loadu_ps(x + i)));
        if (tail)
            _mm512_mask_storeu_ps(res + n16, tail, _mm512_add_ps(_mm512_maskz_loadu_ps(tail, res + n16),
                                                                 _mm512_maskz_loadu_ps(tail, x + n16)));
        src = res;
    }
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m512 v0 = _mm512_loadu_ps(src + i), v1 = _mm512_loadu_ps(src + i + 16);
        a0 = _mm512_fmadd_ps(v0, v0, a0);
        a1 = _mm512_fmadd_ps(v1, v1, a1);
    }
    for (; i < n16; i += 16) {
        const __m512 v = _mm512_loadu_ps(src + i);
        a0 = _mm512_fmadd_ps(v, v, a0);
    }
    if (tail) {
        const __m512 v = _mm512_maskz_loadu_ps(tail, src + n16);
        a1 = _mm512_fmadd_ps(v, v, a1);
    }
    const float ss = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
    const float inv = 1.0f / std::sqrt(ss / float(n) + eps);
    const __m512 vinv = _mm512_set1_ps(inv);
    for (i = 0; i < n16; i += 16)
        _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_loadu_ps(w + i),
                                                _mm512_mul_ps(_mm512_loadu_ps(src + i), vinv)));
    if (tail)
        _mm512_mask_storeu_ps(out + n16, tail,
                              _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, w + n16),
                                            _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, src + n16), vinv)));
}

// As the AVX2 silu_mul8: sigmoid from e = exp(-|g|), so exp never overflows.
inline __m512 silu_mul16(__m512 g, __m512 u) {
    const __m512 one = _mm512_set1_ps(1.0f);
    const __m512 absg = _mm512_abs_ps(g);
    const __m512 e = simd512::exp(_mm512_sub_ps(_mm512_setzero_ps(), absg));
    const __mmask16 neg = _mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_LT_OQ);
    const __m512 num = _mm512_mask_blend_ps(neg, one, e);
    const __m512 sig = _mm512_div_ps(num, _mm512_add_ps(one, e));
    return _mm512_mul_ps(_mm512_mul_ps(g, sig), u);
}

void silu_mul_row(const float* g, const float* u, int64_t n, float* out) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(out + i, silu_mul16(_mm512_loadu_ps(g + i), _mm512_loadu_ps(u + i)));
    if (i < n) {
        const __mmask16 tail = head(n - i);
        _mm512_mask_storeu_ps(out + i, tail, silu_mul16(_mm512_maskz_loadu_ps(tail, g + i),
                                                        _mm512_maskz_loadu_ps(tail, u + i)));
    }
}

// As in elementwise_avx2.cpp: a product kept rounded on its own (no FMA contraction).
inline __m512 rounded(__m512 v) {
    __asm__("" : "+v"(v));
    return v;
}

// x1[i], x2[i] = x1 c - x2 s, x2 c + x1 s (the scalar kernel's products, no fusing).
void rope_head(float* x1, const float* c, const float* s, int64_t half) {
    float* x2 = x1 + half;
    for (int64_t i = 0; i < half; i += 16) {
        const __mmask16 m = half - i >= 16 ? __mmask16(0xffff) : head(half - i);
        const __m512 a = _mm512_maskz_loadu_ps(m, x1 + i), b = _mm512_maskz_loadu_ps(m, x2 + i);
        const __m512 vc = _mm512_maskz_loadu_ps(m, c + i), vs = _mm512_maskz_loadu_ps(m, s + i);
        _mm512_mask_storeu_ps(x1 + i, m, _mm512_sub_ps(rounded(_mm512_mul_ps(a, vc)),
                                                       rounded(_mm512_mul_ps(b, vs))));
        _mm512_mask_storeu_ps(x2 + i, m, _mm512_add_ps(rounded(_mm512_mul_ps(b, vc)),
                                                       rounded(_mm512_mul_ps(a, vs))));
    }
}

}  // namespace

const Kernels& avx512_kernels() {
    static const Kernels k{rms_row, silu_mul_row, rope_head};
    return k;
}

}  // namespace lc::elementwise

LC_ISA_END()

#else  // not x86: never selected

namespace lc::elementwise {
const Kernels& avx512_kernels() { return scalar_kernels(); }
}  // namespace lc::elementwise

#endif
