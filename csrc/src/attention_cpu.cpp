// CPU paged attention: cuts a call into work items, runs them on the worker
// pool with the best instruction set, and merges split-K partial results.
#include "attention_cpu.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <vector>

#include "internal.h"

namespace lc::attn {

namespace {

// A split item reads at least this many context positions; below it the
// merge costs more than the parallelism gains.
constexpr int32_t kMinSplit = 256;
// Calls cheaper than this many multiply-adds run on the calling thread:
// waking the pool costs more than it saves.
constexpr int64_t kSerialMacs = int64_t(1) << 18;

// LLMCORE_ISA=scalar|avx2 caps the choice (for comparisons and for ruling
// the SIMD paths out when debugging).
IsaSetting& isa_setting() {
    static IsaSetting setting("LLMCORE_ISA", Isa::kAvx512);
    return setting;
}

using RunItem = void (*)(const Job&, const WorkItem&, const WorkItem*);

RunItem kernel_for(Isa isa) {
    switch (isa) {
        case Isa::kAvx512:
            return run_item_avx512;
        case Isa::kAvx2:
            return run_item_avx2;
        default:
            return run_item_scalar;
    }
}

int64_t item_cost(const WorkItem& it) { return int64_t(it.rows()) * (it.ctx_end - it.ctx_begin); }

// Items whose context was split, and the output rows their partials merge into.
struct SplitGroup {
    int64_t first_item;
    int32_t num_items;
};

// Base items: sequence x KV heads x query-token block (x head chunk when a
// KV head serves more than kMaxRows query heads). A token block with few rows
// per KV head (decode) takes up to `kv_merge` KV heads, as rows allow.
std::vector<WorkItem> make_items(const lc_attn_plan& plan, int32_t num_kv_heads, int32_t group,
                                 int32_t window, int32_t kv_merge) {
    const int32_t hc = std::min(group, kMaxRows);
    const int32_t tok_block = std::max(1, kMaxRows / hc);
    std::vector<WorkItem> items;
    items.reserve(size_t(plan.num_seqs) * num_kv_heads);
    for (int32_t s = 0; s < plan.num_seqs; ++s) {
        const int32_t q_len = plan.query_start[s + 1] - plan.query_start[s];
        const int32_t seq_len = plan.seq_lens[s];
        for (int32_t tb = 0; tb < q_len; tb += tok_block) {
            WorkItem it;
            it.seq = s;
            it.tok_begin = tb;
            it.tok_count = std::min(tok_block, q_len - tb);
            const int32_t first = seq_len - q_len + tb;
            it.ctx_begin = window > 0 ? std::max(0, first - window + 1) : 0;
            it.ctx_end = first + it.tok_count;
            const int32_t per_head = it.tok_count * hc;
            const int32_t kc = hc == group ? std::max(1, std::min(kv_merge, kMaxRows / per_head)) : 1;
            for (int32_t kvh = 0; kvh < num_kv_heads; kvh += kc)
                for (int32_t hb = 0; hb < group; hb += hc) {
                    it.kv_head = kvh;
                    it.kv_count = std::min(kc, num_kv_heads - kvh);
                    it.head_begin = hb;
                    it.head_count = std::min(hc, group - hb);
                    items.push_back(it);
                }
        }
    }
    return items;
}

// Split the context of long items when there are too few items to keep
// every thread busy (e.g. one sequence decoding a long context).
std::vector<WorkItem> split_items(const std::vector<WorkItem>& base, int threads, int32_t head_size,
                                  std::vector<SplitGroup>& groups, int64_t& partial_floats) {
    const int64_t target = 8 * int64_t(threads);
    const int64_t want = (target + int64_t(base.size()) - 1) / int64_t(base.size());
    std::vector<WorkItem> items;
    items.reserve(base.size() * size_t(want));
    partial_floats = 0;
    for (const WorkItem& it : base) {
        const int32_t len = it.ctx_end - it.ctx_begin;
        const int64_t splits = std::min<int64_t>(want, len / kMinSplit);
        if (splits <= 1) {
            items.push_back(it);
            continue;
        }
        int32_t chunk = int32_t((len + splits - 1) / splits);
        chunk = (chunk + kTile - 1) / kTile * kTile;
        groups.push_back({int64_t(items.size()), 0});
        for (int32_t b = it.ctx_begin; b < it.ctx_end; b += chunk) {
            WorkItem part = it;
            part.ctx_begin = b;
            part.ctx_end = std::min(it.ctx_end, b + chunk);
            part.partial = partial_floats;
            partial_floats += int64_t(it.rows()) * partial_row_floats(head_size);
            items.push_back(part);
            ++groups.back().num_items;
        }
    }
    return items;
}

// out row = sum_i e^(m_i - M) acc_i / sum_i e^(m_i - M) l_i over the splits.
void merge_group(const Job& job, const WorkItem* items, const SplitGroup& g) {
    const WorkItem& first = items[g.first_item];
    const int32_t d = job.head_size;
    const int64_t row_floats = partial_row_floats(d);
    const int32_t rows = first.rows();
    const int32_t group = job.num_heads / job.num_kv_heads;
    const int32_t q0 = job.plan->query_start[first.seq];
    std::vector<float> acc(size_t(d), 0.0f);
    for (int32_t r = 0; r < rows; ++r) {
        float mx = -INFINITY;
        for (int32_t i = 0; i < g.num_items; ++i)
            mx = std::max(mx, job.partials[items[g.first_item + i].partial + r * row_floats]);
        float l = 0.0f;
        std::fill(acc.begin(), acc.end(), 0.0f);
        if (mx != -INFINITY) {
            for (int32_t i = 0; i < g.num_items; ++i) {
                const float* p = job.partials + items[g.first_item + i].partial + r * row_floats;
                if (p[0] == -INFINITY) continue;
                const float w = std::exp(p[0] - mx);
                l += w * p[1];
                for (int32_t k = 0; k < d; ++k) acc[size_t(k)] += w * p[2 + k];
            }
        }
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        const int32_t t = first.row_token(r);
        const int32_t h = first.row_head(r, group);
        const int64_t base =
            int64_t(q0 + first.tok_begin + t) * job.out_stride_t + int64_t(h) * job.out_stride_h;
        if (job.out_dtype == LC_DTYPE_BF16) {
            uint16_t* o = static_cast<uint16_t*>(job.out) + base;
            for (int32_t k = 0; k < d; ++k) o[k] = f32_to_bf16(acc[size_t(k)] * inv);
        } else {
            float* o = static_cast<float*>(job.out) + base;
            for (int32_t k = 0; k < d; ++k) o[k] = acc[size_t(k)] * inv;
        }
    }
}

}  // namespace

Isa best_isa() { return isa_setting().best(); }
Isa set_isa(Isa isa) { return isa_setting().set(isa); }
Isa current_isa() { return isa_setting().current(); }

void paged_attention_cpu(const lc_attn_plan& plan, const lc_tensor& q, const lc_tensor& k_cache,
                         const lc_tensor& v_cache, const lc_tensor& out,
                         const lc_attn_params& params) {
    if (plan.num_tokens == 0) return;
    Job job;
    job.plan = &plan;
    job.q = q.data;
    job.q_stride_t = q.strides[0];
    job.q_stride_h = q.strides[1];
    job.q_dtype = q.dtype;
    job.out = out.data;
    job.out_stride_t = out.strides[0];
    job.out_stride_h = out.strides[1];
    job.out_dtype = out.dtype;
    job.k_cache = k_cache.data;
    job.v_cache = v_cache.data;
    job.cache_dtype = k_cache.dtype;
    job.num_heads = int32_t(q.shape[1]);
    job.num_kv_heads = int32_t(k_cache.shape[1]);
    job.block_size = int32_t(k_cache.shape[2]);
    job.head_size = int32_t(k_cache.shape[3]);
    job.scale = params.scale;
    job.sliding_window = params.sliding_window;
    job.softcap = params.softcap;
    const RunItem run = kernel_for(current_isa());

    const int threads = num_threads();
    const int32_t group = job.num_heads / job.num_kv_heads;
    // Whole blocks (every KV head) per decode item when there are sequences
    // enough to keep the threads busy without splitting KV heads apart.
    const int32_t kv_merge =
        int64_t(plan.num_seqs) >= 4 * int64_t(threads) ? job.num_kv_heads : 1;
    std::vector<WorkItem> items =
        make_items(plan, job.num_kv_heads, group, params.sliding_window, kv_merge);
    int64_t macs = 0;
    for (const WorkItem& it : items) macs += item_cost(it);
    macs *= job.head_size;
    if (threads <= 1 || macs < kSerialMacs) {
        job.items = items.data();
        for (size_t i = 0; i < items.size(); ++i)
            run(job, items[i], i + 1 < items.size() ? &items[i + 1] : nullptr);
        return;
    }

    std::vector<SplitGroup> groups;
    std::vector<float> partials;
    if (int64_t(items.size()) < 4 * int64_t(threads)) {
        int64_t partial_floats = 0;
        items = split_items(items, threads, job.head_size, groups, partial_floats);
        partials.resize(size_t(partial_floats));
        job.partials = partials.data();
    }
    job.items = items.data();

    // Longest items first, handed out one at a time: mixed prefill and
    // decode items differ in cost by orders of magnitude.
    std::vector<int32_t> order(items.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
        return item_cost(items[size_t(a)]) > item_cost(items[size_t(b)]);
    });
    // Each worker claims its next item before running the current one, so
    // the kernel can prefetch that item's first tile.
    std::atomic<int64_t> next{0};
    const int64_t n = int64_t(order.size());
    parallel_for(threads, 1, [&](int64_t, int64_t) {
        int64_t cur = next.fetch_add(1, std::memory_order_relaxed);
        while (cur < n) {
            const int64_t nxt = next.fetch_add(1, std::memory_order_relaxed);
            run(job, items[size_t(order[size_t(cur)])],
                nxt < n ? &items[size_t(order[size_t(nxt)])] : nullptr);
            cur = nxt;
        }
    });
    if (!groups.empty()) {
        parallel_for(int64_t(groups.size()), 4, [&](int64_t b, int64_t e) {
            for (int64_t g = b; g < e; ++g) merge_group(job, items.data(), groups[size_t(g)]);
        });
    }
}

}  // namespace lc::attn
