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
// after bias, masks, penalties and temperature (greedy rows: temperature 1); listed
// ids (logprob_offsets) read the same distribution.
#include <cfloat>
#include <climits>
#include <cstring>
#include <vector>

#include "cuda_util.cuh"
#include "runtime/cuda_api.h"
#include "sampling_row.cuh"

namespace lc::cuda {

namespace {

// One thread block per row (samp::kThreads threads).
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
    size_t lo = 0, li = 0;
    const bool has_listed = csr(b.logprob_offsets, b.logprob_ids, lo, li);
    const size_t num_listed =
        has_listed ? size_t(b.logprob_offsets[rows] - b.logprob_offsets[0]) : 0;
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
    // outputs: tokens, logprobs, ranks [rows] each, then top tokens / logprobs [rows][num_top],
    // then the listed logprobs
    const size_t top_end = size_t(rows) * (3 + 2 * size_t(num_top));
    const size_t out_bytes = (top_end + num_listed) * 4;
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
    a.want_logprobs = out.logprobs || out.ranks || num_top > 0 || has_listed;
    a.x = (float*)at(off_x);
    a.marks = marks_bytes ? (int32_t*)at(off_marks) : nullptr;
    int32_t* d_tokens = (int32_t*)at(off_out);
    a.tokens = d_tokens;
    a.logprobs = out.logprobs ? (float*)(d_tokens + rows) : nullptr;
    a.ranks = out.ranks ? d_tokens + 2 * rows : nullptr;
    a.top_tokens = num_top ? d_tokens + 3 * rows : nullptr;
    a.top_logprobs = num_top ? (float*)(d_tokens + (3 + num_top) * rows) : nullptr;
    if (has_listed) {
        a.listed_off = (int32_t*)at(lo), a.listed_ids = (int32_t*)at(li);
        a.listed_logprobs = (float*)(d_tokens + top_end);
    }

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
    if (num_listed) std::memcpy(out.listed_logprobs, h + top_end * 4, num_listed * 4);
}

}  // namespace lc::cuda
