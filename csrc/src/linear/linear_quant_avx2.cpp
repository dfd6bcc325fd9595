// Quantized packed linear with AVX2 (linear_quant.h): the AVX-512 kernel's
// shape on 32-byte halves of a panel (columns 0-7, 8-15). Without VNNI the
// u8 x s8 dot of four quants is vpmaddubsw (pairs into s16) then vpmaddwd by
// ones (into s32). Q4 products fit s16; a Q8 pair could not (255 * 127 * 2),
// so Q8 quants are taken back to signed q = u - 128 and multiplied as
// |q| x sign(x, q), which fits, with no offset term. With int16 activations
// each 32-byte load splits into words (u0, u2) and (u1, u3) per lane and
// vpmaddwd adds their products with two activations straight into s32.
#include "common/isa_target.h"
#include "linear/linear_quant.h"

#if LC_ISA_X86
#include <immintrin.h>

LC_ISA_BEGIN("avx2,fma,f16c")

namespace lc::linear {
namespace {

constexpr int kMR = 4;

template <int32_t T, int R>
struct Micro {
    static void run(const Job& job, const QuantX& qx, int64_t p, int64_t m0, int nvalid) {
        const int64_t bb = quant::block_bytes(T), qb = quant::quant_bytes(T);
        const uint8_t* base = quant::block_at(*job.packed, p, 0);
        const __m256i lo4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1),
                      flip = _mm256_set1_epi8(char(0x80));
        alignas(32) float out[R][weight::kPanel];
        for (int h = 0; h < 2; ++h) {  // columns 8h .. 8h + 7
            __m256 acc[R];
            for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
            const uint8_t* blk = base + 32 * h;
            for (int64_t b = 0; b < qx.nb; ++b, blk += bb) {
                __m256i wq[8];
                if (T == quant::kQ8_0) {
                    for (int g = 0; g < 8; ++g)
                        wq[g] = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * g)), flip);
                } else {
                    for (int t = 0; t < 4; ++t) {
                        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * t));
                        wq[t] = _mm256_and_si256(v, lo4);
                        wq[t + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4);
                    }
                }
                const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk - 32 * h + qb + 16 * h)));
                const __m256 m = T == quant::kQ4_1
                    ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk - 32 * h + qb + 32 + 16 * h)))
                    : _mm256_setzero_ps();
                for (int r = 0; r < R; ++r) {
                    const int64_t i = (m0 + r) * qx.nb + b;
                    const int32_t* q = reinterpret_cast<const int32_t*>(qx.q + i * quant::kBlock);
                    const int32_t off = T == quant::kQ8_0 ? 0 : quant::offset(T);
                    __m256i dot = _mm256_set1_epi32(-off * qx.isum[i]);
                    for (int g = 0; g < 8; ++g) {
                        const __m256i x = _mm256_set1_epi32(q[g]);
                        const __m256i pr = T == quant::kQ8_0
                            ? _mm256_maddubs_epi16(_mm256_sign_epi8(wq[g], wq[g]), _mm256_sign_epi8(x, wq[g]))
                            : _mm256_maddubs_epi16(wq[g], x);
                        dot = _mm256_add_epi32(dot, _mm256_madd_epi16(pr, ones));
                    }
                    const __m256 s = _mm256_mul_ps(d, _mm256_set1_ps(qx.scale[i]));
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), s, acc[r]);
                    if (T == quant::kQ4_1) acc[r] = _mm256_fmadd_ps(m, _mm256_set1_ps(qx.ssum[i]), acc[r]);
                }
            }
            for (int r = 0; r < R; ++r) _mm256_store_ps(out[r] + 8 * h, acc[r]);
        }
        for (int r = 0; r < R; ++r) store_row(job, m0 + r, p * weight::kPanel, out[r], nvalid);
    }
};

// The int16-activation kernel: Micro's loads, halves and fp32 steps, groups
// outside rows so that a group's two word vectors are made once per block.
template <int32_t T, int R>
struct Micro16 {
    static void run(const Job& job, const QuantX& qx, int64_t p, int64_t m0, int nvalid) {
        const int64_t bb = quant::block_bytes(T), qb = quant::quant_bytes(T);
        const uint8_t* base = quant::block_at(*job.packed, p, 0);
        const __m256i lo4 = _mm256_set1_epi8(0x0f), words = _mm256_set1_epi32(0x00ff00ff);
        alignas(32) float out[R][weight::kPanel];
        for (int h = 0; h < 2; ++h) {  // columns 8h .. 8h + 7
            __m256 acc[R];
            for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
            const uint8_t* blk = base + 32 * h;
            for (int64_t b = 0; b < qx.nb; ++b, blk += bb) {
                const int32_t* q[R];
                __m256i dot[R];
                for (int r = 0; r < R; ++r) {
                    const int64_t i = (m0 + r) * qx.nb + b;
                    q[r] = reinterpret_cast<const int32_t*>(qx.q16 + i * quant::kBlock);
                    dot[r] = _mm256_set1_epi32(-quant::offset(T) * qx.isum[i]);
                }
                for (int g = 0; g < 8; ++g) {
                    __m256i v;
                    if (T == quant::kQ8_0) {
                        v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * g));
                    } else {
                        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * (g % 4)));
                        v = _mm256_and_si256(g < 4 ? raw : _mm256_srli_epi16(raw, 4), lo4);
                    }
                    const __m256i even = _mm256_and_si256(v, words);
                    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(v, 8), words);
                    for (int r = 0; r < R; ++r) {
                        dot[r] = _mm256_add_epi32(dot[r], _mm256_madd_epi16(even, _mm256_set1_epi32(q[r][2 * g])));
                        dot[r] = _mm256_add_epi32(dot[r], _mm256_madd_epi16(odd, _mm256_set1_epi32(q[r][2 * g + 1])));
                    }
                }
                const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk - 32 * h + qb + 16 * h)));
                const __m256 m = T == quant::kQ4_1
                    ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk - 32 * h + qb + 32 + 16 * h)))
                    : _mm256_setzero_ps();
                for (int r = 0; r < R; ++r) {
                    const int64_t i = (m0 + r) * qx.nb + b;
                    const __m256 s = _mm256_mul_ps(d, _mm256_set1_ps(qx.scale[i]));
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r]), s, acc[r]);
                    if (T == quant::kQ4_1) acc[r] = _mm256_fmadd_ps(m, _mm256_set1_ps(qx.ssum[i]), acc[r]);
                }
            }
            for (int r = 0; r < R; ++r) _mm256_store_ps(out[r] + 8 * h, acc[r]);
        }
        for (int r = 0; r < R; ++r) store_row(job, m0 + r, p * weight::kPanel, out[r], nvalid);
    }
};

int32_t hsum_epi32(__m256i v) {
    __m128i t4 = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0x4e));
    t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0xb1));
    return _mm_cvtsi128_si32(t4);
}

}  // namespace

// quantize_blocks_avx512's steps on four 8-lane quarters of a block; the words and bytes
// come back in order through vpackssdw / vpacksswb and a qword permute.
void quantize_blocks_avx2(const float* xs, int64_t ldx, int64_t nb, int64_t i0, int64_t i1,
                          int bits, const QuantXOut& out) {
    const bool wide = bits == 16;
    const float qmax = wide ? 32767.0f : 127.0f;
    const __m256i hi = _mm256_set1_epi32(int(qmax)), lo = _mm256_set1_epi32(-int(qmax));
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i order = _mm256_setr_epi8(0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15,
                                           0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15);
    for (int64_t i = i0; i < i1; ++i) {
        const float* x = xs + (i / nb) * ldx + (i % nb) * quant::kBlock;
        __m256 v[4];
        __m256 mx = _mm256_setzero_ps();
        for (int t = 0; t < 4; ++t) {
            v[t] = _mm256_loadu_ps(x + 8 * t);
            mx = _mm256_max_ps(_mm256_and_ps(v[t], magnitude), mx);
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
        const float amax = _mm_cvtss_f32(m4);
        const float s = amax / qmax, inv = s != 0.0f ? 1.0f / s : 0.0f;
        const __m256 vinv = _mm256_set1_ps(inv);
        __m256i q[4];
        for (int t = 0; t < 4; ++t)
            q[t] = _mm256_max_epi32(lo, _mm256_min_epi32(hi, _mm256_cvtps_epi32(_mm256_mul_ps(v[t], vinv))));
        // words 0-15 and 16-31 in order
        const __m256i w0 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[0], q[1]), 0xd8);
        const __m256i w1 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[2], q[3]), 0xd8);
        if (wide) {
            __m256i* dst = reinterpret_cast<__m256i*>(out.q16 + i * quant::kBlock);
            _mm256_storeu_si256(dst, _mm256_shuffle_epi8(w0, order));
            _mm256_storeu_si256(dst + 1, _mm256_shuffle_epi8(w1, order));
        } else {
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.q + i * quant::kBlock),
                                _mm256_permute4x64_epi64(_mm256_packs_epi16(w0, w1), 0xd8));
        }
        const int32_t half = hsum_epi32(_mm256_add_epi32(q[0], q[1]));
        const int32_t sum = half + hsum_epi32(_mm256_add_epi32(q[2], q[3]));
        out.scale[i] = s;
        out.isum[i] = sum;
        out.hsum[i] = half;
        out.ssum[i] = s * float(sum);
    }
}

void run_quant_avx2(const Job& job, const QuantX& qx) {
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
void run_quant_avx2(const Job&, const QuantX&) {
    fail(LC_ERR_INTERNAL, "AVX2 quantized linear kernel called on a non-x86 build");
}
void quantize_blocks_avx2(const float*, int64_t, int64_t, int64_t, int64_t, int,
                          const QuantXOut&) {
    fail(LC_ERR_INTERNAL, "AVX2 activation quantizer called on a non-x86 build");
}
}  // namespace lc::linear

#endif
