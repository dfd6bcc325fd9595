// Quantized packed linear on AMX-INT8 tiles (linear_quant.h), for Q8_0, Q4_0 and
// Q4_1 at large M: bit-identical to the VNNI kernel (linear_quant_avx512.cpp), so
// a row's result does not depend on how many rows share the call or which of the
// two ran it.
//
// The integer part of a block is exact in both: the VNNI kernel adds s16 x s16
// pairs into int32, the tiles add s8/u8 x u8 quadruples into int32. An int16
// activation q is split into bytes, q = 256 * hi + lo (hi = q >> 8 signed, lo =
// q & 255 unsigned), and per block of 32 and output column
//   sum u q = 256 * sum u hi + sum u lo    (tdpbsud for hi, tdpbuud for lo)
// (|sum| < 2^28 for u <= 255, so nothing wraps); int8 activations take one
// tdpbsud. The fp32 part is the VNNI kernel's, step for step: per block and row,
// fma(float(dot), d * s, acc), then for Q4_1 fma(m, s * sum q, acc), with the
// sixteen columns of a panel in one register per row.
//
// A packed Q8_0 block is already a B tile (8 rows of 64 bytes, row g holding
// quants 4g..4g+3 of each column); a Q4 block's nibbles are split into one in a
// scratch tile. The activations are rewritten once per call into byte planes
// [M rounded up to 16][K] (natural element order), each tile a 16 x 32 slice.
// Per block: two (one) tile products into zeroed C tiles, stored to a scratch
// and folded into the fp32 accumulators of sixteen rows; so the kernel is bound
// by the tile loads, products and stores of each block and that fold (4-8 vector
// ops per row and block): 1.2-1.5x the VNNI kernel at M = 256 on a Sapphire Rapids
// core, int16 activations gaining more than int8 (scripts/bench_linear_amx.py).
#include "linear/linear_quant.h"

#include "common/isa_target.h"
#include "linear/amx_tiles.h"
#include "runtime/cpu_isa.h"

#if LC_ISA_X86
#include <immintrin.h>

#include <cstring>
#include <vector>

LC_ISA_BEGIN("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")

namespace lc::linear {
namespace {

constexpr int kTileRows = 16;

// Tile registers. int8 activations: C tmm0 (even blocks) / tmm1 (odd), A tmm2 / tmm3,
// B tmm4 / tmm5, so consecutive blocks share no tile and their products overlap.
// int16 (hi, lo): C tmm0, tmm1 (even) / tmm5, tmm6 (odd), A tmm2, tmm3 (shared),
// B tmm4 / tmm7. C: 16 rows x 16 int32; A: 16 rows x 32 bytes; B: 8 rows x 64
// bytes (32 quants of 16 columns).
void configure_tiles(bool wide) {
    amx::TileConfig cfg;
    cfg.set(0, kTileRows, 64), cfg.set(1, kTileRows, 64), cfg.set(2, kTileRows, 32);
    cfg.set(3, kTileRows, 32), cfg.set(4, 8, 64);
    if (wide)
        cfg.set(5, kTileRows, 64), cfg.set(6, kTileRows, 64), cfg.set(7, 8, 64);
    else
        cfg.set(5, 8, 64);
    amx::load(cfg);
}

// The activations as byte planes: row m, element k at m * K + k.
struct Planes {
    const int8_t* hi;   // int16: q >> 8; int8: q itself
    const uint8_t* lo;  // int16: q & 255; int8: null
    int64_t K;
};

struct PlaneBuf {
    std::vector<int8_t> hi;
    std::vector<uint8_t> lo;
};

Planes make_planes(const Job& job, const QuantX& qx, PlaneBuf& buf) {
    const int64_t K = job.K, M = job.M;
    const int64_t rows = (M + kTileRows - 1) / kTileRows * kTileRows;
    const bool wide = qx.q16 != nullptr;
    buf.hi.assign(size_t(rows * K), 0);
    buf.lo.assign(wide ? size_t(rows * K) : 0, 0);
    int8_t* hi = buf.hi.data();
    uint8_t* lo = buf.lo.data();
    // x16_index order (x0 x2 x1 x3 in each four) back to natural: the same swap
    const __m512i natural = _mm512_set_epi16(31, 29, 30, 28, 27, 25, 26, 24, 23, 21, 22, 20, 19, 17,
                                             18, 16, 15, 13, 14, 12, 11, 9, 10, 8, 7, 5, 6, 4, 3,
                                             1, 2, 0);
    parallel_for(M, 16, [&](int64_t m0, int64_t m1) {
        for (int64_t m = m0; m < m1; ++m) {
            if (!wide) {
                std::memcpy(hi + m * K, qx.q + m * K, size_t(K));
                continue;
            }
            for (int64_t k = 0; k < K; k += quant::kBlock) {
                const __m512i v = _mm512_permutexvar_epi16(natural, _mm512_loadu_si512(qx.q16 + m * K + k));
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(lo + m * K + k), _mm512_cvtepi16_epi8(v));
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi + m * K + k),
                                    _mm512_cvtepi16_epi8(_mm512_srai_epi16(v, 8)));
            }
        }
    });
    return Planes{hi, wide ? lo : nullptr, K};
}

// The tile instructions take their register as a literal (the intrinsics paste it
// into the mnemonic), so a block's tile steps are macros: tiles CH (hi) and CL (lo)
// accumulate the block's products against B tile TB, then are stored to c[b & 1]. The
// intrinsics do not tell the compiler that they read or write memory: the barriers
// keep the stores of an unpacked B tile before its load, and the loads of c after
// its store.
#define LC_BARRIER() __asm__ volatile("" ::: "memory")
#define LC_TILE_PRODUCTS(CH, CL, AH, AL, TB, b)                                       \
    do {                                                                              \
        _tile_loadd(TB, T == quant::kQ8_0 ? static_cast<const void*>(blk0 + (b) * bb) \
                                          : static_cast<const void*>(bt[(b) & 1]),    \
                    64);                                                              \
        _tile_zero(CH);                                                               \
        _tile_loadd(AH, ahi + (b) * quant::kBlock, a.K);                              \
        _tile_dpbsud(CH, AH, TB);                                                     \
        if (Wide) {                                                                   \
            _tile_zero(CL);                                                           \
            _tile_loadd(AL, alo + (b) * quant::kBlock, a.K);                          \
            _tile_dpbuud(CL, AL, TB);                                                 \
        }                                                                             \
    } while (0)
#define LC_TILE_STORE(CH, CL, b)                                     \
    do {                                                             \
        _tile_stored(CH, c[(b) & 1][0], 64);                         \
        if (Wide) _tile_stored(CL, c[(b) & 1][1], 64);               \
        LC_BARRIER();                                                \
    } while (0)

// Folds block FB's stored C tiles into the sixteen rows' accumulators (a macro, so
// that acc stays in registers).
#define LC_FOLD(FB)                                                                                  \
    do {                                                                                             \
        const int64_t fb = (FB);                                                                     \
        const uint8_t* fblk = blk0 + fb * bb;                                                        \
        const int32_t* chi = c[fb & 1][0];                                                           \
        const int32_t* clo = c[fb & 1][1];                                                           \
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(fblk + qb))); \
        const __m512 m = T == quant::kQ4_1                                                           \
            ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(fblk + qb + 32)))  \
            : _mm512_setzero_ps();                                                                   \
        LC_UNROLL for (int r = 0; r < kTileRows; ++r) {                                              \
            if (r >= rows) break;                                                                    \
            const int64_t i = (m0 + r) * nb + fb;                                                    \
            __m512i dot = _mm512_load_si512(chi + 16 * r);                                           \
            if (Wide) dot = _mm512_add_epi32(_mm512_slli_epi32(dot, 8), _mm512_load_si512(clo + 16 * r)); \
            if (quant::offset(T))                                                                    \
                dot = _mm512_add_epi32(dot, _mm512_set1_epi32(-quant::offset(T) * qx.isum[i]));     \
            const __m512 s = _mm512_mul_ps(d, _mm512_set1_ps(qx.scale[i]));                          \
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), s, acc[r]);                            \
            if (T == quant::kQ4_1) acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(qx.ssum[i]), acc[r]);  \
        }                                                                                            \
    } while (0)

// One panel (16 columns) against rows m0..m0 + rows - 1 (rows <= 16; the planes
// are zero past M). Software-pipelined by one block, with the tile registers and
// buffers alternating between even and odd blocks: block b's tile products run
// while block b - 1 is folded into the accumulators (its C tiles stored one step
// earlier), and a Q4 block's B tile is unpacked one step before it is loaded, so
// no load waits on a store just issued.
template <int32_t T, bool Wide>
void micro(const Job& job, const QuantX& qx, const Planes& a, int64_t p, int64_t m0, int rows,
           int nvalid) {
    const int64_t bb = quant::block_bytes(T), qb = quant::quant_bytes(T), nb = qx.nb;
    const uint8_t* blk0 = quant::block_at(*job.packed, p, 0);
    const __m512i lo4 = _mm512_set1_epi8(0x0f);
    alignas(64) uint8_t bt[2][512];
    alignas(64) int32_t c[2][2][kTileRows * 16];
    __m512 acc[kTileRows];
    LC_UNROLL for (int r = 0; r < kTileRows; ++r) acc[r] = _mm512_setzero_ps();
    const int8_t* ahi = a.hi + m0 * a.K;
    const uint8_t* alo = Wide ? a.lo + m0 * a.K : nullptr;
    auto unpack = [&](int64_t b) {
        const uint8_t* blk = blk0 + b * bb;
        uint8_t* dst = bt[b & 1];
        for (int t = 0; t < 4; ++t) {
            const __m512i v = _mm512_loadu_si512(blk + 64 * t);
            _mm512_store_si512(dst + 64 * t, _mm512_and_si512(v, lo4));
            _mm512_store_si512(dst + 64 * (t + 4), _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4));
        }
        LC_BARRIER();
    };
    if (T != quant::kQ8_0) unpack(0);
    for (int64_t b = 0; b < nb; ++b) {
        // Loads of a tile or from a tile's store wait for the older stores: so each
        // store has a block's work between it and the load that needs it.
        if (Wide && (b & 1)) LC_TILE_PRODUCTS(5, 6, 2, 3, 7, b);
        else if (Wide) LC_TILE_PRODUCTS(0, 1, 2, 3, 4, b);
        else if (b & 1) LC_TILE_PRODUCTS(1, 1, 3, 3, 5, b);
        else LC_TILE_PRODUCTS(0, 0, 2, 2, 4, b);
        if (T != quant::kQ8_0 && b + 1 < nb) unpack(b + 1);
        if (b > 0) LC_FOLD(b - 1);
        if (Wide && (b & 1)) LC_TILE_STORE(5, 6, b);
        else if (Wide) LC_TILE_STORE(0, 1, b);
        else if (b & 1) LC_TILE_STORE(1, 1, b);
        else LC_TILE_STORE(0, 0, b);
    }
    LC_FOLD(nb - 1);
    const int64_t c0 = p * weight::kPanel;
    LC_UNROLL for (int r = 0; r < kTileRows; ++r) {
        if (r >= rows) break;
        if (job.out_dtype == LC_DTYPE_F32 && nvalid == weight::kPanel) {
            const __m512 bias = job.bias ? _mm512_loadu_ps(job.bias + c0) : _mm512_setzero_ps();
            _mm512_storeu_ps(static_cast<float*>(job.out) + (m0 + r) * job.ldo + c0, _mm512_add_ps(acc[r], bias));
            continue;
        }
        alignas(64) float v[weight::kPanel];
        _mm512_store_ps(v, acc[r]);
        store_row(job, m0 + r, c0, v, nvalid);
    }
}

#undef LC_FOLD
#undef LC_TILE_PRODUCTS
#undef LC_TILE_STORE

template <bool Wide>
void run_type(const Job& job, const QuantX& qx, const Planes& a, int64_t p, int64_t m0, int rows,
              int nvalid) {
    switch (job.packed->qtype) {
        case quant::kQ8_0: return micro<quant::kQ8_0, Wide>(job, qx, a, p, m0, rows, nvalid);
        case quant::kQ4_0: return micro<quant::kQ4_0, Wide>(job, qx, a, p, m0, rows, nvalid);
        default: return micro<quant::kQ4_1, Wide>(job, qx, a, p, m0, rows, nvalid);
    }
}

}  // namespace

void run_quant_amx(const Job& job, const QuantX& qx) {
    thread_local PlaneBuf buf;
    const Planes a = make_planes(job, qx, buf);
    drive_quant<kTileRows>(
        job,
        [&](int64_t p, int64_t m0, int rows, int nvalid) {
            a.lo ? run_type<true>(job, qx, a, p, m0, rows, nvalid)
                 : run_type<false>(job, qx, a, p, m0, rows, nvalid);
        },
        [&] { configure_tiles(a.lo != nullptr); }, [] { _tile_release(); });
}

}  // namespace lc::linear

LC_ISA_END()

#else  // not x86-64: never selected

namespace lc::linear {
void run_quant_amx(const Job&, const QuantX&) {
    fail(LC_ERR_INTERNAL, "AMX quantized linear kernel called on a non-x86 build");
}
}  // namespace lc::linear

#endif
