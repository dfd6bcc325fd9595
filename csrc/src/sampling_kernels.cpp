// The portable build of the dense sampler loops and the run-time choice of
// the best instruction set (LLMCORE_SAMPLING_ISA=portable|avx2|avx512 forces one
// the CPU supports, for testing and benchmarking).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "rng.h"
#include "sampling_kernels.h"

namespace lc::sampling::isa_portable {
#define LC_KERNELS_ISA_NAME "portable"
#include "sampling_kernels_impl.h"
#undef LC_KERNELS_ISA_NAME
}  // namespace lc::sampling::isa_portable

namespace lc::sampling {

const Kernels& kernels_portable() { return isa_portable::kTable; }

namespace {

bool cpu_has(const char* isa) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (std::strcmp(isa, "avx512") == 0)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("fma");
    if (std::strcmp(isa, "avx2") == 0)
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
    return false;
}

const Kernels* choose() {
    const Kernels* avx512 = kernels_avx512();
    const Kernels* avx2 = kernels_avx2();
    const char* forced = std::getenv("LLMCORE_SAMPLING_ISA");
    if (forced && std::strcmp(forced, "portable") == 0) return &kernels_portable();
    if (forced && std::strcmp(forced, "avx2") == 0 && avx2 && cpu_has("avx2")) return avx2;
    if (avx512 && cpu_has("avx512") && !(forced && std::strcmp(forced, "avx2") == 0))
        return avx512;
    if (avx2 && cpu_has("avx2")) return avx2;
    return &kernels_portable();
}

}  // namespace

const Kernels& kernels() {
    static const Kernels* chosen = choose();
    return *chosen;
}

}  // namespace lc::sampling
