// CPU paged attention: cuts a call into work items, runs them on the worker
// pool with the best instruction set, and merges split-K partial results.
//
// How a call is cut (items per sequence, KV heads merged into one item or not,
// long contexts split or not: by the call's size and the thread count) never
// changes a row's bits: the kernel computes a row the same way in any item
// (attention_kernel.h), and a split context is merged as the kernel folds an
// unsplit one. A query row's output is thus the same alone, in any batch, in a
// prefill chunk or as a decode row (for one instruction set; the variants
// differ from each other).
#include "attention/attention_cpu.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <vector>

#include "runtime/internal.h"

namespace lc::attn {

namespace {

// A context is split only when it has at least this many positions per part;
// below it the merge costs more than the parallelism gains.
constexpr int32_t kMinSplit = kChunk;
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
using MergeSplit = void (*)(const Job&, const WorkItem&, int32_t);

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

MergeSplit merge_for(Isa isa) {
    switch (isa) {
        case Isa::kAvx512:
            return merge_split_avx512;
        case Isa::kAvx2:
            return merge_split_avx2;
        default:
            return merge_split_scalar;
    }
}

int64_t item_cost(const WorkItem& it) { return int64_t(it.rows()) * (it.ctx_end - it.ctx_begin); }

// An item whose context was split: its first part and its chunk slots (the
// parts' partials follow the first part's, in position order).
struct SplitGroup {
    int64_t first_item;
    int32_t chunks;
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
// every thread busy (e.g. one sequence decoding a long context). Parts are cut
// at multiples of kChunk and store one partial per chunk they touch, so the
// merge folds the chunks exactly as the unsplit kernel would: whether and
// where a context is split changes no bits.
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
        const int32_t c0 = it.ctx_begin / kChunk, c1 = (it.ctx_end - 1) / kChunk + 1;
        const int32_t per = int32_t((c1 - c0 + splits - 1) / std::max<int64_t>(splits, 1));
        if (splits <= 1 || per >= c1 - c0) {
            items.push_back(it);
            continue;
        }
        groups.push_back({int64_t(items.size()), c1 - c0});
        for (int32_t c = c0; c < c1; c += per) {
            WorkItem part = it;
            part.ctx_begin = std::max(it.ctx_begin, c * kChunk);
            part.ctx_end = std::min(it.ctx_end, (c + per) * kChunk);
            part.partial = partial_floats;
            partial_floats +=
                int64_t(std::min(per, c1 - c)) * it.rows() * partial_row_floats(head_size);
            items.push_back(part);
        }
    }
    return items;
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
    const Isa isa = current_isa();
    const RunItem run = kernel_for(isa);

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
        const MergeSplit merge = merge_for(isa);
        parallel_for(int64_t(groups.size()), 4, [&](int64_t b, int64_t e) {
            for (int64_t g = b; g < e; ++g)
                merge(job, items[size_t(groups[size_t(g)].first_item)], groups[size_t(g)].chunks);
        });
    }
}

}  // namespace lc::attn
