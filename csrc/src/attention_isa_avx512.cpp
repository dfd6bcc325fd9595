// The paged-attention kernel compiled for AVX-512F (selected at run time).
// Only AVX512F instructions are used, so any AVX-512 CPU runs it; bf16 K/V
// are widened in registers (a shift), which halves the bytes read.
#include <cstdint>

#include "attention_cpu.h"
#include "internal.h"
#include "exp_poly.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
// GCC 12's avx512fintrin.h self-initializes "undefined" vectors.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace lc::attn {
namespace {

struct Avx512Ops {
    using V = __m512;
    static constexpr int W = 16;
    static constexpr int kRegs = 32;     // vector registers
    static constexpr int kRowBlock = 4;  // query rows per register block
    static constexpr bool kTransposedQk = false;  // no transpose() here yet

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
    // As Avx2Ops::exp; scalef applies 2^n.
    static V exp(V x) {
        using namespace exp_poly;
        const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kMin), _CMP_GE_OQ);
        x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(kMin)), _mm512_set1_ps(kMax));
        const V n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        V r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
        r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
        V p = _mm512_set1_ps(kP0);
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP1));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP2));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP3));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP4));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP5));
        p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
        return _mm512_maskz_mov_ps(live, _mm512_scalef_ps(p, n));
    }
};

}  // namespace
}  // namespace lc::attn

#include "attention_kernel.h"

namespace lc::attn {

void run_item_avx512(const Job& job, const WorkItem& item, const WorkItem* next) {
    kernel::run_item_any<Avx512Ops>(job, item, next);
}

}  // namespace lc::attn

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif

#else  // not x86: never selected (best_isa() reports scalar)

namespace lc::attn {
void run_item_avx512(const Job&, const WorkItem&, const WorkItem*) {
    fail(LC_ERR_INTERNAL, "AVX-512 kernel called on a non-x86 build");
}
}  // namespace lc::attn

#endif
