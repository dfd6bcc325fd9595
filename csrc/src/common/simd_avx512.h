// Small AVX-512F building blocks shared by the kernels compiled for AVX-512.
// Include only inside a translation unit's AVX-512 target region (as
// simd_avx2.h is included inside an AVX2 one).
#pragma once

#include <immintrin.h>

#include "common/fast_math.h"

namespace lc::simd512 {
namespace {  // each including (AVX-512-target) translation unit gets its own copy

// simd::exp's polynomial on 16 lanes; scalef applies 2^n. Exactly 0 below -87.3
// (so -inf becomes 0), clamped above 88.3.
inline __m512 exp(__m512 x) {
    using namespace fast_math;
    const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kMin), _CMP_GE_OQ);
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(kMin)), _mm512_set1_ps(kMax));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
    __m512 p = _mm512_set1_ps(kP0);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP5));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_maskz_mov_ps(live, _mm512_scalef_ps(p, n));
}

// The first n < 16 lanes as a mask.
inline __mmask16 head(int64_t n) { return __mmask16((1u << n) - 1u); }

}  // namespace
}  // namespace lc::simd512
