/*
 * llmcore.h -- the public header of the llmcore inference core: include this
 * one; it includes one header per part (llmcore/runtime.h, kv.h, attention.h,
 * sampling.h, linear.h, elementwise.h).
 *
 * llmcore implements the compute of an LLM inference engine: the paged-KV
 * bookkeeping (block pool with prefix caching), the KV store, paged attention,
 * token sampling, and a decoder layer's linear layers on weights packed once at
 * load (bf16, fp32 or GGUF-quantized), the routed experts of MoE layers and the
 * elementwise operations (RMS norm, SiLU-gated product, RoPE). It is plain C
 * ABI: any host (C, C++, Rust, Go, Python) links libllmcore.so and calls these
 * functions; no Python is needed.
 *
 * Conventions
 *   - Every function that can fail returns lc_status: 0 on success, a
 *     negative LC_ERR_* code on failure. lc_last_error() then returns a
 *     human-readable message for the calling thread.
 *   - Handles are opaque; the function that creates one states who frees it.
 *   - Pointers passed in are BORROWED for the duration of the call unless
 *     the function says otherwise. Output buffers are allocated by the
 *     caller.
 *   - Tensors are described by lc_tensor (data pointer, dtype, device,
 *     shape and strides in elements). The core never allocates or frees
 *     tensor memory it was handed.
 *   - Index arrays (block tables, token lists, offsets) live in host memory,
 *     also for CUDA calls: the core uploads what a kernel needs.
 *   - CUDA calls take the stream explicitly (a cudaStream_t passed as void*;
 *     NULL means the legacy default stream). CPU calls ignore it.
 *
 * KV cache layout (one layer, K and V are separate tensors):
 *
 *     cache[num_blocks][num_kv_heads][block_size][head_size]
 *
 *   token t of a sequence lives in block block_table[t / block_size] at
 *   offset t % block_size; its "slot" is block_id * block_size + offset.
 *
 * Usage example (one decode step for two sequences, one layer):
 *
 *     lc_block_pool* pool;
 *     lc_block_pool_create(1024, 16, &pool);           // caller destroys
 *     int32_t blocks[2];
 *     lc_block_pool_allocate(pool, 2, blocks);          // one block each
 *
 *     int32_t query_start[3] = {0, 1, 2};               // one new token each
 *     int32_t seq_lens[2] = {5, 9};                     // context incl. new token
 *     int32_t block_table[2] = {blocks[0], blocks[1]};  // [2][1]
 *     int64_t slots[2] = {blocks[0] * 16 + 4, blocks[1] * 16 + 8};
 *     lc_attn_metadata md = {2, 2, query_start, seq_lens, block_table, 1, slots};
 *     lc_attn_plan* plan;
 *     lc_attn_plan_create(&md, LC_DEVICE_CPU, 0, NULL, &plan);  // caller destroys
 *
 *     lc_kv_store(plan, &k_new, &v_new, &k_cache, &v_cache, NULL);
 *     lc_attn_params p = {0.125f, 0, 0.0f};
 *     lc_paged_attention(plan, &q, &k_cache, &v_cache, &out, &p, NULL);
 *
 *     lc_sampling_row rows[2] = {...};
 *     lc_sampling_batch batch = {...};
 *     int32_t tokens[2]; float logprobs[2];
 *     lc_sample_output so = {tokens, logprobs, NULL, NULL, NULL};
 *     if (lc_sample(&logits, &batch, NULL, &so) != LC_OK)
 *         fprintf(stderr, "%s\n", lc_last_error());
 *
 *     lc_attn_plan_destroy(plan);
 *     lc_block_pool_free(pool, blocks, 2);
 *     lc_block_pool_destroy(pool);
 */
#ifndef LLMCORE_H
#define LLMCORE_H

#include "llmcore/runtime.h"     /* errors, build facts, threads, lc_tensor */
#include "llmcore/kv.h"          /* block pool with prefix caching */
#include "llmcore/attention.h"   /* attention plan, KV store, paged attention */
#include "llmcore/sampling.h"    /* token sampling */
#include "llmcore/linear.h"      /* linear layers, packed weights, MoE experts */
#include "llmcore/elementwise.h" /* RMS norm, SiLU-gated product, RoPE */

#endif /* LLMCORE_H */
