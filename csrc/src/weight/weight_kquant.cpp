// pack_kunit: one GGUF block of the K family (ggml's block_q5_0, block_q5_1,
// block_q4_K, block_q5_K, block_q6_K, as gguf-py's quants.py reads them)
// unpacked and written into weight_kquant.h's unit layout.
#include "weight/weight_kquant.h"

namespace lc::quant {
namespace {

// One GGUF block of one column, unpacked.
struct KBlock {
    uint8_t u[256];   // unsigned quants, in weight order
    uint16_t d, m;    // fp16 bits: d (the K-quants' D) and Q5_1's m (the K-quants' Dmin)
    uint8_t sc[16];   // Q4_K/Q5_K: 8 six-bit scales; Q6_K: 16 int8 scales
    uint8_t mn[8];    // Q4_K/Q5_K: 8 six-bit mins
};

uint16_t u16_at(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
}

// Q5_0 / Q5_1: d (m), a 32-bit plane of fifth bits, 16 bytes of nibbles (j, j + 16).
void read_q5(const uint8_t* src, bool with_min, KBlock& k) {
    k.d = u16_at(src);
    k.m = with_min ? u16_at(src + 2) : 0;
    const uint8_t* qh = src + (with_min ? 4 : 2);
    const uint32_t high = uint32_t(qh[0]) | uint32_t(qh[1]) << 8 | uint32_t(qh[2]) << 16 |
                          uint32_t(qh[3]) << 24;
    const uint8_t* qs = qh + 4;
    for (int j = 0; j < 32; ++j)
        k.u[j] = uint8_t(((j < 16 ? qs[j] : qs[j - 16] >> 4) & 0x0f) | ((high >> j) & 1) << 4);
}

// Q4_K / Q5_K: D, Dmin, 12 bytes of 6-bit scales and mins, [Q5_K: 32 bytes of fifth
// bits, bit s of byte e for element 32s + e], 128 bytes of nibbles (32-block s: the
// low (s even) or high nibbles of bytes 32 (s / 2) ...).
void read_k45(const uint8_t* src, bool five, KBlock& k) {
    k.d = u16_at(src);
    k.m = u16_at(src + 2);
    const uint8_t* s = src + 4;
    for (int j = 0; j < 4; ++j) {
        k.sc[j] = s[j] & 63;
        k.mn[j] = s[j + 4] & 63;
        k.sc[j + 4] = uint8_t((s[j + 8] & 0x0f) | (s[j] >> 6) << 4);
        k.mn[j + 4] = uint8_t((s[j + 8] >> 4) | (s[j + 4] >> 6) << 4);
    }
    const uint8_t* qh = src + 16;
    const uint8_t* qs = src + (five ? 48 : 16);
    for (int b = 0; b < 8; ++b)
        for (int e = 0; e < 32; ++e) {
            const int lo = (qs[32 * (b / 2) + e] >> (4 * (b % 2))) & 0x0f;
            k.u[32 * b + e] = uint8_t(lo | (five ? ((qh[e] >> b) & 1) << 4 : 0));
        }
}

// Q6_K: 128 bytes of low nibbles, 64 of 2-bit highs, 16 int8 scales, D. Element
// 128h + 64j + i (i < 64) takes nibble j of ql[64h + i]; element 128h + 32j + i
// (i < 32) takes bits 2j, 2j+1 of qh[32h + i].
void read_q6k(const uint8_t* src, KBlock& k) {
    const uint8_t *ql = src, *qh = src + 128;
    std::memcpy(k.sc, src + 192, 16);
    k.d = u16_at(src + 208);
    k.m = 0;
    for (int e = 0; e < 256; ++e) {
        const int h = e / 128, r = e % 128;
        const int lo = (ql[64 * h + r % 64] >> (4 * (r / 64))) & 0x0f;
        const int hi = (qh[32 * h + r % 32] >> (2 * (r / 32))) & 3;
        k.u[e] = uint8_t(lo | hi << 4);
    }
}

void put16(uint8_t* row, int c, uint16_t v) { std::memcpy(row + 2 * c, &v, 2); }

}  // namespace

void pack_kunit(int32_t t, const uint8_t* src, int c, uint8_t* dst) {
    KBlock k;
    if (t == kQ5_0 || t == kQ5_1)
        read_q5(src, t == kQ5_1, k);
    else if (t == kQ6_K)
        read_q6k(src, k);
    else
        read_k45(src, t == kQ5_K, k);
    const Format& f = *format(t);
    put16(dst + kD, c, k.d);
    if (has_min(t)) put16(dst + kMinRow, c, k.m);
    for (int s = 0; s < f.subs && superblock(t); ++s) {
        for (int h = 0; h < halves(t); ++h)
            dst[sc_row(t, s, h) + c] = t == kQ6_K ? k.sc[2 * s + h] : k.sc[s];
        if (t != kQ6_K) dst[mn_row(s) + c] = k.mn[s];
    }
    for (int s = 0; s < f.subs; ++s) {
        uint8_t* q = dst + f.header + s * f.sub;
        for (int e = 0; e < kBlock; ++e) {
            const int u = k.u[kBlock * s + e], g = e / 4, i = e % 4;
            q[(g % 4) * 64 + 4 * c + i] |= uint8_t((u & 0x0f) << (g < 4 ? 0 : 4));
            if (high_bits(t) == 1) q[256 + 4 * c + i] |= uint8_t(((u >> 4) & 1) << g);
            if (high_bits(t) == 2)
                q[256 + (g / 4) * 64 + 4 * c + i] |= uint8_t(((u >> 4) & 3) << (2 * (g % 4)));
        }
    }
}

}  // namespace lc::quant
