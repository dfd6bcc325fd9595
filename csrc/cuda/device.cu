// Device properties the launchers need, queried once per device.
#include <atomic>

#include "cuda_util.cuh"

namespace lc::cuda {

namespace {
constexpr int kMaxDevices = 64;
std::atomic<int> g_sm_count[kMaxDevices];  // 0 = not queried yet
}  // namespace

int sm_count(int device) {
    const bool cacheable = device >= 0 && device < kMaxDevices;
    if (cacheable) {
        const int cached = g_sm_count[device].load(std::memory_order_relaxed);
        if (cached > 0) return cached;
    }
    int n = 0;
    LC_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
    if (n <= 0) n = 1;
    if (cacheable) g_sm_count[device].store(n, std::memory_order_relaxed);
    return n;
}

}  // namespace lc::cuda
