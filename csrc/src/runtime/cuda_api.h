// Internal entry points of the CUDA kernels (csrc/cuda/). The C ABI functions
// in csrc/src dispatch here when their tensors live on a CUDA device. Only
// declared when the build has CUDA (LLMCORE_WITH_CUDA). Arguments have been
// validated by the caller; these functions throw lc::Error on CUDA failures.
#pragma once

#include "attention/attn_plan.h"
#include "llmcore/llmcore.h"

#if defined(LLMCORE_WITH_CUDA)
namespace lc::cuda {

// Uploads the plan's host arrays into plan->device_buffer on `stream`.
void plan_upload(lc_attn_plan* plan, void* stream);
// Frees plan->device_buffer (no-op when null).
void plan_release(lc_attn_plan* plan);

void kv_store(const lc_attn_plan& plan, const lc_tensor& k, const lc_tensor& v,
              const lc_tensor& k_cache, const lc_tensor& v_cache, void* stream);

void paged_attention(const lc_attn_plan& plan, const lc_tensor& q, const lc_tensor& k_cache,
                     const lc_tensor& v_cache, const lc_tensor& out, const lc_attn_params& params,
                     void* stream);

// Host-side batch description; outputs are host buffers (copied back and
// synchronized on `stream` before returning).
void sample(const lc_tensor& logits, const lc_sampling_batch& batch, void* stream,
            lc_sample_output& out);

}  // namespace lc::cuda
#endif
