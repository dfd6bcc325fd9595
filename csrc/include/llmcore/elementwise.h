/*
 * llmcore/elementwise.h -- the elementwise operations of a decoder layer (RMS
 * norm, SiLU-gated product, rotary embedding).
 */
#ifndef LLMCORE_ELEMENTWISE_H
#define LLMCORE_ELEMENTWISE_H

#include "llmcore/runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ */
/* Elementwise operations of a decoder layer                           */
/* ------------------------------------------------------------------ */
/*
 * The small operations between a layer's matmuls, one call per layer instead
 * of a handful of framework ops. Rows of the flattened batch are independent;
 * all tensors are float32 on the CPU, 2-D [T, H] with any row stride and a
 * unit last stride, borrowed for the call.
 *
 * lc_rms_norm: out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * weight (weight [H]
 * float32 or bfloat16). With a residual ([T, H], not x or out): first
 * residual[t] += x[t], then residual[t] is normalised into out[t], the
 * "add, then norm" of a pre-norm layer. out may be x.
 *
 * lc_silu_mul: out[t, i] = silu(x[t, i]) * x[t, I + i] for x [T, 2I] (gate
 * columns, then up columns), out [T, I].
 *
 * lc_rope: rotary embedding in place, rotate-half (NeoX) layout: q [T, Hq, D]
 * and k [T, Hk, D] (k may be NULL; any strides, unit last stride) are rotated
 * by the angles whose cosines and sines are the rows cos, sin [T, D/2] (one
 * row per token, gathered by the caller for the token's position). */
LC_API lc_status lc_rms_norm(const lc_tensor* x, const lc_tensor* residual,
                             const lc_tensor* weight, float eps, const lc_tensor* out);
LC_API lc_status lc_silu_mul(const lc_tensor* x, const lc_tensor* out);
LC_API lc_status lc_rope(const lc_tensor* q, const lc_tensor* k, const lc_tensor* cos,
                         const lc_tensor* sin);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* LLMCORE_ELEMENTWISE_H */
