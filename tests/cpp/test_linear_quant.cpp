// Quantized packed weights (lc_weight_pack_quant) against double-precision
// references, for every instruction set this CPU runs (a variant the CPU lacks
// is reported as skipped, naming the ISA):
//   exact:  W dequantized from the GGUF blocks (in double) times x as the
//           kernel rounds it (per-32 int8): only fp32 accumulation differs;
//   x true: the same W times the unrounded x: the activation rounding's error,
//           bounded by max|x|/254 per element of a block;
//   variants agree with the scalar reference to the last bit.
// Then lc_weight_rows on a quantized weight, and the pack's argument errors.
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

lc_tensor view2(void* data, int32_t dtype, int64_t rows, int64_t cols, int64_t ld) {
    lc_tensor t{};
    t.data = data;
    t.dtype = dtype;
    t.device = LC_DEVICE_CPU;
    t.ndim = 2;
    t.shape[0] = rows;
    t.shape[1] = cols;
    t.strides[0] = ld;
    t.strides[1] = 1;
    return t;
}

uint16_t f32_to_f16(float f) {  // normal range only: what the tests draw
    uint32_t u;
    std::memcpy(&u, &f, 4);
    const uint32_t sign = (u >> 16) & 0x8000u;
    const int e = int((u >> 23) & 0xff) - 127 + 15;
    const uint32_t man = (u >> 13) & 0x3ffu;
    return uint16_t(sign | (uint32_t(e) << 10) | man);
}

// Random GGUF blocks of `type` for W [N, K], and W dequantized as GGUF defines it.
std::vector<uint8_t> random_blocks(int32_t type, int64_t N, int64_t K, std::mt19937& rng,
                                   std::vector<double>& w) {
    const int64_t nb = K / 32, bs = lc::quant::gguf_block_bytes(type);
    std::vector<uint8_t> raw(size_t(N * nb * bs));
    std::uniform_real_distribution<float> sc(0.002f, 0.05f), mn(-0.4f, 0.1f);
    std::uniform_int_distribution<int> byte(0, 255);
    w.assign(size_t(N * K), 0.0);
    for (int64_t n = 0; n < N; ++n)
        for (int64_t b = 0; b < nb; ++b) {
            uint8_t* blk = raw.data() + (n * nb + b) * bs;
            for (int64_t i = 0; i < bs; ++i) blk[i] = uint8_t(byte(rng));
            const uint16_t d = f32_to_f16(sc(rng)), m = f32_to_f16(mn(rng));
            std::memcpy(blk, &d, 2);
            const double dd = lc::quant::f16_to_f32(d), mm = lc::quant::f16_to_f32(m);
            double* row = w.data() + n * K + b * 32;
            if (type == LC_QUANT_Q8_0) {
                for (int e = 0; e < 32; ++e) row[e] = dd * int8_t(blk[2 + e]);
            } else if (type == LC_QUANT_Q4_0) {
                for (int j = 0; j < 16; ++j) {
                    row[j] = dd * ((blk[2 + j] & 15) - 8);
                    row[j + 16] = dd * ((blk[2 + j] >> 4) - 8);
                }
            } else {
                std::memcpy(blk + 2, &m, 2);
                for (int j = 0; j < 16; ++j) {
                    row[j] = dd * (blk[4 + j] & 15) + mm;
                    row[j + 16] = dd * (blk[4 + j] >> 4) + mm;
                }
            }
        }
    return raw;
}

// x as the kernel rounds it: per block of 32, s = max|x| / qmax, q = round(x / s)
// (qmax 127 for int8 activations, 32767 for int16).
std::vector<double> rounded(const std::vector<float>& x, int64_t M, int64_t K, float qmax) {
    std::vector<double> r(x.size());
    for (int64_t i = 0; i < M * K; i += 32) {
        float amax = 0;
        for (int e = 0; e < 32; ++e) amax = std::max(amax, std::fabs(x[size_t(i + e)]));
        const float s = amax / qmax, inv = s != 0 ? 1.0f / s : 0.0f;
        for (int e = 0; e < 32; ++e)
            r[size_t(i + e)] = double(s) * double(std::lrint(x[size_t(i + e)] * inv));
    }
    return r;
}

struct Result {
    std::vector<float> out;
    bool ok;
};

Result run(lc_weight* pw, std::vector<float>& x, int64_t M, int64_t N, int64_t K,
           std::vector<float>* bias) {
    Result r{std::vector<float>(size_t(M * N), -7.0f), false};
    lc_tensor tx = view2(x.data(), LC_DTYPE_F32, M, K, K);
    lc_tensor to = view2(r.out.data(), LC_DTYPE_F32, M, N, N);
    lc_tensor tb{};
    if (bias) {
        tb.data = bias->data();
        tb.dtype = LC_DTYPE_F32;
        tb.device = LC_DEVICE_CPU;
        tb.ndim = 1;
        tb.shape[0] = N;
        tb.strides[0] = 1;
    }
    const lc_status st = lc_linear_packed(&tx, pw, bias ? &tb : nullptr, &to, nullptr);
    CHECK(st == LC_OK, "%s", lc_last_error());
    r.ok = st == LC_OK;
    return r;
}

void check_case(int32_t type, int64_t M, int64_t N, int64_t K, bool with_bias, std::mt19937& rng,
                const std::vector<lc::Isa>& isas) {
    std::vector<double> w;
    const std::vector<uint8_t> raw = random_blocks(type, N, K, rng, w);
    lc_weight* pw = nullptr;
    CHECK(lc_weight_pack_quant(type, raw.data(), int64_t(raw.size()), N, K, &pw) == LC_OK, "%s",
          lc_last_error());
    if (!pw) return;
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(M * K)), bias(static_cast<size_t>(N));
    for (float& v : x) v = dist(rng);
    for (float& v : bias) v = dist(rng);
    const int bits = lc_get_quant_activation_bits();
    const std::vector<double> xr = rounded(x, M, K, bits == 16 ? 32767.0f : 127.0f);
    std::vector<float> scalar_out;
    for (lc::Isa isa : isas) {
        lc::linear::set_isa(isa);
        const Result r = run(pw, x, M, N, K, with_bias ? &bias : nullptr);
        if (!r.ok) continue;
        double worst_exact = 0, worst_true = 0;
        for (int64_t m = 0; m < M; ++m)
            for (int64_t n = 0; n < N; ++n) {
                double ref = with_bias ? bias[size_t(n)] : 0.0, ref_true = ref, mag = 0, err = 0;
                for (int64_t k = 0; k < K; ++k) {
                    const double wv = w[size_t(n * K + k)];
                    ref += wv * xr[size_t(m * K + k)];
                    ref_true += wv * x[size_t(m * K + k)];
                    mag += std::fabs(wv * xr[size_t(m * K + k)]);
                    err += std::fabs(wv) * std::fabs(x[size_t(m * K + k)] - xr[size_t(m * K + k)]);
                }
                const double got = r.out[size_t(m * N + n)];
                const double tol = 4e-7 * std::sqrt(double(K)) * (mag + 1) + 1e-6;
                worst_exact = std::max(worst_exact, std::fabs(got - ref) / tol);
                worst_true = std::max(worst_true, std::fabs(got - ref_true) / (err + tol));
            }
        CHECK(worst_exact <= 1.0, "%s %s int%d M=%lld N=%lld K=%lld: %.2f x tol vs exact",
              lc::quant::name(type), lc::isa_name(isa), bits, (long long)M, (long long)N,
              (long long)K, worst_exact);
        CHECK(worst_true <= 1.0, "%s %s: %.2f x the activation rounding bound",
              lc::quant::name(type), lc::isa_name(isa), worst_true);
        if (isa == lc::Isa::kScalar) {
            scalar_out = r.out;
        } else if (!scalar_out.empty()) {
            int64_t diff = 0;
            for (size_t i = 0; i < r.out.size(); ++i) diff += r.out[i] != scalar_out[i];
            CHECK(diff == 0, "%s %s M=%lld N=%lld K=%lld: %lld results differ from scalar",
                  lc::quant::name(type), lc::isa_name(isa), (long long)M, (long long)N,
                  (long long)K, (long long)diff);
        }
    }
    // Rows: dequantized exactly.
    const int64_t ids[2] = {N - 1, 0};
    std::vector<float> rows(size_t(2 * K));
    lc_tensor tr = view2(rows.data(), LC_DTYPE_F32, 2, K, K);
    CHECK(lc_weight_rows(pw, ids, 2, &tr) == LC_OK, "%s", lc_last_error());
    int64_t bad = 0;
    for (int64_t k = 0; k < K; ++k)
        bad += double(rows[size_t(k)]) != w[size_t((N - 1) * K + k)] ||
               double(rows[size_t(K + k)]) != w[size_t(k)];
    CHECK(bad == 0, "%s rows: %lld values differ", lc::quant::name(type), (long long)bad);
    int32_t qt = -1;
    CHECK(lc_weight_quant_type(pw, &qt) == LC_OK && qt == type, "quant type %d", qt);
    lc_weight_destroy(pw);
}

void errors() {
    std::vector<uint8_t> raw(34 * 4);
    lc_weight* pw = nullptr;
    CHECK(lc_weight_pack_quant(5, raw.data(), 34 * 4, 4, 32, &pw) == LC_ERR_INVALID_ARGUMENT,
          "unknown type");
    CHECK(lc_weight_pack_quant(LC_QUANT_Q8_0, raw.data(), 34 * 4, 2, 64, &pw) == LC_OK, "%s",
          lc_last_error());
    lc_weight_destroy(pw);
    pw = nullptr;
    CHECK(lc_weight_pack_quant(LC_QUANT_Q8_0, raw.data(), 34 * 3, 4, 32, &pw) ==
              LC_ERR_INVALID_ARGUMENT, "wrong size");
    CHECK(lc_weight_pack_quant(LC_QUANT_Q8_0, raw.data(), 34 * 4, 4, 33, &pw) ==
              LC_ERR_INVALID_ARGUMENT, "K not a multiple of 32");
    CHECK(lc_weight_pack_quant(LC_QUANT_Q8_0, nullptr, 34 * 4, 4, 32, &pw) ==
              LC_ERR_INVALID_ARGUMENT, "NULL blocks");
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
    std::mt19937 rng(99);
    for (int threads : {1, 2}) {
        lc_set_num_threads(threads);
        // int16 activations (the default) on one thread count, int8 on the other
        CHECK(lc_set_quant_activation_bits(threads == 1 ? 16 : 8) == LC_OK, "%s", lc_last_error());
        for (int32_t type : {LC_QUANT_Q8_0, LC_QUANT_Q4_0, LC_QUANT_Q4_1}) {
            for (int64_t M : {1, 2, 3, 5, 8, 9, 17})
                for (int64_t N : {1, 16, 40})
                    check_case(type, M, N, 64, M % 2 == 1, rng, isas);
            check_case(type, 1, 576, 576, false, rng, isas);
            check_case(type, 64, 192, 1536, true, rng, isas);
        }
    }
    CHECK(lc_set_quant_activation_bits(12) == LC_ERR_INVALID_ARGUMENT, "12-bit activations");
    CHECK(lc_get_quant_activation_bits() == 8, "width kept after a refused one");
    errors();
    lc::linear::set_isa(lc::linear::best_isa());
    return lctest::finish();
}
