// One boundary check for the attention entry points (see attention_check.h).
#include "attention/attention_check.h"

#include <string>

#include "runtime/internal.h"

namespace lc::attn {

namespace {

using std::string;
using std::to_string;

const char* device_name(int32_t d) { return d == LC_DEVICE_CUDA ? "cuda" : "cpu"; }

string shape_str(const lc_tensor& t) {
    string s = "[";
    for (int i = 0; i < t.ndim; ++i) s += (i ? ", " : "") + to_string(t.shape[i]);
    return s + "]";
}

// lc::check_tensor's checks, with messages built only on failure.
void check_layout(const lc_tensor* t, const char* what, int32_t ndim) {
    LC_CHECK_ARG(t != nullptr, string(what) + " is NULL");
    LC_CHECK_ARG(t->ndim == ndim, string(what) + " must have " + to_string(ndim) + " dims, got " +
                                      to_string(t->ndim));
    LC_CHECK_ARG(dtype_size(t->dtype) != 0, string(what) + " has an unsupported dtype");
    bool empty = false;
    for (int i = 0; i < ndim; ++i) {
        LC_CHECK_ARG(t->shape[i] >= 0, string(what) + " has a negative dimension");
        empty = empty || t->shape[i] == 0;
    }
    // The element count must fit int64 (byte offsets are int64 products of these).
    int64_t elems = 1;
    for (int i = 0; i < ndim && !empty; ++i)
        LC_CHECK_ARG(!__builtin_mul_overflow(elems, t->shape[i], &elems),
                     string(what) + " " + shape_str(*t) + " has too many elements");
    LC_CHECK_ARG(t->data != nullptr || empty, string(what) + " has no data");
    LC_CHECK_ARG(t->strides[ndim - 1] == 1 || t->shape[ndim - 1] <= 1,
                 string(what) + " must have a unit stride in its last dimension");
}


// The longest sequence a call takes: the kernels' int32 position arithmetic
// (tile and chunk ends, seq_len + block_size - 1) stays far below INT32_MAX.
constexpr int32_t kMaxSeqLen = int32_t(1) << 30;

void check_device(const lc_attn_plan& plan, const lc_tensor& t, const char* what,
                  const lc_tensor& first) {
    LC_CHECK_ARG(t.device == plan.device, string(what) + " is on " + device_name(t.device) +
                                              " but the plan is on " + device_name(plan.device));
    LC_CHECK_ARG(t.device_id == first.device_id,
                 string(what) + " is on device " + to_string(t.device_id) +
                     " but the caches are on " + to_string(first.device_id));
}

void check_float_dtype(const lc_tensor& t, const char* what) {
    LC_CHECK_ARG(t.dtype == LC_DTYPE_F32 || t.dtype == LC_DTYPE_BF16,
                 string(what) + " must be float32 or bfloat16, got " + dtype_name(t.dtype));
}

CacheGeometry check_caches(const lc_attn_plan& plan, const lc_tensor* kc, const lc_tensor* vc) {
    check_layout(kc, "k_cache", 4);
    check_layout(vc, "v_cache", 4);
    check_device(plan, *kc, "k_cache", *kc);
    check_device(plan, *vc, "v_cache", *kc);
    for (int i = 0; i < 4; ++i)
        LC_CHECK_ARG(kc->shape[i] == vc->shape[i], "k_cache " + shape_str(*kc) + " and v_cache " +
                                                       shape_str(*vc) +
                                                       " must have the same shape");
    LC_CHECK_ARG(kc->dtype == vc->dtype, string("k_cache (") + dtype_name(kc->dtype) +
                                             ") and v_cache (" + dtype_name(vc->dtype) +
                                             ") must have the same dtype");
    check_float_dtype(*kc, "k_cache");
    // Every dimension is range-checked as int64, before it is narrowed to int32.
    LC_CHECK_ARG(kc->shape[0] <= INT32_MAX && kc->shape[1] <= INT32_MAX && kc->shape[2] <= 1024,
                 "cache shape " + shape_str(*kc) + " is too large");
    LC_CHECK_ARG(supported_head_size(kc->shape[3]),
                 "head_size " + to_string(kc->shape[3]) +
                     " is not supported (32, 64, 80, 96, 128 or 256)");
    LC_CHECK_ARG(is_contiguous(*kc) && is_contiguous(*vc),
                 "k_cache and v_cache must be contiguous");
    CacheGeometry g;
    g.num_blocks = int32_t(kc->shape[0]);
    g.num_kv_heads = int32_t(kc->shape[1]);
    g.block_size = int32_t(kc->shape[2]);
    g.head_size = int32_t(kc->shape[3]);
    g.dtype = kc->dtype;
    LC_CHECK_ARG(
        g.num_kv_heads > 0 && g.block_size > 0,
        "cache shape " + shape_str(*kc) +
            " must be [num_blocks, num_kv_heads, block_size, head_size] with no empty dim");
    LC_CHECK_ARG(plan.num_blocks == 0 || plan.num_blocks <= g.num_blocks,
                 "the plan was checked for " + to_string(plan.num_blocks) +
                     " blocks but the caches have " + to_string(g.num_blocks));
    return g;
}

// Every block a sequence reads (ceil(seq_len / block_size) entries of its
// row) must be a valid id. Memoized per cache geometry in the plan.
void check_block_tables(const lc_attn_plan& plan, const CacheGeometry& g) {
    const uint64_t key = (uint64_t(uint32_t(g.block_size)) << 32) | uint32_t(g.num_blocks);
    if (plan.checked_geometry.load(std::memory_order_acquire) == key) return;
    const int64_t capacity = int64_t(plan.max_blocks_per_seq) * g.block_size;
    LC_CHECK_ARG(plan.max_seq_len <= capacity,
                 "a sequence of " + to_string(plan.max_seq_len) + " tokens needs more than the " +
                     to_string(plan.max_blocks_per_seq) + " blocks of block_tables (block_size " +
                     to_string(g.block_size) + ")");
    for (int32_t s = 0; s < plan.num_seqs; ++s) {
        // int64: seq_len + block_size - 1 can pass INT32_MAX
        const int64_t used = (int64_t(plan.seq_lens[s]) + g.block_size - 1) / g.block_size;
        const int32_t* row = plan.block_tables.data() + size_t(s) * plan.max_blocks_per_seq;
        for (int64_t b = 0; b < used; ++b)
            LC_CHECK_ARG(row[b] >= 0 && row[b] < g.num_blocks,
                         "block id " + to_string(row[b]) + " in block_tables[" + to_string(s) +
                             "][" + to_string(b) + "] is out of range for a cache of " +
                             to_string(g.num_blocks) + " blocks");
    }
    plan.checked_geometry.store(key, std::memory_order_release);
}

// t: [num_tokens, heads, head_size] with a unit last stride.
void check_rows(const lc_attn_plan& plan, const lc_tensor* t, const char* what,
                const lc_tensor& cache, int32_t head_size) {
    LC_CHECK_ARG(t != nullptr, string(what) + " is NULL");
    LC_CHECK_ARG(t->ndim == 3, string(what) +
                                   " must have 3 dims [num_tokens, heads, head_size], got " +
                                   to_string(t->ndim));
    check_layout(t, what, 3);
    check_device(plan, *t, what, cache);
    check_float_dtype(*t, what);
    LC_CHECK_ARG(t->shape[0] == plan.num_tokens, string(what) + " has " + to_string(t->shape[0]) +
                                                     " rows but the plan has " +
                                                     to_string(plan.num_tokens) + " tokens");
    LC_CHECK_ARG(t->shape[2] == head_size, string(what) + " has head_size " +
                                               to_string(t->shape[2]) + " but the caches have " +
                                               to_string(head_size));
}

}  // namespace

bool supported_head_size(int64_t d) { return HeadSizes::has(d); }

CacheGeometry check_kv_store(const lc_attn_plan* plan, const lc_tensor* k, const lc_tensor* v,
                             const lc_tensor* k_cache, const lc_tensor* v_cache) {
    LC_CHECK_ARG(plan != nullptr, "plan is NULL");
    const CacheGeometry g = check_caches(*plan, k_cache, v_cache);
    check_rows(*plan, k, "k", *k_cache, g.head_size);
    check_rows(*plan, v, "v", *k_cache, g.head_size);
    LC_CHECK_ARG(k->shape[1] == g.num_kv_heads && v->shape[1] == g.num_kv_heads,
                 "k/v have " + to_string(k->shape[1]) + "/" + to_string(v->shape[1]) +
                     " heads but the caches have " + to_string(g.num_kv_heads));
    LC_CHECK_ARG(plan->has_slot_mapping || plan->num_tokens == 0,
                 "the plan was created without slot_mapping");
    const int64_t slots = int64_t(g.num_blocks) * g.block_size;
    LC_CHECK_ARG(plan->max_slot < slots, "slot " + to_string(plan->max_slot) +
                                             " is out of range for a cache of " + to_string(slots) +
                                             " slots");
    return g;
}

CacheGeometry check_paged_attention(const lc_attn_plan* plan, const lc_tensor* q,
                                    const lc_tensor* k_cache, const lc_tensor* v_cache,
                                    const lc_tensor* out, const lc_attn_params* params) {
    LC_CHECK_ARG(plan != nullptr, "plan is NULL");
    LC_CHECK_ARG(params != nullptr, "params is NULL");
    const CacheGeometry g = check_caches(*plan, k_cache, v_cache);
    check_rows(*plan, q, "q", *k_cache, g.head_size);
    check_rows(*plan, out, "out", *k_cache, g.head_size);
    const int64_t nh = q->shape[1];
    LC_CHECK_ARG(out->shape[1] == nh,
                 "out has " + to_string(out->shape[1]) + " heads but q has " + to_string(nh));
    LC_CHECK_ARG(nh > 0 && nh % g.num_kv_heads == 0,
                 "num_heads (" + to_string(nh) + ") must be a positive multiple of num_kv_heads (" +
                     to_string(g.num_kv_heads) + ")");
    LC_CHECK_ARG(params->scale - params->scale == 0.0f, "scale must be a finite number");
    LC_CHECK_ARG(params->sliding_window >= 0,
                 "sliding_window must be >= 0, got " + to_string(params->sliding_window));
    LC_CHECK_ARG(params->softcap >= 0.0f, "softcap must be >= 0");
    LC_CHECK_ARG(plan->max_seq_len <= kMaxSeqLen,
                 "a sequence of " + to_string(plan->max_seq_len) + " tokens is longer than " +
                     to_string(kMaxSeqLen) + " tokens");
    check_block_tables(*plan, g);
    return g;
}

}  // namespace lc::attn
