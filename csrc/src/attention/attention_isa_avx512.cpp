// The paged-attention kernel compiled for AVX-512F (selected at run time).
// Only AVX512F instructions are used, so any AVX-512 CPU runs it; bf16 K/V
// are widened in registers (a shift), which halves the bytes read.
#include <cstdint>

#include "attention/attention_cpu.h"
#include "common/isa_target.h"
#include "runtime/internal.h"

#if LC_ISA_X86
#include <immintrin.h>

LC_ISA_BEGIN("avx512f,avx2,fma")

#include "common/simd_avx512.h"

namespace lc::attn {
namespace {

struct Avx512Ops {
    using V = __m512;
    static constexpr int W = 16;
    static constexpr int kRegs = 32;     // vector registers
    static constexpr int kRowBlock = 4;  // query rows per register block
    static constexpr bool kTransposedQk = true;

    static void prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0); }
    static V zero() { return _mm512_setzero_ps(); }
    static V set1(float x) { return _mm512_set1_ps(x); }
    static V load(const float* p) { return _mm512_loadu_ps(p); }
    static V load(const uint16_t* p) {
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    static void store(float* p, V x) { _mm512_storeu_ps(p, x); }
    static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
    static V add(V a, V b) { return _mm512_add_ps(a, b); }
    static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
    static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
    static V div(V a, V b) { return _mm512_div_ps(a, b); }
    static V max(V a, V b) { return _mm512_max_ps(a, b); }
    static float hsum(V x) { return _mm512_reduce_add_ps(x); }
    static float hmax(V x) { return _mm512_reduce_max_ps(x); }

    static __m256 fold(V x) {
        const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1));
        return _mm256_add_ps(_mm512_castps512_ps256(x), hi);
    }
    // dst[i] = sum of the lanes of a[i], i < 8: fold to 8 lanes, then the
    // transposing hadd tree.
    static void hsum8(const V* a, float* dst) {
        const __m256 t0 = _mm256_hadd_ps(fold(a[0]), fold(a[1]));
        const __m256 t1 = _mm256_hadd_ps(fold(a[2]), fold(a[3]));
        const __m256 t2 = _mm256_hadd_ps(fold(a[4]), fold(a[5]));
        const __m256 t3 = _mm256_hadd_ps(fold(a[6]), fold(a[7]));
        const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
        _mm256_storeu_ps(dst, _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20),
                                            _mm256_permute2f128_ps(u0, u1, 0x31)));
    }
    static V lo(V a, V b) {  // 64-bit halves interleaved
        return _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)));
    }
    static V hi(V a, V b) {
        return _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)));
    }
    // r[i][j] <-> r[j][i] for 16 x 16 floats: pairs of rows interleaved (ps, then pd units)
    // give each 128-bit lane L of t[4g + k] the column 4L + k of rows 4g .. 4g + 3; two
    // rounds of lane shuffles then gather those four lanes of one column.
    static void transpose(V* r) {
        V t[16];
        for (int i = 0; i < 16; i += 2) {
            t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
            t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
        }
        V u[16];  // u[4g + k]: lane L = column 4L + k of rows 4g .. 4g + 3
        for (int g = 0; g < 4; ++g) {
            u[4 * g + 0] = lo(t[4 * g], t[4 * g + 2]);
            u[4 * g + 1] = hi(t[4 * g], t[4 * g + 2]);
            u[4 * g + 2] = lo(t[4 * g + 1], t[4 * g + 3]);
            u[4 * g + 3] = hi(t[4 * g + 1], t[4 * g + 3]);
        }
        for (int k = 0; k < 4; ++k) {
            const V even01 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0x88);  // lanes 0, 2 of each
            const V odd01 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0xdd);   // lanes 1, 3
            const V even23 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0x88);
            const V odd23 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0xdd);
            r[k] = _mm512_shuffle_f32x4(even01, even23, 0x88);       // lane 0: column k
            r[8 + k] = _mm512_shuffle_f32x4(even01, even23, 0xdd);   // lane 2: column 8 + k
            r[4 + k] = _mm512_shuffle_f32x4(odd01, odd23, 0x88);     // lane 1: column 4 + k
            r[12 + k] = _mm512_shuffle_f32x4(odd01, odd23, 0xdd);    // lane 3: column 12 + k
        }
    }
    // As Avx2Ops::exp (simd_avx512.h).
    static V exp(V x) { return simd512::exp(x); }
};

}  // namespace
}  // namespace lc::attn

#include "attention/attention_kernel.h"

namespace lc::attn {

void run_item_avx512(const Job& job, const WorkItem& item, const WorkItem* next) {
    kernel::run_item_any<Avx512Ops>(job, item, next);
}

void merge_split_avx512(const Job& job, const WorkItem& first, int32_t chunks) {
    kernel::merge_split_any<Avx512Ops>(job, first, chunks);
}

}  // namespace lc::attn

LC_ISA_END()

#else  // not x86: never selected (best_isa() reports scalar)

namespace lc::attn {
void run_item_avx512(const Job&, const WorkItem&, const WorkItem*) {
    fail(LC_ERR_INTERNAL, "AVX-512 kernel called on a non-x86 build");
}
void merge_split_avx512(const Job&, const WorkItem&, int32_t) {
    fail(LC_ERR_INTERNAL, "AVX-512 kernel called on a non-x86 build");
}
}  // namespace lc::attn

#endif
