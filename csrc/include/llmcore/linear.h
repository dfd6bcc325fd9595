/*
 * llmcore/linear.h -- linear layers, packed (and quantized) weights, and the
 * routed experts of mixture-of-experts layers.
 */
#ifndef LLMCORE_LINEAR_H
#define LLMCORE_LINEAR_H

#include "llmcore/runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ */
/* Linear layers                                                       */
/* ------------------------------------------------------------------ */
/*
 * out[M, N] = x[M, K] @ weight[N, K]^T (+ bias[N]), the projection of a
 * transformer layer (weight in the usual [out_features, in_features] layout).
 *
 *   x:      [M, K] float32, any row stride, unit last stride
 *   weight: [N, K] bfloat16 or float32, contiguous. bf16 weights are widened
 *           to fp32 in registers (a bf16 is the top half of an fp32), so a bf16
 *           model reads half the bytes per token of an fp32 one
 *   bias:   [N] float32 or bfloat16, or NULL for none
 *   out:    [M, N] float32 or bfloat16 (rounded to nearest even), any row
 *           stride, unit last stride; caller-allocated, must not overlap the
 *           inputs
 *
 * Products accumulate in fp32. All tensors are borrowed for the call. CPU
 * only for now: CUDA tensors return LC_ERR_UNSUPPORTED (stream is ignored).
 * The work is split over lc_get_num_threads() threads by columns of out, so
 * each thread reads its own rows of weight. */
LC_API lc_status lc_linear(const lc_tensor* x, const lc_tensor* weight, const lc_tensor* bias,
                           const lc_tensor* out, void* stream);

/*
 * Packed weights: a matrix copied once (at model load) into the layout the
 * linear kernels stream, so that no call repacks it. Panels of 16 output
 * columns, k-major; bf16 or fp32 as the source was; 2 MiB-aligned memory
 * marked for transparent huge pages. The layout is private to the core.
 *
 * lc_weight_pack: copies weight [N, K] (float32 or bfloat16, any row stride,
 * unit last stride, CPU) into a new lc_weight; the caller destroys it with
 * lc_weight_destroy and may free the source at once.
 * lc_weight_info: any of n, k, dtype (lc_dtype) and nbytes (memory held) may
 * be NULL.
 * lc_weight_rows: out[i] = W[rows[i]] for i < count (an embedding lookup on a
 * tied matrix): out [count, K] float32 or bfloat16; rows checked in [0, N).
 * lc_linear_packed: lc_linear with a packed weight; same x, bias, out rules.
 * A packed weight may be used by many threads at once (it is read only). */
typedef struct lc_weight lc_weight;

LC_API lc_status lc_weight_pack(const lc_tensor* weight, lc_weight** out);
LC_API void lc_weight_destroy(lc_weight* weight);
LC_API lc_status lc_weight_info(const lc_weight* weight, int64_t* n, int64_t* k, int32_t* dtype,
                                int64_t* nbytes);
LC_API lc_status lc_weight_rows(const lc_weight* weight, const int64_t* rows, int64_t count,
                                const lc_tensor* out);
LC_API lc_status lc_linear_packed(const lc_tensor* x, const lc_weight* weight,
                                  const lc_tensor* bias, const lc_tensor* out, void* stream);

/*
 * Which kernel family multiplies a packed bf16 weight, where the CPU has two
 * whose roundings differ (AMX: the tiles' tdpbf16ps and AVX512_BF16's
 * vdpbf16ps add a pair of products differently). Each family gives a row the
 * same result whatever M is, so a caller that always sends the same rows to
 * the same family gets results that do not depend on the batch; a server sends
 * the rows of generated tokens (decode: one row per sequence, bound by the
 * weight's bytes) to LC_LINEAR_KERNEL_DOT and prompt rows (compute-bound) to
 * LC_LINEAR_KERNEL_TILES. LC_LINEAR_KERNEL_AUTO is lc_linear_packed's choice:
 * the tiles where usable, at every M. Quantized and fp32 weights have one
 * family (the AMX-INT8 tiles give the VNNI kernel's bits), so the choice does
 * not change their results; on a CPU without the tiles every value runs the
 * dot kernels.
 * lc_linear_packed_kernel: lc_linear_packed with that choice; any other value
 * is LC_ERR_INVALID_ARGUMENT.
 */
typedef enum lc_linear_kernel {
    LC_LINEAR_KERNEL_AUTO = 0,
    LC_LINEAR_KERNEL_DOT = 1,
    LC_LINEAR_KERNEL_TILES = 2
} lc_linear_kernel;

LC_API lc_status lc_linear_packed_kernel(const lc_tensor* x, const lc_weight* weight,
                                         const lc_tensor* bias, const lc_tensor* out,
                                         int32_t kernel, void* stream);

/*
 * Quantized packed weights: a GGUF matrix kept in its own block format, so a
 * decode step reads 4.5-8.5 bits per weight instead of 16.
 *
 * lc_weight_pack_quant: blocks holds W [N, K] as GGUF stores it: N rows, each
 * K/B consecutive blocks of `type` (ggml's block_q8_0, block_q4_0,
 * block_q4_1, block_q5_0, block_q5_1: B = 32 weights of 34, 18, 20, 22, 24
 * bytes; block_q4_K, block_q5_K, block_q6_K: B = 256 weights of 144, 176,
 * 210 bytes), K a multiple of B, nbytes = N * K/B * block size; anything
 * else is LC_ERR_INVALID_ARGUMENT. The packed copy holds 4.5 (q4_0) to 8.5
 * (q8_0) bits per weight: q4_k 4.625, q5_k 5.625, q6_k 6.5625, the others as
 * GGUF's. The blocks are copied (repacked into the kernels' layout; the caller
 * may free them at once) into a new lc_weight, destroyed with
 * lc_weight_destroy like any other. lc_weight_info reports dtype F32 for it
 * (the type of what lc_weight_rows writes) and nbytes of the packed copy.
 * lc_weight_quant_type: the weight's lc_quant_type, 0 for a float weight.
 *
 * lc_linear_packed with a quantized weight: each row of x is quantized per
 * block of 32 to int16 (scale max|x| / 32767, round to nearest; the default)
 * or int8 (max|x| / 127, as llama.cpp's q8 activations), the products are
 * exact integer dot products per block, scaled into fp32 sums: the result is
 * W (dequantized exactly) times x as rounded, within fp32 rounding, the same
 * bits on every instruction set (AVX512_VNNI, AVX2, scalar). lc_weight_rows
 * dequantizes the rows it gathers. CPU only, as every lc_weight.
 * lc_set_quant_activation_bits: 16 or 8 (else LC_ERR_INVALID_ARGUMENT), for
 * every later quantized call in the process; int16 rounds x 256 times more
 * finely at about the same speed with AVX512_VNNI (two vpdpwssd for one
 * vpdpbusd, the loads shared), ~1.3x the int8 cost with AVX2. */
typedef enum {
    LC_QUANT_Q4_0 = 2,
    LC_QUANT_Q4_1 = 3,
    LC_QUANT_Q5_0 = 6,
    LC_QUANT_Q5_1 = 7,
    LC_QUANT_Q8_0 = 8,
    LC_QUANT_Q4_K = 12,
    LC_QUANT_Q5_K = 13,
    LC_QUANT_Q6_K = 14
} lc_quant_type;

LC_API lc_status lc_weight_pack_quant(int32_t type, const void* blocks, int64_t nbytes, int64_t n,
                                      int64_t k, lc_weight** out);
LC_API lc_status lc_weight_quant_type(const lc_weight* weight, int32_t* type);
LC_API lc_status lc_set_quant_activation_bits(int32_t bits);
LC_API int32_t lc_get_quant_activation_bits(void);

/* ------------------------------------------------------------------ */
/* Mixture-of-experts layers                                           */
/* ------------------------------------------------------------------ */
/*
 * lc_moe_experts: the routed SiLU-gated experts of an MoE layer (Qwen3-MoE,
 * Mixtral) in one call; the router (softmax, top-k, renormalisation) stays
 * with the caller:
 *
 *   out[t] = sum_{j < k} topk_weights[t, j] * down_e(silu(g) * u),
 *            [g | u] = gate_up_e(x[t]),  e = topk_ids[t, j]
 *
 *   x:            [T, H] float32, any row stride, unit last stride
 *   topk_ids:     T * k expert indices, row-major [T][k], contiguous, host
 *                 memory; int32 (ids_bytes 4) or int64 (ids_bytes 8); each in
 *                 [0, num_experts), else LC_ERR_INVALID_ARGUMENT naming the
 *                 first bad one. A repeated id in a row is allowed and counts
 *                 once per occurrence (routers never repeat one)
 *   topk_weights: [T, k] float32, k >= 1, any row stride, unit last stride
 *   gate_up:      num_experts packed weights [2I, H]: the gate rows, then the
 *                 up rows
 *   down:         num_experts packed weights [H, I]
 *   out:          [T, H] float32, any row stride, unit last stride; x itself
 *                 or not overlapping any input
 *
 * Every expert must have the same shapes (checked); each matrix may be of
 * any packed format (lc_weight_pack, lc_weight_pack_quant), mixed freely.
 * The routed rows are gathered by expert and each used expert's products run
 * as one multi-row packed linear, so a step reads each used expert's weights
 * once. A token's k terms are added in the order of its top-k list, and a
 * row's products do not depend on the rows routed beside it: out[t] has the
 * same bits whatever else is in the batch and whatever the thread count.
 * Quantized experts give the same bits on every instruction set; float ones
 * agree within fp32 rounding (FMA or not, and bf16 activations with
 * AVX512_BF16, as lc_linear_packed). The call uses T * k * (H + 2I) floats
 * of scratch, kept per calling thread between calls up to 64 MiB (larger ones
 * are freed at return). CPU only: CUDA tensors return LC_ERR_UNSUPPORTED.
 * All arguments are borrowed. */
LC_API lc_status lc_moe_experts(const lc_tensor* x, const void* topk_ids, int32_t ids_bytes,
                                const lc_tensor* topk_weights, const lc_weight* const* gate_up,
                                const lc_weight* const* down, int32_t num_experts,
                                const lc_tensor* out);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* LLMCORE_LINEAR_H */
