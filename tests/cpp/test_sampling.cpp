// C++ checks of the CPU sampler: the Philox known-answer vectors, the
// per-ISA kernels against each other and against the scalar generator,
// greedy, determinism across batch composition, all-masked rows, errors.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <string>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "check.h"
#include "llmcore/llmcore.h"
#include "sampling/rng.h"
#include "sampling/sampling_kernels.h"


static lc_tensor logits_f32(std::vector<float>& v, int64_t rows, int64_t vocab) {
    lc_tensor t{};
    t.data = v.data();
    t.dtype = LC_DTYPE_F32;
    t.device = LC_DEVICE_CPU;
    t.ndim = 2;
    t.shape[0] = rows;
    t.shape[1] = vocab;
    t.strides[0] = vocab;
    t.strides[1] = 1;
    return t;
}

static lc_sampling_row row(float temperature, uint64_t seed, int64_t position) {
    lc_sampling_row r{};
    r.temperature = temperature;
    r.top_p = 1.0f;
    r.repetition_penalty = 1.0f;
    r.seed = seed;
    r.position = position;
    return r;
}

static lc_sampling_batch batch_of(std::vector<lc_sampling_row>& rows) {
    lc_sampling_batch b{};
    b.num_rows = int32_t(rows.size());
    b.rows = rows.data();
    return b;
}

static void test_philox_known_answers() {
    // Random123 kat_vectors, philox4x32 with 10 rounds.
    using lc::rng::U32x4;
    U32x4 a = lc::rng::philox4x32_10({{0, 0, 0, 0}}, 0, 0);
    CHECK(a.v[0] == 0x6627e8d5u && a.v[1] == 0xe169c58du && a.v[2] == 0xbc57ac4cu &&
          a.v[3] == 0x9b00dbd8u);
    U32x4 b = lc::rng::philox4x32_10({{~0u, ~0u, ~0u, ~0u}}, ~0u, ~0u);
    CHECK(b.v[0] == 0x408f276du && b.v[1] == 0x41c83b0eu && b.v[2] == 0xa20bc7c6u &&
          b.v[3] == 0x6d5451fdu);
    U32x4 c = lc::rng::philox4x32_10({{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}},
                                     0xa4093822u, 0x299f31d0u);
    CHECK(c.v[0] == 0xd16cfe09u && c.v[1] == 0x94fdccebu && c.v[2] == 0x5001e420u &&
          c.v[3] == 0x24126ea1u);
    // The documented mapping, and the C entry point.
    const uint64_t seed = 0x0123456789abcdefull;
    const int64_t pos = 0x100000002ll;
    U32x4 d = lc::rng::philox4x32_10({{7u, 2u, 1u, 0u}}, 0x89abcdefu, 0x01234567u);
    CHECK(lc_rng_uniform(seed, pos, 30) == float(d.v[2] >> 8) / 16777216.0f);
    float lo = 1.0f, hi = 0.0f;
    for (uint32_t i = 0; i < 10000; ++i) {
        const float u = lc_rng_uniform(1, 0, i);
        lo = std::min(lo, u);
        hi = std::max(hi, u);
    }
    CHECK(lo >= 0.0f && lo < 0.001f && hi < 1.0f && hi > 0.999f);
}

static void test_kernels_agree() {
    std::mt19937 gen(3);
    std::normal_distribution<float> nd(0.0f, 3.0f);
    const int64_t n = 1000;
    std::vector<float> src(n);
    for (auto& v : src) v = nd(gen);
    src[5] = NAN;
    src[6] = -INFINITY;
    const lc::sampling::Kernels* tables[] = {&lc::sampling::kernels_portable(),
                                             lc::sampling::kernels_avx2(),
                                             lc::sampling::kernels_avx512()};
    const lc::sampling::Kernels& ref = lc::sampling::kernels_portable();
    std::vector<float> a(n), b(n);
    const float ma = ref.load_f32(src.data(), a.data(), n, nullptr);
    CHECK(a[5] == -INFINITY && a[6] == -INFINITY);
    // Scalar reference race with libm: must pick the same token.
    int64_t expect = -1;
    float best = -1.0f;
    for (int64_t i = 0; i < n; ++i) {
        if (!(a[i] > -INFINITY)) continue;
        const float u = lc::rng::uniform(9, 4, uint32_t(i));
        const float key = std::exp(a[i] - ma) / (u > 0 ? -std::log(u) : INFINITY);
        if (key > best) best = key, expect = i;
    }
    for (const lc::sampling::Kernels* k : tables) {
        if (!k) continue;
        // Only tables the CPU can run: the best one and those below it.
        lc::Isa isa;
        CHECK(lc::parse_isa(k->isa, &isa));
        if (isa > lc::sampling::best_isa()) {
            std::printf("skipped sampling kernels %s: this CPU does not run them\n", k->isa);
            continue;
        }
        std::printf("sampling kernels %s vs scalar\n", k->isa);
        const float mb = k->load_f32(src.data(), b.data(), n, nullptr);
        CHECK(mb == ma);
        const float za = ref.sum_exp(a.data(), n, ma), zb = k->sum_exp(b.data(), n, mb);
        CHECK(std::fabs(za - zb) <= 1e-5f * za);
        double z = 0.0;
        for (float v : a) z += std::exp(double(v - ma));
        CHECK(std::fabs(za - z) <= 1e-5 * z);
        CHECK(k->count_greater(b.data(), n, 0.0f) == ref.count_greater(a.data(), n, 0.0f));
        auto r = k->race_dense(b.data(), n, mb, -FLT_MAX, 0.0f, 1.0f, 9, 4);
        CHECK(r.token == expect);
    }
}

static void test_greedy_and_masked() {
    const int64_t vocab = 300;
    std::vector<float> v(3 * vocab, 0.0f);
    v[0 * vocab + 17] = 5.0f;
    v[1 * vocab + 3] = 2.0f;
    v[1 * vocab + 9] = 2.0f;  // tie: lowest id wins
    lc_tensor t = logits_f32(v, 3, vocab);
    std::vector<lc_sampling_row> rows = {row(0.0f, 1, 0), row(-1.0f, 1, 0), row(1.0f, 1, 0)};
    // Row 2: every token banned.
    std::vector<int32_t> banned_offsets = {0, 0, 0, int32_t(vocab)};
    std::vector<int32_t> banned(vocab);
    for (int32_t i = 0; i < vocab; ++i) banned[i] = i;
    lc_sampling_batch b = batch_of(rows);
    b.banned_offsets = banned_offsets.data();
    b.banned_tokens = banned.data();
    int32_t tokens[3], ranks[3];
    float lps[3];
    lc_sample_output out{tokens, lps, ranks, nullptr, nullptr};
    CHECK(lc_sample(&t, &b, nullptr, &out) == LC_OK);
    CHECK(tokens[0] == 17 && tokens[1] == 3 && tokens[2] == LC_NO_TOKEN);
    CHECK(ranks[0] == 1 && ranks[1] == 1 && ranks[2] == 0);
    CHECK(std::isinf(lps[2]) && lps[2] < 0);
    CHECK(std::fabs(lps[0] - (5.0f - std::log(std::exp(5.0f) + 299.0f))) < 1e-5f);
}

static void test_batch_invariance() {
    const int64_t vocab = 4096, rows_n = 16;
    std::mt19937 gen(5);
    std::normal_distribution<float> nd(0.0f, 2.0f);
    std::vector<float> v(rows_n * vocab);
    for (auto& x : v) x = nd(gen);
    std::vector<lc_sampling_row> rows;
    for (int64_t r = 0; r < rows_n; ++r) {
        lc_sampling_row p = row(0.8f, 1000 + r, r * 3);
        p.top_k = r % 3 == 0 ? 40 : 0;
        p.top_p = r % 2 == 0 ? 0.9f : 1.0f;
        rows.push_back(p);
    }
    lc_tensor t = logits_f32(v, rows_n, vocab);
    lc_sampling_batch b = batch_of(rows);
    std::vector<int32_t> all(rows_n);
    lc_sample_output out{all.data(), nullptr, nullptr, nullptr, nullptr};
    CHECK(lc_sample(&t, &b, nullptr, &out) == LC_OK);
    for (int64_t r = 0; r < rows_n; ++r) {
        std::vector<float> one(v.begin() + r * vocab, v.begin() + (r + 1) * vocab);
        lc_tensor t1 = logits_f32(one, 1, vocab);
        std::vector<lc_sampling_row> r1 = {rows[r]};
        lc_sampling_batch b1 = batch_of(r1);
        int32_t tok = -2;
        lc_sample_output o1{&tok, nullptr, nullptr, nullptr, nullptr};
        CHECK(lc_sample(&t1, &b1, nullptr, &o1) == LC_OK);
        CHECK(tok == all[r]);
        CHECK(tok >= 0 && tok < vocab);
    }
}

static void test_errors() {
    std::vector<float> v(8, 0.0f);
    lc_tensor t = logits_f32(v, 1, 8);
    std::vector<lc_sampling_row> rows = {row(1.0f, 1, 0)};
    rows[0].top_p = 0.0f;
    lc_sampling_batch b = batch_of(rows);
    int32_t tok;
    lc_sample_output out{&tok, nullptr, nullptr, nullptr, nullptr};
    CHECK(lc_sample(&t, &b, nullptr, &out) == LC_ERR_INVALID_ARGUMENT);
    CHECK(std::string(lc_last_error()).find("top_p") != std::string::npos);
    rows[0].top_p = 1.0f;
    std::vector<int32_t> offsets = {0, 1}, ids = {8};
    b.output_offsets = offsets.data();
    b.output_tokens = ids.data();
    CHECK(lc_sample(&t, &b, nullptr, &out) == LC_ERR_INVALID_ARGUMENT);
    b.output_offsets = nullptr;
    CHECK(lc_sample(&t, &b, nullptr, &out) == LC_OK);
    t.device = LC_DEVICE_CUDA;
#if !defined(LLMCORE_WITH_CUDA)
    CHECK(lc_sample(&t, &b, nullptr, &out) == LC_ERR_UNSUPPORTED);
#endif
}

int main() {
    test_philox_known_answers();
    test_kernels_agree();
    test_greedy_and_masked();
    test_batch_invariance();
    test_errors();
    std::printf("sampling kernels: %s\n", lc::sampling::kernels().isa);
    return lctest::finish();
}
