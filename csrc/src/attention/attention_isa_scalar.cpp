// The paged-attention kernel in portable C++ (any CPU; the compiler may still
// vectorize it for the baseline ISA). Also the reference the SIMD variants
// are tested against.
#include <cmath>
#include <cstdint>

#include "attention/attention_cpu.h"
#include "runtime/internal.h"

namespace lc::attn {
namespace {

struct ScalarOps {
    using V = float;
    static constexpr int W = 1;
    static constexpr int kRegs = 16;     // vector registers
    static constexpr int kRowBlock = 4;  // query rows per register block
    static constexpr bool kTransposedQk = false;  // no transpose() here yet

    static void prefetch(const void* p) { __builtin_prefetch(p); }
    static V zero() { return 0.0f; }
    static V set1(float x) { return x; }
    static V load(const float* p) { return *p; }
    static V load(const uint16_t* p) { return bf16_to_f32(*p); }
    static void store(float* p, V x) { *p = x; }
    static V fma(V a, V b, V c) { return a * b + c; }
    static V add(V a, V b) { return a + b; }
    static V sub(V a, V b) { return a - b; }
    static V mul(V a, V b) { return a * b; }
    static V div(V a, V b) { return a / b; }
    static V max(V a, V b) { return a > b ? a : b; }
    static float hsum(V x) { return x; }
    static float hmax(V x) { return x; }
    static void hsum8(const V* a, float* dst) {
        for (int i = 0; i < 8; ++i) dst[i] = a[i];
    }
    static V exp(V x) { return std::exp(x); }
};

}  // namespace
}  // namespace lc::attn

#include "attention/attention_kernel.h"

namespace lc::attn {

void run_item_scalar(const Job& job, const WorkItem& item, const WorkItem* next) {
    kernel::run_item_any<ScalarOps>(job, item, next);
}

void merge_split_scalar(const Job& job, const WorkItem& first, int32_t chunks) {
    kernel::merge_split_any<ScalarOps>(job, first, chunks);
}

}  // namespace lc::attn
