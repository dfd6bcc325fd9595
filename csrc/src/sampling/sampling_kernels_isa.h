// Compiles sampling_kernels_impl.h for one instruction set. Include after
// defining LC_KERNELS_NS (namespace), LC_KERNELS_ISA_NAME (string) and
// LC_KERNELS_TARGET (a GCC/Clang target string).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "common/isa_target.h"
#include "sampling/rng.h"
#include "sampling/sampling_kernels.h"

LC_ISA_BEGIN(LC_KERNELS_TARGET)

// Inside the region, so that fast_math's templates, which take this target's
// vectors by value, are compiled for it too (outside, GCC warns that such an
// argument changes the calling convention: -Wpsabi).
#include "common/fast_math.h"

namespace lc::sampling::LC_KERNELS_NS {
#include "sampling/sampling_kernels_impl.h"
}  // namespace lc::sampling::LC_KERNELS_NS

LC_ISA_END()
