// The prefix-cache hashes of the block pool: XXH64 and the chain of block hashes,
// and their C ABI (lc_block_hash_root, lc_block_hash).
//
// Hashes: a block's hash is XXH64 over (parent hash, tokens) serialized
// little-endian, so it is the same on every host. A 64-bit hash can collide,
// so a hit is accepted only when the block's stored tokens and stored parent
// hash equal the query's; a collision then costs a miss, never wrong tokens.
// Colliding chains (two different prefixes with one hash) could still pair a
// right block with a wrong prefix. By chance the odds are 2^-64 per pair, but
// XXH64 is not collision-resistant: a client who can compute the chain can
// search for such a prefix. The root therefore must be secret: the Python host
// (actors/core/kv_manager.py) passes 64 random bits from os.urandom as
// extra_key, drawn per engine, so chain hashes are stable within a process and
// unpredictable outside it. A host of this ABI that chains under a fixed
// extra_key (0, the default root) gives that protection up.
#include <array>
#include <cstring>
#include <vector>

#include "kv/block_pool.h"

namespace lc {

// ---- XXH64 -------------------------------------------------------------------
namespace {

constexpr uint64_t kP1 = 0x9E3779B185EBCA87ULL;
constexpr uint64_t kP2 = 0xC2B2AE3D27D4EB4FULL;
constexpr uint64_t kP3 = 0x165667B19E3779F9ULL;
constexpr uint64_t kP4 = 0x85EBCA77C2B2AE63ULL;
constexpr uint64_t kP5 = 0x27D4EB2F165667C5ULL;

inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

inline uint64_t read64(const uint8_t* p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
    return v;
}

inline uint32_t read32(const uint8_t* p) {
    return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

inline void put64(uint8_t* p, uint64_t v) {
    for (int i = 0; i < 8; ++i) p[i] = uint8_t(v >> (8 * i));
}

inline void put32(uint8_t* p, uint32_t v) {
    for (int i = 0; i < 4; ++i) p[i] = uint8_t(v >> (8 * i));
}

inline uint64_t xround(uint64_t acc, uint64_t input) {
    acc += input * kP2;
    return rotl(acc, 31) * kP1;
}

inline uint64_t xmerge(uint64_t acc, uint64_t val) {
    acc ^= xround(0, val);
    return acc * kP1 + kP4;
}

}  // namespace

uint64_t xxh64(const void* data, size_t len, uint64_t seed) {
    const uint8_t* p = static_cast<const uint8_t*>(data);
    const uint8_t* end = p + len;
    uint64_t h;
    if (len >= 32) {
        uint64_t v1 = seed + kP1 + kP2, v2 = seed + kP2, v3 = seed, v4 = seed - kP1;
        const uint8_t* limit = end - 32;
        do {
            v1 = xround(v1, read64(p));
            v2 = xround(v2, read64(p + 8));
            v3 = xround(v3, read64(p + 16));
            v4 = xround(v4, read64(p + 24));
            p += 32;
        } while (p <= limit);
        h = rotl(v1, 1) + rotl(v2, 7) + rotl(v3, 12) + rotl(v4, 18);
        h = xmerge(h, v1);
        h = xmerge(h, v2);
        h = xmerge(h, v3);
        h = xmerge(h, v4);
    } else {
        h = seed + kP5;
    }
    h += uint64_t(len);
    for (; p + 8 <= end; p += 8) h = rotl(h ^ xround(0, read64(p)), 27) * kP1 + kP4;
    if (p + 4 <= end) {
        h = rotl(h ^ (uint64_t(read32(p)) * kP1), 23) * kP2 + kP3;
        p += 4;
    }
    for (; p < end; ++p) h = rotl(h ^ (uint64_t(*p) * kP5), 11) * kP1;
    h ^= h >> 33;
    h *= kP2;
    h ^= h >> 29;
    h *= kP3;
    h ^= h >> 32;
    return h;
}

// Hashes parent (8 bytes) followed by the tokens (4 bytes each), little-endian.
uint64_t hash_parent_tokens(uint64_t parent, const int32_t* tokens, int32_t n) {
    if (n < 0 || tokens == nullptr) n = 0;
    const size_t len = 8 + 4 * size_t(n);
    std::array<uint8_t, 8 + 4 * 1024> stack;
    std::vector<uint8_t> heap;
    uint8_t* buf = stack.data();
    if (len > stack.size()) {
        heap.resize(len);
        buf = heap.data();
    }
    put64(buf, parent);
    for (int32_t i = 0; i < n; ++i) put32(buf + 8 + 4 * size_t(i), uint32_t(tokens[i]));
    return xxh64(buf, len, 0);
}

}  // namespace lc

// ---- C ABI -------------------------------------------------------------------

extern "C" {

uint64_t lc_block_hash_root(uint64_t extra_key) {
    // A fixed seed keeps roots apart from block hashes of the same bytes.
    uint8_t buf[8];
    for (int i = 0; i < 8; ++i) buf[i] = uint8_t(extra_key >> (8 * i));
    return lc::xxh64(buf, sizeof buf, 0x6c6c6d636f726530ULL /* "llmcore0" */);
}

uint64_t lc_block_hash(uint64_t parent, const int32_t* tokens, int32_t n_tokens) {
    return lc::hash_parent_tokens(parent, tokens, n_tokens);
}

}  // extern "C"
