// Internal helpers shared by the core's translation units: errors that never
// cross the C ABI as exceptions, tensor checks, and the CPU worker pool.
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>

#include "llmcore/llmcore.h"

namespace lc {

// Thrown inside the core; every C entry point converts it to a status.
struct Error : std::runtime_error {
    lc_status status;
    Error(lc_status s, const std::string& msg) : std::runtime_error(msg), status(s) {}
};

[[noreturn]] void fail(lc_status status, const std::string& msg);
inline void require(bool ok, const std::string& msg) {
    if (!ok) fail(LC_ERR_INVALID_ARGUMENT, msg);
}

// Records msg as this thread's last error and returns status.
lc_status set_error(lc_status status, const char* msg);

// Runs fn, mapping exceptions to a status. Use in every C entry point:
//   return lc::guard([&] { ...; });
template <class F>
lc_status guard(F&& fn) noexcept {
    try {
        fn();
        return LC_OK;
    } catch (const Error& e) {
        return set_error(e.status, e.what());
    } catch (const std::bad_alloc&) {
        return set_error(LC_ERR_OUT_OF_MEMORY, "out of host memory");
    } catch (const std::exception& e) {
        return set_error(LC_ERR_INTERNAL, e.what());
    } catch (...) {
        return set_error(LC_ERR_INTERNAL, "unknown C++ exception");
    }
}

// ---- tensors -----------------------------------------------------------------
size_t dtype_size(int32_t dtype);
const char* dtype_name(int32_t dtype);
// Throws LC_ERR_INVALID_ARGUMENT naming `what` unless t has ndim dims, a
// supported dtype and a unit last stride.
void check_tensor(const lc_tensor* t, const char* what, int32_t ndim);
bool is_contiguous(const lc_tensor& t);
// Whether the byte ranges the two tensors span intersect (empty tensors never do).
bool overlaps(const lc_tensor& a, const lc_tensor& b);

// bf16 <-> fp32 (round to nearest even; NaN kept quiet).
inline float bf16_to_f32(uint16_t h) {
    uint32_t u = uint32_t(h) << 16;
    float f;
    __builtin_memcpy(&f, &u, 4);
    return f;
}
inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    __builtin_memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return uint16_t(u >> 16);
}

// ---- CPU parallelism ---------------------------------------------------------
// Calls fn(begin, end) over [0, n) split into contiguous chunks across the
// core's worker pool (the calling thread takes part). Between calls a worker
// spins for a short while (LLMCORE_SPIN_US, default 200 us: the gap between
// two kernels of one forward pass), then sleeps on a condition variable.
// Nested calls run serially. grain: minimum items per chunk.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);
int num_threads();

}  // namespace lc
