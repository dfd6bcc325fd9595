// The K family's microkernel with AVX2 (linear_kquant.h): the AVX-512 kernel's
// steps on 32-byte halves of a panel (columns 0-7, then 8-15). int16
// activations: vpmaddwd on the words (u0, u2), (u1, u3); int8: vpmaddubsw on
// the bytes (u < 64, so a pair of products fits s16), then vpmaddwd by ones.
#include "common/isa_target.h"
#include "linear/linear_kquant.h"

#if LC_ISA_X86
#include <immintrin.h>

LC_ISA_BEGIN("avx2,fma,f16c")

namespace lc::linear {
namespace {

constexpr int kMR = 4;

__m256i load(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
__m256 ph(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
__m256 u8s(const uint8_t* p) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)))); }
__m256 i8s(const uint8_t* p) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)))); }

template <int32_t T, int R, bool Wide>
struct Kernel {
    static constexpr quant::Format F = *quant::format(T);
    static constexpr int H = quant::halves(T), G = 8 / H;

    // Group g's bytes for the columns of half x (q already offset by 32 x).
    static __m256i group(const uint8_t* q, int g) {
        const __m256i raw = load(q + 64 * (g % 4));
        const __m256i v = _mm256_and_si256(g < 4 ? raw : _mm256_srli_epi16(raw, 4), _mm256_set1_epi8(0x0f));
        if constexpr (quant::high_bits(T) == 1) {
            const __m256i hp = load(q + 256);
            const __m256i hb = g <= 4 ? _mm256_slli_epi16(hp, 4 - g) : _mm256_srli_epi16(hp, g - 4);
            return _mm256_or_si256(v, _mm256_and_si256(hb, _mm256_set1_epi8(0x10)));
        } else if constexpr (quant::high_bits(T) == 2) {
            const __m256i hp = load(q + 256 + 64 * (g / 4));
            const int sh = 4 - 2 * (g % 4);
            const __m256i hb = sh >= 0 ? _mm256_slli_epi16(hp, sh) : _mm256_srli_epi16(hp, 2);
            return _mm256_or_si256(v, _mm256_and_si256(hb, _mm256_set1_epi8(0x30)));
        }
        return v;
    }

    static void run(const Job& job, const QuantX& qx, int64_t p, int64_t m0, int nvalid) {
        const uint8_t* panel = static_cast<const uint8_t*>(job.packed->data) + p * quant::panel_bytes(T, job.K);
        alignas(32) float out[R][weight::kPanel];
        for (int x = 0; x < 2; ++x) {  // columns 8x .. 8x + 7
            __m256 acc[R];
            for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
            for (int64_t b = 0; b < qx.nb; ++b) {
                const int s = int(b % F.subs);
                const uint8_t* hdr = panel + b / F.subs * quant::unit_bytes(T);
                const uint8_t* q = hdr + F.header + s * F.sub + 32 * x;
                const __m256 d = ph(hdr + quant::kD + 16 * x);
                LC_UNROLL  // g below a constant: immediate shifts, fixed offsets
                for (int h = 0; h < H; ++h) {
                    __m256 sc = d;
                    if constexpr (T == quant::kQ6_K) sc = _mm256_mul_ps(d, i8s(hdr + quant::sc_row(T, s, h) + 8 * x));
                    else if constexpr (quant::superblock(T)) sc = _mm256_mul_ps(d, u8s(hdr + quant::sc_row(T, s, h) + 8 * x));
                    __m256i dot[R];
                    for (int r = 0; r < R; ++r)
                        dot[r] = _mm256_set1_epi32(-quant::koffset(T) * half_isum<H>(qx, (m0 + r) * qx.nb + b, h));
                    LC_UNROLL
                    for (int gg = 0; gg < G; ++gg) {
                        const int g = h * G + gg;
                        const __m256i v = group(q, g);
                        if constexpr (Wide) {
                            const __m256i words = _mm256_set1_epi32(0x00ff00ff);
                            const __m256i even = _mm256_and_si256(v, words);
                            const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(v, 8), words);
                            for (int r = 0; r < R; ++r) {
                                const int32_t* xq = reinterpret_cast<const int32_t*>(qx.q16 + ((m0 + r) * qx.nb + b) * quant::kBlock);
                                dot[r] = _mm256_add_epi32(dot[r], _mm256_madd_epi16(even, _mm256_set1_epi32(xq[2 * g])));
                                dot[r] = _mm256_add_epi32(dot[r], _mm256_madd_epi16(odd, _mm256_set1_epi32(xq[2 * g + 1])));
                            }
                        } else {
                            for (int r = 0; r < R; ++r) {
                                const int32_t* xq = reinterpret_cast<const int32_t*>(qx.q + ((m0 + r) * qx.nb + b) * quant::kBlock);
                                const __m256i pr = _mm256_maddubs_epi16(v, _mm256_set1_epi32(xq[g]));
                                dot[r] = _mm256_add_epi32(dot[r], _mm256_madd_epi16(pr, _mm256_set1_epi16(1)));
                            }
                        }
                    }
                    for (int r = 0; r < R; ++r) {
                        const __m256 sx = _mm256_mul_ps(sc, _mm256_set1_ps(qx.scale[(m0 + r) * qx.nb + b]));
                        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r]), sx, acc[r]);
                    }
                }
                if constexpr (quant::has_min(T)) {
                    __m256 mn = ph(hdr + quant::kMinRow + 16 * x);
                    if constexpr (T != quant::kQ5_1)  // -(Dmin * mn): the sign flipped exactly
                        mn = _mm256_xor_ps(_mm256_mul_ps(mn, u8s(hdr + quant::mn_row(s) + 8 * x)), _mm256_set1_ps(-0.0f));
                    for (int r = 0; r < R; ++r)
                        acc[r] = _mm256_fmadd_ps(mn, _mm256_set1_ps(qx.ssum[(m0 + r) * qx.nb + b]), acc[r]);
                }
            }
            for (int r = 0; r < R; ++r) _mm256_store_ps(out[r] + 8 * x, acc[r]);
        }
        for (int r = 0; r < R; ++r) store_row(job, m0 + r, p * weight::kPanel, out[r], nvalid);
    }
};

template <int32_t T, int R>
using Micro8 = Kernel<T, R, false>;
template <int32_t T, int R>
using Micro16 = Kernel<T, R, true>;

}  // namespace

void run_kquant_avx2(const Job& job, const QuantX& qx) {
    drive_quant<kMR>(job, [&](int64_t p, int64_t m0, int rows, int nvalid) {
        if (qx.q16)
            dispatch_krows<kMR, Micro16>(job.packed->qtype, rows, job, qx, p, m0, nvalid);
        else
            dispatch_krows<kMR, Micro8>(job.packed->qtype, rows, job, qx, p, m0, nvalid);
    });
}

}  // namespace lc::linear

LC_ISA_END()

#else  // not x86-64: never selected

namespace lc::linear {
void run_kquant_avx2(const Job&, const QuantX&) {
    fail(LC_ERR_INTERNAL, "AVX2 quantized linear kernel called on a non-x86 build");
}
}  // namespace lc::linear

#endif
