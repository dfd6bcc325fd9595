// Quantized lc_weight: GGUF blocks repacked at load into the layout the
// integer kernels read (linear_quant*.cpp, linear_kquant*.cpp).
//
// Every format is kept as unsigned quants u with fp32 block scales and either
// an integer offset or a min, so one kernel shape serves all:
//   Q8_0  w = d * (u - 128)    u = q + 128, q the stored int8
//   Q4_0  w = d * (u - 8)      u the stored nibble
//   Q4_1  w = d * u + m
//   Q5_0, Q5_1, Q4_K, Q5_K, Q6_K: weight_kquant.h (the same shape, with the
//         K-quants' scales d * sc computed from their 6/8-bit sub-scales)
// Blocks are 32 weights along K (GGUF's; the K-quants' 256-superblocks are 8
// of them), so K is a multiple of 32 (256 for the K-quants).
//
// Layout: panels of 16 output columns (as the float pack, weight.h); panel p
// holds its units one after the other, a unit being one GGUF block for every
// column: a header (the K family's scales; none for Q8_0/Q4_0/Q4_1), then its
// 32-blocks. A Q8_0/Q4_0/Q4_1 32-block:
//   quants  Q8: 8 groups g of 64 bytes, byte 4c + i = u[col c][4g + i]
//           Q4: 4 groups t of 64 bytes, byte 4c + i = u[c][4t + i] | u[c][4(t+4) + i] << 4
//   d       16 fp16, one per column
//   m       16 fp16 (Q4_1 only)
// so one 64-byte load (two 32-byte ones) gives, per 32-bit lane c, four
// consecutive quants of column c: the operand of vpdpbusd (u8 x s8 -> s32)
// against four activations broadcast to every lane. A decode step reads the
// bits per weight of kFormats (4.5 to 8.5), in address order.
#pragma once

#include <cstdint>
#include <cstring>

#include "weight/weight.h"

namespace lc::quant {

constexpr int kBlock = 32;  // weights per block (along K)

// GGUF (ggml) type numbers, as lc_quant_type spells them.
constexpr int32_t kQ4_0 = LC_QUANT_Q4_0, kQ4_1 = LC_QUANT_Q4_1, kQ5_0 = LC_QUANT_Q5_0,
                  kQ5_1 = LC_QUANT_Q5_1, kQ8_0 = LC_QUANT_Q8_0, kQ4_K = LC_QUANT_Q4_K,
                  kQ5_K = LC_QUANT_Q5_K, kQ6_K = LC_QUANT_Q6_K;

// One kept type: its GGUF block and its packed unit (one GGUF block of each of a
// panel's 16 columns: `header` bytes, then `subs` 32-blocks of `sub` bytes).
struct Format {
    int32_t type;
    const char* name;
    int32_t gguf_elems, gguf_bytes;  // weights and bytes of one GGUF block (one column)
    int32_t header, subs, sub;
};
// Packed bits per weight = (header + subs * sub) * 8 / (16 * 32 * subs); GGUF's in brackets:
//   q4_0 4.5 (4.5)   q4_1 5.0 (5.0)   q5_0 5.5 (5.5)   q5_1 6.0 (6.0)   q8_0 8.5 (8.5)
//   q4_k 4.625 (4.5)   q5_k 5.625 (5.5)   q6_k 6.5625 (6.5625)
inline constexpr Format kFormats[] = {
    {kQ4_0, "q4_0", 32, 18, 0, 1, 288},     {kQ4_1, "q4_1", 32, 20, 0, 1, 320},
    {kQ5_0, "q5_0", 32, 22, 32, 1, 320},    {kQ5_1, "q5_1", 32, 24, 64, 1, 320},
    {kQ8_0, "q8_0", 32, 34, 0, 1, 544},     {kQ4_K, "q4_k", 256, 144, 320, 8, 256},
    {kQ5_K, "q5_k", 256, 176, 320, 8, 320}, {kQ6_K, "q6_k", 256, 210, 288, 8, 384},
};

// The format of a kept type, or null.
constexpr const Format* format(int32_t t) {
    for (const Format& f : kFormats)
        if (f.type == t) return &f;
    return nullptr;
}
inline bool known(int32_t t) { return format(t) != nullptr; }
inline const char* name(int32_t t) { return known(t) ? format(t)->name : "none"; }
// Bytes of one GGUF block (32 weights; 256 for the K-quants).
inline int64_t gguf_block_bytes(int32_t t) { return format(t)->gguf_bytes; }
// Bytes of a unit, and of a panel of K weights per column.
constexpr int64_t unit_bytes(int32_t t) {
    return format(t)->header + int64_t(format(t)->subs) * format(t)->sub;
}
inline int64_t panel_bytes(int32_t t, int64_t k) { return k / format(t)->gguf_elems * unit_bytes(t); }
// Q8_0/Q4_0/Q4_1: quant bytes of one packed block, and the whole packed block.
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

// The unit holding 32-block b of panel p, and the block itself.
inline const uint8_t* unit_at(const lc_weight& w, int64_t p, int64_t b) {
    const Format& f = *format(w.qtype);
    return static_cast<const uint8_t*>(w.data) + p * panel_bytes(w.qtype, w.k) +
           b / f.subs * unit_bytes(w.qtype);
}
inline const uint8_t* block_at(const lc_weight& w, int64_t p, int64_t b) {
    const Format& f = *format(w.qtype);
    return unit_at(w, p, b) + f.header + b % f.subs * f.sub;
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
