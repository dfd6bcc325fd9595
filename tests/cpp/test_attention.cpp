// Paged attention and KV store on synthetic data against a naive scalar
// implementation written here, for every instruction set this CPU runs.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "attention/attention_cpu.h"
#include "check.h"
#include "llmcore/llmcore.h"
#include "runtime/internal.h"
#include "tensors.h"

namespace {


using lctest::contiguous;

struct Case {
    const char* name;
    std::vector<int32_t> q_lens, seq_lens;
    int32_t num_heads, num_kv_heads, head_size, block_size;
    int32_t cache_dtype;
    int32_t window = 0;
    float softcap = 0.0f;
};

// Naive attention over contiguous per-sequence K/V (double accumulation).
void naive(const Case& c, const std::vector<float>& q, const std::vector<std::vector<float>>& ks,
           const std::vector<std::vector<float>>& vs, float scale, std::vector<float>& out) {
    const int32_t d = c.head_size, nh = c.num_heads, g = c.num_heads / c.num_kv_heads;
    int32_t row = 0;
    for (size_t s = 0; s < c.q_lens.size(); ++s) {
        const int32_t ql = c.q_lens[s], sl = c.seq_lens[s];
        for (int32_t t = 0; t < ql; ++t, ++row) {
            const int32_t pos = sl - ql + t;
            const int32_t lo = c.window > 0 ? std::max(0, pos - c.window + 1) : 0;
            for (int32_t h = 0; h < nh; ++h) {
                const int32_t kvh = h / g;
                std::vector<double> logit(size_t(pos + 1), -INFINITY);
                double mx = -INFINITY;
                for (int32_t j = lo; j <= pos; ++j) {
                    double dot = 0;
                    for (int32_t k = 0; k < d; ++k)
                        dot += double(q[(size_t(row) * nh + h) * d + k]) *
                               ks[s][(size_t(j) * c.num_kv_heads + kvh) * d + k];
                    dot *= scale;
                    if (c.softcap > 0) dot = c.softcap * std::tanh(dot / c.softcap);
                    logit[size_t(j)] = dot;
                    mx = std::max(mx, dot);
                }
                double sum = 0;
                std::vector<double> o(size_t(d), 0.0);
                for (int32_t j = lo; j <= pos; ++j) {
                    const double p = std::exp(logit[size_t(j)] - mx);
                    sum += p;
                    for (int32_t k = 0; k < d; ++k)
                        o[size_t(k)] += p * vs[s][(size_t(j) * c.num_kv_heads + kvh) * d + k];
                }
                for (int32_t k = 0; k < d; ++k)
                    out[(size_t(row) * nh + h) * d + k] = float(o[size_t(k)] / sum);
            }
        }
    }
}

float round_bf16(float x) { return lc::bf16_to_f32(lc::f32_to_bf16(x)); }

void run_case(const Case& c, std::mt19937& rng) {
    const int32_t ns = int32_t(c.q_lens.size()), d = c.head_size, nkv = c.num_kv_heads;
    const int32_t bs = c.block_size;
    std::vector<int32_t> qs(size_t(ns) + 1, 0);
    for (int32_t s = 0; s < ns; ++s) qs[size_t(s) + 1] = qs[size_t(s)] + c.q_lens[size_t(s)];
    const int32_t nt = qs[size_t(ns)];
    int32_t max_blocks = 1, total_blocks = 0;
    for (int32_t sl : c.seq_lens) {
        max_blocks = std::max(max_blocks, (sl + bs - 1) / bs);
        total_blocks += (sl + bs - 1) / bs;
    }
    const int32_t nb = total_blocks + 3;
    std::vector<int32_t> ids(static_cast<size_t>(nb));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    std::vector<int32_t> bt(size_t(ns) * max_blocks, -1);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    auto gen = [&](size_t n) {
        std::vector<float> x(n);
        for (float& v : x)
            v = c.cache_dtype == LC_DTYPE_BF16 ? round_bf16(normal(rng)) : normal(rng);
        return x;
    };
    // Contiguous per-sequence K/V, then scattered into the shuffled blocks.
    std::vector<std::vector<float>> ks, vs;
    const size_t esz = lc::dtype_size(c.cache_dtype);
    std::vector<char> kc(size_t(nb) * nkv * bs * d * esz), vc(kc.size());
    std::fill(kc.begin(), kc.end(), char(0x7f));  // garbage (NaN-ish) in unused slots
    std::fill(vc.begin(), vc.end(), char(0x7f));
    int32_t next = 0;
    for (int32_t s = 0; s < ns; ++s) {
        const int32_t sl = c.seq_lens[size_t(s)];
        ks.push_back(gen(size_t(sl) * nkv * d));
        vs.push_back(gen(size_t(sl) * nkv * d));
        for (int32_t b = 0; b < (sl + bs - 1) / bs; ++b)
            bt[size_t(s) * max_blocks + b] = ids[size_t(next++)];
        for (int32_t j = 0; j < sl; ++j)
            for (int32_t h = 0; h < nkv; ++h)
                for (int32_t k = 0; k < d; ++k) {
                    const int64_t blk = bt[size_t(s) * max_blocks + j / bs];
                    const size_t at = size_t(((blk * nkv + h) * bs + j % bs) * d + k);
                    const float kv = ks[size_t(s)][(size_t(j) * nkv + h) * d + k];
                    const float vv = vs[size_t(s)][(size_t(j) * nkv + h) * d + k];
                    if (c.cache_dtype == LC_DTYPE_BF16) {
                        reinterpret_cast<uint16_t*>(kc.data())[at] = lc::f32_to_bf16(kv);
                        reinterpret_cast<uint16_t*>(vc.data())[at] = lc::f32_to_bf16(vv);
                    } else {
                        reinterpret_cast<float*>(kc.data())[at] = kv;
                        reinterpret_cast<float*>(vc.data())[at] = vv;
                    }
                }
    }
    std::vector<float> q = gen(size_t(nt) * c.num_heads * d);
    std::vector<float> expect(q.size()), got(q.size());
    const float scale = 1.0f / std::sqrt(float(d));
    naive(c, q, ks, vs, scale, expect);

    lc_attn_metadata md = {ns, nt, qs.data(), c.seq_lens.data(), bt.data(), max_blocks, nullptr};
    lc_attn_plan* plan = nullptr;
    CHECK(lc_attn_plan_create(&md, LC_DEVICE_CPU, nb, nullptr, &plan) == LC_OK, "%s",
          lc_last_error());
    lc_tensor tq = contiguous(q.data(), LC_DTYPE_F32, {nt, c.num_heads, d});
    lc_tensor tout = contiguous(got.data(), LC_DTYPE_F32, {nt, c.num_heads, d});
    lc_tensor tk = contiguous(kc.data(), c.cache_dtype, {nb, nkv, bs, d});
    lc_tensor tv = contiguous(vc.data(), c.cache_dtype, {nb, nkv, bs, d});
    lc_attn_params p = {scale, c.window, c.softcap};
    const lc::attn::Isa isas[] = {lc::attn::Isa::kScalar, lc::attn::Isa::kAvx2,
                                  lc::attn::Isa::kAvx512};
    for (lc::attn::Isa want : isas) {
        if (want > lc::attn::best_isa()) continue;
        lc::attn::set_isa(want);
        for (int threads : {1, 2}) {
            lc_set_num_threads(threads);
            std::fill(got.begin(), got.end(), NAN);
            CHECK(lc_paged_attention(plan, &tq, &tk, &tv, &tout, &p, nullptr) == LC_OK, "%s",
                  lc_last_error());
            double worst = 0;
            for (size_t i = 0; i < got.size(); ++i)
                worst = std::max(
                    worst, std::isnan(got[i]) ? INFINITY : double(std::fabs(got[i] - expect[i])));
            CHECK(worst < 2e-5, "%s [%s, %d threads]: max error %g", c.name,
                  lc::attn::isa_name(want), threads, worst);
        }
    }
    lc::attn::set_isa(lc::attn::best_isa());
    lc_set_num_threads(0);
    lc_attn_plan_destroy(plan);
}

void test_kv_store() {
    const int32_t nb = 4, nkv = 2, bs = 16, d = 64, nt = 3;
    int32_t qs[2] = {0, nt}, sl[1] = {nt}, bt[1] = {2};
    int64_t slots[nt] = {2 * bs + 5, -1, 3 * bs + 15};
    lc_attn_metadata md = {1, nt, qs, sl, bt, 1, slots};
    lc_attn_plan* plan = nullptr;
    CHECK(lc_attn_plan_create(&md, LC_DEVICE_CPU, nb, nullptr, &plan) == LC_OK, "%s",
          lc_last_error());
    std::vector<float> k(size_t(nt) * nkv * d), v(k.size());
    for (size_t i = 0; i < k.size(); ++i) k[i] = float(i) * 0.5f, v[i] = -float(i);
    std::vector<uint16_t> kc(size_t(nb) * nkv * bs * d, 0), vc(kc.size(), 0);
    lc_tensor tk = contiguous(k.data(), LC_DTYPE_F32, {nt, nkv, d});
    lc_tensor tv = contiguous(v.data(), LC_DTYPE_F32, {nt, nkv, d});
    lc_tensor tkc = contiguous(kc.data(), LC_DTYPE_BF16, {nb, nkv, bs, d});
    lc_tensor tvc = contiguous(vc.data(), LC_DTYPE_BF16, {nb, nkv, bs, d});
    CHECK(lc_kv_store(plan, &tk, &tv, &tkc, &tvc, nullptr) == LC_OK, "%s", lc_last_error());
    size_t nonzero = 0;
    for (uint16_t x : kc) nonzero += x != 0;
    CHECK(nonzero == size_t(2 * nkv * d - 1), "token 1 (slot -1) must not be stored, %zu", nonzero);
    const size_t at = size_t(((3 * nkv + 1) * bs + 15) * d + 7);  // token 2, head 1, elem 7
    CHECK(lc::bf16_to_f32(kc[at]) == round_bf16(k[size_t((2 * nkv + 1) * d + 7)]), "k round trip");
    CHECK(lc::bf16_to_f32(vc[at]) == round_bf16(v[size_t((2 * nkv + 1) * d + 7)]), "v round trip");
    lc_attn_plan_destroy(plan);

    int64_t bad_slots[nt] = {0, 1, int64_t(nb) * bs};
    md.slot_mapping = bad_slots;
    CHECK(lc_attn_plan_create(&md, LC_DEVICE_CPU, nb, nullptr, &plan) == LC_OK, "%s",
          lc_last_error());
    CHECK(lc_kv_store(plan, &tk, &tv, &tkc, &tvc, nullptr) == LC_ERR_INVALID_ARGUMENT,
          "slot bound");
    CHECK(std::strstr(lc_last_error(), "slot 64") != nullptr, "message: %s", lc_last_error());
    lc_attn_plan_destroy(plan);
}

void test_plan_errors() {
    int32_t qs[3] = {0, 2, 1}, sl[2] = {4, 4}, bt[2] = {0, 1};
    lc_attn_metadata md = {2, 1, qs, sl, bt, 1, nullptr};
    lc_attn_plan* plan = nullptr;
    CHECK(lc_attn_plan_create(&md, LC_DEVICE_CPU, 0, nullptr, &plan) == LC_ERR_INVALID_ARGUMENT,
          "decreasing query_start");
    CHECK(plan == nullptr, "no plan on failure");
    int32_t qs2[3] = {0, 1, 6};
    md.query_start = qs2;
    md.num_tokens = 6;
    CHECK(lc_attn_plan_create(&md, LC_DEVICE_CPU, 0, nullptr, &plan) == LC_ERR_INVALID_ARGUMENT,
          "seq_lens below query count");
    sl[1] = 5;
    bt[1] = 9;
    CHECK(lc_attn_plan_create(&md, LC_DEVICE_CPU, 8, nullptr, &plan) == LC_ERR_INVALID_ARGUMENT,
          "block id out of range");
    CHECK(lc_attn_plan_create(&md, LC_DEVICE_CPU, 10, nullptr, &plan) == LC_OK, "%s",
          lc_last_error());
    lc_attn_plan_destroy(plan);
#if !defined(LLMCORE_WITH_CUDA)
    CHECK(lc_attn_plan_create(&md, LC_DEVICE_CUDA, 10, nullptr, &plan) == LC_ERR_UNSUPPORTED,
          "CUDA plan without CUDA");
#endif
}

}  // namespace

int main() {
    std::mt19937 rng(1234);
    const Case cases[] = {
        {"decode mha", {1, 1, 1}, {1, 17, 40}, 4, 4, 64, 16, LC_DTYPE_F32},
        {"decode gqa3 bf16", {1, 1}, {33, 100}, 9, 3, 64, 16, LC_DTYPE_BF16},
        {"mixed prefill gqa4", {5, 1, 13, 1}, {5, 70, 40, 1}, 8, 2, 80, 32, LC_DTYPE_F32},
        {"chunked prefill gqa8 d96", {20, 3}, {90, 3}, 8, 1, 96, 16, LC_DTYPE_BF16},
        {"window d128", {1, 7}, {150, 60}, 4, 2, 128, 16, LC_DTYPE_F32, 33},
        {"softcap", {3, 1}, {40, 77}, 6, 2, 64, 32, LC_DTYPE_F32, 0, 5.0f},
        {"odd block size", {2, 1}, {30, 55}, 2, 1, 64, 7, LC_DTYPE_F32},
        {"split-k long decode", {1}, {3000}, 9, 3, 64, 16, LC_DTYPE_BF16},
        {"split-k window", {2}, {2500}, 4, 1, 64, 16, LC_DTYPE_F32, 700},
        {"many heads per kv", {2}, {20}, 40, 1, 64, 16, LC_DTYPE_F32},
        // Eight or more sequences: decode items take every KV head of a block.
        {"batched decode gqa3 bf16",
         {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
         {1, 15, 16, 17, 63, 64, 65, 128, 200, 257, 300, 331},
         9, 3, 64, 16, LC_DTYPE_BF16},
        {"batched decode window softcap", {1, 1, 1, 1, 1, 1, 1, 1, 1},
         {5, 40, 41, 90, 130, 64, 200, 7, 99}, 8, 2, 80, 16, LC_DTYPE_F32, 40, 4.0f},
        {"batched decode mha d128 odd block", {1, 1, 1, 1, 1, 1, 1, 1},
         {3, 9, 70, 71, 140, 33, 12, 65}, 4, 4, 128, 7, LC_DTYPE_BF16},
        // Prefill tiles of many query rows (bf16 tiles widened once per item)
        // with ragged ends, next to decode rows in one call.
        {"mixed prefill and decode gqa3", {45, 1, 1, 1, 1, 1, 1, 1, 1, 33, 1},
         {45, 20, 70, 130, 5, 64, 300, 17, 33, 80, 140}, 9, 3, 64, 16, LC_DTYPE_BF16},
        {"prefill window odd block bf16", {45, 33}, {45, 70}, 6, 2, 96, 7, LC_DTYPE_BF16, 50},
        {"prefill softcap f32", {70}, {70}, 9, 3, 64, 16, LC_DTYPE_F32, 0, 3.0f},
        // Gemma 3 270M: 4 query heads over one KV head of 256, sliding windows, bf16 cache;
        // Gemma 2's softcap; a tiny test model's head of 32.
        {"d256 gqa4 one kv head decode bf16", {1, 1, 1}, {3, 130, 700}, 4, 1, 256, 16,
         LC_DTYPE_BF16},
        {"d256 window decode bf16", {1, 1, 1, 1, 1, 1, 1, 1, 1}, {5, 40, 41, 90, 130, 64, 600, 7, 99},
         4, 1, 256, 16, LC_DTYPE_BF16, 50},
        {"d256 prefill window softcap", {45, 20}, {45, 260}, 4, 1, 256, 16, LC_DTYPE_F32, 33, 5.0f},
        {"d256 prefill window bf16 split", {2}, {2000}, 8, 2, 256, 16, LC_DTYPE_BF16, 700},
        {"d32 mixed", {9, 1, 1}, {9, 70, 33}, 6, 2, 32, 16, LC_DTYPE_F32, 0, 4.0f},
        {"d32 window bf16", {30, 1}, {30, 90}, 4, 4, 32, 7, LC_DTYPE_BF16, 12},
    };
    std::printf("best ISA: %s\n", lc::attn::isa_name(lc::attn::best_isa()));
    for (const Case& c : cases) run_case(c, rng);
    test_kv_store();
    test_plan_errors();
    if (lctest::failures) return lctest::finish();
    std::printf("ok\n");
    return 0;
}
