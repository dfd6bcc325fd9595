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

#include "sampling/rng.h"
#include "sampling/sampling_kernels.h"

#define LC_KERNELS_STR2(x) #x
#define LC_KERNELS_PRAGMA(x) _Pragma(LC_KERNELS_STR2(x))

#if defined(__clang__)
LC_KERNELS_PRAGMA(clang attribute push(__attribute__((target(LC_KERNELS_TARGET))), \
                                        apply_to = function))
#else
#pragma GCC push_options
LC_KERNELS_PRAGMA(GCC target(LC_KERNELS_TARGET))
#endif

namespace lc::sampling::LC_KERNELS_NS {
#include "sampling/sampling_kernels_impl.h"
}  // namespace lc::sampling::LC_KERNELS_NS

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
