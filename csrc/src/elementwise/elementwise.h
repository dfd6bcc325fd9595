// The small per-token operations between a transformer layer's matmuls: RMS
// norm (with the residual add folded in), SiLU-gated product, rotary
// embedding. Validated once (elementwise.cpp); the kernels only compute, one
// row of the flattened batch at a time. The AVX2 variants are picked at run
// time (AVX-512F, else AVX2; LLMCORE_ELEMENTWISE_ISA=scalar|avx2 caps the choice).
#pragma once

#include <cstdint>

#include "runtime/cpu_isa.h"
#include "runtime/internal.h"

namespace lc::elementwise {

// One row: if res, res[i] += x[i] and the sum is normalised; out may be x.
// weight is fp32 (bf16 weights are widened by the caller).
using RmsRowFn = void (*)(const float* x, float* res, const float* weight, float eps, int64_t n,
                          float* out);
// out[i] = silu(gate[i]) * up[i].
using SiluMulRowFn = void (*)(const float* gate, const float* up, int64_t n, float* out);

// One head rotated in place: x[i], x[half + i] = x[i] c[i] - x[half + i] s[i],
// x[half + i] c[i] + x[i] s[i] (two products and a sum each, never fused).
using RopeHeadFn = void (*)(float* x, const float* cos, const float* sin, int64_t half);

struct Kernels {
    RmsRowFn rms_row;
    SiluMulRowFn silu_mul_row;
    RopeHeadFn rope_head;
};

const Kernels& scalar_kernels();
const Kernels& avx2_kernels();    // only called when the CPU runs AVX2 + FMA
const Kernels& avx512_kernels();  // only called when the CPU runs AVX-512F

// The variant current_isa() selects.
const Kernels& kernels();

Isa set_isa(Isa isa);
Isa current_isa();

}  // namespace lc::elementwise
