// The sampler on CUDA: one thread block per row, the CPU sampler's pipeline
// (csrc/src/sampling/sampling_row.cpp) step for step:
//
//   load (sanitize) -> bias -> bans -> bitmask -> repetition -> frequency/presence
//   -> temperature -> [greedy argmax] or [min-p -> top-k -> top-p -> race]
//
// The race is the same exponential race over the same Philox uniforms
// (csrc/src/sampling/rng.h) keyed by (seed, position, token id); ties go to the lowest
// id. Top-k and top-p cut-offs come from weighted radix selection instead of
// sorting. Logprobs: RAW = log_softmax of the sanitized logits, PROCESSED =
// after bias, masks, penalties and temperature (greedy rows: temperature 1).
#include <cfloat>
#include <climits>
#include <cstring>
#include <vector>

#include "runtime/cuda_api.h"
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

__global__ void __launch_bounds__(kThreads) sample_kernel(const SampleArgs a) {
    __shared__ SharedState sh;
    const int64_t r = blockIdx.x;
    const int64_t n = a.vocab;
    const lc_sampling_row p = a.rows[r];
    float* x = a.x + r * n;

    float part = -INFINITY;
    for (int64_t i = threadIdx.x; i < n; i += kThreads) {
        const float v = load_logit(a, r, i);
        x[i] = v;
        part = fmaxf(part, v);
    }
    const float raw_max = samp::block_reduce(part, samp::Max{}, red_as<float>(sh));

    // Bias in list order by one thread (repeated ids add up as on the CPU).
    const Span bias = row_span(a.bias_off, r);
    if (threadIdx.x == 0)
        for (int32_t j = bias.begin; j < bias.end; ++j)
            x[a.bias_ids[j]] = __fadd_rn(x[a.bias_ids[j]], a.bias_vals[j]);
    __syncthreads();
    const Span banned = row_span(a.banned_off, r);
    for (int32_t j = banned.begin + threadIdx.x; j < banned.end; j += kThreads)
        x[a.banned_ids[j]] = -INFINITY;
    __syncthreads();
    if (p.use_bitmask) {
        const int32_t* words = a.bitmask + r * a.bitmask_words;
        for (int64_t i = threadIdx.x; i < n; i += kThreads)
            if (!((uint32_t(words[i / 32]) >> (i % 32)) & 1u)) x[i] = -INFINITY;
        __syncthreads();
    }
    apply_penalties(a, p, r, x);

    const bool greedy = !(p.temperature > 0.0f);
    const float temp = greedy ? 1.0f : p.temperature;
    part = -INFINITY;
    for (int64_t i = threadIdx.x; i < n; i += kThreads) {
        const float v = samp::sanitize(temp == 1.0f ? x[i] : x[i] / temp);
        x[i] = v;
        part = fmaxf(part, v);
    }
    const float m = samp::block_reduce(part, samp::Max{}, red_as<float>(sh));

    int32_t token = LC_NO_TOKEN;
    if (m > -INFINITY) {
        if (greedy) {
            int32_t first = INT_MAX;
            for (int64_t i = threadIdx.x; i < n; i += kThreads)
                if (x[i] == m) {
                    first = int32_t(i);
                    break;  // i only grows for this thread
                }
            token = samp::block_reduce(first, samp::Min{}, red_as<int32_t>(sh));
        } else {
            token = draw(a, p, x, m, sh);
        }
    }
    if (threadIdx.x == 0) a.tokens[r] = token;
    if (a.want_logprobs) write_logprobs(a, r, x, m, raw_max, token, sh);
}

// One host staging area, one device buffer: the batch's inputs, copied with
// one cudaMemcpyAsync; each section 16-byte aligned.
class Packer {
   public:
    template <class T>
    size_t add(const T* src, size_t count) {
        const size_t off = bytes_.size();
        bytes_.resize(off + ((count * sizeof(T) + 15) & ~size_t(15)), 0);
        if (count) std::memcpy(bytes_.data() + off, src, count * sizeof(T));
        return off;
    }
    size_t size() const { return bytes_.size(); }
    const unsigned char* data() const { return bytes_.data(); }

   private:
    std::vector<unsigned char> bytes_;
};

size_t align16(size_t n) { return (n + 15) & ~size_t(15); }

}  // namespace

void sample(const lc_tensor& logits, const lc_sampling_batch& b, void* stream,
            lc_sample_output& out) {
    const int64_t rows = b.num_rows;
    if (rows == 0) return;
    const int64_t vocab = logits.shape[1];
    const DeviceGuard guard(logits.device_id);
    const cudaStream_t s = as_stream(stream);

    // ---- inputs ----
    Packer in;
    const size_t off_rows = in.add(b.rows, size_t(rows));
    // CSR lists are rebased to start at 0: only ids[offsets[0] .. offsets[rows])
    // are known to be readable.
    std::vector<int32_t> rebased(size_t(rows) + 1);
    auto csr = [&](const int32_t* offsets, const int32_t* ids, size_t& off_o, size_t& off_i) {
        if (!offsets || offsets[rows] == offsets[0]) return false;  // empty for every row
        for (int64_t r = 0; r <= rows; ++r) rebased[size_t(r)] = offsets[r] - offsets[0];
        off_o = in.add(rebased.data(), rebased.size());
        off_i = in.add(ids + offsets[0], size_t(offsets[rows] - offsets[0]));
        return true;
    };
    size_t po = 0, pi = 0, oo = 0, oi = 0, bo = 0, bi = 0, bv = 0, no = 0, ni = 0, mw = 0;
    const bool has_prompt = csr(b.prompt_offsets, b.prompt_tokens, po, pi);
    const bool has_output = csr(b.output_offsets, b.output_tokens, oo, oi);
    const bool has_bias = csr(b.bias_offsets, b.bias_tokens, bo, bi);
    if (has_bias)
        bv = in.add(b.bias_values + b.bias_offsets[0],
                    size_t(b.bias_offsets[rows] - b.bias_offsets[0]));
    const bool has_banned = csr(b.banned_offsets, b.banned_tokens, no, ni);
    bool any_bitmask = false, any_penalty = false;
    for (int64_t r = 0; r < rows; ++r) {
        const lc_sampling_row& p = b.rows[r];
        any_bitmask |= p.use_bitmask != 0;
        any_penalty |= p.repetition_penalty != 1.0f || p.frequency_penalty != 0.0f ||
                       p.presence_penalty != 0.0f;
    }
    any_penalty &= has_prompt || has_output;
    if (any_bitmask) mw = in.add(b.allowed_bitmask, size_t(rows) * size_t(b.bitmask_words));

    // ---- device layout: | inputs | x | marks | outputs | ----
    const int32_t num_top = b.num_top_logprobs;
    const size_t off_x = in.size();
    const size_t off_marks = off_x + align16(size_t(rows) * vocab * sizeof(float));
    const size_t marks_bytes = any_penalty ? align16(size_t(rows) * vocab * sizeof(int32_t)) : 0;
    const size_t off_out = off_marks + marks_bytes;
    // outputs: tokens, logprobs, ranks [rows] each, then top tokens / logprobs [rows][num_top]
    const size_t out_bytes = size_t(rows) * (3 + 2 * size_t(num_top)) * 4;
    StreamBuffer buf(off_out + out_bytes, s);
    unsigned char* base = buf.as<unsigned char>();
    LC_CUDA_CHECK(cudaMemcpyAsync(base, in.data(), in.size(), cudaMemcpyHostToDevice, s));
    if (marks_bytes) LC_CUDA_CHECK(cudaMemsetAsync(base + off_marks, 0, marks_bytes, s));

    auto at = [&](size_t off) { return static_cast<void*>(base + off); };
    SampleArgs a{};
    a.logits = logits.data;
    a.dtype = logits.dtype;
    a.row_stride = logits.strides[0];
    a.vocab = vocab;
    a.rows = static_cast<const lc_sampling_row*>(at(off_rows));
    if (has_prompt) a.prompt_off = (int32_t*)at(po), a.prompt_ids = (int32_t*)at(pi);
    if (has_output) a.output_off = (int32_t*)at(oo), a.output_ids = (int32_t*)at(oi);
    if (has_bias)
        a.bias_off = (int32_t*)at(bo), a.bias_ids = (int32_t*)at(bi), a.bias_vals = (float*)at(bv);
    if (has_banned) a.banned_off = (int32_t*)at(no), a.banned_ids = (int32_t*)at(ni);
    if (any_bitmask) a.bitmask = (int32_t*)at(mw);
    a.bitmask_words = b.bitmask_words;
    a.num_top = num_top;
    a.raw_mode = b.logprobs_mode == LC_LOGPROBS_RAW;
    a.want_logprobs = out.logprobs || out.ranks || num_top > 0;
    a.x = (float*)at(off_x);
    a.marks = marks_bytes ? (int32_t*)at(off_marks) : nullptr;
    int32_t* d_tokens = (int32_t*)at(off_out);
    a.tokens = d_tokens;
    a.logprobs = out.logprobs ? (float*)(d_tokens + rows) : nullptr;
    a.ranks = out.ranks ? d_tokens + 2 * rows : nullptr;
    a.top_tokens = num_top ? d_tokens + 3 * rows : nullptr;
    a.top_logprobs = num_top ? (float*)(d_tokens + (3 + num_top) * rows) : nullptr;

    sample_kernel<<<unsigned(rows), kThreads, 0, s>>>(a);
    LC_CUDA_CHECK_LAUNCH("sample_kernel");

    std::vector<unsigned char> host(out_bytes);
    LC_CUDA_CHECK(cudaMemcpyAsync(host.data(), d_tokens, out_bytes, cudaMemcpyDeviceToHost, s));
    LC_CUDA_CHECK(cudaStreamSynchronize(s));
    const unsigned char* h = host.data();
    const size_t row4 = size_t(rows) * 4;
    std::memcpy(out.tokens, h, row4);
    if (out.logprobs) std::memcpy(out.logprobs, h + row4, row4);
    if (out.ranks) std::memcpy(out.ranks, h + 2 * row4, row4);
    if (num_top) {
        std::memcpy(out.top_tokens, h + 3 * row4, row4 * num_top);
        std::memcpy(out.top_logprobs, h + (3 + num_top) * row4, row4 * num_top);
    }
}

}  // namespace lc::cuda
