// Block pool through the C ABI: allocation, fork/free, commit, prefix match,
// eviction, revival, reset, errors; plus forced hash collisions and corrupted
// state that check() must catch (through the internal header).
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "check.h"
#include "kv/block_pool.h"
#include "llmcore/llmcore.h"

namespace lc {
// Reaches into the pool's private state: only this test does.
struct BlockPoolTestAccess {
    static void set_hash_mask(BlockPool& p, uint64_t mask) { p.hash_mask_ = mask; }
    static void set_ref(BlockPool& p, int32_t id, int32_t ref) { p.blocks_[size_t(id)].ref = ref; }
    static void set_num_free(BlockPool& p, int32_t n) { p.num_free_ = n; }
    static void set_tail_next(BlockPool& p, int32_t next) {
        p.blocks_[size_t(p.tail_)].next = next;
    }
    static void drop_table_entry(BlockPool& p) { p.table_.erase(p.table_.begin()); }
    static void set_token(BlockPool& p, int32_t id, int32_t value) {
        p.tokens_[size_t(id) * p.block_size_] = value;
    }
};
}  // namespace lc

using Access = lc::BlockPoolTestAccess;

#define CHECK_OK(expr) CHECK((expr) == LC_OK)

static lc_block_pool_stats stats_of(const lc_block_pool* p) {
    lc_block_pool_stats s{};
    CHECK_OK(lc_block_pool_stats_get(p, &s));
    return s;
}

static void test_xxh64_vectors() {
    // Reference values of XXH64 with seed 0.
    CHECK(lc::xxh64("", 0, 0) == 0xEF46DB3751D8E999ULL);
    CHECK(lc::xxh64("a", 1, 0) == 0xD24EC4F1A98C6E5BULL);
    CHECK(lc::xxh64("abc", 3, 0) == 0x44BC2CF5AD770999ULL);
    const char* s = "Nobody inspects the spammish repetition";  // 39 bytes: the 32-byte stripe path
    CHECK(lc::xxh64(s, std::strlen(s), 0) == 0xFBCEA83C8A378BF1ULL);
}

static void test_hashes() {
    const int32_t a[4] = {1, 2, 3, 4}, b[4] = {1, 2, 3, 5};
    const uint64_t root = lc_block_hash_root(0);
    CHECK(root == lc_block_hash_root(0));
    CHECK(root != lc_block_hash_root(1));
    CHECK(lc_block_hash(root, a, 4) == lc_block_hash(root, a, 4));
    CHECK(lc_block_hash(root, a, 4) != lc_block_hash(root, b, 4));
    CHECK(lc_block_hash(root, a, 4) != lc_block_hash(root + 1, a, 4));
    CHECK(lc_block_hash(root, a, 4) != lc_block_hash(root, a, 3));
    CHECK(lc_block_hash(root, nullptr, 0) == lc_block_hash(root, a, 0));
    // Long inputs take the heap path; the result must not depend on it.
    std::vector<int32_t> big(5000, 7);
    CHECK(lc_block_hash(root, big.data(), 5000) == lc_block_hash(root, big.data(), 5000));
    CHECK(lc_block_hash(root, big.data(), 5000) != lc_block_hash(root, big.data(), 4999));
}

static void test_create_errors() {
    lc_block_pool* p = reinterpret_cast<lc_block_pool*>(1);
    CHECK(lc_block_pool_create(0, 16, &p) == LC_ERR_INVALID_ARGUMENT);
    CHECK(p == nullptr);
    CHECK(std::strstr(lc_last_error(), "num_blocks") != nullptr);
    CHECK(lc_block_pool_create(4, 0, &p) == LC_ERR_INVALID_ARGUMENT);
    CHECK(lc_block_pool_create(4, 1025, &p) == LC_ERR_INVALID_ARGUMENT);
    CHECK(lc_block_pool_create(4, 16, nullptr) == LC_ERR_INVALID_ARGUMENT);
    CHECK(lc_block_pool_num_free(nullptr) == LC_ERR_INVALID_ARGUMENT);
    CHECK(lc_block_pool_check(nullptr) == LC_ERR_INVALID_ARGUMENT);
    lc_block_pool_destroy(nullptr);     // no-op
    lc_block_pool_reset_cache(nullptr); // no-op
}

static void test_allocate_free_fork() {
    lc_block_pool* p = nullptr;
    CHECK_OK(lc_block_pool_create(4, 2, &p));
    CHECK(lc_block_pool_num_free(p) == 4);
    int32_t ids[4] = {-1, -1, -1, -1};
    CHECK_OK(lc_block_pool_allocate(p, 3, ids));
    CHECK(ids[0] == 0 && ids[1] == 1 && ids[2] == 2);  // head first: 0, 1, 2, 3 initially
    CHECK(lc_block_pool_num_free(p) == 1);
    CHECK(lc_block_pool_ref_count(p, 1) == 1);
    CHECK(lc_block_pool_ref_count(p, 3) == 0);

    // All or nothing: 2 > 1 free.
    int32_t more[2] = {-7, -7};
    CHECK(lc_block_pool_allocate(p, 2, more) == LC_ERR_OUT_OF_BLOCKS);
    CHECK(more[0] == -7 && lc_block_pool_num_free(p) == 1);
    CHECK(std::strstr(lc_last_error(), "requested") != nullptr);
    CHECK_OK(lc_block_pool_allocate(p, 0, nullptr));
    CHECK(lc_block_pool_allocate(p, -1, more) == LC_ERR_INVALID_ARGUMENT);
    CHECK(lc_block_pool_allocate(p, 1, nullptr) == LC_ERR_INVALID_ARGUMENT);

    // Fork: shared blocks need two frees.
    const int32_t shared[2] = {0, 1};
    CHECK_OK(lc_block_pool_fork(p, shared, 2));
    CHECK(lc_block_pool_ref_count(p, 0) == 2);
    const int32_t fork_bad[2] = {0, 3};  // 3 is free
    CHECK(lc_block_pool_fork(p, fork_bad, 2) == LC_ERR_INVALID_ARGUMENT);
    CHECK(lc_block_pool_ref_count(p, 0) == 2);  // nothing changed
    const int32_t fork_range[1] = {4};
    CHECK(lc_block_pool_fork(p, fork_range, 1) == LC_ERR_INVALID_ARGUMENT);

    // Free validation counts repeats: block 2 has one reference.
    const int32_t twice[3] = {0, 2, 2};
    CHECK(lc_block_pool_free(p, twice, 3) == LC_ERR_INVALID_ARGUMENT);
    CHECK(lc_block_pool_ref_count(p, 0) == 2 && lc_block_pool_ref_count(p, 2) == 1);
    const int32_t neg[1] = {-1};
    CHECK(lc_block_pool_free(p, neg, 1) == LC_ERR_INVALID_ARGUMENT);
    const int32_t free_free[1] = {3};
    CHECK(lc_block_pool_free(p, free_free, 1) == LC_ERR_INVALID_ARGUMENT);
    CHECK(std::strstr(lc_last_error(), "already free") != nullptr);
    CHECK_OK(lc_block_pool_check(p));

    // Free order decides eviction order: 2, 1, 0 join the tail after 3.
    const int32_t tail_first[5] = {2, 1, 1, 0, 0};
    CHECK_OK(lc_block_pool_free(p, tail_first, 5));
    CHECK(lc_block_pool_num_free(p) == 4);
    CHECK(lc_block_pool_ref_count(p, 0) == 0);
    int32_t all[4];
    CHECK_OK(lc_block_pool_allocate(p, 4, all));
    CHECK(all[0] == 3 && all[1] == 2 && all[2] == 1 && all[3] == 0);
    CHECK_OK(lc_block_pool_free(p, all, 4));
    CHECK_OK(lc_block_pool_check(p));
    lc_block_pool_destroy(p);
}

static void test_commit_match_evict_revive() {
    lc_block_pool* p = nullptr;
    CHECK_OK(lc_block_pool_create(4, 2, &p));
    const int32_t toks[6] = {10, 11, 12, 13, 14, 15};
    int32_t ids[3];
    CHECK_OK(lc_block_pool_allocate(p, 3, ids));  // 0, 1, 2
    const uint64_t root = lc_block_hash_root(0);
    uint64_t h0 = 0, h1 = 0;
    CHECK_OK(lc_block_pool_commit(p, ids[0], root, toks, 2, &h0));
    CHECK(h0 == lc_block_hash(root, toks, 2));
    CHECK_OK(lc_block_pool_commit(p, ids[1], h0, toks + 2, 2, &h1));
    CHECK_OK(lc_block_pool_commit(p, ids[1], h0, toks + 2, 2, nullptr));  // same content: no-op
    CHECK(lc_block_pool_commit(p, ids[1], h0, toks + 4, 2, nullptr) == LC_ERR_INVALID_ARGUMENT);
    CHECK(lc_block_pool_commit(p, ids[2], h1, toks + 4, 1, nullptr) == LC_ERR_INVALID_ARGUMENT);
    CHECK(lc_block_pool_commit(p, 3, h1, toks + 4, 2, nullptr) == LC_ERR_INVALID_ARGUMENT);  // free
    CHECK(lc_block_pool_commit(p, 9, h1, toks + 4, 2, nullptr) == LC_ERR_INVALID_ARGUMENT);
    CHECK(lc_block_pool_commit(p, ids[2], h1, nullptr, 2, nullptr) == LC_ERR_INVALID_ARGUMENT);
    lc_block_pool_stats s = stats_of(p);
    CHECK(s.num_cached == 2 && s.num_free_cached == 0 && s.num_used == 3 && s.num_free == 1);

    // A hit in use: refs go up. Only whole blocks match: 5 tokens -> 2 blocks.
    int32_t out[3] = {-1, -1, -1}, found = -1;
    CHECK_OK(lc_block_pool_match_prefix(p, 0, toks, 5, out, 3, &found));
    CHECK(found == 2 && out[0] == ids[0] && out[1] == ids[1]);
    CHECK(lc_block_pool_ref_count(p, ids[0]) == 2);
    s = stats_of(p);
    CHECK(s.queries == 5 && s.hits == 4);
    CHECK_OK(lc_block_pool_free(p, out, found));

    // max_blocks bounds the hit; another namespace misses; a different block misses.
    CHECK_OK(lc_block_pool_match_prefix(p, 0, toks, 6, out, 1, &found));
    CHECK(found == 1 && out[0] == ids[0]);
    CHECK_OK(lc_block_pool_free(p, out, 1));
    CHECK_OK(lc_block_pool_match_prefix(p, 1, toks, 6, out, 3, &found));
    CHECK(found == 0);
    const int32_t other[4] = {10, 11, 99, 13};
    CHECK_OK(lc_block_pool_match_prefix(p, 0, other, 4, out, 3, &found));
    CHECK(found == 1);
    CHECK_OK(lc_block_pool_free(p, out, 1));
    CHECK(lc_block_pool_match_prefix(p, 0, toks, -1, out, 3, &found) == LC_ERR_INVALID_ARGUMENT);
    CHECK(lc_block_pool_match_prefix(p, 0, toks, 4, out, -1, &found) == LC_ERR_INVALID_ARGUMENT);
    CHECK(lc_block_pool_match_prefix(p, 0, toks, 4, nullptr, 2, &found) == LC_ERR_INVALID_ARGUMENT);
    CHECK(lc_block_pool_match_prefix(p, 0, toks, 4, out, 2, nullptr) == LC_ERR_INVALID_ARGUMENT);
    CHECK_OK(lc_block_pool_match_prefix(p, 0, nullptr, 0, nullptr, 0, &found));

    // Free the sequence tail-first: cached blocks stay findable while free.
    const int32_t rev[3] = {ids[2], ids[1], ids[0]};
    CHECK_OK(lc_block_pool_free(p, rev, 3));
    s = stats_of(p);
    CHECK(s.num_free == 4 && s.num_cached == 2 && s.num_free_cached == 2);
    CHECK_OK(lc_block_pool_check(p));

    // Revive: the free cached blocks come off the free list.
    CHECK_OK(lc_block_pool_match_prefix(p, 0, toks, 6, out, 3, &found));
    CHECK(found == 2 && out[0] == ids[0] && out[1] == ids[1]);
    CHECK(lc_block_pool_ref_count(p, ids[0]) == 1 && lc_block_pool_num_free(p) == 2);
    s = stats_of(p);
    CHECK(s.num_free_cached == 0 && s.num_cached == 2);
    CHECK_OK(lc_block_pool_check(p));
    CHECK_OK(lc_block_pool_free(p, out, 2));  // order: ids[0] then ids[1]

    // Free list now: 3, 2, 0, 1. Allocating 3 evicts block 0 (cached).
    int32_t fresh[3];
    CHECK_OK(lc_block_pool_allocate(p, 3, fresh));
    CHECK(fresh[0] == 3 && fresh[1] == 2 && fresh[2] == ids[0]);
    s = stats_of(p);
    CHECK(s.evictions == 1 && s.num_cached == 1 && s.num_free_cached == 1);
    CHECK_OK(lc_block_pool_match_prefix(p, 0, toks, 6, out, 3, &found));
    CHECK(found == 0);  // the chain is broken at its first block
    CHECK_OK(lc_block_pool_check(p));

    // Reset drops every hash, used or free.
    CHECK_OK(lc_block_pool_commit(p, fresh[0], root, toks, 2, nullptr));
    lc_block_pool_reset_cache(p);
    s = stats_of(p);
    CHECK(s.num_cached == 0 && s.num_free_cached == 0 && s.num_used == 3 && s.evictions == 1);
    CHECK_OK(lc_block_pool_match_prefix(p, 0, toks, 6, out, 3, &found));
    CHECK(found == 0);
    CHECK_OK(lc_block_pool_free(p, fresh, 3));
    CHECK_OK(lc_block_pool_check(p));
    CHECK(lc_block_pool_num_free(p) == 4);
    lc_block_pool_destroy(p);
}

static void test_first_copy_wins() {
    lc_block_pool* p = nullptr;
    CHECK_OK(lc_block_pool_create(4, 2, &p));
    const int32_t toks[2] = {5, 6};
    const uint64_t root = lc_block_hash_root(0);
    int32_t ids[2];
    CHECK_OK(lc_block_pool_allocate(p, 2, ids));
    uint64_t h0 = 0, h1 = 0;
    CHECK_OK(lc_block_pool_commit(p, ids[0], root, toks, 2, &h0));
    CHECK_OK(lc_block_pool_commit(p, ids[1], root, toks, 2, &h1));
    CHECK(h0 == h1 && stats_of(p).num_cached == 1);
    int32_t out[1], found = 0;
    CHECK_OK(lc_block_pool_match_prefix(p, 0, toks, 2, out, 1, &found));
    CHECK(found == 1 && out[0] == ids[0]);
    // The duplicate is unregistered, so it may take other content later.
    const int32_t other[2] = {7, 8};
    CHECK_OK(lc_block_pool_commit(p, ids[1], root, other, 2, nullptr));
    CHECK(stats_of(p).num_cached == 2);
    CHECK_OK(lc_block_pool_check(p));
    lc_block_pool_destroy(p);
}

// With every hash narrowed to 2 bits, most entries collide; a hit must still
// return blocks whose stored tokens are the queried ones.
static void test_forced_collisions() {
    lc_block_pool* p = nullptr;
    CHECK_OK(lc_block_pool_create(64, 2, &p));
    Access::set_hash_mask(*p, 0x3);
    std::mt19937 rng(7);
    std::map<int32_t, std::vector<int32_t>> content;  // block -> tokens it was committed with
    std::vector<std::vector<int32_t>> held;
    int32_t hits = 0;
    for (int step = 0; step < 400; ++step) {
        std::vector<int32_t> toks(6);
        for (auto& t : toks) t = int32_t(rng() % 3);
        if (rng() % 2 && lc_block_pool_num_free(p) >= 3) {
            std::vector<int32_t> ids(3);
            CHECK_OK(lc_block_pool_allocate(p, 3, ids.data()));
            uint64_t parent = lc_block_hash_root(0);
            for (int b = 0; b < 3; ++b) {
                CHECK_OK(lc_block_pool_commit(p, ids[b], parent, &toks[2 * b], 2, &parent));
                content[ids[b]].assign(toks.begin() + 2 * b, toks.begin() + 2 * b + 2);
            }
            held.push_back(ids);
        } else {
            std::vector<int32_t> out(3);
            int32_t found = 0;
            CHECK_OK(lc_block_pool_match_prefix(p, 0, toks.data(), 6, out.data(), 3, &found));
            for (int32_t b = 0; b < found; ++b)
                CHECK(content[out[b]] == std::vector<int32_t>(toks.begin() + 2 * b,
                                                              toks.begin() + 2 * b + 2));
            hits += found;
            out.resize(size_t(found));
            held.push_back(out);
        }
        if (held.size() > 8) {
            std::vector<int32_t> seq = held.front();
            held.erase(held.begin());
            CHECK_OK(lc_block_pool_free(p, seq.data(), int32_t(seq.size())));
        }
        CHECK_OK(lc_block_pool_check(p));
    }
    CHECK(hits > 0);
    lc_block_pool_destroy(p);
}

static void test_check_catches_corruption() {
    auto fresh = [] {
        lc_block_pool* p = nullptr;
        CHECK_OK(lc_block_pool_create(4, 2, &p));
        int32_t ids[2];
        CHECK_OK(lc_block_pool_allocate(p, 2, ids));
        const int32_t toks[2] = {1, 2};
        CHECK_OK(lc_block_pool_commit(p, ids[0], lc_block_hash_root(0), toks, 2, nullptr));
        CHECK_OK(lc_block_pool_check(p));
        return p;
    };
    auto expect_broken = [](lc_block_pool* p, const char* words) {
        CHECK(lc_block_pool_check(p) == LC_ERR_INTERNAL);
        CHECK(std::strstr(lc_last_error(), words) != nullptr);
        lc_block_pool_destroy(p);
    };
    lc_block_pool* p = fresh();
    Access::set_ref(*p, 1, -1);
    expect_broken(p, "negative");
    p = fresh();
    Access::set_ref(*p, 3, 1);  // in use, still on the free list
    expect_broken(p, "free list");
    p = fresh();
    Access::set_num_free(*p, 3);
    expect_broken(p, "num_free");
    p = fresh();
    Access::set_tail_next(*p, 2);  // free list loops back to its head
    expect_broken(p, "twice");
    p = fresh();
    Access::drop_table_entry(*p);
    expect_broken(p, "hash table");
    p = fresh();
    Access::set_token(*p, 0, 99);
    expect_broken(p, "do not match");
}

static void test_random_against_model() {
    // Random operations against a plain model of ref counts.
    lc_block_pool* p = nullptr;
    CHECK_OK(lc_block_pool_create(32, 4, &p));
    std::mt19937 rng(123);
    std::vector<int32_t> ref(32, 0);
    std::vector<std::vector<int32_t>> held;
    for (int step = 0; step < 2000; ++step) {
        const int op = int(rng() % 3);
        if (op == 0) {
            const int32_t n = int32_t(rng() % 6);
            std::vector<int32_t> ids(size_t(n) + 1);
            const int32_t free_before = lc_block_pool_num_free(p);
            const lc_status s = lc_block_pool_allocate(p, n, ids.data());
            CHECK(s == (n > free_before ? LC_ERR_OUT_OF_BLOCKS : LC_OK));
            if (s == LC_OK) {
                ids.resize(size_t(n));
                for (int32_t id : ids) CHECK(ref[size_t(id)]++ == 0);
                held.push_back(ids);
            }
        } else if (op == 1 && !held.empty()) {
            const std::vector<int32_t> ids = held[rng() % held.size()];
            CHECK_OK(lc_block_pool_fork(p, ids.data(), int32_t(ids.size())));
            for (int32_t id : ids) ++ref[size_t(id)];
            held.push_back(ids);
        } else if (!held.empty()) {
            const size_t k = rng() % held.size();
            CHECK_OK(lc_block_pool_free(p, held[k].data(), int32_t(held[k].size())));
            for (int32_t id : held[k]) --ref[size_t(id)];
            held.erase(held.begin() + std::ptrdiff_t(k));
        }
        int32_t zeros = 0;
        for (int32_t id = 0; id < 32; ++id) {
            CHECK(lc_block_pool_ref_count(p, id) == ref[size_t(id)]);
            zeros += ref[size_t(id)] == 0;
        }
        CHECK(lc_block_pool_num_free(p) == zeros);
    }
    CHECK_OK(lc_block_pool_check(p));
    lc_block_pool_destroy(p);
}

// Not a test: prints the cost of the hot operations so regressions show.
static void report_timings() {
    using clock = std::chrono::steady_clock;
    const int32_t nb = 4096, bs = 16, seq_blocks = 64;
    lc_block_pool* p = nullptr;
    CHECK_OK(lc_block_pool_create(nb, bs, &p));
    std::vector<int32_t> toks(size_t(seq_blocks) * bs);
    for (size_t i = 0; i < toks.size(); ++i) toks[i] = int32_t(i * 7919 % 32000);
    std::vector<int32_t> ids(static_cast<size_t>(seq_blocks)), out(ids.size());
    const int reps = 2000;
    auto t0 = clock::now();
    for (int r = 0; r < reps; ++r) {
        CHECK_OK(lc_block_pool_allocate(p, seq_blocks, ids.data()));
        CHECK_OK(lc_block_pool_free(p, ids.data(), seq_blocks));
    }
    auto t1 = clock::now();
    CHECK_OK(lc_block_pool_allocate(p, seq_blocks, ids.data()));
    uint64_t parent = lc_block_hash_root(0);
    for (int32_t b = 0; b < seq_blocks; ++b)
        CHECK_OK(lc_block_pool_commit(p, ids[size_t(b)], parent, &toks[size_t(b) * bs], bs,
                                      &parent));
    auto t2 = clock::now();
    int32_t found = 0;
    for (int r = 0; r < reps; ++r) {
        CHECK_OK(lc_block_pool_match_prefix(p, 0, toks.data(), int32_t(toks.size()), out.data(),
                                            seq_blocks, &found));
        CHECK(found == seq_blocks);
        CHECK_OK(lc_block_pool_free(p, out.data(), found));
    }
    auto t3 = clock::now();
    auto ns = [](clock::duration d, double n) {
        return std::chrono::duration<double, std::nano>(d).count() / n;
    };
    std::printf("allocate+free: %.1f ns/block; match_prefix (block_size 16): %.1f ns/block\n",
                ns(t1 - t0, double(reps) * seq_blocks), ns(t3 - t2, double(reps) * seq_blocks));
    lc_block_pool_destroy(p);
}

int main() {
    test_xxh64_vectors();
    test_hashes();
    test_create_errors();
    test_allocate_free_fork();
    test_commit_match_evict_revive();
    test_first_copy_wins();
    test_forced_collisions();
    test_check_catches_corruption();
    test_random_against_model();
    report_timings();
    if (!lctest::failures) std::printf("test_block_pool: all checks passed\n");
    return lctest::finish();
}
