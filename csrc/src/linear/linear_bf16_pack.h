// The activations of the packed bf16 kernels (vdpbf16ps in linear_bf16_avx512.cpp,
// the AMX tiles in linear_bf16_amx.cpp): x rounded to bf16 by one function, so
// that both kernels multiply the same numbers.
//
// Include only inside a translation unit's AVX512_BF16 target region: the
// function has internal linkage, one copy per kernel object (see
// tests/cpp/check_isa_objects.py on shared inline code).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <immintrin.h>

#include "linear/linear.h"

namespace lc::linear {
namespace {

// xb[m][kk] = (bf16(x[m][2kk]), bf16(x[m][2kk + 1])) for m < M, 2kk < K, round to
// nearest even (vcvtne2ps2bf16, f32_to_bf16 for the last few); a missing
// x[m][K] (odd K) and the pairs from (K+1)/2 to `stride` (pairs per row) are
// zero, and so are rows M .. `rows` - 1 (padding for whole tiles).
void pack_bf16_pairs(const Job& job, uint32_t* xb, int64_t stride, int64_t rows) {
    const int64_t K = job.K, K32 = K & ~int64_t(31), K2 = (K + 1) / 2;
    if (rows > job.M) std::memset(xb + job.M * stride, 0, size_t((rows - job.M) * stride) * 4);
    parallel_for(job.M, std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(1, K)),
                 [&](int64_t m0, int64_t m1) {
        for (int64_t m = m0; m < m1; ++m) {
            const float* x = job.x + m * job.ldx;
            uint32_t* dst = xb + m * stride;
            int64_t k = 0;
            for (; k < K32; k += 32) {
                // cvtne2ps: the second operand fills the low 16 words.
                const __m512bh h = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + k + 16),
                                                       _mm512_loadu_ps(x + k));
                _mm512_storeu_si512(dst + k / 2, (__m512i)h);
            }
            for (; k < K; k += 2) {
                const float lo = x[k], hi = k + 1 < K ? x[k + 1] : 0.0f;
                dst[k / 2] = uint32_t(f32_to_bf16(lo)) | uint32_t(f32_to_bf16(hi)) << 16;
            }
            std::fill(dst + K2, dst + stride, 0u);
        }
    });
}

}  // namespace
}  // namespace lc::linear
