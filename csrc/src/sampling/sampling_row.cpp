// One row of the CPU sampler.
//
//   load (sanitize) -> bias -> bans -> bitmask -> repetition -> frequency/presence
//   -> temperature -> [greedy argmax] or [min-p -> top-k -> top-p -> race]
//
// The draw is an exponential race: token i wins with key w_i / E_i, where
// w_i = exp(s_i - max s) and E_i = -log(u_i) ~ Exp(1) with u_i the counter-RNG
// uniform for (seed, position, i). argmax_i w_i / E_i is distributed exactly
// as w_i / sum_j w_j over the kept tokens, needs no normalization and no sort,
// and each token's key depends only on its own id: batch-invariant.
//
// The exact recipe (what a second implementation must follow to draw the
// same tokens): s_i = sanitize(x_i / T) in fp32, m = max_i s_i;
//   min-p keeps s_i >= m + log(min_p);
//   top-k keeps s_i >= the k-th largest surviving s (all ties at it kept);
//   top-p orders the survivors by (s desc, id asc) and keeps token j while the
//     mass exp(s - m) of the tokens before it is < top_p * their total mass;
//   winner = argmax over kept i of exp(s_i - m) / -log(u_i) (u_i = 0 -> key 0),
//     ties -> lowest id, u_i = lc_rng_uniform(seed, position, i).
//
// Logprobs: RAW = log_softmax of the logits as given (sanitized);
// PROCESSED = log_softmax after bias, masks, penalties and temperature (greedy
// rows: temperature 1), before min-p/top-k/top-p. Listed ids (logprob_offsets)
// read the same distribution, so an id's listed logprob equals its top entry.
#include "sampling/sampling_row.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <vector>

#include "runtime/internal.h"
#include "sampling/rng.h"
#include "sampling/sampling_select.h"

namespace lc::sampling {

namespace {

constexpr float kInf = INFINITY;

struct Scratch {
    std::vector<float> x, raw, x_max, raw_max;  // values and their block maxima
    std::vector<uint32_t> stamp;  // stamp[t] == epoch: t already penalized this row
    uint32_t epoch = 0;
    std::vector<int32_t> counts;  // output-token counts, all zero between rows
    std::vector<Candidate> cand, best;
    std::vector<double> mass;

    void prepare(int64_t vocab) {
        const size_t v = size_t(vocab);
        if (x.size() < v) {
            x.resize(v);
            raw.resize(v);
            x_max.resize(v / kBlockSize + 1);
            raw_max.resize(v / kBlockSize + 1);
            stamp.assign(v, 0u);
            counts.assign(v, 0);
            epoch = 0;
        }
        if (++epoch == 0) {  // wrapped: old stamps could alias
            std::fill(stamp.begin(), stamp.end(), 0u);
            epoch = 1;
        }
    }
};

thread_local Scratch t_scratch;

struct Span {
    const int32_t* begin = nullptr;
    const int32_t* end = nullptr;
};

Span row_span(const int32_t* offsets, const int32_t* ids, int64_t r) {
    if (!offsets) return {};
    return {ids + offsets[r], ids + offsets[r + 1]};
}

void apply_penalties(float* x, const lc_sampling_row& p, Span prompt, Span output, Scratch& sc) {
    if (p.repetition_penalty != 1.0f) {
        const float rp = p.repetition_penalty;
        for (Span s : {prompt, output})
            for (const int32_t* t = s.begin; t != s.end; ++t) {
                if (sc.stamp[*t] == sc.epoch) continue;
                sc.stamp[*t] = sc.epoch;
                x[*t] = x[*t] > 0.0f ? x[*t] / rp : x[*t] * rp;
            }
    }
    if (p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f) {
        for (const int32_t* t = output.begin; t != output.end; ++t) ++sc.counts[*t];
        for (const int32_t* t = output.begin; t != output.end; ++t) {
            const int32_t c = sc.counts[*t];
            if (c == 0) continue;  // a repeat, already applied
            x[*t] = x[*t] - p.frequency_penalty * float(c);
            x[*t] = x[*t] - p.presence_penalty;
            sc.counts[*t] = 0;
        }
    }
}

float race_key(float w, uint64_t seed, int64_t position, int32_t token) {
    const float u = rng::uniform(seed, position, uint32_t(token));
    const float e = u > 0.0f ? -std::log(u) : kInf;
    return w / e;
}

// Race over explicit candidates; updates best (ties -> lowest id).
void race_list(const Candidate* c, size_t n, float m, const lc_sampling_row& p, RaceResult& best) {
    for (size_t i = 0; i < n; ++i) {
        const float key = race_key(std::exp(c[i].value - m), p.seed, p.position, c[i].token);
        if (key > best.key || (key == best.key && c[i].token < best.token))
            best = {c[i].token, key};
    }
}

// Number of leading candidates (sorted by better()) kept by top-p: token j is
// kept while the mass before it is below top_p * total.
size_t top_p_prefix(const Candidate* c, size_t n, float m, double target, double before) {
    size_t kept = 0;
    double cum = before;
    while (kept < n && cum < target) cum += std::exp(double(c[kept++].value - m));
    return std::max<size_t>(kept, before == 0.0 && n ? 1 : 0);
}

int64_t draw(const Kernels& k, const float* s, int64_t n, float m, const lc_sampling_row& p,
             Scratch& sc) {
    float lo = -FLT_MAX;  // excludes masked (-inf) tokens
    if (p.min_p > 0.0f) lo = std::max(lo, m + std::log(p.min_p));
    const bool use_top_k = p.top_k > 0 && int64_t(p.top_k) < n;
    const bool use_top_p = p.top_p < 1.0f;

    if (use_top_k) {
        select_top_k(s, sc.x_max.data(), n, p.top_k, lo, sc.cand);
        size_t kept = sc.cand.size();
        if (use_top_p) {
            std::sort(sc.cand.begin(), sc.cand.end(), better);
            double z = 0.0;
            for (const Candidate& c : sc.cand) z += std::exp(double(c.value - m));
            kept = top_p_prefix(sc.cand.data(), sc.cand.size(), m, double(p.top_p) * z, 0.0);
        }
        RaceResult best{-1, -1.0f};
        race_list(sc.cand.data(), kept, m, p, best);
        return best.token;
    }
    if (!use_top_p) return k.race_dense(s, n, m, lo, 0.0f, 1.0f, p.seed, p.position).token;

    // top-p over the whole vocabulary: histogram the mass by distance below
    // the max, find the bucket where the cumulative mass reaches top_p, and
    // sort only that bucket's tokens.
    sc.mass.assign(kNumBuckets, 0.0);
    k.bucket_mass(s, n, m, lo, sc.mass.data());
    double z = 0.0;
    for (double b : sc.mass) z += b;
    const double target = double(p.top_p) * z;
    int edge = 0;
    double before = 0.0;
    while (edge < kNumBuckets - 1 && before + sc.mass[edge] < target) before += sc.mass[edge++];
    sc.cand.clear();
    for (int64_t i = 0; i < n; ++i)
        if (s[i] >= lo && bucket_of(m - s[i]) == edge) sc.cand.push_back({s[i], int32_t(i)});
    std::sort(sc.cand.begin(), sc.cand.end(), better);
    const size_t kept = top_p_prefix(sc.cand.data(), sc.cand.size(), m, target, before);
    RaceResult best = k.race_dense(s, n, m, lo, kBucketsPerNat, float(edge), p.seed, p.position);
    race_list(sc.cand.data(), kept, m, p, best);
    return best.token;
}

// The mode's distribution: values d with max dm; logprob(i) = d[i] - dm - lse.
struct Dist {
    const float* d;
    const float* block_max;
    float dm;
    float lse;
    float logprob(int64_t i) const { return dm > -kInf ? (d[i] - dm) - lse : -kInf; }
};

void write_logprobs(const Kernels& k, const Dist& dist, int64_t n, int64_t token, int64_t r,
                    const lc_sampling_batch& b, const lc_sample_output& out, Scratch& sc) {
    const int32_t num_top = b.num_top_logprobs;
    if (b.logprob_offsets)
        for (int32_t i = b.logprob_offsets[r]; i < b.logprob_offsets[r + 1]; ++i)
            out.listed_logprobs[i - b.logprob_offsets[0]] = dist.logprob(b.logprob_ids[i]);
    if (out.logprobs) out.logprobs[r] = token >= 0 ? dist.logprob(token) : -kInf;
    if (out.ranks)
        out.ranks[r] = token >= 0 ? int32_t(1 + k.count_greater(dist.d, n, dist.d[token])) : 0;
    if (num_top > 0) {
        select_best(dist.d, dist.block_max, n, num_top, -FLT_MAX, sc.best);
        int32_t* tt = out.top_tokens + r * num_top;
        float* tl = out.top_logprobs + r * num_top;
        for (int32_t j = 0; j < num_top; ++j) {
            const bool have = size_t(j) < sc.best.size();
            tt[j] = have ? sc.best[j].token : LC_NO_TOKEN;
            tl[j] = have ? dist.logprob(sc.best[j].token) : -kInf;
        }
    }
}

}  // namespace

void sample_row(const Kernels& k, const lc_tensor& logits, const lc_sampling_batch& b, int64_t r,
                const lc_sample_output& out) {
    const int64_t n = logits.shape[1];
    const lc_sampling_row& p = b.rows[r];
    Scratch& sc = t_scratch;
    sc.prepare(n);
    float* x = sc.x.data();

    const int64_t offset = r * logits.strides[0];
    const bool listed = b.logprob_offsets && b.logprob_offsets[r + 1] > b.logprob_offsets[r];
    const bool want_logprobs = out.logprobs || out.ranks || b.num_top_logprobs > 0 || listed;
    const bool raw_mode = b.logprobs_mode == LC_LOGPROBS_RAW;
    // Raw values (and their block maxima) are kept only when logprobs report them.
    float* raw_block_max = want_logprobs && raw_mode ? sc.raw_max.data() : nullptr;
    const float raw_max =
        logits.dtype == LC_DTYPE_F32
            ? k.load_f32(static_cast<const float*>(logits.data) + offset, x, n, raw_block_max)
            : k.load_bf16(static_cast<const uint16_t*>(logits.data) + offset, x, n,
                          raw_block_max);
    if (raw_block_max) std::memcpy(sc.raw.data(), x, size_t(n) * sizeof(float));

    for (Span s = row_span(b.bias_offsets, b.bias_tokens, r); s.begin != s.end; ++s.begin)
        x[*s.begin] += b.bias_values[s.begin - b.bias_tokens];
    for (Span s = row_span(b.banned_offsets, b.banned_tokens, r); s.begin != s.end; ++s.begin)
        x[*s.begin] = -kInf;
    if (p.use_bitmask) k.apply_bitmask(x, n, b.allowed_bitmask + r * int64_t(b.bitmask_words));
    apply_penalties(x, p, row_span(b.prompt_offsets, b.prompt_tokens, r),
                    row_span(b.output_offsets, b.output_tokens, r), sc);

    const bool greedy = !(p.temperature > 0.0f);
    const float m = k.scale_max(x, n, greedy ? 1.0f : p.temperature, sc.x_max.data());
    int64_t token = LC_NO_TOKEN;
    if (m > -kInf)
        token = greedy ? argmax_first(x, sc.x_max.data(), n, m) : draw(k, x, n, m, p, sc);
    out.tokens[r] = int32_t(token);

    if (!want_logprobs) return;
    Dist dist{raw_mode ? sc.raw.data() : x, raw_mode ? sc.raw_max.data() : sc.x_max.data(),
              raw_mode ? raw_max : m, 0.0f};
    if (dist.dm > -kInf) dist.lse = std::log(k.sum_exp(dist.d, n, dist.dm));
    write_logprobs(k, dist, n, token, r, b, out, sc);
}

}  // namespace lc::sampling
