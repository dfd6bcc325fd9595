// KV store: row t of the new K/V goes to slot slot_mapping[t] of the paged
// caches, converted to the cache dtype; negative slots are skipped.
//
//   cache[block][kv_head][offset][:]   block = slot / block_size, offset = slot % block_size
#include "attention/attn_plan.h"
#include "cuda_util.cuh"
#include "runtime/cuda_api.h"

namespace lc::cuda {

namespace {

constexpr int kStoreThreads = 128;

struct StoreArgs {
    const void* k;
    const void* v;
    int32_t k_dtype, v_dtype;
    int64_t k_st, k_sh, v_st, v_sh;  // source strides: token, head (elements)
    void* k_cache;
    void* v_cache;
    int64_t kc_sb, kc_sh, kc_ss;  // cache strides: block, head, slot
    int64_t vc_sb, vc_sh, vc_ss;
    const int64_t* slot_mapping;
    int32_t num_kv_heads, head_size, block_size;
};

// One thread block per token: its num_kv_heads * head_size K and V elements.
template <class CacheT>
__global__ void __launch_bounds__(kStoreThreads) kv_store_kernel(const StoreArgs a) {
    const int64_t t = blockIdx.x;
    const int64_t slot = a.slot_mapping[t];
    if (slot < 0) return;
    const int64_t block = slot / a.block_size;
    const int64_t offset = slot % a.block_size;
    CacheT* kc = static_cast<CacheT*>(a.k_cache) + block * a.kc_sb + offset * a.kc_ss;
    CacheT* vc = static_cast<CacheT*>(a.v_cache) + block * a.vc_sb + offset * a.vc_ss;
    const int n = a.num_kv_heads * a.head_size;
    for (int i = threadIdx.x; i < n; i += kStoreThreads) {
        const int h = i / a.head_size, d = i % a.head_size;
        const float kx = load_any(a.k, a.k_dtype, t * a.k_st + h * a.k_sh + d);
        const float vx = load_any(a.v, a.v_dtype, t * a.v_st + h * a.v_sh + d);
        kc[h * a.kc_sh + d] = from_float<CacheT>(kx);
        vc[h * a.vc_sh + d] = from_float<CacheT>(vx);
    }
}

}  // namespace

void kv_store(const lc_attn_plan& plan, const lc_tensor& k, const lc_tensor& v,
              const lc_tensor& k_cache, const lc_tensor& v_cache, void* stream) {
    if (plan.num_tokens == 0) return;
    require(plan.d_slot_mapping != nullptr, "kv_store: the plan was not uploaded to a CUDA device");
    require(k_cache.dtype == v_cache.dtype, "kv_store: k_cache and v_cache dtypes differ");
    if (k_cache.dtype != LC_DTYPE_F32 && k_cache.dtype != LC_DTYPE_BF16)
        fail(LC_ERR_UNSUPPORTED, "kv_store: CUDA caches must be float32 or bfloat16");
    const DeviceGuard guard(k_cache.device_id);

    StoreArgs a{};
    a.k = k.data;
    a.v = v.data;
    a.k_dtype = k.dtype;
    a.v_dtype = v.dtype;
    a.k_st = k.strides[0], a.k_sh = k.strides[1];
    a.v_st = v.strides[0], a.v_sh = v.strides[1];
    a.k_cache = k_cache.data;
    a.v_cache = v_cache.data;
    a.kc_sb = k_cache.strides[0], a.kc_sh = k_cache.strides[1], a.kc_ss = k_cache.strides[2];
    a.vc_sb = v_cache.strides[0], a.vc_sh = v_cache.strides[1], a.vc_ss = v_cache.strides[2];
    a.slot_mapping = plan.d_slot_mapping;
    a.num_kv_heads = int32_t(k_cache.shape[1]);
    a.block_size = int32_t(k_cache.shape[2]);
    a.head_size = int32_t(k_cache.shape[3]);
    if (a.num_kv_heads == 0 || a.head_size == 0) return;

    const dim3 grid(unsigned(plan.num_tokens));
    const cudaStream_t s = as_stream(stream);
    if (k_cache.dtype == LC_DTYPE_BF16)
        kv_store_kernel<__nv_bfloat16><<<grid, kStoreThreads, 0, s>>>(a);
    else
        kv_store_kernel<float><<<grid, kStoreThreads, 0, s>>>(a);
    LC_CUDA_CHECK_LAUNCH("kv_store_kernel");
}

}  // namespace lc::cuda
