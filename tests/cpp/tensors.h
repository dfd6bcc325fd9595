// A contiguous lc_tensor over a host buffer, for the C++ tests that call the C ABI.
#pragma once

#include <cstdint>
#include <vector>

#include "llmcore/llmcore.h"

namespace lctest {
inline lc_tensor contiguous(void* data, int32_t dtype, std::vector<int64_t> shape) {
    lc_tensor t{};
    t.data = data;
    t.dtype = dtype;
    t.device = LC_DEVICE_CPU;
    t.ndim = int32_t(shape.size());
    int64_t stride = 1;
    for (int i = t.ndim - 1; i >= 0; --i) {
        t.shape[i] = shape[size_t(i)];
        t.strides[i] = stride;
        stride *= shape[size_t(i)];
    }
    return t;
}
}  // namespace lctest
