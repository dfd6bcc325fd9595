// lc_kv_store: scatter new K/V rows into their slots of the paged caches.
#include <algorithm>
#include <cstring>

#include "attention/attention_check.h"
#include "runtime/cuda_api.h"
#include "runtime/internal.h"

namespace {

// One row of head_size elements, converted to the cache dtype.
void copy_row(const void* src, int32_t src_dtype, void* dst, int32_t dst_dtype, int32_t n) {
    if (src_dtype == dst_dtype) {
        std::memcpy(dst, src, size_t(n) * lc::dtype_size(src_dtype));
    } else if (dst_dtype == LC_DTYPE_BF16) {
        const float* s = static_cast<const float*>(src);
        uint16_t* d = static_cast<uint16_t*>(dst);
        for (int32_t i = 0; i < n; ++i) d[i] = lc::f32_to_bf16(s[i]);
    } else {
        const uint16_t* s = static_cast<const uint16_t*>(src);
        float* d = static_cast<float*>(dst);
        for (int32_t i = 0; i < n; ++i) d[i] = lc::bf16_to_f32(s[i]);
    }
}

// Writes k (or v) rows [begin, end) into cache.
void store_rows(const lc_attn_plan& plan, const lc_tensor& x, const lc_tensor& cache,
                const lc::attn::CacheGeometry& g, int64_t begin, int64_t end) {
    const size_t xs = lc::dtype_size(x.dtype), cs = lc::dtype_size(cache.dtype);
    const int64_t head_stride = int64_t(g.block_size) * g.head_size;
    for (int64_t t = begin; t < end; ++t) {
        const int64_t slot = plan.slot_mapping[size_t(t)];
        if (slot < 0) continue;
        const int64_t block = slot / g.block_size, off = slot % g.block_size;
        for (int32_t h = 0; h < g.num_kv_heads; ++h) {
            const char* src =
                static_cast<const char*>(x.data) + (t * x.strides[0] + h * x.strides[1]) * xs;
            char* dst = static_cast<char*>(cache.data) +
                        ((block * g.num_kv_heads + h) * head_stride + off * g.head_size) * cs;
            copy_row(src, x.dtype, dst, cache.dtype, g.head_size);
        }
    }
}

}  // namespace

extern "C" {

lc_status lc_kv_store(const lc_attn_plan* plan, const lc_tensor* k, const lc_tensor* v,
                      const lc_tensor* k_cache, const lc_tensor* v_cache, void* stream) {
    return lc::guard([&] {
        const lc::attn::CacheGeometry g = lc::attn::check_kv_store(plan, k, v, k_cache, v_cache);
        if (plan->device == LC_DEVICE_CUDA) {
#if defined(LLMCORE_WITH_CUDA)
            lc::cuda::kv_store(*plan, *k, *v, *k_cache, *v_cache, stream);
#else
            lc::fail(LC_ERR_UNSUPPORTED, "this llmcore build has no CUDA support");
#endif
            return;
        }
        const int64_t n = plan->num_tokens;
        // Rows are independent (distinct valid slots); small stores stay on
        // the calling thread.
        const int64_t grain =
            std::max<int64_t>(1, (int64_t(1) << 15) / (int64_t(g.num_kv_heads) * g.head_size));
        lc::parallel_for(n, grain, [&](int64_t b, int64_t e) {
            store_rows(*plan, *k, *k_cache, g, b, e);
            store_rows(*plan, *v, *v_cache, g, b, e);
        });
    });
}

}  // extern "C"
