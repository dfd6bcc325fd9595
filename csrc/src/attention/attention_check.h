// Validation of kv_store / paged_attention arguments: shapes, dtypes, devices,
// block ids and slots are checked here, in one place, before any kernel (CPU
// or CUDA) runs. Kernels may then index without bounds checks.
#pragma once

#include <cstdint>

#include "attention/attn_plan.h"
#include "attention/head_sizes.h"
#include "llmcore/llmcore.h"

// Like lc::require, but builds the message only when the check fails: these
// checks run on every call, and formatting costs more than the kernel of a
// small decode step.
#define LC_CHECK_ARG(cond, msg)                                  \
    do {                                                         \
        if (!(cond)) ::lc::fail(LC_ERR_INVALID_ARGUMENT, (msg)); \
    } while (0)

namespace lc::attn {

// Whether d is one of the head sizes the kernels are compiled for (head_sizes.h).
bool supported_head_size(int64_t d);

// The geometry read off a validated pair of caches
// [num_blocks, num_kv_heads, block_size, head_size].
struct CacheGeometry {
    int32_t num_blocks = 0;
    int32_t num_kv_heads = 0;
    int32_t block_size = 0;
    int32_t head_size = 0;
    int32_t dtype = LC_DTYPE_F32;
};

// k/v: [num_tokens, num_kv_heads, head_size]; every plan slot >= 0 fits the caches.
CacheGeometry check_kv_store(const lc_attn_plan* plan, const lc_tensor* k, const lc_tensor* v,
                             const lc_tensor* k_cache, const lc_tensor* v_cache);

// q/out: [num_tokens, num_heads, head_size]; the block ids the plan's sequences
// read are in range. Returns the geometry; num_heads is q->shape[1].
CacheGeometry check_paged_attention(const lc_attn_plan* plan, const lc_tensor* q,
                                    const lc_tensor* k_cache, const lc_tensor* v_cache,
                                    const lc_tensor* out, const lc_attn_params* params);

}  // namespace lc::attn
