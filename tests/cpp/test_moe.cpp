// lc_moe_experts through the C ABI: against a double-precision loop over the
// routed experts (fp32 and bf16 packed experts, int32 and int64 ids, strided
// views), a token alone against the same token in a batch (the same bits) on
// every linear instruction set this CPU runs, then the refusals at the boundary.
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "check.h"
#include "linear/linear.h"
#include "llmcore/llmcore.h"
#include "runtime/internal.h"
#include "tensors.h"

namespace {

constexpr int64_t H = 48, I = 24;
constexpr int32_t E = 5;

struct Experts {
    std::vector<std::vector<float>> gate_up, down;  // [2I][H], [H][I] as the core sees them
    std::vector<lc_weight*> gu, dn;
    Experts(std::mt19937& rng, bool bf16) {
        std::normal_distribution<float> dist(0.0f, 0.2f);
        for (int32_t e = 0; e < E; ++e) {
            gate_up.emplace_back(size_t(2 * I * H));
            down.emplace_back(size_t(H * I));
            gu.push_back(pack(gate_up.back(), 2 * I, H, bf16, rng, dist));
            dn.push_back(pack(down.back(), H, I, bf16, rng, dist));
        }
    }
    ~Experts() {
        for (lc_weight* w : gu) lc_weight_destroy(w);
        for (lc_weight* w : dn) lc_weight_destroy(w);
    }
    static lc_weight* pack(std::vector<float>& w, int64_t n, int64_t k, bool bf16,
                           std::mt19937& rng, std::normal_distribution<float>& dist) {
        std::vector<uint16_t> w16(w.size());
        for (size_t i = 0; i < w.size(); ++i) {
            w[i] = dist(rng);
            w16[i] = lc::f32_to_bf16(w[i]);
            if (bf16) w[i] = lc::bf16_to_f32(w16[i]);
        }
        lc_tensor t = bf16 ? lctest::contiguous(w16.data(), LC_DTYPE_BF16, {n, k})
                           : lctest::contiguous(w.data(), LC_DTYPE_F32, {n, k});
        lc_weight* out = nullptr;
        CHECK(lc_weight_pack(&t, &out) == LC_OK, "%s", lc_last_error());
        return out;
    }
    const lc_weight* const* gate_ups() const { return gu.data(); }
    const lc_weight* const* downs() const { return dn.data(); }
};

// out[t] = sum_j w[t][j] * down_e(silu(g) * u), in double.
std::vector<double> reference(const Experts& ex, const std::vector<float>& x,
                              const std::vector<int64_t>& ids, const std::vector<float>& w,
                              int64_t T, int64_t k) {
    std::vector<double> out(size_t(T * H), 0.0), hid(size_t{2 * I}), act(size_t{I});
    for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < k; ++j) {
            const size_t e = size_t(ids[size_t(t * k + j)]);
            for (int64_t n = 0; n < 2 * I; ++n) {
                double s = 0.0;
                for (int64_t h = 0; h < H; ++h)
                    s += double(x[size_t(t * H + h)]) * ex.gate_up[e][size_t(n * H + h)];
                hid[size_t(n)] = s;
            }
            for (int64_t i = 0; i < I; ++i)
                act[size_t(i)] = hid[size_t(i)] / (1.0 + std::exp(-hid[size_t(i)])) * hid[size_t(I + i)];
            for (int64_t h = 0; h < H; ++h) {
                double s = 0.0;
                for (int64_t i = 0; i < I; ++i) s += act[size_t(i)] * ex.down[e][size_t(h * I + i)];
                out[size_t(t * H + h)] += double(w[size_t(t * k + j)]) * s;
            }
        }
    return out;
}

void check_against_reference(bool bf16, std::mt19937& rng) {
    const Experts ex(rng, bf16);
    constexpr int64_t T = 21, k = 3;
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> x(size_t(T * H)), w(size_t(T * k));
    std::vector<int64_t> ids(size_t(T * k));
    for (float& v : x) v = dist(rng);
    for (int64_t i = 0; i < T * k; ++i) {
        ids[size_t(i)] = int64_t(rng() % E);
        w[size_t(i)] = float(rng() % 1000) / 1000.0f;
    }
    const std::vector<double> want = reference(ex, x, ids, w, T, k);
    double top = 0.0;
    for (double v : want) top = std::max(top, std::fabs(v));
    std::vector<int32_t> ids32(ids.begin(), ids.end());
    // out as a strided view: rows of H + 5
    std::vector<float> out(size_t(T * (H + 5)), -1.0f), out32(size_t(T * H));
    lc_tensor tx = lctest::contiguous(x.data(), LC_DTYPE_F32, {T, H});
    lc_tensor tw = lctest::contiguous(w.data(), LC_DTYPE_F32, {T, k});
    lc_tensor to = lctest::contiguous(out.data(), LC_DTYPE_F32, {T, H});
    to.strides[0] = H + 5;
    lc_tensor to32 = lctest::contiguous(out32.data(), LC_DTYPE_F32, {T, H});
    CHECK(lc_moe_experts(&tx, ids.data(), 8, &tw, ex.gate_ups(), ex.downs(), E, &to) == LC_OK,
          "%s", lc_last_error());
    CHECK(lc_moe_experts(&tx, ids32.data(), 4, &tw, ex.gate_ups(), ex.downs(), E, &to32) == LC_OK,
          "%s", lc_last_error());
    // bf16 experts may run with bf16-rounded activations (AVX512_BF16)
    const double tol = (bf16 ? 1e-2 : 1e-5) * top;
    for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < H; ++h) {
            const float got = out[size_t(t * (H + 5) + h)];
            CHECK(std::fabs(got - want[size_t(t * H + h)]) <= tol, "bf16=%d t=%ld h=%ld: %g vs %g",
                  int(bf16), long(t), long(h), double(got), want[size_t(t * H + h)]);
            CHECK(got == out32[size_t(t * H + h)], "int32 ids differ at t=%ld", long(t));
        }
    CHECK(out[size_t(H)] == -1.0f, "the row padding was written");

    // Each token alone: the bits it got in the batch, on every instruction set.
    for (lc::Isa isa : {lc::Isa::kScalar, lc::Isa::kAvx2, lc::Isa::kAvx512}) {
        if (lc::linear::set_isa(isa) != isa) continue;
        CHECK(lc_moe_experts(&tx, ids.data(), 8, &tw, ex.gate_ups(), ex.downs(), E, &to32) == LC_OK,
              "%s", lc_last_error());
        for (int64_t t : {int64_t(0), int64_t(7), T - 1}) {
            std::vector<float> one(size_t{H});
            lc_tensor x1 = lctest::contiguous(x.data() + t * H, LC_DTYPE_F32, {1, H});
            lc_tensor w1 = lctest::contiguous(w.data() + t * k, LC_DTYPE_F32, {1, k});
            lc_tensor o1 = lctest::contiguous(one.data(), LC_DTYPE_F32, {1, H});
            CHECK(lc_moe_experts(&x1, ids.data() + t * k, 8, &w1, ex.gate_ups(), ex.downs(), E,
                                 &o1) == LC_OK, "%s", lc_last_error());
            CHECK(std::memcmp(one.data(), out32.data() + t * H, size_t(H) * 4) == 0,
                  "isa %s bf16=%d: token %ld alone differs from the batch", lc::isa_name(isa),
                  int(bf16), long(t));
        }
    }
    lc::linear::set_isa(lc::linear::best_isa());
}

void expect_error(lc_status st, lc_status want, const char* needle) {
    CHECK(st == want, "status %d, want %d (%s)", int(st), int(want), lc_last_error());
    CHECK(std::string(lc_last_error()).find(needle) != std::string::npos,
          "error '%s' lacks '%s'", lc_last_error(), needle);
}

void check_refusals(std::mt19937& rng) {
    const Experts ex(rng, false);
    constexpr int64_t T = 2, k = 2;
    std::vector<float> x(size_t(T * H), 1.0f), w(size_t(T * k), 0.5f), out(size_t(T * H));
    std::vector<int64_t> ids = {0, 1, 4, 2};
    lc_tensor tx = lctest::contiguous(x.data(), LC_DTYPE_F32, {T, H});
    lc_tensor tw = lctest::contiguous(w.data(), LC_DTYPE_F32, {T, k});
    lc_tensor to = lctest::contiguous(out.data(), LC_DTYPE_F32, {T, H});
    auto call = [&](const lc_tensor* xx, const void* id, int32_t bytes, const lc_tensor* ww,
                    const lc_weight* const* gu, const lc_weight* const* dn, int32_t e,
                    const lc_tensor* oo) { return lc_moe_experts(xx, id, bytes, ww, gu, dn, e, oo); };
    CHECK(call(&tx, ids.data(), 8, &tw, ex.gate_ups(), ex.downs(), E, &to) == LC_OK, "%s", lc_last_error());

    ids[3] = 5;
    expect_error(call(&tx, ids.data(), 8, &tw, ex.gate_ups(), ex.downs(), E, &to),
                 LC_ERR_INVALID_ARGUMENT, "topk_ids[1, 1] = 5 is not an expert");
    ids[3] = 2;
    expect_error(call(&tx, ids.data(), 2, &tw, ex.gate_ups(), ex.downs(), E, &to),
                 LC_ERR_INVALID_ARGUMENT, "int32 or int64");
    expect_error(call(&tx, nullptr, 8, &tw, ex.gate_ups(), ex.downs(), E, &to),
                 LC_ERR_INVALID_ARGUMENT, "topk_ids is NULL");
    expect_error(call(&tx, ids.data(), 8, &tw, nullptr, ex.downs(), E, &to),
                 LC_ERR_INVALID_ARGUMENT, "arrays of num_experts");
    expect_error(call(&tx, ids.data(), 8, &tw, ex.gate_ups(), ex.downs(), 0, &to),
                 LC_ERR_INVALID_ARGUMENT, "num_experts must be >= 1");
    std::vector<const lc_weight*> holes(ex.gu.begin(), ex.gu.end());
    holes[3] = nullptr;
    expect_error(call(&tx, ids.data(), 8, &tw, holes.data(), ex.downs(), E, &to),
                 LC_ERR_INVALID_ARGUMENT, "expert 3 has no gate_up or down");
    holes[3] = ex.dn[0];  // [H, I] where [2I, H] belongs
    expect_error(call(&tx, ids.data(), 8, &tw, holes.data(), ex.downs(), E, &to),
                 LC_ERR_INVALID_ARGUMENT, "gate_up[3] is [48, 24], expected [48, 48]");
    lc_tensor cuda_x = tx;
    cuda_x.device = LC_DEVICE_CUDA;
    expect_error(call(&cuda_x, ids.data(), 8, &tw, ex.gate_ups(), ex.downs(), E, &to),
                 LC_ERR_UNSUPPORTED, "CPU only");
    lc_tensor bf_w = tw;
    bf_w.dtype = LC_DTYPE_BF16;
    expect_error(call(&tx, ids.data(), 8, &bf_w, ex.gate_ups(), ex.downs(), E, &to),
                 LC_ERR_INVALID_ARGUMENT, "topk_weights must be float32");
    lc_tensor no_k = lctest::contiguous(w.data(), LC_DTYPE_F32, {T, 0});
    expect_error(call(&tx, ids.data(), 8, &no_k, ex.gate_ups(), ex.downs(), E, &to),
                 LC_ERR_INVALID_ARGUMENT, "k >= 1");
    lc_tensor short_x = lctest::contiguous(x.data(), LC_DTYPE_F32, {T, H - 1});
    lc_tensor short_o = lctest::contiguous(out.data(), LC_DTYPE_F32, {T, H - 1});
    expect_error(call(&short_x, ids.data(), 8, &tw, ex.gate_ups(), ex.downs(), E, &short_o),
                 LC_ERR_INVALID_ARGUMENT, "gate_up[0] is [48, 48], expected [48, 47]");
    // out over the ids' bytes, or half over x
    std::vector<float> shared(size_t(T * H + H));
    lc_tensor over_ids = lctest::contiguous(shared.data(), LC_DTYPE_F32, {T, H});
    expect_error(call(&tx, shared.data() + 2, 8, &tw, ex.gate_ups(), ex.downs(), E, &over_ids),
                 LC_ERR_INVALID_ARGUMENT, "overlap topk_ids");
    lc_tensor lo = lctest::contiguous(shared.data(), LC_DTYPE_F32, {T, H});
    lc_tensor hi = lctest::contiguous(shared.data() + H, LC_DTYPE_F32, {T, H});
    expect_error(call(&lo, ids.data(), 8, &tw, ex.gate_ups(), ex.downs(), E, &hi),
                 LC_ERR_INVALID_ARGUMENT, "out must be x or not overlap it");
    // out == x is allowed, and T = 0 is a no-op
    CHECK(call(&tx, ids.data(), 8, &tw, ex.gate_ups(), ex.downs(), E, &tx) == LC_OK, "%s", lc_last_error());
    CHECK(std::memcmp(x.data(), out.data(), x.size() * 4) == 0, "in place differs from apart");
    lc_tensor none_x = lctest::contiguous(x.data(), LC_DTYPE_F32, {0, H});
    lc_tensor none_w = lctest::contiguous(w.data(), LC_DTYPE_F32, {0, k});
    lc_tensor none_o = lctest::contiguous(out.data(), LC_DTYPE_F32, {0, H});
    CHECK(call(&none_x, nullptr, 8, &none_w, ex.gate_ups(), ex.downs(), E, &none_o) == LC_OK,
          "%s", lc_last_error());
}

}  // namespace

int main() {
    std::mt19937 rng(42);
    check_against_reference(false, rng);
    check_against_reference(true, rng);
    check_refusals(rng);
    return lctest::finish();
}
