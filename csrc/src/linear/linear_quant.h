// The packed linear on quantized weights (weight_quant.h): one driver and one
// per-block formula, each instruction set supplying only its microkernel.
//
// Activations are quantized per row and block of 32 to int16 (q = round(x / s),
// s = max|x| / 32767; the default) or int8 (s = max|x| / 127, as llama.cpp's q8
// path) with the block's integer sum kept, so that per block
//   sum_e w_e x_e = d * s * (sum_e u_e q_e - off * sum_e q_e)   (Q8_0, Q4_0)
//                 = d * s * sum_e u_e q_e + m * (s * sum_e q_e)  (Q4_1)
// with the bracket an exact integer (int8: vpdpbusd, u8 x s8 -> s32; int16:
// vpdpwssd / vpmaddwd, s16 x s16 pairs -> s32, the u8 quants taken as words: a
// 32-bit lane's four quants u0..u3 are the words (u0, u2) and (u1, u3), met by
// the activations stored in that order). Every variant
// accumulates the block terms in the same order with the same fp32 roundings
// (d * s, then one fused multiply-add per term), so they agree with the scalar
// one to the last bit unless the compiler reorders nothing it may not.
//
// The work is split as in the float packed kernels: each thread takes a range
// of panels, visits them in L2-sized groups, and each block of MR x rows passes
// over a group (a decode step streams the weight once).
#pragma once

#include <algorithm>
#include <cstdint>

#include "linear/linear.h"
#include "weight/weight_quant.h"

namespace lc::linear {

// The activations of one call, quantized: row m, block b at index m * nb + b.
struct QuantX {
    const int8_t* q;      // [M][K] (int8 activations), or null
    const int16_t* q16;   // [M][K] (int16), each 4 as x0 x2 x1 x3 (x16_index), or null
    const float* scale;   // s
    const float* ssum;    // s * sum(q), for the Q4_1 min term
    const int32_t* isum;  // sum(q)
    const int32_t* hsum;  // sum(q) of the block's first 16 (Q6_K's half-block scales)
    int64_t nb;           // blocks per row (K / 32)
};

// Where element e of a block sits in the int16 activations: within each 4,
// the order x0 x2 x1 x3.
inline int x16_index(int e) { return (e & ~3) | ((e & 1) << 1) | ((e >> 1) & 1); }

// The activation width quantized linears use (16 or 8; process-wide).
int quant_activation_bits();
void set_quant_activation_bits(int bits);

// The activations' storage one call fills: blocks [i0, i1) of x (block i = row i / nb,
// columns 32 * (i % nb) ...), each quantized as the scalar quantize_blocks_scalar does; every
// variant gives the same bits (the same fp32 max, division and product, rounded to nearest
// even as lrint does, then clamped to +-qmax).
struct QuantXOut {
    int8_t* q;     // bits == 8
    int16_t* q16;  // bits == 16, in x16_index order
    float* scale;
    float* ssum;
    int32_t* isum;
    int32_t* hsum;
};
using QuantizeBlocks = void (*)(const float* x, int64_t ldx, int64_t nb, int64_t i0, int64_t i1,
                                int bits, const QuantXOut& out);
void quantize_blocks_scalar(const float* x, int64_t ldx, int64_t nb, int64_t i0, int64_t i1,
                            int bits, const QuantXOut& out);
void quantize_blocks_avx2(const float* x, int64_t ldx, int64_t nb, int64_t i0, int64_t i1,
                          int bits, const QuantXOut& out);
void quantize_blocks_avx512(const float* x, int64_t ldx, int64_t nb, int64_t i0, int64_t i1,
                            int bits, const QuantXOut& out);

void run_quant_scalar(const Job& job, const QuantX& qx);
void run_quant_avx2(const Job& job, const QuantX& qx);
void run_quant_avx512(const Job& job, const QuantX& qx);  // AVX512_VNNI
// AMX-INT8 tiles (Q8_0, Q4_0, Q4_1): the same bits as run_quant_avx512, faster from
// kAmxMinRows rows on (linear_quant_amx.cpp).
void run_quant_amx(const Job& job, const QuantX& qx);
constexpr int64_t kAmxMinRows = 16;
// The K family (weight_kquant.h): linear_kquant*.cpp.
void run_kquant_scalar(const Job& job, const QuantX& qx);
void run_kquant_avx2(const Job& job, const QuantX& qx);
void run_kquant_avx512(const Job& job, const QuantX& qx);
// Quantizes job.x, picks the variant (current_isa(); avx512 needs AVX512_VNNI) and runs it.
void run_quant(const Job& job);
// Whether this CPU has AVX512_VNNI (the avx512 variant; else avx2 runs in its place).
bool cpu_has_avx512_vnni();

namespace {  // internal linkage: each ISA's translation unit gets its own copy

struct NoHook {
    void operator()() const {}
};

// Calls micro(panel, m0, rows, valid columns) over the job's panels and rows
// in cache-friendly order, spread over the worker pool; each worker calls enter()
// before its share and leave() after (the tile kernels load and release their
// tile configuration there).
template <int MR, class Micro, class Enter = NoHook, class Leave = NoHook>
void drive_quant(const Job& job, Micro&& micro, Enter enter = {}, Leave leave = {}) {
    const lc_weight& w = *job.packed;
    const int64_t panel_bytes = quant::panel_bytes(w.qtype, job.K);
    const int64_t group = std::max<int64_t>(1, (int64_t(192) << 10) / panel_bytes);
    for_tiles(job, w.panels, job.M * job.K * weight::kPanel, [&](int64_t p0, int64_t p1) {
        enter();
        for (int64_t g0 = p0; g0 < p1; g0 += group) {
            const int64_t g1 = std::min(p1, g0 + group);
            for (int64_t m0 = 0; m0 < job.M; m0 += MR) {
                const int rows = int(std::min<int64_t>(MR, job.M - m0));
                for (int64_t p = g0; p < g1; ++p)
                    micro(p, m0, rows,
                          int(std::min<int64_t>(weight::kPanel, job.N - p * weight::kPanel)));
            }
        }
        leave();
    });
}

// micro<T, R>(args...) for the weight's type T and R = rows (1..MR), chosen at run time.
template <int MR, template <int32_t, int> class Micro, int R = 1, class... A>
void dispatch_rows(int32_t t, int rows, A&&... args) {
    if constexpr (R < MR) {
        if (rows != R) return dispatch_rows<MR, Micro, R + 1>(t, rows, args...);
    }
    if (t == quant::kQ8_0)
        Micro<quant::kQ8_0, R>::run(args...);
    else if (t == quant::kQ4_0)
        Micro<quant::kQ4_0, R>::run(args...);
    else
        Micro<quant::kQ4_1, R>::run(args...);
}

}  // namespace

}  // namespace lc::linear
