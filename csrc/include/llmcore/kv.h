/*
 * llmcore/kv.h -- the block pool: paged-KV bookkeeping with prefix caching
 * (the KV store writes rows into the caches: llmcore/attention.h).
 */
#ifndef LLMCORE_KV_H
#define LLMCORE_KV_H

#include "llmcore/runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ */
/* Block pool: paged-KV bookkeeping with prefix caching                */
/* ------------------------------------------------------------------ */
/*
 * A fixed pool of num_blocks blocks of block_size tokens. Every block is
 * either FREE (ref count 0, on the free list) or IN USE (ref count >= 1).
 * A FULL block may carry a hash that chains its parent's hash with its own
 * tokens; such a block stays findable by lc_block_pool_match_prefix while it
 * sits on the free list, until allocation evicts it (least recently freed
 * first). A hit is verified against the stored tokens, never trusted on the
 * hash alone.
 */

typedef struct lc_block_pool lc_block_pool;

typedef struct lc_block_pool_stats {
    int32_t num_blocks;
    int32_t block_size;
    int32_t num_free;        /* ref count 0 (includes free cached blocks) */
    int32_t num_used;        /* ref count >= 1 */
    int32_t num_cached;      /* blocks that carry a hash (free or used) */
    int32_t num_free_cached; /* free blocks that carry a hash (revivable) */
    int64_t queries;         /* tokens looked up by match_prefix, cumulative */
    int64_t hits;            /* tokens found by match_prefix, cumulative */
    int64_t evictions;       /* cached blocks whose hash was dropped for reuse */
} lc_block_pool_stats;

/* Creates a pool. num_blocks >= 1, block_size in [1, 1024].
 * *out receives a handle the caller frees with lc_block_pool_destroy. */
LC_API lc_status lc_block_pool_create(int32_t num_blocks, int32_t block_size,
                                      lc_block_pool** out);
/* Frees the pool (NULL is a no-op). Outstanding block ids become invalid. */
LC_API void lc_block_pool_destroy(lc_block_pool* pool);

/* Number of blocks an allocation of n could take right now (free blocks). */
LC_API int32_t lc_block_pool_num_free(const lc_block_pool* pool);

/* Allocates n blocks, all or nothing, each with ref count 1, written to
 * out_ids[0..n) (caller-allocated). Cached free blocks are evicted (hash
 * dropped) in least-recently-freed order. LC_ERR_OUT_OF_BLOCKS if fewer
 * than n blocks are free; nothing changes then. */
LC_API lc_status lc_block_pool_allocate(lc_block_pool* pool, int32_t n, int32_t* out_ids);

/* Adds one reference to each block (sharing, e.g. the prompt blocks of n > 1
 * forks). Every id must be in use. All or nothing. */
LC_API lc_status lc_block_pool_fork(lc_block_pool* pool, const int32_t* ids, int32_t n);

/* Drops one reference from each block. A block reaching 0 goes to the tail
 * of the free list (evicted last). Pass a sequence's blocks tail-first so its
 * last blocks are evicted before its shared prefix. All-or-nothing check:
 * every id must be in use (counting repeats). */
LC_API lc_status lc_block_pool_free(lc_block_pool* pool, const int32_t* ids, int32_t n);

/* Root of a hash chain. extra_key separates caches that must not share
 * blocks with the same tokens (a LoRA adapter, a cache salt); 0 is the
 * default namespace. */
LC_API uint64_t lc_block_hash_root(uint64_t extra_key);

/* Hash of one full block of tokens (block_size of them) chained on parent. */
LC_API uint64_t lc_block_hash(uint64_t parent, const int32_t* tokens, int32_t n_tokens);

/* Registers an in-use, full block under hash = lc_block_hash(parent, tokens),
 * storing its tokens for verification; writes the hash to *out_hash (may be
 * NULL). n_tokens must equal block_size. If another block already holds an
 * identical entry, this block stays unregistered (the first copy wins) and
 * LC_OK is returned. Registering a block twice with the same content is a
 * no-op; with other content it is LC_ERR_INVALID_ARGUMENT. */
LC_API lc_status lc_block_pool_commit(lc_block_pool* pool, int32_t block_id, uint64_t parent,
                                      const int32_t* tokens, int32_t n_tokens,
                                      uint64_t* out_hash);

/* Finds the longest chain of cached full blocks that holds tokens[0..n),
 * starting at lc_block_hash_root(extra_key). Only whole blocks match, and at
 * most max_blocks. Each hit gains one reference (a free hit is revived off the
 * free list), and its id is written to out_ids. *out_num_blocks receives the
 * hit count (hit tokens = count * block_size). Counts toward queries/hits.
 * To leave at least one token to compute, pass n = num_tokens - 1. */
LC_API lc_status lc_block_pool_match_prefix(lc_block_pool* pool, uint64_t extra_key,
                                            const int32_t* tokens, int32_t n,
                                            int32_t* out_ids, int32_t max_blocks,
                                            int32_t* out_num_blocks);

/* Ref count of a block (0 when free); negative status for a bad id. */
LC_API int32_t lc_block_pool_ref_count(const lc_block_pool* pool, int32_t block_id);

/* Drops every cached hash (a prefix-cache reset). Blocks in use stay in use. */
LC_API void lc_block_pool_reset_cache(lc_block_pool* pool);

LC_API lc_status lc_block_pool_stats_get(const lc_block_pool* pool, lc_block_pool_stats* out);

/* Verifies every internal invariant (ref counts, free list, hash table);
 * LC_ERR_INTERNAL with a message naming the first broken one. O(num_blocks). */
LC_API lc_status lc_block_pool_check(const lc_block_pool* pool);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* LLMCORE_KV_H */
