// Quantized lc_weight: GGUF blocks (Q8_0, Q4_0, Q4_1) repacked at load into the
// layout the integer kernels read (linear_quant*.cpp).
//
// Every format is kept as unsigned quants u with a per-block fp16 scale d and
// either an integer offset or an fp16 min, so one kernel shape serves all:
//   Q8_0  w = d * (u - 128)    u = q + 128, q the stored int8
//   Q4_0  w = d * (u - 8)      u the stored nibble
//   Q4_1  w = d * u + m
// Blocks are 32 weights along K (GGUF's), so K is a multiple of 32.
//
// Layout: panels of 16 output columns (as the float pack, weight.h); panel p
// holds its K/32 blocks one after the other, each block:
//   quants  Q8: 8 groups g of 64 bytes, byte 4c + i = u[col c][4g + i]
//           Q4: 4 groups t of 64 bytes, byte 4c + i = u[c][4t + i] | u[c][4(t+4) + i] << 4
//   d       16 fp16, one per column
//   m       16 fp16 (Q4_1 only)
// so one 64-byte load (two 32-byte ones) gives, per 32-bit lane c, four
// consecutive quants of column c: the operand of vpdpbusd (u8 x s8 -> s32)
// against four activations broadcast to every lane. A decode step reads 4.5-5
// bits (Q4) or 8.5 bits (Q8) per weight, in address order.
#pragma once

#include <cstdint>
#include <cstring>

#include "weight.h"

namespace lc::quant {

constexpr int kBlock = 32;  // weights per block (along K)

// GGUF (ggml) type numbers, as lc_quant_type spells them.
constexpr int32_t kQ4_0 = LC_QUANT_Q4_0, kQ4_1 = LC_QUANT_Q4_1, kQ8_0 = LC_QUANT_Q8_0;

inline bool known(int32_t t) { return t == kQ4_0 || t == kQ4_1 || t == kQ8_0; }
inline const char* name(int32_t t) {
    return t == kQ4_0 ? "q4_0" : t == kQ4_1 ? "q4_1" : t == kQ8_0 ? "q8_0" : "none";
}
// Bytes of one GGUF block of 32 weights.
inline int64_t gguf_block_bytes(int32_t t) { return t == kQ8_0 ? 34 : t == kQ4_1 ? 20 : 18; }
// Quant bytes of one packed panel block, and the whole packed block.
inline int64_t quant_bytes(int32_t t) { return t == kQ8_0 ? 512 : 256; }
inline int64_t block_bytes(int32_t t) { return quant_bytes(t) + 32 + (t == kQ4_1 ? 32 : 0); }
// The integer offset subtracted from u (0 for Q4_1, which has a min instead).
inline int32_t offset(int32_t t) { return t == kQ8_0 ? 128 : t == kQ4_0 ? 8 : 0; }

// IEEE half -> float without F16C (baseline code; subnormals exact).
inline float f16_to_f32(uint16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    uint32_t u;
    if (e == 0x1f) {
        u = sign | 0x7f800000u | (man << 13);
    } else if (e != 0) {
        u = sign | ((e + 112) << 23) | (man << 13);
    } else {
        float f = float(man) * (1.0f / 16777216.0f);  // man * 2^-24
        std::memcpy(&u, &f, 4);
        u |= sign;
    }
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

// The packed block b of panel p.
inline const uint8_t* block_at(const lc_weight& w, int64_t p, int64_t b) {
    const int64_t nb = w.k / kBlock;
    return static_cast<const uint8_t*>(w.data) + (p * nb + b) * block_bytes(w.qtype);
}

// Quant u of column c (0..15), element e (0..31) of a packed block.
inline int quant_of(int32_t t, const uint8_t* blk, int c, int e) {
    const int g = e / 4, i = e % 4;
    if (t == kQ8_0) return blk[g * 64 + c * 4 + i];
    const uint8_t v = blk[(g % 4) * 64 + c * 4 + i];
    return g < 4 ? v & 0x0f : v >> 4;
}

// Row n of W dequantized into dst[0..K) (fp32: exact, d * u + m fits in it).
inline void dequant_row(const lc_weight& w, int64_t n, float* dst) {
    const int32_t t = w.qtype;
    const int64_t p = n / weight::kPanel, nb = w.k / kBlock;
    const int c = int(n % weight::kPanel);
    const int64_t qb = quant_bytes(t);
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = block_at(w, p, b);
        uint16_t h;
        std::memcpy(&h, blk + qb + 2 * c, 2);
        const float d = f16_to_f32(h);
        float m = -float(offset(t)) * d;
        if (t == kQ4_1) {
            std::memcpy(&h, blk + qb + 32 + 2 * c, 2);
            m = f16_to_f32(h);
        }
        for (int e = 0; e < kBlock; ++e) dst[b * kBlock + e] = d * float(quant_of(t, blk, c, e)) + m;
    }
}

}  // namespace lc::quant
