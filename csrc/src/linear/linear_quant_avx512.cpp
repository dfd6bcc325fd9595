// Quantized packed linear with AVX512_VNNI (linear_quant.h): per block, the
// 16 columns' quants come as 4 (Q4) or 8 (Q8) 64-byte loads, each lane four
// consecutive quants of one column, and vpdpbusd adds four u8 x s8 products
// per lane against four activations broadcast to all lanes (int8), or each
// load splits into two of words and vpdpwssd adds two s16 x s16 products per
// lane against two activations (int16: the same loads, two dots per group).
#include "common/isa_target.h"
#include "linear/linear_quant.h"

#if LC_ISA_X86
#include <immintrin.h>

LC_ISA_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")

namespace lc::linear {
namespace {

constexpr int kMR = 8;
constexpr int64_t kPrefetchBytes = 1024;

template <int32_t T, int R>
struct Micro {
    static void run(const Job& job, const QuantX& qx, int64_t p, int64_t m0, int nvalid) {
        const int64_t bb = quant::block_bytes(T), qb = quant::quant_bytes(T);
        const uint8_t* blk = quant::block_at(*job.packed, p, 0);
        const __m512i lo4 = _mm512_set1_epi8(0x0f);
        __m512 acc[R];
        for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
        for (int64_t b = 0; b < qx.nb; ++b, blk += bb) {
            if (m0 == 0) _mm_prefetch(reinterpret_cast<const char*>(blk) + kPrefetchBytes, _MM_HINT_T0);
            __m512i wq[8];
            if (T == quant::kQ8_0) {
                for (int g = 0; g < 8; ++g) wq[g] = _mm512_loadu_si512(blk + 64 * g);
            } else {
                for (int t = 0; t < 4; ++t) {
                    const __m512i v = _mm512_loadu_si512(blk + 64 * t);
                    wq[t] = _mm512_and_si512(v, lo4);
                    wq[t + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4);
                }
            }
            const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + qb)));
            const __m512 m = T == quant::kQ4_1
                ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + qb + 32)))
                : _mm512_setzero_ps();
            for (int r = 0; r < R; ++r) {
                const int64_t i = (m0 + r) * qx.nb + b;
                const int32_t* q = reinterpret_cast<const int32_t*>(qx.q + i * quant::kBlock);
                __m512i dot = _mm512_set1_epi32(-quant::offset(T) * qx.isum[i]);
                for (int g = 0; g < 8; ++g)
                    dot = _mm512_dpbusd_epi32(dot, wq[g], _mm512_set1_epi32(q[g]));
                const __m512 s = _mm512_mul_ps(d, _mm512_set1_ps(qx.scale[i]));
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), s, acc[r]);
                if (T == quant::kQ4_1) acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(qx.ssum[i]), acc[r]);
            }
        }
        store(job, acc, p, m0, nvalid);
    }

    static void store(const Job& job, const __m512* acc, int64_t p, int64_t m0, int nvalid) {
        const int64_t c0 = p * weight::kPanel;
        for (int r = 0; r < R; ++r) {
            if (job.out_dtype == LC_DTYPE_F32 && nvalid == weight::kPanel) {
                const __m512 bias = job.bias ? _mm512_loadu_ps(job.bias + c0) : _mm512_setzero_ps();
                _mm512_storeu_ps(static_cast<float*>(job.out) + (m0 + r) * job.ldo + c0,
                                 _mm512_add_ps(acc[r], bias));
                continue;
            }
            alignas(64) float v[weight::kPanel];
            _mm512_store_ps(v, acc[r]);
            store_row(job, m0 + r, c0, v, nvalid);
        }
    }
};

// The int16-activation kernel: Micro's loads and fp32 steps; per group g the
// lane's quants (u0..u3) become the words (u0, u2) and (u1, u3), made once and
// met by every row (groups outside rows: R dot registers, two word vectors).
template <int32_t T, int R>
struct Micro16 {
    static void run(const Job& job, const QuantX& qx, int64_t p, int64_t m0, int nvalid) {
        const int64_t bb = quant::block_bytes(T), qb = quant::quant_bytes(T);
        const uint8_t* blk = quant::block_at(*job.packed, p, 0);
        const __m512i lo4 = _mm512_set1_epi8(0x0f), words = _mm512_set1_epi32(0x00ff00ff);
        __m512 acc[R];
        for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
        for (int64_t b = 0; b < qx.nb; ++b, blk += bb) {
            if (m0 == 0) _mm_prefetch(reinterpret_cast<const char*>(blk) + kPrefetchBytes, _MM_HINT_T0);
            const int32_t* q[R];
            __m512i dot[R];
            for (int r = 0; r < R; ++r) {
                const int64_t i = (m0 + r) * qx.nb + b;
                q[r] = reinterpret_cast<const int32_t*>(qx.q16 + i * quant::kBlock);
                dot[r] = _mm512_set1_epi32(-quant::offset(T) * qx.isum[i]);
            }
            for (int g = 0; g < 8; ++g) {
                __m512i v;
                if (T == quant::kQ8_0) {
                    v = _mm512_loadu_si512(blk + 64 * g);
                } else {
                    const __m512i raw = _mm512_loadu_si512(blk + 64 * (g % 4));
                    v = _mm512_and_si512(g < 4 ? raw : _mm512_srli_epi16(raw, 4), lo4);
                }
                const __m512i even = _mm512_and_si512(v, words);
                const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(v, 8), words);
                for (int r = 0; r < R; ++r) {
                    dot[r] = _mm512_dpwssd_epi32(dot[r], even, _mm512_set1_epi32(q[r][2 * g]));
                    dot[r] = _mm512_dpwssd_epi32(dot[r], odd, _mm512_set1_epi32(q[r][2 * g + 1]));
                }
            }
            const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + qb)));
            const __m512 m = T == quant::kQ4_1
                ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + qb + 32)))
                : _mm512_setzero_ps();
            for (int r = 0; r < R; ++r) {
                const int64_t i = (m0 + r) * qx.nb + b;
                const __m512 s = _mm512_mul_ps(d, _mm512_set1_ps(qx.scale[i]));
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r]), s, acc[r]);
                if (T == quant::kQ4_1) acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(qx.ssum[i]), acc[r]);
            }
        }
        Micro<T, R>::store(job, acc, p, m0, nvalid);
    }
};

}  // namespace

// quantize_blocks_scalar's formula on two 16-lane halves of a block: the same max
// (NaN lanes dropped by max's second-operand rule, as std::max drops them), the same
// s and 1/s in scalar fp32, vcvtps2dq rounding to nearest even as lrint does.
void quantize_blocks_avx512(const float* xs, int64_t ldx, int64_t nb, int64_t i0, int64_t i1,
                            int bits, const QuantXOut& out) {
    const bool wide = bits == 16;
    const float qmax = wide ? 32767.0f : 127.0f;
    const __m512i hi = _mm512_set1_epi32(int(qmax)), lo = _mm512_set1_epi32(-int(qmax));
    // within each four words: x0 x2 x1 x3 (x16_index)
    const __m256i order = _mm256_setr_epi8(0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15,
                                           0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15);
    for (int64_t i = i0; i < i1; ++i) {
        const float* x = xs + (i / nb) * ldx + (i % nb) * quant::kBlock;
        const __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
        __m512 mx = _mm512_max_ps(_mm512_abs_ps(a), _mm512_setzero_ps());
        mx = _mm512_max_ps(_mm512_abs_ps(b), mx);
        const float amax = _mm512_reduce_max_ps(mx);
        const float s = amax / qmax, inv = s != 0.0f ? 1.0f / s : 0.0f;
        const __m512 vinv = _mm512_set1_ps(inv);
        const __m512i va = _mm512_max_epi32(lo, _mm512_min_epi32(hi, _mm512_cvtps_epi32(_mm512_mul_ps(a, vinv))));
        const __m512i vb = _mm512_max_epi32(lo, _mm512_min_epi32(hi, _mm512_cvtps_epi32(_mm512_mul_ps(b, vinv))));
        if (wide) {
            __m256i* q = reinterpret_cast<__m256i*>(out.q16 + i * quant::kBlock);
            _mm256_storeu_si256(q, _mm256_shuffle_epi8(_mm512_cvtsepi32_epi16(va), order));
            _mm256_storeu_si256(q + 1, _mm256_shuffle_epi8(_mm512_cvtsepi32_epi16(vb), order));
        } else {
            __m128i* q = reinterpret_cast<__m128i*>(out.q + i * quant::kBlock);
            _mm_storeu_si128(q, _mm512_cvtsepi32_epi8(va));
            _mm_storeu_si128(q + 1, _mm512_cvtsepi32_epi8(vb));
        }
        const int32_t half = _mm512_reduce_add_epi32(va);
        const int32_t sum = half + _mm512_reduce_add_epi32(vb);
        out.scale[i] = s;
        out.isum[i] = sum;
        out.hsum[i] = half;
        out.ssum[i] = s * float(sum);
    }
}

void run_quant_avx512(const Job& job, const QuantX& qx) {
    drive_quant<kMR>(job, [&](int64_t p, int64_t m0, int rows, int nvalid) {
        if (qx.q16)
            dispatch_rows<kMR, Micro16>(job.packed->qtype, rows, job, qx, p, m0, nvalid);
        else
            dispatch_rows<kMR, Micro>(job.packed->qtype, rows, job, qx, p, m0, nvalid);
    });
}

}  // namespace lc::linear

LC_ISA_END()

#else  // not x86-64: never selected

namespace lc::linear {
void run_quant_avx512(const Job&, const QuantX&) {
    fail(LC_ERR_INTERNAL, "AVX512_VNNI quantized linear kernel called on a non-x86 build");
}
void quantize_blocks_avx512(const float*, int64_t, int64_t, int64_t, int64_t, int,
                            const QuantXOut&) {
    fail(LC_ERR_INTERNAL, "AVX-512 activation quantizer called on a non-x86 build");
}
}  // namespace lc::linear

#endif
