// The K family of quantized lc_weights (weight_quant.h's units): GGUF Q4_K,
// Q5_K, Q6_K and the 5-bit Q5_0, Q5_1, repacked at load (weight_kquant.cpp)
// for the kernels of linear_kquant*.cpp.
//
// Each is unsigned quants u (4, 5 or 6 bits) with, per 32-block and column,
// one fp32 scale (two for Q6_K: one per 16-element half) and an integer offset
// or a min:
//   Q5_0  w = d * (u - 16)
//   Q5_1  w = d * u + m
//   Q4_K  w = (D * sc) * u - Dmin * mn      sc, mn 6-bit, D, Dmin fp16 per 256
//   Q5_K  the same with 5-bit u
//   Q6_K  w = (D * sc_h) * (u - 32)         sc_h int8 per 16 weights, D per 256
// The products D * sc and Dmin * mn are exact in fp32 (11 x 8 significant bits),
// so the kernels compute them from the bytes kept here, and rows() dequantizes
// with gguf-py's operations in its order (the same fp32 results).
//
// A unit (one GGUF block of each of a panel's 16 columns) is a header, then
// its 32-blocks' quants. Header, per column c (fp16 arrays 16 wide):
//   Q5_0  d[16]                                                 32 bytes
//   Q5_1  d[16], m[16]                                          64
//   Q4_K, Q5_K  D[16], Dmin[16], sc[8 blocks][16], mn[8][16] (u8)  320
//   Q6_K  D[16], sc[8 blocks][2 halves][16] (int8)              288
// Quants of a 32-block: the low nibbles as Q4_0 packs them (4 groups t of 64
// bytes, byte 4c + i = lo(u[c][4t + i]) | lo(u[c][4(t+4) + i]) << 4), then a
// plane of the high bits:
//   5-bit  64 bytes: bit g of byte 4c + i = bit 4 of u[c][4g + i]
//   Q6_K   128 bytes: bits 2(g % 4), +1 of byte 64 (g / 4) + 4c + i = bits 4, 5
//          of u[c][4g + i]
// so the kernels rebuild group g's bytes (four consecutive quants of each
// column per 32-bit lane, as the Q8_0 layout holds them) with one shift and
// mask of the plane per group, on top of Q4_0's nibble extraction. Bits per
// weight are in weight_quant.h's kFormats.
#pragma once

#include "weight/weight_quant.h"

namespace lc::quant {

constexpr bool kfamily(int32_t t) {
    return t == kQ5_0 || t == kQ5_1 || t == kQ4_K || t == kQ5_K || t == kQ6_K;
}
// Bits of u above the nibble: 0, 1 or 2.
constexpr int high_bits(int32_t t) { return t == kQ4_K ? 0 : t == kQ6_K ? 2 : 1; }
// Scales per 32-block (Q6_K: one per 16-element half).
constexpr int halves(int32_t t) { return t == kQ6_K ? 2 : 1; }
// The integer offset subtracted from u; the others have a min instead (or nothing).
constexpr int32_t koffset(int32_t t) { return t == kQ5_0 ? 16 : t == kQ6_K ? 32 : 0; }
constexpr bool has_min(int32_t t) { return t == kQ5_1 || t == kQ4_K || t == kQ5_K; }
constexpr bool superblock(int32_t t) { return t == kQ4_K || t == kQ5_K || t == kQ6_K; }

// Header offsets: the fp16 d (D) row, and the row of 16 sub-scale / min bytes of
// 32-block s (half h).
constexpr int kD = 0, kMinRow = 32;
constexpr int sc_row(int32_t t, int s, int h) { return t == kQ6_K ? 32 + 32 * s + 16 * h : 64 + 16 * s; }
constexpr int mn_row(int s) { return 192 + 16 * s; }

inline float f16_at(const uint8_t* row, int c) {
    uint16_t h;
    std::memcpy(&h, row + 2 * c, 2);
    return f16_to_f32(h);
}

// The fp32 scale of half h of 32-block s (s = b % 8), column c, from its unit's header.
inline float kscale(int32_t t, const uint8_t* hdr, int s, int h, int c) {
    const float d = f16_at(hdr + kD, c);
    if (t == kQ6_K) return d * float(int8_t(hdr[sc_row(t, s, h) + c]));
    if (superblock(t)) return d * float(hdr[sc_row(t, s, h) + c]);
    return d;
}
// The min: w = scale * (u - offset) + min, for the types that have one.
inline float kmin(int32_t t, const uint8_t* hdr, int s, int c) {
    if (t == kQ5_1) return f16_at(hdr + kMinRow, c);
    return -(f16_at(hdr + kMinRow, c) * float(hdr[mn_row(s) + c]));
}

// Quant u of column c (0..15), element e (0..31) of a 32-block's quants.
inline int kquant_of(int32_t t, const uint8_t* q, int c, int e) {
    const int g = e / 4, i = e % 4;
    const int lo = (q[(g % 4) * 64 + c * 4 + i] >> (g < 4 ? 0 : 4)) & 0x0f;
    if (high_bits(t) == 1) return lo | ((q[256 + c * 4 + i] >> g) & 1) << 4;
    if (high_bits(t) == 2) return lo | ((q[256 + (g / 4) * 64 + c * 4 + i] >> (2 * (g % 4))) & 3) << 4;
    return lo;
}

// Row n of a K family W dequantized into dst[0..K), as gguf-py's dequantize computes it.
inline void dequant_krow(const lc_weight& w, int64_t n, float* dst) {
    const int32_t t = w.qtype;
    const int64_t p = n / weight::kPanel, nb = w.k / kBlock;
    const int c = int(n % weight::kPanel);
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t *hdr = unit_at(w, p, b), *q = block_at(w, p, b);
        const int s = int(b % format(t)->subs);
        for (int e = 0; e < kBlock; ++e) {
            const int u = kquant_of(t, q, c, e);
            const float d = kscale(t, hdr, s, e * halves(t) / kBlock, c);
            dst[b * kBlock + e] = has_min(t) ? d * float(u) + kmin(t, hdr, s, c)
                                             : d * float(u - koffset(t));
        }
    }
}

// Packing (weight_kquant.cpp): GGUF block `src` of column c (0..15) into the zeroed
// unit `dst` of its panel.
void pack_kunit(int32_t t, const uint8_t* src, int c, uint8_t* dst);

}  // namespace lc::quant
