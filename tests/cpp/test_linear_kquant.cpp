// The K family of quantized packed weights (Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) from
// random valid GGUF blocks, against a double-precision reading of ggml's block
// formats written here (independent of the core's unpacking):
//   rows:     lc_weight_rows equals the dequantized weights rounded once to fp32
//             (each is a single fp32 rounding of an exact value, as gguf-py's);
//   product:  each variant this CPU runs against W (double) times x as the kernel
//             rounds it (int16 or int8 per 32-block), within fp32 accumulation;
//   variants: bit-equal to the scalar one, M not a multiple of any microkernel's
//             rows, N not a multiple of 16, K of several superblocks;
//   errors:   K not a multiple of 256, a wrong byte count.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "check.h"
#include "linear/linear.h"
#include "linear/linear_quant.h"
#include "llmcore/llmcore.h"
#include "runtime/internal.h"
#include "weight/weight_quant.h"

namespace {

lc_tensor view2(void* data, int64_t rows, int64_t cols) {
    lc_tensor t{};
    t.data = data;
    t.dtype = LC_DTYPE_F32;
    t.device = LC_DEVICE_CPU;
    t.ndim = 2;
    t.shape[0] = rows;
    t.shape[1] = cols;
    t.strides[0] = cols;
    t.strides[1] = 1;
    return t;
}

double half(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return lc::quant::f16_to_f32(h);
}

// One GGUF block of `type` (32 or 256 weights) dequantized into w, in double.
void dequant_block(int32_t type, const uint8_t* b, double* w) {
    if (type == LC_QUANT_Q5_0 || type == LC_QUANT_Q5_1) {
        const bool q51 = type == LC_QUANT_Q5_1;
        const double d = half(b), m = q51 ? half(b + 2) : 0.0;
        const uint8_t *qh = b + (q51 ? 4 : 2), *qs = qh + 4;
        for (int j = 0; j < 32; ++j) {
            const int hi = (qh[j / 8] >> (j % 8)) & 1;
            const int q = (j < 16 ? qs[j] & 15 : qs[j - 16] >> 4) | hi << 4;
            w[j] = q51 ? d * q + m : d * (q - 16);
        }
    } else if (type == LC_QUANT_Q6_K) {
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
        const double d = half(b + 208);
        for (int h = 0; h < 2; ++h)  // ggml's dequantize_row_q6_K, one 128-half at a time
            for (int l = 0; l < 32; ++l)
                for (int j = 0; j < 4; ++j) {
                    const int lo = (ql[64 * h + l + 32 * (j % 2)] >> (4 * (j / 2))) & 15;
                    const int q = (lo | ((qh[32 * h + l] >> (2 * j)) & 3) << 4) - 32;
                    const int e = 128 * h + 32 * j + l;
                    w[e] = d * sc[e / 16] * q;
                }
    } else {  // Q4_K, Q5_K: ggml's get_scale_min_k4
        const bool q5 = type == LC_QUANT_Q5_K;
        const double d = half(b), dmin = half(b + 2);
        const uint8_t *s = b + 4, *qh = b + 16, *qs = b + (q5 ? 48 : 16);
        for (int j = 0; j < 8; ++j) {
            const int sc = j < 4 ? s[j] & 63 : (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
            const int mn = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
            for (int l = 0; l < 32; ++l) {
                const int q = ((qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 15) |
                              (q5 ? ((qh[l] >> j) & 1) << 4 : 0);
                w[32 * j + l] = d * sc * q - dmin * mn;
            }
        }
    }
}

// Random valid blocks of `type` for W [N, K] (random bytes; fp16 scales of either sign).
std::vector<uint8_t> random_blocks(int32_t type, int64_t N, int64_t K, std::mt19937& rng,
                                   std::vector<double>& w) {
    const lc::quant::Format& f = *lc::quant::format(type);
    const int64_t nb = K / f.gguf_elems;
    std::vector<uint8_t> raw(size_t(N * nb * f.gguf_bytes));
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_real_distribution<float> mag(-9.0f, -5.0f);  // log2 of |scale|
    for (uint8_t& v : raw) v = uint8_t(byte(rng));
    w.assign(size_t(N * K), 0.0);
    for (int64_t i = 0; i < N * nb; ++i) {
        uint8_t* blk = raw.data() + i * f.gguf_bytes;
        for (int at : {type == LC_QUANT_Q6_K ? 208 : 0, type == LC_QUANT_Q5_1 ? 2 : -1,
                       f.subs == 8 && type != LC_QUANT_Q6_K ? 2 : -1}) {
            if (at < 0) continue;
            // a normal fp16: sign, exponent 15 + round(mag), random mantissa
            const int e = 15 + int(std::lround(mag(rng)));
            const uint16_t h = uint16_t((byte(rng) & 1) << 15 | e << 10 | (byte(rng) << 2));
            std::memcpy(blk + at, &h, 2);
        }
        dequant_block(type, blk, w.data() + i * f.gguf_elems);
    }
    return raw;
}

std::vector<double> rounded(const std::vector<float>& x, float qmax) {
    std::vector<double> r(x.size());
    for (size_t i = 0; i < x.size(); i += 32) {
        float amax = 0;
        for (int e = 0; e < 32; ++e) amax = std::max(amax, std::fabs(x[i + e]));
        const float s = amax / qmax, inv = s != 0 ? 1.0f / s : 0.0f;
        for (int e = 0; e < 32; ++e) r[i + e] = double(s) * double(std::lrint(x[i + e] * inv));
    }
    return r;
}

void check_case(int32_t type, int64_t M, int64_t N, int64_t K, std::mt19937& rng,
                const std::vector<lc::Isa>& isas) {
    const char* name = lc::quant::name(type);
    std::vector<double> w;
    const std::vector<uint8_t> raw = random_blocks(type, N, K, rng, w);
    lc_weight* pw = nullptr;
    CHECK(lc_weight_pack_quant(type, raw.data(), int64_t(raw.size()), N, K, &pw) == LC_OK, "%s",
          lc_last_error());
    if (!pw) return;
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> x(size_t(M * K));
    for (float& v : x) v = dist(rng);
    const std::vector<double> xr = rounded(x, lc_get_quant_activation_bits() == 16 ? 32767 : 127);
    std::vector<float> scalar_out;
    for (lc::Isa isa : isas) {
        lc::linear::set_isa(isa);
        std::vector<float> out(size_t(M * N), -7.0f);
        lc_tensor tx = view2(x.data(), M, K), to = view2(out.data(), M, N);
        CHECK(lc_linear_packed(&tx, pw, nullptr, &to, nullptr) == LC_OK, "%s", lc_last_error());
        double worst = 0;
        for (int64_t m = 0; m < M; ++m)
            for (int64_t n = 0; n < N; ++n) {
                double ref = 0, mag = 0;
                for (int64_t k = 0; k < K; ++k) {
                    ref += w[size_t(n * K + k)] * xr[size_t(m * K + k)];
                    mag += std::fabs(w[size_t(n * K + k)] * xr[size_t(m * K + k)]);
                }
                const double tol = std::ldexp(double(K / 32 + 8), -24) * mag + 1e-30;
                worst = std::max(worst, std::fabs(out[size_t(m * N + n)] - ref) / tol);
            }
        CHECK(worst <= 1.0, "%s %s M=%lld N=%lld K=%lld: %.2f x tol", name, lc::isa_name(isa),
              (long long)M, (long long)N, (long long)K, worst);
        if (isa == lc::Isa::kScalar) {
            scalar_out = out;
        } else {
            CHECK(std::memcmp(out.data(), scalar_out.data(), out.size() * 4) == 0,
                  "%s %s M=%lld N=%lld K=%lld differs from scalar", name, lc::isa_name(isa),
                  (long long)M, (long long)N, (long long)K);
        }
    }
    std::vector<int64_t> ids(static_cast<size_t>(N));
    for (int64_t n = 0; n < N; ++n) ids[size_t(n)] = N - 1 - n;
    std::vector<float> rows(size_t(N * K));
    lc_tensor tr = view2(rows.data(), N, K);
    CHECK(lc_weight_rows(pw, ids.data(), N, &tr) == LC_OK, "%s", lc_last_error());
    int64_t bad = 0;
    for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k)
            bad += rows[size_t(n * K + k)] != float(w[size_t((N - 1 - n) * K + k)]);
    CHECK(bad == 0, "%s rows: %lld values differ", name, (long long)bad);
    lc_weight_destroy(pw);
}

void errors() {
    std::vector<uint8_t> raw(210 * 4);
    lc_weight* pw = nullptr;
    CHECK(lc_weight_pack_quant(LC_QUANT_Q6_K, raw.data(), 210 * 2, 1, 512, &pw) == LC_OK, "%s",
          lc_last_error());
    lc_weight_destroy(pw);
    pw = nullptr;
    CHECK(lc_weight_pack_quant(LC_QUANT_Q6_K, raw.data(), 210 * 2, 2, 256, &pw) == LC_OK, "%s",
          lc_last_error());
    lc_weight_destroy(pw);
    pw = nullptr;
    CHECK(lc_weight_pack_quant(LC_QUANT_Q4_K, raw.data(), 144 * 2, 4, 128, &pw) ==
              LC_ERR_INVALID_ARGUMENT, "K not a multiple of 256");
    CHECK(std::strstr(lc_last_error(), "multiple of 256") != nullptr, "%s", lc_last_error());
    CHECK(lc_weight_pack_quant(LC_QUANT_Q5_K, raw.data(), 176 * 2 - 1, 2, 256, &pw) ==
              LC_ERR_INVALID_ARGUMENT, "wrong size");
    CHECK(lc_weight_pack_quant(LC_QUANT_Q5_0, raw.data(), 22 * 3, 4, 32, &pw) ==
              LC_ERR_INVALID_ARGUMENT, "wrong size");
    CHECK(lc_weight_pack_quant(LC_QUANT_Q5_1, raw.data(), 24, 1, 32, &pw) == LC_OK, "%s",
          lc_last_error());
    lc_weight_destroy(pw);
    pw = nullptr;
    CHECK(lc_weight_pack_quant(LC_QUANT_Q5_0, raw.data(), 22, 1, 31, &pw) ==
              LC_ERR_INVALID_ARGUMENT, "K not a multiple of 32");
    CHECK(pw == nullptr, "no weight on failure");
}

}  // namespace

int main() {
    using lc::Isa;
    std::vector<Isa> isas;
    for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
        const bool have = lc::linear::set_isa(isa) == isa &&
                          (isa != Isa::kAvx512 || lc::linear::cpu_has_avx512_vnni());
        std::printf("%s %s\n", lc::isa_name(isa), have ? "runs" : "skipped: this CPU lacks it");
        if (have) isas.push_back(isa);
    }
    std::mt19937 rng(5);
    for (int bits : {16, 8}) {
        lc_set_num_threads(bits == 16 ? 1 : 2);
        CHECK(lc_set_quant_activation_bits(bits) == LC_OK, "%s", lc_last_error());
        for (int32_t type : {LC_QUANT_Q5_0, LC_QUANT_Q5_1, LC_QUANT_Q4_K, LC_QUANT_Q5_K,
                             LC_QUANT_Q6_K}) {
            for (int64_t M : {1, 3, 5, 9})
                for (int64_t N : {1, 17, 40}) check_case(type, M, N, 512, rng, isas);
            check_case(type, 13, 24, 768, rng, isas);
        }
    }
    lc_set_quant_activation_bits(16);
    errors();
    lc::linear::set_isa(lc::linear::best_isa());
    return lctest::finish();
}
