// The packed linear on the K family (weight_kquant.h: Q4_K, Q5_K, Q6_K, Q5_0,
// Q5_1): linear_quant.h's driver, activations and per-block formula, with the
// block's scale and min taken from the unit header. Per 32-block and half h
// (Q6_K has two 16-element halves with their own scales; the others one):
//   dot_h = sum_e u_e q_e - off * sum_e q_e      an exact int32
//   acc  = fma(float(dot_h), scale_h * s, acc)   scale_h = d (Q5_0/1), D * sc
//   acc  = fma(min, s * sum_e q_e, acc)          Q5_1 (m), Q4_K/Q5_K (-(Dmin * mn))
// in that order, every fp32 product rounded as the scalar one rounds it
// (D * sc and Dmin * mn are exact), so every variant gives its bits. The two
// halves' integer dots are kept apart: Q6_K's int8 scales times a 16-element
// dot already use 31 bits.
//
// Each variant's microkernel rebuilds group g's bytes (four consecutive quants
// of a column per 32-bit lane) from the nibbles and the high-bit plane, then
// meets every row of the block: int16 activations as the words (u0, u2),
// (u1, u3) of a lane (vpdpwssd / vpmaddwd), int8 ones as the lane's four bytes
// (vpdpbusd / vpmaddubsw: u < 64, so a pair's products fit s16).
#pragma once

#include "linear/linear_quant.h"
#include "weight/weight_kquant.h"

namespace lc::linear {

namespace {  // internal linkage: each ISA's translation unit gets its own copy

// sum(q) over half h of block i (the whole block when a block has one scale).
template <int H>
inline int32_t half_isum(const QuantX& qx, int64_t i, int h) {
    if (H == 1) return qx.isum[i];
    return h == 0 ? qx.hsum[i] : qx.isum[i] - qx.hsum[i];
}

// dispatch_rows for the K family's types.
template <int MR, template <int32_t, int> class Micro, int R = 1, class... A>
void dispatch_krows(int32_t t, int rows, A&&... args) {
    if constexpr (R < MR) {
        if (rows != R) return dispatch_krows<MR, Micro, R + 1>(t, rows, args...);
    }
    switch (t) {
        case quant::kQ5_0: return Micro<quant::kQ5_0, R>::run(args...);
        case quant::kQ5_1: return Micro<quant::kQ5_1, R>::run(args...);
        case quant::kQ4_K: return Micro<quant::kQ4_K, R>::run(args...);
        case quant::kQ5_K: return Micro<quant::kQ5_K, R>::run(args...);
        default: return Micro<quant::kQ6_K, R>::run(args...);
    }
}

}  // namespace

}  // namespace lc::linear
