// lc_weight: a weight matrix W [N, K] (row n = output column n) owned by the
// core in the layout its linear kernels stream.
//
// Layout: panels of kPanel = 16 output columns; panel p holds columns
// 16p .. 16p+15 for every k, k-major: [K][16]. Columns past N are zero.
//
// (A quantized weight keeps the panels but stores blocks: weight_quant.h.)
//
//   panel p, row k:  W[16p + 0][k] ... W[16p + 15][k]      (one 64-byte fp32
//                                                           or 32-byte bf16 row)
//
// A decode step reads the panels of a thread in address order, one stream;
// a batch multiplies each panel row against a block of x rows in registers
// (a 6 x 16 microkernel), so no per-call packing is needed. bf16 rows are
// stored interleaved, slot 2j = column j and slot 2j+1 = column 8+j, so that
// one 256-bit load yields columns 0-7 (shift left 16) and 8-15 (mask the high
// halves) as fp32 without shuffles.
//
// Memory: one allocation, 2 MiB aligned and marked for transparent huge
// pages (MADV_HUGEPAGE) when large: with 4 KiB pages the hardware prefetcher
// stops at every page boundary and a decode step runs about a quarter slower.
#pragma once

#include <cstddef>
#include <cstdint>

#include "internal.h"

struct lc_weight {
    int64_t n = 0, k = 0;
    int32_t dtype = LC_DTYPE_F32;  // storage: LC_DTYPE_F32 or LC_DTYPE_BF16
    int32_t qtype = 0;             // an lc_quant_type: GGUF blocks (weight_quant.h); 0: float
    int64_t panels = 0;
    void* data = nullptr;  // panels * k * 16 elements
    size_t bytes = 0;      // allocated
};

namespace lc::weight {

constexpr int kPanel = 16;

// Weight memory: 2 MiB aligned and marked for huge pages when large; std::free it.
void* alloc_memory(size_t bytes);

// Slot of column c (0..15) within a stored panel row.
inline int slot(int32_t dtype, int c) {
    return dtype == LC_DTYPE_BF16 ? (c < 8 ? 2 * c : 2 * (c - 8) + 1) : c;
}

inline float at(const lc_weight& w, int64_t n, int64_t k) {
    const int64_t p = n / kPanel;
    const int c = int(n % kPanel);
    const int64_t off = (p * w.k + k) * kPanel + slot(w.dtype, c);
    return w.dtype == LC_DTYPE_BF16 ? bf16_to_f32(static_cast<const uint16_t*>(w.data)[off])
                                    : static_cast<const float*>(w.data)[off];
}

}  // namespace lc::weight
