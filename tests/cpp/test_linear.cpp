// lc_linear against naive double-precision loops, for every instruction set
// this CPU runs: bf16 and fp32 weights, bias on/off, strided x/out, bf16 out,
// both the small-M and the packed large-M kernels; then argument errors.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "check.h"
#include "linear/linear.h"
#include "llmcore/llmcore.h"
#include "runtime/internal.h"

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

lc_tensor view1(void* data, int32_t dtype, int64_t n) {
    lc_tensor t{};
    t.data = data;
    t.dtype = dtype;
    t.device = LC_DEVICE_CPU;
    t.ndim = 1;
    t.shape[0] = n;
    t.strides[0] = 1;
    return t;
}

struct Case {
    int64_t M, N, K;
    bool bf16_weight, bias, bf16_bias, bf16_out;
    int64_t x_pad, out_pad;  // extra elements per row (strided views)
};

void run_case(const Case& c, std::mt19937& rng) {
    std::normal_distribution<float> dist(0.0f, 1.0f);
    const int64_t ldx = c.K + c.x_pad, ldo = c.N + c.out_pad;
    std::vector<float> x(size_t(std::max<int64_t>(1, c.M * ldx))), w(size_t(c.N * c.K)),
        b(size_t(c.N));
    for (float& v : x) v = dist(rng);
    for (float& v : w) v = lc::bf16_to_f32(lc::f32_to_bf16(dist(rng)));  // exact in bf16
    for (float& v : b) v = lc::bf16_to_f32(lc::f32_to_bf16(dist(rng)));
    std::vector<uint16_t> w16(w.size()), b16(b.size());
    for (size_t i = 0; i < w.size(); ++i) w16[i] = lc::f32_to_bf16(w[i]);
    for (size_t i = 0; i < b.size(); ++i) b16[i] = lc::f32_to_bf16(b[i]);

    const int32_t odt = c.bf16_out ? LC_DTYPE_BF16 : LC_DTYPE_F32;
    std::vector<float> out32(size_t(std::max<int64_t>(1, c.M * ldo)), -7.0f);
    std::vector<uint16_t> out16(out32.size(), 0);
    lc_tensor tx = view2(x.data(), LC_DTYPE_F32, c.M, c.K, ldx);
    lc_tensor tw = c.bf16_weight ? view2(w16.data(), LC_DTYPE_BF16, c.N, c.K, c.K)
                                 : view2(w.data(), LC_DTYPE_F32, c.N, c.K, c.K);
    lc_tensor tb = c.bf16_bias ? view1(b16.data(), LC_DTYPE_BF16, c.N)
                               : view1(b.data(), LC_DTYPE_F32, c.N);
    lc_tensor to = c.bf16_out ? view2(out16.data(), odt, c.M, c.N, ldo)
                              : view2(out32.data(), odt, c.M, c.N, ldo);
    const lc_status st = lc_linear(&tx, &tw, c.bias ? &tb : nullptr, &to, nullptr);
    CHECK(st == LC_OK, "M=%lld N=%lld K=%lld: %s", (long long)c.M, (long long)c.N,
          (long long)c.K, lc_last_error());
    if (st != LC_OK) return;
    double worst = 0.0;
    for (int64_t m = 0; m < c.M; ++m) {
        for (int64_t n = 0; n < c.N; ++n) {
            double ref = c.bias ? b[size_t(n)] : 0.0, mag = std::fabs(ref);
            for (int64_t k = 0; k < c.K; ++k) {
                const double p = double(x[size_t(m * ldx + k)]) * w[size_t(n * c.K + k)];
                ref += p;
                mag += std::fabs(p);
            }
            const double got = c.bf16_out ? lc::bf16_to_f32(out16[size_t(m * ldo + n)])
                                          : out32[size_t(m * ldo + n)];
            // fp32 accumulation in any order (error ~ sqrt(K) ulps of the magnitude);
            // a bf16 output adds half an ulp of 2^-8.
            const double tol = 2.5e-7 * std::sqrt(double(c.K) + 1.0) * mag + 1e-6 +
                               (c.bf16_out ? std::fabs(ref) / 256.0 : 0.0);
            worst = std::max(worst, std::fabs(got - ref) / tol);
        }
        // Padding between rows is never written.
        for (int64_t n = c.N; n < ldo && !c.bf16_out; ++n)
            CHECK(out32[size_t(m * ldo + n)] == -7.0f, "padding written at row %lld",
                  (long long)m);
    }
    CHECK(worst <= 1.0, "M=%lld N=%lld K=%lld bf16w=%d bias=%d bf16out=%d: error %.2f x tol",
          (long long)c.M, (long long)c.N, (long long)c.K, c.bf16_weight, c.bias, c.bf16_out,
          worst);
}

void correctness(lc::linear::Isa isa) {
    std::mt19937 rng(1234 + int(isa));
    const int64_t Ms[] = {1, 2, 3, 4, 5, 7, 8, 9, 13, 33, 70};
    const int64_t Ns[] = {1, 15, 16, 17, 40};
    const int64_t Ks[] = {1, 7, 8, 64, 100};
    int i = 0;
    for (int64_t M : Ms)
        for (int64_t N : Ns)
            for (int64_t K : Ks) {
                ++i;
                Case c{M, N, K, i % 2 == 0, i % 3 != 0, i % 5 == 0, i % 7 == 0,
                       (i % 4 == 1) ? 3 : 0, (i % 6 == 1) ? 5 : 0};
                run_case(c, rng);
            }
    // Model-sized shapes, both weight dtypes.
    for (bool bf : {true, false}) {
        run_case({1, 960, 576, bf, false, false, false, 0, 0}, rng);
        run_case({8, 1536, 576, bf, true, false, false, 0, 0}, rng);
        run_case({64, 576, 1536, bf, false, false, false, 0, 0}, rng);
    }
}

void errors() {
    std::vector<float> x(6 * 8), w(4 * 8), o(6 * 4);
    std::vector<uint16_t> h(64);
    lc_tensor tx = view2(x.data(), LC_DTYPE_F32, 6, 8, 8);
    lc_tensor tw = view2(w.data(), LC_DTYPE_F32, 4, 8, 8);
    lc_tensor to = view2(o.data(), LC_DTYPE_F32, 6, 4, 4);
    CHECK(lc_linear(&tx, &tw, nullptr, &to, nullptr) == LC_OK, "%s", lc_last_error());

    lc_tensor bad_w = view2(w.data(), LC_DTYPE_F32, 4, 7, 7);
    CHECK(lc_linear(&tx, &bad_w, nullptr, &to, nullptr) == LC_ERR_INVALID_ARGUMENT, "K mismatch");
    lc_tensor bad_o = view2(o.data(), LC_DTYPE_F32, 6, 3, 4);
    CHECK(lc_linear(&tx, &tw, nullptr, &bad_o, nullptr) == LC_ERR_INVALID_ARGUMENT, "N mismatch");
    lc_tensor bf_x = view2(h.data(), LC_DTYPE_BF16, 6, 8, 8);
    CHECK(lc_linear(&bf_x, &tw, nullptr, &to, nullptr) == LC_ERR_INVALID_ARGUMENT, "bf16 x");
    lc_tensor f16_w = view2(h.data(), LC_DTYPE_F16, 4, 8, 8);
    CHECK(lc_linear(&tx, &f16_w, nullptr, &to, nullptr) == LC_ERR_INVALID_ARGUMENT, "f16 w");
    lc_tensor strided_w = view2(w.data(), LC_DTYPE_F32, 2, 8, 16);
    lc_tensor o2 = view2(o.data(), LC_DTYPE_F32, 6, 2, 2);
    CHECK(lc_linear(&tx, &strided_w, nullptr, &o2, nullptr) == LC_ERR_INVALID_ARGUMENT,
          "non-contiguous weight");
    lc_tensor bias = view1(w.data(), LC_DTYPE_F32, 3);
    CHECK(lc_linear(&tx, &tw, &bias, &to, nullptr) == LC_ERR_INVALID_ARGUMENT, "bias size");
    lc_tensor alias = view2(x.data(), LC_DTYPE_F32, 6, 4, 8);
    CHECK(lc_linear(&tx, &tw, nullptr, &alias, nullptr) == LC_ERR_INVALID_ARGUMENT, "out aliases x");
    lc_tensor cuda_x = tx;
    cuda_x.device = LC_DEVICE_CUDA;
    CHECK(lc_linear(&cuda_x, &tw, nullptr, &to, nullptr) == LC_ERR_UNSUPPORTED, "cuda");
    CHECK(lc_linear(nullptr, &tw, nullptr, &to, nullptr) == LC_ERR_INVALID_ARGUMENT, "null x");
    // The packed entry point refuses the same tensors, an unknown device included.
    lc_weight* pw = nullptr;
    CHECK(lc_weight_pack(&tw, &pw) == LC_OK, "%s", lc_last_error());
    CHECK(lc_linear_packed(&tx, pw, nullptr, &to, nullptr) == LC_OK, "%s", lc_last_error());
    CHECK(lc_linear_packed(&cuda_x, pw, nullptr, &to, nullptr) == LC_ERR_UNSUPPORTED, "packed cuda");
    lc_tensor odd_x = tx;
    odd_x.device = 7;
    CHECK(lc_linear_packed(&odd_x, pw, nullptr, &to, nullptr) == LC_ERR_INVALID_ARGUMENT,
          "packed, unknown device");
    CHECK(lc_linear_packed(&tx, pw, nullptr, &alias, nullptr) == LC_ERR_INVALID_ARGUMENT,
          "packed, out aliases x");
    lc_weight_destroy(pw);

    // K = 0: out is the bias.
    std::vector<float> b = {1.0f, 2.0f, 3.0f, 4.0f};
    lc_tensor x0 = view2(x.data(), LC_DTYPE_F32, 6, 0, 0), w0 = view2(w.data(), LC_DTYPE_F32, 4, 0, 0);
    lc_tensor tb = view1(b.data(), LC_DTYPE_F32, 4);
    CHECK(lc_linear(&x0, &w0, &tb, &to, nullptr) == LC_OK, "%s", lc_last_error());
    CHECK(o[5] == 2.0f && o[23] == 4.0f, "K=0 gives bias, got %g %g", o[5], o[23]);
}

}  // namespace

int main() {
    using lc::linear::Isa;
    for (Isa isa : {Isa::kScalar, Isa::kAvx2}) {
        if (lc::linear::set_isa(isa) != isa) continue;  // this CPU lacks it
        std::printf("isa %s\n", lc::linear::isa_name(isa));
        for (int threads : {1, 2}) {
            lc_set_num_threads(threads);
            correctness(isa);
        }
        errors();
    }
    lc::linear::set_isa(lc::linear::best_isa());
    return lctest::finish();
}
