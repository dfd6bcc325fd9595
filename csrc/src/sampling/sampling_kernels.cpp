// The portable build of the dense sampler loops and the run-time choice of
// the best instruction set (LLMCORE_SAMPLING_ISA=scalar|avx2 caps it, for
// testing and benchmarking; set_isa() does the same at run time).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "common/fast_math.h"
#include "runtime/cpu_isa.h"
#include "sampling/rng.h"
#include "sampling/sampling_kernels.h"

namespace lc::sampling::isa_portable {
#define LC_KERNELS_ISA_NAME "scalar"
#define LC_KERNELS_VBYTES 16
#include "sampling/sampling_kernels_impl.h"
#undef LC_KERNELS_ISA_NAME
#undef LC_KERNELS_VBYTES
}  // namespace lc::sampling::isa_portable

namespace lc::sampling {

const Kernels& kernels_portable() { return isa_portable::kTable; }

namespace {

// The widest table compiled in; IsaSetting caps it by what the CPU runs.
Isa compiled_most() {
    if (kernels_avx512()) return Isa::kAvx512;
    if (kernels_avx2()) return Isa::kAvx2;
    return Isa::kScalar;
}

IsaSetting& isa_setting() {
    static IsaSetting setting("LLMCORE_SAMPLING_ISA", compiled_most());
    return setting;
}

}  // namespace

const Kernels& kernels() {
    switch (current_isa()) {
        case Isa::kAvx512:
            return *kernels_avx512();
        case Isa::kAvx2:
            return *kernels_avx2();
        default:
            return kernels_portable();
    }
}

Isa best_isa() { return isa_setting().best(); }
Isa set_isa(Isa isa) { return isa_setting().set(isa); }
Isa current_isa() { return isa_setting().current(); }

}  // namespace lc::sampling
