// lc_weight_pack_quant: GGUF blocks repacked into weight_quant.h's layout
// (the K family's units: weight_kquant.cpp).
#include "weight/weight_quant.h"

#include "weight/weight_kquant.h"

#include <cstdlib>
#include <cstring>
#include <string>

namespace {

using lc::quant::kBlock;

// The 32 unsigned quants, d and m (fp16 bits) of one GGUF block.
void read_gguf_block(int32_t t, const uint8_t* src, uint8_t u[kBlock], uint16_t* d, uint16_t* m) {
    std::memcpy(d, src, 2);
    *m = 0;
    if (t == lc::quant::kQ8_0) {
        for (int e = 0; e < kBlock; ++e) u[e] = uint8_t(int(int8_t(src[2 + e])) + 128);
        return;
    }
    const uint8_t* qs = src + 2;
    if (t == lc::quant::kQ4_1) {
        std::memcpy(m, src + 2, 2);
        qs = src + 4;
    }
    for (int j = 0; j < kBlock / 2; ++j) {  // element j: low nibble, j + 16: high nibble
        u[j] = qs[j] & 0x0f;
        u[j + kBlock / 2] = qs[j] >> 4;
    }
}

// A Q8_0/Q4_0/Q4_1 GGUF block of column c into its zeroed packed block.
void pack_block(int32_t t, const uint8_t* src, int c, uint8_t* dst) {
    uint8_t u[kBlock];
    uint16_t d, m;
    read_gguf_block(t, src, u, &d, &m);
    for (int e = 0; e < kBlock; ++e) {
        const int g = e / 4, i = e % 4;
        if (t == lc::quant::kQ8_0)
            dst[g * 64 + c * 4 + i] = u[e];
        else
            dst[(g % 4) * 64 + c * 4 + i] |= uint8_t(u[e] << (g < 4 ? 0 : 4));
    }
    const int64_t qb = lc::quant::quant_bytes(t);
    std::memcpy(dst + qb + 2 * c, &d, 2);
    if (t == lc::quant::kQ4_1) std::memcpy(dst + qb + 32 + 2 * c, &m, 2);
}

std::string supported() {
    std::string s;
    for (const lc::quant::Format& f : lc::quant::kFormats)
        s += (s.empty() ? "" : ", ") + std::string(f.name) + " = " + std::to_string(f.type);
    return s;
}

}  // namespace

extern "C" lc_status lc_weight_pack_quant(int32_t type, const void* blocks, int64_t nbytes,
                                          int64_t n, int64_t k, lc_weight** out) {
    return lc::guard([&] {
        using namespace lc::quant;
        lc::require(out != nullptr, "out is NULL");
        *out = nullptr;
        lc::require(known(type), "unsupported quantization type " + std::to_string(type) +
                                     " (supported: " + supported() + ")");
        const std::string what = std::string(name(type)) + " [" + std::to_string(n) + ", " +
                                 std::to_string(k) + "]";
        const int64_t elems = format(type)->gguf_elems;
        lc::require(n > 0 && k > 0 && k % elems == 0,
                    "a " + std::string(name(type)) + " weight needs N > 0 and K a positive " +
                        "multiple of " + std::to_string(elems) + ", got [" + std::to_string(n) +
                        ", " + std::to_string(k) + "]");
        // Every size below is checked for int64 overflow: a host's n and k could
        // otherwise wrap the source size onto its buffer's and the packed size onto
        // a small allocation that the repack loop then overruns.
        const int64_t units = k / elems, gb = gguf_block_bytes(type), ub = unit_bytes(type);
        int64_t src_row = 0, src_bytes = 0;
        const bool src_fits = !__builtin_mul_overflow(units, gb, &src_row) &&
                              !__builtin_mul_overflow(n, src_row, &src_bytes);
        lc::require(src_fits, what + " is too large (its size overflows int64)");
        lc::require(nbytes == src_bytes, what + " is " + std::to_string(src_bytes) +
                                             " bytes of GGUF blocks, got " + std::to_string(nbytes));
        lc::require(blocks != nullptr, "blocks is NULL");
        const int64_t panels = n / lc::weight::kPanel + (n % lc::weight::kPanel != 0);
        int64_t packed_units = 0, packed_bytes = 0;
        lc::require(!__builtin_mul_overflow(panels, units, &packed_units) &&
                        !__builtin_mul_overflow(packed_units, ub, &packed_bytes),
                    what + " is too large to pack (its size overflows int64)");
        auto* pw = new lc_weight;
        pw->n = n;
        pw->k = k;
        pw->dtype = LC_DTYPE_F32;
        pw->qtype = type;
        pw->panels = panels;
        pw->bytes = size_t(packed_bytes);
        try {
            pw->data = lc::weight::alloc_memory(pw->bytes);
        } catch (...) {
            delete pw;
            throw;
        }
        const uint8_t* src = static_cast<const uint8_t*>(blocks);
        lc::parallel_for(pw->panels, 4, [&](int64_t p0, int64_t p1) {
            for (int64_t p = p0; p < p1; ++p) {
                for (int64_t j = 0; j < units; ++j) {
                    uint8_t* dst = static_cast<uint8_t*>(pw->data) + (p * units + j) * ub;
                    std::memset(dst, 0, size_t(ub));
                    for (int c = 0; c < lc::weight::kPanel; ++c) {
                        const int64_t row = p * lc::weight::kPanel + c;
                        if (row >= n) break;  // columns past N: zero quants and scales
                        const uint8_t* blk = src + row * src_row + j * gb;
                        kfamily(type) ? pack_kunit(type, blk, c, dst) : pack_block(type, blk, c, dst);
                    }
                }
            }
        });
        *out = pw;
    });
}

extern "C" lc_status lc_weight_quant_type(const lc_weight* w, int32_t* type) {
    return lc::guard([&] {
        lc::require(w != nullptr, "weight is NULL");
        lc::require(type != nullptr, "type is NULL");
        *type = w->qtype;
    });
}
