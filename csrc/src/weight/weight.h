// lc_weight: a weight matrix W [N, K] (row n = output column n) owned by the
// core in the layout its linear kernels stream.
//
// Layout: panels of kPanel = 16 output columns; panel p holds columns
// 16p .. 16p+15 for every k, k-major. Columns past N are zero.
//
//   fp32, panel p row k:  W[16p + 0][k] ... W[16p + 15][k]   (one 64-byte row)
//
//   bf16, panel p pair row kk (k = 2kk, 2kk+1), 64 bytes:
//         W[16p+0][k] W[16p+0][k+1]  W[16p+1][k] W[16p+1][k+1] ... W[16p+15][k+1]
//
// bf16 panels hold rows(w) = K rounded up to 32 rows (zero past K), so a panel
// is K/32 whole AMX B tiles of 16 pair rows x 64 bytes, read in place by the
// tile kernel (tileloadd, stride 64); the vdpbf16ps kernel loads a pair row as
// its 16 lanes of (k, k+1) pairs as is, and the AVX2 kernel widens a 256-bit
// half (8 columns) by a shift (row k) or a mask (row k+1).
//
// A decode step reads the panels of a thread in address order, one stream;
// a batch multiplies each panel row against a block of x rows in registers
// (or tiles), so no per-call packing of W is needed.
//
// Memory: one allocation, 2 MiB aligned and marked for transparent huge
// pages (MADV_HUGEPAGE) when large: with 4 KiB pages the hardware prefetcher
// stops at every page boundary and a decode step runs about a quarter slower.
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/internal.h"

struct lc_weight {
    int64_t n = 0, k = 0;
    int32_t dtype = LC_DTYPE_F32;  // storage: LC_DTYPE_F32 or LC_DTYPE_BF16
    int32_t qtype = 0;             // an lc_quant_type: GGUF blocks (weight_quant.h); 0: float
    int64_t panels = 0;
    void* data = nullptr;  // panels * weight::rows(*this) * 16 elements
    size_t bytes = 0;      // allocated
};

namespace lc::weight {

constexpr int kPanel = 16;

// Weight memory: 2 MiB aligned and marked for huge pages when large; std::free it.
void* alloc_memory(size_t bytes);

// K rows of a bf16 panel are padded to a multiple of this (one B tile's depth).
constexpr int64_t kBf16RowAlign = 32;

// Rows a stored panel holds (>= K): elements per panel = rows(w) * kPanel.
inline int64_t rows(int32_t dtype, int64_t k) {
    return dtype == LC_DTYPE_BF16 ? (k + kBf16RowAlign - 1) / kBf16RowAlign * kBf16RowAlign : k;
}
inline int64_t rows(const lc_weight& w) { return rows(w.dtype, w.k); }

// Element offset of W[n][k] in the panels.
inline int64_t offset(int32_t dtype, int64_t panel_rows, int64_t n, int64_t k) {
    const int64_t base = n / kPanel * panel_rows * kPanel;
    const int64_t c = n % kPanel;
    return dtype == LC_DTYPE_BF16 ? base + (k / 2) * 2 * kPanel + 2 * c + (k & 1)
                                  : base + k * kPanel + c;
}

inline float at(const lc_weight& w, int64_t n, int64_t k) {
    const int64_t off = offset(w.dtype, rows(w), n, k);
    return w.dtype == LC_DTYPE_BF16 ? bf16_to_f32(static_cast<const uint16_t*>(w.data)[off])
                                    : static_cast<const float*>(w.data)[off];
}

}  // namespace lc::weight
