// The K family's microkernel with AVX512_VNNI (linear_kquant.h): a panel's 16
// columns in one register; group g's quants are one 64-byte nibble load (low
// or high nibbles) or'ed with a shift of the high-bit plane, then met by every
// row: vpdpwssd on the words (u0, u2), (u1, u3) against int16 activations, or
// vpdpbusd on the bytes against int8 ones.
#include "common/isa_target.h"
#include "linear/linear_kquant.h"

#if LC_ISA_X86
#include <immintrin.h>

LC_ISA_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")

namespace lc::linear {
namespace {

constexpr int kMR = 8;
constexpr int64_t kPrefetchBytes = 1024;

__m512 ph(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
__m512 u8s(const uint8_t* p) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))); }
__m512 i8s(const uint8_t* p) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))); }

template <int32_t T, int R, bool Wide>
struct Kernel {
    static constexpr quant::Format F = *quant::format(T);
    static constexpr int H = quant::halves(T), G = 8 / H;

    // Group g's bytes: u[c][4g + i] in byte i of lane c.
    static __m512i group(const uint8_t* q, int g) {
        const __m512i raw = _mm512_loadu_si512(q + 64 * (g % 4));
        const __m512i v = _mm512_and_si512(g < 4 ? raw : _mm512_srli_epi16(raw, 4), _mm512_set1_epi8(0x0f));
        if constexpr (quant::high_bits(T) == 1) {
            const __m512i hp = _mm512_loadu_si512(q + 256);
            const __m512i hb = g <= 4 ? _mm512_slli_epi16(hp, 4 - g) : _mm512_srli_epi16(hp, g - 4);
            return _mm512_or_si512(v, _mm512_and_si512(hb, _mm512_set1_epi8(0x10)));
        } else if constexpr (quant::high_bits(T) == 2) {
            const __m512i hp = _mm512_loadu_si512(q + 256 + 64 * (g / 4));
            const int sh = 4 - 2 * (g % 4);
            const __m512i hb = sh >= 0 ? _mm512_slli_epi16(hp, sh) : _mm512_srli_epi16(hp, 2);
            return _mm512_or_si512(v, _mm512_and_si512(hb, _mm512_set1_epi8(0x30)));
        }
        return v;
    }

    static void run(const Job& job, const QuantX& qx, int64_t p, int64_t m0, int nvalid) {
        const uint8_t* panel = static_cast<const uint8_t*>(job.packed->data) + p * quant::panel_bytes(T, job.K);
        __m512 acc[R];
        for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
        for (int64_t b = 0; b < qx.nb; ++b) {
            const int s = int(b % F.subs);
            const uint8_t* hdr = panel + b / F.subs * quant::unit_bytes(T);
            const uint8_t* q = hdr + F.header + s * F.sub;
            if (m0 == 0) _mm_prefetch(reinterpret_cast<const char*>(q) + kPrefetchBytes, _MM_HINT_T0);
            const __m512 d = ph(hdr + quant::kD);
            LC_UNROLL  // g below a constant: immediate shifts, fixed offsets
            for (int h = 0; h < H; ++h) {
                __m512 sc = d;
                if constexpr (T == quant::kQ6_K) sc = _mm512_mul_ps(d, i8s(hdr + quant::sc_row(T, s, h)));
                else if constexpr (quant::superblock(T)) sc = _mm512_mul_ps(d, u8s(hdr + quant::sc_row(T, s, h)));
                __m512i dot[R];
                for (int r = 0; r < R; ++r)
                    dot[r] = _mm512_set1_epi32(-quant::koffset(T) * half_isum<H>(qx, (m0 + r) * qx.nb + b, h));
                LC_UNROLL
                for (int gg = 0; gg < G; ++gg) {
                    const int g = h * G + gg;
                    const __m512i v = group(q, g);
                    if constexpr (Wide) {
                        const __m512i words = _mm512_set1_epi32(0x00ff00ff);
                        const __m512i even = _mm512_and_si512(v, words);
                        const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(v, 8), words);
                        for (int r = 0; r < R; ++r) {
                            const int32_t* x = reinterpret_cast<const int32_t*>(qx.q16 + ((m0 + r) * qx.nb + b) * quant::kBlock);
                            dot[r] = _mm512_dpwssd_epi32(dot[r], even, _mm512_set1_epi32(x[2 * g]));
                            dot[r] = _mm512_dpwssd_epi32(dot[r], odd, _mm512_set1_epi32(x[2 * g + 1]));
                        }
                    } else {
                        for (int r = 0; r < R; ++r) {
                            const int32_t* x = reinterpret_cast<const int32_t*>(qx.q + ((m0 + r) * qx.nb + b) * quant::kBlock);
                            dot[r] = _mm512_dpbusd_epi32(dot[r], v, _mm512_set1_epi32(x[g]));
                        }
                    }
                }
                for (int r = 0; r < R; ++r) {
                    const __m512 sx = _mm512_mul_ps(sc, _mm512_set1_ps(qx.scale[(m0 + r) * qx.nb + b]));
                    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r]), sx, acc[r]);
                }
            }
            if constexpr (quant::has_min(T)) {
                __m512 mn = ph(hdr + quant::kMinRow);
                if constexpr (T != quant::kQ5_1)  // -(Dmin * mn): the sign flipped exactly
                    mn = _mm512_xor_ps(_mm512_mul_ps(mn, u8s(hdr + quant::mn_row(s))), _mm512_set1_ps(-0.0f));
                for (int r = 0; r < R; ++r)
                    acc[r] = _mm512_fmadd_ps(mn, _mm512_set1_ps(qx.ssum[(m0 + r) * qx.nb + b]), acc[r]);
            }
        }
        const int64_t c0 = p * weight::kPanel;
        for (int r = 0; r < R; ++r) {
            if (job.out_dtype == LC_DTYPE_F32 && nvalid == weight::kPanel) {
                const __m512 bias = job.bias ? _mm512_loadu_ps(job.bias + c0) : _mm512_setzero_ps();
                _mm512_storeu_ps(static_cast<float*>(job.out) + (m0 + r) * job.ldo + c0, _mm512_add_ps(acc[r], bias));
                continue;
            }
            alignas(64) float v[weight::kPanel];
            _mm512_store_ps(v, acc[r]);
            store_row(job, m0 + r, c0, v, nvalid);
        }
    }
};

template <int32_t T, int R>
using Micro8 = Kernel<T, R, false>;
template <int32_t T, int R>
using Micro16 = Kernel<T, R, true>;

}  // namespace

void run_kquant_avx512(const Job& job, const QuantX& qx) {
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
void run_kquant_avx512(const Job&, const QuantX&) {
    fail(LC_ERR_INTERNAL, "AVX512_VNNI quantized linear kernel called on a non-x86 build");
}
}  // namespace lc::linear

#endif
