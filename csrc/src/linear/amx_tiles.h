// The AMX tile configuration the tile kernels (linear_*_amx.cpp) load: included
// by *_amx objects only (it holds a tile instruction).
#pragma once

#include <cstdint>

namespace lc::amx {
namespace {  // internal linkage: each tile object gets its own copy

// ldtilecfg's 64-byte operand (palette 1); set() one tile's rows and bytes per row.
struct alignas(64) TileConfig {
    uint8_t palette = 1, start_row = 0;
    uint8_t reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};

    void set(int tile, int nrows, int bytes) {
        rows[tile] = uint8_t(nrows);
        colsb[tile] = uint16_t(bytes);
    }
};

// Loads cfg for this thread. The whole 64-byte object is the asm's operand, so the
// compiler stores every field first (GCC's _tile_loadconfig names only its first 8
// bytes, which let an inlined caller's other stores be dropped: tiles configured
// with garbage rows and columns, a SIGILL at the next tile instruction).
inline void load(const TileConfig& cfg) { __asm__ volatile("ldtilecfg %0" ::"m"(cfg)); }

}  // namespace
}  // namespace lc::amx
