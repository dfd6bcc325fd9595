// Paged attention on CUDA: one thread block per (query token, KV head,
// context partition), serving all query heads of that KV head's group (up to
// kGroupChunk at a time), so each K/V row is read once per group.
//
//   context of token t:   [lo ............................ pos]   (causal, optional window)
//   partitions:           | part 0 | part 1 | ... | part P-1 |      (P from the launcher)
//   inside a partition:   tiles of kTile keys, online softmax (running max / sum)
//
// With P == 1 a block writes the normalized output directly. With P > 1
// (small batches, long contexts: "flash decoding") each block writes its
// unnormalized partial output with its max and sum, and a second kernel
// merges the partitions. Accumulation is fp32 throughout; summation orders
// are fixed, so results are deterministic run to run.
#include <algorithm>
#include <cmath>

#include "attention/attn_plan.h"
#include "attention/head_sizes.h"
#include "cuda_util.cuh"
#include "runtime/cuda_api.h"

namespace lc::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kGroupChunk = 8;    // query heads served by one block
constexpr int kTile = 256;        // keys per softmax tile (scores live in shared memory)
constexpr int kLanesPerKey = 4;   // lanes sharing one K row in the score phase
constexpr int kKeysPerPass = kThreads / kLanesPerKey;
constexpr int kMinPartLen = 64;   // below this, splitting costs more than it gains

struct AttnArgs {
    const void* q;
    int64_t q_st, q_sh;
    int32_t q_dtype;
    void* out;
    int64_t o_st, o_sh;
    int32_t o_dtype;
    const void* k_cache;
    const void* v_cache;
    int64_t k_sb, k_sh, k_ss;  // cache strides: block, head, slot
    int64_t v_sb, v_sh, v_ss;
    const int32_t* query_start;
    const int32_t* seq_lens;
    const int32_t* block_tables;
    const int32_t* token_seq;
    int32_t max_blocks_per_seq, block_size;
    int32_t num_heads, group, head_chunks;
    float scale, softcap;
    int32_t window;
    int32_t part_len, num_parts;
    float* part_acc;  // [num_tokens][num_heads][num_parts][head_size]
    float* part_ml;   // [num_tokens][num_heads][num_parts][2]: max, sum
};

// The context positions query row t sees: [lo, lo + n), n >= 1; s is its sequence.
struct Visible {
    int s, lo, n;
};

__device__ __forceinline__ Visible visible(const AttnArgs& a, int t) {
    Visible v;
    v.s = a.token_seq[t];
    const int q0 = a.query_start[v.s], q1 = a.query_start[v.s + 1];
    const int pos = a.seq_lens[v.s] - (q1 - q0) + (t - q0);
    v.lo = a.window > 0 ? max(0, pos - a.window + 1) : 0;
    v.n = pos + 1 - v.lo;
    return v;
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// Block-wide reductions of kGroupChunk values at once; every thread gets the
// results. Ends with a barrier so `red` may be reused right away.
template <bool kMax>
__device__ __forceinline__ void block_allreduce(float (&v)[kGroupChunk],
                                                float (*red)[kGroupChunk]) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
    for (int g = 0; g < kGroupChunk; ++g) {
        v[g] = kMax ? warp_max(v[g]) : warp_sum(v[g]);
        if (lane == 0) red[warp][g] = v[g];
    }
    __syncthreads();
#pragma unroll
    for (int g = 0; g < kGroupChunk; ++g) {
        float r = red[0][g];
#pragma unroll
        for (int w = 1; w < kWarps; ++w) r = kMax ? fmaxf(r, red[w][g]) : r + red[w][g];
        v[g] = r;
    }
    __syncthreads();
}

template <int HEAD, class CacheT>
__global__ void __launch_bounds__(kThreads) paged_attention_kernel(const AttnArgs a) {
    using KVec = Vec4<CacheT>;   // score phase: 4 lanes x 4 elements = 16 elements per step
    using VVec = Vec16<CacheT>;  // value phase: 16-byte loads along the head dimension
    constexpr int kKChunks = HEAD / KVec::N / kLanesPerKey;  // chunks per lane per K row
    constexpr int kVN = VVec::N;
    constexpr int kVChunks = HEAD / kVN;             // threads covering one V row
    constexpr int kVSlices = kThreads / kVChunks;    // V rows processed side by side
    static_assert(HEAD % (KVec::N * kLanesPerKey) == 0, "head size must be a multiple of 16");
    static_assert(kVSlices >= 1, "head size too large for the block");

    __shared__ __align__(16) float q_s[kGroupChunk][HEAD];
    __shared__ __align__(16) float o_s[kGroupChunk][HEAD];
    __shared__ float p_s[kGroupChunk][kTile];  // scores, then probabilities
    __shared__ int32_t blk_s[kTile];           // physical block of each key of the tile
    __shared__ int32_t off_s[kTile];           // offset inside that block
    __shared__ float red_s[kWarps][kGroupChunk];

    const int tid = threadIdx.x;
    const int t = blockIdx.x;
    const int kvh = blockIdx.y / a.head_chunks;
    const int chunk = blockIdx.y % a.head_chunks;
    const int part = blockIdx.z;
    const int h0 = kvh * a.group + chunk * kGroupChunk;
    const int hc = min(kGroupChunk, a.group - chunk * kGroupChunk);  // heads served here

    const Visible vis = visible(a, t);
    const int pbeg = part * a.part_len;
    if (pbeg >= vis.n) return;  // block-uniform: this partition is empty for this token
    const int first = vis.lo + pbeg;
    const int last = vis.lo + min(vis.n, pbeg + a.part_len);  // exclusive

    for (int i = tid; i < kGroupChunk * HEAD; i += kThreads) {
        const int g = i / HEAD, d = i % HEAD;
        q_s[g][d] = g < hc ? load_any(a.q, a.q_dtype, t * a.q_st + int64_t(h0 + g) * a.q_sh + d)
                           : 0.0f;
        o_s[g][d] = 0.0f;
    }
    __syncthreads();

    const int32_t* table = a.block_tables + int64_t(vis.s) * a.max_blocks_per_seq;
    const CacheT* kc = static_cast<const CacheT*>(a.k_cache) + kvh * a.k_sh;
    const CacheT* vc = static_cast<const CacheT*>(a.v_cache) + kvh * a.v_sh;

    const int key_lane = tid % kLanesPerKey, key_idx = tid / kLanesPerKey;
    const int v_slice = tid / kVChunks, v_chunk = tid % kVChunks;
    const bool v_active = v_slice < kVSlices;

    float m[kGroupChunk], lsum[kGroupChunk], acc[kGroupChunk][kVN];
#pragma unroll
    for (int g = 0; g < kGroupChunk; ++g) {
        m[g] = -INFINITY;
        lsum[g] = 0.0f;
#pragma unroll
        for (int e = 0; e < kVN; ++e) acc[g][e] = 0.0f;
    }

    for (int tile = first; tile < last; tile += kTile) {
        const int cnt = min(kTile, last - tile);

        // Scores: 4 lanes per key, each over every 4th chunk of 4 elements.
        float tmax[kGroupChunk];
#pragma unroll
        for (int g = 0; g < kGroupChunk; ++g) tmax[g] = -INFINITY;
        for (int j0 = 0; j0 < cnt; j0 += kKeysPerPass) {
            const int j = j0 + key_idx;
            const bool valid = j < cnt;
            float dot[kGroupChunk];
#pragma unroll
            for (int g = 0; g < kGroupChunk; ++g) dot[g] = 0.0f;
            if (valid) {
                const int pos = tile + j;
                const int blk = table[pos / a.block_size];
                const int off = pos % a.block_size;
                if (key_lane == 0) blk_s[j] = blk, off_s[j] = off;
                const CacheT* kp = kc + blk * a.k_sb + off * a.k_ss;
#pragma unroll
                for (int c = 0; c < kKChunks; ++c) {
                    const int d = (c * kLanesPerKey + key_lane) * KVec::N;
                    float kf[KVec::N];
                    KVec::load(kp + d, kf);
#pragma unroll
                    for (int g = 0; g < kGroupChunk; ++g) {
                        if (g < hc) {
                            const float4 qv = *reinterpret_cast<const float4*>(&q_s[g][d]);
                            dot[g] += qv.x * kf[0] + qv.y * kf[1] + qv.z * kf[2] + qv.w * kf[3];
                        }
                    }
                }
            }
#pragma unroll
            for (int g = 0; g < kGroupChunk; ++g) {
                // All lanes take part (invalid ones add zeros): full-mask shuffles.
                float x = dot[g];
                x += __shfl_xor_sync(0xffffffffu, x, 1);
                x += __shfl_xor_sync(0xffffffffu, x, 2);
                x *= a.scale;
                if (a.softcap > 0.0f) x = a.softcap * tanhf(x / a.softcap);
                if (valid) {
                    if (key_lane == 0) p_s[g][j] = x;
                    tmax[g] = fmaxf(tmax[g], x);
                }
            }
        }
        block_allreduce<true>(tmax, red_s);  // its barrier also publishes p_s, blk_s, off_s

        // Online softmax: rescale what came before to the new running max.
#pragma unroll
        for (int g = 0; g < kGroupChunk; ++g) {
            const float m_new = fmaxf(m[g], tmax[g]);
            const float alpha = expf(m[g] - m_new);  // 0 on the first tile (m = -inf)
            m[g] = m_new;
            lsum[g] *= alpha;
#pragma unroll
            for (int e = 0; e < kVN; ++e) acc[g][e] *= alpha;
        }
        for (int j = tid; j < cnt; j += kThreads) {
#pragma unroll
            for (int g = 0; g < kGroupChunk; ++g) {
                const float p = expf(p_s[g][j] - m[g]);
                p_s[g][j] = p;
                lsum[g] += p;
            }
        }
        __syncthreads();

        // Values: kVChunks threads per V row, kVSlices rows side by side.
        if (v_active) {
            for (int j = v_slice; j < cnt; j += kVSlices) {
                const CacheT* vp = vc + blk_s[j] * a.v_sb + off_s[j] * a.v_ss + v_chunk * kVN;
                float vf[kVN];
                VVec::load(vp, vf);
#pragma unroll
                for (int g = 0; g < kGroupChunk; ++g) {
                    if (g < hc) {
                        const float p = p_s[g][j];
#pragma unroll
                        for (int e = 0; e < kVN; ++e) acc[g][e] += p * vf[e];
                    }
                }
            }
        }
        __syncthreads();  // p_s / blk_s are rewritten by the next tile
    }

    block_allreduce<false>(lsum, red_s);
    // Merge the V slices in a fixed order (deterministic).
    for (int r = 0; r < kVSlices; ++r) {
        if (v_active && v_slice == r) {
#pragma unroll
            for (int g = 0; g < kGroupChunk; ++g)
#pragma unroll
                for (int e = 0; e < kVN; ++e) o_s[g][v_chunk * kVN + e] += acc[g][e];
        }
        __syncthreads();
    }

#pragma unroll
    for (int g = 0; g < kGroupChunk; ++g) {
        if (g >= hc) break;
        const int h = h0 + g;
        if (a.num_parts == 1) {
            const float inv = 1.0f / lsum[g];
            for (int d = tid; d < HEAD; d += kThreads)
                store_any(a.out, a.o_dtype, t * a.o_st + int64_t(h) * a.o_sh + d, o_s[g][d] * inv);
        } else {
            const int64_t idx = (int64_t(t) * a.num_heads + h) * a.num_parts + part;
            for (int d = tid; d < HEAD; d += kThreads) a.part_acc[idx * HEAD + d] = o_s[g][d];
            if (tid == 0) {
                a.part_ml[idx * 2] = m[g];
                a.part_ml[idx * 2 + 1] = lsum[g];
            }
        }
    }
}

// Merges the partitions of one (token, head): out = sum_p w_p acc_p / sum_p w_p l_p
// with w_p = exp(m_p - max_p m_p). One thread per output element.
__global__ void merge_partitions_kernel(const AttnArgs a, int head_size) {
    const int t = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
    const Visible vis = visible(a, t);
    const int np = (vis.n + a.part_len - 1) / a.part_len;  // non-empty partitions
    const int64_t base = (int64_t(t) * a.num_heads + h) * a.num_parts;
    float mx = -INFINITY;
    for (int p = 0; p < np; ++p) mx = fmaxf(mx, a.part_ml[(base + p) * 2]);
    float l = 0.0f, o = 0.0f;
    for (int p = 0; p < np; ++p) {
        const float w = expf(a.part_ml[(base + p) * 2] - mx);
        l += w * a.part_ml[(base + p) * 2 + 1];
        o += w * a.part_acc[(base + p) * head_size + d];
    }
    store_any(a.out, a.o_dtype, t * a.o_st + int64_t(h) * a.o_sh + d, o / l);
}

template <int HEAD>
void launch_head(const AttnArgs& a, int32_t cache_dtype, dim3 grid, cudaStream_t s) {
    if (cache_dtype == LC_DTYPE_BF16)
        paged_attention_kernel<HEAD, __nv_bfloat16><<<grid, kThreads, 0, s>>>(a);
    else
        paged_attention_kernel<HEAD, float><<<grid, kThreads, 0, s>>>(a);
    LC_CUDA_CHECK_LAUNCH("paged_attention_kernel");
}

void check_cache_layout(const lc_tensor& c, const char* what) {
    // Vector loads need 16-byte aligned rows: the base pointer and every
    // stride (in bytes) must be multiples of 16. The stride of a size-1 dim
    // is never used (its index is always 0), whatever the host reports.
    const int64_t elems16 = int64_t(16 / dtype_size(c.dtype));
    bool ok = aligned16(c.data) && (c.strides[3] == 1 || c.shape[3] == 1);
    for (int i = 0; i < 3; ++i) ok = ok && (c.shape[i] == 1 || c.strides[i] % elems16 == 0);
    require(ok, std::string("paged_attention: ") + what +
                    " must be 16-byte aligned with 16-byte multiple strides on CUDA");
}

}  // namespace

void paged_attention(const lc_attn_plan& plan, const lc_tensor& q, const lc_tensor& k_cache,
                     const lc_tensor& v_cache, const lc_tensor& out, const lc_attn_params& params,
                     void* stream) {
    if (plan.num_tokens == 0) return;
    require(plan.d_token_seq != nullptr,
            "paged_attention: the plan was not uploaded to a CUDA device");
    require(k_cache.dtype == v_cache.dtype, "paged_attention: k_cache and v_cache dtypes differ");
    if (k_cache.dtype != LC_DTYPE_F32 && k_cache.dtype != LC_DTYPE_BF16)
        fail(LC_ERR_UNSUPPORTED, "paged_attention: CUDA caches must be float32 or bfloat16");
    const int head_size = int(q.shape[2]);
    const int num_heads = int(q.shape[1]);
    const int num_kv_heads = int(k_cache.shape[1]);
    require(num_kv_heads > 0 && num_heads % num_kv_heads == 0,
            "paged_attention: num_heads must be a multiple of num_kv_heads");
    require(k_cache.shape[3] == head_size && v_cache.shape[3] == head_size,
            "paged_attention: cache head size differs from q");
    check_cache_layout(k_cache, "k_cache");
    check_cache_layout(v_cache, "v_cache");
    const DeviceGuard guard(q.device_id);

    AttnArgs a{};
    a.q = q.data, a.q_st = q.strides[0], a.q_sh = q.strides[1], a.q_dtype = q.dtype;
    a.out = out.data, a.o_st = out.strides[0], a.o_sh = out.strides[1], a.o_dtype = out.dtype;
    a.k_cache = k_cache.data, a.v_cache = v_cache.data;
    a.k_sb = k_cache.strides[0], a.k_sh = k_cache.strides[1], a.k_ss = k_cache.strides[2];
    a.v_sb = v_cache.strides[0], a.v_sh = v_cache.strides[1], a.v_ss = v_cache.strides[2];
    a.query_start = plan.d_query_start;
    a.seq_lens = plan.d_seq_lens;
    a.block_tables = plan.d_block_tables;
    a.token_seq = plan.d_token_seq;
    a.max_blocks_per_seq = plan.max_blocks_per_seq;
    a.block_size = int32_t(k_cache.shape[2]);
    a.num_heads = num_heads;
    a.group = num_heads / num_kv_heads;
    a.head_chunks = int32_t(ceil_div(a.group, kGroupChunk));
    a.scale = params.scale;
    a.softcap = params.softcap;
    a.window = params.sliding_window > 0 ? params.sliding_window : 0;

    // Partitions: enough blocks to fill the device (~4 per SM), none shorter
    // than kMinPartLen keys. Large batches get one partition (no scratch).
    const int32_t visible_len =
        a.window > 0 ? std::min(plan.max_seq_len, a.window) : plan.max_seq_len;
    const int64_t max_visible = std::max<int64_t>(1, visible_len);
    const int64_t work = int64_t(plan.num_tokens) * num_kv_heads * a.head_chunks;
    const int64_t want = ceil_div(4 * int64_t(sm_count(q.device_id)), work);
    const int64_t max_parts = std::min<int64_t>(ceil_div(max_visible, kMinPartLen), 65535);
    int64_t parts = std::max<int64_t>(1, std::min(want, max_parts));
    int64_t part_len = ceil_div(ceil_div(max_visible, parts), 32) * 32;
    parts = ceil_div(max_visible, part_len);
    a.part_len = int32_t(part_len);
    a.num_parts = int32_t(parts);

    const cudaStream_t s = as_stream(stream);
    const size_t n_partial = parts > 1 ? size_t(plan.num_tokens) * num_heads * parts : 0;
    StreamBuffer scratch(n_partial * (head_size + 2) * sizeof(float), s);
    if (parts > 1) {
        a.part_acc = scratch.as<float>();
        a.part_ml = a.part_acc + n_partial * head_size;
    }

    const dim3 grid(unsigned(plan.num_tokens), unsigned(num_kv_heads * a.head_chunks),
                    unsigned(parts));
    const bool launched = attn::HeadSizes::visit(
        head_size, [&](auto d) { launch_head<decltype(d)::value>(a, k_cache.dtype, grid, s); });
    if (!launched) fail(LC_ERR_UNSUPPORTED, "paged_attention: unsupported head size");
    if (parts > 1) {
        const dim3 merge_grid(unsigned(plan.num_tokens), unsigned(num_heads));
        merge_partitions_kernel<<<merge_grid, head_size, 0, s>>>(a, head_size);
        LC_CUDA_CHECK_LAUNCH("merge_partitions_kernel");
    }
}

}  // namespace lc::cuda
