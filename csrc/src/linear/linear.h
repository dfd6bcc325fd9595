// Dense linear layers on the CPU: out[M,N] = x[M,K] @ W[N,K]^T (+ bias[N]).
//
// The arguments are validated once (linear.cpp) and turned into a Job; the
// kernels (one translation unit per instruction set) only compute. Weights
// stay in the caller's layout: W row n is the K-vector of output column n,
// stored as bf16 bits or fp32, and bf16 is widened to fp32 in registers (a
// bf16 is the top half of an fp32), so a bf16 model reads half the bytes.
//
// Two shapes of work:
//   small M (decode): each thread streams its own rows of W once; a tile of
//     W rows is converted once per k-step and multiplied against every x row
//     of a block of rows (dot products, horizontal sums at the end);
//   large M (batches, prefill): W is packed in panels of 16 columns,
//     transposed to [K][16] fp32 in a per-thread buffer that stays in L2, and
//     a 6x16 register-blocked microkernel walks K for every block of 6 rows.
#pragma once

#include "runtime/cpu_isa.h"

#include <algorithm>
#include <cstdint>

#include "runtime/internal.h"
#include "weight/weight.h"

// Loops over register-resident arrays are unrolled early, so that the arrays become
// registers (otherwise GCC keeps a memory copy of the accumulators, updated every k).
#if defined(__clang__)
#define LC_UNROLL _Pragma("unroll")
#else
#define LC_UNROLL _Pragma("GCC unroll 16")
#endif

namespace lc::linear {

struct Job {
    const float* x;      // [M][ldx]
    const lc_weight* packed;  // set: W is this packed matrix (w and w_dtype describe its data)
    int64_t ldx;
    const void* w;       // [N][K], contiguous; bf16 bits or fp32
    int32_t w_dtype;     // LC_DTYPE_BF16 or LC_DTYPE_F32
    const float* bias;   // [N] fp32 (bf16 bias is widened before the kernels) or nullptr
    void* out;           // [M][ldo]
    int64_t ldo;
    int32_t out_dtype;   // LC_DTYPE_F32 or LC_DTYPE_BF16
    int64_t M, N, K;
    // Sum every row in one order whatever M is, so that a row's result does not
    // depend on the rows beside it (the MoE op: an expert's row count depends on the
    // batch). Only the AVX2 packed kernel splits the sum of 1-2 rows otherwise; the
    // other kernels always do.
    bool fixed_order;
    int32_t kernel;  // lc_linear_kernel: which family a packed bf16 W runs where there are two
};

using Isa = lc::Isa;
using lc::isa_name;

// Runs the job over all threads. One definition per instruction set.
void run_scalar(const Job& job);
void run_avx2(const Job& job);
// The same for a packed W (job.packed; see weight.h for the layout).
void run_packed_scalar(const Job& job);
void run_packed_avx2(const Job& job);
// Packed bf16 W on CPUs with AVX512_BF16: activations rounded to bf16, bf16 dot
// products into fp32 (vdpbf16ps). Used for every M, so a row's result never
// depends on how many rows share the call (batch invariance); at M = 1 it reads
// W as fast as the AVX2 kernel (measured 0.9-1.2x), from M = 4 on it is faster.
void run_packed_bf16_avx512(const Job& job);
// Packed bf16 W on the AMX tiles (tdpbf16ps; isa kAmx, amx_usable()): the same
// bf16 activations. tdpbf16ps does not round as vdpbf16ps does (most results
// differ in the last bits), so where the tiles are usable this kernel serves
// every M, decode included, and a row's result still never depends on M. The
// price is decode: at M = 1-2 the mid-sized projections take ~1.6x the
// vdpbf16ps kernel's time (tile loads stream fewer bytes per second), even at
// M = 4, faster from 8 on (measurements in linear_bf16_amx.cpp).
void run_packed_bf16_amx(const Job& job);

// Runs a validated job (bias already fp32 or null) with the kernel the current
// instruction set and the weight's format select; M, N > 0.
void dispatch(const Job& job);

// The best instruction set this CPU runs and the build compiled.
Isa best_isa();
// Caps the instruction set used from now on (tests run every variant);
// returns the one in effect, min(requested, best_isa()).
Isa set_isa(Isa isa);
Isa current_isa();

// Rows at or below which the small-M (dot product) kernel is used.
constexpr int64_t kSmallM = 8;

// Stores `count` results of one output row starting at column n0, adding the
// bias; the only place that knows the output dtype.
inline void store_row(const Job& job, int64_t m, int64_t n0, const float* v, int64_t count) {
    if (job.out_dtype == LC_DTYPE_BF16) {
        uint16_t* o = static_cast<uint16_t*>(job.out) + m * job.ldo + n0;
        for (int64_t c = 0; c < count; ++c)
            o[c] = f32_to_bf16(v[c] + (job.bias ? job.bias[n0 + c] : 0.0f));
    } else {
        float* o = static_cast<float*>(job.out) + m * job.ldo + n0;
        for (int64_t c = 0; c < count; ++c) o[c] = v[c] + (job.bias ? job.bias[n0 + c] : 0.0f);
    }
}

// Splits `units` work units (tiles of W rows) over the worker pool so that
// each chunk does at least ~kMinChunkMacs multiply-adds; fn(begin, end).
template <class F>
void for_tiles(const Job& job, int64_t units, int64_t macs_per_unit, F&& fn) {
    constexpr int64_t kMinChunkMacs = 1 << 16;
    const int64_t grain = std::max<int64_t>(1, kMinChunkMacs / std::max<int64_t>(1, macs_per_unit));
    parallel_for(units, grain, fn);
}

}  // namespace lc::linear
