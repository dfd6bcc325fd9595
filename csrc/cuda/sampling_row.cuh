// The per-row steps of the CUDA sampler (sampling.cu runs them, one thread block
// per row): the call's arguments on the device, penalties, the draw (greedy, or
// min-p -> top-k -> top-p -> exponential race) and the logprobs. Included once,
// by sampling.cu; internal linkage.
#pragma once

#include <cfloat>
#include <climits>

#include "cuda_util.cuh"
#include "sampling/rng.h"
#include "sampling_math.cuh"
#include "sampling_select.cuh"

namespace lc::cuda {
namespace {

using samp::kThreads;

// Bits of the per-token marks (penalty bookkeeping, zeroed per call).
constexpr int32_t kRepetitionDone = 1;    // repetition penalty applied
constexpr int32_t kCountUnit = 2;         // output count lives in bits 1..29
constexpr int32_t kCountMask = 0x1fffffff;
constexpr int32_t kFrequencyDone = 1 << 30;

struct SampleArgs {
    const void* logits;
    int32_t dtype;
    int64_t row_stride;
    int64_t vocab;
    const lc_sampling_row* rows;
    const int32_t* prompt_off;
    const int32_t* prompt_ids;
    const int32_t* output_off;
    const int32_t* output_ids;
    const int32_t* bias_off;
    const int32_t* bias_ids;
    const float* bias_vals;
    const int32_t* banned_off;
    const int32_t* banned_ids;
    const int32_t* bitmask;
    int64_t bitmask_words;
    int32_t num_top;
    int32_t raw_mode;
    int32_t want_logprobs;
    float* x;        // [rows][vocab] processed logits
    int32_t* marks;  // [rows][vocab] or null when no row has penalties
    int32_t* tokens;
    float* logprobs;
    int32_t* ranks;
    int32_t* top_tokens;
    float* top_logprobs;
    const int32_t* listed_off;  // listed logprobs (CSR rebased to 0), or null
    const int32_t* listed_ids;
    float* listed_logprobs;
};

__device__ __forceinline__ float load_logit(const SampleArgs& a, int64_t r, int64_t i) {
    const int64_t at = r * a.row_stride + i;
    const float v = a.dtype == LC_DTYPE_BF16
                        ? __bfloat162float(static_cast<const __nv_bfloat16*>(a.logits)[at])
                        : static_cast<const float*>(a.logits)[at];
    return samp::sanitize(v);
}

struct Span {
    int32_t begin = 0, end = 0;
};
__device__ __forceinline__ Span row_span(const int32_t* off, int64_t r) {
    Span s;
    if (off) s.begin = off[r], s.end = off[r + 1];
    return s;
}

struct SharedState {
    samp::SelectShared sel;
    __align__(8) unsigned char red[samp::kWarps * 8];
};

template <class T>
__device__ __forceinline__ T* red_as(SharedState& sh) {
    return reinterpret_cast<T*>(sh.red);
}

__device__ void apply_penalties(const SampleArgs& a, const lc_sampling_row& p, int64_t r,
                                float* x) {
    if (!a.marks) return;
    int32_t* mk = a.marks + r * a.vocab;
    const Span prompt = row_span(a.prompt_off, r), output = row_span(a.output_off, r);
    const int32_t np = prompt.end - prompt.begin, no = output.end - output.begin;
    if (p.repetition_penalty != 1.0f) {
        // Each distinct token of prompt and output, once.
        const float rp = p.repetition_penalty;
        for (int32_t j = threadIdx.x; j < np + no; j += kThreads) {
            const int32_t t =
                j < np ? a.prompt_ids[prompt.begin + j] : a.output_ids[output.begin + j - np];
            if (atomicOr(&mk[t], kRepetitionDone) & kRepetitionDone) continue;
            const float v = x[t];
            x[t] = v > 0.0f ? v / rp : v * rp;
        }
        __syncthreads();
    }
    if (p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f) {
        for (int32_t j = threadIdx.x; j < no; j += kThreads)
            atomicAdd(&mk[a.output_ids[output.begin + j]], kCountUnit);
        __syncthreads();
        for (int32_t j = threadIdx.x; j < no; j += kThreads) {
            const int32_t t = a.output_ids[output.begin + j];
            const int32_t old = atomicOr(&mk[t], kFrequencyDone);
            if (old & kFrequencyDone) continue;
            const float c = float((old >> 1) & kCountMask);
            // Two roundings, as the CPU does: no fused multiply-add.
            const float v = __fsub_rn(x[t], __fmul_rn(p.frequency_penalty, c));
            x[t] = __fsub_rn(v, p.presence_penalty);
        }
        __syncthreads();
    }
}

// The draw for a non-greedy row whose max processed logit m is finite.
__device__ int32_t draw(const SampleArgs& a, const lc_sampling_row& p, const float* x, float m,
                        SharedState& sh) {
    const int64_t n = a.vocab;
    float lo = -FLT_MAX;  // excludes masked (-inf) tokens
    if (p.min_p > 0.0f) lo = fmaxf(lo, m + logf(p.min_p));
    const bool use_top_k = p.top_k > 0 && int64_t(p.top_k) < n;
    const bool use_top_p = p.top_p < 1.0f;

    // Members after min-p and top-k: x >= lo and key >= k_min (ties at the
    // k-th value all stay, as on the CPU).
    uint32_t k_min = 0;
    if (use_top_k) {
        const samp::Selection s = samp::select_desc(
            n,
            [&](int64_t i, uint32_t& k) {
                const float v = x[i];
                k = samp::order_key(v);
                return v >= lo;
            },
            [](int64_t, uint32_t) { return 1.0; }, double(p.top_k), sh.sel);
        if (s.reached) k_min = s.key;
    }
    auto member = [&](int64_t i, uint32_t& k) {
        const float v = x[i];
        k = samp::order_key(v);
        return v >= lo && k >= k_min;
    };

    // Top-p: keep the shortest prefix of the sorted members whose mass
    // reaches top_p of their total: keys above p_key, plus the lowest ids
    // (up to tok_max) among the members tied at p_key.
    uint32_t p_key = 0;
    int32_t tok_max = INT_MAX;
    if (use_top_p) {
        double part = 0.0;
        for (int64_t i = threadIdx.x; i < n; i += kThreads) {
            uint32_t k;
            if (member(i, k)) part += exp(double(x[i] - m));
        }
        const double z = samp::block_reduce(part, samp::Sum{}, red_as<double>(sh));
        const double target = double(p.top_p) * z;
        const samp::Selection s = samp::select_desc(
            n, member, [&](int64_t i, uint32_t) { return exp(double(x[i] - m)); }, target, sh.sel);
        if (s.reached) {
            p_key = s.key;
            int32_t ties_part = 0;
            for (int64_t i = threadIdx.x; i < n; i += kThreads) {
                uint32_t k;
                ties_part += member(i, k) && k == p_key;
            }
            const int32_t ties = samp::block_reduce(ties_part, samp::Sum{}, red_as<int32_t>(sh));
            const double w = exp(double(samp::key_value(p_key) - m));
            double cum = s.before;
            int32_t take = 0;
            while (take < ties && cum < target) cum += w, ++take;
            if (take < 1) take = 1;
            if (take < ties) {
                // The take-th smallest id among the ties: select on ~id.
                const samp::Selection t = samp::select_desc(
                    n,
                    [&](int64_t i, uint32_t& k) {
                        uint32_t vk;
                        k = ~uint32_t(i);
                        return member(i, vk) && vk == p_key;
                    },
                    [](int64_t, uint32_t) { return 1.0; }, double(take), sh.sel);
                tok_max = int32_t(~t.key);
            }
        }
    }

    // Exponential race over the kept tokens: argmax exp(v - m) / -log(u).
    // The CPU races top-k candidates with libm exp/log and everything else
    // with its polynomials; do the same so that the keys agree closely.
    uint64_t best = 0;
    const int64_t groups = (n + 3) / 4;  // one Philox call serves 4 ids
    for (int64_t g = threadIdx.x; g < groups; g += kThreads) {
        bool keep[4];
        bool any = false;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int64_t i = 4 * g + j;
            uint32_t k = 0;
            keep[j] = i < n && member(i, k) &&
                      (!use_top_p || k > p_key || (k == p_key && i <= tok_max));
            any |= keep[j];
        }
        if (!any) continue;
        const rng::U32x4 bits = rng::block_bits(p.seed, p.position, uint32_t(g));
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            if (!keep[j]) continue;
            const int64_t i = 4 * g + j;
            const float u = rng::bits_to_uniform(bits.v[j]);
            float key;
            if (use_top_k) {
                const float e = u > 0.0f ? -logf(u) : INFINITY;
                key = expf(x[i] - m) / e;
            } else {
                const float e = u > 0.0f ? -samp::log_pos(u) : INFINITY;
                key = samp::exp_neg(x[i] - m) / e;
            }
            const uint64_t rk = samp::rank_key(samp::order_key(key), int32_t(i));
            best = rk > best ? rk : best;
        }
    }
    best = samp::block_reduce(best, samp::Max{}, red_as<uint64_t>(sh));
    return best ? samp::rank_token(best) : LC_NO_TOKEN;
}

__device__ void write_logprobs(const SampleArgs& a, int64_t r, const float* x, float m,
                               float raw_max, int32_t token, SharedState& sh) {
    const int64_t n = a.vocab;
    const bool raw = a.raw_mode != 0;
    auto d = [&](int64_t i) { return raw ? load_logit(a, r, i) : x[i]; };
    const float dm = raw ? raw_max : m;
    float lse = 0.0f;
    if (dm > -INFINITY) {
        float part = 0.0f;
        for (int64_t i = threadIdx.x; i < n; i += kThreads) part += samp::exp_neg(d(i) - dm);
        lse = logf(samp::block_reduce(part, samp::Sum{}, red_as<float>(sh)));
    }
    auto logprob = [&](int64_t i) { return dm > -INFINITY ? (d(i) - dm) - lse : -INFINITY; };

    if (a.logprobs && threadIdx.x == 0) a.logprobs[r] = token >= 0 ? logprob(token) : -INFINITY;
    const Span listed = row_span(a.listed_off, r);
    for (int32_t j = listed.begin + threadIdx.x; j < listed.end; j += kThreads)
        a.listed_logprobs[j] = logprob(a.listed_ids[j]);
    if (a.ranks) {
        int32_t greater = 0;
        if (token >= 0) {
            const float dt = d(token);
            for (int64_t i = threadIdx.x; i < n; i += kThreads) greater += d(i) > dt;
        }
        greater = samp::block_reduce(greater, samp::Sum{}, red_as<int32_t>(sh));
        if (threadIdx.x == 0) a.ranks[r] = token >= 0 ? 1 + greater : 0;
    }
    // Top-N by repeated arg-max below the previous pick (N <= 20).
    uint64_t prev = ~uint64_t(0);
    for (int32_t j = 0; j < a.num_top; ++j) {
        uint64_t best = 0;
        for (int64_t i = threadIdx.x; i < n; i += kThreads) {
            const float v = d(i);
            if (!(v >= -FLT_MAX)) continue;  // masked tokens are never listed
            const uint64_t rk = samp::rank_key(samp::order_key(v), int32_t(i));
            if (rk < prev && rk > best) best = rk;
        }
        best = samp::block_reduce(best, samp::Max{}, red_as<uint64_t>(sh));
        if (threadIdx.x == 0) {
            const int64_t at = r * a.num_top + j;
            const int32_t t = best ? samp::rank_token(best) : LC_NO_TOKEN;
            a.top_tokens[at] = t;
            a.top_logprobs[at] = best ? logprob(t) : -INFINITY;
        }
        prev = best;  // 0 when nothing is left: later picks stay empty too
    }
}

}  // namespace
}  // namespace lc::cuda
