// The packed linear for bf16 weights on the AMX tiles (selected at run time on
// CPUs whose tiles this process may use, for every M; see linear.h).
//
// tdpbf16ps multiplies a 16 x 32 bf16 tile of activations (A) by a 32 x 16 tile
// of weights held as 16 rows of (k, k+1) pairs (B) into a 16 x 16 fp32 tile
// (C): 8192 multiply-adds per instruction. The bf16 weight panels are stored
// as whole B tiles (weight.h: pair rows, K padded to 32), so B is loaded from
// the weight in place (stride 64 bytes); the activations are rounded to bf16 by
// the function the vdpbf16ps kernel uses (linear_bf16_pack.h) into a
// per-call buffer of zero-padded rows: K to the panels' depth, M to whole
// 16-row tiles (below 16 rows the tiles are configured with M rows).
//
// Blocking: tiles 0-3 are C, 4-5 A (two 16-row blocks), 6-7 B (two panels),
// so each A tile serves two B tiles and each B tile two A tiles. A 2 x 2 block
// of C tiles accumulates over the whole K and is stored once (through a
// 16 x 16 buffer: bias, fp32 or bf16 out, rounded as store_row rounds).
// Each thread takes a range of panel pairs, visits them in L2-sized groups,
// and every 32-row block of A (in L1) passes over a group; the first block
// streams the group in from memory, prefetched ahead.
//
// Batch invariance: tdpbf16ps does not round like vdpbf16ps (measured on
// Sapphire Rapids: for K = 576, 77% of the results differ in the last bits
// from vdpbf16ps over the same k order), so on a CPU with usable tiles this
// kernel serves every M, decode included; a row's products, their k order and
// their grouping into tiles never depend on M or on the rows beside it.
// The cost, measured on the default model's shapes with the weights streamed
// from the last-level cache (2 shared cores): at M = 1-2 the tile loads reach
// ~27 GB/s against ~43 GB/s for the vdpbf16ps kernel's vector loads, so the
// 576-1536 wide projections take ~1.6x its time (o_proj 25 vs 15 us, gate_up
// and down 66 vs 41 us; lm_head 0.9x); even at M = 4, 1.7-2x faster at M = 8,
// 2-3x at 16 and 4-13x from 64 on (docs/bench/linear-amx-cpu-amx.json).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/isa_target.h"
#include "linear/linear.h"

#if LC_ISA_X86
#include <immintrin.h>

LC_ISA_BEGIN("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma")

#include "linear/amx_tiles.h"
#include "linear/linear_bf16_pack.h"

namespace lc::linear {
namespace {

constexpr int kNR = 16;  // columns per panel = per B and C tile
static_assert(kNR == weight::kPanel, "a B tile is one weight.h panel wide");
constexpr int kTileRows = 16;                 // rows of A and C tiles
constexpr int64_t kTileK = 32;                // k per tile product
constexpr int64_t kTileElems = kTileK * kNR;  // bf16 per B tile (1 KiB)
static_assert(kTileK == weight::kBf16RowAlign, "bf16 panels hold whole B tiles");

// C (0-3) and A (4-5) tiles of `rows` rows; B (6-7) of 16 pair rows. Every tile
// row is 64 bytes (16 fp32, or 32 bf16).
void configure(int rows) {
    amx::TileConfig cfg;
    for (int t = 0; t < 8; ++t) cfg.set(t, t < 6 ? rows : kTileRows, 64);
    amx::load(cfg);
}

// out[m0 + r][n0 + c] = c_tile[r][c] + bias for r < nrows, c < ncols: store_row's
// arithmetic (v + bias, or v + 0), and its bf16 rounding (f32_to_bf16) in lanes.
void store_c(const Job& job, const float* c_tile, int64_t m0, int64_t nrows, int64_t n0,
             int64_t ncols) {
    const __mmask16 mask = __mmask16((1u << ncols) - 1);
    const __m512 bias = job.bias ? _mm512_maskz_loadu_ps(mask, job.bias + n0) : _mm512_setzero_ps();
    for (int64_t r = 0; r < nrows; ++r) {
        const __m512 v = _mm512_add_ps(_mm512_load_ps(c_tile + r * kNR), bias);
        if (job.out_dtype == LC_DTYPE_F32) {
            _mm512_mask_storeu_ps(static_cast<float*>(job.out) + (m0 + r) * job.ldo + n0, mask, v);
            continue;
        }
        const __m512i u = _mm512_castps_si512(v);
        const __m512i rounded = _mm512_srli_epi32(
            _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)),
                             _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))),
            16);
        const __mmask16 nan = _mm512_cmpgt_epu32_mask(
            _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
        const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
        const __m256i h = _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
        _mm256_mask_storeu_epi16(static_cast<uint16_t*>(job.out) + (m0 + r) * job.ldo + n0, mask, h);
    }
}

// Rows of the job's output in the A tile that starts at row m0.
inline int64_t valid_rows(const Job& job, int64_t m0) {
    return std::min<int64_t>(kTileRows, job.M - m0);
}

// Prefetch distance of a streaming pass, in B tiles ahead of the one loaded.
constexpr int64_t kPrefetchTiles = 2;

inline void prefetch_tile(const uint16_t* b) {
    const char* p = reinterpret_cast<const char*>(b);
    for (int i = 0; i < 16; ++i) _mm_prefetch(p + 64 * i, _MM_HINT_T0);
}

// MA blocks of 16 rows of xb (from row m0; lda bytes per row) times NB panels
// (from `panel`, per_panel elements apart) over nkb tiles of k; stores MA x NB C
// tiles at (m0, n0). streaming: prefetch the panels ahead (their first pass).
template <int MA, int NB>
void block(const Job& job, const uint16_t* a, int64_t lda, const uint16_t* panel,
           int64_t per_panel, int64_t nkb, int64_t m0, int64_t n0, bool streaming) {
    _tile_zero(0);
    if constexpr (NB == 2) _tile_zero(1);
    if constexpr (MA == 2) _tile_zero(2);
    if constexpr (MA == 2 && NB == 2) _tile_zero(3);
    const uint16_t* a1 = a + kTileRows * lda / 2;
    const uint16_t* b1 = panel + per_panel;
    for (int64_t kb = 0; kb < nkb; ++kb) {
        if (streaming) {
            // Tiles past this pair's depth: the same tiles of the next pair.
            const int64_t t = kb + kPrefetchTiles;
            const uint16_t* q = t < nkb ? panel + t * kTileElems
                                        : panel + NB * per_panel + (t - nkb) * kTileElems;
            prefetch_tile(q);
            if constexpr (NB == 2) prefetch_tile(q + per_panel);
        }
        _tile_loadd(4, a + kb * kTileK, lda);
        _tile_loadd(6, panel + kb * kTileElems, 64);
        _tile_dpbf16ps(0, 4, 6);
        if constexpr (NB == 2) {
            _tile_loadd(7, b1 + kb * kTileElems, 64);
            _tile_dpbf16ps(1, 4, 7);
        }
        if constexpr (MA == 2) {
            _tile_loadd(5, a1 + kb * kTileK, lda);
            _tile_dpbf16ps(2, 5, 6);
            if constexpr (NB == 2) _tile_dpbf16ps(3, 5, 7);
        }
    }
    alignas(64) float c[MA * NB][kTileRows * kNR];
    _tile_stored(0, c[0], 64);
    if constexpr (NB == 2) _tile_stored(1, c[1], 64);
    if constexpr (MA == 2) _tile_stored(2, c[NB], 64);
    if constexpr (MA == 2 && NB == 2) _tile_stored(3, c[3], 64);
    for (int i = 0; i < MA; ++i) {
        const int64_t mi = m0 + i * kTileRows;
        for (int j = 0; j < NB; ++j) {
            const int64_t nj = n0 + j * kNR;
            store_c(job, c[i * NB + j], mi, valid_rows(job, mi),
                    nj, std::min<int64_t>(kNR, job.N - nj));
        }
    }
}

template <int MA>
void block_cols(const Job& job, const uint16_t* a, int64_t lda, const uint16_t* panel,
                int64_t per_panel, int64_t nkb, int64_t m0, int64_t n0, bool pair,
                bool streaming) {
    if (pair)
        block<MA, 2>(job, a, lda, panel, per_panel, nkb, m0, n0, streaming);
    else
        block<MA, 1>(job, a, lda, panel, per_panel, nkb, m0, n0, streaming);
}

}  // namespace

void run_packed_bf16_amx(const Job& job) {
    const lc_weight& w = *job.packed;
    const uint16_t* base = static_cast<const uint16_t*>(w.data);
    const int64_t Kp = weight::rows(w), nkb = Kp / kTileK, per_panel = Kp * kNR;
    // Below 16 rows the A and C tiles have M rows; from 16 on, 16 rows and the
    // activations are padded with zero rows to whole tiles.
    const int tile_rows = int(std::min<int64_t>(job.M, kTileRows));
    const int64_t Mp = job.M < kTileRows ? job.M : (job.M + kTileRows - 1) / kTileRows * kTileRows;
    thread_local std::vector<uint32_t> xb_buf;
    xb_buf.resize(size_t(std::max<int64_t>(1, Mp * Kp / 2)));
    pack_bf16_pairs(job, xb_buf.data(), Kp / 2, Mp);
    const uint16_t* xb = reinterpret_cast<const uint16_t*>(xb_buf.data());
    const int64_t lda = Kp * 2;  // bytes per activation row
    constexpr int64_t kGroupBytes = 384 << 10;
    const int64_t group = std::max<int64_t>(
        2, kGroupBytes / std::max<int64_t>(1, per_panel * 2 * 2) * 2);
    const int64_t units = (w.panels + 1) / 2;  // panel pairs
    for_tiles(job, units, Mp * Kp * 2 * kNR, [&](int64_t u0, int64_t u1) {
        configure(tile_rows);
        const int64_t p0 = 2 * u0, p1 = std::min(w.panels, 2 * u1);
        for (int64_t g0 = p0; g0 < p1; g0 += group) {
            const int64_t g1 = std::min(p1, g0 + group);
            for (int64_t m0 = 0; m0 < Mp; m0 += 2 * kTileRows) {
                const uint16_t* a = xb + m0 * Kp;
                const bool two = m0 + kTileRows < Mp;
                for (int64_t p = g0; p < g1; p += 2) {
                    const uint16_t* panel = base + p * per_panel;
                    const bool pair = p + 1 < g1;
                    if (two)
                        block_cols<2>(job, a, lda, panel, per_panel, nkb, m0, p * kNR, pair, m0 == 0);
                    else
                        block_cols<1>(job, a, lda, panel, per_panel, nkb, m0, p * kNR, pair, m0 == 0);
                }
            }
        }
        _tile_release();
    });
}

}  // namespace lc::linear

LC_ISA_END()

#else  // not x86-64: never selected (best_isa() reports avx2 at most)

namespace lc::linear {
void run_packed_bf16_amx(const Job&) {
    fail(LC_ERR_INTERNAL, "AMX linear kernel called on a non-x86 build");
}
}  // namespace lc::linear

#endif
