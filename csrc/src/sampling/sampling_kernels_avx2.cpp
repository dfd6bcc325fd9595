// The dense sampler loops compiled for AVX2 + FMA (x86-64 only).
#include "sampling/sampling_kernels.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define LC_KERNELS_NS isa_avx2
#define LC_KERNELS_ISA_NAME "avx2"
#define LC_KERNELS_VBYTES 32
#define LC_KERNELS_TARGET "avx2,fma"
#include "sampling/sampling_kernels_isa.h"

const lc::sampling::Kernels* lc::sampling::kernels_avx2() { return &isa_avx2::kTable; }
#else
const lc::sampling::Kernels* lc::sampling::kernels_avx2() { return nullptr; }
#endif
