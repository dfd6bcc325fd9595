/*
 * llmcore/attention.h -- attention metadata (one plan per step), the KV store
 * and paged attention.
 */
#ifndef LLMCORE_ATTENTION_H
#define LLMCORE_ATTENTION_H

#include "llmcore/runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ */
/* Attention metadata: converted once per step, shared by all layers   */
/* ------------------------------------------------------------------ */
/*
 * A step runs a flattened batch: the new tokens of all sequences stacked
 * into [num_tokens, ...]. Sequence s owns query rows
 * [query_start[s], query_start[s+1]); those rows are the LAST
 * (query_start[s+1] - query_start[s]) tokens of its seq_lens[s] tokens of
 * context, so a decode row has 1 query token and a prefill chunk whose
 * earlier tokens are cached has several. Attention is causal.
 *
 *   seq s:  |<------------- seq_lens[s] ------------->|
 *           | already in the KV cache  | new (queries) |
 */
typedef struct lc_attn_metadata {
    int32_t num_seqs;
    int32_t num_tokens;          /* == query_start[num_seqs] */
    const int32_t* query_start;  /* [num_seqs + 1], non-decreasing, starts at 0 */
    const int32_t* seq_lens;     /* [num_seqs], >= the sequence's query count */
    const int32_t* block_tables; /* [num_seqs][max_blocks_per_seq], row-major */
    int32_t max_blocks_per_seq;
    const int64_t* slot_mapping; /* [num_tokens]; slot < 0 = do not store */
} lc_attn_metadata;

typedef struct lc_attn_plan lc_attn_plan;

/* Validates and copies the metadata (host memory, borrowed for this call)
 * into a plan; for LC_DEVICE_CUDA it also uploads it on `stream`. num_blocks
 * bounds the block ids (0 = do not check). The caller frees *out with
 * lc_attn_plan_destroy. */
LC_API lc_status lc_attn_plan_create(const lc_attn_metadata* md, int32_t device,
                                     int32_t num_blocks, void* stream, lc_attn_plan** out);
LC_API void lc_attn_plan_destroy(lc_attn_plan* plan);

typedef struct lc_attn_params {
    float scale;            /* softmax scale, usually 1/sqrt(head_size) */
    int32_t sliding_window; /* > 0: a query sees only its last N positions; 0 = off */
    float softcap;          /* > 0: logits = softcap * tanh(logits / softcap); 0 = off */
} lc_attn_params;

/* Writes new K/V rows into the paged caches: row t of k/v
 * ([num_tokens, num_kv_heads, head_size], any strides with a unit last
 * stride) goes to slot_mapping[t]; negative slots are skipped. k/v are
 * converted to the cache dtype. */
LC_API lc_status lc_kv_store(const lc_attn_plan* plan, const lc_tensor* k, const lc_tensor* v,
                             const lc_tensor* k_cache, const lc_tensor* v_cache, void* stream);

/* out[t, h, :] = softmax(scale * q[t, h] . K^T) V over the context positions
 * that token t may see, with K/V read from the paged caches (KV head
 * h / (num_heads / num_kv_heads): grouped-query attention).
 * q, out: [num_tokens, num_heads, head_size] (unit last stride);
 * caches: [num_blocks, num_kv_heads, block_size, head_size], contiguous,
 * fp32 or bf16; q/out may be fp32 or bf16. head_size in {32, 64, 80, 96, 128, 256}.
 * Queries are expected to have been stored already (lc_kv_store). */
LC_API lc_status lc_paged_attention(const lc_attn_plan* plan, const lc_tensor* q,
                                    const lc_tensor* k_cache, const lc_tensor* v_cache,
                                    const lc_tensor* out, const lc_attn_params* params,
                                    void* stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* LLMCORE_ATTENTION_H */
