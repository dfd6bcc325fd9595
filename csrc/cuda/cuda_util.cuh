// Shared pieces of the CUDA kernels: error checking that turns CUDA failures
// into lc::Error, a scoped device switch, stream-ordered scratch memory, and
// dtype-generic element and vector access.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "runtime/internal.h"

namespace lc::cuda {

// Throws lc::Error for a failed CUDA call: LC_ERR_OUT_OF_MEMORY for failed
// allocations, LC_ERR_INTERNAL otherwise. The non-sticky error state is
// cleared so that later calls on this thread do not report it again.
inline void check(cudaError_t err, const char* what) {
    if (err == cudaSuccess) return;
    (void)cudaGetLastError();
    const lc_status status =
        err == cudaErrorMemoryAllocation ? LC_ERR_OUT_OF_MEMORY : LC_ERR_INTERNAL;
    fail(status, std::string("CUDA error in ") + what + ": " + cudaGetErrorName(err) + " (" +
                     cudaGetErrorString(err) + ")");
}

#define LC_CUDA_CHECK(expr) ::lc::cuda::check((expr), #expr)
// After a kernel launch: reports launch-configuration errors immediately.
#define LC_CUDA_CHECK_LAUNCH(name) ::lc::cuda::check(cudaGetLastError(), name)

inline cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

// Makes `device` current for a scope and restores the caller's device after:
// kernels launch on the current device, which need not be the tensors' one.
class DeviceGuard {
   public:
    explicit DeviceGuard(int device) {
        LC_CUDA_CHECK(cudaGetDevice(&prev_));
        if (prev_ != device) {
            LC_CUDA_CHECK(cudaSetDevice(device));
            switched_ = true;
        }
    }
    ~DeviceGuard() {
        if (switched_) (void)cudaSetDevice(prev_);
    }
    DeviceGuard(const DeviceGuard&) = delete;
    DeviceGuard& operator=(const DeviceGuard&) = delete;

   private:
    int prev_ = 0;
    bool switched_ = false;
};

// Stream-ordered scratch memory for one call: allocated on `stream`, freed on
// the same stream when the scope ends, so the free is ordered after every
// kernel that the scope enqueued (also when an exception unwinds it).
class StreamBuffer {
   public:
    StreamBuffer(size_t bytes, cudaStream_t stream) : stream_(stream) {
        if (bytes) LC_CUDA_CHECK(cudaMallocAsync(&ptr_, bytes, stream));
    }
    ~StreamBuffer() {
        if (ptr_) (void)cudaFreeAsync(ptr_, stream_);
    }
    StreamBuffer(const StreamBuffer&) = delete;
    StreamBuffer& operator=(const StreamBuffer&) = delete;
    template <class T>
    T* as() const {
        return static_cast<T*>(ptr_);
    }

   private:
    void* ptr_ = nullptr;
    cudaStream_t stream_;
};

// Number of SMs of a device, cached per ordinal (an immutable property).
int sm_count(int device);

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// ---- element access ------------------------------------------------------------
// Scalar load / store of a tensor whose dtype is known only at run time
// (queries, outputs, new K/V rows: small next to the caches).
__device__ __forceinline__ float load_any(const void* p, int32_t dtype, int64_t i) {
    switch (dtype) {
        case LC_DTYPE_BF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
        case LC_DTYPE_F16: return __half2float(static_cast<const __half*>(p)[i]);
        default: return static_cast<const float*>(p)[i];
    }
}

__device__ __forceinline__ void store_any(void* p, int32_t dtype, int64_t i, float x) {
    switch (dtype) {
        case LC_DTYPE_BF16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(x); break;
        case LC_DTYPE_F16: static_cast<__half*>(p)[i] = __float2half_rn(x); break;
        default: static_cast<float*>(p)[i] = x; break;
    }
}

template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
    return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}

// ---- vector access of cache rows ---------------------------------------------
// Vec4<T>: 4 consecutive elements (8 bytes of bf16, 16 of fp32) loaded as one
// aligned access and widened to fp32. Vec16<T>: 16 bytes (8 bf16 / 4 fp32).
template <class T>
struct Vec4;
template <>
struct Vec4<float> {
    static constexpr int N = 4;
    __device__ __forceinline__ static void load(const float* p, float* f) {
        const float4 r = *reinterpret_cast<const float4*>(p);
        f[0] = r.x, f[1] = r.y, f[2] = r.z, f[3] = r.w;
    }
};
template <>
struct Vec4<__nv_bfloat16> {
    static constexpr int N = 4;
    __device__ __forceinline__ static void load(const __nv_bfloat16* p, float* f) {
        const uint2 r = *reinterpret_cast<const uint2*>(p);
        const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&r.x));
        const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&r.y));
        f[0] = a.x, f[1] = a.y, f[2] = b.x, f[3] = b.y;
    }
};

template <class T>
struct Vec16;
template <>
struct Vec16<float> : Vec4<float> {};
template <>
struct Vec16<__nv_bfloat16> {
    static constexpr int N = 8;
    __device__ __forceinline__ static void load(const __nv_bfloat16* p, float* f) {
        const uint4 r = *reinterpret_cast<const uint4*>(p);
        const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float2 v = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[i]));
            f[2 * i] = v.x, f[2 * i + 1] = v.y;
        }
    }
};

}  // namespace lc::cuda
