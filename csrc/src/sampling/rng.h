// The counter-based generator behind every sampling draw: Philox4x32-10
// (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11).
//
// This header is shared by the CPU sampler and the CUDA sampler; both must
// produce bit-identical uniforms, so it uses only 32/64-bit integer
// arithmetic and one exact float multiply.
//
// Mapping of (seed, position, index) to a uniform:
//
//   key     k0 = low 32 bits of seed        k1 = high 32 bits of seed
//   counter c0 = index >> 2                 c1 = low 32 bits of position
//           c2 = high 32 bits of position   c3 = 0 (reserved stream id)
//   out[0..4) = philox4x32_10(counter, key)
//   bits      = out[index & 3]              (one Philox call serves 4 indices)
//   uniform   = float(bits >> 8) * 2^-24    (exact; in [0, 1), step 2^-24)
//
// A draw for a row uses index = token id, so token t's uniform depends only
// on (seed, position, t): never on batch composition or thread count.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define LC_RNG_FN __host__ __device__ inline
#else
#define LC_RNG_FN inline
#endif

namespace lc::rng {

struct U32x4 {
    uint32_t v[4];
};

constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;  // golden ratio
constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;  // sqrt(3) - 1

// The raw block function: 10 rounds, key bumped between rounds (Random123's
// philox4x32_R(10, ctr, key)).
LC_RNG_FN U32x4 philox4x32_10(U32x4 c, uint32_t k0, uint32_t k1) {
    for (int round = 0; round < 10; ++round) {
        if (round > 0) {
            k0 += kPhiloxW0;
            k1 += kPhiloxW1;
        }
        const uint64_t p0 = uint64_t(kPhiloxM0) * c.v[0];
        const uint64_t p1 = uint64_t(kPhiloxM1) * c.v[2];
        const uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0);
        const uint32_t hi1 = uint32_t(p1 >> 32), lo1 = uint32_t(p1);
        U32x4 n;
        n.v[0] = hi1 ^ c.v[1] ^ k0;
        n.v[1] = lo1;
        n.v[2] = hi0 ^ c.v[3] ^ k1;
        n.v[3] = lo0;
        c = n;
    }
    return c;
}

// The four outputs serving indices [4 * block, 4 * block + 4).
LC_RNG_FN U32x4 block_bits(uint64_t seed, int64_t position, uint32_t block) {
    const uint64_t pos = uint64_t(position);
    U32x4 c = {{block, uint32_t(pos), uint32_t(pos >> 32), 0u}};
    return philox4x32_10(c, uint32_t(seed), uint32_t(seed >> 32));
}

// 24 high bits -> [0, 1). Exact in fp32: every value is k * 2^-24.
LC_RNG_FN float bits_to_uniform(uint32_t bits) { return float(bits >> 8) * 5.9604644775390625e-8f; }

LC_RNG_FN float uniform(uint64_t seed, int64_t position, uint32_t index) {
    const U32x4 b = block_bits(seed, position, index >> 2);
    return bits_to_uniform(b.v[index & 3u]);
}

}  // namespace lc::rng

#undef LC_RNG_FN
