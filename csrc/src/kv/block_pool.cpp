// The paged-KV block pool and its prefix-cache hashes (see block_pool.h for
// the states and invariants). Not thread-safe: one owner serializes calls.
//
// A block's hash, and why a hit also compares tokens and parent: block_hash.cpp.
#include "kv/block_pool.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>

#include "runtime/internal.h"

namespace lc {

// ---- BlockPool ---------------------------------------------------------------

BlockPool::BlockPool(int32_t num_blocks, int32_t block_size) : block_size_(block_size) {
    require(num_blocks >= 1, "num_blocks must be >= 1, got " + std::to_string(num_blocks));
    require(block_size >= 1 && block_size <= 1024,
            "block_size must be in [1, 1024], got " + std::to_string(block_size));
    blocks_.resize(size_t(num_blocks));
    tokens_.resize(size_t(num_blocks) * size_t(block_size));
    pending_.assign(size_t(num_blocks), 0);
    table_.reserve(size_t(num_blocks));
    for (int32_t id = 0; id < num_blocks; ++id) push_tail(id);
}

uint64_t BlockPool::hash_of(uint64_t parent, const int32_t* tokens) const {
    return hash_parent_tokens(parent, tokens, block_size_) & hash_mask_;
}

bool BlockPool::holds(int32_t id, uint64_t parent, const int32_t* tokens) const {
    const Block& b = blocks_[size_t(id)];
    return b.parent == parent &&
           std::memcmp(tokens_of(id), tokens, sizeof(int32_t) * size_t(block_size_)) == 0;
}

void BlockPool::require_id(int32_t id, const char* what) const {
    if (id < 0 || id >= num_blocks())
        fail(LC_ERR_INVALID_ARGUMENT, std::string(what) + ": block id " + std::to_string(id) +
                                          " out of range [0, " + std::to_string(num_blocks()) +
                                          ")");
}

template <class Need>
void BlockPool::validate_counts(const int32_t* ids, int32_t n, const char* what, Need need) {
    require(n >= 0, std::string(what) + ": negative count " + std::to_string(n));
    require(n == 0 || ids != nullptr, std::string(what) + ": ids is NULL");
    int32_t i = 0;
    std::string error;
    for (; i < n; ++i) {
        const int32_t id = ids[i];
        if (id < 0 || id >= num_blocks()) {
            error = std::string(what) + ": block id " + std::to_string(id) + " out of range [0, " +
                    std::to_string(num_blocks()) + ")";
            break;
        }
        const int32_t count = ++pending_[size_t(id)];
        error = need(blocks_[size_t(id)].ref, count, id);
        if (!error.empty()) {
            ++i;  // pending_[id] was incremented: undo it below too
            break;
        }
    }
    for (int32_t j = 0; j < i; ++j) pending_[size_t(ids[j])] = 0;
    if (!error.empty()) fail(LC_ERR_INVALID_ARGUMENT, error);
}

void BlockPool::push_tail(int32_t id) {
    Block& b = blocks_[size_t(id)];
    b.prev = tail_;
    b.next = kNil;
    if (tail_ != kNil) blocks_[size_t(tail_)].next = id;
    else head_ = id;
    tail_ = id;
    ++num_free_;
    if (b.cached) ++num_free_cached_;
}

void BlockPool::unlink(int32_t id) {
    Block& b = blocks_[size_t(id)];
    if (b.prev != kNil) blocks_[size_t(b.prev)].next = b.next;
    else head_ = b.next;
    if (b.next != kNil) blocks_[size_t(b.next)].prev = b.prev;
    else tail_ = b.prev;
    b.prev = b.next = kNil;
    --num_free_;
    if (b.cached) --num_free_cached_;
}

void BlockPool::uncache(int32_t id) {
    Block& b = blocks_[size_t(id)];
    table_.erase(b.hash);
    b.cached = false;
}

void BlockPool::allocate(int32_t n, int32_t* out_ids) {
    require(n >= 0, "allocate: negative count " + std::to_string(n));
    require(n == 0 || out_ids != nullptr, "allocate: out_ids is NULL");
    if (n > num_free_)
        fail(LC_ERR_OUT_OF_BLOCKS, "allocate: " + std::to_string(n) + " blocks requested, " +
                                       std::to_string(num_free_) + " free of " +
                                       std::to_string(num_blocks()));
    for (int32_t i = 0; i < n; ++i) {
        const int32_t id = head_;
        unlink(id);
        if (blocks_[size_t(id)].cached) {
            uncache(id);
            ++evictions_;
        }
        blocks_[size_t(id)].ref = 1;
        out_ids[i] = id;
    }
}

void BlockPool::fork(const int32_t* ids, int32_t n) {
    validate_counts(ids, n, "fork", [](int32_t ref, int32_t count, int32_t id) -> std::string {
        if (ref < 1) return "fork: block " + std::to_string(id) + " is free";
        if (ref > std::numeric_limits<int32_t>::max() - count)
            return "fork: ref count of block " + std::to_string(id) + " would overflow";
        return {};
    });
    for (int32_t i = 0; i < n; ++i) ++blocks_[size_t(ids[i])].ref;
}

void BlockPool::release(const int32_t* ids, int32_t n) {
    validate_counts(ids, n, "free", [](int32_t ref, int32_t count, int32_t id) -> std::string {
        if (ref < 1) return "free: block " + std::to_string(id) + " is already free";
        if (count > ref)
            return "free: block " + std::to_string(id) + " freed " + std::to_string(count) +
                   " times but has " + std::to_string(ref) + " references";
        return {};
    });
    for (int32_t i = 0; i < n; ++i) {
        const int32_t id = ids[i];
        if (--blocks_[size_t(id)].ref == 0) push_tail(id);
    }
}

uint64_t BlockPool::commit(int32_t id, uint64_t parent, const int32_t* tokens, int32_t n_tokens) {
    require_id(id, "commit");
    require(blocks_[size_t(id)].ref >= 1,
            "commit: block " + std::to_string(id) + " is free; only in-use blocks are committed");
    require(n_tokens == block_size_, "commit: a block holds block_size = " +
                                         std::to_string(block_size_) + " tokens, got " +
                                         std::to_string(n_tokens));
    require(tokens != nullptr, "commit: tokens is NULL");
    const uint64_t h = hash_of(parent, tokens);
    Block& b = blocks_[size_t(id)];
    if (b.cached) {
        if (b.hash == h && holds(id, parent, tokens)) return h;
        fail(LC_ERR_INVALID_ARGUMENT,
             "commit: block " + std::to_string(id) + " is already committed with other tokens");
    }
    // An existing entry under h is either an identical copy (the first copy
    // wins) or a collision with other content; this block stays unregistered.
    if (!table_.emplace(h, id).second) return h;
    b.cached = true;
    b.hash = h;
    b.parent = parent;
    std::memcpy(&tokens_[size_t(id) * block_size_], tokens, sizeof(int32_t) * size_t(block_size_));
    return h;
}

int32_t BlockPool::match_prefix(uint64_t extra_key, const int32_t* tokens, int32_t n,
                                int32_t* out_ids, int32_t max_blocks) {
    require(n >= 0, "match_prefix: negative token count " + std::to_string(n));
    require(n == 0 || tokens != nullptr, "match_prefix: tokens is NULL");
    require(max_blocks >= 0, "match_prefix: negative max_blocks " + std::to_string(max_blocks));
    const int32_t limit = std::min(n / block_size_, max_blocks);
    require(limit == 0 || out_ids != nullptr, "match_prefix: out_ids is NULL");

    // Find the whole chain first, then take references: nothing can fail after.
    int32_t found = 0;
    uint64_t parent = lc_block_hash_root(extra_key);
    for (; found < limit; ++found) {
        const int32_t* block_tokens = tokens + size_t(found) * block_size_;
        const uint64_t h = hash_of(parent, block_tokens);
        auto it = table_.find(h);
        if (it == table_.end() || !holds(it->second, parent, block_tokens)) break;
        out_ids[found] = it->second;
        parent = h;
    }
    for (int32_t i = 0; i < found; ++i) {
        Block& b = blocks_[size_t(out_ids[i])];
        if (b.ref == 0) unlink(out_ids[i]);  // revive a free cached block
        ++b.ref;
    }
    queries_ += n;
    hits_ += int64_t(found) * block_size_;
    return found;
}

int32_t BlockPool::ref_count(int32_t id) const {
    require_id(id, "ref_count");
    return blocks_[size_t(id)].ref;
}

void BlockPool::reset_cache() {
    for (const auto& entry : table_) blocks_[size_t(entry.second)].cached = false;
    table_.clear();
    num_free_cached_ = 0;
}

lc_block_pool_stats BlockPool::stats() const {
    lc_block_pool_stats s{};
    s.num_blocks = num_blocks();
    s.block_size = block_size_;
    s.num_free = num_free_;
    s.num_used = num_blocks() - num_free_;
    s.num_cached = int32_t(table_.size());
    s.num_free_cached = num_free_cached_;
    s.queries = queries_;
    s.hits = hits_;
    s.evictions = evictions_;
    return s;
}

void BlockPool::check() const {
    auto broken = [](const std::string& what) { fail(LC_ERR_INTERNAL, "block pool: " + what); };
    const int32_t nb = num_blocks();
    int32_t zero_refs = 0, cached = 0, free_cached = 0;
    for (int32_t id = 0; id < nb; ++id) {
        const Block& b = blocks_[size_t(id)];
        if (b.ref < 0) broken("block " + std::to_string(id) + " has negative ref count");
        if (b.ref == 0) ++zero_refs;
        if (b.ref > 0 && (b.prev != kNil || b.next != kNil || head_ == id))
            broken("in-use block " + std::to_string(id) + " is linked into the free list");
        if (pending_[size_t(id)] != 0) broken("validation scratch not cleared");
        if (!b.cached) continue;
        ++cached;
        if (b.ref == 0) ++free_cached;
        auto it = table_.find(b.hash);
        if (it == table_.end() || it->second != id)
            broken("cached block " + std::to_string(id) + " is missing from the hash table");
        if (hash_of(b.parent, tokens_of(id)) != b.hash)
            broken("cached block " + std::to_string(id) +
                   " holds tokens that do not match its hash");
    }
    // Walk the free list: bounded by nb steps, so a cycle is caught too.
    std::vector<char> seen(size_t(nb), 0);
    int32_t walked = 0, prev = kNil;
    for (int32_t id = head_; id != kNil; id = blocks_[size_t(id)].next) {
        if (id < 0 || id >= nb) broken("free list holds out-of-range id " + std::to_string(id));
        if (seen[size_t(id)]) broken("block " + std::to_string(id) + " is on the free list twice");
        seen[size_t(id)] = 1;
        const Block& b = blocks_[size_t(id)];
        if (b.ref != 0) broken("block " + std::to_string(id) + " is on the free list but in use");
        if (b.prev != prev) broken("free list back link broken at block " + std::to_string(id));
        prev = id;
        ++walked;
    }
    if (prev != tail_) broken("free list tail does not match its last block");
    if (walked != zero_refs)
        broken("free list holds " + std::to_string(walked) + " blocks but " +
               std::to_string(zero_refs) + " have ref count 0");
    if (walked != num_free_)
        broken("num_free is " + std::to_string(num_free_) + " but the free list holds " +
               std::to_string(walked));
    if (cached != int32_t(table_.size()))
        broken("hash table has " + std::to_string(table_.size()) + " entries but " +
               std::to_string(cached) + " blocks are cached");
    if (free_cached != num_free_cached_)
        broken("num_free_cached is " + std::to_string(num_free_cached_) + " but " +
               std::to_string(free_cached) + " free blocks are cached");
    for (const auto& entry : table_) {
        const int32_t id = entry.second;
        if (id < 0 || id >= nb)
            broken("hash table points at out-of-range id " + std::to_string(id));
        const Block& b = blocks_[size_t(id)];
        if (!b.cached || b.hash != entry.first)
            broken("hash table entry points at block " + std::to_string(id) +
                   " which does not hold that hash");
    }
}

}  // namespace lc

// ---- C ABI -------------------------------------------------------------------
using lc::guard;
using lc::require;

extern "C" {

lc_status lc_block_pool_create(int32_t num_blocks, int32_t block_size, lc_block_pool** out) {
    return guard([&] {
        require(out != nullptr, "lc_block_pool_create: out is NULL");
        *out = nullptr;
        *out = new lc_block_pool(num_blocks, block_size);
    });
}

void lc_block_pool_destroy(lc_block_pool* pool) { delete pool; }

int32_t lc_block_pool_num_free(const lc_block_pool* pool) {
    if (!pool)
        return lc::set_error(LC_ERR_INVALID_ARGUMENT, "lc_block_pool_num_free: pool is NULL");
    return pool->num_free();
}

lc_status lc_block_pool_allocate(lc_block_pool* pool, int32_t n, int32_t* out_ids) {
    return guard([&] {
        require(pool != nullptr, "lc_block_pool_allocate: pool is NULL");
        pool->allocate(n, out_ids);
    });
}

lc_status lc_block_pool_fork(lc_block_pool* pool, const int32_t* ids, int32_t n) {
    return guard([&] {
        require(pool != nullptr, "lc_block_pool_fork: pool is NULL");
        pool->fork(ids, n);
    });
}

lc_status lc_block_pool_free(lc_block_pool* pool, const int32_t* ids, int32_t n) {
    return guard([&] {
        require(pool != nullptr, "lc_block_pool_free: pool is NULL");
        pool->release(ids, n);
    });
}

lc_status lc_block_pool_commit(lc_block_pool* pool, int32_t block_id, uint64_t parent,
                               const int32_t* tokens, int32_t n_tokens, uint64_t* out_hash) {
    return guard([&] {
        require(pool != nullptr, "lc_block_pool_commit: pool is NULL");
        const uint64_t h = pool->commit(block_id, parent, tokens, n_tokens);
        if (out_hash) *out_hash = h;
    });
}

lc_status lc_block_pool_match_prefix(lc_block_pool* pool, uint64_t extra_key, const int32_t* tokens,
                                     int32_t n, int32_t* out_ids, int32_t max_blocks,
                                     int32_t* out_num_blocks) {
    return guard([&] {
        require(out_num_blocks != nullptr, "lc_block_pool_match_prefix: out_num_blocks is NULL");
        *out_num_blocks = 0;
        require(pool != nullptr, "lc_block_pool_match_prefix: pool is NULL");
        *out_num_blocks = pool->match_prefix(extra_key, tokens, n, out_ids, max_blocks);
    });
}

int32_t lc_block_pool_ref_count(const lc_block_pool* pool, int32_t block_id) {
    int32_t ref = 0;
    const lc_status s = guard([&] {
        require(pool != nullptr, "lc_block_pool_ref_count: pool is NULL");
        ref = pool->ref_count(block_id);
    });
    return s == LC_OK ? ref : s;
}

void lc_block_pool_reset_cache(lc_block_pool* pool) {
    if (pool) pool->reset_cache();
}

lc_status lc_block_pool_stats_get(const lc_block_pool* pool, lc_block_pool_stats* out) {
    return guard([&] {
        require(pool != nullptr, "lc_block_pool_stats_get: pool is NULL");
        require(out != nullptr, "lc_block_pool_stats_get: out is NULL");
        *out = pool->stats();
    });
}

lc_status lc_block_pool_check(const lc_block_pool* pool) {
    return guard([&] {
        require(pool != nullptr, "lc_block_pool_check: pool is NULL");
        pool->check();
    });
}

}  // extern "C"
