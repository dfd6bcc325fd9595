// The CPU paged-attention kernel: how a call is cut into work items and the
// per-instruction-set entry points that run them.
//
// A work item is one sequence x one or more KV heads x a block of its query
// tokens (x, for a long context with few items, one slice of the context:
// split-K). Its rows are (KV head, token, query head of the KV head's group)
// triples, so every K/V row loaded from the cache serves all query heads that
// share it, and a decode item can read whole blocks (all KV heads of a block
// are adjacent in the cache) instead of one head's rows of each.
//
//   rows of an item:  r = (k * tok_count + t) * head_count + h
//                     (k: KV head from kv_head, t: token, h: head in group)
//   context:          [ctx_begin, ctx_end) of the sequence's positions
#pragma once

#include "runtime/cpu_isa.h"

#include <cstdint>
#include <optional>
#include <type_traits>

#include "attention/attn_plan.h"
#include "attention/head_sizes.h"
#include "llmcore/llmcore.h"

namespace lc::attn {

constexpr int kMaxRows = 32;  // query rows per work item (bounds the scratch on the stack)
constexpr int kTile = 64;     // context positions per online-softmax step
// Context positions per chunk: a row's softmax state restarts at every
// multiple of kChunk and the chunks' states are folded in position order, so
// a split context (cut at chunk boundaries) gives the bits of an unsplit one.
constexpr int kChunk = 256;
static_assert(kChunk % kTile == 0, "a tile never straddles two chunks");

struct WorkItem {
    int32_t seq = 0;
    int32_t kv_head = 0;
    int32_t kv_count = 1;    // KV heads kv_head .. kv_head + kv_count - 1
    int32_t head_begin = 0;  // first query head of the group (within the group)
    int32_t head_count = 0;
    int32_t tok_begin = 0;  // first query token, counted within the sequence's queries
    int32_t tok_count = 0;
    int32_t ctx_begin = 0;
    int32_t ctx_end = 0;
    int64_t partial = -1;  // float offset of this item's first chunk's partials; -1 = write out

    int32_t rows() const { return kv_count * tok_count * head_count; }
    int32_t row_token(int32_t r) const { return r / head_count % tok_count; }
    // The query head of row r, given the number of query heads per KV head.
    int32_t row_head(int32_t r, int32_t group) const {
        return (kv_head + r / (head_count * tok_count)) * group + head_begin + r % head_count;
    }
};

// Partial results of a split row, one per chunk of its context:
// [m, l, acc[head_size]] (max logit, sum of exp, unnormalized output).
inline int64_t partial_row_floats(int32_t head_size) { return int64_t(head_size) + 2; }

struct Job {
    const lc_attn_plan* plan = nullptr;
    const WorkItem* items = nullptr;
    const void* q = nullptr;
    int64_t q_stride_t = 0, q_stride_h = 0;
    int32_t q_dtype = LC_DTYPE_F32;
    void* out = nullptr;
    int64_t out_stride_t = 0, out_stride_h = 0;
    int32_t out_dtype = LC_DTYPE_F32;
    const void* k_cache = nullptr;
    const void* v_cache = nullptr;
    int32_t cache_dtype = LC_DTYPE_F32;
    int32_t num_heads = 0, num_kv_heads = 0, head_size = 0, block_size = 0;
    float scale = 1.0f;
    int32_t sliding_window = 0;
    float softcap = 0.0f;
    float* partials = nullptr;
};

// Runs one work item; `next` (may be null) is the item the calling worker
// runs next, whose first K/V tile is prefetched while this item finishes.
// One definition per instruction set; each is compiled for its own target
// and chosen at run time.
void run_item_scalar(const Job& job, const WorkItem& item, const WorkItem* next);
void run_item_avx2(const Job& job, const WorkItem& item, const WorkItem* next);
void run_item_avx512(const Job& job, const WorkItem& item, const WorkItem* next);
// Writes the output rows of a split item from its parts' partials: `first` is
// its first part, and `chunks` chunk slots follow first.partial. Per
// instruction set, as run_item_*: the fold gives the bits the unsplit item's
// kernel would.
void merge_split_scalar(const Job& job, const WorkItem& first, int32_t chunks);
void merge_split_avx2(const Job& job, const WorkItem& first, int32_t chunks);
void merge_split_avx512(const Job& job, const WorkItem& first, int32_t chunks);

using Isa = lc::Isa;
using lc::isa_name;
// The best instruction set this CPU runs (and the build compiled).
Isa best_isa();
// Caps the instruction set used from now on (tests run every variant);
// returns the one in effect, which is min(requested, best_isa()).
Isa set_isa(Isa isa);
// The instruction set in effect.
Isa current_isa();

// Runs paged attention on the CPU; arguments are validated.
void paged_attention_cpu(const lc_attn_plan& plan, const lc_tensor& q, const lc_tensor& k_cache,
                         const lc_tensor& v_cache, const lc_tensor& out,
                         const lc_attn_params& params);

}  // namespace lc::attn
