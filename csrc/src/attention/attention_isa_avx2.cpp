// The paged-attention kernel compiled for AVX2 + FMA (selected at run time;
// the rest of the build assumes no more than the baseline x86-64 ISA).
#include <cstdint>

#include "attention/attention_cpu.h"
#include "common/isa_target.h"
#include "runtime/internal.h"

#if LC_ISA_X86
#include <immintrin.h>

LC_ISA_BEGIN("avx2,fma")

#include "common/simd_avx2.h"

namespace lc::attn {
namespace {

struct Avx2Ops {
    using V = __m256;
    static constexpr int W = 8;
    static constexpr int kRegs = 16;     // vector registers
    static constexpr int kRowBlock = 3;  // query rows per register block
    static constexpr bool kTransposedQk = true;

    static void prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0); }
    static V zero() { return _mm256_setzero_ps(); }
    static V set1(float x) { return _mm256_set1_ps(x); }
    static V load(const float* p) { return _mm256_loadu_ps(p); }
    // bf16 bits -> fp32: widen to 32 bits and shift into the high half.
    static V load(const uint16_t* p) {
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    static void store(float* p, V x) { _mm256_storeu_ps(p, x); }
    static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
    static V add(V a, V b) { return _mm256_add_ps(a, b); }
    static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
    static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
    static V div(V a, V b) { return _mm256_div_ps(a, b); }
    static V max(V a, V b) { return _mm256_max_ps(a, b); }

    static float hsum4(__m128 x) {
        x = _mm_add_ps(x, _mm_movehl_ps(x, x));
        x = _mm_add_ss(x, _mm_movehdup_ps(x));
        return _mm_cvtss_f32(x);
    }
    static float hsum(V x) {
        return hsum4(_mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1)));
    }
    static float hmax(V x) {
        __m128 y = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
        y = _mm_max_ps(y, _mm_movehl_ps(y, y));
        y = _mm_max_ss(y, _mm_movehdup_ps(y));
        return _mm_cvtss_f32(y);
    }
    // dst[i] = sum of the lanes of a[i], i < 8, by a transposing hadd tree.
    static void hsum8(const V* a, float* dst) {
        const V t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
        const V t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
        const V u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
        _mm256_storeu_ps(dst, _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20),
                                            _mm256_permute2f128_ps(u0, u1, 0x31)));
    }
    // r[i][j] <- r[j][i] for an 8 x 8 block.
    static void transpose(V* r) { simd::transpose8(r); }
    // exp(x) (Cephes polynomial, ~1 ulp); exactly 0 below -87.3, so -inf masks become 0.
    static V exp(V x) { return simd::exp(x); }
};

}  // namespace
}  // namespace lc::attn

#include "attention/attention_kernel.h"

namespace lc::attn {

void run_item_avx2(const Job& job, const WorkItem& item, const WorkItem* next) {
    kernel::run_item_any<Avx2Ops>(job, item, next);
}

void merge_split_avx2(const Job& job, const WorkItem& first, int32_t chunks) {
    kernel::merge_split_any<Avx2Ops>(job, first, chunks);
}

}  // namespace lc::attn

LC_ISA_END()

#else  // not x86: never selected (best_isa() reports scalar)

namespace lc::attn {
void run_item_avx2(const Job&, const WorkItem&, const WorkItem*) {
    fail(LC_ERR_INTERNAL, "AVX2 kernel called on a non-x86 build");
}
void merge_split_avx2(const Job&, const WorkItem&, int32_t) {
    fail(LC_ERR_INTERNAL, "AVX2 kernel called on a non-x86 build");
}
}  // namespace lc::attn

#endif
