// lc_paged_attention: the C entry point. Validates once at the boundary,
// then runs the CPU kernel or hands over to the CUDA one.
#include "attention/attention_check.h"
#include "attention/attention_cpu.h"
#include "runtime/cuda_api.h"
#include "runtime/internal.h"

extern "C" {

lc_status lc_paged_attention(const lc_attn_plan* plan, const lc_tensor* q, const lc_tensor* k_cache,
                             const lc_tensor* v_cache, const lc_tensor* out,
                             const lc_attn_params* params, void* stream) {
    return lc::guard([&] {
        lc::attn::check_paged_attention(plan, q, k_cache, v_cache, out, params);
        if (plan->device == LC_DEVICE_CUDA) {
#if defined(LLMCORE_WITH_CUDA)
            lc::cuda::paged_attention(*plan, *q, *k_cache, *v_cache, *out, *params, stream);
#else
            lc::fail(LC_ERR_UNSUPPORTED, "this llmcore build has no CUDA support");
#endif
            return;
        }
        lc::attn::paged_attention_cpu(*plan, *q, *k_cache, *v_cache, *out, *params);
    });
}

}  // extern "C"
