// The block pool behind lc_block_pool_*: a fixed set of KV blocks with ref
// counts, an LRU free list and a prefix-cache table of chained block hashes.
//
// Not thread-safe: a pool has one owner (the KV manager) that serializes its
// calls. Two threads may use two different pools.
//
// States of a block:
//
//   IN USE     ref >= 1, not on the free list; may carry a hash (cached)
//   FREE       ref == 0, on the free list; if cached, match_prefix can revive it
//
//   free list:  head (least recently freed, allocated/evicted first) <-> ... <-> tail
//
// Invariants (checked by check()):
//   - ref >= 0; a block is on the free list exactly once iff ref == 0
//   - num_free_ == length of the free list; num_free_cached_ == free blocks with a hash
//   - table_[h] == id  <=>  blocks_[id].cached && blocks_[id].hash == h
//   - a cached block's hash == block_hash(its parent, its stored tokens)
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "llmcore/llmcore.h"

namespace lc {

// XXH64 of len bytes (the reference algorithm, little-endian reads).
uint64_t xxh64(const void* data, size_t len, uint64_t seed);
// A block's chain hash: XXH64 of parent (8 bytes) then the n tokens (4 bytes
// each), little-endian (block_hash.cpp). n < 0 or no tokens hash as n = 0.
uint64_t hash_parent_tokens(uint64_t parent, const int32_t* tokens, int32_t n);

class BlockPool {
   public:
    BlockPool(int32_t num_blocks, int32_t block_size);

    int32_t num_blocks() const { return int32_t(blocks_.size()); }
    int32_t block_size() const { return block_size_; }
    int32_t num_free() const { return num_free_; }

    // Every mutating call validates all its arguments before changing
    // anything, so a failure (an lc::Error) leaves the pool as it was.
    void allocate(int32_t n, int32_t* out_ids);
    void fork(const int32_t* ids, int32_t n);
    void release(const int32_t* ids, int32_t n);
    uint64_t commit(int32_t id, uint64_t parent, const int32_t* tokens, int32_t n_tokens);
    int32_t match_prefix(uint64_t extra_key, const int32_t* tokens, int32_t n, int32_t* out_ids,
                         int32_t max_blocks);
    int32_t ref_count(int32_t id) const;
    void reset_cache();
    lc_block_pool_stats stats() const;
    void check() const;  // throws LC_ERR_INTERNAL naming the first broken invariant

   private:
    friend struct BlockPoolTestAccess;  // tests corrupt state and force collisions
    static constexpr int32_t kNil = -1;

    struct Block {
        int32_t ref = 0;
        int32_t prev = kNil;  // free-list links, kNil while in use
        int32_t next = kNil;
        bool cached = false;  // registered in table_ under `hash`
        uint64_t hash = 0;
        uint64_t parent = 0;  // parent hash, verified on every hit
    };

    uint64_t hash_of(uint64_t parent, const int32_t* tokens) const;
    const int32_t* tokens_of(int32_t id) const { return &tokens_[size_t(id) * block_size_]; }
    bool holds(int32_t id, uint64_t parent, const int32_t* tokens) const;
    void require_id(int32_t id, const char* what) const;
    // Checks that ids[0..n) each have at least `need(count)` references,
    // counting repeats; restores pending_ to all zero before returning or throwing.
    template <class Need>
    void validate_counts(const int32_t* ids, int32_t n, const char* what, Need need);
    void push_tail(int32_t id);
    void unlink(int32_t id);
    void uncache(int32_t id);

    int32_t block_size_;
    std::vector<Block> blocks_;
    std::vector<int32_t> tokens_;   // [num_blocks][block_size]; meaningful while cached
    std::vector<int32_t> pending_;  // validation scratch; all zero between calls
    std::unordered_map<uint64_t, int32_t> table_;
    int32_t head_ = kNil;
    int32_t tail_ = kNil;
    int32_t num_free_ = 0;
    int32_t num_free_cached_ = 0;
    int64_t queries_ = 0;
    int64_t hits_ = 0;
    int64_t evictions_ = 0;
    uint64_t hash_mask_ = ~uint64_t(0);  // narrowed only by tests, to force collisions
};

}  // namespace lc

// The C handle is the pool itself.
struct lc_block_pool : lc::BlockPool {
    using lc::BlockPool::BlockPool;
};
