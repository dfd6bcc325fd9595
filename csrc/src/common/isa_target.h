// The glue every per-ISA translation unit shares: which builds compile the x86
// kernels, and the region that compiles a file's kernels for one instruction set
// while the rest of the build assumes only the baseline x86-64 ISA (SSE2). The
// run-time choice among the variants is each family's IsaSetting (cpu_isa.h);
// tests/cpp/check_isa_objects.py checks that no object exceeds its level.
//
//     #include "common/isa_target.h"
//     #if LC_ISA_X86
//     #include <immintrin.h>
//     LC_ISA_BEGIN("avx2,fma")
//     #include "common/simd_avx2.h"   // helpers take the region's target
//     ... kernels ...
//     LC_ISA_END()
//     #else
//     ... the non-x86 stubs (never selected) ...
//     #endif
//
// In the region every function gets the target (GCC: push_options + target,
// Clang: an attribute pushed on each function). GCC 12's AVX-512 intrinsic
// headers self-initialize their "undefined" vectors, which -Wmaybe-uninitialized
// and -Wuninitialized report inside kernels; the region silences those two.
#pragma once

// 1 where the SIMD variants are compiled (x86-64 with GCC or Clang), else 0.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define LC_ISA_X86 1
#else
#define LC_ISA_X86 0
#endif

#define LC_ISA_PRAGMA_STR(x) _Pragma(#x)
#define LC_ISA_PRAGMA(x) LC_ISA_PRAGMA_STR(x)

#if defined(__clang__)
#define LC_ISA_BEGIN(targets) \
    LC_ISA_PRAGMA(clang attribute push(__attribute__((target(targets))), apply_to = function))
#define LC_ISA_END() LC_ISA_PRAGMA(clang attribute pop)
#else
#define LC_ISA_BEGIN(targets)                                  \
    LC_ISA_PRAGMA(GCC push_options)                            \
    LC_ISA_PRAGMA(GCC target(targets))                         \
    LC_ISA_PRAGMA(GCC diagnostic push)                         \
    LC_ISA_PRAGMA(GCC diagnostic ignored "-Wmaybe-uninitialized") \
    LC_ISA_PRAGMA(GCC diagnostic ignored "-Wuninitialized")
#define LC_ISA_END() LC_ISA_PRAGMA(GCC diagnostic pop) LC_ISA_PRAGMA(GCC pop_options)
#endif
